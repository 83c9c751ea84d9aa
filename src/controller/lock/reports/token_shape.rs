//! What can be a projected service-account token for our audience, decided on the token's text alone, before a
//! `TokenReview` is spent on it. A report is worth a review only if its bearer token reads as the kubelet's
//! projected token does: a JWT (three base64url segments, at most [`MAX_TOKEN_BYTES`]) whose claims name our
//! audience in `aud`, have not expired (`exp`), are already valid (`nbf`, `iat`), and carry the pod-bound claim
//! `kubernetes.io` with the namespace and the pod's name and uid (`pkg/serviceaccount/claims.go`).
//!
//! The signature is not checked here: the review does that. This only refuses what cannot be genuine, so that a
//! made-up string costs the API server nothing; a well-formed forgery still reaches the review, within the
//! bounds of `budget`. Pure, tested without a cluster.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;

/// A projected token is about a kilobyte (an RS256 signature, a dozen claims); eight times that is no token.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// How far this replica's clock may be from the API server's that issued the token: an `exp` that passed less
/// than this ago, or an `nbf`/`iat` less than this ahead, is left to the review.
pub const CLOCK_SKEW_SECS: i64 = 60;

/// The pod a token claims to be bound to (unverified: the review says whether it is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

/// Why a bearer token cannot be a projected service-account token for our audience.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotAToken {
    /// Not a JWT: too long, not three base64url segments, or a header or payload that is not a JSON object.
    Shape,
    /// `aud` does not name our audience.
    Audience,
    /// `exp` has passed, or is missing.
    Expired,
    /// `nbf` or `iat` is ahead of now, or `exp` is not after `iat`.
    NotYetValid,
    /// No `kubernetes.io` claim with a namespace and a pod's name and uid.
    NotPodBound,
}

impl NotAToken {
    /// A label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Shape => "not_a_jwt",
            Self::Audience => "wrong_audience",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::NotPodBound => "not_pod_bound",
        }
    }

    /// Why, for the reporter's log.
    pub fn message(self) -> &'static str {
        match self {
            Self::Shape => "the bearer token is not a JWT",
            Self::Audience => "the token is not for the audience redlock-operator",
            Self::Expired => "the token has expired",
            Self::NotYetValid => "the token is not valid yet",
            Self::NotPodBound => {
                "the token is not bound to a pod (use a projected serviceAccountToken volume)"
            }
        }
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct Payload {
    /// A string or an array of strings (RFC 7519, 4.1.3).
    #[serde(default)]
    aud: Value,
    exp: Option<f64>,
    nbf: Option<f64>,
    iat: Option<f64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaim>,
}

#[derive(Deserialize)]
struct KubernetesClaim {
    #[serde(default)]
    namespace: String,
    pod: Option<ObjectClaim>,
}

#[derive(Deserialize)]
struct ObjectClaim {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
}

/// The pod `token` claims to be bound to, if it can be a projected token for `audience` at `now` (Unix seconds).
pub fn claims_of(token: &str, audience: &str, now: i64) -> Result<Claimed, NotAToken> {
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err(NotAToken::Shape);
    }
    let mut segments = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (segments.next(), segments.next(), segments.next(), segments.next())
    else {
        return Err(NotAToken::Shape);
    };
    let decode = |segment: &str| {
        URL_SAFE_NO_PAD
            .decode(segment)
            .ok()
            .filter(|bytes| !bytes.is_empty())
    };
    let header: Header = decode(header)
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or(NotAToken::Shape)?;
    // An unsigned token is never a service account's.
    if header.alg.is_empty() || header.alg.eq_ignore_ascii_case("none") || decode(signature).is_none() {
        return Err(NotAToken::Shape);
    }
    let payload: Payload = decode(payload)
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or(NotAToken::Shape)?;
    let for_us = match &payload.aud {
        Value::String(one) => one == audience,
        Value::Array(many) => many.iter().any(|one| one.as_str() == Some(audience)),
        _ => false,
    };
    if !for_us {
        return Err(NotAToken::Audience);
    }
    let now = now as f64;
    let skew = CLOCK_SKEW_SECS as f64;
    let exp = payload
        .exp
        .filter(|exp| *exp + skew > now)
        .ok_or(NotAToken::Expired)?;
    let ahead = |at: Option<f64>| at.is_some_and(|at| at > now + skew);
    if ahead(payload.nbf) || ahead(payload.iat) || payload.iat.is_some_and(|iat| exp <= iat) {
        return Err(NotAToken::NotYetValid);
    }
    let bound = payload.kubernetes.ok_or(NotAToken::NotPodBound)?;
    let pod = bound.pod.ok_or(NotAToken::NotPodBound)?;
    // Names as the API server bounds them: a namespace is a DNS label, a pod's name a DNS subdomain.
    let fits = |value: &str, max: usize| !value.is_empty() && value.len() <= max;
    if !fits(&bound.namespace, 63) || !fits(&pod.name, 253) || !fits(&pod.uid, 128) {
        return Err(NotAToken::NotPodBound);
    }
    Ok(Claimed {
        namespace: bound.namespace,
        pod: pod.name,
        uid: pod.uid,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_800_000_000;
    const AUD: &str = "redlock-operator";

    fn b64(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(value.to_string())
    }

    /// A token as the API server issues it for a projected volume (with a signature nobody checks here).
    fn claims() -> Value {
        json!({
            "aud": [AUD],
            "exp": NOW + 3600,
            "iat": NOW - 10,
            "nbf": NOW - 10,
            "iss": "https://kubernetes.default.svc.cluster.local",
            "jti": "0f8e5a4c-4b7e-4d8a-9d0e-1c2b3a4d5e6f",
            "kubernetes.io": {
                "namespace": "shop",
                "node": {"name": "node-1", "uid": "5b1c"},
                "pod": {"name": "web-0", "uid": "7c9d-11"},
                "serviceaccount": {"name": "default", "uid": "a1b2"},
            },
            "sub": "system:serviceaccount:shop:default",
        })
    }

    fn token(claims: &Value) -> String {
        format!(
            "{}.{}.{}",
            b64(&json!({"alg": "RS256", "kid": "k1"})),
            b64(claims),
            URL_SAFE_NO_PAD.encode([7u8; 256])
        )
    }

    fn with(path: &[&str], value: Value) -> String {
        let mut claims = claims();
        let mut at = &mut claims;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        token(&claims)
    }

    fn without(path: &[&str]) -> String {
        let mut claims = claims();
        let mut at = &mut claims;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at.as_object_mut()
            .expect("an object")
            .remove(path[path.len() - 1]);
        token(&claims)
    }

    #[test]
    fn a_projected_token_for_our_audience_names_its_pod() {
        assert_eq!(
            claims_of(&token(&claims()), AUD, NOW),
            Ok(Claimed {
                namespace: "shop".into(),
                pod: "web-0".into(),
                uid: "7c9d-11".into(),
            })
        );
        // `aud` may be a single string.
        assert!(claims_of(&with(&["aud"], json!(AUD)), AUD, NOW).is_ok());
        // Other audiences beside ours.
        assert!(claims_of(&with(&["aud"], json!(["api", AUD])), AUD, NOW).is_ok());
    }

    #[test]
    fn what_is_not_a_jwt_is_refused() {
        let good = token(&claims());
        let parts: Vec<&str> = good.split('.').collect();
        let long = format!("{good}{}", "A".repeat(MAX_TOKEN_BYTES));
        let not_json = format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode("nope"), parts[2]);
        let unsigned = format!("{}.{}.{}", b64(&json!({"alg": "none"})), parts[1], parts[2]);
        let padded = format!("{}.{}=.{}", parts[0], parts[1], parts[2]);
        for bad in [
            "",
            "made-up-token",
            "a.b",
            "a.b.c.d",
            &format!("{}.{}.", parts[0], parts[1]),
            &format!("{}.{}", parts[0], parts[1]),
            &format!("{}.{}.{}.{}", parts[0], parts[1], parts[2], parts[2]),
            &format!("{}.{}!.{}", parts[0], parts[1], parts[2]),
            &padded,
            &long,
            &not_json,
            &unsigned,
            &format!("{}.{}.{}", URL_SAFE_NO_PAD.encode("[]"), parts[1], parts[2]),
        ] {
            assert_eq!(claims_of(bad, AUD, NOW), Err(NotAToken::Shape), "{bad:.80}");
        }
    }

    #[test]
    fn a_token_for_another_audience_is_refused() {
        for aud in [
            json!(["https://kubernetes.default.svc.cluster.local"]),
            json!("redlock"),
            json!([]),
            json!(7),
            Value::Null,
        ] {
            assert_eq!(
                claims_of(&with(&["aud"], aud.clone()), AUD, NOW),
                Err(NotAToken::Audience),
                "{aud}"
            );
        }
        assert_eq!(claims_of(&without(&["aud"]), AUD, NOW), Err(NotAToken::Audience));
    }

    #[test]
    fn times_are_checked_with_a_small_skew() {
        // Issued two hours ago, so that only `exp` decides.
        let exp = |at: i64| {
            let mut claims = claims();
            claims["iat"] = json!(NOW - 7200);
            claims["nbf"] = json!(NOW - 7200);
            claims["exp"] = json!(at);
            claims_of(&token(&claims), AUD, NOW)
        };
        assert!(exp(NOW + 1).is_ok());
        assert!(exp(NOW - CLOCK_SKEW_SECS + 1).is_ok(), "within the skew");
        assert_eq!(exp(NOW - CLOCK_SKEW_SECS), Err(NotAToken::Expired));
        assert_eq!(exp(NOW - 86_400), Err(NotAToken::Expired));
        assert_eq!(claims_of(&without(&["exp"]), AUD, NOW), Err(NotAToken::Expired));
        for claim in ["nbf", "iat"] {
            let at = |at: i64| claims_of(&with(&[claim], json!(at)), AUD, NOW);
            assert!(at(NOW + CLOCK_SKEW_SECS).is_ok(), "{claim} within the skew");
            assert_eq!(
                at(NOW + CLOCK_SKEW_SECS + 1),
                Err(NotAToken::NotYetValid),
                "{claim}"
            );
            assert!(
                claims_of(&without(&[claim]), AUD, NOW).is_ok(),
                "{claim} is optional"
            );
        }
        // Issued after it expires.
        let mut backwards = claims();
        backwards["iat"] = json!(NOW + 30);
        backwards["exp"] = json!(NOW + 20);
        assert_eq!(
            claims_of(&token(&backwards), AUD, NOW),
            Err(NotAToken::NotYetValid)
        );
    }

    #[test]
    fn a_token_not_bound_to_a_pod_is_refused() {
        for bad in [
            without(&["kubernetes.io"]),
            without(&["kubernetes.io", "pod"]),
            without(&["kubernetes.io", "namespace"]),
            without(&["kubernetes.io", "pod", "uid"]),
            without(&["kubernetes.io", "pod", "name"]),
            with(&["kubernetes.io", "pod", "uid"], json!("")),
            with(&["kubernetes.io", "namespace"], json!("n".repeat(64))),
            with(&["kubernetes.io", "pod", "name"], json!("p".repeat(254))),
        ] {
            assert_eq!(claims_of(&bad, AUD, NOW), Err(NotAToken::NotPodBound));
        }
        // A legacy Secret-based token has neither our audience nor a pod.
        let legacy = json!({
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": "shop",
            "kubernetes.io/serviceaccount/secret.name": "default-token-x",
            "sub": "system:serviceaccount:shop:default",
        });
        assert_eq!(claims_of(&token(&legacy), AUD, NOW), Err(NotAToken::Audience));
        // Wrong types are not a pod.
        let wrong = with(&["kubernetes.io", "pod"], json!("web-0"));
        assert_eq!(claims_of(&wrong, AUD, NOW), Err(NotAToken::Shape));
    }
}

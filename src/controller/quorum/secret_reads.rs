//! Reads the Secrets a `RedisQuorum` names. Read on every health check rather than watched: the operator then
//! needs `get` on Secrets only, not a cache of every Secret; a rotated password is picked up within one health
//! interval.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::config::QuorumSecrets;
use crate::api::RedisQuorum;
use crate::api::quorum::QuorumAuth;
use crate::controller::context::Context;
use crate::controller::engines::problem::QuorumProblem;

pub async fn read_secrets(quorum: &RedisQuorum, ctx: &Context) -> Result<QuorumSecrets, QuorumProblem> {
    let namespace = ctx.secrets_namespace.as_str();
    let references = secret_references(quorum, namespace)?;
    let mut secrets = QuorumSecrets::default();
    if let Some(auth) = references.auth {
        let secret = get_secret(ctx, namespace, &auth.secret_name).await?;
        let text = |key: &str| secret_text(&secret, namespace, &auth.secret_name, key);
        secrets.password = Some(text(&auth.password_key)?);
        if let Some(key) = &auth.username_key {
            secrets.username = Some(text(key)?);
        }
    }
    if let Some((name, key)) = references.ca {
        let secret = get_secret(ctx, namespace, name).await?;
        secrets.ca_pem = Some(secret_text(&secret, namespace, name, key)?.into_bytes());
    }
    Ok(secrets)
}

/// The Secrets a quorum names, once every namespace it gives is the Secrets namespace: checked before any read,
/// so that a quorum naming another namespace never makes the operator read (or send) that namespace's Secret.
pub struct SecretReferences<'a> {
    pub auth: Option<&'a QuorumAuth>,
    /// CA bundle: Secret name and key.
    pub ca: Option<(&'a str, &'a str)>,
}

pub fn secret_references<'a>(
    quorum: &'a RedisQuorum,
    secrets_namespace: &str,
) -> Result<SecretReferences<'a>, QuorumProblem> {
    let allowed = |field: &'static str, requested: &Option<String>| match requested {
        Some(requested) if requested != secrets_namespace => Err(QuorumProblem::SecretNamespaceNotAllowed {
            field,
            requested: requested.clone(),
            allowed: secrets_namespace.to_owned(),
        }),
        _ => Ok(()),
    };
    let auth = quorum.spec.auth.as_ref();
    if let Some(auth) = auth {
        allowed("spec.auth.secretNamespace", &auth.secret_namespace)?;
    }
    let mut ca = None;
    if let Some(tls) = &quorum.spec.tls {
        allowed("spec.tls.caSecretNamespace", &tls.ca_secret_namespace)?;
        match &tls.ca_secret_name {
            Some(name) => ca = Some((name.as_str(), tls.ca_key.as_str())),
            None if tls.ca_secret_namespace.is_some() => {
                return Err(QuorumProblem::InvalidSpec(
                    "spec.tls.caSecretNamespace is set without spec.tls.caSecretName".to_owned(),
                ));
            }
            None => {}
        }
    }
    Ok(SecretReferences { auth, ca })
}

async fn get_secret(ctx: &Context, namespace: &str, name: &str) -> Result<Secret, QuorumProblem> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    match api.get_opt(&name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(QuorumProblem::SecretNotFound { namespace, name }),
        Err(kube::Error::Api(status)) if status.is_forbidden() => Err(QuorumProblem::SecretForbidden {
            namespace,
            name,
            message: status.message.clone(),
        }),
        Err(err) => Err(QuorumProblem::SecretUnreadable {
            namespace,
            name,
            message: err.to_string(),
        }),
    }
}

fn secret_text(secret: &Secret, namespace: &str, name: &str, key: &str) -> Result<String, QuorumProblem> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|value| value.clone().into_bytes())
        })
        .ok_or_else(|| QuorumProblem::SecretKeyMissing {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        })?;
    String::from_utf8(bytes).map_err(|_| QuorumProblem::SecretKeyInvalid {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quorum(spec: serde_json::Value) -> RedisQuorum {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": {"name": "q"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn secrets_are_named_only_in_the_secrets_namespace() {
        let endpoints = serde_json::json!(["rediss://a:1"]);
        let own = quorum(serde_json::json!({"endpoints": endpoints,
            "auth": {"secretName": "auth", "secretNamespace": "redlock-system"},
            "tls": {"caSecretName": "ca"}}));
        let references = secret_references(&own, "redlock-system").unwrap();
        assert_eq!(
            references.auth.map(|auth| auth.secret_name.as_str()),
            Some("auth")
        );
        assert_eq!(references.ca, Some(("ca", "ca.crt")));

        let foreign = quorum(serde_json::json!({"endpoints": endpoints,
            "auth": {"secretName": "auth", "secretNamespace": "team-b"}}));
        let err = secret_references(&foreign, "redlock-system").err().unwrap();
        assert_eq!(err.reason(), "SecretNamespaceNotAllowed");
        assert!(err.to_string().contains("`team-b`"), "{err}");
        let foreign_ca = quorum(serde_json::json!({"endpoints": endpoints,
            "tls": {"caSecretName": "ca", "caSecretNamespace": "kube-system"}}));
        assert!(secret_references(&foreign_ca, "redlock-system").is_err());
    }
}

//! Kubernetes' rule for label keys (a "qualified name": an optional DNS-subdomain prefix and `/`, then a name
//! of at most 63 characters), checked before the operator writes a label a user named. Hand-written because
//! no maintained crate exports the API server's validation; the rule is short and its tests carry the
//! API server's own examples.

/// Why `key` is not a label key the API server would accept, if it is not.
pub fn check(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err(format!("`{key}`: the prefix must be 1 to 253 characters"));
        }
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if !prefix.split('.').all(label_ok) {
            return Err(format!(
                "`{key}`: the prefix must be a DNS subdomain (lower-case letters, digits, `-` and `.`)"
            ));
        }
    }
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if name.is_empty()
        || name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || !edge_ok(name.bytes().next())
        || !edge_ok(name.bytes().last())
    {
        return Err(format!(
            "`{key}`: the name must be 1 to 63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Keys Kubernetes itself sets on pods, or reserves: a leader label there would fight the controllers that own
/// them (removing `pod-template-hash` orphans a pod from its ReplicaSet).
pub fn is_reserved(key: &str) -> bool {
    let prefix = key.rsplit_once('/').map(|(prefix, _)| prefix);
    matches!(key, "pod-template-hash" | "controller-revision-hash")
        || prefix.is_some_and(|prefix| {
            ["kubernetes.io", "k8s.io"]
                .iter()
                .any(|reserved| prefix == *reserved || prefix.ends_with(&format!(".{reserved}")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_the_api_server_accepts() {
        for good in ["app", "redlock.io/leader", "a.b-c/x_y.z", "A9", &"n".repeat(63)] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        let long_prefix = format!("{}/x", vec!["a".repeat(63); 4].join("."));
        assert!(long_prefix.len() > 256);
        for bad in [
            "",
            "/x",
            "x/",
            "-x",
            "x-",
            "UPPER.io/x",
            "a b",
            "a/b/c",
            &"n".repeat(64),
            &long_prefix,
            "ex!ample.io/x",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubernetes_keys_are_reserved() {
        for reserved in [
            "pod-template-hash",
            "controller-revision-hash",
            "statefulset.kubernetes.io/pod-name",
            "kubernetes.io/hostname",
            "batch.kubernetes.io/job-name",
            "apps.kubernetes.io/pod-index",
            "node.k8s.io/x",
        ] {
            assert!(is_reserved(reserved), "{reserved}");
        }
        assert!(!is_reserved("redlock.io/leader"));
        assert!(!is_reserved("mykubernetes.io/leader"));
    }
}

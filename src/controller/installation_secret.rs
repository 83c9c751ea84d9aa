//! Lock values derived from a per-installation secret, so that a restarted or standby replica can rebuild the
//! value of a lock its predecessor holds — and resume extending it — without the value ever being written to
//! a resource where others could read it.

use std::path::Path;

use ring::hmac;

use crate::redlock::{LockValue, ValueError};

/// Shortest installation secret accepted: the derived values must be as unguessable as random ones.
pub const MIN_SECRET_BYTES: usize = 32;

pub struct InstallationSecret {
    key: hmac::Key,
    /// Shared by the replicas of the installation (read from a file), not made up by this process.
    shared: bool,
}

impl std::fmt::Debug for InstallationSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InstallationSecret(<redacted>)")
    }
}

impl InstallationSecret {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        // A file written by hand or by `echo` ends with a line break that is not part of the secret.
        let trimmed = bytes
            .strip_suffix(b"\n")
            .map(|rest| rest.strip_suffix(b"\r").unwrap_or(rest))
            .unwrap_or(bytes);
        if trimmed.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the installation secret must hold at least {MIN_SECRET_BYTES} bytes, it has {}",
                trimmed.len()
            ));
        }
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, trimmed),
            shared: true,
        })
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        Self::from_bytes(&bytes).map_err(|err| format!("{}: {err}", path.display()))
    }

    /// A secret for this process only: locks cannot be resumed by another process after a restart.
    pub fn ephemeral() -> Result<Self, ValueError> {
        let mut bytes = [0u8; MIN_SECRET_BYTES];
        getrandom::fill(&mut bytes).map_err(|err| ValueError::Random(err.to_string()))?;
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
            shared: false,
        })
    }

    /// Whether another replica derives the same lock values (so it can take over, release or re-grant a lock this
    /// one holds).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The value of one acquisition: distinct per lock object (its uid), per key and per fencing token, so a
    /// value never outlives the acquisition it belongs to, and a recreated object never reuses one.
    pub fn lock_value(
        &self,
        key: &str,
        uid: &str,
        token: i64,
        holder: &str,
    ) -> Result<LockValue, ValueError> {
        let mut message = Vec::with_capacity(key.len() + uid.len() + 32);
        for part in [b"redlock-operator/v1".as_slice(), key.as_bytes(), uid.as_bytes()] {
            message.extend_from_slice(&(part.len() as u64).to_be_bytes());
            message.extend_from_slice(part);
        }
        message.extend_from_slice(&token.to_be_bytes());
        let tag = hmac::sign(&self.key, &message);
        LockValue::with_secret(holder, tag.as_ref())
    }
}

impl InstallationSecret {
    /// The name a lock's permit waits under in its key's fair queue: the same in every reconcile and on every
    /// replica of this installation (so that a failover keeps the place), distinct across locks and
    /// installations.
    pub fn waiter_id(&self, key: &str, uid: &str, permit: u32) -> u64 {
        let mut message = Vec::with_capacity(key.len() + uid.len() + 40);
        for part in [
            b"redlock-operator/queue/v1".as_slice(),
            key.as_bytes(),
            uid.as_bytes(),
        ] {
            message.extend_from_slice(&(part.len() as u64).to_be_bytes());
            message.extend_from_slice(part);
        }
        message.extend_from_slice(&permit.to_be_bytes());
        let tag = hmac::sign(&self.key, &message);
        let mut id = [0u8; 8];
        id.copy_from_slice(&tag.as_ref()[..8]);
        u64::from_be_bytes(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_stable_per_acquisition_and_distinct_across() {
        let secret = InstallationSecret::from_bytes(&[7u8; 40]).unwrap();
        let a = secret.lock_value("ns/a", "uid-1", 3, "batch").unwrap();
        assert_eq!(a, secret.lock_value("ns/a", "uid-1", 3, "batch").unwrap());
        assert_ne!(a, secret.lock_value("ns/a", "uid-1", 4, "batch").unwrap());
        assert_ne!(a, secret.lock_value("ns/a", "uid-2", 3, "batch").unwrap());
        assert_ne!(a, secret.lock_value("ns/b", "uid-1", 3, "batch").unwrap());
        let other = InstallationSecret::from_bytes(&[8u8; 40]).unwrap();
        assert_ne!(a, other.lock_value("ns/a", "uid-1", 3, "batch").unwrap());
        assert_eq!(a.holder(), "batch");
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(InstallationSecret::from_bytes(b"too short\n").is_err());
        let with_newline = InstallationSecret::from_bytes(b"0123456789abcdef0123456789abcdef\n").unwrap();
        let without = InstallationSecret::from_bytes(b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(
            with_newline.lock_value("k", "u", 1, "h").unwrap(),
            without.lock_value("k", "u", 1, "h").unwrap()
        );
        assert!(!format!("{:?}", InstallationSecret::ephemeral().unwrap()).contains('7'));
    }
}

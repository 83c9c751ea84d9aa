use std::fmt;
use std::sync::Arc;

/// Separates the holder label from the secret; the secret is hex, so the last separator is unambiguous.
const SEPARATOR: char = '|';
const RANDOM_SECRET_BYTES: usize = 24;

/// The value a lock's key holds on every master: `<holder>|<secret>`.
///
/// The holder part lets a contender report who blocks it; the secret part (≥ 24 random bytes from the OS, or
/// derived from an installation secret) makes the value unguessable, so only its owner can extend or release
/// it. `Debug` and `Display` show the holder only: the secret must never reach a log.
#[derive(Clone, PartialEq, Eq)]
pub struct LockValue {
    encoded: Arc<str>,
    holder_len: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
    #[error("a lock secret must be at least 20 bytes, got {0}")]
    SecretTooShort(usize),
}

impl LockValue {
    /// A fresh value with a secret from the OS CSPRNG.
    pub fn random(holder: &str) -> Result<Self, ValueError> {
        let mut secret = [0u8; RANDOM_SECRET_BYTES];
        getrandom::fill(&mut secret).map_err(|err| ValueError::Random(err.to_string()))?;
        Self::with_secret(holder, &secret)
    }

    /// A value whose secret the caller derived (for example an HMAC of an installation secret), so that a
    /// restarted process can rebuild it without it ever being stored where others can read it.
    pub fn with_secret(holder: &str, secret: &[u8]) -> Result<Self, ValueError> {
        if secret.len() < 20 {
            return Err(ValueError::SecretTooShort(secret.len()));
        }
        let holder = sanitize_holder(holder);
        let encoded = format!("{holder}{SEPARATOR}{}", hex::encode(secret));
        Ok(Self {
            holder_len: holder.len(),
            encoded: encoded.into(),
        })
    }

    pub fn holder(&self) -> &str {
        &self.encoded[..self.holder_len]
    }

    /// The bytes stored in Redis. Crate-private so that the secret cannot leak through the public API.
    pub(crate) fn as_str(&self) -> &str {
        &self.encoded
    }

    /// The holder label of a value read from Redis, whoever wrote it; `None` for foreign values.
    pub fn holder_of(raw: &[u8]) -> Option<String> {
        let raw = std::str::from_utf8(raw).ok()?;
        let (holder, secret) = raw.rsplit_once(SEPARATOR)?;
        (!secret.is_empty() && secret.bytes().all(|b| b.is_ascii_hexdigit())).then(|| holder.to_owned())
    }
}

/// Keeps holder labels printable and free of the separator, so parsing another holder's value is exact.
fn sanitize_holder(holder: &str) -> String {
    let cleaned: String = holder
        .chars()
        .map(|c| if c == SEPARATOR || c.is_control() { '_' } else { c })
        .take(200)
        .collect();
    if cleaned.is_empty() {
        "anonymous".to_owned()
    } else {
        cleaned
    }
}

impl fmt::Debug for LockValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockValue({}|<redacted>)", self.holder())
    }
}

impl fmt::Display for LockValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.holder())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_values_are_unique_and_carry_the_holder() {
        let a = LockValue::random("web-0").unwrap();
        let b = LockValue::random("web-0").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.holder(), "web-0");
        assert_eq!(a.as_str().len(), "web-0|".len() + 2 * RANDOM_SECRET_BYTES);
        assert_eq!(
            LockValue::holder_of(a.as_str().as_bytes()).as_deref(),
            Some("web-0")
        );
    }

    #[test]
    fn the_secret_never_shows_in_formatting() {
        let value = LockValue::with_secret("job|x\n", &[0xab; 20]).unwrap();
        assert_eq!(value.holder(), "job_x_");
        assert!(!format!("{value:?}{value}").contains("abab"));
    }

    #[test]
    fn short_secrets_and_foreign_values_are_refused() {
        assert!(LockValue::with_secret("a", &[1; 19]).is_err());
        assert_eq!(LockValue::holder_of(b"someone-elses-lock"), None);
        assert_eq!(LockValue::holder_of(b"x|not-hex"), None);
    }
}

//! The reports port's certificate and key: made by the replica at start, or read from files (a Secret of type
//! `kubernetes.io/tls` mounted in the pod), and the pin status shows for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Where the key comes from.
#[derive(Clone, Debug, Default)]
pub enum KeySource {
    /// A key and a self-signed certificate made at start, for this process alone: a restarted or newly active
    /// replica shows its own pin, which status carries to the holders with its URL.
    #[default]
    Generated,
    /// PEM files: the certificate chain (the first one is pinned) and its private key.
    Files { certificate: PathBuf, key: PathBuf },
}

/// The server's TLS configuration and the pin of its certificate.
pub struct Identity {
    pub server_config: Arc<ServerConfig>,
    pub pin: String,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot make a key for the reports port: {0}")]
    Generate(#[source] rcgen::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read, and is not PEM of the kind expected.
    #[error("cannot read {path}: {source}")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("the reports port's certificate and key do not make a TLS server: {0}")]
    Config(#[source] rustls::Error),
}

impl Identity {
    pub fn new(source: &KeySource, names: &[String]) -> Result<Self, IdentityError> {
        match source {
            KeySource::Generated => Self::generated(names),
            KeySource::Files { certificate, key } => Self::from_files(certificate, key),
        }
    }

    /// A fresh key and a self-signed certificate naming `names` (holders check the pin, not the names, which are
    /// there for people who look at it).
    fn generated(names: &[String]) -> Result<Self, IdentityError> {
        let names = if names.is_empty() {
            vec!["redlock-operator".to_owned()]
        } else {
            names.to_vec()
        };
        let made = rcgen::generate_simple_self_signed(names).map_err(IdentityError::Generate)?;
        let certificate = made.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
        Self::with(vec![certificate], key)
    }

    fn from_files(certificate: &Path, key: &Path) -> Result<Self, IdentityError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| IdentityError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let chain = CertificateDer::pem_slice_iter(&read(certificate)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| IdentityError::Pem {
                path: certificate.to_owned(),
                source,
            })?;
        if chain.is_empty() {
            return Err(IdentityError::NoCertificate {
                path: certificate.to_owned(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|source| IdentityError::Pem {
            path: key.to_owned(),
            source,
        })?;
        Self::with(chain, key)
    }

    fn with(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Result<Self, IdentityError> {
        let pin = chain
            .first()
            .map(super::pin::of)
            .ok_or_else(|| IdentityError::Config(rustls::Error::General("no certificate".into())))?;
        let mut config = ServerConfig::builder_with_provider(super::crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(IdentityError::Config)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(IdentityError::Config)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Stateless resumption tickets: a holder that asks again (about once per extension) resumes its session
        // instead of a full handshake, and the server keeps nothing per holder (its session cache holds 256).
        config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(IdentityError::Config)?;
        Ok(Self {
            server_config: Arc::new(config),
            pin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|line| std::str::from_utf8(line).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn each_generated_identity_has_its_own_pin() {
        let one = Identity::new(&KeySource::Generated, &["10.0.0.5".into()]).unwrap();
        let other = Identity::new(&KeySource::Generated, &[]).unwrap();
        assert_eq!(one.pin.len(), super::super::pin::PIN_LENGTH);
        assert_ne!(one.pin, other.pin);
    }

    #[test]
    fn files_give_the_pin_of_their_first_certificate_and_bad_ones_are_named() {
        let made = rcgen::generate_simple_self_signed(vec!["reports".to_owned()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (certificate, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&certificate, pem("CERTIFICATE", made.cert.der())).unwrap();
        std::fs::write(&key, pem("PRIVATE KEY", &made.signing_key.serialize_der())).unwrap();
        let files = KeySource::Files {
            certificate: certificate.clone(),
            key: key.clone(),
        };
        let identity = Identity::new(&files, &[]).unwrap();
        assert_eq!(identity.pin, super::super::pin::of(made.cert.der()));

        std::fs::write(&certificate, "not PEM").unwrap();
        let err = Identity::new(&files, &[]).err().unwrap().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let missing = KeySource::Files {
            certificate: dir.path().join("absent"),
            key,
        };
        let err = Identity::new(&missing, &[]).err().unwrap().to_string();
        assert!(err.contains("cannot read") && err.contains("absent"), "{err}");
    }
}

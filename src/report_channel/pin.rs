//! A certificate's pin: the SHA-256 of its DER encoding, in lowercase hex (as `openssl x509 -fingerprint
//! -sha256` prints it, without the colons).

use rustls::pki_types::CertificateDer;

/// The length of a pin in hex digits.
pub const PIN_LENGTH: usize = 64;

/// The pin of `certificate`.
pub fn of(certificate: &CertificateDer<'_>) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, certificate.as_ref()))
}

/// `text` as a pin (64 hex digits, either case), lowercase; `None` when it is not one.
pub fn parse(text: &str) -> Option<String> {
    let text = text.trim();
    (text.len() == PIN_LENGTH && text.bytes().all(|byte| byte.is_ascii_hexdigit()))
        .then(|| text.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_is_the_sha256_of_the_der_in_lowercase_hex() {
        // SHA-256 of the three bytes "abc" (FIPS 180-2's example).
        let pin = of(&CertificateDer::from(b"abc".to_vec()));
        assert_eq!(
            pin,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse(&pin.to_ascii_uppercase()), Some(pin.clone()));
        assert_eq!(parse(&format!(" {pin}\n")), Some(pin.clone()));
    }

    #[test]
    fn anything_else_is_not_a_pin() {
        for text in [
            "",
            "abc",
            &"g".repeat(64),
            &"a".repeat(63),
            &"a".repeat(65),
            &"é".repeat(32),
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }
}

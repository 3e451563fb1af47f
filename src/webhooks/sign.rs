//! Signing a delivery as the Standard Webhooks specification says: the signed content is
//! `<id>.<timestamp>.<body>`, the MAC is HMAC-SHA256 under the secret's bytes (the base64 after
//! `whsec_`), and the `webhook-signature` header carries `v1,<base64 MAC>`.
//!
//! Owns: secret decoding and the three headers. Must not: send anything.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// The prefix of an encoded secret.
const PREFIX: &str = "whsec_";

/// What a tenant's secret is derived under, before the tenant's name.
const TENANT_LABEL: &[u8] = b"aptix-webhook-tenant\0";

/// The fewest secret bytes accepted (the specification asks for 24 to 64).
const MIN_BYTES: usize = 24;
/// The most secret bytes accepted.
const MAX_BYTES: usize = 64;

/// A signing secret, decoded. Its bytes never print.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(…)")
    }
}

/// The signing secrets a process has, by the variable they were read from.
pub type Secrets = std::collections::BTreeMap<String, SigningKey>;

/// Why a secret cannot be used (its text is never part of the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSecret {
    /// Not `whsec_` followed by base64.
    #[error(
        "a webhook secret is `whsec_` followed by base64 (as the Standard Webhooks specification encodes it)"
    )]
    Encoding,
    /// Too short or too long once decoded.
    #[error("a webhook secret must decode to {MIN_BYTES} to {MAX_BYTES} bytes; this one has {0}")]
    Length(usize),
}

impl SigningKey {
    /// Decodes `whsec_<base64>`.
    pub fn parse(encoded: &str) -> Result<Self, BadSecret> {
        let b64 = encoded
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(BadSecret::Encoding)?;
        let bytes = STANDARD.decode(b64).map_err(|_| BadSecret::Encoding)?;
        if !(MIN_BYTES..=MAX_BYTES).contains(&bytes.len()) {
            return Err(BadSecret::Length(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// The `webhook-signature` value of `body` sent as message `id` at `timestamp` (seconds
    /// since the Unix epoch).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // Any key length is valid for HMAC; `new_from_slice` cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    /// Tenant `tenant`'s own secret, derived from this one (the deployment's): the HMAC-SHA256,
    /// under this secret's bytes, of `aptix-webhook-tenant`, a NUL and the tenant's name — 32
    /// bytes no other tenant's deliveries are signed with. [`SigningKey::encoded`] is what the
    /// tenant's receiver is given (`aptix webhooks secret <tenant>`).
    pub fn for_tenant(&self, tenant: &str) -> SigningKey {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return self.clone();
        };
        mac.update(TENANT_LABEL);
        mac.update(tenant.as_bytes());
        SigningKey(mac.finalize().into_bytes().to_vec())
    }

    /// The secret as a receiver is given it: `whsec_` and its bytes in base64.
    pub fn encoded(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// The three headers of a delivery: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`.
    pub fn headers(&self, id: &str, timestamp: i64, body: &[u8]) -> [(&'static str, String); 3] {
        [
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", self.sign(id, timestamp, body)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's published test vector.
    #[test]
    fn signs_the_specifications_test_vector() {
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_secret_must_be_prefixed_base64_of_a_sensible_length() {
        assert_eq!(
            SigningKey::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            BadSecret::Encoding
        );
        assert_eq!(
            SigningKey::parse("whsec_not base64!").unwrap_err(),
            BadSecret::Encoding
        );
        assert_eq!(
            SigningKey::parse("whsec_c2hvcnQ=").unwrap_err(),
            BadSecret::Length(5)
        );
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert!(!format!("{key:?}").contains("MfKQ"));
    }

    #[test]
    fn each_tenant_gets_a_secret_of_its_own_that_reads_back() {
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let (a, b) = (key.for_tenant("acme"), key.for_tenant("globex"));
        assert_ne!(a.0, b.0);
        assert_ne!(a.0, key.0);
        assert_eq!(
            a.0,
            key.for_tenant("acme").0,
            "derived the same way every time"
        );
        let again = SigningKey::parse(&a.encoded()).unwrap();
        assert_eq!(again.0, a.0);
        assert_ne!(a.sign("m", 1, b"{}"), b.sign("m", 1, b"{}"));
    }
}

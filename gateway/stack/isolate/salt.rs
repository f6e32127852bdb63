//! Per-tenant prefix-cache salt.
//!
//! Engines that share a prefix cache between requests (vLLM, SGLang) keep entries of
//! different `cache_salt` values apart. The gateway, not the client, chooses that value:
//! [`CacheSalter::salt`] derives it from the tenant's name under a gateway secret, so it is
//! stable for a tenant (its own prefixes stay cacheable), different across tenants, and
//! cannot be guessed or chosen by a client. Dispatch drops every cache key a client sent
//! (`api::fields`), so a forged or shared salt never reaches the engine.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Domain separation: the gateway secret may also key other things (API-key hashes), so
/// the salt key is derived from it rather than being the secret itself.
const KEY_LABEL: &[u8] = b"kvgate/cache-salt/v1";

/// Derives per-tenant cache salts from a gateway secret and enforces them on request bodies.
#[derive(Clone)]
pub struct CacheSalter {
    key: [u8; 32],
}

impl std::fmt::Debug for CacheSalter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key: with it anyone can compute every tenant's salt.
        f.debug_struct("CacheSalter").finish_non_exhaustive()
    }
}

impl CacheSalter {
    /// A salter keyed by `secret` (any length; the same secret gives the same salts on
    /// every replica and across restarts, so cached prefixes survive both).
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: hmac_sha256(secret, KEY_LABEL),
        }
    }

    /// Hex HMAC-SHA256 of the tenant name under the derived key: always 64 lowercase hex
    /// characters, stable per tenant, different across tenants.
    pub fn salt(&self, tenant: &str) -> String {
        hex(&hmac_sha256(&self.key, tenant.as_bytes()))
    }

    /// The tenant's cache partition as a number: the first 8 bytes of its salt's MAC. Equal
    /// for two tenants exactly when their salts are (up to a 2⁻⁶⁴ chance), and as secret:
    /// routing seeds the tenant's prompt blocks with it (`stack::routing::blocks`).
    pub fn partition(&self, tenant: &str) -> u64 {
        let mac = hmac_sha256(&self.key, tenant.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&mac[..8]);
        u64::from_le_bytes(first)
    }
}

impl crate::stack::routing::CachePartitions for CacheSalter {
    fn partition(&self, tenant: &str) -> u64 {
        CacheSalter::partition(self, tenant)
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length, so `new_from_slice` cannot fail here; the fallback
    // keeps the request path free of panics all the same.
    let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
        return [0; 32];
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_tenant_same_salt() {
        let salter = CacheSalter::new(b"gateway secret");
        assert_eq!(salter.salt("acme"), salter.salt("acme"));
        // Another replica with the same secret agrees.
        assert_eq!(
            salter.salt("acme"),
            CacheSalter::new(b"gateway secret").salt("acme")
        );
    }

    #[test]
    fn salts_are_fixed_length_lowercase_hex() {
        let salter = CacheSalter::new(b"s");
        for tenant in ["", "a", "acme", &"x".repeat(10_000), "ünïcødé"] {
            let salt = salter.salt(tenant);
            assert_eq!(salt.len(), 64);
            assert!(salt
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
    }

    #[test]
    fn different_tenants_or_secrets_differ() {
        let salter = CacheSalter::new(b"gateway secret");
        assert_ne!(salter.salt("acme"), salter.salt("globex"));
        assert_ne!(salter.salt("acme"), salter.salt("acme "));
        assert_ne!(
            salter.salt("acme"),
            CacheSalter::new(b"other secret").salt("acme")
        );
    }

    #[test]
    fn partitions_follow_the_salts() {
        let salter = CacheSalter::new(b"gateway secret");
        assert_eq!(salter.partition("acme"), salter.partition("acme"));
        assert_ne!(salter.partition("acme"), salter.partition("globex"));
        assert_ne!(
            salter.partition("acme"),
            CacheSalter::new(b"other secret").partition("acme")
        );
        // The salt's first 8 bytes, little-endian.
        let salt = salter.salt("acme");
        let le: String = (0..8).rev().map(|i| &salt[2 * i..2 * i + 2]).collect();
        assert_eq!(format!("{:016x}", salter.partition("acme")), le);
    }

    #[test]
    fn matches_hmac_sha256_reference() {
        // RFC 4231 test case 2, to pin the primitive (the salt itself adds a derived key).
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let salter = CacheSalter::new(b"secret");
        let shown = format!("{salter:?}");
        assert!(!shown.contains("key"), "{shown}");
    }
}

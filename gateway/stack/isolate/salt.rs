//! Per-tenant prefix-cache salt.
//!
//! Engines that share a prefix cache between requests (vLLM, SGLang) keep entries of
//! different `cache_salt` values apart. The gateway, not the client, chooses that value:
//! [`CacheSalter::salt`] derives it from the tenant's name under a gateway secret, so it is
//! stable for a tenant (its own prefixes stay cacheable), different across tenants, and
//! cannot be guessed or chosen by a client. [`CacheSalter::apply`] strips every cache key
//! a client sent, so a forged or shared salt never reaches the engine.

use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Request fields that select a prefix-cache partition (vLLM `cache_salt`, SGLang
/// `extra_key`, OpenAI `prompt_cache_key`). Only the gateway may set them.
const CACHE_KEY_FIELDS: [&str; 3] = ["cache_salt", "extra_key", "prompt_cache_key"];

/// Nested objects some clients and engine versions read request options from: SGLang's
/// `sampling_params` (an object, or a list of them for batches) and a literal
/// `extra_body` sent by clients that do not flatten it.
const NESTED_FIELDS: [&str; 2] = ["sampling_params", "extra_body"];

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

    /// Removes client-supplied `cache_salt`, `extra_key` and `prompt_cache_key` from the
    /// top level of `body` and from `sampling_params` (object or list of objects) and
    /// `extra_body`; when `inject`, sets the top-level `cache_salt` to `tenant`'s salt.
    ///
    /// Stripping happens even without `inject`: for an engine that ignores the salt it is
    /// harmless, and for one that honours it a client-chosen value would let tenants share
    /// (or probe) a cache partition.
    pub fn apply(&self, body: &mut Map<String, Value>, tenant: &str, inject: bool) {
        strip(body);
        for field in NESTED_FIELDS {
            match body.get_mut(field) {
                Some(Value::Object(nested)) => strip(nested),
                Some(Value::Array(items)) => {
                    for item in items {
                        if let Value::Object(nested) = item {
                            strip(nested);
                        }
                    }
                }
                _ => {}
            }
        }
        if inject {
            body.insert("cache_salt".to_owned(), Value::String(self.salt(tenant)));
        }
    }
}

fn strip(map: &mut Map<String, Value>) {
    for field in CACHE_KEY_FIELDS {
        // `shift_remove` keeps the order of the remaining fields (serde_json
        // `preserve_order`), so the engine sees the client's body otherwise unchanged.
        map.shift_remove(field);
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
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

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

    #[test]
    fn forged_client_salts_never_survive() {
        let salter = CacheSalter::new(b"gateway secret");
        let forged = || {
            object(json!({
                "model": "qwen3",
                "cache_salt": "victim-salt",
                "extra_key": ["a", "b"],
                "prompt_cache_key": "shared",
                "sampling_params": {"max_new_tokens": 4, "cache_salt": "x", "extra_key": "y"},
                "extra_body": {"cache_salt": "z", "top_k": 5},
            }))
        };
        let mut body = forged();
        salter.apply(&mut body, "acme", true);
        assert_eq!(body["cache_salt"], json!(salter.salt("acme")));
        assert!(!body.contains_key("extra_key"));
        assert!(!body.contains_key("prompt_cache_key"));
        assert_eq!(body["sampling_params"], json!({"max_new_tokens": 4}));
        assert_eq!(body["extra_body"], json!({"top_k": 5}));
        assert_eq!(body["model"], json!("qwen3"));

        let mut body = forged();
        salter.apply(&mut body, "acme", false);
        for field in CACHE_KEY_FIELDS {
            assert!(!body.contains_key(field), "{field} survived");
        }
    }

    #[test]
    fn batch_sampling_params_are_stripped() {
        let salter = CacheSalter::new(b"k");
        let mut body = object(json!({
            "text": ["a", "b"],
            "sampling_params": [{"extra_key": "x", "temperature": 0}, {}, 3],
        }));
        salter.apply(&mut body, "t", true);
        assert_eq!(body["sampling_params"], json!([{"temperature": 0}, {}, 3]));
        assert_eq!(body["cache_salt"], json!(salter.salt("t")));
    }

    #[test]
    fn other_fields_keep_their_order() {
        let salter = CacheSalter::new(b"k");
        let mut body = object(json!({"a": 1, "cache_salt": "f", "b": 2, "c": 3}));
        salter.apply(&mut body, "t", false);
        let keys: Vec<&str> = body.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }
}

//! Tenant isolation (invariant I5): a tenant sees only its own data.
//!
//! - [`CacheSalter`] — the per-tenant prefix-cache salt. The gateway derives it from the
//!   tenant's name under its secret, strips every cache key a client sent, and injects the
//!   tenant's salt where the engine honours one (vLLM and SGLang `cache_salt`), so the
//!   engine never serves one tenant's cached prefix pages to another.

mod salt;

pub use salt::CacheSalter;

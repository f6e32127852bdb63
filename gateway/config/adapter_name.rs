//! LoRA adapter names, as engines register them: what a tenant's `lora_adapters` lists and
//! what a request's `lora_path` may name. One definition, so the config and the request
//! path can never disagree on what a name is.

use std::fmt;

/// An adapter name: letters, digits, `.`, `_`, `-`; never a path (no `/`), never empty or
/// `..` (a path would make the engine load arbitrary weights).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterName(String);

/// A string that is not an adapter name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an adapter name: use letters, digits, `.`, `_` and `-` (the name the engine registered, never a path)")]
pub struct AdapterNameError(pub String);

impl AdapterName {
    /// Whether `name` is an adapter name (without keeping it).
    pub fn is_valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 128
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }

    pub fn parse(name: &str) -> Result<Self, AdapterNameError> {
        if Self::is_valid(name) {
            Ok(Self(name.to_owned()))
        } else {
            Err(AdapterNameError(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AdapterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_only_never_paths() {
        for bad in ["", ".", "a/b", "../x", "/models/evil", &"x".repeat(129)] {
            assert!(AdapterName::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(AdapterName::parse("sql-v2").unwrap().as_str(), "sql-v2");
    }
}

//! Reading Anthropic bodies: SDK models echo unset fields as `null`, so a `null` field is
//! an absent one everywhere here.

use serde_json::{Map, Value};

/// A field's value, or `None` when it is absent or `null`.
pub(super) fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

//! Reading a JSON request body the way SGLang's request models (pydantic, `protocol.py`)
//! read it: a field of the wrong type, or a required one missing, is a validation error
//! whose text names the field. Shared by the Responses conversion here and the simulated
//! engine's request parsing, so both refuse a body with the same words.

use serde_json::{Map, Value};

/// pydantic's name for a JSON value's Python type (`got int`, `got dict`, ...).
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// A field's value, absent and `null` alike as `None`.
pub fn get<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).filter(|v| !v.is_null())
}

/// The text of a type error on field `name`.
pub fn wrong(name: &str, expected: &str, value: &Value) -> String {
    format!("{name}: Input should be {expected}, got {}", kind(value))
}

/// A required field's value.
pub fn required<'a>(map: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    map.get(name)
        .ok_or_else(|| format!("{name}: Field required"))
}

/// An optional string.
pub fn opt_str<'a>(map: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(name, "a valid string", v)),
    }
}

/// A boolean with a default (`null` is not a boolean to pydantic, but SGLang's optional
/// flags take it as unset).
pub fn flag(map: &Map<String, Value>, name: &str, default: bool) -> Result<bool, String> {
    match get(map, name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(wrong(name, "a valid boolean", v)),
    }
}

/// An optional integer (any sign).
pub fn opt_int(map: &Map<String, Value>, name: &str) -> Result<Option<i64>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(name, "a valid integer", v)),
    }
}

/// An optional number.
pub fn opt_f64(map: &Map<String, Value>, name: &str) -> Result<Option<f64>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| wrong(name, "a valid number", v)),
    }
}

/// An optional object.
pub fn opt_object<'a>(
    map: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a Map<String, Value>>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(wrong(name, "a valid dictionary", v)),
    }
}

/// Python's `repr` of a string, as SGLang's messages quote names (`{name!r}`).
pub fn py_repr(s: &str) -> String {
    if s.contains('\'') && !s.contains('"') {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

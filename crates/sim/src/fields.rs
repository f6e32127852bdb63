//! Reading a JSON body the way SGLang's request models (pydantic, `protocol.py`) read it:
//! a field of the wrong type, or a required one missing, is a validation error (the
//! caller answers it with `errors::validation`), whose text names the field.

use serde_json::{Map, Value};

use super::errors::kind;

/// The body of a route, as the HTTP layer hands it over: whether its content type was
/// JSON (`validate_json_request`) and the parsed JSON (or why it did not parse).
pub(crate) struct RouteBody {
    pub(crate) json_type: Result<(), String>,
    pub(crate) parsed: Result<Value, String>,
}

impl RouteBody {
    /// The body's object, or the validation message FastAPI would answer with.
    pub(crate) fn object(self) -> Result<Map<String, Value>, String> {
        self.json_type?;
        match self.parsed {
            Ok(Value::Object(map)) => Ok(map),
            Ok(other) => Err(format!(
                "body: Input should be a valid dictionary or object to extract fields from, got {}",
                kind(&other)
            )),
            Err(e) => Err(format!("body: JSON decode error: {e}")),
        }
    }
}

/// A field's value, absent and `null` alike as `None`.
pub(crate) fn get<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).filter(|v| !v.is_null())
}

fn wrong(name: &str, expected: &str, value: &Value) -> String {
    format!("{name}: Input should be {expected}, got {}", kind(value))
}

/// A required field's value.
pub(crate) fn required<'a>(map: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    map.get(name)
        .ok_or_else(|| format!("{name}: Field required"))
}

/// An optional string.
pub(crate) fn opt_str<'a>(
    map: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(name, "a valid string", v)),
    }
}

/// A boolean with a default (`null` is not a boolean to pydantic, but SGLang's optional
/// flags take it as unset).
pub(crate) fn flag(map: &Map<String, Value>, name: &str, default: bool) -> Result<bool, String> {
    match get(map, name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(wrong(name, "a valid boolean", v)),
    }
}

/// An optional integer (any sign).
pub(crate) fn opt_int(map: &Map<String, Value>, name: &str) -> Result<Option<i64>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(name, "a valid integer", v)),
    }
}

/// An optional number.
pub(crate) fn opt_f64(map: &Map<String, Value>, name: &str) -> Result<Option<f64>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| wrong(name, "a valid number", v)),
    }
}

/// An optional object.
pub(crate) fn opt_object<'a>(
    map: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a Map<String, Value>>, String> {
    match get(map, name) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(v) => Err(wrong(name, "a valid dictionary", v)),
    }
}

/// Token ids: a list of integers; one that is negative or past `u32` is `None`, for the
/// caller's own message (pydantic's `List[int]` takes any integer).
pub(crate) fn ids(value: &Value, name: &str) -> Result<Vec<Option<u32>>, String> {
    let Some(list) = value.as_array() else {
        return Err(wrong(name, "a valid list", value));
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => {
                Ok(n.as_u64().and_then(|t| u32::try_from(t).ok()))
            }
            other => Err(wrong(&format!("{name}.{i}"), "a valid integer", other)),
        })
        .collect()
}

/// Python's `repr` of a string, as SGLang's messages quote names (`{name!r}`).
pub(crate) fn py_repr(s: &str) -> String {
    if s.contains('\'') && !s.contains('"') {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

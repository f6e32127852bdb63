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

pub(crate) use kvgate_tokenize::prepare::fields::{
    flag, get, opt_f64, opt_int, opt_object, opt_str, py_repr, required, wrong,
};

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

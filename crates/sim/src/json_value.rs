//! JSON documents made to fit a JSON schema — tool-call arguments and `response_format`
//! answers — and their text as SGLang writes it.
//!
//! The value is deterministic and plausible: `const`, the first `enum` value or `default`
//! where given; else by type — objects get their required properties (all of them when the
//! schema lists none as required), arrays one item (or `minItems`), numbers 1 or 1.5 moved
//! into their bounds, booleans `true`, and strings a value their format or property name
//! suggests (a city for `city`, an address for `email`), padded or cut to their length
//! bounds. `$ref`s into the schema's `$defs` / `definitions` are followed; `anyOf` and
//! `oneOf` take their first non-null branch, `allOf` its branches merged.

use serde_json::{json, Map, Value};

/// How deep the maker follows nested schemas (and `$ref` cycles) before writing `null`.
const MAX_DEPTH: usize = 16;

/// A document valid for `schema` (for the schemas above).
pub(crate) fn fit(schema: &Value) -> Value {
    Maker { root: schema }.value(schema, None, 0)
}

/// `json.dumps(value, ensure_ascii=False)`: `", "` and `": "` separators, non-ASCII kept.
pub(crate) fn python_dumps(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_dumps(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_dumps).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

struct Maker<'a> {
    root: &'a Value,
}

impl Maker<'_> {
    fn value(&self, schema: &Value, name: Option<&str>, depth: usize) -> Value {
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        let Some(obj) = schema.as_object() else {
            // `true` (anything) or a malformed schema: a string will do.
            return json!(string_for(name, None));
        };
        if let Some(target) = obj
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| self.resolve(r))
        {
            return self.value(target, name, depth + 1);
        }
        if let Some(value) = obj.get("const") {
            return value.clone();
        }
        if let Some(first) = obj
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            return first.clone();
        }
        if let Some(value) = obj.get("default") {
            return value.clone();
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = obj.get(key).and_then(Value::as_array) {
                let branch = branches
                    .iter()
                    .find(|b| b.get("type").and_then(Value::as_str) != Some("null"))
                    .or_else(|| branches.first());
                if let Some(branch) = branch {
                    return self.value(branch, name, depth + 1);
                }
            }
        }
        if let Some(branches) = obj.get("allOf").and_then(Value::as_array) {
            let merged = merge(obj, branches);
            return self.value(&merged, name, depth + 1);
        }
        match kind(obj) {
            "object" => self.object(obj, depth),
            "array" => self.array(obj, name, depth),
            "integer" => json!(integer(obj)),
            "number" => json!(number(obj)),
            "boolean" => json!(true),
            "null" => Value::Null,
            _ => json!(string_for(name, Some(obj))),
        }
    }

    /// `#/$defs/X`, `#/definitions/X` or any JSON pointer into the root schema.
    fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(pointer)
    }

    fn object(&self, obj: &Map<String, Value>, depth: usize) -> Value {
        let properties = obj.get("properties").and_then(Value::as_object);
        let required: Option<Vec<&str>> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect());
        let mut out = Map::new();
        for (key, schema) in properties.into_iter().flatten() {
            if required.as_ref().is_none_or(|r| r.contains(&key.as_str())) {
                out.insert(key.clone(), self.value(schema, Some(key), depth + 1));
            }
        }
        // Required names the properties do not describe: whatever `additionalProperties` says.
        let extra = obj.get("additionalProperties").filter(|a| a.is_object());
        for key in required.into_iter().flatten() {
            if !out.contains_key(key) {
                let value = match extra {
                    Some(schema) => self.value(schema, Some(key), depth + 1),
                    None => json!(string_for(Some(key), None)),
                };
                out.insert(key.to_string(), value);
            }
        }
        Value::Object(out)
    }

    fn array(&self, obj: &Map<String, Value>, name: Option<&str>, depth: usize) -> Value {
        if let Some(prefix) = obj.get("prefixItems").and_then(Value::as_array) {
            return prefix
                .iter()
                .map(|s| self.value(s, name, depth + 1))
                .collect();
        }
        let min = obj
            .get("minItems")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1);
        let max = obj
            .get("maxItems")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        let count = min.min(max).min(8);
        let items = obj.get("items").cloned().unwrap_or(Value::Bool(true));
        // An item is named as its array, singular: the items of `tags` read as a `tag`.
        let item_name = name.map(|n| n.strip_suffix('s').unwrap_or(n));
        (0..count)
            .map(|_| self.value(&items, item_name, depth + 1))
            .collect()
    }
}

/// The schema's type: `type` (the first non-null of a list), else what its keywords imply.
fn kind(obj: &Map<String, Value>) -> &str {
    match obj.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if obj.contains_key("properties") => "object",
        _ if obj.contains_key("items") || obj.contains_key("prefixItems") => "array",
        _ => "string",
    }
}

/// The branches of an `allOf` merged into one schema: keywords of the first that sets
/// them, properties united, required lists concatenated.
fn merge(obj: &Map<String, Value>, branches: &[Value]) -> Value {
    let mut merged: Map<String, Value> = obj.clone();
    merged.remove("allOf");
    let mut properties = Map::new();
    let mut required = Vec::new();
    for branch in std::iter::once(&Value::Object(obj.clone())).chain(branches) {
        let Some(b) = branch.as_object() else {
            continue;
        };
        if let Some(p) = b.get("properties").and_then(Value::as_object) {
            properties.extend(p.clone());
        }
        if let Some(r) = b.get("required").and_then(Value::as_array) {
            required.extend(r.iter().cloned());
        }
        for (k, v) in b {
            if k != "allOf" && k != "properties" && k != "required" {
                merged.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    if !properties.is_empty() {
        merged.insert("properties".into(), Value::Object(properties));
    }
    if !required.is_empty() {
        merged.insert("required".into(), Value::Array(required));
    }
    Value::Object(merged)
}

fn bound(obj: &Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

fn integer(obj: &Map<String, Value>) -> i64 {
    let low = bound(obj, "minimum")
        .map(f64::ceil)
        .or_else(|| bound(obj, "exclusiveMinimum").map(|m| m.floor() + 1.0));
    let high = bound(obj, "maximum")
        .map(f64::floor)
        .or_else(|| bound(obj, "exclusiveMaximum").map(|m| m.ceil() - 1.0));
    let mut v = 1.0_f64;
    if let Some(low) = low {
        v = v.max(low);
    }
    if let Some(step) = bound(obj, "multipleOf").filter(|s| *s >= 1.0) {
        v = (v / step).ceil() * step;
    }
    if let Some(high) = high {
        v = v.min(high);
    }
    // In range by the clamps above; a schema with an empty range gets its upper bound.
    v as i64
}

fn number(obj: &Map<String, Value>) -> f64 {
    let mut v = 1.5_f64;
    if let Some(low) = bound(obj, "minimum") {
        v = v.max(low);
    }
    if let Some(low) = bound(obj, "exclusiveMinimum") {
        if v <= low {
            v = low + 0.5;
        }
    }
    if let Some(high) = bound(obj, "maximum") {
        v = v.min(high);
    }
    if let Some(high) = bound(obj, "exclusiveMaximum") {
        if v >= high {
            v = high - 0.5;
        }
    }
    v
}

/// A string its format, else its property name, suggests; fit to `minLength`/`maxLength`.
fn string_for(name: Option<&str>, obj: Option<&Map<String, Value>>) -> String {
    let format = obj.and_then(|o| o.get("format")).and_then(Value::as_str);
    let by_format = match format {
        Some("date") => Some("2025-01-01"),
        Some("date-time") => Some("2025-01-01T12:00:00Z"),
        Some("time") => Some("12:00:00"),
        Some("email") => Some("alice@example.com"),
        Some("uri" | "url" | "iri") => Some("https://example.com"),
        Some("uuid") => Some("123e4567-e89b-12d3-a456-426614174000"),
        Some("ipv4") => Some("192.0.2.1"),
        Some("ipv6") => Some("2001:db8::1"),
        Some("hostname") => Some("example.com"),
        _ => None,
    };
    let name = name.unwrap_or_default().to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| name.contains(w));
    let text = by_format.unwrap_or(if has(&["city", "location", "place", "destination"]) {
        "Paris"
    } else if has(&["country"]) {
        "France"
    } else if has(&["email"]) {
        "alice@example.com"
    } else if has(&["url", "link", "website"]) {
        "https://example.com"
    } else if has(&["date", "day"]) {
        "2025-01-01"
    } else if has(&["unit"]) {
        "celsius"
    } else if has(&["lang"]) {
        "en"
    } else if has(&["name", "user", "author"]) {
        "Alice"
    } else if has(&["query", "search", "keyword", "topic"]) {
        "kvgate"
    } else if has(&[
        "answer",
        "summary",
        "description",
        "text",
        "content",
        "message",
    ]) {
        "A short answer from the simulated engine."
    } else if name.ends_with("id") {
        "id-1"
    } else {
        "example"
    });
    let mut text = text.to_string();
    let min = obj
        .and_then(|o| o.get("minLength"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let min = usize::try_from(min).unwrap_or(usize::MAX).min(4096);
    while text.chars().count() < min {
        text.push('x');
    }
    if let Some(max) = obj.and_then(|o| o.get("maxLength")).and_then(Value::as_u64) {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        text = text.chars().take(max).collect();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_get_their_required_properties_by_type() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 3, "maximum": 10},
                "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
                "temperature": {"type": "number", "exclusiveMaximum": 1},
                "alerts": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "where": {"$ref": "#/$defs/place"},
                "note": {"type": ["null", "string"], "maxLength": 3},
                "optional": {"type": "string"}
            },
            "required": ["city", "days", "unit", "temperature", "alerts", "tags", "where", "note", "extra"],
            "$defs": {"place": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}}
        });
        let v = fit(&schema);
        assert_eq!(
            v,
            json!({"city": "Paris", "days": 3, "unit": "fahrenheit", "temperature": 0.5, "alerts": true,
                   "tags": ["example", "example"], "where": {"lat": 1.5}, "note": "exa", "extra": "example"})
        );
        assert_eq!(
            python_dumps(&json!({"a": [1, "é"], "b": {}})),
            r#"{"a": [1, "é"], "b": {}}"#
        );
    }

    #[test]
    fn schemas_without_required_fill_everything_and_combinators_pick_a_branch() {
        let schema = json!({"properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}}});
        assert_eq!(
            fit(&schema),
            json!({"name": "Alice", "email": "alice@example.com"})
        );
        let any = json!({"anyOf": [{"type": "null"}, {"type": "integer", "exclusiveMinimum": 5}]});
        assert_eq!(fit(&any), json!(6));
        let all = json!({"allOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                                   {"properties": {"b": {"const": 7}}, "required": ["b"]}]});
        assert_eq!(fit(&all), json!({"a": true, "b": 7}));
        let cyclic = json!({"$ref": "#"});
        assert_eq!(fit(&cyclic), Value::Null);
        assert_eq!(fit(&json!(true)), json!("example"));
    }
}

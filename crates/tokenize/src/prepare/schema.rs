//! Tool parameter schemas as the engines read them: SGLang's type normalization and
//! schema check (`function_call/utils.py` `normalize_json_schema_types`, `serving_chat.py`
//! `_validate_request`), and the types llama.cpp's grammar builder knows.

use serde_json::Value;

const STANDARD_TYPES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "string", "integer",
];

/// `normalize_json_schema_types`: every `type` spelled as a database or language type
/// (`varchar`, `int64`, `List[str]`) becomes its JSON Schema name, recursively.
pub(super) fn normalize_schema_types(schema: &mut Value) {
    let Value::Object(map) = schema else {
        if let Value::Array(items) = schema {
            items.iter_mut().for_each(normalize_schema_types);
        }
        return;
    };
    if let Some(kind) = map.get_mut("type") {
        match kind {
            Value::String(s) => *s = json_type(s),
            Value::Array(list) => {
                let mut mapped: Vec<Value> = Vec::with_capacity(list.len());
                for item in list.iter() {
                    let item = match item {
                        Value::String(s) => Value::from(json_type(s)),
                        other => other.clone(),
                    };
                    if !mapped.contains(&item) {
                        mapped.push(item);
                    }
                }
                *list = mapped;
            }
            _ => {}
        }
    }
    for key in [
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
    ] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(normalize_schema_types);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(normalize_schema_types);
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    ] {
        if let Some(child) = map.get_mut(key) {
            normalize_schema_types(child);
        }
    }
}

fn json_type(spelled: &str) -> String {
    if STANDARD_TYPES.contains(&spelled) {
        return spelled.to_owned();
    }
    let base = spelled
        .split('(')
        .next()
        .unwrap_or_default()
        .trim()
        .to_lowercase();
    if STANDARD_TYPES.contains(&base.as_str()) {
        return base;
    }
    let alias = match base.as_str() {
        "str" | "text" | "varchar" | "char" | "enum" | "uuid" | "date" | "datetime" | "time"
        | "timestamp" | "binary" | "blob" | "bytea" | "bytes" | "varbinary" => Some("string"),
        "bool" => Some("boolean"),
        "bigint" | "smallint" | "tinyint" => Some("integer"),
        "double" | "decimal" | "real" | "numeric" => Some("number"),
        "arr" | "tuple" | "set" => Some("array"),
        "map" => Some("object"),
        _ => None,
    };
    if let Some(alias) = alias {
        return alias.to_owned();
    }
    const PREFIXES: [(&str, &str); 9] = [
        ("int", "integer"),
        ("uint", "integer"),
        ("long", "integer"),
        ("short", "integer"),
        ("unsigned", "integer"),
        ("num", "number"),
        ("float", "number"),
        ("list", "array"),
        ("dict", "object"),
    ];
    for (prefix, kind) in PREFIXES {
        if let Some(rest) = base.strip_prefix(prefix) {
            let next = rest.chars().next();
            if next.is_none_or(|c| c.is_ascii_digit() || "[<( \t".contains(c)) {
                return kind.to_owned();
            }
        }
    }
    spelled.to_owned()
}

/// The part of `Draft202012Validator.check_schema` that tool schemas get wrong in
/// practice: `type`, `required`, `properties`, `items`, `enum` and the subschema lists;
/// messages in the `jsonschema` library's words (first line).
pub(super) fn check_schema(schema: &Value, depth: usize) -> Result<(), String> {
    if depth > 64 {
        return Err("the schema is too deeply nested or contains a cycle".into());
    }
    let map = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(map) => map,
        other => {
            return Err(format!(
                "{} is not of type 'object', 'boolean'",
                py_repr(other)
            ))
        }
    };
    if let Some(kind) = map.get("type") {
        let valid = |v: &Value| v.as_str().is_some_and(|s| STANDARD_TYPES.contains(&s));
        let ok = match kind {
            Value::String(_) => valid(kind),
            Value::Array(list) => !list.is_empty() && list.iter().all(valid),
            _ => false,
        };
        if !ok {
            return Err(format!(
                "{} is not valid under any of the given schemas",
                py_repr(kind)
            ));
        }
    }
    if let Some(required) = map.get("required") {
        let Value::Array(names) = required else {
            return Err(format!("{} is not of type 'array'", py_repr(required)));
        };
        if let Some(bad) = names.iter().find(|n| !n.is_string()) {
            return Err(format!("{} is not of type 'string'", py_repr(bad)));
        }
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        match map.get(key) {
            None => {}
            Some(Value::Object(children)) => {
                for child in children.values() {
                    check_schema(child, depth + 1)?;
                }
            }
            Some(other) => return Err(format!("{} is not of type 'object'", py_repr(other))),
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
    ] {
        if let Some(child) = map.get(key) {
            check_schema(child, depth + 1)?;
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        match map.get(key) {
            None => {}
            Some(Value::Array(children)) if !children.is_empty() => {
                for child in children {
                    check_schema(child, depth + 1)?;
                }
            }
            Some(other) => return Err(format!("{} is not of type 'array'", py_repr(other))),
        }
    }
    if let Some(values) = map.get("enum").filter(|v| !v.is_array()) {
        return Err(format!("{} is not of type 'array'", py_repr(values)));
    }
    Ok(())
}

/// A JSON value as Python's `repr` writes it (the `jsonschema` messages quote values so).
fn py_repr(value: &Value) -> String {
    match value {
        Value::String(s) => format!("'{s}'"),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// Every `type` of a schema is a JSON Schema type (llama.cpp's `json-schema-to-grammar`):
/// else the path and the type, as its error names them.
pub(super) fn schema_types(schema: &Value, path: &str) -> Result<(), String> {
    let Value::Object(map) = schema else {
        return Ok(());
    };
    const TYPES: [&str; 7] = [
        "null", "boolean", "object", "array", "number", "string", "integer",
    ];
    let bad = |t: &Value| t.as_str().filter(|s| !TYPES.contains(s)).map(str::to_owned);
    match map.get("type") {
        Some(t @ Value::String(_)) => {
            if let Some(t) = bad(t) {
                return Err(format!("{path}: unrecognized type {t}"));
            }
        }
        Some(Value::Array(list)) => {
            if let Some(t) = list.iter().find_map(bad) {
                return Err(format!("{path}: unrecognized type {t}"));
            }
        }
        _ => {}
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, child) in props {
            schema_types(child, &format!("{path}/properties/{name}"))?;
        }
    }
    if let Some(items) = map.get("items") {
        schema_types(items, &format!("{path}/items"))?;
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = map.get(key) {
            for (i, child) in list.iter().enumerate() {
                schema_types(child, &format!("{path}/{key}/{i}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_types_are_normalized_like_sglang() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "varchar(20)"}, "b": {"type": ["int64", "integer", "null"]}, "c": {"type": "List[str]", "items": {"type": "Float"}}, "d": {"type": "interval"}}});
        normalize_schema_types(&mut s);
        assert_eq!(
            s,
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": ["integer", "null"]}, "c": {"type": "array", "items": {"type": "number"}}, "d": {"type": "interval"}}})
        );
    }
}

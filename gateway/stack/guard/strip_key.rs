//! Removing one top-level member from a JSON object's text, without re-serialising it.
//!
//! The guard asks OpenAI-format engines for usage in every stream chunk (its early
//! prompt-count check) and takes it out again of chunks the client did not ask it for.
//! Parsing a chunk is needed anyway for the checks; writing it back out is not: the member's
//! byte span is cut from the engine's own text, so everything else reaches the client byte
//! for byte. The scan tracks only strings (with escapes) and nesting depth, which is all it
//! takes to tell a top-level key from the same text inside a string or a nested object.

/// `json` (an object) without its top-level member `key`; `None` when `json` is not an
/// object this scanner understands (the caller falls back to re-serialising) or has no such
/// member.
pub fn without_top_level_key(json: &str, key: &str) -> Option<String> {
    let bytes = json.as_bytes();
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    // (start of the member, including a preceding comma if any; end of its value)
    let mut previous_comma: Option<usize> = None;
    loop {
        let member = skip_ws(bytes, i);
        match bytes.get(member) {
            Some(b'"') => {}
            Some(b'}') => return None,
            _ => return None,
        }
        let key_end = string_end(bytes, member)?;
        let is_key = json.get(member + 1..key_end - 1) == Some(key);
        let colon = skip_ws(bytes, key_end);
        if bytes.get(colon) != Some(&b':') {
            return None;
        }
        let value_end = value_end(bytes, colon + 1)?;
        let after = skip_ws(bytes, value_end);
        let next = bytes.get(after).copied();
        if is_key {
            let (cut_from, cut_to) = match (previous_comma, next) {
                // `…, "key": v }` or `…, "key": v, …`: drop the comma before it.
                (Some(comma), _) => (comma, value_end),
                // `{ "key": v, …`: drop the comma after it.
                (None, Some(b',')) => (member, skip_ws(bytes, after + 1)),
                // `{ "key": v }`: the only member.
                (None, _) => (member, value_end),
            };
            let mut out = String::with_capacity(json.len());
            out.push_str(json.get(..cut_from)?);
            out.push_str(json.get(cut_to..)?);
            return Some(out);
        }
        match next {
            Some(b',') => {
                previous_comma = Some(value_end);
                i = after + 1;
            }
            _ => return None,
        }
    }
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes
        .get(i)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// The index just past the string starting at `start` (a `"`).
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index just past the value starting at or after `start`.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = skip_ws(bytes, start);
    let mut depth = 0usize;
    loop {
        match *bytes.get(i)? {
            b'"' => {
                i = string_end(bytes, i)?;
                if depth == 0 {
                    return Some(i);
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    return Some(i); // the end of the enclosing object: a scalar ended
                }
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn reference(json: &str, key: &str) -> Option<Value> {
        let mut v: Value = serde_json::from_str(json).ok()?;
        v.as_object_mut()?.remove(key)?;
        Some(v)
    }

    #[test]
    fn the_member_goes_and_everything_else_stays_byte_for_byte() {
        let chunk = r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"a \"usage\": {x}"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;
        assert_eq!(
            without_top_level_key(chunk, "usage").as_deref(),
            Some(r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"a \"usage\": {x}"}}]}"#)
        );
        for (input, want) in [
            (r#"{"usage":1,"a":2}"#, r#"{"a":2}"#),
            (r#"{ "a" : 1 , "usage" : null }"#, r#"{ "a" : 1 }"#),
            (r#"{"usage":{"n":[1,{"usage":2}]}}"#, r#"{}"#),
            (r#"{"a":{"usage":1},"usage":"x,}"}"#, r#"{"a":{"usage":1}}"#),
        ] {
            assert_eq!(
                without_top_level_key(input, "usage").as_deref(),
                Some(want),
                "{input}"
            );
        }
        assert_eq!(without_top_level_key(r#"{"a":{"usage":1}}"#, "usage"), None);
        assert_eq!(without_top_level_key("[1]", "usage"), None);
        assert_eq!(without_top_level_key(r#"{"usage":"#, "usage"), None);
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z\"\\\\{},:\\[\\] ]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("(usage|id|[a-z]{1,3})", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn agrees_with_removing_from_the_parsed_value(
            members in prop::collection::btree_map("(usage|id|[a-z]{1,3})", any_json(), 0..5),
            pretty in any::<bool>(),
        ) {
            let object = Value::Object(members.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                serde_json::to_string(&object).unwrap()
            };
            let stripped = without_top_level_key(&text, "usage")
                .map(|s| serde_json::from_str::<Value>(&s).unwrap());
            prop_assert_eq!(stripped, reference(&text, "usage"));
        }
    }

    #[test]
    fn a_chunk_without_usage_is_left_alone() {
        let chunk = json!({"id": "x", "choices": []}).to_string();
        assert_eq!(without_top_level_key(&chunk, "usage"), None);
    }
}

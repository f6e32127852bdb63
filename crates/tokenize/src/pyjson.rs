//! Python's `json.dumps` as HF's chat-template `tojson` filter uses it, so rendered prompts
//! (and so token counts) match transformers byte for byte.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`.
///
/// minijinja's built-in `tojson` escapes HTML characters and uses compact separators, which
/// would change the rendered prompt and so the token count.
/// The template variable that asks for llama.cpp's float printing (its own Jinja engine,
/// `common/jinja/value.cpp` `tojson`, writes doubles as C++ `ostream` does: 6 significant
/// digits). Set by `prepare::llama_cpp`.
pub(crate) const CPP_FLOATS_VARIABLE: &str = "__kvgate_cpp_floats";

pub(crate) fn tojson(
    state: &minijinja::State,
    value: Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let cpp_floats = state
        .lookup(CPP_FLOATS_VARIABLE)
        .is_some_and(|v| v.is_true());
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v)?;
                Some(" ".repeat(usize::try_from(n.max(0)).unwrap_or(0)))
            }
        },
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(seps) if !seps.is_none() => {
            let item = seps.get_item_by_index(0)?;
            let key = seps.get_item_by_index(1)?;
            (
                item.as_str().unwrap_or(",").to_string(),
                key.as_str().unwrap_or(":").to_string(),
            )
        }
        // Python's defaults: ", " without indent, "," with it.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        cpp_floats,
        ensure_ascii: false,
    };
    let mut out = String::new();
    style.write(&mut out, &json, 0);
    Ok(out)
}

/// The layout options of Python's `json.dumps`.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    /// Floats as C++ prints them (llama.cpp) rather than as Python's `repr`.
    cpp_floats: bool,
    /// Every character outside printable ASCII as `\uXXXX` (Python's default).
    ensure_ascii: bool,
}

/// Python's `json.dumps(value)` with its defaults: `", "` and `": "` separators, no indent,
/// keys in insertion order and `ensure_ascii=True` (every character outside `' '..='~'`
/// escaped as `\uXXXX`, astral characters as a UTF-16 surrogate pair; CPython
/// `Lib/json/encoder.py` `py_encode_basestring_ascii`). SGLang writes an Anthropic
/// `tool_use` block's `input` as its tool call's `arguments` this way.
pub(crate) fn python_dumps(value: &serde_json::Value) -> String {
    let style = JsonStyle {
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        sort_keys: false,
        cpp_floats: false,
        ensure_ascii: true,
    };
    let mut out = String::new();
    style.write(&mut out, value, 0);
    out
}

/// A JSON string literal as `py_encode_basestring_ascii` writes it.
fn ascii_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

impl JsonStyle {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &serde_json::Value, depth: usize) {
        match value {
            serde_json::Value::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push(']');
            }
            serde_json::Value::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.string(out, key);
                    out.push_str(&self.key_sep);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push('}');
            }
            // Floats print like Python's `repr` (`1e+20`, `1.5e-07`), not like Rust's.
            serde_json::Value::Number(n) if n.is_f64() => match n.as_f64() {
                Some(f) if self.cpp_floats => out.push_str(&cpp_float(f)),
                Some(f) => out.push_str(&python_float_repr(f)),
                None => out.push_str(&n.to_string()),
            },
            serde_json::Value::String(s) => self.string(out, s),
            // Other scalars and empty containers.
            other => out.push_str(&other.to_string()),
        }
    }

    /// A string literal. serde_json escapes strings the way `ensure_ascii=False` does
    /// (control characters, `"` and `\\` only).
    fn string(&self, out: &mut String, s: &str) {
        if self.ensure_ascii {
            ascii_string(out, s);
        } else {
            out.push_str(&serde_json::Value::String(s.to_owned()).to_string());
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, in fixed notation when the
/// decimal exponent is in `-4..16` (always with a fractional part), else in scientific
/// notation with a signed, at least two-digit exponent.
fn python_float_repr(f: f64) -> String {
    if !f.is_finite() {
        // json.dumps writes these (allow_nan=True); serde_json values never hold them.
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's `{:e}` gives the same shortest digits: "1.5e-7", "-0e0", "1e20".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else {
            let point = point as usize;
            if digits.len() > point {
                format!("{}.{}", &digits[..point], &digits[point..])
            } else {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            }
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.unsigned_abs())
    }
}

/// C++ `std::ostream << double` with the default precision (`%g`, 6 significant digits):
/// `1.0` → `1`, `3.14159265` → `3.14159`, `1e20` → `1e+20`, `1.5e-7` → `1.5e-07`.
fn cpp_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        }
        .into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{f:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.unsigned_abs())
    } else {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{f:.decimals$}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_cpp_ostream_for_llama_cpp() {
        for (f, want) in [
            (1.0, "1"),
            (3.14159265, "3.14159"),
            (1e20, "1e+20"),
            (1.5e-7, "1.5e-07"),
            (-0.0, "-0"),
            (1.5, "1.5"),
            (123456.7, "123457"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
        ] {
            assert_eq!(cpp_float(f), want, "{f}");
        }
    }

    #[test]
    fn python_dumps_escapes_like_ensure_ascii() {
        let value = serde_json::json!({
            "path": "caf\u{e9} \u{1F600} \u{7f}", "q": "a\"b\\c\n\t\u{1}",
            "n": [1, -2, 1.5, 1e20, 0.1, true, null], "e": {}, "l": [],
        });
        assert_eq!(
            python_dumps(&value),
            r#"{"path": "caf\u00e9 \ud83d\ude00 \u007f", "q": "a\"b\\c\n\t\u0001", "n": [1, -2, 1.5, 1e+20, 0.1, true, null], "e": {}, "l": []}"#
        );
        // Keys are escaped too; CJK stays in the BMP (one escape).
        assert_eq!(
            python_dumps(&serde_json::json!({"\u{4f60}": "\u{597d}"})),
            r#"{"\u4f60": "\u597d"}"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1.5e-7, "1.5e-07"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (2.5, "2.5"),
            (-123.456, "-123.456"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }
}

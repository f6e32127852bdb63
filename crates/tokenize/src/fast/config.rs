//! Reads the parts of `tokenizer.json` the count-only path must reproduce, and refuses
//! (with a reason) every configuration it does not model exactly.

use serde::Deserialize;
use serde_json::Value;

/// The normalizers the fast path reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Normalize {
    /// No normalizer, or an empty `Sequence`.
    Identity,
    /// Unicode NFC (Qwen2/Qwen3).
    Nfc,
}

impl Normalize {
    /// The most UTF-8 bytes one input byte can become (Unicode's documented maximum
    /// expansion of NFC in UTF-8 is 3×, e.g. U+1D160 → three 4-byte code points).
    pub(crate) fn max_expansion(self) -> usize {
        match self {
            Normalize::Identity => 1,
            Normalize::Nfc => 3,
        }
    }
}

/// What the fast path needs, taken from `tokenizer.json`.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) normalize: Normalize,
    /// The `Split` regexes, applied in sequence, before the final `ByteLevel`.
    pub(crate) split_patterns: Vec<String>,
    /// Added tokens matched on the raw text (`normalized: false`).
    pub(crate) raw_tokens: Vec<String>,
    /// Their ids, in the same order.
    pub(crate) raw_token_ids: Vec<u32>,
    /// Added tokens matched on normalized text (`normalized: true`).
    pub(crate) normalized_tokens: Vec<String>,
    /// Their ids, in the same order.
    pub(crate) normalized_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    pre_tokenizer: Value,
    #[serde(default)]
    post_processor: Value,
    #[serde(default)]
    truncation: Value,
    #[serde(default)]
    padding: Value,
    model: ModelHead,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
}

/// Only the model's type and dropout matter; vocab and merges are read by `tokenizers`.
#[derive(Deserialize)]
struct ModelHead {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Value,
}

/// Interprets `tokenizer.json`; `Err` says why the fast path cannot be exact for it.
pub(crate) fn plan(tokenizer_json: &str) -> Result<Plan, String> {
    let file: File = serde_json::from_str(tokenizer_json).map_err(|e| e.to_string())?;
    if !file.truncation.is_null() || !file.padding.is_null() {
        return Err("truncation or padding is configured".into());
    }
    // `kind` is absent in old BPE files; `tokenizers` then infers BPE from the fields.
    if file.model.kind.as_deref().is_some_and(|k| k != "BPE") {
        return Err(format!("model type {:?} is not BPE", file.model.kind));
    }
    if !file.model.dropout.is_null() {
        return Err("BPE dropout makes counts random".into());
    }
    post_processor_supported(&file.post_processor)?;
    let normalize = normalizer(&file.normalizer)?;
    let split_patterns = pre_tokenizer(&file.pre_tokenizer)?;
    let mut raw_tokens = Vec::new();
    let mut raw_token_ids = Vec::new();
    let mut normalized_tokens = Vec::new();
    let mut normalized_token_ids = Vec::new();
    for t in file.added_tokens {
        if t.single_word || t.lstrip || t.rstrip {
            return Err(format!(
                "added token {:?} uses single_word/lstrip/rstrip",
                t.content
            ));
        }
        if t.content.is_empty() {
            return Err("empty added token".into());
        }
        if t.normalized {
            if normalize != Normalize::Identity {
                // HF matches the token's *normalized* form; not modelled.
                return Err("normalized added tokens with a non-identity normalizer".into());
            }
            normalized_tokens.push(t.content);
            normalized_token_ids.push(t.id);
        } else {
            raw_tokens.push(t.content);
            raw_token_ids.push(t.id);
        }
    }
    Ok(Plan {
        normalize,
        split_patterns,
        raw_tokens,
        raw_token_ids,
        normalized_tokens,
        normalized_token_ids,
    })
}

fn kind(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

fn normalizer(v: &Value) -> Result<Normalize, String> {
    if v.is_null() {
        return Ok(Normalize::Identity);
    }
    match kind(v) {
        Some("NFC") => Ok(Normalize::Nfc),
        Some("Sequence") => {
            let list = v
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or("normalizer Sequence without a list")?;
            let mut out = Normalize::Identity;
            for n in list {
                match (out, normalizer(n)?) {
                    (_, Normalize::Identity) => {}
                    (Normalize::Identity, other) => out = other,
                    // NFC is idempotent.
                    (Normalize::Nfc, Normalize::Nfc) => {}
                }
            }
            Ok(out)
        }
        other => Err(format!("normalizer {other:?} is not supported")),
    }
}

/// `Sequence[Split(Regex, Isolated, invert=false)..., ByteLevel(use_regex=false,
/// add_prefix_space=false)]`, or that `ByteLevel` alone.
fn pre_tokenizer(v: &Value) -> Result<Vec<String>, String> {
    let list: Vec<&Value> = match kind(v) {
        Some("Sequence") => v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .ok_or("pre-tokenizer Sequence without a list")?
            .iter()
            .collect(),
        Some(_) => vec![v],
        None => return Err("no pre-tokenizer: not a byte-level BPE".into()),
    };
    let Some((last, splits)) = list.split_last() else {
        return Err("empty pre-tokenizer Sequence".into());
    };
    let flag = |v: &Value, key: &str| v.get(key).and_then(Value::as_bool);
    if kind(last) != Some("ByteLevel")
        || flag(last, "use_regex") != Some(false)
        || flag(last, "add_prefix_space") != Some(false)
    {
        return Err(
            "the last pre-tokenizer is not ByteLevel(use_regex=false, add_prefix_space=false)"
                .into(),
        );
    }
    let mut patterns = Vec::new();
    for s in splits {
        if kind(s) != Some("Split")
            || s.get("behavior").and_then(Value::as_str) != Some("Isolated")
            || flag(s, "invert") != Some(false)
        {
            return Err(format!("pre-tokenizer {s} is not Split(Isolated)"));
        }
        let pattern = s.get("pattern").ok_or("Split without a pattern")?;
        if let Some(re) = pattern.get("Regex").and_then(Value::as_str) {
            patterns.push(re.to_string());
        } else if let Some(lit) = pattern.get("String").and_then(Value::as_str) {
            patterns.push(regex_escape(lit));
        } else {
            return Err("Split pattern is neither Regex nor String".into());
        }
    }
    Ok(patterns)
}

fn regex_escape(lit: &str) -> String {
    let mut out = String::with_capacity(lit.len() * 2);
    for c in lit.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Post-processors whose only effect on ids is adding a fixed number of special tokens.
fn post_processor_supported(v: &Value) -> Result<(), String> {
    match kind(v) {
        None if v.is_null() => Ok(()),
        Some("ByteLevel" | "TemplateProcessing" | "BertProcessing" | "RobertaProcessing") => Ok(()),
        Some("Sequence") => v
            .get("processors")
            .and_then(Value::as_array)
            .ok_or_else(|| "post-processor Sequence without a list".to_string())?
            .iter()
            .try_for_each(post_processor_supported),
        other => Err(format!("post-processor {other:?} is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_configurations_are_refused() {
        let base = |normalizer: &str, pre: &str| {
            format!(
                r#"{{"added_tokens": [], "normalizer": {normalizer}, "pre_tokenizer": {pre}, "post_processor": null, "model": {{"type": "BPE", "dropout": null}}}}"#
            )
        };
        let bl = r#"{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}"#;
        assert!(plan(&base("null", bl)).is_ok());
        assert!(plan(&base(r#"{"type": "NFKC"}"#, bl)).is_err());
        let gpt2 = r#"{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}"#;
        assert!(plan(&base("null", gpt2)).is_err());
        let removed = format!(
            r#"{{"type": "Sequence", "pretokenizers": [{{"type": "Split", "pattern": {{"Regex": "a"}}, "behavior": "Removed", "invert": false}}, {bl}]}}"#
        );
        assert!(plan(&base("null", &removed)).is_err());
        assert_eq!(regex_escape("a.b|"), r"a\.b\|");
    }
}

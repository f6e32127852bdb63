//! The reference fixtures of `tests/fixtures/tokenize/` (Python `tokenizers` 0.23.3 and
//! `transformers` 5.24.0): every id list, count and rendered chat must match exactly, through
//! the plain encode and through every fast counting entry point (and the fast ids path).

use std::path::PathBuf;
use std::sync::LazyLock;

use kvgate_tokenize::{Count, ModelTokenizer};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load(model: &str) -> ModelTokenizer {
    let dir = root().join("config/tokenizers").join(model);
    ModelTokenizer::from_dir(&dir).expect("tokenizer files ship with the repository")
}

static QWEN3: LazyLock<ModelTokenizer> = LazyLock::new(|| load("qwen3"));
static DEEPSEEK: LazyLock<ModelTokenizer> = LazyLock::new(|| load("deepseek_v3"));

fn tokenizer(model: &str) -> &'static ModelTokenizer {
    match model {
        "qwen3" => &QWEN3,
        "deepseek_v3" => &DEEPSEEK,
        other => panic!("unknown model {other}"),
    }
}

/// The cases of a fixture file, without its `_meta` header line.
fn cases(file: &str) -> Vec<Value> {
    let path = root().join("tests/fixtures/tokenize").join(file);
    let text = std::fs::read_to_string(&path).expect("fixture file");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object per line"))
        .filter(|v| v.get("_meta").is_none())
        .collect()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|i| u32::try_from(i.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

/// DeepSeek-V3's `tokenizer_config.json` has `add_bos_token: true`: `ModelTokenizer::encode`
/// with special tokens prepends BOS (id 0) like transformers 4.x / SGLang; the `tokenizers`
/// library (and so the fixtures) does not. Qwen3 adds nothing.
fn documented_bos(model: &str) -> Vec<u32> {
    match model {
        "deepseek_v3" => vec![0],
        _ => Vec::new(),
    }
}

/// Checks one text case; returns what went wrong.
fn check_text(case: &Value) -> Result<(), String> {
    let model = case["model"].as_str().ok_or("model")?;
    let tok = tokenizer(model);
    let text = case["text"].as_str().ok_or("text")?;
    let ast = case["add_special_tokens"].as_bool().ok_or("ast")?;
    let want = ids_of(&case["ids"]);
    // Library semantics: with these files add_special_tokens adds nothing in `tokenizers`.
    let raw = tok.encode(text, false).map_err(|e| e.to_string())?;
    if raw != want {
        return Err(format!(
            "raw ids differ: {} vs {} ids",
            raw.len(),
            want.len()
        ));
    }
    let with = tok.encode(text, ast).map_err(|e| e.to_string())?;
    let expected_with: Vec<u32> = if ast {
        documented_bos(model)
            .into_iter()
            .chain(want.iter().copied())
            .collect()
    } else {
        want.clone()
    };
    if with != expected_with {
        return Err("encode(text, add_special_tokens) is not raw + documented BOS".into());
    }
    if tok.ids_fast(text, ast).map_err(|e| e.to_string())? != with {
        return Err("ids_fast(text, add_special_tokens) differs from encode".into());
    }
    let fast = tok.count_fast(text, ast).map_err(|e| e.to_string())?;
    if fast != with.len() || tok.count(text, ast).map_err(|e| e.to_string())? != with.len() {
        return Err(format!("count_fast {fast} != encode len {}", with.len()));
    }
    let n = with.len();
    if tok.count_up_to(text, ast, n).map_err(|e| e.to_string())? != Count::Exact(n) {
        return Err("count_up_to at the exact limit is not Exact".into());
    }
    if n > 0 {
        match tok
            .count_up_to(text, ast, n - 1)
            .map_err(|e| e.to_string())?
        {
            // Exact when counting finished anyway (e.g. BOS alone passes a limit of 0).
            Count::Exact(m) if m == n => {}
            Count::Over { at_least } if at_least > n - 1 && at_least <= n => {}
            other => return Err(format!("count_up_to(limit = n-1) gave {other:?}")),
        }
    }
    let chat = tok.count_rendered_chat(text).map_err(|e| e.to_string())?;
    if chat != want.len() {
        return Err(format!("count_rendered_chat {chat} != {}", want.len()));
    }
    if tok.token_upper_bound(text.len(), ast) < n {
        return Err("token_upper_bound below the count".into());
    }
    Ok(())
}

fn check_chat(case: &Value) -> Result<(), String> {
    let model = case["model"].as_str().ok_or("model")?;
    let tok = tokenizer(model);
    let tools = case.get("tools").filter(|t| !t.is_null());
    let agp = case["add_generation_prompt"].as_bool().ok_or("agp")?;
    let kwargs = case.get("template_kwargs").filter(|k| !k.is_null());
    let rendered = tok.apply_chat_template_with(&case["messages"], tools, agp, kwargs);
    if case.get("error").is_some() {
        return match rendered {
            Err(_) => Ok(()),
            Ok(r) => Err(format!("rendered instead of failing: {r:?}")),
        };
    }
    let rendered = rendered.map_err(|e| format!("render failed: {e}"))?;
    let want = case["rendered"].as_str().ok_or("rendered")?;
    if rendered != want {
        return Err(format!(
            "rendered differs:\n got {rendered:?}\nwant {want:?}"
        ));
    }
    let want_ids = ids_of(&case["ids"]);
    if tok.encode(&rendered, false).map_err(|e| e.to_string())? != want_ids {
        return Err("ids differ".into());
    }
    if tok.ids_fast(&rendered, false).map_err(|e| e.to_string())? != want_ids {
        return Err("ids_fast differs".into());
    }
    if tok
        .ids_rendered_chat(&rendered)
        .map_err(|e| e.to_string())?
        != want_ids
    {
        return Err("ids_rendered_chat differs".into());
    }
    let fast = tok
        .count_fast(&rendered, false)
        .map_err(|e| e.to_string())?;
    let chat = tok
        .count_rendered_chat(&rendered)
        .map_err(|e| e.to_string())?;
    if fast != want_ids.len() || chat != want_ids.len() {
        return Err(format!(
            "count_fast {fast} / chat {chat} != {}",
            want_ids.len()
        ));
    }
    Ok(())
}

fn run(file: &str, check: fn(&Value) -> Result<(), String>) -> usize {
    let all = cases(file);
    let mut failures = Vec::new();
    for case in &all {
        if let Err(why) = check(case) {
            failures.push(format!("{}: {why}", case["id"]));
        }
    }
    println!(
        "{file}: {} of {} cases pass",
        all.len() - failures.len(),
        all.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    all.len()
}

#[test]
fn text_cases_match_the_tokenizers_library() {
    assert_eq!(run("text_cases.jsonl", check_text), 436);
}

#[test]
fn chat_cases_match_transformers_5() {
    assert_eq!(run("chat_cases.jsonl", check_chat), 230);
}

#[test]
fn both_models_use_the_fast_path() {
    assert_eq!(QWEN3.fast_count_unsupported(), None);
    assert_eq!(DEEPSEEK.fast_count_unsupported(), None);
}

/// Byte bound on the whole corpus: tokens ≤ bytes (× 3 for NFC) + BOS/EOS.
#[test]
fn token_upper_bound_holds_on_the_corpus() {
    for case in cases("text_cases.jsonl") {
        let tok = tokenizer(case["model"].as_str().unwrap_or_default());
        let text = case["text"].as_str().unwrap_or_default();
        let count = case["count"].as_u64().unwrap_or_default() as usize;
        assert!(
            count <= tok.token_upper_bound(text.len(), false),
            "{}",
            case["id"]
        );
        if case["model"] == "deepseek_v3" {
            // No normalizer: plain tokens ≤ bytes; BOS adds one with special tokens.
            assert!(count <= text.len());
            assert_eq!(DEEPSEEK.token_upper_bound(text.len(), true), text.len() + 1);
        }
    }
    // NFC can make more tokens than input bytes: U+1D160 (4 bytes) is 3 code points in NFC.
    let text = "\u{1D160}".repeat(50);
    let n = QWEN3.count(&text, false).unwrap_or_default();
    assert!(n <= QWEN3.token_upper_bound(text.len(), false), "{n}");
    assert_eq!(QWEN3.count_fast(&text, false).ok(), Some(n));
}

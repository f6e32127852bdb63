//! Property tests: on random text built from the pieces that stress each step (whitespace
//! runs, newlines before letters, digits, CJK, emoji, NFD marks, added-token strings and
//! their look-alikes), every fast entry point equals the library's encode — also with
//! parallel cutting forced on small texts.

use std::path::PathBuf;
use std::sync::LazyLock;

use proptest::prelude::*;

use crate::{Count, CountConfig, ModelTokenizer};

fn load(model: &str, config: CountConfig) -> ModelTokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("config/tokenizers")
        .join(model);
    ModelTokenizer::from_files_with(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        config,
    )
    .expect("tokenizer files ship with the repository")
}

/// Cuts every text of 64 bytes or more into up to 4 chunks, and keeps caches tiny so
/// eviction happens all the time.
fn forced() -> CountConfig {
    CountConfig {
        threads: 4,
        parallel_min_bytes: 64,
        piece_cache_entries: 64,
        segment_cache_entries: 32,
        segment_cache_bytes: 4096,
    }
}

static QWEN3: LazyLock<ModelTokenizer> = LazyLock::new(|| load("qwen3", CountConfig::default()));
static DEEPSEEK: LazyLock<ModelTokenizer> =
    LazyLock::new(|| load("deepseek_v3", CountConfig::default()));
static QWEN3_CUT: LazyLock<ModelTokenizer> = LazyLock::new(|| load("qwen3", forced()));
static DEEPSEEK_CUT: LazyLock<ModelTokenizer> = LazyLock::new(|| load("deepseek_v3", forced()));

const SPECIALS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<|fim_prefix|>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<|EOT|>",
    // look-alikes
    "<|im_sta",
    "<|IM_START|>",
    "<| im_start |>",
    "<|User|>",
    "<｜User",
    "<thin",
    "<|im_start|\n>",
    "<<|im_end|>>",
];

const FIXED: &[&str] = &[
    "'s",
    "'LL",
    "'re",
    " 's",
    "\r\n",
    "\n\n\n",
    "\t\t",
    "\u{a0}",
    "\u{3000}",
    "\u{2028}",
    "你好世界",
    "日本語のテキスト",
    "カタカナ",
    "한국어",
    "Ελληνικά",
    "русский",
    "עברית",
    "हिन्दी",
    "क़",
    "😀",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "e\u{301}",
    "A\u{30a}",
    "\u{1d160}",
    "\u{fb2c}",
    "é",
    "ñ",
    "ü",
    "\u{0}",
    "\u{7}",
    "\u{1b}[0m",
    "\u{feff}",
    "\u{200b}",
    "...",
    "!!!",
    "?!",
    "->",
    "::",
    "{}",
    "();",
    "#include",
    "0x1F",
    "3.14159",
    "1,000,000",
    "١٢٣",
    "½",
    "²",
    "https://example.com/a?b=c",
    "foo_bar",
    "CamelCase",
    "ALLCAPS",
];

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        2 => (1usize..300).prop_map(|n| " ".repeat(n)),
        1 => (1usize..6, 1usize..6).prop_map(|(a, b)| format!("{}\n{}", " ".repeat(a), "\t".repeat(b))),
        2 => "[a-zA-Z]{0,3}".prop_map(|w| format!("\n{w}")),
        1 => "[ \t\r\n]{1,8}",
        2 => "[0-9]{1,9}",
        2 => "[!-/:-@\\[-`{-~]{1,4}",
        2 => proptest::sample::select(SPECIALS).prop_map(str::to_string),
        3 => proptest::sample::select(FIXED).prop_map(str::to_string),
        1 => any::<char>().prop_map(|c| c.to_string()),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..60).prop_map(|v| v.concat())
}

fn check(tok: &ModelTokenizer, text: &str, limit: usize) -> Result<(), TestCaseError> {
    for ast in [false, true] {
        let want = tok
            .encode(text, ast)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let n = want.len();
        prop_assert_eq!(tok.count_fast(text, ast).ok(), Some(n), "ast={}", ast);
        // Twice: the second call takes its pre-tokens from the shared ids cache.
        for _ in 0..2 {
            let ids = tok.ids_fast(text, ast).ok();
            prop_assert_eq!(ids.as_ref(), Some(&want), "ids ast={}", ast);
        }
        let up_to = tok.count_up_to(text, ast, limit).ok();
        match up_to {
            Some(Count::Exact(m)) => prop_assert_eq!(m, n),
            Some(Count::Over { at_least }) => {
                prop_assert!(
                    at_least > limit && at_least <= n,
                    "{} {} {}",
                    at_least,
                    limit,
                    n
                )
            }
            None => prop_assert!(false, "count_up_to failed"),
        }
        prop_assert!(n <= tok.token_upper_bound(text.len(), ast));
    }
    let raw_ids = tok.encode(text, false).ok();
    // Twice: the second call is served from the segment ids cache.
    for _ in 0..2 {
        prop_assert_eq!(tok.ids_rendered_chat(text).ok(), raw_ids.clone());
    }
    let raw = tok.count(text, false).ok();
    // Twice: the second call is served from the segment cache.
    prop_assert_eq!(tok.count_rendered_chat(text).ok(), raw);
    prop_assert_eq!(tok.count_rendered_chat(text).ok(), raw);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn fast_counts_equal_encode(text in text(), limit in 0usize..200) {
        check(&QWEN3, &text, limit)?;
        check(&DEEPSEEK, &text, limit)?;
    }

    #[test]
    fn cut_and_parallel_counts_equal_encode(parts in prop::collection::vec(text(), 1..6), limit in 0usize..400) {
        // Joining with "\n" + letter plants cut points between random texts.
        let text = parts.join("\nW");
        check(&QWEN3_CUT, &text, limit)?;
        check(&DEEPSEEK_CUT, &text, limit)?;
    }
}

/// Chats grow by one message; the cached count must follow exactly.
#[test]
fn appended_conversations_count_exactly() {
    for tok in [&*QWEN3_CUT, &*DEEPSEEK_CUT] {
        let mut messages = Vec::new();
        for i in 0..40 {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let content = format!(
                "message {i}: {}\nNext line é 你好 {}",
                "word ".repeat(i * 7),
                i * 31
            );
            messages.push(serde_json::json!({"role": role, "content": content}));
            let rendered = tok
                .apply_chat_template(&serde_json::Value::Array(messages.clone()), None, true)
                .unwrap();
            assert_eq!(
                tok.count_rendered_chat(&rendered).unwrap(),
                tok.count(&rendered, false).unwrap()
            );
            let ids = tok.encode(&rendered, false).unwrap();
            assert_eq!(tok.ids_fast(&rendered, false).unwrap(), ids);
            assert_eq!(tok.ids_rendered_chat(&rendered).unwrap(), ids);
        }
    }
}

//! The engines' rules on the Qwen3 template, where their outputs differ (the zoo and the
//! llama.cpp tests hold SGLang's and llama.cpp's to the engines themselves).

use super::*;
use crate::ModelTokenizer;
use serde_json::json;

fn qwen3() -> ModelTokenizer {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/tokenizers/qwen3");
    ModelTokenizer::from_dir(&dir).unwrap()
}

fn render(rules: ChatRules, body: Value) -> Result<String, TokenizeError> {
    let tok = qwen3();
    let request = ChatRequest::from_body(body.as_object().unwrap()).unwrap();
    tok.chat_prompt(rules, &request)
        .map(|p| p.rendered + p.appended.as_deref().unwrap_or(""))
}

#[test]
fn vllm_follows_its_worked_example() {
    // vllm_rules.md's example: parts joined with "\n", reasoning kept, arguments parsed,
    // tools with null description and parameters kept although tool_choice is "none".
    let body = json!({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": null, "reasoning_content": "r",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"});
    let out = render(ChatRules::Vllm, body.clone()).unwrap();
    assert!(out.contains("A\nB"), "{out}");
    assert!(out.contains(r#"{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}"#), "{out}");
    assert!(
        out.contains(r#"{"name": "f", "arguments": {"x": 1}}"#),
        "{out}"
    );
    // SGLang hides the tools for "none" and joins parts with one space.
    let sglang = render(ChatRules::Sglang, body.clone()).unwrap();
    assert!(
        !sglang.contains("<tools>") && sglang.contains("A B"),
        "{sglang}"
    );
    // llama.cpp keeps them, re-serialized with its own defaults.
    let llama = render(ChatRules::LlamaCpp, body).unwrap();
    assert!(
        llama.contains(r#""description": "", "parameters": {}"#),
        "{llama}"
    );
}

#[test]
fn vllm_merges_system_turns_when_the_template_has_no_developer_role() {
    let body = json!({"messages": [
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d"},
        {"role": "system", "content": "s"}]});
    let out = render(ChatRules::Vllm, body).unwrap();
    assert!(
        out.starts_with("<|im_start|>system\nd\n\ns<|im_end|>\n<|im_start|>user\nu"),
        "{out}"
    );
}

#[test]
fn continuing_the_final_message_differs_by_engine() {
    let body = json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "It is"}],
        "continue_final_message": true});
    // vLLM and llama.cpp need add_generation_prompt false with it.
    assert!(render(ChatRules::Vllm, body.clone()).is_err());
    assert!(render(ChatRules::LlamaCpp, body.clone()).is_err());
    let sglang = render(ChatRules::Sglang, body.clone()).unwrap();
    assert!(
        sglang.ends_with("<|im_start|>assistant\nIt is"),
        "{sglang:?}"
    );
    let mut explicit = body;
    explicit["add_generation_prompt"] = json!(false);
    let vllm = render(ChatRules::Vllm, explicit.clone()).unwrap();
    assert!(vllm.ends_with("It is"), "{vllm:?}");
    let llama = render(ChatRules::LlamaCpp, explicit).unwrap();
    assert!(
        llama.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\nIt is"),
        "{llama:?}"
    );
}

#[test]
fn reasoning_effort_none_turns_thinking_off_everywhere() {
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none"});
    for rules in [ChatRules::Sglang, ChatRules::Vllm, ChatRules::LlamaCpp] {
        let out = render(rules, body.clone()).unwrap();
        assert!(
            out.ends_with("<think>\n\n</think>\n\n"),
            "{rules:?}: {out:?}"
        );
    }
    let bad =
        json!({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "extreme"});
    assert!(render(ChatRules::Sglang, bad.clone()).is_err());
    assert!(render(ChatRules::Vllm, bad).is_err());
}

#[test]
fn options_key_tells_rules_and_fields_apart() {
    let fields = json!({"tool_choice": "none", "temperature": 1})
        .as_object()
        .unwrap()
        .clone();
    assert_ne!(
        options_key(ChatRules::Sglang, &fields),
        options_key(ChatRules::Vllm, &fields)
    );
    let other = json!({"tool_choice": "auto", "temperature": 1})
        .as_object()
        .unwrap()
        .clone();
    assert_ne!(
        options_key(ChatRules::Sglang, &fields),
        options_key(ChatRules::Sglang, &other)
    );
    // Fields that do not shape the prompt do not split the cache.
    let same = json!({"tool_choice": "none", "temperature": 0.2})
        .as_object()
        .unwrap()
        .clone();
    assert_eq!(
        options_key(ChatRules::Sglang, &fields),
        options_key(ChatRules::Sglang, &same)
    );
}

#[test]
fn the_final_message_cut_follows_transformers() {
    let tag = vllm::CONTINUE_TAG;
    let kept = format!("<s>assistant: The answer is {tag} </s>\n");
    assert_eq!(cut_at_tag(&kept).unwrap(), "<s>assistant: The answer is ");
    // A template that trimmed the tag's space: the text before it is right-trimmed.
    let trimmed = format!("<s>assistant: The answer is {tag}</s>\n");
    assert_eq!(cut_at_tag(&trimmed).unwrap(), "<s>assistant: The answer is");
    assert!(cut_at_tag("no tag").is_err());
}

//! What llama.cpp probes of a chat template at load (`common/jinja/caps.cpp` `caps_get`):
//! it renders test chats and looks for a needle in the output.

use serde_json::Value;

use crate::TokenizeError;

/// What llama.cpp probes of a template at load (`caps_get`), by rendering test chats.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caps {
    pub(crate) string_content: bool,
    pub(crate) typed_content: bool,
    pub(crate) system_role: bool,
    pub(crate) object_arguments: bool,
    /// The reasoning block's tags, when the template writes one (`<think>`, `</think>`).
    pub(crate) reasoning_tags: Option<(String, String)>,
}

const NEEDLE: &str = "kvgate_probe_needle";

impl Caps {
    /// Probe a template through `render(messages, add_generation_prompt)`.
    pub(crate) fn probe(
        source: &str,
        render: impl Fn(&Value, bool) -> Result<String, TokenizeError>,
    ) -> Self {
        let shows =
            |messages: Value| render(&messages, false).is_ok_and(|out| out.contains(NEEDLE));
        let user = |content: Value| serde_json::json!([{"role": "user", "content": content}]);
        let string_content = shows(user(Value::from(NEEDLE)));
        let typed_content = shows(user(serde_json::json!([{"type": "text", "text": NEEDLE}])));
        let system_role = shows(serde_json::json!([
            {"role": "system", "content": NEEDLE},
            {"role": "user", "content": "Hey"}
        ]));
        let object_arguments = shows(serde_json::json!([
            {"role": "user", "content": "Hey"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "ipython", "arguments": {"code": NEEDLE}}, "id": "call_1___"}
            ]},
            {"role": "tool", "content": "ok", "tool_call_id": "call_1___"},
            {"role": "user", "content": "Thanks"}
        ]));
        // The autoparser's tags for a `<think>` block (measured on llama-server with the
        // Qwen3 template: `<think>\n` … `\n</think>\n\n`).
        let reasoning_tags = source
            .contains("<think>")
            .then(|| ("<think>\n".to_owned(), "\n</think>\n\n".to_owned()));
        Self {
            string_content,
            typed_content,
            system_role,
            object_arguments,
            reasoning_tags,
        }
    }
}

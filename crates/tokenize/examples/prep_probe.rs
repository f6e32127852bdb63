use kvgate_tokenize::{ChatRequest, ChatRules, ModelTokenizer};
use serde_json::json;
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let tok = ModelTokenizer::from_dir(std::path::Path::new(&dir)).unwrap();
    let tools = json!([{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]);
    let cases = vec![
        (
            "plain",
            json!({"messages":[{"role":"user","content":"Hello"}]}),
        ),
        (
            "parts",
            json!({"messages":[{"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":"there"}]}]}),
        ),
        (
            "toolloop",
            json!({"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}],"tools":tools}),
        ),
        (
            "none",
            json!({"messages":[{"role":"user","content":"Hi"}],"tools":tools,"tool_choice":"none"}),
        ),
        (
            "trailing",
            json!({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello, I"}]}),
        ),
        (
            "nothink",
            json!({"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}}),
        ),
    ];
    for (name, body) in cases {
        let map = body.as_object().unwrap();
        let req = ChatRequest::from_body(map).unwrap();
        for rules in [ChatRules::Sglang, ChatRules::Vllm, ChatRules::LlamaCpp] {
            match tok.chat_prompt(rules, &req) {
                Ok(p) => println!(
                    "{name} {rules:?} {} {:?} +{:?}",
                    tok.count_chat_prompt(&p).unwrap(),
                    p.rendered,
                    p.appended
                ),
                Err(e) => println!("{name} {rules:?} ERR {e}"),
            }
        }
    }
}

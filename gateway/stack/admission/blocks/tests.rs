use super::*;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::stack::admission::{admit, ModelAdmission};
use crate::stack::api::{parse_inference, Endpoint, ModelCatalog};
use serde_json::json;

fn qwen3() -> Arc<ModelTokenizer> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen3");
    Arc::new(ModelTokenizer::from_dir(&dir).unwrap())
}

/// Admission over one pool of `workers` unified workers, hashing in blocks of 16 (or not).
fn state(workers: usize, prefix: bool) -> (AdmissionState, ModelCatalog) {
    let list: Vec<String> = (0..workers)
        .map(|i| format!("{{ url = \"http://10.0.0.{i}:1\", kv_tokens = 100000 }}"))
        .collect();
    let text = format!(
        "[server]\nallow_anonymous = true\n[[models]]\nname = \"qwen3\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\ncontext_window = 100000\n[[pools]]\nname = \"p\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{}]\n",
        list.join(", ")
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/x.toml");
    let config = Config::from_toml(&text, &path).unwrap();
    let model = ModelAdmission {
        tokenizer: qwen3(),
        context_window: 100_000,
        default_max_new_tokens: None,
        vision: None,
    };
    let state = AdmissionState {
        models: [("qwen3".to_owned(), model)].into_iter().collect(),
        fleet: Arc::new(Fleet::from_config(&config)),
        permits: Arc::new(tokio::sync::Semaphore::new(2)),
        prefix: prefix.then(|| PrefixHashing::new(16)),
    };
    (state, ModelCatalog::from_config(&config))
}

/// The chain admission hands routing for `body` (None: none handed over).
async fn chain_of(
    state: &AdmissionState,
    catalog: &ModelCatalog,
    endpoint: Endpoint,
    body: &serde_json::Value,
) -> Option<Option<Arc<[u64]>>> {
    let bytes = bytes::Bytes::from(body.to_string());
    let mut parsed = parse_inference(endpoint, &bytes, catalog).unwrap();
    let (_, _, blocks) = admit(state, &mut parsed, None, None).await.unwrap();
    match blocks {
        Some(b) => Some(b.0.chain().await),
        None => None,
    }
}

fn system() -> String {
    "You are a careful assistant. Answer in full sentences and cite sources. ".repeat(8)
}

#[tokio::test]
async fn chats_are_hashed_from_their_rendered_ids_and_repeats_from_the_cache() {
    let (state, catalog) = state(2, true);
    let tok = qwen3();
    let messages = json!([{"role": "system", "content": system()},
                          {"role": "user", "content": "What is a KV page?"}]);
    let body = json!({"model": "qwen3", "max_tokens": 8, "messages": messages});
    let rendered = tok.apply_chat_template(&messages, None, true).unwrap();
    let want: Arc<[u64]> = Arc::from(chain(&tok.encode(&rendered, false).unwrap(), 16));
    assert!(want.len() >= 5, "{} blocks", want.len());
    let first = chain_of(&state, &catalog, Endpoint::ChatCompletions, &body).await;
    assert_eq!(first, Some(Some(want.clone())));
    // The repeat is counted from the chat cache (no render): its chain from this cache.
    let again = chain_of(&state, &catalog, Endpoint::ChatCompletions, &body).await;
    assert_eq!(again, Some(Some(want)));
}

#[tokio::test]
async fn text_is_hashed_with_special_tokens_and_ids_as_given() {
    let (state, catalog) = state(2, true);
    let tok = qwen3();
    let text = system();
    let body =
        json!({"text": [text.clone(), "second sample"], "sampling_params": {"max_new_tokens": 4}});
    let want = chain(&tok.encode(&text, true).unwrap(), 16);
    let got = chain_of(&state, &catalog, Endpoint::Generate, &body).await;
    assert_eq!(
        got,
        Some(Some(Arc::from(want))),
        "the first sample's blocks"
    );
    let ids: Vec<u32> = (1000..1040).collect();
    let body = json!({"model": "qwen3", "prompt": ids, "max_tokens": 4});
    let got = chain_of(&state, &catalog, Endpoint::Completions, &body).await;
    assert_eq!(got, Some(Some(Arc::from(chain(&ids, 16)))));
}

#[tokio::test]
async fn long_prompts_are_hashed_on_the_blocking_pool() {
    let (state, catalog) = state(2, true);
    let tok = qwen3();
    let text = "Long document line about paged attention and prefix caches.\n".repeat(400);
    assert!(text.len() > INLINE_COUNT_BYTES);
    let body = json!({"text": text, "sampling_params": {"max_new_tokens": 4}});
    let want = chain(&tok.encode(&text, true).unwrap(), 16);
    let got = chain_of(&state, &catalog, Endpoint::Generate, &body).await;
    assert_eq!(got, Some(Some(Arc::from(want))));
}

#[tokio::test]
async fn nothing_is_hashed_when_no_pool_chooses_or_the_prompt_is_under_a_block() {
    let body = json!({"text": system(), "sampling_params": {"max_new_tokens": 4}});
    let (off, catalog) = state(2, false);
    assert_eq!(
        chain_of(&off, &catalog, Endpoint::Generate, &body).await,
        None
    );
    let (single, catalog) = state(1, true);
    assert_eq!(
        chain_of(&single, &catalog, Endpoint::Generate, &body).await,
        None
    );
    let (on, catalog) = state(2, true);
    let short = json!({"text": "hi", "sampling_params": {"max_new_tokens": 4}});
    assert_eq!(
        chain_of(&on, &catalog, Endpoint::Generate, &short).await,
        None
    );
}

/// Admission for a vision model (the Qwen2.5-VL stand-in) over two unified workers that
/// choose by prefix.
fn vision_state() -> (AdmissionState, ModelCatalog) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = format!(
        "[server]\nallow_anonymous = true\n[[models]]\nname = \"vl\"\ntokenizer = \"tokenizers/qwen2_5_vl/tokenizer.json\"\nchat_template = \"tokenizers/qwen2_5_vl/tokenizer_config.json\"\ncontext_window = 100000\n[models.vision]\nfamily = \"qwen2_5_vl\"\npreprocessor_config = \"vision/Qwen2.5-VL-7B-Instruct/preprocessor_config.json\"\n[[pools]]\nname = \"p\"\nmodel = \"vl\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{{ url = \"http://10.0.0.1:1\", kv_tokens = 100000 }}, {{ url = \"http://10.0.0.2:1\", kv_tokens = 100000 }}]\n"
    );
    let config = Config::from_toml(&text, &root.join("config/x.toml")).unwrap();
    let tokenizer =
        Arc::new(ModelTokenizer::from_dir(&root.join("config/tokenizers/qwen2_5_vl")).unwrap());
    let vision = crate::vision::ModelVision::from_config(&config).unwrap();
    let model = ModelAdmission {
        tokenizer,
        context_window: 100_000,
        default_max_new_tokens: None,
        vision: Some((vision["vl"].clone(), Some(151_655))),
    };
    let state = AdmissionState {
        models: [("vl".to_owned(), model)].into_iter().collect(),
        fleet: Arc::new(Fleet::from_config(&config)),
        permits: Arc::new(tokio::sync::Semaphore::new(2)),
        prefix: Some(PrefixHashing::new(16)),
    };
    (state, ModelCatalog::from_config(&config))
}

fn image_chat(file: &str) -> serde_json::Value {
    use base64::Engine as _;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vision/images")
        .join(file);
    let data = base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap());
    json!({"model": "vl", "max_tokens": 4, "messages": [
        {"role": "system", "content": system()},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}},
            {"type": "text", "text": "What is in this picture? Describe it in detail, please."}
        ]}
    ]})
}

#[tokio::test]
async fn two_different_images_of_one_size_never_look_like_one_prefix() {
    let (state, catalog) = vision_state();
    let chain_of_image = |file: &'static str| {
        let state = &state;
        let catalog = &catalog;
        async move {
            chain_of(state, catalog, Endpoint::ChatCompletions, &image_chat(file))
                .await
                .flatten()
                .expect("a chain")
        }
    };
    // Both 57x43: the same number of image tokens, the same text around them.
    let png = chain_of_image("png_57x43.png").await;
    let jpeg = chain_of_image("jpeg_gray_57x43.jpg").await;
    assert_eq!(png.len(), jpeg.len());
    assert_eq!(
        png,
        chain_of_image("png_57x43.png").await,
        "the same image: the same chain"
    );
    let same = png
        .iter()
        .zip(jpeg.iter())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(same >= 5, "the system prompt's blocks are shared ({same})");
    assert!(same < png.len(), "from the image's block on, they differ");
}

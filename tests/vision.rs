//! Images admitted exactly (issue 41), end to end: a gateway in front of a simulated
//! Qwen2.5-VL engine, whose image counts are its own implementation (`crates/sim`, the
//! `imagesize` crate and its own smart_resize) while kvgate's are `kvgate_tokenize::vision`.
//! The guard compares the engine's `prompt_tokens` with kvgate's count exactly (tolerance 0),
//! so every 200 here is the two counts agreeing; the fixtures' counts come from the real HF
//! processors (`tests/vision/reference.py`).

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use kvgate_sim::{RunningSim, SimConfig, SimRole, VisionConfig, VisionFamily};
use support::*;

const MODEL: &str = "qwen-vl";

fn images_dir() -> std::path::PathBuf {
    repo().join("tests/vision/images")
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn data_url(file: &str) -> String {
    let bytes = std::fs::read(images_dir().join(file)).expect("test image");
    let kind = match file.rsplit('.').next() {
        Some("jpg") => "jpeg",
        Some(ext) => ext,
        None => "png",
    };
    format!("data:image/{kind};base64,{}", base64(&bytes))
}

/// A vision model as both sides see it: the sim's family, kvgate's `[models.vision]`, the
/// tokenizer folder and the fixtures' key of its counts.
#[derive(Clone, Copy)]
struct Family {
    sim: VisionFamily,
    name: &'static str,
    preprocessor: &'static str,
    fixture: &'static str,
}

const QWEN2_5_VL: Family = Family {
    sim: VisionFamily::Qwen25Vl,
    name: "qwen2_5_vl",
    preprocessor: "Qwen2.5-VL-7B-Instruct",
    fixture: "qwen2_5_vl/sglang",
};

const QWEN3_VL: Family = Family {
    sim: VisionFamily::Qwen3Vl,
    name: "qwen3_vl",
    preprocessor: "Qwen3-VL-8B-Instruct",
    fixture: "qwen3_vl/sglang",
};

const GEMMA3: Family = Family {
    sim: VisionFamily::Gemma3,
    name: "gemma3",
    preprocessor: "gemma-3-4b-it",
    fixture: "gemma3/sglang",
};

/// The tokenizer folder of `family`: the Qwen2.5-VL stand-in for both Qwen families (their
/// placeholders are the same), Gemma 3's from the zoo (`tests/zoo/fetch.sh`; None without).
fn tokenizer_dir(family: Family) -> Option<std::path::PathBuf> {
    if family.sim != VisionFamily::Gemma3 {
        return Some(repo().join("config/tokenizers/qwen2_5_vl"));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let dir = target.join("zoo/gemma3");
    if dir.join("tokenizer.json").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the Gemma 3 tokenizer is missing: run tests/zoo/fetch.sh"
    );
    eprintln!("skipped: no Gemma 3 tokenizer (run tests/zoo/fetch.sh)");
    None
}

async fn vision_sim(cap: Option<u64>) -> RunningSim {
    family_sim(QWEN2_5_VL, cap).await
}

async fn family_sim(family: Family, cap: Option<u64>) -> RunningSim {
    let dir = tokenizer_dir(family).expect("a tokenizer folder");
    let tokenizer =
        Arc::new(kvgate_tokenize::ModelTokenizer::from_dir(&dir).expect("the model's tokenizer"));
    let config = SimConfig {
        role: SimRole::Unified,
        kv_tokens: 200_000,
        context_length: 65_536,
        model: MODEL.into(),
        vision: Some(VisionConfig {
            max_pixels_cap: cap,
            ..VisionConfig::new(family.sim)
        }),
        ..SimConfig::default()
    };
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    kvgate_sim::spawn(config, tokenizer, http, None)
        .await
        .expect("sim starts")
}

/// A gateway with the vision model on `engine` (context window `window`), the pool's
/// `[pools.images]` table `images`, plus the text-only `qwen3` model.
fn config(engine: &RunningSim, window: u64, images: &str) -> String {
    family_config(QWEN2_5_VL, engine, window, images)
}

fn family_config(family: Family, engine: &RunningSim, window: u64, images: &str) -> String {
    let repo = repo();
    let dir = tokenizer_dir(family).expect("a tokenizer folder");
    let pools = format!(
        "[[models]]\nname = \"{MODEL}\"\ntokenizer = \"{t}/tokenizer.json\"\n\
         chat_template = \"{t}/tokenizer_config.json\"\ncontext_window = {window}\n\
         [models.vision]\nfamily = \"{f}\"\npreprocessor_config = \"{r}/config/vision/{p}/preprocessor_config.json\"\n\n\
         [[pools]]\nname = \"vl\"\nmodel = \"{MODEL}\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{}]\n{images}\n",
        worker(engine, Some(200_000)),
        r = repo.display(),
        t = dir.display(),
        f = family.name,
        p = family.preprocessor,
    );
    let text_only = engine_placeholder_pool();
    config_with_pools(32_768, &format!("{pools}\n{text_only}"))
}

/// The text-only model's pool: its worker is never reached in these tests.
fn engine_placeholder_pool() -> String {
    "[[pools]]\nname = \"text\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{ url = \"http://127.0.0.1:9\", kv_tokens = 8192 }]\n".into()
}

fn chat(model: &str, url: &str) -> Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url}}
    ]}]})
}

fn fixtures() -> Vec<Value> {
    let text =
        std::fs::read_to_string(repo().join("tests/vision/fixtures.json")).expect("fixtures");
    let v: Value = serde_json::from_str(&text).expect("fixtures are JSON");
    v["cases"].as_array().cloned().unwrap_or_default()
}

/// Every fixture image through kvgate to a sim of `family`: served (the guard saw kvgate's
/// count equal the engine's) with the reference's image tokens, or refused before dispatch
/// where the reference's processor errs. Returns how many were served.
async fn fixture_images(family: Family) -> usize {
    let engine = family_sim(family, None).await;
    let gw = gateway(&family_config(family, &engine, 65_536, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let mut text_part: Option<u64> = None;
    let mut served = 0;
    for case in fixtures() {
        let file = case["file"].as_str().unwrap_or_default();
        let expected = &case["counts"][family.fixture];
        let before = generations(&engine).len();
        let reply = post(&url, Some(KEY), &chat(MODEL, &data_url(file))).await;
        match expected["tokens"].as_u64() {
            Some(tokens) => {
                assert_eq!(
                    reply.status,
                    200,
                    "{} {file}: {}",
                    family.name,
                    reply.text()
                );
                // The rest of the prompt is the same for every image: the engine's count
                // less the image's tokens.
                let prompt = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
                let rest = prompt - tokens;
                assert_eq!(
                    *text_part.get_or_insert(rest),
                    rest,
                    "{} {file}",
                    family.name
                );
                served += 1;
            }
            None => {
                assert_eq!(
                    reply.status,
                    400,
                    "{} {file}: {}",
                    family.name,
                    reply.text()
                );
                assert_eq!(
                    generations(&engine).len(),
                    before,
                    "{file}: refused before dispatch"
                );
            }
        }
    }
    gw.shutdown().await;
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_image_is_admitted_with_the_engines_own_count_or_refused_before_dispatch() {
    assert!(fixture_images(QWEN2_5_VL).await >= 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_vl_images_are_counted_by_its_own_patch_size() {
    assert!(fixture_images(QWEN3_VL).await >= 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_images_are_counted_with_their_newlines_merged_into_the_text() {
    if tokenizer_dir(GEMMA3).is_none() {
        return;
    }
    assert!(fixture_images(GEMMA3).await >= 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_pushes_the_prompt_over_the_window_is_refused_before_dispatch() {
    let engine = vision_sim(None).await;
    // 1920x1080 is 2,691 image tokens on current SGLang: over a 2,048-token window.
    let gw = gateway(&config(&engine, 2048, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(
        &url,
        Some(KEY),
        &chat(MODEL, &data_url("png_1920x1080.png")),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(error_code(&reply), "context_length_exceeded");
    assert!(reply.text().contains("2048"), "{}", reply.text());
    // A small image fits.
    let reply = post(&url, Some(KEY), &chat(MODEL, &data_url("png_28x28.png"))).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(generations(&engine).len(), 1, "only the small one was sent");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_engines_that_pre_resize_counts_with_their_cap() {
    // Older SGLang resized to SGLANG_IMAGE_MAX_PIXELS first: 1920x1080 is 1,222 tokens at a
    // 1,003,520-pixel cap, 2,691 without.
    let engine = vision_sim(Some(1_003_520)).await;
    let gw = gateway(&config(
        &engine,
        65_536,
        "[pools.images]\npre_resize_max_pixels = 1003520\n",
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let small = post(&url, Some(KEY), &chat(MODEL, &data_url("png_28x28.png"))).await;
    let large = post(
        &url,
        Some(KEY),
        &chat(MODEL, &data_url("png_1920x1080.png")),
    )
    .await;
    assert_eq!(large.status, 200, "{}", large.text());
    let prompt = |r: &Reply| r.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    // 28x28 is scaled up to 56x56: 4 tokens.
    assert_eq!(prompt(&large) - prompt(&small), 1222 - 4);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_audio_and_images_for_a_text_model_are_clear_400s() {
    let engine = vision_sim(None).await;
    let gw = gateway(&config(&engine, 65_536, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let video = json!({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}]});
    let reply = post(&url, Some(KEY), &video).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("not counted yet"), "{}", reply.text());
    let text_model = post(&url, Some(KEY), &chat("qwen3", &data_url("png_28x28.png"))).await;
    assert_eq!(text_model.status, 400, "{}", text_model.text());
    assert!(
        text_model.text().contains("Model only supports text input"),
        "{}",
        text_model.text()
    );
    // Not an image at all, and a "URL" SGLang would read as a file on the engine's host.
    for (bad, says) in [
        ("data:image/png;base64,aGVsbG8gd29ybGQ=", "image"),
        ("/etc/passwd", "data: URL"),
    ] {
        let reply = post(&url, Some(KEY), &chat(MODEL, bad)).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text());
        assert!(reply.text().contains(says), "{bad}: {}", reply.text());
    }
    assert!(generations(&engine).is_empty());
    gw.shutdown().await;
}

/// A plain HTTP server for one image on `ip`: counts the connections it accepted; a path
/// of `/redirect` answers 302 to `redirect_to`.
async fn image_server(
    ip: &str,
    file: &str,
    redirect_to: Option<String>,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = std::fs::read(images_dir().join(file)).expect("image");
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            let redirect_to = redirect_to.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let response = match (&redirect_to, head.starts_with("GET /redirect")) {
                    (Some(to), true) => format!(
                        "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    .into_bytes(),
                    _ => {
                        let mut r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        r.extend_from_slice(&body);
                        r
                    }
                };
                let _ = socket.write_all(&response).await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_images_are_fetched_only_where_the_pool_allows_and_never_from_private_addresses() {
    let engine = vision_sim(None).await;
    let (allowed, allowed_hits) = image_server("127.0.0.1", "png_333x517.png", None).await;
    let image = format!("{allowed}/photo.png");

    // A pool that reads data: URLs only.
    let gw = gateway(&config(&engine, 65_536, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat(MODEL, &image)).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("not fetched"), "{}", reply.text());
    gw.shutdown().await;

    // Remote images on, but loopback is not a public address.
    let gw = gateway(&config(
        &engine,
        65_536,
        "[pools.images]\nremote = true\nallow_http = true\n",
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat(MODEL, &image)).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("loopback"), "{}", reply.text());
    // Counted where an operator sees SSRF attempts (the series exists from start-up: the
    // value says it counted).
    let metrics = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    let refusals = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "kvgate_image_refusals_total{{model=\"{MODEL}\",reason=\"forbidden_address\"}} "
            ))
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(refusals >= Some(1.0), "{metrics}");
    gw.shutdown().await;
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 0, "never connected");
    assert!(generations(&engine).is_empty());

    // The operator allows one internal address: fetched (its header), counted, served; a
    // redirect from there to another loopback address is refused.
    let (other, other_hits) = image_server("127.0.0.2", "png_28x28.png", None).await;
    let (redirecting, _) =
        image_server("127.0.0.1", "png_28x28.png", Some(format!("{other}/x.png"))).await;
    let gw = gateway(&config(
        &engine,
        65_536,
        "[pools.images]\nremote = true\nallow_http = true\nallow_networks = [\"127.0.0.1/32\"]\n",
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat(MODEL, &image)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(allowed_hits.load(Ordering::SeqCst) >= 1);
    let reply = post(
        &url,
        Some(KEY),
        &chat(MODEL, &format!("{redirecting}/redirect")),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("127.0.0.2"), "{}", reply.text());
    assert_eq!(
        other_hits.load(Ordering::SeqCst),
        0,
        "the redirect's target was never reached"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_anthropic_images_are_counted_and_images_count_toward_the_token_rate() {
    let engine = vision_sim(None).await;
    // 4,000 tokens a minute: a 1920x1080 image (2,691 tokens) fits once, not twice.
    let text = config(&engine, 65_536, "")
        .replace("name = \"t1\"", "name = \"t1\"\ntokens_per_minute = 4000");
    let gw = gateway(&text).await;
    let base = format!("http://{}", gw.data_addr());
    // The Responses API's input_image: a 28x28 image, 4 tokens.
    let responses = json!({"model": MODEL, "max_output_tokens": 4, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Describe it."},
        {"type": "input_image", "image_url": data_url("png_28x28.png")}
    ]}]});
    let reply = post(&format!("{base}/v1/responses"), Some(KEY), &responses).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.json()["usage"]["input_tokens"].as_u64().unwrap_or(0) > 4);
    // Anthropic's image block (translated to an image_url part).
    let png = std::fs::read(images_dir().join("png_57x43.png")).expect("image");
    let anthropic = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64(&png)}},
        {"type": "text", "text": "What is this?"}
    ]}]});
    let reply = post(&format!("{base}/v1/messages"), Some(KEY), &anthropic).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["type"], "message", "{}", reply.text());
    // The token rate counts image tokens like text.
    let chat_url = format!("{base}/v1/chat/completions");
    let first = post(
        &chat_url,
        Some(KEY),
        &chat(MODEL, &data_url("png_1920x1080.png")),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let second = post(
        &chat_url,
        Some(KEY),
        &chat(MODEL, &data_url("png_1920x1080.png")),
    )
    .await;
    assert_eq!(second.status, 429, "{}", second.text());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_count_tokens_count_images_as_admission_does() {
    let engine = vision_sim(None).await;
    let gw = gateway(&config(&engine, 65_536, "")).await;
    let base = format!("http://{}", gw.data_addr());
    let body = chat(MODEL, &data_url("png_333x517.png"));
    let served = post(&format!("{base}/v1/chat/completions"), Some(KEY), &body).await;
    assert_eq!(served.status, 200, "{}", served.text());
    let engine_count = served.json()["usage"]["prompt_tokens"].as_u64();
    let mut tokenize = body.clone();
    tokenize.as_object_mut().map(|o| o.remove("max_tokens"));
    let tokenized = post(&format!("{base}/tokenize"), Some(KEY), &tokenize).await;
    assert_eq!(tokenized.status, 200, "{}", tokenized.text());
    assert_eq!(tokenized.json()["count"].as_u64(), engine_count);
    // Anthropic's count_tokens of the same image as a block: the translated chat's count,
    // what /v1/messages with it reports.
    let png = std::fs::read(images_dir().join("png_333x517.png")).expect("image");
    let anthropic = json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64(&png)}},
        {"type": "text", "text": "What is this?"}
    ]}]});
    let mut count = anthropic.clone();
    count.as_object_mut().map(|o| o.remove("max_tokens"));
    let counted = post(
        &format!("{base}/v1/messages/count_tokens"),
        Some(KEY),
        &count,
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let sent = post(&format!("{base}/v1/messages"), Some(KEY), &anthropic).await;
    assert_eq!(sent.status, 200, "{}", sent.text());
    assert_eq!(
        counted.json()["input_tokens"].as_u64(),
        sent.json()["usage"]["input_tokens"].as_u64(),
        "{}",
        sent.text()
    );
    assert!(counted.json()["input_tokens"].as_u64().unwrap_or(0) > 100);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_fetched_image_goes_only_to_pools_that_fetch() {
    let fetching = vision_sim(None).await;
    let inline_only = vision_sim(None).await;
    let (server, _) = image_server("127.0.0.1", "png_28x28.png", None).await;
    // The pool that fetches has a tiny weight: without the rule most requests would land on
    // the other.
    let text = config(
        &fetching,
        65_536,
        "weight = 1\n[pools.images]\nremote = true\nallow_http = true\nallow_networks = [\"127.0.0.1/32\"]\n",
    )
    .replace(
        "\n[[pools]]\nname = \"text\"",
        &format!(
            "\n[[pools]]\nname = \"vl-inline\"\nmodel = \"{MODEL}\"\nengine = \"sglang\"\nmode = \"unified\"\nweight = 1000\nworkers = [{}]\n\n[[pools]]\nname = \"text\"",
            worker(&inline_only, Some(200_000))
        ),
    );
    let gw = gateway(&text).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for i in 0..6 {
        let remote = post(&url, Some(KEY), &chat(MODEL, &format!("{server}/{i}.png"))).await;
        assert_eq!(remote.status, 200, "{}", remote.text());
        assert_eq!(remote.headers["x-kvgate-pool"], "vl");
    }
    assert!(generations(&inline_only).is_empty());
    // Inline images may go anywhere (here: mostly the heavier pool).
    let inline = post(&url, Some(KEY), &chat(MODEL, &data_url("png_28x28.png"))).await;
    assert_eq!(inline.status, 200, "{}", inline.text());
    gw.shutdown().await;
}

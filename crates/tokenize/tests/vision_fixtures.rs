//! Every test image through `probe` + `image_tokens`, against the Python reference.
//!
//! `tests/vision/fixtures.json` holds, for each file in `tests/vision/images/`, the size Pillow
//! reports (or its refusal) and the token count the real HF image processor gives under each
//! setting (or its error). See `tests/vision/README.md`.

use std::path::{Path, PathBuf};

use kvgate_tokenize::vision::{
    probe, probe_file, ImageError, Probe, VisionError, VisionFamily, VisionProcessor,
    MAX_PROBE_BYTES,
};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> Value {
    let text = std::fs::read_to_string(root().join("tests/vision/fixtures.json"))
        .expect("tests/vision/fixtures.json ships with the repository");
    serde_json::from_str(&text).expect("fixtures.json is JSON")
}

fn processor(setting: &Value) -> VisionProcessor {
    let family = match setting["family"].as_str().expect("family") {
        "qwen2_vl" => VisionFamily::Qwen2Vl,
        "qwen3_vl" => VisionFamily::Qwen3Vl,
        "gemma3" => VisionFamily::Gemma3,
        other => panic!("unknown family {other}"),
    };
    let model = setting["model"].as_str().expect("model");
    let path = root()
        .join("config/vision")
        .join(model)
        .join("preprocessor_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    for (key, value) in setting["overrides"].as_object().expect("overrides") {
        config[key] = value.clone();
    }
    VisionProcessor::new(family, &config.to_string())
        .expect("the shipped configs are valid")
        .with_pre_resize_cap(setting["pre_resize_cap"].as_u64())
}

#[test]
fn vision_every_image_matches_the_reference() {
    let fixtures = fixtures();
    let settings = fixtures["settings"].as_object().expect("settings");
    let cases = fixtures["cases"].as_array().expect("cases");
    let images = root().join("tests/vision/images");
    let mut compared = 0;
    for case in cases {
        let file = case["file"].as_str().expect("file");
        let bytes = std::fs::read(images.join(file)).expect("image file");
        let probed = probe_file(&bytes);
        if let Some(error) = case["probe_error"].as_str() {
            let got = probed.expect_err(file);
            if error == "too_large" {
                assert!(
                    matches!(got, ImageError::TooLarge { .. }),
                    "{file}: {got:?}"
                );
            } else {
                assert!(
                    !matches!(got, ImageError::TooLarge { .. }),
                    "{file}: {got:?}"
                );
            }
            compared += 1;
            continue;
        }
        let info = probed.unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(info.format.name(), case["format"], "{file}");
        assert_eq!(u64::from(info.width), case["width"], "{file} width");
        assert_eq!(u64::from(info.height), case["height"], "{file} height");
        for (name, expected) in case["counts"].as_object().expect("counts") {
            let got = processor(&settings[name]).image_tokens(&info);
            match (expected.get("tokens"), expected.get("error")) {
                (Some(tokens), _) => {
                    assert_eq!(
                        got.as_ref().map(|&n| u64::from(n)).ok(),
                        tokens.as_u64(),
                        "{file} {name}: {got:?}"
                    )
                }
                (None, Some(message)) => {
                    let error = got.expect_err(file);
                    assert!(
                        matches!(error, VisionError::AspectRatio { .. }),
                        "{file} {name}"
                    );
                    assert_eq!(
                        error.to_string(),
                        message.as_str().expect("message"),
                        "{file} {name}"
                    );
                }
                _ => panic!("{file} {name}: malformed fixture"),
            }
            compared += 1;
        }
    }
    assert!(compared > 250, "only {compared} comparisons");
}

/// A streaming fetcher's view: every prefix of every image either asks for more (never past
/// the cap, never for fewer bytes than it has) or gives the whole file's answer.
#[test]
fn vision_every_prefix_is_consistent_with_the_whole_file() {
    let images = root().join("tests/vision/images");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&images)
        .expect("images")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for path in files {
        let bytes = std::fs::read(&path).expect("image");
        let whole = probe(&bytes);
        let mut len = 0;
        loop {
            match probe(&bytes[..len]) {
                Probe::NeedMore { at_least } => {
                    assert!(
                        at_least > len && at_least <= MAX_PROBE_BYTES,
                        "{}",
                        name(&path)
                    );
                    assert!(
                        at_least <= bytes.len(),
                        "{} asks past the file",
                        name(&path)
                    );
                    len = at_least;
                }
                answer => {
                    assert_eq!(answer, whole, "{} at {len}", name(&path));
                    break;
                }
            }
        }
        // And every shorter prefix too, for the small ones (cheap: the probe reads headers).
        for short in 0..bytes.len().min(600) {
            if let Probe::Known(info) = probe(&bytes[..short]) {
                assert_eq!(Probe::Known(info), whole, "{} at {short}", name(&path));
            }
        }
    }
}

fn name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn vision_issue_41_numbers_reproduce() {
    let fixtures = fixtures();
    let checks = fixtures["issue_checks"].as_object().expect("issue_checks");
    let quoted = [
        (
            "1920x1080 Qwen2.5-VL, old SGLang default cap (issue: 2691)",
            2691,
        ),
        ("1920x1080 Qwen2.5-VL, cap 1003520 (issue: 1222)", 1222),
        ("10x2000 Qwen2.5-VL, current SGLang (issue: 29)", 29),
        ("10x2000 Qwen2.5-VL, old SGLang default cap (issue: 71)", 71),
    ];
    for (label, n) in quoted {
        assert_eq!(checks[label], n, "{label}");
    }
}

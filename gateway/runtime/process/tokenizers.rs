//! The models' tokenizers, loaded once per process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kvgate_tokenize::{ModelTokenizer, TokenizeError};

/// Load a model's tokenizer once per process: several gateways (tests, reloads) and the
/// demo's engines share the ≈130 MB it takes.
pub fn load_tokenizer(
    tokenizer: &std::path::Path,
    chat_template: Option<&std::path::Path>,
) -> Result<Arc<ModelTokenizer>, TokenizeError> {
    type Cache = Mutex<HashMap<(PathBuf, Option<PathBuf>), Arc<ModelTokenizer>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let key = (tokenizer.to_owned(), chat_template.map(|p| p.to_owned()));
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(t);
    }
    let loaded = Arc::new(ModelTokenizer::from_files(tokenizer, chat_template)?);
    if let Ok(mut c) = cache.lock() {
        c.insert(key, loaded.clone());
    }
    Ok(loaded)
}

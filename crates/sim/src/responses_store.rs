//! The Responses API's store, in this engine process only, as SGLang keeps it
//! (`OpenAIServingResponses.response_store` and `msg_store`, `serving_responses.py`): each
//! stored response and the conversation that led to it (input history plus its output
//! items), for `previous_response_id`, `GET /v1/responses/{id}` and `cancel`. Like SGLang's,
//! it has no expiry.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Value};
use tokio::task::AbortHandle;

/// One stored response.
struct Stored {
    response: Value,
    /// The conversation a continuation starts from.
    history: Vec<Value>,
    /// A background response's generation, while it runs.
    task: Option<AbortHandle>,
}

/// Responses kept by id.
#[derive(Default)]
pub(crate) struct ResponseStore {
    inner: Mutex<HashMap<String, Stored>>,
}

impl std::fmt::Debug for ResponseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStore").finish_non_exhaustive()
    }
}

fn status(response: &Value) -> Option<&str> {
    response.get("status").and_then(Value::as_str)
}

impl ResponseStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stored>> {
        // A poisoned map only means another request panicked mid-update; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stored response `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Value> {
        self.lock().get(id).map(|s| s.response.clone())
    }

    /// The conversation a continuation of `id` starts from.
    pub(crate) fn history(&self, id: &str) -> Option<Vec<Value>> {
        self.lock().get(id).map(|s| s.history.clone())
    }

    /// Keeps `response` and its conversation, unless `id` was cancelled meanwhile.
    pub(crate) fn put(&self, id: &str, response: Value, history: Vec<Value>) {
        let mut map = self.lock();
        if let Some(old) = map.get(id) {
            if status(&old.response) == Some("cancelled") {
                return;
            }
        }
        map.insert(
            id.to_string(),
            Stored {
                response,
                history,
                task: None,
            },
        );
    }

    /// Records the task that generates background response `id`.
    pub(crate) fn set_task(&self, id: &str, task: AbortHandle) {
        if let Some(stored) = self.lock().get_mut(id) {
            stored.task = Some(task);
        }
    }

    /// Sets the status of a response still queued or in progress.
    pub(crate) fn set_status(&self, id: &str, to: &str) {
        if let Some(stored) = self.lock().get_mut(id) {
            if matches!(status(&stored.response), Some("queued" | "in_progress")) {
                if let Some(map) = stored.response.as_object_mut() {
                    map.insert("status".into(), json!(to));
                }
            }
        }
    }

    /// `cancel_responses`: a queued or running response becomes `cancelled` and its
    /// generation stops; a finished one is returned as it is. `None`: no such response.
    pub(crate) fn cancel(&self, id: &str) -> Option<Value> {
        let mut map = self.lock();
        let stored = map.get_mut(id)?;
        if matches!(status(&stored.response), Some("queued" | "in_progress")) {
            if let Some(map) = stored.response.as_object_mut() {
                map.insert("status".into(), json!("cancelled"));
            }
            if let Some(task) = stored.task.take() {
                task.abort();
            }
        }
        Some(stored.response.clone())
    }
}

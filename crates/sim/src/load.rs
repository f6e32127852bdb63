//! The load endpoints in SGLang's shapes: `GET /v1/loads` (newer) and `GET /get_load` (older).
//!
//! Both read the scheduler's running batch and waiting queue at one instant. The sim is one
//! data-parallel rank (`dp_rank` 0).

use serde_json::{json, Value};

use super::config::SimRole;
use super::engine::SimEngine;
use super::reply::unix_now;
use super::scheduler::Load;

/// Tokens in use as the load endpoints report them: allocated pages, never above the pool
/// (a pool whose size is not a multiple of the page size has one partly usable last page).
pub(crate) fn used_tokens(engine: &SimEngine, load: &Load) -> usize {
    load.used_tokens.min(engine.config.kv_tokens)
}

/// `used / max_total_num_tokens`, 0 for an empty pool.
pub(crate) fn token_usage(engine: &SimEngine, load: &Load) -> f64 {
    let capacity = engine.config.kv_tokens;
    if capacity == 0 {
        0.0
    } else {
        used_tokens(engine, load) as f64 / capacity as f64
    }
}

/// `GET /v1/loads`: SGLang's `GetLoadsReqOutput` core fields (`dp_rank`, `timestamp`,
/// `num_running_reqs`, `num_waiting_reqs`, `num_used_tokens`, `max_total_num_tokens`,
/// `token_usage` rounded to 4 places, `max_running_requests`), at the top level for a single
/// rank and again in `loads` (one per rank), plus the sim's `role`.
pub(crate) fn loads(engine: &SimEngine) -> Value {
    let c = &engine.config;
    let load = engine.scheduler.load();
    let usage = (token_usage(engine, &load) * 10_000.0).round() / 10_000.0;
    let rank = json!({
        "dp_rank": 0,
        "timestamp": unix_now(),
        "num_running_reqs": load.running,
        "num_waiting_reqs": load.waiting,
        "num_used_tokens": used_tokens(engine, &load),
        "max_total_num_tokens": c.kv_tokens,
        "token_usage": usage,
        "max_running_requests": c.max_running_requests.map(|n| n.get()),
    });
    let mut top = rank.clone();
    if let Some(map) = top.as_object_mut() {
        map.insert(
            "role".into(),
            json!(match c.role {
                SimRole::Unified => "unified",
                SimRole::Prefill => "prefill",
                SimRole::Decode => "decode",
            }),
        );
        map.insert("loads".into(), json!([rank]));
    }
    top
}

/// `GET /get_load`: the older endpoint, a list with one object per data-parallel rank, as
/// SGLang's scheduler builds `GetLoadReqOutput` (`scheduler_metrics_mixin.get_load`):
/// `num_reqs` is running plus waiting, and `num_tokens` is the tokens in use plus the prompt
/// tokens of the waiting requests (`sum(req.seqlen)` over the waiting queue).
pub(crate) fn get_load(engine: &SimEngine) -> Value {
    let load = engine.scheduler.load();
    json!([{
        "dp_rank": 0,
        "num_reqs": load.running + load.waiting,
        "num_waiting_reqs": load.waiting,
        "num_tokens": used_tokens(engine, &load) + load.waiting_prompt_tokens,
    }])
}

//! What an engine reported about itself, and how the last probe went.

use crate::fleet::cache_tiers::ReportedTiers;

/// What an engine reported about itself (`/get_server_info` or `/server_info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerInfo {
    /// `scheduler_info.max_total_num_tokens`: the KV pool in tokens.
    pub max_total_num_tokens: Option<u64>,
    /// `scheduler_info.max_req_input_len` (or top-level `max_req_input_len`).
    pub max_req_input_len: Option<u64>,
    /// `context_length`.
    pub context_length: Option<u64>,
    /// `disaggregation_bootstrap_port`.
    pub bootstrap_port: Option<u16>,
    /// `disaggregation_mode`: "null", "prefill", "decode".
    pub disaggregation_mode: Option<String>,
    /// `max_running_requests`: the most requests the engine runs at once.
    pub max_running_requests: Option<u64>,
    /// `version`.
    pub version: Option<String>,
    /// Its cache tiers below the GPU prefix cache, as far as it says (`fleet/cache_tiers.rs`).
    pub cache_tiers: ReportedTiers,
}

/// The result of the last discovery probe.
#[derive(Debug, Clone, Default)]
pub enum Discovery {
    /// Not probed yet.
    #[default]
    Pending,
    /// The engine answered.
    Found(ServerInfo),
    /// The probe failed; the reason is shown by /ready and `kvgate check`.
    Failed(String),
}

//! Whether a target's workers answer at all, asked before anything is sent to them.
//!
//! A worker that cannot be reached is reported once, as "unreachable, not probed", with the
//! connection's error: probing it anyway turned every probe into a FAIL of its own and
//! counted their prompts as sent, which buried the one fact that matters (issue 40 item 5).

use std::time::Duration;

use tokio::time::Instant;

use super::capacity::Target;
use crate::upstream::Upstream;

/// How long a worker has to answer the question.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// The target's workers that do not answer (`host:port: why`); empty when all do. Any
/// HTTP answer counts, whatever its status: only a connection that fails, or no answer in
/// time, is unreachable.
pub(super) async fn unreachable(
    target: &Target<'_>,
    upstream: &Upstream,
    timeout: Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    for w in target.workers() {
        let deadline = Instant::now() + timeout.min(REACH_TIMEOUT);
        if let Err(e) = upstream.get(w, w.health_path(), deadline).await {
            out.push(format!("{} {}: {e}", w.role.as_str(), w.authority));
        }
    }
    out
}

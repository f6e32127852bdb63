//! What this replica is called among the others (shared decisions, audit lines).

/// This replica's name in shared decisions and audit lines: the host name (a pod's name
/// in Kubernetes) and a random suffix, so two processes on one host differ.
pub(crate) fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "kvgate".to_owned());
    format!("{host}-{:04x}", crate::secure_random::u64() & 0xffff)
}

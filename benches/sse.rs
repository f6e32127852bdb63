//! SSE re-framer throughput (filled in by the next commit).

fn main() {}

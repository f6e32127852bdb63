//! The `kvgate` commands that are not a serving gateway: `check` (what admission will
//! enforce, from the config and optionally the engines), `preflight` (probes every pool's
//! engines end to end before traffic) and `demo` (the gateway with simulated engines).

pub mod check;
pub mod demo;
pub mod preflight;

use crate::config::Config;

/// Load and validate the config at `path`; the error is printed for the operator (None).
pub fn load_config(path: &std::path::Path) -> Option<Config> {
    match Config::load(path) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("kvgate: invalid config: {e}");
            None
        }
    }
}

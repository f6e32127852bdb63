//! `kvgate check`: validate a config and print what admission will enforce per model and
//! pool (the [`CapacityReport`]), optionally after asking the engines for their capacity.

use std::path::Path;
use std::process::ExitCode;

use super::load_config;
use crate::dns::Discoverer;
use crate::fleet::{discover_all, Fleet, NameBook};
use crate::runtime::CapacityReport;
use crate::upstream::Upstream;

/// Run `kvgate check` on the config at `path`; `discover` asks the engines for their
/// capacity first, `strict` makes every warning an error (exit 3).
pub async fn run(path: &Path, discover: bool, strict: bool) -> ExitCode {
    let Some(config) = load_config(path) else {
        return ExitCode::from(2);
    };
    // `--discover` also resolves the `discover` names, so their engines are probed too.
    let config = if discover {
        let names = NameBook::default();
        let resolved = Discoverer::default().resolve(&config, &names).await;
        for pool in &config.pools {
            for (key, state) in names.of_pool(&pool.name) {
                let engines: Vec<String> =
                    state.endpoints.iter().map(|e| e.addr.to_string()).collect();
                match &state.last_error {
                    None => println!(
                        "{} {} {}: {}",
                        key.pool,
                        key.list,
                        key.name,
                        engines.join(" ")
                    ),
                    Some(e) => println!("{} {} {}: {e}", key.pool, key.list, key.name),
                }
            }
        }
        resolved
    } else {
        config
    };
    // The Redis TLS files are read at start only: check them here too, so a broken one is
    // found before a rollout, not by the first replica that starts with it.
    if let Some(tls) = &config.limits.redis_tls {
        let client = tls.cert_file.as_deref().zip(tls.key_file.as_deref());
        if let Err(e) = crate::tls::RedisPem::read(tls.ca_file.as_deref(), client) {
            eprintln!("error: {}: limits.redis_tls: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    let fleet = Fleet::from_config(&config);
    if discover {
        let tls = match crate::tls::EngineTls::from_config(&config) {
            Ok(tls) => tls,
            Err(e) => {
                eprintln!("error: {}: upstream.tls: {e}", path.display());
                return ExitCode::from(2);
            }
        };
        discover_all(&fleet, &Upstream::new(&config.upstream, &tls)).await;
    }
    let report = CapacityReport::build(&config, &fleet);
    println!("config {} is valid", path.display());
    print!("{report}");
    if strict && !report.warnings().is_empty() {
        eprintln!(
            "kvgate check --strict: {} warning(s) treated as errors",
            report.warnings().len()
        );
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}

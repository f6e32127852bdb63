//! `kvgate-sim`: one simulated engine as its own process (`kvgate sim-engine` runs the same).

use clap::Parser;

/// A simulated SGLang engine (tests, demo, benchmarks).
#[derive(Parser)]
#[command(name = "kvgate-sim", version)]
struct Cli {
    #[command(flatten)]
    args: kvgate_sim::SimArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match kvgate_sim::run_cli(Cli::parse().args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvgate-sim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

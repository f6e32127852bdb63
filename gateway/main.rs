//! The `kvgate` command line: serve, check, sim-engine, demo, hash-key.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use kvgate::commands::load_config;
use kvgate::runtime::Gateway;

/// kvgate: admission and isolation in front of LLM inference engines.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The gateway config (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config and print, per model and pool, what the gateway will enforce.
    Check {
        /// The gateway config (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Also ask every worker for its capacity (/get_server_info) before reporting.
        #[arg(long)]
        discover: bool,
        /// Treat configuration mismatches (context window above a KV pool) as errors.
        #[arg(long)]
        strict: bool,
    },
    /// Probe every worker straight (not through admission) for the incident's bug class
    /// before it takes traffic: capacity, boundary prompts, isolation. Exit 0 only when
    /// every probe passes; 1 when one fails; 2 for an invalid config or a probe left unrun
    /// by the token budget.
    Preflight {
        /// The gateway config (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Only this pool (repeatable).
        #[arg(long = "pool", value_name = "NAME")]
        pools: Vec<String>,
        /// Print the report as JSON (for pipelines).
        #[arg(long)]
        json: bool,
        /// Prompt tokens all probes together may send (overrides preflight.token_budget).
        #[arg(long, value_name = "TOKENS")]
        token_budget: Option<u64>,
    },
    /// Run a simulated SGLang engine (tests, demo, benchmarks).
    SimEngine(kvgate_sim::SimArgs),
    /// Run the load harness's engine: real prompt counts, a fixed answer, almost no CPU.
    MockEngine(kvgate_sim::MockArgs),
    /// Send requests at a fixed rate and print latency percentiles (the load harness).
    LoadGen(kvgate_sim::LoadArgs),
    /// Run the load harness's floor: hyper forwarding to one upstream, no checks at all.
    BareProxy(kvgate_sim::BareProxyArgs),
    /// Run the gateway with built-in simulated engines on loopback, ready for curl.
    Demo(kvgate::commands::demo::DemoArgs),
    /// Print the SHA-256 of an API key, for `api_key_sha256`.
    HashKey {
        /// The key; read from stdin when omitted (keeps it out of shell history).
        key: Option<String>,
    },
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a terminal: files, journald and containers get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvgate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve { config } => serve(config).await,
        Command::Check {
            config,
            discover,
            strict,
        } => kvgate::commands::check::run(&config, discover, strict).await,
        Command::Preflight {
            config,
            pools,
            json,
            token_budget,
        } => preflight(config, pools, json, token_budget).await,
        Command::SimEngine(args) => match kvgate_sim::run_cli(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvgate sim-engine: {e}");
                ExitCode::FAILURE
            }
        },
        Command::MockEngine(args) => match kvgate_sim::run_mock_cli(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvgate mock-engine: {e}");
                ExitCode::FAILURE
            }
        },
        Command::LoadGen(args) => match kvgate_sim::run_load_cli(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvgate load-gen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::BareProxy(args) => match kvgate_sim::run_bare_proxy_cli(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvgate bare-proxy: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Demo(args) => match kvgate::commands::demo::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kvgate demo: {e}");
                ExitCode::FAILURE
            }
        },
        Command::HashKey { key } => hash_key(key),
    }
}

async fn serve(path: PathBuf) -> ExitCode {
    let Some(config) = load_config(&path) else {
        return ExitCode::from(2);
    };
    // Signal handlers first: a SIGHUP or SIGTERM that arrives as soon as the port is open
    // must reload or drain, not hit the default action (terminate).
    let mut signals = Signals::install();
    let gateway = match Gateway::new(config) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("kvgate: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let running = match gateway.bind_and_start().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvgate: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SIGHUP reloads the config and the certificates (the reload logs its outcome, the
    // refusal included); anything else stops.
    while let SignalEvent::Reload = signals.next().await {
        // In a task of its own: a reload that waits on discovery or a tokenizer must not
        // delay a SIGTERM behind it (the drain has a deadline).
        let reloader = running.reloader().clone();
        tokio::spawn(async move {
            let _ = reloader.reload().await;
        });
    }
    tracing::info!("shutting down: no new connections, draining in-flight requests");
    running.shutdown().await;
    ExitCode::SUCCESS
}

enum SignalEvent {
    Reload,
    Stop,
}

/// SIGHUP (reload), SIGTERM and Ctrl-C (stop).
struct Signals {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let hup = signal(SignalKind::hangup()).ok();
            if hup.is_none() {
                tracing::warn!(
                    "SIGHUP handler unavailable: reload with POST /reload on the admin port"
                );
            }
            Self {
                hup,
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    async fn next(&mut self) -> SignalEvent {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        if s.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => SignalEvent::Stop,
                _ = recv(&mut self.term) => SignalEvent::Stop,
                _ = recv(&mut self.hup) => SignalEvent::Reload,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            SignalEvent::Stop
        }
    }
}

async fn preflight(
    path: PathBuf,
    pools: Vec<String>,
    json: bool,
    token_budget: Option<u64>,
) -> ExitCode {
    use kvgate::commands::preflight::{run, PreflightOptions};
    let Some(config) = load_config(&path) else {
        return ExitCode::from(2);
    };
    let options = PreflightOptions {
        pools,
        token_budget,
    };
    let report = match run(&config, &options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvgate preflight: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("kvgate preflight: cannot encode the report: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{report}");
    }
    ExitCode::from(report.exit_code())
}

fn hash_key(key: Option<String>) -> ExitCode {
    let key = match key {
        Some(k) => k,
        None => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("kvgate hash-key: cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
            line.trim_end_matches(['\r', '\n']).to_owned()
        }
    };
    if key.is_empty() {
        eprintln!("kvgate hash-key: the key is empty");
        return ExitCode::FAILURE;
    }
    println!("{}", kvgate::stack::auth::hash_key(&key));
    ExitCode::SUCCESS
}

//! The `archivist` binary: flags, logging, signals and wiring; the work is
//! in the library.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use archivist::cli::backfill::{self, BackfillArgs};
use archivist::cli::session::{self, SessionArgs};
use archivist::cli::{load_config, shutdown_signal};
use archivist::config::{self, LogFormat, Overrides};

#[derive(Debug, Parser)]
#[command(
    name = "archivist",
    version,
    about = "Memory summarisation for LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gRPC server (defaults: 127.0.0.1:50051, ./archivist-data,
    /// the built-in extractive summariser).
    Serve {
        /// A TOML configuration file.
        #[arg(long, env = config::CONFIG_ENV)]
        config: Option<PathBuf>,
        /// Address to listen on.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Directory holding the database.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Allow a non-loopback listen address with no tenants configured
        /// (anyone who can reach it reads every session).
        #[arg(long)]
        insecure_open: bool,
    },
    /// Talk to a running server from a terminal.
    Session(SessionArgs),
    /// Drain unsummarised segments, beside a running server or not; exits
    /// 0 when nothing is left, 2 when something is, 1 on an error.
    Backfill(BackfillArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve {
            config,
            listen,
            data_dir,
            insecure_open,
        } => runtime.block_on(serve(Overrides {
            config_file: config,
            listen,
            data_dir,
            insecure_open,
        })),
        Command::Backfill(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(backfill::run(args))
        }
        Command::Session(args) => {
            init_logging(LogFormat::Text, "warn");
            match runtime.block_on(session::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(overrides: Overrides) -> ExitCode {
    let config = match load_config(&overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    init_logging(config.log_format, "info");
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.listen, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match archivist::server::run(config, listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %archivist::error_chain(&e), "archivist failed");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

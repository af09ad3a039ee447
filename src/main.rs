//! The `archivist` binary: flags, logging, signals and wiring; the work is
//! in the library.
//!
//! Exit status, for every command: 0 done; 1 an error; 64 a usage error
//! (bad flags or arguments). `backfill` adds 2 (segments are left
//! unsummarised); the terminal client adds 3 (a close or flush worked but a
//! recap is not there); a second SIGINT or SIGTERM exits 130.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use archivist::cli::backfill::{self, BackfillArgs};
use archivist::cli::check::{self, CheckArgs};
use archivist::cli::import::{self, ImportArgs};
use archivist::cli::migrate::{self, MigrateArgs};
use archivist::cli::search::{self, SearchArgs};
use archivist::cli::session::{self, ClientFlags, ForgetSubjectArgs, SessionArgs, SessionsArgs};
use archivist::cli::{EXIT_USAGE, load_config, parse_listen, shutdown_signal};
use archivist::config::{self, LogFormat, Overrides};
use archivist::mcp::{self, McpArgs};

#[derive(Debug, Parser)]
#[command(
    name = "archivist",
    version,
    about = "Memory summarisation for LLM agents",
    after_help = "Exit status: 0 done, 1 an error, 64 a usage error; backfill: 2 when segments are left; session close --wait and flush: 3 when a recap is not done."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gRPC server (defaults: 127.0.0.1:50051, ./archivist-data,
    /// the built-in extractive summariser).
    #[command(after_help = config::keys_help())]
    Serve {
        /// A TOML configuration file [env: ARCHIVIST_CONFIG].
        #[arg(long, env = config::CONFIG_ENV, hide_env = true)]
        config: Option<PathBuf>,
        /// Address to listen on, IP:PORT or HOST:PORT (overrides listen and
        /// ARCHIVIST_LISTEN).
        #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
        listen: Option<SocketAddr>,
        /// Directory holding the database (overrides data_dir and
        /// ARCHIVIST_DATA_DIR).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Allow a non-loopback listen address with no tenants configured
        /// (anyone who can reach it reads every session).
        #[arg(long)]
        insecure_open: bool,
        /// Start even though the provider configured differs from the one
        /// the database was last served with (recaps from now on come from
        /// the new one).
        #[arg(long)]
        allow_provider_change: bool,
    },
    /// Talk to a running server from a terminal.
    #[command(
        after_help = "Exit status: 0 done; 1 an error (NOT_FOUND included); 3 close --wait or flush closed the segment but its recap failed or is not done yet; 64 a usage error."
    )]
    Session(SessionArgs),
    /// List your sessions on a running server (with --subject, only that
    /// subject's).
    Sessions(SessionsArgs),
    /// Search your memory on a running server: entries and recaps found
    /// by their words, best first, across every session or only some, a
    /// subject's, a time window, roles or levels.
    Search(SearchArgs),
    /// Import a history into a running server from JSON Lines (FILE, or -
    /// for standard input), one message a line: session_id, role, content,
    /// and optionally name, occurred_at (RFC 3339), metadata,
    /// client_entry_id, subject. Running it again stores nothing new.
    Import(ImportArgs),
    /// Erase every session of a subject on a running server (the "forget
    /// this user" privacy law asks for). Asks first on a terminal.
    ForgetSubject(ForgetSubjectArgs),
    /// Show a running server's backlog: segments per state, the oldest
    /// pending, parked ones per failure class.
    Backlog(ClientFlags),
    /// Drain unsummarised segments, beside a running server or not; exits
    /// 0 when nothing is left, 2 when something is, 1 on an error, 64 on a
    /// usage error.
    Backfill(BackfillArgs),
    /// Send one tiny request to the configured provider through a real
    /// recap pass and say what came back, and what would fix a failure.
    /// Exits 0 when it answered, 1 when not.
    Check(CheckArgs),
    /// Bring the configured database (SQLite or PostgreSQL) to the schema
    /// this build knows, say so in one line and exit: for deploys that
    /// migrate as a step of their own (serve still migrates at start-up).
    /// Exits 0 when the database is current, 1 when it is not.
    Migrate(MigrateArgs),
    /// Serve the Model Context Protocol (stdio, or streamable HTTP with
    /// --listen) in front of a running server, so an MCP-capable agent
    /// gets a memory: tools remember, recall, context, list_sessions, and
    /// forget and forget_subject with --allow-forget.
    Mcp(McpArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are not errors; everything else a usage
            // error, whose status no command gives to an outcome.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
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
            allow_provider_change,
        } => runtime.block_on(serve(Overrides {
            config_file: config,
            listen,
            data_dir,
            insecure_open,
            allow_provider_change,
        })),
        Command::Backfill(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(backfill::run(args))
        }
        Command::Check(args) => {
            // The check prints its own findings; retries are not news here.
            init_logging(LogFormat::Text, "error");
            runtime.block_on(check::run(args))
        }
        Command::Migrate(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(migrate::run(args))
        }
        Command::Session(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(session::run(args))
        }
        Command::Sessions(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(session::sessions(args))
        }
        Command::Search(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(search::run(args))
        }
        Command::Import(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(import::run(args))
        }
        Command::ForgetSubject(args) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(session::forget_subject(args))
        }
        Command::Mcp(args) => {
            // Standard output is the protocol on stdio: logs go to
            // standard error only.
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(mcp::run(args))
        }
        Command::Backlog(flags) => {
            init_logging(LogFormat::Text, "warn");
            runtime.block_on(session::backlog(flags))
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
            let hint = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "; something else (another archivist?) listens there: stop it, or choose another address with --listen"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "; ports below 1024 need privileges: choose a higher one with --listen"
                }
                std::io::ErrorKind::AddrNotAvailable => {
                    "; that address is not one of this machine's: choose another with --listen"
                }
                _ => "",
            };
            tracing::error!(
                listen = %config.listen,
                "cannot listen on {} (the address from --listen, ARCHIVIST_LISTEN or listen in the configuration): {e}{hint}",
                config.listen
            );
            return ExitCode::FAILURE;
        }
    };
    match archivist::server::run(config, listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("archivist cannot run: {}", archivist::error_chain(&e));
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

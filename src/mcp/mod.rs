//! `archivist mcp`: archivist as a Model Context Protocol server, so any
//! MCP-capable agent gets a memory from one entry of its configuration.
//! It serves over stdio (the host starts it as a child process) or, with
//! `--listen`, over streamable HTTP at `/mcp`, on the official SDK
//! (`rmcp`), and is a client of a running `archivist serve` over gRPC,
//! reached as the terminal client reaches it (`--server`, TLS, the
//! tenant's token from `ARCHIVIST_TOKEN`).
//!
//! Tools: `remember` (AppendEntries; without a session, the subject's
//! session of the day), `recall` (Search), `context` (GetContext within a
//! budget), `list_sessions` (ListSessions) and, only when started with
//! `--allow-forget`, `forget` (DeleteSession) and `forget_subject`
//! (DeleteSubject): without the flag they are not listed, and a call
//! naming one anyway is refused with a tool error saying which flag would
//! allow it.
//!
//! What holds for every call: arguments are checked here, every bad field
//! named, before anything is sent (`args.rs`); every failure is a tool
//! error carrying the gRPC code and reason, retryability and its delay,
//! the causes and a recap's `Failure`, in text and in structured content
//! (`error.rs`); an answer stays within `--max-answer-bytes` (`context`
//! asks for a cover zoomed out to fit; otherwise cut with a note,
//! `answer.rs`); stored text is quoted so it cannot forge a line of an
//! answer; and nothing a caller sends or a server does ends
//! the process: an archivist that went away is a retryable error until it
//! is back. `tools.rs` holds the tools (`recall.rs` the search),
//! `handler.rs` the MCP handler and the shared connection, `http.rs` the
//! HTTP endpoint (its sessions capped by `--max-sessions`, closed after
//! `--session-idle`).

mod answer;
mod args;
mod error;
mod handler;
mod http;
mod recall;
mod tools;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rmcp::ServiceExt;

use crate::cli::{ConnectFlags, parse_duration, parse_listen, shutdown_signal};
use crate::client::{ConnectError, connect_with};
use handler::{Archivist, Backend};

/// The smallest answer cap: one session line or a short context.
const MIN_ANSWER_BYTES: usize = 1024;

/// `archivist mcp`'s flags.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub connect: ConnectFlags,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (IP:PORT
    /// or HOST:PORT; port 0 picks a free one, printed at start-up).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// Offer the `forget` and `forget_subject` tools, which erase a session
    /// or a subject's every session for good. Without it they are not
    /// listed and a call to them is refused.
    #[arg(long)]
    pub allow_forget: bool,
    /// The longest one call to archivist may take ("30s", "2m").
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// The most bytes one answer may take (its text, and its structured
    /// content); a larger one is cut, saying so. The default is about
    /// 8,000 tokens, within common hosts' limits.
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024,
          value_parser = clap::value_parser!(u32).range(MIN_ANSWER_BYTES as i64..))]
    pub max_answer_bytes: u32,
    /// With --listen: answer each POST on its own, with no `initialize` or
    /// session id needed, as plain JSON when the client accepts it (SSE
    /// when it accepts only that). Without it, MCP sessions as the spec's
    /// streamable HTTP keeps them.
    #[arg(long, requires = "listen")]
    pub stateless: bool,
    /// With --listen: the most MCP sessions open at once; a handshake past
    /// it is refused (HTTP 503) until one closes or expires.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,
    /// With --listen: how long an MCP session may go without a message
    /// before it is closed ("5m", "30s").
    #[arg(long, value_name = "DURATION", value_parser = parse_idle, default_value = "5m")]
    pub session_idle: Duration,
    /// Allow --listen on an address other than loopback. The MCP endpoint
    /// has no authentication of its own: anyone who reaches it acts as
    /// the tenant whose token this process holds.
    #[arg(long)]
    pub insecure_open: bool,
}

/// A session's idle time: a session closed at once could never be used.
fn parse_idle(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("a session must be allowed some idle time, such as \"30s\"".into()),
        d => Ok(d),
    }
}

/// Runs the MCP server until its input ends (stdio) or a signal comes.
pub async fn run(args: McpArgs) -> ExitCode {
    if let Some(addr) = args.listen
        && !addr.ip().is_loopback()
        && !args.insecure_open
    {
        eprintln!(
            "error: --listen {addr} is not a loopback address, and the MCP endpoint has no authentication of its own (anyone who reaches it acts as this tenant); listen on 127.0.0.1, or pass --insecure-open behind your own access control"
        );
        return ExitCode::from(crate::cli::EXIT_USAGE);
    }
    let options = args.connect.options(Some(args.timeout));
    // A server that does not answer yet is no reason not to start: hosts
    // start their MCP servers with themselves, and each call says so until
    // archivist is up. Settings that can never work are.
    let client = match connect_with(&options).await {
        Ok(client) => Some(client),
        Err(
            e @ (ConnectError::Refused(..)
            | ConnectError::Connect(..)
            | ConnectError::ConnectTimeout(..)),
        ) => {
            tracing::warn!(
                "{}; starting anyway: each tool call says so until it answers",
                crate::error_chain(&e)
            );
            None
        }
        Err(
            e @ (ConnectError::BadAddress(..)
            | ConnectError::NotTls(..)
            | ConnectError::Tls(..)
            | ConnectError::Read(..)
            | ConnectError::HalfIdentity
            | ConnectError::BadToken
            | ConnectError::TlsNeedsHttps(..)),
        ) => {
            eprintln!("error: {}", crate::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let backend = Arc::new(Backend::new(
        options,
        args.timeout,
        args.allow_forget,
        args.max_answer_bytes as usize,
        client,
    ));
    match args.listen {
        None => serve_stdio(backend).await,
        Some(addr) => {
            let opts = http::HttpOptions {
                open: args.insecure_open,
                stateless: args.stateless,
                max_sessions: args.max_sessions as usize,
                session_idle: args.session_idle,
            };
            http::serve(backend, addr, opts).await
        }
    }
}

async fn serve_stdio(backend: Arc<Backend>) -> ExitCode {
    let service = match Archivist::new(backend)
        .serve(rmcp::transport::io::stdio_pipes())
        .await
    {
        Ok(service) => service,
        Err(e) => {
            // The host closed the pipe or spoke no MCP before the
            // handshake ended.
            eprintln!("error: the MCP handshake on stdio failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        quit = service.waiting() => match quit {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: the MCP service stopped: {e}");
                ExitCode::FAILURE
            }
        },
        _ = shutdown_signal() => ExitCode::SUCCESS,
    }
}

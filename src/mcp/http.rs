//! `archivist mcp --listen`: streamable HTTP at `/mcp`. Stateful (the
//! default) keeps an MCP session per client that sent `initialize`: at
//! most `--max-sessions` at once, each closed after `--session-idle`
//! without a message, so a flood of handshakes cannot grow the process
//! without bound.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::handler::{Archivist, Backend};
use crate::cli::shutdown_signal;
use crate::throttle::{LOG_INTERVAL, Throttle};

/// The largest request body read (rmcp's own bound on a POST).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How the HTTP endpoint keeps its clients.
pub(super) struct HttpOptions {
    /// Answer anyone who reaches the port, whatever `Host` they name.
    pub(super) open: bool,
    /// The most MCP sessions open at once.
    pub(super) max_sessions: usize,
    /// How long a session may go without a message before it is closed.
    pub(super) session_idle: Duration,
}

type Service = StreamableHttpService<Archivist, LocalSessionManager>;

/// What every request to the stateful endpoint shares.
struct Stateful {
    service: Service,
    sessions: Arc<LocalSessionManager>,
    max_sessions: usize,
    session_idle: Duration,
    /// Held from the count of open sessions to the new one's creation, so
    /// handshakes at once cannot all pass the cap together.
    opening: tokio::sync::Mutex<()>,
}

pub(super) async fn serve(backend: Arc<Backend>, addr: SocketAddr, opts: HttpOptions) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    let stop = CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    // On loopback the SDK's own Host check (loopback names only) stands
    // against DNS rebinding; an open endpoint answers any name it is
    // reached by.
    if opts.open {
        config = config.disable_allowed_hosts();
    }
    let mut sessions = LocalSessionManager::default();
    let mut session_config = SessionConfig::default();
    session_config.keep_alive = Some(opts.session_idle);
    sessions.session_config = session_config;
    let sessions = Arc::new(sessions);
    let state = Arc::new(Stateful {
        service: StreamableHttpService::new(
            move || Ok(Archivist::new(backend.clone())),
            sessions.clone(),
            config,
        ),
        sessions,
        max_sessions: opts.max_sessions,
        session_idle: opts.session_idle,
        opening: tokio::sync::Mutex::new(()),
    });
    let router = axum::Router::new()
        .route("/mcp", axum::routing::any(stateful))
        .with_state(state);
    // Tests and scripts read the address from this line.
    eprintln!("archivist mcp is serving at http://{local}/mcp");
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            stop.cancel();
        })
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: the MCP HTTP server stopped: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One request to the stateful endpoint: a handshake counted against the
/// cap, anything else straight to the SDK.
async fn stateful(State(state): State<Arc<Stateful>>, request: Request) -> Response {
    if request.method() != Method::POST || request.headers().contains_key("mcp-session-id") {
        return state.service.handle(request).await.into_response();
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("Payload Too Large: a request may take at most {MAX_BODY_BYTES} bytes"),
            )
                .into_response();
        }
    };
    let message: Option<Value> = serde_json::from_slice(&bytes).ok();
    let request = Request::from_parts(parts, Body::from(bytes));
    let initialize = message
        .as_ref()
        .is_some_and(|m| m.get("method").and_then(Value::as_str) == Some("initialize"));
    if !initialize {
        return state.service.handle(request).await.into_response();
    }
    let _opening = state.opening.lock().await;
    let open = state.sessions.sessions.read().await.len();
    if open >= state.max_sessions {
        return sessions_full(&state, message.as_ref().and_then(|m| m.get("id")));
    }
    state.service.handle(request).await.into_response()
}

/// Refused logs once in a while, however many handshakes a flood sends.
static FULL: Throttle = Throttle::new(LOG_INTERVAL);

/// 503 with a JSON-RPC error a client can show: the cap, and when a place
/// may be free (an idle session is closed by then at the latest).
fn sessions_full(state: &Stateful, id: Option<&Value>) -> Response {
    if let Some(held_back) = FULL.hit() {
        tracing::warn!(
            max_sessions = state.max_sessions,
            held_back,
            "an MCP handshake was refused: every session is taken"
        );
    }
    let message = format!(
        "this MCP server already holds {} sessions (--max-sessions); close one (HTTP DELETE with its Mcp-Session-Id) or retry once an idle one has expired (--session-idle {})",
        state.max_sessions,
        humantime::format_duration(state.session_idle)
    );
    let body = json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": -32000, "message": message},
    });
    let retry_after = state.session_idle.as_secs().clamp(1, 60);
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

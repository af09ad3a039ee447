//! `archivist mcp --listen`: streamable HTTP at `/mcp`. Stateful (the
//! default) keeps an MCP session per client that sent `initialize`: at
//! most `--max-sessions` at once, each closed after `--session-idle`
//! without a message, so a flood of handshakes cannot grow the process
//! without bound. `--stateless` answers each POST on its own, no
//! handshake or session id needed, as plain JSON when the client accepts
//! it and as an SSE stream when it accepts only that; a response or a
//! notification is 202 with no body, as in a stateful session. On both, a
//! POST whose JSON body is no JSON-RPC message, or whose body is over the
//! cap, is answered as JSON-RPC says (a parse error, an invalid request),
//! not as the SDK does.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion, RequestId};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
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
    /// Answer each POST on its own, without MCP sessions.
    pub(super) stateless: bool,
    /// The most MCP sessions open at once.
    pub(super) max_sessions: usize,
    /// How long a session may go without a message before it is closed.
    pub(super) session_idle: Duration,
}

type Service = StreamableHttpService<Archivist, LocalSessionManager>;
type OneShot = StreamableHttpService<Archivist, NeverSessionManager>;

/// The stateless endpoint: the same tools answered as JSON or as SSE.
struct Stateless {
    json: OneShot,
    sse: OneShot,
    /// The SDK's allowed hosts (`guarded`).
    hosts: Vec<String>,
}

/// What every request to the stateful endpoint shares.
struct Stateful {
    service: Service,
    /// The SDK's allowed hosts (`guarded`).
    hosts: Vec<String>,
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
    let router = match opts.stateless {
        true => stateless_router(backend, config),
        false => stateful_router(backend, config, &opts),
    };
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

fn stateless_router(backend: Arc<Backend>, config: StreamableHttpServerConfig) -> axum::Router {
    let config = config.with_legacy_session_mode(false);
    let service = |json: bool| {
        let backend = backend.clone();
        StreamableHttpService::new(
            move || Ok(Archivist::new(backend.clone())),
            Arc::new(NeverSessionManager::default()),
            config.clone().with_json_response(json),
        )
    };
    let state = Arc::new(Stateless {
        json: service(true),
        sse: service(false),
        hosts: config.allowed_hosts.clone(),
    });
    axum::Router::new()
        .route("/mcp", axum::routing::any(stateless))
        .with_state(state)
}

fn stateful_router(
    backend: Arc<Backend>,
    config: StreamableHttpServerConfig,
    opts: &HttpOptions,
) -> axum::Router {
    let mut sessions = LocalSessionManager::default();
    let mut session_config = SessionConfig::default();
    session_config.keep_alive = Some(opts.session_idle);
    sessions.session_config = session_config;
    let sessions = Arc::new(sessions);
    let hosts = config.allowed_hosts.clone();
    let state = Arc::new(Stateful {
        hosts,
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
    axum::Router::new()
        .route("/mcp", axum::routing::any(stateful))
        .with_state(state)
}

/// One request to the stateless endpoint. The SDK insists a POST accept
/// both JSON and SSE; a generic JSON-RPC client often sends neither, so
/// the answer's form is chosen here from what the client accepts (JSON
/// first, no Accept meaning anything) and the SDK told it may use both.
async fn stateless(State(state): State<Arc<Stateless>>, request: Request) -> Response {
    if request.method() != Method::POST || guarded(&request, &state.hosts) {
        return state.json.handle(request).await.into_response();
    }
    let (mut request, message) = match read_message(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // A response (or error) to no request of this server's: taken as the
    // stateful endpoint takes one in a session, 202 with no body (the SDK
    // refuses it here, with an error that has no id).
    if let Some(ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_)) = message {
        return match unknown_version(request.headers()) {
            Some(refused) => refused,
            None => StatusCode::ACCEPTED.into_response(),
        };
    }
    let (json, sse) = accepted(request.headers());
    let service = match (json, sse) {
        (true, _) => &state.json,
        (false, true) => &state.sse,
        (false, false) => {
            return (
                StatusCode::NOT_ACCEPTABLE,
                "Not Acceptable: this endpoint answers application/json or text/event-stream",
            )
                .into_response();
        }
    };
    request.headers_mut().insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    service.handle(request).await.into_response()
}

/// The SDK's refusal of an `MCP-Protocol-Version` it does not know, which
/// it makes of every message in a session and of a notification here, so
/// a response the SDK never sees is refused alike.
fn unknown_version(headers: &http::HeaderMap) -> Option<Response> {
    let value = headers.get("mcp-protocol-version")?;
    let message = match value.to_str() {
        Err(_) => "Bad Request: Invalid MCP-Protocol-Version header encoding".to_owned(),
        Ok(v)
            if ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .any(|k| k.as_str() == v) =>
        {
            return None;
        }
        Ok(v) => format!("Bad Request: Unsupported MCP-Protocol-Version: {v}"),
    };
    Some((StatusCode::BAD_REQUEST, message).into_response())
}

/// Whether the client accepts JSON, and SSE: no Accept header accepts
/// anything (RFC 9110), as do wildcards; `q=0` refuses.
fn accepted(headers: &http::HeaderMap) -> (bool, bool) {
    let mut values = headers.get_all(header::ACCEPT).iter().peekable();
    if values.peek().is_none() {
        return (true, true);
    }
    let (mut json, mut sse) = (false, false);
    let ranges = values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for range in ranges {
        let mut parts = range.split(';').map(str::trim);
        let essence = parts.next().unwrap_or_default().to_ascii_lowercase();
        let refused = parts.any(|p| {
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("q")
                    && v.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
            })
        });
        if refused {
            continue;
        }
        match essence.as_str() {
            "*/*" => (json, sse) = (true, true),
            "application/*" | "application/json" => json = true,
            "text/*" | "text/event-stream" => sse = true,
            _ => {}
        }
    }
    (json, sse)
}

/// One request to the stateful endpoint: a handshake counted against the
/// cap, anything else straight to the SDK.
async fn stateful(State(state): State<Arc<Stateful>>, request: Request) -> Response {
    if request.method() != Method::POST || guarded(&request, &state.hosts) {
        return state.service.handle(request).await.into_response();
    }
    let (request, message) = match read_message(request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    if request.headers().contains_key("mcp-session-id") {
        return state.service.handle(request).await.into_response();
    }
    let id = match message {
        Some(ClientJsonRpcMessage::Request(r))
            if matches!(r.request, ClientRequest::InitializeRequest(_)) =>
        {
            r.id
        }
        _ => return state.service.handle(request).await.into_response(),
    };
    let _opening = state.opening.lock().await;
    let open = state.sessions.sessions.read().await.len();
    if open >= state.max_sessions {
        return sessions_full(&state, &id);
    }
    state.service.handle(request).await.into_response()
}

/// Whether a request is left to the SDK's guard against DNS rebinding
/// before anything here reads it: its Host is not one the SDK allows
/// (`allowed`, the host names; empty: any), or it names an Origin (which
/// the SDK checks). Such a request gets the SDK's answers alone (403 for
/// a foreign Host), never this layer's, whatever its body.
fn guarded(request: &Request, allowed: &[String]) -> bool {
    if request.headers().contains_key(header::ORIGIN) {
        return true;
    }
    if allowed.is_empty() {
        return false;
    }
    let host = (request.headers().get(header::HOST))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| http::uri::Authority::try_from(v).ok())
        .or_else(|| request.uri().authority().cloned());
    let Some(host) = host else {
        return true;
    };
    let name = host.host().trim_matches(['[', ']']).to_ascii_lowercase();
    !allowed.iter().any(|a| {
        let a = a.trim();
        let a = http::uri::Authority::try_from(a)
            .map(|auth| auth.host().to_owned())
            .unwrap_or_else(|_| a.to_owned());
        a.trim_matches(['[', ']']).eq_ignore_ascii_case(&name)
    })
}

/// A POST's body, read whole (the request rebuilt around it), and the
/// JSON-RPC message in it when it is declared JSON. The SDK answers a body
/// it cannot read as a message with 415 Unsupported Media Type, which
/// tells a client its Content-Type is wrong when its JSON is; JSON-RPC
/// says a parse error (-32700) or an invalid request (-32600), which MCP's
/// HTTP transport sends as 400 with the error and no id. A body declared
/// as something else is left to the SDK (415 is right there).
async fn read_message(
    request: Request,
) -> Result<(Request, Option<ClientJsonRpcMessage>), Response> {
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => return Err(unread(e).into_response()),
    };
    let declared_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    let message = match declared_json {
        false => None,
        true => Some(check_message(&bytes).map_err(RpcError::into_response)?),
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), message))
}

/// The refusal of a body that could not be read whole: one over the cap
/// (413), or one the client broke off or framed wrongly (400). Either is
/// an invalid request with no id, as JSON-RPC has no code of its own for
/// them and the message was never read.
fn unread(e: axum::Error) -> RpcError {
    let over = std::error::Error::source(&e)
        .is_some_and(|cause| cause.is::<http_body_util::LengthLimitError>());
    let (status, message) = match over {
        true => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Request too large: a request may take at most {MAX_BODY_BYTES} bytes ({} MiB)",
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        ),
        false => (
            StatusCode::BAD_REQUEST,
            format!("Invalid Request: the body could not be read ({e})"),
        ),
    };
    RpcError {
        status,
        id: Value::Null,
        code: INVALID_REQUEST,
        message,
    }
}

/// The JSON-RPC message `bytes` hold, or the error JSON-RPC names for
/// what they hold instead.
fn check_message(bytes: &[u8]) -> Result<ClientJsonRpcMessage, RpcError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| RpcError {
        status: StatusCode::BAD_REQUEST,
        id: Value::Null,
        code: PARSE_ERROR,
        message: format!("Parse error: the body is not JSON ({e})"),
    })?;
    match serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        Ok(message) => Ok(message),
        Err(e) => {
            // The id, when one of a request's kind can be read, so a
            // client can match the error to its call.
            let id = value
                .get("id")
                .filter(|id| id.is_string() || id.is_number())
                .cloned()
                .unwrap_or(Value::Null);
            Err(RpcError {
                status: StatusCode::BAD_REQUEST,
                id,
                code: INVALID_REQUEST,
                message: format!("Invalid Request: not a JSON-RPC 2.0 message MCP knows ({e})"),
            })
        }
    }
}

/// JSON-RPC's code for a body that is not JSON.
const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's code for JSON that is no valid request.
const INVALID_REQUEST: i64 = -32600;

/// A JSON-RPC error for a POST that carried no message.
struct RpcError {
    /// 400, or 413 for a body over the cap.
    status: StatusCode,
    id: Value,
    code: i64,
    message: String,
}

impl RpcError {
    /// The error as a JSON-RPC response, with its HTTP status.
    fn into_response(self) -> Response {
        let RpcError {
            status,
            id,
            code,
            message,
        } = self;
        let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let mut response = (status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// Refused logs once in a while, however many handshakes a flood sends.
static FULL: Throttle = Throttle::new(LOG_INTERVAL);

/// 503 with a JSON-RPC error a client can show: the cap, and when a place
/// may be free (an idle session is closed by then at the latest).
fn sessions_full(state: &Stateful, id: &RequestId) -> Response {
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
        "id": id,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(values: &[&str]) -> (bool, bool) {
        let mut headers = http::HeaderMap::new();
        for v in values {
            headers.append(header::ACCEPT, HeaderValue::from_str(v).expect("header"));
        }
        accepted(&headers)
    }

    #[test]
    fn a_body_is_a_message_or_json_rpc_says_what_it_is() {
        let code = |body: &[u8]| check_message(body).err().map(|e| (e.code, e.id));
        assert_eq!(
            code(b"{\"jsonrpc\": \"2.0\", \"id\":"),
            Some((PARSE_ERROR, Value::Null))
        );
        assert_eq!(code(b""), Some((PARSE_ERROR, Value::Null)));
        assert_eq!(code(b"[]"), Some((INVALID_REQUEST, Value::Null)));
        assert_eq!(
            code(b"{\"jsonrpc\": \"1.0\", \"id\": 7, \"method\": \"tools/list\"}"),
            Some((INVALID_REQUEST, json!(7)))
        );
        assert_eq!(
            code(b"{\"jsonrpc\": \"2.0\", \"id\": 7, \"method\": \"tools/list\"}"),
            None
        );
    }

    #[tokio::test]
    async fn a_body_not_read_whole_is_over_the_cap_or_broken() {
        let big = Body::from(vec![b' '; MAX_BODY_BYTES + 1]);
        let over = unread(
            axum::body::to_bytes(big, MAX_BODY_BYTES)
                .await
                .expect_err("over the cap"),
        );
        assert_eq!(
            (over.status, over.code),
            (StatusCode::PAYLOAD_TOO_LARGE, INVALID_REQUEST)
        );
        assert!(
            over.message.contains("4194304 bytes (4 MiB)"),
            "{}",
            over.message
        );
        let broken = unread(axum::Error::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(
            (broken.status, broken.code),
            (StatusCode::BAD_REQUEST, INVALID_REQUEST)
        );
        assert_eq!(broken.id, Value::Null);
    }

    #[test]
    fn what_a_client_accepts_picks_the_answers_form() {
        assert_eq!(accept(&[]), (true, true));
        assert_eq!(accept(&["application/json"]), (true, false));
        assert_eq!(accept(&["text/event-stream"]), (false, true));
        assert_eq!(accept(&["Application/JSON; charset=utf-8"]), (true, false));
        assert_eq!(
            accept(&["application/json, text/event-stream"]),
            (true, true)
        );
        assert_eq!(accept(&["text/html", "*/*;q=0.1"]), (true, true));
        assert_eq!(accept(&["application/json;q=0", "text/*"]), (false, true));
        assert_eq!(accept(&["text/html"]), (false, false));
    }
}

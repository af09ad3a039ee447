//! The layers every call passes through before its handler, one concern
//! each (outermost first as `server.rs` stacks them):
//!
//! - `RecordCalls` counts every call, health and reflection included, by
//!   method and the status it really ended with: from the headers of a
//!   trailers-only answer, else from the trailers, else `Cancelled` when
//!   the caller went away before the end; and marks it running on its
//!   connection until its answer is gone, so idle connections can be told
//!   from busy ones (`conn.rs`).
//! - `NameRefusals` gives tonic's refusals of a request the codes gRPC
//!   defines, with details: over the message limit is RESOURCE_EXHAUSTED
//!   instead of OUT_OF_RANGE, undecodable is INVALID_ARGUMENT instead of
//!   INTERNAL; it rewrites those statuses and no other.
//!
//! Around the archivist service alone, after authentication (so a stranger
//! holds nothing):
//!
//! - `Whole` reads a request's body whole, within the message limit, the
//!   request timeout and the budget of bytes being received, before the
//!   call goes on: a stalled body holds no call slot.
//! - `Shed` caps the archivist calls served at once: past the cap a call
//!   is refused at once (RESOURCE_EXHAUSTED, TOO_MANY_CALLS, with a
//!   RetryInfo) instead of waiting in a queue that would grow without bound.
//!   A watch stream holds its slot only until its stream starts: watches
//!   have a budget of their own (`events.rs`), so however many are open,
//!   unary calls keep their slots. One tenant's searches (which may wait
//!   on the embedder) hold half of the slots at most: past that a search
//!   is refused at once (TOO_MANY_SEARCHES), so other calls keep the rest.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codegen::{BoxFuture, Bytes, Service, http};
use tonic::server::NamedService;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::conn::{CallOnConn, ConnInfo};
use super::status::ERROR_DOMAIN;
use crate::config::LimitsConfig;
use crate::metrics::Metrics;
use crate::model::Tenant;

const ARCHIVIST_PATH: &str = "/archivist.v1.Archivist/";
/// The one streaming method, whose stream holds no call slot.
const WATCH_PATH: &str = "/archivist.v1.Archivist/WatchSession";
/// The method whose calls may wait on the embedder.
const SEARCH_PATH: &str = "/archivist.v1.Archivist/Search";

/// What tonic says when a request is over `max_decoding_message_size`.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";
/// What tonic (through tonic-prost) says when a message does not decode.
const PROST_DECODE_ERROR: &str = "failed to decode Protobuf message: ";
/// What tonic says when a request's body ends before its message does.
const TONIC_TRUNCATED: [&str; 2] = [
    "Unexpected EOF decoding stream.",
    "Missing request message.",
];

/// Every method of `archivist.v1.Archivist`, each a metrics label of its
/// own (a test checks the list against the service's descriptor).
const METHODS: [&str; 14] = [
    "AppendEntries",
    "CloseSegment",
    "FlushSession",
    "GetSegment",
    "ListSegments",
    "GetContext",
    "RequeueSegments",
    "GetBacklog",
    "DeleteSession",
    "WatchSession",
    "ListSessions",
    "ListEntries",
    "DeleteSubject",
    "Search",
];

/// The metrics label for a request path: one of ours, or "other", so that
/// callers (even unauthenticated ones) cannot mint label values.
fn method_label(path: &str) -> &'static str {
    match path.strip_prefix(ARCHIVIST_PATH) {
        Some(name) => METHODS.into_iter().find(|m| *m == name).unwrap_or("other"),
        None if path.starts_with("/grpc.health.") => "health",
        None if path.starts_with("/grpc.reflection.") => "reflection",
        None => "other",
    }
}

/// The gRPC status in a header map (`grpc-status`), if there is one.
fn status_in(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from_i32)
}

/// A code's name as metrics label it.
fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

// ---- RecordCalls ----------------------------------------------------------

/// Counts every call by method and the status it ended with.
#[derive(Clone)]
pub(crate) struct RecordCalls {
    metrics: Arc<Metrics>,
}

impl RecordCalls {
    pub(crate) fn new(metrics: Arc<Metrics>) -> RecordCalls {
        RecordCalls { metrics }
    }
}

impl<S> tower::Layer<S> for RecordCalls {
    type Service = Recorded<S>;

    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Recorded<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Recorded<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<RecordedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let pending = Pending {
            metrics: self.metrics.clone(),
            method: method_label(request.uri().path()),
        };
        let watch = request.uri().path() == WATCH_PATH;
        let on_conn = request
            .extensions()
            .get::<ConnInfo>()
            .map(|info| info.state.begin_call(watch));
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = match call.await {
                Ok(response) => response,
                Err(e) => {
                    pending.record(Code::Unknown);
                    return Err(e);
                }
            };
            // A trailers-only answer (every error) has its status here.
            let pending = match status_in(response.headers()) {
                Some(code) => {
                    pending.record(code);
                    None
                }
                None => Some(pending),
            };
            Ok(response.map(|inner| RecordedBody {
                inner,
                pending,
                _on_conn: on_conn,
            }))
        })
    }
}

/// A call whose status is not known yet.
struct Pending {
    metrics: Arc<Metrics>,
    method: &'static str,
}

impl Pending {
    fn record(self, code: Code) {
        self.metrics.grpc_call(self.method, code_label(code));
    }
}

/// A response body that records its call's status when the trailers pass
/// (or `Cancelled` if it is dropped before the end), and keeps the call
/// marked on its connection while it lives.
pub(crate) struct RecordedBody<B> {
    inner: B,
    pending: Option<Pending>,
    _on_conn: Option<CallOnConn>,
}

impl<B> Drop for RecordedBody<B> {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.record(Code::Cancelled);
        }
    }
}

impl<B: Body + Unpin> Body for RecordedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_in)
                    && let Some(pending) = self.pending.take()
                {
                    pending.record(code);
                }
            }
            // The body ended or broke without a status: nothing says how the
            // call went.
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                if let Some(pending) = self.pending.take() {
                    pending.record(Code::Unknown);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// ---- NameRefusals --------------------------------------------------------

/// Gives tonic's own refusals of a request the codes gRPC defines, with
/// the rich details every other error carries: a request over the message
/// limit is RESOURCE_EXHAUSTED (MESSAGE_TOO_LARGE) instead of OUT_OF_RANGE,
/// and one that does not decode (a truncated message, a string that is not
/// UTF-8) is INVALID_ARGUMENT (MALFORMED_REQUEST, with a BadRequest naming
/// the field where prost says which) instead of INTERNAL. It rewrites those
/// statuses and no other.
#[derive(Clone)]
pub(crate) struct NameRefusals {
    max_message_bytes: usize,
}

impl NameRefusals {
    pub(crate) fn new(max_message_bytes: usize) -> NameRefusals {
        NameRefusals { max_message_bytes }
    }
}

impl<S> tower::Layer<S> for NameRefusals {
    type Service = Refusals<S>;

    fn layer(&self, inner: S) -> Refusals<S> {
        Refusals {
            inner,
            limit: self.max_message_bytes,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Refusals<S> {
    inner: S,
    limit: usize,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Refusals<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let ours = request.uri().path().starts_with(ARCHIVIST_PATH);
        let call = self.inner.call(request);
        let limit = self.limit;
        Box::pin(async move {
            let response = call.await?;
            if !ours {
                return Ok(response);
            }
            Ok(match refusal(response.headers(), limit) {
                Some(status) => status.into_http::<ResBody>(),
                None => response,
            })
        })
    }
}

/// A request over the message limit, as every layer refuses it.
fn too_large(limit: usize) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        "MESSAGE_TOO_LARGE",
        ERROR_DOMAIN,
        HashMap::from([("limit_bytes".to_owned(), limit.to_string())]),
    );
    Status::with_error_details(
        Code::ResourceExhausted,
        format!("the request message is larger than the server's limit of {limit} bytes"),
        details,
    )
}

/// A request that is not a well-formed message, as every layer refuses it.
fn malformed(field: &str, description: &str) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info("MALFORMED_REQUEST", ERROR_DOMAIN, HashMap::new());
    details.add_bad_request_violation(field, description);
    Status::with_error_details(
        Code::InvalidArgument,
        format!("the request is not a valid message: {field}: {description}"),
        details,
    )
}

/// The status to answer instead of tonic's, for a trailers-only answer
/// that is tonic refusing a request it could not read.
fn refusal(headers: &http::HeaderMap, limit: usize) -> Option<Status> {
    let code = status_in(headers)?;
    if !matches!(code, Code::OutOfRange | Code::Internal) {
        return None;
    }
    // grpc-message is percent-encoded.
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|m| percent_encoding::percent_decode_str(m).decode_utf8_lossy())?;
    match code {
        Code::OutOfRange if message.starts_with(TONIC_TOO_LARGE) => Some(too_large(limit)),
        Code::Internal => {
            if let Some(rest) = message.strip_prefix(PROST_DECODE_ERROR) {
                let (field, description) = decode_error_field(rest);
                return Some(malformed(&field, description));
            }
            TONIC_TRUNCATED
                .contains(&message.as_ref())
                .then(|| malformed("(request)", "the message ends before it is whole"))
        }
        _ => None,
    }
}

/// The field path and the description in the rest of a prost decode error
/// (`Inner.field: Outer.field: description`, innermost first), as
/// `outer.inner` and the description.
fn decode_error_field(rest: &str) -> (String, &str) {
    let mut fields = Vec::new();
    let mut tail = rest;
    while let Some((head, after)) = tail.split_once(": ") {
        let Some((message, field)) = head.split_once('.') else {
            break;
        };
        let ident =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !(ident(message) && ident(field)) {
            break;
        }
        fields.push(field);
        tail = after;
    }
    fields.reverse();
    let path = if fields.is_empty() {
        "(request)".to_owned()
    } else {
        fields.join(".")
    };
    (path, tail)
}

// ---- Whole ----------------------------------------------------------------

/// Reads an archivist request's body whole before the call may take a
/// slot: a client that sends its headers and then stalls holds no slot and
/// no more memory than the bytes it sent, and is cut off after
/// `limits.request_timeout`. What every pending body holds together is
/// capped too (`limits.max_receiving_bytes`): past it a request is refused
/// at once (OVERLOADED) rather than buffered. A body over the message
/// limit is refused as soon as its frame header says so; a body that is not
/// one whole gRPC message is refused as malformed.
#[derive(Clone)]
pub(crate) struct Whole<S> {
    inner: S,
    max_message_bytes: usize,
    timeout: Duration,
    receiving: Arc<Semaphore>,
}

impl<S> Whole<S> {
    pub(crate) fn new(inner: S, limits: &LimitsConfig) -> Whole<S> {
        let receiving = usize::try_from(limits.max_receiving_bytes)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Whole {
            inner,
            max_message_bytes: limits.max_message_bytes as usize,
            timeout: limits.request_timeout,
            receiving: Arc::new(Semaphore::new(receiving)),
        }
    }
}

impl<S: NamedService> NamedService for Whole<S> {
    const NAME: &'static str = S::NAME;
}

/// The gRPC frame header: a compression flag and the message's length.
const FRAME_HEADER: usize = 5;

impl<S, ResBody> Service<http::Request<tonic::body::Body>> for Whole<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // The service that was polled ready serves this call; a clone takes
        // its place for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let max_message_bytes = self.max_message_bytes;
        let timeout = self.timeout;
        let receiving = self.receiving.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let read = read_whole(body, max_message_bytes, &receiving);
            let (bytes, held) = match tokio::time::timeout(timeout, read).await {
                Ok(Ok(read)) => read,
                Ok(Err(status)) => return Ok(status.into_http()),
                Err(_) => return Ok(request_timeout(timeout).into_http()),
            };
            let body = tonic::body::Body::new(http_body_util::Full::new(bytes));
            let call = inner.call(http::Request::from_parts(parts, body));
            // From here the call's slot bounds what it holds.
            drop(held);
            call.await
        })
    }
}

/// The body of a unary request, whole, as one gRPC message; with the share
/// of the receiving budget its bytes hold.
async fn read_whole(
    mut body: tonic::body::Body,
    max_message_bytes: usize,
    receiving: &Arc<Semaphore>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Status> {
    use http_body_util::BodyExt;
    let mut buf: Vec<u8> = Vec::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut expected: Option<usize> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            // Trailers: a unary request has nothing to say in them.
            continue;
        };
        let n = u32::try_from(data.len()).map_err(|_| too_large(max_message_bytes))?;
        let permit = receiving
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| overloaded())?;
        match &mut held {
            Some(h) => h.merge(permit),
            None => held = Some(permit),
        }
        buf.extend_from_slice(&data);
        if expected.is_none() && buf.len() >= FRAME_HEADER {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > max_message_bytes {
                return Err(too_large(max_message_bytes));
            }
            buf.reserve_exact((FRAME_HEADER + len).saturating_sub(buf.len()));
            expected = Some(FRAME_HEADER + len);
        }
        if let Some(total) = expected
            && buf.len() > total
        {
            return Err(malformed(
                "(request)",
                "a unary call carries one message; more bytes followed it",
            ));
        }
    }
    match expected {
        Some(total) if buf.len() == total => Ok((Bytes::from(buf), held)),
        _ => Err(malformed(
            "(request)",
            "the body ends before its message is whole",
        )),
    }
}

/// A request whose body did not arrive whole in time.
fn request_timeout(timeout: Duration) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        "REQUEST_TIMEOUT",
        ERROR_DOMAIN,
        HashMap::from([("timeout_ms".to_owned(), timeout.as_millis().to_string())]),
    );
    Status::with_error_details(
        Code::DeadlineExceeded,
        format!(
            "the request body did not arrive whole within {} ms (limits.request_timeout)",
            timeout.as_millis()
        ),
        details,
    )
}

/// The bodies being received fill the receiving budget.
fn overloaded() -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info("OVERLOADED", ERROR_DOMAIN, HashMap::new());
    details.set_retry_info(Some(Duration::from_millis(100)));
    Status::with_error_details(
        Code::ResourceExhausted,
        "the server is receiving as many request bytes as it holds at once; retry shortly",
        details,
    )
}

// ---- ShedLoad -------------------------------------------------------------

/// Caps the archivist calls served at once (it wraps the archivist service
/// only: health and reflection stay out of the cap, so probes get through
/// an overload). A call takes its slot once its request is whole (`Whole`
/// runs first) and holds it until its answer is ready. A tenant's searches
/// take half of the slots at most (`Searches`).
#[derive(Clone)]
pub(crate) struct Shed<S> {
    inner: S,
    permits: Arc<Semaphore>,
    searches: Arc<Searches>,
}

impl<S> Shed<S> {
    /// `searches` is shared with the handlers whose calls search only
    /// with some requests (GetContext with a query), which take their
    /// turn themselves.
    pub(crate) fn new(inner: S, max_concurrent_calls: usize, searches: Arc<Searches>) -> Shed<S> {
        Shed {
            inner,
            permits: Arc::new(Semaphore::new(max_concurrent_calls)),
            searches,
        }
    }
}

/// The searches each tenant has running: a search waits on the embedder
/// (its query's vector), so a slow embedder could gather every call slot
/// in one tenant's searches and refuse everyone's appends. With at most
/// half the slots each, another tenant, and the same tenant's other calls,
/// always find slots.
pub(crate) struct Searches {
    limit: usize,
    busy: Mutex<HashMap<Tenant, usize>>,
}

impl Searches {
    /// Each tenant's searches may hold half of `max_concurrent_calls`.
    pub(crate) fn new(max_concurrent_calls: usize) -> Arc<Searches> {
        Arc::new(Searches {
            limit: (max_concurrent_calls / 2).max(1),
            busy: Mutex::new(HashMap::new()),
        })
    }

    /// A turn for one more of the tenant's searches, or the refusal
    /// (RESOURCE_EXHAUSTED, TOO_MANY_SEARCHES) at its limit.
    pub(crate) fn turn(self: &Arc<Self>, tenant: &Tenant) -> Result<SearchTurn, Status> {
        self.enter(tenant).ok_or_else(|| {
            let limit = self.limit;
            shed(
                "TOO_MANY_SEARCHES",
                format!(
                    "this tenant has {limit} searches running, half of the server's \
                     concurrent calls (limits.max_concurrent_calls); retry shortly"
                ),
                HashMap::from([("limit".to_owned(), limit.to_string())]),
            )
        })
    }

    /// A turn for one more of the tenant's searches; None at its limit.
    fn enter(self: &Arc<Self>, tenant: &Tenant) -> Option<SearchTurn> {
        // Poisoned only by a panic while counting, which leaves the count
        // whole: it is still the count.
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let n = busy.entry(tenant.clone()).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(SearchTurn {
            searches: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

/// One running search of a tenant, counted until it is dropped.
pub(crate) struct SearchTurn {
    searches: Arc<Searches>,
    tenant: Tenant,
}

impl Drop for SearchTurn {
    fn drop(&mut self) {
        let mut busy = self.searches.busy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = busy.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                busy.remove(&self.tenant);
            }
        }
    }
}

/// A call refused at once for a limit of concurrent calls, with a RetryInfo.
fn shed(reason: &str, message: String, metadata: HashMap<String, String>) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(reason, ERROR_DOMAIN, metadata);
    details.set_retry_info(Some(Duration::from_millis(100)));
    Status::with_error_details(Code::ResourceExhausted, message, details)
}

impl<S: NamedService> NamedService for Shed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody> Service<http::Request<ReqBody>> for Shed<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let refuse = |status: Status| -> Self::Future {
            let response = status.into_http::<tonic::body::Body>();
            Box::pin(async move { Ok(response) })
        };
        // The authenticator ran first and named the tenant; a call without
        // one fails in its handler, and takes no search turn here.
        let search = match request.extensions().get::<Tenant>() {
            Some(tenant) if request.uri().path() == SEARCH_PATH => {
                match self.searches.turn(tenant) {
                    Ok(turn) => Some(turn),
                    Err(status) => return refuse(status),
                }
            }
            _ => None,
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return refuse(shed(
                "TOO_MANY_CALLS",
                "the server is at its limit of concurrent calls; retry shortly".to_owned(),
                HashMap::new(),
            ));
        };
        let stream = request.uri().path() == WATCH_PATH;
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            if stream {
                // A watch's stream is bounded by the watch budget, not by
                // the call slots: the slot covered its start only.
                drop(permit);
                return Ok(response);
            }
            // The slot is a unary answer's until it is sent whole.
            Ok(response.map(|body| {
                tonic::body::Body::new(Held {
                    body,
                    _permit: permit,
                    _search: search,
                })
            }))
        })
    }
}

/// An answer's body, holding its call's slot (and a search's turn) until
/// it is dropped.
struct Held<B> {
    body: B,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _search: Option<SearchTurn>,
}

impl<B: Body + Unpin> Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: &str, message: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", code.parse().expect("header"));
        let encoded =
            percent_encoding::utf8_percent_encode(message, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        headers.insert("grpc-message", encoded.parse().expect("header"));
        headers
    }

    #[test]
    fn only_tonics_refusals_are_renamed() {
        let oversize = answer(
            "11",
            "Error, decoded message length too large: found 5 bytes",
        );
        let status = refusal(&oversize, 10).expect("renamed");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(refusal(&answer("11", "seq out of range"), 10).is_none());
        assert!(
            refusal(
                &answer(
                    "8",
                    "Error, decoded message length too large: found 5 bytes"
                ),
                10
            )
            .is_none()
        );
        let utf8 = answer(
            "13",
            "failed to decode Protobuf message: NewEntry.content: AppendEntriesRequest.entries: invalid string value: data is not UTF-8 encoded",
        );
        let status = refusal(&utf8, 10).expect("renamed");
        assert_eq!(status.code(), Code::InvalidArgument);
        let details = status.get_error_details();
        assert_eq!(
            details.error_info().map(|i| i.reason.as_str()),
            Some("MALFORMED_REQUEST")
        );
        let violation = &details.bad_request().expect("bad request").field_violations[0];
        assert_eq!(violation.field, "entries.content");
        assert_eq!(
            violation.description,
            "invalid string value: data is not UTF-8 encoded"
        );
        let short = answer("13", "failed to decode Protobuf message: buffer underflow");
        let status = refusal(&short, 10).expect("renamed");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(refusal(&answer("13", "Unexpected EOF decoding stream."), 10).is_some());
        // Our own INTERNAL errors pass untouched.
        assert!(refusal(&answer("13", "the call was not authenticated"), 10).is_none());
    }

    #[test]
    fn a_tenants_searches_take_their_share_and_give_it_back() {
        let searches = Arc::new(Searches {
            limit: 2,
            busy: Mutex::new(HashMap::new()),
        });
        let (a, b) = (Tenant("a".to_owned()), Tenant("b".to_owned()));
        let first = searches.enter(&a).expect("a turn");
        let _second = searches.enter(&a).expect("a turn");
        assert!(searches.enter(&a).is_none(), "over the tenant's share");
        let other = searches
            .enter(&b)
            .expect("another tenant's share is its own");
        drop(first);
        assert!(
            searches.enter(&a).is_some(),
            "a turn given back is taken again"
        );
        drop(other);
        assert!(!searches.busy.lock().expect("lock").contains_key(&b));
    }

    #[test]
    fn labels_are_a_fixed_set() {
        assert_eq!(
            method_label("/archivist.v1.Archivist/GetContext"),
            "GetContext"
        );
        assert_eq!(method_label("/archivist.v1.Archivist/Nope"), "other");
        // Every method the service has is labelled by its name.
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let service = set
            .file
            .iter()
            .flat_map(|f| &f.service)
            .find(|s| s.name() == "Archivist")
            .expect("the Archivist service");
        let mut names: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        let mut labelled = METHODS.to_vec();
        labelled.sort_unstable();
        assert_eq!(names, labelled);
        for name in names {
            let path = format!("/archivist.v1.Archivist/{name}");
            assert_eq!(method_label(&path), name);
        }
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), "health");
        assert_eq!(method_label("/x"), "other");
    }
}

//! The tonic service: validates and converts requests at the edge, calls
//! `service.rs`, converts back, and maps every error to a gRPC status with
//! the rich error model (ErrorInfo, BadRequest, RetryInfo, DebugInfo, and
//! the `archivist.v1.Failure` detail). The only file that sees tonic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use std::task::{Context as TaskContext, Poll};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use tonic::codegen::{BoxFuture, Service as TowerService, http};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::auth::{Auth, AuthError};
use crate::config::LimitsConfig;
use crate::failure::{Failure, FailureClass, cause_chain};
use crate::metrics::Metrics;
use crate::model::{
    Backlog, Context, ContextItem, Entry, Millis, NewEntry, Role, Segment, SegmentState,
    SessionName, Summary, Tenant,
};
use crate::pb;
use crate::service::{Service, ServiceError};
use crate::store::{SegmentFilter, StoreError};

/// The ErrorInfo domain of every error this service returns.
pub const ERROR_DOMAIN: &str = "archivist";
/// The type URL of the `Failure` status detail.
pub const FAILURE_TYPE_URL: &str = "type.googleapis.com/archivist.v1.Failure";

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 1000;
const MAX_CLIENT_ENTRY_ID: usize = 128;
/// Most segment ids one RequeueSegments call may name.
const MAX_REQUEUE_IDS: usize = 1000;
/// A waiting call answers this long before its deadline, so the answer
/// (the segment as it stands) arrives before the client gives up.
const DEADLINE_MARGIN: Duration = Duration::from_millis(100);
/// Violations listed in one status; more would only bloat the trailer.
const MAX_VIOLATIONS: usize = 50;
/// Longest cause line sent; status details ride in a header block.
const MAX_CAUSE_CHARS: usize = 1024;

pub struct GrpcService {
    service: Arc<Service>,
    limits: LimitsConfig,
}

impl GrpcService {
    pub fn new(service: Arc<Service>, limits: LimitsConfig) -> GrpcService {
        GrpcService { service, limits }
    }

    /// The service as tonic serves it: reading messages up to
    /// `max_message_bytes`, every call authenticated first.
    pub fn into_server(
        self,
        auth: Arc<Auth>,
        max_message_bytes: usize,
    ) -> InterceptedService<pb::archivist_server::ArchivistServer<GrpcService>, Authenticator> {
        let server = pb::archivist_server::ArchivistServer::new(self)
            .max_decoding_message_size(max_message_bytes);
        InterceptedService::new(server, Authenticator { auth })
    }
}

const ARCHIVIST_PATH: &str = "/archivist.v1.Archivist/";

/// The metrics label for a request path: one of ours, or "other", so that
/// callers (even unauthenticated ones) cannot mint label values.
fn method_label(path: &str) -> &'static str {
    const METHODS: [&str; 8] = [
        "AppendEntries",
        "CloseSegment",
        "FlushSession",
        "GetSegment",
        "ListSegments",
        "GetContext",
        "RequeueSegments",
        "GetBacklog",
    ];
    match path.strip_prefix(ARCHIVIST_PATH) {
        Some(name) => METHODS.into_iter().find(|m| *m == name).unwrap_or("other"),
        None if path.starts_with("/grpc.health.") => "health",
        None if path.starts_with("/grpc.reflection.") => "reflection",
        None => "other",
    }
}

/// Caps the calls served at once: a call past the cap is answered at once
/// with RESOURCE_EXHAUSTED (and a RetryInfo) instead of waiting in a queue
/// that would grow without bound under overload. Also counts every call by
/// method and status code, and gives a message over the size limit the
/// code gRPC defines for it.
#[derive(Clone)]
pub struct CallGate {
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    max_message_bytes: usize,
}

impl CallGate {
    pub fn new(
        max_concurrent_calls: usize,
        max_message_bytes: usize,
        metrics: Arc<Metrics>,
    ) -> CallGate {
        CallGate {
            permits: Arc::new(Semaphore::new(max_concurrent_calls)),
            metrics,
            max_message_bytes,
        }
    }
}

impl<S> tower::Layer<S> for CallGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    gate: CallGate,
}

impl<S, ReqBody, ResBody> TowerService<http::Request<ReqBody>> for Gated<S>
where
    S: TowerService<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        let method = method_label(path);
        let metrics = self.gate.metrics.clone();
        // Health and reflection stay out of the cap: probes must get through
        // an overload, and their streams would hold a permit only until
        // their headers anyway.
        if !path.starts_with(ARCHIVIST_PATH) {
            let call = self.inner.call(request);
            return Box::pin(async move {
                let response = call.await;
                metrics.grpc_call(method, Code::Ok);
                response
            });
        }
        let Ok(permit) = self.gate.permits.clone().try_acquire_owned() else {
            metrics.grpc_call(method, Code::ResourceExhausted);
            let mut details = ErrorDetails::new();
            details.set_error_info("TOO_MANY_CALLS", ERROR_DOMAIN, HashMap::new());
            details.set_retry_info(Some(Duration::from_millis(100)));
            let status = Status::with_error_details(
                Code::ResourceExhausted,
                "the server is at its limit of concurrent calls; retry shortly",
                details,
            );
            let response = status.into_http::<ResBody>();
            return Box::pin(async move { Ok(response) });
        };
        let call = self.inner.call(request);
        let limit = self.gate.max_message_bytes;
        Box::pin(async move {
            let mut response = call.await;
            drop(permit);
            if let Ok(r) = &mut response {
                // An error status travels in the headers of a trailers-only
                // response; a success's status comes in the trailers.
                let mut code = r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(Code::Ok, Code::from_i32);
                // No handler here answers OUT_OF_RANGE: it is tonic refusing
                // a message over max_decoding_message_size, which gRPC
                // names RESOURCE_EXHAUSTED.
                if code == Code::OutOfRange {
                    code = Code::ResourceExhausted;
                    let mut details = ErrorDetails::new();
                    details.set_error_info(
                        "MESSAGE_TOO_LARGE",
                        ERROR_DOMAIN,
                        HashMap::from([("limit_bytes".to_owned(), limit.to_string())]),
                    );
                    *r = Status::with_error_details(
                        code,
                        format!(
                            "the request message is larger than the server's limit of {limit} bytes"
                        ),
                        details,
                    )
                    .into_http::<ResBody>();
                }
                metrics.grpc_call(method, code);
            }
            response
        })
    }
}

/// Resolves each call's tenant from its bearer token before the call runs;
/// a call without a valid token goes no further.
#[derive(Clone)]
pub struct Authenticator {
    auth: Arc<Auth>,
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.auth.tenant(header) {
            Ok(tenant) => {
                request.extensions_mut().insert(tenant);
                Ok(request)
            }
            Err(e) => {
                let reason = match e {
                    AuthError::Missing => "MISSING_TOKEN",
                    AuthError::Invalid => "INVALID_TOKEN",
                };
                let mut details = ErrorDetails::new();
                details.set_error_info(reason, ERROR_DOMAIN, HashMap::new());
                Err(Status::with_error_details(
                    Code::Unauthenticated,
                    e.to_string(),
                    details,
                ))
            }
        }
    }
}

/// The caller's tenant, as the authenticator resolved it. A call that
/// reached a handler without passing the authenticator is a wiring bug: it
/// fails closed rather than running as the default tenant.
fn tenant<T>(request: &Request<T>) -> Result<Tenant, Status> {
    request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

#[tonic::async_trait]
impl pb::archivist_server::Archivist for GrpcService {
    async fn append_entries(
        &self,
        request: Request<pb::AppendEntriesRequest>,
    ) -> Result<Response<pb::AppendEntriesResponse>, Status> {
        let tenant = tenant(&request)?;
        let (session, entries) = parse_append(request.into_inner(), &self.limits)?;
        let outcome = self
            .service
            .append(&tenant, &session, entries)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::AppendEntriesResponse {
            entries: outcome
                .entries
                .into_iter()
                .map(|e| pb::AppendedEntry {
                    seq: e.seq,
                    client_entry_id: e.client_entry_id.unwrap_or_default(),
                    duplicate: e.duplicate,
                })
                .collect(),
            open_segment_id: outcome.open_segment_id,
            closed_segment_ids: outcome.closed_segment_ids,
        }))
    }

    async fn close_segment(
        &self,
        request: Request<pb::CloseSegmentRequest>,
    ) -> Result<Response<pb::CloseSegmentResponse>, Status> {
        let tenant = tenant(&request)?;
        let deadline = call_deadline(&request);
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        // Without a deadline a waiting close is bounded by the pass itself.
        let wait_until = req
            .wait
            .then(|| deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(24 * 3600)));
        let segment = self
            .service
            .close_segment(&tenant, &session, wait_until)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::CloseSegmentResponse {
            segment: segment.map(segment_to_pb),
        }))
    }

    async fn flush_session(
        &self,
        request: Request<pb::FlushSessionRequest>,
    ) -> Result<Response<pb::FlushSessionResponse>, Status> {
        let tenant = tenant(&request)?;
        let deadline = call_deadline(&request);
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        let flushed = self
            .service
            .flush(&tenant, &session, deadline)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::FlushSessionResponse {
            segments: flushed.segments.into_iter().map(segment_to_pb).collect(),
            complete: flushed.complete,
        }))
    }

    async fn get_segment(
        &self,
        request: Request<pb::GetSegmentRequest>,
    ) -> Result<Response<pb::Segment>, Status> {
        let tenant = tenant(&request)?;
        let id = request.into_inner().segment_id;
        let segment = self
            .service
            .segment(&tenant, id)
            .await
            .map_err(service_status)?;
        Ok(Response::new(segment_to_pb(segment)))
    }

    async fn list_segments(
        &self,
        request: Request<pb::ListSegmentsRequest>,
    ) -> Result<Response<pb::ListSegmentsResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let mut violations = Vec::new();
        let session = match req.session_id.as_str() {
            "" => None,
            raw => match parse_session(raw, "session_id") {
                Ok(s) => Some(s),
                Err(v) => {
                    violations.extend(v);
                    None
                }
            },
        };
        let mut states = Vec::new();
        for (i, raw) in req.states.iter().enumerate() {
            match state_from_pb(*raw) {
                Some(s) => states.push(s),
                None => violations.push(violation(
                    format!("states[{i}]"),
                    "UNKNOWN_STATE",
                    format!("{raw} is not a segment state"),
                )),
            }
        }
        let after = match parse_page_token(&req.page_token) {
            Some(after) => after,
            None => {
                violations.push(violation(
                    "page_token",
                    "INVALID_PAGE_TOKEN",
                    "not a page token this service issued",
                ));
                0
            }
        };
        if !violations.is_empty() {
            return Err(invalid(violations));
        }
        let page_size = match req.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let filter = SegmentFilter {
            session,
            states,
            ids: Vec::new(),
        };
        let page = self
            .service
            .list_segments(&tenant, filter, after, page_size)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::ListSegmentsResponse {
            segments: page.segments.into_iter().map(segment_to_pb).collect(),
            next_page_token: page.next_after.map(page_token).unwrap_or_default(),
        }))
    }

    async fn get_context(
        &self,
        request: Request<pb::GetContextRequest>,
    ) -> Result<Response<pb::GetContextResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        let context = self
            .service
            .context(&tenant, &session, req.max_tokens)
            .await
            .map_err(service_status)?;
        Ok(Response::new(context_to_pb(context)))
    }

    async fn requeue_segments(
        &self,
        request: Request<pb::RequeueSegmentsRequest>,
    ) -> Result<Response<pb::RequeueSegmentsResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let session = match req.session_id.as_str() {
            "" => None,
            raw => Some(parse_session(raw, "session_id").map_err(invalid)?),
        };
        if req.segment_ids.len() > MAX_REQUEUE_IDS {
            return Err(invalid(vec![violation(
                "segment_ids",
                "TOO_MANY_SEGMENT_IDS",
                format!(
                    "{} ids in one call; at most {MAX_REQUEUE_IDS} are allowed (leave it empty to match every segment)",
                    req.segment_ids.len()
                ),
            )]));
        }
        let requeued = self
            .service
            .requeue(&tenant, session, req.segment_ids, req.include_parked)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::RequeueSegmentsResponse { requeued }))
    }

    async fn get_backlog(
        &self,
        request: Request<pb::GetBacklogRequest>,
    ) -> Result<Response<pb::Backlog>, Status> {
        let tenant = tenant(&request)?;
        let backlog = self
            .service
            .backlog(&tenant)
            .await
            .map_err(service_status)?;
        Ok(Response::new(backlog_to_pb(backlog)))
    }
}

// ---- validation -----------------------------------------------------------

fn violation(
    field: impl Into<String>,
    reason: &str,
    description: impl Into<String>,
) -> FieldViolation {
    let mut v = FieldViolation::new(field, description);
    v.reason = reason.to_owned();
    v
}

fn parse_session(raw: &str, field: &str) -> Result<SessionName, Vec<FieldViolation>> {
    SessionName::parse(raw).map_err(|e| vec![violation(field, "INVALID_SESSION_ID", e.to_string())])
}

fn parse_append(
    req: pb::AppendEntriesRequest,
    limits: &LimitsConfig,
) -> Result<(SessionName, Vec<NewEntry>), Status> {
    let mut violations = Vec::new();
    let session = parse_session(&req.session_id, "session_id").map_err(|v| violations.extend(v));
    if req.entries.is_empty() {
        violations.push(violation(
            "entries",
            "NO_ENTRIES",
            "at least one entry is required",
        ));
    }
    if req.entries.len() > limits.max_entries_per_call as usize {
        violations.push(violation(
            "entries",
            "TOO_MANY_ENTRIES",
            format!(
                "{} entries in one call; at most {} are allowed",
                req.entries.len(),
                limits.max_entries_per_call
            ),
        ));
        // Checking each of an oversized batch would only say more of the same.
        return Err(invalid(violations));
    }
    let mut entries = Vec::with_capacity(req.entries.len());
    for (i, e) in req.entries.into_iter().enumerate() {
        let role = match pb::Role::try_from(e.role) {
            Ok(pb::Role::User) => Some(Role::User),
            Ok(pb::Role::Assistant) => Some(Role::Assistant),
            Ok(pb::Role::System) => Some(Role::System),
            Ok(pb::Role::Tool) => Some(Role::Tool),
            Ok(pb::Role::Unspecified) | Err(_) => {
                violations.push(violation(
                    format!("entries[{i}].role"),
                    "INVALID_ROLE",
                    format!(
                        "role {} is not one of ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM, ROLE_TOOL",
                        e.role
                    ),
                ));
                None
            }
        };
        if e.content.is_empty() {
            violations.push(violation(
                format!("entries[{i}].content"),
                "EMPTY_CONTENT",
                "content must not be empty",
            ));
        } else if e.content.len() > limits.max_content_bytes as usize {
            violations.push(violation(
                format!("entries[{i}].content"),
                "CONTENT_TOO_LARGE",
                format!(
                    "content is {} bytes; at most {} are allowed",
                    e.content.len(),
                    limits.max_content_bytes
                ),
            ));
        }
        let client_entry_id = match e.client_entry_id.as_str() {
            "" => None,
            id if id.chars().count() > MAX_CLIENT_ENTRY_ID || id.chars().any(char::is_control) => {
                violations.push(violation(
                    format!("entries[{i}].client_entry_id"),
                    "INVALID_CLIENT_ENTRY_ID",
                    format!(
                        "client_entry_id must be at most {MAX_CLIENT_ENTRY_ID} characters with no control characters"
                    ),
                ));
                None
            }
            _ => Some(e.client_entry_id),
        };
        if let Some(role) = role {
            entries.push(NewEntry {
                client_entry_id,
                role,
                content: e.content,
            });
        }
    }
    match session {
        Ok(session) if violations.is_empty() => Ok((session, entries)),
        _ => Err(invalid(violations)),
    }
}

/// Page tokens are opaque to callers: `p1.` and the last id served.
fn page_token(after: u64) -> String {
    format!("p1.{after}")
}

fn parse_page_token(token: &str) -> Option<u64> {
    if token.is_empty() {
        return Some(0);
    }
    let after: u64 = token.strip_prefix("p1.")?.parse().ok()?;
    (after <= i64::MAX as u64).then_some(after)
}

fn state_from_pb(raw: i32) -> Option<SegmentState> {
    match pb::SegmentState::try_from(raw) {
        Ok(pb::SegmentState::Open) => Some(SegmentState::Open),
        Ok(pb::SegmentState::Pending) => Some(SegmentState::Pending),
        Ok(pb::SegmentState::Summarised) => Some(SegmentState::Summarised),
        Ok(pb::SegmentState::Parked) => Some(SegmentState::Parked),
        Ok(pb::SegmentState::Unspecified) | Err(_) => None,
    }
}

/// The instant the caller stops waiting, from its `grpc-timeout` header,
/// less a margin so the answer gets back in time.
fn call_deadline<T>(request: &Request<T>) -> Option<Instant> {
    let raw = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(raw)?;
    Some(Instant::now() + timeout.saturating_sub(DEADLINE_MARGIN))
}

/// `grpc-timeout` is at most 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    if raw.len() < 2 || raw.len() > 9 {
        return None;
    }
    let (digits, unit) = raw.split_at(raw.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

// ---- errors ---------------------------------------------------------------

fn invalid(violations: Vec<FieldViolation>) -> Status {
    let reason = violations
        .first()
        .map(|v| v.reason.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "INVALID_ARGUMENT".to_owned());
    let message = violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .take(3)
        .collect::<Vec<_>>()
        .join("; ");
    let mut details = ErrorDetails::new();
    details.set_error_info(reason, ERROR_DOMAIN, HashMap::new());
    details.set_bad_request(
        violations
            .into_iter()
            .take(MAX_VIOLATIONS)
            .collect::<Vec<_>>(),
    );
    Status::with_error_details(Code::InvalidArgument, message, details)
}

fn service_status(err: ServiceError) -> Status {
    match err {
        ServiceError::RecapFailed {
            segment_id,
            failure,
        } => failure_status(segment_id, &failure),
        ServiceError::Store(e) => store_status(&e),
        ServiceError::PassPanicked { segment_id } => {
            let mut details = ErrorDetails::new();
            details.set_error_info(
                "RECAP_PASS_PANICKED",
                ERROR_DOMAIN,
                HashMap::from([("segment_id".to_owned(), segment_id.to_string())]),
            );
            Status::with_error_details(Code::Internal, err.to_string(), details)
        }
    }
}

fn store_status(err: &StoreError) -> Status {
    let (code, reason, metadata) = match err {
        StoreError::SessionNotFound(name) => (
            Code::NotFound,
            "SESSION_NOT_FOUND",
            vec![("session_id".to_owned(), name.clone())],
        ),
        StoreError::SegmentNotFound(id) => (
            Code::NotFound,
            "SEGMENT_NOT_FOUND",
            vec![("segment_id".to_owned(), id.to_string())],
        ),
        StoreError::Shared(inner) => return store_status(inner),
        StoreError::Closed => (Code::Unavailable, "SHUTTING_DOWN", Vec::new()),
        StoreError::Busy => (Code::ResourceExhausted, "OVERLOADED", Vec::new()),
        StoreError::TenantFull { limit, .. } => (
            Code::ResourceExhausted,
            "TENANT_STORAGE_FULL",
            vec![("limit_bytes".to_owned(), limit.to_string())],
        ),
        StoreError::Open { .. }
        | StoreError::DataDir { .. }
        | StoreError::Migration { .. }
        | StoreError::TooNew { .. }
        | StoreError::Sqlite(_)
        | StoreError::Batch(_)
        | StoreError::Corrupt(_)
        | StoreError::Worker(_) => (Code::Internal, "STORE_ERROR", Vec::new()),
    };
    let causes = cause_chain(err);
    if code == Code::Internal {
        tracing::error!(error = %causes.join(": "), "store error");
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(
        reason,
        ERROR_DOMAIN,
        metadata.into_iter().collect::<HashMap<_, _>>(),
    );
    match (code, err) {
        (Code::NotFound, _) => {}
        (_, StoreError::TenantFull { tenant, limit, .. }) => {
            details.add_quota_failure_violation(
                format!("tenant:{tenant}"),
                format!("stored content is capped at {limit} bytes (limits.max_tenant_bytes)"),
            );
        }
        (Code::ResourceExhausted, _) => {
            details.set_retry_info(Some(Duration::from_millis(100)));
        }
        _ => {
            details.set_debug_info(clip_causes(causes), "");
        }
    }
    Status::with_error_details(code, err.to_string(), details)
}

/// The status code for a failure class; exhaustive, so a new class must be
/// given one.
pub fn failure_code(class: FailureClass) -> Code {
    match class {
        FailureClass::Transport | FailureClass::Unavailable | FailureClass::MalformedResponse => {
            Code::Unavailable
        }
        FailureClass::Timeout | FailureClass::BudgetExhausted => Code::DeadlineExceeded,
        FailureClass::RateLimited | FailureClass::QuotaExhausted => Code::ResourceExhausted,
        FailureClass::Unauthorized | FailureClass::UnknownModel | FailureClass::InvalidRequest => {
            Code::FailedPrecondition
        }
        FailureClass::Cancelled => Code::Cancelled,
    }
}

fn failure_status(segment_id: u64, failure: &Failure) -> Status {
    let code = failure_code(failure.class);
    let mut metadata = HashMap::from([
        ("segment_id".to_owned(), segment_id.to_string()),
        ("attempts".to_owned(), failure.attempts.to_string()),
        ("provider".to_owned(), failure.provider.clone()),
        ("model".to_owned(), failure.model.clone()),
    ]);
    if let Some(status) = failure.http_status {
        metadata.insert("http_status".to_owned(), status.to_string());
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(failure.class.reason(), ERROR_DOMAIN, metadata);
    if let Some(wait) = failure.retry_after {
        details.set_retry_info(Some(wait));
    }
    details.set_debug_info(clip_causes(failure.causes.clone()), "");
    let message = format!(
        "recap of segment {segment_id} failed ({}) after {} attempt(s): {}",
        failure.class.as_str(),
        failure.attempts,
        failure
            .causes
            .last()
            .map(String::as_str)
            .unwrap_or("no cause recorded")
    );
    let status = Status::with_error_details(code, message.clone(), details);
    // tonic-types builds the standard details; the Failure detail is ours,
    // so add it to the same google.rpc.Status.
    let mut rpc = match tonic_types::pb::Status::decode(status.details()) {
        Ok(rpc) => rpc,
        Err(_) => return status,
    };
    rpc.details.push(prost_types::Any {
        type_url: FAILURE_TYPE_URL.to_owned(),
        value: failure_to_pb(failure).encode_to_vec(),
    });
    Status::with_details(code, message, rpc.encode_to_vec().into())
}

/// Most bytes of causes one status carries: details ride in the
/// `grpc-status-details-bin` trailer, and clients refuse header blocks past
/// 16 KiB by default.
const MAX_CAUSES_BYTES: usize = 6 * 1024;

/// Each cause cut to MAX_CAUSE_CHARS, and the list to MAX_CAUSES_BYTES by
/// dropping middle causes (the outermost and the root say the most); every
/// cut says so in the text.
fn clip_causes(causes: Vec<String>) -> Vec<String> {
    let mut clipped: Vec<String> = causes
        .into_iter()
        .map(|c| {
            if c.chars().count() <= MAX_CAUSE_CHARS {
                c
            } else {
                let cut: String = c.chars().take(MAX_CAUSE_CHARS).collect();
                format!("{cut}… [truncated]")
            }
        })
        .collect();
    let mut dropped = 0;
    while clipped.iter().map(String::len).sum::<usize>() > MAX_CAUSES_BYTES && clipped.len() > 2 {
        clipped.remove(clipped.len() / 2);
        dropped += 1;
    }
    if dropped > 0 {
        let at = clipped.len() / 2;
        clipped.insert(at, format!("[{dropped} more causes truncated]"));
    }
    clipped
}

// ---- conversions ----------------------------------------------------------

fn timestamp(m: Millis) -> prost_types::Timestamp {
    prost_types::Timestamp::from(m.as_system_time())
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    })
}

fn role_to_pb(role: Role) -> pb::Role {
    match role {
        Role::User => pb::Role::User,
        Role::Assistant => pb::Role::Assistant,
        Role::System => pb::Role::System,
        Role::Tool => pb::Role::Tool,
    }
}

fn state_to_pb(state: SegmentState) -> pb::SegmentState {
    match state {
        SegmentState::Open => pb::SegmentState::Open,
        SegmentState::Pending => pb::SegmentState::Pending,
        SegmentState::Summarised => pb::SegmentState::Summarised,
        SegmentState::Parked => pb::SegmentState::Parked,
    }
}

fn summary_to_pb(s: Summary) -> pb::Summary {
    pb::Summary {
        text: s.text,
        provider: s.provider,
        model: s.model,
        prompt_version: s.prompt_version,
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        created_at: Some(timestamp(s.created_at)),
    }
}

fn entry_to_pb(e: Entry) -> pb::Entry {
    pb::Entry {
        seq: e.seq,
        client_entry_id: e.client_entry_id.unwrap_or_default(),
        role: role_to_pb(e.role).into(),
        content: e.content,
        created_at: Some(timestamp(e.created_at)),
    }
}

pub fn failure_to_pb(f: &Failure) -> pb::Failure {
    use pb::failure::Kind;
    let kind = match f.class {
        FailureClass::Transport => Kind::Transport(pb::failure::Transport {}),
        FailureClass::Timeout => Kind::Timeout(pb::failure::Timeout {}),
        FailureClass::Unavailable => Kind::Unavailable(pb::failure::Unavailable {}),
        FailureClass::RateLimited => Kind::RateLimited(pb::failure::RateLimited {
            retry_after: f.retry_after.map(duration),
        }),
        FailureClass::QuotaExhausted => Kind::QuotaExhausted(pb::failure::QuotaExhausted {}),
        FailureClass::Unauthorized => Kind::Unauthorized(pb::failure::Unauthorized {}),
        FailureClass::UnknownModel => Kind::UnknownModel(pb::failure::UnknownModel {}),
        FailureClass::InvalidRequest => Kind::InvalidRequest(pb::failure::InvalidRequest {}),
        FailureClass::MalformedResponse => {
            Kind::MalformedResponse(pb::failure::MalformedResponse {})
        }
        FailureClass::Cancelled => Kind::Cancelled(pb::failure::Cancelled {}),
        FailureClass::BudgetExhausted => Kind::BudgetExhausted(pb::failure::BudgetExhausted {}),
    };
    pb::Failure {
        kind: Some(kind),
        retryable: f.retryable(),
        causes: clip_causes(f.causes.clone()),
        attempts: f.attempts,
        elapsed: Some(duration(f.elapsed)),
        http_status: f.http_status.map(u32::from),
        provider: f.provider.clone(),
        model: f.model.clone(),
    }
}

/// The wire `Failure` back as the domain's; None when it names no class
/// this build knows.
pub fn failure_from_pb(f: &pb::Failure) -> Option<Failure> {
    use pb::failure::Kind;
    let mut retry_after = None;
    let class = match f.kind.as_ref()? {
        Kind::Transport(_) => FailureClass::Transport,
        Kind::Timeout(_) => FailureClass::Timeout,
        Kind::Unavailable(_) => FailureClass::Unavailable,
        Kind::RateLimited(r) => {
            retry_after = r.retry_after.and_then(|d| Duration::try_from(d).ok());
            FailureClass::RateLimited
        }
        Kind::QuotaExhausted(_) => FailureClass::QuotaExhausted,
        Kind::Unauthorized(_) => FailureClass::Unauthorized,
        Kind::UnknownModel(_) => FailureClass::UnknownModel,
        Kind::InvalidRequest(_) => FailureClass::InvalidRequest,
        Kind::MalformedResponse(_) => FailureClass::MalformedResponse,
        Kind::Cancelled(_) => FailureClass::Cancelled,
        Kind::BudgetExhausted(_) => FailureClass::BudgetExhausted,
    };
    Some(Failure {
        class,
        retry_after,
        causes: f.causes.clone(),
        attempts: f.attempts,
        elapsed: f
            .elapsed
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default(),
        http_status: f.http_status.and_then(|s| u16::try_from(s).ok()),
        provider: f.provider.clone(),
        model: f.model.clone(),
    })
}

pub fn segment_to_pb(s: Segment) -> pb::Segment {
    pb::Segment {
        id: s.id,
        session_id: s.session,
        ordinal: s.ordinal,
        state: state_to_pb(s.state).into(),
        first_seq: s.first_seq,
        last_seq: s.last_seq,
        entry_count: s.entry_count,
        summary: s.summary.map(summary_to_pb),
        attempts: s.attempts,
        passes: s.passes,
        last_failure: s.last_failure.as_ref().map(failure_to_pb),
        next_attempt_at: match s.state {
            SegmentState::Pending => s.next_attempt_at.map(timestamp),
            SegmentState::Open | SegmentState::Summarised | SegmentState::Parked => None,
        },
        closed_at: s.closed_at.map(timestamp),
    }
}

fn context_to_pb(c: Context) -> pb::GetContextResponse {
    pb::GetContextResponse {
        items: c
            .items
            .into_iter()
            .map(|item| pb::ContextItem {
                item: Some(match item {
                    ContextItem::Summary {
                        segment_id,
                        first_seq,
                        last_seq,
                        summary,
                    } => pb::context_item::Item::Summary(pb::ContextSummary {
                        segment_id,
                        first_seq,
                        last_seq,
                        summary: Some(summary_to_pb(summary)),
                    }),
                    ContextItem::Entry(e) => pb::context_item::Item::Entry(entry_to_pb(e)),
                }),
            })
            .collect(),
        truncated: c.truncated,
        estimated_tokens: c.tokens,
    }
}

fn backlog_to_pb(b: Backlog) -> pb::Backlog {
    pb::Backlog {
        open: b.open,
        pending: b.pending,
        summarised: b.summarised,
        parked: b.parked,
        oldest_pending_age: b.oldest_pending_age.map(duration),
        parked_by_class: b.parked_by_class.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("10Q"), None);
    }

    #[test]
    fn page_tokens_round_trip_and_reject_strangers() {
        assert_eq!(parse_page_token(&page_token(42)), Some(42));
        assert_eq!(parse_page_token(""), Some(0));
        assert_eq!(parse_page_token("42"), None);
        assert_eq!(parse_page_token("p1.-3"), None);
        assert_eq!(parse_page_token("p1.18446744073709551615"), None);
    }

    #[test]
    fn every_class_has_the_designed_code() {
        use FailureClass::*;
        let expect = [
            (Transport, Code::Unavailable),
            (Unavailable, Code::Unavailable),
            (MalformedResponse, Code::Unavailable),
            (Timeout, Code::DeadlineExceeded),
            (BudgetExhausted, Code::DeadlineExceeded),
            (RateLimited, Code::ResourceExhausted),
            (QuotaExhausted, Code::ResourceExhausted),
            (Unauthorized, Code::FailedPrecondition),
            (UnknownModel, Code::FailedPrecondition),
            (InvalidRequest, Code::FailedPrecondition),
            (Cancelled, Code::Cancelled),
        ];
        assert_eq!(expect.len(), FailureClass::ALL.len());
        for (class, code) in expect {
            assert_eq!(failure_code(class), code, "{class:?}");
        }
    }
}

//! The layers every call passes through before its handler, one concern
//! each (outermost first as `server.rs` stacks them):
//!
//! - `RecordCalls` counts every call, health and reflection included, by
//!   method and the status it really ended with: from the headers of a
//!   trailers-only answer, else from the trailers, else `Cancelled` when
//!   the caller went away before the end.
//! - `NameOversize` gives a request over the message limit the code gRPC
//!   defines for it (RESOURCE_EXHAUSTED with a reason) instead of tonic's
//!   OUT_OF_RANGE; it rewrites that status and no other.
//! - `ShedLoad` caps the archivist calls served at once: past the cap a
//!   call is refused at once (RESOURCE_EXHAUSTED, TOO_MANY_CALLS, with a
//!   RetryInfo) instead of waiting in a queue that would grow without bound.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::Semaphore;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::status::ERROR_DOMAIN;
use crate::metrics::Metrics;

const ARCHIVIST_PATH: &str = "/archivist.v1.Archivist/";

/// What tonic says when a request is over `max_decoding_message_size`.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// The metrics label for a request path: one of ours, or "other", so that
/// callers (even unauthenticated ones) cannot mint label values.
fn method_label(path: &str) -> &'static str {
    const METHODS: [&str; 11] = [
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
    ];
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
            Ok(response.map(|inner| RecordedBody { inner, pending }))
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
/// (or `Cancelled` if it is dropped before the end).
pub(crate) struct RecordedBody<B> {
    inner: B,
    pending: Option<Pending>,
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

// ---- NameOversize ---------------------------------------------------------

/// Rewrites tonic's OUT_OF_RANGE for a request over the message limit into
/// RESOURCE_EXHAUSTED with reason MESSAGE_TOO_LARGE.
#[derive(Clone)]
pub(crate) struct NameOversize {
    max_message_bytes: usize,
}

impl NameOversize {
    pub(crate) fn new(max_message_bytes: usize) -> NameOversize {
        NameOversize { max_message_bytes }
    }
}

impl<S> tower::Layer<S> for NameOversize {
    type Service = Oversize<S>;

    fn layer(&self, inner: S) -> Oversize<S> {
        Oversize {
            inner,
            limit: self.max_message_bytes,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Oversize<S> {
    inner: S,
    limit: usize,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Oversize<S>
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
            let mut response = call.await?;
            if ours && is_too_large(response.headers()) {
                let mut details = ErrorDetails::new();
                details.set_error_info(
                    "MESSAGE_TOO_LARGE",
                    ERROR_DOMAIN,
                    HashMap::from([("limit_bytes".to_owned(), limit.to_string())]),
                );
                response = Status::with_error_details(
                    Code::ResourceExhausted,
                    format!(
                        "the request message is larger than the server's limit of {limit} bytes"
                    ),
                    details,
                )
                .into_http::<ResBody>();
            }
            Ok(response)
        })
    }
}

/// Whether a trailers-only answer is tonic refusing an oversized request.
fn is_too_large(headers: &http::HeaderMap) -> bool {
    status_in(headers) == Some(Code::OutOfRange)
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            // grpc-message is percent-encoded.
            .map(|m| percent_encoding::percent_decode_str(m).decode_utf8_lossy())
            .is_some_and(|m| m.starts_with(TONIC_TOO_LARGE))
}

// ---- ShedLoad -------------------------------------------------------------

/// Caps the archivist calls served at once; health and reflection stay out
/// of the cap, so probes get through an overload.
#[derive(Clone)]
pub(crate) struct ShedLoad {
    permits: Arc<Semaphore>,
}

impl ShedLoad {
    pub(crate) fn new(max_concurrent_calls: usize) -> ShedLoad {
        ShedLoad {
            permits: Arc::new(Semaphore::new(max_concurrent_calls)),
        }
    }
}

impl<S> tower::Layer<S> for ShedLoad {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            permits: self.permits.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Shed<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Shed<S>
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
        if !request.uri().path().starts_with(ARCHIVIST_PATH) {
            return Box::pin(self.inner.call(request));
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
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
        Box::pin(async move {
            let response = call.await;
            drop(permit);
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_oversize_status_is_renamed() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", "11".parse().expect("header"));
        headers.insert(
            "grpc-message",
            "Error,%20decoded%20message%20length%20too%20large:%20found%205%20bytes"
                .parse()
                .expect("header"),
        );
        assert!(is_too_large(&headers));
        headers.insert(
            "grpc-message",
            "seq%20out%20of%20range".parse().expect("header"),
        );
        assert!(!is_too_large(&headers));
        headers.insert("grpc-status", "8".parse().expect("header"));
        assert!(!is_too_large(&headers));
    }

    #[test]
    fn labels_are_a_fixed_set() {
        assert_eq!(
            method_label("/archivist.v1.Archivist/GetContext"),
            "GetContext"
        );
        assert_eq!(method_label("/archivist.v1.Archivist/Nope"), "other");
        assert_eq!(method_label("/grpc.health.v1.Health/Check"), "health");
        assert_eq!(method_label("/x"), "other");
    }
}

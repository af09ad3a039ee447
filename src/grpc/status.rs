//! Every error as a gRPC status with the rich error model: the code, an
//! ErrorInfo (domain `archivist`, an UPPER_SNAKE reason, metadata),
//! BadRequest for bad input, RetryInfo where waiting helps, DebugInfo with
//! the cause chain. A failed recap is no call's error: it is the segment's
//! `last_failure`. The mappings are exhaustive: a new error must be given a
//! code.

use std::collections::HashMap;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::events::WatchRefused;
use crate::failure::{FailureClass, cause_chain};
use crate::provider::ProviderError;
use crate::service::ServiceError;
use crate::store::StoreError;
use crate::throttle::{LOG_INTERVAL, Throttle};
use crate::wire::clip_causes;

/// The ErrorInfo domain of every error this service returns.
pub(crate) const ERROR_DOMAIN: &str = "archivist";
/// Violations listed in one status; more would only bloat the trailer.
const MAX_VIOLATIONS: usize = 50;
/// How long a caller refused for a full disk is asked to wait.
const STORAGE_FULL_RETRY: Duration = Duration::from_secs(5);

/// How long a caller refused a watch for a full watch budget is asked to
/// wait: watches are long-lived, so places free slowly.
const WATCH_RETRY: Duration = Duration::from_secs(1);

static STORE_ERRORS: Throttle = Throttle::new(LOG_INTERVAL);
static STORAGE_FULL: Throttle = Throttle::new(LOG_INTERVAL);

/// The error a shared one stands for.
fn innermost(err: &StoreError) -> &StoreError {
    match err {
        StoreError::Shared(inner) => innermost(inner),
        other => other,
    }
}

pub(super) fn invalid(violations: Vec<FieldViolation>) -> Status {
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

/// A semantic search asked of a server with no embeddings configured.
pub(super) fn no_embeddings() -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info("EMBEDDINGS_OFF", ERROR_DOMAIN, HashMap::new());
    details.add_precondition_failure_violation(
        "CONFIG",
        "embedding",
        "semantic search needs `[embedding]` configured on the server; use SEARCH_MODE_LEXICAL or AUTO",
    );
    Status::with_error_details(
        Code::FailedPrecondition,
        "SEARCH_MODE_SEMANTIC needs embeddings, and `[embedding]` is not configured on this server",
        details,
    )
}

/// The code a failure class answers with (DESIGN.md's table).
fn class_code(class: FailureClass) -> Code {
    match class {
        FailureClass::Transport | FailureClass::Unavailable | FailureClass::MalformedResponse => {
            Code::Unavailable
        }
        FailureClass::Timeout | FailureClass::BudgetExhausted => Code::DeadlineExceeded,
        FailureClass::RateLimited | FailureClass::QuotaExhausted => Code::ResourceExhausted,
        FailureClass::Unauthorized | FailureClass::UnknownModel | FailureClass::InvalidRequest => {
            Code::FailedPrecondition
        }
        FailureClass::Store => Code::Unavailable,
    }
}

/// The longest wait a failed query embedding asks a client for.
const MAX_QUERY_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// A semantic search whose query could not be embedded: the class's code,
/// the class, status and provider in the ErrorInfo, the wait asked for.
fn query_embedding_status(e: &ProviderError) -> Status {
    let mut details = ErrorDetails::new();
    let mut metadata = HashMap::from([
        ("class".to_owned(), e.class.as_str().to_owned()),
        ("provider".to_owned(), e.provider.to_owned()),
        ("retryable".to_owned(), e.class.retryable().to_string()),
    ]);
    if let Some(status) = e.http_status {
        metadata.insert("http_status".to_owned(), status.to_string());
    }
    details.set_error_info("QUERY_EMBEDDING_FAILED", ERROR_DOMAIN, metadata);
    // An embedder's Retry-After is the embedder's to say, but a search is
    // not held off past a minute by it (AUTO answers by words meanwhile).
    if let Some(wait) = e.retry_after {
        details.set_retry_info(Some(wait.min(MAX_QUERY_RETRY_AFTER)));
    }
    details.set_debug_info(clip_causes(vec![e.detail.clone()]), "");
    Status::with_error_details(
        class_code(e.class),
        format!(
            "the query could not be embedded ({}): {}",
            e.class.as_str(),
            e.detail
        ),
        details,
    )
}

pub(super) fn service_status(err: ServiceError) -> Status {
    match err {
        ServiceError::Store(e) => store_status(&e),
        ServiceError::EmbeddingsOff => no_embeddings(),
        ServiceError::QueryEmbedding(e) => query_embedding_status(&e),
        ServiceError::WatchRefused(refused) => {
            let (scope, limit) = match refused {
                WatchRefused::Server { limit } => ("server", limit),
                WatchRefused::Tenant { limit } => ("tenant", limit),
            };
            let mut details = ErrorDetails::new();
            details.set_error_info(
                "TOO_MANY_WATCHES",
                ERROR_DOMAIN,
                HashMap::from([
                    ("scope".to_owned(), scope.to_owned()),
                    ("limit".to_owned(), limit.to_string()),
                ]),
            );
            details.set_retry_info(Some(WATCH_RETRY));
            Status::with_error_details(Code::ResourceExhausted, refused.to_string(), details)
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
        StoreError::CheckpointBusy => (Code::Unavailable, "ERASURE_PENDING", Vec::new()),
        StoreError::Full(_) => (Code::Unavailable, "STORAGE_FULL", Vec::new()),
        StoreError::Unreachable(_) | StoreError::Connect { .. } => {
            (Code::Unavailable, "STORAGE_UNAVAILABLE", Vec::new())
        }
        StoreError::Busy | StoreError::ReadsBusy | StoreError::IndexBehind => {
            (Code::ResourceExhausted, "OVERLOADED", Vec::new())
        }
        // Busy as the others are (retry after the RetryInfo delay), with the
        // budget that went on waiting, so a caller can tell it from
        // SEARCH_TOO_COSTLY's "change the query".
        StoreError::SearchBusy { budget } => (
            Code::ResourceExhausted,
            "OVERLOADED",
            vec![(
                "search_budget_ms".to_owned(),
                budget.as_millis().to_string(),
            )],
        ),
        StoreError::SearchTooCostly => (Code::ResourceExhausted, "SEARCH_TOO_COSTLY", Vec::new()),
        StoreError::TenantFull { limit, .. } => (
            Code::ResourceExhausted,
            "TENANT_STORAGE_FULL",
            vec![("limit_bytes".to_owned(), limit.to_string())],
        ),
        StoreError::ClientEntryIdReused {
            session,
            client_entry_id,
            index,
            seq,
        } => (
            Code::AlreadyExists,
            "CLIENT_ENTRY_ID_REUSED",
            vec![
                ("session_id".to_owned(), session.clone()),
                ("client_entry_id".to_owned(), client_entry_id.clone()),
                ("entry".to_owned(), format!("entries[{index}]")),
                ("seq".to_owned(), seq.to_string()),
            ],
        ),
        StoreError::SubjectMismatch {
            session, subject, ..
        } => (
            Code::FailedPrecondition,
            "SUBJECT_MISMATCH",
            vec![
                ("session_id".to_owned(), session.clone()),
                ("subject".to_owned(), subject.clone().unwrap_or_default()),
            ],
        ),
        StoreError::OccurredOutOfOrder { index, newest } => (
            Code::InvalidArgument,
            "OCCURRED_OUT_OF_ORDER",
            vec![
                ("entry".to_owned(), format!("entries[{index}]")),
                ("newest_occurred_at_ms".to_owned(), newest.0.to_string()),
            ],
        ),
        StoreError::Unstorable { index, .. } => (
            Code::InvalidArgument,
            "ENTRY_UNSTORABLE",
            vec![("entry".to_owned(), format!("entries[{index}]"))],
        ),
        StoreError::BudgetTooSmall { needed } => (
            Code::InvalidArgument,
            "CONTEXT_BUDGET_TOO_SMALL",
            vec![("min_max_tokens".to_owned(), needed.to_string())],
        ),
        StoreError::Open { .. }
        | StoreError::NoDatabase { .. }
        | StoreError::ServedElsewhere { .. }
        | StoreError::Serving { .. }
        | StoreError::NeedsMigration { .. }
        | StoreError::ReadOnly
        | StoreError::Detached
        | StoreError::DataDir { .. }
        | StoreError::Migration { .. }
        | StoreError::VectorsMissing { .. }
        | StoreError::TooNew { .. }
        | StoreError::Query(_)
        | StoreError::NotCommitted(_)
        | StoreError::Corrupt(_)
        | StoreError::Worker(_) => (Code::Internal, "STORE_ERROR", Vec::new()),
    };
    let causes = cause_chain(err);
    // A broken or full store fails every call; the log says so once per
    // interval, with how many more there were, not once per call.
    if code == Code::Internal
        && let Some(more) = STORE_ERRORS.hit()
    {
        tracing::error!(error = %causes.join(": "), more, "store error");
    }
    if let StoreError::Full(_) = innermost(err)
        && let Some(more) = STORAGE_FULL.hit()
    {
        tracing::warn!(
            error = %causes.join(": "),
            more,
            "the disk holding the database is full: calls that write are refused (UNAVAILABLE, STORAGE_FULL) until there is room"
        );
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(
        reason,
        ERROR_DOMAIN,
        metadata.into_iter().collect::<HashMap<_, _>>(),
    );
    match (code, innermost(err)) {
        (Code::NotFound, _) => {}
        (_, StoreError::ClientEntryIdReused { index, seq, .. }) => {
            details.add_bad_request_violation(
                format!("entries[{index}].client_entry_id"),
                format!(
                    "already names entry {seq} of this session, which has other content; use a new id for a new entry"
                ),
            );
        }
        (_, StoreError::SubjectMismatch { .. }) => {
            details.add_precondition_failure_violation(
                "SUBJECT",
                "subject",
                "a session's subject is fixed by the append that creates it; name the same subject, or none",
            );
        }
        (_, StoreError::OccurredOutOfOrder { index, .. }) => {
            let mut v = tonic_types::FieldViolation::new(
                format!("entries[{index}].occurred_at"),
                "before the session's newest entry (or the one before it in this call): a session's entries are in the order they were said",
            );
            v.reason = "OCCURRED_OUT_OF_ORDER".to_owned();
            details.set_bad_request(vec![v]);
        }
        (_, StoreError::Unstorable { index, reason }) => {
            details.add_bad_request_violation(format!("entries[{index}].content"), *reason);
        }
        (_, StoreError::BudgetTooSmall { needed }) => {
            details.add_bad_request_violation(
                "max_tokens",
                format!(
                    "too small for the session's newest entry; {needed} is the smallest budget that returns anything (0: the server's cap)"
                ),
            );
        }
        (_, StoreError::TenantFull { tenant, limit, .. }) => {
            details.add_quota_failure_violation(
                format!("tenant:{tenant}"),
                format!("stored content is capped at {limit} bytes (limits.max_tenant_bytes)"),
            );
        }
        // The same search would cost the same again: no retry advice.
        (_, StoreError::SearchTooCostly) => {}
        (Code::ResourceExhausted, _) => {
            details.set_retry_info(Some(Duration::from_millis(100)));
        }
        (_, StoreError::Full(_)) => {
            details.set_retry_info(Some(STORAGE_FULL_RETRY));
        }
        (_, StoreError::Unreachable(_) | StoreError::Connect { .. }) => {
            details.set_retry_info(Some(Duration::from_secs(1)));
            details.set_debug_info(clip_causes(causes), "");
        }
        _ => {
            details.set_debug_info(clip_causes(causes), "");
        }
    }
    Status::with_error_details(code, err.to_string(), details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_unavailable_with_a_reason_and_a_wait() {
        let full = StoreError::Full(Box::new(std::io::Error::other("SQLITE_FULL")));
        for err in [
            full,
            StoreError::Shared(std::sync::Arc::new(StoreError::Full(Box::new(
                std::io::Error::other("SQLITE_FULL"),
            )))),
        ] {
            let status = store_status(&err);
            assert_eq!(status.code(), Code::Unavailable);
            let details = status.get_error_details();
            assert_eq!(
                details.error_info().map(|i| i.reason.as_str()),
                Some("STORAGE_FULL")
            );
            assert_eq!(
                details.retry_info().and_then(|r| r.retry_delay),
                Some(STORAGE_FULL_RETRY)
            );
        }
    }
}

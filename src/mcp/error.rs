//! Every way a tool call can fail, as a tool error a model can act on: the
//! same fields in the text it reads and in the structured content a program
//! reads (where the failure came from, the gRPC code and reason, whether
//! and when to retry, every cause, a recap's typed `Failure`, and what to
//! do next). Nothing here ends the process: a bad argument, an archivist
//! server that went away or an answer that cannot be read each become one
//! failed call.

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;

use crate::client::{CallError, ConnectError, failure_detail};
use crate::failure::cause_chain;
use crate::pb;
use crate::text::human_duration;

/// Where a failure came from, which says what a retry can change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Origin {
    /// The tool's arguments were refused here; nothing was sent.
    Arguments,
    /// The tool is not offered by this MCP server (unknown, or `forget`
    /// without `--allow-forget`).
    Tool,
    /// The archivist server could not be reached, or did not answer.
    Connection,
    /// The archivist server answered with an error.
    Archivist,
}

/// One bad argument.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub(super) struct Violation {
    pub field: String,
    pub description: String,
}

/// A recap's failure as it travelled: `archivist.v1.Failure`.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub(super) struct FailureReport {
    /// The failure class: transport, timeout, unavailable, rate_limited,
    /// quota_exhausted, unauthorized, unknown_model, invalid_request,
    /// malformed_response, cancelled, budget_exhausted or store.
    pub kind: &'static str,
    pub retryable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<f64>,
    /// Outermost first.
    pub causes: Vec<String>,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u32>,
    pub provider: String,
    pub model: String,
    /// What most likely fixes it, for a person.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hint: String,
}

/// A failed tool call (boxed: it travels in every tool's `Result`).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ToolError(Box<Report>);

impl std::ops::Deref for ToolError {
    type Target = Report;
    fn deref(&self) -> &Report {
        &self.0
    }
}

/// A failed call's structured content. Every tool's output schema admits
/// it: clients validate a tool error's structured content too (the
/// TypeScript SDK does), and one that did not match would reach the model
/// as a protocol error, the Failure lost.
#[derive(Serialize, schemars::JsonSchema)]
pub(super) struct Failed {
    pub error: Report,
}

/// What a failed call's structured content holds under `error`.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub(super) struct Report {
    pub origin: Origin,
    /// The gRPC status code, UPPER_SNAKE (`NOT_FOUND`); for a failure of
    /// this MCP server's own, the code the archivist server would give.
    pub code: &'static str,
    /// ErrorInfo's UPPER_SNAKE reason, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub message: String,
    /// Whether the same call may succeed later without changing it.
    pub retryable: bool,
    /// How long to wait before retrying, when the server said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
    /// Every cause, outermost first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// The recap failure behind the error, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureReport>,
    /// What to do next, for the model reading it.
    pub what_to_do: String,
}

impl ToolError {
    /// Arguments refused before any call: every bad one named.
    pub(super) fn arguments(violations: Vec<Violation>) -> ToolError {
        let named: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
        ToolError(Box::new(Report {
            origin: Origin::Arguments,
            code: "INVALID_ARGUMENT",
            reason: Some("INVALID_ARGUMENTS".to_owned()),
            message: format!("bad arguments: {}", named.join(", ")),
            retryable: false,
            retry_after_seconds: None,
            metadata: BTreeMap::new(),
            violations,
            causes: Vec::new(),
            failure: None,
            what_to_do: "Nothing was sent to archivist. Fix the arguments named in violations (the tool's input schema says what each takes) and call again.".to_owned(),
        }))
    }

    /// A tool this server does not offer.
    pub(super) fn no_such_tool(name: &str, offered: &[&str]) -> ToolError {
        ToolError(Box::new(Report {
            origin: Origin::Tool,
            code: "UNIMPLEMENTED",
            reason: Some("UNKNOWN_TOOL".to_owned()),
            message: format!("no tool named {name:?}"),
            retryable: false,
            retry_after_seconds: None,
            metadata: BTreeMap::new(),
            violations: Vec::new(),
            causes: Vec::new(),
            failure: None,
            what_to_do: format!("Call one of: {}.", offered.join(", ")),
        }))
    }

    /// `forget` on a server started without `--allow-forget`.
    pub(super) fn forget_disabled(tool: &str) -> ToolError {
        ToolError(Box::new(Report {
            origin: Origin::Tool,
            code: "PERMISSION_DENIED",
            reason: Some("FORGET_DISABLED".to_owned()),
            message: format!(
                "{tool} is turned off: this MCP server was started without --allow-forget"
            ),
            retryable: false,
            retry_after_seconds: None,
            metadata: BTreeMap::new(),
            violations: Vec::new(),
            causes: Vec::new(),
            failure: None,
            what_to_do: "Nothing was erased. Erasing needs a person to start `archivist mcp` with --allow-forget; do not retry.".to_owned(),
        }))
    }

    /// No connection to the archivist server could be set up.
    pub(super) fn connect(err: &ConnectError) -> ToolError {
        // Reachability passes; a bad address, token or TLS file does not
        // (the command refuses those at start-up, so they are rare here).
        let retryable = matches!(
            err,
            ConnectError::Refused(..)
                | ConnectError::Connect(..)
                | ConnectError::ConnectTimeout(..)
        );
        let mut causes = cause_chain(err);
        // The outermost is the message.
        let message = match causes.is_empty() {
            true => err.to_string(),
            false => causes.remove(0),
        };
        ToolError(Box::new(Report {
            origin: Origin::Connection,
            code: "UNAVAILABLE",
            reason: Some("ARCHIVIST_UNREACHABLE".to_owned()),
            message,
            retryable,
            retry_after_seconds: None,
            metadata: BTreeMap::new(),
            violations: Vec::new(),
            causes,
            failure: None,
            what_to_do: match retryable {
                true => "The archivist server is not reachable now; nothing was done. Retry in a few seconds; if it persists, a person must start `archivist serve` or fix --server.".to_owned(),
                false => "This MCP server's connection settings are wrong; a person must fix them. Do not retry.".to_owned(),
            },
        }))
    }

    /// A call the archivist server failed (or that never reached it).
    /// `tool` decides what a retry risks; `timeout` is the call's deadline.
    pub(super) fn status(status: &tonic::Status, tool: &str, timeout: Duration) -> ToolError {
        let mut call = CallError::from_status(status);
        let failure = failure_detail(status).map(failure_report);
        // No ErrorInfo and no DebugInfo: the status came from the client's
        // own transport (a refused connection, a reset, the deadline), and
        // its source chain says why.
        let from_transport = call.reason.is_none() && call.causes.is_empty();
        // tonic's own call timeout ends the call as CANCELLED ("Timeout
        // expired"): it is this process's deadline, and the call may have
        // committed, so it is said as the deadline it is.
        if from_transport && call.code == tonic::Code::Cancelled {
            call.code = tonic::Code::DeadlineExceeded;
        }
        let causes = match (&failure, from_transport) {
            (Some(f), _) if !f.causes.is_empty() => f.causes.clone(),
            (_, true) => {
                let mut chain = cause_chain(status);
                // The status itself and its message are said already.
                if !status.message().is_empty() {
                    chain.retain(|c| !c.contains(status.message()));
                }
                chain
            }
            _ => call.causes.clone(),
        };
        let (origin, reason) = match (from_transport, call.code) {
            (true, tonic::Code::Unavailable) => {
                (Origin::Connection, Some("ARCHIVIST_UNREACHABLE".to_owned()))
            }
            (true, tonic::Code::DeadlineExceeded) => {
                (Origin::Connection, Some("NO_ANSWER_IN_TIME".to_owned()))
            }
            // A reset or closed connection mid-call ends as UNKNOWN
            // "transport error" with the transport's error as its source:
            // the call may or may not have reached the server.
            (true, tonic::Code::Unknown) => {
                (Origin::Connection, Some("CONNECTION_LOST".to_owned()))
            }
            _ => (Origin::Archivist, call.reason.clone()),
        };
        let retry_after = call.retry_after.or_else(|| {
            failure
                .as_ref()
                .and_then(|f| f.retry_after_seconds.map(Duration::from_secs_f64))
        });
        let retryable = match &failure {
            Some(f) => f.retryable,
            // Every way this process loses a call passes with the connection.
            None if origin == Origin::Connection => true,
            None => retryable_code(call.code, retry_after.is_some()),
        };
        let what_to_do = advice(&call, origin, retryable, retry_after, tool, timeout);
        ToolError(Box::new(Report {
            origin,
            code: code_name(call.code),
            reason,
            message: call.message.clone(),
            retryable,
            retry_after_seconds: retry_after.map(|d| d.as_secs_f64()),
            metadata: call.metadata.iter().cloned().collect(),
            violations: call
                .violations
                .iter()
                .map(|(field, description)| Violation {
                    field: field.clone(),
                    description: description.clone(),
                })
                .collect(),
            causes,
            failure,
            what_to_do,
        }))
    }

    /// The error as the text a model reads: the same facts as the
    /// structured content, a line each.
    pub(super) fn text(&self) -> String {
        let mut out = format!("Error ({}", self.code);
        if let Some(reason) = &self.reason {
            out.push_str(&format!(" {reason}"));
        }
        out.push_str(&format!("): {}", self.message));
        out.push_str(&format!(
            "\nfrom: {}",
            match self.origin {
                Origin::Arguments => "the arguments (nothing was sent to archivist)",
                Origin::Tool => "this MCP server (nothing was sent to archivist)",
                Origin::Connection => "the connection to the archivist server",
                Origin::Archivist => "the archivist server",
            }
        ));
        for v in &self.violations {
            out.push_str(&format!("\n  {}: {}", v.field, v.description));
        }
        for (k, v) in &self.metadata {
            out.push_str(&format!("\n  {k} = {v}"));
        }
        out.push_str(&format!(
            "\nretryable: {}",
            if self.retryable { "yes" } else { "no" }
        ));
        if let Some(wait) = self.retry_after_seconds {
            out.push_str(&format!(
                " (after {})",
                human_duration(Duration::from_secs_f64(wait))
            ));
        }
        if let Some(f) = &self.failure {
            out.push_str(&format!(
                "\nrecap failure: {} (retryable: {}), {} attempt(s), provider {} model {}",
                f.kind,
                if f.retryable { "yes" } else { "no" },
                f.attempts,
                f.provider,
                f.model
            ));
            if let Some(s) = f.http_status {
                out.push_str(&format!(", HTTP {s}"));
            }
            if !f.hint.is_empty() {
                out.push_str(&format!("\nfix: {}", f.hint));
            }
        }
        for cause in &self.causes {
            out.push_str(&format!("\ncaused by: {cause}"));
        }
        out.push_str(&format!("\nwhat to do: {}", self.what_to_do));
        out
    }

    /// The failed call's result: `isError`, the text, and the same as
    /// structured content under `error`.
    pub(super) fn into_result(self) -> CallToolResult {
        let text = self.text();
        let structured = serde_json::to_value(Failed { error: *self.0 }).unwrap_or_default();
        let mut result = CallToolResult::structured_error(structured);
        result.content = vec![ContentBlock::text(text)];
        result
    }
}

/// Whether a call failing with `code` may succeed unchanged later, as
/// docs/errors.md says: a wait, a lost connection and shed load pass; a
/// full tenant or a bad call does not.
fn retryable_code(code: tonic::Code, has_retry_info: bool) -> bool {
    use tonic::Code;
    match code {
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted => true,
        Code::ResourceExhausted => has_retry_info,
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => false,
    }
}

/// The canonical UPPER_SNAKE name of a gRPC code.
pub(super) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A wire `Failure` as the report carries it, whatever this build knows
/// of its domain type.
pub(super) fn failure_report(f: pb::Failure) -> FailureReport {
    use pb::failure::Kind;
    let (kind, retry_after) = match &f.kind {
        Some(Kind::Transport(_)) => ("transport", None),
        Some(Kind::Timeout(_)) => ("timeout", None),
        Some(Kind::Unavailable(_)) => ("unavailable", None),
        Some(Kind::RateLimited(r)) => ("rate_limited", r.retry_after),
        Some(Kind::QuotaExhausted(_)) => ("quota_exhausted", None),
        Some(Kind::Unauthorized(_)) => ("unauthorized", None),
        Some(Kind::UnknownModel(_)) => ("unknown_model", None),
        Some(Kind::InvalidRequest(_)) => ("invalid_request", None),
        Some(Kind::MalformedResponse(_)) => ("malformed_response", None),
        Some(Kind::Cancelled(_)) => ("cancelled", None),
        Some(Kind::BudgetExhausted(_)) => ("budget_exhausted", None),
        Some(Kind::Store(_)) => ("store", None),
        None => ("unknown", None),
    };
    FailureReport {
        kind,
        retryable: f.retryable,
        retry_after_seconds: retry_after
            .and_then(|d| Duration::try_from(d).ok())
            .map(|d| d.as_secs_f64()),
        causes: f.causes,
        attempts: f.attempts,
        elapsed_seconds: f
            .elapsed
            .and_then(|d| Duration::try_from(d).ok())
            .map(|d| d.as_secs_f64()),
        http_status: f.http_status,
        provider: f.provider,
        model: f.model,
        hint: f.hint,
    }
}

/// What the model should do about a failed call, in a sentence or two.
fn advice(
    call: &CallError,
    origin: Origin,
    retryable: bool,
    retry_after: Option<Duration>,
    tool: &str,
    timeout: Duration,
) -> String {
    use tonic::Code;
    let wait = retry_after
        .map(|d| format!("after {}", human_duration(d)))
        .unwrap_or_else(|| "in a few seconds".to_owned());
    // A `remember` that timed out may have committed: without ids a retry
    // stores the entries again (docs/errors.md, "Retrying a call").
    let append_risk = match tool {
        "remember" => {
            " If the entries carry no client_entry_id, the first call may have stored them: check with context before sending them again."
        }
        _ => "",
    };
    let reason = call.reason.as_deref();
    match (call.code, reason) {
        (_, Some("SESSION_NOT_FOUND")) => "No session with this id exists for this tenant (it was never written to, was forgotten, or belongs to someone else). Check the id with list_sessions; remember starts a new session.".to_owned(),
        (_, Some("CONTEXT_BUDGET_TOO_SMALL")) => match call.metadata.iter().find(|(k, _)| k == "min_max_tokens") {
            Some((_, min)) => format!("Call again with max_tokens of at least {min}."),
            None => "Call again with a larger max_tokens.".to_owned(),
        },
        (_, Some("CLIENT_ENTRY_ID_REUSED")) => "A client_entry_id of this call already names another entry of the session; nothing of the call was stored. Give new text a new id (the same id with the same text is a safe retry).".to_owned(),
        (_, Some("TENANT_STORAGE_FULL")) => "This tenant's storage is full; nothing was stored. Forget sessions no longer needed, or ask the operator for more room; retrying unchanged will not help.".to_owned(),
        (_, Some("SUBJECT_MISMATCH")) => match call.metadata.iter().find(|(k, _)| k == "subject") {
            Some((_, theirs)) if !theirs.is_empty() => format!("Nothing was stored: this session's subject is {theirs:?}. Name that subject (or none), or use another session for this one."),
            _ => "Nothing was stored: this session was created without a subject. Leave subject out, or use another session for this one.".to_owned(),
        },
        (Code::InvalidArgument, _) => "The archivist server refused the arguments named in violations; fix them and call again.".to_owned(),
        (Code::Unauthenticated, _) => "This MCP server's archivist token (ARCHIVIST_TOKEN or --token) is missing or unknown to the server; a person must fix it. Do not retry.".to_owned(),
        (Code::PermissionDenied, _) => "The tenant may not do this; do not retry.".to_owned(),
        (Code::DeadlineExceeded, _) if origin == Origin::Connection => format!(
            "No answer within {} (this MCP server's --timeout). Retry {wait}.{append_risk}",
            human_duration(timeout)
        ),
        (Code::FailedPrecondition, _) if call.failure.is_some() => "The recap provider behind archivist is misconfigured; a person must fix it (see fix). Retrying will not help until then.".to_owned(),
        _ if origin == Origin::Connection => format!(
            "The archivist server could not be reached or dropped the call. Retry {wait}; if it persists, a person must check that `archivist serve` runs at this MCP server's --server.{append_risk}"
        ),
        _ if retryable => format!("A passing condition; retry {wait}.{append_risk}"),
        _ => "Retrying the same call will get the same answer; change the call or tell the user.".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    #[test]
    fn a_missing_session_says_what_happened_and_what_to_do() {
        let details = ErrorDetails::with_error_info(
            "SESSION_NOT_FOUND",
            "archivist",
            [("session_id".to_owned(), "s1".to_owned())],
        );
        let status =
            tonic::Status::with_error_details(tonic::Code::NotFound, "no session \"s1\"", details);
        let err = ToolError::status(&status, "context", Duration::from_secs(30));
        assert_eq!(err.origin, Origin::Archivist);
        assert_eq!(
            (err.code, err.reason.as_deref()),
            ("NOT_FOUND", Some("SESSION_NOT_FOUND"))
        );
        assert!(!err.retryable);
        assert_eq!(
            err.metadata.get("session_id").map(String::as_str),
            Some("s1")
        );
        assert!(err.what_to_do.contains("list_sessions"));
        let text = err.text();
        assert!(
            text.starts_with("Error (NOT_FOUND SESSION_NOT_FOUND): no session \"s1\""),
            "{text}"
        );
        assert!(text.contains("retryable: no"), "{text}");
        let result = err.into_result();
        assert_eq!(result.is_error, Some(true));
        let structured = result.structured_content.expect("structured content");
        assert_eq!(structured["error"]["code"], "NOT_FOUND");
        assert_eq!(structured["error"]["origin"], "archivist");
    }

    #[test]
    fn shed_load_is_retryable_after_the_servers_delay() {
        let mut details = ErrorDetails::with_error_info("OVERLOADED", "archivist", []);
        details.set_retry_info(Some(Duration::from_millis(100)));
        let status =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "busy", details);
        let err = ToolError::status(&status, "remember", Duration::from_secs(30));
        assert!(err.retryable);
        assert_eq!(err.retry_after_seconds, Some(0.1));
        assert!(
            err.what_to_do.contains("after 100 ms"),
            "{}",
            err.what_to_do
        );
        assert!(
            err.what_to_do.contains("client_entry_id"),
            "{}",
            err.what_to_do
        );
    }

    #[test]
    fn a_status_from_the_clients_own_transport_is_the_connection() {
        let lost = tonic::Status::new(tonic::Code::Unavailable, "tcp connect error");
        let err = ToolError::status(&lost, "context", Duration::from_secs(30));
        assert_eq!(err.origin, Origin::Connection);
        assert_eq!(err.reason.as_deref(), Some("ARCHIVIST_UNREACHABLE"));
        assert!(err.retryable);
        assert!(
            err.what_to_do.contains("archivist serve"),
            "{}",
            err.what_to_do
        );
        // The deadline as a status says it, and as tonic's call timeout
        // really ends a call (CANCELLED).
        for code in [tonic::Code::DeadlineExceeded, tonic::Code::Cancelled] {
            let late = tonic::Status::new(code, "Timeout expired");
            let err = ToolError::status(&late, "remember", Duration::from_secs(30));
            assert_eq!(err.origin, Origin::Connection, "{code:?}");
            assert_eq!(err.reason.as_deref(), Some("NO_ANSWER_IN_TIME"), "{code:?}");
            assert!(err.retryable, "{code:?}");
            assert!(err.what_to_do.contains("within 30 s"), "{}", err.what_to_do);
            assert!(
                err.what_to_do.contains("client_entry_id"),
                "{}",
                err.what_to_do
            );
        }
        // A connection reset mid-call: tonic's UNKNOWN "transport error",
        // the reset as its source.
        let reset = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        assert_eq!(reset.code(), tonic::Code::Unknown);
        let err = ToolError::status(&reset, "remember", Duration::from_secs(30));
        assert_eq!(err.origin, Origin::Connection);
        assert_eq!(err.reason.as_deref(), Some("CONNECTION_LOST"));
        assert!(err.retryable);
        assert!(
            err.what_to_do.contains("client_entry_id"),
            "{}",
            err.what_to_do
        );
        assert!(err.text().contains("connection reset"), "{}", err.text());
    }

    #[test]
    fn a_full_tenant_is_not_retryable() {
        let details = ErrorDetails::with_error_info("TENANT_STORAGE_FULL", "archivist", []);
        let status =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "full", details);
        let err = ToolError::status(&status, "remember", Duration::from_secs(30));
        assert!(!err.retryable);
        assert!(err.what_to_do.contains("Forget"), "{}", err.what_to_do);
    }

    #[test]
    fn a_recap_failure_travels_whole() {
        let failure = pb::Failure {
            kind: Some(pb::failure::Kind::RateLimited(pb::failure::RateLimited {
                retry_after: Some(prost_types::Duration {
                    seconds: 7,
                    nanos: 0,
                }),
            })),
            retryable: true,
            causes: vec![
                "recap of segment 3 failed".to_owned(),
                "HTTP 429".to_owned(),
            ],
            attempts: 2,
            elapsed: None,
            http_status: Some(429),
            provider: "openai".to_owned(),
            model: "m".to_owned(),
            hint: "wait".to_owned(),
        };
        let report = failure_report(failure);
        assert_eq!(report.kind, "rate_limited");
        assert_eq!(report.retry_after_seconds, Some(7.0));
        assert_eq!(report.http_status, Some(429));
        assert_eq!(report.causes.len(), 2);
    }

    #[test]
    fn every_code_has_its_canonical_name() {
        assert_eq!(
            code_name(tonic::Code::DeadlineExceeded),
            "DEADLINE_EXCEEDED"
        );
        assert_eq!(code_name(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
        assert_eq!(
            code_name(tonic::Code::FailedPrecondition),
            "FAILED_PRECONDITION"
        );
    }
}

//! The failure taxonomy: the classes a recap pass can fail with, what each
//! one means for retrying, and the `Failure` record that travels to the
//! caller and is stored as a segment's `last_failure`.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// Why a recap failed, chosen by what can be done about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    Transport,
    Timeout,
    Unavailable,
    RateLimited,
    QuotaExhausted,
    Unauthorized,
    UnknownModel,
    InvalidRequest,
    MalformedResponse,
    Cancelled,
    BudgetExhausted,
}

/// What follows a failed pass for its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterPass {
    /// Stays PENDING and is due again on the reconciler's schedule.
    Reschedule,
    /// PARKED: retrying cannot help until someone changes something.
    Park,
    /// Stays PENDING, due at once; not counted as a failure.
    Release,
}

impl FailureClass {
    pub const ALL: [FailureClass; 11] = [
        FailureClass::Transport,
        FailureClass::Timeout,
        FailureClass::Unavailable,
        FailureClass::RateLimited,
        FailureClass::QuotaExhausted,
        FailureClass::Unauthorized,
        FailureClass::UnknownModel,
        FailureClass::InvalidRequest,
        FailureClass::MalformedResponse,
        FailureClass::Cancelled,
        FailureClass::BudgetExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Transport => "transport",
            FailureClass::Timeout => "timeout",
            FailureClass::Unavailable => "unavailable",
            FailureClass::RateLimited => "rate_limited",
            FailureClass::QuotaExhausted => "quota_exhausted",
            FailureClass::Unauthorized => "unauthorized",
            FailureClass::UnknownModel => "unknown_model",
            FailureClass::InvalidRequest => "invalid_request",
            FailureClass::MalformedResponse => "malformed_response",
            FailureClass::Cancelled => "cancelled",
            FailureClass::BudgetExhausted => "budget_exhausted",
        }
    }

    pub fn parse(name: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// May another send within the same pass succeed?
    pub fn retry_within_pass(self) -> bool {
        match self {
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::MalformedResponse
            | FailureClass::RateLimited => true,
            FailureClass::QuotaExhausted
            | FailureClass::Unauthorized
            | FailureClass::UnknownModel
            | FailureClass::InvalidRequest
            | FailureClass::Cancelled
            | FailureClass::BudgetExhausted => false,
        }
    }

    /// May a later pass succeed without anyone changing anything?
    pub fn retryable(self) -> bool {
        !matches!(self.after_pass(), AfterPass::Park)
    }

    pub fn after_pass(self) -> AfterPass {
        match self {
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::MalformedResponse
            | FailureClass::RateLimited
            | FailureClass::BudgetExhausted
            // Quota waits out a long delay while PENDING rather than parking:
            // a refill or a new billing period fixes it with nobody acting.
            | FailureClass::QuotaExhausted => AfterPass::Reschedule,
            FailureClass::Unauthorized
            | FailureClass::UnknownModel
            | FailureClass::InvalidRequest => AfterPass::Park,
            FailureClass::Cancelled => AfterPass::Release,
        }
    }

    /// The ErrorInfo reason for this class, UPPER_SNAKE.
    pub fn reason(self) -> String {
        self.as_str().to_ascii_uppercase()
    }
}

/// A failed recap, as the caller sees it and the store keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    /// The wait the provider asked for, for `rate_limited`.
    pub retry_after: Option<Duration>,
    /// Outermost first: the error's Display, then each `source()` to the root.
    pub causes: Vec<String>,
    /// Sends in the failing pass.
    pub attempts: u32,
    pub elapsed: Duration,
    pub http_status: Option<u16>,
    pub provider: String,
    pub model: String,
}

impl Failure {
    pub fn retryable(&self) -> bool {
        self.class.retryable()
    }
}

/// Every message in an error's chain, outermost first, each once.
pub fn cause_chain(err: &(dyn StdError + 'static)) -> Vec<String> {
    let mut causes = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        // Some errors repeat their source's text in their own Display; keep
        // the chain readable by not printing the same line twice in a row.
        if causes.last() != Some(&text) {
            causes.push(text);
        }
        next = e.source();
    }
    causes
}

/// What an HTTP error response (status, the provider's JSON error body)
/// says about retrying. Decided on the typed status and the body's
/// `code`/`type`, never on a flattened error string.
pub fn classify_http(status: u16, body: &str) -> FailureClass {
    let error = ErrorBody::parse(body);
    match status {
        401 | 403 => FailureClass::Unauthorized,
        402 => FailureClass::QuotaExhausted,
        404 => FailureClass::UnknownModel,
        408 | 504 => FailureClass::Timeout,
        429 if error.is_quota() => FailureClass::QuotaExhausted,
        429 => FailureClass::RateLimited,
        400 | 413 | 422 if error.is_unknown_model() => FailureClass::UnknownModel,
        400..=499 => FailureClass::InvalidRequest,
        500..=599 => FailureClass::Unavailable,
        // A 1xx or 3xx where a completion was due: nothing we can read.
        _ => FailureClass::MalformedResponse,
    }
}

/// The parts of a provider's error body that classify it. Providers differ:
/// OpenAI and llama.cpp nest `{"error": {"code", "type", "message"}}`, vLLM
/// puts them at the top level, Ollama sends `{"error": "text"}`.
#[derive(Debug, Default, PartialEq)]
pub struct ErrorBody {
    pub code: String,
    pub kind: String,
    pub message: String,
}

impl ErrorBody {
    pub fn parse(body: &str) -> ErrorBody {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
            return ErrorBody::default();
        };
        let text = |v: Option<&serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let fields = |o: &serde_json::Value| ErrorBody {
            code: text(o.get("code")),
            kind: text(o.get("type")),
            message: text(o.get("message")),
        };
        match value.get("error") {
            Some(inner @ serde_json::Value::Object(_)) => fields(inner),
            Some(serde_json::Value::String(message)) => ErrorBody {
                message: message.clone(),
                ..ErrorBody::default()
            },
            _ => fields(&value),
        }
    }

    fn markers(&self) -> [String; 3] {
        [
            self.code.to_ascii_lowercase(),
            self.kind.to_ascii_lowercase(),
            self.message.to_ascii_lowercase(),
        ]
    }

    /// Out of credit or over a spend limit: waiting seconds will not help.
    pub fn is_quota(&self) -> bool {
        const CODES: &[&str] = &[
            "insufficient_quota",
            "billing_hard_limit_reached",
            "billing_not_active",
            "quota_exceeded",
            "spend_limit_exceeded",
        ];
        let [code, kind, message] = self.markers();
        if !code.is_empty() || !kind.is_empty() {
            // A typed code says what it is; a plain rate limit may still
            // mention billing in its text.
            return CODES.contains(&code.as_str()) || CODES.contains(&kind.as_str());
        }
        message.contains("exceeded your current quota") || message.contains("insufficient_quota")
    }

    pub fn is_unknown_model(&self) -> bool {
        let [code, kind, message] = self.markers();
        code == "model_not_found"
            || kind == "model_not_found"
            || (message.contains("model")
                && (message.contains("not found") || message.contains("does not exist")))
    }
}

/// The longest wait a Retry-After is taken to ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// The wait a response asks for: `retry-after-ms` (milliseconds), else
/// `retry-after` as seconds or as an HTTP date.
pub fn parse_retry_after(
    retry_after_ms: Option<&str>,
    retry_after: Option<&str>,
    now: SystemTime,
) -> Option<Duration> {
    // The values are the provider's: anything absurd is capped, never a
    // panic.
    let seconds = |secs: f64| {
        (secs.is_finite() && secs >= 0.0).then(|| {
            Duration::try_from_secs_f64(secs)
                .unwrap_or(MAX_RETRY_AFTER)
                .min(MAX_RETRY_AFTER)
        })
    };
    if let Some(wait) = retry_after_ms
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let raw = retry_after?.trim();
    if let Ok(secs) = raw.parse::<f64>() {
        return seconds(secs);
    }
    let at = httpdate::parse_http_date(raw).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The marker that stands where a secret was.
pub const REDACTED: &str = "[REDACTED]";

/// Removes secrets from a text bound for a caller, a log or the store: the
/// given secrets (an API key) wherever they appear, bearer tokens, the
/// credentials of URLs, and key-like query parameters.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        // Very short "secrets" would blank out ordinary words.
        if secret.len() >= 6 {
            out = out.replace(secret, REDACTED);
        }
    }
    out = redact_after(&out, "Bearer ", |c| {
        !c.is_whitespace() && c != '"' && c != '\''
    });
    out = redact_url_credentials(&out);
    for param in [
        "key=",
        "api_key=",
        "api-key=",
        "apikey=",
        "token=",
        "access_token=",
    ] {
        out = redact_after(&out, param, |c| {
            !matches!(c, '&' | ' ' | ')' | '"' | '\'' | '#')
        });
    }
    out
}

/// Replaces the run of `keep` characters after each `marker` with REDACTED.
fn redact_after(text: &str, marker: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find_ignore_case(rest, marker) {
        let value_start = at + marker.len();
        out.push_str(&rest[..value_start]);
        let tail = &rest[value_start..];
        let len = tail.find(|c: char| !keep(c)).unwrap_or(tail.len());
        if len > 0 && !tail.starts_with(REDACTED) {
            out.push_str(REDACTED);
        } else {
            out.push_str(&tail[..len]);
        }
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    haystack.char_indices().map(|(i, _)| i).find(|&i| {
        haystack
            .get(i..i + needle.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(needle))
    })
}

/// `scheme://user:password@host` loses its `user:password`.
fn redact_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let host_start = at + 3;
        out.push_str(&rest[..host_start]);
        let tail = &rest[host_start..];
        let authority_end = tail
            .find(['/', '?', '#', ' ', ')', '"'])
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str(REDACTED);
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in FailureClass::ALL {
            assert_eq!(FailureClass::parse(c.as_str()), Some(c));
        }
    }

    #[test]
    fn terminal_classes_are_sent_once_and_park() {
        for c in [
            FailureClass::Unauthorized,
            FailureClass::UnknownModel,
            FailureClass::InvalidRequest,
        ] {
            assert!(!c.retry_within_pass());
            assert_eq!(c.after_pass(), AfterPass::Park);
            assert!(!c.retryable());
        }
        assert!(!FailureClass::QuotaExhausted.retry_within_pass());
        assert_eq!(
            FailureClass::QuotaExhausted.after_pass(),
            AfterPass::Reschedule
        );
    }

    #[test]
    fn http_statuses_and_bodies_classify() {
        use FailureClass::*;
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let rate = r#"{"error":{"message":"Rate limit reached for requests. Visit https://platform.openai.com/account/billing to raise it","type":"requests","code":"rate_limit_exceeded"}}"#;
        let model = r#"{"error":{"message":"The model `gpt-9` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#;
        let context = r#"{"error":{"message":"maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#;
        let ollama = r#"{"error":"model \"llama9\" not found, try pulling it first"}"#;
        let cases = [
            (401, "", Unauthorized),
            (403, "", Unauthorized),
            (404, model, UnknownModel),
            (404, ollama, UnknownModel),
            (400, ollama, UnknownModel),
            (429, quota, QuotaExhausted),
            (429, rate, RateLimited),
            (429, "", RateLimited),
            (400, context, InvalidRequest),
            (413, "", InvalidRequest),
            (422, "", InvalidRequest),
            (408, "", Timeout),
            (504, "", Timeout),
            (500, "", Unavailable),
            (502, "<html>bad gateway</html>", Unavailable),
            (503, "", Unavailable),
            (529, "", Unavailable),
            (402, "", QuotaExhausted),
        ];
        for (status, body, want) in cases {
            assert_eq!(classify_http(status, body), want, "{status} {body}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            parse_retry_after(None, Some("5"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse_retry_after(None, Some("1.5"), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(Some("250"), Some("5"), now),
            Some(Duration::from_millis(250))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(
            parse_retry_after(None, Some(&later), now),
            Some(Duration::from_secs(120))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(120));
        assert_eq!(
            parse_retry_after(None, Some(&past), now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(None, Some("soon"), now), None);
        assert_eq!(parse_retry_after(None, Some("-3"), now), None);
        assert_eq!(
            parse_retry_after(Some("1e30"), None, now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after(None, Some("99999999999999999999"), now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(parse_retry_after(None, None, now), None);
    }

    #[test]
    fn secrets_are_redacted() {
        let key = "sk-test-ABCDEF123456";
        let text = format!(
            "error sending request for url (https://user:pa55@api.example/v1/chat?key={key}&x=1): Authorization: Bearer {key} rejected"
        );
        let red = redact(&text, &[key]);
        assert!(!red.contains(key), "{red}");
        assert!(!red.contains("pa55"), "{red}");
        assert!(
            red.contains("https://[REDACTED]@api.example/v1/chat"),
            "{red}"
        );
        assert!(red.contains("x=1"), "{red}");
        assert_eq!(redact("plain words stay", &[key]), "plain words stay");
        assert_eq!(redact("bearer abc.def", &[]), "bearer [REDACTED]");
    }

    #[test]
    fn chain_walks_every_source() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("root cause"));
        assert_eq!(cause_chain(&e), vec!["outer", "root cause"]);
    }
}

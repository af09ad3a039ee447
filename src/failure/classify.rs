//! Classifying a provider's answer: an HTTP status with the provider's JSON
//! error body, and the wait a response asks for (Retry-After). Decided on
//! typed values, never on a flattened error string.

use std::time::{Duration, SystemTime};

use super::FailureClass;

/// What an HTTP error response (status, the provider's JSON error body)
/// says about retrying. Decided on the typed status and the body's
/// `code`/`type`, never on a flattened error string.
pub(crate) fn classify_http(status: u16, body: &str) -> FailureClass {
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
pub(crate) struct ErrorBody {
    pub(crate) code: String,
    pub(crate) kind: String,
    pub(crate) message: String,
}

impl ErrorBody {
    pub(crate) fn parse(body: &str) -> ErrorBody {
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
    pub(crate) fn is_quota(&self) -> bool {
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

    pub(crate) fn is_unknown_model(&self) -> bool {
        let [code, kind, message] = self.markers();
        code == "model_not_found"
            || kind == "model_not_found"
            || (message.contains("model")
                && (message.contains("not found") || message.contains("does not exist")))
    }
}

/// The longest wait a Retry-After is taken to ask for.
pub(crate) const MAX_RETRY_AFTER: Duration = super::LONGEST_WAIT;

/// The wait a response asks for: `retry-after-ms` (milliseconds), else
/// `retry-after` as seconds or as an HTTP date; in every form at most
/// MAX_RETRY_AFTER.
pub(crate) fn parse_retry_after(
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
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A date far ahead is capped like a number of seconds.
        assert_eq!(
            parse_retry_after(None, Some("Thu, 01 Jan 2099 00:00:00 GMT"), now),
            Some(MAX_RETRY_AFTER)
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
}

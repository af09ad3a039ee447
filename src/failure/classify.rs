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
        // A numeric code only repeats the HTTP status (vLLM, llama.cpp and
        // some gateways send one): it names no reason.
        let typed_code = !code.is_empty() && !code.bytes().all(|b| b.is_ascii_digit());
        if typed_code || !kind.is_empty() {
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

    /// Error bodies as providers send them, and the class each must get.
    #[test]
    fn real_error_bodies_from_each_provider_classify() {
        use FailureClass::*;
        let cases: &[(&str, u16, &str, FailureClass)] = &[
            // OpenAI.
            (
                "openai bad key",
                401,
                r#"{"error":{"message":"Incorrect API key provided: sk-abc***xyz. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
                Unauthorized,
            ),
            (
                "openai no such model",
                404,
                r#"{"error":{"message":"The model `gpt-5-turbo` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
                UnknownModel,
            ),
            (
                "openai rate limit",
                429,
                r#"{"error":{"message":"Rate limit reached for gpt-4 in organization org-xyz on tokens per min (TPM): Limit 10000, Used 9000, Requested 2000. Please try again in 6s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
                RateLimited,
            ),
            (
                "openai quota",
                429,
                r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
                QuotaExhausted,
            ),
            (
                "openai billing limit",
                429,
                r#"{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}"#,
                QuotaExhausted,
            ),
            (
                "openai context",
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                InvalidRequest,
            ),
            (
                "openai server error",
                500,
                r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
                Unavailable,
            ),
            (
                "openai overloaded",
                503,
                r#"{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}"#,
                Unavailable,
            ),
            // Azure OpenAI.
            (
                "azure bad key",
                401,
                r#"{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}"#,
                Unauthorized,
            ),
            (
                "azure no deployment",
                404,
                r#"{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."}}"#,
                UnknownModel,
            ),
            (
                "azure rate limit",
                429,
                r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 8 seconds."}}"#,
                RateLimited,
            ),
            (
                "azure content filter",
                400,
                r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}"#,
                InvalidRequest,
            ),
            // Anthropic-compatible gateways.
            (
                "anthropic overloaded",
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                Unavailable,
            ),
            (
                "anthropic rate limit",
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
                RateLimited,
            ),
            (
                "anthropic bad key",
                401,
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                Unauthorized,
            ),
            (
                "anthropic no model",
                404,
                r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#,
                UnknownModel,
            ),
            (
                "anthropic no credit",
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#,
                InvalidRequest,
            ),
            (
                "litellm throttled",
                429,
                r#"{"error":{"message":"litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached","type":"throttling_error","param":null,"code":"429"}}"#,
                RateLimited,
            ),
            // vLLM: a numeric code, at the top level.
            (
                "vllm no model",
                404,
                r#"{"object":"error","message":"The model `llama-9` does not exist.","type":"NotFoundError","param":null,"code":404}"#,
                UnknownModel,
            ),
            (
                "vllm context",
                400,
                r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}"#,
                InvalidRequest,
            ),
            (
                "vllm no model as 400",
                400,
                r#"{"object":"error","message":"The model `llama-9` does not exist.","type":"NotFoundError","param":null,"code":400}"#,
                UnknownModel,
            ),
            // llama.cpp server: a numeric code, nested.
            (
                "llama.cpp context",
                400,
                r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
                InvalidRequest,
            ),
            (
                "llama.cpp loading",
                503,
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
                Unavailable,
            ),
            (
                "llama.cpp bad key",
                401,
                r#"{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}"#,
                Unauthorized,
            ),
            // A gateway echoing the status as the code, with only the text
            // telling a quota from a rate limit.
            (
                "gateway quota, numeric code",
                429,
                r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details."}}"#,
                QuotaExhausted,
            ),
            (
                "gateway rate, numeric code",
                429,
                r#"{"error":{"code":429,"message":"Too many requests, slow down"}}"#,
                RateLimited,
            ),
            // Ollama: the error is a bare string.
            (
                "ollama no model",
                404,
                r#"{"error":"model "llama9" not found, try pulling it first"}"#,
                UnknownModel,
            ),
            (
                "ollama no model as 400",
                400,
                r#"{"error":"model 'llama9' not found"}"#,
                UnknownModel,
            ),
            (
                "ollama missing model",
                400,
                r#"{"error":"model is required"}"#,
                InvalidRequest,
            ),
            (
                "ollama runner died",
                500,
                r#"{"error":"llama runner process has terminated: signal: killed"}"#,
                Unavailable,
            ),
            (
                "ollama quota text only",
                429,
                r#"{"error":"insufficient_quota for this key"}"#,
                QuotaExhausted,
            ),
            // Each marker on its own: the code, the type, the text.
            (
                "model code only",
                400,
                r#"{"error":{"code":"model_not_found","message":"unavailable"}}"#,
                UnknownModel,
            ),
            (
                "model type only",
                422,
                r#"{"error":{"type":"model_not_found","message":"unavailable"}}"#,
                UnknownModel,
            ),
            (
                "model text, does not exist",
                413,
                r#"{"error":{"message":"Model x does not exist"}}"#,
                UnknownModel,
            ),
            (
                "not found, but no model",
                400,
                r#"{"error":{"message":"route not found"}}"#,
                InvalidRequest,
            ),
            (
                "a model, found",
                400,
                r#"{"error":{"message":"model found but busy"}}"#,
                InvalidRequest,
            ),
            (
                "quota code only",
                429,
                r#"{"error":{"code":"quota_exceeded","message":"slow down"}}"#,
                QuotaExhausted,
            ),
            (
                "quota type only",
                429,
                r#"{"error":{"type":"spend_limit_exceeded","message":"slow down"}}"#,
                QuotaExhausted,
            ),
            (
                "typed rate code, quota words",
                429,
                r#"{"error":{"code":"rate_limit_exceeded","message":"You exceeded your current quota of requests per minute"}}"#,
                RateLimited,
            ),
            (
                "typed rate type, quota words",
                429,
                r#"{"error":{"type":"requests","message":"insufficient_quota soon"}}"#,
                RateLimited,
            ),
            (
                "quota text only",
                429,
                r#"{"error":{"message":"You exceeded your current quota."}}"#,
                QuotaExhausted,
            ),
        ];
        for (name, status, body, want) in cases {
            assert_eq!(classify_http(*status, body), *want, "{name}");
        }
    }

    #[test]
    fn the_code_a_body_carries_is_read_whatever_its_type() {
        let text = ErrorBody::parse(r#"{"error":{"code":"rate_limit_exceeded","message":"m"}}"#);
        assert_eq!(text.code, "rate_limit_exceeded");
        let number = ErrorBody::parse(
            r#"{"object":"error","code":404,"type":"NotFoundError","message":"gone"}"#,
        );
        assert_eq!(
            number,
            ErrorBody {
                code: "404".to_owned(),
                kind: "NotFoundError".to_owned(),
                message: "gone".to_owned(),
            }
        );
        let nested = ErrorBody::parse(r#"{"error":{"code":503,"message":"Loading model"}}"#);
        assert_eq!(nested.code, "503");
        assert_eq!(ErrorBody::parse("<html>"), ErrorBody::default());
        assert_eq!(
            ErrorBody::parse(r#"{"error":{"code":null}}"#),
            ErrorBody::default()
        );
    }

    #[test]
    fn a_wait_is_capped_at_thirty_days_in_every_form() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cap = Duration::from_secs(30 * 24 * 3600);
        assert_eq!(MAX_RETRY_AFTER, cap);
        let secs = cap.as_secs();
        for (ms, s, want) in [
            (None, Some(secs.to_string()), cap),
            (
                None,
                Some((secs - 1).to_string()),
                cap - Duration::from_secs(1),
            ),
            (None, Some((secs + 1).to_string()), cap),
            (Some((secs * 1000).to_string()), None, cap),
            (
                Some((secs * 1000 - 1).to_string()),
                None,
                cap - Duration::from_millis(1),
            ),
            (Some((secs * 1000 + 1).to_string()), None, cap),
        ] {
            assert_eq!(
                parse_retry_after(ms.as_deref(), s.as_deref(), now),
                Some(want),
                "{ms:?} {s:?}"
            );
        }
        for (offset, want) in [
            (cap - Duration::from_secs(1), cap - Duration::from_secs(1)),
            (cap, cap),
            (cap + Duration::from_secs(1), cap),
            (cap * 1000, cap),
        ] {
            let date = httpdate::fmt_http_date(now + offset);
            assert_eq!(
                parse_retry_after(None, Some(&date), now),
                Some(want),
                "{date}"
            );
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

//! The HTTP plumbing every OpenAI-compatible call shares (chat completions
//! in `openai.rs`, embeddings in `embed.rs`): the client, built never to
//! retry; the key as a bearer token; the response body read up to a bound;
//! Retry-After; an error status classified where the typed answer is still
//! in hand; and every quoted text redacted. One attempt per call: the pass
//! in `retry.rs` is the only retry layer.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::{ProviderError, Symptom};
use crate::failure::{
    ErrorBody, FailureClass, cause_chain, classify_http, parse_retry_after, redact,
};
use crate::text::hex;

/// Longest stretch of an error body quoted in a cause.
const MAX_BODY_QUOTE: usize = 300;

/// Which call a request is, for the words of its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Call {
    Chat,
    Embeddings,
}

impl Call {
    /// The request's name in a message.
    fn noun(self) -> &'static str {
        match self {
            Call::Chat => "chat-completion",
            Call::Embeddings => "embeddings",
        }
    }

    /// What a successful answer is, in a message.
    fn answer(self) -> &'static str {
        match self {
            Call::Chat => "chat completion",
            Call::Embeddings => "list of embeddings",
        }
    }

    /// The configuration section whose `base_url` a missing route blames.
    fn section(self) -> &'static str {
        match self {
            Call::Chat => "provider",
            Call::Embeddings => "embedding",
        }
    }
}

/// One failed attempt, before it is classified. Display never repeats the
/// source's text, so a cause chain shows each message once.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("the {} request could not be sent", .0.noun())]
    Send(Call, #[source] reqwest::Error),
    #[error("reading the {} response failed", .0.noun())]
    Body(Call, #[source] reqwest::Error),
    #[error("the response body is larger than {bound} ({limit} bytes); the rest was not read")]
    TooLarge { limit: usize, bound: &'static str },
    #[error("the completion is longer than provider.max_output_tokens ({limit}) allows: {found}")]
    TooLong { limit: u32, found: String },
    #[error("the provider answered HTTP {status}: {detail}")]
    Status { status: u16, detail: String },
    /// Display carries the JSON error itself (no source): the root of
    /// the chain then says what came back, not only where parsing stopped.
    #[error("{}", decode_message(*.call, .content_type, .snippet, .json_error))]
    Decode {
        call: Call,
        content_type: String,
        snippet: String,
        json_error: serde_json::Error,
    },
    #[error("the provider returned an empty completion")]
    Empty,
    /// An embeddings answer that parsed but cannot be stored as it is.
    #[error("the embeddings answer is not usable: {0}")]
    Vectors(String),
}

/// A failed attempt with its class, decided where the typed cause was.
pub(super) struct Failed {
    pub(super) error: HttpError,
    pub(super) class: FailureClass,
    pub(super) status: Option<u16>,
    pub(super) retry_after: Option<Duration>,
    pub(super) symptom: Option<Symptom>,
}

impl Failed {
    /// A 2xx answer that is not what was asked for.
    pub(super) fn malformed(error: HttpError, status: u16, symptom: Option<Symptom>) -> Failed {
        Failed {
            error,
            class: FailureClass::MalformedResponse,
            status: Some(status),
            retry_after: None,
            symptom,
        }
    }
}

/// A 2xx answer, read whole within the bound.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) text: String,
    pub(super) content_type: String,
}

impl Answer {
    /// The body as JSON of type `T`, or a malformed_response quoting it
    /// (redacted).
    pub(super) fn json<T: serde::de::DeserializeOwned>(
        &self,
        call: Call,
        secrets: &[&str],
    ) -> Result<T, Failed> {
        serde_json::from_str(&self.text).map_err(|json_error| {
            Failed::malformed(
                HttpError::Decode {
                    call,
                    content_type: self.content_type.clone(),
                    snippet: quote(&redact(&self.text, secrets)),
                    json_error,
                },
                self.status,
                is_html(&self.content_type, &self.text).then_some(Symptom::HtmlPage),
            )
        })
    }
}

/// The client, the key and the body bound one provider's calls share.
pub(super) struct Http {
    client: reqwest::Client,
    api_key: Option<String>,
    max_response_bytes: usize,
    /// What names the bound in a message (`provider.max_response_bytes`).
    bound: &'static str,
}

/// Why a response body was not read whole.
enum BodyError {
    Read(reqwest::Error),
    TooLarge,
}

impl Http {
    /// `api_key` is the key's value, or None for servers that need none.
    pub(super) fn new(
        api_key: Option<String>,
        max_response_bytes: usize,
        bound: &'static str,
    ) -> Result<Http, reqwest::Error> {
        // reqwest is built without a bundled crypto provider; ring is ours.
        // Installing twice is harmless (the second call just says so).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // No retries below the pass, not even reqwest's protocol-level
            // ones: every send is counted and bounded by the pass.
            .retry(reqwest::retry::never())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("archivist/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Http {
            client,
            api_key: api_key.filter(|k| !k.is_empty()),
            max_response_bytes,
            bound,
        })
    }

    /// What must never appear in a cause, a log line or the store.
    pub(super) fn secrets(&self) -> Vec<&str> {
        self.api_key.iter().map(String::as_str).collect()
    }

    /// A hash of the key (or `no-key`), never the key.
    pub(super) fn key_identity(&self) -> String {
        use sha2::{Digest, Sha256};
        match &self.api_key {
            Some(key) => hex(&Sha256::digest(key.as_bytes())),
            None => "no-key".to_owned(),
        }
    }

    /// A failed attempt as the pass sees it, its cause chain redacted.
    pub(super) fn error(&self, provider: &'static str, f: Failed) -> ProviderError {
        ProviderError {
            provider,
            class: f.class,
            http_status: f.status,
            retry_after: f
                .retry_after
                .filter(|_| f.class == FailureClass::RateLimited),
            symptom: f.symptom,
            detail: redact(&cause_chain(&f.error).join(": "), &self.secrets()),
            source: Box::new(f.error),
        }
    }

    /// One POST of `body` as JSON to `endpoint`: the 2xx answer read
    /// whole, or the attempt's failure, classified.
    pub(super) async fn post<B: Serialize>(
        &self,
        call: Call,
        endpoint: &str,
        body: &B,
    ) -> Result<Answer, Failed> {
        let mut request = self.client.post(endpoint).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| Failed {
            class: if e.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Transport
            },
            error: HttpError::Send(call, e),
            status: None,
            retry_after: None,
            symptom: None,
        })?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = parse_retry_after(
            header("retry-after-ms").as_deref(),
            header("retry-after").as_deref(),
            SystemTime::now(),
        );
        let content_type = header("content-type").unwrap_or_else(|| "no content type".to_owned());
        let ok = (200..300).contains(&status);
        let text = match self.read_body(response).await {
            Ok(text) => text,
            Err(BodyError::Read(e)) => {
                return Err(Failed {
                    // The body was cut off mid-read: the connection failed,
                    // not the provider's judgement.
                    class: if e.is_timeout() {
                        FailureClass::Timeout
                    } else {
                        FailureClass::Transport
                    },
                    error: HttpError::Body(call, e),
                    status: Some(status),
                    retry_after: None,
                    symptom: None,
                });
            }
            // An answer too large to read is not an answer; an error status
            // still says what it says, without its body.
            Err(BodyError::TooLarge) if ok => {
                return Err(Failed::malformed(
                    HttpError::TooLarge {
                        limit: self.max_response_bytes,
                        bound: self.bound,
                    },
                    status,
                    None,
                ));
            }
            Err(BodyError::TooLarge) => format!(
                "(a body over {}, {} bytes, not read)",
                self.bound, self.max_response_bytes
            ),
        };
        if ok {
            return Ok(Answer {
                status,
                text,
                content_type,
            });
        }
        let class = classify_http(status, &text);
        let symptom = match class {
            FailureClass::UnknownModel
                if status == 404 && !ErrorBody::parse(&text).is_unknown_model() =>
            {
                Some(Symptom::NoRoute)
            }
            _ if is_html(&content_type, &text) => Some(Symptom::HtmlPage),
            _ => None,
        };
        Err(Failed {
            class,
            error: HttpError::Status {
                status,
                detail: error_detail(call, &text, &self.secrets(), symptom),
            },
            status: Some(status),
            retry_after,
            symptom,
        })
    }

    /// The response body as text, read up to `max_response_bytes` and no
    /// further.
    async fn read_body(&self, response: reqwest::Response) -> Result<String, BodyError> {
        use http_body_util::{BodyExt, LengthLimitError, Limited};
        let limit = self.max_response_bytes;
        // A declared length over the cap is refused before a byte is read.
        if response.content_length().is_some_and(|n| n > limit as u64) {
            return Err(BodyError::TooLarge);
        }
        let body = http::Response::<reqwest::Body>::from(response).into_body();
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(String::from_utf8_lossy(&collected.to_bytes()).into_owned()),
            Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge),
            Err(e) => match e.downcast::<reqwest::Error>() {
                Ok(e) => Err(BodyError::Read(*e)),
                // Limited only adds LengthLimitError to the body's own errors.
                Err(_) => Err(BodyError::TooLarge),
            },
        }
    }
}

/// Whether an answer is an HTML page (by its content type, or by its look
/// when the type is missing or wrong).
fn is_html(content_type: &str, body: &str) -> bool {
    let start = body
        .trim_start()
        .get(..15)
        .unwrap_or("")
        .to_ascii_lowercase();
    content_type.to_ascii_lowercase().contains("text/html")
        || start.starts_with("<!doctype html")
        || start.starts_with("<html")
}

/// What a body that is not the answer asked for was, for a person.
fn decode_message(
    call: Call,
    content_type: &str,
    snippet: &str,
    error: &serde_json::Error,
) -> String {
    let answer = call.answer();
    if is_html(content_type, snippet) {
        format!(
            "the provider answered with an HTML page ({content_type}) where a JSON {answer} was due: {snippet}"
        )
    } else if error.is_syntax() || error.is_eof() {
        format!("the provider's answer ({content_type}) is not JSON ({error}): {snippet}")
    } else {
        format!(
            "the provider's answer ({content_type}) is JSON but not a {answer} ({error}): {snippet}"
        )
    }
}

/// The provider's own message (and code) where the body has one, else a
/// quote of the body; for a 404 without a model named, what that means.
fn error_detail(call: Call, body: &str, secrets: &[&str], symptom: Option<Symptom>) -> String {
    let parsed = ErrorBody::parse(body);
    let text = match (parsed.message.is_empty(), parsed.code.is_empty()) {
        (true, _) => body.to_owned(),
        (false, true) => parsed.message,
        (false, false) => format!("{} ({})", parsed.message, parsed.code),
    };
    let quoted = quote(&redact(&text, secrets));
    match symptom {
        Some(Symptom::NoRoute) => format!(
            "no such route (the URL is not {} endpoint; is {}.base_url right?): {quoted}",
            match call {
                Call::Chat => "a chat-completions",
                Call::Embeddings => "an embeddings",
            },
            call.section()
        ),
        _ => quoted,
    }
}

fn quote(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let flat = flat.trim();
    if flat.is_empty() {
        return "(empty body)".to_owned();
    }
    if flat.chars().count() <= MAX_BODY_QUOTE {
        return flat.to_owned();
    }
    let cut: String = flat.chars().take(MAX_BODY_QUOTE).collect();
    format!("{cut}… [truncated]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_error(body: &str) -> serde_json::Error {
        serde_json::from_str::<Vec<u32>>(body).expect_err("not a list")
    }

    #[test]
    fn a_body_that_is_not_the_answer_is_described_by_what_it_is() {
        let page = "<!DOCTYPE html><html><body>502 Bad Gateway</body></html>";
        let text = decode_message(Call::Chat, "text/html", page, &json_error(page));
        assert!(
            text.starts_with("the provider answered with an HTML page"),
            "{text}"
        );
        assert!(text.contains("502 Bad Gateway"), "{text}");
        // No content type, but an HTML page all the same.
        assert!(is_html("no content type", "  <html><p>hi</p></html>"));

        let other = r#"{"object": "list", "data": []}"#;
        let text = decode_message(Call::Chat, "application/json", other, &json_error(other));
        assert!(text.contains("is JSON but not a chat completion"), "{text}");
        let text = decode_message(
            Call::Embeddings,
            "application/json",
            other,
            &json_error(other),
        );
        assert!(
            text.contains("is JSON but not a list of embeddings"),
            "{text}"
        );
        let cut = "[1, 2";
        let text = decode_message(Call::Chat, "application/json", cut, &json_error(cut));
        assert!(text.contains("is not JSON"), "{text}");
    }

    #[test]
    fn a_404_naming_no_model_says_the_route_is_missing() {
        let text = error_detail(
            Call::Chat,
            "404 page not found",
            &[],
            Some(Symptom::NoRoute),
        );
        assert!(text.contains("provider.base_url"), "{text}");
        assert!(text.contains("404 page not found"), "{text}");
        let text = error_detail(Call::Embeddings, "404", &[], Some(Symptom::NoRoute));
        assert!(text.contains("embedding.base_url"), "{text}");
    }
}

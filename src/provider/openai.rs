//! The OpenAI-compatible chat-completions client: one attempt, one POST to
//! `{base_url}/chat/completions`, classified where the typed error is still
//! in hand (status code, headers, the provider's error body, reqwest's
//! error kind). Works with OpenAI, vLLM, Ollama, llama.cpp server, LM Studio
//! and most gateways. The client never retries on its own: the pass in
//! `retry.rs` is the only retry layer.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::prompts::{self, Prompt};
use super::{ProviderError, Recap, RecapInput, Symptom};
use crate::config::ProviderConfig;
use crate::failure::{
    ErrorBody, FailureClass, cause_chain, classify_http, parse_retry_after, redact,
};
use crate::text::hex;

pub const NAME: &str = "openai";

/// Longest stretch of an error body quoted in a cause.
const MAX_BODY_QUOTE: usize = 300;

/// Most bytes of completion text one allowed output token may stand for. No
/// tokenizer's token of ordinary text comes near it (English averages about
/// 4 bytes, CJK about 3 to 6), so only a completion far past
/// `max_output_tokens` is refused.
pub const MAX_BYTES_PER_TOKEN: usize = 16;

pub struct OpenAi {
    client: reqwest::Client,
    /// `provider.base_url` with any credentials in it redacted: what logs
    /// and the database may show.
    base_url: String,
    endpoint: String,
    model: String,
    /// The name of the variable the key was read from.
    key_env: String,
    api_key: Option<String>,
    max_output_tokens: u32,
    max_response_bytes: usize,
}

/// One failed attempt, before it is classified. Display never repeats the
/// source's text, so a cause chain shows each message once.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    #[error("the chat-completion request could not be sent")]
    Send(#[source] reqwest::Error),
    #[error("reading the chat-completion response failed")]
    Body(#[source] reqwest::Error),
    #[error(
        "the response body is larger than provider.max_response_bytes ({limit} bytes); the rest was not read"
    )]
    TooLarge { limit: usize },
    #[error("the completion is longer than provider.max_output_tokens ({limit}) allows: {found}")]
    TooLong { limit: u32, found: String },
    #[error("the provider answered HTTP {status}: {detail}")]
    Status { status: u16, detail: String },
    /// Display carries the JSON error itself (no source): the root of
    /// the chain then says what came back, not only where parsing stopped.
    #[error("{}", decode_message(.content_type, .snippet, .json_error))]
    Decode {
        content_type: String,
        snippet: String,
        json_error: serde_json::Error,
    },
    #[error("the provider returned an empty completion")]
    Empty,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [Message<'a>; 2],
    max_tokens: u32,
    temperature: f32,
    stream: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Deserialize)]
struct ChatResponse {
    #[serde(default)]
    model: Option<String>,
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
}

impl OpenAi {
    /// `api_key` is the key's value (read by the caller from the variable
    /// the configuration names), or None for servers that need none.
    pub fn new(config: &ProviderConfig, api_key: Option<String>) -> Result<OpenAi, reqwest::Error> {
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
        let base_url = config.base_url.trim_end_matches('/');
        Ok(OpenAi {
            client,
            base_url: redact(base_url, &[]),
            endpoint: format!("{base_url}/chat/completions"),
            model: config.model.clone(),
            key_env: config.api_key_env.clone(),
            api_key: api_key.filter(|k| !k.is_empty()),
            max_output_tokens: config.max_output_tokens,
            max_response_bytes: usize::try_from(config.max_response_bytes).unwrap_or(usize::MAX),
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The base URL, credentials redacted.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The name of the variable the key is read from.
    pub fn key_env(&self) -> &str {
        &self.key_env
    }

    /// A hash of kind, endpoint, model and key: equal for equal
    /// configurations, and showing nothing of the key.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let key_identity = match &self.api_key {
            Some(key) => hex(&Sha256::digest(key.as_bytes())),
            None => "no-key".to_owned(),
        };
        let digest = Sha256::digest(
            format!("{NAME}\n{}\n{}\n{key_identity}", self.endpoint, self.model).as_bytes(),
        );
        format!("{NAME}:{}", &hex(&digest)[..16])
    }

    /// What must never appear in a cause, a log line or the store.
    pub fn secrets(&self) -> Vec<&str> {
        self.api_key.iter().map(String::as_str).collect()
    }

    /// The system prompts' share of the input budget, in estimated tokens,
    /// with room for the request's JSON framing.
    pub fn prompt_tokens(&self) -> u32 {
        prompts::overhead_tokens() + 32
    }

    /// One attempt, asking for at most `max_output_tokens`. The caller
    /// bounds it in time.
    pub async fn summarise(
        &self,
        input: &RecapInput<'_>,
        max_output_tokens: u32,
    ) -> Result<Recap, ProviderError> {
        let (prompt, user) = prompts::request(input);
        self.send(prompt, &user, max_output_tokens)
            .await
            .map_err(|f| ProviderError {
                provider: NAME,
                class: f.class,
                http_status: f.status,
                retry_after: f
                    .retry_after
                    .filter(|_| f.class == FailureClass::RateLimited),
                symptom: f.symptom,
                detail: redact(&cause_chain(&f.error).join(": "), &self.secrets()),
                source: Box::new(f.error),
            })
    }

    async fn send(&self, prompt: Prompt, user: &str, max_tokens: u32) -> Result<Recap, Failed> {
        let body = ChatRequest {
            model: &self.model,
            messages: [
                Message {
                    role: "system",
                    content: prompt.system,
                },
                Message {
                    role: "user",
                    content: user,
                },
            ],
            max_tokens,
            temperature: 0.2,
            stream: false,
        };
        let mut request = self.client.post(&self.endpoint).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| Failed {
            class: if e.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Transport
            },
            error: OpenAiError::Send(e),
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
                    error: OpenAiError::Body(e),
                    status: Some(status),
                    retry_after: None,
                    symptom: None,
                });
            }
            // An answer too large to read is not a completion; an error
            // status still says what it says, without its body.
            Err(BodyError::TooLarge) if ok => {
                return Err(Failed {
                    class: FailureClass::MalformedResponse,
                    error: OpenAiError::TooLarge {
                        limit: self.max_response_bytes,
                    },
                    status: Some(status),
                    retry_after: None,
                    symptom: None,
                });
            }
            Err(BodyError::TooLarge) => format!(
                "(a body over provider.max_response_bytes, {} bytes, not read)",
                self.max_response_bytes
            ),
        };
        let html = is_html(&content_type, &text);
        if !ok {
            let class = classify_http(status, &text);
            let symptom = match class {
                FailureClass::UnknownModel
                    if status == 404 && !ErrorBody::parse(&text).is_unknown_model() =>
                {
                    Some(Symptom::NoRoute)
                }
                _ if html => Some(Symptom::HtmlPage),
                _ => None,
            };
            return Err(Failed {
                class,
                error: OpenAiError::Status {
                    status,
                    detail: error_detail(&text, &self.secrets(), symptom),
                },
                status: Some(status),
                retry_after,
                symptom,
            });
        }
        let malformed = |error, symptom| Failed {
            class: FailureClass::MalformedResponse,
            error,
            status: Some(status),
            retry_after: None,
            symptom,
        };
        let parsed: ChatResponse = serde_json::from_str(&text).map_err(|json_error| {
            malformed(
                OpenAiError::Decode {
                    content_type,
                    snippet: quote(&redact(&text, &self.secrets())),
                    json_error,
                },
                html.then_some(Symptom::HtmlPage),
            )
        })?;
        let content = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| malformed(OpenAiError::Empty, None))?;
        let reported = parsed.usage.as_ref().map(|u| u.completion_tokens);
        if let Some(found) = self.over_output_limit(&content, reported) {
            return Err(malformed(
                OpenAiError::TooLong {
                    limit: self.max_output_tokens,
                    found,
                },
                None,
            ));
        }
        let usage = parsed.usage.unwrap_or(Usage {
            prompt_tokens: crate::model::estimate_tokens(user),
            completion_tokens: crate::model::estimate_tokens(&content),
        });
        Ok(Recap {
            text: content,
            model: parsed.model.unwrap_or_else(|| self.model.clone()),
            prompt_version: prompt.version.to_owned(),
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
        })
    }
}

impl OpenAi {
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

    /// How a completion passes what `max_output_tokens` allows, if it does:
    /// by the provider's own count (when it gives one), or by more than
    /// MAX_BYTES_PER_TOKEN bytes of text per allowed token.
    fn over_output_limit(&self, content: &str, reported_tokens: Option<u32>) -> Option<String> {
        let max_bytes = (self.max_output_tokens as usize).saturating_mul(MAX_BYTES_PER_TOKEN);
        if content.len() > max_bytes {
            return Some(format!(
                "{} bytes of text, over {max_bytes} ({MAX_BYTES_PER_TOKEN} a token)",
                content.len()
            ));
        }
        reported_tokens
            .filter(|&n| n > self.max_output_tokens)
            .map(|n| format!("{n} tokens by the provider's count"))
    }
}

/// Why a response body was not read whole.
enum BodyError {
    Read(reqwest::Error),
    TooLarge,
}

/// A failed attempt with its class, decided where the typed cause was.
struct Failed {
    error: OpenAiError,
    class: FailureClass,
    status: Option<u16>,
    retry_after: Option<Duration>,
    symptom: Option<Symptom>,
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

/// What a body that is not a chat completion was, for a person.
fn decode_message(content_type: &str, snippet: &str, error: &serde_json::Error) -> String {
    if is_html(content_type, snippet) {
        format!(
            "the provider answered with an HTML page ({content_type}) where a JSON chat completion was due: {snippet}"
        )
    } else if error.is_syntax() || error.is_eof() {
        format!("the provider's answer ({content_type}) is not JSON ({error}): {snippet}")
    } else {
        format!(
            "the provider's answer ({content_type}) is JSON but not a chat completion ({error}): {snippet}"
        )
    }
}

/// The provider's own message (and code) where the body has one, else a
/// quote of the body; for a 404 without a model named, what that means.
fn error_detail(body: &str, secrets: &[&str], symptom: Option<Symptom>) -> String {
    let parsed = ErrorBody::parse(body);
    let text = match (parsed.message.is_empty(), parsed.code.is_empty()) {
        (true, _) => body.to_owned(),
        (false, true) => parsed.message,
        (false, false) => format!("{} ({})", parsed.message, parsed.code),
    };
    let quoted = quote(&redact(&text, secrets));
    match symptom {
        Some(Symptom::NoRoute) => format!(
            "no such route (the URL is not a chat-completions endpoint; is provider.base_url right?): {quoted}"
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
        serde_json::from_str::<ChatResponse>(body)
            .err()
            .expect("not a completion")
    }

    #[test]
    fn a_body_that_is_not_a_completion_is_described_by_what_it_is() {
        let page = "<!DOCTYPE html><html><body>502 Bad Gateway</body></html>";
        let text = decode_message("text/html", page, &json_error(page));
        assert!(
            text.starts_with("the provider answered with an HTML page"),
            "{text}"
        );
        assert!(text.contains("502 Bad Gateway"), "{text}");
        // No content type, but an HTML page all the same.
        assert!(is_html("no content type", "  <html><p>hi</p></html>"));

        let other = r#"{"object": "list", "data": []}"#;
        let text = decode_message("application/json", other, &json_error(other));
        assert!(text.contains("is JSON but not a chat completion"), "{text}");
        let cut = "{\"choices\": [";
        let text = decode_message("application/json", cut, &json_error(cut));
        assert!(text.contains("is not JSON"), "{text}");
    }

    #[test]
    fn a_404_naming_no_model_says_the_route_is_missing() {
        let text = error_detail("404 page not found", &[], Some(Symptom::NoRoute));
        assert!(text.contains("provider.base_url"), "{text}");
        assert!(text.contains("404 page not found"), "{text}");
    }

    fn client(max_output_tokens: u32) -> OpenAi {
        let config = ProviderConfig {
            max_output_tokens,
            ..ProviderConfig::default()
        };
        OpenAi::new(&config, None).expect("client")
    }

    #[test]
    fn a_completion_is_held_to_max_output_tokens() {
        let p = client(512);
        // No usage reported: only the text's length counts, generously.
        assert_eq!(p.over_output_limit(&"a".repeat(3000), None), None);
        assert_eq!(p.over_output_limit(&"a".repeat(512 * 16), None), None);
        let found = p.over_output_limit(&"a".repeat(512 * 16 + 1), None);
        assert!(found.is_some_and(|f| f.contains("bytes")));
        // The provider's own count, when it gives one.
        assert_eq!(p.over_output_limit("short", Some(512)), None);
        let found = p.over_output_limit("short", Some(513));
        assert!(found.is_some_and(|f| f.contains("513 tokens")));
    }
}

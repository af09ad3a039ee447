//! The OpenAI-compatible chat-completions client: one attempt, one POST to
//! `{base_url}/chat/completions`, classified where the typed error is still
//! in hand (status code, headers, the provider's error body, reqwest's
//! error kind). Works with OpenAI, vLLM, Ollama, llama.cpp server, LM Studio
//! and most gateways. The client never retries on its own: the pass in
//! `retry.rs` is the only retry layer.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::prompts::{self, Prompt};
use super::{ProviderError, Recap, RecapInput};
use crate::config::ProviderConfig;
use crate::failure::{
    ErrorBody, FailureClass, cause_chain, classify_http, parse_retry_after, redact,
};
use crate::text::hex;

pub const NAME: &str = "openai";

/// Longest stretch of an error body quoted in a cause.
const MAX_BODY_QUOTE: usize = 300;

pub struct OpenAi {
    client: reqwest::Client,
    endpoint: String,
    model: String,
    api_key: Option<String>,
    max_output_tokens: u32,
}

/// One failed attempt, before it is classified. Display never repeats the
/// source's text, so a cause chain shows each message once.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiError {
    #[error("the chat-completion request could not be sent")]
    Send(#[source] reqwest::Error),
    #[error("reading the chat-completion response failed")]
    Body(#[source] reqwest::Error),
    #[error("the provider answered HTTP {status}: {detail}")]
    Status { status: u16, detail: String },
    #[error("the response is not a chat completion ({content_type}): {snippet}")]
    Decode {
        content_type: String,
        snippet: String,
        #[source]
        source: serde_json::Error,
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
        Ok(OpenAi {
            client,
            endpoint: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
            model: config.model.clone(),
            api_key: api_key.filter(|k| !k.is_empty()),
            max_output_tokens: config.max_output_tokens,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
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

    /// One attempt. The caller bounds it in time.
    pub async fn summarise(&self, input: &RecapInput<'_>) -> Result<Recap, ProviderError> {
        let (prompt, user) = prompts::request(input);
        self.send(prompt, &user).await.map_err(|f| ProviderError {
            provider: NAME,
            class: f.class,
            http_status: f.status,
            retry_after: f
                .retry_after
                .filter(|_| f.class == FailureClass::RateLimited),
            detail: redact(&cause_chain(&f.error).join(": "), &self.secrets()),
            source: Box::new(f.error),
        })
    }

    async fn send(&self, prompt: Prompt, user: &str) -> Result<Recap, Failed> {
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
            max_tokens: self.max_output_tokens,
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
        let text = response.text().await.map_err(|e| Failed {
            // The body was cut off mid-read: the connection failed, not the
            // provider's judgement.
            class: if e.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Transport
            },
            error: OpenAiError::Body(e),
            status: Some(status),
            retry_after: None,
        })?;
        if !(200..300).contains(&status) {
            return Err(Failed {
                class: classify_http(status, &text),
                error: OpenAiError::Status {
                    status,
                    detail: error_detail(&text, &self.secrets()),
                },
                status: Some(status),
                retry_after,
            });
        }
        let malformed = |error| Failed {
            class: FailureClass::MalformedResponse,
            error,
            status: Some(status),
            retry_after: None,
        };
        let parsed: ChatResponse = serde_json::from_str(&text).map_err(|source| {
            malformed(OpenAiError::Decode {
                content_type,
                snippet: quote(&redact(&text, &self.secrets())),
                source,
            })
        })?;
        let content = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| malformed(OpenAiError::Empty))?;
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

/// A failed attempt with its class, decided where the typed cause was.
struct Failed {
    error: OpenAiError,
    class: FailureClass,
    status: Option<u16>,
    retry_after: Option<Duration>,
}

/// The provider's own message (and code) where the body has one, else a
/// quote of the body.
fn error_detail(body: &str, secrets: &[&str]) -> String {
    let parsed = ErrorBody::parse(body);
    let text = match (parsed.message.is_empty(), parsed.code.is_empty()) {
        (true, _) => body.to_owned(),
        (false, true) => parsed.message,
        (false, false) => format!("{} ({})", parsed.message, parsed.code),
    };
    quote(&redact(&text, secrets))
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

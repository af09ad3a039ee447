//! The OpenAI-compatible chat-completions client: one attempt, one POST to
//! `{base_url}/chat/completions` through the shared plumbing of `http.rs`
//! (bounded body, Retry-After, classification where the typed error is
//! still in hand). Works with OpenAI, vLLM, Ollama, llama.cpp server, LM Studio
//! and most gateways. The client never retries on its own: the pass in
//! `retry.rs` is the only retry layer.

use serde::{Deserialize, Serialize};

use super::http::{Call, Failed, Http, HttpError};
use super::prompts::{self, Prompt};
use super::{ProviderError, Recap, RecapInput};
use crate::config::ProviderConfig;
use crate::failure::redact;
use crate::text::hex;

pub const NAME: &str = "openai";

/// Most bytes of completion text one allowed output token may stand for. No
/// tokenizer's token of ordinary text comes near it (English averages about
/// 4 bytes, CJK about 3 to 6), so only a completion far past
/// `max_output_tokens` is refused.
pub const MAX_BYTES_PER_TOKEN: usize = 16;

pub struct OpenAi {
    http: Http,
    /// `provider.base_url` with any credentials in it redacted: what logs
    /// and the database may show.
    base_url: String,
    endpoint: String,
    model: String,
    /// The name of the variable the key was read from.
    key_env: String,
    max_output_tokens: u32,
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
        let max_response_bytes = usize::try_from(config.max_response_bytes).unwrap_or(usize::MAX);
        let http = Http::new(api_key, max_response_bytes, "provider.max_response_bytes")?;
        let base_url = config.base_url.trim_end_matches('/');
        Ok(OpenAi {
            http,
            base_url: redact(base_url, &[]),
            endpoint: format!("{base_url}/chat/completions"),
            model: config.model.clone(),
            key_env: config.api_key_env.clone(),
            max_output_tokens: config.max_output_tokens,
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
        let key_identity = self.http.key_identity();
        let digest = Sha256::digest(
            format!("{NAME}\n{}\n{}\n{key_identity}", self.endpoint, self.model).as_bytes(),
        );
        format!("{NAME}:{}", &hex(&digest)[..16])
    }

    /// What must never appear in a cause, a log line or the store.
    pub fn secrets(&self) -> Vec<&str> {
        self.http.secrets()
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
            .map_err(|f| self.http.error(NAME, f))
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
        let answer = self.http.post(Call::Chat, &self.endpoint, &body).await?;
        let status = answer.status;
        let parsed: ChatResponse = answer.json(Call::Chat, &self.secrets())?;
        let malformed = |error| Failed::malformed(error, status, None);
        let content = parsed
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| malformed(HttpError::Empty))?;
        let reported = parsed.usage.as_ref().map(|u| u.completion_tokens);
        if let Some(found) = self.over_output_limit(&content, reported) {
            return Err(malformed(HttpError::TooLong {
                limit: self.max_output_tokens,
                found,
            }));
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

#[cfg(test)]
mod tests {
    use super::*;

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

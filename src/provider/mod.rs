//! Summarisers: one attempt each, segment entries (or partial recaps to
//! fold) in, a recap (text and usage) out, or one typed error. The retry
//! policy lives in `retry.rs`, never here.

pub mod embed;
pub mod extractive;
mod http;
pub mod openai;
mod prompts;

use std::time::Duration;

use crate::config::{ProviderConfig, ProviderKind};
use crate::failure::FailureClass;
use crate::model::{Entry, Millis, ProviderIdentity, Role, estimate_tokens};

pub use extractive::Extractive;
pub use openai::OpenAi;
pub(crate) use prompts::label_tokens;

/// What one attempt summarises.
#[derive(Clone, Copy, Debug)]
pub enum RecapInput<'a> {
    /// A segment's entries, or a run of them, with the summary of what came
    /// before as context not to be retold.
    Entries {
        entries: &'a [Entry],
        carry: Option<&'a str>,
    },
    /// Recaps of consecutive parts of one segment, to fold into one.
    Parts(&'a [String]),
    /// A roll-up's children's summaries, oldest first.
    Children(&'a [String]),
}

/// A successful recap, before it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recap {
    pub text: String,
    pub model: String,
    pub prompt_version: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// What, beyond its class, an attempt's failure says about the setup:
/// decided where the typed answer was in hand, for the fix a person is
/// told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symptom {
    /// An HTTP 404 that names no model: the URL has no chat-completions
    /// route, so `base_url` is wrong (often a missing `/v1`).
    NoRoute,
    /// An HTML page where JSON was due: `base_url` points at a website, a
    /// proxy's page or a login wall rather than the API.
    HtmlPage,
}

/// One failed attempt, classified where the typed cause was still in hand.
#[derive(Debug, thiserror::Error)]
#[error("{provider} attempt failed ({})", class.as_str())]
pub struct ProviderError {
    pub provider: &'static str,
    pub class: FailureClass,
    pub http_status: Option<u16>,
    pub retry_after: Option<Duration>,
    pub symptom: Option<Symptom>,
    /// The source's cause chain, secrets removed, for log lines.
    pub detail: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error("cannot build the HTTP client for the provider")]
    Client(#[source] reqwest::Error),
}

/// The configured summariser.
pub enum Provider {
    Extractive(Extractive),
    OpenAi(OpenAi),
}

impl Provider {
    /// `api_key` is the value of the variable `api_key_env` names, if set.
    pub fn from_config(
        config: &ProviderConfig,
        api_key: Option<String>,
    ) -> Result<Provider, ProviderSetupError> {
        match config.kind {
            ProviderKind::Extractive => Ok(Provider::Extractive(Extractive)),
            ProviderKind::Openai => OpenAi::new(config, api_key)
                .map(Provider::OpenAi)
                .map_err(ProviderSetupError::Client),
        }
    }

    /// The provider's name as summaries and failures record it.
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Extractive(_) => extractive::NAME,
            Provider::OpenAi(_) => openai::NAME,
        }
    }

    pub fn model(&self) -> &str {
        match self {
            Provider::Extractive(_) => extractive::MODEL,
            Provider::OpenAi(p) => p.model(),
        }
    }

    /// Which provider this is, as the database records it for a run: kind,
    /// base URL (credentials redacted) and model; never the key.
    pub fn identity(&self) -> ProviderIdentity {
        match self {
            Provider::Extractive(_) => ProviderIdentity {
                kind: extractive::NAME.to_owned(),
                base_url: String::new(),
                model: extractive::MODEL.to_owned(),
            },
            Provider::OpenAi(p) => ProviderIdentity {
                kind: openai::NAME.to_owned(),
                base_url: p.base_url().to_owned(),
                model: p.model().to_owned(),
            },
        }
    }

    /// Identifies the provider configuration: kind, base URL, model and the
    /// key's identity (a hash of it, never the key). A segment parked under
    /// one fingerprint is due again under another.
    pub fn fingerprint(&self) -> String {
        match self {
            Provider::Extractive(_) => format!("{}/{}", extractive::NAME, extractive::MODEL),
            Provider::OpenAi(p) => p.fingerprint(),
        }
    }

    /// How many estimated tokens of entries (or parts) one request may carry,
    /// after the prompt's own share; None when there is no limit.
    pub fn content_budget(&self, max_input_tokens: u32) -> Option<u32> {
        match self {
            Provider::Extractive(_) => None,
            Provider::OpenAi(p) => Some(max_input_tokens.saturating_sub(p.prompt_tokens()).max(16)),
        }
    }

    /// The base URL requests go to (credentials redacted); empty for a
    /// provider that calls no endpoint.
    pub fn base_url(&self) -> &str {
        match self {
            Provider::Extractive(_) => "",
            Provider::OpenAi(p) => p.base_url(),
        }
    }

    /// The URL of a chat completion (credentials redacted), if there is one.
    pub fn endpoint(&self) -> Option<String> {
        match self {
            Provider::Extractive(_) => None,
            Provider::OpenAi(p) => Some(format!("{}/chat/completions", p.base_url())),
        }
    }

    /// The name of the variable the key is read from, and whether it held
    /// one; None for a provider that needs no key.
    pub fn key_source(&self) -> Option<(&str, bool)> {
        match self {
            Provider::Extractive(_) => None,
            Provider::OpenAi(p) => Some((p.key_env(), !p.secrets().is_empty())),
        }
    }

    /// Removes the provider's secrets (its API key, bearer tokens, URL
    /// credentials) from a text.
    pub fn redact(&self, text: &str) -> String {
        match self {
            Provider::Extractive(_) => text.to_owned(),
            Provider::OpenAi(p) => crate::failure::redact(text, &p.secrets()),
        }
    }

    /// One attempt. The caller (the pass) bounds it in time.
    pub async fn summarise(
        &self,
        input: RecapInput<'_>,
        max_output_tokens: u32,
    ) -> Result<Recap, ProviderError> {
        match self {
            // Local and CPU-bound, a few microseconds an entry.
            Provider::Extractive(e) => Ok(match input {
                RecapInput::Entries { entries, .. } => e.summarise(entries, max_output_tokens),
                RecapInput::Parts(parts) | RecapInput::Children(parts) => {
                    let entries: Vec<Entry> = parts
                        .iter()
                        .enumerate()
                        .map(|(i, p)| Entry {
                            seq: i as u64 + 1,
                            client_entry_id: None,
                            role: Role::Assistant,
                            content: p.clone(),
                            created_at: Millis(0),
                            tokens: estimate_tokens(p),
                            occurred_at: Millis(0),
                            name: None,
                            metadata: Default::default(),
                        })
                        .collect();
                    e.summarise_recaps(&entries, max_output_tokens)
                }
            }),
            Provider::OpenAi(p) => p.summarise(&input, max_output_tokens).await,
        }
    }
}

//! Summarisers: one attempt each, segment entries in, a recap (text and
//! usage) out, or one typed error. The retry policy lives in `retry.rs`,
//! never here.

pub mod extractive;

use std::time::Duration;

use crate::config::{ProviderConfig, ProviderKind};
use crate::failure::FailureClass;
use crate::model::Entry;

pub use extractive::Extractive;

/// What one attempt summarises.
#[derive(Clone, Debug)]
pub struct RecapRequest<'a> {
    pub entries: &'a [Entry],
    pub max_output_tokens: u32,
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

/// One failed attempt, classified where the typed cause is still in hand.
#[derive(Debug, thiserror::Error)]
#[error("{provider} recap attempt failed ({})", class.as_str())]
pub struct ProviderError {
    pub provider: &'static str,
    pub class: FailureClass,
    pub http_status: Option<u16>,
    pub retry_after: Option<Duration>,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// The configured summariser.
pub enum Provider {
    Extractive(Extractive),
}

impl Provider {
    pub fn from_config(config: &ProviderConfig) -> Result<Provider, ProviderSetupError> {
        match config.kind {
            ProviderKind::Extractive => Ok(Provider::Extractive(Extractive)),
            ProviderKind::Openai => Err(ProviderSetupError::NotAvailable("openai")),
        }
    }

    /// The provider's name as summaries and failures record it.
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Extractive(_) => extractive::NAME,
        }
    }

    pub fn model(&self) -> &str {
        match self {
            Provider::Extractive(_) => extractive::MODEL,
        }
    }

    /// One attempt, bounded by `timeout`.
    pub async fn summarise(
        &self,
        request: &RecapRequest<'_>,
        _timeout: Duration,
    ) -> Result<Recap, ProviderError> {
        match self {
            // Local and CPU-bound for a few microseconds per entry: no
            // timeout can usefully interrupt it.
            Provider::Extractive(e) => Ok(e.summarise(request)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error("provider kind {0:?} is not available in this build")]
    NotAvailable(&'static str),
}

//! The `Failure` record of a pass that gave up: its class, the provider's
//! status and Retry-After, the whole cause chain, redacted, and a hint of
//! what would fix it, as the caller reads it and the segment keeps it.

use std::time::Duration;

use super::retry::GaveUp;
use crate::config::RetryConfig;
use crate::failure::{Failure, FailureClass, cause_chain};
use crate::model::SegmentId;
use crate::provider::{Provider, ProviderError, Symptom};
use crate::store::StoreError;
use crate::text::{count, human_duration};

/// What a pass was for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Subject {
    /// A segment's recap.
    Segment(SegmentId),
    /// A probe of the provider (`archivist check`, the start-up check).
    Probe,
    /// The embedding of a batch of this many entries and summaries.
    Embedding(usize),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Segment(id) => write!(f, "recap of segment {id}"),
            Subject::Probe => f.write_str("the provider check"),
            Subject::Embedding(n) => {
                write!(f, "embedding of {}", count(*n as u64, "text", "texts"))
            }
        }
    }
}

/// A pass that ended without a recap, with everything its Failure needs.
#[derive(Debug, thiserror::Error)]
#[error("{subject} failed ({}) after {}", class.as_str(), count(u64::from(*attempts), "attempt", "attempts"))]
struct PassFailed {
    subject: Subject,
    class: FailureClass,
    attempts: u32,
    #[source]
    cause: PassCause,
}

#[derive(Debug, thiserror::Error)]
enum PassCause {
    #[error(transparent)]
    Provider(ProviderError),
    #[error(
        "no answer within {} (the attempt's time: retry.attempt_timeout, or what was left of retry.pass_ceiling)",
        human_duration(*.0)
    )]
    TimedOut(Duration),
    #[error(
        "the pass used up its {} (retry.pass_ceiling) before a recap came back",
        human_duration(*.0)
    )]
    Ceiling(Duration, #[source] Option<ProviderError>),
    #[error("the recap could not be stored")]
    Store(#[source] StoreError),
}

/// What a Failure says of the other side of a pass: the summariser or the
/// embedder.
pub(crate) trait Source {
    fn name(&self) -> &'static str;
    fn model(&self) -> &str;
    /// `text` without the source's secrets.
    fn redact(&self, text: &str) -> String;
    /// What most likely fixes a failure of `class`, for a person.
    fn hint(
        &self,
        class: FailureClass,
        last: Option<&ProviderError>,
        retry: &RetryConfig,
    ) -> String;
}

impl Source for Provider {
    fn name(&self) -> &'static str {
        Provider::name(self)
    }
    fn model(&self) -> &str {
        Provider::model(self)
    }
    fn redact(&self, text: &str) -> String {
        Provider::redact(self, text)
    }
    fn hint(
        &self,
        class: FailureClass,
        last: Option<&ProviderError>,
        retry: &RetryConfig,
    ) -> String {
        hint(self, class, last, retry)
    }
}

/// The record of a pass for `subject` that gave up after `attempts` sends
/// in `elapsed`, under the pass rules `retry`.
pub(crate) fn failure(
    provider: &impl Source,
    subject: Subject,
    end: GaveUp<ProviderError>,
    attempts: u32,
    elapsed: Duration,
    retry: &RetryConfig,
) -> Failure {
    let class = end.class();
    let last = end.last_error();
    let http_status = last.and_then(|e| e.http_status);
    let retry_after = last.and_then(|e| e.retry_after);
    let hint = provider.hint(class, last, retry);
    let cause = match end {
        GaveUp::Error(e) => PassCause::Provider(e),
        GaveUp::TimedOut { timeout } => PassCause::TimedOut(timeout),
        GaveUp::Ceiling { last } => PassCause::Ceiling(retry.pass_ceiling, last),
    };
    let error = PassFailed {
        subject,
        class,
        attempts,
        cause,
    };
    recorded(provider, error, retry_after, http_status, elapsed, hint)
}

/// The record of a pass for `subject` whose recap came back after
/// `attempts` sends in `elapsed` but could not be stored (`error`).
pub(crate) fn store_failure(
    provider: &impl Source,
    subject: Subject,
    error: StoreError,
    attempts: u32,
    elapsed: Duration,
    retry: &RetryConfig,
) -> Failure {
    let class = FailureClass::Store;
    let hint = provider.hint(class, None, retry);
    let error = PassFailed {
        subject,
        class,
        attempts,
        cause: PassCause::Store(error),
    };
    recorded(provider, error, None, None, elapsed, hint)
}

/// A pass's failure as it is kept and told: every cause and the hint
/// redacted.
fn recorded(
    provider: &impl Source,
    error: PassFailed,
    retry_after: Option<Duration>,
    http_status: Option<u16>,
    elapsed: Duration,
    hint: String,
) -> Failure {
    Failure {
        class: error.class,
        retry_after,
        causes: cause_chain(&error)
            .iter()
            .map(|c| provider.redact(c))
            .collect(),
        attempts: error.attempts,
        elapsed,
        http_status,
        provider: provider.name().to_owned(),
        model: provider.model().to_owned(),
        hint: provider.redact(&hint),
    }
}

/// What most likely fixes a failure of `class`, for a person: decided on
/// the class and the typed symptom of the last attempt, never on text.
fn hint(
    provider: &Provider,
    class: FailureClass,
    last: Option<&ProviderError>,
    retry: &RetryConfig,
) -> String {
    let base_url = provider.base_url();
    let endpoint = provider.endpoint().unwrap_or_default();
    let symptom = last.and_then(|e| e.symptom);
    let status = last
        .and_then(|e| e.http_status)
        .map(|s| format!(" (HTTP {s})"))
        .unwrap_or_default();
    let later = "the server tries again by itself, with growing spacing";
    match (class, symptom) {
        (FailureClass::UnknownModel, Some(Symptom::NoRoute)) => format!(
            "{endpoint} is not a chat-completions endpoint (HTTP 404 naming no model): \
             provider.base_url is probably wrong. OpenAI-compatible servers serve under /v1 \
             (for example http://127.0.0.1:11434/v1 for Ollama), and archivist appends \
             /chat/completions to it"
        ),
        (FailureClass::UnknownModel, _) => format!(
            "the provider does not serve the model {:?}: check provider.model against the \
             models it lists (Ollama: pull the model first); segments parked by it are retried \
             once the server runs with the fixed setup",
            provider.model()
        ),
        (FailureClass::Unauthorized, _) if provider.key_source().is_some_and(|(_, set)| !set) => {
            let var = provider.key_source().map(|(v, _)| v).unwrap_or_default();
            format!(
                "no key was sent: the variable {var} (named by provider.api_key_env) is not \
                 set where archivist runs; set it and restart"
            )
        }
        (FailureClass::Unauthorized, _) => {
            let var = provider.key_source().map(|(v, _)| v).unwrap_or_default();
            format!(
                "the provider refused the key{status}: check that {var} (named by \
                 provider.api_key_env) holds a valid key for {base_url}; segments parked by \
                 it are retried once the server runs with another key"
            )
        }
        (FailureClass::Unavailable | FailureClass::InvalidRequest, Some(Symptom::HtmlPage)) => {
            format!(
                "the provider (or a proxy in front of it) answered with an HTML error \
                 page{status}: the API behind it may be down, or provider.base_url may point \
                 at a website rather than the API (OpenAI-compatible APIs usually end in /v1)"
            )
        }
        (FailureClass::InvalidRequest, _) => format!(
            "the provider refused the request as invalid{status}: the cause says why; a \
             segment too large for the model's context needs a lower \
             provider.max_input_tokens. Once fixed, requeue it (archivist session requeue \
             SESSION --include-parked)"
        ),
        (FailureClass::QuotaExhausted, _) => format!(
            "the account behind the key is out of quota or credit{status}: add credit or raise \
             its limit; the segment is tried again after reconciler.quota_delay"
        ),
        (FailureClass::RateLimited, _) => format!(
            "the provider asked archivist to slow down{status}; {later}, never sooner than it \
             asked. If it persists, lower reconciler.concurrency"
        ),
        (FailureClass::MalformedResponse, Some(Symptom::HtmlPage)) => format!(
            "{base_url} answered with an HTML page, not the API: provider.base_url probably \
             points at a website, a proxy or a login page (OpenAI-compatible APIs usually end \
             in /v1)"
        ),
        (FailureClass::MalformedResponse, _) => format!(
            "the answer was not a usable chat completion: check that {base_url} is an \
             OpenAI-compatible API; {later}"
        ),
        (FailureClass::Transport, _) => format!(
            "nothing usable answered at {base_url}: check that the provider is running and \
             reachable from here, and that provider.base_url has the right scheme, host and \
             port; {later}"
        ),
        (FailureClass::Timeout, _) => format!(
            "the provider did not answer within {} (retry.attempt_timeout){status}: it may be \
             overloaded or loading the model; raise retry.attempt_timeout if it is always \
             this slow; {later}",
            human_duration(retry.attempt_timeout)
        ),
        (FailureClass::Unavailable, _) => {
            format!("the provider reported a failure on its side{status}; {later}")
        }
        (FailureClass::Store, _) => format!(
            "the provider's recap came back but archivist's database refused to store it (the \
             causes say why); {later}"
        ),
        (FailureClass::BudgetExhausted, _) => format!(
            "no recap came back within retry.pass_ceiling ({}); {later}",
            human_duration(retry.pass_ceiling)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_read_as_a_person_would_say_them() {
        let timed_out = PassCause::TimedOut(Duration::from_millis(9_668)).to_string();
        assert!(
            timed_out.starts_with("no answer within 9.7 s"),
            "{timed_out}"
        );
        let ceiling = PassCause::Ceiling(Duration::from_secs(30), None).to_string();
        assert!(
            ceiling.contains("its 30 s (retry.pass_ceiling)"),
            "{ceiling}"
        );
        let failed = PassFailed {
            subject: Subject::Segment(7),
            class: FailureClass::Timeout,
            attempts: 1,
            cause: PassCause::TimedOut(Duration::from_secs(2)),
        };
        assert_eq!(
            failed.to_string(),
            "recap of segment 7 failed (timeout) after 1 attempt"
        );
    }
}

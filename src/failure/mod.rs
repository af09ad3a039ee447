//! The failure taxonomy: the classes a recap pass can fail with, what each
//! one means for retrying, and the `Failure` record that travels to the
//! caller and is stored as a segment's `last_failure`. Classifying a
//! provider's answer is in `classify.rs`; keeping secrets out of every text
//! is in `redact.rs`.
//!
//! A cancelled pass is not a failure: it is control flow (`PassEnd::Cancelled`
//! in the pass), and no class stands for it here.

mod classify;
mod redact;

use std::error::Error as StdError;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use classify::{ErrorBody, classify_http, parse_retry_after};
pub(crate) use redact::redact;

/// The longest wait anything schedules or accepts (a Retry-After, a
/// configured duration): past it deadlines and leases would overflow, and
/// nothing sensible needs more than a month.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);

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
    BudgetExhausted,
    /// The provider's recap came back but archivist's own database refused
    /// what the pass had to write: a pass that ends so is counted and
    /// recorded like any other failure, never retried silently.
    Store,
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
        FailureClass::BudgetExhausted,
        FailureClass::Store,
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
            FailureClass::BudgetExhausted => "budget_exhausted",
            FailureClass::Store => "store",
        }
    }

    pub fn parse(name: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// May another send within the same pass succeed?
    pub(crate) fn retry_within_pass(self) -> bool {
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
            | FailureClass::BudgetExhausted
            // It comes after the sends, from the store, not the provider.
            | FailureClass::Store => false,
        }
    }

    /// Does a failure of this class park its segment: retrying cannot help
    /// until someone changes something (the key, the model, the request).
    pub(crate) fn parks(self) -> bool {
        match self {
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::MalformedResponse
            | FailureClass::RateLimited
            | FailureClass::BudgetExhausted
            | FailureClass::Store
            // Quota waits out a long delay while PENDING rather than parking:
            // a refill or a new billing period fixes it with nobody acting.
            | FailureClass::QuotaExhausted => false,
            FailureClass::Unauthorized
            | FailureClass::UnknownModel
            | FailureClass::InvalidRequest => true,
        }
    }

    /// May a later pass succeed without anyone changing anything?
    pub fn retryable(self) -> bool {
        !self.parks()
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
    /// What most likely fixes it, for a person (empty when unknown).
    #[serde(default)]
    pub hint: String,
}

impl Failure {
    pub fn retryable(&self) -> bool {
        self.class.retryable()
    }
}

/// Every message in an error's chain, outermost first, each once.
pub(crate) fn cause_chain(err: &(dyn StdError + 'static)) -> Vec<String> {
    let mut causes = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        // Some errors repeat their source's text in their own Display
        // (whole, or at the end after a colon), and some sources repeat
        // the error above them after a prefix of their own (SQLite's
        // "Error code 26: file is not a database" under "file is not a
        // database"); keep the chain readable by not saying the same thing
        // twice in a row.
        let repeated = causes.last().is_some_and(|last: &String| {
            *last == text
                || last.ends_with(&format!(": {text}"))
                || text.ends_with(&format!(": {last}"))
        });
        if !repeated {
            causes.push(text);
        }
        next = e.source();
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose Display ends with its source's, as a pool's error
    /// wrapping a driver's does.
    #[derive(Debug)]
    struct Wraps(&'static str, Option<Box<Wraps>>);

    impl std::fmt::Display for Wraps {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Wraps {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_cause_repeated_by_the_error_above_it_is_said_once() {
        let err = Wraps(
            "creating a connection: db error",
            Some(Box::new(Wraps(
                "db error",
                Some(Box::new(Wraps("FATAL: no such database", None))),
            ))),
        );
        assert_eq!(
            cause_chain(&err),
            ["creating a connection: db error", "FATAL: no such database"]
        );
        // A source that says the error above it again after a prefix.
        let err = Wraps(
            "cannot open the database",
            Some(Box::new(Wraps(
                "file is not a database",
                Some(Box::new(Wraps(
                    "Error code 26: file is not a database",
                    None,
                ))),
            ))),
        );
        assert_eq!(
            cause_chain(&err),
            ["cannot open the database", "file is not a database"]
        );
        // Not a repeat: only the same text, whole or after a colon.
        let err = Wraps("timed out", Some(Box::new(Wraps("out", None))));
        assert_eq!(cause_chain(&err), ["timed out", "out"]);
        let err = Wraps("out", Some(Box::new(Wraps("timed out", None))));
        assert_eq!(cause_chain(&err), ["out", "timed out"]);
    }

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
            assert!(c.parks());
            assert!(!c.retryable());
        }
        assert!(!FailureClass::QuotaExhausted.retry_within_pass());
        assert!(!FailureClass::QuotaExhausted.parks());
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

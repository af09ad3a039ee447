//! The failure taxonomy: the classes a recap pass can fail with, what each
//! one means for retrying, and the `Failure` record that travels to the
//! caller and is stored as a segment's `last_failure`.

use std::error::Error as StdError;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    Cancelled,
    BudgetExhausted,
}

/// What follows a failed pass for its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterPass {
    /// Stays PENDING and is due again on the reconciler's schedule.
    Reschedule,
    /// PARKED: retrying cannot help until someone changes something.
    Park,
    /// Stays PENDING, due at once; not counted as a failure.
    Release,
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
        FailureClass::Cancelled,
        FailureClass::BudgetExhausted,
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
            FailureClass::Cancelled => "cancelled",
            FailureClass::BudgetExhausted => "budget_exhausted",
        }
    }

    pub fn parse(name: &str) -> Option<FailureClass> {
        FailureClass::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// May another send within the same pass succeed?
    pub fn retry_within_pass(self) -> bool {
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
            | FailureClass::Cancelled
            | FailureClass::BudgetExhausted => false,
        }
    }

    /// May a later pass succeed without anyone changing anything?
    pub fn retryable(self) -> bool {
        !matches!(self.after_pass(), AfterPass::Park)
    }

    pub fn after_pass(self) -> AfterPass {
        match self {
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::MalformedResponse
            | FailureClass::RateLimited
            | FailureClass::BudgetExhausted
            // Quota waits out a long delay while PENDING rather than parking:
            // a refill or a new billing period fixes it with nobody acting.
            | FailureClass::QuotaExhausted => AfterPass::Reschedule,
            FailureClass::Unauthorized
            | FailureClass::UnknownModel
            | FailureClass::InvalidRequest => AfterPass::Park,
            FailureClass::Cancelled => AfterPass::Release,
        }
    }

    /// The ErrorInfo reason for this class, UPPER_SNAKE.
    pub fn reason(self) -> String {
        self.as_str().to_ascii_uppercase()
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
}

impl Failure {
    pub fn retryable(&self) -> bool {
        self.class.retryable()
    }
}

/// Every message in an error's chain, outermost first, each once.
pub fn cause_chain(err: &(dyn StdError + 'static)) -> Vec<String> {
    let mut causes = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        // Some errors repeat their source's text in their own Display; keep
        // the chain readable by not printing the same line twice in a row.
        if causes.last() != Some(&text) {
            causes.push(text);
        }
        next = e.source();
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(c.after_pass(), AfterPass::Park);
            assert!(!c.retryable());
        }
        assert!(!FailureClass::QuotaExhausted.retry_within_pass());
        assert_eq!(
            FailureClass::QuotaExhausted.after_pass(),
            AfterPass::Reschedule
        );
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

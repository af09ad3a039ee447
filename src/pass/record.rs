//! The `Failure` record of a pass that gave up: its class, the provider's
//! status and Retry-After, and the whole cause chain, redacted, as the
//! caller reads it and the segment keeps it.

use std::time::Duration;

use super::retry::GaveUp;
use crate::failure::{Failure, FailureClass, cause_chain};
use crate::model::SegmentId;
use crate::provider::{Provider, ProviderError};

/// A pass that ended without a recap, with everything its Failure needs.
#[derive(Debug, thiserror::Error)]
#[error("recap of segment {segment_id} failed ({}) after {attempts} attempt(s)", class.as_str())]
struct PassFailed {
    segment_id: SegmentId,
    class: FailureClass,
    attempts: u32,
    #[source]
    cause: PassCause,
}

#[derive(Debug, thiserror::Error)]
enum PassCause {
    #[error(transparent)]
    Provider(ProviderError),
    #[error("no answer within the attempt's {0:?}")]
    TimedOut(Duration),
    #[error("the pass ceiling of {0:?} ran out")]
    Ceiling(Duration, #[source] Option<ProviderError>),
}

/// The record of a pass over `segment_id` that gave up after `attempts`
/// sends in `elapsed`, under a pass ceiling of `ceiling`.
pub(crate) fn failure(
    provider: &Provider,
    segment_id: SegmentId,
    end: GaveUp<ProviderError>,
    attempts: u32,
    elapsed: Duration,
    ceiling: Duration,
) -> Failure {
    let class = end.class();
    let last = end.last_error();
    let http_status = last.and_then(|e| e.http_status);
    let retry_after = last.and_then(|e| e.retry_after);
    let cause = match end {
        GaveUp::Error(e) => PassCause::Provider(e),
        GaveUp::TimedOut { timeout } => PassCause::TimedOut(timeout),
        GaveUp::Ceiling { last } => PassCause::Ceiling(ceiling, last),
    };
    let error = PassFailed {
        segment_id,
        class,
        attempts,
        cause,
    };
    Failure {
        class,
        retry_after,
        causes: cause_chain(&error)
            .iter()
            .map(|c| provider.redact(c))
            .collect(),
        attempts,
        elapsed,
        http_status,
        provider: provider.name().to_owned(),
        model: provider.model().to_owned(),
    }
}

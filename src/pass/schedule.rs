//! What follows a pass that ended without a recap, decided in one place
//! (the `Disposition` of `model.rs`): the segment is due again later
//! (`Retry`), parked until someone changes something (`Park`), or let go
//! with nothing counted (`Release`, for a cancelled pass). Also how long a
//! claim lasts.

use std::time::Duration;

use rand::Rng;

use crate::config::{ReconcilerConfig, RetryConfig};
use crate::failure::{Failure, FailureClass};
use crate::model::{Disposition, Millis};

/// What follows a failed pass, the segment's `passes`-th (from 1): spacing
/// that doubles with every pass from the reconciler's interval, capped at
/// `max_spacing`, with up to half of it taken off at random (`rng`) so that
/// segments that failed together do not come back together; never sooner
/// than a Retry-After; `quota_delay` for an exhausted quota.
pub(crate) fn after_failure(
    failure: &Failure,
    passes: u32,
    config: &ReconcilerConfig,
    now: Millis,
    rng: &mut impl Rng,
) -> Disposition {
    if failure.class.parks() {
        return Disposition::Park;
    }
    if failure.class == FailureClass::QuotaExhausted {
        return Disposition::Retry {
            at: now.saturating_add(config.quota_delay),
        };
    }
    let exp = passes.saturating_sub(1).min(30);
    let base = config
        .interval
        .saturating_mul(1u32 << exp)
        .min(config.max_spacing);
    let jittered = base.mul_f64(1.0 - 0.5 * rng.r#gen::<f64>());
    let spacing = match failure.retry_after {
        Some(wait) => jittered.max(wait),
        None => jittered,
    };
    Disposition::Retry {
        at: now.saturating_add(spacing),
    }
}

/// How long a claim lasts: longer than the longest pass (twice its ceiling,
/// and a margin for the store), so that a live worker never loses its claim
/// while still inside the ceiling. A crashed worker's segment is due again
/// after this.
pub(crate) fn lease(retry: &RetryConfig) -> Duration {
    retry.pass_ceiling * 2 + Duration::from_secs(5)
}

#[cfg(test)]
mod tests {
    use rand::rngs::mock::StepRng;

    use super::*;

    fn failure(class: FailureClass, retry_after: Option<Duration>) -> Failure {
        Failure {
            class,
            retry_after,
            causes: vec!["cause".to_owned()],
            attempts: 1,
            elapsed: Duration::ZERO,
            http_status: None,
            provider: "p".to_owned(),
            model: "m".to_owned(),
            hint: String::new(),
        }
    }

    fn config() -> ReconcilerConfig {
        ReconcilerConfig {
            interval: Duration::from_secs(5),
            max_spacing: Duration::from_secs(3600),
            quota_delay: Duration::from_secs(7200),
            ..ReconcilerConfig::default()
        }
    }

    /// A source whose every f64 is 0.0: no jitter taken off.
    fn no_jitter() -> StepRng {
        StepRng::new(0, 0)
    }

    /// A source whose every f64 is just under 1.0: the most jitter.
    fn most_jitter() -> StepRng {
        StepRng::new(u64::MAX, 0)
    }

    fn delay(d: Disposition) -> Duration {
        match d {
            Disposition::Retry { at } => Duration::from_millis(at.0 as u64),
            other => panic!("not a retry: {other:?}"),
        }
    }

    const NOW: Millis = Millis(0);

    #[test]
    fn spacing_doubles_with_each_pass_up_to_the_cap() {
        let f = failure(FailureClass::Unavailable, None);
        let c = config();
        let delays: Vec<Duration> = (1..=12)
            .map(|p| delay(after_failure(&f, p, &c, NOW, &mut no_jitter())))
            .collect();
        assert_eq!(delays[0], Duration::from_secs(5));
        assert_eq!(delays[1], Duration::from_secs(10));
        assert_eq!(delays[2], Duration::from_secs(20));
        assert_eq!(delays[9], Duration::from_secs(2560));
        assert_eq!(delays[10], c.max_spacing, "capped");
        assert_eq!(delays[11], c.max_spacing);
        // A huge pass count neither overflows nor passes the cap.
        assert_eq!(
            delay(after_failure(&f, u32::MAX, &c, NOW, &mut no_jitter())),
            c.max_spacing
        );
    }

    #[test]
    fn jitter_takes_off_at_most_half() {
        let f = failure(FailureClass::Transport, None);
        let c = config();
        let most = delay(after_failure(&f, 3, &c, NOW, &mut most_jitter()));
        assert!(most >= Duration::from_secs(10), "{most:?}");
        assert!(most < Duration::from_millis(10_010), "{most:?}");
        let mut seen = std::collections::BTreeSet::new();
        let mut rng = rand::thread_rng();
        for _ in 0..200 {
            let d = delay(after_failure(&f, 3, &c, NOW, &mut rng));
            assert!(d >= Duration::from_secs(10) && d <= Duration::from_secs(20));
            seen.insert(d);
        }
        assert!(seen.len() > 50, "spread: {} distinct", seen.len());
    }

    #[test]
    fn a_retry_after_is_a_floor() {
        let c = config();
        let long = failure(FailureClass::RateLimited, Some(Duration::from_secs(600)));
        assert_eq!(
            delay(after_failure(&long, 1, &c, NOW, &mut no_jitter())),
            Duration::from_secs(600)
        );
        // A shorter one leaves the schedule as it is.
        let short = failure(FailureClass::RateLimited, Some(Duration::from_secs(1)));
        assert_eq!(
            delay(after_failure(&short, 2, &c, NOW, &mut no_jitter())),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn an_exhausted_quota_waits_the_quota_delay() {
        let f = failure(FailureClass::QuotaExhausted, None);
        for passes in [1, 5, 40] {
            assert_eq!(
                delay(after_failure(
                    &f,
                    passes,
                    &config(),
                    NOW,
                    &mut most_jitter()
                )),
                Duration::from_secs(7200)
            );
        }
    }

    #[test]
    fn classes_that_retrying_cannot_fix_park_and_no_other_does() {
        for class in FailureClass::ALL {
            let d = after_failure(&failure(class, None), 1, &config(), NOW, &mut no_jitter());
            let parked = matches!(d, Disposition::Park);
            assert_eq!(parked, !class.retryable(), "{class:?}");
            assert_eq!(
                parked,
                matches!(
                    class,
                    FailureClass::Unauthorized
                        | FailureClass::UnknownModel
                        | FailureClass::InvalidRequest
                ),
                "{class:?}"
            );
        }
    }

    #[test]
    fn a_lease_outlives_two_ceilings() {
        let retry = RetryConfig {
            pass_ceiling: Duration::from_secs(30),
            ..RetryConfig::default()
        };
        assert_eq!(lease(&retry), Duration::from_secs(65));
    }
}

//! The provider-wide circuit breaker: when passes fail in a row for a
//! reason that is the provider's (down, overloaded, rate limited, out of
//! quota, refusing the key), the reconciler stops fanning out and probes with
//! one segment at a time, ever more sparsely, until a pass succeeds. There is
//! one per provider: the summariser's, for recap passes, and the embedder's,
//! for embedding passes; each names its kind of pass in its log lines.
//!
//! Why a breaker and not a retry budget: a budget caps retries as a share of
//! first tries, but every reconciler pass over a backlog *is* a first try, so
//! with ten thousand due segments a budget still sends ten thousand. The
//! breaker's cost while the provider is down is set by time alone: one probe
//! pass (at most `max_attempts` sends) per probe interval, whatever the
//! backlog.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::failure::FailureClass;
use crate::model::SegmentId;

/// Consecutive provider-wide failures that open the breaker.
pub const TRIP_AFTER: u32 = 3;
/// Longest wait between probes.
pub(crate) const MAX_PROBE_SPACING: Duration = Duration::from_secs(60);

/// What a finished pass tells the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    Success,
    /// A failure that says the provider, not the segment, is in trouble.
    ProviderFailure,
    /// Says nothing of the provider (a bad segment, a cancelled pass, a lost
    /// claim).
    Neutral,
}

impl Signal {
    pub(crate) fn of_failure(class: FailureClass) -> Signal {
        match class {
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::MalformedResponse
            | FailureClass::RateLimited
            | FailureClass::QuotaExhausted
            | FailureClass::BudgetExhausted
            // A refused key or an unknown model fails every segment alike.
            | FailureClass::Unauthorized
            | FailureClass::UnknownModel => Signal::ProviderFailure,
            // Neither says anything of the provider's health.
            FailureClass::InvalidRequest | FailureClass::Store => Signal::Neutral,
        }
    }
}

/// The kind of pass a breaker watches, named in its log lines so that an
/// operator knows which provider is failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guarded {
    /// Recap passes, sent to the summariser's provider.
    Recap,
    /// Embedding passes, sent to the embedder.
    Embedding,
}

impl Guarded {
    /// The pass's name, as the retry loop's log lines give it.
    fn pass(self) -> &'static str {
        match self {
            Guarded::Recap => "recap",
            Guarded::Embedding => "embedding",
        }
    }

    /// What the pass calls.
    fn provider(self) -> &'static str {
        match self {
            Guarded::Recap => "provider",
            Guarded::Embedding => "embedder",
        }
    }

    /// Where an operator sees why it fails.
    fn diagnosis(self) -> &'static str {
        match self {
            Guarded::Recap => "`archivist check` shows what the provider answers",
            Guarded::Embedding => "`archivist backlog` shows the embedder's last failure",
        }
    }
}

/// The breaker's state, as metrics and logs show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed,
    Open,
    Probing,
}

#[derive(Debug)]
enum Mode {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        spacing: Duration,
    },
    Probing {
        segment: SegmentId,
        spacing: Duration,
        since: Instant,
    },
}

#[derive(Debug)]
pub(crate) struct Breaker {
    guarded: Guarded,
    mode: Mutex<Mode>,
    first_spacing: Duration,
    max_spacing: Duration,
    /// A probe that has not reported back after this long is taken as lost
    /// (its pass died), so the breaker never waits on it for ever.
    probe_timeout: Duration,
}

impl Breaker {
    /// `first_spacing` is the wait before the first probe; it doubles after
    /// each failed probe up to `max_spacing`.
    pub(crate) fn new(
        guarded: Guarded,
        first_spacing: Duration,
        max_spacing: Duration,
        probe_timeout: Duration,
    ) -> Breaker {
        Breaker {
            guarded,
            mode: Mutex::new(Mode::Closed { failures: 0 }),
            first_spacing: first_spacing.min(max_spacing),
            max_spacing,
            probe_timeout,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        match *self.lock() {
            Mode::Closed { .. } => BreakerState::Closed,
            Mode::Open { .. } => BreakerState::Open,
            Mode::Probing { .. } => BreakerState::Probing,
        }
    }

    /// May the reconciler start a pass over `segment` now? Closed: yes.
    /// Open: only once the probe interval is over, and then only this one
    /// segment, as the probe.
    pub(crate) fn admit(&self, segment: SegmentId) -> bool {
        let mut mode = self.lock();
        let now = Instant::now();
        let spacing = match *mode {
            Mode::Closed { .. } => return true,
            Mode::Probing { since, spacing, .. } if now - since >= self.probe_timeout => {
                warn!(
                    pass = self.guarded.pass(),
                    "a {} probe never reported back; probing again",
                    self.guarded.pass()
                );
                spacing
            }
            Mode::Probing { .. } => return false,
            Mode::Open { until, .. } if now < until => return false,
            Mode::Open { spacing, .. } => spacing,
        };
        *mode = Mode::Probing {
            segment,
            spacing,
            since: now,
        };
        true
    }

    /// When the next probe may start, while the breaker is open and that
    /// time is still to come (a past one is no reason to wake again).
    pub(crate) fn next_probe(&self) -> Option<Instant> {
        match *self.lock() {
            Mode::Open { until, .. } if until > Instant::now() => Some(until),
            Mode::Open { .. } | Mode::Closed { .. } | Mode::Probing { .. } => None,
        }
    }

    /// Takes in how a pass over `segment` ended, wherever it was started.
    pub(crate) fn record(&self, segment: SegmentId, signal: Signal) {
        let mut mode = self.lock();
        let next = match (&*mode, signal) {
            (_, Signal::Success) => {
                if !matches!(*mode, Mode::Closed { .. }) {
                    info!(
                        pass = self.guarded.pass(),
                        "the {} answers again; the reconciler resumes full concurrency of {} passes",
                        self.guarded.provider(),
                        self.guarded.pass()
                    );
                }
                Mode::Closed { failures: 0 }
            }
            (Mode::Closed { failures }, Signal::ProviderFailure) => {
                let failures = failures + 1;
                if failures >= TRIP_AFTER {
                    // Passes, not segments: three in a row may be one
                    // segment's, so the message claims no more than that.
                    let (pass, provider) = (self.guarded.pass(), self.guarded.provider());
                    warn!(
                        pass,
                        failures,
                        probe_in_ms = self.first_spacing.as_millis() as u64,
                        "{failures} {pass} passes in a row failed for a reason on the {provider}'s side; until one succeeds, the reconciler runs one {pass} pass at a time, the next in {} ({})",
                        crate::text::human_duration(self.first_spacing),
                        self.guarded.diagnosis()
                    );
                    Mode::Open {
                        until: Instant::now() + self.first_spacing,
                        spacing: self.first_spacing,
                    }
                } else {
                    Mode::Closed { failures }
                }
            }
            (Mode::Closed { failures }, Signal::Neutral) => Mode::Closed {
                failures: *failures,
            },
            (
                Mode::Probing {
                    segment: probe,
                    spacing,
                    ..
                },
                Signal::ProviderFailure,
            ) if *probe == segment => {
                let spacing = (*spacing * 2).min(self.max_spacing);
                warn!(
                    pass = self.guarded.pass(),
                    probe_in_ms = spacing.as_millis() as u64,
                    "the {} probe pass failed too: the {} is still failing; the next probe in {}",
                    self.guarded.pass(),
                    self.guarded.provider(),
                    crate::text::human_duration(spacing)
                );
                Mode::Open {
                    until: Instant::now() + spacing,
                    spacing,
                }
            }
            // A probe that said nothing of the provider: probe again soon.
            (
                Mode::Probing {
                    segment: probe,
                    spacing,
                    ..
                },
                Signal::Neutral,
            ) if *probe == segment => Mode::Open {
                until: Instant::now(),
                spacing: *spacing,
            },
            // Another entry point's pass while open or probing: the state
            // stands until the probe answers.
            (
                Mode::Probing {
                    segment,
                    spacing,
                    since,
                },
                _,
            ) => Mode::Probing {
                segment: *segment,
                spacing: *spacing,
                since: *since,
            },
            (Mode::Open { until, spacing }, _) => Mode::Open {
                until: *until,
                spacing: *spacing,
            },
        };
        *mode = next;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mode> {
        self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn trips_after_consecutive_provider_failures_and_probes_one_at_a_time() {
        let b = Breaker::new(
            Guarded::Recap,
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        );
        for id in 1..TRIP_AFTER as u64 {
            assert!(b.admit(id));
            b.record(id, Signal::ProviderFailure);
            assert_eq!(b.state(), BreakerState::Closed);
        }
        b.record(99, Signal::ProviderFailure);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.admit(10), "no pass before the probe interval");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.admit(10), "the probe");
        assert!(!b.admit(11), "one probe at a time");
        b.record(11, Signal::ProviderFailure);
        assert_eq!(
            b.state(),
            BreakerState::Probing,
            "only the probe's outcome counts"
        );
        b.record(10, Signal::ProviderFailure);
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!b.admit(12), "the spacing doubled to 10 s");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.admit(12));
        b.record(12, Signal::Success);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit(13) && b.admit(14));
    }

    #[tokio::test(start_paused = true)]
    async fn spacing_is_capped_and_a_success_anywhere_closes_it() {
        let b = Breaker::new(
            Guarded::Recap,
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        );
        for id in 0..TRIP_AFTER as u64 {
            b.record(id, Signal::ProviderFailure);
        }
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(60)).await;
            assert!(b.admit(1));
            b.record(1, Signal::ProviderFailure);
        }
        assert!(
            b.next_probe()
                .is_some_and(|t| t <= Instant::now() + Duration::from_secs(60))
        );
        b.record(2, Signal::Success);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_does_not_stall_it() {
        let b = Breaker::new(
            Guarded::Recap,
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(70),
        );
        for id in 0..TRIP_AFTER as u64 {
            b.record(id, Signal::ProviderFailure);
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.admit(1));
        assert!(b.next_probe().is_none());
        tokio::time::advance(Duration::from_secs(69)).await;
        assert!(!b.admit(2));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.admit(2), "the probe that never answered is given up");
    }

    #[test]
    fn neutral_outcomes_do_not_trip_it() {
        let b = Breaker::new(
            Guarded::Recap,
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        );
        for id in 0..10 {
            b.record(id, Signal::of_failure(FailureClass::InvalidRequest));
            b.record(id, Signal::Neutral);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Non-consecutive failures do not add up.
        b.record(1, Signal::ProviderFailure);
        b.record(2, Signal::ProviderFailure);
        b.record(3, Signal::Success);
        b.record(4, Signal::ProviderFailure);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    /// Takes a breaker guarding `guarded` through every line it logs: it
    /// trips, loses a probe, fails one and closes again.
    async fn every_line(guarded: Guarded) {
        let b = Breaker::new(
            guarded,
            Duration::from_secs(5),
            Duration::from_secs(60),
            Duration::from_secs(70),
        );
        for id in 0..TRIP_AFTER as u64 {
            b.record(id, Signal::ProviderFailure);
        }
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.admit(1));
        tokio::time::advance(Duration::from_secs(70)).await;
        assert!(b.admit(2), "the lost probe is given up");
        b.record(2, Signal::ProviderFailure);
        b.record(3, Signal::Success);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn its_log_lines_name_the_kind_of_pass_it_guards() {
        let log = crate::test_log::LogCapture::start();
        // Every line reached once, so that `rearm` keeps them enabled.
        every_line(Guarded::Recap).await;
        log.rearm();
        every_line(Guarded::Recap).await;
        let recap = log.text();
        log.rearm();
        every_line(Guarded::Embedding).await;
        let embedding = log.text();
        for (text, pass, other) in [
            (&recap, "recap", "embedding"),
            (&embedding, "embedding", "recap"),
        ] {
            assert_eq!(text.lines().count(), 4, "{text}");
            assert!(
                text.contains(&format!("{TRIP_AFTER} {pass} passes in a row failed")),
                "{text}"
            );
            assert!(
                text.contains(&format!("a {pass} probe never reported back")),
                "{text}"
            );
            assert!(
                text.contains(&format!("the {pass} probe pass failed too")),
                "{text}"
            );
            assert!(
                text.contains(&format!("resumes full concurrency of {pass} passes")),
                "{text}"
            );
            assert!(!text.contains(other), "{text}");
        }
        assert!(recap.contains("`archivist check`"), "{recap}");
        assert!(embedding.contains("embedder's side"), "{embedding}");
        assert!(embedding.contains("`archivist backlog`"), "{embedding}");
    }
}

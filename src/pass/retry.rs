//! The pass: the one bounded retry loop around a summariser, and the only
//! place in archivist where anything is retried. Knows nothing of HTTP: an
//! attempt is any future whose error tells its class and, optionally, how
//! long the other side asked us to wait.
//!
//! The rules, each enforced here:
//! - at most `max_attempts` sends;
//! - waits from a randomised exponential schedule (the `backoff` crate's,
//!   used only as a source of delays), capped at `max_backoff` after jitter;
//! - a hard ceiling on the whole pass, sends and waits included: each
//!   attempt's timeout is clamped to the time left, and a wait that does not
//!   fit in the time left ends the pass at once;
//! - a Retry-After is honoured (never retried sooner), and one longer than
//!   `max_blind_wait` ends the pass, leaving it to the reconciler;
//! - classes that retrying cannot fix are sent once;
//! - cancellation stops the sleep and the send at once.
//!
//! `backoff` 0.4's own `retry` is not used: it lets a Retry-After replace the
//! schedule and skip `max_elapsed_time`, has no attempt cap, and its
//! `max_elapsed_time` counts the next sleep but not the next send.

use std::future::Future;
use std::time::Duration;

use backoff::backoff::Backoff;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::RetryConfig;
use crate::failure::FailureClass;

/// What the pass needs to know of an attempt's error.
pub(crate) trait Classified {
    fn class(&self) -> FailureClass;
    /// The wait the other side asked for (Retry-After), if it said.
    fn retry_after(&self) -> Option<Duration>;
    /// What a log line says of the error: its whole cause chain, with
    /// nothing secret in it.
    fn detail(&self) -> String;
}

/// Why a pass ended without a result.
#[derive(Debug)]
pub(crate) enum PassEnd<E> {
    /// The pass gave up: what it ran into is a failure to record.
    GaveUp(GaveUp<E>),
    /// Shutdown or the caller cancelled the pass: control flow, not a
    /// failure; nothing is recorded against the segment.
    Cancelled,
}

/// How a pass gave up.
#[derive(Debug)]
pub(crate) enum GaveUp<E> {
    /// The last attempt failed with a class that ends the pass: terminal,
    /// or retryable but out of attempts, or its Retry-After was too long.
    Error(E),
    /// The attempt was still running when its timeout (clamped to the pass
    /// ceiling) came.
    TimedOut { timeout: Duration },
    /// The ceiling came, or the next wait would not fit before it; carries
    /// the last attempt's error, if there was one.
    Ceiling { last: Option<E> },
}

impl<E: Classified> GaveUp<E> {
    pub(crate) fn class(&self) -> FailureClass {
        match self {
            GaveUp::Error(e) => e.class(),
            GaveUp::TimedOut { .. } => FailureClass::Timeout,
            GaveUp::Ceiling { .. } => FailureClass::BudgetExhausted,
        }
    }

    pub(crate) fn last_error(&self) -> Option<&E> {
        match self {
            GaveUp::Error(e) => Some(e),
            GaveUp::Ceiling { last } => last.as_ref(),
            GaveUp::TimedOut { .. } => None,
        }
    }
}

/// How a pass went: its result, and what it cost.
#[derive(Debug)]
pub(crate) struct PassReport<T, E> {
    pub(crate) result: Result<T, PassEnd<E>>,
    /// Sends made (an attempt counts once it has started).
    pub(crate) attempts: u32,
}

/// The randomised exponential schedule of waits between attempts.
pub(crate) struct Schedule {
    inner: backoff::ExponentialBackoff,
    cap: Duration,
}

impl Schedule {
    pub(crate) fn new(config: &RetryConfig) -> Schedule {
        Schedule {
            inner: backoff::ExponentialBackoff {
                current_interval: config.initial_backoff,
                initial_interval: config.initial_backoff,
                randomization_factor: config.jitter,
                multiplier: config.multiplier,
                max_interval: config.max_backoff,
                // The pass enforces its own ceiling, counting sends too.
                max_elapsed_time: None,
                ..backoff::ExponentialBackoff::default()
            },
            cap: config.max_backoff,
        }
    }

    /// The next wait. The cap is applied after jitter, so a jittered wait
    /// never exceeds `max_backoff`.
    pub(crate) fn next_wait(&mut self) -> Duration {
        self.inner.next_backoff().unwrap_or(self.cap).min(self.cap)
    }
}

/// Whether a pass logs its retries and its giving up, and as what: a
/// recap's and an embedding batch's do, each named so an operator reading
/// the log knows which provider call is failing; a probe of the provider,
/// which reports its own result in one line, does not.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Logged {
    Recap,
    Embedding,
    No,
}

impl Logged {
    /// The pass's name in its log lines; None when it writes none.
    fn name(self) -> Option<&'static str> {
        match self {
            Logged::Recap => Some("recap"),
            Logged::Embedding => Some("embedding"),
            Logged::No => None,
        }
    }
}

/// Runs `attempt` under the pass rules of `config`. `attempt` gets the
/// attempt number (from 1) and the timeout it runs under.
pub(crate) async fn run_pass<T, E, F, Fut>(
    config: &RetryConfig,
    cancel: &CancellationToken,
    logged: Logged,
    mut attempt: F,
) -> PassReport<T, E>
where
    E: Classified,
    F: FnMut(u32, Duration) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    let deadline = start + config.pass_ceiling;
    let mut schedule = Schedule::new(config);
    let mut attempts = 0u32;
    let report = |result, attempts| PassReport { result, attempts };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return report(
                Err(PassEnd::GaveUp(GaveUp::Ceiling { last: None })),
                attempts,
            );
        }
        let timeout = config.attempt_timeout.min(left);
        attempts += 1;
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => return report(Err(PassEnd::Cancelled), attempts - 1),
            outcome = tokio::time::timeout(timeout, attempt(attempts, timeout)) => outcome,
        };
        let error = match outcome {
            Ok(Ok(value)) => return report(Ok(value), attempts),
            Ok(Err(e)) => e,
            Err(_) => {
                let end = GaveUp::TimedOut { timeout };
                if attempts >= config.max_attempts || Instant::now() >= deadline {
                    warn_exhausted(logged, &end, attempts, start.elapsed());
                    return report(Err(PassEnd::GaveUp(end)), attempts);
                }
                let wait = schedule.next_wait();
                if !fits(wait, deadline) {
                    let end = GaveUp::Ceiling { last: None };
                    warn_exhausted(logged, &end, attempts, start.elapsed());
                    return report(Err(PassEnd::GaveUp(end)), attempts);
                }
                warn_retry::<E>(
                    logged,
                    attempts,
                    config.max_attempts,
                    FailureClass::Timeout,
                    wait,
                    None,
                );
                if sleep_or_cancel(wait, cancel).await.is_err() {
                    return report(Err(PassEnd::Cancelled), attempts);
                }
                continue;
            }
        };
        let class = error.class();
        if !class.retry_within_pass() || attempts >= config.max_attempts {
            let end = GaveUp::Error(error);
            warn_exhausted(logged, &end, attempts, start.elapsed());
            return report(Err(PassEnd::GaveUp(end)), attempts);
        }
        let backoff = schedule.next_wait();
        let wait = match error.retry_after() {
            // A wait longer than we may wait blind ends the pass; the
            // reconciler schedules the segment no sooner than it asks.
            Some(asked) if asked > config.max_blind_wait => {
                let end = GaveUp::Error(error);
                warn_exhausted(logged, &end, attempts, start.elapsed());
                return report(Err(PassEnd::GaveUp(end)), attempts);
            }
            Some(asked) => asked.max(backoff),
            None => backoff,
        };
        if !fits(wait, deadline) {
            // Sleeping past the ceiling would break the bound; end now. A
            // Retry-After keeps its class so the schedule honours it.
            let end = if error.retry_after().is_some() {
                GaveUp::Error(error)
            } else {
                GaveUp::Ceiling { last: Some(error) }
            };
            warn_exhausted(logged, &end, attempts, start.elapsed());
            return report(Err(PassEnd::GaveUp(end)), attempts);
        }
        warn_retry(
            logged,
            attempts,
            config.max_attempts,
            class,
            wait,
            Some(&error),
        );
        if sleep_or_cancel(wait, cancel).await.is_err() {
            return report(Err(PassEnd::Cancelled), attempts);
        }
    }
}

/// The least time worth a send: a wait that leaves less than this before
/// the ceiling ends the pass instead of sending one that cannot answer.
const MIN_SEND: Duration = Duration::from_millis(100);

/// Whether waiting `wait` still leaves time for another attempt.
fn fits(wait: Duration, deadline: Instant) -> bool {
    Instant::now() + wait + MIN_SEND <= deadline
}

async fn sleep_or_cancel(wait: Duration, cancel: &CancellationToken) -> Result<(), ()> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(()),
        () = tokio::time::sleep(wait) => Ok(()),
    }
}

fn warn_retry<E: Classified>(
    logged: Logged,
    attempt: u32,
    max: u32,
    class: FailureClass,
    delay: Duration,
    error: Option<&E>,
) {
    let Some(pass) = logged.name() else {
        return;
    };
    warn!(
        pass,
        attempt,
        max_attempts = max,
        class = class.as_str(),
        delay_ms = delay.as_millis() as u64,
        error = error
            .map(Classified::detail)
            .unwrap_or_else(|| "no answer in time".to_owned()),
        "{pass} attempt failed; retrying"
    );
}

fn warn_exhausted<E: Classified>(
    logged: Logged,
    end: &GaveUp<E>,
    attempts: u32,
    elapsed: Duration,
) {
    let Some(pass) = logged.name() else {
        return;
    };
    warn!(
        pass,
        attempts,
        class = end.class().as_str(),
        elapsed_ms = elapsed.as_millis() as u64,
        error = match end {
            GaveUp::TimedOut { timeout } => format!("no answer within {timeout:?}"),
            _ => end
                .last_error()
                .map(Classified::detail)
                .unwrap_or_else(|| "no answer before the pass's ceiling".to_owned()),
        },
        "{pass} pass gave up"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Fake {
        class: FailureClass,
        retry_after: Option<Duration>,
    }

    impl Classified for Fake {
        fn class(&self) -> FailureClass {
            self.class
        }
        fn retry_after(&self) -> Option<Duration> {
            self.retry_after
        }
        fn detail(&self) -> String {
            format!("fake {}", self.class.as_str())
        }
    }

    fn fail(class: FailureClass) -> Fake {
        Fake {
            class,
            retry_after: None,
        }
    }

    fn config() -> RetryConfig {
        RetryConfig::default()
    }

    /// The class a pass gave up with; panics on success or cancellation.
    fn class_of<T: std::fmt::Debug>(result: Result<T, PassEnd<Fake>>) -> FailureClass {
        match result {
            Err(PassEnd::GaveUp(end)) => end.class(),
            other => panic!("the pass did not give up: {other:?}"),
        }
    }

    #[test]
    fn jitter_never_pushes_a_wait_past_the_cap_and_spreads_waits() {
        let c = RetryConfig {
            initial_backoff: Duration::from_secs(6),
            max_backoff: Duration::from_secs(8),
            jitter: 0.5,
            ..config()
        };
        let mut firsts = Vec::new();
        for _ in 0..200 {
            let mut s = Schedule::new(&c);
            let first = s.next_wait();
            assert!(
                first >= Duration::from_secs(3) && first <= c.max_backoff,
                "{first:?}"
            );
            firsts.push(first);
            for _ in 0..10 {
                assert!(s.next_wait() <= c.max_backoff);
            }
        }
        firsts.sort();
        firsts.dedup();
        assert!(
            firsts.len() > 100,
            "waits are spread: {} distinct",
            firsts.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retryable_failures_get_exactly_max_attempts() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = config();
        let report = run_pass(&c, &CancellationToken::new(), Logged::Recap, |_, _| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(fail(FailureClass::Unavailable))
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(report.attempts, 3);
        assert!(
            matches!(report.result, Err(PassEnd::GaveUp(GaveUp::Error(ref e))) if e.class == FailureClass::Unavailable)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn success_after_failures_stops_retrying() {
        let calls = Arc::new(AtomicU32::new(0));
        let report = run_pass(
            &config(),
            &CancellationToken::new(),
            Logged::Recap,
            |n, _| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if n < 3 {
                        Err(fail(FailureClass::Transport))
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(report.result.ok(), Some(3));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn terminal_classes_are_sent_once() {
        for class in [
            FailureClass::Unauthorized,
            FailureClass::UnknownModel,
            FailureClass::InvalidRequest,
            FailureClass::QuotaExhausted,
        ] {
            let calls = Arc::new(AtomicU32::new(0));
            let report = run_pass(
                &config(),
                &CancellationToken::new(),
                Logged::Recap,
                |_, _| {
                    let calls = calls.clone();
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Err::<(), _>(fail(class))
                    }
                },
            )
            .await;
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{class:?}");
            assert_eq!(class_of(report.result), class);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured_and_a_long_one_ends_the_pass() {
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let c = config();
        let report = run_pass(&c, &CancellationToken::new(), Logged::Recap, |n, _| {
            let times = times.clone();
            async move {
                times.lock().expect("lock").push(Instant::now());
                if n == 1 {
                    Err(Fake {
                        class: FailureClass::RateLimited,
                        retry_after: Some(Duration::from_secs(5)),
                    })
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert!(report.result.is_ok());
        let times = times.lock().expect("lock").clone();
        assert!(times[1] - times[0] >= Duration::from_secs(5));

        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let report = run_pass(&c, &CancellationToken::new(), Logged::Recap, |_, _| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Fake {
                    class: FailureClass::RateLimited,
                    retry_after: Some(Duration::from_secs(31)),
                })
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(start.elapsed(), Duration::ZERO, "ended at once, no sleep");
        assert_eq!(class_of(report.result), FailureClass::RateLimited);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_that_does_not_fit_the_time_left_ends_the_pass() {
        let c = RetryConfig {
            pass_ceiling: Duration::from_secs(10),
            ..config()
        };
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let report = run_pass(&c, &CancellationToken::new(), Logged::Recap, |_, _| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Fake {
                    class: FailureClass::RateLimited,
                    retry_after: Some(Duration::from_secs(20)),
                })
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(report.result.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_provider_that_never_answers_ends_within_the_ceiling() {
        for attempt_timeout in [
            Duration::from_secs(1),
            Duration::from_secs(20),
            Duration::from_secs(600),
        ] {
            let c = RetryConfig {
                attempt_timeout,
                pass_ceiling: Duration::from_secs(30),
                ..config()
            };
            let start = Instant::now();
            let report = run_pass(&c, &CancellationToken::new(), Logged::Recap, |_, _| async {
                std::future::pending::<Result<(), Fake>>().await
            })
            .await;
            assert!(start.elapsed() <= c.pass_ceiling, "{:?}", start.elapsed());
            assert!(report.attempts <= c.max_attempts);
            let class = class_of(report.result);
            assert!(
                matches!(class, FailureClass::Timeout | FailureClass::BudgetExhausted),
                "{class:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_the_sleep_and_the_send() {
        let cancel = CancellationToken::new();
        let c = config();
        let trigger = cancel.clone();
        let start = Instant::now();
        let handle = tokio::spawn(async move {
            run_pass(&c, &cancel, Logged::Recap, |_, _| async {
                std::future::pending::<Result<(), Fake>>().await
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
        let report = handle.await.expect("joined");
        assert!(matches!(report.result, Err(PassEnd::Cancelled)));
        assert_eq!(report.attempts, 0, "a cancelled send is not counted");
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    /// Sends of a pass whose every attempt fails with `error()`, and how
    /// long the pass took (time is paused: only its own waits count).
    async fn sends(c: &RetryConfig, error: impl Fn() -> Fake) -> (u32, Duration) {
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        run_pass(c, &CancellationToken::new(), Logged::No, |_, _| {
            let calls = calls.clone();
            let e = error();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(e)
            }
        })
        .await;
        (calls.load(Ordering::SeqCst), start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_of_exactly_the_blind_wait_cap_is_waited_out() {
        let c = RetryConfig {
            max_attempts: 2,
            max_blind_wait: Duration::from_secs(30),
            pass_ceiling: Duration::from_secs(60),
            ..config()
        };
        let asking = |wait: Duration| {
            move || Fake {
                class: FailureClass::RateLimited,
                retry_after: Some(wait),
            }
        };
        let (n, took) = sends(&c, asking(Duration::from_secs(30))).await;
        assert_eq!(n, 2, "waited the 30 s it asked for, then sent again");
        assert!(took >= Duration::from_secs(30), "{took:?}");
        let (n, took) = sends(&c, asking(Duration::from_millis(30_001))).await;
        assert_eq!(n, 1, "a wait past the cap ends the pass");
        assert_eq!(took, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_leaves_less_than_a_send_before_the_ceiling_ends_the_pass() {
        let unavailable = || fail(FailureClass::Unavailable);
        for (backoff, want) in [
            // 9.85 s of wait leaves 150 ms: enough for a send (100 ms).
            (Duration::from_millis(9_850), 2),
            // Exactly 100 ms left still counts.
            (Duration::from_millis(9_900), 2),
            // 9.95 s leaves 50 ms: not worth a send, so the pass ends now.
            (Duration::from_millis(9_950), 1),
        ] {
            let c = RetryConfig {
                max_attempts: 2,
                initial_backoff: backoff,
                max_backoff: backoff,
                jitter: 0.0,
                pass_ceiling: Duration::from_secs(10),
                ..config()
            };
            let (n, took) = sends(&c, unavailable).await;
            assert_eq!(n, want, "backoff {backoff:?}");
            if want == 1 {
                assert_eq!(took, Duration::ZERO, "ended at once, no sleep");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_that_time_out_are_retried_up_to_max_attempts() {
        let c = RetryConfig {
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(1),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(100),
            jitter: 0.0,
            pass_ceiling: Duration::from_secs(30),
            ..config()
        };
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let report = run_pass(&c, &CancellationToken::new(), Logged::No, |_, _| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<(), Fake>>().await
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(report.attempts, 3);
        assert_eq!(class_of(report.result), FailureClass::Timeout);
        // Three timeouts and two waits, well inside the ceiling.
        assert_eq!(start.elapsed(), Duration::from_millis(3_200));
    }

    /// What a pass under `c` and `logged` writes to the log; `answer`
    /// gives each attempt's error by its number, or None for an attempt
    /// that never answers.
    async fn log_of_pass(
        c: &RetryConfig,
        logged: Logged,
        answer: impl Fn(u32) -> Option<Fake>,
    ) -> String {
        let log = crate::test_log::LogCapture::start();
        // Both warnings reached once, so that `rearm` keeps them enabled.
        let warm = GaveUp::<Fake>::Ceiling { last: None };
        warn_exhausted(Logged::Recap, &warm, 0, Duration::ZERO);
        warn_retry::<Fake>(
            Logged::Recap,
            0,
            0,
            FailureClass::Timeout,
            Duration::ZERO,
            None,
        );
        log.rearm();
        run_pass(c, &CancellationToken::new(), logged, |n, _| {
            let error = answer(n);
            async move {
                match error {
                    Some(e) => Err::<(), _>(e),
                    None => std::future::pending().await,
                }
            }
        })
        .await;
        log.text()
    }

    /// What a pass under `logged` writes to the log, failing with a
    /// retryable class (the first attempt timing out if `timeout_first`)
    /// until it gives up.
    async fn log_of(logged: Logged, timeout_first: bool) -> String {
        let c = RetryConfig {
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(1),
            ..config()
        };
        log_of_pass(&c, logged, |n| {
            (!(timeout_first && n == 1)).then(|| fail(FailureClass::Unavailable))
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_logged_pass_warns_of_each_retry_and_of_giving_up_and_a_quiet_one_does_not() {
        for timeout_first in [false, true] {
            let loud = log_of(Logged::Recap, timeout_first).await;
            assert_eq!(
                loud.matches("retrying").count(),
                2,
                "{timeout_first}: {loud}"
            );
            assert_eq!(loud.matches("gave up").count(), 1, "{loud}");
            assert!(loud.contains("recap attempt failed"), "{loud}");
            let embedding = log_of(Logged::Embedding, timeout_first).await;
            assert_eq!(
                embedding
                    .matches("embedding attempt failed; retrying")
                    .count(),
                2,
                "{embedding}"
            );
            assert!(embedding.contains("embedding pass gave up"), "{embedding}");
            assert!(!embedding.contains("recap"), "{embedding}");
            let quiet = log_of(Logged::No, timeout_first).await;
            assert!(quiet.is_empty(), "{quiet}");
        }
    }

    /// Every way a pass gives up writes one WARN line saying so, with the
    /// class it gave up with and the last error it saw (none after a
    /// timeout); a quiet pass writes nothing.
    #[tokio::test(start_paused = true)]
    async fn every_way_of_giving_up_is_one_warn_line_naming_the_class_and_the_last_error() {
        let steady = |wait: Duration| RetryConfig {
            max_attempts: 3,
            initial_backoff: wait,
            max_backoff: wait,
            jitter: 0.0,
            attempt_timeout: Duration::from_secs(5),
            pass_ceiling: Duration::from_secs(10),
            max_blind_wait: Duration::from_secs(30),
            ..config()
        };
        let asking = |wait: u64| Fake {
            class: FailureClass::RateLimited,
            retry_after: Some(Duration::from_secs(wait)),
        };
        type Answer = Box<dyn Fn(u32) -> Option<Fake>>;
        let cases: Vec<(&str, RetryConfig, Answer, &str, &str)> = vec![
            (
                "a timeout on the last attempt",
                RetryConfig {
                    max_attempts: 1,
                    ..steady(Duration::from_millis(100))
                },
                Box::new(|_| None),
                "timeout",
                "no answer within ",
            ),
            (
                "a timeout that reaches the ceiling",
                RetryConfig {
                    attempt_timeout: Duration::from_secs(60),
                    ..steady(Duration::from_millis(100))
                },
                Box::new(|_| None),
                "timeout",
                "no answer within ",
            ),
            (
                "a timeout with no time left for the wait and a send",
                RetryConfig {
                    attempt_timeout: Duration::from_millis(9_900),
                    ..steady(Duration::from_millis(100))
                },
                Box::new(|_| None),
                "budget_exhausted",
                "no answer before the pass's ceiling",
            ),
            (
                "a terminal class",
                steady(Duration::from_millis(100)),
                Box::new(|_| Some(fail(FailureClass::Unauthorized))),
                "unauthorized",
                "fake unauthorized",
            ),
            (
                "a Retry-After past the blind-wait cap",
                steady(Duration::from_millis(100)),
                Box::new(move |_| Some(asking(31))),
                "rate_limited",
                "fake rate_limited",
            ),
            (
                "a Retry-After that does not fit before the ceiling",
                steady(Duration::from_millis(100)),
                Box::new(move |_| Some(asking(20))),
                "rate_limited",
                "fake rate_limited",
            ),
            (
                "a backoff that does not fit before the ceiling",
                steady(Duration::from_secs(11)),
                Box::new(|_| Some(fail(FailureClass::Unavailable))),
                "budget_exhausted",
                "fake unavailable",
            ),
        ];
        for (name, c, answer, class, error) in cases {
            let loud = log_of_pass(&c, Logged::Recap, &answer).await;
            let gave_up: Vec<&str> = loud.lines().filter(|l| l.contains("gave up")).collect();
            assert_eq!(gave_up.len(), 1, "{name}: {loud}");
            let line = gave_up[0];
            assert!(line.contains("WARN"), "{name}: {line}");
            assert!(
                line.contains(&format!("class=\"{class}\"")),
                "{name}: {line}"
            );
            // The error said in full, or (a timeout's) begun: never empty.
            assert!(
                line.contains(&format!("error=\"{error}\""))
                    || (error.ends_with(' ') && line.contains(&format!("error=\"{error}"))),
                "{name}: {line}"
            );
            let quiet = log_of_pass(&c, Logged::No, &answer).await;
            assert!(quiet.is_empty(), "{name}: {quiet}");
        }
    }
}

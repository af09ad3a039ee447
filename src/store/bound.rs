//! A search's budget, shared by all its statements (the common-terms probe
//! and both lexical legs): the deadline each stops at, and how much of the
//! budget went on the search's own work. A search stopped at its deadline
//! is told apart by that: its own work took at least half the budget, so
//! the same search costs the same again (`SearchTooCostly`, no retry
//! advice); or the budget went mostly on waiting, for a read connection or
//! for the CPU among many searches, so a retry once the server is less
//! busy may well answer (`SearchBusy`, with a RetryInfo).
//!
//! Work is the CPU time of a statement's thread on SQLite (the statement
//! runs there; what a loaded machine takes from it is waiting), and the
//! time a statement ran on PostgreSQL (the work is the database server's,
//! whose CPU this process cannot see); the wait for a connection is never
//! work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

/// One search's deadline and the work its statements have done so far.
#[derive(Clone, Debug)]
pub(crate) struct SearchBound {
    deadline: Instant,
    budget: Duration,
    /// Nanoseconds of the search's own work, added by each statement.
    worked: Arc<AtomicU64>,
}

impl SearchBound {
    /// A search beginning now, with `budget` for all its statements.
    pub(crate) fn new(budget: Duration) -> SearchBound {
        SearchBound {
            deadline: Instant::now() + budget,
            budget,
            worked: Arc::default(),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Counts `work` done by one of the search's statements.
    pub(crate) fn add_work(&self, work: Duration) {
        let nanos = u64::try_from(work.as_nanos()).unwrap_or(u64::MAX);
        self.worked.fetch_add(nanos, Ordering::Relaxed);
    }

    fn worked(&self) -> Duration {
        Duration::from_nanos(self.worked.load(Ordering::Relaxed))
    }

    /// What a search stopped at its deadline is: too costly, or refused
    /// for a busy server.
    pub(crate) fn spent(&self) -> StoreError {
        verdict(self.worked(), self.budget)
    }
}

/// Too costly when its own work took at least half the budget; busy when
/// waiting took more than half.
fn verdict(worked: Duration, budget: Duration) -> StoreError {
    if worked.saturating_mul(2) >= budget {
        StoreError::SearchTooCostly
    } else {
        StoreError::SearchBusy { budget }
    }
}

/// CPU time the calling thread has used so far: what a statement run on
/// it worked is the difference across the statement. Where the clock
/// cannot be read, the time that passed stands for it (so a stop then
/// always reads as work, as before the two were told apart).
pub(crate) struct ThreadWork {
    cpu: Option<Duration>,
    started: std::time::Instant,
}

impl ThreadWork {
    pub(crate) fn start() -> ThreadWork {
        ThreadWork {
            cpu: thread_cpu(),
            started: std::time::Instant::now(),
        }
    }

    /// The work done on this thread since `start`.
    pub(crate) fn done(&self) -> Duration {
        match (self.cpu, thread_cpu()) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => self.started.elapsed(),
        }
    }
}

#[cfg(unix)]
fn thread_cpu() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a
    // live, writable one, and reads nothing else.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if read != 0 {
        return None;
    }
    let secs = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

#[cfg(not(unix))]
fn thread_cpu() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_that_worked_half_its_budget_is_too_costly_and_one_that_waited_is_busy() {
        let budget = Duration::from_secs(2);
        for (worked, costly) in [
            (Duration::ZERO, false),
            (Duration::from_millis(999), false),
            (Duration::from_secs(1), true),
            (Duration::from_secs(3), true),
        ] {
            let said = verdict(worked, budget);
            assert_eq!(
                matches!(said, StoreError::SearchTooCostly),
                costly,
                "{worked:?}: {said:?}"
            );
            assert_eq!(matches!(said, StoreError::SearchBusy { .. }), !costly);
        }
    }

    #[test]
    fn the_work_of_every_statement_counts() {
        let bound = SearchBound::new(Duration::from_secs(2));
        assert!(matches!(bound.spent(), StoreError::SearchBusy { .. }));
        bound.add_work(Duration::from_millis(600));
        assert!(matches!(bound.spent(), StoreError::SearchBusy { .. }));
        bound.clone().add_work(Duration::from_millis(400));
        assert!(matches!(bound.spent(), StoreError::SearchTooCostly));
    }
}

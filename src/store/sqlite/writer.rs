//! Group commit: one writer thread owns the only writing connection and
//! commits whatever has queued up in one transaction. Each job runs inside
//! its own savepoint, so one job's error undoes only that job; a job that
//! breaks the transaction (or panics) aborts its whole batch, and every
//! caller is answered only after the COMMIT that made its work durable (or
//! told that it was not committed).
//!
//! Appends keep their sessions' rows in memory between batches (`Kept`):
//! the writer writes what they changed once, just before each COMMIT, and
//! forgets it all before any other kind of job runs, when a batch fails,
//! and when another connection has committed since its last batch.
//!
//! The entries appends store are the search index's tail (fts.rs) until a
//! batch indexes them all before it commits: the first batch to find the
//! tail at `TailPolicy`'s bound of texts (so the appends of that batch wait
//! for it: the tail never runs away), or the first to end once the
//! policy's wait has passed since the tail was last indexed whole. The
//! writer counts the tail as its appends add to it; a ticker wakes an idle
//! writer once the wait is over. What another process appends (a backfill
//! run) is indexed by that process's writer, or by the next search.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::fts;
use super::kept::Kept;
use crate::store::StoreError;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 512;

/// When the writer indexes the search index's tail: at `texts` texts, or
/// `wait` after it last indexed it whole (`[search]` tail_texts,
/// tail_wait).
/// Shared with the ticker, which also reads what the writer last counted.
#[derive(Debug)]
pub(crate) struct TailPolicy {
    texts: AtomicU64,
    wait_ms: AtomicU64,
    /// The writer's count of the tail after its last batch: an upper
    /// bound (a search's own indexing and an erasure are not subtracted
    /// until the next whole-tail indexing).
    owed: AtomicU64,
}

impl Default for TailPolicy {
    fn default() -> Self {
        let defaults = crate::config::SearchConfig::default();
        TailPolicy {
            texts: AtomicU64::new(defaults.tail_texts),
            wait_ms: AtomicU64::new(millis(defaults.tail_wait)),
            owed: AtomicU64::new(0),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TailPolicy {
    pub(super) fn set(&self, texts: u64, wait: Duration) {
        self.texts.store(texts.max(1), Ordering::Relaxed);
        self.wait_ms.store(millis(wait), Ordering::Relaxed);
    }

    pub(super) fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms.load(Ordering::Relaxed))
    }

    pub(super) fn owed(&self) -> u64 {
        self.owed.load(Ordering::Relaxed)
    }

    /// Whether the tail is due: at the bound, or `wait` after it was last
    /// indexed whole.
    fn due(&self, owed: u64, since: Instant) -> bool {
        owed >= self.texts.load(Ordering::Relaxed) || (owed > 0 && since.elapsed() >= self.wait())
    }
}

/// The writer's count of the tail and when it last indexed it all.
struct Tail {
    owed: u64,
    since: Instant,
}

/// Why a batch of writes was not committed; every job in it gets this.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum BatchFailure {
    #[error("could not begin a write transaction")]
    Begin(#[source] Arc<rusqlite::Error>),
    #[error("the commit failed")]
    Commit(#[source] Arc<rusqlite::Error>),
    #[error("another write in the same transaction failed in a way that aborted it")]
    Aborted {
        /// It failed for want of room on the disk.
        full: bool,
    },
}

impl BatchFailure {
    /// The error a job of the failed batch answers with: a full disk says
    /// so (the write may succeed once there is room), anything else is a
    /// write not committed.
    fn into_store_error(self) -> StoreError {
        let full = match &self {
            BatchFailure::Begin(e) | BatchFailure::Commit(e) => super::is_full(e),
            BatchFailure::Aborted { full } => *full,
        };
        if full {
            StoreError::Full(Box::new(self))
        } else {
            StoreError::NotCommitted(Box::new(self))
        }
    }
}

type Completion = Box<dyn FnOnce(Result<(), BatchFailure>) + Send>;

/// What running a job left: what to do once the batch's fate is known,
/// whether the batch's transaction is still whole, and whether the job
/// found the disk full.
pub(super) struct Ran {
    completion: Completion,
    intact: bool,
    full: bool,
}

type Run = Box<dyn FnOnce(Result<(&Connection, &mut Kept), BatchFailure>) -> Ran + Send>;

/// A write job: runs inside the batch's transaction (or learns that the
/// transaction could not start).
pub(super) struct Job {
    run: Run,
    /// It reads and writes rows through `Kept` (an append); any other job
    /// sees the database only after what is kept has been written.
    keeps: bool,
}

/// Wraps `f` as a job for the writer, and gives the receiver of its answer.
pub(super) fn job<T, F>(f: F) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    keeping_job(move |conn, _| f(conn), false)
}

/// As `job`, for an append, which keeps its session's rows in `Kept`.
pub(super) fn append_job<T, F>(f: F) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection, &mut Kept) -> Result<T, StoreError> + Send + 'static,
{
    keeping_job(f, true)
}

fn keeping_job<T, F>(f: F, keeps: bool) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection, &mut Kept) -> Result<T, StoreError> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let run: Run = Box::new(move |tx_state| {
        let (result, intact) = match tx_state {
            Ok((conn, kept)) => in_savepoint(conn, |conn| f(conn, kept)),
            Err(e) => (Err(e.into_store_error()), true),
        };
        let full = matches!(result, Err(StoreError::Full(_)));
        Ran {
            full,
            completion: Box::new(move |batch| {
                let outcome = match (result, batch) {
                    // The job's own error explains more than the batch's.
                    (Err(e), _) => Err(e),
                    (Ok(value), Ok(())) => Ok(value),
                    (Ok(_), Err(e)) => Err(e.into_store_error()),
                };
                // The caller may have gone away; its work is committed anyway.
                let _ = tx.send(outcome);
            }),
            intact,
        }
    });
    (Job { run, keeps }, rx)
}

/// Runs `f` in a savepoint of the open transaction, undoing only its own
/// writes if it fails. Also says whether the transaction is still whole: an
/// I/O error, a full disk or a failed ROLLBACK TO can end it for the whole
/// batch, and then nothing of the batch may be committed.
fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> (Result<T, StoreError>, bool) {
    if let Err(e) = statement(conn, "SAVEPOINT job") {
        return (Err(e.into()), !conn.is_autocommit());
    }
    let result = f(conn);
    if result.is_err()
        && let Err(e) = statement(conn, "ROLLBACK TO job")
    {
        return (result.and(Err(e.into())), false);
    }
    if let Err(e) = statement(conn, "RELEASE job") {
        return (result.and(Err(e.into())), false);
    }
    (result, !conn.is_autocommit())
}

/// Runs one statement of the writer's own (transaction and savepoint
/// control), prepared once: `execute_batch` would parse it again each time.
fn statement(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// The writer thread: takes the first queued job, then whatever else has
/// queued up meanwhile, runs them all in one transaction and commits once.
/// A job that breaks the transaction (or panics) aborts the batch: it is
/// rolled back and every job in it is told so; the jobs still queued run in
/// the next batch.
pub(super) fn writer_loop(
    conn: Connection,
    mut jobs: mpsc::Receiver<Job>,
    policy: Arc<TailPolicy>,
) {
    let mut done: Vec<Completion> = Vec::with_capacity(MAX_BATCH);
    let mut kept = Kept::default();
    // The tail was indexed at open (mod.rs).
    let mut tail = Tail {
        owed: 0,
        since: Instant::now(),
    };
    while let Some(first) = jobs.blocking_recv() {
        if let Err(e) = statement(&conn, "BEGIN IMMEDIATE") {
            let e = BatchFailure::Begin(Arc::new(e));
            ((first.run)(Err(e.clone())).completion)(Err(e));
            continue;
        }
        // Holding the write lock now, so nobody else commits until this
        // batch ends.
        kept.forget_if_changed(&conn);
        let (mut intact, mut full) = run_job(&conn, &mut kept, first, &mut done);
        while intact && done.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => (intact, full) = run_job(&conn, &mut kept, job, &mut done),
                Err(_) => break,
            }
        }
        if intact && let Err(e) = kept.write(&conn) {
            (intact, full) = (false, super::is_full(&e));
        }
        let mut indexed = false;
        if intact && policy.due(tail.owed.saturating_add(kept.unindexed()), tail.since) {
            match fts::index_tail(&conn, None) {
                Ok(_) => indexed = true,
                Err(e) => (intact, full) = (false, matches!(e, StoreError::Full(_))),
            }
        }
        let outcome = if intact {
            statement(&conn, "COMMIT").map_err(|e| BatchFailure::Commit(Arc::new(e)))
        } else {
            Err(BatchFailure::Aborted { full })
        };
        let stored = kept.take_unindexed();
        match (&outcome, indexed) {
            (Ok(()), true) => {
                tail = Tail {
                    owed: 0,
                    since: Instant::now(),
                }
            }
            (Ok(()), false) => tail.owed = tail.owed.saturating_add(stored),
            (Err(_), _) => {}
        }
        policy.owed.store(tail.owed, Ordering::Relaxed);
        if outcome.is_err() {
            // What was kept was never committed.
            kept.forget();
            if !conn.is_autocommit() {
                // End what is left of the transaction so the next batch
                // starts clean. Nothing of this batch stays.
                let _ = statement(&conn, "ROLLBACK");
            }
        }
        for completion in done.drain(..) {
            completion(outcome.clone());
        }
    }
    // Every handle is gone: what is left of the tail is indexed now rather
    // than at the next open (a backfill run ends here).
    if tail.owed > 0 {
        let _ = index_tail_alone(&conn);
    }
}

/// Indexes the whole tail in a transaction of its own (at open, and when
/// the writer stops).
pub(super) fn index_tail_alone(conn: &Connection) -> Result<u64, StoreError> {
    statement(conn, "BEGIN IMMEDIATE")?;
    match fts::index_tail(conn, None) {
        Ok(n) => {
            statement(conn, "COMMIT")?;
            Ok(n)
        }
        Err(e) => {
            let _ = statement(conn, "ROLLBACK");
            Err(e)
        }
    }
}

/// Runs one job; says whether the batch's transaction is still whole, and
/// whether the job found the disk full. A job that does not keep rows
/// first has what is kept written and forgotten, so that it reads the
/// database as the appends before it left it.
fn run_job(
    conn: &Connection,
    kept: &mut Kept,
    job: Job,
    done: &mut Vec<Completion>,
) -> (bool, bool) {
    if !job.keeps {
        let written = kept.write(conn).map_err(StoreError::from);
        kept.forget();
        if let Err(e) = written {
            let full = matches!(e, StoreError::Full(_));
            let failure = BatchFailure::Aborted { full };
            done.push((job.run)(Err(failure)).completion);
            return (false, full);
        }
    }
    let run = job.run;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(Ok((conn, kept))))) {
        Ok(ran) => {
            done.push(ran.completion);
            (ran.intact, ran.full)
        }
        // The job's answer channel was dropped in the unwind, so its caller
        // hears the store failed; what it half-wrote must not be committed.
        Err(_) => (false, false),
    }
}

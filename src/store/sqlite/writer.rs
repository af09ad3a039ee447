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
//! The entries appends store are the search index's tail (fts.rs), which
//! the indexer thread indexes (indexer.rs): after each commit the writer
//! counts what its appends stored and wakes the indexer when a pass is
//! due; it never waits for it. Its transactions take the main file's
//! write lock alone (`TAKE_MAIN`): `BEGIN IMMEDIATE` would take the
//! search file's too and wait out each of the indexer's passes. A job
//! that writes the search file takes that lock first
//! (`fts::lock_for_writer`).

use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::indexer::{Asks, TailPolicy};
use super::kept::Kept;
use crate::store::StoreError;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 512;

/// Begins a batch's write transaction on the main file alone: a write
/// that changes nothing still takes the file's write lock.
const TAKE_MAIN: &str = "DELETE FROM main.search_owed WHERE 0";

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
    indexer: Arc<Asks>,
) {
    let mut done: Vec<Completion> = Vec::with_capacity(MAX_BATCH);
    let mut kept = Kept::default();
    while let Some(first) = jobs.blocking_recv() {
        if let Err(e) = begin(&conn) {
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
        let outcome = if intact {
            statement(&conn, "COMMIT").map_err(|e| BatchFailure::Commit(Arc::new(e)))
        } else {
            Err(BatchFailure::Aborted { full })
        };
        let stored = kept.take_unindexed();
        if outcome.is_ok() && policy.stored(stored) {
            indexer.wake();
        }
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
}

/// Begins a transaction holding the main file's write lock (`TAKE_MAIN`).
fn begin(conn: &Connection) -> rusqlite::Result<()> {
    statement(conn, "BEGIN")?;
    if let Err(e) = statement(conn, TAKE_MAIN) {
        let _ = statement(conn, "ROLLBACK");
        return Err(e);
    }
    Ok(())
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

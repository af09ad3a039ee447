//! The indexer: one thread with its own connection that builds the search
//! index just behind the writer, in the search file (fts.rs), so that
//! FTS5's work runs beside the appends instead of in the thread every
//! append waits for.
//!
//! It indexes the tail (fts.rs) of every tenant, in transactions of
//! `PASS_TEXTS` at most, once `TailPolicy`'s texts have been stored since
//! its last whole pass, or
//! its wait has passed with any stored; a tenant's alone when a search
//! asks (`Indexer::tenant`), answering once that is committed; and all
//! of it at start-up (what a killed process left) and when the store
//! closes. Each pass ends by asking the writer to copy the watermarks into
//! the main file and to forget the recaps it indexed (a job of its own,
//! not waited for: the copy only narrows where the next pass looks).
//!
//! Appends wait (`TailPolicy::admit`) while the texts stored and not yet
//! covered by a whole pass reach `BOUND_PASSES` times the policy's texts:
//! the tail never runs away, and the writer never waits for the indexer.
//!
//! The thread runs at the lowest priority the system gives a thread
//! (nice 19): it takes the processor the calls leave, so appends are not
//! slowed by the index, only held back at the bound (docs/benchmarks.md,
//! issue 38).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{Notify, mpsc, oneshot};

use super::fts::{self, Pass};
use super::writer::{Job, job};
use crate::store::StoreError;

/// Appends wait once this many times the policy's texts are owed.
const BOUND_PASSES: u64 = 2;
/// How long an append waits at the bound before it is refused as busy.
const ADMIT_WAIT: Duration = Duration::from_secs(10);
/// The most texts one transaction of a pass indexes: the default
/// `tail_texts`, where a text cost least (fts.rs); a writer job that wants
/// the search file has its turn between two of them.
const PASS_TEXTS: u64 = 20_000;
/// How soon a whole pass that failed (the search file busy) is tried again.
const RETRY: Duration = Duration::from_millis(200);
/// The longest the indexer holds back for writer jobs that want the search
/// file (one that cannot have it in this time is left to try again).
const WRITER_FIRST: Duration = Duration::from_secs(1);
/// How long the thread sleeps with nothing owed.
const IDLE: Duration = Duration::from_secs(3600);

/// When the indexer makes a whole pass: at `texts` texts stored since the
/// last one, or `wait` after it with any stored (`[search]` tail_texts,
/// tail_wait); and how far appends may run ahead of it.
#[derive(Debug)]
pub(crate) struct TailPolicy {
    texts: AtomicU64,
    wait_ms: AtomicU64,
    /// Texts stored (appended entries and recaps) since the store opened,
    /// counted after each commit.
    stored: AtomicU64,
    /// Of those, how many a whole pass has covered: every text counted
    /// before its last transaction began is in that one's snapshot.
    covered: AtomicU64,
    /// Appends waiting at the bound are woken after each whole pass.
    passed: Notify,
}

impl Default for TailPolicy {
    fn default() -> Self {
        let defaults = crate::config::SearchConfig::default();
        TailPolicy {
            texts: AtomicU64::new(defaults.tail_texts),
            wait_ms: AtomicU64::new(millis(defaults.tail_wait)),
            stored: AtomicU64::new(0),
            covered: AtomicU64::new(0),
            passed: Notify::new(),
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

    /// Texts stored and not yet covered by a whole pass: an upper bound of
    /// the tail (a search's pass of its tenant and an erasure are not
    /// subtracted until the next whole pass).
    pub(super) fn owed(&self) -> u64 {
        self.stored
            .load(Ordering::Acquire)
            .saturating_sub(self.covered.load(Ordering::Acquire))
    }

    /// Counts `n` texts committed; says whether a whole pass is due.
    pub(super) fn stored(&self, n: u64) -> bool {
        if n == 0 {
            return false;
        }
        self.stored.fetch_add(n, Ordering::AcqRel);
        self.owed() >= self.texts.load(Ordering::Relaxed)
    }

    fn bound(&self) -> u64 {
        self.texts
            .load(Ordering::Relaxed)
            .saturating_mul(BOUND_PASSES)
    }

    /// Waits while the owed texts are at the bound; refuses (`IndexBehind`)
    /// if no whole pass brings them under it within `ADMIT_WAIT`.
    pub(super) async fn admit(&self) -> Result<(), StoreError> {
        if self.owed() < self.bound() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + ADMIT_WAIT;
        loop {
            let passed = self.passed.notified();
            tokio::pin!(passed);
            // Registered before the check, so a pass ending in between
            // still wakes it.
            passed.as_mut().enable();
            if self.owed() < self.bound() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, passed).await.is_err() {
                return Err(StoreError::IndexBehind);
            }
        }
    }
}

/// What the indexer is asked to do.
#[derive(Default)]
struct Asked {
    /// Tenants whose tail a search waits for, with its answer.
    tenants: Vec<(String, oneshot::Sender<Result<(), StoreError>>)>,
    /// A whole pass is due (the writer counted the policy's texts).
    wake: bool,
    /// The store is gone: a last whole pass, then the thread ends.
    closed: bool,
}

/// The indexer's inbox, shared by the store, the writer and the thread.
#[derive(Default)]
pub(super) struct Asks {
    asked: Mutex<Asked>,
    ready: Condvar,
    /// Writer jobs waiting for the search file's lock: the indexer begins
    /// no transaction while there are any (`WRITER_FIRST` at most), so
    /// that they take it between two of its transactions without the
    /// writer ever waiting long in one.
    writer_waiting: AtomicUsize,
}

impl Asks {
    fn ask(&self, f: impl FnOnce(&mut Asked)) {
        f(&mut super::lock(&self.asked));
        self.ready.notify_one();
    }

    /// A whole pass is due.
    pub(super) fn wake(&self) {
        self.ask(|a| a.wake = true);
    }

    fn writer_wants(&self) -> WriterWants<'_> {
        self.writer_waiting.fetch_add(1, Ordering::AcqRel);
        WriterWants(self)
    }

    /// Waits, up to `WRITER_FIRST`, while writer jobs want the search file.
    fn let_writer_first(&self) {
        let began = Instant::now();
        while self.writer_waiting.load(Ordering::Acquire) > 0 && began.elapsed() < WRITER_FIRST {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A writer job's claim on the search file's next turn (`Asks::writer_wants`).
pub(super) struct WriterWants<'a>(&'a Asks);

impl Drop for WriterWants<'_> {
    fn drop(&mut self) {
        self.0.writer_waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The store's handle on the indexer thread; the thread makes a last pass
/// and ends when this is dropped.
pub(super) struct Indexer {
    asks: Arc<Asks>,
}

impl Drop for Indexer {
    fn drop(&mut self) {
        self.asks.ask(|a| a.closed = true);
    }
}

impl Indexer {
    /// Starts the thread on `conn` (the main file, with the search file
    /// attached), reporting its passes to the writer through `jobs` (so the
    /// writer outlives it, and takes its last pass's report).
    pub(super) fn start(
        conn: Connection,
        asks: Arc<Asks>,
        policy: Arc<TailPolicy>,
        jobs: mpsc::Sender<Job>,
    ) -> std::io::Result<Indexer> {
        let thread_asks = asks.clone();
        std::thread::Builder::new()
            .name("archivist-store-indexer".to_owned())
            .spawn(move || {
                lower_priority();
                run(&conn, &thread_asks, &policy, &jobs);
            })?;
        Ok(Indexer { asks })
    }

    /// A whole pass is due.
    pub(super) fn wake(&self) {
        self.asks.wake();
    }

    /// Says a writer job wants the search file until the guard is dropped.
    pub(super) fn writer_wants(&self) -> WriterWants<'_> {
        self.asks.writer_wants()
    }

    /// Indexes the tenant's tail; answers once it is committed.
    pub(super) async fn tenant(&self, tenant: &str) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.asks.ask(|a| a.tenants.push((tenant.to_owned(), tx)));
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// Gives the calling thread the lowest priority (Linux: nice is per thread).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions; setpriority on this thread's own
    // id changes nothing but its niceness, and a failure is only logged.
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) != 0 {
            tracing::debug!("the indexer thread keeps its priority");
        }
    }
}

/// The thread: a whole pass first, then each ask as it comes.
fn run(conn: &Connection, asks: &Asks, policy: &TailPolicy, jobs: &mpsc::Sender<Job>) {
    let mut since = Instant::now();
    let mut failed = match whole_pass(conn, asks, policy, jobs) {
        Ok(texts) => {
            if texts > 0 {
                tracing::info!(
                    texts,
                    "indexed for search what was stored and not yet indexed when the last run ended"
                );
            }
            false
        }
        Err(()) => true,
    };
    loop {
        let asked = {
            let mut asked = super::lock(&asks.asked);
            let wait = if failed {
                RETRY
            } else if policy.owed() > 0 {
                policy.wait().saturating_sub(since.elapsed())
            } else {
                IDLE
            };
            if asked.tenants.is_empty() && !asked.wake && !asked.closed {
                asked = asks
                    .ready
                    .wait_timeout(asked, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::take(&mut *asked)
        };
        serve(conn, asked.tenants, asks, jobs);
        let due = failed || (policy.owed() > 0 && since.elapsed() >= policy.wait());
        if asked.wake || asked.closed || due {
            failed = whole_pass(conn, asks, policy, jobs).is_err();
            since = Instant::now();
        }
        if asked.closed {
            return;
        }
    }
}

/// Indexes every tenant's tail; on success everything counted stored
/// before its last transaction began is covered. Appends waiting at the
/// bound are woken to look again either way.
fn whole_pass(
    conn: &Connection,
    asks: &Asks,
    policy: &TailPolicy,
    jobs: &mpsc::Sender<Job>,
) -> Result<u64, ()> {
    let done = pass(conn, None, asks, Some(policy), jobs);
    if let Ok((_, before)) = done {
        policy.covered.fetch_max(before, Ordering::AcqRel);
    }
    policy.passed.notify_waiters();
    done.map(|(texts, _)| texts).map_err(|e| {
        tracing::warn!(error = %e, "could not index the search index's tail; trying again shortly");
    })
}

/// One pass (of `tenant`, or of all), in transactions of `PASS_TEXTS`
/// entries at most; returns the texts it indexed, and what `policy`
/// counted stored when its last transaction began (each reads the main
/// file as it is then, so that one covers all of it).
fn pass(
    conn: &Connection,
    tenant: Option<&str>,
    asks: &Asks,
    policy: Option<&TailPolicy>,
    jobs: &mpsc::Sender<Job>,
) -> Result<(u64, u64), StoreError> {
    let mut texts = 0;
    loop {
        asks.let_writer_first();
        if !conn.is_autocommit() {
            // What a failed ROLLBACK left: every BEGIN would fail after it.
            conn.execute_batch("ROLLBACK")?;
        }
        let before = policy.map_or(0, |p| p.stored.load(Ordering::Acquire));
        conn.execute_batch("BEGIN")?;
        let done = fts::lock(conn)
            .and_then(|()| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    fts::index_tail(conn, tenant, PASS_TEXTS)
                }))
                .unwrap_or_else(|_| {
                    Err(StoreError::Corrupt(
                        "indexing the search index's tail panicked".to_owned(),
                    ))
                })
            })
            .and_then(|pass| {
                conn.execute_batch("COMMIT")?;
                Ok(pass)
            });
        let pass = match done {
            Ok(pass) => pass,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        };
        texts += pass.texts;
        let more = pass.more;
        report(pass, jobs);
        if !more {
            return Ok((texts, before));
        }
        if tenant.is_none() {
            // Searches waiting do not wait for the rest of a long pass (a
            // history owed after an upgrade).
            let waiting = std::mem::take(&mut super::lock(&asks.asked).tenants);
            serve(conn, waiting, asks, jobs);
        }
    }
}

/// Indexes each asking tenant's tail and answers it.
fn serve(
    conn: &Connection,
    tenants: Vec<(String, oneshot::Sender<Result<(), StoreError>>)>,
    asks: &Asks,
    jobs: &mpsc::Sender<Job>,
) {
    for (tenant, answer) in tenants {
        let result = pass(conn, Some(&tenant), asks, None, jobs).map(drop);
        let _ = answer.send(result);
    }
}

/// Asks the writer to copy the pass's watermarks into the main file and to
/// forget the recaps it indexed. Not waited for: left undone (the store
/// closing, a crash), the next pass finds those sessions and recaps again
/// and finds nothing left to index.
fn report(pass: Pass, jobs: &mpsc::Sender<Job>) {
    if pass.marks.is_empty() && pass.recaps.is_empty() {
        return;
    }
    let (note, _) = job(move |conn| {
        // created_at: a session erased since, whose id a new session took,
        // keeps its own copy.
        let mut copy = conn.prepare_cached(
            "UPDATE sessions SET indexed_seq = max(indexed_seq, ?2) \
             WHERE id = ?1 AND created_at = ?3",
        )?;
        for (session, created_at, seq) in pass.marks {
            copy.execute(rusqlite::params![session, seq, created_at])?;
        }
        let mut forget = conn.prepare_cached("DELETE FROM search_owed WHERE id = ?1")?;
        for owed in pass.recaps {
            forget.execute([owed])?;
        }
        Ok(())
    });
    let _ = jobs.blocking_send(note);
}

//! Checkpoints off the writer's path. SQLite's own automatic checkpoint
//! runs inside the COMMIT that takes the write-ahead log past 1,000 pages,
//! on the writer thread: two fsyncs (the log, then the database file) while
//! every append queued behind that commit waits; on this project's machine
//! that was 5 to 10 ms every few hundred commits, most of an append's p99.
//!
//! Instead, the writer's log hook asks a checkpoint thread, with its own
//! connection, for a PASSIVE checkpoint each time another
//! `BACKGROUND_PAGES` pages have been committed, and it copies them into
//! the database file while the writer goes on committing. SQLite starts the
//! log again from its beginning at the first write after a checkpoint has
//! copied all of it, which takes a moment with no commit in between; under
//! a load that never pauses the writer still checkpoints inline once the
//! log reaches `INLINE_PAGES` (as SQLite's automatic checkpoint does at
//! 1,000), so the log stays bounded, and by then there is little left to
//! copy.
//!
//! Nothing here changes what a commit promises: a checkpoint only copies
//! committed pages from the log into the database file, and syncs both as
//! SQLite's own does (the connection has the writer's `synchronous`).
//!
//! The same thread finishes erasures. An erasure records itself in
//! `erasures_pending`, in its own transaction, and its text leaves the
//! files only when a checkpoint has copied the whole log into the database
//! file (over the text's pages, zeroed by `secure_delete`) and truncated
//! the log to nothing. That needs no reader on an older snapshot (another
//! program's read transaction: a backup, an operator's shell) and no
//! writer at that moment, so the thread tries it without waiting on
//! either (its connection has no busy handler): a try that cannot finish
//! holds the writer's lock no longer than its copy takes, and the next try
//! comes shortly, backing off to once a second, until one finishes; then
//! it removes the records of the erasures it finished. A record outlives a
//! crash, so after a restart the first try comes at once. The search
//! index's file (fts.rs) has a log of its own, scrubbed the same way; each
//! file's log is emptied on its own, so the two need not be idle at once.

use std::ffi::c_int;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Duration;

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::watch;

use super::{BUSY_TIMEOUT, configure};
use crate::store::{Durability, StoreError};

/// The first wait before trying an unfinished scrub again; it doubles, up
/// to `SCRUB_RETRY_MAX`, while readers keep the log.
const SCRUB_RETRY_MIN: Duration = Duration::from_millis(20);
const SCRUB_RETRY_MAX: Duration = Duration::from_secs(1);
/// How long the thread sleeps with nothing asked and nothing to scrub.
const IDLE: Duration = Duration::from_secs(3600);

/// The checkpoint thread as the store sees it: what asks it to scrub, and
/// the newest erasure it has scrubbed from the files.
pub(super) struct Checkpoints {
    asks: SyncSender<()>,
    scrubbed: watch::Receiver<i64>,
}

impl Checkpoints {
    /// Asks for a scrub of the erasures recorded so far, without waiting.
    pub(super) fn ask(&self) {
        let _ = self.asks.try_send(());
    }

    /// Asks for a scrub of the erasures recorded so far, and waits until
    /// the one recorded as `erasure` is done, or `within` has passed;
    /// true when done.
    pub(super) async fn scrub(&self, erasure: i64, within: Duration) -> bool {
        let _ = self.asks.try_send(());
        let mut scrubbed = self.scrubbed.clone();
        tokio::time::timeout(within, scrubbed.wait_for(|done| *done >= erasure))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Pages committed to the log between two background checkpoints (SQLite's
/// default for its automatic one).
const BACKGROUND_PAGES: c_int = 1000;
/// The log's length (pages) past which the writer checkpoints inline, after
/// every commit, until the log starts again: about 40 MiB of 4 KiB pages.
const INLINE_PAGES: c_int = 10_000;

/// Opens the checkpoint thread's connection to the database at `path` and
/// starts it, and hooks the writer's commits to it.
pub(super) fn start(
    path: &Path,
    durability: Durability,
    writer: &mut Connection,
) -> Result<Checkpoints, StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_owned(),
        source: e.into(),
    };
    let conn =
        Connection::open_with_flags(path, OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE)
            .map_err(open_err)?;
    configure(&conn).map_err(open_err)?;
    // A scrub truncates the search file's log too (the writer made it).
    super::fts::attach(&conn, &super::search_path(path)).map_err(open_err)?;
    conn.pragma_update(None, "synchronous", durability.pragma())
        .map_err(open_err)?;
    // Never waits on the writer or a reader: see the module doc.
    conn.busy_timeout(Duration::ZERO).map_err(open_err)?;
    // One request waiting is enough: a checkpoint copies all there is.
    let (asks, asked) = sync_channel(1);
    let (done, scrubbed) = watch::channel(0);
    // Erasures recorded before a crash are scrubbed first.
    let pending = pending_erasures(&conn).map_err(open_err)?;
    std::thread::Builder::new()
        .name("archivist-store-checkpoint".to_owned())
        .spawn(move || checkpoint_loop(conn, asked, pending, done))
        .map_err(|source| StoreError::DataDir {
            path: path.to_owned(),
            source,
        })?;
    let mut hook = LogHook {
        asks: asks.clone(),
        asked_at: 0,
    };
    // Replaces SQLite's automatic checkpoint (itself a log hook).
    writer
        .wal_hook(Some(move |wal: &mut Wal, pages: c_int| {
            hook.committed(wal, pages);
            // The commit has happened whatever a checkpoint did: an error
            // here would make it look as if it had not.
            Ok(())
        }))
        .map_err(open_err)?;
    Ok(Checkpoints { asks, scrubbed })
}

/// The writer's side: asks for checkpoints as the log grows.
struct LogHook {
    asks: SyncSender<()>,
    /// The log's length when a checkpoint was last asked for.
    asked_at: c_int,
}

impl LogHook {
    /// Called after each commit with the log's length in pages.
    fn committed(&mut self, wal: &mut Wal, pages: c_int) {
        if wal.name() != c"main" {
            // The search file's log, which the writer rarely writes: the
            // indexer's connection checkpoints it as SQLite does.
            return;
        }
        if pages < self.asked_at {
            // The log started again from its beginning.
            self.asked_at = 0;
        }
        if pages >= INLINE_PAGES {
            // What SQLite's automatic checkpoint does at 1,000 pages; the
            // next commit tries again if this one could not finish.
            let _ = wal.checkpoint();
        }
        if pages - self.asked_at >= BACKGROUND_PAGES {
            // Full: a checkpoint is already asked for, and it copies these.
            let _ = self.asks.try_send(());
            self.asked_at = pages;
        }
    }
}

/// The checkpoint thread: a PASSIVE checkpoint each time it is asked, and
/// the scrub of recorded erasures while any are left, until the writer's
/// connection (and so its hook) and the store are gone. A checkpoint that
/// cannot run now (another one is running, a reader holds part of the log)
/// is simply left to the next.
fn checkpoint_loop(
    conn: Connection,
    asked: Receiver<()>,
    mut pending: bool,
    done: watch::Sender<i64>,
) {
    let mut retry = SCRUB_RETRY_MIN;
    let mut reached = Reached::default();
    loop {
        let wait = if pending { retry } else { IDLE };
        let woken = match asked.recv_timeout(wait) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if woken {
            // An erasure may have been recorded: look, and try at once.
            retry = SCRUB_RETRY_MIN;
        }
        match scrub(&conn, &mut reached) {
            Ok(Scrub::Done { upto }) => {
                pending = false;
                if let Some(upto) = upto {
                    done.send_replace(upto);
                    tracing::info!("erased text is gone from the database files");
                }
            }
            Ok(Scrub::Held) => {
                pending = true;
                retry = (retry * 2).min(SCRUB_RETRY_MAX);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot scrub erased text from the log yet");
                pending = true;
                retry = (retry * 2).min(SCRUB_RETRY_MAX);
            }
        }
    }
}

/// Whether erasures are recorded that no checkpoint has finished.
fn pending_erasures(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row("SELECT EXISTS (SELECT 1 FROM erasures_pending)", [], |r| {
        r.get(0)
    })
}

/// What a scrub did.
enum Scrub {
    /// The log is empty and the records up to `upto` (None: there were
    /// none) are removed.
    Done { upto: Option<i64> },
    /// A reader or the writer holds the log: try again later.
    Held,
}

/// The newest erasure record whose text each file's log no longer holds.
#[derive(Default)]
struct Reached {
    main: Option<i64>,
    search: Option<i64>,
}

/// With erasures recorded, copies each file's whole log into it and
/// truncates it, without waiting on anyone, then, once both have been
/// since the newest record, removes the records: their text is gone from
/// the files. With none, a PASSIVE checkpoint of the main file.
fn scrub(conn: &Connection, done: &mut Reached) -> rusqlite::Result<Scrub> {
    let upto: Option<i64> =
        conn.query_row("SELECT max(id) FROM erasures_pending", [], |r| r.get(0))?;
    if upto.is_none() {
        if let Err(e) = conn.wal_checkpoint_v2(Some(c"main"), CheckpointMode::PASSIVE) {
            tracing::debug!(error = %e, "a background checkpoint did not run");
        }
        return Ok(Scrub::Done { upto: None });
    }
    // Each file's log on its own: both need not be idle at one moment. A
    // file's log emptied after the erasures up to `upto` were recorded
    // holds none of their text (it was deleted before), whatever comes
    // after; what each file has reached is kept between tries.
    for (schema, reached) in [("main", &mut done.main), ("search", &mut done.search)] {
        if reached.is_some_and(|r| Some(r) >= upto) {
            continue;
        }
        let busy: i64 = conn.query_row(
            &format!("PRAGMA {schema}.wal_checkpoint(TRUNCATE)"),
            [],
            |r| r.get(0),
        )?;
        if busy == 0 {
            *reached = upto;
        }
    }
    if done.main < upto || done.search < upto {
        return Ok(Scrub::Held);
    }
    if let Some(upto) = upto {
        // A small write beside the writer: here waiting a moment is fine.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let removed = conn.execute("DELETE FROM erasures_pending WHERE id <= ?1", [upto]);
        conn.busy_timeout(Duration::ZERO)?;
        removed?;
    }
    Ok(Scrub::Done { upto })
}

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

use std::ffi::c_int;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};

use super::configure;
use crate::store::{Durability, StoreError};

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
) -> Result<(), StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_owned(),
        source: e.into(),
    };
    let conn =
        Connection::open_with_flags(path, OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE)
            .map_err(open_err)?;
    configure(&conn).map_err(open_err)?;
    conn.pragma_update(None, "synchronous", durability.pragma())
        .map_err(open_err)?;
    // One request waiting is enough: a checkpoint copies all there is.
    let (asks, asked) = sync_channel(1);
    std::thread::Builder::new()
        .name("archivist-store-checkpoint".to_owned())
        .spawn(move || checkpoint_loop(conn, asked))
        .map_err(|source| StoreError::DataDir {
            path: path.to_owned(),
            source,
        })?;
    let mut hook = LogHook { asks, asked_at: 0 };
    // Replaces SQLite's automatic checkpoint (itself a log hook).
    writer
        .wal_hook(Some(move |wal: &mut Wal, pages: c_int| {
            hook.committed(wal, pages);
            // The commit has happened whatever a checkpoint did: an error
            // here would make it look as if it had not.
            Ok(())
        }))
        .map_err(open_err)?;
    Ok(())
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

/// The checkpoint thread: a PASSIVE checkpoint each time it is asked, until
/// the writer's connection (and so its hook) is gone. A checkpoint that
/// cannot run now (another one is running, a reader holds part of the log)
/// is simply left to the next.
fn checkpoint_loop(conn: Connection, asked: Receiver<()>) {
    while asked.recv().is_ok() {
        if let Err(e) = conn.wal_checkpoint_v2(Some(c"main"), CheckpointMode::PASSIVE) {
            tracing::debug!(error = %e, "a background checkpoint did not run");
        }
    }
}

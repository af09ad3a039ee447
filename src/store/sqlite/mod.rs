//! The SQLite backend, in WAL mode: the embedded default.
//!
//! Writes go to one writer thread (`writer.rs`, group commit); reads run on
//! a small pool of read-only connections on tokio's blocking threads, so no
//! SQLite call ever runs on an async thread. The queries live beside what
//! they serve: `sessions.rs` (appends, closing, the session listing),
//! `segments.rs` (reads, listings, the backlog, requeues), `entries.rs`
//! (the transcript, paged), `claims.rs`
//! (claims and the results written under them), `runs.rs` (the provider
//! each kind of run last used); `rows.rs` decodes rows and `schema.rs`
//! migrates. A serving process claims the data directory (a lock on the
//! directory, `claim_for_serving`), so one SQLite store has one server.
//!
//! Durability: WAL, by default with `synchronous = NORMAL`. A committed
//! transaction is in the WAL file before its caller is answered, so it
//! survives the process being killed (kill -9); only an operating-system
//! crash or power loss can lose the last commits. `Durability::Power`
//! (`storage.durability = "power"`) prevents that with an fsync per commit,
//! shared by every write of a group commit. Checkpoints (copying the WAL
//! into the database file) run on a thread of their own
//! (`checkpoint.rs`), not in the writer's commits.

mod checkpoint;
mod claims;
mod embeddings;
mod entries;
mod fts;
mod generations;
mod index;
mod indexer;
mod kept;
mod rows;
mod runs;
mod schema;
mod search;
mod segments;
mod sessions;
mod vectors;
mod writer;

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::mpsc;

use super::{Durability, FullSeen, OpenMode, StoreError};
use indexer::{Asks, Indexer, TailPolicy};
use kept::Kept;
use writer::{Job, append_job, job, writer_loop};

/// Jobs waiting for the writer before callers wait to enqueue.
const QUEUE_DEPTH: usize = 4096;
/// Idle read connections kept open.
const MAX_IDLE_READERS: usize = 8;
/// How long a statement waits on a lock held by another process (a backfill
/// run beside the server) before failing with SQLITE_BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an erasure's checkpoint is tried before the call says the
/// text is still in the WAL (50 tries, 20 ms apart).
const CHECKPOINT_TRIES: usize = 50;
/// How long an erasure waits for its text to leave the files before it
/// answers ERASURE_PENDING (the scrub then finishes in the background).
const ERASURE_WAIT: Duration = Duration::from_secs(1);
/// The database file inside the data directory.
const DATABASE_FILE: &str = "archivist.sqlite3";
/// The file inside the data directory naming the process that serves it
/// (the lock is on the directory itself).
const SERVING_FILE: &str = "archivist.serving";

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        if is_full(&e) {
            StoreError::Full(Box::new(e))
        } else {
            StoreError::Query(Box::new(e))
        }
    }
}

/// SQLITE_FULL: the disk (or the database's size limit) has no room.
pub(super) fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::Power => "FULL",
        }
    }
}

/// A handle on the SQLite database; cheap to clone.
#[derive(Clone)]
pub(super) struct Sqlite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// None when opened read-only: every write fails with `ReadOnly`.
    jobs: Option<mpsc::Sender<Job>>,
    readers: Mutex<Vec<Connection>>,
    /// A write failed for want of room since the last health probe.
    full_seen: FullSeen,
    /// The checkpoint thread, which scrubs erasures (None read-only).
    checkpoints: Option<checkpoint::Checkpoints>,
    /// The semantic leg's vectors in memory (vectors.rs).
    vectors: vectors::Vectors,
    /// When the indexer indexes the search index's tail (indexer.rs).
    tail: Arc<TailPolicy>,
    /// The indexer thread (None read-only).
    indexer: Option<Indexer>,
}

impl Sqlite {
    /// Opens the database in `data_dir` as `mode` says: creating it as
    /// needed or requiring it, migrating it to the current schema and
    /// starting the writer thread, or (read-only) only checking that its
    /// schema is the current one.
    pub(super) async fn open(
        data_dir: &Path,
        durability: Durability,
        mode: OpenMode,
    ) -> Result<Sqlite, StoreError> {
        let data_dir = data_dir.to_owned();
        let store =
            tokio::task::spawn_blocking(move || Sqlite::open_blocking(&data_dir, durability, mode))
                .await
                .map_err(StoreError::Worker)??;
        if store.inner.jobs.is_some() {
            store.resume_erasures().await?;
        }
        Ok(store)
    }

    /// The schema version this build migrates SQLite databases to.
    pub(super) fn schema_version() -> i64 {
        i64::try_from(schema::MIGRATIONS.len()).unwrap_or(i64::MAX)
    }

    /// The database file of `data_dir`.
    pub(super) fn database_path(data_dir: &Path) -> PathBuf {
        data_dir.join(DATABASE_FILE)
    }

    fn open_blocking(
        data_dir: &Path,
        durability: Durability,
        mode: OpenMode,
    ) -> Result<Sqlite, StoreError> {
        let path = Sqlite::database_path(data_dir);
        match mode {
            OpenMode::Create => create_data_dir(data_dir)?,
            OpenMode::Existing | OpenMode::ReadOnly => {
                if let Some(e) = not_a_directory(data_dir) {
                    return Err(e);
                }
                if !path.is_file() {
                    // Named as an operator would look for it, from the root.
                    let path = std::path::absolute(&path).unwrap_or(path);
                    return Err(StoreError::NoDatabase { path });
                }
            }
        }
        if mode == OpenMode::ReadOnly {
            let reader = open_reader(&path)?;
            schema::check_current(&reader)?;
            return Ok(Sqlite {
                inner: Arc::new(Inner {
                    path,
                    jobs: None,
                    readers: Mutex::new(vec![reader]),
                    full_seen: FullSeen::default(),
                    checkpoints: None,
                    vectors: vectors::Vectors::default(),
                    tail: Arc::default(),
                    indexer: None,
                }),
            });
        }
        let flags = match mode {
            OpenMode::Create => OpenFlags::default(),
            // Never create the file: it was there a moment ago, and if it
            // has gone since, that is an error too.
            OpenMode::Existing | OpenMode::ReadOnly => {
                OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE
            }
        };
        // The search file is made as needed whatever the mode: a data
        // directory from before it has none, and one whose file was lost
        // has it made again and filled (fts::prepare).
        let search = search_path(&path);
        if !search.is_file() {
            Connection::open(&search).map_err(|e| StoreError::Open {
                path: search.clone(),
                source: e.into(),
            })?;
        }
        let mut writer = open_writing(&path, flags, durability)?;
        schema::migrate(&mut writer)?;
        fts::prepare(&writer)?;
        fts::tune_all(&writer)?;
        let checkpoints = checkpoint::start(&path, durability, &mut writer)?;
        let (jobs, rx) = mpsc::channel(QUEUE_DEPTH);
        let tail = Arc::new(TailPolicy::default());
        let asks = Arc::new(Asks::default());
        let spawn_err = |source| StoreError::DataDir {
            path: data_dir.to_owned(),
            source,
        };
        let (policy, wake) = (tail.clone(), asks.clone());
        std::thread::Builder::new()
            .name("archivist-store-writer".to_owned())
            .spawn(move || writer_loop(writer, rx, policy, wake))
            .map_err(spawn_err)?;
        // Its own connection: it writes the search file only, beside the
        // writer. What a killed process left unindexed (the tail) is its
        // first pass.
        let indexing = open_writing(
            &path,
            OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE,
            durability,
        )?;
        let indexer = Indexer::start(indexing, asks.clone(), tail.clone(), jobs.clone())
            .map_err(spawn_err)?;
        Ok(Sqlite {
            inner: Arc::new(Inner {
                path,
                jobs: Some(jobs),
                readers: Mutex::new(Vec::new()),
                full_seen: FullSeen::default(),
                checkpoints: Some(checkpoints),
                vectors: vectors::Vectors::default(),
                tail,
                indexer: Some(indexer),
            }),
        })
    }

    /// When the indexer indexes the search index's tail (`[search]`
    /// tail_texts and tail_wait).
    pub(super) fn set_tail_policy(&self, texts: u64, wait: Duration) {
        self.inner.tail.set(texts, wait);
    }

    /// Counts `n` texts owed to the index by a commit (a recap); wakes the
    /// indexer if a pass is due.
    fn owe_index(&self, n: u64) {
        if self.inner.tail.stored(n)
            && let Some(indexer) = &self.inner.indexer
        {
            indexer.wake();
        }
    }

    /// Has the indexer index the tenant's tail (fts.rs), if it has one:
    /// what a search runs first, so that it finds every entry acknowledged
    /// before it began. Read-only, there is no indexer: the search reads
    /// what is indexed (a server indexes the tail when it opens).
    pub(super) async fn index_tail_of(&self, tenant: &str) -> Result<(), StoreError> {
        let Some(indexer) = &self.inner.indexer else {
            return Ok(());
        };
        let t = tenant.to_owned();
        if self.read(move |conn| fts::tail_exists(conn, &t)).await? {
            indexer.tenant(tenant).await?;
        }
        Ok(())
    }

    /// Runs `f` in the writer's next transaction; answers after it commits.
    /// Waits for room in the writer's queue.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let jobs = self.inner.jobs.as_ref().ok_or(StoreError::ReadOnly)?;
        let (job, answer) = job(f);
        jobs.send(job).await.map_err(|_| StoreError::Closed)?;
        self.noting_full(answer.await.map_err(|_| StoreError::Closed)?)
    }

    /// `write` for a job that writes the search file (fts::lock_for_writer):
    /// tried again, backing off, while another connection holds that file,
    /// for up to `patience`.
    async fn write_search<T, F>(&self, patience: Duration, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Clone + Send + 'static,
    {
        let began = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(5);
        // The indexer begins no transaction meanwhile (indexer.rs).
        let _wants = self.inner.indexer.as_ref().map(Indexer::writer_wants);
        loop {
            match self.write(f.clone()).await {
                Err(e) if fts::locked(&e) && began.elapsed() < patience => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                done => return done,
            }
        }
    }

    /// Passes a write's result on, remembering a full disk for the probe.
    fn noting_full<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        self.inner.full_seen.note(result)
    }

    /// Whether a write failed for want of room since the last call.
    fn take_full_seen(&self) -> bool {
        self.inner.full_seen.take()
    }

    /// As `write` for an append (which keeps its session's rows in the
    /// writer's memory: `kept.rs`), but refuses with `Busy` instead of
    /// waiting when the writer's queue is full: callers' writes shed load,
    /// workers' wait.
    async fn append_or_busy<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut Kept) -> Result<T, StoreError> + Send + 'static,
    {
        let jobs = self.inner.jobs.as_ref().ok_or(StoreError::ReadOnly)?;
        // Held back while the index's tail is at its bound (indexer.rs).
        self.inner.tail.admit().await?;
        let (job, answer) = append_job(f);
        jobs.try_send(job).map_err(super::refused)?;
        self.noting_full(answer.await.map_err(|_| StoreError::Closed)?)
    }

    /// Waits, up to `ERASURE_WAIT`, for the erasure recorded as `scrub` to
    /// leave the files; past that it is `CheckpointBusy` (ERASURE_PENDING):
    /// the erasure is committed and recorded, and the checkpoint thread
    /// finishes it as soon as readers allow, holding no writer meanwhile.
    pub(super) async fn scrubbed(&self, scrub: i64) -> Result<(), StoreError> {
        let Some(checkpoints) = &self.inner.checkpoints else {
            return Ok(());
        };
        if checkpoints.scrub(scrub, ERASURE_WAIT).await {
            Ok(())
        } else {
            tracing::warn!(
                "an erasure is committed but its text is still in the write-ahead log: another program holds a read of the database; it leaves the files as soon as that read ends"
            );
            Err(StoreError::CheckpointBusy)
        }
    }

    /// Copies every committed page from the WAL into the database file and
    /// empties the WAL (`TRUNCATE`), so that what was overwritten or erased
    /// is in neither file. Retries while readers or a batch hold it up.
    pub(super) async fn checkpoint(&self) -> Result<(), StoreError> {
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = Connection::open(&path).map_err(|e| StoreError::Open {
                path: path.clone(),
                source: e.into(),
            })?;
            configure(&conn)?;
            attach_if_made(&conn, &path)?;
            for _ in 0..CHECKPOINT_TRIES {
                let busy: i64 =
                    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
                if busy == 0 {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(StoreError::CheckpointBusy)
        })
        .await
        .map_err(StoreError::Worker)?
    }

    /// Runs `f` on a read connection, in one read transaction (a consistent
    /// snapshot), on a blocking thread.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.read_mut(move |conn| f(conn)).await
    }

    /// `read`, with the connection to set handlers on (search's work bound).
    async fn read_mut<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = lock(&inner.readers).pop();
            let mut conn = match pooled {
                Some(c) => c,
                None => open_reader(&inner.path)?,
            };
            conn.execute_batch("BEGIN")?;
            let result = f(&mut conn);
            let end = conn.execute_batch("COMMIT");
            let mut readers = lock(&inner.readers);
            if end.is_ok() && readers.len() < MAX_IDLE_READERS {
                readers.push(conn);
            }
            drop(readers);
            let value = result?;
            end?;
            Ok(value)
        })
        .await
        .map_err(StoreError::Worker)?
    }
}

/// Creates `data_dir` and its parents as needed.
fn create_data_dir(data_dir: &Path) -> Result<(), StoreError> {
    if let Some(e) = not_a_directory(data_dir) {
        return Err(e);
    }
    std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
        path: data_dir.to_owned(),
        source,
    })
}

/// Something other than a directory at `data_dir` (a file, a dangling
/// link), named as such rather than as "File exists" or as a missing
/// database inside it.
fn not_a_directory(data_dir: &Path) -> Option<StoreError> {
    let there = std::fs::symlink_metadata(data_dir).is_ok();
    (there && !data_dir.is_dir()).then(|| StoreError::DataDir {
        path: data_dir.to_owned(),
        source: std::io::Error::other("something other than a directory is at that path"),
    })
}

/// A data directory claimed by this process's server: the directory
/// itself is locked (flock) for as long as this value lives, and the
/// operating system drops the lock when the process ends, however it ends.
/// Beside it, `archivist.serving` holds the process id, for the message a
/// second server gives; the lock, not that file, decides.
pub(crate) struct ServingClaim {
    /// Removed (best effort) when the claim ends, before the lock goes.
    pid_file: PathBuf,
    _locked: File,
}

impl Drop for ServingClaim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Claims `data_dir` (created as needed) for this process's server, or
/// says which process serves it already.
pub(super) fn claim_for_serving(data_dir: &Path) -> Result<ServingClaim, StoreError> {
    create_data_dir(data_dir)?;
    let serving_err = |path: &Path, source| StoreError::Serving {
        path: path.to_owned(),
        source,
    };
    // The directory, not a file in it: a lock file can be deleted (or
    // replaced by a link) under a running server, the directory it serves
    // from cannot without the operator meaning it.
    let locked = File::open(data_dir).map_err(|e| serving_err(data_dir, e))?;
    let pid_file = data_dir.join(SERVING_FILE);
    match locked.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(StoreError::ServedElsewhere {
                dir: std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned()),
                holder: serving_pid(&pid_file),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(serving_err(data_dir, e)),
    }
    // Written aside and renamed into place: a reader sees the whole id or
    // none, and a link planted at either name is replaced, never followed.
    let aside = data_dir.join(format!("{SERVING_FILE}.new"));
    match std::fs::remove_file(&aside) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serving_err(&aside, e)),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&aside)
        .and_then(|mut f| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .and_then(|()| std::fs::rename(&aside, &pid_file))
        .map_err(|e| serving_err(&pid_file, e))?;
    Ok(ServingClaim {
        pid_file,
        _locked: locked,
    })
}

/// The process id a serving process wrote, if the file holds one (it is
/// only read when it is a plain file).
fn serving_pid(pid_file: &Path) -> Option<u32> {
    let plain = std::fs::symlink_metadata(pid_file).ok()?.is_file();
    if !plain {
        return None;
    }
    let mut text = String::new();
    File::open(pid_file)
        .ok()?
        .take(32)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the pool lock leaves a Vec that is
    // still perfectly usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Open {
        path: path.to_owned(),
        source: e.into(),
    })?;
    configure(&conn)?;
    attach_if_made(&conn, path)?;
    Ok(conn)
}

/// The search file beside the main file at `path`.
fn search_path(path: &Path) -> PathBuf {
    path.with_file_name(fts::FILE)
}

/// Attaches the search file beside the main file at `path`, if it is
/// there (a read-only open of a directory from before it has none).
fn attach_if_made(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let search = search_path(path);
    if search.is_file() {
        fts::attach(conn, &search).map_err(|e| StoreError::Open {
            path: search,
            source: e.into(),
        })?;
    }
    Ok(())
}

/// A connection that writes (the writer's, the indexer's): the main file
/// at `path` opened with `flags`, the search file attached, both set up
/// by `writing`.
fn open_writing(
    path: &Path,
    flags: OpenFlags,
    durability: Durability,
) -> Result<Connection, StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_owned(),
        source: e.into(),
    };
    let conn = Connection::open_with_flags(path, flags).map_err(open_err)?;
    configure(&conn).map_err(open_err)?;
    fts::attach(&conn, &search_path(path)).map_err(open_err)?;
    writing(&conn, path, durability)?;
    Ok(conn)
}

/// A writing connection's settings, for both files: `durability`'s sync,
/// the log, deleted content overwritten (an erased session's text must
/// leave the files, with a checkpoint of the log), and sorts in memory
/// (indexing in document order may sort texts; an erased text is never in
/// a temporary file). An error names the file it is about (the main file at `path`, or the
/// search file beside it: one holding something else is "not a database").
///
/// The search file syncs every commit (`FULL`) whatever the durability:
/// what the main file says after it (an erasure's second step, a
/// watermark's copy, a recap forgotten) must not reach the disk before
/// it, and the main file's log is synced at its checkpoints. Its commits
/// are few (the indexer's passes, an erasure's first steps).
fn writing(conn: &Connection, path: &Path, durability: Durability) -> Result<(), StoreError> {
    for (schema, file, sync) in [
        ("main", path.to_owned(), durability.pragma()),
        ("search", search_path(path), Durability::Power.pragma()),
    ] {
        let set = || -> rusqlite::Result<()> {
            conn.pragma_update(Some(schema), "synchronous", sync)?;
            conn.pragma_update(Some(schema), "secure_delete", "ON")?;
            conn.pragma_update(Some(schema), "journal_mode", "WAL")
        };
        set().map_err(|e| StoreError::Open {
            path: file,
            source: e.into(),
        })?;
    }
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

#[cfg(test)]
mod tests;

//! The store: sessions, entries, segments, summaries and claims, behind one
//! backend-neutral interface. Only the backends under this folder see SQL;
//! callers see domain types and `StoreError`, which names no backend's types.
//!
//! - `sqlite/`: the embedded default (rusqlite, WAL, group commit).
//! - `postgres/`: the database that several replicas share (tokio-postgres
//!   and a pool, group commit, `SKIP LOCKED` claims, LISTEN/NOTIFY).
//! - `context.rs`: the budget rule of GetContext, shared by every backend.
//! - `bound.rs`: a search's deadline, and whether one stopped there was too
//!   costly or waited too long.
//! - `tests.rs`: one suite of behaviour every backend must pass.

mod bound;
mod context;
mod postgres;
mod sqlite;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::failure::Failure;
use crate::model::{
    AppendOutcome, Backlog, Context, Disposition, Entry, Millis, NewEntry, ProviderIdentity,
    Segment, SegmentId, SegmentPolicy, SegmentState, SessionInfo, SessionName, Subject, Summary,
    Tenant,
};

/// A backend's own error, kept as the source of a `StoreError` so the cause
/// chain shows it without the interface naming its type.
pub(crate) type BackendError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session {0:?} not found")]
    SessionNotFound(String),
    #[error("segment {0} not found")]
    SegmentNotFound(SegmentId),
    /// Not even the session's newest entry fits the context budget.
    #[error(
        "max_tokens is too small for the session's newest entry: the smallest budget that returns anything is {needed} tokens"
    )]
    BudgetTooSmall { needed: u32 },
    #[error("cannot open the database at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: BackendError,
    },
    #[error("cannot use the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("database migration to version {version} failed")]
    Migration {
        version: usize,
        #[source]
        source: BackendError,
    },
    #[error("the database is at schema version {found}, newer than this build knows ({known})")]
    TooNew { found: i64, known: usize },
    #[error(
        "the database is at schema version {found} and this build needs {known}: run `archivist migrate` (or start the server, or a backfill that is not a dry run) once to migrate it"
    )]
    NeedsMigration { found: i64, known: usize },
    #[error("there is no database at {path}")]
    NoDatabase { path: PathBuf },
    #[error(
        "another `archivist serve`{} is serving the data directory {}: stop it first, or give this server a data directory of its own (several servers share one store on PostgreSQL)",
        .holder.map(|pid| format!(" (process {pid})")).unwrap_or_default(),
        .dir.display()
    )]
    ServedElsewhere { dir: PathBuf, holder: Option<u32> },
    #[error("cannot mark the data directory as served by this process ({path})")]
    Serving {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the store was opened read-only")]
    ReadOnly,
    #[error("no database is open")]
    Detached,
    #[error(
        "entries[{index}]: client_entry_id {client_entry_id:?} already names entry {seq} of session {session:?}, with other content; nothing of this call was stored"
    )]
    ClientEntryIdReused {
        session: String,
        client_entry_id: String,
        /// The entry's position in the call.
        index: usize,
        /// The seq of the entry stored under that id.
        seq: u64,
    },
    #[error(
        "session {session:?} is {}; this call names subject {requested:?}; nothing of this call was stored",
        .subject.as_ref().map_or("of no subject".to_owned(), |s| format!("subject {s:?}'s"))
    )]
    SubjectMismatch {
        session: String,
        /// The session's subject, fixed when it was created.
        subject: Option<String>,
        requested: String,
    },
    /// An entry said before the session's newest (or before the one ahead
    /// of it in the call).
    #[error(
        "entries[{index}].occurred_at is before the session's newest entry, said at {}; nothing of this call was stored",
        humantime::format_rfc3339_millis(.newest.as_system_time())
    )]
    OccurredOutOfOrder {
        /// The entry's position in the call.
        index: usize,
        newest: Millis,
    },
    #[error("entries[{index}] cannot be stored: {reason}; nothing of this call was stored")]
    Unstorable {
        /// The entry's position in the call.
        index: usize,
        reason: &'static str,
    },
    #[error("database query failed")]
    Query(#[source] BackendError),
    #[error("the write was not committed")]
    NotCommitted(#[source] BackendError),
    #[error("the store's write queue is full")]
    Busy,
    /// SQLite: appends wait while the search index's tail is at its bound,
    /// and this one waited its longest.
    #[error(
        "the search index is behind the appends (twice search.tail_texts texts wait for it, and none were indexed while this append waited); retry shortly"
    )]
    IndexBehind,
    #[error(
        "every database connection for reads stayed busy while this read waited; try again shortly"
    )]
    ReadsBusy,
    #[error("the disk holding the database is full")]
    Full(#[source] BackendError),
    #[error("{} would store {wanted} bytes, over its cap of {limit}", tenant_label(.tenant))]
    TenantFull {
        tenant: String,
        wanted: u64,
        limit: u64,
    },
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the store is shut down")]
    Closed,
    /// The database server cannot be reached now (a lost connection, a
    /// refused one, a pool that found none in time): a retry may work.
    #[error("the database cannot be reached")]
    Unreachable(#[source] BackendError),
    #[error("cannot connect to the database at {target}")]
    Connect {
        /// Where, with any password left out.
        target: String,
        #[source]
        source: BackendError,
    },
    #[error(
        "the session is erased, but the database is too busy to empty its write-ahead log now; \
         the erased text leaves the files at the next checkpoint"
    )]
    CheckpointBusy,
    #[error(transparent)]
    Shared(Arc<StoreError>),
    /// One search statement took more than the work bound of a query.
    #[error(
        "the search took more work than one query may; narrow it (fewer words, a scope, levels)"
    )]
    SearchTooCostly,
    /// A search stopped at its deadline having spent most of its budget
    /// waiting (for a read connection, or the CPU), not working.
    #[error(
        "the server was too busy to finish this search within its budget of {} ms (search.budget): most of it went on waiting for a database connection or the CPU, not on the search; retry shortly", budget.as_millis()
    )]
    SearchBusy { budget: Duration },
    /// Embeddings are on, and the PostgreSQL database has no `vector`
    /// extension, nor could it be created (the cause says why, when a
    /// CREATE EXTENSION was tried).
    #[error(
        "embeddings are on ([embedding] kind = \"openai\") but the PostgreSQL database at {target} has no `vector` extension (pgvector), and it could not be created: install pgvector on the database server and run CREATE EXTENSION vector in this database as a role allowed to, or set embedding.kind = \"none\""
    )]
    VectorsMissing {
        /// Where, with any password left out.
        target: String,
        #[source]
        source: Option<BackendError>,
    },
    #[error("a database worker thread failed")]
    Worker(#[source] tokio::task::JoinError),
}

/// The most bytes a segment takes in an answer, near enough: its texts (the
/// session name, the summary, the last failure's causes) and a fixed share
/// for ids, counts, states and timestamps. Reads stop at a number of these
/// bytes, so what one call holds follows what it can answer.
pub(crate) fn segment_bytes(segment: &Segment) -> usize {
    const FIXED: usize = 256;
    let summary = segment.summary.as_ref().map_or(0, |s| {
        s.text.len() + s.provider.len() + s.model.len() + s.prompt_version.len()
    });
    let failure = segment.last_failure.as_ref().map_or(0, |f| {
        f.causes.iter().map(String::len).sum::<usize>() + f.provider.len() + f.model.len()
    });
    FIXED + segment.session.len() + summary + failure
}

/// When an entry of an append was said: its own time, which may not be
/// before the session's `newest`, or else `now` (never before `newest`, so
/// a live entry after an imported one a little ahead of this clock keeps
/// the order). Both backends' appends decide it here.
pub(crate) fn occurred(
    index: usize,
    given: Option<Millis>,
    newest: Option<Millis>,
    now: Millis,
) -> Result<Millis, StoreError> {
    match (given, newest) {
        (Some(at), Some(newest)) if at < newest => {
            Err(StoreError::OccurredOutOfOrder { index, newest })
        }
        (Some(at), _) => Ok(at),
        (None, newest) => Ok(newest.map_or(now, |n| n.max(now))),
    }
}

/// The bytes of an entry's texts that a tenant's cap counts.
pub(crate) fn stored_bytes(entry: &NewEntry) -> u64 {
    let metadata: usize = entry.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    (entry.content.len()
        + entry.client_entry_id.as_ref().map_or(0, String::len)
        + entry.name.as_ref().map_or(0, String::len)
        + metadata) as u64
}

/// An entry's metadata as both backends keep it: a JSON object of strings,
/// absent when empty.
pub(crate) fn encode_metadata(metadata: &crate::model::Metadata) -> Option<String> {
    (!metadata.is_empty())
        .then(|| serde_json::to_string(metadata).unwrap_or_else(|_| "{}".to_owned()))
}

/// Reads back what `encode_metadata` wrote.
pub(crate) fn decode_metadata(json: Option<&str>) -> Result<crate::model::Metadata, StoreError> {
    match json {
        None => Ok(crate::model::Metadata::new()),
        Some(json) => serde_json::from_str(json)
            .map_err(|e| StoreError::Corrupt(format!("entry metadata: {e}"))),
    }
}

/// The most bytes an entry takes in an answer, near enough: its texts and
/// a fixed share for its seq, role and timestamp (as `segment_bytes`).
pub(crate) fn entry_bytes(entry: &Entry) -> usize {
    const FIXED: usize = 64;
    FIXED
        + entry.content.len()
        + entry.client_entry_id.as_ref().map_or(0, String::len)
        + entry.name.as_ref().map_or(0, String::len)
        + entry
            .metadata
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum::<usize>()
}

/// What one item of a listing takes in an answer (`segment_bytes`,
/// `entry_bytes`).
pub(crate) trait AnswerBytes {
    fn answer_bytes(&self) -> usize;
}

impl AnswerBytes for Segment {
    fn answer_bytes(&self) -> usize {
        segment_bytes(self)
    }
}

impl AnswerBytes for Entry {
    fn answer_bytes(&self) -> usize {
        entry_bytes(self)
    }
}

/// Whether a write failed for want of room since the health probe last
/// asked: the probe's own write may succeed in the room a refused one
/// left, and must still report it.
#[derive(Debug, Default)]
pub(crate) struct FullSeen(std::sync::atomic::AtomicBool);

impl FullSeen {
    /// Passes a write's result on, remembering a full disk.
    pub(crate) fn note<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Full(_)) = &result {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }

    /// Whether a write failed for want of room since the last call.
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

/// Why a writer's queue refused a job without waiting: full (shed the
/// load) or gone (the store is shut down).
pub(crate) fn refused<T>(e: tokio::sync::mpsc::error::TrySendError<T>) -> StoreError {
    match e {
        tokio::sync::mpsc::error::TrySendError::Full(_) => StoreError::Busy,
        tokio::sync::mpsc::error::TrySendError::Closed(_) => StoreError::Closed,
    }
}

/// State codes as an SQL list: our own integers, never caller text.
pub(crate) fn state_codes(states: &[SegmentState]) -> String {
    let codes: Vec<String> = states.iter().map(|s| s.code().to_string()).collect();
    codes.join(",")
}

/// A failure as the JSON a segment row keeps, and its class's name.
pub(crate) fn encode_failure(f: &Failure) -> Result<(String, &'static str), StoreError> {
    serde_json::to_string(f)
        .map(|json| (json, f.class.as_str()))
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a failure: {e}")))
}

/// Refuses a schema newer than the `known` migrations of this build.
pub(crate) fn not_newer(found: i64, known: usize) -> Result<(), StoreError> {
    if found > known as i64 {
        return Err(StoreError::TooNew { found, known });
    }
    Ok(())
}

/// Refuses a schema other than the one this build's `known` migrations
/// make: newer, or older (it needs migrating).
pub(crate) fn is_current(found: i64, known: usize) -> Result<(), StoreError> {
    not_newer(found, known)?;
    if found < known as i64 {
        return Err(StoreError::NeedsMigration { found, known });
    }
    Ok(())
}

/// Segments or entries gathered up to a number of bytes (`AnswerBytes`),
/// and always the first: what one answer can carry, read no further.
pub(crate) struct BytesBound<T: AnswerBytes> {
    max_bytes: usize,
    used: usize,
    pub(crate) items: Vec<T>,
}

impl<T: AnswerBytes> BytesBound<T> {
    pub(crate) fn new(max_bytes: usize) -> BytesBound<T> {
        BytesBound {
            max_bytes,
            used: 0,
            items: Vec::new(),
        }
    }

    /// Keeps the item if it fits; false (and it is dropped) if not.
    pub(crate) fn take(&mut self, item: T) -> bool {
        let used = self.used.saturating_add(item.answer_bytes());
        if used > self.max_bytes && !self.items.is_empty() {
            return false;
        }
        self.used = used;
        self.items.push(item);
        true
    }
}

/// What survives once a write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Durability {
    /// The process being killed: the commit is in the database's log, in the
    /// operating system's hands.
    #[default]
    Process,
    /// Power loss and operating-system crashes too: an fsync at every
    /// commit, shared by the writes committed together.
    Power,
}

/// The connections a PostgreSQL store opens at most, by what they are
/// for (the append writers have theirs besides): `storage.read_connections`
/// and `storage.write_connections`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Connections {
    /// For the reads callers ask for that may cost.
    pub(crate) reads: usize,
    /// For everything else.
    pub(crate) writes: usize,
}

impl Default for Connections {
    fn default() -> Connections {
        let storage = crate::config::StorageConfig::default();
        Connections {
            reads: storage.read_connections as usize,
            writes: storage.write_connections as usize,
        }
    }
}

/// How a run opens the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum OpenMode {
    /// Creates the data directory and the database as needed, and migrates
    /// it (the server, the benchmarks).
    #[default]
    Create,
    /// Opens a database that must exist already, and migrates it (a
    /// backfill: it has nothing to drain in a database nobody served).
    Existing,
    /// Opens a database that must exist already, for reading only: nothing
    /// is created, migrated or written (a dry run, `archivist check`).
    ReadOnly,
}

/// What migrating a database did (`archivist migrate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Migrated {
    /// `sqlite` or `postgres`.
    pub(crate) backend: &'static str,
    /// The database's file, or its server and name (never a password).
    pub(crate) location: String,
    /// The schema version it was at: 0 for none (a new database).
    pub(crate) from: i64,
    /// The schema version it is at now: the one this build knows.
    pub(crate) to: i64,
}

/// A held claim on a segment: the right to write its result, as long as the
/// token still matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) segment_id: SegmentId,
    pub(crate) owner: String,
    pub(crate) token: i64,
}

/// What to read for one pass over a node of the memory tree.
#[derive(Clone, Debug)]
pub(crate) struct PassInput {
    /// The tenant whose session holds the node.
    pub(crate) tenant: Tenant,
    pub(crate) segment: Segment,
    pub(crate) material: Material,
}

/// What a node's recap is written from.
#[derive(Clone, Debug)]
pub(crate) enum Material {
    /// A level-1 segment's entries, and the newest summary of what came just
    /// before them (context for the recap, not to be retold).
    Entries {
        entries: Vec<Entry>,
        carry: Option<String>,
    },
    /// A roll-up's children's summaries, oldest first.
    Summaries(Vec<String>),
}

/// A session named by its tenant and name (for housekeeping that spans
/// tenants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SessionRef {
    pub(crate) tenant: Tenant,
    pub(crate) session: String,
}

/// What erasing a session removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Erased {
    pub(crate) entries: u64,
    /// Segments and roll-ups.
    pub(crate) segments: u64,
}

/// What completing a pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Completed {
    /// The claim still held: the summary is written.
    pub(crate) held: bool,
    /// The roll-ups this completion made whole (usually none or one),
    /// created PENDING in the same transaction, oldest first.
    pub(crate) rollups: Vec<SegmentId>,
}

/// Which segments a listing or a requeue covers.
#[derive(Clone, Debug, Default)]
pub(crate) struct SegmentFilter {
    pub(crate) session: Option<SessionName>,
    /// Empty: every state.
    pub(crate) states: Vec<SegmentState>,
    /// Empty: every segment that matches the rest.
    pub(crate) ids: Vec<SegmentId>,
    /// Levels of the memory tree; empty: every level.
    pub(crate) levels: Vec<u32>,
}

/// Which segments a backfill run takes: any tenant's, by session and by
/// when they were closed.
#[derive(Clone, Debug, Default)]
pub(crate) struct BackfillFilter {
    pub(crate) session: Option<SessionName>,
    pub(crate) closed_before: Option<Millis>,
    pub(crate) closed_after: Option<Millis>,
    pub(crate) states: Vec<SegmentState>,
}

/// What a pass that wrote no summary leaves on its segment.
#[derive(Clone, Debug)]
pub(crate) struct EndedPass {
    pub(crate) disposition: Disposition,
    /// Sends the pass made; they count whatever the disposition.
    pub(crate) attempts: u32,
    /// The failure to record; None for a released (cancelled) pass.
    pub(crate) failure: Option<Failure>,
    /// The provider configuration the pass ran under; a PARKED segment is
    /// due again once the server runs under another.
    pub(crate) provider_fingerprint: String,
}

/// A tenant as messages name it: an open server's one tenant has no name.
fn tenant_label(tenant: &str) -> String {
    if tenant.is_empty() {
        "the tenant (an open server's only one)".to_owned()
    } else {
        format!("tenant {tenant:?}")
    }
}

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

pub use context::Budget;
pub(crate) use postgres::{Heard, Notes};
pub(crate) use sqlite::ServingClaim;

#[derive(Clone)]
enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
    /// No database: every call fails with `Detached`. For a provider probe
    /// run where no database exists, which must not create one.
    Detached,
}

/// Calls the same method on whichever backend the store runs on.
macro_rules! on_backend {
    ($store:expr, $b:ident => $call:expr) => {
        match &$store.backend {
            Backend::Sqlite($b) => $call,
            Backend::Postgres($b) => $call,
            Backend::Detached => Err(StoreError::Detached),
        }
    };
}

// After `on_backend`, which they use.
mod embeddings;
mod generations;
mod index;
mod recall;
mod search;
pub(crate) use embeddings::{Batch, EndedBatch};
pub(crate) use generations::{DROP_BATCH, Dropped};
pub(crate) use index::Indexed;
pub(crate) use search::{Leg, SearchHit, SearchScope, fuse};

impl Store {
    /// Opens (creating as needed) the SQLite database in `data_dir` and
    /// migrates it to the current schema.
    pub async fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(data_dir, Durability::Process).await
    }

    /// As `open`, committing with the given durability.
    pub(crate) async fn open_with(
        data_dir: &Path,
        durability: Durability,
    ) -> Result<Store, StoreError> {
        Store::open_as(data_dir, durability, OpenMode::Create).await
    }

    /// Opens the database in `data_dir` as `mode` says.
    pub(crate) async fn open_as(
        data_dir: &Path,
        durability: Durability,
        mode: OpenMode,
    ) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Sqlite(sqlite::Sqlite::open(data_dir, durability, mode).await?),
        })
    }

    /// Connects to the PostgreSQL database `url` names and, as `mode`
    /// says, migrates it (under an advisory lock, so replicas starting
    /// together take turns) or checks that it is current.
    pub(crate) async fn open_postgres(
        url: &str,
        mode: OpenMode,
        durability: Durability,
    ) -> Result<Store, StoreError> {
        Store::open_postgres_with(url, mode, durability, Connections::default()).await
    }

    /// As `open_postgres`, with at most `connections`.
    pub(crate) async fn open_postgres_with(
        url: &str,
        mode: OpenMode,
        durability: Durability,
        connections: Connections,
    ) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Postgres(
                postgres::Postgres::open(url, mode, durability, connections).await?,
            ),
        })
    }

    /// Opens (creating as needed) the SQLite database in `data_dir`,
    /// migrates it to the current schema and closes it again.
    pub(crate) async fn migrate_sqlite(
        data_dir: &Path,
        durability: Durability,
    ) -> Result<Migrated, StoreError> {
        let to = sqlite::Sqlite::schema_version();
        // Read first, changing nothing, to learn the version it is at.
        let from = match Store::open_as(data_dir, durability, OpenMode::ReadOnly).await {
            Ok(_) => to,
            Err(StoreError::NeedsMigration { found, .. }) => found,
            Err(StoreError::NoDatabase { .. }) => 0,
            Err(e) => return Err(e),
        };
        let store = Store::open_as(data_dir, durability, OpenMode::Create).await?;
        // The migrated schema into the database file itself, not left in
        // the log: a deploy step may copy or inspect the file alone.
        if let Backend::Sqlite(sqlite) = &store.backend {
            sqlite.checkpoint().await?;
        }
        Ok(Migrated {
            backend: "sqlite",
            location: store.location(data_dir),
            from,
            to,
        })
    }

    /// Connects to the PostgreSQL database `url` names (which must exist),
    /// migrates it to the current schema and lets go.
    pub(crate) async fn migrate_postgres(
        url: &str,
        durability: Durability,
    ) -> Result<Migrated, StoreError> {
        let (location, from, to) = postgres::Postgres::migrate(url, durability).await?;
        Ok(Migrated {
            backend: "postgres",
            location,
            from,
            to: i64::try_from(to).unwrap_or(i64::MAX),
        })
    }

    /// Connects to the PostgreSQL database `url` names, migrating it to
    /// the current schema (for the benchmarks and tests).
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Store::open_postgres(url, OpenMode::Create, Durability::default()).await
    }

    /// Claims the SQLite data directory `data_dir` (creating it as
    /// needed) for this process's server while the returned claim lives:
    /// one SQLite store has one server (a second would run its own
    /// reconciler and passes against it, and its watchers would miss the
    /// first's appends), so a second `archivist serve` on the same
    /// directory is refused before it opens the database. Offline commands
    /// (a backfill beside the server) do not claim it; PostgreSQL needs no
    /// claim, its replicas share one database by design.
    pub(crate) fn claim_sqlite_dir(data_dir: &Path) -> Result<ServingClaim, StoreError> {
        sqlite::claim_for_serving(data_dir)
    }

    /// Where the database is, for messages: a file's path, or a server
    /// and database (never a password).
    pub(crate) fn location(&self, data_dir: &Path) -> String {
        match &self.backend {
            Backend::Postgres(p) => p.target().to_owned(),
            Backend::Sqlite(_) | Backend::Detached => {
                let path = Store::database_path(data_dir);
                std::path::absolute(&path)
                    .unwrap_or(path)
                    .display()
                    .to_string()
            }
        }
    }

    /// Notes between the processes that share this database, when its
    /// backend carries them (PostgreSQL's LISTEN/NOTIFY): the tasks that
    /// publish and receive them start here, counting lost notes in
    /// `metrics`.
    pub(crate) fn notes(&self, metrics: Arc<crate::metrics::Metrics>) -> Option<Notes> {
        match &self.backend {
            Backend::Postgres(p) => Some(p.notes(metrics)),
            Backend::Sqlite(_) | Backend::Detached => None,
        }
    }

    /// A store with no database behind it: every call fails with
    /// `Detached`.
    pub(crate) fn detached() -> Store {
        Store {
            backend: Backend::Detached,
        }
    }

    /// Where the database of `data_dir` is (or would be).
    pub(crate) fn database_path(data_dir: &Path) -> PathBuf {
        sqlite::Sqlite::database_path(data_dir)
    }

    /// Appends `entries` in order to the session's open segment, creating
    /// the session and segments as needed, and closes each segment that
    /// reaches a bound of `policy`, all in one transaction.
    /// `max_tenant_bytes` (0: none) caps the bytes the tenant stores; an
    /// append that would pass it stores nothing. Sheds load with `Busy`
    /// rather than queueing without bound.
    pub async fn append(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        self.append_as(tenant, session, None, entries, policy, max_tenant_bytes)
            .await
    }

    /// `append`, naming whose memory the session is. The append that
    /// creates the session fixes its subject (or its having none); one that
    /// names another later is refused with `SubjectMismatch` and stores
    /// nothing, and one that names none is taken.
    pub async fn append_as(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        subject: Option<&Subject>,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        let subject = subject.map(|s| s.as_str().to_owned());
        on_backend!(self, b => b.append_as(tenant, session, subject, entries, policy, max_tenant_bytes).await)
    }

    /// Closes the session's open segment, if any, and returns its id.
    pub async fn close_open_segment(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<SegmentId>, StoreError> {
        on_backend!(self, b => b.close_open_segment(tenant, session).await)
    }

    /// Erases a session: its entries, segments, roll-ups, summaries and
    /// failures, in one transaction, and with them its bytes from the
    /// tenant's count; the text is gone from the database files when this
    /// returns. A pass running for it writes nothing afterwards (its claim
    /// names a segment that no longer exists).
    pub(crate) async fn delete_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Erased, StoreError> {
        on_backend!(self, b => b.delete_session(tenant, session).await)
    }

    /// Erases every session of the subject in the tenant, each as
    /// `delete_session` does, in one transaction; returns each erased session's name
    /// and what it held, in name order.
    pub(crate) async fn delete_subject(
        &self,
        tenant: &Tenant,
        subject: &Subject,
    ) -> Result<Vec<(String, Erased)>, StoreError> {
        on_backend!(self, b => b.delete_subject(tenant, subject).await)
    }

    /// Whether the tenant has a session of that name (the store suite
    /// checks erasure with it).
    #[cfg(test)]
    pub(crate) async fn has_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<bool, StoreError> {
        on_backend!(self, b => b.has_session(tenant, session).await)
    }

    /// Closes the open segments of sessions whose last append was at or
    /// before `cutoff`, at most `limit` of them, longest idle first; returns
    /// their ids. A session that took an append since is left alone.
    pub(crate) async fn close_idle_segments(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, SegmentId)>, StoreError> {
        on_backend!(self, b => b.close_idle_segments(cutoff, limit).await)
    }

    /// Erases sessions with no append since `cutoff`, at most `limit` of
    /// them, oldest first, as `delete_session` does; returns what it erased.
    pub(crate) async fn expire_sessions(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, Erased)>, StoreError> {
        on_backend!(self, b => b.expire_sessions(cutoff, limit).await)
    }

    /// The tenant's sessions in name order, after the name `after` (if
    /// any), at most `limit` of them.
    #[cfg(test)]
    pub(crate) async fn list_sessions(
        &self,
        tenant: &Tenant,
        after: Option<SessionName>,
        limit: u32,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        self.list_subject_sessions(tenant, None, after, limit).await
    }

    /// `list_sessions`, only the subject's when one is given.
    pub(crate) async fn list_subject_sessions(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
        after: Option<SessionName>,
        limit: u32,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        on_backend!(self, b => b.list_sessions(tenant, subject, after, limit).await)
    }

    /// The provider a run of `role` (serve, backfill) last recorded.
    pub(crate) async fn provider_identity(
        &self,
        role: &str,
    ) -> Result<Option<ProviderIdentity>, StoreError> {
        on_backend!(self, b => b.provider_identity(role).await)
    }

    /// Records the provider a run of `role` summarises with.
    pub(crate) async fn record_provider_identity(
        &self,
        role: &str,
        identity: &ProviderIdentity,
    ) -> Result<(), StoreError> {
        on_backend!(self, b => b.record_provider_identity(role, identity).await)
    }

    /// One segment, if the tenant's sessions hold it.
    pub(crate) async fn segment(
        &self,
        tenant: &Tenant,
        id: SegmentId,
    ) -> Result<Segment, StoreError> {
        on_backend!(self, b => b.segment(tenant, id).await)
    }

    /// One segment, whoever's it is, and whether a live claim holds it: for
    /// workers, never for callers.
    pub(crate) async fn segment_any(&self, id: SegmentId) -> Result<(Segment, bool), StoreError> {
        on_backend!(self, b => b.segment_any(id).await)
    }

    /// Segments matching `filter`, ordered by id (which within a session is
    /// ordinal order), after the id `after`: at most `limit` of them, and
    /// no more than `max_bytes` take in an answer (`segment_bytes`; the
    /// first is always given). True with them when the bytes cut the list
    /// short.
    pub(crate) async fn list_segments(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
        after: SegmentId,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        on_backend!(self, b => b.list_segments(tenant, filter, after, limit, max_bytes).await)
    }

    /// The session's entries after the seq `after`, oldest first: at most
    /// `limit` of them, and no more than `max_bytes` take in an answer
    /// (`entry_bytes`; the first is always given). True with them when the
    /// bytes cut the page short. Reads through the (session, seq) key, so
    /// a page costs what it holds, not what the session does.
    pub(crate) async fn entries(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        after: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Entry>, bool), StoreError> {
        on_backend!(self, b => b.entries(tenant, session, after, limit, max_bytes).await)
    }

    /// The session's PENDING segments, in ordinal order, each with when it
    /// is due; read without their texts.
    pub(crate) async fn pending_in_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Vec<(SegmentId, Option<Millis>)>, StoreError> {
        on_backend!(self, b => b.pending_in_session(tenant, session).await)
    }

    /// What a flush answers: the session's segments still owed a recap,
    /// then its summarised ones, each newest first, as far as `max_bytes`
    /// goes (`segment_bytes`), in ordinal order; and whether every segment
    /// of the session is SUMMARISED. Reads no further than that.
    pub(crate) async fn flushed(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        on_backend!(self, b => b.flushed(tenant, session, max_bytes).await)
    }

    /// What an agent puts in its prompt (the rule is `context.rs`'s),
    /// within `budget`; reads from the newest end only as far as the budget
    /// goes.
    pub async fn context(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        budget: Budget,
    ) -> Result<Context, StoreError> {
        on_backend!(self, b => b.context(tenant, session, budget).await)
    }

    /// Counts per state, the oldest PENDING age and parked counts per class;
    /// one tenant's, or with `None` every tenant's (for metrics).
    pub async fn backlog(&self, tenant: Option<&Tenant>) -> Result<Backlog, StoreError> {
        on_backend!(self, b => b.backlog(tenant).await)
    }

    /// Makes matching PENDING segments (and PARKED ones, when the filter's
    /// states include PARKED) due now; returns how many.
    pub(crate) async fn requeue(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.requeue(tenant, filter).await)
    }

    /// Segments a backfill run covers, in id order, each with whether a live
    /// claim holds it now.
    pub(crate) async fn backfill_segments(
        &self,
        filter: BackfillFilter,
    ) -> Result<Vec<(Segment, bool)>, StoreError> {
        on_backend!(self, b => b.backfill_segments(filter).await)
    }

    /// Makes the given PARKED segments PENDING and due now; returns how many.
    pub(crate) async fn unpark(&self, ids: Vec<SegmentId>) -> Result<u64, StoreError> {
        on_backend!(self, b => b.unpark(ids).await)
    }

    /// Makes every PARKED segment that failed under a provider configuration
    /// other than `fingerprint` due now; returns how many.
    pub(crate) async fn unpark_changed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        on_backend!(self, b => b.unpark_changed(fingerprint).await)
    }

    /// Whether the store can write and read now: one small write committed
    /// and read back. For the health probe.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.probe().await)
    }

    /// PENDING segments due at `now` and not claimed by a live worker,
    /// longest-waiting first.
    pub async fn due_segments(
        &self,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<SegmentId>, StoreError> {
        on_backend!(self, b => b.due_segments(now, limit).await)
    }

    /// Claims a PENDING segment for `lease`, unless a live claim holds it,
    /// and reads what its pass needs. Returns the claim with a fresh fencing
    /// token and the input, or `None`.
    pub(crate) async fn claim(
        &self,
        id: SegmentId,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<(Claim, PassInput)>, StoreError> {
        on_backend!(self, b => b.claim(id, owner, lease).await)
    }

    /// Writes the summary and marks the node SUMMARISED, if `claim` still
    /// holds it (else writes nothing), and in the same transaction creates
    /// the roll-up of `fanout` nodes (0: none) that this one completes.
    pub(crate) async fn complete(
        &self,
        claim: &Claim,
        summary: Summary,
        attempts: u32,
        fanout: u32,
    ) -> Result<Completed, StoreError> {
        on_backend!(self, b => b.complete(claim, summary, attempts, fanout).await)
    }

    /// Records a pass that wrote no summary, as its disposition says, and
    /// releases the claim, if `claim` still holds the segment. Returns false
    /// when the claim was lost.
    pub(crate) async fn end_pass(
        &self,
        claim: &Claim,
        ended: EndedPass,
    ) -> Result<bool, StoreError> {
        on_backend!(self, b => b.end_pass(claim, ended).await)
    }

    /// Extends a held claim by `lease` from now; false when it was lost.
    pub(crate) async fn renew(&self, claim: &Claim, lease: Duration) -> Result<bool, StoreError> {
        on_backend!(self, b => b.renew(claim, lease).await)
    }
}

//! The store: the only place with SQL. SQLite through rusqlite, in WAL mode,
//! with versioned migrations applied at open, and the narrow interface the
//! service needs (sessions, entries, segments, claims).
//!
//! Writes go to one writer thread that owns the only writing connection and
//! commits whatever has queued up in one transaction (group commit): each
//! job runs inside its own savepoint, so one job's error undoes only that
//! job, and every caller is answered only after the COMMIT that made its
//! work durable. Reads run on a small pool of read-only connections on
//! tokio's blocking threads, so no SQLite call ever runs on an async thread.
//!
//! Durability: WAL, by default with `synchronous = NORMAL`. A committed
//! transaction is in the WAL file before its caller is answered, so it
//! survives the process being killed (kill -9); only an operating-system
//! crash or power loss can lose the last commits. `Durability::Power`
//! (`storage.durability = "power"`) prevents that with an fsync per commit,
//! shared by every write of a group commit.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use tokio::sync::{mpsc, oneshot};

use crate::failure::Failure;
use crate::model::{
    AppendOutcome, Appended, Backlog, Context, ContextItem, Entry, Millis, NewEntry, Role, Segment,
    SegmentId, SegmentPolicy, SegmentState, SessionName, Summary, Tenant, estimate_tokens,
};

/// What a tenant's byte cap counts for each stored entry and session on top
/// of its text (content, id, name): the row and index space around it, so
/// that many tiny entries cannot store far more than the cap says.
const ROW_OVERHEAD_BYTES: u64 = 64;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 512;
/// Jobs waiting for the writer before callers wait to enqueue.
const QUEUE_DEPTH: usize = 4096;
/// Idle read connections kept open.
const MAX_IDLE_READERS: usize = 8;
/// How long a statement waits on a lock held by another process (a backfill
/// run beside the server) before failing with SQLITE_BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session {0:?} not found")]
    SessionNotFound(String),
    #[error("segment {0} not found")]
    SegmentNotFound(SegmentId),
    #[error("cannot open the database at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot create the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("database migration to version {version} failed")]
    Migration {
        version: usize,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the database is at schema version {found}, newer than this build knows ({known})")]
    TooNew { found: i64, known: usize },
    #[error("database query failed")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the write was not committed")]
    Batch(#[source] BatchFailure),
    #[error("the store's write queue is full")]
    Busy,
    #[error("tenant {tenant:?} would store {wanted} bytes, over its cap of {limit}")]
    TenantFull {
        tenant: String,
        wanted: u64,
        limit: u64,
    },
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the store is shut down")]
    Closed,
    #[error(transparent)]
    Shared(Arc<StoreError>),
    #[error("a database worker thread failed")]
    Worker(#[source] tokio::task::JoinError),
}

/// Why a batch of writes was not committed; every job in it gets this.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BatchFailure {
    #[error("could not begin a write transaction")]
    Begin(#[source] Arc<rusqlite::Error>),
    #[error("the commit failed")]
    Commit(#[source] Arc<rusqlite::Error>),
    #[error("another write in the same transaction failed in a way that aborted it")]
    Aborted,
}

type Completion = Box<dyn FnOnce(Result<(), BatchFailure>) + Send>;

/// What running a job left: what to do once the batch's fate is known, and
/// whether the batch's transaction is still whole.
struct Ran {
    completion: Completion,
    intact: bool,
}

/// A write job: runs inside the batch's transaction (or learns that the
/// transaction could not start).
type Job = Box<dyn FnOnce(Result<&Connection, BatchFailure>) -> Ran + Send>;

/// What survives once a write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// The process being killed (`synchronous = NORMAL` in WAL mode): the
    /// commit is in the WAL file, in the operating system's hands.
    #[default]
    Process,
    /// Power loss and operating-system crashes too (`synchronous = FULL`):
    /// an fsync at every commit, shared by the writes committed together.
    Power,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::Power => "FULL",
        }
    }
}

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    jobs: mpsc::Sender<Job>,
    readers: Mutex<Vec<Connection>>,
}

/// A held claim on a segment: the right to write its result, as long as the
/// token still matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub segment_id: SegmentId,
    pub owner: String,
    pub token: i64,
}

/// What to read for one pass over a segment.
#[derive(Clone, Debug)]
pub struct PassInput {
    pub segment: Segment,
    pub entries: Vec<Entry>,
}

/// Which segments a listing or a requeue covers.
#[derive(Clone, Debug, Default)]
pub struct SegmentFilter {
    pub session: Option<SessionName>,
    pub states: Vec<SegmentState>,
    pub ids: Vec<SegmentId>,
}

/// Which segments a backfill run takes: any tenant's, by session and by
/// when they were closed.
#[derive(Clone, Debug, Default)]
pub struct BackfillFilter {
    pub session: Option<SessionName>,
    pub closed_before: Option<Millis>,
    pub closed_after: Option<Millis>,
    pub states: Vec<SegmentState>,
}

/// What a failed pass leaves on its segment.
#[derive(Clone, Debug)]
pub struct FailedPass {
    pub failure: Failure,
    pub attempts: u32,
    pub state: SegmentState,
    pub next_attempt_at: Millis,
    /// Whether the pass counts as a failed pass and its failure is recorded
    /// (a cancelled one is neither: the segment is simply due again).
    pub counts_as_pass: bool,
    /// The provider configuration the pass ran under; a PARKED segment is
    /// due again once the server runs under another.
    pub provider_fingerprint: String,
}

const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id              INTEGER PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    next_seq        INTEGER NOT NULL DEFAULT 1,
    next_ordinal    INTEGER NOT NULL DEFAULT 1,
    open_segment_id INTEGER,
    created_at      INTEGER NOT NULL,
    UNIQUE (tenant, name)
);

CREATE TABLE entries (
    session_id      INTEGER NOT NULL REFERENCES sessions (id),
    seq             INTEGER NOT NULL,
    client_entry_id TEXT,
    role            INTEGER NOT NULL,
    content         TEXT    NOT NULL,
    tokens          INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX entries_by_client_id
    ON entries (session_id, client_entry_id) WHERE client_entry_id IS NOT NULL;

CREATE TABLE segments (
    id                   INTEGER PRIMARY KEY,
    session_id           INTEGER NOT NULL REFERENCES sessions (id),
    ordinal              INTEGER NOT NULL,
    state                INTEGER NOT NULL,
    first_seq            INTEGER NOT NULL,
    last_seq             INTEGER NOT NULL,
    entry_count          INTEGER NOT NULL,
    token_estimate       INTEGER NOT NULL,
    attempts             INTEGER NOT NULL DEFAULT 0,
    passes               INTEGER NOT NULL DEFAULT 0,
    next_attempt_at      INTEGER,
    closed_at            INTEGER,
    last_failure         TEXT,
    failure_class        TEXT,
    provider_fingerprint TEXT,
    claim_owner          TEXT,
    claim_token          INTEGER NOT NULL DEFAULT 0,
    claim_expires_at     INTEGER,
    created_at           INTEGER NOT NULL,
    UNIQUE (session_id, ordinal)
);

-- The reconciler's scan reads only due PENDING rows through this index, so
-- its cost follows the backlog, not the number of segments ever stored.
CREATE INDEX segments_by_state_due ON segments (state, next_attempt_at);

CREATE TABLE summaries (
    segment_id     INTEGER PRIMARY KEY REFERENCES segments (id),
    text           TEXT    NOT NULL,
    provider       TEXT    NOT NULL,
    model          TEXT    NOT NULL,
    prompt_version TEXT    NOT NULL,
    input_tokens   INTEGER NOT NULL,
    output_tokens  INTEGER NOT NULL,
    created_at     INTEGER NOT NULL
);
"#,
    r#"
-- Bytes of entry content each tenant stores, kept in step by every append,
-- so the per-tenant cap is checked without summing the entries.
CREATE TABLE tenant_usage (
    tenant       TEXT    PRIMARY KEY,
    stored_bytes INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO tenant_usage (tenant, stored_bytes)
    SELECT x.tenant, sum(length(CAST(e.content AS BLOB)))
    FROM entries e JOIN sessions x ON x.id = e.session_id
    GROUP BY x.tenant;
"#,
    r#"
-- Segments per tenant and state, kept in step by triggers, so that
-- GetBacklog and every metrics scrape cost the same with a million
-- summarised segments as with none.
CREATE TABLE segment_counts (
    tenant TEXT    NOT NULL,
    state  INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (tenant, state)
) WITHOUT ROWID;

INSERT INTO segment_counts (tenant, state, n)
    SELECT x.tenant, s.state, count(*)
    FROM segments s JOIN sessions x ON x.id = s.session_id
    GROUP BY x.tenant, s.state;

CREATE TRIGGER segments_counted_on_insert AFTER INSERT ON segments
BEGIN
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;

CREATE TRIGGER segments_counted_on_state AFTER UPDATE OF state ON segments
WHEN OLD.state != NEW.state
BEGIN
    UPDATE segment_counts SET n = n - 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = OLD.session_id)
          AND state = OLD.state;
    INSERT OR IGNORE INTO segment_counts (tenant, state, n)
        VALUES ((SELECT tenant FROM sessions WHERE id = NEW.session_id), NEW.state, 0);
    UPDATE segment_counts SET n = n + 1
        WHERE tenant = (SELECT tenant FROM sessions WHERE id = NEW.session_id)
          AND state = NEW.state;
END;
"#,
];

const SEGMENT_COLUMNS: &str = "s.id, x.name, s.ordinal, s.state, s.first_seq, s.last_seq, \
     s.entry_count, s.token_estimate, s.attempts, s.passes, s.next_attempt_at, s.closed_at, \
     s.last_failure, m.text, m.provider, m.model, m.prompt_version, m.input_tokens, \
     m.output_tokens, m.created_at";
const SEGMENT_FROM: &str = "segments s JOIN sessions x ON x.id = s.session_id \
     LEFT JOIN summaries m ON m.segment_id = s.id";

impl Store {
    /// Opens (creating as needed) the database in `data_dir`, migrates it to
    /// the current schema and starts the writer thread.
    pub async fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(data_dir, Durability::Process).await
    }

    /// As `open`, committing with the given durability.
    pub async fn open_with(data_dir: &Path, durability: Durability) -> Result<Store, StoreError> {
        let data_dir = data_dir.to_owned();
        tokio::task::spawn_blocking(move || Store::open_blocking(&data_dir, durability))
            .await
            .map_err(StoreError::Worker)?
    }

    fn open_blocking(data_dir: &Path, durability: Durability) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join("archivist.sqlite3");
        let open_err = |source| StoreError::Open {
            path: path.clone(),
            source,
        };
        let mut writer = Connection::open(&path).map_err(open_err)?;
        configure(&writer).map_err(open_err)?;
        // Only the writer commits, so only its setting matters.
        writer
            .pragma_update(None, "synchronous", durability.pragma())
            .map_err(open_err)?;
        writer
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        migrate(&mut writer)?;
        let (jobs, rx) = mpsc::channel(QUEUE_DEPTH);
        std::thread::Builder::new()
            .name("archivist-store-writer".to_owned())
            .spawn(move || writer_loop(writer, rx))
            .map_err(|source| StoreError::DataDir {
                path: data_dir.to_owned(),
                source,
            })?;
        Ok(Store {
            inner: Arc::new(Inner {
                path,
                jobs,
                readers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Runs `f` in the writer's next transaction; answers after it commits.
    /// Waits for room in the writer's queue.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, answer) = job(f);
        self.inner
            .jobs
            .send(job)
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// As `write`, but refuses with `Busy` instead of waiting when the
    /// writer's queue is full: callers' writes shed load, workers' wait.
    async fn write_or_busy<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, answer) = job(f);
        self.inner.jobs.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => StoreError::Busy,
            mpsc::error::TrySendError::Closed(_) => StoreError::Closed,
        })?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `f` on a read connection, in one read transaction (a consistent
    /// snapshot), on a blocking thread.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = lock(&inner.readers).pop();
            let conn = match pooled {
                Some(c) => c,
                None => open_reader(&inner.path)?,
            };
            conn.execute_batch("BEGIN")?;
            let result = f(&conn);
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

    /// Appends `entries` in order to the session's open segment, creating
    /// the session and segments as needed, and closes each segment that
    /// reaches a bound of `policy`, all in one transaction.
    /// `max_tenant_bytes` (0: none) caps the content bytes the tenant
    /// stores; an append that would pass it stores nothing.
    pub async fn append(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.write_or_busy(move |conn| {
            append_tx(conn, &tenant, &session, entries, policy, max_tenant_bytes)
        })
        .await
    }

    /// Closes the session's open segment, if any, and returns its id.
    pub async fn close_open_segment(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<SegmentId>, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.write(move |conn| {
            let Some((session_id, open)) = conn
                .prepare_cached(
                    "SELECT id, open_segment_id FROM sessions WHERE tenant = ?1 AND name = ?2",
                )?
                .query_row(params![tenant, session], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, Option<u64>>(1)?))
                })
                .optional()?
            else {
                return Err(StoreError::SessionNotFound(session));
            };
            let Some(open) = open else {
                return Ok(None);
            };
            close_segment_tx(conn, open, Millis::now())?;
            conn.prepare_cached("UPDATE sessions SET open_segment_id = NULL WHERE id = ?1")?
                .execute([session_id])?;
            Ok(Some(open))
        })
        .await
    }

    /// Closes every open segment of every session (at shutdown); returns
    /// how many were closed.
    pub async fn close_all_open_segments(&self) -> Result<u64, StoreError> {
        self.write(|conn| {
            let now = Millis::now();
            let ids: Vec<u64> = conn
                .prepare_cached(
                    "SELECT open_segment_id FROM sessions WHERE open_segment_id IS NOT NULL",
                )?
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for id in &ids {
                close_segment_tx(conn, *id, now)?;
            }
            conn.prepare_cached(
                "UPDATE sessions SET open_segment_id = NULL WHERE open_segment_id IS NOT NULL",
            )?
            .execute([])?;
            Ok(ids.len() as u64)
        })
        .await
    }

    /// One segment, if the tenant's sessions hold it.
    pub async fn segment(&self, tenant: &Tenant, id: SegmentId) -> Result<Segment, StoreError> {
        if i64::try_from(id).is_err() {
            return Err(StoreError::SegmentNotFound(id));
        }
        let tenant = tenant.0.clone();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.id = ?1 AND x.tenant = ?2"
            );
            conn.prepare_cached(&sql)?
                .query_row(params![id, tenant], segment_from_row)
                .optional()?
                .ok_or(StoreError::SegmentNotFound(id))?
        })
        .await
    }

    /// One segment, whoever's it is, and whether a live claim holds it: for
    /// workers, never for callers.
    pub async fn segment_any(&self, id: SegmentId) -> Result<(Segment, bool), StoreError> {
        if i64::try_from(id).is_err() {
            return Err(StoreError::SegmentNotFound(id));
        }
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS}, s.claim_expires_at > ?2 FROM {SEGMENT_FROM} WHERE s.id = ?1"
            );
            let (segment, claimed) = conn
                .prepare_cached(&sql)?
                .query_row(params![id, Millis::now().0], |r| {
                    Ok((segment_from_row(r)?, r.get::<_, Option<bool>>(20)?))
                })
                .optional()?
                .ok_or(StoreError::SegmentNotFound(id))?;
            Ok((segment?, claimed.unwrap_or(false)))
        })
        .await
    }

    /// Segments matching `filter`, ordered by id (which within a session is
    /// ordinal order), after the id `after`, at most `limit` of them.
    pub async fn list_segments(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
        after: SegmentId,
        limit: u32,
    ) -> Result<Vec<Segment>, StoreError> {
        let tenant = tenant.0.clone();
        self.read(move |conn| {
            let (clause, mut values) = filter_clause(&tenant, &filter);
            values.push(rusqlite::types::Value::Integer(after as i64));
            values.push(rusqlite::types::Value::Integer(i64::from(limit)));
            let n = values.len();
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE {clause} AND s.id > ?{} \
                 ORDER BY s.id LIMIT ?{n}",
                n - 1
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(values), segment_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row??);
            }
            Ok(out)
        })
        .await
    }

    /// Every segment of one session, in ordinal order.
    pub async fn session_segments(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Vec<Segment>, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} \
                 WHERE x.tenant = ?1 AND x.name = ?2 ORDER BY s.ordinal"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![tenant, session], segment_from_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row??);
            }
            if out.is_empty() && session_row(conn, &tenant, &session)?.is_none() {
                return Err(StoreError::SessionNotFound(session));
            }
            Ok(out)
        })
        .await
    }

    /// What an agent puts in its prompt: summaries of summarised segments and
    /// raw entries elsewhere, oldest first, the oldest dropped to fit
    /// `max_tokens` (0: no limit). Walks from the newest item back, so a
    /// long session costs only what fits.
    pub async fn context(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        max_tokens: u32,
    ) -> Result<Context, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let Some(session_id) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.session_id = ?1 \
                 ORDER BY s.ordinal DESC"
            );
            let mut segments = conn.prepare_cached(&sql)?;
            let mut entries = conn.prepare_cached(
                "SELECT seq, client_entry_id, role, content, tokens, created_at FROM entries \
                 WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3 ORDER BY seq DESC",
            )?;
            let limit = if max_tokens == 0 {
                u32::MAX
            } else {
                max_tokens
            };
            let mut items = Vec::new();
            let mut total: u32 = 0;
            let mut truncated = false;
            let mut fits = |item: &ContextItem| match total.checked_add(item.tokens()) {
                Some(t) if t <= limit => {
                    total = t;
                    true
                }
                _ => false,
            };
            'segments: for seg in segments.query_map([session_id], segment_from_row)? {
                let seg = seg??;
                match (seg.state, seg.summary) {
                    (SegmentState::Summarised, Some(summary)) => {
                        let item = ContextItem::Summary {
                            segment_id: seg.id,
                            first_seq: seg.first_seq,
                            last_seq: seg.last_seq,
                            summary,
                        };
                        if !fits(&item) {
                            truncated = true;
                            break 'segments;
                        }
                        items.push(item);
                    }
                    _ => {
                        let rows = entries.query_map(
                            params![session_id, seg.first_seq, seg.last_seq],
                            entry_from_row,
                        )?;
                        for entry in rows {
                            let item = ContextItem::Entry(entry??);
                            if !fits(&item) {
                                truncated = true;
                                break 'segments;
                            }
                            items.push(item);
                        }
                    }
                }
            }
            items.reverse();
            Ok(Context {
                items,
                truncated,
                tokens: total,
            })
        })
        .await
    }

    /// Counts per state, the oldest PENDING age and parked counts per class.
    pub async fn backlog(&self, tenant: &Tenant) -> Result<Backlog, StoreError> {
        self.backlog_where(Some(tenant.0.clone())).await
    }

    /// The backlog across every tenant (for metrics and operators).
    pub async fn backlog_all(&self) -> Result<Backlog, StoreError> {
        self.backlog_where(None).await
    }

    async fn backlog_where(&self, tenant: Option<String>) -> Result<Backlog, StoreError> {
        self.read(move |conn| {
            let mut backlog = Backlog::default();
            // Counts from the trigger-kept table; the oldest PENDING and the
            // parked classes read only PENDING and PARKED rows (through the
            // state index), so the cost follows the backlog.
            let mut stmt = conn.prepare_cached(
                "SELECT state, sum(n) FROM segment_counts \
                 WHERE (?1 IS NULL OR tenant = ?1) GROUP BY state",
            )?;
            let rows = stmt.query_map([&tenant], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })?;
            for row in rows {
                let (state, count) = row?;
                let count = u64::try_from(count).unwrap_or(0);
                match SegmentState::from_code(state) {
                    Some(SegmentState::Open) => backlog.open = count,
                    Some(SegmentState::Pending) => backlog.pending = count,
                    Some(SegmentState::Summarised) => backlog.summarised = count,
                    Some(SegmentState::Parked) => backlog.parked = count,
                    None => return Err(StoreError::Corrupt(format!("segment state {state}"))),
                }
            }
            let oldest: Option<i64> = conn
                .prepare_cached(
                    "SELECT min(s.closed_at) FROM segments s \
                     JOIN sessions x ON x.id = s.session_id \
                     WHERE s.state = ?2 AND (?1 IS NULL OR x.tenant = ?1)",
                )?
                .query_row(params![tenant, SegmentState::Pending.code()], |r| r.get(0))?;
            backlog.oldest_pending_age = oldest.map(|t| Millis(t).age_at(Millis::now()));
            let mut stmt = conn.prepare_cached(
                "SELECT coalesce(s.failure_class, 'unknown'), count(*) FROM segments s \
                 JOIN sessions x ON x.id = s.session_id \
                 WHERE (?1 IS NULL OR x.tenant = ?1) AND s.state = ?2 GROUP BY 1 ORDER BY 1",
            )?;
            let rows = stmt.query_map(params![tenant, SegmentState::Parked.code()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
            })?;
            for row in rows {
                backlog.parked_by_class.push(row?);
            }
            Ok(backlog)
        })
        .await
    }

    /// Makes matching PENDING segments (and PARKED ones, when the filter's
    /// states include PARKED) due now; returns how many.
    pub async fn requeue(&self, tenant: &Tenant, filter: SegmentFilter) -> Result<u64, StoreError> {
        let tenant = tenant.0.clone();
        self.write(move |conn| {
            let (clause, values) = filter_clause(&tenant, &filter);
            let now = Millis::now().0;
            let sql = format!(
                "UPDATE segments SET state = {pending}, next_attempt_at = {now} \
                 WHERE id IN (SELECT s.id FROM segments s JOIN sessions x ON x.id = s.session_id \
                 WHERE {clause})",
                pending = SegmentState::Pending.code(),
            );
            let n = conn.execute(&sql, rusqlite::params_from_iter(values))?;
            Ok(n as u64)
        })
        .await
    }

    /// Segments a backfill run covers, in id order, each with whether a live
    /// claim holds it now.
    pub async fn backfill_segments(
        &self,
        filter: BackfillFilter,
    ) -> Result<Vec<(Segment, bool)>, StoreError> {
        self.read(move |conn| {
            use rusqlite::types::Value;
            let mut values = vec![Value::Integer(Millis::now().0)];
            let mut clause = String::from("1 = 1");
            if let Some(session) = &filter.session {
                values.push(Value::Text(session.as_str().to_owned()));
                clause.push_str(&format!(" AND x.name = ?{}", values.len()));
            }
            if let Some(before) = filter.closed_before {
                values.push(Value::Integer(before.0));
                clause.push_str(&format!(" AND s.closed_at < ?{}", values.len()));
            }
            if let Some(after) = filter.closed_after {
                values.push(Value::Integer(after.0));
                clause.push_str(&format!(" AND s.closed_at > ?{}", values.len()));
            }
            // State codes are our own integers, never caller text.
            let codes: Vec<String> = filter.states.iter().map(|s| s.code().to_string()).collect();
            clause.push_str(&format!(" AND s.state IN ({})", codes.join(",")));
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS}, coalesce(s.claim_expires_at > ?1, 0) FROM {SEGMENT_FROM} \
                 WHERE {clause} ORDER BY s.id"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(values), |r| {
                Ok((segment_from_row(r)?, r.get::<_, bool>(20)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (segment, claimed) = row?;
                out.push((segment?, claimed));
            }
            Ok(out)
        })
        .await
    }

    /// Makes the given PARKED segments PENDING and due now; returns how many.
    pub async fn unpark(&self, ids: Vec<SegmentId>) -> Result<u64, StoreError> {
        self.write(move |conn| {
            let mut stmt = conn.prepare_cached(
                "UPDATE segments SET state = ?1, next_attempt_at = ?2 WHERE id = ?3 AND state = ?4",
            )?;
            let now = Millis::now().0;
            let mut n = 0;
            for id in ids {
                n += stmt.execute(params![
                    SegmentState::Pending.code(),
                    now,
                    id,
                    SegmentState::Parked.code()
                ])? as u64;
            }
            Ok(n)
        })
        .await
    }

    /// PENDING segments due at `now` and not claimed by a live worker,
    /// longest-waiting first.
    pub async fn due_segments(
        &self,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<SegmentId>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id FROM segments WHERE state = ?1 AND next_attempt_at <= ?2 \
                 AND (claim_expires_at IS NULL OR claim_expires_at <= ?2) \
                 ORDER BY next_attempt_at LIMIT ?3",
            )?;
            let rows = stmt
                .query_map(params![SegmentState::Pending.code(), now.0, limit], |r| {
                    r.get::<_, u64>(0)
                })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Claims a PENDING segment for `lease`, unless a live claim holds it,
    /// and reads what its pass needs in the same transaction (one trip to
    /// the writer instead of two). Returns the claim with a fresh fencing
    /// token and the input, or `None`.
    pub async fn claim(
        &self,
        id: SegmentId,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<(Claim, PassInput)>, StoreError> {
        let owner = owner.to_owned();
        self.write(move |conn| {
            let now = Millis::now();
            let token = conn
                .prepare_cached(
                    "UPDATE segments SET claim_owner = ?1, claim_token = claim_token + 1, \
                     claim_expires_at = ?2 WHERE id = ?3 AND state = ?4 \
                     AND (claim_expires_at IS NULL OR claim_expires_at <= ?5) \
                     RETURNING claim_token",
                )?
                .query_row(
                    params![
                        owner,
                        now.saturating_add(lease).0,
                        id,
                        SegmentState::Pending.code(),
                        now.0
                    ],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?;
            let Some(token) = token else {
                return Ok(None);
            };
            let claim = Claim {
                segment_id: id,
                owner,
                token,
            };
            Ok(Some((claim, pass_input(conn, id)?)))
        })
        .await
    }

    /// Writes the summary and marks the segment SUMMARISED, if `claim` still
    /// holds it. Returns false (and writes nothing) when the claim was lost.
    pub async fn complete(
        &self,
        claim: &Claim,
        summary: Summary,
        attempts: u32,
    ) -> Result<bool, StoreError> {
        let claim = claim.clone();
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE segments SET state = ?1, attempts = attempts + ?2, passes = passes + 1, \
                     next_attempt_at = NULL, failure_class = NULL, claim_owner = NULL, \
                     claim_expires_at = NULL \
                     WHERE id = ?3 AND claim_owner = ?4 AND claim_token = ?5 AND state = ?6",
                )?
                .execute(params![
                    SegmentState::Summarised.code(),
                    attempts,
                    claim.segment_id,
                    claim.owner,
                    claim.token,
                    SegmentState::Pending.code()
                ])?;
            if changed == 0 {
                return Ok(false);
            }
            conn.prepare_cached(
                "INSERT INTO summaries (segment_id, text, provider, model, prompt_version, \
                 input_tokens, output_tokens, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                claim.segment_id,
                summary.text,
                summary.provider,
                summary.model,
                summary.prompt_version,
                summary.input_tokens,
                summary.output_tokens,
                summary.created_at.0
            ])?;
            Ok(true)
        })
        .await
    }

    /// Records a failed pass and releases the claim, if `claim` still holds
    /// the segment. Returns false when the claim was lost.
    pub async fn fail(&self, claim: &Claim, pass: FailedPass) -> Result<bool, StoreError> {
        let claim = claim.clone();
        let failure = serde_json::to_string(&pass.failure)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode a failure: {e}")))?;
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE segments SET state = ?1, attempts = attempts + ?2, \
                     passes = passes + ?3, \
                     next_attempt_at = CASE WHEN ?3 = 1 THEN ?4 \
                         ELSE max(?4, coalesce(next_attempt_at, ?4)) END, \
                     last_failure = CASE WHEN ?3 = 1 THEN ?5 ELSE last_failure END, \
                     failure_class = CASE WHEN ?3 = 1 THEN ?6 ELSE failure_class END, \
                     provider_fingerprint = ?11, claim_owner = NULL, claim_expires_at = NULL \
                     WHERE id = ?7 AND claim_owner = ?8 AND claim_token = ?9 AND state = ?10",
                )?
                .execute(params![
                    pass.state.code(),
                    pass.attempts,
                    u32::from(pass.counts_as_pass),
                    pass.next_attempt_at.0,
                    failure,
                    pass.failure.class.as_str(),
                    claim.segment_id,
                    claim.owner,
                    claim.token,
                    SegmentState::Pending.code(),
                    pass.provider_fingerprint
                ])?;
            Ok(changed == 1)
        })
        .await
    }

    /// Makes every PARKED segment that failed under a provider configuration
    /// other than `fingerprint` due now; returns how many. Run at start-up:
    /// a new key or model deserves a try at what the old one could not do.
    pub async fn unpark_changed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        let fingerprint = fingerprint.to_owned();
        self.write(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE segments SET state = ?1, next_attempt_at = ?2 \
                     WHERE state = ?3 AND provider_fingerprint IS NOT ?4",
                )?
                .execute(params![
                    SegmentState::Pending.code(),
                    Millis::now().0,
                    SegmentState::Parked.code(),
                    fingerprint
                ])?;
            Ok(n as u64)
        })
        .await
    }

    /// Extends a held claim by `lease` from now; false when it was lost.
    pub async fn renew(&self, claim: &Claim, lease: Duration) -> Result<bool, StoreError> {
        let claim = claim.clone();
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE segments SET claim_expires_at = ?1 \
                     WHERE id = ?2 AND claim_owner = ?3 AND claim_token = ?4 AND state = ?5",
                )?
                .execute(params![
                    Millis::now().saturating_add(lease).0,
                    claim.segment_id,
                    claim.owner,
                    claim.token,
                    SegmentState::Pending.code()
                ])?;
            Ok(changed == 1)
        })
        .await
    }

    /// Releases a claim without recording anything (the pass was cancelled
    /// before it sent anything that counts).
    pub async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let claim = claim.clone();
        self.write(move |conn| {
            conn.prepare_cached(
                "UPDATE segments SET claim_owner = NULL, claim_expires_at = NULL \
                 WHERE id = ?1 AND claim_owner = ?2 AND claim_token = ?3",
            )?
            .execute(params![claim.segment_id, claim.owner, claim.token])?;
            Ok(())
        })
        .await
    }
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
    .map_err(|source| StoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    configure(&conn)?;
    Ok(conn)
}

/// Applies the migrations this build has and the database lacks, all in one
/// IMMEDIATE transaction: two processes opening a new database at once (a
/// server and a backfill run) take turns, and the second finds the work done.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let known = MIGRATIONS.len();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|source| StoreError::Migration {
            version: known,
            source,
        })?;
    let current: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current > known as i64 {
        return Err(StoreError::TooNew {
            found: current,
            known,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let version = i + 1;
        let err = |source| StoreError::Migration { version, source };
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", version as i64)
            .map_err(err)?;
    }
    tx.commit().map_err(|source| StoreError::Migration {
        version: known,
        source,
    })
}

/// Wraps `f` as a job for the writer, and gives the receiver of its answer.
fn job<T, F>(f: F) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |conn| {
        let (result, intact) = match conn {
            Ok(conn) => in_savepoint(conn, f),
            Err(e) => (Err(StoreError::Batch(e)), true),
        };
        Ran {
            completion: Box::new(move |batch| {
                let outcome = match (result, batch) {
                    // The job's own error explains more than the batch's.
                    (Err(e), _) => Err(e),
                    (Ok(value), Ok(())) => Ok(value),
                    (Ok(_), Err(e)) => Err(StoreError::Batch(e)),
                };
                // The caller may have gone away; its work is committed anyway.
                let _ = tx.send(outcome);
            }),
            intact,
        }
    });
    (job, rx)
}

/// Runs `f` in a savepoint of the open transaction, undoing only its own
/// writes if it fails. Also says whether the transaction is still whole: an
/// I/O error, a full disk or a failed ROLLBACK TO can end it for the whole
/// batch, and then nothing of the batch may be committed.
fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> (Result<T, StoreError>, bool) {
    let step = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    if let Err(e) = step("SAVEPOINT job") {
        return (Err(e.into()), !conn.is_autocommit());
    }
    let result = f(conn);
    if result.is_err()
        && let Err(e) = step("ROLLBACK TO job")
    {
        return (result.and(Err(e.into())), false);
    }
    if let Err(e) = step("RELEASE job") {
        return (result.and(Err(e.into())), false);
    }
    (result, !conn.is_autocommit())
}

/// The writer thread: takes the first queued job, then whatever else has
/// queued up meanwhile, runs them all in one transaction and commits once.
/// A job that breaks the transaction (or panics) aborts the batch: it is
/// rolled back and every job in it is told so; the jobs still queued run in
/// the next batch.
fn writer_loop(conn: Connection, mut jobs: mpsc::Receiver<Job>) {
    let mut done: Vec<Completion> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = jobs.blocking_recv() {
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let e = BatchFailure::Begin(Arc::new(e));
            (first(Err(e.clone())).completion)(Err(e));
            continue;
        }
        let mut intact = run_job(&conn, first, &mut done);
        while intact && done.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => intact = run_job(&conn, job, &mut done),
                Err(_) => break,
            }
        }
        let outcome = if intact {
            conn.execute_batch("COMMIT")
                .map_err(|e| BatchFailure::Commit(Arc::new(e)))
        } else {
            Err(BatchFailure::Aborted)
        };
        if outcome.is_err() && !conn.is_autocommit() {
            // End what is left of the transaction so the next batch starts
            // clean. Nothing of this batch stays.
            let _ = conn.execute_batch("ROLLBACK");
        }
        for completion in done.drain(..) {
            completion(outcome.clone());
        }
    }
}

/// Runs one job; false when the batch's transaction is no longer whole.
fn run_job(conn: &Connection, job: Job, done: &mut Vec<Completion>) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok(conn)))) {
        Ok(ran) => {
            done.push(ran.completion);
            ran.intact
        }
        // The job's answer channel was dropped in the unwind, so its caller
        // hears the store failed; what it half-wrote must not be committed.
        Err(_) => false,
    }
}

/// The segment and its entries, for a pass.
fn pass_input(conn: &Connection, id: SegmentId) -> Result<PassInput, StoreError> {
    let sql = format!("SELECT {SEGMENT_COLUMNS}, s.session_id FROM {SEGMENT_FROM} WHERE s.id = ?1");
    let (segment, session_id) = conn
        .prepare_cached(&sql)?
        .query_row([id], |r| Ok((segment_from_row(r)?, r.get::<_, i64>(20)?)))
        .optional()?
        .ok_or(StoreError::SegmentNotFound(id))?;
    let segment = segment?;
    let mut stmt = conn.prepare_cached(
        "SELECT seq, client_entry_id, role, content, tokens, created_at FROM entries \
             WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3 ORDER BY seq",
    )?;
    let mut entries = Vec::with_capacity(segment.entry_count as usize);
    for e in stmt.query_map(
        params![session_id, segment.first_seq, segment.last_seq],
        entry_from_row,
    )? {
        entries.push(e??);
    }
    Ok(PassInput { segment, entries })
}

fn session_row(conn: &Connection, tenant: &str, name: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT id FROM sessions WHERE tenant = ?1 AND name = ?2")?
        .query_row(params![tenant, name], |r| r.get(0))
        .optional()?)
}

fn close_segment_tx(conn: &Connection, id: u64, now: Millis) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE segments SET state = ?1, closed_at = ?2, next_attempt_at = ?2 \
         WHERE id = ?3 AND state = ?4",
    )?
    .execute(params![
        SegmentState::Pending.code(),
        now.0,
        id,
        SegmentState::Open.code()
    ])?;
    Ok(())
}

struct OpenSegment {
    id: u64,
    entries: u32,
    tokens: u32,
    last_seq: u64,
    touched: bool,
}

fn append_tx(
    conn: &Connection,
    tenant: &str,
    name: &str,
    entries: Vec<NewEntry>,
    policy: SegmentPolicy,
    max_tenant_bytes: u64,
) -> Result<AppendOutcome, StoreError> {
    let now = Millis::now();
    let existing = conn
        .prepare_cached(
            "SELECT id, next_seq, next_ordinal, open_segment_id FROM sessions \
             WHERE tenant = ?1 AND name = ?2",
        )?
        .query_row(params![tenant, name], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, u64>(1)?,
                r.get::<_, u32>(2)?,
                r.get::<_, Option<u64>>(3)?,
            ))
        })
        .optional()?;
    let mut added_bytes = 0u64;
    if max_tenant_bytes > 0 {
        // A tenant already at its cap is refused before any write.
        let stored: u64 = conn
            .prepare_cached("SELECT stored_bytes FROM tenant_usage WHERE tenant = ?1")?
            .query_row([tenant], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        if stored >= max_tenant_bytes {
            return Err(StoreError::TenantFull {
                tenant: tenant.to_owned(),
                wanted: stored,
                limit: max_tenant_bytes,
            });
        }
    }
    let (session_id, mut next_seq, mut next_ordinal, open_id) = match existing {
        Some(row) => row,
        None => {
            added_bytes += name.len() as u64 + ROW_OVERHEAD_BYTES;
            let id = conn
                .prepare_cached(
                    "INSERT INTO sessions (tenant, name, created_at) VALUES (?1, ?2, ?3) RETURNING id",
                )?
                .query_row(params![tenant, name, now.0], |r| r.get::<_, i64>(0))?;
            (id, 1, 1, None)
        }
    };
    let mut open = match open_id {
        Some(id) => Some(
            conn.prepare_cached(
                "SELECT entry_count, token_estimate, last_seq FROM segments WHERE id = ?1",
            )?
            .query_row([id], |r| {
                Ok(OpenSegment {
                    id,
                    entries: r.get(0)?,
                    tokens: r.get(1)?,
                    last_seq: r.get(2)?,
                    touched: false,
                })
            })?,
        ),
        None => None,
    };

    let mut find_dup = conn
        .prepare_cached("SELECT seq FROM entries WHERE session_id = ?1 AND client_entry_id = ?2")?;
    let mut insert_entry = conn.prepare_cached(
        "INSERT INTO entries (session_id, seq, client_entry_id, role, content, tokens, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut insert_segment = conn.prepare_cached(
        "INSERT INTO segments (session_id, ordinal, state, first_seq, last_seq, entry_count, \
         token_estimate, created_at) VALUES (?1, ?2, ?3, ?4, ?4, 0, 0, ?5) RETURNING id",
    )?;
    let mut outcome = AppendOutcome {
        entries: Vec::with_capacity(entries.len()),
        open_segment_id: None,
        closed_segment_ids: Vec::new(),
    };
    for entry in entries {
        if let Some(cid) = &entry.client_entry_id {
            let seen = find_dup
                .query_row(params![session_id, cid], |r| r.get::<_, u64>(0))
                .optional()?;
            if let Some(seq) = seen {
                outcome.entries.push(Appended {
                    seq,
                    client_entry_id: entry.client_entry_id,
                    duplicate: true,
                });
                continue;
            }
        }
        let seq = next_seq;
        next_seq += 1;
        added_bytes += (entry.content.len() + entry.client_entry_id.as_ref().map_or(0, String::len))
            as u64
            + ROW_OVERHEAD_BYTES;
        let tokens = estimate_tokens(&entry.content);
        insert_entry.execute(params![
            session_id,
            seq,
            entry.client_entry_id,
            entry.role.code(),
            entry.content,
            tokens,
            now.0
        ])?;
        let seg = match &mut open {
            Some(seg) => seg,
            None => {
                let id = insert_segment.query_row(
                    params![
                        session_id,
                        next_ordinal,
                        SegmentState::Open.code(),
                        seq,
                        now.0
                    ],
                    |r| r.get::<_, u64>(0),
                )?;
                next_ordinal += 1;
                open.insert(OpenSegment {
                    id,
                    entries: 0,
                    tokens: 0,
                    last_seq: seq,
                    touched: false,
                })
            }
        };
        seg.entries += 1;
        seg.tokens = seg.tokens.saturating_add(tokens);
        seg.last_seq = seq;
        seg.touched = true;
        outcome.entries.push(Appended {
            seq,
            client_entry_id: entry.client_entry_id,
            duplicate: false,
        });
        if policy.is_full(seg.entries, seg.tokens) {
            save_open_segment(conn, seg)?;
            close_segment_tx(conn, seg.id, now)?;
            outcome.closed_segment_ids.push(seg.id);
            open = None;
        }
    }
    if let Some(seg) = &open {
        if seg.touched {
            save_open_segment(conn, seg)?;
        }
        outcome.open_segment_id = Some(seg.id);
    }
    conn.prepare_cached(
        "UPDATE sessions SET next_seq = ?1, next_ordinal = ?2, open_segment_id = ?3 WHERE id = ?4",
    )?
    .execute(params![
        next_seq,
        next_ordinal,
        outcome.open_segment_id,
        session_id
    ])?;
    if added_bytes > 0 {
        let stored: u64 = conn
            .prepare_cached(
                "INSERT INTO tenant_usage (tenant, stored_bytes) VALUES (?1, ?2) \
                 ON CONFLICT (tenant) DO UPDATE SET stored_bytes = stored_bytes + ?2 \
                 RETURNING stored_bytes",
            )?
            .query_row(params![tenant, added_bytes], |r| r.get(0))?;
        if max_tenant_bytes > 0 && stored > max_tenant_bytes {
            // The job's savepoint rolls every write of this append back.
            return Err(StoreError::TenantFull {
                tenant: tenant.to_owned(),
                wanted: stored,
                limit: max_tenant_bytes,
            });
        }
    }
    Ok(outcome)
}

fn save_open_segment(conn: &Connection, seg: &OpenSegment) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE segments SET entry_count = ?1, token_estimate = ?2, last_seq = ?3 WHERE id = ?4",
    )?
    .execute(params![seg.entries, seg.tokens, seg.last_seq, seg.id])?;
    Ok(())
}

/// The WHERE clause (over `segments s JOIN sessions x`) and its values.
fn filter_clause(tenant: &str, filter: &SegmentFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut values = vec![Value::Text(tenant.to_owned())];
    let mut clause = "x.tenant = ?1".to_owned();
    if let Some(session) = &filter.session {
        values.push(Value::Text(session.as_str().to_owned()));
        clause.push_str(&format!(" AND x.name = ?{}", values.len()));
    }
    if !filter.states.is_empty() {
        // State codes are our own integers, never caller text.
        let codes: Vec<String> = filter.states.iter().map(|s| s.code().to_string()).collect();
        clause.push_str(&format!(" AND s.state IN ({})", codes.join(",")));
    }
    if !filter.ids.is_empty() {
        let mut marks = Vec::with_capacity(filter.ids.len());
        for id in &filter.ids {
            // An id past i64::MAX cannot exist; -1 matches nothing.
            values.push(Value::Integer(i64::try_from(*id).unwrap_or(-1)));
            marks.push(format!("?{}", values.len()));
        }
        clause.push_str(&format!(" AND s.id IN ({})", marks.join(",")));
    }
    (clause, values)
}

fn segment_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Segment, StoreError>> {
    let state_code: i64 = r.get(3)?;
    let Some(state) = SegmentState::from_code(state_code) else {
        return Ok(Err(StoreError::Corrupt(format!(
            "segment state {state_code}"
        ))));
    };
    let last_failure = match r.get::<_, Option<String>>(12)? {
        Some(json) => match serde_json::from_str::<Failure>(&json) {
            Ok(f) => Some(f),
            Err(e) => return Ok(Err(StoreError::Corrupt(format!("stored failure: {e}")))),
        },
        None => None,
    };
    let summary = match r.get::<_, Option<String>>(13)? {
        Some(text) => Some(Summary {
            text,
            provider: r.get(14)?,
            model: r.get(15)?,
            prompt_version: r.get(16)?,
            input_tokens: r.get(17)?,
            output_tokens: r.get(18)?,
            created_at: Millis(r.get(19)?),
        }),
        None => None,
    };
    Ok(Ok(Segment {
        id: r.get(0)?,
        session: r.get(1)?,
        ordinal: r.get(2)?,
        state,
        first_seq: r.get(4)?,
        last_seq: r.get(5)?,
        entry_count: r.get(6)?,
        token_estimate: r.get(7)?,
        summary,
        attempts: r.get(8)?,
        passes: r.get(9)?,
        last_failure,
        next_attempt_at: r.get::<_, Option<i64>>(10)?.map(Millis),
        closed_at: r.get::<_, Option<i64>>(11)?.map(Millis),
    }))
}

fn entry_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Entry, StoreError>> {
    let role_code: i64 = r.get(2)?;
    let Some(role) = Role::from_code(role_code) else {
        return Ok(Err(StoreError::Corrupt(format!("entry role {role_code}"))));
    };
    Ok(Ok(Entry {
        seq: r.get(0)?,
        client_entry_id: r.get(1)?,
        role,
        content: r.get(3)?,
        tokens: r.get(4)?,
        created_at: Millis(r.get(5)?),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    const POLICY: SegmentPolicy = SegmentPolicy {
        max_entries: 1000,
        max_tokens: 1_000_000,
    };

    async fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("open");
        (dir, store)
    }

    fn entries(texts: &[&str]) -> Vec<NewEntry> {
        texts
            .iter()
            .map(|t| NewEntry {
                client_entry_id: None,
                role: Role::User,
                content: (*t).to_owned(),
            })
            .collect()
    }

    fn session(name: &str) -> SessionName {
        SessionName::parse(name).expect("valid name")
    }

    /// One closed (PENDING) segment of `texts` in session "s".
    async fn closed_segment(store: &Store, texts: &[&str]) -> SegmentId {
        let t = Tenant::default();
        store
            .append(&t, &session("s"), entries(texts), POLICY, 0)
            .await
            .expect("append");
        store
            .close_open_segment(&t, &session("s"))
            .await
            .expect("close")
            .expect("was open")
    }

    async fn count_entries(store: &Store, name: &str) -> usize {
        match store.context(&Tenant::default(), &session(name), 0).await {
            Ok(ctx) => ctx.items.len(),
            Err(StoreError::SessionNotFound(_)) => 0,
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `bad` among many concurrent appends and checks the writer's
    /// promise: an append that was acknowledged is stored, one that was not
    /// is not, and the writer goes on working.
    async fn acknowledged_means_stored(
        bad: impl FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    ) {
        let (_dir, store) = open().await;
        let mut tasks = Vec::new();
        for i in 0..40 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let name = format!("s{i}");
                let ok = store
                    .append(
                        &Tenant::default(),
                        &session(&name),
                        entries(&["x"]),
                        POLICY,
                        0,
                    )
                    .await
                    .is_ok();
                (name, ok)
            }));
        }
        let bad_result = store.write(bad).await;
        assert!(bad_result.is_err());
        for t in tasks {
            let (name, ok) = t.await.expect("joined");
            assert_eq!(
                count_entries(&store, &name).await,
                usize::from(ok),
                "{name}"
            );
        }
        store
            .append(
                &Tenant::default(),
                &session("after"),
                entries(&["y"]),
                POLICY,
                0,
            )
            .await
            .expect("the writer still works");
        assert_eq!(count_entries(&store, "after").await, 1);
    }

    #[tokio::test]
    async fn a_failing_job_undoes_only_itself() {
        let (_dir, store) = open().await;
        let result = store
            .write(|conn| {
                conn.execute(
                    "INSERT INTO sessions (tenant, name, created_at) VALUES ('', 'ghost', 0)",
                    [],
                )?;
                Err::<(), _>(StoreError::Corrupt("on purpose".to_owned()))
            })
            .await;
        assert!(matches!(result, Err(StoreError::Corrupt(_))));
        assert_eq!(count_entries(&store, "ghost").await, 0);
        assert!(matches!(
            store
                .context(&Tenant::default(), &session("ghost"), 0)
                .await,
            Err(StoreError::SessionNotFound(_))
        ));
        acknowledged_means_stored(|conn| {
            conn.execute(
                "INSERT INTO sessions (tenant, name, created_at) VALUES ('', 'ghost', 0)",
                [],
            )?;
            Err(StoreError::Corrupt("on purpose".to_owned()))
        })
        .await;
    }

    #[tokio::test]
    async fn a_job_that_ends_the_transaction_aborts_its_batch() {
        acknowledged_means_stored(|conn| {
            conn.execute_batch("ROLLBACK")?;
            Ok(())
        })
        .await;
    }

    #[tokio::test]
    async fn a_panicking_job_aborts_its_batch() {
        acknowledged_means_stored(|_| panic!("a bug in a write job")).await;
    }

    #[tokio::test]
    async fn claims_are_exclusive_and_fenced() {
        let (_dir, store) = open().await;
        let t = Tenant::default();
        let id = closed_segment(&store, &["a", "b"]).await;
        let lease = Duration::from_secs(60);
        let (first, input) = store
            .claim(id, "one", lease)
            .await
            .expect("claim")
            .expect("free");
        assert_eq!(input.entries.len(), 2);
        assert!(
            store
                .claim(id, "two", lease)
                .await
                .expect("claim")
                .is_none(),
            "held"
        );
        let stale = Claim {
            token: first.token - 1,
            ..first.clone()
        };
        let summary = Summary {
            text: "recap".to_owned(),
            provider: "test".to_owned(),
            model: "m".to_owned(),
            prompt_version: "v".to_owned(),
            input_tokens: 1,
            output_tokens: 1,
            created_at: Millis::now(),
        };
        assert!(
            !store
                .complete(&stale, summary.clone(), 1)
                .await
                .expect("complete")
        );
        assert!(
            store
                .complete(&first, summary.clone(), 2)
                .await
                .expect("complete")
        );
        // Done once: the same claim cannot write twice.
        assert!(!store.complete(&first, summary, 1).await.expect("complete"));
        let seg = store.segment(&t, id).await.expect("segment");
        assert_eq!(seg.state, SegmentState::Summarised);
        assert_eq!((seg.attempts, seg.passes), (2, 1));
    }

    #[tokio::test]
    async fn backlog_counts_follow_every_state_change() {
        let (dir, store) = open().await;
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        let small = SegmentPolicy {
            max_entries: 1,
            max_tokens: 1_000_000,
        };
        store
            .append(&t, &session("s"), entries(&["a", "b", "c", "d"]), small, 0)
            .await
            .expect("append");
        store
            .append(&other, &session("s"), entries(&["x", "y"]), POLICY, 0)
            .await
            .expect("append");
        let due = store.due_segments(Millis::now(), 10).await.expect("due");
        let (first, _) = store
            .claim(due[0], "w", Duration::from_secs(60))
            .await
            .expect("claim")
            .expect("free");
        let summary = Summary {
            text: "r".to_owned(),
            provider: "p".to_owned(),
            model: "m".to_owned(),
            prompt_version: "v".to_owned(),
            input_tokens: 1,
            output_tokens: 1,
            created_at: Millis::now(),
        };
        assert!(store.complete(&first, summary, 1).await.expect("complete"));
        let (second, _) = store
            .claim(due[1], "w", Duration::from_secs(60))
            .await
            .expect("claim")
            .expect("free");
        let failure = Failure {
            class: crate::failure::FailureClass::Unauthorized,
            retry_after: None,
            causes: vec!["401".to_owned()],
            attempts: 1,
            elapsed: Duration::ZERO,
            http_status: Some(401),
            provider: "p".to_owned(),
            model: "m".to_owned(),
        };
        let parked = FailedPass {
            failure,
            attempts: 1,
            state: SegmentState::Parked,
            next_attempt_at: Millis::now(),
            counts_as_pass: true,
            provider_fingerprint: "f".to_owned(),
        };
        assert!(store.fail(&second, parked).await.expect("fail"));
        let b = store.backlog(&t).await.expect("backlog");
        assert_eq!((b.open, b.pending, b.summarised, b.parked), (0, 2, 1, 1));
        assert_eq!(b.parked_by_class, vec![("unauthorized".to_owned(), 1)]);
        assert!(b.oldest_pending_age.is_some());
        let o = store.backlog(&other).await.expect("backlog");
        assert_eq!((o.open, o.pending, o.summarised, o.parked), (1, 0, 0, 0));
        let all = store.backlog_all().await.expect("backlog");
        assert_eq!(
            (all.open, all.pending, all.summarised, all.parked),
            (1, 2, 1, 1)
        );

        store.unpark(vec![due[1]]).await.expect("unpark");
        let b = store.backlog(&t).await.expect("backlog");
        assert_eq!((b.pending, b.parked), (3, 0));
        // The kept counts equal a recount.
        let conn = Connection::open(dir.path().join("archivist.sqlite3")).expect("open");
        let recount: Vec<(String, i64, i64)> = conn
            .prepare(
                "SELECT x.tenant, s.state, count(*) FROM segments s \
                 JOIN sessions x ON x.id = s.session_id GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        let kept: Vec<(String, i64, i64)> = conn
            .prepare("SELECT tenant, state, n FROM segment_counts WHERE n > 0 ORDER BY 1, 2")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(kept, recount);
    }

    #[tokio::test]
    async fn the_writer_commits_with_the_durability_asked_for() {
        for (durability, level) in [(Durability::Process, 1), (Durability::Power, 2)] {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Store::open_with(dir.path(), durability)
                .await
                .expect("open");
            let synchronous: i64 = store
                .write(|conn| Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?))
                .await
                .expect("pragma");
            assert_eq!(synchronous, level, "{durability:?}");
        }
    }

    #[tokio::test]
    async fn an_expired_claim_can_be_taken_over() {
        let (_dir, store) = open().await;
        let id = closed_segment(&store, &["a"]).await;
        let crashed = store
            .claim(id, "crashed", Duration::ZERO)
            .await
            .expect("claim")
            .expect("free")
            .0;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let next = store
            .claim(id, "next", Duration::from_secs(60))
            .await
            .expect("claim")
            .expect("the lease ran out")
            .0;
        assert!(next.token > crashed.token);
        assert!(
            !store
                .renew(&crashed, Duration::from_secs(60))
                .await
                .expect("renew")
        );
        assert!(
            store
                .renew(&next, Duration::from_secs(60))
                .await
                .expect("renew")
        );
    }
}

//! The PostgreSQL backend: one database that any number of replicas share.
//!
//! Connections come from a pool (deadpool-postgres over tokio-postgres);
//! every statement is prepared once per connection and cached. The queries
//! live beside what they serve, as in `sqlite/`: `writer.rs` (the append
//! writer, its group commit and its transaction), `sessions.rs` (closing
//! open segments on demand or when idle, the session listing),
//! `erasure.rs` (deleting and expiring sessions), `segments.rs` (reads,
//! listings, the backlog, requeues, the due scan), `entries.rs` (the
//! transcript, paged), `claims.rs` (claims and what is written under
//! them), `embeddings.rs` (what is owed a vector, the vectors, the
//! semantic leg through pgvector), `runs.rs` (the provider each kind of
//! run last used), `notes.rs`
//! (events between replicas, LISTEN/NOTIFY); `rows.rs` decodes rows and
//! `schema.rs` migrates.
//!
//! Locks, always taken in this order so that no two transactions wait on
//! each other in a cycle: a tenant's `tenant_usage` row (appends and
//! erasures, in tenant order), then sessions (in tenant and name order;
//! a session's erasure lock, an advisory lock, before its row), then
//! segment rows, several always in ascending id: a transaction that
//! changes several segments first locks them with `SELECT ... ORDER BY id
//! FOR UPDATE`, and changes no other.
//!
//! - A completing pass takes its session's erasure lock shared and a
//!   key-share lock on its row (the lock that inserting a roll-up takes
//!   anyway), then an advisory lock on forming the roll-ups of its node's
//!   level (taken by nothing else; it is what makes each roll-up once),
//!   then the nodes of that level a roll-up may adopt, and its own.
//! - An erasure takes its session's erasure lock exclusively (it waits
//!   for the passes completing the session's nodes and keeps new ones
//!   out), locks its row outright (FOR UPDATE), then every node of the
//!   session; as no roll-up can be added meanwhile, those are all there
//!   are when it deletes them. The row lock alone would not keep passes
//!   out: PostgreSQL can grant a key-share lock beside a FOR UPDATE taken
//!   at the same moment (`lock_level` in `claims.rs`).
//! - A requeue, an unpark and the closing of idle segments lock the rows
//!   they change, in id order, in the statement that changes them.
//! - An append changes, of the segments already there, only the open one
//!   of each session it holds locked, so its writes need no order among
//!   themselves.
//! - Claims take one segment row with `FOR UPDATE SKIP LOCKED`, so a
//!   replica never waits on another's claim.
//!
//! Whatever still deadlocks (PostgreSQL breaks the cycle by failing one
//! side) is retried where retrying is safe.
//!
//! Statements are pipelined (sent together, answered in order). Where a
//! transaction pipelines several, they are awaited with a `biased`
//! `try_join!`, so that the error reported is the first statement's (a
//! deadlock, say, which is retried), not a later one's "current
//! transaction is aborted" (an unbiased join polls its futures in turn
//! from a rotating start, and returns whichever error it sees first).
//!
//! Connections come from three pools, so that no kind of work can take
//! the connections another needs: the append writers' own (one connection
//! each, used by nothing else); the reads callers ask for that may cost
//! (Search, GetContext, the listings, the transcript, backlogs), at most
//! `storage.read_connections` at once, further ones queueing for up to
//! `POOL_WAIT` and then refused as `ReadsBusy`; and everything else
//! (claims and what passes write, closing, erasure, point reads), at most
//! `storage.write_connections`. However many costly reads run, appends and
//! passes still get their connections.
//!
//! A connection is taken from a pool as a [`Conn`]: one dropped inside a
//! transaction (its future cancelled between BEGIN and COMMIT) is closed,
//! never handed to the next caller.
//!
//! Durability follows `storage.durability`, as with SQLite. `process` (the
//! default) runs archivist's sessions with `synchronous_commit = off`: a
//! commit is acknowledged once it is in the server's WAL buffers, so an
//! acknowledged write survives any archivist process dying (a replica
//! killed, a deploy), but a crash of the database server itself can lose
//! the last moments of acknowledged writes (at most three
//! `wal_writer_delay`s, 600 ms by default; never a partial transaction).
//! `power` leaves the server's own `synchronous_commit` (on by default,
//! or stronger with synchronous standbys): every commit waits for its WAL
//! flush, and the append writers share each flush among a batch.

mod claims;
mod embeddings;
mod entries;
mod erasure;
mod generations;
mod index;
mod notes;
mod rows;
mod runs;
mod schema;
mod search;
mod segments;
mod sessions;
mod writer;

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::{Connections, Durability, FullSeen, OpenMode, StoreError};

pub(crate) use notes::{Heard, Notes};

/// How long a caller waits for a free connection before the store says
/// the database cannot be reached (or, for a read, that reads are busy).
const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long a new connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Appends waiting for a writer before callers are refused with `Busy`.
const QUEUE_DEPTH: usize = 4096;
/// Writer tasks, each committing one batch of appends at a time on a
/// connection of its own. With `synchronous_commit = off` a commit waits
/// for no disk, and one writer keeps the server busy with the largest
/// batches (the server's CPU, per statement, is what a batch costs); when
/// each commit waits for its WAL flush, a second writer builds and sends
/// the next batch meanwhile.
fn writers(durability: Durability) -> usize {
    match durability {
        Durability::Process => 1,
        Durability::Power => 2,
    }
}
/// How often a transaction that lost a deadlock (or a race on a key) is
/// run again before its error is returned.
const TRIES: usize = 3;
/// The advisory lock key that guards a session against its erasure, as
/// SQL over the column holding the session's id: an erasure takes it
/// exclusively, a completing pass shared, each before any row of the
/// session (see the module doc). The session's id shifted as the forming
/// lock of a level (`claims.rs`) shifts it, with level 0, which no node
/// has: the two never share a key.
fn erasure_lock(session_id: &str) -> String {
    format!("({session_id} << 8)")
}
/// What a tenant's byte cap counts for each stored entry and session on
/// top of its text, as the SQLite backend counts it: added by appends,
/// given back by erasures.
const ROW_OVERHEAD_BYTES: u64 = 64;

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> StoreError {
        if e.code() == Some(&SqlState::DISK_FULL) {
            StoreError::Full(Box::new(e))
        } else if is_connection_loss(&e) {
            StoreError::Unreachable(Box::new(e))
        } else {
            StoreError::Query(Box::new(e))
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> StoreError {
        StoreError::Unreachable(Box::new(e))
    }
}

/// The connection is gone or the server is going away: the same work may
/// succeed on another connection later.
fn is_connection_loss(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || code.code().starts_with("08")
        }
        // No server error: an I/O error under the connection.
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// A transaction lost to another (a deadlock broken by the server, a
/// serialization failure, a key inserted meanwhile): running it again is
/// safe and will most likely succeed. `what` names the transaction for
/// the warning a deadlock gets.
fn is_lost_race(e: &StoreError, what: &str) -> bool {
    let StoreError::Query(source) = e else {
        return false;
    };
    let Some(db) = source
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
    else {
        return false;
    };
    let c = db.code();
    if *c == SqlState::T_R_DEADLOCK_DETECTED {
        // The lock order (module doc) should rule deadlocks out, and the
        // retry would hide one: the server's account of the cycle (the
        // processes, the transactions they waited for, the tuple; never
        // stored text) is what tells which order was broken.
        tracing::warn!(
            transaction = what,
            detail = db.detail().unwrap_or(""),
            context = db.where_().unwrap_or(""),
            "PostgreSQL broke a deadlock, failing this transaction"
        );
    }
    *c == SqlState::T_R_DEADLOCK_DETECTED
        || *c == SqlState::T_R_SERIALIZATION_FAILURE
        || *c == SqlState::UNIQUE_VIOLATION
        || *c == SqlState::FOREIGN_KEY_VIOLATION
}

/// Where a URL points, without its password: `postgres://user@host:port/db`.
pub(super) fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let mut split_password = false;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                // No host name has an '@': this is the tail of a password
                // whose '@' was not written %40 (the URL splits at the
                // first '@'), so everything before the last '@' is secret.
                Host::Tcp(name) if name.contains('@') => {
                    split_password = true;
                    let after = name.rsplit('@').next().unwrap_or_default();
                    format!("***@{after}")
                }
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let described = format!(
        "postgres://{}@{}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    );
    if split_password {
        format!("{described} (a host name with '@' in it: write an '@' in the password as %40)")
    } else {
        described
    }
}

/// A handle on the PostgreSQL database; cheap to clone.
#[derive(Clone)]
pub(super) struct Postgres {
    inner: Arc<Inner>,
}

struct Inner {
    /// Writes and whatever else is not a costly read.
    pool: Pool,
    /// The reads callers ask for that may cost (see the module doc).
    reads: Pool,
    config: tokio_postgres::Config,
    /// Where the database is, without a password, for messages.
    target: String,
    /// None when opened read-only: every write fails with `ReadOnly`.
    appends: Option<mpsc::Sender<writer::AppendJob>>,
    /// A write failed for want of room since the last health probe.
    full_seen: FullSeen,
}

/// A connection to `target` (where the database is, without a password)
/// could not be made.
fn connect_error(
    target: &str,
    source: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::Connect {
        target: target.to_owned(),
        source: Box::new(source),
    }
}

/// A pool for the database a URL names, before any connection is made.
struct Connecting {
    pool: Pool,
    /// The URL's settings and archivist's own (timeouts, name, durability).
    connect_config: tokio_postgres::Config,
    /// Where the database is, without a password, for messages.
    target: String,
}

impl Connecting {
    /// Another pool of up to `size` connections to the same database.
    fn pool(&self, size: usize) -> Result<Pool, StoreError> {
        new_pool(&self.connect_config, size).map_err(|e| connect_error(&self.target, e))
    }

    fn new(url: &str, durability: Durability, size: usize) -> Result<Connecting, StoreError> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::Connect {
            target: "(a storage URL that does not parse; not shown, it may hold a password)"
                .to_owned(),
            source: Box::new(e),
        })?;
        let target = describe(&config);
        let mut connect_config = config;
        connect_config.connect_timeout(CONNECT_TIMEOUT);
        if connect_config.get_application_name().is_none() {
            connect_config.application_name("archivist");
        }
        if durability == Durability::Process {
            let options = match connect_config.get_options() {
                Some(given) => format!("{given} -c synchronous_commit=off"),
                None => "-c synchronous_commit=off".to_owned(),
            };
            connect_config.options(options);
        }
        let pool = new_pool(&connect_config, size).map_err(|e| connect_error(&target, e))?;
        Ok(Connecting {
            pool,
            connect_config,
            target,
        })
    }
}

/// A pool of up to `size` connections made with `config`, connecting
/// when first asked.
fn new_pool(
    config: &tokio_postgres::Config,
    size: usize,
) -> Result<Pool, deadpool_postgres::BuildError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
}

impl Postgres {
    /// Connects to the database `url` names and, as `mode` says, migrates
    /// it to the current schema (creating it in an empty database, or
    /// requiring one already there) or only checks that it is current.
    /// Does not create the database itself: the operator does.
    pub(super) async fn open(
        url: &str,
        mode: OpenMode,
        durability: Durability,
        connections: Connections,
    ) -> Result<Postgres, StoreError> {
        let connecting = Connecting::new(url, durability, connections.writes.max(1))?;
        let reads = connecting.pool(connections.reads.max(1))?;
        let Connecting {
            pool,
            connect_config,
            target,
        } = connecting;
        {
            let mut client = pool.get().await.map_err(|e| connect_error(&target, e))?;
            match mode {
                OpenMode::Create => {
                    schema::migrate(&mut client).await?;
                }
                OpenMode::Existing => {
                    if !schema::exists(&client).await? {
                        return Err(StoreError::NoDatabase {
                            path: target.clone().into(),
                        });
                    }
                    schema::migrate(&mut client).await?;
                }
                OpenMode::ReadOnly => {
                    if !schema::exists(&client).await? {
                        return Err(StoreError::NoDatabase {
                            path: target.clone().into(),
                        });
                    }
                    schema::check_current(&client).await?;
                }
            }
        }
        let appends = if mode == OpenMode::ReadOnly {
            None
        } else {
            let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            // The writers' own connections, which nothing else can take.
            let appends = new_pool(&connect_config, writers(durability))
                .map_err(|e| connect_error(&target, e))?;
            for _ in 0..writers(durability) {
                tokio::spawn(writer::writer(appends.clone(), rx.clone()));
            }
            Some(tx)
        };
        Ok(Postgres {
            inner: Arc::new(Inner {
                pool,
                reads,
                config: connect_config,
                target,
                appends,
                full_seen: FullSeen::default(),
            }),
        })
    }

    /// Connects to the database `url` names, migrates it to the current
    /// schema (creating archivist's tables in an empty database) and lets
    /// go, starting nothing else: `archivist migrate`. Returns where the
    /// database is (no password) and the schema versions it was at and is
    /// at now.
    pub(super) async fn migrate(
        url: &str,
        durability: Durability,
    ) -> Result<(String, i64, usize), StoreError> {
        let Connecting { pool, target, .. } = Connecting::new(url, durability, 1)?;
        let mut client = pool.get().await.map_err(|e| connect_error(&target, e))?;
        let from = schema::migrate(&mut client).await?;
        Ok((target, from, schema::known()))
    }

    /// Where the database is, without a password.
    pub(super) fn target(&self) -> &str {
        &self.inner.target
    }

    /// A pooled connection for writes, and for reads that cost little.
    async fn client(&self) -> Result<Conn, StoreError> {
        Ok(Conn::new(self.inner.pool.get().await?))
    }

    /// A pooled connection for a read a caller asked for that may cost
    /// (see the module doc): from a pool of its own, so that however many
    /// run, writes keep theirs. Past `POOL_WAIT` waiting for one, the
    /// read is refused as `ReadsBusy`.
    async fn reader(&self) -> Result<Conn, StoreError> {
        match self.inner.reads.get().await {
            Ok(object) => Ok(Conn::new(object)),
            Err(deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {
                Err(StoreError::ReadsBusy)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Refuses a write on a store opened read-only.
    fn writable(&self) -> Result<(), StoreError> {
        match self.inner.appends {
            Some(_) => Ok(()),
            None => Err(StoreError::ReadOnly),
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
}

/// A pooled connection that knows whether it is inside a transaction.
///
/// deadpool returns a dropped connection to the pool after checking only
/// that it is open (`RecyclingMethod::Fast`; the other methods run their
/// query when the connection is next taken, too late, and none of them
/// ends a transaction left open). A
/// connection dropped between BEGIN and COMMIT, because the future using
/// it was cancelled (a flush at its bound, a caller gone), would go back
/// with its transaction open: holding its locks while it sits idle, and
/// running the next caller's statements inside a transaction that is not
/// theirs, whose COMMIT would then commit the stranger's half-done work.
/// So such a connection is taken out of the pool and closed instead, with
/// a cancel request for the statement it may still be running: the server
/// rolls its transaction back and frees its locks at once rather than when
/// that statement ends, and the pool opens a fresh connection in its place.
pub(super) struct Conn {
    /// Always Some until dropped.
    object: Option<Object>,
    in_transaction: AtomicBool,
}

impl Conn {
    fn new(object: Object) -> Conn {
        Conn {
            object: Some(object),
            in_transaction: AtomicBool::new(false),
        }
    }

    /// From here until `ended`, dropping this connection closes it.
    fn begun(&self) {
        self.in_transaction.store(true, Ordering::SeqCst);
    }

    /// The transaction is over (COMMIT or ROLLBACK answered): the
    /// connection can go back to the pool.
    fn ended(&self) {
        self.in_transaction.store(false, Ordering::SeqCst);
    }
}

impl Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        match &self.object {
            Some(object) => object,
            // Taken only in `drop`, after which nothing can deref.
            None => unreachable!("a connection used after it was dropped"),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if !self.in_transaction.load(Ordering::SeqCst) {
            // Returned to the pool by the object's own drop.
            return;
        }
        if let Some(object) = self.object.take() {
            // A statement still running (waiting on a lock, say) would keep
            // the transaction and its locks until it ends on its own: ask
            // the server to cancel it. A request for a statement already
            // over, or a process already gone, does nothing.
            let cancel = object.cancel_token();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = cancel.cancel_query(NoTls).await;
                });
            }
            // Detached from the pool (which may then open another) and
            // dropped: the client goes, and its connection task sends
            // Terminate once the statements in flight are answered.
            drop(Object::take(object));
        }
    }
}

/// Runs `body` in a transaction on `client`: BEGIN is sent with the body's
/// first statement, COMMIT when it succeeds, ROLLBACK when it fails. If
/// this is cancelled before COMMIT or ROLLBACK is answered, or either
/// fails, the connection is closed when dropped (see [`Conn`]).
async fn transact<T>(
    client: &Conn,
    body: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    client.begun();
    let (begun, result) = tokio::join!(client.batch_execute("BEGIN"), body);
    if let Err(e) = begun {
        // Whatever the body did ran outside a transaction only if BEGIN
        // failed, and then the connection is broken and so did the body.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e.into());
    }
    match result {
        Ok(value) => {
            client.batch_execute("COMMIT").await?;
            client.ended();
            Ok(value)
        }
        Err(e) => {
            if client.batch_execute("ROLLBACK").await.is_ok() {
                client.ended();
            }
            Err(e)
        }
    }
}

/// The database server's clock, in milliseconds since the epoch: leases
/// are set and read by it, so that replicas on machines whose clocks
/// disagree still agree on when a claim runs out.
const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

/// A value of a BIGINT column as an unsigned count or id.
fn unsigned<T: TryFrom<i64>>(value: i64, what: &str) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} {value}")))
}

/// An unsigned id or count as a BIGINT value; past i64::MAX (which no row
/// has) it is -1, which matches nothing.
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(-1)
}

#[cfg(test)]
pub(super) mod testing;
#[cfg(test)]
mod tests;

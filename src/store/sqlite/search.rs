//! One leg of Search on SQLite: the tenant's FTS5 table (fts.rs), ranked by
//! bm25, with the filters applied before the limit; and the probe that
//! finds common terms. A session being erased (its entries still going, in
//! batches) is gone to search as to every other read.
//!
//! Each runs as a bounded read (`read_bounded`): stopped at the search's
//! deadline, and as soon as its caller's future is dropped; the CPU time
//! it takes is the search's work (`store/bound.rs`), so a search stopped
//! having mostly waited (for a thread, or the CPU) is busy, not costly. The progress
//! handler alone cannot do that: FTS5 walks a phrase's candidates inside
//! one step of the engine, where it is not called (`"b a b a …"` of 1,023
//! words ran 9 s past a bound of 200 million instructions). An interrupt
//! is seen there all the same: FTS5 reads each page of its index through a
//! statement of its own, and every statement stops at its first step once
//! interrupted (about 15 ms after the interrupt, measured on such a walk).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::ToSql;
use rusqlite::{Connection, InterruptHandle, params};

use super::{Sqlite, fts, lock};
use crate::model::{Millis, Role, Tenant};
use crate::search::query::{Query, Term, fts5_term};
use crate::store::StoreError;
use crate::store::bound::{SearchBound, ThreadWork};
use crate::store::search::{CANDIDATES, COMMON_DOCS, SearchHit, SearchScope};

/// The most progress-handler calls (each after this many virtual machine
/// instructions) one search statement may take before it is stopped with
/// `SearchTooCostly`: the bound on the work of one query.
const STEPS_PER_CALL: i32 = 10_000;
const MAX_CALLS: u32 = 20_000;

/// How often a stopped read is interrupted again while it runs: an
/// interrupt that lands between two statements is lost (SQLite clears it
/// when the next one starts).
const INTERRUPT_AGAIN: Duration = Duration::from_millis(50);

/// Runs `f` with the work bound set, and clears it after.
pub(super) fn bounded<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    bounded_by(conn, None, f)
}

/// `bounded`, and stopped by `stop` too.
fn bounded_by<T>(
    conn: &mut Connection,
    stop: Option<Arc<Stop>>,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut calls = 0u32;
    conn.progress_handler(
        STEPS_PER_CALL,
        Some(move || {
            calls += 1;
            calls > MAX_CALLS || stop.as_ref().is_some_and(|s| s.stopped())
        }),
    )?;
    let result = f(conn);
    // A pooled reader must not keep the bound for its next read.
    conn.progress_handler(0, None::<fn() -> bool>)?;
    result.map_err(|e| match e {
        StoreError::Query(ref source)
            if source
                .downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code)
                == Some(rusqlite::ErrorCode::OperationInterrupted) =>
        {
            StoreError::SearchTooCostly
        }
        other => other,
    })
}

/// What stops a read from another thread: the search's deadline, or its
/// caller gone.
#[derive(Default)]
struct Stop {
    stopped: AtomicBool,
    /// The connection's interrupt while the read runs on it; None before
    /// and after, so that no stop reaches a connection back in the pool.
    running: Mutex<Option<InterruptHandle>>,
}

impl Stop {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Marks the read stopped and interrupts it if it runs; whether it ran.
    fn interrupt(&self) -> bool {
        self.stopped.store(true, Ordering::SeqCst);
        match lock(&self.running).as_ref() {
            Some(running) => {
                running.interrupt();
                true
            }
            None => false,
        }
    }

    /// Stops the read: at once, and again every `INTERRUPT_AGAIN` while it
    /// runs. A read not begun yet is refused when it begins.
    fn stop(self: &Arc<Self>) {
        if !self.interrupt() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let stop = self.clone();
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(INTERRUPT_AGAIN).await;
                    if !stop.interrupt() {
                        return;
                    }
                }
            });
        }
    }

    /// Runs `f` on `conn` as the read this stops, unless it is stopped,
    /// counting the CPU time it takes as the search's work. Stopped at the
    /// deadline (before it began, or while it ran), it is what `bound`
    /// says: too costly, or busy when the search mostly waited (for this
    /// thread, or for the CPU while it ran).
    fn run<T>(
        self: &Arc<Self>,
        conn: &mut Connection,
        bound: &SearchBound,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        {
            let mut running = lock(&self.running);
            if self.stopped() {
                return Err(bound.spent());
            }
            *running = Some(conn.get_interrupt_handle());
        }
        let work = ThreadWork::start();
        let result = bounded_by(conn, Some(self.clone()), f);
        bound.add_work(work.done());
        *lock(&self.running) = None;
        match result {
            // An interrupt can surface as another error (FTS5's own).
            Err(_) if self.stopped() => Err(bound.spent()),
            // Past the work bound of a query (not stopped): too costly
            // however idle the server.
            other => other,
        }
    }
}

/// Stops its read when dropped: with the future that awaits the read
/// (a caller gone), or after it (then there is nothing left to stop).
struct StopOnDrop(Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The filters of a search over entries (`e`, of session `x`), every one
/// inside the leg, before its limit: ?2 tenant, ?3 subject, ?4 session
/// names, ?5 after, ?6 before (of when it was said), ?7 roles, ?8 levels,
/// ?9 metadata (a JSON object every pair of which the entry's holds).
/// Shared by both legs.
macro_rules! entry_filters {
    () => {
        "x.tenant = ?2 AND x.erasing IS NULL AND (?3 IS NULL OR x.subject = ?3) \
         AND (?4 IS NULL OR x.name IN (SELECT value FROM json_each(?4))) \
         AND (?5 IS NULL OR coalesce(e.occurred_at, e.created_at) > ?5) \
         AND (?6 IS NULL OR coalesce(e.occurred_at, e.created_at) < ?6) \
         AND (?7 IS NULL OR e.role IN (SELECT value FROM json_each(?7))) \
         AND 0 IN (SELECT value FROM json_each(?8)) \
         AND (?9 IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(?9) p WHERE NOT EXISTS \
         (SELECT 1 FROM json_each(e.metadata) q WHERE q.key = p.key AND q.value = p.value)))"
    };
}

/// When a summary (of node `g`) was said: its last entry's time.
macro_rules! summary_said {
    () => {
        "(SELECT coalesce(l.occurred_at, l.created_at) FROM entries l \
         WHERE l.session_id = g.session_id AND l.seq = g.last_seq)"
    };
}

/// As `entry_filters`, over summaries (`s`) of nodes (`g`): a role or a
/// metadata filter leaves every summary out.
macro_rules! summary_filters {
    () => {
        concat!(
            "x.tenant = ?2 AND x.erasing IS NULL AND (?3 IS NULL OR x.subject = ?3) \
             AND (?4 IS NULL OR x.name IN (SELECT value FROM json_each(?4))) \
             AND (?5 IS NULL OR ",
            summary_said!(),
            " > ?5) AND (?6 IS NULL OR ",
            summary_said!(),
            " < ?6) AND ?7 IS NULL AND ?9 IS NULL AND g.level IN (SELECT value FROM json_each(?8))"
        )
    };
}

/// What a hit's statement selects after its first columns (session name,
/// level, seq range, segment, role, time, text), read by name (`row`): for
/// an entry (`e`) when it was said, its speaker and metadata.
macro_rules! entry_said {
    () => {
        "coalesce(e.occurred_at, e.created_at) AS occurred_at, e.name AS speaker, \
         e.metadata AS metadata"
    };
}

/// As `entry_said`, for a summary of node `g`: its last entry's time.
macro_rules! summary_hit_said {
    () => {
        concat!(
            summary_said!(),
            " AS occurred_at, NULL AS speaker, NULL AS metadata"
        )
    };
}
pub(super) use {entry_filters, entry_said, summary_filters, summary_hit_said, summary_said};

/// The leg's statement over the tenant table `{table}`: ?1 the MATCH
/// expression, ?10 the limit, ?11 the candidates (`CANDIDATES`), ?12
/// whether to rank by weight (bm25) or, with only common words to go by,
/// newest first. Entries have positive document ids, summaries negative
/// ones (fts.rs). Each part walks its matches newest first (FTS5 reads a
/// rowid order from the index itself), filters them and ranks the first
/// ?11 that pass: the cost of a leg follows the candidates, not the number
/// of texts that hold the words (ties go to the newer), and the CASE keeps bm25 (which reads the
/// whole posting list of every term to weigh it) out of an unweighted leg.
const LEG: &str = concat!(
    "SELECT * FROM (SELECT x.name, 0, e.seq, e.seq, NULL, e.role, e.created_at, e.content, \
     CASE WHEN ?12 THEN bm25({table}) ELSE -coalesce(e.occurred_at, e.created_at) END, ",
    entry_said!(),
    " FROM {table} JOIN entries e ON e.session_id = ({table}.rowid >> 32) \
     AND e.seq = ({table}.rowid & 4294967295) JOIN sessions x ON x.id = e.session_id \
     WHERE {table} MATCH ?1 AND {table}.rowid > 0 AND ",
    entry_filters!(),
    " ORDER BY {table}.rowid DESC LIMIT ?11) \
     UNION ALL \
     SELECT * FROM (SELECT x.name, g.level, g.first_seq, g.last_seq, g.id, NULL, s.created_at, \
     s.text, CASE WHEN ?12 THEN bm25({table}) ELSE -s.created_at END, ",
    summary_hit_said!(),
    " FROM {table} JOIN summaries s ON s.segment_id = -{table}.rowid \
     JOIN segments g ON g.id = s.segment_id JOIN sessions x ON x.id = g.session_id \
     WHERE {table} MATCH ?1 AND {table}.rowid < 0 AND ",
    summary_filters!(),
    " ORDER BY {table}.rowid LIMIT ?11) ORDER BY 9, 10 DESC, 3 DESC LIMIT ?10"
);

/// The scope's filters as the statements' values ?2 to ?9.
pub(super) struct ScopeValues {
    tenant: String,
    subject: Option<String>,
    sessions: Option<String>,
    after: Option<i64>,
    before: Option<i64>,
    roles: Option<String>,
    levels: String,
    metadata: Option<String>,
}

impl ScopeValues {
    pub(super) fn new(tenant: &Tenant, scope: &SearchScope) -> Result<ScopeValues, StoreError> {
        // Names are JSON-quoted by serde_json, not by hand.
        let sessions = (!scope.sessions.is_empty())
            .then(|| {
                let names: Vec<&str> = scope.sessions.iter().map(|s| s.as_str()).collect();
                serde_json::to_string(&names)
            })
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("session names: {e}")))?;
        Ok(ScopeValues {
            tenant: tenant.0.clone(),
            subject: scope.subject.as_ref().map(|s| s.as_str().to_owned()),
            sessions,
            after: scope.after.map(|m| m.0),
            before: scope.before.map(|m| m.0),
            roles: (!scope.roles.is_empty())
                .then(|| json_list(scope.roles.iter().map(|r| r.code()))),
            levels: json_list(scope.levels().into_iter()),
            metadata: (!scope.metadata.is_empty())
                .then(|| serde_json::to_string(&scope.metadata))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("metadata: {e}")))?,
        })
    }

    /// The session filters alone (tenant, subject, names), as ?1 to ?3.
    pub(super) fn session_params(&self) -> [&dyn ToSql; 3] {
        [&self.tenant, &self.subject, &self.sessions]
    }

    /// ?1, the scope's ?2 to ?9, and any after them.
    pub(super) fn params<'a>(
        &'a self,
        first: &'a dyn ToSql,
        rest: &[&'a dyn ToSql],
    ) -> Vec<&'a dyn ToSql> {
        let mut all: Vec<&dyn ToSql> = vec![
            first,
            &self.tenant,
            &self.subject,
            &self.sessions,
            &self.after,
            &self.before,
            &self.roles,
            &self.levels,
            &self.metadata,
        ];
        all.extend_from_slice(rest);
        all
    }
}

fn json_list<T: ToString>(items: impl Iterator<Item = T>) -> String {
    let items: Vec<String> = items.map(|i| i.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// A hit as the legs' statements select it (session name, level, seq
/// range, segment, role, time, text, then `entry_said` or
/// `summary_hit_said`'s columns by name).
pub(super) fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SearchHit> {
    let role: Option<i64> = r.get(5)?;
    let metadata: Option<String> = r.get("metadata")?;
    let metadata = crate::store::decode_metadata(metadata.as_deref()).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(10, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(SearchHit {
        session: r.get(0)?,
        level: r.get(1)?,
        first_seq: r.get(2)?,
        last_seq: r.get(3)?,
        segment_id: r.get(4)?,
        role: role.and_then(Role::from_code),
        created_at: Millis(r.get(6)?),
        occurred_at: Millis(r.get("occurred_at")?),
        name: r.get("speaker")?,
        metadata,
        text: r.get(7)?,
        score: 0.0,
        legs: Vec::new(),
        similarity: 0.0,
        lexical_rank: 0,
        semantic_rank: 0,
        held: 0.0,
    })
}

impl Sqlite {
    /// `read` under the work bound, stopped (`SearchTooCostly` or
    /// `SearchBusy`, as `bound` says) at its deadline and as soon as this
    /// future is dropped.
    async fn read_bounded<T, F>(&self, bound: &SearchBound, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let stop = Arc::new(Stop::default());
        let _on_drop = StopOnDrop(stop.clone());
        let runs = stop.clone();
        let counts = bound.clone();
        let read = self.read_mut(move |conn| runs.run(conn, &counts, f));
        tokio::pin!(read);
        tokio::select! {
            biased;
            done = &mut read => done,
            () = tokio::time::sleep_until(bound.deadline()) => {
                stop.stop();
                // Awaited: the read transaction has ended when this answers.
                read.await
            }
        }
    }

    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        weighed: bool,
        bound: &SearchBound,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let matching = query.fts5();
        let values = ScopeValues::new(tenant, scope)?;
        let tenant = tenant.0.clone();
        self.read_bounded(bound, move |conn| {
            // A tenant with nothing indexed yet has no table.
            let Some(k) = fts::table_of(conn, &tenant)? else {
                return Ok(Vec::new());
            };
            let sql = LEG.replace("{table}", &fts::name(k));
            let mut stmt = conn.prepare_cached(&sql)?;
            let params = values.params(&matching, &[&limit, &CANDIDATES, &weighed]);
            let rows = stmt.query_map(params.as_slice(), row)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// In how many of the tenant's documents each term is, counted up to
    /// `COMMON_DOCS` (counting stops there, and reads no weights), in one
    /// read.
    pub(crate) async fn term_docs(
        &self,
        tenant: &Tenant,
        terms: &[Term],
        bound: &SearchBound,
    ) -> Result<Vec<u32>, StoreError> {
        let matching: Vec<String> = terms
            .iter()
            .map(|t| format!("body : {}", fts5_term(t)))
            .collect();
        let tenant = tenant.0.clone();
        self.read_bounded(bound, move |conn| {
            let Some(k) = fts::table_of(conn, &tenant)? else {
                return Ok(vec![0; matching.len()]);
            };
            let table = fts::name(k);
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ?1 LIMIT ?2)"
            ))?;
            let mut docs = Vec::with_capacity(matching.len());
            for m in &matching {
                docs.push(stmt.query_row(params![m, COMMON_DOCS], |r| r.get::<_, u32>(0))?);
            }
            Ok(docs)
        })
        .await
    }
}

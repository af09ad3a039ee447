//! Reading segments: one, a page, a session's, the context walk, the
//! backlog, a backfill run's candidates and the reconciler's due scan; the
//! operator's requeue and unpark; and the folding of the kept counts.

use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use super::rows::{self, ENTRY_COLUMNS, SEGMENT_COLUMN_COUNT, SEGMENT_COLUMNS, SEGMENT_FROM};
use super::{DB_NOW, Postgres, signed, transact, unsigned};
use crate::model::{
    Backlog, Context, Entry, Millis, Segment, SegmentId, SegmentState, SessionName, Tenant,
};
use crate::store::context::{Budget, Tree, cover};
use crate::store::{BackfillFilter, BytesBound, SegmentFilter, StoreError, state_codes};

/// The advisory lock the folding of count deltas holds, so that one
/// replica folds at a time ("counts", any fixed number).
const COUNTS_LOCK: i64 = 0x636f_756e_7473;
/// Most count deltas folded in one go.
const FOLD_BATCH: i64 = 10_000;

type Param = Box<dyn ToSql + Sync + Send>;

fn refs(values: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// The WHERE clause (over `segments s JOIN sessions x`) and its values.
fn filter_clause(tenant: &str, filter: &SegmentFilter) -> (String, Vec<Param>) {
    let mut values: Vec<Param> = vec![Box::new(tenant.to_owned())];
    let mut clause = "x.tenant = $1".to_owned();
    if let Some(session) = &filter.session {
        values.push(Box::new(session.as_str().to_owned()));
        clause.push_str(&format!(" AND x.name = ${}", values.len()));
    }
    if !filter.states.is_empty() {
        clause.push_str(&format!(
            " AND s.state IN ({})",
            state_codes(&filter.states)
        ));
    }
    if !filter.levels.is_empty() {
        // Levels are integers checked at the edge, never caller text.
        let levels: Vec<String> = filter.levels.iter().map(u32::to_string).collect();
        clause.push_str(&format!(" AND s.level IN ({})", levels.join(",")));
    }
    if !filter.ids.is_empty() {
        let ids: Vec<i64> = filter.ids.iter().map(|id| signed(*id)).collect();
        values.push(Box::new(ids));
        clause.push_str(&format!(" AND s.id = ANY(${})", values.len()));
    }
    (clause, values)
}

/// The session's id, if the tenant has it.
async fn session_id(client: &Object, tenant: &str, name: &str) -> Result<Option<i64>, StoreError> {
    let stmt = client
        .prepare_cached("SELECT id FROM sessions WHERE tenant = $1 AND name = $2")
        .await?;
    Ok(match client.query_opt(&stmt, &[&tenant, &name]).await? {
        Some(r) => Some(r.try_get(0)?),
        None => None,
    })
}

/// Visits a session's entries with seqs `first..=last`, newest or oldest
/// first, until `visit` returns false.
pub(super) async fn entries_between(
    client: &Object,
    session_id: i64,
    first: u64,
    last: u64,
    newest_first: bool,
    visit: &mut (dyn FnMut(Entry) -> bool + Send),
) -> Result<(), StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS} FROM entries WHERE session_id = $1 AND seq BETWEEN $2 AND $3 \
         ORDER BY seq {}",
        if newest_first { "DESC" } else { "ASC" }
    );
    let stmt = client.prepare_cached(&sql).await?;
    for row in client
        .query(&stmt, &[&session_id, &signed(first), &signed(last)])
        .await?
    {
        if !visit(rows::entry(&row)?) {
            break;
        }
    }
    Ok(())
}

/// Every segment a query over `SEGMENT_FROM` returns.
async fn collect_segments(
    client: &Object,
    sql: &str,
    values: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Segment>, StoreError> {
    let stmt = client.prepare_cached(sql).await?;
    client
        .query(&stmt, values)
        .await?
        .iter()
        .map(rows::segment)
        .collect()
}

/// A session's memory tree as the cover reads it. The cover is written
/// for a backend that answers at once (`context.rs`), so it runs on a
/// blocking thread and each read blocks there on the runtime, inside one
/// REPEATABLE READ transaction: a consistent snapshot of the session.
struct PgTree<'c> {
    client: &'c Object,
    session_id: i64,
    runtime: tokio::runtime::Handle,
}

impl Tree for PgTree<'_> {
    fn roots_before(&mut self, before: u64, limit: u32) -> Result<Vec<Segment>, StoreError> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} \
             WHERE s.session_id = $1 AND s.parent_id IS NULL AND s.first_seq < $2 \
             ORDER BY s.first_seq DESC LIMIT $3"
        );
        // No seq is past i64::MAX: "before" anything larger is before that.
        let (before, limit) = (signed(before.min(i64::MAX as u64)), i64::from(limit));
        self.runtime.block_on(collect_segments(
            self.client,
            &sql,
            &[&self.session_id, &before, &limit],
        ))
    }

    fn children(&mut self, node: &Segment) -> Result<Vec<Segment>, StoreError> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.parent_id = $1 ORDER BY s.ordinal"
        );
        self.runtime
            .block_on(collect_segments(self.client, &sql, &[&signed(node.id)]))
    }

    fn entries(
        &mut self,
        first: u64,
        mut last: u64,
        visit: &mut dyn FnMut(Entry) -> bool,
    ) -> Result<(), StoreError> {
        // Read in pages, newest first, so that a walk that stops early (the
        // budget is spent) reads little more than it returns, however long
        // the range.
        let sql = format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE session_id = $1 AND seq BETWEEN $2 AND $3 \
             ORDER BY seq DESC LIMIT {ENTRY_PAGE}"
        );
        while first <= last {
            let rows = self.runtime.block_on(async {
                let stmt = self.client.prepare_cached(&sql).await?;
                self.client
                    .query(&stmt, &[&self.session_id, &signed(first), &signed(last)])
                    .await
            })?;
            let Some(oldest) = rows.last().map(rows::entry).transpose()? else {
                return Ok(());
            };
            for row in &rows {
                if !visit(rows::entry(row)?) {
                    return Ok(());
                }
            }
            match oldest.seq.checked_sub(1) {
                Some(before) if rows.len() as i64 == ENTRY_PAGE => last = before,
                _ => return Ok(()),
            }
        }
        Ok(())
    }
}

/// Entries one read of the cover fetches.
const ENTRY_PAGE: i64 = 64;

impl Postgres {
    pub(crate) async fn segment(
        &self,
        tenant: &Tenant,
        id: SegmentId,
    ) -> Result<Segment, StoreError> {
        let Ok(signed_id) = i64::try_from(id) else {
            return Err(StoreError::SegmentNotFound(id));
        };
        let client = self.client().await?;
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.id = $1 AND x.tenant = $2"
        );
        let stmt = client.prepare_cached(&sql).await?;
        match client.query_opt(&stmt, &[&signed_id, &tenant.0]).await? {
            Some(row) => rows::segment(&row),
            None => Err(StoreError::SegmentNotFound(id)),
        }
    }

    pub(crate) async fn segment_any(&self, id: SegmentId) -> Result<(Segment, bool), StoreError> {
        let Ok(signed_id) = i64::try_from(id) else {
            return Err(StoreError::SegmentNotFound(id));
        };
        let client = self.client().await?;
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS}, coalesce(s.claim_expires_at > {DB_NOW}, false) \
             FROM {SEGMENT_FROM} WHERE s.id = $1"
        );
        let stmt = client.prepare_cached(&sql).await?;
        match client.query_opt(&stmt, &[&signed_id]).await? {
            Some(row) => Ok((rows::segment(&row)?, row.try_get(SEGMENT_COLUMN_COUNT)?)),
            None => Err(StoreError::SegmentNotFound(id)),
        }
    }

    pub(crate) async fn list_segments(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
        after: SegmentId,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        let client = self.reader().await?;
        let (clause, mut values) = filter_clause(&tenant.0, &filter);
        values.push(Box::new(signed(after)));
        values.push(Box::new(i64::from(limit)));
        let n = values.len();
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE {clause} AND s.id > ${} \
             ORDER BY s.id LIMIT ${n}",
            n - 1
        );
        let stmt = client.prepare_cached(&sql).await?;
        let mut page = BytesBound::new(max_bytes);
        for row in client.query(&stmt, &refs(&values)).await? {
            if !page.take(rows::segment(&row)?) {
                return Ok((page.items, true));
            }
        }
        Ok((page.items, false))
    }

    pub(crate) async fn pending_in_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Vec<(SegmentId, Option<Millis>)>, StoreError> {
        let client = self.client().await?;
        let Some(id) = session_id(&client, &tenant.0, session.as_str()).await? else {
            return Err(StoreError::SessionNotFound(session.as_str().to_owned()));
        };
        let stmt = client
            .prepare_cached(
                "SELECT id, next_attempt_at FROM segments \
                 WHERE session_id = $1 AND level = 1 AND state = $2 ORDER BY ordinal",
            )
            .await?;
        client
            .query(&stmt, &[&id, &SegmentState::Pending.code()])
            .await?
            .iter()
            .map(|r| {
                Ok((
                    unsigned(r.try_get(0)?, "segment id")?,
                    r.try_get::<_, Option<i64>>(1)?.map(Millis),
                ))
            })
            .collect()
    }

    pub(crate) async fn flushed(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        let client = self.reader().await?;
        let Some(id) = session_id(&client, &tenant.0, session.as_str()).await? else {
            return Err(StoreError::SessionNotFound(session.as_str().to_owned()));
        };
        let summarised = SegmentState::Summarised.code();
        let mut kept = BytesBound::new(max_bytes);
        let mut complete = true;
        // Those still owed a recap first, then the summarised ones; each
        // newest first, as far as the bytes go.
        for op in ["!=", "="] {
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} \
                 WHERE s.session_id = $1 AND s.level = 1 AND s.state {op} $2 \
                 ORDER BY s.ordinal DESC"
            );
            let stmt = client.prepare_cached(&sql).await?;
            for row in client.query(&stmt, &[&id, &summarised]).await? {
                let segment = rows::segment(&row)?;
                if segment.state != SegmentState::Summarised {
                    complete = false;
                }
                if !kept.take(segment) {
                    break;
                }
            }
        }
        let mut segments = kept.items;
        segments.sort_by_key(|s| s.ordinal);
        Ok((segments, complete))
    }

    pub(crate) async fn context(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        budget: Budget,
    ) -> Result<Context, StoreError> {
        let client = self.reader().await?;
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Handle::current();
            // Until COMMIT is answered, dropping the connection (a panic
            // in the walk) closes it (see `Conn`).
            client.begun();
            runtime.block_on(
                client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
            )?;
            let result = (|| {
                let Some(id) = runtime.block_on(session_id(&client, &tenant, &session))? else {
                    return Err(StoreError::SessionNotFound(session.clone()));
                };
                cover(
                    &mut PgTree {
                        client: &client,
                        session_id: id,
                        runtime: runtime.clone(),
                    },
                    budget,
                )
            })();
            let end = runtime.block_on(client.batch_execute("COMMIT"));
            if end.is_ok() {
                client.ended();
            }
            let value = result?;
            end?;
            Ok(value)
        })
        .await
        .map_err(StoreError::Worker)?
    }

    pub(crate) async fn backlog(&self, tenant: Option<&Tenant>) -> Result<Backlog, StoreError> {
        if self.writable().is_ok() {
            self.fold_counts().await?;
        }
        let client = self.reader().await?;
        let tenant = tenant.map(|t| t.0.clone());
        let mut backlog = Backlog::default();
        // Counts from the kept totals and the deltas not folded in yet; the
        // oldest PENDING and the parked classes read only PENDING and PARKED
        // rows (through the state index), so the cost follows the backlog.
        let counts = client
            .prepare_cached(
                "SELECT state, sum(n)::BIGINT FROM ( \
                 SELECT tenant, state, n FROM segment_counts \
                 UNION ALL SELECT tenant, state, d FROM segment_count_deltas) c \
                 WHERE ($1::TEXT IS NULL OR tenant = $1) GROUP BY state",
            )
            .await?;
        let oldest = client
            .prepare_cached(
                "SELECT min(s.closed_at) FROM segments s \
                 JOIN sessions x ON x.id = s.session_id \
                 WHERE s.state = $2 AND ($1::TEXT IS NULL OR x.tenant = $1)",
            )
            .await?;
        let parked = client
            .prepare_cached(
                "SELECT coalesce(s.failure_class, 'unknown'), count(*) FROM segments s \
                 JOIN sessions x ON x.id = s.session_id \
                 WHERE ($1::TEXT IS NULL OR x.tenant = $1) AND s.state = $2 \
                 GROUP BY 1 ORDER BY 1",
            )
            .await?;
        let (counts, oldest, parked) = tokio::try_join!(
            async { client.query(&counts, &[&tenant]).await },
            async {
                client
                    .query_one(&oldest, &[&tenant, &SegmentState::Pending.code()])
                    .await
            },
            async {
                client
                    .query(&parked, &[&tenant, &SegmentState::Parked.code()])
                    .await
            },
        )?;
        for row in counts {
            let state: i64 = row.try_get(0)?;
            let count = u64::try_from(row.try_get::<_, Option<i64>>(1)?.unwrap_or(0)).unwrap_or(0);
            match SegmentState::from_code(state) {
                Some(SegmentState::Open) => backlog.open = count,
                Some(SegmentState::Pending) => backlog.pending = count,
                Some(SegmentState::Summarised) => backlog.summarised = count,
                Some(SegmentState::Parked) => backlog.parked = count,
                None => return Err(StoreError::Corrupt(format!("segment state {state}"))),
            }
        }
        let oldest: Option<i64> = oldest.try_get(0)?;
        backlog.oldest_pending_age = oldest.map(|t| Millis(t).age_at(Millis::now()));
        for row in parked {
            backlog
                .parked_by_class
                .push((row.try_get(0)?, unsigned(row.try_get(1)?, "count")?));
        }
        Ok(backlog)
    }

    /// Folds the count deltas the triggers appended into the totals, when
    /// no other replica is doing it at the moment.
    async fn fold_counts(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let body = async {
            let lock = client
                .prepare_cached("SELECT pg_try_advisory_xact_lock($1)")
                .await?;
            let fold = client
                .prepare_cached(
                    "WITH moved AS ( \
                     DELETE FROM segment_count_deltas WHERE id IN \
                     (SELECT id FROM segment_count_deltas ORDER BY id LIMIT $1) \
                     RETURNING tenant, state, d), \
                     sums AS (SELECT tenant, state, sum(d)::BIGINT AS d FROM moved \
                     GROUP BY tenant, state) \
                     INSERT INTO segment_counts (tenant, state, n) \
                     SELECT tenant, state, d FROM sums ORDER BY tenant, state \
                     ON CONFLICT (tenant, state) DO UPDATE SET n = segment_counts.n + excluded.n",
                )
                .await?;
            let locked: bool = client.query_one(&lock, &[&COUNTS_LOCK]).await?.try_get(0)?;
            if locked {
                client.execute(&fold, &[&FOLD_BATCH]).await?;
            }
            Ok(())
        };
        transact(&client, body).await
    }

    pub(crate) async fn requeue(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
    ) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let (clause, mut values) = filter_clause(&tenant.0, &filter);
        values.push(Box::new(Millis::now().0));
        // Locked in id order before they change (see the module doc of
        // `postgres`). Locking rechecks the filter on a row that changed
        // while it waited, so a segment summarised meanwhile is left alone;
        // MATERIALIZED keeps the locking query whole.
        let sql = format!(
            "WITH locked AS MATERIALIZED (SELECT s.id FROM segments s \
             JOIN sessions x ON x.id = s.session_id WHERE {clause} \
             ORDER BY s.id FOR UPDATE OF s) \
             UPDATE segments s SET state = {pending}, next_attempt_at = ${n} \
             FROM locked WHERE s.id = locked.id",
            pending = SegmentState::Pending.code(),
            n = values.len(),
        );
        let result = client.execute(&sql, &refs(&values)).await;
        self.noting_full(result.map_err(StoreError::from))
    }

    pub(crate) async fn backfill_segments(
        &self,
        filter: BackfillFilter,
    ) -> Result<Vec<(Segment, bool)>, StoreError> {
        let client = self.client().await?;
        let mut values: Vec<Param> = Vec::new();
        let mut clause = String::from("TRUE");
        if let Some(session) = &filter.session {
            values.push(Box::new(session.as_str().to_owned()));
            clause.push_str(&format!(" AND x.name = ${}", values.len()));
        }
        if let Some(before) = filter.closed_before {
            values.push(Box::new(before.0));
            clause.push_str(&format!(" AND s.closed_at < ${}", values.len()));
        }
        if let Some(after) = filter.closed_after {
            values.push(Box::new(after.0));
            clause.push_str(&format!(" AND s.closed_at > ${}", values.len()));
        }
        if filter.states.is_empty() {
            clause.push_str(" AND FALSE");
        } else {
            clause.push_str(&format!(
                " AND s.state IN ({})",
                state_codes(&filter.states)
            ));
        }
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS}, coalesce(s.claim_expires_at > {DB_NOW}, false) \
             FROM {SEGMENT_FROM} WHERE {clause} ORDER BY s.id"
        );
        client
            .query(&sql, &refs(&values))
            .await?
            .iter()
            .map(|r| Ok((rows::segment(r)?, r.try_get(SEGMENT_COLUMN_COUNT)?)))
            .collect()
    }

    pub(crate) async fn unpark(&self, ids: Vec<SegmentId>) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let ids: Vec<i64> = ids.into_iter().map(signed).collect();
        // Locked in id order before they change (see the module doc of
        // `postgres`); MATERIALIZED keeps the locking query whole.
        let stmt = client
            .prepare_cached(
                "WITH locked AS MATERIALIZED (SELECT id FROM segments \
                 WHERE id = ANY($3) AND state = $4 ORDER BY id FOR UPDATE) \
                 UPDATE segments s SET state = $1, next_attempt_at = $2 \
                 FROM locked WHERE s.id = locked.id",
            )
            .await?;
        let result = client
            .execute(
                &stmt,
                &[
                    &SegmentState::Pending.code(),
                    &Millis::now().0,
                    &ids,
                    &SegmentState::Parked.code(),
                ],
            )
            .await;
        self.noting_full(result.map_err(StoreError::from))
    }

    /// Fails if a write failed for want of room since the last probe; else
    /// writes the probe row and reads it back, and folds the count deltas.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        if self.take_full_seen() {
            return Err(StoreError::Full(
                "writes failed for want of room since the last probe".into(),
            ));
        }
        self.writable()?;
        let client = self.client().await?;
        let write = client
            .prepare_cached(
                "INSERT INTO health_probe (id, at) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            )
            .await?;
        let read = client
            .prepare_cached("SELECT at FROM health_probe WHERE id = 1")
            .await?;
        let written = client.execute(&write, &[&Millis::now().0]).await;
        self.noting_full(written.map_err(StoreError::from))?;
        client.query_one(&read, &[]).await?;
        drop(client);
        self.fold_counts().await
    }

    pub(crate) async fn due_segments(
        &self,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<SegmentId>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT id FROM segments WHERE state = $1 AND next_attempt_at <= $2 \
                 AND (claim_expires_at IS NULL OR claim_expires_at <= {DB_NOW}) \
                 ORDER BY next_attempt_at LIMIT $3"
            ))
            .await?;
        client
            .query(
                &stmt,
                &[&SegmentState::Pending.code(), &now.0, &i64::from(limit)],
            )
            .await?
            .iter()
            .map(|r| unsigned(r.try_get(0)?, "segment id"))
            .collect()
    }
}

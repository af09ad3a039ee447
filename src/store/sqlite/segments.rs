//! Reading segments: one, a page, a session's, the context walk, the
//! backlog, a backfill run's candidates and the reconciler's due scan; and
//! the operator's requeue and unpark.

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::Sqlite;
use super::rows::{self, ENTRY_COLUMNS, SEGMENT_COLUMNS, SEGMENT_FROM, after_segment};
use super::sessions::session_row;
use crate::model::{
    Backlog, Context, Entry, Millis, Segment, SegmentId, SegmentState, SessionName, Tenant,
};
use crate::store::context::{Budget, Tree, cover};
use crate::store::{BackfillFilter, BytesBound, SegmentFilter, StoreError, state_codes};

/// Oldest first or newest first.
#[derive(Clone, Copy)]
pub(super) enum Order {
    Asc,
    Desc,
}

/// Visits a session's entries with seqs `first..=last` in `order` until
/// `visit` returns false.
pub(super) fn entries_between(
    conn: &Connection,
    session_id: i64,
    first: u64,
    last: u64,
    order: Order,
    visit: &mut dyn FnMut(Entry) -> bool,
) -> Result<(), StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS} FROM entries WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3 \
         ORDER BY seq {}",
        match order {
            Order::Asc => "ASC",
            Order::Desc => "DESC",
        }
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    for entry in stmt.query_map(params![session_id, first, last], rows::entry)? {
        if !visit(entry??) {
            break;
        }
    }
    Ok(())
}

/// A session's memory tree as the cover reads it.
struct SqliteTree<'c> {
    conn: &'c Connection,
    session_id: i64,
}

impl Tree for SqliteTree<'_> {
    fn roots_before(&mut self, before: u64, limit: u32) -> Result<Vec<Segment>, StoreError> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} \
             WHERE s.session_id = ?1 AND s.parent_id IS NULL AND s.first_seq < ?2 \
             ORDER BY s.first_seq DESC LIMIT ?3"
        );
        let before = before.min(i64::MAX as u64);
        collect_segments(self.conn, &sql, params![self.session_id, before, limit])
    }

    fn children(&mut self, node: &Segment) -> Result<Vec<Segment>, StoreError> {
        let sql = format!(
            "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.parent_id = ?1 ORDER BY s.ordinal"
        );
        collect_segments(self.conn, &sql, [node.id])
    }

    fn entries(
        &mut self,
        first: u64,
        last: u64,
        visit: &mut dyn FnMut(Entry) -> bool,
    ) -> Result<(), StoreError> {
        // Rows are read as they are visited: the walk stops where the
        // budget does.
        entries_between(self.conn, self.session_id, first, last, Order::Desc, visit)
    }
}

/// Every segment a query over `SEGMENT_FROM` returns.
fn collect_segments(
    conn: &Connection,
    sql: &str,
    values: impl rusqlite::Params,
) -> Result<Vec<Segment>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(values, rows::segment)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row??);
    }
    Ok(out)
}

impl Sqlite {
    pub(crate) async fn segment(
        &self,
        tenant: &Tenant,
        id: SegmentId,
    ) -> Result<Segment, StoreError> {
        if i64::try_from(id).is_err() {
            return Err(StoreError::SegmentNotFound(id));
        }
        let tenant = tenant.0.clone();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE s.id = ?1 AND x.tenant = ?2"
            );
            conn.prepare_cached(&sql)?
                .query_row(params![id, tenant], rows::segment)
                .optional()?
                .ok_or(StoreError::SegmentNotFound(id))?
        })
        .await
    }

    pub(crate) async fn segment_any(&self, id: SegmentId) -> Result<(Segment, bool), StoreError> {
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
                    Ok((rows::segment(r)?, after_segment::<Option<bool>>(r, 0)?))
                })
                .optional()?
                .ok_or(StoreError::SegmentNotFound(id))?;
            Ok((segment?, claimed.unwrap_or(false)))
        })
        .await
    }

    pub(crate) async fn list_segments(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
        after: SegmentId,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        let tenant = tenant.0.clone();
        self.read(move |conn| {
            let (clause, mut values) = filter_clause(&tenant, &filter);
            values.push(Value::Integer(after as i64));
            values.push(Value::Integer(i64::from(limit)));
            let n = values.len();
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} WHERE {clause} AND s.id > ?{} \
                 ORDER BY s.id LIMIT ?{n}",
                n - 1
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut page = BytesBound::new(max_bytes);
            for row in stmt.query_map(params_from_iter(values), rows::segment)? {
                if !page.take(row??) {
                    return Ok((page.items, true));
                }
            }
            Ok((page.items, false))
        })
        .await
    }

    pub(crate) async fn pending_in_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Vec<(SegmentId, Option<Millis>)>, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            let mut stmt = conn.prepare_cached(
                "SELECT id, next_attempt_at FROM segments \
                 WHERE session_id = ?1 AND level = 1 AND state = ?2 ORDER BY ordinal",
            )?;
            let rows = stmt.query_map(params![row.id, SegmentState::Pending.code()], |r| {
                Ok((r.get::<_, u64>(0)?, r.get::<_, Option<i64>>(1)?.map(Millis)))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    pub(crate) async fn flushed(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        max_bytes: usize,
    ) -> Result<(Vec<Segment>, bool), StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            let summarised = SegmentState::Summarised.code();
            let mut kept = BytesBound::new(max_bytes);
            let mut complete = true;
            // Those still owed a recap first, then the summarised ones; each
            // newest first, as far as the bytes go.
            for op in ["!=", "="] {
                let sql = format!(
                    "SELECT {SEGMENT_COLUMNS} FROM {SEGMENT_FROM} \
                     WHERE s.session_id = ?1 AND s.level = 1 AND s.state {op} ?2 \
                     ORDER BY s.ordinal DESC"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                for segment in stmt.query_map(params![row.id, summarised], rows::segment)? {
                    let segment = segment??;
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
        })
        .await
    }

    pub(crate) async fn context(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        budget: Budget,
    ) -> Result<Context, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            cover(
                &mut SqliteTree {
                    conn,
                    session_id: row.id,
                },
                budget,
            )
        })
        .await
    }

    pub(crate) async fn backlog(&self, tenant: Option<&Tenant>) -> Result<Backlog, StoreError> {
        let tenant = tenant.map(|t| t.0.clone());
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
            // Recorded ones wait for a scrub of the files; sessions still
            // `erasing` wait for their batches (one going on in the
            // background while another process holds the search file).
            backlog.erasures_pending = conn
                .prepare_cached(
                    "SELECT (SELECT count(*) FROM erasures_pending WHERE (?1 IS NULL OR tenant = ?1)) \
                     + (SELECT count(*) FROM sessions \
                        WHERE erasing IS NOT NULL AND (?1 IS NULL OR tenant = ?1))",
                )?
                .query_row([&tenant], |r| r.get(0))?;
            let (unindexed, oldest) = super::fts::tail(conn, tenant.as_deref())?;
            backlog.unindexed = unindexed;
            backlog.oldest_unindexed_age = oldest.map(|t| Millis(t).age_at(Millis::now()));
            Ok(backlog)
        })
        .await
    }

    pub(crate) async fn requeue(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
    ) -> Result<u64, StoreError> {
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
            let n = conn.execute(&sql, params_from_iter(values))?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) async fn backfill_segments(
        &self,
        filter: BackfillFilter,
    ) -> Result<Vec<(Segment, bool)>, StoreError> {
        self.read(move |conn| {
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
            clause.push_str(&format!(" AND s.state IN ({})", state_codes(&filter.states)));
            let sql = format!(
                "SELECT {SEGMENT_COLUMNS}, coalesce(s.claim_expires_at > ?1, 0) FROM {SEGMENT_FROM} \
                 WHERE {clause} ORDER BY s.id"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(params_from_iter(values), |r| {
                Ok((rows::segment(r)?, after_segment::<bool>(r, 0)?))
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

    pub(crate) async fn unpark(&self, ids: Vec<SegmentId>) -> Result<u64, StoreError> {
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

    /// Fails if a write failed for want of room since the last probe (the
    /// probe's own small row may still fit where an append does not);
    /// else writes the probe row through the writer (a commit, as every
    /// write makes) and reads it back on a read connection.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        if self.take_full_seen() {
            return Err(StoreError::Full(
                "writes failed for want of room since the last probe".into(),
            ));
        }
        let at = Millis::now().0;
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO health_probe (id, at) VALUES (1, ?1) \
                 ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            )?
            .execute([at])?;
            Ok(())
        })
        .await?;
        self.read(|conn| {
            conn.prepare_cached("SELECT at FROM health_probe WHERE id = 1")?
                .query_row([], |r| r.get::<_, i64>(0))?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn due_segments(
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
}

/// The WHERE clause (over `segments s JOIN sessions x`) and its values.
fn filter_clause(tenant: &str, filter: &SegmentFilter) -> (String, Vec<Value>) {
    let mut values = vec![Value::Text(tenant.to_owned())];
    let mut clause = "x.tenant = ?1".to_owned();
    if let Some(session) = &filter.session {
        values.push(Value::Text(session.as_str().to_owned()));
        clause.push_str(&format!(" AND x.name = ?{}", values.len()));
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

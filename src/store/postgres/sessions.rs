//! Sessions and their open segment outside the append writer: closing a
//! session's open segment on demand or when idle, and the listing of a
//! tenant's sessions.

use deadpool_postgres::Object;

use super::{Postgres, transact, unsigned};
use crate::model::{Millis, SegmentId, SegmentState, SessionInfo, SessionName, Subject, Tenant};
use crate::store::{SessionRef, StoreError};

/// Closes the OPEN segments `ids`, due now.
async fn close_segment(client: &Object, ids: &[i64], now: Millis) -> Result<(), StoreError> {
    // Locked in id order before they change (see the module doc of
    // `postgres`); MATERIALIZED keeps the locking query whole.
    let stmt = client
        .prepare_cached(
            "WITH locked AS MATERIALIZED (SELECT id FROM segments \
             WHERE id = ANY($3) AND state = $4 ORDER BY id FOR UPDATE) \
             UPDATE segments s SET state = $1, closed_at = $2, next_attempt_at = $2 \
             FROM locked WHERE s.id = locked.id",
        )
        .await?;
    client
        .execute(
            &stmt,
            &[
                &SegmentState::Pending.code(),
                &now.0,
                &ids,
                &SegmentState::Open.code(),
            ],
        )
        .await?;
    Ok(())
}

impl Postgres {
    pub(crate) async fn close_open_segment(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<SegmentId>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            let lock = client
                .prepare_cached(
                    "SELECT id, open_segment_id FROM sessions WHERE tenant = $1 AND name = $2 \
                     FOR NO KEY UPDATE",
                )
                .await?;
            let Some(row) = client
                .query_opt(&lock, &[&tenant.0, &session.as_str()])
                .await?
            else {
                return Err(StoreError::SessionNotFound(session.as_str().to_owned()));
            };
            let id: i64 = row.try_get(0)?;
            let Some(open) = row.try_get::<_, Option<i64>>(1)? else {
                return Ok(None);
            };
            let clear = client
                .prepare_cached("UPDATE sessions SET open_segment_id = NULL WHERE id = $1")
                .await?;
            tokio::try_join!(
                biased;
                async { close_segment(&client, &[open], Millis::now()).await },
                async { Ok(client.execute(&clear, &[&id]).await?) }
            )?;
            Ok(Some(unsigned(open, "segment id")?))
        };
        self.noting_full(transact(&client, body).await)
    }

    #[cfg(test)]
    pub(crate) async fn has_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT 1 FROM sessions WHERE tenant = $1 AND name = $2")
            .await?;
        Ok(client
            .query_opt(&stmt, &[&tenant.0, &session.as_str()])
            .await?
            .is_some())
    }

    /// The session's subject (None: it has none); `SessionNotFound` when
    /// the tenant has no such session.
    pub(crate) async fn session_subject(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<String>, StoreError> {
        let client = self.reader().await?;
        let stmt = client
            .prepare_cached("SELECT subject FROM sessions WHERE tenant = $1 AND name = $2")
            .await?;
        match client
            .query_opt(&stmt, &[&tenant.0, &session.as_str()])
            .await?
        {
            Some(row) => Ok(row.try_get(0)?),
            None => Err(StoreError::SessionNotFound(session.as_str().to_owned())),
        }
    }

    pub(crate) async fn close_idle_segments(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, SegmentId)>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        // Chosen and closed in one transaction; a session another replica
        // is appending to is skipped (it is not idle).
        let body = async {
            let stmt = client
                .prepare_cached(
                    "SELECT id, open_segment_id, tenant, name FROM sessions \
                     WHERE open_segment_id IS NOT NULL AND last_append_at <= $1 \
                     ORDER BY last_append_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED",
                )
                .await?;
            let rows = client.query(&stmt, &[&cutoff.0, &i64::from(limit)]).await?;
            let mut sessions = Vec::with_capacity(rows.len());
            let mut segments = Vec::with_capacity(rows.len());
            let mut idle = Vec::with_capacity(rows.len());
            for r in rows {
                let segment: i64 = r.try_get(1)?;
                sessions.push(r.try_get::<_, i64>(0)?);
                segments.push(segment);
                idle.push((
                    SessionRef {
                        tenant: Tenant(r.try_get(2)?),
                        session: r.try_get(3)?,
                    },
                    unsigned(segment, "segment id")?,
                ));
            }
            if idle.is_empty() {
                return Ok(idle);
            }
            let clear = client
                .prepare_cached("UPDATE sessions SET open_segment_id = NULL WHERE id = ANY($1)")
                .await?;
            tokio::try_join!(
                biased;
                close_segment(&client, &segments, Millis::now()),
                async { Ok(client.execute(&clear, &[&sessions]).await?) }
            )?;
            Ok(idle)
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn list_sessions(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
        after: Option<SessionName>,
        limit: u32,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        let client = self.reader().await?;
        // Through the (tenant, name) index, or the (tenant, subject, name)
        // one: two statements, so that each is planned for its own.
        let sql = match subject {
            None => {
                "SELECT x.name, x.next_seq, x.open_segment_id, x.created_at, \
                 coalesce(x.last_append_at, x.created_at), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $3), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $4), \
                 x.subject \
                 FROM sessions x WHERE x.tenant = $1 AND x.name > $2 \
                 AND $6::TEXT IS NULL ORDER BY x.name LIMIT $5"
            }
            Some(_) => {
                "SELECT x.name, x.next_seq, x.open_segment_id, x.created_at, \
                 coalesce(x.last_append_at, x.created_at), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $3), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $4), \
                 x.subject \
                 FROM sessions x WHERE x.tenant = $1 AND x.subject = $6 AND x.name > $2 \
                 ORDER BY x.name LIMIT $5"
            }
        };
        let stmt = client.prepare_cached(sql).await?;
        let subject = subject.map(Subject::as_str);
        let after = after.map(|a| a.as_str().to_owned()).unwrap_or_default();
        let rows = client
            .query(
                &stmt,
                &[
                    &tenant.0,
                    &after,
                    &SegmentState::Pending.code(),
                    &SegmentState::Parked.code(),
                    &i64::from(limit),
                    &subject,
                ],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let next_seq: u64 = unsigned(r.try_get(1)?, "next seq")?;
                Ok(SessionInfo {
                    name: r.try_get(0)?,
                    // Entries are never removed, and seqs have no gaps.
                    entry_count: next_seq.saturating_sub(1),
                    last_seq: next_seq.saturating_sub(1),
                    open_segment_id: r
                        .try_get::<_, Option<i64>>(2)?
                        .map(|id| unsigned(id, "segment id"))
                        .transpose()?,
                    created_at: Millis(r.try_get(3)?),
                    last_append_at: Millis(r.try_get(4)?),
                    pending: unsigned(r.try_get(5)?, "count")?,
                    parked: unsigned(r.try_get(6)?, "count")?,
                    subject: r.try_get(7)?,
                })
            })
            .collect()
    }
}

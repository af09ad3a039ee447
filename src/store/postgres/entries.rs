//! Reading a session's transcript back: its entries after a seq, a page at
//! a time, through the `(session_id, seq)` primary key.

use std::pin::pin;

use tokio_postgres::types::ToSql;
use tokio_stream::StreamExt;

use super::Postgres;
use super::rows::{self, ENTRY_COLUMNS};
use crate::model::{Entry, SessionName, Tenant};
use crate::store::{BytesBound, StoreError};

impl Postgres {
    pub(crate) async fn entries(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        after: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Entry>, bool), StoreError> {
        let client = self.reader().await?;
        // One statement, so one snapshot: an erasure is seen whole or not
        // at all. A session with nothing after `after` is one row of
        // NULLs; no row at all, no such session (for this tenant).
        let sql = format!(
            "SELECT e.* FROM sessions x LEFT JOIN LATERAL ( \
                 SELECT {ENTRY_COLUMNS} FROM entries \
                 WHERE session_id = x.id AND seq > $3 ORDER BY seq LIMIT $4 \
             ) e ON true \
             WHERE x.tenant = $1 AND x.name = $2 ORDER BY e.seq"
        );
        let stmt = client.prepare_cached(&sql).await?;
        // Past any seq a row can hold, nothing follows.
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::from(limit);
        let params: [&(dyn ToSql + Sync); 4] = [&tenant.0, &session.as_str(), &after, &limit];
        // Streamed, so that rows past the byte bound are never held.
        let mut rows = pin!(client.query_raw(&stmt, params).await?);
        let mut found = false;
        let mut page = BytesBound::new(max_bytes);
        while let Some(row) = rows.next().await {
            let row = row?;
            found = true;
            if row.try_get::<_, Option<i64>>(0)?.is_none() {
                continue;
            }
            if !page.take(rows::entry(&row)?) {
                return Ok((page.items, true));
            }
        }
        if !found {
            return Err(StoreError::SessionNotFound(session.as_str().to_owned()));
        }
        Ok((page.items, false))
    }
}

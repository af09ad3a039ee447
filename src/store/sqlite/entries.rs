//! Reading a session's transcript back: its entries after a seq, a page at
//! a time, through the `(session_id, seq)` primary key.

use super::Sqlite;
use super::segments::{Order, entries_between};
use super::sessions::session_row;
use crate::model::{Entry, SessionName, Tenant};
use crate::store::{BytesBound, StoreError};

/// The largest seq a row can hold: SQLite's integers are signed.
const MAX_SEQ: u64 = i64::MAX as u64;

impl Sqlite {
    pub(crate) async fn entries(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        after: u64,
        limit: u32,
        max_bytes: usize,
    ) -> Result<(Vec<Entry>, bool), StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        // One read transaction: the session and its entries as of one
        // moment, so an erasure is seen whole or not at all.
        self.read(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            let mut page = BytesBound::new(max_bytes);
            let mut cut = false;
            if after < MAX_SEQ && limit > 0 {
                // The statement steps through the key from `after` and stops
                // at the visit that says so: it reads what the page holds,
                // however long the session.
                entries_between(conn, row.id, after + 1, MAX_SEQ, Order::Asc, &mut |entry| {
                    if !page.take(entry) {
                        cut = true;
                        return false;
                    }
                    page.items.len() < limit as usize
                })?;
            }
            Ok((page.items, cut))
        })
        .await
    }
}

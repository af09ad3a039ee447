//! Erasing sessions: one on request (DeleteSession), every one of a
//! subject (DeleteSubject) and those idle past retention (expiry). Each
//! erasure locks the tenant's usage row and the session (its erasure lock
//! and its row), then its nodes, and deletes summaries, segments, entries,
//! what they were owed of embeddings and their vectors, and the session,
//! and its bytes from the tenant's count; the stored embedding failures of
//! its owner's other debts, which may quote its texts, are forgotten.
//!
//! One transaction however large the session, unlike SQLite's batches
//! (`sqlite/sessions.rs`): PostgreSQL has no single writer, and under MVCC
//! the deletes hold only row locks, on this session's rows and its tenant's
//! usage row; other tenants' appends commit meanwhile, and readers see the
//! session whole until the commit. Only the same tenant's appends wait (on
//! the usage row), as they must for its byte count to stay exact.

use deadpool_postgres::Object;

use super::{Postgres, ROW_OVERHEAD_BYTES, TRIES, is_lost_race, transact, unsigned};
use crate::model::{Millis, SessionName, Subject, Tenant};
use crate::store::{Erased, SessionRef, StoreError};

/// Erases the session `id` of `tenant`, whose usage row and session row
/// the caller has locked: summaries, segments, entries and the session,
/// and its bytes from the tenant's count.
///
/// The session's nodes are locked first, in id order, as a completing pass
/// locks its roll-up group (see the module doc of `postgres`). With the
/// session locked as `lock_for_erasure` locks it, no pass is
/// completing one of them and none can add a roll-up, so the nodes locked
/// are all the session has, and the deletes take no other lock on them.
async fn erase_tx(
    client: &Object,
    id: i64,
    tenant: &str,
    name: &str,
) -> Result<Erased, StoreError> {
    let overhead = ROW_OVERHEAD_BYTES as i64;
    let lock = client
        .prepare_cached("SELECT id FROM segments WHERE session_id = $1 ORDER BY id FOR UPDATE")
        .await?;
    let count = client
        .prepare_cached(
            "SELECT count(*), coalesce(sum(octet_length(content) \
             + coalesce(octet_length(client_entry_id), 0) + $2::BIGINT), 0)::BIGINT \
             FROM entries WHERE session_id = $1",
        )
        .await?;
    let summaries = client
        .prepare_cached(
            "DELETE FROM summaries WHERE segment_id IN \
             (SELECT id FROM segments WHERE session_id = $1)",
        )
        .await?;
    let segments = client
        .prepare_cached("DELETE FROM segments WHERE session_id = $1")
        .await?;
    let entries = client
        .prepare_cached("DELETE FROM entries WHERE session_id = $1")
        .await?;
    // The debts before the vectors (postgres/embeddings.rs): a batch
    // settling some of them is waited for here, and the vectors it stored
    // are then seen, and deleted, by the next statement.
    let forget = client
        .prepare_cached(super::embeddings::FORGET_OWNER_FAILURES)
        .await?;
    let owed = client
        .prepare_cached("DELETE FROM embeddings_owed WHERE session_id = $1")
        .await?;
    let vectors = client
        .prepare_cached("DELETE FROM embeddings WHERE session_id = $1")
        .await?;
    let session = client
        .prepare_cached("DELETE FROM sessions WHERE id = $1")
        .await?;
    // One round trip; the server runs them in this order.
    let (_, counted, _, segments, _, _, _, _, _) = tokio::try_join!(
        biased;
        async { client.query(&lock, &[&id]).await },
        async { client.query_one(&count, &[&id, &overhead]).await },
        async { client.execute(&summaries, &[&id]).await },
        async { client.execute(&segments, &[&id]).await },
        async { client.execute(&entries, &[&id]).await },
        async { client.execute(&forget, &[&id]).await },
        async { client.execute(&owed, &[&id]).await },
        async { client.execute(&vectors, &[&id]).await },
        async { client.execute(&session, &[&id]).await },
    )?;
    let entries: i64 = counted.try_get(0)?;
    let bytes: i64 = counted.try_get(1)?;
    let freed = bytes + name.len() as i64 + overhead;
    let usage = client
        .prepare_cached(
            "UPDATE tenant_usage SET stored_bytes = greatest(stored_bytes - $2, 0) \
             WHERE tenant = $1",
        )
        .await?;
    client.execute(&usage, &[&tenant, &freed]).await?;
    Ok(Erased {
        entries: unsigned(entries, "entry count")?,
        segments,
    })
}

/// Locks the tenant's usage row, then the session's erasure lock
/// (exclusive) and its row (if it is still there and, with `cutoff`, still
/// idle since then); its id. The erasure lock waits for every pass
/// completing one of the session's nodes (each holds it shared from
/// before it locks anything else of the session) and keeps new ones out,
/// so no roll-up can be added to the session while it is erased; the row
/// is then locked outright (FOR UPDATE, as deleting it would) for appends
/// and closings. Not the row lock alone: see `lock_level` in `claims.rs`
/// for how a pass's key-share lock can slip in beside it.
async fn lock_for_erasure(
    client: &Object,
    tenant: &str,
    name: &str,
    cutoff: Option<Millis>,
) -> Result<Option<i64>, StoreError> {
    let usage = client
        .prepare_cached("SELECT 1 FROM tenant_usage WHERE tenant = $1 FOR UPDATE")
        .await?;
    let erasing = client
        .prepare_cached(&format!(
            "SELECT pg_advisory_xact_lock({}) FROM sessions WHERE tenant = $1 AND name = $2",
            super::erasure_lock("id")
        ))
        .await?;
    let session = client
        .prepare_cached(
            "SELECT id FROM sessions WHERE tenant = $1 AND name = $2 \
             AND ($3::BIGINT IS NULL \
             OR coalesce(last_said_at, last_append_at, created_at) <= $3) \
             FOR UPDATE",
        )
        .await?;
    let cutoff = cutoff.map(|c| c.0);
    let (_, _, row) = tokio::try_join!(
        biased;
        async { client.query_opt(&usage, &[&tenant]).await },
        async { client.query_opt(&erasing, &[&tenant, &name]).await },
        async { client.query_opt(&session, &[&tenant, &name, &cutoff]).await }
    )?;
    Ok(match row {
        Some(r) => Some(r.try_get(0)?),
        None => None,
    })
}

impl Postgres {
    pub(crate) async fn delete_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Erased, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let mut tries = 0;
        loop {
            tries += 1;
            let body = async {
                let Some(id) = lock_for_erasure(&client, &tenant.0, session.as_str(), None).await?
                else {
                    return Err(StoreError::SessionNotFound(session.as_str().to_owned()));
                };
                erase_tx(&client, id, &tenant.0, session.as_str()).await
            };
            match transact(&client, body).await {
                // A race lost all the same (the lock order should rule
                // it out): erase again.
                Err(e) if is_lost_race(&e, "erasure") && tries < TRIES => continue,
                other => return self.noting_full(other),
            }
        }
    }

    pub(crate) async fn delete_subject(
        &self,
        tenant: &Tenant,
        subject: &Subject,
    ) -> Result<Vec<(String, Erased)>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let usage = client
            .prepare_cached("SELECT 1 FROM tenant_usage WHERE tenant = $1 FOR UPDATE")
            .await?;
        // Locked as `lock_for_erasure` locks one, after the tenant's usage
        // row: every session's erasure lock, then their rows, each in name
        // order as appends lock theirs. The rows locked are those whose
        // erasure lock was taken (a session the subject gains meanwhile is
        // left for another erasure).
        let erasing = client
            .prepare_cached(&format!(
                "SELECT id, pg_advisory_xact_lock({}) FROM (SELECT id FROM sessions \
                 WHERE tenant = $1 AND subject = $2 ORDER BY name) s",
                super::erasure_lock("id")
            ))
            .await?;
        let sessions = client
            .prepare_cached(
                "SELECT id, name FROM sessions WHERE id = ANY($1) ORDER BY name FOR UPDATE",
            )
            .await?;
        let mut tries = 0;
        loop {
            tries += 1;
            let body = async {
                client.query_opt(&usage, &[&tenant.0]).await?;
                let ids = client
                    .query(&erasing, &[&tenant.0, &subject.as_str()])
                    .await?
                    .iter()
                    .map(|r| r.try_get::<_, i64>(0))
                    .collect::<Result<Vec<_>, _>>()?;
                let rows = client.query(&sessions, &[&ids]).await?;
                let mut out = Vec::with_capacity(rows.len());
                for r in rows {
                    let (id, name): (i64, String) = (r.try_get(0)?, r.try_get(1)?);
                    let erased = erase_tx(&client, id, &tenant.0, &name).await?;
                    out.push((name, erased));
                }
                Ok(out)
            };
            match transact(&client, body).await {
                Err(e) if is_lost_race(&e, "subject erasure") && tries < TRIES => continue,
                other => return self.noting_full(other),
            }
        }
    }

    pub(crate) async fn expire_sessions(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, Erased)>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                // By when its newest entry was said (schema.rs's
                // sessions_by_last_said), not when it came in.
                "SELECT tenant, name FROM sessions \
                 WHERE coalesce(last_said_at, last_append_at, created_at) <= $1 \
                 ORDER BY coalesce(last_said_at, last_append_at, created_at) LIMIT $2",
            )
            .await?;
        let rows = client.query(&stmt, &[&cutoff.0, &i64::from(limit)]).await?;
        let mut out = Vec::with_capacity(rows.len());
        // One transaction each, locked as an erasure locks: another
        // replica expiring the same sessions finds them gone and skips them.
        for r in rows {
            let session = SessionRef {
                tenant: Tenant(r.try_get(0)?),
                session: r.try_get(1)?,
            };
            let body = async {
                let Some(id) =
                    lock_for_erasure(&client, &session.tenant.0, &session.session, Some(cutoff))
                        .await?
                else {
                    return Ok(None);
                };
                Ok(Some(
                    erase_tx(&client, id, &session.tenant.0, &session.session).await?,
                ))
            };
            match transact(&client, body).await {
                Ok(Some(erased)) => out.push((session, erased)),
                Ok(None) => {}
                // Left for the next round.
                Err(e) if is_lost_race(&e, "expiry") => {}
                Err(e) => return self.noting_full(Err(e)),
            }
        }
        Ok(out)
    }
}

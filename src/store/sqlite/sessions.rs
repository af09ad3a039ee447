//! Sessions and their open segment: the append transaction (sequence
//! numbers, idempotency keys, the tenant's byte cap, closing a segment at a
//! bound of its policy), closing segments on demand or when idle, and the
//! listing of a tenant's sessions.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::kept::{Kept, KeptSession, OpenSegment};
use super::{Sqlite, fts};
use crate::model::{
    AppendOutcome, Appended, Millis, NewEntry, Role, SegmentId, SegmentPolicy, SegmentState,
    SessionInfo, SessionName, Subject, Tenant, estimate_tokens,
};
use crate::store::{Erased, SessionRef, StoreError};

/// What a tenant's byte cap counts for each stored entry and session on top
/// of its text (content, id, name): the row and index space around it, so
/// that many tiny entries cannot store far more than the cap says.
pub(super) const ROW_OVERHEAD_BYTES: u64 = 64;

/// A session's row.
pub(super) struct SessionRow {
    pub(super) id: i64,
    open_segment_id: Option<SegmentId>,
}

/// The most entries, and about the most bytes of them, one batch of an
/// erasure deletes: each batch is its own writer job, so other tenants'
/// appends interleave between them instead of waiting on the whole session
/// (a 200 MB one held the writer ~5 s in one transaction). Each deleted
/// entry also takes its terms out of the search index's pages
/// (secure-delete), about as much work again as the row: hence half a MiB.
/// And at most about `ERASE_BATCH_TIME` of the writer's time: on a machine
/// short of CPU the same half MiB held the writer, and every append queued
/// behind it, for seconds.
const ERASE_BATCH_ROWS: u32 = 1_000;
const ERASE_BATCH_BYTES: u64 = 1 << 19;
const ERASE_BATCH_TIME: std::time::Duration = std::time::Duration::from_millis(50);
/// How long an erasure's caller waits for a search file another process
/// holds before the erasure goes on in the background.
const ERASURE_LOCK_WAIT: Duration = Duration::from_secs(1);

/// Begins erasing the session `id` (the tenant's `name`), in one short
/// transaction that makes it gone to every reader: its summaries and
/// segments go, and the row leaves the tenant's names (renamed to one no
/// session name can be, marked `erasing`), so the name is free at once,
/// a new append under it starts a fresh session at seq 1, and lookups,
/// listings and the workers pass it by. Its entries go after, in batches
/// (`erase_batch`). Returns what the erasure removes.
fn tombstone_tx(
    conn: &Connection,
    id: i64,
    tenant: &str,
    name: &str,
) -> Result<Erased, StoreError> {
    // Seqs are gapless from 1 and a session loses entries only to its
    // erasure, which has not begun: counting the rows instead read every
    // page of the session (over a second for 200 MB, with every append
    // waiting on the writer).
    let entries: u64 = conn
        .prepare_cached("SELECT next_seq - 1 FROM sessions WHERE id = ?1")?
        .query_row([id], |r| r.get(0))?;
    // The recaps leave the index with the entries, in the batches; their
    // texts wait in `erasing_texts` until then ('delete' needs the text).
    // Every recap's: whether the index has it is the search file's to say,
    // which this transaction does not read (fts::lock).
    conn.prepare_cached(
        "INSERT OR IGNORE INTO erasing_texts (session_id, doc, text) \
         SELECT ?1, -m.segment_id, m.text FROM summaries m \
         JOIN segments g ON g.id = m.segment_id WHERE g.session_id = ?1",
    )?
    .execute([id])?;
    conn.prepare_cached(
        "DELETE FROM search_owed WHERE segment_id IN (SELECT id FROM segments WHERE session_id = ?1)",
    )?
    .execute([id])?;
    conn.prepare_cached(
        "DELETE FROM summaries WHERE segment_id IN (SELECT id FROM segments WHERE session_id = ?1)",
    )?
    .execute([id])?;
    let segments = conn
        .prepare_cached("DELETE FROM segments WHERE session_id = ?1")?
        .execute([id])? as u64;
    super::embeddings::forget_owner_failures(conn, id)?;
    // A NUL never passes SessionName's check, and the id keeps it unique.
    // Its entries not indexed yet leave the index's tail (fts.rs) with
    // the name: nothing indexes them after this.
    conn.prepare_cached(
        "UPDATE sessions SET name = char(0) || 'erasing:' || id, erasing = 1, \
         open_segment_id = NULL, subject = NULL, indexed_seq = next_seq - 1 WHERE id = ?1",
    )?
    .execute([id])?;
    // The name's bytes leave the count now; the entries' with their batch.
    conn.prepare_cached(
        "UPDATE tenant_usage SET stored_bytes = max(stored_bytes - ?2, 0) WHERE tenant = ?1",
    )?
    .execute(params![tenant, name.len() as u64 + ROW_OVERHEAD_BYTES])?;
    Ok(Erased { entries, segments })
}

/// What an entry row counts against its tenant's bytes: its text and id,
/// and `ROW_OVERHEAD_BYTES` given as the statement's value `$overhead`.
macro_rules! entry_bytes {
    ($overhead:literal) => {
        concat!(
            "length(CAST(content AS BLOB)) + coalesce(length(CAST(client_entry_id AS BLOB)), 0) + ",
            $overhead
        )
    };
}

/// The next batch of an erasure begun by `tombstone_tx`, as its first
/// step found it.
enum EraseStep {
    /// These waiting recap texts are out of the index.
    Recaps(Vec<i64>),
    /// The session's entries up to `upto` are out of the index.
    Entries { upto: i64 },
    /// Nothing of it is left but its row (and its watermark, now gone).
    Row,
}

/// The first step of a batch of an erasure: takes the recaps' waiting
/// texts out of the index, or with none left the session's oldest entries,
/// up to `ERASE_BATCH_ROWS` of them or about `ERASE_BATCH_BYTES` or
/// `ERASE_BATCH_TIME` (at least one); with none left, its watermark. It
/// writes the search file alone, and is committed before the second step
/// (`erase_batch`) deletes the same rows from the main file: the two files
/// commit apart, and this order leaves no indexed text behind a crash
/// between them (the batch is found again, and what is out of the index
/// stays out: `fts::unindex` takes only what is there).
fn unindex_batch(conn: &Connection, id: i64) -> Result<EraseStep, StoreError> {
    fts::lock_for_writer(conn)?;
    let tenant: String = conn
        .prepare_cached("SELECT tenant FROM sessions WHERE id = ?1 AND erasing IS NOT NULL")?
        .query_row([id], |r| r.get(0))?;
    let table = fts::table_of(conn, &tenant)?;
    let began = std::time::Instant::now();
    let recaps = unindex_recaps(conn, id, table, began)?;
    if !recaps.is_empty() {
        return Ok(EraseStep::Recaps(recaps));
    }
    let mut upto = None;
    let mut bytes = 0u64;
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT seq, ",
        entry_bytes!("?2"),
        ", content FROM entries WHERE session_id = ?1 ORDER BY seq LIMIT ?3"
    ))?;
    let mut rows = stmt.query(params![id, ROW_OVERHEAD_BYTES, ERASE_BATCH_ROWS])?;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        let len: u64 = row.get(1)?;
        let content: String = row.get(2)?;
        if let Some(k) = table {
            fts::unindex(conn, k, (id << 32) | seq, &content)?;
        }
        upto = Some(seq);
        bytes += len;
        if bytes >= ERASE_BATCH_BYTES || began.elapsed() >= ERASE_BATCH_TIME {
            break;
        }
    }
    if let Some(upto) = upto {
        return Ok(EraseStep::Entries { upto });
    }
    // The id may be a new session's once the row is gone.
    conn.prepare_cached("DELETE FROM search_marks WHERE session_id = ?1")?
        .execute([id])?;
    Ok(EraseStep::Row)
}

/// The second step of a batch of an erasure (`unindex_batch` did the
/// first): deletes from the main file what the first took out of the
/// index, and the bytes from the tenant's count. With nothing left, deletes
/// the session row and records the erasure as owed a scrub of the files
/// (only now: a scrub finished before the last batch would leave that
/// batch's text in the log), and returns the record's id.
fn erase_batch(conn: &Connection, id: i64, step: EraseStep) -> Result<Option<i64>, StoreError> {
    let tenant: String = conn
        .prepare_cached("SELECT tenant FROM sessions WHERE id = ?1 AND erasing IS NOT NULL")?
        .query_row([id], |r| r.get(0))?;
    match step {
        EraseStep::Recaps(docs) => {
            let mut delete = conn
                .prepare_cached("DELETE FROM erasing_texts WHERE session_id = ?1 AND doc = ?2")?;
            for doc in &docs {
                delete.execute(params![id, doc])?;
            }
            Ok(None)
        }
        EraseStep::Entries { upto } => {
            // The bytes of the rows this deletes: another process erasing
            // the same session (a backfill's start-up) may have deleted
            // some of those the first step found.
            let bytes: u64 = conn
                .prepare_cached(concat!(
                    "DELETE FROM entries WHERE session_id = ?1 AND seq <= ?2 RETURNING ",
                    entry_bytes!("?3")
                ))?
                .query_map(params![id, upto, ROW_OVERHEAD_BYTES], |r| {
                    r.get::<_, u64>(0)
                })?
                .sum::<Result<u64, _>>()?;
            conn.prepare_cached(
                "UPDATE tenant_usage SET stored_bytes = max(stored_bytes - ?2, 0) WHERE tenant = ?1",
            )?
            .execute(params![tenant, bytes])?;
            Ok(None)
        }
        EraseStep::Row => {
            conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                .execute([id])?;
            let scrub: i64 = conn
                .prepare_cached(
                    "INSERT INTO erasures_pending (tenant, erased_at) VALUES (?1, ?2) RETURNING id",
                )?
                .query_row(params![tenant, Millis::now().0], |r| r.get(0))?;
            Ok(Some(scrub))
        }
    }
}

/// Takes the waiting recap texts of erasure `id` out of index `table`, as
/// many as `ERASE_BATCH_TIME` from `began` allows (at least one); returns
/// their documents, for `erase_batch` to take out of `erasing_texts`.
fn unindex_recaps(
    conn: &Connection,
    id: i64,
    table: Option<i64>,
    began: std::time::Instant,
) -> Result<Vec<i64>, StoreError> {
    let mut done = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT doc, text FROM erasing_texts WHERE session_id = ?1 ORDER BY doc LIMIT ?2",
    )?;
    let mut rows = stmt.query(params![id, ERASE_BATCH_ROWS])?;
    while let Some(row) = rows.next()? {
        let doc: i64 = row.get(0)?;
        let text: String = row.get(1)?;
        if let Some(k) = table {
            fts::unindex(conn, k, doc, &text)?;
        }
        done.push(doc);
        if began.elapsed() >= ERASE_BATCH_TIME {
            break;
        }
    }
    Ok(done)
}

/// The tenant's session of that name, if it exists.
pub(super) fn session_row(
    conn: &Connection,
    tenant: &str,
    name: &str,
) -> Result<Option<SessionRow>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, open_segment_id FROM sessions \
             WHERE tenant = ?1 AND name = ?2",
        )?
        .query_row(params![tenant, name], |r| {
            Ok(SessionRow {
                id: r.get(0)?,
                open_segment_id: r.get(1)?,
            })
        })
        .optional()?)
}

impl Sqlite {
    /// An append naming no subject (the backend's own tests).
    #[cfg(test)]
    pub(crate) async fn append(
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

    pub(crate) async fn append_as(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        subject: Option<String>,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.append_or_busy(move |conn, kept| {
            append_tx(
                conn,
                kept,
                &tenant,
                &session,
                subject,
                entries,
                (policy, max_tenant_bytes),
            )
        })
        .await
    }

    pub(crate) async fn close_open_segment(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<SegmentId>, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.write(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            let Some(open) = row.open_segment_id else {
                return Ok(None);
            };
            close_segment_tx(conn, open, Millis::now())?;
            conn.prepare_cached("UPDATE sessions SET open_segment_id = NULL WHERE id = ?1")?
                .execute([row.id])?;
            Ok(Some(open))
        })
        .await
    }

    pub(crate) async fn delete_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Erased, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        let (id, erased) = self
            .write(move |conn| {
                let Some(row) = session_row(conn, &tenant, &session)? else {
                    return Err(StoreError::SessionNotFound(session));
                };
                Ok((row.id, tombstone_tx(conn, row.id, &tenant, &session)?))
            })
            .await?;
        let scrub = self.finish_erasure(id).await?;
        self.scrubbed(scrub).await?;
        Ok(erased)
    }

    pub(crate) async fn delete_subject(
        &self,
        tenant: &Tenant,
        subject: &Subject,
    ) -> Result<Vec<(String, Erased)>, StoreError> {
        let tenant = tenant.0.clone();
        let subject = subject.as_str().to_owned();
        let erased = self
            .write(move |conn| {
                let sessions: Vec<(i64, String)> = conn
                    .prepare_cached(
                        "SELECT id, name FROM sessions WHERE tenant = ?1 AND subject = ?2 \
                         ORDER BY name",
                    )?
                    .query_map(params![tenant, subject], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let mut out = Vec::with_capacity(sessions.len());
                for (id, name) in sessions {
                    let erased = tombstone_tx(conn, id, &tenant, &name)?;
                    out.push((id, name, erased));
                }
                Ok(out)
            })
            .await?;
        self.finish_erasures(erased).await
    }

    /// Deletes the entries of an erasure begun by `tombstone_tx`, one
    /// writer job per batch, and its row; returns its scrub record's id.
    /// When the search file stays locked (another process holds it) past
    /// `ERASURE_LOCK_WAIT`, the erasure goes on in the background, trying
    /// again until it can, and this answers `CheckpointBusy`
    /// (ERASURE_PENDING): the session is gone to readers already.
    async fn finish_erasure(&self, id: i64) -> Result<i64, StoreError> {
        match self.erase_batches(id, ERASURE_LOCK_WAIT).await {
            Err(e) if fts::locked(&e) => {
                tracing::warn!(
                    "an erasure waits for the search index's file, which another process holds; it goes on in the background"
                );
                let store = self.clone();
                tokio::spawn(async move {
                    match store.erase_batches(id, Duration::MAX).await {
                        Ok(_) => {
                            if let Some(checkpoints) = &store.inner.checkpoints {
                                checkpoints.ask();
                            }
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            "an erasure could not finish; the next start finishes it"
                        ),
                    }
                });
                Err(StoreError::CheckpointBusy)
            }
            done => done,
        }
    }

    /// The batches of an erasure, trying a batch the search file's lock
    /// kept out again for up to `patience`.
    async fn erase_batches(&self, id: i64, patience: Duration) -> Result<i64, StoreError> {
        loop {
            // Two jobs, each committed before the next: out of the search
            // file, then out of the main one (`unindex_batch`).
            let step = self
                .write_search(patience, move |conn| unindex_batch(conn, id))
                .await?;
            if let Some(scrub) = self.write(move |conn| erase_batch(conn, id, step)).await? {
                return Ok(scrub);
            }
        }
    }

    /// `finish_erasure` for each begun one, then one wait for their scrub.
    async fn finish_erasures<N>(
        &self,
        begun: Vec<(i64, N, Erased)>,
    ) -> Result<Vec<(N, Erased)>, StoreError> {
        let mut newest = None;
        let mut pending = false;
        let mut out = Vec::with_capacity(begun.len());
        for (id, name, erased) in begun {
            match self.finish_erasure(id).await {
                Ok(scrub) => newest = Some(scrub),
                // Going on in the background; the others go on here.
                Err(StoreError::CheckpointBusy) => pending = true,
                Err(e) => return Err(e),
            }
            out.push((name, erased));
        }
        if let Some(scrub) = newest {
            self.scrubbed(scrub).await?;
        }
        if pending {
            return Err(StoreError::CheckpointBusy);
        }
        Ok(out)
    }

    /// Finishes the erasures a crash (or a failed batch) left begun: their
    /// sessions are already gone to readers; their entries are not yet
    /// gone from the files. Run at open, before the store serves.
    pub(super) async fn resume_erasures(&self) -> Result<(), StoreError> {
        let begun: Vec<i64> = self
            .read(|conn| {
                Ok(conn
                    .prepare_cached("SELECT id FROM sessions WHERE erasing IS NOT NULL")?
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<_, _>>()?)
            })
            .await?;
        let mut newest = None;
        for id in begun {
            match self.finish_erasure(id).await {
                Ok(scrub) => newest = Some(scrub),
                // Going on in the background.
                Err(StoreError::CheckpointBusy) => {}
                Err(e) => return Err(e),
            }
        }
        if newest.is_some()
            && let Some(checkpoints) = &self.inner.checkpoints
        {
            // Asked, not awaited: a reader may hold the log for long.
            checkpoints.ask();
        }
        Ok(())
    }

    /// Begins the erasure of a session and goes no further, as a crash
    /// right after the first transaction would (the backend's tests).
    #[cfg(test)]
    pub(crate) async fn begin_erasure_only(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Erased, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.write(move |conn| {
            let Some(row) = session_row(conn, &tenant, &session)? else {
                return Err(StoreError::SessionNotFound(session));
            };
            tombstone_tx(conn, row.id, &tenant, &session)
        })
        .await
    }

    #[cfg(test)]
    pub(crate) async fn has_session(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<bool, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| Ok(session_row(conn, &tenant, &session)?.is_some()))
            .await
    }

    /// The session's subject (None: it has none); `SessionNotFound` when
    /// the tenant has no such session.
    pub(crate) async fn session_subject(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<String>, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.as_str().to_owned();
        self.read(move |conn| {
            let subject: Option<Option<String>> = conn
                .prepare_cached("SELECT subject FROM sessions WHERE tenant = ?1 AND name = ?2")?
                .query_row(params![tenant, session], |r| r.get(0))
                .optional()?;
            subject.ok_or(StoreError::SessionNotFound(session))
        })
        .await
    }

    pub(crate) async fn close_idle_segments(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, SegmentId)>, StoreError> {
        // Chosen and closed in one write, so an append committed in between
        // keeps its segment open.
        self.write(move |conn| {
            let idle: Vec<(i64, SegmentId, SessionRef)> = conn
                .prepare_cached(
                    "SELECT id, open_segment_id, tenant, name FROM sessions \
                     WHERE open_segment_id IS NOT NULL AND last_append_at <= ?1 \
                     ORDER BY last_append_at LIMIT ?2",
                )?
                .query_map(params![cutoff.0, limit], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        SessionRef {
                            tenant: Tenant(r.get(2)?),
                            session: r.get(3)?,
                        },
                    ))
                })?
                .collect::<Result<_, _>>()?;
            let now = Millis::now();
            let mut clear =
                conn.prepare_cached("UPDATE sessions SET open_segment_id = NULL WHERE id = ?1")?;
            for (session_id, segment_id, _) in &idle {
                close_segment_tx(conn, *segment_id, now)?;
                clear.execute([session_id])?;
            }
            Ok(idle
                .into_iter()
                .map(|(_, id, session)| (session, id))
                .collect())
        })
        .await
    }

    pub(crate) async fn expire_sessions(
        &self,
        cutoff: Millis,
        limit: u32,
    ) -> Result<Vec<(SessionRef, Erased)>, StoreError> {
        let expired = self
            .write(move |conn| {
                let old: Vec<(i64, SessionRef)> = conn
                    .prepare_cached(
                        // By when its newest entry was said (schema.rs's
                        // sessions_by_last_said), not when it came in.
                        "SELECT id, tenant, name FROM sessions \
                         WHERE coalesce(last_said_at, last_append_at, created_at) <= ?1 \
                         AND erasing IS NULL \
                         ORDER BY coalesce(last_said_at, last_append_at, created_at) LIMIT ?2",
                    )?
                    .query_map(params![cutoff.0, limit], |r| {
                        Ok((
                            r.get(0)?,
                            SessionRef {
                                tenant: Tenant(r.get(1)?),
                                session: r.get(2)?,
                            },
                        ))
                    })?
                    .collect::<Result<_, _>>()?;
                let mut out = Vec::with_capacity(old.len());
                for (id, session) in old {
                    let erased = tombstone_tx(conn, id, &session.tenant.0, &session.session)?;
                    out.push((id, session, erased));
                }
                Ok(out)
            })
            .await?;
        self.finish_erasures(expired).await
    }

    pub(crate) async fn list_sessions(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
        after: Option<SessionName>,
        limit: u32,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        let tenant = tenant.0.clone();
        let subject = subject.map(|s| s.as_str().to_owned());
        let after = after.map(|a| a.as_str().to_owned());
        self.read(move |conn| {
            // Through the (tenant, name) index, or the (tenant, subject,
            // name) one; the counts read only each listed session's
            // segments. Both take the same parameters (`?6 IS NULL` holds
            // in the first).
            let sql = match subject {
                None => {
                    "SELECT x.name, x.next_seq, x.open_segment_id, x.created_at, \
                     coalesce(x.last_append_at, x.created_at), \
                     (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = ?3), \
                     (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = ?4), \
                     x.subject \
                     FROM sessions x WHERE x.tenant = ?1 AND x.name > ?2 \
                     AND x.erasing IS NULL AND ?6 IS NULL ORDER BY x.name LIMIT ?5"
                }
                Some(_) => {
                    "SELECT x.name, x.next_seq, x.open_segment_id, x.created_at, \
                     coalesce(x.last_append_at, x.created_at), \
                     (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = ?3), \
                     (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = ?4), \
                     x.subject \
                     FROM sessions x WHERE x.tenant = ?1 AND x.subject = ?6 AND x.name > ?2 \
                     ORDER BY x.name LIMIT ?5"
                }
            };
            let mut stmt = conn.prepare_cached(sql)?;
            let rows = stmt.query_map(
                params![
                    tenant,
                    after.unwrap_or_default(),
                    SegmentState::Pending.code(),
                    SegmentState::Parked.code(),
                    limit,
                    subject
                ],
                |r| {
                    let next_seq: u64 = r.get(1)?;
                    Ok(SessionInfo {
                        name: r.get(0)?,
                        // Entries are never removed, and seqs have no gaps.
                        entry_count: next_seq.saturating_sub(1),
                        last_seq: next_seq.saturating_sub(1),
                        open_segment_id: r.get(2)?,
                        created_at: Millis(r.get(3)?),
                        last_append_at: Millis(r.get(4)?),
                        pending: r.get(5)?,
                        parked: r.get(6)?,
                        subject: r.get(7)?,
                    })
                },
            )?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }
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

/// Closes the open segment, if there is one, its counts written first, and
/// names it among those the append closed.
fn close_open(
    conn: &Connection,
    open: &mut Option<OpenSegment>,
    closed: &mut Vec<SegmentId>,
    now: Millis,
) -> Result<(), StoreError> {
    if let Some(mut seg) = open.take() {
        seg.save(conn)?;
        close_segment_tx(conn, seg.id, now)?;
        closed.push(seg.id);
    }
    Ok(())
}

/// One append, in the writer's transaction: `bounds` are the segment
/// policy and the tenant's byte cap (0: none).
fn append_tx(
    conn: &Connection,
    kept: &mut Kept,
    tenant: &str,
    name: &str,
    subject: Option<String>,
    entries: Vec<NewEntry>,
    bounds: (SegmentPolicy, u64),
) -> Result<AppendOutcome, StoreError> {
    let (policy, max_tenant_bytes) = bounds;
    let now = Millis::now();
    // A copy: what this append changes is kept only if it succeeds (its
    // savepoint undoes its SQL writes otherwise).
    let (existing, stored) = match kept.get(tenant, name) {
        Some((session, stored)) => (Some(session), stored),
        None => read_start(conn, kept, tenant, name)?,
    };
    // A tenant at its cap is refused at the end, once the call is known to
    // add bytes (its savepoint undoes what it wrote): a retry of what is
    // already stored still answers.
    let mut added_bytes = 0u64;
    let appended_before = existing.as_ref().and_then(|s| s.appended_at);
    let mut newest = existing.as_ref().and_then(|s| s.newest);
    let (session_id, mut next_seq, mut next_ordinal, mut open, subject) = match existing {
        Some(s) => {
            if let Some(requested) = subject
                && s.subject.as_ref() != Some(&requested)
            {
                return Err(StoreError::SubjectMismatch {
                    session: name.to_owned(),
                    subject: s.subject,
                    requested,
                });
            }
            (s.id, s.next_seq, s.next_ordinal, s.open, s.subject)
        }
        None => {
            added_bytes += name.len() as u64 + ROW_OVERHEAD_BYTES;
            let id = conn
                .prepare_cached(
                    "INSERT INTO sessions (tenant, name, created_at, last_append_at, subject) \
                     VALUES (?1, ?2, ?3, ?3, ?4) RETURNING id",
                )?
                .query_row(params![tenant, name, now.0, subject], |r| {
                    r.get::<_, i64>(0)
                })?;
            // The search index's (session_id << 32) | seq must stay a
            // positive i64 (summaries have the negative ones).
            if id >= 1 << 31 {
                return Err(StoreError::Unstorable {
                    index: 0,
                    reason: "the database has held 2^31 sessions, the most the search index names",
                });
            }
            (id, 1, 1, None, subject)
        }
    };

    let mut insert_entry = conn.prepare_cached(
        "INSERT INTO entries (session_id, seq, client_entry_id, role, content, tokens, created_at, \
         occurred_at, name, metadata) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    // Prepared when first needed: most appends carry no idempotency keys
    // and go to a segment already open.
    let mut find_dup = None;
    let mut insert_segment = None;
    let mut outcome = AppendOutcome {
        entries: Vec::with_capacity(entries.len()),
        open_segment_id: None,
        closed_segment_ids: Vec::new(),
    };
    let mut stored_any = false;
    for (index, entry) in entries.into_iter().enumerate() {
        if let Some(cid) = &entry.client_entry_id {
            let find_dup = match &mut find_dup {
                Some(statement) => statement,
                None => find_dup.insert(conn.prepare_cached(
                    "SELECT seq, role, content FROM entries \
                     WHERE session_id = ?1 AND client_entry_id = ?2",
                )?),
            };
            let seen = find_dup
                .query_row(params![session_id, cid], |r| {
                    Ok((
                        r.get::<_, u64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .optional()?;
            if let Some((seq, role, content)) = seen {
                // The same id for another entry is a caller's bug, not a
                // retry: refusing it (the job's savepoint undoes the whole
                // call) beats keeping one text and silently dropping the
                // other.
                if Role::from_code(role) != Some(entry.role) || content != entry.content {
                    return Err(StoreError::ClientEntryIdReused {
                        session: name.to_owned(),
                        client_entry_id: cid.clone(),
                        index,
                        seq,
                    });
                }
                outcome.entries.push(Appended {
                    seq,
                    client_entry_id: entry.client_entry_id,
                    duplicate: true,
                });
                continue;
            }
        }
        let occurred = crate::store::occurred(index, entry.occurred_at, newest, now)?;
        if newest.is_some_and(|last| policy.is_gap(last, occurred)) {
            // The conversation's own clock says a new sitting begins here.
            close_open(conn, &mut open, &mut outcome.closed_segment_ids, now)?;
        }
        newest = Some(occurred);
        let seq = next_seq;
        // The search index names an entry (session_id << 32) | seq
        // (schema.rs): a seq past 32 bits would name another's.
        if seq >= 1 << 32 {
            return Err(StoreError::Unstorable {
                index,
                reason: "the session holds 2^32 - 1 entries, the most one session may",
            });
        }
        next_seq += 1;
        stored_any = true;
        added_bytes += crate::store::stored_bytes(&entry) + ROW_OVERHEAD_BYTES;
        let tokens = estimate_tokens(&entry.content);
        insert_entry.execute(params![
            session_id,
            seq,
            entry.client_entry_id,
            entry.role.code(),
            entry.content,
            tokens,
            now.0,
            (occurred != now).then_some(occurred.0),
            entry.name,
            crate::store::encode_metadata(&entry.metadata),
        ])?;
        let seg = match &mut open {
            Some(seg) => seg,
            None => {
                let insert_segment = match &mut insert_segment {
                    Some(statement) => statement,
                    None => insert_segment.insert(conn.prepare_cached(
                        "INSERT INTO segments (session_id, ordinal, state, first_seq, last_seq, \
                         entry_count, token_estimate, created_at) \
                         VALUES (?1, ?2, ?3, ?4, ?4, 0, 0, ?5) RETURNING id",
                    )?),
                };
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
            close_open(conn, &mut open, &mut outcome.closed_segment_ids, now)?;
        }
    }
    outcome.open_segment_id = open.as_ref().map(|seg| seg.id);
    if added_bytes > 0 {
        let wanted = stored.saturating_add(added_bytes);
        if max_tenant_bytes > 0 && wanted > max_tenant_bytes {
            // The job's savepoint rolls every write of this append back.
            return Err(StoreError::TenantFull {
                tenant: tenant.to_owned(),
                wanted,
                limit: max_tenant_bytes,
            });
        }
    }
    let session = KeptSession {
        id: session_id,
        next_seq,
        next_ordinal,
        open,
        subject,
        // An earlier append of this batch may have stored something.
        appended_at: if stored_any {
            Some(now)
        } else {
            appended_before
        },
        newest,
    };
    let stored_now = outcome.entries.iter().filter(|e| !e.duplicate).count() as u64;
    kept.put(tenant, name, session, stored, added_bytes);
    // Each new entry joins the search index's tail (fts.rs).
    kept.note_unindexed(stored_now);
    Ok(outcome)
}

/// What an append starts from when it is not kept: the session's row (if
/// it exists), its open segment's counts and the tenant's stored bytes, in
/// one statement when the session exists.
fn read_start(
    conn: &Connection,
    kept: &Kept,
    tenant: &str,
    name: &str,
) -> Result<(Option<KeptSession>, u64), StoreError> {
    // Scalar subqueries rather than a join: SQLite re-plans a join with
    // bound parameters each time the statement is reused.
    let found = conn
        .prepare_cached(
            "SELECT x.id, x.next_seq, x.next_ordinal, x.open_segment_id, \
             (SELECT entry_count FROM segments WHERE id = x.open_segment_id), \
             (SELECT token_estimate FROM segments WHERE id = x.open_segment_id), \
             (SELECT last_seq FROM segments WHERE id = x.open_segment_id), \
             (SELECT stored_bytes FROM tenant_usage WHERE tenant = ?1), x.subject, \
             (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
             WHERE e.session_id = x.id ORDER BY e.seq DESC LIMIT 1) \
             FROM sessions x WHERE x.tenant = ?1 AND x.name = ?2",
        )?
        .query_row(params![tenant, name], |r| {
            let open_id: Option<SegmentId> = r.get(3)?;
            let open = match (open_id, r.get(4)?) {
                (Some(id), Some(entries)) => Some(Some(OpenSegment {
                    id,
                    entries,
                    tokens: r.get(5)?,
                    last_seq: r.get(6)?,
                    touched: false,
                })),
                // The session names an open segment that is not there.
                (Some(_), None) => None,
                (None, _) => Some(None),
            };
            let session = match open {
                Some(open) => Some(KeptSession {
                    id: r.get(0)?,
                    next_seq: r.get(1)?,
                    next_ordinal: r.get(2)?,
                    open,
                    subject: r.get(8)?,
                    appended_at: None,
                    newest: r.get::<_, Option<i64>>(9)?.map(Millis),
                }),
                None => None,
            };
            Ok((session, r.get::<_, Option<u64>>(7)?))
        })
        .optional()?;
    let (session, stored) = match found {
        Some((Some(session), stored)) => (Some(session), stored),
        Some((None, _)) => return Err(rusqlite::Error::QueryReturnedNoRows.into()),
        None => (None, None),
    };
    // The tenant's bytes as kept count this batch's appends, which the
    // table does not have yet.
    let stored = match (kept.stored(tenant), stored, &session) {
        (Some(kept), _, _) => Some(kept),
        (None, stored, Some(_)) => stored,
        (None, _, None) => conn
            .prepare_cached("SELECT stored_bytes FROM tenant_usage WHERE tenant = ?1")?
            .query_row([tenant], |r| r.get(0))
            .optional()?,
    };
    Ok((session, stored.unwrap_or(0)))
}

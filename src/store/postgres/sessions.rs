//! Sessions and their open segment: the append writer (group commit,
//! sequence numbers, idempotency keys, the tenant's byte cap, closing a
//! segment at a bound of its policy), closing segments on demand or when
//! idle, erasure, and the listing of a tenant's sessions.
//!
//! Appends queue for a few writer tasks. Each takes whatever has queued up
//! and commits it in one transaction, each call in a savepoint of its own
//! (one call's error undoes only that call), its statements pipelined: a
//! call costs two round trips to the server, and the commit (the WAL
//! flush) is shared by the whole batch. A batch first locks its tenants'
//! `tenant_usage` rows, in tenant order, then each session's row, in
//! tenant and name order: so appends to one session from any number of
//! replicas take turns, and their seqs stay gapless and unique.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{Postgres, TRIES, is_lost_race, signed, transact, unsigned};
use crate::model::{
    AppendOutcome, Appended, Millis, NewEntry, Role, SegmentId, SegmentPolicy, SegmentState,
    SessionInfo, SessionName, Tenant, estimate_tokens,
};
use crate::store::{Erased, SessionRef, StoreError};

/// What a tenant's byte cap counts for each stored entry and session on
/// top of its text, as the SQLite backend counts it.
const ROW_OVERHEAD_BYTES: u64 = 64;
/// Most appends committed in one transaction.
const MAX_BATCH: usize = 256;

/// One AppendEntries call waiting for a writer.
pub(super) struct AppendJob {
    tenant: String,
    session: String,
    entries: Vec<NewEntry>,
    policy: SegmentPolicy,
    cap: u64,
    reply: oneshot::Sender<Result<AppendOutcome, StoreError>>,
}

/// A writer task: takes the first queued append and whatever else has
/// queued meanwhile, and commits them together.
pub(super) async fn writer(pool: Pool, jobs: Arc<Mutex<mpsc::Receiver<AppendJob>>>) {
    loop {
        let batch = {
            let mut rx = jobs.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        run_batch(&pool, batch).await;
    }
}

/// Commits a batch (again, when it lost a deadlock) and answers every
/// caller after the COMMIT, or with why nothing was committed.
async fn run_batch(pool: &Pool, mut batch: Vec<AppendJob>) {
    // Lock order: tenant, then session name; a stable sort keeps two calls
    // to one session in the order they came.
    batch.sort_by(|a, b| (&a.tenant, &a.session).cmp(&(&b.tenant, &b.session)));
    let mut tries = 0;
    let outcome = loop {
        tries += 1;
        let result = match pool.get().await {
            Ok(client) => commit_batch(&client, &batch).await,
            Err(e) => Err(e.into()),
        };
        match result {
            Err(e) if is_lost_race(&e) && tries < TRIES => continue,
            other => break other,
        }
    };
    match outcome {
        Ok(results) => {
            for (job, result) in batch.into_iter().zip(results) {
                // The caller may have gone; its work is committed anyway.
                let _ = job.reply.send(result);
            }
        }
        Err(e) => {
            let shared = Arc::new(e);
            for job in batch {
                let _ = job.reply.send(Err(StoreError::Shared(shared.clone())));
            }
        }
    }
}

/// One transaction for the whole batch; the outer error says it was not
/// committed, the inner ones are the calls' own (each rolled back to its
/// savepoint).
async fn commit_batch(
    client: &Object,
    batch: &[AppendJob],
) -> Result<Vec<Result<AppendOutcome, StoreError>>, StoreError> {
    let mut tenants: Vec<&str> = batch.iter().map(|j| j.tenant.as_str()).collect();
    tenants.dedup();
    let now = Millis::now();
    let body = async {
        let insert = client
            .prepare_cached(
                "INSERT INTO tenant_usage (tenant, stored_bytes) \
                 SELECT t, 0 FROM unnest($1::text[]) AS t ORDER BY t \
                 ON CONFLICT (tenant) DO NOTHING",
            )
            .await?;
        let lock = client
            .prepare_cached(
                "SELECT tenant, stored_bytes FROM tenant_usage WHERE tenant = ANY($1) \
                 ORDER BY tenant FOR UPDATE",
            )
            .await?;
        let (_, rows) = tokio::try_join!(
            async { client.execute(&insert, &[&tenants]).await },
            async { client.query(&lock, &[&tenants]).await }
        )?;
        let mut stored: HashMap<String, (u64, u64)> = HashMap::new();
        for row in rows {
            let bytes: i64 = row.try_get(1)?;
            stored.insert(row.try_get(0)?, (unsigned(bytes, "stored bytes")?, 0));
        }
        let mut results = Vec::with_capacity(batch.len());
        for job in batch {
            let (before, added) = stored.get(&job.tenant).copied().unwrap_or((0, 0));
            let (savepoint, reads) =
                tokio::join!(client.batch_execute("SAVEPOINT job"), read_job(client, job));
            savepoint?;
            let result = match reads {
                Ok(reads) => write_job(client, job, reads, before + added, now).await,
                Err(e) => Err(e),
            };
            match result {
                Ok((outcome, bytes)) => {
                    if let Some(entry) = stored.get_mut(&job.tenant) {
                        entry.1 += bytes;
                    }
                    results.push(Ok(outcome));
                }
                Err(e) => {
                    client
                        .batch_execute("ROLLBACK TO SAVEPOINT job; RELEASE SAVEPOINT job")
                        .await?;
                    results.push(Err(e));
                }
            }
        }
        let (names, added): (Vec<&str>, Vec<i64>) = stored
            .iter()
            .filter(|(_, (_, added))| *added > 0)
            .map(|(tenant, (_, added))| (tenant.as_str(), signed(*added)))
            .unzip();
        if !names.is_empty() {
            let update = client
                .prepare_cached(
                    "UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + d.added \
                     FROM unnest($1::text[], $2::bigint[]) AS d (tenant, added) \
                     WHERE u.tenant = d.tenant",
                )
                .await?;
            client.execute(&update, &[&names, &added]).await?;
        }
        Ok(results)
    };
    transact(client, body).await
}

/// What a call reads before it writes: its session (locked), and the
/// entries its idempotency keys already name.
struct JobReads {
    session: Option<SessionRow>,
    seen: HashMap<String, (u64, i64, String)>,
}

struct SessionRow {
    id: i64,
    next_seq: u64,
    next_ordinal: u32,
    /// The open segment: id, ordinal, entries, tokens, last seq.
    open: Option<(u64, u32, u32, u32, u64)>,
}

async fn read_job(client: &Object, job: &AppendJob) -> Result<JobReads, StoreError> {
    let lock = client
        .prepare_cached(
            "SELECT s.id, s.next_seq, s.next_ordinal, s.open_segment_id, o.ordinal, \
             o.entry_count, o.token_estimate, o.last_seq \
             FROM sessions s LEFT JOIN segments o ON o.id = s.open_segment_id \
             WHERE s.tenant = $1 AND s.name = $2 FOR NO KEY UPDATE OF s",
        )
        .await?;
    let ids: Vec<&str> = job
        .entries
        .iter()
        .filter_map(|e| e.client_entry_id.as_deref())
        .collect();
    let dups = async {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let stmt = client
            .prepare_cached(
                "SELECT e.client_entry_id, e.seq, e.role, e.content \
                 FROM entries e JOIN sessions s ON s.id = e.session_id \
                 WHERE s.tenant = $1 AND s.name = $2 AND e.client_entry_id = ANY($3)",
            )
            .await?;
        client
            .query(&stmt, &[&job.tenant, &job.session, &ids])
            .await
    };
    let (row, dups) = tokio::try_join!(
        async { client.query_opt(&lock, &[&job.tenant, &job.session]).await },
        dups
    )?;
    let session = match row {
        Some(r) => {
            let open = match r.try_get::<_, Option<i64>>(3)? {
                Some(id) => Some((
                    unsigned(id, "segment id")?,
                    unsigned(r.try_get(4)?, "ordinal")?,
                    unsigned(r.try_get(5)?, "entry count")?,
                    unsigned(r.try_get(6)?, "token estimate")?,
                    unsigned(r.try_get(7)?, "last seq")?,
                )),
                None => None,
            };
            Some(SessionRow {
                id: r.try_get(0)?,
                next_seq: unsigned(r.try_get(1)?, "next seq")?,
                next_ordinal: unsigned(r.try_get(2)?, "next ordinal")?,
                open,
            })
        }
        None => None,
    };
    let mut seen = HashMap::with_capacity(dups.len());
    for r in dups {
        seen.insert(
            r.try_get(0)?,
            (
                unsigned(r.try_get(1)?, "seq")?,
                r.try_get(2)?,
                r.try_get(3)?,
            ),
        );
    }
    Ok(JobReads { session, seen })
}

/// A segment the call writes: the one open before it, or a new one.
struct Planned {
    id: Option<SegmentId>,
    ordinal: u32,
    first_seq: u64,
    last_seq: u64,
    entries: u32,
    tokens: u32,
    closed: bool,
    touched: bool,
}

/// Plans the call in memory (seqs, duplicates, segments, the cap), then
/// writes it with every statement pipelined. Returns the outcome and the
/// bytes it adds to the tenant's count.
async fn write_job(
    client: &Object,
    job: &AppendJob,
    reads: JobReads,
    stored: u64,
    now: Millis,
) -> Result<(AppendOutcome, u64), StoreError> {
    if job.cap > 0 && stored >= job.cap {
        return Err(StoreError::TenantFull {
            tenant: job.tenant.clone(),
            wanted: stored,
            limit: job.cap,
        });
    }
    let mut added = 0u64;
    let row = match reads.session {
        Some(row) => row,
        None => {
            added += job.session.len() as u64 + ROW_OVERHEAD_BYTES;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO sessions (tenant, name, created_at, last_append_at) \
                     VALUES ($1, $2, $3, $3) RETURNING id",
                )
                .await?;
            let r = client
                .query_one(&stmt, &[&job.tenant, &job.session, &now.0])
                .await?;
            SessionRow {
                id: r.try_get(0)?,
                next_seq: 1,
                next_ordinal: 1,
                open: None,
            }
        }
    };
    let mut seen = reads.seen;
    let mut segments: Vec<Planned> = Vec::new();
    let mut open: Option<usize> = None;
    if let Some((id, ordinal, entries, tokens, last_seq)) = row.open {
        segments.push(Planned {
            id: Some(id),
            ordinal,
            first_seq: 0,
            last_seq,
            entries,
            tokens,
            closed: false,
            touched: false,
        });
        open = Some(0);
    }
    let (mut next_seq, mut next_ordinal) = (row.next_seq, row.next_ordinal);
    let mut outcome = AppendOutcome {
        entries: Vec::with_capacity(job.entries.len()),
        open_segment_id: None,
        closed_segment_ids: Vec::new(),
    };
    // The rows to insert, column by column.
    let mut seqs: Vec<i64> = Vec::new();
    let mut ids: Vec<Option<&str>> = Vec::new();
    let mut roles: Vec<i64> = Vec::new();
    let mut contents: Vec<&str> = Vec::new();
    let mut token_counts: Vec<i64> = Vec::new();
    for (index, entry) in job.entries.iter().enumerate() {
        if let Some(cid) = &entry.client_entry_id
            && let Some((seq, role, content)) = seen.get(cid)
        {
            // The same id for another entry is a caller's bug, not a retry:
            // the whole call is refused (its savepoint undoes it).
            if Role::from_code(*role) != Some(entry.role) || *content != entry.content {
                return Err(StoreError::ClientEntryIdReused {
                    session: job.session.clone(),
                    client_entry_id: cid.clone(),
                    index,
                    seq: *seq,
                });
            }
            outcome.entries.push(Appended {
                seq: *seq,
                client_entry_id: entry.client_entry_id.clone(),
                duplicate: true,
            });
            continue;
        }
        let seq = next_seq;
        next_seq += 1;
        added += (entry.content.len() + entry.client_entry_id.as_ref().map_or(0, String::len))
            as u64
            + ROW_OVERHEAD_BYTES;
        let tokens = estimate_tokens(&entry.content);
        seqs.push(signed(seq));
        ids.push(entry.client_entry_id.as_deref());
        roles.push(entry.role.code());
        contents.push(&entry.content);
        token_counts.push(i64::from(tokens));
        if let Some(cid) = &entry.client_entry_id {
            seen.insert(cid.clone(), (seq, entry.role.code(), entry.content.clone()));
        }
        let at = match open {
            Some(at) => at,
            None => {
                segments.push(Planned {
                    id: None,
                    ordinal: next_ordinal,
                    first_seq: seq,
                    last_seq: seq,
                    entries: 0,
                    tokens: 0,
                    closed: false,
                    touched: false,
                });
                next_ordinal += 1;
                segments.len() - 1
            }
        };
        let seg = &mut segments[at];
        seg.entries += 1;
        seg.tokens = seg.tokens.saturating_add(tokens);
        seg.last_seq = seq;
        seg.touched = true;
        open = Some(at);
        outcome.entries.push(Appended {
            seq,
            client_entry_id: entry.client_entry_id.clone(),
            duplicate: false,
        });
        if job.policy.is_full(seg.entries, seg.tokens) {
            seg.closed = true;
            open = None;
        }
    }
    if added > 0 && job.cap > 0 && stored + added > job.cap {
        return Err(StoreError::TenantFull {
            tenant: job.tenant.clone(),
            wanted: stored + added,
            limit: job.cap,
        });
    }
    let stored_any = !seqs.is_empty();

    // The writes, pipelined: new segments, the one open before, the
    // entries, the session, and the savepoint's release.
    let pending = SegmentState::Pending.code();
    let new: Vec<&Planned> = segments.iter().filter(|s| s.id.is_none()).collect();
    let new_ordinals: Vec<i64> = new.iter().map(|s| i64::from(s.ordinal)).collect();
    let new_states: Vec<i64> = new
        .iter()
        .map(|s| {
            if s.closed {
                pending
            } else {
                SegmentState::Open.code()
            }
        })
        .collect();
    let new_first: Vec<i64> = new.iter().map(|s| signed(s.first_seq)).collect();
    let new_last: Vec<i64> = new.iter().map(|s| signed(s.last_seq)).collect();
    let new_entries: Vec<i64> = new.iter().map(|s| i64::from(s.entries)).collect();
    let new_tokens: Vec<i64> = new.iter().map(|s| i64::from(s.tokens)).collect();
    let new_closed: Vec<Option<i64>> = new.iter().map(|s| s.closed.then_some(now.0)).collect();
    // Prepared first (once per connection), so that the statements below
    // reach the server in the order they are written.
    let insert_segments_stmt = client.prepare_cached(
        "INSERT INTO segments (session_id, level, ordinal, state, first_seq, last_seq, \
                 entry_count, token_estimate, next_attempt_at, closed_at, created_at) \
                 SELECT $1, 1, u.ordinal, u.state, u.first_seq, u.last_seq, u.entry_count, \
                 u.tokens, u.closed_at, u.closed_at, $2 \
                 FROM unnest($3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], \
                 $7::bigint[], $8::bigint[], $9::bigint[]) \
                 AS u (ordinal, state, first_seq, last_seq, entry_count, tokens, closed_at) \
                 ORDER BY u.ordinal RETURNING id, ordinal",
    );
    let update_open_stmt = client.prepare_cached(
        "UPDATE segments SET entry_count = $1, token_estimate = $2, last_seq = $3, \
                 state = CASE WHEN $4 THEN $5 ELSE state END, \
                 closed_at = CASE WHEN $4 THEN $6 ELSE closed_at END, \
                 next_attempt_at = CASE WHEN $4 THEN $6 ELSE next_attempt_at END \
                 WHERE id = $7",
    );
    let insert_entries_stmt = client.prepare_cached(
        "INSERT INTO entries (session_id, seq, client_entry_id, role, content, tokens, \
                 created_at) SELECT $1, u.seq, u.cid, u.role, u.content, u.tokens, $2 \
                 FROM unnest($3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::bigint[]) \
                 AS u (seq, cid, role, content, tokens)",
    );
    let update_session_stmt = client.prepare_cached(
        "UPDATE sessions SET next_seq = $1, next_ordinal = $2, \
                 open_segment_id = (SELECT id FROM segments \
                 WHERE session_id = $3 AND level = 1 AND ordinal = $4), \
                 last_append_at = CASE WHEN $5 THEN $6 ELSE last_append_at END WHERE id = $3",
    );
    let (insert_segments_stmt, update_open_stmt, insert_entries_stmt, update_session_stmt) = tokio::try_join!(
        insert_segments_stmt,
        update_open_stmt,
        insert_entries_stmt,
        update_session_stmt
    )?;
    let insert_segments = async {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        client
            .query(
                &insert_segments_stmt,
                &[
                    &row.id,
                    &now.0,
                    &new_ordinals,
                    &new_states,
                    &new_first,
                    &new_last,
                    &new_entries,
                    &new_tokens,
                    &new_closed,
                ],
            )
            .await
    };
    let old = segments.first().filter(|s| s.id.is_some() && s.touched);
    let update_open = async {
        let Some(old) = old else {
            return Ok(0);
        };
        client
            .execute(
                &update_open_stmt,
                &[
                    &i64::from(old.entries),
                    &i64::from(old.tokens),
                    &signed(old.last_seq),
                    &old.closed,
                    &pending,
                    &now.0,
                    &signed(old.id.unwrap_or(0)),
                ],
            )
            .await
    };
    let insert_entries = async {
        if seqs.is_empty() {
            return Ok(0);
        }
        client
            .execute(
                &insert_entries_stmt,
                &[
                    &row.id,
                    &now.0,
                    &seqs,
                    &ids,
                    &roles,
                    &contents,
                    &token_counts,
                ],
            )
            .await
    };
    let open_ordinal: Option<i64> = open.map(|at| i64::from(segments[at].ordinal));
    let update_session = async {
        client
            .execute(
                &update_session_stmt,
                &[
                    &signed(next_seq),
                    &i64::from(next_ordinal),
                    &row.id,
                    &open_ordinal,
                    &stored_any,
                    &now.0,
                ],
            )
            .await
    };
    let (inserted, _, _, _, _) = tokio::try_join!(
        insert_segments,
        update_open,
        insert_entries,
        update_session,
        client.batch_execute("RELEASE SAVEPOINT job")
    )?;
    let mut new_ids: HashMap<i64, SegmentId> = HashMap::with_capacity(inserted.len());
    for r in inserted {
        new_ids.insert(r.try_get(1)?, unsigned(r.try_get(0)?, "segment id")?);
    }
    let id_of = |s: &Planned| -> Result<SegmentId, StoreError> {
        match s.id {
            Some(id) => Ok(id),
            None => new_ids
                .get(&i64::from(s.ordinal))
                .copied()
                .ok_or_else(|| StoreError::Corrupt(format!("segment {} not inserted", s.ordinal))),
        }
    };
    for seg in &segments {
        if seg.closed {
            outcome.closed_segment_ids.push(id_of(seg)?);
        }
    }
    if let Some(at) = open {
        outcome.open_segment_id = Some(id_of(&segments[at])?);
    }
    Ok((outcome, added))
}

/// Erases the session `id` of `tenant`, whose usage row and session row
/// the caller has locked: summaries, segments, entries and the session,
/// and its bytes from the tenant's count.
async fn erase_tx(
    client: &Object,
    id: i64,
    tenant: &str,
    name: &str,
) -> Result<Erased, StoreError> {
    let overhead = ROW_OVERHEAD_BYTES as i64;
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
    let session = client
        .prepare_cached("DELETE FROM sessions WHERE id = $1")
        .await?;
    let (counted, _, segments, _, _) = tokio::try_join!(
        async { client.query_one(&count, &[&id, &overhead]).await },
        async { client.execute(&summaries, &[&id]).await },
        async { client.execute(&segments, &[&id]).await },
        async { client.execute(&entries, &[&id]).await },
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

/// Locks the tenant's usage row, then the session's row (if it is still
/// there and, with `cutoff`, still idle since then); its id.
async fn lock_for_erasure(
    client: &Object,
    tenant: &str,
    name: &str,
    cutoff: Option<Millis>,
) -> Result<Option<i64>, StoreError> {
    let usage = client
        .prepare_cached("SELECT 1 FROM tenant_usage WHERE tenant = $1 FOR UPDATE")
        .await?;
    let session = client
        .prepare_cached(
            "SELECT id FROM sessions WHERE tenant = $1 AND name = $2 \
             AND ($3::BIGINT IS NULL OR coalesce(last_append_at, created_at) <= $3) \
             FOR NO KEY UPDATE",
        )
        .await?;
    let cutoff = cutoff.map(|c| c.0);
    let (_, row) = tokio::try_join!(
        async { client.query_opt(&usage, &[&tenant]).await },
        async { client.query_opt(&session, &[&tenant, &name, &cutoff]).await }
    )?;
    Ok(match row {
        Some(r) => Some(r.try_get(0)?),
        None => None,
    })
}

/// Closes the OPEN segment `id`, due now.
async fn close_segment(client: &Object, ids: &[i64], now: Millis) -> Result<(), StoreError> {
    let stmt = client
        .prepare_cached(
            "UPDATE segments SET state = $1, closed_at = $2, next_attempt_at = $2 \
             WHERE id = ANY($3) AND state = $4",
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
    pub(crate) async fn append(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        let jobs = self.inner.appends.as_ref().ok_or(StoreError::ReadOnly)?;
        let (reply, answer) = oneshot::channel();
        jobs.try_send(AppendJob {
            tenant: tenant.0.clone(),
            session: session.as_str().to_owned(),
            entries,
            policy,
            cap: max_tenant_bytes,
            reply,
        })
        .map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => StoreError::Busy,
            mpsc::error::TrySendError::Closed(_) => StoreError::Closed,
        })?;
        self.noting_full(answer.await.map_err(|_| StoreError::Closed)?)
    }

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
                async { close_segment(&client, &[open], Millis::now()).await },
                async { Ok(client.execute(&clear, &[&id]).await?) }
            )?;
            Ok(Some(unsigned(open, "segment id")?))
        };
        self.noting_full(transact(&client, body).await)
    }

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
                // A roll-up committed meanwhile by a pass of this session:
                // erase again, with it.
                Err(e) if is_lost_race(&e) && tries < TRIES => continue,
                other => return self.noting_full(other),
            }
        }
    }

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
            tokio::try_join!(close_segment(&client, &segments, Millis::now()), async {
                Ok(client.execute(&clear, &[&sessions]).await?)
            })?;
            Ok(idle)
        };
        self.noting_full(transact(&client, body).await)
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
                "SELECT tenant, name FROM sessions \
                 WHERE coalesce(last_append_at, created_at) <= $1 \
                 ORDER BY last_append_at LIMIT $2",
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
                Err(e) if is_lost_race(&e) => {}
                Err(e) => return self.noting_full(Err(e)),
            }
        }
        Ok(out)
    }

    pub(crate) async fn list_sessions(
        &self,
        tenant: &Tenant,
        after: Option<SessionName>,
        limit: u32,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "SELECT x.name, x.next_seq, x.open_segment_id, x.created_at, \
                 coalesce(x.last_append_at, x.created_at), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $3), \
                 (SELECT count(*) FROM segments s WHERE s.session_id = x.id AND s.state = $4) \
                 FROM sessions x WHERE x.tenant = $1 AND x.name > $2 ORDER BY x.name LIMIT $5",
            )
            .await?;
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
                })
            })
            .collect()
    }
}

//! The append writer and its transaction: group commit, sequence
//! numbers, idempotency keys, the tenant's byte cap, closing a segment at
//! a bound of its policy.
//!
//! Appends queue for a few writer tasks. Each takes whatever has queued up
//! and commits it in one transaction of a handful of set-based statements
//! (however many calls it holds), pipelined into three or four round trips
//! to the server; the commit (and its WAL flush) is shared by the whole
//! batch. A batch first locks its tenants' `tenant_usage` rows, in tenant
//! order, then its sessions' rows, in tenant and name order: so appends to
//! one session from any number of replicas take turns, and their seqs stay
//! gapless and unique. Between the reads and the writes every call is
//! planned in memory, in order; a call refused there (the tenant's cap, a
//! reused idempotency key) is left out of the writes, so one call's error
//! undoes only that call. An error of the database itself fails the whole
//! batch (run again when it lost a deadlock), and every caller in it is
//! told that nothing was committed.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{Conn, Postgres, ROW_OVERHEAD_BYTES, TRIES, is_lost_race, signed, unsigned};
use crate::model::{
    AppendOutcome, Appended, Millis, NewEntry, Role, SegmentId, SegmentPolicy, SegmentState,
    SessionName, Tenant, estimate_tokens,
};
use crate::store::StoreError;

/// An appended entry's search vector, in the index's language; NULL in a
/// measurement-only build (Cargo.toml's `measure-unindexed`), to weigh the
/// index against this same code.
const ENTRY_TSV: &str = if cfg!(feature = "measure-unindexed") {
    "NULL::tsvector"
} else {
    "to_tsvector((SELECT language FROM search_state WHERE id = 1), u.content)"
};

/// Most appends committed in one transaction.
const MAX_BATCH: usize = 256;

/// One AppendEntries call waiting for a writer.
pub(super) struct AppendJob {
    tenant: String,
    session: String,
    subject: Option<String>,
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
            Ok(client) => commit_batch(&Conn::new(client), &batch).await,
            Err(e) => Err(e.into()),
        };
        match result {
            Err(e) if is_lost_race(&e, "append batch") && tries < TRIES => continue,
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

/// A session of the batch as its calls leave it, planned in memory.
#[derive(Clone)]
struct SessionPlan {
    tenant: String,
    name: String,
    /// None for a session the batch creates (inserted at the end, if a
    /// call to it succeeds).
    id: Option<i64>,
    next_seq: u64,
    next_ordinal: u32,
    /// The segments the batch writes: the one open before it (if any)
    /// first, then new ones, in ordinal order.
    segments: Vec<Planned>,
    /// Index into `segments` of the open segment, if one is open.
    open: Option<usize>,
    /// Whose memory it is: the stored session's, or, for one the batch
    /// creates, the subject of the call that creates it.
    subject: Option<String>,
    /// Entries already stored under each idempotency key the batch names:
    /// seq, role code, content.
    seen: HashMap<String, (u64, i64, String)>,
    /// A call to it succeeded: the session row is written.
    touched: bool,
    /// When its newest entry was said (none yet: `None`).
    newest: Option<Millis>,
    /// A call stored an entry: its last append time moves.
    stored_any: bool,
}

/// A segment the batch writes: the one open before it, or a new one.
#[derive(Clone)]
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

/// An entry to insert: its session's index in the batch, and its columns.
struct EntryRow<'a> {
    session: usize,
    seq: u64,
    client_entry_id: Option<&'a str>,
    role: i64,
    content: &'a str,
    tokens: u32,
    occurred_at: Millis,
    name: Option<&'a str>,
    metadata: &'a crate::model::Metadata,
}

impl SessionPlan {
    /// Closes its open segment, if there is one; returns where it stands
    /// in `segments`.
    fn close_open(&mut self) -> Option<usize> {
        let at = self.open.take()?;
        self.segments[at].closed = true;
        self.segments[at].touched = true;
        Some(at)
    }
}

/// What a call's answer says of segments before their ids are known:
/// (session index, segment index) pairs.
struct PlannedOutcome {
    entries: Vec<Appended>,
    closed: Vec<(usize, usize)>,
    open: Option<(usize, usize)>,
}

/// One transaction for the whole batch, set-based: a handful of
/// statements however many calls it holds, in three or four round trips
/// (locks and reads; new sessions; every write; COMMIT). The calls are
/// planned in memory, in order, between the reads and the writes; a call
/// refused (the tenant's cap, a reused idempotency key, a NUL character)
/// is left out of the writes, so one call's error undoes only that call.
/// The outer error says nothing was committed.
async fn commit_batch(
    client: &Conn,
    batch: &[AppendJob],
) -> Result<Vec<Result<AppendOutcome, StoreError>>, StoreError> {
    let now = Millis::now();
    // The batch's sessions, in lock order (the batch is sorted), and each
    // call's session.
    let mut keys: Vec<(&str, &str)> = Vec::new();
    let mut of_job = Vec::with_capacity(batch.len());
    for job in batch {
        let key = (job.tenant.as_str(), job.session.as_str());
        if keys.last() != Some(&key) {
            keys.push(key);
        }
        of_job.push(keys.len() - 1);
    }
    let mut tenants: Vec<&str> = keys.iter().map(|k| k.0).collect();
    tenants.dedup();
    let key_tenants: Vec<&str> = keys.iter().map(|k| k.0).collect();
    let key_names: Vec<&str> = keys.iter().map(|k| k.1).collect();
    let (mut id_tenants, mut id_names, mut id_keys) = (Vec::new(), Vec::new(), Vec::new());
    for job in batch {
        for e in &job.entries {
            if let Some(cid) = &e.client_entry_id {
                id_tenants.push(job.tenant.as_str());
                id_names.push(job.session.as_str());
                id_keys.push(cid.as_str());
            }
        }
    }
    let body = async {
        let (insert_usage, lock_usage, lock_sessions, find_ids) = tokio::try_join!(
            biased;
            client.prepare_cached(
                "INSERT INTO tenant_usage (tenant, stored_bytes) \
                 SELECT t, 0 FROM unnest($1::text[]) AS t ORDER BY t \
                 ON CONFLICT (tenant) DO NOTHING",
            ),
            client.prepare_cached(
                "SELECT tenant, stored_bytes FROM tenant_usage WHERE tenant = ANY($1) \
                 ORDER BY tenant FOR UPDATE",
            ),
            // Each session through its (tenant, name) index, locked in the
            // order given (tenant, then name).
            client.prepare_cached(
                "SELECT k.t, k.n, s.id, s.next_seq, s.next_ordinal, s.open_segment_id, \
                 o.ordinal, o.entry_count, o.token_estimate, o.last_seq, s.subject, \
                 (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
                 WHERE e.session_id = s.id ORDER BY e.seq DESC LIMIT 1) \
                 FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k (t, n, i) \
                 CROSS JOIN LATERAL (SELECT s.id, s.next_seq, s.next_ordinal, \
                 s.open_segment_id, s.subject FROM sessions s WHERE s.tenant = k.t AND s.name = k.n \
                 LIMIT 1 FOR NO KEY UPDATE) s \
                 LEFT JOIN segments o ON o.id = s.open_segment_id ORDER BY k.i",
            ),
            // One probe of the (session, client_entry_id) index per key
            // (LIMIT keeps the planner from turning the lookups into a
            // join that reads the sessions' every entry).
            client.prepare_cached(
                "SELECT k.t, k.n, e.client_entry_id, e.seq, e.role, e.content \
                 FROM unnest($1::text[], $2::text[], $3::text[]) AS k (t, n, cid) \
                 CROSS JOIN LATERAL (SELECT s.id FROM sessions s \
                 WHERE s.tenant = k.t AND s.name = k.n LIMIT 1) s \
                 CROSS JOIN LATERAL (SELECT e.client_entry_id, e.seq, e.role, e.content \
                 FROM entries e WHERE e.session_id = s.id AND e.client_entry_id = k.cid \
                 LIMIT 1) e",
            ),
        )?;
        // Locks in order: the tenants' usage rows, then the sessions'.
        let (_, usage_rows, session_rows, id_rows) = tokio::try_join!(
            biased;
            async { client.execute(&insert_usage, &[&tenants]).await },
            async { client.query(&lock_usage, &[&tenants]).await },
            async {
                client
                    .query(&lock_sessions, &[&key_tenants, &key_names])
                    .await
            },
            async {
                if id_keys.is_empty() {
                    return Ok(Vec::new());
                }
                client
                    .query(&find_ids, &[&id_tenants, &id_names, &id_keys])
                    .await
            },
        )?;
        let mut usage: HashMap<String, (u64, u64)> = HashMap::new();
        for row in usage_rows {
            let bytes: i64 = row.try_get(1)?;
            usage.insert(row.try_get(0)?, (unsigned(bytes, "stored bytes")?, 0));
        }
        let index: HashMap<(&str, &str), usize> =
            keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let mut plans: Vec<SessionPlan> = keys
            .iter()
            .map(|(tenant, name)| SessionPlan {
                tenant: (*tenant).to_owned(),
                name: (*name).to_owned(),
                id: None,
                next_seq: 1,
                next_ordinal: 1,
                segments: Vec::new(),
                open: None,
                subject: None,
                seen: HashMap::new(),
                touched: false,
                stored_any: false,
                newest: None,
            })
            .collect();
        for r in session_rows {
            let (tenant, name): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let Some(&i) = index.get(&(tenant.as_str(), name.as_str())) else {
                continue;
            };
            let plan = &mut plans[i];
            plan.id = Some(r.try_get(2)?);
            plan.next_seq = unsigned(r.try_get(3)?, "next seq")?;
            plan.next_ordinal = unsigned(r.try_get(4)?, "next ordinal")?;
            plan.subject = r.try_get(10)?;
            plan.newest = r.try_get::<_, Option<i64>>(11)?.map(Millis);
            if let Some(id) = r.try_get::<_, Option<i64>>(5)? {
                plan.segments.push(Planned {
                    id: Some(unsigned(id, "segment id")?),
                    ordinal: unsigned(r.try_get(6)?, "ordinal")?,
                    first_seq: 0,
                    last_seq: unsigned(r.try_get(9)?, "last seq")?,
                    entries: unsigned(r.try_get(7)?, "entry count")?,
                    tokens: unsigned(r.try_get(8)?, "token estimate")?,
                    closed: false,
                    touched: false,
                });
                plan.open = Some(0);
            }
        }
        for r in id_rows {
            let (tenant, name): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            if let Some(&i) = index.get(&(tenant.as_str(), name.as_str())) {
                plans[i].seen.insert(
                    r.try_get(2)?,
                    (
                        unsigned(r.try_get(3)?, "seq")?,
                        r.try_get(4)?,
                        r.try_get(5)?,
                    ),
                );
            }
        }

        // Every call, in order, in memory.
        let mut rows: Vec<EntryRow> = Vec::new();
        let mut planned: Vec<Result<PlannedOutcome, StoreError>> = Vec::with_capacity(batch.len());
        for (job, &i) in batch.iter().zip(&of_job) {
            let (stored, added) = usage.get(&job.tenant).copied().unwrap_or((0, 0));
            let before = plans[i].clone();
            let rows_before = rows.len();
            match plan_job(job, i, &mut plans[i], &mut rows, (stored + added, now)) {
                Ok((outcome, bytes)) => {
                    if let Some(u) = usage.get_mut(&job.tenant) {
                        u.1 += bytes;
                    }
                    planned.push(Ok(outcome));
                }
                Err(e) => {
                    plans[i] = before;
                    rows.truncate(rows_before);
                    planned.push(Err(e));
                }
            }
        }

        // Sessions the batch creates, then every write, pipelined.
        let new: Vec<usize> = (0..plans.len())
            .filter(|&i| plans[i].touched && plans[i].id.is_none())
            .collect();
        if !new.is_empty() {
            let insert = client
                .prepare_cached(
                    "INSERT INTO sessions (tenant, name, created_at, last_append_at, subject) \
                     SELECT k.t, k.n, $3, $3, k.s \
                     FROM unnest($1::text[], $2::text[], $4::text[]) AS k (t, n, s) \
                     ORDER BY k.t, k.n RETURNING tenant, name, id",
                )
                .await?;
            let t: Vec<&str> = new.iter().map(|&i| plans[i].tenant.as_str()).collect();
            let n: Vec<&str> = new.iter().map(|&i| plans[i].name.as_str()).collect();
            let subjects: Vec<Option<&str>> =
                new.iter().map(|&i| plans[i].subject.as_deref()).collect();
            for r in client.query(&insert, &[&t, &n, &now.0, &subjects]).await? {
                let (tenant, name): (String, String) = (r.try_get(0)?, r.try_get(1)?);
                if let Some(&i) = index.get(&(tenant.as_str(), name.as_str())) {
                    plans[i].id = Some(r.try_get(2)?);
                }
            }
        }
        let session_id = |i: usize| -> Result<i64, StoreError> {
            plans[i].id.ok_or_else(|| {
                StoreError::Corrupt(format!("session {:?} not inserted", plans[i].name))
            })
        };
        let new_segments = write_all(client, &plans, &rows, &usage, now, &session_id).await?;
        let id_of = |(i, at): (usize, usize)| -> Result<SegmentId, StoreError> {
            let seg = &plans[i].segments[at];
            match seg.id {
                Some(id) => Ok(id),
                None => new_segments
                    .get(&(session_id(i)?, i64::from(seg.ordinal)))
                    .copied()
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("segment {} not inserted", seg.ordinal))
                    }),
            }
        };
        planned
            .into_iter()
            .map(|p| {
                p.and_then(|p| {
                    Ok(AppendOutcome {
                        entries: p.entries,
                        closed_segment_ids: p
                            .closed
                            .into_iter()
                            .map(id_of)
                            .collect::<Result<_, _>>()?,
                        open_segment_id: p.open.map(id_of).transpose()?,
                    })
                })
            })
            .map(Ok)
            .collect::<Result<Vec<_>, StoreError>>()
    };
    // BEGIN goes with the first statements, COMMIT with the writes (see
    // `write_all`): a batch takes two round trips when it creates no
    // session. Until COMMIT or ROLLBACK is answered, dropping the
    // connection closes it (see `Conn`).
    client.begun();
    let (begun, result) = tokio::join!(client.batch_execute("BEGIN"), body);
    if let Err(e) = begun {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e.into());
    }
    if result.is_err() {
        // Ends the transaction when the error came before the COMMIT was
        // sent; a notice, no more, when the server had already rolled back.
        if client.batch_execute("ROLLBACK").await.is_ok() {
            client.ended();
        }
    } else {
        client.ended();
    }
    result
}

/// Writes what the batch planned and commits, every statement in one
/// round trip: new segments, the segments open before, the entries, the
/// sessions, the tenants' byte counts, COMMIT. Returns the new segments'
/// ids by session id and ordinal.
async fn write_all(
    client: &Object,
    plans: &[SessionPlan],
    rows: &[EntryRow<'_>],
    usage: &HashMap<String, (u64, u64)>,
    now: Millis,
    session_id: &(dyn Fn(usize) -> Result<i64, StoreError> + Sync),
) -> Result<HashMap<(i64, i64), SegmentId>, StoreError> {
    let pending = SegmentState::Pending.code();
    let open_state = SegmentState::Open.code();
    // New segments, column by column.
    let (mut n_session, mut n_ordinal, mut n_state, mut n_first, mut n_last) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut n_entries, mut n_tokens, mut n_closed) = (Vec::new(), Vec::new(), Vec::new());
    // Segments open before the batch that it changed.
    let (mut o_id, mut o_entries, mut o_tokens, mut o_last, mut o_closed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Sessions.
    let (mut s_id, mut s_seq, mut s_ordinal, mut s_open, mut s_stored) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut s_said = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        if !plan.touched {
            continue;
        }
        let id = session_id(i)?;
        for seg in &plan.segments {
            match seg.id {
                None => {
                    n_session.push(id);
                    n_ordinal.push(i64::from(seg.ordinal));
                    n_state.push(if seg.closed { pending } else { open_state });
                    n_first.push(signed(seg.first_seq));
                    n_last.push(signed(seg.last_seq));
                    n_entries.push(i64::from(seg.entries));
                    n_tokens.push(i64::from(seg.tokens));
                    n_closed.push(seg.closed.then_some(now.0));
                }
                Some(existing) if seg.touched => {
                    o_id.push(signed(existing));
                    o_entries.push(i64::from(seg.entries));
                    o_tokens.push(i64::from(seg.tokens));
                    o_last.push(signed(seg.last_seq));
                    o_closed.push(seg.closed);
                }
                Some(_) => {}
            }
        }
        s_id.push(id);
        s_seq.push(signed(plan.next_seq));
        s_ordinal.push(i64::from(plan.next_ordinal));
        s_open.push(plan.open.map(|at| i64::from(plan.segments[at].ordinal)));
        s_stored.push(plan.stored_any);
        s_said.push(plan.newest.map(|m| m.0));
    }
    let mut e_session = Vec::with_capacity(rows.len());
    for r in rows {
        e_session.push(session_id(r.session)?);
    }
    let e_seq: Vec<i64> = rows.iter().map(|r| signed(r.seq)).collect();
    let e_id: Vec<Option<&str>> = rows.iter().map(|r| r.client_entry_id).collect();
    let e_role: Vec<i64> = rows.iter().map(|r| r.role).collect();
    let e_content: Vec<&str> = rows.iter().map(|r| r.content).collect();
    let e_tokens: Vec<i64> = rows.iter().map(|r| i64::from(r.tokens)).collect();
    // NULL when said as it was stored: most live entries spend nothing.
    let e_occurred: Vec<Option<i64>> = rows
        .iter()
        .map(|r| (r.occurred_at != now).then_some(r.occurred_at.0))
        .collect();
    let e_name: Vec<Option<&str>> = rows.iter().map(|r| r.name).collect();
    let e_metadata: Vec<Option<String>> = rows
        .iter()
        .map(|r| crate::store::encode_metadata(r.metadata))
        .collect();
    let (u_tenant, u_added): (Vec<&str>, Vec<i64>) = usage
        .iter()
        .filter(|(_, (_, added))| *added > 0)
        .map(|(tenant, (_, added))| (tenant.as_str(), signed(*added)))
        .unzip();

    // The text's search vector in the index's language (schema.rs).
    let insert_entries_sql = format!(
        "INSERT INTO entries (session_id, seq, client_entry_id, role, content, tokens, \
         created_at, tsv, occurred_at, name, metadata) \
         SELECT u.session_id, u.seq, u.cid, u.role, u.content, u.tokens, $1, {ENTRY_TSV}, \
         u.occurred_at, u.name, u.metadata::jsonb \
         FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], \
         $7::bigint[], $8::bigint[], $9::text[], $10::text[]) \
         AS u (session_id, seq, cid, role, content, tokens, occurred_at, name, metadata)"
    );
    // Prepared first (once per connection), so that the statements below
    // reach the server in the order they are written: the sessions'
    // open_segment_id reads the segments inserted just before.
    let (insert_segments, update_open, insert_entries, update_sessions, update_usage) = tokio::try_join!(
        biased;
        client.prepare_cached(
            "INSERT INTO segments (session_id, level, ordinal, state, first_seq, last_seq, \
             entry_count, token_estimate, next_attempt_at, closed_at, created_at) \
             SELECT u.session_id, 1, u.ordinal, u.state, u.first_seq, u.last_seq, \
             u.entry_count, u.tokens, u.closed_at, u.closed_at, $1 \
             FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], \
             $7::bigint[], $8::bigint[], $9::bigint[]) \
             AS u (session_id, ordinal, state, first_seq, last_seq, entry_count, tokens, closed_at) \
             ORDER BY u.session_id, u.ordinal RETURNING id, session_id, ordinal",
        ),
        client.prepare_cached(
            "UPDATE segments s SET entry_count = u.entry_count, token_estimate = u.tokens, \
             last_seq = u.last_seq, \
             state = CASE WHEN u.closed THEN $1 ELSE s.state END, \
             closed_at = CASE WHEN u.closed THEN $2 ELSE s.closed_at END, \
             next_attempt_at = CASE WHEN u.closed THEN $2 ELSE s.next_attempt_at END \
             FROM unnest($3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bool[]) \
             AS u (id, entry_count, tokens, last_seq, closed) WHERE s.id = u.id",
        ),
        client.prepare_cached(&insert_entries_sql),
        client.prepare_cached(
            "UPDATE sessions x SET next_seq = u.next_seq, next_ordinal = u.next_ordinal, \
             open_segment_id = (SELECT s.id FROM segments s \
             WHERE s.session_id = u.id AND s.level = 1 AND s.ordinal = u.open_ordinal), \
             last_append_at = CASE WHEN u.stored THEN $1 ELSE x.last_append_at END, \
             last_said_at = CASE WHEN u.stored THEN u.said ELSE x.last_said_at END \
             FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bool[], \
             $7::bigint[]) AS u (id, next_seq, next_ordinal, open_ordinal, stored, said) \
             WHERE x.id = u.id",
        ),
        client.prepare_cached(
            "UPDATE tenant_usage u SET stored_bytes = u.stored_bytes + d.added \
             FROM unnest($1::text[], $2::bigint[]) AS d (tenant, added) \
             WHERE u.tenant = d.tenant",
        ),
    )?;
    // COMMIT goes in the same round trip: a write that fails aborts the
    // transaction, and the server then answers COMMIT by rolling back, so
    // the batch counts as committed only when every write succeeded too.
    let (inserted, _, _, _, _, ()) = tokio::try_join!(
        biased;
        async {
            if n_session.is_empty() {
                return Ok(Vec::new());
            }
            client
                .query(
                    &insert_segments,
                    &[
                        &now.0, &n_session, &n_ordinal, &n_state, &n_first, &n_last, &n_entries,
                        &n_tokens, &n_closed,
                    ],
                )
                .await
        },
        async {
            if o_id.is_empty() {
                return Ok(0);
            }
            client
                .execute(
                    &update_open,
                    &[
                        &pending, &now.0, &o_id, &o_entries, &o_tokens, &o_last, &o_closed,
                    ],
                )
                .await
        },
        async {
            if e_seq.is_empty() {
                return Ok(0);
            }
            client
                .execute(
                    &insert_entries,
                    &[
                        &now.0,
                        &e_session,
                        &e_seq,
                        &e_id,
                        &e_role,
                        &e_content,
                        &e_tokens,
                        &e_occurred,
                        &e_name,
                        &e_metadata,
                    ],
                )
                .await
        },
        async {
            if s_id.is_empty() {
                return Ok(0);
            }
            client
                .execute(
                    &update_sessions,
                    &[&now.0, &s_id, &s_seq, &s_ordinal, &s_open, &s_stored, &s_said],
                )
                .await
        },
        async {
            if u_tenant.is_empty() {
                return Ok(0);
            }
            client.execute(&update_usage, &[&u_tenant, &u_added]).await
        },
        client.batch_execute("COMMIT"),
    )?;
    let mut ids = HashMap::with_capacity(inserted.len());
    for r in inserted {
        ids.insert(
            (r.try_get(1)?, r.try_get(2)?),
            unsigned(r.try_get(0)?, "segment id")?,
        );
    }
    Ok(ids)
}

/// Plans one call on its session's plan: seqs, duplicates, segments
/// closing at the policy's bounds, and the tenant's cap (`stored`: what the
/// tenant stores with the batch's calls so far). Returns what to answer
/// and the bytes it adds; on an error the caller puts the plan back.
fn plan_job<'a>(
    job: &'a AppendJob,
    session: usize,
    plan: &mut SessionPlan,
    rows: &mut Vec<EntryRow<'a>>,
    (stored, now): (u64, Millis),
) -> Result<(PlannedOutcome, u64), StoreError> {
    // A tenant at its cap is refused below, once the call is known to
    // add bytes: a retry of what is already stored still answers.
    let mut added = 0u64;
    if plan.id.is_none() && !plan.touched {
        added += job.session.len() as u64 + ROW_OVERHEAD_BYTES;
        plan.subject = job.subject.clone();
    } else if let Some(requested) = &job.subject
        && plan.subject.as_ref() != Some(requested)
    {
        return Err(StoreError::SubjectMismatch {
            session: job.session.clone(),
            subject: plan.subject.clone(),
            requested: requested.clone(),
        });
    }
    plan.touched = true;
    let mut outcome = PlannedOutcome {
        entries: Vec::with_capacity(job.entries.len()),
        closed: Vec::new(),
        open: None,
    };
    for (index, entry) in job.entries.iter().enumerate() {
        if entry.content.contains('\0') {
            return Err(StoreError::Unstorable {
                index,
                reason: "its content holds a NUL character (U+0000), which PostgreSQL cannot store in text",
            });
        }
        if let Some(cid) = &entry.client_entry_id
            && let Some((seq, role, content)) = plan.seen.get(cid)
        {
            // The same id for another entry is a caller's bug, not a retry:
            // the whole call is refused.
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
        let occurred = crate::store::occurred(index, entry.occurred_at, plan.newest, now)?;
        if plan
            .newest
            .is_some_and(|last| job.policy.is_gap(last, occurred))
            && let Some(at) = plan.close_open()
        {
            // The conversation's own clock says a new sitting begins here.
            outcome.closed.push((session, at));
        }
        plan.newest = Some(occurred);
        let seq = plan.next_seq;
        plan.next_seq += 1;
        plan.stored_any = true;
        added += crate::store::stored_bytes(entry) + ROW_OVERHEAD_BYTES;
        let tokens = estimate_tokens(&entry.content);
        rows.push(EntryRow {
            session,
            seq,
            client_entry_id: entry.client_entry_id.as_deref(),
            role: entry.role.code(),
            content: &entry.content,
            tokens,
            occurred_at: occurred,
            name: entry.name.as_deref(),
            metadata: &entry.metadata,
        });
        if let Some(cid) = &entry.client_entry_id {
            plan.seen
                .insert(cid.clone(), (seq, entry.role.code(), entry.content.clone()));
        }
        let at = match plan.open {
            Some(at) => at,
            None => {
                plan.segments.push(Planned {
                    id: None,
                    ordinal: plan.next_ordinal,
                    first_seq: seq,
                    last_seq: seq,
                    entries: 0,
                    tokens: 0,
                    closed: false,
                    touched: true,
                });
                plan.next_ordinal += 1;
                plan.segments.len() - 1
            }
        };
        let seg = &mut plan.segments[at];
        seg.entries += 1;
        seg.tokens = seg.tokens.saturating_add(tokens);
        seg.last_seq = seq;
        seg.touched = true;
        plan.open = Some(at);
        outcome.entries.push(Appended {
            seq,
            client_entry_id: entry.client_entry_id.clone(),
            duplicate: false,
        });
        if job.policy.is_full(seg.entries, seg.tokens)
            && let Some(at) = plan.close_open()
        {
            outcome.closed.push((session, at));
        }
    }
    if added > 0 && job.cap > 0 && stored + added > job.cap {
        return Err(StoreError::TenantFull {
            tenant: job.tenant.clone(),
            wanted: stored + added,
            limit: job.cap,
        });
    }
    outcome.open = plan.open.map(|at| (session, at));
    Ok((outcome, added))
}

impl Postgres {
    pub(crate) async fn append_as(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        subject: Option<String>,
        entries: Vec<NewEntry>,
        policy: SegmentPolicy,
        max_tenant_bytes: u64,
    ) -> Result<AppendOutcome, StoreError> {
        let jobs = self.inner.appends.as_ref().ok_or(StoreError::ReadOnly)?;
        let (reply, answer) = oneshot::channel();
        jobs.try_send(AppendJob {
            tenant: tenant.0.clone(),
            session: session.as_str().to_owned(),
            subject,
            entries,
            policy,
            cap: max_tenant_bytes,
            reply,
        })
        .map_err(crate::store::refused)?;
        self.noting_full(answer.await.map_err(|_| StoreError::Closed)?)
    }
}

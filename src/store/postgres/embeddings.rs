//! Embeddings on PostgreSQL (the tables and triggers are in schema.rs):
//! the check that the server has pgvector, claims on batches of owed
//! items, the vectors written under them (and each generation's HNSW
//! index, made with its first vectors), what a failed pass leaves, the
//! backlog, and the semantic leg of Search: cosine distance through the
//! generation's HNSW index with an iterative scan, every filter applied in
//! the statement before its limit, and an exact scan of the scope when the
//! index finds fewer than asked.
//!
//! Locks: `store_vectors` deletes its items' debts first (locking them),
//! then makes the generation (its row, and its index, which takes a SHARE
//! lock on `embeddings`), then inserts; an erasure deletes the session's
//! debts, then its vectors. Both lock debts before anything of
//! `embeddings`, so neither waits on the other in a cycle, and whichever
//! comes second sees the first's work: a batch after an erasure finds no
//! debt and stores nothing; an erasure after a batch deletes, in a later
//! statement (a fresh snapshot), the vectors the batch committed.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{Conn, DB_NOW, Postgres, transact, unsigned};
use crate::failure::{Failure, FailureClass};
use crate::model::{Disposition, EmbeddingBacklog, Generation, Millis, SessionName, Tenant};
use crate::store::embeddings::{Batch, BatchClaim, EndedBatch, Owed, SemanticLeg};
use crate::store::search::{SearchHit, SearchScope};
use crate::store::{StoreError, encode_failure};

/// The work bound of the semantic leg's transaction, as the lexical leg's.
const STATEMENT_TIMEOUT_MS: u32 = 2000;

/// Index tuples an iterative scan reads at most before it gives up (the
/// pgvector default, said here so that the bound is ours): a filter that
/// few vectors pass then falls to the exact scan of the scope.
const MAX_SCAN_TUPLES: u32 = 20_000;

/// The claim still holds the item: same owner, same fencing token.
const HELD: &str = "claim_owner = $2 AND claim_token = $3";

/// The pgvector type a generation of `dimensions` is indexed as: `vector`
/// up to the 2,000 dimensions its HNSW index takes, `halfvec` (half
/// precision in the index only; the table keeps f32) up to 4,000, and none
/// past that (such a generation is searched exactly).
fn index_type(dimensions: i32) -> Option<&'static str> {
    match dimensions {
        1..=2000 => Some("vector"),
        2001..=4000 => Some("halfvec"),
        _ => None,
    }
}

/// What the semantic leg's distance is computed over: the column cast as
/// the generation's index casts it (so that the planner finds the index),
/// against the query ($1, real[]) cast alike.
fn distance(column: &str, dimensions: i32) -> String {
    let ty = index_type(dimensions).unwrap_or("vector");
    format!("(({column})::{ty}({dimensions})) <=> ($1::real[]::{ty}({dimensions}))")
}

/// The filters of the semantic leg over vectors (`v`, of session `x`),
/// with the lexical leg's parameters from `$first` on: tenant, subject,
/// session names, after, before, roles, levels, metadata. A summary has no
/// role or metadata, so either filter leaves every summary out, as in the
/// lexical leg. When a text was said is its entry's (or, for a summary,
/// its last entry's) occurred_at, read through the text only when a time
/// or metadata filter is given.
fn vector_filters(first: usize) -> String {
    let p = |i: usize| format!("${}", first + i);
    format!(
        "x.tenant = {t} AND ({s}::TEXT IS NULL OR x.subject = {s}) \
         AND ({n}::TEXT[] IS NULL OR x.name = ANY({n})) \
         AND ({r}::BIGINT[] IS NULL OR v.role = ANY({r})) AND v.level = ANY({l}::BIGINT[]) \
         AND (({a}::BIGINT IS NULL AND {b}::BIGINT IS NULL AND {m}::TEXT IS NULL) \
         OR (v.doc > 0 AND EXISTS (SELECT 1 FROM entries e WHERE e.session_id = v.session_id \
         AND e.seq = (v.doc & 4294967295) AND ({a}::BIGINT IS NULL OR {es} > {a}) \
         AND ({b}::BIGINT IS NULL OR {es} < {b}) \
         AND ({m}::TEXT IS NULL OR e.metadata @> {m}::TEXT::JSONB))) \
         OR (v.doc < 0 AND {m}::TEXT IS NULL AND EXISTS (SELECT 1 FROM segments g \
         WHERE g.id = -v.doc AND ({a}::BIGINT IS NULL OR {ss} > {a}) \
         AND ({b}::BIGINT IS NULL OR {ss} < {b}))))",
        t = p(0),
        s = p(1),
        n = p(2),
        a = p(3),
        b = p(4),
        r = p(5),
        l = p(6),
        m = p(7),
        es = super::search::ENTRY_SAID,
        ss = super::search::SUMMARY_SAID,
    )
}

/// The rows found (`near`: doc, session_id, d), as hits, nearest first.
fn near_hits() -> String {
    format!(
        "SELECT x.name, 0::BIGINT, e.seq, e.seq, NULL::BIGINT, e.role, e.created_at, e.content, \
         n.d, n.doc, {entry_said} \
         FROM near n JOIN entries e ON e.session_id = n.session_id AND e.seq = (n.doc & 4294967295) \
         JOIN sessions x ON x.id = e.session_id WHERE n.doc > 0 \
         UNION ALL \
         SELECT x.name, g.level, g.first_seq, g.last_seq, g.id, NULL::BIGINT, s.created_at, s.text, \
         n.d, n.doc, {summary_said} \
         FROM near n JOIN summaries s ON s.segment_id = -n.doc JOIN segments g ON g.id = s.segment_id \
         JOIN sessions x ON x.id = g.session_id WHERE n.doc < 0 \
         ORDER BY 9, 10",
        entry_said = super::search::entry_hit_said(),
        summary_said = super::search::summary_hit_said(),
    )
}

/// The nearest `$10` vectors of generation `id` within the scope, through
/// the generation's index (an iterative scan: the filters are tested on
/// each candidate the index yields, and the scan goes on until the limit
/// is met or its bound is reached).
fn indexed_leg(id: i32, dimensions: i32) -> String {
    let d = distance("v.vector", dimensions);
    format!(
        "WITH near AS MATERIALIZED (SELECT v.doc, v.session_id, {d} AS d \
         FROM embeddings v JOIN sessions x ON x.id = v.session_id \
         WHERE v.generation = {id} AND {filters} ORDER BY {d} LIMIT $10) {near}",
        filters = vector_filters(2),
        near = near_hits(),
    )
}

/// As `indexed_leg`, exactly: every vector of the scope is compared (the
/// scope is read first, so no index can stand in for the comparison).
fn exact_leg(id: i32, dimensions: i32) -> String {
    let d = distance("scoped.vector", dimensions);
    format!(
        "WITH scoped AS MATERIALIZED (SELECT v.doc, v.session_id, v.vector \
         FROM embeddings v JOIN sessions x ON x.id = v.session_id \
         WHERE v.generation = {id} AND {filters}), \
         near AS MATERIALIZED (SELECT doc, session_id, {d} AS d FROM scoped \
         ORDER BY d LIMIT $10) {near}",
        filters = vector_filters(2),
        near = near_hits(),
    )
}

/// How many texts the scope holds, and how many of them have a vector of
/// generation $9 (0 when it has none yet): `embedded_share` is the second
/// over the first. Filters as the lexical leg's, over $1..$8.
fn scope_counts() -> String {
    format!(
        "SELECT (SELECT count(*) FROM entries e JOIN sessions x ON x.id = e.session_id \
         WHERE {entry_filters}) \
         + (SELECT count(*) FROM summaries s JOIN segments g ON g.id = s.segment_id \
         JOIN sessions x ON x.id = g.session_id WHERE {summary_filters}), \
         (SELECT count(*) FROM embeddings v JOIN sessions x ON x.id = v.session_id \
         WHERE v.generation = $9 AND {filters})",
        entry_filters = super::search::entry_filters(1),
        summary_filters = super::search::summary_filters(1),
        filters = vector_filters(1)
    )
}

/// How many texts of the scope are owed a vector (filters as the lexical
/// leg's, over $1..$8), and whether a change of generation is still being
/// walked (its texts are not owed yet). With none owed and no walk, every
/// text of the scope has a vector of the active generation, and nothing
/// needs counting: the counts cost a pass over the scope (84 ms at 100k
/// vectors), ten times the index search.
fn scope_owed() -> String {
    format!(
        "SELECT (SELECT count(*) FROM embeddings_owed o \
        JOIN entries e ON o.doc > 0 AND e.session_id = o.session_id AND e.seq = (o.doc & 4294967295) \
        JOIN sessions x ON x.id = e.session_id WHERE {entry_filters}) \
     + (SELECT count(*) FROM embeddings_owed o \
        JOIN summaries s ON o.doc < 0 AND s.segment_id = -o.doc \
        JOIN segments g ON g.id = s.segment_id JOIN sessions x ON x.id = g.session_id \
        WHERE {summary_filters}), \
       (SELECT entries_after IS NOT NULL OR summaries_after IS NOT NULL \
        FROM embedding_state WHERE id = 1)",
        entry_filters = super::search::entry_filters(1),
        summary_filters = super::search::summary_filters(1),
    )
}

/// Before the session `$1` is erased (in the erasure's transaction):
/// forgets the stored failures of every debt of its owner (its tenant and
/// subject, `Store::claim_owed`), since any of them may quote one of its
/// texts, and lets go of their claims, so that a batch in flight stores
/// neither the failure it would write nor vectors (its texts are claimed
/// again). Locked in doc order, so two erasures of one owner take turns
/// instead of deadlocking. The class stays: parked debts are still counted
/// by it.
pub(super) const FORGET_OWNER_FAILURES: &str = "\
WITH mine AS (SELECT o.doc FROM embeddings_owed o JOIN sessions y ON y.id = o.session_id \
    JOIN sessions me ON me.id = $1 AND y.tenant = me.tenant \
    AND y.subject IS NOT DISTINCT FROM me.subject \
    WHERE o.last_failure IS NOT NULL OR o.claim_token IS NOT NULL \
    ORDER BY o.doc FOR UPDATE OF o) \
UPDATE embeddings_owed o SET last_failure = NULL, claim_owner = NULL, claim_token = NULL, \
    claim_expires_at = NULL FROM mine WHERE o.doc = mine.doc";

/// A lease as milliseconds.
fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2)
}

/// A statement cancelled at its bound is a search too costly.
fn bounded(e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&SqlState::QUERY_CANCELED) {
        StoreError::SearchTooCostly
    } else {
        e.into()
    }
}

impl Postgres {
    /// Makes sure the database has the `vector` extension (pgvector),
    /// creating it if it can (under the migration lock, so replicas
    /// starting together take turns); refuses, naming it, when it cannot.
    /// A store opened read-only only checks.
    pub(crate) async fn require_vectors(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let installed = client
            .query_opt("SELECT 1 FROM pg_extension WHERE extname = 'vector'", &[])
            .await?;
        if installed.is_some() {
            return Ok(());
        }
        let missing = |source: Option<tokio_postgres::Error>| StoreError::VectorsMissing {
            target: self.target().to_owned(),
            source: source.map(|e| Box::new(e) as _),
        };
        if self.writable().is_err() {
            return Err(missing(None));
        }
        let body = async {
            client
                .execute(
                    "SELECT pg_advisory_xact_lock($1)",
                    &[&super::schema::MIGRATION_LOCK],
                )
                .await?;
            client
                .batch_execute(
                    "SET LOCAL client_min_messages = warning; \
                     CREATE EXTENSION IF NOT EXISTS vector",
                )
                .await
                .map_err(|e| missing(Some(e)))
        };
        transact(&client, body).await
    }

    pub(crate) async fn claim_owed(
        &self,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Option<Batch>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let token: i64 = rand::random::<i64>().abs();
        // SKIP LOCKED: a replica never waits on another's claim, nor on an
        // erasure deleting the debts it would take. The batch is of the
        // owner of the oldest due debt only (`Store::claim_owed` says why).
        let due = format!(
            "FROM embeddings_owed o JOIN sessions x ON x.id = o.session_id \
             WHERE o.state = 0 AND o.next_attempt_at <= {DB_NOW} \
             AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= {DB_NOW})"
        );
        let claim = client
            .prepare_cached(&format!(
                "WITH first AS (SELECT x.tenant, x.subject {due} \
                 ORDER BY o.next_attempt_at, o.doc LIMIT 1 FOR UPDATE OF o SKIP LOCKED), \
                 due AS (SELECT o.doc {due} AND x.tenant = (SELECT tenant FROM first) \
                 AND x.subject IS NOT DISTINCT FROM (SELECT subject FROM first) \
                 ORDER BY o.next_attempt_at, o.doc LIMIT $4 FOR UPDATE OF o SKIP LOCKED) \
                 UPDATE embeddings_owed o SET claim_owner = $1, claim_token = $2, \
                 claim_expires_at = {DB_NOW} + $3 \
                 FROM due WHERE o.doc = due.doc RETURNING o.doc, o.passes"
            ))
            .await?;
        let rows = client
            .query(
                &claim,
                &[&owner, &token, &lease_ms(lease), &i64::from(limit)],
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut passes = Vec::with_capacity(rows.len());
        for r in &rows {
            passes.push((r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?));
        }
        let docs: Vec<i64> = passes.iter().map(|(doc, _)| *doc).collect();
        let texts = client
            .prepare_cached(
                "SELECT d.doc, coalesce(e.content, s.text) FROM unnest($1::BIGINT[]) AS d (doc) \
                 LEFT JOIN entries e ON d.doc > 0 AND e.session_id = d.doc >> 32 \
                 AND e.seq = d.doc & 4294967295 \
                 LEFT JOIN summaries s ON d.doc < 0 AND s.segment_id = -d.doc ORDER BY d.doc",
            )
            .await?;
        let mut items = Vec::with_capacity(docs.len());
        let mut gone = Vec::new();
        let mut most = 0;
        for r in client.query(&texts, &[&docs]).await? {
            let doc: i64 = r.try_get(0)?;
            match r.try_get::<_, Option<String>>(1)? {
                Some(text) => {
                    let p = passes
                        .iter()
                        .find(|(d, _)| *d == doc)
                        .map_or(0, |(_, p)| *p);
                    most = most.max(p);
                    items.push(Owed { doc, text });
                }
                None => gone.push(doc),
            }
        }
        if !gone.is_empty() {
            // A debt whose text is gone is no debt.
            let forget = client
                .prepare_cached("DELETE FROM embeddings_owed WHERE doc = ANY($1)")
                .await?;
            client.execute(&forget, &[&gone]).await?;
        }
        // Sorted (by the statement) so the batch's first item, the
        // breaker's key, is stable.
        Ok((!items.is_empty()).then(|| Batch {
            claim: BatchClaim {
                owner: owner.to_owned(),
                token,
            },
            items,
            passes: u32::try_from(most).unwrap_or(u32::MAX),
        }))
    }

    pub(crate) async fn store_vectors(
        &self,
        claim: &BatchClaim,
        generation: &Generation,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<u64, StoreError> {
        self.writable()?;
        let Some(length) = vectors.first().map(|(_, v)| v.len()) else {
            return Ok(0);
        };
        if vectors.iter().any(|(_, v)| v.len() != length) {
            return Err(StoreError::Corrupt(
                "a batch of vectors of unequal lengths".to_owned(),
            ));
        }
        let dimensions = i32::try_from(length)
            .map_err(|_| StoreError::Corrupt(format!("a vector of {length} dimensions")))?;
        let client = self.client().await?;
        let body = async {
            let docs: Vec<i64> = vectors.iter().map(|(doc, _)| *doc).collect();
            // The debts first (see the module doc): those the claim still
            // holds are ours to settle; an erasure that took them first
            // leaves nothing to store.
            let settle = client
                .prepare_cached(&format!(
                    "DELETE FROM embeddings_owed WHERE doc = ANY($1) AND {HELD} RETURNING doc"
                ))
                .await?;
            let held: Vec<i64> = client
                .query(&settle, &[&docs, &claim.owner, &claim.token])
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
            if held.is_empty() {
                return Ok(0);
            }
            let id = generation_id(&client, generation.as_str(), dimensions).await?;
            // One statement for the batch: the docs in order, their
            // vectors laid end to end, each cut out by its position.
            let (docs, flat): (Vec<i64>, Vec<Vec<f32>>) = vectors
                .iter()
                .filter(|(doc, _)| held.contains(doc))
                .cloned()
                .unzip();
            let flat: Vec<f32> = flat.concat();
            let insert = client
                .prepare_cached(
                    "INSERT INTO embeddings (doc, generation, session_id, level, role, created_at, vector) \
                     SELECT u.doc, $2::INTEGER, e.session_id, 0::BIGINT, e.role, e.created_at, \
                     ($3::REAL[])[((u.o - 1) * $4::BIGINT + 1)::INT : (u.o * $4::BIGINT)::INT] \
                     FROM unnest($1::BIGINT[]) WITH ORDINALITY AS u (doc, o) \
                     JOIN entries e ON u.doc > 0 AND e.session_id = u.doc >> 32 \
                     AND e.seq = u.doc & 4294967295 \
                     UNION ALL \
                     SELECT u.doc, $2::INTEGER, g.session_id, g.level, NULL::BIGINT, s.created_at, \
                     ($3::REAL[])[((u.o - 1) * $4::BIGINT + 1)::INT : (u.o * $4::BIGINT)::INT] \
                     FROM unnest($1::BIGINT[]) WITH ORDINALITY AS u (doc, o) \
                     JOIN summaries s ON u.doc < 0 AND s.segment_id = -u.doc \
                     JOIN segments g ON g.id = s.segment_id \
                     ON CONFLICT (doc, generation) DO UPDATE SET vector = EXCLUDED.vector",
                )
                .await?;
            let stored = client
                .execute(&insert, &[&docs, &id, &flat, &i64::from(dimensions)])
                .await?;
            Ok(stored)
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn end_batch(
        &self,
        claim: &BatchClaim,
        ended: EndedBatch,
    ) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let release = "claim_owner = NULL, claim_token = NULL, claim_expires_at = NULL";
        let (state, at): (i64, i64) = match ended.disposition {
            Disposition::Release => {
                let stmt = client
                    .prepare_cached(&format!(
                        "UPDATE embeddings_owed SET {release} \
                         WHERE claim_owner = $1 AND claim_token = $2"
                    ))
                    .await?;
                return Ok(client.execute(&stmt, &[&claim.owner, &claim.token]).await?);
            }
            Disposition::Retry { at } => (0, at.0),
            Disposition::Park => (1, Millis::now().0),
        };
        let failure = ended.failure.as_ref().map(encode_failure).transpose()?;
        let (json, class) = match &failure {
            Some((json, class)) => (Some(json.as_str()), Some(*class)),
            None => (None, None),
        };
        let stmt = client
            .prepare_cached(&format!(
                "UPDATE embeddings_owed SET {release}, state = $3, next_attempt_at = $4, \
                 passes = passes + 1, attempts = attempts + $5, failure_class = $6, \
                 last_failure = $7, failed_at = $8, fingerprint = $9 \
                 WHERE claim_owner = $1 AND claim_token = $2"
            ))
            .await?;
        let n = client
            .execute(
                &stmt,
                &[
                    &claim.owner,
                    &claim.token,
                    &state,
                    &at,
                    &i64::from(ended.attempts),
                    &class,
                    &json,
                    &Millis::now().0,
                    &ended.fingerprint,
                ],
            )
            .await;
        self.noting_full(n.map_err(StoreError::from))
    }

    pub(crate) async fn unpark_owed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "UPDATE embeddings_owed SET state = 0, next_attempt_at = 0 \
                 WHERE (state = 1 OR next_attempt_at > {DB_NOW}) \
                 AND fingerprint IS DISTINCT FROM $1"
            ))
            .await?;
        Ok(client.execute(&stmt, &[&fingerprint]).await?)
    }

    pub(crate) async fn requeue_owed(
        &self,
        tenant: &Tenant,
        session: Option<&SessionName>,
        include_parked: bool,
    ) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "UPDATE embeddings_owed SET state = 0, next_attempt_at = 0 \
                 WHERE ((state = 0 AND next_attempt_at > {DB_NOW}) OR ($3 AND state = 1)) \
                 AND session_id IN (SELECT id FROM sessions WHERE tenant = $1 \
                 AND ($2::TEXT IS NULL OR name = $2))"
            ))
            .await?;
        let session = session.map(SessionName::as_str);
        let n = client
            .execute(&stmt, &[&tenant.0, &session, &include_parked])
            .await;
        self.noting_full(n.map_err(StoreError::from))
    }

    pub(crate) async fn generation_dimensions(
        &self,
        generation: &Generation,
    ) -> Result<Option<usize>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT dimensions FROM embedding_generations WHERE name = $1")
            .await?;
        match client.query_opt(&stmt, &[&generation.as_str()]).await? {
            Some(r) => Ok(Some(unsigned(
                i64::from(r.try_get::<_, i32>(0)?),
                "dimensions",
            )?)),
            None => Ok(None),
        }
    }

    pub(crate) async fn embedding_backlog(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<EmbeddingBacklog, StoreError> {
        let client = self.client().await?;
        let tenant = tenant.map(|t| t.0.as_str());
        const OWED: &str = "FROM embeddings_owed o JOIN sessions x ON x.id = o.session_id \
                            WHERE ($1::TEXT IS NULL OR x.tenant = $1)";
        let pending = client
            .prepare_cached(&format!("SELECT count(*) {OWED} AND o.state = 0"))
            .await?;
        let deferred = client
            .prepare_cached(&format!(
                "SELECT count(*) {OWED} AND o.state = 0 AND o.next_attempt_at > {DB_NOW} \
                 AND o.failure_class IN ('{}', '{}')",
                FailureClass::RateLimited.as_str(),
                FailureClass::QuotaExhausted.as_str()
            ))
            .await?;
        let parked = client
            .prepare_cached(&format!(
                "SELECT coalesce(o.failure_class, ''), count(*) {OWED} AND o.state = 1 \
                 GROUP BY 1 ORDER BY 1"
            ))
            .await?;
        let last = client
            .prepare_cached(&format!(
                "SELECT o.last_failure {OWED} AND o.last_failure IS NOT NULL \
                 ORDER BY o.failed_at DESC LIMIT 1"
            ))
            .await?;
        let embedded = client
            .prepare_cached(
                "SELECT count(*) FROM embeddings v JOIN sessions x ON x.id = v.session_id \
                 JOIN embedding_generations n ON n.id = v.generation \
                 WHERE n.name = $2 AND ($1::TEXT IS NULL OR x.tenant = $1)",
            )
            .await?;
        let name = generation.as_str();
        let by_tenant: [&(dyn ToSql + Sync); 1] = [&tenant];
        let by_generation: [&(dyn ToSql + Sync); 2] = [&tenant, &name];
        // Pipelined: five reads in one round trip.
        let (pending, deferred, parked, last, embedded) = tokio::try_join!(
            biased;
            client.query_one(&pending, &by_tenant),
            client.query_one(&deferred, &by_tenant),
            client.query(&parked, &by_tenant),
            client.query_opt(&last, &by_tenant),
            client.query_one(&embedded, &by_generation),
        )?;
        let mut parked_by_class = Vec::with_capacity(parked.len());
        for r in parked {
            parked_by_class.push((r.try_get(0)?, unsigned(r.try_get(1)?, "count")?));
        }
        let last_failure = match last {
            Some(r) => Some(
                serde_json::from_str::<Failure>(&r.try_get::<_, String>(0)?)
                    .map_err(|e| StoreError::Corrupt(format!("stored failure: {e}")))?,
            ),
            None => None,
        };
        Ok(EmbeddingBacklog {
            pending: unsigned(pending.try_get(0)?, "count")?,
            parked: parked_by_class.iter().map(|(_, n)| n).sum(),
            parked_by_class,
            embedded: unsigned(embedded.try_get(0)?, "count")?,
            last_failure,
            deferred: unsigned(deferred.try_get(0)?, "count")?,
        })
    }

    pub(crate) async fn semantic_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        generation: &Generation,
        query: Vec<f32>,
        limit: u32,
    ) -> Result<SemanticLeg, StoreError> {
        let client = self.reader().await?;
        let known = client
            .prepare_cached("SELECT id, dimensions FROM embedding_generations WHERE name = $1")
            .await?;
        let Some(row) = client.query_opt(&known, &[&generation.as_str()]).await? else {
            // No vector of the generation anywhere yet: lexical carries it.
            return Ok(SemanticLeg::default());
        };
        let (id, dimensions): (i32, i32) = (row.try_get(0)?, row.try_get(1)?);
        let values = super::search::ScopeValues::new(tenant, scope)?;
        let wanted = i64::from(limit);
        let filters = values.params();
        // The index's candidate list at least the limit (so one pass of
        // the graph can fill it), within what pgvector takes. Plans made
        // for each call's values: a generic plan of these cached
        // statements (PostgreSQL's choice after five calls) cannot see
        // that the filters' `$n IS NULL` hold, expects few rows, and reads
        // and sorts the whole scope instead of walking the index (1.5 s
        // against 17 ms at 100k vectors).
        let ef_search = limit.clamp(40, 1000);
        let settings = format!(
            "SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}; \
             SET LOCAL hnsw.ef_search = {ef_search}; \
             SET LOCAL hnsw.iterative_scan = relaxed_order; \
             SET LOCAL hnsw.max_scan_tuples = {MAX_SCAN_TUPLES}; \
             SET LOCAL plan_cache_mode = force_custom_plan"
        );
        let comparable = usize::try_from(dimensions).is_ok_and(|d| d == query.len());
        let body = async {
            client.batch_execute(&settings).await?;
            let owed = client.prepare_cached(&scope_owed()).await?;
            let owed = client.query_one(&owed, &filters).await.map_err(bounded)?;
            let (owed, walking): (i64, Option<bool>) = (owed.try_get(0)?, owed.try_get(1)?);
            // (total, embedded), counted only when some text of the scope
            // may lack a vector.
            let counts = if owed > 0 || walking.unwrap_or(false) {
                let counts = client.prepare_cached(&scope_counts()).await?;
                let mut count_params: Vec<&(dyn ToSql + Sync)> = filters.to_vec();
                count_params.push(&id);
                let counted = client
                    .query_one(&counts, &count_params)
                    .await
                    .map_err(bounded)?;
                Some((counted.try_get::<_, i64>(0)?, counted.try_get::<_, i64>(1)?))
            } else {
                None
            };
            // A query of another length is of another generation: it
            // compares with nothing here.
            if !comparable || counts.is_some_and(|(_, embedded)| embedded == 0) {
                return Ok((Vec::new(), counts));
            }
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&query];
            params.extend_from_slice(&filters);
            params.push(&wanted);
            let mut rows = Vec::new();
            if index_type(dimensions).is_some() {
                let indexed = client.prepare_cached(&indexed_leg(id, dimensions)).await?;
                rows = client.query(&indexed, &params).await.map_err(bounded)?;
            }
            // Fewer than asked, while the scope may have more vectors: the
            // scan stopped at its bound (or there is no index). The exact
            // scan finds every one, so a filter never costs a hit that
            // exists.
            let more = counts.is_none_or(|(_, embedded)| (rows.len() as i64) < embedded);
            if (rows.len() as i64) < wanted && more {
                let exact = client.prepare_cached(&exact_leg(id, dimensions)).await?;
                rows = client.query(&exact, &params).await.map_err(bounded)?;
            }
            Ok((rows, counts))
        };
        let (rows, counts) = transact(&client, body).await?;
        let hits = rows
            .iter()
            .map(|r| {
                // pgvector's `<=>` is the cosine distance, 1 - cosine.
                let distance: f64 = r.try_get(8)?;
                Ok(SearchHit {
                    similarity: (1.0 - distance) as f32,
                    ..super::search::hit(r)?
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let embedded_share = match counts {
            Some((total, embedded)) if total > 0 => embedded as f64 / total as f64,
            Some(_) => 0.0,
            // Nothing owed: every text of the scope has its vector (and an
            // empty scope none).
            None if rows.is_empty() => 0.0,
            None => 1.0,
        };
        Ok(SemanticLeg {
            hits,
            embedded_share,
        })
    }
}

/// The id of `generation` (vectors of `dimensions`), made with its HNSW
/// index if it is new. Inside the caller's transaction: a replica storing
/// the same new generation meanwhile waits on its row, then finds it.
async fn generation_id(client: &Conn, name: &str, dimensions: i32) -> Result<i32, StoreError> {
    let find = client
        .prepare_cached("SELECT id, dimensions FROM embedding_generations WHERE name = $1")
        .await?;
    let found = match client.query_opt(&find, &[&name]).await? {
        Some(r) => Some((r.try_get::<_, i32>(0)?, r.try_get::<_, i32>(1)?)),
        None => {
            let make = client
                .prepare_cached(
                    "INSERT INTO embedding_generations (name, dimensions) VALUES ($1, $2) \
                     ON CONFLICT (name) DO NOTHING RETURNING id",
                )
                .await?;
            match client.query_opt(&make, &[&name, &dimensions]).await? {
                Some(r) => {
                    let id: i32 = r.try_get(0)?;
                    if let Some(ty) = index_type(dimensions) {
                        // Our own integers only: no caller text in DDL.
                        client
                            .batch_execute(&format!(
                                "CREATE INDEX embeddings_hnsw_{id} ON embeddings \
                                 USING hnsw ((vector::{ty}({dimensions})) {ty}_cosine_ops) \
                                 WHERE generation = {id}"
                            ))
                            .await?;
                    }
                    return Ok(id);
                }
                // Made by another transaction that committed meanwhile.
                None => match client.query_opt(&find, &[&name]).await? {
                    Some(r) => Some((r.try_get::<_, i32>(0)?, r.try_get::<_, i32>(1)?)),
                    None => None,
                },
            }
        }
    };
    match found {
        Some((id, d)) if d == dimensions => Ok(id),
        Some((_, d)) => Err(StoreError::Corrupt(format!(
            "vectors of {dimensions} dimensions for the generation {name:?}, whose vectors have {d}"
        ))),
        None => Err(StoreError::Corrupt(format!(
            "the generation {name:?} vanished while being made"
        ))),
    }
}

//! Embeddings on SQLite (the tables and triggers are in schema.rs): claims
//! on batches of owed items, the vectors written under them, what a failed
//! pass leaves, the backlog, and the semantic leg of Search: an exact
//! cosine over the scope's unit vectors, in Rust, every filter applied in
//! the statement that reads them.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::search::{
    ScopeValues, bounded, entry_filters, entry_said, row, summary_filters, summary_hit_said,
    summary_said,
};
use super::{Sqlite, vectors};
use crate::failure::{Failure, FailureClass};
use crate::model::{Disposition, EmbeddingBacklog, Generation, Millis, SessionName, Tenant};
use crate::store::embeddings::{
    Batch, BatchClaim, EndedBatch, Owed, SemanticLeg, cosine, from_bytes, to_bytes,
};
use crate::store::search::{SearchHit, SearchScope};
use crate::store::{StoreError, encode_failure};

/// The claim still holds the item: same owner, same fencing token.
const HELD: &str = "doc = ?1 AND claim_owner = ?2 AND claim_token = ?3";

/// Every document of the scope, with its vector of the generation (?1) if
/// it has one.
const SCOPE_VECTORS: &str = concat!(
    "SELECT (e.session_id << 32) | e.seq, v.vector FROM sessions x \
     JOIN entries e ON e.session_id = x.id \
     LEFT JOIN embeddings v ON v.doc = (e.session_id << 32) | e.seq AND v.generation = ?1 \
     WHERE ",
    entry_filters!(),
    " UNION ALL SELECT -g.id, v.vector FROM sessions x \
     JOIN segments g ON g.session_id = x.id JOIN summaries s ON s.segment_id = g.id \
     LEFT JOIN embeddings v ON v.doc = -g.id AND v.generation = ?1 \
     WHERE ",
    summary_filters!()
);

/// The debts due at ?1 and not claimed by a live worker, with their
/// session (`x`); erasing sessions' are left alone.
const DUE: &str = "FROM embeddings_owed o JOIN sessions x ON x.id = o.session_id \
                   WHERE o.state = 0 AND o.next_attempt_at <= ?1 AND x.erasing IS NULL \
                   AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= ?1)";

/// Before the session `id` is erased (in the erasure's transaction, while
/// the session still names its subject): forgets the stored failures of
/// every debt of its owner (its tenant and subject, `Store::claim_owed`),
/// since any of them may quote one of its texts, and lets go of their
/// claims, so that a batch in flight stores neither the failure it would
/// write nor vectors (its texts are claimed again). The class stays, so
/// parked debts are still counted by it.
pub(super) fn forget_owner_failures(conn: &Connection, id: i64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE embeddings_owed SET last_failure = NULL, claim_owner = NULL, \
         claim_token = NULL, claim_expires_at = NULL \
         WHERE session_id IN (SELECT y.id FROM sessions me JOIN sessions y \
         ON y.tenant = me.tenant AND y.subject IS me.subject WHERE me.id = ?1) \
         AND (last_failure IS NOT NULL OR claim_token IS NOT NULL)",
    )?
    .execute([id])?;
    Ok(())
}

/// The text a document names: an entry's content or a summary's text.
fn text_of(conn: &Connection, doc: i64) -> Result<Option<String>, StoreError> {
    Ok(if doc > 0 {
        conn.prepare_cached("SELECT content FROM entries WHERE session_id = ?1 AND seq = ?2")?
            .query_row(params![doc >> 32, doc & 0xFFFF_FFFF], |r| r.get(0))
            .optional()?
    } else {
        conn.prepare_cached("SELECT text FROM summaries WHERE segment_id = ?1")?
            .query_row(params![-doc], |r| r.get(0))
            .optional()?
    })
}

/// A document found, as a hit.
fn hit(conn: &Connection, doc: i64) -> Result<Option<SearchHit>, StoreError> {
    let found = if doc > 0 {
        conn.prepare_cached(concat!(
            "SELECT x.name, 0, e.seq, e.seq, NULL, e.role, e.created_at, e.content, ",
            entry_said!(),
            " FROM entries e JOIN sessions x ON x.id = e.session_id \
             WHERE e.session_id = ?1 AND e.seq = ?2"
        ))?
        .query_row(params![doc >> 32, doc & 0xFFFF_FFFF], row)
        .optional()?
    } else {
        conn.prepare_cached(concat!(
            "SELECT x.name, g.level, g.first_seq, g.last_seq, g.id, NULL, s.created_at, s.text, ",
            summary_hit_said!(),
            " FROM summaries s JOIN segments g ON g.id = s.segment_id \
             JOIN sessions x ON x.id = g.session_id WHERE s.segment_id = ?1"
        ))?
        .query_row(params![-doc], row)
        .optional()?
    };
    Ok(found)
}

impl Sqlite {
    pub(crate) async fn claim_owed(
        &self,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Option<Batch>, StoreError> {
        let owner = owner.to_owned();
        self.write(move |conn| {
            let now = Millis::now();
            let token: i64 = rand::random::<i64>().abs();
            // The owner of the oldest due debt; the batch is of its texts
            // only (`Store::claim_owed` says why).
            let first: Option<(String, Option<String>)> = conn
                .prepare_cached(&format!(
                    "SELECT x.tenant, x.subject {DUE} ORDER BY o.next_attempt_at, o.doc LIMIT 1"
                ))?
                .query_row(params![now.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((tenant, subject)) = first else {
                return Ok(None);
            };
            let claimed: Vec<(i64, u32)> = conn
                .prepare_cached(&format!(
                    "UPDATE embeddings_owed SET claim_owner = ?2, claim_token = ?3, \
                     claim_expires_at = ?4 WHERE doc IN (SELECT o.doc {DUE} \
                     AND x.tenant = ?6 AND x.subject IS ?7 \
                     ORDER BY o.next_attempt_at, o.doc LIMIT ?5) RETURNING doc, passes"
                ))?
                .query_map(
                    params![
                        now.0,
                        owner,
                        token,
                        now.saturating_add(lease).0,
                        limit,
                        tenant,
                        subject
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?
                .collect::<Result<_, _>>()?;
            if claimed.is_empty() {
                return Ok(None);
            }
            let mut items = Vec::with_capacity(claimed.len());
            let mut passes = 0;
            for (doc, p) in claimed {
                match text_of(conn, doc)? {
                    Some(text) => {
                        passes = passes.max(p);
                        items.push(Owed { doc, text });
                    }
                    // A debt whose text is gone is no debt.
                    None => {
                        conn.prepare_cached("DELETE FROM embeddings_owed WHERE doc = ?1")?
                            .execute(params![doc])?;
                    }
                }
            }
            // Sorted so the batch's first item, the breaker's key, is stable.
            items.sort_by_key(|i| i.doc);
            Ok((!items.is_empty()).then_some(Batch {
                claim: BatchClaim { owner, token },
                items,
                passes,
            }))
        })
        .await
    }

    pub(crate) async fn store_vectors(
        &self,
        claim: &BatchClaim,
        generation: &Generation,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<u64, StoreError> {
        let claim = claim.clone();
        let generation = generation.as_str().to_owned();
        self.write(move |conn| {
            let mut stored = 0;
            for (doc, vector) in vectors {
                stored += conn
                    .prepare_cached(&format!(
                        "INSERT OR REPLACE INTO embeddings (doc, generation, session_id, vector) \
                         SELECT doc, ?4, session_id, ?5 FROM embeddings_owed WHERE {HELD}"
                    ))?
                    .execute(params![
                        doc,
                        claim.owner,
                        claim.token,
                        generation,
                        to_bytes(&vector)
                    ])? as u64;
                conn.prepare_cached(&format!("DELETE FROM embeddings_owed WHERE {HELD}"))?
                    .execute(params![doc, claim.owner, claim.token])?;
            }
            Ok(stored)
        })
        .await
    }

    pub(crate) async fn end_batch(
        &self,
        claim: &BatchClaim,
        ended: EndedBatch,
    ) -> Result<u64, StoreError> {
        let claim = claim.clone();
        let failure = ended.failure.as_ref().map(encode_failure).transpose()?;
        self.write(move |conn| {
            let release = "claim_owner = NULL, claim_token = NULL, claim_expires_at = NULL";
            let (state, at) = match ended.disposition {
                Disposition::Release => {
                    let n = conn
                        .prepare_cached(&format!(
                            "UPDATE embeddings_owed SET {release} \
                             WHERE claim_owner = ?1 AND claim_token = ?2"
                        ))?
                        .execute(params![claim.owner, claim.token])?;
                    return Ok(n as u64);
                }
                Disposition::Retry { at } => (0, at.0),
                Disposition::Park => (1, Millis::now().0),
            };
            let (json, class) = match &failure {
                Some((json, class)) => (Some(json.as_str()), Some(*class)),
                None => (None, None),
            };
            let n = conn
                .prepare_cached(&format!(
                    "UPDATE embeddings_owed SET {release}, state = ?3, next_attempt_at = ?4, \
                     passes = passes + 1, attempts = attempts + ?5, failure_class = ?6, \
                     last_failure = ?7, failed_at = ?8, fingerprint = ?9 \
                     WHERE claim_owner = ?1 AND claim_token = ?2"
                ))?
                .execute(params![
                    claim.owner,
                    claim.token,
                    state,
                    at,
                    ended.attempts,
                    class,
                    json,
                    Millis::now().0,
                    ended.fingerprint
                ])?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) async fn unpark_owed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        let fingerprint = fingerprint.to_owned();
        self.write(move |conn| {
            Ok(conn
                .prepare_cached(
                    "UPDATE embeddings_owed SET state = 0, next_attempt_at = 0 \
                     WHERE (state = 1 OR next_attempt_at > ?2) AND fingerprint IS NOT ?1",
                )?
                .execute(params![fingerprint, Millis::now().0])? as u64)
        })
        .await
    }

    pub(crate) async fn requeue_owed(
        &self,
        tenant: &Tenant,
        session: Option<&SessionName>,
        include_parked: bool,
    ) -> Result<u64, StoreError> {
        let tenant = tenant.0.clone();
        let session = session.map(|s| s.as_str().to_owned());
        self.write(move |conn| {
            Ok(conn
                .prepare_cached(
                    "UPDATE embeddings_owed SET state = 0, next_attempt_at = 0 \
                     WHERE ((state = 0 AND next_attempt_at > ?3) OR (?4 AND state = 1)) \
                     AND session_id IN (SELECT id FROM sessions WHERE tenant = ?1 \
                     AND (?2 IS NULL OR name = ?2) AND erasing IS NULL)",
                )?
                .execute(params![tenant, session, Millis::now().0, include_parked])?
                as u64)
        })
        .await
    }

    pub(crate) async fn generation_dimensions(
        &self,
        generation: &Generation,
    ) -> Result<Option<usize>, StoreError> {
        let generation = generation.as_str().to_owned();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT length(vector) / 4 FROM embeddings WHERE generation = ?1 LIMIT 1",
                )?
                .query_row(params![generation], |r| r.get::<_, i64>(0))
                .optional()?
                .map(|n| n as usize))
        })
        .await
    }

    pub(crate) async fn embedding_backlog(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<EmbeddingBacklog, StoreError> {
        let tenant = tenant.map(|t| t.0.clone());
        let generation = generation.as_str().to_owned();
        self.read(move |conn| {
            const OWED: &str = "FROM embeddings_owed o JOIN sessions x ON x.id = o.session_id \
                                WHERE (?1 IS NULL OR x.tenant = ?1) AND x.erasing IS NULL";
            let pending: u64 = conn
                .prepare_cached(&format!("SELECT count(*) {OWED} AND o.state = 0"))?
                .query_row(params![tenant], |r| r.get(0))?;
            let deferred: u64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) {OWED} AND o.state = 0 AND o.next_attempt_at > ?2 \
                     AND o.failure_class IN ('{}', '{}')",
                    FailureClass::RateLimited.as_str(),
                    FailureClass::QuotaExhausted.as_str()
                ))?
                .query_row(params![tenant, Millis::now().0], |r| r.get(0))?;
            let parked_by_class: Vec<(String, u64)> = conn
                .prepare_cached(&format!(
                    "SELECT coalesce(o.failure_class, ''), count(*) {OWED} AND o.state = 1 \
                     GROUP BY 1 ORDER BY 1"
                ))?
                .query_map(params![tenant], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            let last: Option<String> = conn
                .prepare_cached(&format!(
                    "SELECT o.last_failure {OWED} AND o.last_failure IS NOT NULL \
                     ORDER BY o.failed_at DESC LIMIT 1"
                ))?
                .query_row(params![tenant], |r| r.get(0))
                .optional()?;
            let last_failure = last
                .map(|json| serde_json::from_str::<Failure>(&json))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("stored failure: {e}")))?;
            let embedded: u64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM embeddings v JOIN sessions x ON x.id = v.session_id \
                     WHERE v.generation = ?2 AND (?1 IS NULL OR x.tenant = ?1) \
                     AND x.erasing IS NULL",
                )?
                .query_row(params![tenant, generation], |r| r.get(0))?;
            Ok(EmbeddingBacklog {
                pending,
                parked: parked_by_class.iter().map(|(_, n)| n).sum(),
                parked_by_class,
                embedded,
                last_failure,
                deferred,
            })
        })
        .await
    }

    pub(crate) async fn semantic_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        generation: &Generation,
        query: Vec<f32>,
        limit: u32,
    ) -> Result<SemanticLeg, StoreError> {
        let values = ScopeValues::new(tenant, scope)?;
        let generation = generation.as_str().to_owned();
        let (inner, tenant, scope) = (self.inner.clone(), tenant.clone(), scope.clone());
        self.read_mut(move |conn| {
            bounded(conn, |conn| {
                let cached = vectors::semantic_leg(
                    conn,
                    &inner.vectors,
                    &tenant,
                    &scope,
                    &generation,
                    &query,
                    limit,
                )?;
                if let Some(leg) = cached {
                    return Ok(leg);
                }
                // Past the cache's budget: every vector read here.
                let mut stmt = conn.prepare_cached(SCOPE_VECTORS)?;
                let mut rows = stmt.query(values.params(&generation, &[]).as_slice())?;
                let (mut total, mut embedded) = (0u64, 0u64);
                let mut scored: Vec<(f32, i64)> = Vec::new();
                while let Some(r) = rows.next()? {
                    total += 1;
                    let doc: i64 = r.get(0)?;
                    let Some(bytes) = r.get::<_, Option<Vec<u8>>>(1)? else {
                        continue;
                    };
                    embedded += 1;
                    let vector = from_bytes(&bytes)
                        .ok_or_else(|| StoreError::Corrupt(format!("vector of {doc}")))?;
                    // Another length is another generation's vector, never
                    // compared.
                    if vector.len() == query.len() {
                        scored.push((cosine(&query, &vector), doc));
                    }
                }
                drop(rows);
                let keep = (limit as usize).min(scored.len());
                if keep < scored.len() {
                    scored.select_nth_unstable_by(keep, |a, b| b.0.total_cmp(&a.0));
                    scored.truncate(keep);
                }
                scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                let mut hits = Vec::with_capacity(scored.len());
                for (cos, doc) in scored {
                    if let Some(h) = hit(conn, doc)? {
                        hits.push(SearchHit {
                            similarity: cos,
                            ..h
                        });
                    }
                }
                Ok(SemanticLeg {
                    hits,
                    embedded_share: if total == 0 {
                        0.0
                    } else {
                        embedded as f64 / total as f64
                    },
                })
            })
        })
        .await
    }
}

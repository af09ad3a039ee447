//! A change of embedding generation on PostgreSQL (the `embedding_state`
//! row, schema.rs; the walk is described in store/generations.rs). Every
//! step locks the state row, so replicas take turns; appends never wait
//! on it. The last of an old generation's vectors go with its HNSW index
//! and its row.

use super::{Conn, Postgres, transact, unsigned};
use crate::model::{Generation, Tenant};
use crate::store::StoreError;
use crate::store::generations::{Dropped, Reowed, SCAN, Walked, pick};

/// One kind of text the walk owes, in the order of its key.
struct Part {
    /// (key, doc, session, lacking) of the texts with $1 < key <= $2, the
    /// first $3 in key order; lacking: no vector of generation id $4, no
    /// debt.
    walk: &'static str,
    /// How many texts with $1 < key <= $2 (of tenant $4, or any) lack a
    /// vector of generation id $3 and a debt.
    unwalked: &'static str,
    /// The range's bounds in `embedding_state`.
    after: &'static str,
    until: &'static str,
}

/// Entries by document (their primary key's order: seq < 2^32). An
/// erasure takes a session's debts in its own transaction; a debt owed
/// here for a text it erased meanwhile is dropped when claimed.
const ENTRIES: Part = Part {
    walk: "SELECT (e.session_id << 32) | e.seq, (e.session_id << 32) | e.seq, e.session_id, \
           NOT EXISTS (SELECT 1 FROM embeddings v \
                           WHERE v.doc = (e.session_id << 32) | e.seq AND v.generation = $4) \
           AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = (e.session_id << 32) | e.seq) \
           FROM entries e JOIN sessions x ON x.id = e.session_id \
           WHERE (e.session_id, e.seq) > ($1::BIGINT >> 32, $1::BIGINT & 4294967295) \
           AND (e.session_id, e.seq) <= ($2::BIGINT >> 32, $2::BIGINT & 4294967295) \
           ORDER BY e.session_id, e.seq LIMIT $3",
    unwalked: "SELECT count(*) FROM entries e JOIN sessions x ON x.id = e.session_id \
               WHERE (e.session_id, e.seq) > ($1::BIGINT >> 32, $1::BIGINT & 4294967295) \
               AND (e.session_id, e.seq) <= ($2::BIGINT >> 32, $2::BIGINT & 4294967295) \
               AND ($4::TEXT IS NULL OR x.tenant = $4) \
               AND NOT EXISTS (SELECT 1 FROM embeddings v \
                               WHERE v.doc = (e.session_id << 32) | e.seq AND v.generation = $3) \
               AND NOT EXISTS (SELECT 1 FROM embeddings_owed o \
                               WHERE o.doc = (e.session_id << 32) | e.seq)",
    after: "entries_after",
    until: "entries_until",
};

/// Summaries by segment id (their document is minus it).
const SUMMARIES: Part = Part {
    walk: "SELECT m.segment_id, -m.segment_id, g.session_id, \
           NOT EXISTS (SELECT 1 FROM embeddings v \
                           WHERE v.doc = -m.segment_id AND v.generation = $4) \
           AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = -m.segment_id) \
           FROM summaries m JOIN segments g ON g.id = m.segment_id \
           JOIN sessions x ON x.id = g.session_id \
           WHERE m.segment_id > $1 AND m.segment_id <= $2 ORDER BY m.segment_id LIMIT $3",
    unwalked: "SELECT count(*) FROM summaries m JOIN segments g ON g.id = m.segment_id \
               JOIN sessions x ON x.id = g.session_id \
               WHERE m.segment_id > $1 AND m.segment_id <= $2 \
               AND ($4::TEXT IS NULL OR x.tenant = $4) \
               AND NOT EXISTS (SELECT 1 FROM embeddings v \
                               WHERE v.doc = -m.segment_id AND v.generation = $3) \
               AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = -m.segment_id)",
    after: "summaries_after",
    until: "summaries_until",
};

/// The walk's ranges, the state row locked (FOR UPDATE) when `lock`.
async fn ranges(client: &Conn, lock: bool) -> Result<[Option<(i64, i64)>; 2], StoreError> {
    let row = client
        .query_one(
            &format!(
                "SELECT entries_after, entries_until, summaries_after, summaries_until \
                 FROM embedding_state WHERE id = 1{}",
                if lock { " FOR UPDATE" } else { "" }
            ),
            &[],
        )
        .await?;
    let get = |i: usize| row.try_get::<_, Option<i64>>(i);
    Ok([get(0)?.zip(get(1)?), get(2)?.zip(get(3)?)])
}

/// The active generation, the state row locked (FOR UPDATE) when `lock`.
async fn active(client: &Conn, lock: bool) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_one(
            &format!(
                "SELECT generation FROM embedding_state WHERE id = 1{}",
                if lock { " FOR UPDATE" } else { "" }
            ),
            &[],
        )
        .await?
        .try_get(0)?)
}

/// The id of a generation by name; -1 (no row's) when it has none yet.
async fn generation_id(client: &Conn, generation: &Generation) -> Result<i32, StoreError> {
    let stmt = client
        .prepare_cached("SELECT id FROM embedding_generations WHERE name = $1")
        .await?;
    Ok(
        match client.query_opt(&stmt, &[&generation.as_str()]).await? {
            Some(r) => r.try_get(0)?,
            None => -1,
        },
    )
}

impl Postgres {
    pub(crate) async fn set_embedding_generation(
        &self,
        generation: &Generation,
    ) -> Result<Option<Option<String>>, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            let row = client
                .query_one(
                    "SELECT generation, owing FROM embedding_state WHERE id = 1 FOR UPDATE",
                    &[],
                )
                .await?;
            let (before, owing): (Option<String>, bool) = (row.try_get(0)?, row.try_get(1)?);
            let same = before.as_deref() == Some(generation.as_str());
            if same && owing {
                return Ok(None);
            }
            // Another generation, or embeddings turned on: nothing stored
            // while they were off is owed, so every text is walked (what
            // has a vector of this generation or a debt is skipped).
            client
                .execute(
                    "UPDATE embedding_state SET generation = $1, owing = true, \
                     entries_after = 0, \
                     entries_until = (SELECT (session_id << 32) | seq FROM entries \
                                      ORDER BY session_id DESC, seq DESC LIMIT 1), \
                     summaries_after = 0, \
                     summaries_until = (SELECT max(segment_id) FROM summaries) \
                     WHERE id = 1",
                    &[&generation.as_str()],
                )
                .await?;
            if same {
                return Ok(None);
            }
            // Back to a generation whose vectors are still there: what was
            // owed for the one between and has its vector needs nothing.
            client
                .execute(
                    "DELETE FROM embeddings_owed o WHERE o.claim_owner IS NULL AND EXISTS \
                     (SELECT 1 FROM embeddings v JOIN embedding_generations n ON n.id = v.generation \
                      WHERE v.doc = o.doc AND n.name = $1)",
                    &[&generation.as_str()],
                )
                .await?;
            Ok(Some(before))
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn stop_owing_embeddings(&self) -> Result<(), StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let done = client
            .execute("UPDATE embedding_state SET owing = false WHERE id = 1", &[])
            .await
            .map(drop)
            .map_err(StoreError::from);
        self.noting_full(done)
    }

    pub(crate) async fn embedding_generation(&self) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        active(&client, false).await
    }

    pub(crate) async fn reowe(
        &self,
        generation: &Generation,
        limit: u64,
    ) -> Result<Reowed, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            if active(&client, true).await?.as_deref() != Some(generation.as_str()) {
                return Ok(Reowed {
                    owed: 0,
                    done: true,
                });
            }
            let [entries, summaries] = ranges(&client, false).await?;
            let (part, (after, until)) = match (entries, summaries) {
                (Some(r), _) => (&ENTRIES, r),
                (None, Some(r)) => (&SUMMARIES, r),
                (None, None) => {
                    return Ok(Reowed {
                        owed: 0,
                        done: true,
                    });
                }
            };
            let id = generation_id(&client, generation).await?;
            let walk = client.prepare_cached(part.walk).await?;
            let mut scanned = Vec::new();
            for r in client
                .query(&walk, &[&after, &until, &i64::from(SCAN), &id])
                .await?
            {
                scanned.push(Walked {
                    key: r.try_get(0)?,
                    doc: r.try_get(1)?,
                    session: r.try_get(2)?,
                    lacking: r.try_get(3)?,
                });
            }
            let (owe, next) = pick(&scanned, limit, until);
            let (docs, sessions): (Vec<i64>, Vec<i64>) = owe.into_iter().unzip();
            let insert = client
                .prepare_cached(
                    "INSERT INTO embeddings_owed (doc, session_id) \
                     SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[]) ON CONFLICT (doc) DO NOTHING",
                )
                .await?;
            let owed = client.execute(&insert, &[&docs, &sessions]).await?;
            match next {
                Some(key) => {
                    client
                        .execute(
                            &format!(
                                "UPDATE embedding_state SET {} = $1 WHERE id = 1",
                                part.after
                            ),
                            &[&key],
                        )
                        .await?
                }
                None => {
                    client
                        .execute(
                            &format!(
                                "UPDATE embedding_state SET {} = NULL, {} = NULL WHERE id = 1",
                                part.after, part.until
                            ),
                            &[],
                        )
                        .await?
                }
            };
            let done = next.is_none() && (part.after == SUMMARIES.after || summaries.is_none());
            Ok(Reowed { owed, done })
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn unwalked(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<u64, StoreError> {
        let tenant = tenant.map(|t| t.0.as_str());
        let client = self.client().await?;
        let id = generation_id(&client, generation).await?;
        let mut n = 0i64;
        for (part, range) in [&ENTRIES, &SUMMARIES]
            .into_iter()
            .zip(ranges(&client, false).await?)
        {
            if let Some((after, until)) = range {
                let stmt = client.prepare_cached(part.unwalked).await?;
                n += client
                    .query_one(&stmt, &[&after, &until, &id, &tenant])
                    .await?
                    .try_get::<_, i64>(0)?;
            }
        }
        unsigned(n, "count")
    }

    pub(crate) async fn drop_old_vectors(
        &self,
        generation: &Generation,
        limit: u32,
    ) -> Result<Dropped, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            if active(&client, true).await?.as_deref() != Some(generation.as_str()) {
                return Ok(Dropped::Waiting);
            }
            let walking = ranges(&client, false).await?.iter().any(Option::is_some);
            // A text still owed whose only vector is old: the old one is
            // kept until the new one is stored.
            let owed_with_old = client
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM embeddings_owed o \
                     JOIN embeddings v ON v.doc = o.doc \
                     JOIN embedding_generations n ON n.id = v.generation WHERE n.name <> $1)",
                )
                .await?;
            if walking
                || client
                    .query_one(&owed_with_old, &[&generation.as_str()])
                    .await?
                    .try_get::<_, bool>(0)?
            {
                return Ok(Dropped::Waiting);
            }
            let delete = client
                .prepare_cached(
                    "DELETE FROM embeddings WHERE (doc, generation) IN \
                     (SELECT v.doc, v.generation FROM embeddings v \
                      JOIN embedding_generations n ON n.id = v.generation \
                      WHERE n.name <> $1 LIMIT $2)",
                )
                .await?;
            let gone = client
                .execute(&delete, &[&generation.as_str(), &i64::from(limit)])
                .await?;
            if gone < u64::from(limit) {
                // The last of them: their generations' indexes and rows go.
                let emptied = client
                    .query(
                        "SELECT n.id FROM embedding_generations n WHERE n.name <> $1 \
                         AND NOT EXISTS (SELECT 1 FROM embeddings v WHERE v.generation = n.id)",
                        &[&generation.as_str()],
                    )
                    .await?;
                for r in emptied {
                    let id: i32 = r.try_get(0)?;
                    // Our own integers only: no caller text in DDL.
                    client
                        .batch_execute(&format!(
                            "SET LOCAL client_min_messages = warning; \
                             DROP INDEX IF EXISTS embeddings_hnsw_{id}; \
                             DELETE FROM embedding_generations WHERE id = {id}"
                        ))
                        .await?;
                }
            }
            Ok(Dropped::Vectors(gone))
        };
        self.noting_full(transact(&client, body).await)
    }
}

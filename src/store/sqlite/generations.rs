//! A change of embedding generation on SQLite (the `embedding_state` row,
//! schema.rs; the walk is described in store/generations.rs): each step
//! owes, in one writer transaction between appends, what the next texts
//! of the range lack, and moves the range's lower bound past them.

use rusqlite::{Connection, OptionalExtension, params};

use super::Sqlite;
use crate::model::{Generation, Tenant};
use crate::store::StoreError;
use crate::store::generations::{Dropped, Reowed, SCAN, Walked, pick};

/// One kind of text the walk owes, in the order of its key.
struct Part {
    /// (key, doc, session, lacking) of the texts with ?1 < key <= ?2, the
    /// first ?3 in key order; lacking: no vector of generation ?4, no debt.
    walk: &'static str,
    /// How many texts with ?1 < key <= ?2 (of tenant ?4, or any) lack a
    /// vector of ?3 and a debt.
    unwalked: &'static str,
    /// The range's bounds in `embedding_state`.
    after: &'static str,
    until: &'static str,
}

/// Entries by document (their primary key's order: seq < 2^32). Those of
/// a session being erased are left out (its erasure is taking them).
const ENTRIES: Part = Part {
    walk: "SELECT (e.session_id << 32) | e.seq, (e.session_id << 32) | e.seq, e.session_id, \
           x.erasing IS NULL \
           AND NOT EXISTS (SELECT 1 FROM embeddings v \
                           WHERE v.doc = (e.session_id << 32) | e.seq AND v.generation = ?4) \
           AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = (e.session_id << 32) | e.seq) \
           FROM entries e JOIN sessions x ON x.id = e.session_id \
           WHERE (e.session_id, e.seq) > (?1 >> 32, ?1 & 4294967295) \
           AND (e.session_id, e.seq) <= (?2 >> 32, ?2 & 4294967295) \
           ORDER BY e.session_id, e.seq LIMIT ?3",
    unwalked: "SELECT count(*) FROM entries e JOIN sessions x ON x.id = e.session_id \
               WHERE (e.session_id, e.seq) > (?1 >> 32, ?1 & 4294967295) \
               AND (e.session_id, e.seq) <= (?2 >> 32, ?2 & 4294967295) AND x.erasing IS NULL \
               AND (?4 IS NULL OR x.tenant = ?4) \
               AND NOT EXISTS (SELECT 1 FROM embeddings v \
                               WHERE v.doc = (e.session_id << 32) | e.seq AND v.generation = ?3) \
               AND NOT EXISTS (SELECT 1 FROM embeddings_owed o \
                               WHERE o.doc = (e.session_id << 32) | e.seq)",
    after: "entries_after",
    until: "entries_until",
};

/// Summaries by segment id (their document is minus it).
const SUMMARIES: Part = Part {
    walk: "SELECT m.segment_id, -m.segment_id, g.session_id, \
           x.erasing IS NULL \
           AND NOT EXISTS (SELECT 1 FROM embeddings v \
                           WHERE v.doc = -m.segment_id AND v.generation = ?4) \
           AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = -m.segment_id) \
           FROM summaries m JOIN segments g ON g.id = m.segment_id \
           JOIN sessions x ON x.id = g.session_id \
           WHERE m.segment_id > ?1 AND m.segment_id <= ?2 ORDER BY m.segment_id LIMIT ?3",
    unwalked: "SELECT count(*) FROM summaries m JOIN segments g ON g.id = m.segment_id \
               JOIN sessions x ON x.id = g.session_id \
               WHERE m.segment_id > ?1 AND m.segment_id <= ?2 AND x.erasing IS NULL \
               AND (?4 IS NULL OR x.tenant = ?4) \
               AND NOT EXISTS (SELECT 1 FROM embeddings v \
                               WHERE v.doc = -m.segment_id AND v.generation = ?3) \
               AND NOT EXISTS (SELECT 1 FROM embeddings_owed o WHERE o.doc = -m.segment_id)",
    after: "summaries_after",
    until: "summaries_until",
};

/// The active generation.
fn active(conn: &Connection) -> Result<Option<String>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT generation FROM embedding_state WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .optional()?
        .flatten())
}

/// The part's range, when some of it is left.
fn range(conn: &Connection, part: &Part) -> Result<Option<(i64, i64)>, StoreError> {
    let (after, until): (Option<i64>, Option<i64>) = conn.query_row(
        &format!(
            "SELECT {}, {} FROM embedding_state WHERE id = 1",
            part.after, part.until
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(after.zip(until))
}

impl Sqlite {
    pub(crate) async fn set_embedding_generation(
        &self,
        generation: &Generation,
    ) -> Result<Option<Option<String>>, StoreError> {
        let generation = generation.as_str().to_owned();
        self.write(move |conn| {
            let (before, owing): (Option<String>, bool) = conn.query_row(
                "SELECT generation, owing FROM embedding_state WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let same = before.as_deref() == Some(generation.as_str());
            if same && owing {
                return Ok(None);
            }
            // Another generation, or embeddings turned on: nothing stored
            // while they were off is owed, so every text is walked (what
            // has a vector of this generation or a debt is skipped).
            conn.execute(
                "UPDATE embedding_state SET generation = ?1, owing = 1, \
                 entries_after = 0, \
                 entries_until = (SELECT max((session_id << 32) | seq) FROM entries), \
                 summaries_after = 0, \
                 summaries_until = (SELECT max(segment_id) FROM summaries) \
                 WHERE id = 1",
                params![generation],
            )?;
            if same {
                return Ok(None);
            }
            // Back to a generation whose vectors are still there: what was
            // owed for the one between and has its vector needs nothing.
            conn.execute(
                "DELETE FROM embeddings_owed WHERE claim_owner IS NULL AND EXISTS \
                 (SELECT 1 FROM embeddings v WHERE v.doc = embeddings_owed.doc AND v.generation = ?1)",
                params![generation],
            )?;
            Ok(Some(before))
        })
        .await
    }

    pub(crate) async fn stop_owing_embeddings(&self) -> Result<(), StoreError> {
        self.write(|conn| {
            conn.execute("UPDATE embedding_state SET owing = 0 WHERE id = 1", [])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn embedding_generation(&self) -> Result<Option<String>, StoreError> {
        self.read(active).await
    }

    pub(crate) async fn reowe(
        &self,
        generation: &Generation,
        limit: u64,
    ) -> Result<Reowed, StoreError> {
        let generation = generation.as_str().to_owned();
        self.write(move |conn| {
            if active(conn)?.as_deref() != Some(generation.as_str()) {
                return Ok(Reowed {
                    owed: 0,
                    done: true,
                });
            }
            // Entries first; summaries once the entries are walked.
            let mut walking = None;
            for part in [&ENTRIES, &SUMMARIES] {
                if let Some(r) = range(conn, part)? {
                    walking = Some((part, r));
                    break;
                }
            }
            let Some((part, (after, until))) = walking else {
                return Ok(Reowed {
                    owed: 0,
                    done: true,
                });
            };
            let scanned: Vec<Walked> = conn
                .prepare_cached(part.walk)?
                .query_map(params![after, until, SCAN, generation], |r| {
                    Ok(Walked {
                        key: r.get(0)?,
                        doc: r.get(1)?,
                        session: r.get(2)?,
                        lacking: r.get(3)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            let (owe, next) = pick(&scanned, limit, until);
            let mut owed = 0;
            let mut insert = conn.prepare_cached(
                "INSERT OR IGNORE INTO embeddings_owed (doc, session_id) VALUES (?1, ?2)",
            )?;
            for (doc, session) in owe {
                owed += insert.execute(params![doc, session])? as u64;
            }
            match next {
                Some(key) => conn.execute(
                    &format!(
                        "UPDATE embedding_state SET {} = ?1 WHERE id = 1",
                        part.after
                    ),
                    params![key],
                )?,
                None => conn.execute(
                    &format!(
                        "UPDATE embedding_state SET {} = NULL, {} = NULL WHERE id = 1",
                        part.after, part.until
                    ),
                    [],
                )?,
            };
            let done = next.is_none() && range(conn, &SUMMARIES)?.is_none();
            Ok(Reowed { owed, done })
        })
        .await
    }

    pub(crate) async fn unwalked(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<u64, StoreError> {
        let tenant = tenant.map(|t| t.0.clone());
        let generation = generation.as_str().to_owned();
        self.read(move |conn| {
            let mut n = 0u64;
            for part in [&ENTRIES, &SUMMARIES] {
                if let Some((after, until)) = range(conn, part)? {
                    n += conn
                        .prepare_cached(part.unwalked)?
                        .query_row(params![after, until, generation, tenant], |r| {
                            r.get::<_, u64>(0)
                        })?;
                }
            }
            Ok(n)
        })
        .await
    }

    pub(crate) async fn drop_old_vectors(
        &self,
        generation: &Generation,
        limit: u32,
    ) -> Result<Dropped, StoreError> {
        let generation = generation.as_str().to_owned();
        self.write(move |conn| {
            if active(conn)?.as_deref() != Some(generation.as_str()) {
                return Ok(Dropped::Waiting);
            }
            let walking = range(conn, &ENTRIES)?.is_some() || range(conn, &SUMMARIES)?.is_some();
            // A text still owed whose only vector is old: the old one is
            // kept until the new one is stored.
            let owed_with_old: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM embeddings_owed o \
                     JOIN embeddings v ON v.doc = o.doc WHERE v.generation <> ?1)",
                )?
                .query_row(params![generation], |r| r.get(0))?;
            if walking || owed_with_old {
                return Ok(Dropped::Waiting);
            }
            let gone = conn
                .prepare_cached(
                    "DELETE FROM embeddings WHERE (doc, generation) IN \
                     (SELECT doc, generation FROM embeddings WHERE generation <> ?1 LIMIT ?2)",
                )?
                .execute(params![generation, limit])?;
            Ok(Dropped::Vectors(gone as u64))
        })
        .await
    }
}

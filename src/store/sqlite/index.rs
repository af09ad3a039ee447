//! The FTS5 index's language and backlog on SQLite (the `search_state`
//! row, schema.rs): a language change drops the tenants' tables (fts.rs;
//! each is made again with the language's tokenizer), owing every stored
//! text again; each batch indexes the next owed texts in document order
//! and moves the backlog's lower bound past them, in one writer
//! transaction between appends. All of it is in the search file (fts.rs),
//! which these writer jobs lock before they read it
//! (`fts::lock_for_writer`).

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{Sqlite, fts};
use crate::config::SearchLanguage;
use crate::store::{Indexed, StoreError};

/// How long a language change or a batch of the backlog tries again while
/// another process holds the search file.
const LOCK_PATIENCE: Duration = Duration::from_secs(30);

/// The backlog: owed entry documents in (after, until], owed summaries'
/// segment ids in (after, until].
struct Backlog {
    entries: Option<(i64, i64)>,
    summaries: Option<(i64, i64)>,
}

fn backlog(conn: &Connection) -> Result<Backlog, StoreError> {
    let row = conn
        .query_row(
            "SELECT entries_after, entries_until, summaries_after, summaries_until \
             FROM search_state WHERE id = 1",
            [],
            |r| {
                Ok((
                    r.get::<_, Option<i64>>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            },
        )
        .optional()?;
    let Some((ea, eu, sa, su)) = row else {
        return Ok(Backlog {
            entries: None,
            summaries: None,
        });
    };
    Ok(Backlog {
        entries: ea.zip(eu),
        summaries: sa.zip(su),
    })
}

impl Sqlite {
    pub(crate) async fn set_search_language(
        &self,
        language: SearchLanguage,
    ) -> Result<bool, StoreError> {
        // Read first: the usual case changes nothing and needs no lock on
        // the search file (which a long first pass may hold at start-up).
        let current: String = self
            .read(|conn| {
                Ok(
                    conn.query_row("SELECT language FROM search_state WHERE id = 1", [], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await?;
        if current == language.name() {
            return Ok(false);
        }
        self.write_search(LOCK_PATIENCE, move |conn| {
            fts::lock_for_writer(conn)?;
            let current: String =
                conn.query_row("SELECT language FROM search_state WHERE id = 1", [], |r| {
                    r.get(0)
                })?;
            if current == language.name() {
                return Ok(false);
            }
            fts::drop_all(conn)?;
            conn.execute(
                "UPDATE search_state SET language = ?1, \
                 entries_after = 0, entries_until = (SELECT max((session_id << 32) | seq) FROM entries), \
                 summaries_after = 0, summaries_until = (SELECT max(segment_id) FROM summaries) \
                 WHERE id = 1",
                params![language.name()],
            )?;
            Ok(true)
        })
        .await
    }

    pub(crate) async fn index_backlog(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            let owed = backlog(conn)?;
            let mut n = 0u64;
            for (part, range) in [(&ENTRIES, owed.entries), (&SUMMARIES, owed.summaries)] {
                let Some((after, until)) = range else {
                    continue;
                };
                // Per tenant, what its table lacks; a tenant with no table
                // yet owes all of its texts in the range.
                let mut stmt = conn.prepare_cached(part.per_tenant)?;
                let counts = stmt.query_map(params![after, until], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))
                })?;
                for row in counts {
                    let (tenant, all) = row?;
                    n += match fts::table_of(conn, &tenant)? {
                        None => all,
                        Some(k) => conn.query_row(
                            &part.unindexed(&fts::name(k)),
                            params![after, until, tenant],
                            |r| r.get::<_, u64>(0),
                        )?,
                    };
                }
            }
            Ok(n)
        })
        .await
    }

    pub(crate) async fn index_some(&self, batch: u32) -> Result<Indexed, StoreError> {
        self.write_search(LOCK_PATIENCE, move |conn| {
            fts::lock_for_writer(conn)?;
            let owed = backlog(conn)?;
            // Entries first; summaries once no entry is owed.
            let (part, (after, until), then_owed) = match (owed.entries, owed.summaries) {
                (Some(range), summaries) => (&ENTRIES, range, summaries.is_some()),
                (None, Some(range)) => (&SUMMARIES, range, false),
                (None, None) => {
                    return Ok(Indexed {
                        texts: 0,
                        done: true,
                    });
                }
            };
            let mut docs = Vec::new();
            {
                let mut rows = conn.prepare_cached(part.owed)?;
                let found = rows.query_map(params![after, until, batch], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                })?;
                for doc in found {
                    docs.push(doc?);
                }
            }
            // Texts stored since the backlog began were indexed as they came
            // (their document size row says so).
            let mut texts = 0u64;
            for (_, doc, body, tenant) in &docs {
                let k = fts::table_for(conn, tenant)?;
                texts += u64::from(fts::index(conn, k, *doc, body)?);
            }
            let last = docs.last().map(|d| d.0);
            let more = docs.len() == batch as usize && last.is_some_and(|l| l < until);
            match (more, last) {
                (true, Some(last)) => conn.execute(part.advance, params![last])?,
                _ => conn.execute(part.clear, [])?,
            };
            Ok(Indexed {
                texts,
                done: !more && !then_owed,
            })
        })
        .await
    }
}

/// One kind of text the backlog owes, walked in the order of its key.
struct Part {
    /// (key, rowid, body, tenant) of the owed texts with ?1 < key <= ?2,
    /// the first ?3 in key order.
    owed: &'static str,
    /// (tenant, count) of the texts with ?1 < key <= ?2.
    per_tenant: &'static str,
    /// Counts, of the texts with ?1 < key <= ?2 of tenant ?3, those the
    /// table `{table}` lacks.
    unindexed_sql: &'static str,
    /// Moves the lower bound to ?1.
    advance: &'static str,
    /// Nothing of this kind is owed.
    clear: &'static str,
}

/// Entries by document (their primary key's order: seq < 2^32), up to
/// each session's watermark in the search file: those past it are its
/// tail, which the indexer indexes (fts.rs), so the two never index one
/// entry twice (marks only move up, and a batch reads them after taking
/// the search file's lock). Those of a session being erased are left out
/// (its erasure is taking them).
const ENTRIES: Part = Part {
    owed: "SELECT (e.session_id << 32) | e.seq, (e.session_id << 32) | e.seq, e.content, \
           x.tenant FROM entries e JOIN sessions x ON x.id = e.session_id \
           WHERE (e.session_id, e.seq) > (?1 >> 32, ?1 & 4294967295) \
           AND (e.session_id, e.seq) <= (?2 >> 32, ?2 & 4294967295) AND x.erasing IS NULL \
           AND e.seq <= coalesce((SELECT seq FROM search_marks WHERE session_id = e.session_id), 0) \
           ORDER BY e.session_id, e.seq LIMIT ?3",
    per_tenant: "SELECT x.tenant, count(*) FROM entries e JOIN sessions x ON x.id = e.session_id \
                 WHERE (e.session_id, e.seq) > (?1 >> 32, ?1 & 4294967295) \
                 AND (e.session_id, e.seq) <= (?2 >> 32, ?2 & 4294967295) \
                 AND x.erasing IS NULL \
                 AND e.seq <= coalesce((SELECT seq FROM search_marks WHERE session_id = e.session_id), 0) \
                 GROUP BY x.tenant",
    unindexed_sql: "SELECT count(*) FROM entries e JOIN sessions x ON x.id = e.session_id \
                    WHERE (e.session_id, e.seq) > (?1 >> 32, ?1 & 4294967295) \
                    AND (e.session_id, e.seq) <= (?2 >> 32, ?2 & 4294967295) \
                    AND x.erasing IS NULL AND x.tenant = ?3 \
                    AND e.seq <= coalesce((SELECT seq FROM search_marks WHERE session_id = e.session_id), 0) \
                    AND NOT EXISTS (SELECT 1 FROM {table}_docsize \
                                    WHERE id = (e.session_id << 32) | e.seq)",
    advance: "UPDATE search_state SET entries_after = ?1 WHERE id = 1",
    clear: "UPDATE search_state SET entries_after = NULL, entries_until = NULL WHERE id = 1",
};

/// Summaries by segment id (their document is minus it).
const SUMMARIES: Part = Part {
    owed: "SELECT m.segment_id, -m.segment_id, m.text, x.tenant FROM summaries m \
           JOIN segments g ON g.id = m.segment_id JOIN sessions x ON x.id = g.session_id \
           WHERE m.segment_id > ?1 AND m.segment_id <= ?2 ORDER BY m.segment_id LIMIT ?3",
    per_tenant: "SELECT x.tenant, count(*) FROM summaries m \
                 JOIN segments g ON g.id = m.segment_id JOIN sessions x ON x.id = g.session_id \
                 WHERE m.segment_id > ?1 AND m.segment_id <= ?2 GROUP BY x.tenant",
    unindexed_sql: "SELECT count(*) FROM summaries m \
                    JOIN segments g ON g.id = m.segment_id JOIN sessions x ON x.id = g.session_id \
                    WHERE m.segment_id > ?1 AND m.segment_id <= ?2 AND x.tenant = ?3 \
                    AND NOT EXISTS (SELECT 1 FROM {table}_docsize WHERE id = -m.segment_id)",
    advance: "UPDATE search_state SET summaries_after = ?1 WHERE id = 1",
    clear: "UPDATE search_state SET summaries_after = NULL, summaries_until = NULL WHERE id = 1",
};

impl Part {
    fn unindexed(&self, table: &str) -> String {
        self.unindexed_sql.replace("{table}", table)
    }
}

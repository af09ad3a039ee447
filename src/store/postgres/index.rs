//! The tsvector index's language and backlog on PostgreSQL (the
//! `search_state` row, schema.rs): a language change owes every stored
//! text its vector in the new language (the old vectors answer meanwhile);
//! each batch recomputes the next owed rows in key order and moves the
//! backlog's lower bound past them. The state row is locked for the batch,
//! so replicas take turns; appends never wait on it (they only read it).

use super::{Postgres, transact};
use crate::config::SearchLanguage;
use crate::store::{Indexed, StoreError};

/// The backlog as the state row holds it (see schema.rs).
struct Backlog {
    language: String,
    entries: Option<((i64, i64), (i64, i64))>,
    summaries: Option<(i64, i64)>,
}

async fn backlog(client: &super::Conn, lock: bool) -> Result<Backlog, StoreError> {
    const READ: &str = "SELECT language::TEXT, entries_after_session, entries_after_seq, \
        entries_until_session, entries_until_seq, summaries_after, summaries_until \
        FROM search_state WHERE id = 1";
    let sql = match lock {
        true => format!("{READ} FOR UPDATE"),
        false => READ.to_owned(),
    };
    let row = client.query_one(&sql, &[]).await?;
    let get = |i: usize| row.try_get::<_, Option<i64>>(i);
    let entries = match (get(1)?, get(2)?, get(3)?, get(4)?) {
        (Some(s0), Some(q0), Some(s1), Some(q1)) => Some(((s0, q0), (s1, q1))),
        _ => None,
    };
    Ok(Backlog {
        language: row.try_get(0)?,
        entries,
        summaries: get(5)?.zip(get(6)?),
    })
}

impl Postgres {
    pub(crate) async fn set_search_language(
        &self,
        language: SearchLanguage,
    ) -> Result<bool, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            if backlog(&client, true).await?.language == language.name() {
                return Ok(false);
            }
            client
                .execute(
                    "UPDATE search_state SET language = $1::TEXT::regconfig, \
                     entries_after_session = 0, entries_after_seq = 0, \
                     entries_until_session = last.session_id, entries_until_seq = last.seq, \
                     summaries_after = 0, summaries_until = (SELECT max(segment_id) FROM summaries) \
                     FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT session_id, seq FROM entries \
                     ORDER BY session_id DESC, seq DESC LIMIT 1) last ON true WHERE id = 1",
                    &[&language.name()],
                )
                .await?;
            Ok(true)
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn index_backlog(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let owed = backlog(&client, false).await?;
        let mut n = 0i64;
        if let Some(((s0, q0), (s1, q1))) = owed.entries {
            let row = client
                .query_one(
                    "SELECT count(*) FROM entries WHERE (session_id, seq) > ($1, $2) \
                     AND (session_id, seq) <= ($3, $4)",
                    &[&s0, &q0, &s1, &q1],
                )
                .await?;
            n += row.try_get::<_, i64>(0)?;
        }
        if let Some((after, until)) = owed.summaries {
            let row = client
                .query_one(
                    "SELECT count(*) FROM summaries WHERE segment_id > $1 AND segment_id <= $2",
                    &[&after, &until],
                )
                .await?;
            n += row.try_get::<_, i64>(0)?;
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }

    pub(crate) async fn index_some(&self, batch: u32) -> Result<Indexed, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let limit = i64::from(batch);
        let body = async {
            let owed = backlog(&client, true).await?;
            if let Some(((s0, q0), (s1, q1))) = owed.entries {
                let rows = client
                    .query(
                        "WITH b AS (SELECT session_id, seq FROM entries \
                         WHERE (session_id, seq) > ($1, $2) AND (session_id, seq) <= ($3, $4) \
                         ORDER BY session_id, seq LIMIT $5), \
                         u AS (UPDATE entries e SET tsv = to_tsvector(s.language, e.content) \
                         FROM b, search_state s WHERE s.id = 1 \
                         AND e.session_id = b.session_id AND e.seq = b.seq \
                         RETURNING e.session_id, e.seq) \
                         SELECT session_id, seq, count(*) OVER () FROM u \
                         ORDER BY session_id DESC, seq DESC LIMIT 1",
                        &[&s0, &q0, &s1, &q1, &limit],
                    )
                    .await?;
                let (last, texts) = match rows.first() {
                    Some(r) => (
                        Some((r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?)),
                        r.try_get::<_, i64>(2)?,
                    ),
                    None => (None, 0),
                };
                let more = texts == limit && last.is_some_and(|l| l < (s1, q1));
                match last {
                    Some((s, q)) if more => {
                        client
                            .execute(
                                "UPDATE search_state SET entries_after_session = $1, \
                                 entries_after_seq = $2 WHERE id = 1",
                                &[&s, &q],
                            )
                            .await?
                    }
                    _ => {
                        client
                            .execute(
                                "UPDATE search_state SET entries_after_session = NULL, \
                                 entries_after_seq = NULL, entries_until_session = NULL, \
                                 entries_until_seq = NULL WHERE id = 1",
                                &[],
                            )
                            .await?
                    }
                };
                return Ok(Indexed {
                    texts: u64::try_from(texts).unwrap_or(0),
                    done: !more && owed.summaries.is_none(),
                });
            }
            if let Some((after, until)) = owed.summaries {
                let rows = client
                    .query(
                        "WITH b AS (SELECT segment_id FROM summaries \
                         WHERE segment_id > $1 AND segment_id <= $2 ORDER BY segment_id LIMIT $3), \
                         u AS (UPDATE summaries m SET tsv = to_tsvector(s.language, m.text) \
                         FROM b, search_state s WHERE s.id = 1 AND m.segment_id = b.segment_id \
                         RETURNING m.segment_id) \
                         SELECT max(segment_id), count(*) FROM u",
                        &[&after, &until, &limit],
                    )
                    .await?;
                let (last, texts) = match rows.first() {
                    Some(r) => (r.try_get::<_, Option<i64>>(0)?, r.try_get::<_, i64>(1)?),
                    None => (None, 0),
                };
                let more = texts == limit && last.is_some_and(|l| l < until);
                match last {
                    Some(l) if more => {
                        client
                            .execute(
                                "UPDATE search_state SET summaries_after = $1 WHERE id = 1",
                                &[&l],
                            )
                            .await?
                    }
                    _ => {
                        client
                            .execute(
                                "UPDATE search_state SET summaries_after = NULL, \
                                 summaries_until = NULL WHERE id = 1",
                                &[],
                            )
                            .await?
                    }
                };
                return Ok(Indexed {
                    texts: u64::try_from(texts).unwrap_or(0),
                    done: !more,
                });
            }
            Ok(Indexed {
                texts: 0,
                done: true,
            })
        };
        self.noting_full(transact(&client, body).await)
    }
}

//! Claims and what is written under them: claiming a segment (with the
//! entries its pass reads), renewing the claim, and ending the pass with a
//! summary or with its disposition. Every write under a claim matches the
//! same `HELD` condition, so a stale worker writes nothing.

use std::time::Duration;

use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, params};

use super::Sqlite;
use super::rows::{self, SEGMENT_COLUMNS, SEGMENT_FROM, after_segment};
use super::segments::{Order, entries_between};
use crate::model::{Disposition, Millis, SegmentId, SegmentState, Summary, Tenant};
use crate::store::{Claim, Completed, EndedPass, Material, PassInput, StoreError};

/// The claim still holds the segment: same owner, same fencing token, and
/// the segment still PENDING. Its values are named `:id`, `:owner`,
/// `:token` and `:pending`.
const HELD: &str =
    "id = :id AND claim_owner = :owner AND claim_token = :token AND state = :pending";

/// Runs `UPDATE segments SET {set}` if `claim` still holds the segment;
/// true when it did.
fn update_held(
    conn: &Connection,
    claim: &Claim,
    set: &str,
    values: &[(&str, &dyn ToSql)],
) -> Result<bool, StoreError> {
    let pending = SegmentState::Pending.code();
    let mut all: Vec<(&str, &dyn ToSql)> = values.to_vec();
    all.extend([
        (":id", &claim.segment_id as &dyn ToSql),
        (":owner", &claim.owner),
        (":token", &claim.token),
        (":pending", &pending),
    ]);
    let sql = format!("UPDATE segments SET {set} WHERE {HELD}");
    Ok(conn.prepare_cached(&sql)?.execute(all.as_slice())? == 1)
}

/// Lets the claim go, as part of a `SET` clause.
const RELEASE_CLAIM: &str = "claim_owner = NULL, claim_expires_at = NULL";

impl Sqlite {
    pub(crate) async fn claim(
        &self,
        id: SegmentId,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<(Claim, PassInput)>, StoreError> {
        let owner = owner.to_owned();
        // Claim and read in one writer trip instead of two.
        self.write(move |conn| {
            let now = Millis::now();
            let token = conn
                .prepare_cached(
                    "UPDATE segments SET claim_owner = ?1, claim_token = claim_token + 1, \
                     claim_expires_at = ?2 WHERE id = ?3 AND state = ?4 \
                     AND (claim_expires_at IS NULL OR claim_expires_at <= ?5) \
                     RETURNING claim_token",
                )?
                .query_row(
                    params![
                        owner,
                        now.saturating_add(lease).0,
                        id,
                        SegmentState::Pending.code(),
                        now.0
                    ],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?;
            let Some(token) = token else {
                return Ok(None);
            };
            let claim = Claim {
                segment_id: id,
                owner,
                token,
            };
            Ok(Some((claim, pass_input(conn, id)?)))
        })
        .await
    }

    pub(crate) async fn complete(
        &self,
        claim: &Claim,
        summary: Summary,
        attempts: u32,
        fanout: u32,
    ) -> Result<Completed, StoreError> {
        let claim = claim.clone();
        let completed = self
            .write(move |conn| {
                let summarised = SegmentState::Summarised.code();
                let held = update_held(
                    conn,
                    &claim,
                    &format!(
                        "state = :state, attempts = attempts + :attempts, passes = passes + 1, \
                     next_attempt_at = NULL, failure_class = NULL, {RELEASE_CLAIM}"
                    ),
                    &[(":state", &summarised), (":attempts", &attempts)],
                )?;
                if !held {
                    return Ok(Completed {
                        held: false,
                        rollups: Vec::new(),
                    });
                }
                conn.prepare_cached(
                    "INSERT INTO summaries (segment_id, text, provider, model, prompt_version, \
                 input_tokens, output_tokens, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute(params![
                    claim.segment_id,
                    summary.text,
                    summary.provider,
                    summary.model,
                    summary.prompt_version,
                    summary.input_tokens,
                    summary.output_tokens,
                    summary.created_at.0
                ])?;
                // Owed to the index, which the indexer writes (indexer.rs).
                conn.prepare_cached("INSERT OR IGNORE INTO search_owed (segment_id) VALUES (?1)")?
                    .execute([claim.segment_id])?;
                Ok(Completed {
                    held: true,
                    rollups: roll_up(conn, claim.segment_id, fanout)?,
                })
            })
            .await?;
        if completed.held {
            self.owe_index(1);
        }
        Ok(completed)
    }

    pub(crate) async fn end_pass(
        &self,
        claim: &Claim,
        ended: EndedPass,
    ) -> Result<bool, StoreError> {
        let claim = claim.clone();
        let failure = ended
            .failure
            .as_ref()
            .map(crate::store::encode_failure)
            .transpose()?;
        self.write(move |conn| {
            let now = Millis::now().0;
            let fingerprint = &ended.provider_fingerprint;
            let attempts = &ended.attempts;
            let (json, class) = match &failure {
                Some((json, class)) => (Some(json.as_str()), Some(*class)),
                None => (None, None),
            };
            // A failed pass is counted and its failure recorded; a released
            // one only gives its sends back and keeps a later due time.
            let recorded = format!(
                "attempts = attempts + :attempts, passes = passes + 1, last_failure = :failure, \
                 failure_class = :class, provider_fingerprint = :fingerprint, {RELEASE_CLAIM}"
            );
            match ended.disposition {
                Disposition::Retry { at } => {
                    let pending = SegmentState::Pending.code();
                    update_held(
                        conn,
                        &claim,
                        &format!("state = :state, next_attempt_at = :at, {recorded}"),
                        &[
                            (":state", &pending),
                            (":at", &at.0),
                            (":attempts", attempts),
                            (":failure", &json),
                            (":class", &class),
                            (":fingerprint", fingerprint),
                        ],
                    )
                }
                // A parked segment is not scanned; a requeue or unpark sets
                // its next due time.
                Disposition::Park => {
                    let parked = SegmentState::Parked.code();
                    update_held(
                        conn,
                        &claim,
                        &format!("state = :state, next_attempt_at = NULL, {recorded}"),
                        &[
                            (":state", &parked),
                            (":attempts", attempts),
                            (":failure", &json),
                            (":class", &class),
                            (":fingerprint", fingerprint),
                        ],
                    )
                }
                Disposition::Release => update_held(
                    conn,
                    &claim,
                    &format!(
                        "attempts = attempts + :attempts, \
                         next_attempt_at = max(:now, coalesce(next_attempt_at, :now)), \
                         {RELEASE_CLAIM}"
                    ),
                    &[(":attempts", attempts), (":now", &now)],
                ),
            }
        })
        .await
    }

    pub(crate) async fn unpark_changed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        let fingerprint = fingerprint.to_owned();
        self.write(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE segments SET state = ?1, next_attempt_at = ?2 \
                     WHERE state = ?3 AND provider_fingerprint IS NOT ?4",
                )?
                .execute(params![
                    SegmentState::Pending.code(),
                    Millis::now().0,
                    SegmentState::Parked.code(),
                    fingerprint
                ])?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) async fn renew(&self, claim: &Claim, lease: Duration) -> Result<bool, StoreError> {
        let claim = claim.clone();
        self.write(move |conn| {
            let until = Millis::now().saturating_add(lease).0;
            update_held(
                conn,
                &claim,
                "claim_expires_at = :until",
                &[(":until", &until)],
            )
        })
        .await
    }
}

/// What a pass over the node `id` reads: a level-1 segment's entries and
/// the summary carried into its recap, or a roll-up's children's summaries.
fn pass_input(conn: &Connection, id: SegmentId) -> Result<PassInput, StoreError> {
    let sql = format!(
        "SELECT {SEGMENT_COLUMNS}, s.session_id, x.tenant FROM {SEGMENT_FROM} WHERE s.id = ?1"
    );
    let (segment, session_id, tenant) = conn
        .prepare_cached(&sql)?
        .query_row([id], |r| {
            Ok((
                rows::segment(r)?,
                after_segment::<i64>(r, 0)?,
                Tenant(after_segment::<String>(r, 1)?),
            ))
        })
        .optional()?
        .ok_or(StoreError::SegmentNotFound(id))?;
    let segment = segment?;
    if segment.level > 1 {
        let mut summaries = Vec::with_capacity(segment.child_ids.len());
        let mut stmt = conn.prepare_cached(
            "SELECT m.text FROM segments c JOIN summaries m ON m.segment_id = c.id \
             WHERE c.parent_id = ?1 ORDER BY c.ordinal",
        )?;
        for text in stmt.query_map([id], |r| r.get::<_, String>(0))? {
            summaries.push(text?);
        }
        return Ok(PassInput {
            tenant,
            segment,
            material: Material::Summaries(summaries),
        });
    }
    let mut entries = Vec::with_capacity(segment.entry_count as usize);
    entries_between(
        conn,
        session_id,
        segment.first_seq,
        segment.last_seq,
        Order::Asc,
        &mut |e| {
            entries.push(e);
            true
        },
    )?;
    let carry = carried(conn, session_id, segment.ordinal)?;
    Ok(PassInput {
        tenant,
        segment,
        material: Material::Entries { entries, carry },
    })
}

/// The newest summary of a node that ends just before the level-1 segment
/// of `ordinal`: the previous segment's, or a roll-up's that it ends. Read
/// by primary key up the previous segment's ancestors, so its cost does not
/// grow with the session.
fn carried(conn: &Connection, session_id: i64, ordinal: u32) -> Result<Option<String>, StoreError> {
    if ordinal <= 1 {
        return Ok(None);
    }
    let mut node = conn
        .prepare_cached(
            "SELECT id, last_seq, parent_id FROM segments \
             WHERE session_id = ?1 AND level = 1 AND ordinal = ?2",
        )?
        .query_row(params![session_id, ordinal - 1], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, u64>(1)?,
                r.get::<_, Option<i64>>(2)?,
            ))
        })
        .optional()?;
    let Some((_, end, _)) = node else {
        return Ok(None);
    };
    let mut newest: Option<(i64, String)> = None;
    let mut summary = conn
        .prepare_cached("SELECT m.created_at, m.text FROM summaries m WHERE m.segment_id = ?1")?;
    let mut parent =
        conn.prepare_cached("SELECT id, last_seq, parent_id FROM segments WHERE id = ?1")?;
    while let Some((id, last_seq, parent_id)) = node {
        if last_seq != end {
            break;
        }
        if let Some((at, text)) = summary
            .query_row([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .optional()?
            && newest
                .as_ref()
                .is_none_or(|(newest_at, _)| at >= *newest_at)
        {
            newest = Some((at, text));
        }
        node = match parent_id {
            Some(p) => parent
                .query_row([p], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })
                .optional()?,
            None => None,
        };
    }
    Ok(newest.map(|(_, text)| text))
}

/// Creates the roll-ups that `node` (just SUMMARISED) completes, if any,
/// in the transaction that completed it, so a crash never loses one. A
/// level's groups are formed in order: the next group is the `fanout` nodes
/// that follow the last node already in a roll-up, and it is rolled up once
/// all of them are SUMMARISED, taking the next ordinal of the level above.
/// So a change of `memory.fanout` applies to groups formed after it (a
/// smaller fanout may complete two groups at once). Returns the roll-ups
/// made, oldest first.
fn roll_up(conn: &Connection, node: SegmentId, fanout: u32) -> Result<Vec<SegmentId>, StoreError> {
    let mut made = Vec::new();
    if fanout < 2 {
        return Ok(made);
    }
    let (session_id, level): (i64, u32) = conn
        .prepare_cached("SELECT session_id, level FROM segments WHERE id = ?1")?
        .query_row([node], |r| Ok((r.get(0)?, r.get(1)?)))?;
    while let Some(id) = roll_up_next(conn, session_id, level, fanout)? {
        made.push(id);
    }
    Ok(made)
}

/// Rolls up the next group of `level` in the session if it is complete.
fn roll_up_next(
    conn: &Connection,
    session_id: i64,
    level: u32,
    fanout: u32,
) -> Result<Option<SegmentId>, StoreError> {
    // The level's first node not yet in a roll-up (the session's roots, in
    // seq order, are few: a cover of the session).
    let first: Option<u32> = conn
        .prepare_cached(
            "SELECT ordinal FROM segments WHERE session_id = ?1 AND parent_id IS NULL \
             AND level = ?2 ORDER BY first_seq LIMIT 1",
        )?
        .query_row(params![session_id, level], |r| r.get(0))
        .optional()?;
    let Some(first) = first else {
        return Ok(None);
    };
    let last = first + fanout - 1;
    let (count, summarised, parented, first_seq, last_seq, entries): (u32, u32, u32, u64, u64, u64) =
        conn.prepare_cached(
            "SELECT count(*), coalesce(sum(state = ?5), 0), coalesce(sum(parent_id IS NOT NULL), 0), \
             coalesce(min(first_seq), 0), coalesce(max(last_seq), 0), coalesce(sum(entry_count), 0) \
             FROM segments WHERE session_id = ?1 AND level = ?2 AND ordinal BETWEEN ?3 AND ?4",
        )?
        .query_row(
            params![session_id, level, first, last, SegmentState::Summarised.code()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )?;
    if count != fanout || summarised != fanout || parented != 0 {
        return Ok(None);
    }
    // What the roll-up's pass reads: its children's summaries.
    let tokens: u32 = conn
        .prepare_cached(
            "SELECT coalesce(sum(length(CAST(m.text AS BLOB)) / 4 + 5), 0) FROM segments c \
             JOIN summaries m ON m.segment_id = c.id \
             WHERE c.session_id = ?1 AND c.level = ?2 AND c.ordinal BETWEEN ?3 AND ?4",
        )?
        .query_row(params![session_id, level, first, last], |r| r.get(0))?;
    let now = Millis::now().0;
    let id: SegmentId = conn
        .prepare_cached(
            "INSERT INTO segments (session_id, level, ordinal, state, first_seq, last_seq, \
             entry_count, token_estimate, next_attempt_at, closed_at, created_at) \
             SELECT ?1, ?2, coalesce(max(ordinal), 0) + 1, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8 \
             FROM segments WHERE session_id = ?1 AND level = ?2 RETURNING id",
        )?
        .query_row(
            params![
                session_id,
                level + 1,
                SegmentState::Pending.code(),
                first_seq,
                last_seq,
                u32::try_from(entries).unwrap_or(u32::MAX),
                tokens,
                now
            ],
            |r| r.get(0),
        )?;
    conn.prepare_cached(
        "UPDATE segments SET parent_id = ?1 \
         WHERE session_id = ?2 AND level = ?3 AND ordinal BETWEEN ?4 AND ?5",
    )?
    .execute(params![id, session_id, level, first, last])?;
    Ok(Some(id))
}

//! Claims and what is written under them, across replicas: a claim takes
//! its segment's row with `FOR UPDATE SKIP LOCKED` (a replica never waits
//! on another's claim, it moves on), bumps the fencing token and sets the
//! lease; every write under a claim matches `HELD`, so a replica whose
//! lease ran out (or that was killed) writes nothing once another has
//! taken the segment over.

use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use super::rows::{self, SEGMENT_COLUMN_COUNT, SEGMENT_COLUMNS, SEGMENT_FROM};
use super::segments::entries_between;
use super::{DB_NOW, Postgres, erasure_lock, signed, transact, unsigned};
use crate::model::{Disposition, Millis, SegmentId, SegmentState, Summary, Tenant};
use crate::store::{Claim, Completed, EndedPass, Material, PassInput, StoreError};

/// The claim still holds the segment: same owner, same fencing token, and
/// the segment still PENDING. Its values are `$1` (id), `$2` (owner), `$3`
/// (token) and `$4` (PENDING); a `SET` clause numbers its own from `$5`.
const HELD: &str = "id = $1 AND claim_owner = $2 AND claim_token = $3 AND state = $4";

/// Lets the claim go, as part of a `SET` clause.
const RELEASE_CLAIM: &str = "claim_owner = NULL, claim_expires_at = NULL";

/// Runs `UPDATE segments SET {set} WHERE {HELD}`; true when the claim
/// still held the segment.
async fn update_held(
    client: &Object,
    claim: &Claim,
    set: &str,
    values: &[&(dyn ToSql + Sync)],
) -> Result<bool, StoreError> {
    let sql = format!("UPDATE segments SET {set} WHERE {HELD}");
    let stmt = client.prepare_cached(&sql).await?;
    let id = signed(claim.segment_id);
    let pending = SegmentState::Pending.code();
    let mut all: Vec<&(dyn ToSql + Sync)> = vec![&id, &claim.owner, &claim.token, &pending];
    all.extend_from_slice(values);
    Ok(client.execute(&stmt, &all).await? == 1)
}

/// A lease in milliseconds.
fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2)
}

impl Postgres {
    pub(crate) async fn claim(
        &self,
        id: SegmentId,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<(Claim, PassInput)>, StoreError> {
        self.writable()?;
        let Ok(signed_id) = i64::try_from(id) else {
            return Ok(None);
        };
        let client = self.client().await?;
        let body = async {
            let stmt = client
                .prepare_cached(&format!(
                    "UPDATE segments SET claim_owner = $1, claim_token = claim_token + 1, \
                     claim_expires_at = {DB_NOW} + $2 WHERE id = ( \
                     SELECT id FROM segments WHERE id = $3 AND state = $4 \
                     AND (claim_expires_at IS NULL OR claim_expires_at <= {DB_NOW}) \
                     FOR UPDATE SKIP LOCKED) \
                     RETURNING claim_token"
                ))
                .await?;
            let row = client
                .query_opt(
                    &stmt,
                    &[
                        &owner,
                        &lease_ms(lease),
                        &signed_id,
                        &SegmentState::Pending.code(),
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let claim = Claim {
                segment_id: id,
                owner: owner.to_owned(),
                token: row.try_get(0)?,
            };
            let input = pass_input(&client, id).await?;
            Ok(Some((claim, input)))
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn complete(
        &self,
        claim: &Claim,
        summary: Summary,
        attempts: u32,
        fanout: u32,
    ) -> Result<Completed, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let body = async {
            // The rows a roll-up may adopt first, in id order, as every
            // transaction that changes several segments takes them (see
            // the module doc of `postgres`).
            let Some(level) = lock_level(&client, claim.segment_id, fanout).await? else {
                // Erased meanwhile.
                return Ok(Completed {
                    held: false,
                    rollups: Vec::new(),
                });
            };
            let held = update_held(
                &client,
                claim,
                &format!(
                    "state = $5, attempts = attempts + $6, passes = passes + 1, \
                     next_attempt_at = NULL, failure_class = NULL, {RELEASE_CLAIM}"
                ),
                &[&SegmentState::Summarised.code(), &i64::from(attempts)],
            )
            .await?;
            if !held {
                return Ok(Completed {
                    held: false,
                    rollups: Vec::new(),
                });
            }
            let stmt = client
                .prepare_cached(
                    "INSERT INTO summaries (segment_id, text, provider, model, prompt_version, \
                     input_tokens, output_tokens, created_at, tsv) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
                     to_tsvector((SELECT language FROM search_state WHERE id = 1), $2))",
                )
                .await?;
            client
                .execute(
                    &stmt,
                    &[
                        &signed(claim.segment_id),
                        // PostgreSQL's text cannot hold U+0000: a provider
                        // that sends one gets it replaced, not a recap that
                        // can never be written.
                        &summary.text.replace('\0', "\u{FFFD}"),
                        &summary.provider,
                        &summary.model,
                        &summary.prompt_version,
                        &i64::from(summary.input_tokens),
                        &i64::from(summary.output_tokens),
                        &summary.created_at.0,
                    ],
                )
                .await?;
            let rollups = if fanout < 2 {
                Vec::new()
            } else {
                roll_up(&client, level, fanout).await?
            };
            Ok(Completed {
                held: true,
                rollups,
            })
        };
        self.noting_full(transact(&client, body).await)
    }

    pub(crate) async fn end_pass(
        &self,
        claim: &Claim,
        ended: EndedPass,
    ) -> Result<bool, StoreError> {
        self.writable()?;
        let failure = ended
            .failure
            .as_ref()
            .map(crate::store::encode_failure)
            .transpose()?;
        let (json, class) = match &failure {
            Some((json, class)) => (Some(json.as_str()), Some(*class)),
            None => (None, None),
        };
        let attempts = i64::from(ended.attempts);
        let fingerprint = ended.provider_fingerprint.as_str();
        let client = self.client().await?;
        // A failed pass is counted and its failure recorded; a released one
        // only gives its sends back and keeps a later due time.
        let recorded = format!(
            "attempts = attempts + $6, passes = passes + 1, last_failure = $7, \
             failure_class = $8, provider_fingerprint = $9, {RELEASE_CLAIM}"
        );
        let result = match ended.disposition {
            Disposition::Retry { at } => {
                update_held(
                    &client,
                    claim,
                    &format!("state = $5, next_attempt_at = $10, {recorded}"),
                    &[
                        &SegmentState::Pending.code(),
                        &attempts,
                        &json,
                        &class,
                        &fingerprint,
                        &at.0,
                    ],
                )
                .await
            }
            // A parked segment is not scanned; a requeue or unpark sets its
            // next due time.
            Disposition::Park => {
                update_held(
                    &client,
                    claim,
                    &format!("state = $5, next_attempt_at = NULL, {recorded}"),
                    &[
                        &SegmentState::Parked.code(),
                        &attempts,
                        &json,
                        &class,
                        &fingerprint,
                    ],
                )
                .await
            }
            Disposition::Release => {
                update_held(
                    &client,
                    claim,
                    &format!(
                        "attempts = attempts + $5, \
                         next_attempt_at = greatest($6, coalesce(next_attempt_at, $6)), \
                         {RELEASE_CLAIM}"
                    ),
                    &[&attempts, &Millis::now().0],
                )
                .await
            }
        };
        self.noting_full(result)
    }

    pub(crate) async fn unpark_changed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        // Locked in id order before they change (see the module doc of
        // `postgres`); MATERIALIZED keeps the locking query whole.
        let stmt = client
            .prepare_cached(
                "WITH locked AS MATERIALIZED (SELECT id FROM segments \
                 WHERE state = $3 AND provider_fingerprint IS DISTINCT FROM $4 \
                 ORDER BY id FOR UPDATE) \
                 UPDATE segments s SET state = $1, next_attempt_at = $2 \
                 FROM locked WHERE s.id = locked.id",
            )
            .await?;
        let result = client
            .execute(
                &stmt,
                &[
                    &SegmentState::Pending.code(),
                    &Millis::now().0,
                    &SegmentState::Parked.code(),
                    &fingerprint,
                ],
            )
            .await;
        self.noting_full(result.map_err(StoreError::from))
    }

    pub(crate) async fn renew(&self, claim: &Claim, lease: Duration) -> Result<bool, StoreError> {
        self.writable()?;
        let client = self.client().await?;
        let set = format!("claim_expires_at = {DB_NOW} + $5");
        let result = update_held(&client, claim, &set, &[&lease_ms(lease)]).await;
        self.noting_full(result)
    }
}

/// What a pass over the node `id` reads: a level-1 segment's entries and
/// the summary carried into its recap, or a roll-up's children's summaries.
async fn pass_input(client: &Object, id: SegmentId) -> Result<PassInput, StoreError> {
    let sql = format!(
        "SELECT {SEGMENT_COLUMNS}, s.session_id, x.tenant FROM {SEGMENT_FROM} WHERE s.id = $1"
    );
    let stmt = client.prepare_cached(&sql).await?;
    let Some(row) = client.query_opt(&stmt, &[&signed(id)]).await? else {
        return Err(StoreError::SegmentNotFound(id));
    };
    let segment = rows::segment(&row)?;
    let session_id: i64 = row.try_get(SEGMENT_COLUMN_COUNT)?;
    let tenant = Tenant(row.try_get(SEGMENT_COLUMN_COUNT + 1)?);
    if segment.level > 1 {
        let stmt = client
            .prepare_cached(
                "SELECT m.text FROM segments c JOIN summaries m ON m.segment_id = c.id \
                 WHERE c.parent_id = $1 ORDER BY c.ordinal",
            )
            .await?;
        let summaries = client
            .query(&stmt, &[&signed(id)])
            .await?
            .iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<_, _>>()?;
        return Ok(PassInput {
            tenant,
            segment,
            material: Material::Summaries(summaries),
        });
    }
    let mut entries = Vec::with_capacity(segment.entry_count as usize);
    entries_between(
        client,
        session_id,
        segment.first_seq,
        segment.last_seq,
        false,
        &mut |e| {
            entries.push(e);
            true
        },
    )
    .await?;
    let carry = carried(client, session_id, segment.ordinal).await?;
    Ok(PassInput {
        tenant,
        segment,
        material: Material::Entries { entries, carry },
    })
}

/// The newest summary of a node that ends just before the level-1 segment
/// of `ordinal`: the previous segment's, or a roll-up's that it ends; read
/// up the previous segment's ancestors in one recursive query.
async fn carried(
    client: &Object,
    session_id: i64,
    ordinal: u32,
) -> Result<Option<String>, StoreError> {
    if ordinal <= 1 {
        return Ok(None);
    }
    let stmt = client
        .prepare_cached(
            "WITH RECURSIVE up (id, parent_id, end_seq, depth) AS ( \
             SELECT id, parent_id, last_seq, 0 FROM segments \
             WHERE session_id = $1 AND level = 1 AND ordinal = $2 \
             UNION ALL \
             SELECT p.id, p.parent_id, up.end_seq, up.depth + 1 FROM segments p \
             JOIN up ON p.id = up.parent_id WHERE p.last_seq = up.end_seq) \
             SELECT m.text FROM up JOIN summaries m ON m.segment_id = up.id \
             ORDER BY m.created_at DESC, up.depth DESC LIMIT 1",
        )
        .await?;
    Ok(
        match client
            .query_opt(&stmt, &[&session_id, &(i64::from(ordinal) - 1)])
            .await?
        {
            Some(r) => Some(r.try_get(0)?),
            None => None,
        },
    )
}

/// The nodes of one level of a session that one roll-up covers (or would):
/// ordinals `first..=last` of `level`, the `group`-th such run (from 0).
/// The level of a completing node, whose roll-ups its transaction may form.
#[derive(Clone, Copy)]
struct Level {
    session_id: i64,
    level: i64,
}

/// Locks the session of `node` (its erasure lock, shared, then a
/// key-share lock on its row), then the forming of roll-ups over `node`'s
/// level of that session, then, in id order, the level's nodes a roll-up
/// may adopt (those SUMMARISED and in none yet) and `node` itself;
/// returns the level. With `fanout` below 2 (no roll-ups) only `node` is
/// locked. None when `node` is gone (its session was erased).
///
/// The session first keeps the order of the module doc of `postgres`
/// (session, then segments): an erasure of the session, which takes its
/// erasure lock exclusively, waits for this pass, or this pass for it,
/// before either has locked a segment. The row's key-share lock alone
/// cannot promise that: PostgreSQL grants FOR KEY SHARE without waiting
/// while only other key-share lockers hold the row, and rechecks after
/// re-taking the page lock only whether the row was updated meanwhile,
/// not whether an erasure's FOR UPDATE (a lock, no update) came in
/// between. So a pass could hold its key-share lock beside the erasure's
/// FOR UPDATE, lock its segments, and wait for the erasure's, while the
/// erasure's DELETE of the row waited for the pass: a deadlock (seen in
/// the erasure race test under load). The advisory lock is the lock
/// manager's, with no such window. The key-share lock stays: inserting a
/// roll-up takes it anyway.
///
/// The lock on the level (a transaction-scoped advisory lock, which
/// nothing else takes) is what makes each roll-up once: two siblings
/// completing at once (on two replicas) take it in turn, so the second
/// reads after the first has committed (each statement takes a fresh
/// snapshot under READ COMMITTED) and sees its writes: the sibling
/// SUMMARISED, the roll-up made and its children adopted. Which nodes form
/// the next group depends on what is rolled up already (see `roll_up`), so
/// no set of rows locked in advance could stand for it.
async fn lock_level(
    client: &Object,
    node: SegmentId,
    fanout: u32,
) -> Result<Option<Level>, StoreError> {
    let erasing = client
        .prepare_cached(&format!(
            "SELECT pg_advisory_xact_lock_shared({}) FROM segments WHERE id = $1",
            erasure_lock("session_id")
        ))
        .await?;
    let session = client
        .prepare_cached(
            "SELECT 1 FROM sessions WHERE id = (SELECT session_id FROM segments WHERE id = $1) \
             FOR KEY SHARE",
        )
        .await?;
    // The node's session and level never change: read, not locked here.
    let read = client
        .prepare_cached("SELECT session_id, level FROM segments WHERE id = $1")
        .await?;
    let id = signed(node);
    // One round trip; the server runs them in this order.
    let (_, _, rows) = tokio::try_join!(
        biased;
        async { client.query(&erasing, &[&id]).await },
        async { client.query(&session, &[&id]).await },
        async { client.query(&read, &[&id]).await },
    )?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let level = Level {
        session_id: row.try_get(0)?,
        level: row.try_get(1)?,
    };
    if fanout >= 2 {
        // Levels stay below 256 (validate.rs caps the levels read at 64):
        // the key is the session's id and its level, one per pair.
        let forming = client
            .prepare_cached("SELECT pg_advisory_xact_lock(($1::BIGINT << 8) | $2::BIGINT)")
            .await?;
        client
            .execute(&forming, &[&level.session_id, &level.level])
            .await?;
    }
    let adoptable = client
        .prepare_cached(
            "SELECT id FROM segments WHERE session_id = $1 AND level = $2 \
             AND parent_id IS NULL AND (id = $3 OR (state = $4 AND $5)) \
             ORDER BY id FOR UPDATE",
        )
        .await?;
    let locked = client
        .query(
            &adoptable,
            &[
                &level.session_id,
                &level.level,
                &id,
                &SegmentState::Summarised.code(),
                &(fanout >= 2),
            ],
        )
        .await?;
    if locked.is_empty() {
        return Ok(None);
    }
    Ok(Some(level))
}

/// Creates the roll-ups that a node of `level` just SUMMARISED completes,
/// if any, in the transaction that completed it (whose locks `lock_level`
/// took). A level's groups are formed in order: the next group is the
/// `fanout` nodes that follow the last node already in a roll-up, rolled
/// up once all are SUMMARISED, taking the next ordinal of the level above.
/// So a change of `memory.fanout` applies to groups formed after it (a
/// smaller fanout may complete two groups at once). Returns the roll-ups
/// made, oldest first.
async fn roll_up(client: &Object, level: Level, fanout: u32) -> Result<Vec<SegmentId>, StoreError> {
    let mut made = Vec::new();
    while let Some(id) = roll_up_next(client, level, i64::from(fanout)).await? {
        made.push(id);
    }
    Ok(made)
}

/// Rolls up the next group of `level` if it is complete.
async fn roll_up_next(
    client: &Object,
    level: Level,
    fanout: i64,
) -> Result<Option<SegmentId>, StoreError> {
    let Level { session_id, level } = level;
    // The level's first node not yet in a roll-up (the session's roots, in
    // seq order, are few: a cover of the session).
    let first = client
        .prepare_cached(
            "SELECT ordinal FROM segments WHERE session_id = $1 AND parent_id IS NULL \
             AND level = $2 ORDER BY first_seq LIMIT 1",
        )
        .await?;
    let Some(row) = client.query_opt(&first, &[&session_id, &level]).await? else {
        return Ok(None);
    };
    let first: i64 = row.try_get(0)?;
    let last = first + fanout - 1;
    let check = client
        .prepare_cached(
            "SELECT count(*), count(*) FILTER (WHERE state = $5), \
             count(*) FILTER (WHERE parent_id IS NOT NULL), \
             coalesce(min(first_seq), 0), coalesce(max(last_seq), 0), \
             coalesce(sum(entry_count), 0)::BIGINT \
             FROM segments WHERE session_id = $1 AND level = $2 AND ordinal BETWEEN $3 AND $4",
        )
        .await?;
    let row = client
        .query_one(
            &check,
            &[
                &session_id,
                &level,
                &first,
                &last,
                &SegmentState::Summarised.code(),
            ],
        )
        .await?;
    let (count, summarised, parented): (i64, i64, i64) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    if count != fanout || summarised != fanout || parented != 0 {
        return Ok(None);
    }
    let (first_seq, last_seq, entries): (i64, i64, i64) =
        (row.try_get(3)?, row.try_get(4)?, row.try_get(5)?);
    // What the roll-up's pass reads: its children's summaries.
    let tokens = client
        .prepare_cached(
            "SELECT coalesce(sum(octet_length(m.text) / 4 + 5), 0)::BIGINT FROM segments c \
             JOIN summaries m ON m.segment_id = c.id \
             WHERE c.session_id = $1 AND c.level = $2 AND c.ordinal BETWEEN $3 AND $4",
        )
        .await?;
    let tokens: i64 = client
        .query_one(&tokens, &[&session_id, &level, &first, &last])
        .await?
        .try_get(0)?;
    let now = Millis::now().0;
    let insert = client
        .prepare_cached(
            "INSERT INTO segments (session_id, level, ordinal, state, first_seq, last_seq, \
             entry_count, token_estimate, next_attempt_at, closed_at, created_at) \
             SELECT $1, $2, coalesce(max(ordinal), 0) + 1, $3, $4, $5, $6, $7, $8, $8, $8 \
             FROM segments WHERE session_id = $1 AND level = $2 RETURNING id",
        )
        .await?;
    let id: i64 = client
        .query_one(
            &insert,
            &[
                &session_id,
                &(level + 1),
                &SegmentState::Pending.code(),
                &first_seq,
                &last_seq,
                &entries.min(i64::from(u32::MAX)),
                &tokens.min(i64::from(u32::MAX)),
                &now,
            ],
        )
        .await?
        .try_get(0)?;
    let adopt = client
        .prepare_cached(
            "UPDATE segments SET parent_id = $1 \
             WHERE session_id = $2 AND level = $3 AND ordinal BETWEEN $4 AND $5",
        )
        .await?;
    client
        .execute(&adopt, &[&id, &session_id, &level, &first, &last])
        .await?;
    Ok(Some(unsigned(id, "segment id")?))
}

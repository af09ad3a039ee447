//! Rows to domain types: the column lists every segment and entry query
//! selects, and their decoding. A query that needs a value beyond a
//! segment's columns selects it right after them (`SEGMENT_COLUMN_COUNT`).

use tokio_postgres::Row;

use super::unsigned;
use crate::failure::Failure;
use crate::model::{Entry, Millis, Role, Segment, SegmentState, Summary};
use crate::store::StoreError;

/// A segment's columns, over `SEGMENT_FROM`.
pub(super) const SEGMENT_COLUMNS: &str = "s.id, x.name, s.ordinal, s.state, s.first_seq, \
     s.last_seq, s.entry_count, s.token_estimate, s.attempts, s.passes, s.next_attempt_at, \
     s.closed_at, s.last_failure, m.text, m.provider, m.model, m.prompt_version, \
     m.input_tokens, m.output_tokens, m.created_at, s.level, \
     ARRAY(SELECT c.id FROM segments c WHERE c.parent_id = s.id ORDER BY c.ordinal), \
     (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
      WHERE e.session_id = s.session_id AND e.seq = s.first_seq), \
     (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
      WHERE e.session_id = s.session_id AND e.seq = s.last_seq)";
/// How many columns `SEGMENT_COLUMNS` names.
pub(super) const SEGMENT_COLUMN_COUNT: usize = 24;
pub(super) const SEGMENT_FROM: &str = "segments s JOIN sessions x ON x.id = s.session_id \
     LEFT JOIN summaries m ON m.segment_id = s.id";

/// An entry's columns, over `entries`.
pub(super) const ENTRY_COLUMNS: &str = "seq, client_entry_id, role, content, tokens, created_at, \
     coalesce(occurred_at, created_at), name, metadata::text";

pub(super) fn segment(r: &Row) -> Result<Segment, StoreError> {
    let state_code: i64 = r.try_get(3)?;
    let Some(state) = SegmentState::from_code(state_code) else {
        return Err(StoreError::Corrupt(format!("segment state {state_code}")));
    };
    let last_failure = match r.try_get::<_, Option<String>>(12)? {
        Some(json) => Some(
            serde_json::from_str::<Failure>(&json)
                .map_err(|e| StoreError::Corrupt(format!("stored failure: {e}")))?,
        ),
        None => None,
    };
    let summary = match r.try_get::<_, Option<String>>(13)? {
        Some(text) => Some(Summary {
            text,
            provider: r.try_get(14)?,
            model: r.try_get(15)?,
            prompt_version: r.try_get(16)?,
            input_tokens: unsigned(r.try_get(17)?, "input tokens")?,
            output_tokens: unsigned(r.try_get(18)?, "output tokens")?,
            created_at: Millis(r.try_get(19)?),
        }),
        None => None,
    };
    let child_ids = r
        .try_get::<_, Vec<i64>>(21)?
        .into_iter()
        .map(|id| unsigned(id, "child id"))
        .collect::<Result<_, _>>()?;
    Ok(Segment {
        id: unsigned(r.try_get(0)?, "segment id")?,
        session: r.try_get(1)?,
        ordinal: unsigned(r.try_get(2)?, "ordinal")?,
        state,
        first_seq: unsigned(r.try_get(4)?, "first seq")?,
        last_seq: unsigned(r.try_get(5)?, "last seq")?,
        entry_count: unsigned(r.try_get(6)?, "entry count")?,
        token_estimate: unsigned(r.try_get(7)?, "token estimate")?,
        summary,
        attempts: unsigned(r.try_get(8)?, "attempts")?,
        passes: unsigned(r.try_get(9)?, "passes")?,
        last_failure,
        next_attempt_at: r.try_get::<_, Option<i64>>(10)?.map(Millis),
        closed_at: r.try_get::<_, Option<i64>>(11)?.map(Millis),
        level: unsigned(r.try_get(20)?, "level")?,
        child_ids,
        first_occurred_at: r.try_get::<_, Option<i64>>(22)?.map(Millis),
        last_occurred_at: r.try_get::<_, Option<i64>>(23)?.map(Millis),
    })
}

pub(super) fn entry(r: &Row) -> Result<Entry, StoreError> {
    let role_code: i64 = r.try_get(2)?;
    let Some(role) = Role::from_code(role_code) else {
        return Err(StoreError::Corrupt(format!("entry role {role_code}")));
    };
    Ok(Entry {
        seq: unsigned(r.try_get(0)?, "seq")?,
        client_entry_id: r.try_get(1)?,
        role,
        content: r.try_get(3)?,
        tokens: unsigned(r.try_get(4)?, "tokens")?,
        created_at: Millis(r.try_get(5)?),
        occurred_at: Millis(r.try_get(6)?),
        name: r.try_get(7)?,
        metadata: crate::store::decode_metadata(r.try_get::<_, Option<&str>>(8)?)?,
    })
}

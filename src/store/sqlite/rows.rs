//! Rows to domain types: the column lists every segment and entry query
//! selects, and their decoding. A query that needs a value beyond a
//! segment's columns selects it right after them and reads it with
//! `after_segment`.

use rusqlite::Row;
use rusqlite::types::FromSql;

use crate::failure::Failure;
use crate::model::{Entry, Millis, Role, Segment, SegmentState, Summary};
use crate::store::StoreError;

/// A segment's columns, over `SEGMENT_FROM`.
pub(super) const SEGMENT_COLUMNS: &str = "s.id, x.name, s.ordinal, s.state, s.first_seq, \
     s.last_seq, s.entry_count, s.token_estimate, s.attempts, s.passes, s.next_attempt_at, \
     s.closed_at, s.last_failure, m.text, m.provider, m.model, m.prompt_version, \
     m.input_tokens, m.output_tokens, m.created_at, s.level, \
     (SELECT group_concat(c.id, ',' ORDER BY c.ordinal) FROM segments c WHERE c.parent_id = s.id), \
     (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
      WHERE e.session_id = s.session_id AND e.seq = s.first_seq), \
     (SELECT coalesce(e.occurred_at, e.created_at) FROM entries e \
      WHERE e.session_id = s.session_id AND e.seq = s.last_seq)";
/// How many columns `SEGMENT_COLUMNS` names.
const SEGMENT_COLUMN_COUNT: usize = 24;
pub(super) const SEGMENT_FROM: &str = "segments s JOIN sessions x ON x.id = s.session_id \
     LEFT JOIN summaries m ON m.segment_id = s.id";

/// An entry's columns, over `entries`.
pub(super) const ENTRY_COLUMNS: &str = "seq, client_entry_id, role, content, tokens, created_at, \
     coalesce(occurred_at, created_at), name, metadata";

/// A decoded row: the outer error is SQLite's, the inner one says the
/// stored data makes no sense.
pub(super) type Decoded<T> = rusqlite::Result<Result<T, StoreError>>;

/// The `n`th column (from 0) selected after a segment's.
pub(super) fn after_segment<T: FromSql>(r: &Row<'_>, n: usize) -> rusqlite::Result<T> {
    r.get(SEGMENT_COLUMN_COUNT + n)
}

pub(super) fn segment(r: &Row<'_>) -> Decoded<Segment> {
    let state_code: i64 = r.get(3)?;
    let Some(state) = SegmentState::from_code(state_code) else {
        return Ok(Err(StoreError::Corrupt(format!(
            "segment state {state_code}"
        ))));
    };
    let last_failure = match r.get::<_, Option<String>>(12)? {
        Some(json) => match serde_json::from_str::<Failure>(&json) {
            Ok(f) => Some(f),
            Err(e) => return Ok(Err(StoreError::Corrupt(format!("stored failure: {e}")))),
        },
        None => None,
    };
    let summary = match r.get::<_, Option<String>>(13)? {
        Some(text) => Some(Summary {
            text,
            provider: r.get(14)?,
            model: r.get(15)?,
            prompt_version: r.get(16)?,
            input_tokens: r.get(17)?,
            output_tokens: r.get(18)?,
            created_at: Millis(r.get(19)?),
        }),
        None => None,
    };
    let mut child_ids = Vec::new();
    if let Some(list) = r.get::<_, Option<String>>(21)? {
        for id in list.split(',') {
            match id.parse() {
                Ok(id) => child_ids.push(id),
                Err(_) => return Ok(Err(StoreError::Corrupt(format!("child id {id:?}")))),
            }
        }
    }
    Ok(Ok(Segment {
        id: r.get(0)?,
        session: r.get(1)?,
        ordinal: r.get(2)?,
        state,
        first_seq: r.get(4)?,
        last_seq: r.get(5)?,
        entry_count: r.get(6)?,
        token_estimate: r.get(7)?,
        summary,
        attempts: r.get(8)?,
        passes: r.get(9)?,
        last_failure,
        next_attempt_at: r.get::<_, Option<i64>>(10)?.map(Millis),
        closed_at: r.get::<_, Option<i64>>(11)?.map(Millis),
        level: r.get(20)?,
        child_ids,
        first_occurred_at: r.get::<_, Option<i64>>(22)?.map(Millis),
        last_occurred_at: r.get::<_, Option<i64>>(23)?.map(Millis),
    }))
}

pub(super) fn entry(r: &Row<'_>) -> Decoded<Entry> {
    let role_code: i64 = r.get(2)?;
    let Some(role) = Role::from_code(role_code) else {
        return Ok(Err(StoreError::Corrupt(format!("entry role {role_code}"))));
    };
    Ok(Ok(Entry {
        seq: r.get(0)?,
        client_entry_id: r.get(1)?,
        role,
        content: r.get(3)?,
        tokens: r.get(4)?,
        created_at: Millis(r.get(5)?),
        occurred_at: Millis(r.get(6)?),
        name: r.get(7)?,
        metadata: match crate::store::decode_metadata(r.get::<_, Option<String>>(8)?.as_deref()) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e)),
        },
    }))
}

//! The wire, both ways: domain types to `pb` and back, for the server and
//! the client alike, and what keeps a status's details small enough to
//! travel (clipped causes). Nothing else converts.

use std::time::Duration;

use prost::Message;

use crate::events::{Event, EventKind};
use crate::failure::{Failure, FailureClass};
use crate::model::{
    AppendOutcome, Backlog, Context, ContextItem, Entry, Millis, Role, Segment, SegmentState,
    SessionInfo, Summary,
};
use crate::pb;

/// The type URL of the `Failure` status detail.
pub(crate) const FAILURE_TYPE_URL: &str = "type.googleapis.com/archivist.v1.Failure";
/// Longest cause line sent; status details ride in a header block.
const MAX_CAUSE_CHARS: usize = 1024;

/// Most bytes of causes one status carries: details ride in the
/// `grpc-status-details-bin` trailer, and clients refuse header blocks past
/// 16 KiB by default.
const MAX_CAUSES_BYTES: usize = 6 * 1024;

/// Each cause cut to MAX_CAUSE_CHARS, and the list to MAX_CAUSES_BYTES by
/// dropping middle causes (the outermost and the root say the most); every
/// cut says so in the text.
pub(crate) fn clip_causes(causes: Vec<String>) -> Vec<String> {
    let mut clipped: Vec<String> = causes
        .into_iter()
        .map(|c| {
            if c.chars().count() <= MAX_CAUSE_CHARS {
                c
            } else {
                let cut: String = c.chars().take(MAX_CAUSE_CHARS).collect();
                format!("{cut}… [truncated]")
            }
        })
        .collect();
    let mut dropped = 0;
    while clipped.iter().map(String::len).sum::<usize>() > MAX_CAUSES_BYTES && clipped.len() > 2 {
        clipped.remove(clipped.len() / 2);
        dropped += 1;
    }
    if dropped > 0 {
        let at = clipped.len() / 2;
        clipped.insert(at, format!("[{dropped} more causes truncated]"));
    }
    clipped
}

pub(crate) fn timestamp(m: Millis) -> prost_types::Timestamp {
    prost_types::Timestamp::from(m.as_system_time())
}

pub(crate) fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    })
}

pub(crate) fn role_to_pb(role: Role) -> pb::Role {
    match role {
        Role::User => pb::Role::User,
        Role::Assistant => pb::Role::Assistant,
        Role::System => pb::Role::System,
        Role::Tool => pb::Role::Tool,
    }
}

pub(crate) fn state_to_pb(state: SegmentState) -> pb::SegmentState {
    match state {
        SegmentState::Open => pb::SegmentState::Open,
        SegmentState::Pending => pb::SegmentState::Pending,
        SegmentState::Summarised => pb::SegmentState::Summarised,
        SegmentState::Parked => pb::SegmentState::Parked,
    }
}

fn summary_to_pb(s: Summary) -> pb::Summary {
    pb::Summary {
        text: s.text,
        provider: s.provider,
        model: s.model,
        prompt_version: s.prompt_version,
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        created_at: Some(timestamp(s.created_at)),
    }
}

pub(crate) fn entry_to_pb(e: Entry) -> pb::Entry {
    pb::Entry {
        seq: e.seq,
        client_entry_id: e.client_entry_id.unwrap_or_default(),
        role: role_to_pb(e.role).into(),
        content: e.content,
        created_at: Some(timestamp(e.created_at)),
        occurred_at: Some(timestamp(e.occurred_at)),
        name: e.name.unwrap_or_default(),
        metadata: e.metadata.into_iter().collect(),
    }
}

pub(crate) fn failure_to_pb(f: &Failure) -> pb::Failure {
    use pb::failure::Kind;
    let kind = match f.class {
        FailureClass::Transport => Kind::Transport(pb::failure::Transport {}),
        FailureClass::Timeout => Kind::Timeout(pb::failure::Timeout {}),
        FailureClass::Unavailable => Kind::Unavailable(pb::failure::Unavailable {}),
        FailureClass::RateLimited => Kind::RateLimited(pb::failure::RateLimited {
            retry_after: f.retry_after.map(duration),
        }),
        FailureClass::QuotaExhausted => Kind::QuotaExhausted(pb::failure::QuotaExhausted {}),
        FailureClass::Unauthorized => Kind::Unauthorized(pb::failure::Unauthorized {}),
        FailureClass::UnknownModel => Kind::UnknownModel(pb::failure::UnknownModel {}),
        FailureClass::InvalidRequest => Kind::InvalidRequest(pb::failure::InvalidRequest {}),
        FailureClass::MalformedResponse => {
            Kind::MalformedResponse(pb::failure::MalformedResponse {})
        }
        FailureClass::BudgetExhausted => Kind::BudgetExhausted(pb::failure::BudgetExhausted {}),
        FailureClass::Store => Kind::Store(pb::failure::Store {}),
    };
    pb::Failure {
        kind: Some(kind),
        retryable: f.retryable(),
        causes: clip_causes(f.causes.clone()),
        attempts: f.attempts,
        elapsed: Some(duration(f.elapsed)),
        http_status: f.http_status.map(u32::from),
        provider: f.provider.clone(),
        model: f.model.clone(),
        hint: f.hint.clone(),
    }
}

/// The wire `Failure` back as the domain's; None when it names no class
/// this build knows.
pub(crate) fn failure_from_pb(f: &pb::Failure) -> Option<Failure> {
    use pb::failure::Kind;
    let mut retry_after = None;
    let class = match f.kind.as_ref()? {
        Kind::Transport(_) => FailureClass::Transport,
        Kind::Timeout(_) => FailureClass::Timeout,
        Kind::Unavailable(_) => FailureClass::Unavailable,
        Kind::RateLimited(r) => {
            retry_after = r.retry_after.and_then(|d| Duration::try_from(d).ok());
            FailureClass::RateLimited
        }
        Kind::QuotaExhausted(_) => FailureClass::QuotaExhausted,
        Kind::Unauthorized(_) => FailureClass::Unauthorized,
        Kind::UnknownModel(_) => FailureClass::UnknownModel,
        Kind::InvalidRequest(_) => FailureClass::InvalidRequest,
        Kind::MalformedResponse(_) => FailureClass::MalformedResponse,
        // A cancelled pass is not a failure; only older servers send it.
        Kind::Cancelled(_) => return None,
        Kind::BudgetExhausted(_) => FailureClass::BudgetExhausted,
        Kind::Store(_) => FailureClass::Store,
    };
    Some(Failure {
        class,
        retry_after,
        causes: f.causes.clone(),
        attempts: f.attempts,
        elapsed: f
            .elapsed
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default(),
        http_status: f.http_status.and_then(|s| u16::try_from(s).ok()),
        provider: f.provider.clone(),
        model: f.model.clone(),
        hint: f.hint.clone(),
    })
}

pub(crate) fn segment_to_pb(s: Segment) -> pb::Segment {
    pb::Segment {
        id: s.id,
        session_id: s.session,
        ordinal: s.ordinal,
        state: state_to_pb(s.state).into(),
        first_seq: s.first_seq,
        last_seq: s.last_seq,
        entry_count: s.entry_count,
        summary: s.summary.map(summary_to_pb),
        attempts: s.attempts,
        passes: s.passes,
        last_failure: s.last_failure.as_ref().map(failure_to_pb),
        next_attempt_at: match s.state {
            SegmentState::Pending => s.next_attempt_at.map(timestamp),
            SegmentState::Open | SegmentState::Summarised | SegmentState::Parked => None,
        },
        closed_at: s.closed_at.map(timestamp),
        level: s.level,
        child_ids: s.child_ids,
        first_occurred_at: s.first_occurred_at.map(timestamp),
        last_occurred_at: s.last_occurred_at.map(timestamp),
    }
}

pub(crate) fn context_to_pb(c: Context) -> pb::GetContextResponse {
    pb::GetContextResponse {
        items: c
            .items
            .into_iter()
            .map(|item| pb::ContextItem {
                item: Some(match item {
                    ContextItem::Summary {
                        segment_id,
                        level,
                        first_seq,
                        last_seq,
                        summary,
                        said: (first, last),
                    } => pb::context_item::Item::Summary(pb::ContextSummary {
                        segment_id,
                        level,
                        first_seq,
                        last_seq,
                        summary: Some(summary_to_pb(summary)),
                        first_occurred_at: first.map(timestamp),
                        last_occurred_at: last.map(timestamp),
                    }),
                    ContextItem::Entry(e) => pb::context_item::Item::Entry(entry_to_pb(e)),
                    ContextItem::Recalled(r) => pb::context_item::Item::Recalled(pb::RecalledHit {
                        session_id: r.session,
                        level: r.level,
                        first_seq: r.first_seq,
                        last_seq: r.last_seq,
                        name: r.name.unwrap_or_default(),
                        occurred_at: Some(timestamp(r.occurred_at)),
                        text: r.text,
                        score: r.score,
                        segment_id: r.segment_id.unwrap_or(0),
                        role: r.role.map_or(pb::Role::Unspecified, role_to_pb) as i32,
                    }),
                }),
            })
            .collect(),
        truncated: c.truncated,
        estimated_tokens: c.tokens,
    }
}

pub(crate) fn backlog_to_pb(b: Backlog) -> pb::Backlog {
    pb::Backlog {
        open: b.open,
        pending: b.pending,
        summarised: b.summarised,
        parked: b.parked,
        oldest_pending_age: b.oldest_pending_age.map(duration),
        parked_by_class: b.parked_by_class.into_iter().collect(),
        erasures_pending: b.erasures_pending,
        embeddings: Some(pb::EmbeddingBacklog {
            pending: b.embeddings.pending,
            parked: b.embeddings.parked,
            parked_by_class: b.embeddings.parked_by_class.into_iter().collect(),
            embedded: b.embeddings.embedded,
            last_failure: b.embeddings.last_failure.as_ref().map(failure_to_pb),
            deferred: b.embeddings.deferred,
        }),
        unindexed: b.unindexed,
        oldest_unindexed_age: b.oldest_unindexed_age.map(duration),
    }
}

pub(crate) fn session_info_to_pb(s: SessionInfo) -> pb::SessionInfo {
    pb::SessionInfo {
        session_id: s.name,
        entry_count: s.entry_count,
        last_seq: s.last_seq,
        open_segment_id: s.open_segment_id,
        pending: s.pending,
        parked: s.parked,
        created_at: Some(timestamp(s.created_at)),
        last_append_at: Some(timestamp(s.last_append_at)),
        subject: s.subject.unwrap_or_default(),
    }
}

pub(crate) fn role_from_pb(raw: i32) -> Option<Role> {
    match pb::Role::try_from(raw) {
        Ok(pb::Role::User) => Some(Role::User),
        Ok(pb::Role::Assistant) => Some(Role::Assistant),
        Ok(pb::Role::System) => Some(Role::System),
        Ok(pb::Role::Tool) => Some(Role::Tool),
        Ok(pb::Role::Unspecified) | Err(_) => None,
    }
}

pub(crate) fn state_from_pb(raw: i32) -> Option<SegmentState> {
    match pb::SegmentState::try_from(raw) {
        Ok(pb::SegmentState::Open) => Some(SegmentState::Open),
        Ok(pb::SegmentState::Pending) => Some(SegmentState::Pending),
        Ok(pb::SegmentState::Summarised) => Some(SegmentState::Summarised),
        Ok(pb::SegmentState::Parked) => Some(SegmentState::Parked),
        Ok(pb::SegmentState::Unspecified) | Err(_) => None,
    }
}

/// The `archivist.v1.Failure` detail among a status's encoded details
/// (`google.rpc.Status`), if it carries one.
pub(crate) fn failure_detail(details: &[u8]) -> Option<pb::Failure> {
    let rpc = tonic_types::pb::Status::decode(details).ok()?;
    rpc.details
        .iter()
        .find(|any| any.type_url == FAILURE_TYPE_URL)
        .and_then(|any| pb::Failure::decode(any.value.as_slice()).ok())
}

pub(crate) fn append_to_pb(outcome: AppendOutcome) -> pb::AppendEntriesResponse {
    pb::AppendEntriesResponse {
        entries: outcome
            .entries
            .into_iter()
            .map(|e| pb::AppendedEntry {
                seq: e.seq,
                client_entry_id: e.client_entry_id.unwrap_or_default(),
                duplicate: e.duplicate,
            })
            .collect(),
        open_segment_id: outcome.open_segment_id,
        closed_segment_ids: outcome.closed_segment_ids,
    }
}

pub(crate) fn event_to_pb(event: &Event) -> pb::SessionEvent {
    pb::SessionEvent {
        kind: match event.kind {
            EventKind::Closed => pb::SessionEventKind::Closed,
            EventKind::Summarised => pb::SessionEventKind::Summarised,
            EventKind::Failed => pb::SessionEventKind::Failed,
            EventKind::Parked => pb::SessionEventKind::Parked,
            EventKind::Deleted => pb::SessionEventKind::Deleted,
            EventKind::Gap => pb::SessionEventKind::Gap,
        }
        .into(),
        segment: event.segment.clone().map(segment_to_pb),
        at: Some(timestamp(event.at)),
        missed: 0,
    }
}

/// The marker a watcher gets after losing `missed` events.
pub(crate) fn gap_to_pb(missed: u64) -> pb::SessionEvent {
    pb::SessionEvent {
        kind: pb::SessionEventKind::Gap.into(),
        segment: None,
        at: Some(timestamp(Millis::now())),
        missed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_crosses_the_wire_with_its_retryable_flag() {
        for class in FailureClass::ALL {
            let failure = Failure {
                class,
                retry_after: (class == FailureClass::RateLimited).then_some(Duration::from_secs(7)),
                causes: vec!["outer".to_owned(), "root".to_owned()],
                attempts: 2,
                elapsed: Duration::from_millis(1500),
                http_status: Some(503),
                provider: "openai".to_owned(),
                model: "m".to_owned(),
                hint: "what to do".to_owned(),
            };
            let wire = failure_to_pb(&failure);
            // Only the classes that retrying cannot fix say so.
            let parks = matches!(
                class,
                FailureClass::Unauthorized
                    | FailureClass::UnknownModel
                    | FailureClass::InvalidRequest
            );
            assert_eq!(wire.retryable, !parks, "{class:?}");
            assert_eq!(failure_from_pb(&wire), Some(failure), "{class:?}");
        }
    }
}

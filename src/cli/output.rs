//! What the terminal client prints: segments, events, trees and errors for
//! a person, and the same as JSON for scripts (`--json`).

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;

use crate::client::CallError;
use crate::model::{Role, SegmentState};
use crate::pb;
use crate::text::{count, human_duration};
use crate::wire::{role_from_pb, state_from_pb};

pub(super) fn role_name(role: i32) -> &'static str {
    role_from_pb(role).map_or("?", Role::as_str)
}

pub(super) fn state_name(state: i32) -> &'static str {
    state_from_pb(state).map_or("?", SegmentState::as_str)
}

pub(super) fn seq_range(seg: &pb::Segment) -> String {
    format!(
        "seq {}..{}, {}",
        seg.first_seq,
        seg.last_seq,
        count(u64::from(seg.entry_count), "entry", "entries")
    )
}

pub(super) fn system_time(t: &prost_types::Timestamp) -> Option<SystemTime> {
    SystemTime::try_from(*t).ok()
}

/// A time with how far it is from now: "2026-11-29T10:00:05Z (in 4 s)".
pub(super) fn when(t: &prost_types::Timestamp, now: SystemTime) -> String {
    let Some(at) = system_time(t) else {
        return "?".to_owned();
    };
    let stamp = humantime::format_rfc3339_seconds(at);
    match at.duration_since(now) {
        Ok(ahead) if ahead >= Duration::from_secs(1) => {
            format!("{stamp} (in {})", human_duration(ahead))
        }
        Err(past) if past.duration() >= Duration::from_secs(1) => {
            format!("{stamp} ({} ago)", human_duration(past.duration()))
        }
        _ => format!("{stamp} (now)"),
    }
}

/// What a person should know of texts parked owing an embedding, said by
/// `archivist backlog` and by `archivist backfill --embeddings`.
pub(super) const PARKED_EMBEDDINGS: &str = "parked texts wait for another embedder configuration (key, model, URL or dimensions): fix it, then restart the server with it or run `archivist backfill --embeddings`";

/// What a person should know to do about a segment in its state: nothing
/// for a healthy one.
pub(super) fn advice(seg: &pb::Segment) -> Option<String> {
    match state_from_pb(seg.state)? {
        SegmentState::Parked => Some(format!(
            "parked: the server does not retry it by itself. Fix the provider setup (`archivist check` with the server's configuration shows what is wrong), then restart the server with it, or run `archivist session requeue {} --include-parked`",
            seg.session_id
        )),
        SegmentState::Pending if seg.last_failure.is_some() => Some(
            "pending: the server tries again by itself at the next attempt; `archivist session requeue` makes it due now"
                .to_owned(),
        ),
        _ => None,
    }
}

pub(super) fn print_segment(seg: &pb::Segment) {
    let now = SystemTime::now();
    let tried = match (seg.attempts, seg.passes) {
        (0, 0) => String::new(),
        (attempts, passes) => format!(
            ", {} in {}",
            count(u64::from(attempts), "attempt", "attempts"),
            count(u64::from(passes), "pass", "passes")
        ),
    };
    println!(
        "segment {} (#{} of {}): {}, {}{tried}",
        seg.id,
        seg.ordinal,
        seg.session_id,
        state_name(seg.state),
        seq_range(seg),
    );
    if let Some(s) = &seg.summary {
        for line in s.text.lines() {
            println!("    {line}");
        }
        println!("    [{} / {}]", s.provider, s.model);
    }
    if let Some(at) = &seg.next_attempt_at {
        println!("    next attempt: {}", when(at, now));
    }
    if let Some(f) = &seg.last_failure {
        print_failure(f, state_from_pb(seg.state));
    }
    if let Some(advice) = advice(seg) {
        println!("    {advice}");
    }
}

/// A node's last failure, as its state makes it: what stands in the way of
/// a PENDING or PARKED node's recap, with its fix; for a node summarised
/// since, a past failure in one line, with no fix to make.
fn print_failure(f: &pb::Failure, state: Option<SegmentState>) {
    if !matches!(state, Some(SegmentState::Pending | SegmentState::Parked)) {
        println!(
            "    an earlier pass failed ({} after {}); a later one succeeded",
            failure_class_name(f),
            count(u64::from(f.attempts), "attempt", "attempts")
        );
        return;
    }
    println!("    last failure: {}", failure_line(f));
    if !f.hint.is_empty() {
        println!("    fix: {}", f.hint);
    }
}

/// A failure in one line: its class, HTTP status, attempts and causes.
pub(super) fn failure_line(f: &pb::Failure) -> String {
    let attempts = count(u64::from(f.attempts), "attempt", "attempts");
    let status = f
        .http_status
        .map(|s| format!(" (HTTP {s})"))
        .unwrap_or_default();
    // The first cause restates the class and attempts.
    let causes = f.causes.get(1..).unwrap_or_default().join(": ");
    let class = failure_class_name(f);
    if causes.is_empty() {
        format!("{class}{status} after {attempts}")
    } else {
        format!("{class}{status} after {attempts}: {causes}")
    }
}

pub(super) fn failure_class_name(f: &pb::Failure) -> &'static str {
    crate::wire::failure_from_pb(f).map_or("unknown", |f| f.class.as_str())
}

/// A failed call as lines for a person: the status, then every cause.
pub fn describe(status: &tonic::Status) -> String {
    let error = CallError::from_status(status);
    let mut out = error.to_string();
    for (field, description) in &error.violations {
        out.push_str(&format!("\n  {field}: {description}"));
    }
    if let Some(wait) = error.retry_after {
        out.push_str(&format!("\n  retry after {}", human_duration(wait)));
    }
    for cause in error.chain() {
        out.push_str(&format!("\ncaused by: {cause}"));
    }
    if let Some(hint) = error
        .failure
        .as_ref()
        .map(|f| &f.hint)
        .filter(|h| !h.is_empty())
    {
        out.push_str(&format!("\nfix: {hint}"));
    }
    out
}

/// As `describe`, with what a person at this terminal can do about it.
pub(super) fn describe_with_hint(status: &tonic::Status) -> String {
    let error = CallError::from_status(status);
    let mut out = describe(status);
    let hint = match (status.code(), error.reason.as_deref()) {
        (tonic::Code::Unauthenticated, Some("MISSING_TOKEN")) => {
            Some("this server needs a token: pass --token, or set ARCHIVIST_TOKEN")
        }
        (tonic::Code::Unauthenticated, _) => {
            Some("the server knows no tenant with this token: check --token (or ARCHIVIST_TOKEN)")
        }
        (tonic::Code::AlreadyExists, Some("CLIENT_ENTRY_ID_REUSED")) => Some(
            "that --id already names another entry: give new text a new id (the same id with the same text is a safe retry)",
        ),
        (tonic::Code::DeadlineExceeded, None) => {
            Some("no answer within --timeout: give it longer, or check the server")
        }
        _ => None,
    };
    if let Some(hint) = hint {
        out.push_str(&format!("\nhint: {hint}"));
    }
    out
}

/// archivist.v1's descriptors (compiled in), to print any wire message.
static DESCRIPTORS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("the compiled-in descriptors decode")
});

/// How wire messages print: the protobuf JSON mapping (enums by name,
/// times in RFC 3339, durations as "1.5s"), with the proto's field names,
/// 64-bit integers as numbers, and every field that has no presence even
/// at its default (`level`, `child_ids: []`); an unset message or optional
/// field is left out.
const JSON_OPTIONS: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .stringify_64_bit_integers(false)
    .skip_default_fields(false);

/// A wire message as JSON, every field of it: the one conversion behind
/// every `--json` output, so a script sees what the server sent.
pub(super) fn wire_json<M: prost::Name>(message: &M) -> Value {
    let name = M::full_name();
    let descriptor = DESCRIPTORS
        .get_message_by_name(&name)
        .unwrap_or_else(|| panic!("{name} is in the compiled-in descriptors"));
    // Our own encoding of a message of this very descriptor.
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("{name} decodes as itself: {e}"));
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &JSON_OPTIONS)
        .unwrap_or_else(|e| panic!("{name} serialises to JSON: {e}"))
}

/// `wire_json` of a message, with the session it is of.
pub(super) fn session_wire_json<M: prost::Name>(session: &str, message: &M) -> Value {
    let mut value = wire_json(message);
    if let Value::Object(fields) = &mut value {
        fields.insert("session_id".to_owned(), Value::from(session));
    }
    value
}

/// An entry as a person reads it: "seq role: content", and for one said by
/// someone named or at a time of its own (an imported history), who and
/// when: "seq role Tom (14 Nov 2023 09:12): content".
pub(super) fn entry_line(e: &pb::Entry) -> String {
    let said_then = e.occurred_at.is_some() && e.occurred_at != e.created_at;
    if e.name.is_empty() && !said_then {
        return format!("{} {}: {}", e.seq, role_name(e.role), e.content);
    }
    let mut label = role_name(e.role).to_owned();
    if !e.name.is_empty() {
        label.push(' ');
        label.push_str(&e.name);
    }
    if let Some(at) = &e.occurred_at {
        let ms = at.seconds.saturating_mul(1000) + i64::from(at.nanos / 1_000_000);
        let (day, time) = crate::text::day_and_time(crate::model::Millis(ms));
        label.push_str(&format!(" ({day} {time})"));
    }
    format!("{} {label}: {}", e.seq, e.content)
}

/// A search leg's name: how a hit was matched.
pub(super) fn leg_name(leg: i32) -> &'static str {
    match pb::SearchLeg::try_from(leg) {
        Ok(pb::SearchLeg::Lexical) => "lexical",
        Ok(pb::SearchLeg::Semantic) => "semantic",
        Ok(pb::SearchLeg::Unspecified) | Err(_) => "?",
    }
}

/// The legs of a hit or a search: "lexical", "lexical+semantic".
pub(super) fn legs(legs: &[i32]) -> String {
    legs.iter()
        .map(|l| leg_name(*l))
        .collect::<Vec<_>>()
        .join("+")
}

/// Text as a terminal should show it: control characters other than
/// newline and tab (escape sequences that would clear the screen, retitle
/// the window or hide what follows) written as escapes, `\u{1b}`. A search
/// prints whatever anyone stored in the tenant's memory.
pub(super) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let shown = |c: char| !c.is_control() || c == '\n' || c == '\t';
    if text.chars().all(shown) {
        return text.into();
    }
    text.chars()
        .map(|c| match shown(c) {
            true => c.to_string(),
            false => c.escape_unicode().to_string(),
        })
        .collect::<String>()
        .into()
}

/// One search hit as a block for a person: its rank, where it is (the
/// session, what kind of text, the seq range, the node), its role and
/// speaker, when it was said (an entry's occurred_at, a summary's last
/// entry's; created_at from a server without it), its score, then its
/// whole text indented.
pub(super) fn render_hit(rank: usize, hit: &pb::SearchHit, now: SystemTime) -> String {
    let what = match hit.level {
        0 if hit.name.is_empty() => format!("seq {}, {}", hit.first_seq, role_name(hit.role)),
        0 => format!(
            "seq {}, {} {}",
            hit.first_seq,
            role_name(hit.role),
            printable(&hit.name)
        ),
        1 => format!(
            "recap of seq {}..{} (segment {})",
            hit.first_seq, hit.last_seq, hit.segment_id
        ),
        level => format!(
            "level {level} roll-up of seq {}..{} (node {})",
            hit.first_seq, hit.last_seq, hit.segment_id
        ),
    };
    let at = hit
        .occurred_at
        .as_ref()
        .or(hit.created_at.as_ref())
        .map(|t| format!(", {}", when(t, now)))
        .unwrap_or_default();
    // The cosine only where the semantic leg found the hit: a 0 there
    // means "not found by meaning", not a similarity of 0.
    let similarity = match hit.semantic_rank {
        0 => String::new(),
        _ => format!(", similarity {:.3}", hit.similarity),
    };
    let mut out = format!(
        "{rank}. {} {what}{at}; score {:.4} ({}){similarity}\n",
        hit.session_id,
        hit.score,
        legs(&hit.legs)
    );
    for line in hit.text.lines() {
        out.push_str("    ");
        out.push_str(&printable(line));
        out.push('\n');
    }
    out
}

/// A context's recalled hit, as `session context --query` prints it: like
/// a search hit, marked as recalled, its text indented beneath.
pub(super) fn render_recalled(rank: usize, hit: &pb::RecalledHit, now: SystemTime) -> String {
    let as_hit = pb::SearchHit {
        session_id: hit.session_id.clone(),
        level: hit.level,
        first_seq: hit.first_seq,
        last_seq: hit.last_seq,
        segment_id: hit.segment_id,
        role: hit.role,
        score: hit.score,
        text: hit.text.clone(),
        name: hit.name.clone(),
        occurred_at: hit.occurred_at,
        ..Default::default()
    };
    let rendered = render_hit(rank, &as_hit, now);
    // The hit's line ends with its legs, which a recalled hit does not
    // name: " ()" before the first newline.
    match rendered.split_once(" ()\n") {
        Some((head, rest)) => format!("[recalled] {head}\n{rest}"),
        None => format!("[recalled] {rendered}"),
    }
}

/// Levels `session tree` asks for: with fanout 4, level 16 covers four
/// billion segments.
pub(super) const TREE_DEPTH: u32 = 16;

/// The nodes as a tree: roots (nodes no roll-up covers) oldest first, each
/// roll-up's children indented beneath it.
pub(super) fn render_tree(nodes: &[pb::Segment]) -> String {
    use std::collections::{HashMap, HashSet};
    use std::fmt::Write;
    let by_id: HashMap<u64, &pb::Segment> = nodes.iter().map(|n| (n.id, n)).collect();
    let covered: HashSet<u64> = nodes
        .iter()
        .flat_map(|n| n.child_ids.iter().copied())
        .collect();
    let mut roots: Vec<&pb::Segment> = nodes.iter().filter(|n| !covered.contains(&n.id)).collect();
    roots.sort_by_key(|n| n.first_seq);
    let mut out = String::new();
    let mut stack: Vec<(&pb::Segment, usize)> = roots.into_iter().rev().map(|n| (n, 0)).collect();
    while let Some((node, depth)) = stack.pop() {
        let summary = node
            .summary
            .as_ref()
            .map(|s| s.text.lines().next().unwrap_or_default().to_owned())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:indent$}L{} #{} (id {}) seq {}..{} {}  {}",
            "",
            node.level,
            node.ordinal,
            node.id,
            node.first_seq,
            node.last_seq,
            state_name(node.state),
            summary,
            indent = depth * 2
        );
        for child in node.child_ids.iter().rev() {
            if let Some(child) = by_id.get(child) {
                stack.push((child, depth + 1));
            }
        }
    }
    out
}

pub(super) fn event_kind(event: &pb::SessionEvent) -> &'static str {
    match pb::SessionEventKind::try_from(event.kind) {
        Ok(pb::SessionEventKind::Closed) => "CLOSED",
        Ok(pb::SessionEventKind::Summarised) => "SUMMARISED",
        Ok(pb::SessionEventKind::Failed) => "FAILED",
        Ok(pb::SessionEventKind::Parked) => "PARKED",
        Ok(pb::SessionEventKind::Deleted) => "DELETED",
        Ok(pb::SessionEventKind::Gap) => "GAP",
        Ok(pb::SessionEventKind::Unspecified) | Err(_) => "?",
    }
}

pub(super) fn print_event(event: &pb::SessionEvent) {
    let at = event
        .at
        .and_then(|t| std::time::SystemTime::try_from(t).ok())
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default();
    let kind = event_kind(event);
    match &event.segment {
        Some(seg) => {
            let why = match kind {
                "FAILED" | "PARKED" => seg
                    .last_failure
                    .as_ref()
                    .and_then(|f| f.causes.last())
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            println!(
                "{at} {kind} level {} #{} (id {}) seq {}..{}{why}",
                seg.level, seg.ordinal, seg.id, seg.first_seq, seg.last_seq
            );
        }
        None if kind == "GAP" => println!(
            "{at} GAP: {} lost (this watcher fell behind)",
            count(event.missed, "event", "events")
        ),
        None => println!("{at} {kind}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roll_up_hit_names_its_level_range_and_node_and_indents_every_line() {
        let hit = pb::SearchHit {
            session_id: "ada".to_owned(),
            level: 2,
            first_seq: 1,
            last_seq: 200,
            segment_id: 9,
            created_at: None,
            score: 1.0 / 61.0 + 1.0 / 62.0,
            text: "first line\nsecond line".to_owned(),
            legs: vec![
                pb::SearchLeg::Lexical as i32,
                pb::SearchLeg::Semantic as i32,
            ],
            similarity: 0.75,
            lexical_rank: 2,
            semantic_rank: 1,
            ..Default::default()
        };
        assert_eq!(
            render_hit(3, &hit, SystemTime::now()),
            "3. ada level 2 roll-up of seq 1..200 (node 9); score 0.0325 (lexical+semantic), similarity 0.750\n    first line\n    second line\n"
        );
    }

    #[test]
    fn an_entry_hit_names_its_speaker_and_when_it_was_said() {
        let said = prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        };
        let hit = pb::SearchHit {
            session_id: "ada".to_owned(),
            first_seq: 4,
            last_seq: 4,
            role: pb::Role::User as i32,
            name: "Tom\u{1b}".to_owned(),
            created_at: Some(prost_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            occurred_at: Some(said),
            score: 1.0 / 61.0,
            text: "moved it".to_owned(),
            legs: vec![pb::SearchLeg::Lexical as i32],
            ..Default::default()
        };
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            render_hit(1, &hit, now),
            "1. ada seq 4, user Tom\\u{1b}, 2023-11-14T22:13:20Z (now); score 0.0164 (lexical)\n    moved it\n"
        );
    }

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(printable("a\tb\nc"), "a\tb\nc");
        assert_eq!(
            printable("\u{1b}[2Jgone\u{7}\r"),
            "\\u{1b}[2Jgone\\u{7}\\u{d}"
        );
    }
}

//! Checking requests at the edge: every field of a request is checked and
//! every bad one named (BadRequest), before anything reaches the service.
//! Also the call's deadline and the opaque page tokens.

use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Status};
use tonic_types::FieldViolation;

use super::status::invalid;
use crate::config::LimitsConfig;
use crate::model::{
    MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE, NewEntry, SegmentId, SessionName,
    Subject, metadata_key_ok, metadata_value_ok,
};
use crate::pb;
use crate::store::SegmentFilter;
use crate::wire::{role_from_pb, state_from_pb};

const DEFAULT_PAGE_SIZE: u32 = 50;
/// Entries are small beside segments (no summaries, no failures): a
/// transcript's default page holds more of them.
const DEFAULT_ENTRIES_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
const MAX_CLIENT_ENTRY_ID: usize = 128;
/// An entry's `name`: a participant's name, as a chat message's.
const MAX_NAME_CHARS: usize = 64;
/// The deepest level ListSegments takes: with fanout 2, level 64 would
/// cover 2^63 segments.
const MAX_LEVEL: u32 = 64;
/// Most segment ids one RequeueSegments call may name.
const MAX_REQUEUE_IDS: usize = 1000;
/// Violations of one repeated field named in one answer; past it, more of
/// the same would only cost memory.
const MAX_LISTED_VIOLATIONS: usize = 20;
/// A waiting call answers this long before its deadline, so the answer
/// (the segment as it stands) arrives before the client gives up.
const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

pub(super) fn violation(
    field: impl Into<String>,
    reason: &str,
    description: impl Into<String>,
) -> FieldViolation {
    let mut v = FieldViolation::new(field, description);
    v.reason = reason.to_owned();
    v
}

pub(super) fn parse_session(raw: &str, field: &str) -> Result<SessionName, Vec<FieldViolation>> {
    SessionName::parse(raw).map_err(|e| vec![violation(field, "INVALID_SESSION_ID", e.to_string())])
}

pub(super) fn parse_subject(raw: &str) -> Result<Subject, Vec<FieldViolation>> {
    Subject::parse(raw).map_err(|e| vec![violation("subject", "INVALID_SUBJECT", e.to_string())])
}

/// An optional subject: empty means none.
fn optional_subject(raw: &str, violations: &mut Vec<FieldViolation>) -> Option<Subject> {
    match raw {
        "" => None,
        raw => parse_subject(raw).map_err(|v| violations.extend(v)).ok(),
    }
}

/// An AppendEntries request, checked: the session, its subject if named,
/// and the entries.
pub(super) fn parse_append(
    req: pb::AppendEntriesRequest,
    limits: &LimitsConfig,
) -> Result<(SessionName, Option<Subject>, Vec<NewEntry>), Status> {
    let mut violations = Vec::new();
    let session = parse_session(&req.session_id, "session_id").map_err(|v| violations.extend(v));
    let subject = optional_subject(&req.subject, &mut violations);
    if req.entries.is_empty() {
        violations.push(violation(
            "entries",
            "NO_ENTRIES",
            "at least one entry is required",
        ));
    }
    if req.entries.len() > limits.max_entries_per_call as usize {
        violations.push(violation(
            "entries",
            "TOO_MANY_ENTRIES",
            format!(
                "{} entries in one call; at most {} are allowed",
                req.entries.len(),
                limits.max_entries_per_call
            ),
        ));
        // Checking each of an oversized batch would only say more of the same.
        return Err(invalid(violations));
    }
    let now = crate::model::Millis::now();
    let skew_ms = i64::try_from(limits.max_clock_skew.as_millis()).unwrap_or(i64::MAX);
    let latest = crate::model::Millis(now.0.saturating_add(skew_ms));
    let mut entries = Vec::with_capacity(req.entries.len());
    for (i, e) in req.entries.into_iter().enumerate() {
        let role = role_from_pb(e.role);
        if role.is_none() {
            violations.push(violation(
                format!("entries[{i}].role"),
                "INVALID_ROLE",
                format!(
                    "role {} is not one of ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM, ROLE_TOOL",
                    e.role
                ),
            ));
        }
        if e.content.is_empty() {
            violations.push(violation(
                format!("entries[{i}].content"),
                "EMPTY_CONTENT",
                "content must not be empty",
            ));
        } else if e.content.len() > limits.max_content_bytes as usize {
            violations.push(violation(
                format!("entries[{i}].content"),
                "CONTENT_TOO_LARGE",
                format!(
                    "content is {} bytes; at most {} are allowed",
                    e.content.len(),
                    limits.max_content_bytes
                ),
            ));
        }
        let client_entry_id = match e.client_entry_id.as_str() {
            "" => None,
            id if id.chars().count() > MAX_CLIENT_ENTRY_ID || id.chars().any(char::is_control) => {
                violations.push(violation(
                    format!("entries[{i}].client_entry_id"),
                    "INVALID_CLIENT_ENTRY_ID",
                    format!(
                        "client_entry_id must be at most {MAX_CLIENT_ENTRY_ID} characters with no control characters"
                    ),
                ));
                None
            }
            _ => Some(e.client_entry_id),
        };
        let occurred_at = match &e.occurred_at {
            None => None,
            Some(ts) => match millis(ts).filter(|m| m.0 >= 0) {
                None => {
                    violations.push(violation(
                        format!("entries[{i}].occurred_at"),
                        "INVALID_TIMESTAMP",
                        "not a valid timestamp (from 1970 on)",
                    ));
                    None
                }
                Some(at) if at > latest => {
                    violations.push(violation(
                        format!("entries[{i}].occurred_at"),
                        "OCCURRED_IN_FUTURE",
                        format!(
                            "{} ms past the server's clock; at most {} ms ahead is taken (limits.max_clock_skew)",
                            at.0 - now.0,
                            skew_ms
                        ),
                    ));
                    None
                }
                at => at,
            },
        };
        let name = match e.name.as_str() {
            "" => None,
            n if !is_speaker_name(n) => {
                violations.push(violation(
                    format!("entries[{i}].name"),
                    "INVALID_NAME",
                    format!(
                        "a name is 1 to {MAX_NAME_CHARS} characters, not a role's (user, assistant, system, tool), with no control characters, line breaks, ( ) : or space at either end"
                    ),
                ));
                None
            }
            _ => Some(e.name),
        };
        check_metadata(
            &e.metadata,
            &format!("entries[{i}].metadata"),
            &mut violations,
        );
        if let Some(role) = role {
            entries.push(NewEntry {
                client_entry_id,
                role,
                content: e.content,
                occurred_at,
                name,
                metadata: e.metadata.into_iter().collect(),
            });
        }
    }
    match session {
        Ok(session) if violations.is_empty() => Ok((session, subject, entries)),
        _ => Err(invalid(violations)),
    }
}

/// Whether `name` may name a speaker. A recap labels a line with its
/// speaker's name where the entry has one and its role where not
/// (`Tom (14 Nov 2023 09:12): ...`, `assistant: ...`): a name that is a
/// role, or that holds the label's own punctuation or a line break, could
/// pass one speaker's words off as another's turn.
fn is_speaker_name(name: &str) -> bool {
    let count = name.chars().count();
    (1..=MAX_NAME_CHARS).contains(&count)
        && name.trim() == name
        && !name
            .chars()
            .any(|c| c.is_control() || matches!(c, '(' | ')' | ':' | '\u{2028}' | '\u{2029}'))
        && crate::model::Role::parse(&name.to_ascii_lowercase()).is_none()
}

/// Checks an entry's (or a filter's) metadata pairs: at most
/// `MAX_METADATA_PAIRS`, keys 1 to 64 of `[A-Za-z0-9_.-]`, values at most
/// 256 bytes with no NUL.
pub(super) fn check_metadata(
    metadata: &std::collections::HashMap<String, String>,
    field: &str,
    violations: &mut Vec<FieldViolation>,
) {
    if metadata.len() > MAX_METADATA_PAIRS {
        violations.push(violation(
            field,
            "TOO_MANY_METADATA_PAIRS",
            format!(
                "{} pairs; at most {MAX_METADATA_PAIRS} are allowed",
                metadata.len()
            ),
        ));
        return;
    }
    // In key order, so the violations named are the same for the same map.
    let mut keys: Vec<&String> = metadata.keys().collect();
    keys.sort();
    for key in keys {
        if !metadata_key_ok(key) {
            violations.push(violation(
                field,
                "INVALID_METADATA_KEY",
                format!(
                    "key {:?}: a key is 1 to {MAX_METADATA_KEY} of letters, digits and . _ -",
                    crate::text::prefix(key, MAX_METADATA_KEY)
                ),
            ));
        } else if !metadata_value_ok(&metadata[key]) {
            violations.push(violation(
                format!("{field}[{key}]"),
                "INVALID_METADATA_VALUE",
                format!("a value is at most {MAX_METADATA_VALUE} bytes, with no NUL"),
            ));
        }
    }
}

/// Page tokens are opaque to callers: `p1.` and the last id served.
pub(super) fn page_token(after: u64) -> String {
    format!("p1.{after}")
}

fn parse_page_token(token: &str) -> Option<u64> {
    if token.is_empty() {
        return Some(0);
    }
    let after: u64 = token.strip_prefix("p1.")?.parse().ok()?;
    (after <= i64::MAX as u64).then_some(after)
}

/// A ListSegments request, checked: the filter, the id to continue after,
/// and the page size.
pub(super) fn parse_list(
    req: pb::ListSegmentsRequest,
) -> Result<(SegmentFilter, SegmentId, u32), Status> {
    let mut violations = Vec::new();
    let session = optional_session(&req.session_id, &mut violations);
    // However long the list, at most the four states come out of it, in
    // one order: a caller repeating values cannot make the query (or the
    // store's statement cache) grow with its request.
    let mut states = Vec::new();
    for (i, raw) in req.states.iter().enumerate() {
        match state_from_pb(*raw) {
            Some(s) if !states.contains(&s) => states.push(s),
            Some(_) => {}
            None if violations.len() < MAX_LISTED_VIOLATIONS => violations.push(violation(
                format!("states[{i}]"),
                "UNKNOWN_STATE",
                format!("{raw} is not a segment state"),
            )),
            None => {}
        }
    }
    states.sort_by_key(|s| s.code());
    if req.levels.len() > MAX_LEVEL as usize {
        violations.push(violation(
            "levels",
            "TOO_MANY_LEVELS",
            format!(
                "{} levels named; there are at most {MAX_LEVEL}",
                req.levels.len()
            ),
        ));
    }
    let mut levels = Vec::new();
    for (i, level) in req.levels.iter().enumerate().take(MAX_LEVEL as usize) {
        if *level == 0 || *level > MAX_LEVEL {
            violations.push(violation(
                format!("levels[{i}]"),
                "INVALID_LEVEL",
                format!("{level} is not a level of the memory tree (1 to {MAX_LEVEL})"),
            ));
        } else if !levels.contains(level) {
            levels.push(*level);
        }
    }
    if levels.is_empty() {
        // What v1 clients expect: segments of entries.
        levels.push(1);
    }
    let after = match parse_page_token(&req.page_token) {
        Some(after) => after,
        None => {
            violations.push(violation(
                "page_token",
                "INVALID_PAGE_TOKEN",
                "not a page token this service issued",
            ));
            0
        }
    };
    if !violations.is_empty() {
        return Err(invalid(violations));
    }
    let page_size = page_size(req.page_size, DEFAULT_PAGE_SIZE);
    let filter = SegmentFilter {
        session,
        states,
        ids: Vec::new(),
        levels,
    };
    Ok((filter, after, page_size))
}

/// Session page tokens: `n1.` and the last session id served.
pub(super) fn session_page_token(after: &SessionName) -> String {
    format!("n1.{after}")
}

/// A ListSessions request, checked: the subject whose sessions it lists
/// (none: all), the session id to continue after, and the page size.
pub(super) fn parse_list_sessions(
    req: &pb::ListSessionsRequest,
) -> Result<(Option<Subject>, Option<SessionName>, u32), Status> {
    let mut violations = Vec::new();
    let subject = optional_subject(&req.subject, &mut violations);
    if !violations.is_empty() {
        return Err(invalid(violations));
    }
    let after = match req.page_token.as_str() {
        "" => None,
        token => match token
            .strip_prefix("n1.")
            .and_then(|name| SessionName::parse(name).ok())
        {
            Some(name) => Some(name),
            None => {
                return Err(invalid(vec![violation(
                    "page_token",
                    "INVALID_PAGE_TOKEN",
                    "not a page token this service issued",
                )]));
            }
        },
    };
    Ok((subject, after, page_size(req.page_size, DEFAULT_PAGE_SIZE)))
}

/// A ListEntries request, checked: the session, the seq to continue after
/// (any: past the newest entry the page is empty) and the page size.
pub(super) fn parse_list_entries(
    req: &pb::ListEntriesRequest,
) -> Result<(SessionName, u64, u32), Status> {
    let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
    let page_size = page_size(req.page_size, DEFAULT_ENTRIES_PAGE_SIZE);
    Ok((session, req.after_seq, page_size))
}

/// A requested page size: 0 is the listing's default, and anything past
/// the cap is read as the cap.
fn page_size(requested: u32, default: u32) -> u32 {
    match requested {
        0 => default,
        n => n.min(MAX_PAGE_SIZE),
    }
}

/// A RequeueSegments request, checked: the session (if named) and the ids.
pub(super) fn parse_requeue(
    req: &pb::RequeueSegmentsRequest,
) -> Result<Option<SessionName>, Status> {
    let mut violations = Vec::new();
    let session = optional_session(&req.session_id, &mut violations);
    if req.segment_ids.len() > MAX_REQUEUE_IDS {
        violations.push(violation(
            "segment_ids",
            "TOO_MANY_SEGMENT_IDS",
            format!(
                "{} ids in one call; at most {MAX_REQUEUE_IDS} are allowed (leave it empty to match every segment)",
                req.segment_ids.len()
            ),
        ));
    }
    match violations.is_empty() {
        true => Ok(session),
        false => Err(invalid(violations)),
    }
}

/// A session id that may be left empty (meaning every session).
fn optional_session(raw: &str, violations: &mut Vec<FieldViolation>) -> Option<SessionName> {
    match raw {
        "" => None,
        raw => match parse_session(raw, "session_id") {
            Ok(s) => Some(s),
            Err(v) => {
                violations.extend(v);
                None
            }
        },
    }
}

/// The instant the caller stops waiting, from its `grpc-timeout` header,
/// less a margin so the answer gets back in time.
pub(super) fn call_deadline<T>(request: &Request<T>) -> Option<Instant> {
    let raw = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(raw)?;
    Some(Instant::now() + timeout.saturating_sub(DEADLINE_MARGIN))
}

/// `grpc-timeout` is at most 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    if raw.len() < 2 || raw.len() > 9 {
        return None;
    }
    let (digits, unit) = raw.split_at(raw.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

const DEFAULT_SEARCH_LIMIT: u32 = 10;
const MAX_SEARCH_LIMIT: u32 = 100;
/// Most session ids one Search may name.
const MAX_SEARCH_SESSIONS: usize = 1000;
/// Most roles one Search may name: four exist, so more only repeat them.
const MAX_SEARCH_ROLES: usize = 16;
/// Most levels one Search may name: 0 (entries) to `MAX_LEVEL`.
const MAX_SEARCH_LEVELS: usize = MAX_LEVEL as usize + 1;

/// A timestamp as milliseconds since the epoch, if it is one.
fn millis(ts: &prost_types::Timestamp) -> Option<crate::model::Millis> {
    let ms = ts
        .seconds
        .checked_mul(1000)?
        .checked_add(i64::from(ts.nanos) / 1_000_000)?;
    (0..1_000_000_000)
        .contains(&ts.nanos)
        .then_some(crate::model::Millis(ms))
}

/// A Search request, checked: the parsed query, the scope, the limit and
/// whether the semantic leg was asked for alone.
/// A search's query, or its violation added to `violations`.
fn parse_query(
    raw: &str,
    violations: &mut Vec<FieldViolation>,
) -> Option<crate::search::query::Query> {
    use crate::search::query::{MAX_QUERY_BYTES, Query, QueryError};
    match Query::parse(raw) {
        Ok(q) => Some(q),
        Err(QueryError::TooLong) => {
            violations.push(violation(
                "query",
                "QUERY_TOO_LONG",
                format!(
                    "the query is {} bytes, over the cap of {MAX_QUERY_BYTES}",
                    raw.len()
                ),
            ));
            None
        }
        Err(QueryError::NoWords) => {
            violations.push(violation(
                "query",
                "EMPTY_QUERY",
                "the query has no word to look for (letters or digits, not only excluded ones)",
            ));
            None
        }
    }
}

/// A `min_similarity`'s violation, added to `violations`, when it is no
/// cosine.
fn check_min_similarity(min_similarity: Option<f32>, violations: &mut Vec<FieldViolation>) {
    if let Some(problem) = min_similarity.and_then(crate::model::min_similarity_problem) {
        violations.push(violation(
            "min_similarity",
            "INVALID_MIN_SIMILARITY",
            problem,
        ));
    }
}

/// GetContext's session, and its recall when it has a query: the query
/// and the recall's `min_similarity`. A query past the cap is refused as
/// Search's is; one with no word to look for ("👍", "...") is no query: a
/// host passes the user's message, whatever it is. `min_similarity` is
/// checked with or without a query, so a bad one is never silently kept.
pub(super) fn parse_get_context(
    req: &pb::GetContextRequest,
) -> Result<(SessionName, Option<crate::service::Recall>), Status> {
    let mut violations = match parse_session(&req.session_id, "session_id") {
        Ok(_) => Vec::new(),
        Err(v) => v,
    };
    let query = match crate::search::query::Query::parse(&req.query) {
        _ if req.query.is_empty() => None,
        Err(crate::search::query::QueryError::NoWords) => None,
        _ => parse_query(&req.query, &mut violations),
    };
    check_min_similarity(req.min_similarity, &mut violations);
    let recall = query.map(|query| crate::service::Recall {
        query,
        min_similarity: req.min_similarity,
    });
    match SessionName::parse(&req.session_id) {
        Ok(session) if violations.is_empty() => Ok((session, recall)),
        _ => Err(invalid(violations)),
    }
}

pub(super) fn parse_search(
    req: &pb::SearchRequest,
) -> Result<(crate::search::query::Query, crate::store::SearchScope, u32), Status> {
    let mut violations = Vec::new();
    let query = parse_query(&req.query, &mut violations);
    if pb::SearchMode::try_from(req.mode).is_err() {
        violations.push(violation(
            "mode",
            "INVALID_MODE",
            format!("{} is no SearchMode", req.mode),
        ));
    }
    if req.session_ids.len() > MAX_SEARCH_SESSIONS {
        violations.push(violation(
            "session_ids",
            "TOO_MANY_SESSIONS",
            format!(
                "{} session ids, over the cap of {MAX_SEARCH_SESSIONS}",
                req.session_ids.len()
            ),
        ));
    }
    let mut sessions = Vec::new();
    for (i, raw) in req.session_ids.iter().take(MAX_SEARCH_SESSIONS).enumerate() {
        match parse_session(raw, &format!("session_ids[{i}]")) {
            Ok(s) if !sessions.contains(&s) => sessions.push(s),
            Ok(_) => {}
            Err(v) if violations.len() < MAX_LISTED_VIOLATIONS => violations.extend(v),
            Err(_) => {}
        }
    }
    let subject = optional_subject(&req.subject, &mut violations);
    let mut time = |field: &str, ts: &Option<prost_types::Timestamp>| match ts {
        None => None,
        Some(ts) => {
            let m = millis(ts);
            if m.is_none() {
                violations.push(violation(
                    field,
                    "INVALID_TIMESTAMP",
                    "not a valid timestamp",
                ));
            }
            m
        }
    };
    let after = time("after", &req.after);
    let before = time("before", &req.before);
    // Repeated filters are bounded and deduplicated here, so what reaches
    // the legs (and their per-text checks) is a handful of values, never a
    // caller's millions.
    for (field, reason, named, cap) in [
        ("roles", "TOO_MANY_ROLES", req.roles.len(), MAX_SEARCH_ROLES),
        (
            "levels",
            "TOO_MANY_LEVELS",
            req.levels.len(),
            MAX_SEARCH_LEVELS,
        ),
    ] {
        if named > cap {
            violations.push(violation(
                field,
                reason,
                format!("{named} {field} named, over the cap of {cap}"),
            ));
        }
    }
    let mut roles = Vec::new();
    for (i, raw) in req.roles.iter().take(MAX_SEARCH_ROLES).enumerate() {
        match role_from_pb(*raw) {
            Some(r) if !roles.contains(&r) => roles.push(r),
            Some(_) => {}
            None => violations.push(violation(
                format!("roles[{i}]"),
                "INVALID_ROLE",
                format!("{raw} is no role"),
            )),
        }
    }
    let mut levels = Vec::new();
    for (i, level) in req.levels.iter().take(MAX_SEARCH_LEVELS).enumerate() {
        if *level > MAX_LEVEL {
            violations.push(violation(
                format!("levels[{i}]"),
                "INVALID_LEVEL",
                format!("level {level} is past the deepest, {MAX_LEVEL}"),
            ));
        } else if !levels.contains(level) {
            levels.push(*level);
        }
    }
    check_metadata(&req.metadata, "metadata", &mut violations);
    check_min_similarity(req.min_similarity, &mut violations);
    violations.truncate(MAX_LISTED_VIOLATIONS);
    let Some(query) = query.filter(|_| violations.is_empty()) else {
        return Err(invalid(violations));
    };
    let limit = match req.limit {
        0 => DEFAULT_SEARCH_LIMIT,
        n => n.min(MAX_SEARCH_LIMIT),
    };
    let scope = crate::store::SearchScope {
        sessions,
        subject,
        after,
        before,
        roles,
        levels,
        metadata: req
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        min_similarity: req.min_similarity,
    };
    Ok((query, scope, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("10Q"), None);
    }

    #[test]
    fn repeated_states_come_out_once_each_in_one_order() {
        let many = pb::ListSegmentsRequest {
            states: [4, 2, 2, 4, 2]
                .into_iter()
                .cycle()
                .take(1_000_000)
                .collect(),
            ..Default::default()
        };
        let (filter, _, _) = parse_list(many).expect("valid");
        assert_eq!(
            filter.states,
            vec![
                crate::model::SegmentState::Pending,
                crate::model::SegmentState::Parked
            ]
        );
        let bad = pb::ListSegmentsRequest {
            states: vec![99; 1_000_000],
            ..Default::default()
        };
        let status = parse_list(bad).expect_err("unknown states");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        use tonic_types::StatusExt;
        let listed = status
            .get_error_details()
            .bad_request()
            .map_or(0, |b| b.field_violations.len());
        assert_eq!(listed, MAX_LISTED_VIOLATIONS);
    }

    #[test]
    fn page_tokens_round_trip_and_reject_strangers() {
        assert_eq!(parse_page_token(&page_token(42)), Some(42));
        assert_eq!(parse_page_token(""), Some(0));
        assert_eq!(parse_page_token("42"), None);
        assert_eq!(parse_page_token("p1.-3"), None);
        assert_eq!(parse_page_token("p1.18446744073709551615"), None);
    }
}

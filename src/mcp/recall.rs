//! The `recall` tool: a search over the tenant's memory (Search), its hits
//! best first, each pointing back at the session and seq range it came
//! from, within the answer cap.

use std::collections::BTreeMap;

use rmcp::model::{CallToolResult, JsonObject};
use schemars::JsonSchema;
use serde::Serialize;

use super::answer::{Cut, Room, cost, quoted, shorten, success};
use super::args::{DEFAULT_RECALL_LIMIT, ModeArg, RecallArgs};
use super::error::ToolError;
use super::handler::Backend;
use crate::pb;
use crate::text::count;
use crate::wire::{role_from_pb, role_to_pb};

pub(super) const RECALL: &str = "recall";

pub(super) const RECALL_DESCRIPTION: &str = "Search long-term memory for what was said: across every session, or only some (session_ids) or one subject's, optionally within a time window, by role, or by kind (messages, recaps). \
Use it when the user refers to something from an earlier conversation, or before answering a question the memory may hold. \
The query works like a web search: words, \"an exact phrase\", `or`, -word. \
Hits come best first, each a message or a recap with its session_id and seq range; read around a hit with context.";

/// `recall`'s answer.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub(super) struct RecallOutput {
    pub query: String,
    /// Best first.
    pub hits: Vec<Hit>,
    /// How the search matched: lexical (by words), semantic (by meaning).
    pub matched_by: Vec<String>,
    /// The share of the searched texts that have an embedding (0 without
    /// embeddings): below 1, a semantic match may miss the rest.
    pub embedded_share: f64,
    /// Set when this answer left hits out or shortened them to stay within
    /// this server's answer cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
}

/// A message, or a recap, that matched.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub(super) struct Hit {
    pub session_id: String,
    /// message, or recap.
    pub kind: &'static str,
    /// 0 a message, 1 a recap of messages, 2 and up a recap of recaps.
    pub level: u32,
    /// The message's seq, or the first the recap covers.
    pub first_seq: u64,
    pub last_seq: u64,
    /// A message's role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// When it was stored, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// A message's speaker, when one was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it was said (a recap: its last message), RFC 3339, when that
    /// differs from when it was stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occurred_at: Option<String>,
    /// A message's metadata, as given at remember.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Higher is better; comparable within one answer only.
    pub score: f64,
    pub text: String,
    /// lexical, semantic, or both.
    pub matched_by: Vec<String>,
    /// The cosine to the query, when meaning matched it (-1 to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f32>,
}

pub(super) async fn recall(
    backend: &Backend,
    args: Option<JsonObject>,
) -> Result<CallToolResult, ToolError> {
    let args = backend.parse::<RecallArgs>(args)?;
    let request = pb::SearchRequest {
        query: args.query.clone(),
        session_ids: args.session_ids.clone().unwrap_or_default(),
        subject: args.subject.clone().unwrap_or_default(),
        after: args.after.as_deref().and_then(timestamp),
        before: args.before.as_deref().and_then(timestamp),
        roles: args
            .roles
            .iter()
            .flatten()
            .map(|r| role_to_pb(r.role()) as i32)
            .collect(),
        levels: args.levels.clone().unwrap_or_default(),
        limit: args.limit.unwrap_or(DEFAULT_RECALL_LIMIT),
        mode: match args.mode.unwrap_or(ModeArg::Auto) {
            ModeArg::Auto => pb::SearchMode::Auto,
            ModeArg::Lexical => pb::SearchMode::Lexical,
            ModeArg::Semantic => pb::SearchMode::Semantic,
        } as i32,
        metadata: args
            .metadata
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        min_similarity: args.min_similarity,
    };
    let mut client = backend.client().await?;
    let resp = client
        .search(backend.request(request))
        .await
        .map_err(|s| backend.status(&s, RECALL))?
        .into_inner();
    let hits: Vec<Hit> = resp.hits.into_iter().map(hit).collect();
    let header = format!(
        "{} for {:?}, best first:",
        count(hits.len() as u64, "hit", "hits"),
        args.query
    );
    // A hit is a pointer into memory, not the memory itself: each is kept
    // short enough that several fit, and the lowest ranked go first.
    let mut room = Room::new(backend.max_answer_bytes, header.len() + 600);
    let per_hit = room.per_item() / 2;
    let mut kept: Vec<(Hit, String)> = Vec::new();
    let mut shortened = 0;
    for mut h in hits.iter().cloned() {
        if let Some(cut) = shorten(&h.text, per_hit) {
            h.text = cut;
            shortened += 1;
        }
        let line = hit_line(kept.len() + 1, &h);
        if !room.take(cost(&line, &h)) {
            break;
        }
        kept.push((h, line));
    }
    let left_out = hits.len() - kept.len();
    let cut = (left_out > 0 || shortened > 0).then(|| Cut {
        left_out,
        shortened,
        note: format!(
            "{} left out and {} shortened to keep this answer within {} bytes; a smaller limit or a narrower query gives fewer, and context reads a hit's session whole",
            count(left_out as u64, "lower-ranked hit", "lower-ranked hits"),
            count(shortened as u64, "hit", "hits"),
            backend.max_answer_bytes
        ),
    });
    let matched_by: Vec<String> = resp.legs.iter().map(|l| leg(*l).to_owned()).collect();
    let mut text = match hits.is_empty() {
        true => format!(
            "Nothing found for {:?}: try other words, fewer of them, or `or` between alternatives.",
            args.query
        ),
        false => header,
    };
    if resp.embedded_share > 0.0 && resp.embedded_share < 1.0 {
        text.push_str(&format!(
            " ({:.0}% of the searched texts have embeddings so far.)",
            resp.embedded_share * 100.0
        ));
    }
    if let Some(cut) = &cut {
        text.push_str(&format!(" Cut: {}.", cut.note));
    }
    for (_, line) in &kept {
        text.push('\n');
        text.push_str(line);
    }
    let out = RecallOutput {
        query: args.query,
        hits: kept.into_iter().map(|(h, _)| h).collect(),
        matched_by,
        embedded_share: resp.embedded_share,
        cut,
    };
    Ok(success(text, &out))
}

fn hit(h: pb::SearchHit) -> Hit {
    let role = match h.level {
        0 => role_from_pb(h.role).map(|r| r.as_str().to_owned()),
        _ => None,
    };
    Hit {
        kind: if h.level == 0 { "message" } else { "recap" },
        session_id: h.session_id,
        level: h.level,
        first_seq: h.first_seq,
        last_seq: h.last_seq,
        role,
        created_at: h.created_at.as_ref().and_then(super::tools::rfc3339),
        name: (!h.name.is_empty()).then_some(h.name),
        occurred_at: h
            .occurred_at
            .as_ref()
            .filter(|at| h.created_at.as_ref() != Some(*at))
            .and_then(super::tools::rfc3339),
        metadata: h.metadata.into_iter().collect(),
        score: h.score,
        text: h.text,
        matched_by: h.legs.iter().map(|l| leg(*l).to_owned()).collect(),
        similarity: (h.semantic_rank > 0).then_some(h.similarity),
    }
}

fn leg(raw: i32) -> &'static str {
    match pb::SearchLeg::try_from(raw) {
        Ok(pb::SearchLeg::Lexical) => "lexical",
        Ok(pb::SearchLeg::Semantic) => "semantic",
        Ok(pb::SearchLeg::Unspecified) | Err(_) => "unknown",
    }
}

/// One hit as a model reads it: where it is, then its text, quoted.
fn hit_line(rank: usize, h: &Hit) -> String {
    let text = quoted(&h.text);
    let at = match (&h.occurred_at, &h.created_at) {
        (Some(said), _) => format!(", said {said}"),
        (None, Some(t)) => format!(", {t}"),
        (None, None) => String::new(),
    };
    // A name is quoted like any stored text: it cannot close the bracket.
    let who = h
        .name
        .as_ref()
        .map(|n| format!(" {}", quoted(n)))
        .unwrap_or_default();
    let at = match h.similarity {
        Some(s) => format!("{at}, similarity {s:.2}"),
        None => at,
    };
    match (&h.role, h.level) {
        (Some(role), _) => format!(
            "{rank}. [{} seq {}, {role}{who}{at}] {text}",
            h.session_id, h.first_seq
        ),
        (None, 0) => format!("{rank}. [{} seq {}{at}] {text}", h.session_id, h.first_seq),
        (None, 1) => format!(
            "{rank}. [{} recap of seq {}-{}{at}] {text}",
            h.session_id, h.first_seq, h.last_seq
        ),
        (None, level) => format!(
            "{rank}. [{} recap of seq {}-{}, level {level}{at}] {text}",
            h.session_id, h.first_seq, h.last_seq
        ),
    }
}

/// An RFC 3339 time (as the arguments normalised it) on the wire.
fn timestamp(text: &str) -> Option<prost_types::Timestamp> {
    humantime::parse_rfc3339(text)
        .ok()
        .map(prost_types::Timestamp::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_read_as_lines_that_point_back_into_memory() {
        let message = Hit {
            session_id: "ada".to_owned(),
            kind: "message",
            level: 0,
            first_seq: 7,
            last_seq: 7,
            role: Some("user".to_owned()),
            created_at: Some("2026-12-01T09:00:00Z".to_owned()),
            name: None,
            occurred_at: None,
            metadata: BTreeMap::new(),
            score: 0.016,
            text: "migration 0042 timed out".to_owned(),
            matched_by: vec!["lexical".to_owned()],
            similarity: None,
        };
        assert_eq!(
            hit_line(1, &message),
            r#"1. [ada seq 7, user, 2026-12-01T09:00:00Z] "migration 0042 timed out""#
        );
        let recap = Hit {
            kind: "recap",
            level: 2,
            first_seq: 1,
            last_seq: 200,
            role: None,
            created_at: None,
            ..message.clone()
        };
        assert_eq!(
            hit_line(2, &recap),
            r#"2. [ada recap of seq 1-200, level 2] "migration 0042 timed out""#
        );
        // A speaker is quoted (a name cannot close the bracket), and a
        // history's own time is what the line gives.
        let said = Hit {
            name: Some("Maya] 9. [forged".to_owned()),
            occurred_at: Some("2023-11-14T09:12:00Z".to_owned()),
            ..message.clone()
        };
        assert_eq!(
            hit_line(3, &said),
            r#"3. [ada seq 7, user "Maya] 9. [forged", said 2023-11-14T09:12:00Z] "migration 0042 timed out""#
        );
        let by_meaning = Hit {
            similarity: Some(0.875),
            ..recap
        };
        assert_eq!(
            hit_line(3, &by_meaning),
            r#"3. [ada recap of seq 1-200, level 2, similarity 0.88] "migration 0042 timed out""#
        );
    }
}

//! Plain domain types: sessions, entries, segments, summaries and their
//! states. No I/O here; the store persists these and `wire.rs` converts them
//! to and from the wire.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::failure::Failure;

/// A segment's id: unique across the database, assigned by the store.
pub type SegmentId = u64;

/// Milliseconds since the Unix epoch: how the store keeps every instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Millis(pub i64);

impl Millis {
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Millis(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }

    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Millis(self.0.saturating_add(ms))
    }

    /// How long ago `self` was, as seen at `now` (zero if in the future).
    pub fn age_at(self, now: Millis) -> Duration {
        Duration::from_millis(u64::try_from(now.0.saturating_sub(self.0)).unwrap_or(0))
    }

    pub fn as_system_time(self) -> SystemTime {
        match u64::try_from(self.0) {
            Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
            Err(_) => UNIX_EPOCH,
        }
    }
}

/// The tenant a session belongs to. Until authentication is configured every
/// caller is the default tenant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

/// A caller-chosen session name: 1 to 128 characters of `[A-Za-z0-9._:-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionName(String);

pub const SESSION_NAME_MAX: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionNameError {
    #[error("session id is empty")]
    Empty,
    #[error("session id is {0} characters long; at most {SESSION_NAME_MAX} are allowed")]
    TooLong(usize),
    /// Every character it may not hold, each once, in order.
    #[error("session id contains {}; only letters, digits and . _ : - are allowed", quoted(.0))]
    BadCharacters(Vec<char>),
}

/// `' '`, `' ' and '!'`, `' ', '!' and '/'`.
fn quoted(chars: &[char]) -> String {
    let each: Vec<String> = chars.iter().map(|c| format!("{c:?}")).collect();
    match each.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => each.concat(),
    }
}

impl SessionName {
    pub fn parse(raw: &str) -> Result<Self, SessionNameError> {
        if raw.is_empty() {
            return Err(SessionNameError::Empty);
        }
        let len = raw.chars().count();
        if len > SESSION_NAME_MAX {
            return Err(SessionNameError::TooLong(len));
        }
        let mut bad: Vec<char> = Vec::new();
        for c in raw.chars() {
            let allowed = c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
            if !allowed && !bad.contains(&c) {
                bad.push(c);
            }
        }
        match bad.is_empty() {
            true => Ok(SessionName(raw.to_owned())),
            false => Err(SessionNameError::BadCharacters(bad)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whose memory a session is (a user, a customer): 1 to 256 characters of
/// `[A-Za-z0-9._:@-]`, so an email address or a prefixed id fits. Fixed by
/// the append that creates the session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Subject(String);

pub const SUBJECT_MAX: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    #[error("subject is empty")]
    Empty,
    #[error("subject is {0} characters long; at most {SUBJECT_MAX} are allowed")]
    TooLong(usize),
    /// Every character it may not hold, each once, in order.
    #[error("subject contains {}; only letters, digits and . _ : @ - are allowed", quoted(.0))]
    BadCharacters(Vec<char>),
}

impl Subject {
    pub fn parse(raw: &str) -> Result<Self, SubjectError> {
        if raw.is_empty() {
            return Err(SubjectError::Empty);
        }
        let len = raw.chars().count();
        if len > SUBJECT_MAX {
            return Err(SubjectError::TooLong(len));
        }
        let mut bad: Vec<char> = Vec::new();
        for c in raw.chars() {
            let allowed = c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-');
            if !allowed && !bad.contains(&c) {
                bad.push(c);
            }
        }
        match bad.is_empty() {
            true => Ok(Subject(raw.to_owned())),
            false => Err(SubjectError::BadCharacters(bad)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    System,
    Tool,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::User, Role::Assistant, Role::System, Role::Tool];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
            Role::Tool => "tool",
        }
    }

    /// The store's integer code; stable, never reuse one.
    pub fn code(self) -> i64 {
        match self {
            Role::User => 1,
            Role::Assistant => 2,
            Role::System => 3,
            Role::Tool => 4,
        }
    }

    pub fn from_code(code: i64) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.code() == code)
    }

    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentState {
    Open,
    Pending,
    Summarised,
    Parked,
}

impl SegmentState {
    pub const ALL: [SegmentState; 4] = [
        SegmentState::Open,
        SegmentState::Pending,
        SegmentState::Summarised,
        SegmentState::Parked,
    ];

    /// The store's integer code; stable, never reuse one.
    pub fn code(self) -> i64 {
        match self {
            SegmentState::Open => 1,
            SegmentState::Pending => 2,
            SegmentState::Summarised => 3,
            SegmentState::Parked => 4,
        }
    }

    pub fn from_code(code: i64) -> Option<SegmentState> {
        SegmentState::ALL.into_iter().find(|s| s.code() == code)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SegmentState::Open => "OPEN",
            SegmentState::Pending => "PENDING",
            SegmentState::Summarised => "SUMMARISED",
            SegmentState::Parked => "PARKED",
        }
    }
}

/// An entry's metadata: a few caller-chosen pairs, in key order.
pub type Metadata = std::collections::BTreeMap<String, String>;

/// The bounds of an entry's (or a filter's) metadata: pairs, key length,
/// value bytes (DESIGN, "Time and speakers"), for every edge that takes it.
pub(crate) const MAX_METADATA_PAIRS: usize = 16;
pub(crate) const MAX_METADATA_KEY: usize = 64;
pub(crate) const MAX_METADATA_VALUE: usize = 256;

/// A metadata key: 1 to `MAX_METADATA_KEY` of letters, digits and `. _ -`.
pub(crate) fn metadata_key_ok(key: &str) -> bool {
    (1..=MAX_METADATA_KEY).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A metadata value: at most `MAX_METADATA_VALUE` bytes, with no NUL.
pub(crate) fn metadata_value_ok(value: &str) -> bool {
    value.len() <= MAX_METADATA_VALUE && !value.contains('\0')
}

/// What is wrong with metadata `pairs` (each key, and its value when it
/// is a string), in plain words: every bad pair named, or the count alone
/// when there are too many. For the edges that check before the server.
pub(crate) fn metadata_problems<'a>(
    pairs: impl ExactSizeIterator<Item = (&'a str, Option<&'a str>)>,
) -> Vec<String> {
    if pairs.len() > MAX_METADATA_PAIRS {
        return vec![format!(
            "holds {} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            pairs.len()
        )];
    }
    let mut problems = Vec::new();
    for (key, value) in pairs {
        if !metadata_key_ok(key) {
            problems.push(format!(
                "key {:?} is not 1 to {MAX_METADATA_KEY} of letters, digits and . _ -",
                crate::text::prefix(key, MAX_METADATA_KEY)
            ));
        } else if value.is_some_and(|v| !metadata_value_ok(v)) {
            problems.push(format!(
                "the value of {key:?} is over {MAX_METADATA_VALUE} bytes or holds a NUL"
            ));
        }
    }
    problems
}

/// What is wrong with a `min_similarity` (Search's, the turn's recall),
/// when it is no cosine: for the server's check and the terminal's, so
/// both say the same. NaN is in no range, so it is refused too.
pub(crate) fn min_similarity_problem(min_similarity: f32) -> Option<String> {
    (!(-1.0..=1.0).contains(&min_similarity))
        .then(|| format!("{min_similarity} is no cosine: a similarity is from -1 to 1"))
}

/// An entry as a caller submits it, already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEntry {
    pub client_entry_id: Option<String>,
    pub role: Role,
    pub content: String,
    /// When it was said; `None`: when the server receives it (never before
    /// the session's newest entry).
    pub occurred_at: Option<Millis>,
    /// Who said it.
    pub name: Option<String>,
    pub metadata: Metadata,
}

impl NewEntry {
    /// An entry said now, by nobody named, with no metadata.
    pub fn new(role: Role, content: impl Into<String>) -> NewEntry {
        NewEntry {
            client_entry_id: None,
            role,
            content: content.into(),
            occurred_at: None,
            name: None,
            metadata: Metadata::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub client_entry_id: Option<String>,
    pub role: Role,
    pub content: String,
    pub created_at: Millis,
    pub tokens: u32,
    /// When it was said (`created_at` when the caller gave no time).
    pub occurred_at: Millis,
    pub name: Option<String>,
    pub metadata: Metadata,
}

/// What an append did with one entry of the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub client_entry_id: Option<String>,
    pub duplicate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    pub entries: Vec<Appended>,
    pub open_segment_id: Option<SegmentId>,
    pub closed_segment_ids: Vec<SegmentId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    pub provider: String,
    pub model: String,
    pub prompt_version: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub created_at: Millis,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub id: SegmentId,
    pub session: String,
    pub ordinal: u32,
    pub state: SegmentState,
    pub first_seq: u64,
    pub last_seq: u64,
    pub entry_count: u32,
    pub token_estimate: u32,
    pub summary: Option<Summary>,
    pub attempts: u32,
    pub passes: u32,
    pub last_failure: Option<Failure>,
    pub next_attempt_at: Option<Millis>,
    pub closed_at: Option<Millis>,
    /// 1 for a segment of entries; L + 1 for a roll-up of level-L nodes.
    pub level: u32,
    /// A roll-up's children, oldest first; empty at level 1.
    pub child_ids: Vec<SegmentId>,
    /// When its first and last entries were said (read with the node).
    pub first_occurred_at: Option<Millis>,
    pub last_occurred_at: Option<Millis>,
}

/// The segment's next state after a pass without a recap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// A failed pass: PENDING, due again at `at`.
    Retry { at: Millis },
    /// A failed pass whose class retrying cannot fix: PARKED until a requeue
    /// or a change of provider configuration.
    Park,
    /// A cancelled pass: PENDING and due again (no later than it already
    /// was); not counted as a pass and no failure recorded.
    Release,
}

/// When an open segment closes by itself: whichever bound is reached first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentPolicy {
    pub max_entries: u32,
    pub max_tokens: u32,
    /// A gap longer than this between two entries' `occurred_at` closes
    /// the segment before the later one; `None`: never.
    pub max_gap: Option<Duration>,
}

impl SegmentPolicy {
    pub fn is_full(&self, entries: u32, tokens: u32) -> bool {
        entries >= self.max_entries || tokens >= self.max_tokens
    }

    /// Whether an entry said at `next` starts a new segment after one said
    /// at `last` (the conversation's own clock, so an imported history is
    /// cut where its days are).
    pub fn is_gap(&self, last: Millis, next: Millis) -> bool {
        self.max_gap.is_some_and(|gap| {
            next.0.saturating_sub(last.0) > i64::try_from(gap.as_millis()).unwrap_or(i64::MAX)
        })
    }
}

/// One item of an agent's context: the recalled ones first, best first,
/// then the cover, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub enum ContextItem {
    Summary {
        segment_id: SegmentId,
        level: u32,
        first_seq: u64,
        last_seq: u64,
        summary: Summary,
        /// When the first and last entries it covers were said.
        said: (Option<Millis>, Option<Millis>),
    },
    Entry(Entry),
    /// A text recalled for the call's query.
    Recalled(Recalled),
}

impl ContextItem {
    pub fn tokens(&self) -> u32 {
        match self {
            ContextItem::Summary { summary, .. } => estimate_tokens(&summary.text),
            ContextItem::Entry(entry) => entry.tokens,
            ContextItem::Recalled(hit) => estimate_tokens(&hit.text),
        }
    }
}

/// A search hit a context carries for its query: an entry (level 0) or a
/// node's summary, of the session or another of its subject.
#[derive(Clone, Debug, PartialEq)]
pub struct Recalled {
    pub session: String,
    pub level: u32,
    pub first_seq: u64,
    pub last_seq: u64,
    /// The node whose summary this is; None for an entry.
    pub segment_id: Option<SegmentId>,
    /// An entry's role (a summary has none).
    pub role: Option<Role>,
    /// An entry's speaker (a summary has none).
    pub name: Option<String>,
    /// When an entry was said; a summary's last entry's.
    pub occurred_at: Millis,
    pub text: String,
    /// Search's fused reciprocal-rank score.
    pub score: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    pub items: Vec<ContextItem>,
    pub truncated: bool,
    pub tokens: u32,
}

/// One session as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub name: String,
    /// Whose memory it is, if the append that created it said.
    pub subject: Option<String>,
    /// Entries stored in the session.
    pub entry_count: u64,
    /// The seq of its newest entry (0 when it has none).
    pub last_seq: u64,
    pub open_segment_id: Option<SegmentId>,
    /// Its segments still owed a recap, and those parked.
    pub pending: u64,
    pub parked: u64,
    pub created_at: Millis,
    pub last_append_at: Millis,
}

/// Which provider a run summarises with: kind, base URL (with any
/// credentials removed) and model. Never the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderIdentity {
    pub kind: String,
    /// Empty for a provider that calls no endpoint (extractive).
    pub base_url: String,
    pub model: String,
}

impl fmt::Display for ProviderIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.base_url.is_empty() {
            write!(f, "{} (model {})", self.kind, self.model)
        } else {
            write!(
                f,
                "{} at {} (model {})",
                self.kind, self.base_url, self.model
            )
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backlog {
    pub open: u64,
    pub pending: u64,
    pub summarised: u64,
    pub parked: u64,
    pub oldest_pending_age: Option<Duration>,
    pub parked_by_class: Vec<(String, u64)>,
    /// Erasures committed whose text a checkpoint has yet to scrub from
    /// the SQLite files (always 0 on PostgreSQL).
    pub erasures_pending: u64,
    /// What is owed an embedding (all zero with embeddings off).
    pub embeddings: EmbeddingBacklog,
    /// Entries stored and not in the search index yet (SQLite's tail,
    /// indexed just behind the appends; Search indexes its tenant's before
    /// it reads, so it finds them all the same). Always 0 on PostgreSQL.
    pub unindexed: u64,
    /// How long the oldest of them has waited.
    pub oldest_unindexed_age: Option<Duration>,
}

/// Entries and summaries owed a vector of the active generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmbeddingBacklog {
    /// Owed and not parked (due now or later).
    pub pending: u64,
    pub parked: u64,
    pub parked_by_class: Vec<(String, u64)>,
    /// Items with a vector of the active generation.
    pub embedded: u64,
    /// The failure of the most recent embedding pass that failed, while
    /// any item it was for is still owed.
    pub last_failure: Option<crate::failure::Failure>,
    /// Of `pending`: put off past now by the embedder (rate limited, with
    /// its Retry-After, or out of quota).
    pub deferred: u64,
}

/// Which vectors compare with which: the model and the dimensions asked
/// for (0: the model's own). A change of either starts a new generation;
/// vectors of one generation are never compared with another's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Generation(String);

impl Generation {
    pub fn new(model: &str, dimensions: u32) -> Generation {
        Generation(format!("{model}@{dimensions}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A rough token count: about four bytes of text a token, plus a few for the
/// role and framing of a message. Good enough for budgets; no tokenizer is
/// loaded, so it works the same for every provider.
pub fn estimate_tokens(text: &str) -> u32 {
    let bytes = u32::try_from(text.len()).unwrap_or(u32::MAX);
    bytes.div_ceil(4).saturating_add(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked() {
        assert!(Subject::parse("user:ada@example.com").is_ok());
        assert!(Subject::parse(&"a".repeat(256)).is_ok());
        assert_eq!(Subject::parse(""), Err(SubjectError::Empty));
        assert_eq!(
            Subject::parse(&"a".repeat(257)),
            Err(SubjectError::TooLong(257))
        );
        assert_eq!(
            Subject::parse("ada lovelace/1"),
            Err(SubjectError::BadCharacters(vec![' ', '/']))
        );
    }

    #[test]
    fn session_names_are_checked() {
        assert!(SessionName::parse("agent-1:run_2.a").is_ok());
        assert_eq!(SessionName::parse(""), Err(SessionNameError::Empty));
        assert_eq!(
            SessionName::parse(&"a".repeat(129)),
            Err(SessionNameError::TooLong(129))
        );
        assert!(SessionName::parse(&"a".repeat(128)).is_ok());
        assert_eq!(
            SessionName::parse("a b"),
            Err(SessionNameError::BadCharacters(vec![' ']))
        );
        assert_eq!(
            SessionName::parse("é"),
            Err(SessionNameError::BadCharacters(vec!['é']))
        );
        let every = SessionName::parse("bad id! no/way!").expect_err("refused");
        assert_eq!(every, SessionNameError::BadCharacters(vec![' ', '!', '/']));
        assert_eq!(
            every.to_string(),
            "session id contains ' ', '!' and '/'; only letters, digits and . _ : - are allowed"
        );
    }

    #[test]
    fn codes_round_trip() {
        for r in Role::ALL {
            assert_eq!(Role::from_code(r.code()), Some(r));
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        for s in SegmentState::ALL {
            assert_eq!(SegmentState::from_code(s.code()), Some(s));
        }
    }

    #[test]
    fn policy_closes_at_either_bound() {
        let p = SegmentPolicy {
            max_entries: 3,
            max_tokens: 100,
            max_gap: None,
        };
        assert!(!p.is_full(2, 99));
        assert!(p.is_full(3, 10));
        assert!(p.is_full(1, 100));
    }
}

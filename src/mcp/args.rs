//! The tools' arguments: each tool's argument type (whose JSON schema is
//! the tool's input schema), and the reading of a call's JSON arguments
//! into it, every bad field named at once before anything is sent.
//!
//! Arguments are read field by field rather than through serde: a model
//! that sends `sessionId`, a number for a string or `role: "bot"` is told
//! which field, why, and every other mistake of the same call, where a
//! derived `Deserialize` stops at the first with no path.

use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde_json::Value;

use super::error::Violation;
use crate::model::{Role, SessionName, Subject};

/// Most messages one `remember` takes: beyond that a model is pasting a
/// transcript, which an agent host should stream over gRPC instead.
pub(super) const MAX_MESSAGES: usize = 100;
/// The longest a client_entry_id may be (the server's own bound).
const MAX_CLIENT_ENTRY_ID: usize = 128;
/// The longest message text, in UTF-8 bytes: a server's default bound, so
/// a model is told which message before anything is sent.
pub(super) const MAX_CONTENT_BYTES: usize = crate::config::DEFAULT_MAX_CONTENT_BYTES as usize;
/// The most text one `remember` sends: a server's default request bound,
/// less room for the rest of the request (ids, roles, framing).
const MAX_CALL_BYTES: usize = crate::config::DEFAULT_MAX_MESSAGE_BYTES as usize - 64 * 1024;
/// Sessions one `list_sessions` page holds at most.
pub(super) const MAX_PAGE_SIZE: u32 = 100;
pub(super) const DEFAULT_PAGE_SIZE: u32 = 20;
/// The budget `context` asks for when the model names none.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 2000;
/// Most sessions one `recall` may name.
const MAX_RECALL_SESSIONS: usize = 100;
/// Hits one `recall` returns by default, and at most.
pub(super) const DEFAULT_RECALL_LIMIT: u32 = 10;
const MAX_RECALL_LIMIT: u32 = 100;
/// Levels deeper than this cover more than any session holds (fanout 2:
/// 2^63 segments).
const MAX_LEVEL: u32 = 64;
/// A page token is opaque and short; anything longer is not ours.
const MAX_PAGE_TOKEN: usize = 1024;

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(rename_all = "lowercase")]
pub(super) enum RoleArg {
    User,
    Assistant,
    System,
    Tool,
}

impl RoleArg {
    pub(super) fn role(self) -> Role {
        match self {
            RoleArg::User => Role::User,
            RoleArg::Assistant => Role::Assistant,
            RoleArg::System => Role::System,
            RoleArg::Tool => Role::Tool,
        }
    }
}

/// One message to remember.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct MessageArg {
    /// Who said it: user, assistant, system or tool.
    pub role: RoleArg,
    /// The text, exactly as said (not empty; at most 65,536 bytes of UTF-8).
    #[schemars(length(min = 1, max = 65536))]
    pub content: String,
    /// Optional idempotency key, unique within the session (at most 128
    /// characters): sending the same id with the same text again stores it
    /// once, so a retry after a timeout is safe.
    #[schemars(length(min = 1, max = 128))]
    pub client_entry_id: Option<String>,
}

/// `remember`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct RememberArgs {
    /// The session (one conversation's memory) to add to: 1 to 128
    /// characters of letters, digits and . _ : -. A new id starts a new
    /// session. Without it, the subject's session of the day
    /// (<subject>:<YYYY-MM-DD>, in UTC), or without a subject the day's
    /// (<YYYY-MM-DD>); the answer names it.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    pub session_id: Option<String>,
    /// What to remember, oldest first: 1 to 100 messages.
    #[schemars(length(min = 1, max = 100))]
    pub messages: Vec<MessageArg>,
    /// Whose memory this is (a user, a customer: 1 to 256 characters of
    /// letters, digits and . _ : @ -), to find their sessions later. Fixed
    /// by the first remember of a session: another one later is refused.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"))]
    pub subject: Option<String>,
}

/// `context`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct ContextArgs {
    /// The session to read.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    pub session_id: String,
    /// The most tokens (about four characters each) the memory may take
    /// in your prompt; default 2000. Older history is zoomed out to recaps
    /// to fit, and the newest turns come verbatim.
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
}

/// `list_sessions`' arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct ListSessionsArgs {
    /// Sessions per page, 1 to 100; default 20.
    #[schemars(range(min = 1, max = 100))]
    pub page_size: Option<u32>,
    /// The next_page_token of the previous page, to read on.
    pub page_token: Option<String>,
    /// Only the sessions of this subject.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"))]
    pub subject: Option<String>,
}

/// How `recall` looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(rename_all = "lowercase")]
pub(super) enum ModeArg {
    /// By words and by meaning where the server has embeddings on; by
    /// words otherwise.
    Auto,
    /// By words only.
    Lexical,
    /// By meaning only (needs embeddings on the server).
    Semantic,
}

/// `recall`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct RecallArgs {
    /// What to look for, as in a web search: words (all of them match
    /// best), "an exact phrase", `or` between alternatives, -word to
    /// exclude. At most 4096 bytes.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// Only these sessions (at most 100); with neither this nor subject,
    /// every session of this memory.
    #[schemars(length(max = 100))]
    pub session_ids: Option<Vec<String>>,
    /// Only the sessions of this subject.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"))]
    pub subject: Option<String>,
    /// Only what was stored after this time: RFC 3339
    /// (2026-11-30T09:00:00Z) or a date (2026-11-30, midnight UTC).
    pub after: Option<String>,
    /// Only what was stored before this time, written as for after.
    pub before: Option<String>,
    /// Only messages of these roles (recaps have none, so naming roles
    /// leaves recaps out).
    pub roles: Option<Vec<RoleArg>>,
    /// What to search: 0 messages, 1 recaps of messages, 2 and up recaps
    /// of recaps; default messages and recaps (0 and 1).
    #[schemars(length(max = 16))]
    pub levels: Option<Vec<u32>>,
    /// The most hits, best first: 1 to 100, default 10.
    #[schemars(range(min = 1, max = 100))]
    pub limit: Option<u32>,
    /// How to match: auto (default), lexical or semantic.
    pub mode: Option<ModeArg>,
}

/// `forget`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct ForgetArgs {
    /// The session to erase, with everything remembered in it.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"))]
    pub session_id: String,
}

/// `forget_subject`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(super) struct ForgetSubjectArgs {
    /// The subject whose every session is erased, with everything
    /// remembered in them.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"))]
    pub subject: String,
}

/// A tool's arguments, read from the JSON a call sent.
pub(super) trait FromArgs: Sized {
    /// Every field the tool takes: any other is a violation.
    const FIELDS: &'static [&'static str];
    fn read(reader: &mut Reader) -> Option<Self>;

    /// The arguments, or every violation in them.
    fn parse(arguments: Option<JsonObject>) -> Result<Self, Vec<Violation>> {
        let mut reader = Reader::new(arguments.unwrap_or_default(), "");
        let value = Self::read(&mut reader);
        reader.finish(Self::FIELDS);
        match (value, reader.violations.is_empty()) {
            (Some(value), true) => Ok(value),
            _ => Err(reader.violations),
        }
    }
}

impl FromArgs for RememberArgs {
    const FIELDS: &'static [&'static str] = &["session_id", "messages", "subject"];

    fn read(r: &mut Reader) -> Option<Self> {
        let session_id = r.opt_session_id("session_id");
        let messages = r.array("messages", 1, MAX_MESSAGES).map(|items| {
            items
                .into_iter()
                .enumerate()
                .filter_map(|(i, item)| r.message(i, item))
                .collect::<Vec<_>>()
        });
        if let Some(messages) = &messages {
            let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
            if bytes > MAX_CALL_BYTES {
                r.bad(
                    "messages",
                    format!(
                        "hold {bytes} bytes of text together; one call takes at most {MAX_CALL_BYTES}: send them in several calls"
                    ),
                );
            }
        }
        let subject = r.subject("subject");
        Some(RememberArgs {
            session_id: session_id?,
            messages: messages?,
            subject: subject?,
        })
    }
}

impl FromArgs for ContextArgs {
    const FIELDS: &'static [&'static str] = &["session_id", "max_tokens"];

    fn read(r: &mut Reader) -> Option<Self> {
        let session_id = r.session_id("session_id");
        let max_tokens = r.count("max_tokens", 1, u32::MAX);
        Some(ContextArgs {
            session_id: session_id?,
            max_tokens: max_tokens?,
        })
    }
}

impl FromArgs for ListSessionsArgs {
    const FIELDS: &'static [&'static str] = &["page_size", "page_token", "subject"];

    fn read(r: &mut Reader) -> Option<Self> {
        let page_size = r.count("page_size", 1, MAX_PAGE_SIZE);
        let page_token = r.opt_string("page_token", MAX_PAGE_TOKEN);
        let subject = r.subject("subject");
        Some(ListSessionsArgs {
            page_size: page_size?,
            page_token: page_token?.filter(|t| !t.is_empty()),
            subject: subject?,
        })
    }
}

impl FromArgs for RecallArgs {
    const FIELDS: &'static [&'static str] = &[
        "query",
        "session_ids",
        "subject",
        "after",
        "before",
        "roles",
        "levels",
        "limit",
        "mode",
    ];

    fn read(r: &mut Reader) -> Option<Self> {
        let query = r.query("query");
        let session_ids = r
            .opt_array("session_ids", MAX_RECALL_SESSIONS)
            .map(|items| {
                items.map(|items| {
                    items
                        .into_iter()
                        .enumerate()
                        .filter_map(|(i, item)| r.item_session_id("session_ids", i, item))
                        .collect::<Vec<_>>()
                })
            });
        let subject = r.subject("subject");
        let after = r.time("after");
        let before = r.time("before");
        let roles = r.opt_array("roles", Role::ALL.len() * 4).map(|items| {
            items.map(|items| {
                items
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, item)| r.item_role("roles", i, item))
                    .collect::<Vec<_>>()
            })
        });
        let levels = r.opt_array("levels", 16).map(|items| {
            items.map(|items| {
                items
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, item)| r.item_level("levels", i, item))
                    .collect::<Vec<_>>()
            })
        });
        let limit = r.count("limit", 1, MAX_RECALL_LIMIT);
        let mode = r.mode("mode");
        if let (Some(Some(after)), Some(Some(before))) = (&after, &before)
            && after >= before
        {
            r.bad("before", "must be later than after");
        }
        Some(RecallArgs {
            query: query?,
            session_ids: session_ids?,
            subject: subject?,
            after: after?.map(|t| humantime::format_rfc3339(t).to_string()),
            before: before?.map(|t| humantime::format_rfc3339(t).to_string()),
            roles: roles?,
            levels: levels?,
            limit: limit?,
            mode: mode?,
        })
    }
}

impl FromArgs for ForgetSubjectArgs {
    const FIELDS: &'static [&'static str] = &["subject"];

    fn read(r: &mut Reader) -> Option<Self> {
        let subject = match r.subject("subject")? {
            Some(subject) => subject,
            None => {
                r.bad("subject", "required");
                return None;
            }
        };
        Some(ForgetSubjectArgs { subject })
    }
}

impl FromArgs for ForgetArgs {
    const FIELDS: &'static [&'static str] = &["session_id"];

    fn read(r: &mut Reader) -> Option<Self> {
        Some(ForgetArgs {
            session_id: r.session_id("session_id")?,
        })
    }
}

/// Takes the fields of one JSON object, noting every violation; a field's
/// reader gives None when the field is bad (absent optional fields are
/// `Some(None)`).
pub(super) struct Reader {
    object: JsonObject,
    /// The path of this object in the arguments (`messages[2].`).
    prefix: String,
    violations: Vec<Violation>,
}

impl Reader {
    fn new(object: JsonObject, prefix: &str) -> Reader {
        Reader {
            object,
            prefix: prefix.to_owned(),
            violations: Vec::new(),
        }
    }

    fn bad(&mut self, field: &str, description: impl Into<String>) {
        self.violations.push(Violation {
            field: format!("{}{field}", self.prefix),
            description: description.into(),
        });
    }

    /// The field's value; null counts as absent (models send it for
    /// "not given").
    fn take(&mut self, field: &str) -> Option<Value> {
        self.object.remove(field).filter(|v| !v.is_null())
    }

    fn required(&mut self, field: &str) -> Option<Value> {
        let value = self.take(field);
        if value.is_none() {
            self.bad(field, "required");
        }
        value
    }

    fn string(&mut self, field: &str) -> Option<String> {
        match self.required(field)? {
            Value::String(s) => Some(s),
            other => {
                self.bad(field, format!("must be a string, not {}", kind(&other)));
                None
            }
        }
    }

    fn opt_string(&mut self, field: &str, max_len: usize) -> Option<Option<String>> {
        match self.take(field) {
            None => Some(None),
            Some(Value::String(s)) if s.chars().count() > max_len => {
                self.bad(field, format!("is longer than {max_len} characters"));
                None
            }
            Some(Value::String(s)) => Some(Some(s)),
            Some(other) => {
                self.bad(field, format!("must be a string, not {}", kind(&other)));
                None
            }
        }
    }

    fn session_id(&mut self, field: &str) -> Option<String> {
        let raw = self.string(field)?;
        match SessionName::parse(&raw) {
            Ok(_) => Some(raw),
            Err(e) => {
                self.bad(
                    field,
                    format!(
                        "{e} (a session id is 1 to 128 characters of letters, digits and . _ : -)"
                    ),
                );
                None
            }
        }
    }

    /// An optional subject.
    fn opt_session_id(&mut self, field: &str) -> Option<Option<String>> {
        match self.object.get(field).is_none_or(Value::is_null) {
            true => Some(None),
            false => self.session_id(field).map(Some),
        }
    }

    fn subject(&mut self, field: &str) -> Option<Option<String>> {
        let raw = self.opt_string(field, usize::MAX)?;
        match raw.as_deref().map(Subject::parse) {
            None => Some(None),
            Some(Ok(_)) => Some(raw),
            Some(Err(e)) => {
                self.bad(
                    field,
                    format!(
                        "{e} (a subject is 1 to 256 characters of letters, digits and . _ : @ -)"
                    ),
                );
                None
            }
        }
    }

    /// An optional whole number within `min..=max`.
    fn count(&mut self, field: &str, min: u32, max: u32) -> Option<Option<u32>> {
        let Some(value) = self.take(field) else {
            return Some(None);
        };
        // 2000.0 is a whole number a model may well send.
        let whole: Option<i128> = match &value {
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e18)
                        .map(|f| f as i128)
                }),
            _ => None,
        };
        match whole {
            Some(n) if n >= i128::from(min) && n <= i128::from(max) => Some(u32::try_from(n).ok()),
            Some(_) => {
                self.bad(field, format!("must be from {min} to {max}, not {value}"));
                None
            }
            None => {
                let what = match &value {
                    Value::Number(n) => n.to_string(),
                    other => kind(other).to_owned(),
                };
                self.bad(field, format!("must be a whole number, not {what}"));
                None
            }
        }
    }

    fn array(&mut self, field: &str, min: usize, max: usize) -> Option<Vec<Value>> {
        match self.required(field)? {
            Value::Array(items) if items.len() < min => {
                self.bad(field, format!("needs at least {min} item(s)"));
                None
            }
            Value::Array(items) if items.len() > max => {
                self.bad(
                    field,
                    format!("holds {} items; at most {max} are allowed", items.len()),
                );
                None
            }
            Value::Array(items) => Some(items),
            other => {
                self.bad(field, format!("must be an array, not {}", kind(&other)));
                None
            }
        }
    }

    /// A search query: words to look for, within the server's bound.
    fn query(&mut self, field: &str) -> Option<String> {
        use crate::search::query::{MAX_QUERY_BYTES, Query, QueryError};
        let raw = self.string(field)?;
        match Query::parse(&raw) {
            Ok(_) => Some(raw),
            Err(QueryError::TooLong) => {
                self.bad(
                    field,
                    format!(
                        "is {} bytes; at most {MAX_QUERY_BYTES} are allowed",
                        raw.len()
                    ),
                );
                None
            }
            Err(QueryError::NoWords) => {
                self.bad(
                    field,
                    "has no word to look for (letters or digits, not only -excluded ones)",
                );
                None
            }
        }
    }

    /// An optional time: RFC 3339, or a date meaning its midnight UTC.
    fn time(&mut self, field: &str) -> Option<Option<std::time::SystemTime>> {
        let Some(raw) = self.opt_string(field, 64)? else {
            return Some(None);
        };
        let parsed = match raw.len() {
            10 => humantime::parse_rfc3339(&format!("{raw}T00:00:00Z")),
            _ => humantime::parse_rfc3339_weak(&raw),
        };
        match parsed {
            Ok(at) => Some(Some(at)),
            Err(_) => {
                self.bad(
                    field,
                    format!("{raw:?} is not a time: write it like 2026-11-30T09:00:00Z, or a date like 2026-11-30"),
                );
                None
            }
        }
    }

    fn mode(&mut self, field: &str) -> Option<Option<ModeArg>> {
        let Some(raw) = self.opt_string(field, 64)? else {
            return Some(None);
        };
        match raw.as_str() {
            "auto" => Some(Some(ModeArg::Auto)),
            "lexical" => Some(Some(ModeArg::Lexical)),
            "semantic" => Some(Some(ModeArg::Semantic)),
            _ => {
                self.bad(
                    field,
                    format!("{raw:?} is not a mode: auto, lexical or semantic"),
                );
                None
            }
        }
    }

    /// An optional array of at most `max` items.
    fn opt_array(&mut self, field: &str, max: usize) -> Option<Option<Vec<Value>>> {
        match self.take(field) {
            None => Some(None),
            Some(Value::Array(items)) if items.len() > max => {
                self.bad(
                    field,
                    format!("holds {} items; at most {max} are allowed", items.len()),
                );
                None
            }
            Some(Value::Array(items)) => Some(Some(items)),
            Some(other) => {
                self.bad(field, format!("must be an array, not {}", kind(&other)));
                None
            }
        }
    }

    fn item_session_id(&mut self, field: &str, i: usize, item: Value) -> Option<String> {
        let path = format!("{field}[{i}]");
        match item {
            Value::String(raw) => match SessionName::parse(&raw) {
                Ok(_) => Some(raw),
                Err(e) => {
                    self.bad(&path, e.to_string());
                    None
                }
            },
            other => {
                self.bad(&path, format!("must be a string, not {}", kind(&other)));
                None
            }
        }
    }

    fn item_role(&mut self, field: &str, i: usize, item: Value) -> Option<RoleArg> {
        let path = format!("{field}[{i}]");
        match item {
            Value::String(name) => match role_arg(&name) {
                Some(role) => Some(role),
                None => {
                    self.bad(
                        &path,
                        format!("{name:?} is not a role: user, assistant, system or tool"),
                    );
                    None
                }
            },
            other => {
                self.bad(&path, format!("must be a string, not {}", kind(&other)));
                None
            }
        }
    }

    fn item_level(&mut self, field: &str, i: usize, item: Value) -> Option<u32> {
        let path = format!("{field}[{i}]");
        match item.as_u64() {
            Some(level) if level <= u64::from(MAX_LEVEL) => Some(level as u32),
            _ => {
                self.bad(
                    &path,
                    format!("must be a whole number from 0 to {MAX_LEVEL}, not {item}"),
                );
                None
            }
        }
    }

    /// `messages[i]`, its violations added to this reader's.
    fn message(&mut self, i: usize, item: Value) -> Option<MessageArg> {
        let path = format!("{}messages[{i}]", self.prefix);
        let Value::Object(object) = item else {
            self.violations.push(Violation {
                field: path,
                description: format!("must be an object, not {}", kind(&item)),
            });
            return None;
        };
        let mut r = Reader::new(object, &format!("{path}."));
        let role = match r.string("role") {
            Some(name) => match role_arg(&name) {
                Some(role) => Some(role),
                None => {
                    r.bad(
                        "role",
                        format!("{name:?} is not a role: user, assistant, system or tool"),
                    );
                    None
                }
            },
            None => None,
        };
        let content = match r.string("content") {
            Some(c) if c.trim().is_empty() => {
                r.bad("content", "is empty");
                None
            }
            Some(c) if c.len() > MAX_CONTENT_BYTES => {
                r.bad(
                    "content",
                    format!(
                        "is {} bytes; at most {MAX_CONTENT_BYTES} are allowed: split it into several messages",
                        c.len()
                    ),
                );
                None
            }
            other => other,
        };
        let client_entry_id = match r.opt_string("client_entry_id", MAX_CLIENT_ENTRY_ID) {
            Some(Some(id)) if id.is_empty() => {
                r.bad("client_entry_id", "is empty (leave it out for none)");
                None
            }
            other => other,
        };
        r.finish(&["role", "content", "client_entry_id"]);
        self.violations.append(&mut r.violations);
        Some(MessageArg {
            role: role?,
            content: content?,
            client_entry_id: client_entry_id?,
        })
    }

    /// Every field left is one the tool does not take.
    fn finish(&mut self, fields: &[&str]) {
        let mut unknown: Vec<String> = self.object.keys().cloned().collect();
        unknown.sort();
        for name in unknown {
            self.bad(
                &name,
                format!(
                    "is not an argument of this tool; it takes {}",
                    fields.join(", ")
                ),
            );
        }
        self.object.clear();
    }
}

fn role_arg(name: &str) -> Option<RoleArg> {
    match Role::parse(name)? {
        Role::User => Some(RoleArg::User),
        Role::Assistant => Some(RoleArg::Assistant),
        Role::System => Some(RoleArg::System),
        Role::Tool => Some(RoleArg::Tool),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Option<JsonObject> {
        match value {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    fn fields(violations: &[Violation]) -> Vec<&str> {
        violations.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn remember_reads_every_field() {
        let args = RememberArgs::parse(object(json!({
            "session_id": "agent-1",
            "messages": [
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Noted.", "client_entry_id": "t2", },
            ],
        })))
        .expect("good arguments");
        assert_eq!(args.session_id.as_deref(), Some("agent-1"));
        assert_eq!(args.messages.len(), 2);
        assert_eq!(args.messages[0].role, RoleArg::User);
        assert_eq!(args.messages[1].client_entry_id.as_deref(), Some("t2"));
        assert_eq!(args.subject, None);
        let args = RememberArgs::parse(object(json!({
            "session_id": "a",
            "messages": [{"role": "user", "content": "hi"}],
            "subject": "ada@example.com",
        })))
        .expect("a subject");
        assert_eq!(args.subject.as_deref(), Some("ada@example.com"));
        let violations = RememberArgs::parse(object(json!({
            "session_id": "a",
            "messages": [{"role": "user", "content": "hi"}],
            "subject": "Ada Lovelace",
        })))
        .expect_err("a space");
        assert_eq!(fields(&violations), ["subject"]);
        assert!(
            violations[0].description.contains("' '"),
            "{}",
            violations[0].description
        );
    }

    #[test]
    fn every_bad_field_is_named_with_its_path() {
        let violations = RememberArgs::parse(object(json!({
            "sessionId": "x",
            "session_id": "bad id!",
            "messages": [
                {"role": "bot", "content": ""},
                "hello",
                {"role": "user", "content": 5, "extra": true},
            ],
        })))
        .expect_err("bad arguments");
        assert_eq!(
            fields(&violations),
            [
                "session_id",
                "messages[0].role",
                "messages[0].content",
                "messages[1]",
                "messages[2].content",
                "messages[2].extra",
                "sessionId",
            ]
        );
        assert!(violations[1].description.contains("\"bot\" is not a role"));
        assert!(
            violations[4]
                .description
                .contains("must be a string, not a number")
        );
        assert!(
            violations[6]
                .description
                .contains("takes session_id, messages")
        );
    }

    #[test]
    fn missing_arguments_are_required_ones() {
        let violations = RememberArgs::parse(None).expect_err("nothing given");
        assert_eq!(fields(&violations), ["messages"]);
        assert!(violations.iter().all(|v| v.description == "required"));
        let too_many: Vec<Value> = (0..=MAX_MESSAGES)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        let violations =
            RememberArgs::parse(object(json!({"session_id": "s", "messages": too_many})))
                .expect_err("too many");
        assert_eq!(fields(&violations), ["messages"]);
        assert!(violations[0].description.contains("at most 100"));
    }

    #[test]
    fn text_past_the_servers_bounds_is_named_before_sending() {
        let big = "é".repeat(MAX_CONTENT_BYTES / 2 + 1);
        let violations = RememberArgs::parse(object(json!({"session_id": "s", "messages": [
            {"role": "user", "content": "fine"},
            {"role": "user", "content": big},
        ]})))
        .expect_err("too long");
        assert_eq!(fields(&violations), ["messages[1].content"]);
        assert!(
            violations[0].description.contains("65538 bytes"),
            "{violations:?}"
        );
        // Each within its bound, too much together.
        let each = "x".repeat(MAX_CONTENT_BYTES);
        let many: Vec<Value> = (0..MAX_MESSAGES)
            .map(|_| json!({"role": "user", "content": each}))
            .collect();
        let violations = RememberArgs::parse(object(json!({"session_id": "s", "messages": many})))
            .expect_err("too much");
        assert_eq!(fields(&violations), ["messages"]);
        assert!(
            violations[0].description.contains("several calls"),
            "{violations:?}"
        );
    }

    #[test]
    fn numbers_are_whole_and_in_range() {
        let args = ContextArgs::parse(object(json!({"session_id": "s", "max_tokens": 500.0})))
            .expect("a whole float");
        assert_eq!(args.max_tokens, Some(500));
        let args = ContextArgs::parse(object(json!({"session_id": "s", "max_tokens": null})))
            .expect("null is absent");
        assert_eq!(args.max_tokens, None);
        for bad in [
            json!(0),
            json!(-3),
            json!(1.5),
            json!("20"),
            json!(5_000_000_000u64),
        ] {
            let violations =
                ContextArgs::parse(object(json!({"session_id": "s", "max_tokens": bad})))
                    .expect_err("bad max_tokens");
            assert_eq!(fields(&violations), ["max_tokens"], "{bad}");
        }
        let violations = ListSessionsArgs::parse(object(json!({"page_size": 101})))
            .expect_err("past the page cap");
        assert!(violations[0].description.contains("from 1 to 100"));
        assert_eq!(
            ListSessionsArgs::parse(None).expect("all optional"),
            ListSessionsArgs {
                page_size: None,
                page_token: None,
                subject: None,
            }
        );
    }

    #[test]
    fn recall_reads_its_scope_and_filters() {
        let args = RecallArgs::parse(object(json!({
            "query": "\"migration 0042\" or timeout -staging",
            "session_ids": ["a", "b"],
            "after": "2026-11-30",
            "before": "2026-12-01T12:00:00Z",
            "roles": ["user"],
            "levels": [0, 1, 2],
            "limit": 5,
            "mode": "lexical",
        })))
        .expect("good arguments");
        assert_eq!(
            args.session_ids.as_deref(),
            Some(&["a".to_owned(), "b".to_owned()][..])
        );
        assert_eq!(args.after.as_deref(), Some("2026-11-30T00:00:00Z"));
        assert_eq!(args.before.as_deref(), Some("2026-12-01T12:00:00Z"));
        assert_eq!(args.roles, Some(vec![RoleArg::User]));
        assert_eq!(args.levels, Some(vec![0, 1, 2]));
        assert_eq!((args.limit, args.mode), (Some(5), Some(ModeArg::Lexical)));
        let violations = RecallArgs::parse(object(json!({
            "query": "-only -excluded",
            "session_ids": ["ok", "not ok"],
            "after": "yesterday",
            "roles": ["bot"],
            "levels": [99],
            "limit": 0,
            "mode": "fuzzy",
        })))
        .expect_err("bad arguments");
        assert_eq!(
            fields(&violations),
            [
                "query",
                "session_ids[1]",
                "after",
                "roles[0]",
                "levels[0]",
                "limit",
                "mode"
            ]
        );
        assert!(violations[0].description.contains("no word to look for"));
        let violations = RecallArgs::parse(object(json!({
            "query": "x", "after": "2026-12-02", "before": "2026-12-01",
        })))
        .expect_err("an empty window");
        assert_eq!(fields(&violations), ["before"]);
    }

    /// The schema a model reads and the fields read here are one list.
    #[test]
    fn each_schema_names_the_fields_read() {
        fn properties<T: JsonSchema>() -> Vec<String> {
            let schema = schemars::schema_for!(T);
            let mut names: Vec<String> = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            names.sort();
            names
        }
        fn sorted(fields: &[&str]) -> Vec<String> {
            let mut names: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
            names.sort();
            names
        }
        assert_eq!(properties::<RememberArgs>(), sorted(RememberArgs::FIELDS));
        assert_eq!(properties::<ContextArgs>(), sorted(ContextArgs::FIELDS));
        assert_eq!(
            properties::<ListSessionsArgs>(),
            sorted(ListSessionsArgs::FIELDS)
        );
        assert_eq!(properties::<ForgetArgs>(), sorted(ForgetArgs::FIELDS));
        assert_eq!(properties::<RecallArgs>(), sorted(RecallArgs::FIELDS));
        assert_eq!(
            properties::<MessageArg>(),
            sorted(&["role", "content", "client_entry_id"])
        );
    }
}

//! The tools' arguments: one type per tool, whose derived JSON schema is
//! both the tool's input schema and the check of a call's arguments, and
//! whose serde reading takes them once the check passed. Every bad field
//! is named at once, with its path (`messages[2].role`), before anything
//! is sent: a model that sends `sessionId`, a number for a string or
//! `role: "bot"` is told which field and why. A field the schema cannot
//! check in full (a session id's characters, a time) names its check in
//! the schema (`x-check`, taken out of the listed schema), and a check
//! across fields is the type's own (`ToolArgs::check`).

use rmcp::handler::server::tool::schema_for_input;
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

use super::error::Violation;
use crate::model::{Role, SessionName, Subject};

/// Most messages one `remember` takes: beyond that a model is pasting a
/// transcript, which an agent host should stream over gRPC instead.
pub(super) const MAX_MESSAGES: usize = 100;
/// The longest message text, in UTF-8 bytes: a server's default bound, so
/// a model is told which message before anything is sent.
pub(super) const MAX_CONTENT_BYTES: usize = crate::config::DEFAULT_MAX_CONTENT_BYTES as usize;
/// The most text one `remember` sends: a server's default request bound,
/// less room for the rest of the request (ids, roles, framing).
const MAX_CALL_BYTES: usize = crate::config::DEFAULT_MAX_MESSAGE_BYTES as usize - 64 * 1024;
pub(super) const DEFAULT_PAGE_SIZE: u32 = 20;
/// The budget `context` asks for when the model names none.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 2000;
/// Hits one `recall` returns by default.
pub(super) const DEFAULT_RECALL_LIMIT: u32 = 10;

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageArg {
    /// Who said it: user, assistant, system or tool.
    pub role: RoleArg,
    /// The text, exactly as said (not empty; at most 65,536 bytes of UTF-8).
    #[schemars(length(min = 1), extend("x-check" = "content"))]
    pub content: String,
    /// Optional idempotency key, unique within the session (at most 128
    /// characters): sending the same id with the same text again stores it
    /// once, so a retry after a timeout is safe.
    #[schemars(length(min = 1, max = 128))]
    pub client_entry_id: Option<String>,
    /// Who said it, by name (1 to 64 characters), when the role alone
    /// does not say (a group chat, an imported history).
    #[schemars(length(min = 1, max = 64))]
    pub name: Option<String>,
    /// When it was said, for a history told after the fact: RFC 3339
    /// (2023-11-14T09:12:00Z) or a date (midnight UTC); default now. Never
    /// before the session's newest message.
    #[schemars(extend("x-check" = "time"))]
    pub occurred_at: Option<String>,
    /// Labels of your own to find it by later with recall's metadata
    /// (a channel, a thread, a source): at most 16 pairs, keys 1 to 64 of
    /// letters, digits and . _ -, values text of at most 256 bytes.
    #[schemars(extend("x-check" = "metadata"))]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `remember`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RememberArgs {
    /// The session (one conversation's memory) to add to: 1 to 128
    /// characters of letters, digits and . _ : -. A new id starts a new
    /// session. Without it, the subject's session of the day
    /// (<subject>:<YYYY-MM-DD>, in UTC), or without a subject the day's
    /// (<YYYY-MM-DD>); the answer names it.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"), extend("x-check" = "session_id"))]
    pub session_id: Option<String>,
    /// What to remember, oldest first: 1 to 100 messages.
    #[schemars(length(min = 1, max = MAX_MESSAGES))]
    pub messages: Vec<MessageArg>,
    /// Whose memory this is (a user, a customer: 1 to 256 characters of
    /// letters, digits and . _ : @ -), to find their sessions later. Fixed
    /// by the first remember of a session: another one later is refused.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"), extend("x-check" = "subject"))]
    pub subject: Option<String>,
}

/// `context`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ContextArgs {
    /// The session to read.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"), extend("x-check" = "session_id"))]
    pub session_id: String,
    /// The most tokens (about four characters each) the memory may take
    /// in your prompt; default 2000. Older history is zoomed out to recaps
    /// to fit, and the newest turns come verbatim.
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
    /// The turn's question or the user's last message: what the memory of
    /// the session's subject (every session of it) holds about it comes
    /// first, best first, within a quarter of max_tokens (the server's
    /// setting), and what the memory of this session already shows
    /// verbatim is not repeated. Words, at most 4096 bytes.
    #[schemars(length(min = 1), extend("x-check" = "query"))]
    pub query: Option<String>,
    /// With query: leave out of what is recalled what only meaning
    /// matched, when its similarity (the cosine to the query, -1 to 1) is
    /// below this, so a question nothing in memory answers recalls
    /// nothing. What the words matched stays. As recall's min_similarity.
    #[schemars(range(min = -1.0, max = 1.0))]
    pub min_similarity: Option<f32>,
}

/// `list_sessions`' arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListSessionsArgs {
    /// Sessions per page, 1 to 100; default 20.
    #[schemars(range(min = 1, max = 100))]
    pub page_size: Option<u32>,
    /// The next_page_token of the previous page, to read on.
    #[schemars(length(max = 1024))]
    pub page_token: Option<String>,
    /// Only the sessions of this subject.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"), extend("x-check" = "subject"))]
    pub subject: Option<String>,
}

/// How `recall` looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RecallArgs {
    /// What to look for, as in a web search: words (all of them match
    /// best), "an exact phrase", `or` between alternatives, -word to
    /// exclude. At most 4096 bytes.
    #[schemars(length(min = 1), extend("x-check" = "query"))]
    pub query: String,
    /// Only these sessions (at most 100); with neither this nor subject,
    /// every session of this memory.
    #[schemars(
        length(max = 100),
        inner(regex(pattern = r"^[A-Za-z0-9._:-]+$")),
        extend("x-check-items" = "session_id")
    )]
    pub session_ids: Option<Vec<String>>,
    /// Only the sessions of this subject.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"), extend("x-check" = "subject"))]
    pub subject: Option<String>,
    /// Only what was said after this time (a recap: its last message):
    /// RFC 3339 (2026-11-30T09:00:00Z) or a date (2026-11-30, midnight UTC).
    #[schemars(extend("x-check" = "time"))]
    pub after: Option<String>,
    /// Only what was said before this time, written as for after.
    #[schemars(extend("x-check" = "time"))]
    pub before: Option<String>,
    /// Only messages of these roles (recaps have none, so naming roles
    /// leaves recaps out).
    #[schemars(length(max = 16))]
    pub roles: Option<Vec<RoleArg>>,
    /// What to search: 0 messages, 1 recaps of messages, 2 and up recaps
    /// of recaps; default messages and recaps (0 and 1).
    #[schemars(length(max = 16), inner(range(max = 64)))]
    pub levels: Option<Vec<u32>>,
    /// The most hits, best first: 1 to 100, default 10.
    #[schemars(range(min = 1, max = 100))]
    pub limit: Option<u32>,
    /// How to match: auto (default), lexical or semantic.
    pub mode: Option<ModeArg>,
    /// Only messages whose metadata (given at remember) holds every one of
    /// these pairs; recaps have none, so a pair leaves them out.
    #[schemars(extend("x-check" = "metadata"))]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Leave out what only meaning matched, when its similarity (the
    /// cosine to the query, -1 to 1) is below this: a question nothing in
    /// memory answers then comes back with no hits rather than the
    /// nearest texts. What the words matched stays. Try 0.8 with e5
    /// models; each hit's similarity says what a model gives.
    #[schemars(range(min = -1.0, max = 1.0))]
    pub min_similarity: Option<f32>,
}

/// `forget`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForgetArgs {
    /// The session to erase, with everything remembered in it.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._:-]+$"), extend("x-check" = "session_id"))]
    pub session_id: String,
}

/// `forget_subject`'s arguments.
#[derive(Clone, Debug, PartialEq, JsonSchema, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForgetSubjectArgs {
    /// The subject whose every session is erased, with everything
    /// remembered in them.
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9._:@-]+$"), extend("x-check" = "subject"))]
    pub subject: String,
}

/// A tool's arguments: their schema and serde reading are derived; what
/// holds across fields is checked here, once every field is well formed.
pub(super) trait ToolArgs: JsonSchema + DeserializeOwned + 'static {
    fn check(&self, _bad: &mut Violations) {}

    /// The arguments, or every violation in them.
    fn parse(arguments: Option<JsonObject>) -> Result<Self, Vec<Violation>> {
        let schema = schema_for_input::<Self>().map_err(|e| {
            vec![Violation {
                field: String::new(),
                description: format!("this tool's schema is broken: {e}"),
            }]
        })?;
        let mut bad = Violations(Vec::new());
        let mut value = Value::Object(arguments.unwrap_or_default());
        Walk { root: &schema }.value(&schema, &mut value, "", None, &mut bad);
        if !bad.0.is_empty() {
            return Err(bad.0);
        }
        // The walk has checked every field serde reads, so a failure here
        // is a schema that says less than the type: named, not a panic.
        let args: Self = serde_json::from_value(value).map_err(|e| {
            vec![Violation {
                field: String::new(),
                description: e.to_string(),
            }]
        })?;
        args.check(&mut bad);
        match bad.0.is_empty() {
            true => Ok(args),
            false => Err(bad.0),
        }
    }
}

impl ToolArgs for RememberArgs {
    fn check(&self, bad: &mut Violations) {
        let bytes: usize = self.messages.iter().map(|m| m.content.len()).sum();
        if bytes > MAX_CALL_BYTES {
            bad.add(
                "messages",
                format!(
                    "hold {bytes} bytes of text together; one call takes at most {MAX_CALL_BYTES}: send them in several calls"
                ),
            );
        }
    }
}

impl ToolArgs for ContextArgs {}
impl ToolArgs for ListSessionsArgs {}
impl ToolArgs for ForgetArgs {}
impl ToolArgs for ForgetSubjectArgs {}

impl ToolArgs for RecallArgs {
    fn check(&self, bad: &mut Violations) {
        let at = |t: &Option<String>| t.as_deref().and_then(|t| humantime::parse_rfc3339(t).ok());
        if let (Some(after), Some(before)) = (at(&self.after), at(&self.before))
            && after >= before
        {
            bad.add("before", "must be later than after");
        }
    }
}

/// The violations of one call, in the order found.
pub(super) struct Violations(Vec<Violation>);

impl Violations {
    fn add(&mut self, field: &str, description: impl Into<String>) {
        self.0.push(Violation {
            field: field.to_owned(),
            description: description.into(),
        });
    }
}

/// A walk of a call's arguments along the tool's schema: each value
/// checked by the keywords its schema has, and put in the form serde reads
/// (a whole float as an integer, a date as RFC 3339, a null as absent).
struct Walk<'a> {
    root: &'a JsonObject,
}

impl Walk<'_> {
    /// `schema`'s `$ref` resolved, and the name of the definition it named.
    fn resolve<'s>(&'s self, schema: &'s JsonObject) -> (&'s JsonObject, Option<&'s str>) {
        let name = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"));
        let target = name
            .and_then(|n| self.root.get("$defs")?.get(n)?.as_object())
            .unwrap_or(schema);
        (target, name)
    }

    fn value(
        &self,
        schema: &JsonObject,
        value: &mut Value,
        path: &str,
        name: Option<&str>,
        bad: &mut Violations,
    ) {
        let (schema, named) = self.resolve(schema);
        let name = named.or(name);
        // An Option is "T or null"; null was taken as absent already.
        if let Some(Value::Array(branches)) = schema.get("anyOf") {
            if let Some(branch) = branches
                .iter()
                .filter_map(Value::as_object)
                .find(|b| b.get("type").and_then(Value::as_str) != Some("null"))
            {
                self.value(branch, value, path, name, bad);
            }
            return;
        }
        if let Some(choices) = choices(schema) {
            return self.choice(&choices, value, path, name, bad);
        }
        let ty = match schema.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(Value::Array(types)) => types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .unwrap_or("null"),
            _ => return,
        };
        match ty {
            "object" => self.object(schema, value, path, bad),
            "array" => self.array(schema, value, path, bad),
            "string" => string(schema, value, path, bad),
            "integer" => integer(schema, value, path, bad),
            "number" => number(schema, value, path, bad),
            _ => {}
        }
    }

    fn object(&self, schema: &JsonObject, value: &mut Value, path: &str, bad: &mut Violations) {
        let Value::Object(fields) = value else {
            return bad.add(path, format!("must be an object, not {}", kind(value)));
        };
        let prefix = match path {
            "" => String::new(),
            p => format!("{p}."),
        };
        // Models send null for "not given".
        fields.retain(|_, v| !v.is_null());
        // A map (metadata): its keys are the caller's, each value as the
        // map's schema says.
        if let Some(each) = schema
            .get("additionalProperties")
            .and_then(Value::as_object)
        {
            if schema.get("x-check").and_then(Value::as_str) == Some("metadata") {
                let problems = metadata(fields);
                let refused = !problems.is_empty();
                for description in problems {
                    bad.add(path, description);
                }
                if refused {
                    return;
                }
            }
            for (key, v) in fields.iter_mut() {
                self.value(each, v, &format!("{path}[{key}]"), None, bad);
            }
            return;
        }
        let empty = Map::new();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (field, property) in properties {
            let at = format!("{prefix}{field}");
            match (fields.get_mut(field), property.as_object()) {
                (Some(v), Some(property)) => self.value(property, v, &at, None, bad),
                (None, _) if required.contains(&field.as_str()) => bad.add(&at, "required"),
                _ => {}
            }
        }
        let takes: Vec<&str> = properties.keys().map(String::as_str).collect();
        for field in fields.keys().filter(|f| !properties.contains_key(*f)) {
            bad.add(
                &format!("{prefix}{field}"),
                format!(
                    "is not an argument of this tool; it takes {}",
                    takes.join(", ")
                ),
            );
        }
    }

    fn array(&self, schema: &JsonObject, value: &mut Value, path: &str, bad: &mut Violations) {
        let Value::Array(items) = value else {
            return bad.add(path, format!("must be an array, not {}", kind(value)));
        };
        let bound = |key| schema.get(key).and_then(Value::as_u64);
        if let Some(min) = bound("minItems").filter(|&min| (items.len() as u64) < min) {
            return bad.add(path, format!("needs at least {min} item(s)"));
        }
        if let Some(max) = bound("maxItems").filter(|&max| items.len() as u64 > max) {
            return bad.add(
                path,
                format!("holds {} items; at most {max} are allowed", items.len()),
            );
        }
        if let Some(item) = schema.get("items").and_then(Value::as_object) {
            // Each item's own check, where the array names one.
            let mut item = item.clone();
            if let Some(check) = schema.get("x-check-items") {
                item.insert("x-check".to_owned(), check.clone());
            }
            for (i, v) in items.iter_mut().enumerate() {
                self.value(&item, v, &format!("{path}[{i}]"), None, bad);
            }
        }
    }

    /// One of a fixed set of strings (an enum): named by its type
    /// (`RoleArg` is a role).
    fn choice(
        &self,
        choices: &[&str],
        value: &Value,
        path: &str,
        name: Option<&str>,
        bad: &mut Violations,
    ) {
        let Value::String(raw) = value else {
            return bad.add(path, format!("must be a string, not {}", kind(value)));
        };
        if choices.contains(&raw.as_str()) {
            return;
        }
        let noun = name
            .map(|n| n.trim_end_matches("Arg").to_ascii_lowercase())
            .unwrap_or_else(|| "choice".to_owned());
        let listed = match choices.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        bad.add(path, format!("{raw:?} is not a {noun}: {listed}"));
    }
}

/// The strings an enum's schema allows: `enum`, or `oneOf` of `const`s
/// (variants with their own descriptions).
fn choices(schema: &JsonObject) -> Option<Vec<&str>> {
    if let Some(Value::Array(values)) = schema.get("enum") {
        return Some(values.iter().filter_map(Value::as_str).collect());
    }
    let Some(Value::Array(branches)) = schema.get("oneOf") else {
        return None;
    };
    branches
        .iter()
        .map(|b| b.get("const").and_then(Value::as_str))
        .collect()
}

fn string(schema: &JsonObject, value: &mut Value, path: &str, bad: &mut Violations) {
    let Value::String(text) = value else {
        return bad.add(path, format!("must be a string, not {}", kind(value)));
    };
    let check = schema.get("x-check").and_then(Value::as_str);
    let bound = |key| schema.get(key).and_then(Value::as_u64);
    // A field with its own check says why better than a length could.
    if check.is_none() {
        if bound("minLength").is_some_and(|min| min > 0) && text.is_empty() {
            return bad.add(path, "is empty");
        }
        if let Some(max) = bound("maxLength").filter(|&max| text.chars().count() as u64 > max) {
            return bad.add(path, format!("is longer than {max} characters"));
        }
    }
    let outcome = match check {
        Some("session_id") => SessionName::parse(text).map(drop).map_err(|e| {
            format!("{e} (a session id is 1 to 128 characters of letters, digits and . _ : -)")
        }),
        Some("subject") => Subject::parse(text).map(drop).map_err(|e| {
            format!("{e} (a subject is 1 to 256 characters of letters, digits and . _ : @ -)")
        }),
        Some("content") => content(text),
        Some("query") => query(text),
        Some("time") => time(text).map(|at| *text = humantime::format_rfc3339(at).to_string()),
        _ => Ok(()),
    };
    if let Err(description) = outcome {
        bad.add(path, description);
    }
}

/// A whole number (2000.0 is one a model may well send) within the
/// schema's bounds and its type's.
fn integer(schema: &JsonObject, value: &mut Value, path: &str, bad: &mut Violations) {
    let whole: Option<i128> = match &*value {
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
    let Some(n) = whole else {
        let what = match &*value {
            Value::Number(n) => n.to_string(),
            other => kind(other).to_owned(),
        };
        return bad.add(path, format!("must be a whole number, not {what}"));
    };
    let limit = |key| schema.get(key).and_then(Value::as_f64).map(|f| f as i128);
    let type_max = match schema.get("format").and_then(Value::as_str) {
        Some("uint32") => i128::from(u32::MAX),
        _ => i128::from(i64::MAX),
    };
    let min = limit("minimum").unwrap_or(i128::from(i64::MIN));
    let max = limit("maximum").unwrap_or(type_max).min(type_max);
    if n < min || n > max {
        return bad.add(path, format!("must be from {min} to {max}, not {value}"));
    }
    if let Ok(n) = i64::try_from(n) {
        *value = Value::from(n);
    }
}

/// A number within the schema's bounds.
fn number(schema: &JsonObject, value: &mut Value, path: &str, bad: &mut Violations) {
    let Some(n) = value.as_f64() else {
        return bad.add(path, format!("must be a number, not {}", kind(value)));
    };
    let min = schema.get("minimum").and_then(Value::as_f64);
    let max = schema.get("maximum").and_then(Value::as_f64);
    if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
        let bound = |b: Option<f64>| b.map_or_else(|| "any".to_owned(), |b| b.to_string());
        bad.add(
            path,
            format!("must be from {} to {}, not {value}", bound(min), bound(max)),
        );
    }
}

/// A message's text: not blank, within the server's default bound.
fn content(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("is empty".to_owned());
    }
    if text.len() > MAX_CONTENT_BYTES {
        return Err(format!(
            "is {} bytes; at most {MAX_CONTENT_BYTES} are allowed: split it into several messages",
            text.len()
        ));
    }
    Ok(())
}

/// Metadata pairs: what is wrong with them, each, as the bounds an
/// entry's metadata has on the wire say.
fn metadata(pairs: &Map<String, Value>) -> Vec<String> {
    crate::model::metadata_problems(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A search query: words to look for, within the server's bound.
fn query(text: &str) -> Result<(), String> {
    use crate::search::query::{MAX_QUERY_BYTES, Query, QueryError};
    match Query::parse(text) {
        Ok(_) => Ok(()),
        Err(QueryError::TooLong) => Err(format!(
            "is {} bytes; at most {MAX_QUERY_BYTES} are allowed",
            text.len()
        )),
        Err(QueryError::NoWords) => {
            Err("has no word to look for (letters or digits, not only -excluded ones)".to_owned())
        }
    }
}

/// A time: RFC 3339, or a date meaning its midnight UTC.
fn time(text: &str) -> Result<std::time::SystemTime, String> {
    let parsed = match text.len() {
        10 => humantime::parse_rfc3339(&format!("{text}T00:00:00Z")),
        _ => humantime::parse_rfc3339_weak(text),
    };
    parsed.map_err(|_| {
        format!(
            "{text:?} is not a time: write it like 2026-11-30T09:00:00Z, or a date like 2026-11-30"
        )
    })
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
            // By field name, as the schema lists them; unknown ones last.
            [
                "messages[0].content",
                "messages[0].role",
                "messages[1]",
                "messages[2].content",
                "messages[2].extra",
                "session_id",
                "sessionId",
            ]
        );
        assert_eq!(
            violations[1].description,
            "\"bot\" is not a role: user, assistant, system or tool"
        );
        assert_eq!(violations[3].description, "must be a string, not a number");
        assert!(
            violations[5]
                .description
                .ends_with("(a session id is 1 to 128 characters of letters, digits and . _ : -)"),
            "{}",
            violations[5].description
        );
        assert_eq!(
            violations[6].description,
            "is not an argument of this tool; it takes messages, session_id, subject"
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
    fn metadata_is_checked_as_the_wire_checks_it() {
        let args = RememberArgs::parse(object(json!({"session_id": "s", "messages": [
            {"role": "user", "content": "hi", "metadata": {"channel": "sms", "thread.id": "7"}},
        ]})))
        .expect("good pairs");
        let pairs = args.messages[0].metadata.clone().expect("kept");
        assert_eq!(pairs["channel"], "sms");
        assert_eq!(pairs["thread.id"], "7");
        let too_many: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        let violations = RememberArgs::parse(object(json!({"session_id": "s", "messages": [
            {"role": "user", "content": "hi", "metadata": {"bad key": "x"}},
            {"role": "user", "content": "hi", "metadata": {"k": 5}},
            {"role": "user", "content": "hi", "metadata": {"k": "x".repeat(257)}},
            {"role": "user", "content": "hi", "metadata": too_many},
            {"role": "user", "content": "hi", "metadata": "channel=sms"},
        ]})))
        .expect_err("bad metadata");
        assert_eq!(
            fields(&violations),
            [
                "messages[0].metadata",
                "messages[1].metadata[k]",
                "messages[2].metadata",
                "messages[3].metadata",
                "messages[4].metadata",
            ]
        );
        assert!(
            violations[0].description.contains("\"bad key\""),
            "{violations:?}"
        );
        assert_eq!(violations[1].description, "must be a string, not a number");
        assert!(
            violations[2].description.contains("256 bytes"),
            "{violations:?}"
        );
        assert!(
            violations[3].description.contains("17 pairs"),
            "{violations:?}"
        );
        // recall's filter takes the same pairs.
        let args = RecallArgs::parse(object(
            json!({"query": "key", "metadata": {"channel": "sms"}}),
        ))
        .expect("a filter");
        assert_eq!(args.metadata.expect("kept")["channel"], "sms");
        let violations = RecallArgs::parse(object(json!({"query": "key", "metadata": {"": "x"}})))
            .expect_err("an empty key");
        assert_eq!(fields(&violations), ["metadata"]);
        // Every bad pair is named at once.
        let violations = RecallArgs::parse(object(
            json!({"query": "key", "metadata": {"bad key": "v", "k": "a\u{0}b", "": "x"}}),
        ))
        .expect_err("three bad pairs");
        assert_eq!(fields(&violations), ["metadata", "metadata", "metadata"]);
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
            "min_similarity": -0.25,
        })))
        .expect("good arguments");
        assert_eq!(args.min_similarity, Some(-0.25));
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
            "min_similarity": 1.5,
        })))
        .expect_err("bad arguments");
        assert_eq!(
            fields(&violations),
            [
                "after",
                "levels[0]",
                "limit",
                "min_similarity",
                "mode",
                "query",
                "roles[0]",
                "session_ids[1]",
            ]
        );
        assert_eq!(violations[1].description, "must be from 0 to 64, not 99");
        assert_eq!(violations[3].description, "must be from -1 to 1, not 1.5");
        assert_eq!(
            violations[4].description,
            "\"fuzzy\" is not a mode: auto, lexical or semantic"
        );
        assert!(violations[5].description.contains("no word to look for"));
        let violations = RecallArgs::parse(object(json!({
            "query": "x", "min_similarity": "high",
        })))
        .expect_err("a string for a number");
        assert_eq!(violations[0].field, "min_similarity");
        assert_eq!(violations[0].description, "must be a number, not a string");
        let violations = RecallArgs::parse(object(json!({
            "query": "x", "after": "2026-12-02", "before": "2026-12-01",
        })))
        .expect_err("an empty window");
        assert_eq!(fields(&violations), ["before"]);
    }
}

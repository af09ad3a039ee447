//! `archivist import FILE|-`: a history brought in as it happened, from
//! JSON Lines (one message a line: `session_id`, `role`, `content`, and
//! optionally `name`, `occurred_at` in RFC 3339, `metadata`,
//! `client_entry_id`, `subject`), sent in batches of consecutive lines of
//! one session. A line without `client_entry_id` gets one derived from its
//! line number and text, so a second run stores nothing new. A bad line
//! stops the import, naming its line and field: every earlier batch is
//! kept, nothing of the bad line's batch is stored. A dry run reads the
//! whole file and names every bad line it can tell, with its field.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic_types::StatusExt;

use super::output::describe_with_hint;
use super::terminal::{ClientFlags, Failed, connect, exit, print_json, request};
use crate::model::{Role, SessionName, Subject};
use crate::pb;
use crate::text::count;
use crate::wire::role_to_pb;

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub flags: ClientFlags,
    /// The JSON Lines file, or - for standard input.
    #[arg(value_name = "FILE")]
    pub file: String,
    /// Check every line of the file and send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Most entries sent in one call (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch: u32,
}

/// One line of the file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    session_id: String,
    role: String,
    content: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    occurred_at: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    client_entry_id: Option<String>,
    #[serde(default)]
    subject: Option<String>,
}

/// A bad line: its number (from 1), the field that is wrong (None when
/// the line is no JSON object, or the server refused the whole call), and
/// what is wrong, naming the field.
#[derive(Debug, PartialEq)]
struct BadLine {
    line: u64,
    field: Option<String>,
    why: String,
}

impl BadLine {
    fn json(&self) -> serde_json::Value {
        json!({"line": self.line, "field": self.field, "error": self.why})
    }
}

/// The keys of a line that must be strings when given.
const TEXT_KEYS: [&str; 7] = [
    "session_id",
    "role",
    "content",
    "name",
    "occurred_at",
    "client_entry_id",
    "subject",
];

/// A line, checked: where it goes and what it sends.
struct Parsed {
    session: String,
    subject: String,
    entry: pb::NewEntry,
}

/// Reads line `number` (from 1). What the client can tell is wrong (JSON,
/// a missing or unknown key, a role, a session id, a subject, a time, an
/// empty content, the metadata's bounds) is found here, so `--dry-run`
/// finds it too; the rest (sizes, order, the clock, a speaker's name) is
/// the server's to say.
fn parse_line(number: u64, text: &str) -> Result<Parsed, BadLine> {
    let bad = |field: &str, why: String| BadLine {
        line: number,
        field: Some(field.to_owned()),
        why: format!("{field}: {why}"),
    };
    let line: Line = serde_json::from_str(text).map_err(|e| {
        let field = json_field(text, &e);
        let why = json_error(&e);
        // serde names an unknown or a missing field, not a wrong type's.
        let why = match &field {
            Some(field) if !why.contains("field `") => format!("{field}: {why}"),
            _ => why,
        };
        BadLine {
            line: number,
            field,
            why,
        }
    })?;
    SessionName::parse(&line.session_id).map_err(|e| bad("session_id", e.to_string()))?;
    let subject = line.subject.unwrap_or_default();
    if !subject.is_empty() {
        Subject::parse(&subject).map_err(|e| bad("subject", e.to_string()))?;
    }
    if line.content.is_empty() {
        return Err(bad("content", "must not be empty".to_owned()));
    }
    if let Some(metadata) = &line.metadata {
        let pairs = metadata.iter().map(|(k, v)| (k.as_str(), Some(v.as_str())));
        if let Some(problem) = crate::model::metadata_problems(pairs).into_iter().next() {
            return Err(bad("metadata", problem));
        }
    }
    let role = Role::parse(&line.role).ok_or_else(|| {
        bad(
            "role",
            format!("{:?} is not user, assistant, system or tool", line.role),
        )
    })?;
    let occurred_at = match &line.occurred_at {
        None => None,
        Some(at) => Some(
            humantime::parse_rfc3339_weak(at)
                .map(prost_types::Timestamp::from)
                .map_err(|e| {
                    bad(
                        "occurred_at",
                        format!(
                            "{at:?} is not an RFC 3339 time from 1970 on, such as 2023-11-14T09:12:00Z ({e})"
                        ),
                    )
                })?,
        ),
    };
    // Derived from the line's place and text: the same file imported again
    // names the same entries, which the server does not store twice.
    let client_entry_id = line.client_entry_id.unwrap_or_else(|| {
        let digest = Sha256::digest(format!("{number}\n{text}").as_bytes());
        format!("import:{number}:{}", crate::text::hex(&digest[..8]))
    });
    Ok(Parsed {
        session: line.session_id,
        subject,
        entry: pb::NewEntry {
            client_entry_id,
            role: role_to_pb(role).into(),
            content: line.content,
            occurred_at,
            name: line.name.unwrap_or_default(),
            metadata: line.metadata.unwrap_or_default().into_iter().collect(),
        },
    })
}

/// The longest line read whole: far past any entry a server takes (its
/// content is at most `limits.max_content_bytes`, 64 KiB by default, and a
/// call at most 4 MiB, however the JSON escapes it). A longer line is a
/// bad line, passed over without being held in memory.
const MAX_LINE_BYTES: usize = 8 << 20;

/// The next line of `reader` (without its line ending) and the bytes it
/// took, or why it cannot be read as one (too long, not UTF-8); `None` at
/// the end. `buf` is the caller's, kept between lines.
fn next_line(
    reader: &mut dyn BufRead,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(Result<String, String>, u64)>> {
    use std::io::Read;
    buf.clear();
    let mut taken = reader.take(MAX_LINE_BYTES as u64 + 1);
    let n = taken.read_until(b'\n', buf)? as u64;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE_BYTES {
        let mut skipped = n;
        loop {
            let available = reader.fill_buf()?;
            let (used, end) = match available.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (available.len(), available.is_empty()),
            };
            reader.consume(used);
            skipped += used as u64;
            if end {
                break;
            }
        }
        let why = format!(
            "the line is {skipped} bytes; at most {} MiB are read",
            MAX_LINE_BYTES >> 20
        );
        return Ok(Some((Err(why), skipped)));
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    let text = String::from_utf8(std::mem::take(buf)).map_err(|e| {
        format!(
            "not UTF-8 text (a bad byte after {} bytes)",
            e.utf8_error().valid_up_to()
        )
    });
    Ok(Some((text, n)))
}

/// serde_json's error without its "at line 1 column N" (always line 1
/// here: the file's line number is given instead).
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// The field a line's JSON error is about: the one serde names (an
/// unknown or missing field), or the first key whose value is of the
/// wrong type; None when the line is not a JSON object at all.
fn json_field(text: &str, e: &serde_json::Error) -> Option<String> {
    if e.classify() != serde_json::error::Category::Data {
        return None;
    }
    let message = e.to_string();
    if let Some((_, rest)) = message.split_once("field `")
        && let Some((field, _)) = rest.split_once('`')
    {
        return Some(field.to_owned());
    }
    misfit_key(text)
}

/// The first key of the JSON object `text` whose value has the wrong type.
fn misfit_key(text: &str) -> Option<String> {
    let serde_json::Value::Object(map) = serde_json::from_str(text).ok()? else {
        return None;
    };
    map.iter().find_map(|(key, value)| {
        let fits = match key.as_str() {
            "metadata" => {
                value.is_null()
                    || value
                        .as_object()
                        .is_some_and(|m| m.values().all(serde_json::Value::is_string))
            }
            k if TEXT_KEYS.contains(&k) => {
                value.is_string()
                    || (value.is_null() && !matches!(k, "session_id" | "role" | "content"))
            }
            _ => true,
        };
        (!fits).then(|| key.clone())
    })
}

/// What an import did.
#[derive(Debug, Default)]
struct Tally {
    /// Lines read, blank ones and bad ones too.
    read: u64,
    /// Good lines: sent, or for a dry run to be sent.
    lines: u64,
    stored: u64,
    present: u64,
    sessions: HashSet<String>,
    /// A dry run's bad lines: how many, and the first `MAX_LISTED` of them.
    bad: u64,
    bad_lines: Vec<BadLine>,
}

/// The most bad lines a dry run lists (in `--json`; the first 20 are
/// printed): a file of a million bad lines gives a bounded answer, with
/// the count of them all.
const MAX_LISTED: usize = 1000;
/// The most bad lines a dry run prints.
const MAX_PRINTED: usize = 20;

impl Tally {
    fn line(&self, dry_run: bool) -> String {
        if dry_run {
            let bad = match self.bad {
                0 => String::new(),
                n => format!(", {}", count(n, "bad line", "bad lines")),
            };
            let blank = self.read.saturating_sub(self.lines + self.bad);
            let blank = match blank {
                0 => String::new(),
                n => format!(", {n} blank"),
            };
            return format!(
                "checked {}: {} would be stored, for {}{bad}{blank}; nothing sent (--dry-run)",
                count(self.read, "line", "lines"),
                count(self.lines, "entry", "entries"),
                count(self.sessions.len() as u64, "session", "sessions"),
            );
        }
        format!(
            "imported {}: {} stored, {} already present, {}",
            count(self.lines, "line", "lines"),
            count(self.stored, "entry", "entries"),
            self.present,
            count(self.sessions.len() as u64, "session", "sessions"),
        )
    }

    fn json(&self, dry_run: bool, stopped: Option<&BadLine>) -> serde_json::Value {
        let mut summary = json!({
            "lines_read": self.read,
            "lines": self.lines,
            "stored": self.stored,
            "already_present": self.present,
            "sessions": self.sessions.len(),
            "dry_run": dry_run,
            "stopped_at_line": stopped.map(|b| b.line),
            "error": stopped.map(|b| b.why.clone()),
        });
        if dry_run {
            summary["would_store"] = self.lines.into();
            summary["bad"] = self.bad.into();
            summary["bad_lines"] = self.bad_lines.iter().map(BadLine::json).collect();
        }
        summary
    }
}

/// The batch being gathered: consecutive lines of one session and subject.
#[derive(Default)]
struct Batch {
    session: String,
    subject: String,
    first_line: u64,
    lines: Vec<u64>,
    entries: Vec<pb::NewEntry>,
    /// What its entries take on the wire.
    bytes: usize,
}

/// The most bytes of entries one call carries: well within the server's
/// default message limit (`limits.max_message_bytes`, 4 MiB), so that long
/// lines are sent in smaller batches rather than refused as a whole.
const MAX_BATCH_BYTES: usize = 3 * 1024 * 1024;

/// `archivist import`.
pub async fn run(args: ImportArgs) -> ExitCode {
    exit(import(args).await)
}

async fn import(args: ImportArgs) -> Result<(), Failed> {
    let (reader, size): (Box<dyn BufRead>, Option<u64>) = if args.file == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| Failed::Usage(format!("cannot open {:?}: {e}", args.file)))?;
        let size = file.metadata().ok().map(|m| m.len());
        (Box::new(std::io::BufReader::new(file)), size)
    };
    let mut client = if args.dry_run {
        None
    } else {
        Some(connect(&args.flags).await?)
    };
    let bar = progress(size);
    let mut tally = Tally::default();
    let mut batch = Batch::default();
    let mut read = 0u64;
    let mut stopped = None;
    // Where the stored part ends: the first line of the batch not sent.
    let mut unsent_from = 0;
    let mut reader = reader;
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        let line = next_line(&mut reader, &mut buf);
        number += 1;
        let (text, len) = match line {
            Ok(None) => break,
            Ok(Some(read)) => read,
            Err(e) => {
                unsent_from = if batch.entries.is_empty() {
                    number
                } else {
                    batch.first_line
                };
                stopped = Some(BadLine {
                    line: number,
                    field: None,
                    why: format!("cannot read it: {e}"),
                });
                break;
            }
        };
        read += len;
        tally.read += 1;
        if let Some(bar) = &bar {
            bar.set_position(read);
        }
        let parsed = match text {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => parse_line(number, &text),
            Err(why) => Err(BadLine {
                line: number,
                field: None,
                why,
            }),
        };
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(bad) if args.dry_run => {
                // A dry run reads on, to name every bad line at once.
                tally.bad += 1;
                if tally.bad_lines.len() < MAX_LISTED {
                    tally.bad_lines.push(bad);
                }
                continue;
            }
            Err(bad) => {
                unsent_from = if batch.entries.is_empty() {
                    bad.line
                } else {
                    batch.first_line
                };
                stopped = Some(bad);
                break;
            }
        };
        tally.lines += 1;
        tally.sessions.insert(parsed.session.clone());
        let Some(client) = client.as_mut() else {
            continue;
        };
        let same = batch.session == parsed.session && batch.subject == parsed.subject;
        let size = prost::Message::encoded_len(&parsed.entry) + 8;
        if !batch.entries.is_empty()
            && (!same
                || batch.entries.len() >= args.batch as usize
                || batch.bytes + size > MAX_BATCH_BYTES)
            && let Err(bad) = send(client, &args.flags, &mut batch, &mut tally).await
        {
            unsent_from = batch.first_line;
            stopped = Some(bad);
            break;
        }
        if batch.entries.is_empty() {
            batch.session = parsed.session;
            batch.subject = parsed.subject;
            batch.first_line = number;
        }
        batch.lines.push(number);
        batch.entries.push(parsed.entry);
        batch.bytes += size;
    }
    if stopped.is_none()
        && let Some(client) = client.as_mut()
        && !batch.entries.is_empty()
        && let Err(bad) = send(client, &args.flags, &mut batch, &mut tally).await
    {
        unsent_from = batch.first_line;
        stopped = Some(bad);
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if args.dry_run && !args.flags.json {
        for bad in tally.bad_lines.iter().take(MAX_PRINTED) {
            eprintln!("line {}: {}", bad.line, bad.why);
        }
        if tally.bad > MAX_PRINTED as u64 {
            eprintln!(
                "... and {} more bad lines (--json lists up to {MAX_LISTED})",
                tally.bad - MAX_PRINTED as u64
            );
        }
    }
    let first_bad = tally.bad_lines.first().map(|b| b.line);
    if args.flags.json {
        let stopped = stopped.as_ref().or(tally.bad_lines.first());
        print_json(&tally.json(args.dry_run, stopped));
    } else {
        eprintln!("{}", tally.line(args.dry_run));
    }
    match (stopped, first_bad) {
        (None, None) => Ok(()),
        // A dry run stops only when the file cannot be read on.
        (Some(bad), _) if args.dry_run => Err(Failed::Error(format!(
            "line {}: {}; the lines after it were not checked",
            bad.line, bad.why
        ))),
        (None, Some(first)) => Err(Failed::Error(format!(
            "{} of {} bad (the first: line {first}); fix them and check again",
            count(tally.bad, "line", "lines"),
            tally.read
        ))),
        (Some(bad), _) => Err(Failed::Error(format!(
            "line {}: {}\nstopped there: the lines before line {unsent_from} are stored, nothing from it on; fix the line and run the same import again (what is stored already is not stored twice)",
            bad.line, bad.why
        ))),
    }
}

/// A progress bar on a terminal: by bytes of a file, or a spinner for
/// standard input.
fn progress(size: Option<u64>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match size {
        Some(size) => {
            let bar = ProgressBar::new(size);
            if let Ok(style) = ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} [{elapsed_precise}, eta {eta}]",
            ) {
                bar.set_style(style);
            }
            bar
        }
        None => ProgressBar::new_spinner(),
    };
    Some(bar)
}

/// Sends the batch as one AppendEntries call and counts what it stored;
/// a refusal is told as the line it names (`entries[3]` is the batch's
/// fourth line). The batch is empty after.
async fn send(
    client: &mut crate::client::Client,
    flags: &ClientFlags,
    batch: &mut Batch,
    tally: &mut Tally,
) -> Result<(), BadLine> {
    let req = pb::AppendEntriesRequest {
        session_id: std::mem::take(&mut batch.session),
        entries: std::mem::take(&mut batch.entries),
        subject: std::mem::take(&mut batch.subject),
    };
    let lines = std::mem::take(&mut batch.lines);
    batch.bytes = 0;
    match client.append_entries(request(flags, req)).await {
        Ok(resp) => {
            for e in resp.into_inner().entries {
                if e.duplicate {
                    tally.present += 1;
                } else {
                    tally.stored += 1;
                }
            }
            Ok(())
        }
        Err(status) => Err(refused_line(&status, &lines, batch.first_line)),
    }
}

/// The line a refused call names, and why: the first field violation's
/// `entries[i]` is the batch's `i`th line; a refusal of the whole call is
/// told at the batch's first line.
fn refused_line(status: &tonic::Status, lines: &[u64], first_line: u64) -> BadLine {
    let violations = status
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.clone())
        .unwrap_or_default();
    for v in &violations {
        if let Some(rest) = v.field.strip_prefix("entries[")
            && let Some((index, field)) = rest.split_once(']')
            && let Ok(index) = index.parse::<usize>()
            && let Some(&line) = lines.get(index)
        {
            let field = field.trim_start_matches('.');
            let reason = if v.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", v.reason)
            };
            return BadLine {
                line,
                field: Some(field.to_owned()).filter(|f| !f.is_empty()),
                why: format!("{field}: {}{reason}", v.description),
            };
        }
    }
    BadLine {
        line: first_line,
        field: None,
        why: describe_with_hint(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_checked_and_its_id_derived_from_its_place_and_text() {
        let text = r#"{"session_id":"chat-1","role":"user","content":"hi","name":"Tom","occurred_at":"2023-11-14T09:12:00Z","metadata":{"k":"v"}}"#;
        let a = parse_line(7, text).expect("good line");
        assert_eq!(a.session, "chat-1");
        assert_eq!(a.entry.name, "Tom");
        assert_eq!(
            a.entry.occurred_at.as_ref().map(|t| t.seconds),
            Some(1_699_953_120)
        );
        assert_eq!(a.entry.metadata.get("k").map(String::as_str), Some("v"));
        // The same line at the same place: the same id; elsewhere, another.
        assert_eq!(
            parse_line(7, text).expect("again").entry.client_entry_id,
            a.entry.client_entry_id
        );
        assert_ne!(
            parse_line(8, text).expect("moved").entry.client_entry_id,
            a.entry.client_entry_id
        );
        assert!(a.entry.client_entry_id.starts_with("import:7:"));
        // Given ids are kept.
        let keyed =
            r#"{"session_id":"s","role":"assistant","content":"x","client_entry_id":"m-42"}"#;
        assert_eq!(
            parse_line(1, keyed).expect("keyed").entry.client_entry_id,
            "m-42"
        );
    }

    #[test]
    fn a_line_too_long_or_not_utf8_is_bad_and_the_next_is_read() {
        let mut input = b"first\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        input.extend(b"\n\xff\xfe junk\nlast");
        let mut reader = std::io::Cursor::new(input);
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        while let Some((line, _)) = next_line(&mut reader, &mut buf).expect("read") {
            lines.push(line);
        }
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0].as_deref(), Ok("first"));
        assert!(
            lines[1]
                .as_ref()
                .is_err_and(|why| why.contains("at most 8 MiB")),
            "{:?}",
            lines[1]
        );
        assert!(
            lines[2]
                .as_ref()
                .is_err_and(|why| why.contains("not UTF-8"))
        );
        assert_eq!(lines[3].as_deref(), Ok("last"));
    }

    #[test]
    fn a_bad_line_names_its_number_and_field() {
        for (text, said, field) in [
            (
                r#"{"session_id":"s","role":"user"}"#,
                "missing field `content`",
                Some("content"),
            ),
            (
                r#"{"session_id":"s","role":"boss","content":"x"}"#,
                "role:",
                Some("role"),
            ),
            (
                r#"{"session_id":"a b","role":"user","content":"x"}"#,
                "session_id:",
                Some("session_id"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","occurred_at":"Tuesday"}"#,
                "occurred_at:",
                Some("occurred_at"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","when":"now"}"#,
                "unknown field `when`",
                Some("when"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","metadata":{"n":1}}"#,
                "metadata: invalid type",
                Some("metadata"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":5}"#,
                "content: invalid type",
                Some("content"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":""}"#,
                "content: must not be empty",
                Some("content"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","metadata":{"a b":"c"}}"#,
                "metadata: key \"a b\"",
                Some("metadata"),
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","name":null}"#,
                "",
                None,
            ),
            ("not json", "expected", None),
            ("[1, 2]", "expected", None),
        ] {
            let Err(bad) = parse_line(12, text) else {
                assert_eq!(field, None, "{text} is good");
                continue;
            };
            assert_eq!(bad.line, 12);
            assert!(
                bad.why.starts_with(said) || bad.why.contains(said),
                "{text}: {}",
                bad.why
            );
            assert_eq!(bad.field.as_deref(), field, "{text}: {}", bad.why);
        }
    }
}

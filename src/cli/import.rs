//! `archivist import FILE|-`: a history brought in as it happened, from
//! JSON Lines (one message a line: `session_id`, `role`, `content`, and
//! optionally `name`, `occurred_at` in RFC 3339, `metadata`,
//! `client_entry_id`, `subject`), sent in batches of consecutive lines of
//! one session. A line without `client_entry_id` gets one derived from its
//! line number and text, so a second run stores nothing new. A bad line
//! stops the import, naming its line and field: every earlier batch is
//! kept, nothing of the bad line's batch is stored.

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

/// A bad line: its number (from 1) and what is wrong, naming the field.
#[derive(Debug, PartialEq)]
struct BadLine {
    line: u64,
    why: String,
}

/// A line, checked: where it goes and what it sends.
struct Parsed {
    session: String,
    subject: String,
    entry: pb::NewEntry,
}

/// Reads line `number` (from 1). What the client can tell is wrong (JSON,
/// a missing or unknown key, a role, a session id, a subject, a time) is
/// found here; the rest (sizes, order, the clock) is the server's to say.
fn parse_line(number: u64, text: &str) -> Result<Parsed, BadLine> {
    let bad = |why: String| BadLine { line: number, why };
    let line: Line = serde_json::from_str(text).map_err(|e| bad(json_error(&e)))?;
    SessionName::parse(&line.session_id).map_err(|e| bad(format!("session_id: {e}")))?;
    let subject = line.subject.unwrap_or_default();
    if !subject.is_empty() {
        Subject::parse(&subject).map_err(|e| bad(format!("subject: {e}")))?;
    }
    let role = Role::parse(&line.role).ok_or_else(|| {
        bad(format!(
            "role: {:?} is not user, assistant, system or tool",
            line.role
        ))
    })?;
    let occurred_at = match &line.occurred_at {
        None => None,
        Some(at) => Some(
            humantime::parse_rfc3339_weak(at)
                .map(prost_types::Timestamp::from)
                .map_err(|e| {
                    bad(format!(
                        "occurred_at: {at:?} is not an RFC 3339 time from 1970 on, such as 2023-11-14T09:12:00Z ({e})"
                    ))
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

/// serde_json's error without its "at line 1 column N" (always line 1
/// here: the file's line number is given instead).
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// What an import did.
#[derive(Debug, Default)]
struct Tally {
    lines: u64,
    stored: u64,
    present: u64,
    sessions: HashSet<String>,
}

impl Tally {
    fn line(&self, dry_run: bool) -> String {
        if dry_run {
            return format!(
                "checked {}: {} for {}; nothing sent (--dry-run)",
                count(self.lines, "line", "lines"),
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
        json!({
            "lines": self.lines,
            "stored": self.stored,
            "already_present": self.present,
            "sessions": self.sessions.len(),
            "dry_run": dry_run,
            "stopped_at_line": stopped.map(|b| b.line),
            "error": stopped.map(|b| b.why.clone()),
        })
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
    let mut bad_lines = Vec::new();
    for (i, text) in reader.lines().enumerate() {
        let number = i as u64 + 1;
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                unsent_from = if batch.entries.is_empty() {
                    number
                } else {
                    batch.first_line
                };
                stopped = Some(BadLine {
                    line: number,
                    why: format!("cannot read it: {e}"),
                });
                break;
            }
        };
        read += text.len() as u64 + 1;
        if let Some(bar) = &bar {
            bar.set_position(read);
        }
        if text.trim().is_empty() {
            continue;
        }
        let parsed = match parse_line(number, &text) {
            Ok(parsed) => parsed,
            Err(bad) if args.dry_run => {
                // A dry run reads on, to name every bad line at once.
                bad_lines.push(bad);
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
    if stopped.is_none() && !bad_lines.is_empty() {
        for bad in bad_lines.iter().skip(1).take(19) {
            eprintln!("line {}: {}", bad.line, bad.why);
        }
        if bad_lines.len() > 20 {
            eprintln!("... and {} more bad lines", bad_lines.len() - 20);
        }
        stopped = bad_lines.into_iter().next();
    }
    if args.flags.json {
        print_json(&tally.json(args.dry_run, stopped.as_ref()));
    } else {
        eprintln!("{}", tally.line(args.dry_run));
    }
    match stopped {
        None => Ok(()),
        Some(bad) if args.dry_run => Err(Failed::Error(format!("line {}: {}", bad.line, bad.why))),
        Some(bad) => Err(Failed::Error(format!(
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
                why: format!("{field}: {}{reason}", v.description),
            };
        }
    }
    BadLine {
        line: first_line,
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
    fn a_bad_line_names_its_number_and_field() {
        for (text, field) in [
            (
                r#"{"session_id":"s","role":"user"}"#,
                "missing field `content`",
            ),
            (r#"{"session_id":"s","role":"boss","content":"x"}"#, "role:"),
            (
                r#"{"session_id":"a b","role":"user","content":"x"}"#,
                "session_id:",
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","occurred_at":"Tuesday"}"#,
                "occurred_at:",
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","when":"now"}"#,
                "unknown field `when`",
            ),
            (
                r#"{"session_id":"s","role":"user","content":"x","metadata":{"n":1}}"#,
                "invalid type",
            ),
            ("not json", "expected"),
        ] {
            let bad = parse_line(12, text).err().expect(text);
            assert_eq!(bad.line, 12);
            assert!(bad.why.contains(field), "{text}: {}", bad.why);
        }
    }
}

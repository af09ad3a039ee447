//! The client commands that only read: a session's segments (`show`) and
//! transcript (`entries`), the tenant's sessions (`archivist sessions`)
//! and the backlog.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::output::*;
use super::terminal::{ClientFlags, Failed, all_segments, connect, print_json, print_out, request};
use crate::client::Client;
use crate::pb;
use crate::text::{count, human_duration};

pub(super) async fn show(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
) -> Result<(), Failed> {
    let segments = all_segments(client, flags, session, Vec::new(), 100).await?;
    if flags.json {
        print_json(&json!({
            "session_id": session,
            "segments": segments.iter().map(wire_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if segments.is_empty() {
        println!("{session} has no segments");
    }
    for seg in &segments {
        print_segment(seg);
    }
    Ok(())
}

/// The most entries one page asks for: the server's cap.
const ENTRIES_PAGE: u64 = 1000;

/// `session entries`: the transcript after the seq `after`, page by page,
/// each page printed as it comes (a line per entry, or a JSON object per
/// line), `limit` entries at most. A reader that goes away (`| head`) ends
/// it quietly.
pub(super) async fn list_entries(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
    after: u64,
    limit: Option<u64>,
) -> Result<(), Failed> {
    let mut next = after;
    let mut left = limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    while left > 0 {
        let resp = client
            .list_entries(request(
                flags,
                pb::ListEntriesRequest {
                    session_id: session.to_owned(),
                    after_seq: next,
                    page_size: left.min(ENTRIES_PAGE) as u32,
                },
            ))
            .await?
            .into_inner();
        for e in resp
            .entries
            .iter()
            .take(usize::try_from(left).unwrap_or(usize::MAX))
        {
            let line = match flags.json {
                true => wire_json(e).to_string(),
                false => entry_line(e),
            };
            if !print_out(&format!("{line}\n"))? {
                return Ok(());
            }
            printed += 1;
            left -= 1;
        }
        if resp.next_after_seq == 0 {
            break;
        }
        next = resp.next_after_seq;
    }
    if printed == 0 && !flags.json {
        eprintln!("{session} has no entries after seq {after}");
    }
    Ok(())
}

/// The tenant's sessions, or only a subject's.
pub(super) async fn list_sessions(
    flags: &ClientFlags,
    subject: Option<&str>,
) -> Result<(), Failed> {
    let mut client = connect(flags).await?;
    let mut sessions = Vec::new();
    let mut token = String::new();
    loop {
        let resp = client
            .list_sessions(request(
                flags,
                pb::ListSessionsRequest {
                    page_size: 200,
                    page_token: token,
                    subject: subject.unwrap_or_default().to_owned(),
                },
            ))
            .await?
            .into_inner();
        sessions.extend(resp.sessions);
        if resp.next_page_token.is_empty() {
            break;
        }
        token = resp.next_page_token;
    }
    if flags.json {
        print_json(&json!({
            "sessions": sessions.iter().map(wire_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if sessions.is_empty() {
        match subject {
            Some(subject) => println!("no sessions of subject {subject}"),
            None => println!("no sessions yet: `archivist session append NAME TEXT` starts one"),
        }
        return Ok(());
    }
    let now = SystemTime::now();
    for s in &sessions {
        let open = match s.open_segment_id {
            Some(id) => format!("segment {id} open"),
            None => "nothing open".to_owned(),
        };
        let of = match s.subject.as_str() {
            "" => String::new(),
            subject => format!(" (subject {subject})"),
        };
        println!(
            "{}{of}: {}, {}, {} pending, {} parked, last append {}",
            s.session_id,
            count(s.entry_count, "entry", "entries"),
            open,
            s.pending,
            s.parked,
            s.last_append_at
                .as_ref()
                .map(|t| when(t, now))
                .unwrap_or_else(|| "never".to_owned())
        );
    }
    Ok(())
}

pub(super) async fn show_backlog(flags: &ClientFlags) -> Result<(), Failed> {
    let mut client = connect(flags).await?;
    let b = client
        .get_backlog(request(flags, pb::GetBacklogRequest {}))
        .await?
        .into_inner();
    let oldest = b
        .oldest_pending_age
        .and_then(|d| Duration::try_from(d).ok());
    if flags.json {
        print_json(&wire_json(&b));
        return Ok(());
    }
    println!("open: {}", b.open);
    match oldest {
        Some(age) if b.pending > 0 => println!(
            "pending: {} (the oldest closed {} ago)",
            b.pending,
            human_duration(age)
        ),
        _ => println!("pending: {}", b.pending),
    }
    println!("summarised: {}", b.summarised);
    println!("parked: {}", b.parked);
    let mut by_class: Vec<(&String, &u64)> = b.parked_by_class.iter().collect();
    by_class.sort();
    for (class, n) in by_class {
        println!("  {class}: {n}");
    }
    if let Some(e) = b.embeddings.as_ref().filter(|e| owes_or_holds(e)) {
        print_embedding_backlog(e);
    }
    if b.unindexed > 0 {
        let age = b
            .oldest_unindexed_age
            .and_then(|d| Duration::try_from(d).ok())
            .map(|a| format!(", the oldest stored {} ago", human_duration(a)))
            .unwrap_or_default();
        println!(
            "not yet in the search index: {}{age} (indexed just behind the appends; a search finds them all the same)",
            b.unindexed
        );
    }
    if b.erasures_pending > 0 {
        println!(
            "erasures pending: {} (erased, but their text is still in the write-ahead log: another program holds a read of the database; it leaves the files once that read ends)",
            b.erasures_pending
        );
    }
    if b.parked > 0 {
        println!(
            "parked segments wait for a fixed provider setup: `archivist check` (with the server's configuration) shows what is wrong; once fixed, restart the server or run `archivist session requeue --include-parked`"
        );
    }
    Ok(())
}

/// Whether the embedding part says anything: all 0 (and no failure) when
/// the server has embeddings off, or on with nothing stored yet.
fn owes_or_holds(e: &pb::EmbeddingBacklog) -> bool {
    e.pending > 0 || e.parked > 0 || e.embedded > 0 || e.last_failure.is_some()
}

/// What is owed an embedding, as the recap backlog above it: counts, the
/// parked by class, the last failure with its fix.
fn print_embedding_backlog(e: &pb::EmbeddingBacklog) {
    println!("embeddings:");
    println!("  embedded: {}", e.embedded);
    println!("  pending: {}", e.pending);
    if e.deferred > 0 {
        println!(
            "    deferred by the embedder (rate limited or out of quota): {}; \
             `archivist session requeue` makes them due now",
            e.deferred
        );
    }
    println!("  parked: {}", e.parked);
    let mut by_class: Vec<(&String, &u64)> = e.parked_by_class.iter().collect();
    by_class.sort();
    for (class, n) in by_class {
        println!("    {class}: {n}");
    }
    if let Some(f) = &e.last_failure {
        println!("  last failure: {}", failure_line(f));
        if !f.hint.is_empty() {
            println!("  fix: {}", f.hint);
        }
    }
    if e.parked > 0 {
        println!("  {PARKED_EMBEDDINGS}");
    }
}

//! `archivist session …`: a small terminal client, so a person can try the
//! service without writing code.

use std::io::Read;

use clap::{Args, Subcommand};

use crate::client::{CallError, ClientOptions, connect_with};
use crate::model::{Role, SegmentState};
use crate::pb;
use crate::wire::{role_from_pb, role_to_pb, state_from_pb};

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The server to talk to (https:// for TLS).
    #[arg(long, env = "ARCHIVIST_SERVER", default_value = crate::client::DEFAULT_SERVER, global = true)]
    pub server: String,
    /// The tenant's bearer token.
    #[arg(long, env = "ARCHIVIST_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// PEM CA certificate to trust for the server (TLS).
    #[arg(long, global = true)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// PEM client certificate, for mutual TLS.
    #[arg(long, global = true, requires = "client_key")]
    pub client_cert: Option<std::path::PathBuf>,
    /// PEM client key, for mutual TLS.
    #[arg(long, global = true, requires = "client_cert")]
    pub client_key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: SessionCommand,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Append one entry (the text arguments, or standard input if none).
    Append {
        session: String,
        /// user, assistant, system or tool.
        #[arg(long, default_value = "user")]
        role: String,
        /// Idempotency key: the same id is stored once.
        #[arg(long = "id")]
        client_entry_id: Option<String>,
        text: Vec<String>,
    },
    /// Close the open segment and schedule its recap.
    Close {
        session: String,
        /// Wait for the recap pass to end.
        #[arg(long)]
        wait: bool,
    },
    /// Close the open segment and wait for every pending recap (bounded).
    Flush { session: String },
    /// List the session's segments with their states and summaries.
    Show { session: String },
    /// Erase the session: its entries, segments, roll-ups and summaries.
    /// Asks first on a terminal.
    Delete {
        session: String,
        /// Do not ask (for scripts; required when not on a terminal).
        #[arg(long)]
        yes: bool,
    },
    /// Print the session's events (closed, summarised, failed, parked,
    /// deleted) as they happen, until it is erased or the server stops.
    Watch { session: String },
    /// Show the session's memory tree: each roll-up above the nodes it
    /// covers, newest last.
    Tree { session: String },
    /// Print what an agent would put in its prompt.
    Context {
        session: String,
        /// Token budget; 0 means no limit.
        #[arg(long, default_value_t = 0)]
        max_tokens: u32,
    },
}

/// Runs the command; the error is the text to print, already formatted.
pub async fn run(args: SessionArgs) -> Result<(), String> {
    let mut client = connect_with(&ClientOptions {
        address: args.server.clone(),
        token: args.token.clone(),
        ca_cert: args.ca_cert.clone(),
        client_cert: args.client_cert.clone(),
        client_key: args.client_key.clone(),
    })
    .await
    .map_err(|e| crate::failure::cause_chain(&e).join(": "))?;
    match args.command {
        SessionCommand::Append {
            session,
            role,
            client_entry_id,
            text,
        } => {
            let role = parse_role(&role)?;
            let content = if text.is_empty() {
                let mut buf = String::new();
                std::io::stdin()
                    .read_to_string(&mut buf)
                    .map_err(|e| format!("cannot read standard input: {e}"))?;
                buf.trim_end().to_owned()
            } else {
                text.join(" ")
            };
            let resp = client
                .append_entries(pb::AppendEntriesRequest {
                    session_id: session,
                    entries: vec![pb::NewEntry {
                        client_entry_id: client_entry_id.unwrap_or_default(),
                        role: role.into(),
                        content,
                    }],
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            for e in &resp.entries {
                let dup = if e.duplicate { " (already stored)" } else { "" };
                println!("appended seq {}{dup}", e.seq);
            }
            for id in &resp.closed_segment_ids {
                println!("closed segment {id}; its recap runs in the background");
            }
        }
        SessionCommand::Close { session, wait } => {
            let resp = client
                .close_segment(pb::CloseSegmentRequest {
                    session_id: session,
                    wait,
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            match resp.segment {
                Some(seg) => print_segment(&seg),
                None => println!("nothing was open"),
            }
        }
        SessionCommand::Flush { session } => {
            let resp = client
                .flush_session(pb::FlushSessionRequest {
                    session_id: session,
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            for seg in &resp.segments {
                print_segment(seg);
            }
            println!(
                "{}",
                if resp.complete {
                    "complete: every segment is summarised"
                } else {
                    "not complete: what is left stays PENDING and the server keeps at it"
                }
            );
        }
        SessionCommand::Show { session } => {
            let mut token = String::new();
            loop {
                let resp = client
                    .list_segments(pb::ListSegmentsRequest {
                        levels: Vec::new(),
                        session_id: session.clone(),
                        states: Vec::new(),
                        page_size: 100,
                        page_token: token,
                    })
                    .await
                    .map_err(|s| describe(&s))?
                    .into_inner();
                for seg in &resp.segments {
                    print_segment(seg);
                }
                if resp.next_page_token.is_empty() {
                    break;
                }
                token = resp.next_page_token;
            }
        }
        SessionCommand::Delete { session, yes } => {
            if !yes {
                confirm(&format!(
                    "Erase session {session:?} and everything archivist keeps of it? [y/N] "
                ))?;
            }
            let resp = client
                .delete_session(pb::DeleteSessionRequest {
                    session_id: session.clone(),
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            println!(
                "erased session {session}: {} entries, {} segments and roll-ups",
                resp.entries_deleted, resp.segments_deleted
            );
        }
        SessionCommand::Watch { session } => {
            let mut stream = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: session,
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(event)) => print_event(&event),
                    Ok(None) => break,
                    Err(status) => return Err(describe(&status)),
                }
            }
        }
        SessionCommand::Tree { session } => {
            let mut nodes = Vec::new();
            let mut token = String::new();
            loop {
                let resp = client
                    .list_segments(pb::ListSegmentsRequest {
                        session_id: session.clone(),
                        levels: (1..=TREE_DEPTH).collect(),
                        page_size: 1000,
                        page_token: token,
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| describe(&s))?
                    .into_inner();
                nodes.extend(resp.segments);
                if resp.next_page_token.is_empty() {
                    break;
                }
                token = resp.next_page_token;
            }
            if nodes.is_empty() {
                println!("no segments yet");
            }
            print!("{}", render_tree(&nodes));
        }
        SessionCommand::Context {
            session,
            max_tokens,
        } => {
            let resp = client
                .get_context(pb::GetContextRequest {
                    session_id: session,
                    max_tokens,
                })
                .await
                .map_err(|s| describe(&s))?
                .into_inner();
            if resp.truncated {
                println!("[older items dropped to fit {max_tokens} tokens]");
            }
            for item in resp.items {
                match item.item {
                    Some(pb::context_item::Item::Summary(s)) => {
                        let summary = s.summary.unwrap_or_default();
                        println!(
                            "[level {} summary of seq {}..{} by {}]\n{}",
                            s.level, s.first_seq, s.last_seq, summary.provider, summary.text
                        );
                    }
                    Some(pb::context_item::Item::Entry(e)) => {
                        println!("{} {}: {}", e.seq, role_name(e.role), e.content);
                    }
                    None => {}
                }
            }
        }
    }
    Ok(())
}

fn parse_role(name: &str) -> Result<pb::Role, String> {
    Role::parse(name)
        .map(role_to_pb)
        .ok_or_else(|| format!("unknown role {name:?}: use user, assistant, system or tool"))
}

fn role_name(role: i32) -> &'static str {
    role_from_pb(role).map_or("?", Role::as_str)
}

fn state_name(state: i32) -> &'static str {
    state_from_pb(state).map_or("?", SegmentState::as_str)
}

/// Levels `session tree` asks for: with fanout 4, level 16 covers four
/// billion segments.
const TREE_DEPTH: u32 = 16;

/// The nodes as a tree: roots (nodes no roll-up covers) oldest first, each
/// roll-up's children indented beneath it.
fn render_tree(nodes: &[pb::Segment]) -> String {
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

/// Asks on the terminal; anything but yes is an error. Off a terminal there
/// is nobody to ask, so `--yes` is required.
fn confirm(question: &str) -> Result<(), String> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err("not on a terminal, so nobody can confirm: pass --yes to erase".to_owned());
    }
    print!("{question}");
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err("not erased".to_owned()),
    }
}

fn print_event(event: &pb::SessionEvent) {
    let at = event
        .at
        .and_then(|t| std::time::SystemTime::try_from(t).ok())
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default();
    let kind = match pb::SessionEventKind::try_from(event.kind) {
        Ok(pb::SessionEventKind::Closed) => "CLOSED",
        Ok(pb::SessionEventKind::Summarised) => "SUMMARISED",
        Ok(pb::SessionEventKind::Failed) => "FAILED",
        Ok(pb::SessionEventKind::Parked) => "PARKED",
        Ok(pb::SessionEventKind::Deleted) => "DELETED",
        Ok(pb::SessionEventKind::Gap) => {
            println!(
                "{at} GAP: {} events lost (this watcher fell behind)",
                event.missed
            );
            return;
        }
        Ok(pb::SessionEventKind::Unspecified) | Err(_) => "?",
    };
    match &event.segment {
        Some(seg) => {
            let failure = seg
                .last_failure
                .as_ref()
                .and_then(|f| f.causes.last())
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            println!(
                "{at} {kind} level {} #{} (id {}) seq {}..{}{}",
                seg.level,
                seg.ordinal,
                seg.id,
                seg.first_seq,
                seg.last_seq,
                if kind == "FAILED" || kind == "PARKED" {
                    failure
                } else {
                    String::new()
                }
            );
        }
        None => println!("{at} {kind}"),
    }
}

fn print_segment(seg: &pb::Segment) {
    println!(
        "segment {} (#{} of {}): {}, seq {}..{}, {} entries, {} attempt(s)",
        seg.id,
        seg.ordinal,
        seg.session_id,
        state_name(seg.state),
        seg.first_seq,
        seg.last_seq,
        seg.entry_count,
        seg.attempts
    );
    if let Some(s) = &seg.summary {
        for line in s.text.lines() {
            println!("    {line}");
        }
        println!("    [{} / {}]", s.provider, s.model);
    }
    if let Some(f) = &seg.last_failure {
        println!("    last failure: {}", f.causes.join(": "));
    }
}

/// A failed call as lines for a person: the status, then every cause.
pub fn describe(status: &tonic::Status) -> String {
    let error = CallError::from_status(status);
    let mut out = error.to_string();
    for (field, description) in &error.violations {
        out.push_str(&format!("\n  {field}: {description}"));
    }
    if let Some(wait) = error.retry_after {
        out.push_str(&format!("\n  retry after {wait:?}"));
    }
    for cause in error.chain() {
        out.push_str(&format!("\ncaused by: {cause}"));
    }
    out
}

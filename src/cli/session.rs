//! The terminal client: `archivist session …`, `archivist sessions` and
//! `archivist backlog`, so a person can try and watch the service without
//! writing code. Every command prints JSON on standard output with
//! `--json`; messages for a person (progress, errors) go to standard error.
//!
//! Exit status: 0 done; 1 an error (the call failed, or no server); 3 a
//! close or flush that worked whose recap is not there (failed, or still
//! running at the bound); 64 a usage error.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

pub use super::output::describe;
use super::output::*;
use super::reads::{list_entries, list_sessions, show, show_backlog};
pub use super::terminal::ClientFlags;
use super::terminal::{
    Failed, all_segments, check_session, check_subject, connect, ensure_session, exit,
    parse_min_similarity, parse_role, print_json, request,
};
use super::waits::{close, flush};
use crate::pb;
use crate::text::count;

#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(flatten)]
    pub flags: ClientFlags,
    #[command(subcommand)]
    pub command: SessionCommand,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Append one entry: the text arguments, or standard input if none.
    Append {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// user, assistant, system or tool.
        #[arg(long, default_value = "user")]
        role: String,
        /// Idempotency key: the same id with the same text is stored once;
        /// the same id with other text is refused.
        #[arg(long = "id")]
        client_entry_id: Option<String>,
        /// Whose memory the session is (a user, a customer): 1 to 256
        /// characters of letters, digits and . _ : @ -. Fixed by the append
        /// that creates the session; another one later is refused.
        #[arg(long)]
        subject: Option<String>,
        /// Who said it: a participant's name (1 to 64 characters).
        #[arg(long)]
        name: Option<String>,
        /// When it was said: an RFC 3339 time (2023-11-14T09:12:00Z) or a
        /// duration ago ("2h"); default now. Never before the session's
        /// newest entry.
        #[arg(long = "at", value_name = "TIME")]
        at: Option<String>,
        /// A metadata pair KEY=VALUE (repeatable, at most 16).
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        text: Vec<String>,
    },
    /// Close the open segment and schedule its recap.
    Close {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// Wait for the recap pass to end (exit status 3 if the segment was
        /// closed but its recap failed or is still running).
        #[arg(long)]
        wait: bool,
    },
    /// Close the open segment and wait for every pending recap (bounded by
    /// the server's flush.ceiling; exit status 3 if not all are done).
    Flush {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
    },
    /// The session's segments: states, summaries, attempts, the next
    /// attempt, and what to do about a failure.
    Show {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
    },
    /// Erase the session: its entries, segments, roll-ups and summaries.
    /// Asks first on a terminal.
    Delete {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// Do not ask (for scripts; required when not on a terminal).
        #[arg(long)]
        yes: bool,
    },
    /// Print the session's events (closed, summarised, failed, parked,
    /// deleted) as they happen, until it is erased or the server stops.
    Watch {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
    },
    /// The session's memory tree: each roll-up above the nodes it covers.
    Tree {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
    },
    /// The session's transcript: its entries as they were appended, oldest
    /// first, summarised or not; one line each ("seq role: content"), or
    /// with --json one JSON object per line.
    Entries {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// Only the entries after this seq.
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        after: u64,
        /// At most this many entries (default: every one).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
    },
    /// What an agent would put in its prompt.
    Context {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// Token budget; 0 means the server's cap (limits.max_context_tokens).
        #[arg(long, default_value_t = 0)]
        max_tokens: u32,
        /// The question of the turn (the user's message): what the memory of
        /// the session's subject holds about it comes first, marked
        /// [recalled], within the server's context.recall_tokens.
        #[arg(long, value_name = "TEXT")]
        query: Option<String>,
        /// With --query: leave out of the recall what only meaning found
        /// whose similarity (the cosine to the query, -1 to 1) is below
        /// this; what the words found stays. Default: none.
        #[arg(long, value_name = "COSINE", allow_hyphen_values = true, value_parser = parse_min_similarity)]
        min_similarity: Option<f32>,
    },
    /// Make the session's (or, with no session, every) PENDING segment due
    /// now, and PARKED ones too with --include-parked.
    Requeue {
        /// The session id (none: every session).
        session: Option<String>,
        /// Only these segments (repeatable).
        #[arg(long = "segment", value_name = "ID")]
        segments: Vec<u64>,
        /// Also PARKED segments (after fixing the provider setup).
        #[arg(long)]
        include_parked: bool,
    },
}

#[derive(Debug, Args)]
pub struct SessionsArgs {
    #[command(flatten)]
    pub flags: ClientFlags,
    /// Only the sessions of this subject.
    #[arg(long)]
    pub subject: Option<String>,
}

#[derive(Debug, Args)]
pub struct ForgetSubjectArgs {
    #[command(flatten)]
    pub flags: ClientFlags,
    /// The subject whose every session is erased.
    pub subject: String,
    /// Do not ask (for scripts; required when not on a terminal).
    #[arg(long)]
    pub yes: bool,
}

/// `archivist session …`.
pub async fn run(args: SessionArgs) -> ExitCode {
    exit(session(args).await)
}

/// `archivist sessions`: the tenant's sessions (or a subject's), in name
/// order.
pub async fn sessions(args: SessionsArgs) -> ExitCode {
    let listed = async {
        if let Some(subject) = &args.subject {
            check_subject(subject)?;
        }
        list_sessions(&args.flags, args.subject.as_deref()).await
    };
    exit(listed.await)
}

/// `archivist forget-subject`: erases every session of a subject.
pub async fn forget_subject(args: ForgetSubjectArgs) -> ExitCode {
    exit(forget(args).await)
}

async fn forget(args: ForgetSubjectArgs) -> Result<(), Failed> {
    let (flags, subject) = (&args.flags, args.subject);
    check_subject(&subject)?;
    if !args.yes {
        confirm(&format!(
            "Erase every session of subject {subject:?} and everything archivist keeps of them? [y/N] "
        ))?;
    }
    let mut client = connect(flags).await?;
    let resp = client
        .delete_subject(request(
            flags,
            pb::DeleteSubjectRequest {
                subject: subject.clone(),
            },
        ))
        .await?
        .into_inner();
    if flags.json {
        let mut out = wire_json(&resp);
        if let Some(map) = out.as_object_mut() {
            map.insert("subject".to_owned(), json!(subject));
        }
        print_json(&out);
    } else {
        println!(
            "erased subject {subject}: {}, {} and {} of the memory tree (segments and roll-ups)",
            count(resp.sessions_deleted, "session", "sessions"),
            count(resp.entries_deleted, "entry", "entries"),
            count(resp.segments_deleted, "node", "nodes"),
        );
    }
    Ok(())
}

/// `archivist backlog`: segments per state, the oldest pending, parked per
/// class.
pub async fn backlog(flags: ClientFlags) -> ExitCode {
    exit(show_backlog(&flags).await)
}

async fn session(args: SessionArgs) -> Result<(), Failed> {
    let flags = &args.flags;
    // Checked before connecting, so a typo is told as one.
    match &args.command {
        SessionCommand::Append {
            session,
            role,
            subject,
            at,
            metadata,
            ..
        } => {
            check_session(session)?;
            parse_role(role)?;
            if let Some(subject) = subject {
                check_subject(subject)?;
            }
            if let Some(at) = at {
                super::parse_time(at).map_err(|e| Failed::Usage(format!("--at: {e}")))?;
            }
            for pair in metadata {
                if !pair.contains('=') {
                    return Err(Failed::Usage(format!(
                        "--meta {pair:?}: write a pair as KEY=VALUE"
                    )));
                }
            }
        }
        SessionCommand::Close { session, .. }
        | SessionCommand::Flush { session }
        | SessionCommand::Show { session }
        | SessionCommand::Delete { session, .. }
        | SessionCommand::Watch { session }
        | SessionCommand::Tree { session }
        | SessionCommand::Entries { session, .. } => check_session(session)?,
        SessionCommand::Context { session, .. } => check_session(session)?,
        SessionCommand::Requeue { session, .. } => {
            if let Some(session) = session {
                check_session(session)?;
            }
        }
    }
    let content = match &args.command {
        SessionCommand::Append { text, .. } => Some(entry_text(text)?),
        _ => None,
    };
    let mut client = connect(flags).await?;
    match args.command {
        SessionCommand::Append {
            session,
            role,
            client_entry_id,
            subject,
            name,
            at,
            metadata,
            ..
        } => {
            let occurred_at = at
                .as_deref()
                .map(super::parse_time)
                .transpose()
                .map_err(|e| Failed::Usage(format!("--at: {e}")))?
                .map(crate::wire::timestamp);
            let metadata = metadata
                .iter()
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            let resp = client
                .append_entries(request(
                    flags,
                    pb::AppendEntriesRequest {
                        session_id: session.clone(),
                        entries: vec![pb::NewEntry {
                            client_entry_id: client_entry_id.unwrap_or_default(),
                            role: parse_role(&role)?.into(),
                            content: content.unwrap_or_default(),
                            occurred_at,
                            name: name.unwrap_or_default(),
                            metadata,
                        }],
                        subject: subject.unwrap_or_default(),
                    },
                ))
                .await?
                .into_inner();
            if flags.json {
                print_json(&session_wire_json(&session, &resp));
                return Ok(());
            }
            for e in &resp.entries {
                if e.duplicate {
                    println!(
                        "already stored as seq {} (id {:?}); nothing new was stored",
                        e.seq, e.client_entry_id
                    );
                } else {
                    println!("appended seq {} to {session}", e.seq);
                }
            }
            for id in &resp.closed_segment_ids {
                println!("closed segment {id} (it was full); its recap runs in the background");
            }
            Ok(())
        }
        SessionCommand::Close { session, wait } => close(&mut client, flags, &session, wait).await,
        SessionCommand::Flush { session } => flush(&mut client, flags, &session).await,
        SessionCommand::Show { session } => show(&mut client, flags, &session).await,
        SessionCommand::Delete { session, yes } => {
            if !yes {
                confirm(&format!(
                    "Erase session {session:?} and everything archivist keeps of it? [y/N] "
                ))?;
            }
            let resp = client
                .delete_session(request(
                    flags,
                    pb::DeleteSessionRequest {
                        session_id: session.clone(),
                    },
                ))
                .await?
                .into_inner();
            if flags.json {
                print_json(&session_wire_json(&session, &resp));
            } else {
                // segments_deleted counts roll-ups too.
                println!(
                    "erased session {session}: {} and {} of the memory tree (segments and roll-ups)",
                    count(resp.entries_deleted, "entry", "entries"),
                    count(resp.segments_deleted, "node", "nodes"),
                );
            }
            Ok(())
        }
        SessionCommand::Watch { session } => {
            // A watch runs until the session ends: no --timeout applies.
            let mut stream = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: session,
                })
                .await?
                .into_inner();
            while let Some(event) = stream.message().await? {
                if flags.json {
                    println!("{}", wire_json(&event));
                } else {
                    print_event(&event);
                }
            }
            Ok(())
        }
        SessionCommand::Tree { session } => {
            let levels = (1..=TREE_DEPTH).collect();
            let nodes = all_segments(&mut client, flags, &session, levels, 1000).await?;
            if flags.json {
                print_json(&json!({
                    "session_id": session,
                    "nodes": nodes.iter().map(wire_json).collect::<Vec<_>>(),
                }));
            } else if nodes.is_empty() {
                println!("no segments yet");
            } else {
                print!("{}", render_tree(&nodes));
            }
            Ok(())
        }
        SessionCommand::Entries {
            session,
            after,
            limit,
        } => list_entries(&mut client, flags, &session, after, limit).await,
        SessionCommand::Context {
            session,
            max_tokens,
            query,
            min_similarity,
        } => {
            let resp = client
                .get_context(request(
                    flags,
                    pb::GetContextRequest {
                        session_id: session.clone(),
                        max_tokens,
                        query: query.unwrap_or_default(),
                        min_similarity,
                    },
                ))
                .await?
                .into_inner();
            if flags.json {
                print_json(&wire_json(&resp));
                return Ok(());
            }
            if resp.truncated {
                println!("[older items dropped to fit {max_tokens} tokens]");
            }
            let now = std::time::SystemTime::now();
            let mut rank = 0;
            for item in resp.items {
                match item.item {
                    Some(pb::context_item::Item::Recalled(r)) => {
                        rank += 1;
                        print!("{}", render_recalled(rank, &r, now));
                    }
                    Some(pb::context_item::Item::Summary(s)) => {
                        let summary = s.summary.unwrap_or_default();
                        println!(
                            "[level {} summary of seq {}..{} by {}]\n{}",
                            s.level, s.first_seq, s.last_seq, summary.provider, summary.text
                        );
                    }
                    Some(pb::context_item::Item::Entry(e)) => println!("{}", entry_line(&e)),
                    None => {}
                }
            }
            Ok(())
        }
        SessionCommand::Requeue {
            session,
            segments,
            include_parked,
        } => {
            let resp = client
                .requeue_segments(request(
                    flags,
                    pb::RequeueSegmentsRequest {
                        session_id: session.clone().unwrap_or_default(),
                        segment_ids: segments,
                        include_parked,
                    },
                ))
                .await?
                .into_inner();
            if resp.requeued == 0
                && resp.embeddings_requeued == 0
                && let Some(session) = &session
            {
                // A requeue of a session that is not there is NOT_FOUND,
                // as every other command says.
                ensure_session(&mut client, flags, session).await?;
            }
            if flags.json {
                print_json(&wire_json(&resp));
            } else if resp.requeued == 0 && resp.embeddings_requeued == 0 {
                println!(
                    "nothing to requeue: no matching segment is {}",
                    if include_parked {
                        "PENDING or PARKED"
                    } else {
                        "PENDING (add --include-parked for PARKED ones)"
                    }
                );
            } else {
                let mut what = vec![count(resp.requeued, "segment", "segments")];
                if resp.embeddings_requeued > 0 {
                    what.push(count(
                        resp.embeddings_requeued,
                        "text owed an embedding",
                        "texts owed an embedding",
                    ));
                }
                println!(
                    "requeued {}; the server takes them up now",
                    what.join(" and ")
                );
            }
            Ok(())
        }
    }
}

/// The text of an entry: the arguments, else standard input (with a
/// prompt on a terminal, so nobody waits on a silent one).
fn entry_text(args: &[String]) -> Result<String, Failed> {
    let text = if args.is_empty() {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            eprintln!(
                "Type the entry's text, then press Ctrl-D on a line of its own (or give the text as arguments)."
            );
        }
        let mut buf = String::new();
        stdin
            .lock()
            .read_to_string(&mut buf)
            .map_err(|e| Failed::Error(format!("cannot read standard input: {e}")))?;
        buf.trim_end().to_owned()
    } else {
        args.join(" ")
    };
    if text.trim().is_empty() {
        return Err(Failed::Usage(
            "nothing to append: give the text as arguments or on standard input".to_owned(),
        ));
    }
    Ok(text)
}

/// Asks on the terminal; anything but yes ends the command. Off a terminal
/// nobody can answer, so `--yes` is required.
fn confirm(question: &str) -> Result<(), Failed> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(Failed::Usage(
            "not on a terminal, so nobody can confirm: pass --yes to erase".to_owned(),
        ));
    }
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failed::Error(format!("cannot read the answer: {e}")))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failed::Error("not erased".to_owned())),
    }
}

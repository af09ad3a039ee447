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
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::client::{CallError, Client, ClientOptions, DEFAULT_SERVER, connect_with};
use crate::model::{Role, SegmentState};
use crate::pb;
use crate::text::{count, human_duration};
use crate::wire::{role_from_pb, role_to_pb, state_from_pb};

/// Exit status of a close or flush that worked while a recap is not there:
/// it failed, or was still running when the call's bound came.
pub const EXIT_RECAP_NOT_DONE: u8 = 3;

/// How to reach the server, and how to print; shared by every client
/// command.
#[derive(Debug, Args)]
pub struct ClientFlags {
    /// The server to talk to (https:// for TLS).
    #[arg(long, env = "ARCHIVIST_SERVER", default_value = DEFAULT_SERVER, global = true)]
    pub server: String,
    /// The tenant's bearer token (a server with [[auth.tenants]] needs one).
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
    /// The longest a call may take ("10s", "2m"); a waiting close or flush
    /// answers with the state as it stands a little before it. Default: no
    /// limit of the client's own (the server's bounds hold).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, global = true)]
    pub timeout: Option<Duration>,
    /// Print the result as JSON on standard output.
    #[arg(long, global = true)]
    pub json: bool,
}

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
    /// What an agent would put in its prompt.
    Context {
        /// The session id: 1 to 128 characters of letters, digits and . _ : -
        session: String,
        /// Token budget; 0 means no limit.
        #[arg(long, default_value_t = 0)]
        max_tokens: u32,
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

/// Why a command did not end well.
enum Failed {
    /// A call failed, or there is no server: exit 1.
    Error(String),
    /// The arguments make no sense: exit 64.
    Usage(String),
    /// A close or flush worked but a recap is not there: exit 3 (what
    /// happened is already printed).
    RecapNotDone,
}

impl From<tonic::Status> for Failed {
    fn from(status: tonic::Status) -> Failed {
        Failed::Error(describe_with_hint(&status))
    }
}

fn exit(result: Result<(), Failed>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed::RecapNotDone) => ExitCode::from(EXIT_RECAP_NOT_DONE),
        Err(Failed::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(super::EXIT_USAGE)
        }
        Err(Failed::Error(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `archivist session …`.
pub async fn run(args: SessionArgs) -> ExitCode {
    exit(session(args).await)
}

/// `archivist sessions`: the tenant's sessions, in name order.
pub async fn sessions(flags: ClientFlags) -> ExitCode {
    exit(list_sessions(&flags).await)
}

/// `archivist backlog`: segments per state, the oldest pending, parked per
/// class.
pub async fn backlog(flags: ClientFlags) -> ExitCode {
    exit(show_backlog(&flags).await)
}

async fn connect(flags: &ClientFlags) -> Result<Client, Failed> {
    connect_with(&ClientOptions {
        address: flags.server.clone(),
        token: flags.token.clone(),
        ca_cert: flags.ca_cert.clone(),
        client_cert: flags.client_cert.clone(),
        client_key: flags.client_key.clone(),
        connect_timeout: flags.timeout,
    })
    .await
    .map_err(|e| Failed::Error(crate::failure::cause_chain(&e).join(": ")))
}

/// A request carrying the `--timeout` as its deadline.
fn request<T>(flags: &ClientFlags, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(limit) = flags.timeout {
        request.set_timeout(limit);
    }
    request
}

fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

async fn session(args: SessionArgs) -> Result<(), Failed> {
    let flags = &args.flags;
    // Checked before connecting, so a typo is told as one.
    match &args.command {
        SessionCommand::Append { session, role, .. } => {
            check_session(session)?;
            parse_role(role)?;
        }
        SessionCommand::Close { session, .. }
        | SessionCommand::Flush { session }
        | SessionCommand::Show { session }
        | SessionCommand::Delete { session, .. }
        | SessionCommand::Watch { session }
        | SessionCommand::Tree { session }
        | SessionCommand::Context { session, .. } => check_session(session)?,
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
            ..
        } => {
            let resp = client
                .append_entries(request(
                    flags,
                    pb::AppendEntriesRequest {
                        session_id: session.clone(),
                        entries: vec![pb::NewEntry {
                            client_entry_id: client_entry_id.unwrap_or_default(),
                            role: parse_role(&role)?.into(),
                            content: content.unwrap_or_default(),
                        }],
                    },
                ))
                .await?
                .into_inner();
            if flags.json {
                print_json(&append_json(&session, &resp));
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
                print_json(&json!({
                    "session_id": session,
                    "entries_deleted": resp.entries_deleted,
                    "segments_deleted": resp.segments_deleted,
                }));
            } else {
                println!(
                    "erased session {session}: {} and {}",
                    count(resp.entries_deleted, "entry", "entries"),
                    count(
                        resp.segments_deleted,
                        "segment or roll-up",
                        "segments and roll-ups"
                    )
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
                    println!("{}", event_json(&event));
                } else {
                    print_event(&event);
                }
            }
            Ok(())
        }
        SessionCommand::Tree { session } => {
            let mut nodes = Vec::new();
            let mut token = String::new();
            loop {
                let resp = client
                    .list_segments(request(
                        flags,
                        pb::ListSegmentsRequest {
                            session_id: session.clone(),
                            levels: (1..=TREE_DEPTH).collect(),
                            page_size: 1000,
                            page_token: token,
                            ..Default::default()
                        },
                    ))
                    .await?
                    .into_inner();
                nodes.extend(resp.segments);
                if resp.next_page_token.is_empty() {
                    break;
                }
                token = resp.next_page_token;
            }
            if nodes.is_empty() {
                ensure_session(&mut client, flags, &session).await?;
            }
            if flags.json {
                print_json(&json!({
                    "session_id": session,
                    "nodes": nodes.iter().map(segment_json).collect::<Vec<_>>(),
                }));
            } else if nodes.is_empty() {
                println!("no segments yet");
            } else {
                print!("{}", render_tree(&nodes));
            }
            Ok(())
        }
        SessionCommand::Context {
            session,
            max_tokens,
        } => {
            let resp = client
                .get_context(request(
                    flags,
                    pb::GetContextRequest {
                        session_id: session,
                        max_tokens,
                    },
                ))
                .await?
                .into_inner();
            if flags.json {
                print_json(&context_json(&resp));
                return Ok(());
            }
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
                && let Some(session) = &session
            {
                // A requeue of a session that is not there is NOT_FOUND,
                // as every other command says.
                ensure_session(&mut client, flags, session).await?;
            }
            if flags.json {
                print_json(&json!({ "requeued": resp.requeued }));
            } else if resp.requeued == 0 {
                println!(
                    "nothing to requeue: no matching segment is {}",
                    if include_parked {
                        "PENDING or PARKED"
                    } else {
                        "PENDING (add --include-parked for PARKED ones)"
                    }
                );
            } else {
                println!(
                    "requeued {}; the server takes them up now",
                    count(resp.requeued, "segment", "segments")
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

fn check_session(session: &str) -> Result<(), Failed> {
    crate::model::SessionName::parse(session)
        .map(|_| ())
        .map_err(|e| {
            Failed::Usage(format!(
                "{e} (a session id is 1 to 128 characters of letters, digits and . _ : -)"
            ))
        })
}

/// NOT_FOUND when `session` does not exist (GetContext says so).
async fn ensure_session(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
) -> Result<(), Failed> {
    client
        .get_context(request(
            flags,
            pb::GetContextRequest {
                session_id: session.to_owned(),
                max_tokens: 1,
            },
        ))
        .await?;
    Ok(())
}

/// Shows progress on standard error while a call waits: a spinner with
/// the time so far on a terminal, one line otherwise.
struct Waiting(Option<ProgressBar>);

impl Waiting {
    fn start(what: String) -> Waiting {
        if !std::io::stderr().is_terminal() {
            eprintln!("{what}");
            return Waiting(None);
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
            bar.set_style(style);
        }
        bar.set_message(what);
        bar.enable_steady_tick(Duration::from_millis(120));
        Waiting(Some(bar))
    }

    fn done(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}

fn bound(flags: &ClientFlags, server_default: &str) -> String {
    match flags.timeout {
        Some(t) => format!("up to {} (--timeout)", human_duration(t)),
        None => format!("up to the server's {server_default}"),
    }
}

async fn close(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
    wait: bool,
) -> Result<(), Failed> {
    let waiting = wait.then(|| {
        Waiting::start(format!(
            "closing the open segment of {session} and waiting for its recap ({})",
            bound(flags, "retry.pass_ceiling, 30 s by default")
        ))
    });
    let result = client
        .close_segment(request(
            flags,
            pb::CloseSegmentRequest {
                session_id: session.to_owned(),
                wait,
            },
        ))
        .await;
    if let Some(w) = waiting {
        w.done();
    }
    let status = match result {
        Ok(resp) => {
            let Some(seg) = resp.into_inner().segment else {
                if flags.json {
                    print_json(&json!({ "closed": false, "segment": null }));
                } else {
                    println!("nothing was open in {session}: there is no segment to close");
                }
                return Ok(());
            };
            let summarised = state_from_pb(seg.state) == Some(SegmentState::Summarised);
            if flags.json {
                print_json(&json!({ "closed": true, "segment": segment_json(&seg) }));
            } else if !wait {
                println!(
                    "closed segment {} of {session} ({}); its recap runs in the background (`archivist session show {session}` shows it)",
                    seg.id,
                    seq_range(&seg)
                );
            } else {
                println!(
                    "closed segment {} of {session} ({})",
                    seg.id,
                    seq_range(&seg)
                );
                print_segment(&seg);
                if !summarised {
                    println!(
                        "its recap is not done yet: the server goes on with it; `archivist session show {session}` shows it"
                    );
                }
            }
            return match (wait, summarised) {
                (true, false) => Err(Failed::RecapNotDone),
                _ => Ok(()),
            };
        }
        Err(status) => status,
    };
    // A waiting close fails with the recap's failure after the segment was
    // closed: say so, and what happens next, rather than only the error.
    let error = CallError::from_status(&status);
    let segment_id = error
        .metadata
        .iter()
        .find(|(k, _)| k == "segment_id")
        .and_then(|(_, v)| v.parse::<u64>().ok());
    let Some(segment_id) = segment_id.filter(|_| wait && status.code() != tonic::Code::NotFound)
    else {
        return Err(status.into());
    };
    let seg = client
        .get_segment(request(flags, pb::GetSegmentRequest { segment_id }))
        .await?
        .into_inner();
    if flags.json {
        print_json(&json!({
            "closed": true,
            "segment": segment_json(&seg),
            "error": error_json(&error),
        }));
    } else {
        println!(
            "closed segment {} of {session} ({}), but its recap did not succeed: {}",
            seg.id,
            seq_range(&seg),
            error.message
        );
        print_segment(&seg);
    }
    Err(Failed::RecapNotDone)
}

async fn flush(client: &mut Client, flags: &ClientFlags, session: &str) -> Result<(), Failed> {
    let waiting = Waiting::start(format!(
        "flushing {session}: closing its open segment and waiting for every pending recap ({})",
        bound(flags, "flush.ceiling, 10 s by default")
    ));
    let result = client
        .flush_session(request(
            flags,
            pb::FlushSessionRequest {
                session_id: session.to_owned(),
            },
        ))
        .await;
    waiting.done();
    let resp = result?.into_inner();
    if flags.json {
        print_json(&json!({
            "session_id": session,
            "complete": resp.complete,
            "segments": resp.segments.iter().map(segment_json).collect::<Vec<_>>(),
        }));
    } else {
        for seg in &resp.segments {
            print_segment(seg);
        }
        println!(
            "{}",
            if resp.complete {
                "complete: every segment is summarised"
            } else {
                "not complete: what is left stays PENDING (or PARKED) and the server keeps at it"
            }
        );
    }
    if resp.complete {
        Ok(())
    } else {
        Err(Failed::RecapNotDone)
    }
}

async fn show(client: &mut Client, flags: &ClientFlags, session: &str) -> Result<(), Failed> {
    let mut segments = Vec::new();
    let mut token = String::new();
    loop {
        let resp = client
            .list_segments(request(
                flags,
                pb::ListSegmentsRequest {
                    session_id: session.to_owned(),
                    states: Vec::new(),
                    page_size: 100,
                    page_token: token,
                    levels: Vec::new(),
                },
            ))
            .await?
            .into_inner();
        segments.extend(resp.segments);
        if resp.next_page_token.is_empty() {
            break;
        }
        token = resp.next_page_token;
    }
    if segments.is_empty() {
        // ListSegments filters; a session that is not there is NOT_FOUND.
        ensure_session(client, flags, session).await?;
    }
    if flags.json {
        print_json(&json!({
            "session_id": session,
            "segments": segments.iter().map(segment_json).collect::<Vec<_>>(),
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

async fn list_sessions(flags: &ClientFlags) -> Result<(), Failed> {
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
            "sessions": sessions.iter().map(session_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if sessions.is_empty() {
        println!("no sessions yet: `archivist session append NAME TEXT` starts one");
        return Ok(());
    }
    let now = SystemTime::now();
    for s in &sessions {
        let open = match s.open_segment_id {
            Some(id) => format!("segment {id} open"),
            None => "nothing open".to_owned(),
        };
        println!(
            "{}: {}, {}, {} pending, {} parked, last append {}",
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

async fn show_backlog(flags: &ClientFlags) -> Result<(), Failed> {
    let mut client = connect(flags).await?;
    let b = client
        .get_backlog(request(flags, pb::GetBacklogRequest {}))
        .await?
        .into_inner();
    let oldest = b
        .oldest_pending_age
        .and_then(|d| Duration::try_from(d).ok());
    if flags.json {
        let mut by_class: Vec<(&String, &u64)> = b.parked_by_class.iter().collect();
        by_class.sort();
        print_json(&json!({
            "open": b.open,
            "pending": b.pending,
            "summarised": b.summarised,
            "parked": b.parked,
            "oldest_pending_age_seconds": oldest.map(|d| d.as_secs_f64()),
            "parked_by_class": by_class
                .into_iter()
                .map(|(k, v)| (k.clone(), Value::from(*v)))
                .collect::<serde_json::Map<String, Value>>()
        }));
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
    if b.parked > 0 {
        println!(
            "parked segments wait for a fixed provider setup: `archivist check` (with the server's configuration) shows what is wrong; once fixed, restart the server or run `archivist session requeue --include-parked`"
        );
    }
    Ok(())
}

fn parse_role(name: &str) -> Result<pb::Role, Failed> {
    Role::parse(name).map(role_to_pb).ok_or_else(|| {
        Failed::Usage(format!(
            "unknown role {name:?}: use user, assistant, system or tool"
        ))
    })
}

/// "2m", "10s", "1h 30m".
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write it like \"10s\" or \"2m\""))
}

fn role_name(role: i32) -> &'static str {
    role_from_pb(role).map_or("?", Role::as_str)
}

fn state_name(state: i32) -> &'static str {
    state_from_pb(state).map_or("?", SegmentState::as_str)
}

fn seq_range(seg: &pb::Segment) -> String {
    format!(
        "seq {}..{}, {}",
        seg.first_seq,
        seg.last_seq,
        count(u64::from(seg.entry_count), "entry", "entries")
    )
}

fn system_time(t: &prost_types::Timestamp) -> Option<SystemTime> {
    SystemTime::try_from(*t).ok()
}

fn rfc3339(t: &prost_types::Timestamp) -> Option<String> {
    system_time(t).map(|t| humantime::format_rfc3339_seconds(t).to_string())
}

/// A time with how far it is from now: "2026-11-29T10:00:05Z (in 4 s)".
fn when(t: &prost_types::Timestamp, now: SystemTime) -> String {
    let Some(at) = system_time(t) else {
        return "?".to_owned();
    };
    let stamp = humantime::format_rfc3339_seconds(at);
    match at.duration_since(now) {
        Ok(ahead) if ahead >= Duration::from_secs(1) => {
            format!("{stamp} (in {})", human_duration(ahead))
        }
        Err(past) if past.duration() >= Duration::from_secs(1) => {
            format!("{stamp} ({} ago)", human_duration(past.duration()))
        }
        _ => format!("{stamp} (now)"),
    }
}

/// What a person should know to do about a segment in its state: nothing
/// for a healthy one.
fn advice(seg: &pb::Segment) -> Option<String> {
    match state_from_pb(seg.state)? {
        SegmentState::Parked => Some(format!(
            "parked: the server does not retry it by itself. Fix the provider setup (`archivist check` with the server's configuration shows what is wrong), then restart the server with it, or run `archivist session requeue {} --include-parked`",
            seg.session_id
        )),
        SegmentState::Pending if seg.last_failure.is_some() => Some(
            "pending: the server tries again by itself at the next attempt; `archivist session requeue` makes it due now"
                .to_owned(),
        ),
        _ => None,
    }
}

fn print_segment(seg: &pb::Segment) {
    let now = SystemTime::now();
    let tried = match (seg.attempts, seg.passes) {
        (0, 0) => String::new(),
        (attempts, passes) => format!(
            ", {} in {}",
            count(u64::from(attempts), "attempt", "attempts"),
            count(u64::from(passes), "pass", "passes")
        ),
    };
    println!(
        "segment {} (#{} of {}): {}, {}{tried}",
        seg.id,
        seg.ordinal,
        seg.session_id,
        state_name(seg.state),
        seq_range(seg),
    );
    if let Some(s) = &seg.summary {
        for line in s.text.lines() {
            println!("    {line}");
        }
        println!("    [{} / {}]", s.provider, s.model);
    }
    if let Some(at) = &seg.next_attempt_at {
        println!("    next attempt: {}", when(at, now));
    }
    if let Some(f) = &seg.last_failure {
        let status = f
            .http_status
            .map(|s| format!(" (HTTP {s})"))
            .unwrap_or_default();
        // The first cause restates the class and attempts.
        let causes = f.causes.get(1..).unwrap_or_default().join(": ");
        println!(
            "    last failure: {}{status} after {}: {causes}",
            failure_class_name(f),
            count(u64::from(f.attempts), "attempt", "attempts"),
        );
        if !f.hint.is_empty() {
            println!("    fix: {}", f.hint);
        }
    }
    if let Some(advice) = advice(seg) {
        println!("    {advice}");
    }
}

fn failure_class_name(f: &pb::Failure) -> &'static str {
    crate::wire::failure_from_pb(f).map_or("unknown", |f| f.class.as_str())
}

/// A failed call as lines for a person: the status, then every cause.
pub fn describe(status: &tonic::Status) -> String {
    let error = CallError::from_status(status);
    let mut out = error.to_string();
    for (field, description) in &error.violations {
        out.push_str(&format!("\n  {field}: {description}"));
    }
    if let Some(wait) = error.retry_after {
        out.push_str(&format!("\n  retry after {}", human_duration(wait)));
    }
    for cause in error.chain() {
        out.push_str(&format!("\ncaused by: {cause}"));
    }
    if let Some(hint) = error
        .failure
        .as_ref()
        .map(|f| &f.hint)
        .filter(|h| !h.is_empty())
    {
        out.push_str(&format!("\nfix: {hint}"));
    }
    out
}

/// As `describe`, with what a person at this terminal can do about it.
fn describe_with_hint(status: &tonic::Status) -> String {
    let error = CallError::from_status(status);
    let mut out = describe(status);
    let hint = match (status.code(), error.reason.as_deref()) {
        (tonic::Code::Unauthenticated, Some("MISSING_TOKEN")) => {
            Some("this server needs a token: pass --token, or set ARCHIVIST_TOKEN")
        }
        (tonic::Code::Unauthenticated, _) => {
            Some("the server knows no tenant with this token: check --token (or ARCHIVIST_TOKEN)")
        }
        (tonic::Code::AlreadyExists, Some("CLIENT_ENTRY_ID_REUSED")) => Some(
            "that --id already names another entry: give new text a new id (the same id with the same text is a safe retry)",
        ),
        (tonic::Code::DeadlineExceeded, None) => {
            Some("no answer within --timeout: give it longer, or check the server")
        }
        _ => None,
    };
    if let Some(hint) = hint {
        out.push_str(&format!("\nhint: {hint}"));
    }
    out
}

fn timestamp_json(t: &Option<prost_types::Timestamp>) -> Value {
    t.as_ref()
        .and_then(rfc3339)
        .map_or(Value::Null, Value::from)
}

fn failure_json(f: &pb::Failure) -> Value {
    json!({
        "class": failure_class_name(f),
        "retryable": f.retryable,
        "attempts": f.attempts,
        "elapsed_seconds": f.elapsed.and_then(|d| Duration::try_from(d).ok()).map(|d| d.as_secs_f64()),
        "http_status": f.http_status,
        "provider": f.provider,
        "model": f.model,
        "causes": f.causes,
        "hint": f.hint,
    })
}

fn segment_json(seg: &pb::Segment) -> Value {
    json!({
        "id": seg.id,
        "session_id": seg.session_id,
        "ordinal": seg.ordinal,
        "state": state_name(seg.state),
        "first_seq": seg.first_seq,
        "last_seq": seg.last_seq,
        "entry_count": seg.entry_count,
        "attempts": seg.attempts,
        "passes": seg.passes,
        "next_attempt_at": timestamp_json(&seg.next_attempt_at),
        "closed_at": timestamp_json(&seg.closed_at),
        "summary": seg.summary.as_ref().map(|s| json!({
            "text": s.text,
            "provider": s.provider,
            "model": s.model,
            "prompt_version": s.prompt_version,
            "input_tokens": s.input_tokens,
            "output_tokens": s.output_tokens,
            "created_at": timestamp_json(&s.created_at),
        })),
        "last_failure": seg.last_failure.as_ref().map(failure_json),
        "advice": advice(seg),
    })
}

fn session_json(s: &pb::SessionInfo) -> Value {
    json!({
        "session_id": s.session_id,
        "entry_count": s.entry_count,
        "last_seq": s.last_seq,
        "open_segment_id": s.open_segment_id,
        "pending": s.pending,
        "parked": s.parked,
        "created_at": timestamp_json(&s.created_at),
        "last_append_at": timestamp_json(&s.last_append_at),
    })
}

fn append_json(session: &str, resp: &pb::AppendEntriesResponse) -> Value {
    json!({
        "session_id": session,
        "entries": resp.entries.iter().map(|e| json!({
            "seq": e.seq,
            "client_entry_id": e.client_entry_id,
            "duplicate": e.duplicate,
        })).collect::<Vec<_>>(),
        "open_segment_id": resp.open_segment_id,
        "closed_segment_ids": resp.closed_segment_ids,
    })
}

fn context_json(resp: &pb::GetContextResponse) -> Value {
    let items: Vec<Value> = resp
        .items
        .iter()
        .filter_map(|item| match &item.item {
            Some(pb::context_item::Item::Summary(s)) => {
                let summary = s.summary.clone().unwrap_or_default();
                Some(json!({ "summary": {
                    "segment_id": s.segment_id,
                    "first_seq": s.first_seq,
                    "last_seq": s.last_seq,
                    "text": summary.text,
                    "provider": summary.provider,
                    "model": summary.model,
                }}))
            }
            Some(pb::context_item::Item::Entry(e)) => Some(json!({ "entry": {
                "seq": e.seq,
                "role": role_name(e.role),
                "content": e.content,
                "client_entry_id": e.client_entry_id,
                "created_at": timestamp_json(&e.created_at),
            }})),
            None => None,
        })
        .collect();
    json!({
        "items": items,
        "truncated": resp.truncated,
        "estimated_tokens": resp.estimated_tokens,
    })
}

fn error_json(error: &CallError) -> Value {
    json!({
        "code": format!("{:?}", error.code),
        "message": error.message,
        "reason": error.reason,
        "causes": error.chain(),
        "hint": error.failure.as_ref().map(|f| f.hint.clone()),
    })
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

fn event_kind(event: &pb::SessionEvent) -> &'static str {
    match pb::SessionEventKind::try_from(event.kind) {
        Ok(pb::SessionEventKind::Closed) => "CLOSED",
        Ok(pb::SessionEventKind::Summarised) => "SUMMARISED",
        Ok(pb::SessionEventKind::Failed) => "FAILED",
        Ok(pb::SessionEventKind::Parked) => "PARKED",
        Ok(pb::SessionEventKind::Deleted) => "DELETED",
        Ok(pb::SessionEventKind::Gap) => "GAP",
        Ok(pb::SessionEventKind::Unspecified) | Err(_) => "?",
    }
}

fn event_json(event: &pb::SessionEvent) -> Value {
    json!({
        "kind": event_kind(event),
        "at": event.at.map(|t| t.to_string()),
        "missed": event.missed,
        "segment": event.segment.as_ref().map(segment_json),
    })
}

fn print_event(event: &pb::SessionEvent) {
    let at = event
        .at
        .and_then(|t| std::time::SystemTime::try_from(t).ok())
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default();
    let kind = event_kind(event);
    match &event.segment {
        Some(seg) => {
            let why = match kind {
                "FAILED" | "PARKED" => seg
                    .last_failure
                    .as_ref()
                    .and_then(|f| f.causes.last())
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            println!(
                "{at} {kind} level {} #{} (id {}) seq {}..{}{why}",
                seg.level, seg.ordinal, seg.id, seg.first_seq, seg.last_seq
            );
        }
        None if kind == "GAP" => println!(
            "{at} GAP: {} lost (this watcher fell behind)",
            count(event.missed, "event", "events")
        ),
        None => println!("{at} {kind}"),
    }
}

//! What every command of the terminal client shares: its flags, the
//! connection, a request with the `--timeout` as its deadline, the checks
//! made before connecting, JSON on standard output, and the exit status.
//! The commands (`session.rs`, `reads.rs`, `waits.rs`) use this module and
//! `output.rs`; neither of those knows the commands.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::output::describe_with_hint;
use crate::client::{Client, ClientOptions, DEFAULT_SERVER, connect_with};
use crate::model::Role;
use crate::pb;
use crate::wire::role_to_pb;

/// Exit status of a close or flush that worked while a recap is not there:
/// it failed, or was still running when the call's bound came.
const EXIT_RECAP_NOT_DONE: u8 = 3;

/// How to reach the server and as whom: the flags every client of a
/// running server takes (the terminal client, `archivist mcp`).
#[derive(Clone, Debug, Args)]
pub struct ConnectFlags {
    /// The server to talk to (https:// for TLS).
    // The value is not shown: clap would print `ARCHIVIST_SERVER=` with
    // nothing after it when the variable is unset.
    #[arg(
        long,
        env = "ARCHIVIST_SERVER",
        hide_env_values = true,
        default_value = DEFAULT_SERVER,
        global = true
    )]
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
}

impl ConnectFlags {
    /// The connection these flags describe, giving up on setting it up
    /// after `connect_timeout`.
    pub(crate) fn options(&self, connect_timeout: Option<Duration>) -> ClientOptions {
        ClientOptions {
            address: self.server.clone(),
            token: self.token.clone(),
            ca_cert: self.ca_cert.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            connect_timeout,
        }
    }
}

/// How to reach the server, and how to print; shared by every client
/// command.
#[derive(Debug, Args)]
pub struct ClientFlags {
    #[command(flatten)]
    pub connect: ConnectFlags,
    /// The longest a call may take ("10s", "2m"); a waiting close or flush
    /// answers with the state as it stands a little before it. Default: no
    /// limit of the client's own (the server's bounds hold).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, global = true)]
    pub timeout: Option<Duration>,
    /// Print the result as JSON on standard output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Why a command did not end well.
pub(super) enum Failed {
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

/// The exit status of a command's result, with its error printed.
pub(super) fn exit(result: Result<(), Failed>) -> ExitCode {
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

pub(super) async fn connect(flags: &ClientFlags) -> Result<Client, Failed> {
    connect_with(&flags.connect.options(flags.timeout))
        .await
        .map_err(|e| Failed::Error(crate::failure::cause_chain(&e).join(": ")))
}

/// A request carrying the `--timeout` as its deadline.
pub(super) fn request<T>(flags: &ClientFlags, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(limit) = flags.timeout {
        request.set_timeout(limit);
    }
    request
}

pub(super) fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            if let Err(Failed::Error(e)) = print_out(&format!("{text}\n")) {
                eprintln!("error: {e}");
            }
        }
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

/// Writes `text` to standard output; false when its reader has gone
/// (`| head`), which ends a command quietly rather than in a panic.
pub(super) fn print_out(text: &str) -> Result<bool, Failed> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Failed::Error(format!("cannot print: {e}"))),
    }
}

/// A session id as the server would take it; checked before connecting,
/// so a typo is told as one.
pub(super) fn check_session(session: &str) -> Result<(), Failed> {
    crate::model::SessionName::parse(session)
        .map(|_| ())
        .map_err(|e| {
            Failed::Usage(format!(
                "{e} (a session id is 1 to 128 characters of letters, digits and . _ : -)"
            ))
        })
}

pub(super) fn check_subject(subject: &str) -> Result<(), Failed> {
    crate::model::Subject::parse(subject)
        .map(|_| ())
        .map_err(|e| {
            Failed::Usage(format!(
                "{e} (a subject is 1 to 256 characters of letters, digits and . _ : @ -)"
            ))
        })
}

/// A `--min-similarity`: any number clap would take for a flag too
/// (`-0.5`, `-inf`, `-NaN`: hence `allow_hyphen_values` where it is
/// declared), refused as the server refuses it when it is no cosine.
pub(super) fn parse_min_similarity(text: &str) -> Result<f32, String> {
    let least: f32 = text
        .parse()
        .map_err(|e| format!("{e}: a cosine is a number from -1 to 1"))?;
    match crate::model::min_similarity_problem(least) {
        Some(problem) => Err(format!("{problem} [INVALID_MIN_SIMILARITY]")),
        None => Ok(least),
    }
}

/// A role named on the command line.
pub(super) fn parse_role(name: &str) -> Result<pb::Role, Failed> {
    Role::parse(name).map(role_to_pb).ok_or_else(|| {
        Failed::Usage(format!(
            "unknown role {name:?}: use user, assistant, system or tool"
        ))
    })
}

/// Every segment of `session` at `levels` (all when empty), page by page;
/// NOT_FOUND when the session does not exist.
pub(super) async fn all_segments(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
    levels: Vec<u32>,
    page_size: u32,
) -> Result<Vec<pb::Segment>, Failed> {
    let mut segments = Vec::new();
    let mut token = String::new();
    loop {
        let resp = client
            .list_segments(request(
                flags,
                pb::ListSegmentsRequest {
                    session_id: session.to_owned(),
                    levels: levels.clone(),
                    page_size,
                    page_token: token,
                    ..Default::default()
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
    Ok(segments)
}

/// NOT_FOUND when `session` does not exist (ListEntries says so, reading
/// one entry; GetContext with a tiny budget is refused as too small).
pub(super) async fn ensure_session(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
) -> Result<(), Failed> {
    client
        .list_entries(request(
            flags,
            pb::ListEntriesRequest {
                session_id: session.to_owned(),
                after_seq: 0,
                page_size: 1,
            },
        ))
        .await?;
    Ok(())
}

/// "2m", "10s", "1h 30m".
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write it like \"10s\" or \"2m\""))
}

//! `archivist search`: the tenant's memory searched by its words (the
//! Search RPC), every field of the request a flag, the hits printed best
//! first as blocks for a person or, with `--json`, as the wire response.

use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Args, ValueEnum};

use super::output::{legs, render_hit, wire_json};
use super::terminal::{
    ClientFlags, Failed, check_session, check_subject, connect, exit, parse_min_similarity,
    parse_role, print_json, print_out, request,
};
use crate::pb;
use crate::text::count;
use crate::wire::timestamp;

#[derive(Debug, Args)]
pub struct SearchArgs {
    #[command(flatten)]
    pub flags: ClientFlags,
    /// What to look for, web-search style: words, "a phrase" (quoted for
    /// the shell too), `or` between alternatives, -word to exclude (a query
    /// that starts with - goes after `--`). The words of several arguments
    /// are joined by spaces.
    #[arg(required = true, value_name = "QUERY")]
    pub query: Vec<String>,
    /// Only this session (repeatable). Default: every session of yours.
    #[arg(long = "session", value_name = "ID")]
    pub sessions: Vec<String>,
    /// Only the sessions of this subject (whose memory they are).
    #[arg(long)]
    pub subject: Option<String>,
    /// Only what was said after this (an entry's occurred_at, a recap's
    /// last entry's): an RFC 3339 time (2026-11-29T10:00:00Z), or a
    /// duration ago ("2h").
    #[arg(long, value_name = "TIME")]
    pub after: Option<String>,
    /// Only what was said before this (as --after).
    #[arg(long, value_name = "TIME")]
    pub before: Option<String>,
    /// Only entries whose metadata holds this pair (repeatable: every pair
    /// must match). Recaps have no metadata, so this leaves them out.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Only entries of this role (repeatable): user, assistant, system or
    /// tool. Recaps have no role, so this leaves them out.
    #[arg(long = "role", value_name = "ROLE")]
    pub roles: Vec<String>,
    /// Only this level (repeatable): 0 entries, 1 segment recaps, 2 and up
    /// roll-ups. Default: entries and segment recaps.
    #[arg(long = "level", value_name = "N")]
    pub levels: Vec<u32>,
    /// At most this many hits (1 to 100; default 10).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub limit: Option<u32>,
    /// How to match: auto (by meaning too when the server has embeddings),
    /// lexical (by words), semantic (by meaning; needs embeddings).
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
    /// Leave out the hits found only by meaning whose similarity (the
    /// cosine to the query, -1 to 1) is below this; hits found by their
    /// words stay. Default: none.
    #[arg(long, value_name = "COSINE", allow_hyphen_values = true, value_parser = parse_min_similarity)]
    pub min_similarity: Option<f32>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    Auto,
    Lexical,
    Semantic,
}

impl From<Mode> for pb::SearchMode {
    fn from(mode: Mode) -> pb::SearchMode {
        match mode {
            Mode::Auto => pb::SearchMode::Auto,
            Mode::Lexical => pb::SearchMode::Lexical,
            Mode::Semantic => pb::SearchMode::Semantic,
        }
    }
}

/// `archivist search`.
pub async fn run(args: SearchArgs) -> ExitCode {
    exit(search(args).await)
}

/// The request the flags describe; what the client can tell is wrong
/// (a session id, a subject, a role, a time) is a usage error before
/// connecting. The query's own rules are the server's: it says what is
/// wrong with one, naming the field.
fn search_request(args: &SearchArgs) -> Result<pb::SearchRequest, Failed> {
    for session in &args.sessions {
        check_session(session)?;
    }
    if let Some(subject) = &args.subject {
        check_subject(subject)?;
    }
    let time = |flag: &str, text: &Option<String>| {
        text.as_deref()
            .map(|t| {
                super::parse_time(t)
                    .map(timestamp)
                    .map_err(|e| Failed::Usage(format!("{flag}: {e}")))
            })
            .transpose()
    };
    Ok(pb::SearchRequest {
        query: args.query.join(" "),
        session_ids: args.sessions.clone(),
        subject: args.subject.clone().unwrap_or_default(),
        after: time("--after", &args.after)?,
        before: time("--before", &args.before)?,
        roles: args
            .roles
            .iter()
            .map(|r| parse_role(r).map(i32::from))
            .collect::<Result<_, _>>()?,
        levels: args.levels.clone(),
        limit: args.limit.unwrap_or(0),
        mode: pb::SearchMode::from(args.mode).into(),
        min_similarity: args.min_similarity,
        metadata: args
            .metadata
            .iter()
            .map(|pair| {
                pair.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| Failed::Usage(format!("--meta {pair:?}: expected KEY=VALUE")))
            })
            .collect::<Result<_, _>>()?,
    })
}

async fn search(args: SearchArgs) -> Result<(), Failed> {
    let flags = &args.flags;
    let req = search_request(&args)?;
    let query = req.query.clone();
    let mut client = connect(flags).await?;
    let resp = client.search(request(flags, req)).await?.into_inner();
    if flags.json {
        print_json(&wire_json(&resp));
        return Ok(());
    }
    if resp.hits.is_empty() {
        println!(
            "no hits for {query:?} (matched {}): try other words, fewer of them, or `or` between alternatives",
            legs(&resp.legs)
        );
        return Ok(());
    }
    let mut out = format!(
        "{} for {query:?}, best first (matched {})",
        count(resp.hits.len() as u64, "hit", "hits"),
        legs(&resp.legs)
    );
    if resp.embedded_share > 0.0 && resp.embedded_share < 1.0 {
        out.push_str(&format!(
            "; {:.0}% of the searched texts have embeddings so far, so a match by meaning may miss the rest",
            resp.embedded_share * 100.0
        ));
    }
    out.push('\n');
    let now = SystemTime::now();
    for (i, hit) in resp.hits.iter().enumerate() {
        out.push_str(&render_hit(i + 1, hit, now));
    }
    print_out(&out)?;
    Ok(())
}

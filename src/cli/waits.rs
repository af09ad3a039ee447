//! The client commands that wait on recaps (`close --wait`, `flush`): their
//! progress on a terminal, and what they say when a recap is not done.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::output::*;
use super::terminal::{ClientFlags, Failed, print_json, request};
use crate::client::Client;
use crate::model::SegmentState;
use crate::pb;
use crate::text::human_duration;
use crate::wire::state_from_pb;

/// Shows progress on standard error while a call waits: a spinner with
/// the time so far on a terminal, one line otherwise.
pub(super) struct Waiting(Option<ProgressBar>);

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

pub(super) fn bound(flags: &ClientFlags, server_default: &str) -> String {
    match flags.timeout {
        Some(t) => format!("up to {} (--timeout)", human_duration(t)),
        None => format!("up to the server's {server_default}"),
    }
}

pub(super) async fn close(
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
    // The close is committed once the call is OK, whatever the recap did:
    // the segment's state and last failure tell that.
    let Some(seg) = result?.into_inner().segment else {
        if flags.json {
            print_json(&json!({ "closed": false, "segment": null }));
        } else {
            println!("nothing was open in {session}: there is no segment to close");
        }
        return Ok(());
    };
    let summarised = state_from_pb(seg.state) == Some(SegmentState::Summarised);
    if flags.json {
        print_json(&json!({ "closed": true, "segment": wire_json(&seg) }));
    } else if !wait {
        println!(
            "closed segment {} of {session} ({}); its recap runs in the background (`archivist session show {session}` shows it)",
            seg.id,
            seq_range(&seg)
        );
    } else {
        match seg.last_failure.as_ref().filter(|_| !summarised) {
            Some(f) => println!(
                "closed segment {} of {session} ({}), but its recap did not succeed ({})",
                seg.id,
                seq_range(&seg),
                failure_class_name(f)
            ),
            None => println!(
                "closed segment {} of {session} ({})",
                seg.id,
                seq_range(&seg)
            ),
        }
        print_segment(&seg);
        if !summarised && seg.last_failure.is_none() {
            println!(
                "its recap is not done yet: the server goes on with it; `archivist session show {session}` shows it"
            );
        }
    }
    match (wait, summarised) {
        (true, false) => Err(Failed::RecapNotDone),
        _ => Ok(()),
    }
}

pub(super) async fn flush(
    client: &mut Client,
    flags: &ClientFlags,
    session: &str,
) -> Result<(), Failed> {
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
        print_json(&session_wire_json(session, &resp));
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

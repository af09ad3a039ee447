//! `archivist import` through the real binary: a two-person history of
//! several days comes in with its own times and speakers, cut where its
//! days are; a second run stores nothing new; a bad line stops it naming
//! the line and field with every earlier batch kept and nothing of its own.

use std::time::Duration;

use archivist::pb;

use crate::harness::{TestServer, transcript as entries};
use crate::operator::{Ran, archivist};

/// `archivist import --server ADDRESS ARGS FILE`.
async fn import(server: &TestServer, file: &std::path::Path, args: &[&str]) -> Ran {
    let address = format!("http://{}", server.addr);
    let path = file.to_string_lossy().into_owned();
    let mut all = vec!["import", "--server", address.as_str()];
    all.extend_from_slice(args);
    all.push(&path);
    archivist(&all, &[("ARCHIVIST_TOKEN", None)], None).await
}

/// Three days of a chat between Tom and Maya, two lines a day, the key
/// moved on the last day; `session` is the session of every line.
fn history(session: &str) -> Vec<String> {
    let days = [
        ("2023-11-13", "The spare key is under the flowerpot."),
        ("2023-11-14", "The boiler man comes on Thursday."),
        ("2023-11-16", "I moved the spare key to Mrs Lindqvist."),
    ];
    let mut lines = Vec::new();
    for (day, said) in days {
        lines.push(format!(
            r#"{{"session_id":"{session}","subject":"user:tom","role":"user","name":"Tom","content":"{said}","occurred_at":"{day}T08:55:00Z","metadata":{{"source":"export"}}}}"#
        ));
        lines.push(format!(
            r#"{{"session_id":"{session}","subject":"user:tom","role":"assistant","name":"Maya","content":"Noted.","occurred_at":"{day}T08:56:00Z"}}"#
        ));
    }
    lines
}

fn write(dir: &std::path::Path, name: &str, lines: &[String]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_is_imported_as_it_happened_once_however_often_it_runs() {
    let server = TestServer::start_with(|c| {
        c.segment.max_entries = 1000;
        c.segment.max_gap = Some(Duration::from_secs(6 * 3600));
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "chat.jsonl", &history("tom-chat"));

    // A dry run checks and sends nothing.
    let dry = import(&server, &file, &["--dry-run"]).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(dry.stderr.contains("checked 6 lines"), "{}", dry.stderr);
    assert!(entries(&server, "tom-chat").await.is_empty());

    let first = import(&server, &file, &["--batch", "4", "--json"]).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let summary = first.json();
    assert_eq!(summary["lines"], 6);
    assert_eq!(summary["stored"], 6);
    assert_eq!(summary["already_present"], 0);
    assert_eq!(summary["sessions"], 1);
    let stored = entries(&server, "tom-chat").await;
    let said: Vec<(&str, &str, i64)> = stored
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.content.as_str(),
                e.occurred_at.as_ref().map_or(0, |t| t.seconds),
            )
        })
        .collect();
    assert_eq!(
        said[0],
        (
            "Tom",
            "The spare key is under the flowerpot.",
            1_699_865_700
        )
    );
    assert_eq!(said[5].0, "Maya");
    assert_eq!(
        stored[0].metadata.get("source").map(String::as_str),
        Some("export")
    );
    // Cut by its own days: three segments of two.
    let segments = server
        .client
        .clone()
        .list_segments(pb::ListSegmentsRequest {
            session_id: "tom-chat".into(),
            ..Default::default()
        })
        .await
        .expect("segments")
        .into_inner()
        .segments;
    let ranges: Vec<(u64, u64)> = segments.iter().map(|s| (s.first_seq, s.last_seq)).collect();
    assert_eq!(ranges, [(1, 2), (3, 4), (5, 6)]);

    // The terminal client says who and when.
    let address = format!("http://{}", server.addr);
    let shown = archivist(
        &["session", "entries", "tom-chat", "--server", &address],
        &[("ARCHIVIST_TOKEN", None)],
        None,
    )
    .await;
    assert!(
        shown
            .stdout
            .contains("1 user Tom (13 Nov 2023 08:55): The spare key is under the flowerpot."),
        "{}",
        shown.stdout
    );

    // Again: nothing new.
    let again = import(&server, &file, &[]).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(
        again.stderr.contains("0 entries stored, 6 already present"),
        "{}",
        again.stderr
    );
    assert_eq!(entries(&server, "tom-chat").await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_stops_the_import_naming_it_and_keeps_every_earlier_batch() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");

    // Line 5 goes back in time: the server refuses its batch (lines 5-6
    // with batches of two), the batches before it stay.
    let mut lines = history("s1");
    lines[4] = lines[4].replace("2023-11-16T08:55", "2023-11-01T08:55");
    let file = write(dir.path(), "backwards.jsonl", &lines);
    let ran = import(&server, &file, &["--batch", "2"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains("line 5: occurred_at"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("OCCURRED_OUT_OF_ORDER"),
        "{}",
        ran.stderr
    );
    let kept: Vec<String> = entries(&server, "s1")
        .await
        .into_iter()
        .map(|e| e.content)
        .collect();
    assert_eq!(kept.len(), 4, "{kept:?}");

    // A line the client can read as wrong: named with its field, nothing
    // of its batch sent (line 3 is in the batch of lines 3-4).
    let mut lines = history("s2");
    lines[3] = r#"{"session_id":"s2","role":"boss","content":"x"}"#.to_owned();
    let file = write(dir.path(), "role.jsonl", &lines);
    let ran = import(&server, &file, &["--batch", "2"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(ran.stderr.contains("line 4: role"), "{}", ran.stderr);
    assert_eq!(entries(&server, "s2").await.len(), 2);

    // A dry run names every bad line with its field, counts what it read
    // and what would be stored, sends nothing, and fails.
    let mut lines = history("s3");
    lines[1] = "{not json".to_owned();
    lines[2] = r#"{"session_id":"s3","role":"user","content":"x","when":"now"}"#.to_owned();
    lines[4] = r#"{"session_id":"s3","role":"user","content":5}"#.to_owned();
    lines.push(String::new());
    let file = write(dir.path(), "many.jsonl", &lines);
    let ran = import(&server, &file, &["--dry-run"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let said: Vec<&str> = ran.stderr.lines().collect();
    assert!(said[0].starts_with("line 2: "), "{}", ran.stderr);
    assert!(
        said[1].starts_with("line 3: unknown field `when`"),
        "{}",
        ran.stderr
    );
    assert!(
        said[2].starts_with("line 5: content: invalid type"),
        "{}",
        ran.stderr
    );
    assert_eq!(
        said[3],
        "checked 7 lines: 3 entries would be stored, for 1 session, 3 bad lines, 1 blank; nothing sent (--dry-run)"
    );
    assert!(
        said[4].contains("3 lines of 7 bad (the first: line 2)"),
        "{}",
        ran.stderr
    );
    let ran = import(&server, &file, &["--dry-run", "--json"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let summary = ran.json();
    assert_eq!(
        (
            &summary["lines_read"],
            &summary["would_store"],
            &summary["bad"],
            &summary["stored"]
        ),
        (&7.into(), &3.into(), &3.into(), &0.into())
    );
    let bad: Vec<(u64, Option<&str>)> = summary["bad_lines"]
        .as_array()
        .expect("bad lines")
        .iter()
        .map(|b| (b["line"].as_u64().unwrap_or(0), b["field"].as_str()))
        .collect();
    assert_eq!(
        bad,
        vec![(2, None), (3, Some("when")), (5, Some("content"))]
    );
    assert_eq!(summary["stopped_at_line"], 2);
    assert!(entries(&server, "s3").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lines_go_in_batches_that_fit_the_message_limit() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // Seventy lines of 60 KB (each under the content cap): 4.2 MB, past
    // the server's 4 MiB message limit in one call of the default 200.
    let lines: Vec<String> = (0..70)
        .map(|i| {
            format!(
                r#"{{"session_id":"long","role":"user","content":"{}{i}"}}"#,
                "w".repeat(60_000)
            )
        })
        .collect();
    let file = write(dir.path(), "long.jsonl", &lines);
    let ran = import(&server, &file, &["--json"]).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.json()["stored"], 70);
    // A page of the transcript is bounded in bytes too: its first holds
    // most, and they are the file's first lines, in order.
    let first = entries(&server, "long").await;
    assert!(!first.is_empty());
    assert!(
        first
            .iter()
            .enumerate()
            .all(|(i, e)| e.content.ends_with(&i.to_string()))
    );
}

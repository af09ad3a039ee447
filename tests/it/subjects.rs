//! Subjects through the real binary: a session's subject fixed by the
//! append that creates it (another one later is FAILED_PRECONDITION,
//! SUBJECT_MISMATCH, and stores nothing), ListSessions by subject, and the
//! erasure of every session of a subject, after which its text is neither
//! served nor in any file; from gRPC and from the terminal client.

use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::binary::Process;
use crate::harness::{append_request, reason};
use crate::lifecycle::in_any_file;
use crate::operator::archivist;

const MARKER: &str = "MARKER-subject-7c2e9";

fn of(subject: &str, session: &str, texts: &[&str]) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        subject: subject.to_owned(),
        ..append_request(session, texts)
    }
}

async fn listed(client: &mut archivist::client::Client, subject: &str) -> Vec<(String, String)> {
    client
        .list_sessions(pb::ListSessionsRequest {
            subject: subject.to_owned(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| (s.session_id, s.subject))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_is_fixed_listed_and_forgotten_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Process::start(dir.path(), &[("ARCHIVIST_SEGMENT_MAX_ENTRIES", "2")]).await;
    let mut client = server.client().await;
    let ada = "user:ada@example.com";
    for (subject, session) in [(ada, "ada-1"), (ada, "ada-2"), ("bob", "bob-1")] {
        let text = format!("{MARKER} {session}: the locker code is 4711");
        client
            .append_entries(of(subject, session, &[&text, "and a second entry"]))
            .await
            .expect("append");
    }

    // Another subject for a session is refused, naming the session's.
    let refused = client
        .append_entries(of("bob", "ada-1", &["not stored"]))
        .await
        .expect_err("another subject");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(reason(&refused), "SUBJECT_MISMATCH");
    let info = refused
        .get_error_details()
        .error_info()
        .cloned()
        .expect("info");
    assert_eq!(info.metadata.get("subject").map(String::as_str), Some(ada));
    assert_eq!(
        info.metadata.get("session_id").map(String::as_str),
        Some("ada-1")
    );
    // None later is fine, and the refused call stored nothing.
    let next = client
        .append_entries(append_request("ada-1", &["third"]))
        .await
        .expect("append without a subject")
        .into_inner();
    assert_eq!(next.entries[0].seq, 3);

    // A subject that breaks the rules is a field violation.
    let bad = client
        .append_entries(of("ada lovelace", "x", &["y"]))
        .await
        .expect_err("bad subject");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(reason(&bad), "INVALID_SUBJECT");
    let fields: Vec<String> = bad
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect())
        .unwrap_or_default();
    assert_eq!(fields, ["subject"]);

    assert_eq!(
        listed(&mut client, ada).await,
        [
            ("ada-1".to_owned(), ada.to_owned()),
            ("ada-2".to_owned(), ada.to_owned())
        ]
    );
    assert_eq!(listed(&mut client, "").await.len(), 3);

    // The terminal client: an append with a subject, a listing, erasure.
    let address = server.address.clone();
    let ran = archivist(
        &[
            "session",
            "--server",
            &address,
            "append",
            "ada-3",
            "--subject",
            ada,
            MARKER,
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let ran = archivist(
        &[
            "session",
            "--server",
            &address,
            "append",
            "ada-3",
            "--subject",
            "bob",
            "no",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("SUBJECT_MISMATCH"), "{}", ran.stderr);
    let ran = archivist(
        &["sessions", "--server", &address, "--subject", ada],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    assert!(
        lines[2].starts_with(&format!("ada-3 (subject {ada}): 1 entry")),
        "{}",
        ran.stdout
    );
    let ran = archivist(
        &[
            "sessions",
            "--server",
            &address,
            "--subject",
            "bob",
            "--json",
        ],
        &[],
        None,
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).expect("json");
    assert_eq!(json["sessions"][0]["session_id"], "bob-1");
    assert_eq!(json["sessions"][0]["subject"], "bob");
    // Off a terminal nobody can confirm: a usage error, nothing erased.
    let ran = archivist(&["forget-subject", "--server", &address, ada], &[], None).await;
    assert_eq!(ran.code, 64, "{}", ran.stderr);
    assert_eq!(listed(&mut client, ada).await.len(), 3);

    let ran = archivist(
        &["forget-subject", "--server", &address, ada, "--yes"],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    // ada-1: 3 entries in 2 segments; ada-2: 2 in 1; ada-3: 1 in 1.
    assert_eq!(
        ran.stdout.trim(),
        format!(
            "erased subject {ada}: 3 sessions, 6 entries and 4 nodes of the memory tree (segments and roll-ups)"
        )
    );
    for gone in ["ada-1", "ada-2", "ada-3"] {
        let status = client
            .list_entries(pb::ListEntriesRequest {
                session_id: gone.into(),
                ..Default::default()
            })
            .await
            .expect_err("erased");
        assert_eq!(status.code(), Code::NotFound, "{gone}");
    }
    assert!(listed(&mut client, ada).await.is_empty());
    // Bob's session keeps its text; ada's is in no file of the database.
    let bobs = client
        .list_entries(pb::ListEntriesRequest {
            session_id: "bob-1".into(),
            ..Default::default()
        })
        .await
        .expect("bob's")
        .into_inner();
    assert!(bobs.entries[0].content.contains("bob-1"));
    for session in ["ada-1", "ada-2"] {
        let needle = format!("{MARKER} {session}");
        assert_eq!(in_any_file(dir.path(), &needle), Vec::<String>::new());
    }

    // Again: nothing left to erase, counted as such, in JSON.
    let ran = archivist(
        &[
            "forget-subject",
            "--server",
            &address,
            ada,
            "--yes",
            "--json",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).expect("json");
    assert_eq!(json["subject"], ada);
    assert_eq!(json["sessions_deleted"], 0);
}

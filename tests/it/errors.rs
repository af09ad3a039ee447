//! Bad input: the right code, ErrorInfo and BadRequest details, and nothing
//! stored or changed.

use archivist::client::CallError;
use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, append_request, context_entries, entry};

/// Asserts the status is INVALID_ARGUMENT with `reason` and a violation on
/// `field`.
fn assert_invalid(status: &tonic::Status, reason: &str, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo");
    assert_eq!(info.domain, "archivist");
    let bad = details.bad_request().expect("BadRequest");
    assert!(
        bad.field_violations
            .iter()
            .any(|v| v.field == field && v.reason == reason && !v.description.is_empty()),
        "no {reason} violation on {field}: {bad:?}"
    );
    let report = CallError::from_status(status);
    assert!(report.violations.iter().any(|(f, _)| f == field));
}

fn assert_not_found(status: &tonic::Status, reason: &str) {
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let details = status.get_error_details();
    assert_eq!(details.error_info().expect("ErrorInfo").reason, reason);
}

#[tokio::test]
async fn bad_appends_are_refused_and_store_nothing() {
    let server = TestServer::start_with(|c| c.limits.max_content_bytes = 100).await;
    let mut client = server.client.clone();
    // One acknowledged entry that must survive every refusal below.
    server.append("s", &["kept"]).await;

    let too_long_session = "a".repeat(129);
    let cases: Vec<(pb::AppendEntriesRequest, &str, &str)> = vec![
        (
            append_request("", &["x"]),
            "INVALID_SESSION_ID",
            "session_id",
        ),
        (
            append_request(&too_long_session, &["x"]),
            "INVALID_SESSION_ID",
            "session_id",
        ),
        (
            append_request("has space", &["x"]),
            "INVALID_SESSION_ID",
            "session_id",
        ),
        (
            append_request("s", &["fine", ""]),
            "EMPTY_CONTENT",
            "entries[1].content",
        ),
        (
            append_request("s", &["fine", &"y".repeat(101)]),
            "CONTENT_TOO_LARGE",
            "entries[1].content",
        ),
        (append_request("s", &[]), "NO_ENTRIES", "entries"),
        (
            pb::AppendEntriesRequest {
                session_id: "s".into(),
                entries: vec![
                    entry("fine"),
                    pb::NewEntry {
                        role: 0,
                        ..entry("x")
                    },
                ],
                ..Default::default()
            },
            "INVALID_ROLE",
            "entries[1].role",
        ),
        (
            pb::AppendEntriesRequest {
                session_id: "s".into(),
                entries: vec![pb::NewEntry {
                    role: 99,
                    ..entry("x")
                }],
                ..Default::default()
            },
            "INVALID_ROLE",
            "entries[0].role",
        ),
        (
            pb::AppendEntriesRequest {
                session_id: "s".into(),
                entries: vec![pb::NewEntry {
                    client_entry_id: "k".repeat(129),
                    ..entry("x")
                }],
                ..Default::default()
            },
            "INVALID_CLIENT_ENTRY_ID",
            "entries[0].client_entry_id",
        ),
    ];
    for (request, reason, field) in cases {
        let status = client.append_entries(request).await.expect_err("refused");
        assert_invalid(&status, reason, field);
    }

    // Too many entries in one call (the default limit is 1000).
    let many: Vec<String> = (0..1001).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let status = client
        .append_entries(append_request("s", &refs))
        .await
        .expect_err("refused");
    assert_invalid(&status, "TOO_MANY_ENTRIES", "entries");

    // Nothing changed: the one entry is there, and the next seq is 2.
    let ctx = server.context("s", 0).await;
    assert_eq!(context_entries(&ctx), vec![(1, "kept".to_owned())]);
    let next = server.append("s", &["next"]).await;
    assert_eq!(next.entries[0].seq, 2);
    // No session or segment was created by a refused call: "s" is the only
    // session, with its one open segment.
    let all = crate::harness::list_segments(&mut client.clone(), "").await;
    let sessions: Vec<&str> = all.iter().map(|s| s.session_id.as_str()).collect();
    assert_eq!(sessions, vec!["s"]);
    assert_eq!(all[0].entry_count, 2);
}

#[tokio::test]
async fn every_violation_of_a_call_is_listed() {
    let server = TestServer::start().await;
    let status = server
        .client
        .clone()
        .append_entries(pb::AppendEntriesRequest {
            session_id: String::new(),
            entries: vec![
                entry(""),
                pb::NewEntry {
                    role: 7,
                    ..entry("x")
                },
            ],
            ..Default::default()
        })
        .await
        .expect_err("refused");
    let bad = status
        .get_error_details()
        .bad_request()
        .cloned()
        .expect("BadRequest");
    let fields: Vec<&str> = bad
        .field_violations
        .iter()
        .map(|v| v.field.as_str())
        .collect();
    assert_eq!(
        fields,
        vec!["session_id", "entries[0].content", "entries[1].role"]
    );
}

#[tokio::test]
async fn unknown_sessions_and_segments_are_not_found() {
    let server = TestServer::start().await;
    let mut client = server.client.clone();
    let status = client
        .get_segment(pb::GetSegmentRequest { segment_id: 12345 })
        .await
        .expect_err("no segment");
    assert_not_found(&status, "SEGMENT_NOT_FOUND");
    let status = client
        .get_segment(pb::GetSegmentRequest {
            segment_id: u64::MAX,
        })
        .await
        .expect_err("no segment");
    assert_not_found(&status, "SEGMENT_NOT_FOUND");
    let status = client
        .close_segment(pb::CloseSegmentRequest {
            session_id: "nobody".into(),
            wait: true,
        })
        .await
        .expect_err("no session");
    assert_not_found(&status, "SESSION_NOT_FOUND");
    let status = client
        .flush_session(pb::FlushSessionRequest {
            session_id: "nobody".into(),
        })
        .await
        .expect_err("no session");
    assert_not_found(&status, "SESSION_NOT_FOUND");
    let status = client
        .get_context(pb::GetContextRequest {
            session_id: "nobody".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect_err("no session");
    assert_not_found(&status, "SESSION_NOT_FOUND");
    // None of these created anything.
    let backlog = client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner();
    assert_eq!(backlog.open + backlog.pending + backlog.summarised, 0);
}

#[tokio::test]
async fn bad_listing_arguments_are_invalid() {
    let server = TestServer::start().await;
    let mut client = server.client.clone();
    let list = |token: &str, states: Vec<i32>, session: &str| pb::ListSegmentsRequest {
        session_id: session.to_owned(),
        states,
        page_size: 10,
        page_token: token.to_owned(),
        levels: Vec::new(),
    };
    let status = client
        .list_segments(list("not-a-token", vec![], ""))
        .await
        .expect_err("bad token");
    assert_invalid(&status, "INVALID_PAGE_TOKEN", "page_token");
    let status = client
        .list_segments(list("", vec![42], ""))
        .await
        .expect_err("bad state");
    assert_invalid(&status, "UNKNOWN_STATE", "states[0]");
    let status = client
        .list_segments(list("", vec![], "bad session"))
        .await
        .expect_err("bad session");
    assert_invalid(&status, "INVALID_SESSION_ID", "session_id");
    let status = client
        .close_segment(pb::CloseSegmentRequest {
            session_id: String::new(),
            wait: false,
        })
        .await
        .expect_err("bad session");
    assert_invalid(&status, "INVALID_SESSION_ID", "session_id");
}

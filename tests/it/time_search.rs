//! Search by when and by metadata through the real server: an imported
//! history found by the days it was said (entries and recaps alike), hits
//! carrying who said them, when and their metadata, a metadata filter that
//! needs every pair, and a correction ranked above what it corrects.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, eventually};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Monday 13 Nov 2023, 22:13:20 UTC: an imported history's first day.
fn monday() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn at(t: SystemTime) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp::from(t))
}

fn said(text: &str, when: SystemTime, name: &str, metadata: &[(&str, &str)]) -> pb::NewEntry {
    pb::NewEntry {
        role: pb::Role::User.into(),
        content: text.to_owned(),
        occurred_at: at(when),
        name: name.to_owned(),
        metadata: metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn search(query: &str) -> pb::SearchRequest {
    pb::SearchRequest {
        query: query.to_owned(),
        ..Default::default()
    }
}

async fn hits(server: &TestServer, req: pb::SearchRequest) -> Vec<pb::SearchHit> {
    server
        .client
        .clone()
        .search(req)
        .await
        .expect("search")
        .into_inner()
        .hits
}

fn texts(hits: &[pb::SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.text.as_str()).collect()
}

/// A server whose segments close at an hour's silence, so that each
/// imported day is a segment of its own and gets its recap.
async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.segment.max_entries = 1000;
        c.segment.max_gap = Some(Duration::from_secs(3600));
    })
    .await
}

/// Five days of a chat, two lines a day, appended as an import would.
async fn import_week(server: &TestServer) {
    let days = [
        ("The spare key is under the flowerpot.", "Noted, flowerpot."),
        ("The garden hose leaks again.", "I will buy a washer."),
        ("Dinner with Ingrid on Friday.", "Booked the table."),
        (
            "I moved the spare key to Mrs Lindqvist.",
            "Lindqvist has it.",
        ),
        ("The plumber comes at nine.", "Leave the door open."),
    ];
    let mut entries = Vec::new();
    for (d, (tom, maya)) in days.iter().enumerate() {
        let morning = monday() + DAY * d as u32;
        entries.push(said(tom, morning, "Tom", &[("channel", "sms")]));
        entries.push(said(
            maya,
            morning + Duration::from_secs(60),
            "Maya",
            &[("channel", "email"), ("day", &d.to_string())],
        ));
    }
    server
        .client
        .clone()
        .append_entries(pb::AppendEntriesRequest {
            session_id: "chat".to_owned(),
            entries,
            ..Default::default()
        })
        .await
        .expect("append");
    // Days 1 to 4 closed by the gaps after them (day 5 by being idle
    // since, on its own clock): their recaps are written.
    let done = eventually(Duration::from_secs(30), || async {
        let b = server.backlog().await;
        b.summarised >= 4 && b.pending == 0
    })
    .await;
    assert!(done, "{:?}", server.backlog().await);
}

#[tokio::test]
async fn an_imported_week_is_found_by_the_day_it_was_said_with_who_and_when() {
    let server = server().await;
    import_week(&server).await;
    let thursday = monday() + 3 * DAY - Duration::from_secs(3600);
    let friday = monday() + 4 * DAY - Duration::from_secs(3600);

    // Day 4, entries and recaps: day 4's text and recap, never day 1's,
    // though every one of them was stored today.
    let day4 = hits(
        &server,
        pb::SearchRequest {
            after: at(thursday),
            before: at(friday),
            ..search("spare key")
        },
    )
    .await;
    assert!(!day4.is_empty());
    for h in &day4 {
        assert!(h.text.contains("Lindqvist"), "{h:?}");
        assert!(!h.text.contains("flowerpot"), "{h:?}");
    }
    let entry = day4.iter().find(|h| h.level == 0).expect("day 4's entry");
    assert_eq!(entry.text, "I moved the spare key to Mrs Lindqvist.");
    assert_eq!(entry.name, "Tom");
    assert_eq!(
        entry.occurred_at.as_ref().map(|t| t.seconds),
        Some(1_700_000_000 + 3 * 86_400)
    );
    assert_eq!(
        entry.metadata,
        HashMap::from([("channel".to_owned(), "sms".to_owned())])
    );
    // Stored today, said in 2023.
    assert!(entry.created_at.as_ref().expect("created_at").seconds > 1_700_000_000 + 5 * 86_400);
    // The recap of day 4 is said when its last entry was, and has no
    // speaker or metadata of its own.
    let recap = day4.iter().find(|h| h.level == 1).expect("day 4's recap");
    assert_eq!(
        recap.occurred_at.as_ref().map(|t| t.seconds),
        Some(1_700_000_000 + 3 * 86_400 + 60)
    );
    assert!(recap.name.is_empty() && recap.metadata.is_empty());

    // Before day 2: day 1 only.
    let day1 = hits(
        &server,
        pb::SearchRequest {
            before: at(monday() + DAY - Duration::from_secs(3600)),
            ..search("spare key")
        },
    )
    .await;
    assert!(!day1.is_empty());
    assert!(
        day1.iter().all(|h| h.text.contains("flowerpot")),
        "{day1:?}"
    );
}

#[tokio::test]
async fn a_metadata_filter_needs_every_pair_and_never_finds_a_recap() {
    let server = server().await;
    import_week(&server).await;
    let with = |pairs: &[(&str, &str)]| pb::SearchRequest {
        metadata: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        levels: vec![0, 1],
        ..search("spare key or flowerpot or lindqvist or washer or hose")
    };
    // Without a filter the recaps are found too.
    let all = hits(&server, with(&[])).await;
    assert!(all.iter().any(|h| h.level == 1), "{all:?}");

    let sms = hits(&server, with(&[("channel", "sms")])).await;
    let mut got = texts(&sms);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "I moved the spare key to Mrs Lindqvist.",
            "The garden hose leaks again.",
            "The spare key is under the flowerpot.",
        ]
    );
    assert!(sms.iter().all(|h| h.level == 0 && h.name == "Tom"));

    // Both pairs: Maya's email of day 1 only (day 0 counted from 0).
    let both = hits(&server, with(&[("channel", "email"), ("day", "0")])).await;
    assert_eq!(texts(&both), ["Noted, flowerpot."]);
    // One pair that matches nothing leaves nothing, however many do.
    assert!(
        hits(&server, with(&[("channel", "email"), ("day", "9")]))
            .await
            .is_empty()
    );
    assert!(hits(&server, with(&[("channel", "fax")])).await.is_empty());
    // A key that no entry has matches nothing either.
    assert!(hits(&server, with(&[("thread", "sms")])).await.is_empty());
}

#[tokio::test]
async fn a_metadata_filter_past_an_entrys_bounds_is_refused_naming_the_field() {
    let server = TestServer::start().await;
    let cases: Vec<(HashMap<String, String>, &str)> = vec![
        (
            (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect(),
            "TOO_MANY_METADATA_PAIRS",
        ),
        (
            HashMap::from([("bad key".to_owned(), "v".to_owned())]),
            "INVALID_METADATA_KEY",
        ),
    ];
    for (metadata, reason) in cases {
        let status = server
            .client
            .clone()
            .search(pb::SearchRequest {
                metadata,
                ..search("key")
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        let violations = status
            .get_error_details()
            .bad_request()
            .map(|b| b.field_violations.clone())
            .unwrap_or_default();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].field, "metadata");
        assert_eq!(violations[0].reason, reason);
    }
}

#[tokio::test]
async fn a_correction_ranks_above_what_it_corrects() {
    let server = server().await;
    server
        .client
        .clone()
        .append_entries(pb::AppendEntriesRequest {
            session_id: "chat".to_owned(),
            entries: vec![
                said(
                    "The spare key is under the flowerpot.",
                    monday(),
                    "Tom",
                    &[],
                ),
                said("The hose leaks.", monday() + DAY, "Maya", &[]),
                said(
                    "Correction: the spare key is now with Mrs Lindqvist.",
                    monday() + 3 * DAY,
                    "Tom",
                    &[],
                ),
            ],
            ..Default::default()
        })
        .await
        .expect("append");
    let found = hits(
        &server,
        pb::SearchRequest {
            levels: vec![0],
            ..search("where is the spare key")
        },
    )
    .await;
    // The hose is found by "the" alone, after both.
    assert_eq!(
        texts(&found[..2]),
        [
            "Correction: the spare key is now with Mrs Lindqvist.",
            "The spare key is under the flowerpot.",
        ]
    );
    // Scores stay best first.
    assert!(found[0].score > found[1].score);
}

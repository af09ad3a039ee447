//! Appends, idempotency, segment bounds, closing, flushing and listing.

use std::time::Duration;

use archivist::pb;

use crate::harness::{TestServer, append_request, context_entries, entry, eventually, state};

#[tokio::test]
async fn entries_land_in_order_with_seqs() {
    let server = TestServer::start().await;
    let first = server.append("s1", &["one", "two", "three"]).await;
    let seqs: Vec<u64> = first.entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    let second = server.append("s1", &["four", "five"]).await;
    let seqs: Vec<u64> = second.entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![4, 5]);
    assert_eq!(first.open_segment_id, second.open_segment_id);
    assert!(first.open_segment_id.is_some());

    // Sessions are independent.
    let other = server.append("s2", &["alpha"]).await;
    assert_eq!(other.entries[0].seq, 1);

    let ctx = server.context("s1", 0).await;
    let got: Vec<(u64, String)> = context_entries(&ctx);
    let want: Vec<(u64, String)> = ["one", "two", "three", "four", "five"]
        .iter()
        .enumerate()
        .map(|(i, t)| (i as u64 + 1, t.to_string()))
        .collect();
    assert_eq!(got, want);
    assert!(!ctx.truncated);
}

#[tokio::test]
async fn a_repeated_client_entry_id_is_stored_once() {
    let server = TestServer::start().await;
    let with_id = |id: &str, text: &str| pb::NewEntry {
        client_entry_id: id.to_owned(),
        ..entry(text)
    };
    let mut client = server.client.clone();
    let first = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![with_id("a", "first"), with_id("b", "second")],
            ..Default::default()
        })
        .await
        .expect("append")
        .into_inner();
    assert_eq!(first.entries[0].seq, 1);
    assert!(!first.entries[0].duplicate);

    // A retry of the same call, plus a new entry, plus a repeat within the call.
    let retry = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![
                with_id("a", "first"),
                with_id("b", "second"),
                with_id("c", "third"),
                with_id("c", "third"),
            ],
            ..Default::default()
        })
        .await
        .expect("append")
        .into_inner();
    let got: Vec<(u64, &str, bool)> = retry
        .entries
        .iter()
        .map(|e| (e.seq, e.client_entry_id.as_str(), e.duplicate))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "a", true),
            (2, "b", true),
            (3, "c", false),
            (3, "c", true)
        ]
    );

    let ctx = server.context("s", 0).await;
    let contents: Vec<String> = context_entries(&ctx).into_iter().map(|(_, c)| c).collect();
    assert_eq!(contents, vec!["first", "second", "third"]);

    // The same id in another session is another entry.
    let mut other = append_request("t", &[]);
    other.entries.push(with_id("a", "elsewhere"));
    let resp = client
        .append_entries(other)
        .await
        .expect("append")
        .into_inner();
    assert!(!resp.entries[0].duplicate);
}

#[tokio::test]
async fn a_reused_client_entry_id_with_other_content_is_refused_and_nothing_is_stored() {
    let server = TestServer::start().await;
    let with_id = |id: &str, text: &str| pb::NewEntry {
        client_entry_id: id.to_owned(),
        ..entry(text)
    };
    let mut client = server.client.clone();
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![with_id("a", "first")],
            ..Default::default()
        })
        .await
        .expect("append");

    let calls = [
        // Another text under a stored id, after a new entry in the same call.
        vec![entry("would be seq 2"), with_id("a", "not the first")],
        // Another role under a stored id.
        vec![
            entry("would be seq 2"),
            pb::NewEntry {
                role: pb::Role::Assistant.into(),
                ..with_id("a", "first")
            },
        ],
        // Two texts under one new id within a call.
        vec![with_id("n", "one"), with_id("n", "two")],
    ];
    for entries in calls {
        let status = client
            .append_entries(pb::AppendEntriesRequest {
                session_id: "s".into(),
                entries,
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
        let error = archivist::client::CallError::from_status(&status);
        assert_eq!(error.reason.as_deref(), Some("CLIENT_ENTRY_ID_REUSED"));
        let meta: std::collections::HashMap<_, _> = error.metadata.iter().cloned().collect();
        assert_eq!(meta.get("entry").map(String::as_str), Some("entries[1]"));
        assert!(meta.contains_key("client_entry_id"), "{meta:?}");
        assert_eq!(
            error.violations.first().map(|(f, _)| f.as_str()),
            Some("entries[1].client_entry_id")
        );
    }
    // Nothing of the refused calls was stored: the next entry is seq 2.
    let ctx = server.context("s", 0).await;
    assert_eq!(context_entries(&ctx), vec![(1, "first".to_owned())]);
    let next = server.append("s", &["second"]).await;
    assert_eq!(next.entries[0].seq, 2);
}

#[tokio::test]
async fn sessions_are_listed_by_name_page_by_page_with_their_counts() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    for name in ["c", "a", "b"] {
        server.append(name, &["one", "two", "three"]).await;
    }
    let mut client = server.client.clone();
    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 2,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        assert!(page.sessions.len() <= 2);
        for s in &page.sessions {
            assert_eq!((s.entry_count, s.last_seq), (3, 3), "{s:?}");
            assert!(s.open_segment_id.is_some());
            assert!(s.created_at.is_some() && s.last_append_at.is_some());
        }
        names.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(names, vec!["a", "b", "c"]);
    let status = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 0,
            page_token: "bogus".into(),
            ..Default::default()
        })
        .await
        .expect_err("a token the server never issued");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn a_segment_closes_exactly_at_its_entry_bound() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 3).await;
    let a = server.append("s", &["1", "2"]).await;
    assert!(a.closed_segment_ids.is_empty());
    let open = a.open_segment_id.expect("open segment");
    let b = server.append("s", &["3"]).await;
    assert_eq!(b.closed_segment_ids, vec![open]);
    assert_eq!(b.open_segment_id, None);

    // One call that crosses two bounds closes two segments, in order.
    let c = server
        .append("s", &["4", "5", "6", "7", "8", "9", "10"])
        .await;
    assert_eq!(c.closed_segment_ids.len(), 2);
    let segs = server.segments("s").await;
    let shape: Vec<(u32, u64, u64, u32)> = segs
        .iter()
        .map(|s| (s.ordinal, s.first_seq, s.last_seq, s.entry_count))
        .collect();
    assert_eq!(
        shape,
        vec![(1, 1, 3, 3), (2, 4, 6, 3), (3, 7, 9, 3), (4, 10, 10, 1)]
    );
    assert_eq!(c.closed_segment_ids, vec![segs[1].id, segs[2].id]);
    assert_eq!(c.open_segment_id, Some(segs[3].id));
    assert_eq!(state(&segs[3]), pb::SegmentState::Open);
}

#[tokio::test]
async fn a_segment_closes_at_its_token_bound() {
    // 40 bytes estimate as 10 + 4 = 14 tokens: two fit under 30, a third reaches it.
    let server = TestServer::start_with(|c| c.segment.max_tokens = 30).await;
    let text = "x".repeat(40);
    let a = server.append("s", &[&text, &text]).await;
    assert!(a.closed_segment_ids.is_empty());
    let b = server.append("s", &[&text]).await;
    assert_eq!(b.closed_segment_ids.len(), 1);
    let segs = server.segments("s").await;
    assert_eq!(segs[0].entry_count, 3);
}

#[tokio::test]
async fn close_with_wait_returns_a_summarised_segment() {
    let server = TestServer::start().await;
    server
        .append(
            "s",
            &[
                "The billing deploy failed last night because the migration timed out.",
                "Rerun the billing migration with a longer timeout.",
            ],
        )
        .await;
    let seg = server
        .close("s", true)
        .await
        .expect("close")
        .segment
        .expect("a segment was open");
    assert_eq!(state(&seg), pb::SegmentState::Summarised);
    let summary = seg.summary.expect("summary");
    assert_eq!(summary.provider, "extractive");
    assert!(summary.text.contains("billing"), "{}", summary.text);
    assert_eq!((seg.attempts, seg.passes), (1, 1));
    assert!(seg.closed_at.is_some());
    assert!(seg.last_failure.is_none());

    // Nothing open now: closing again is a no-op.
    let again = server.close("s", true).await.expect("close");
    assert!(again.segment.is_none());
}

#[tokio::test]
async fn closed_segments_are_summarised_in_the_background() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    server
        .append("s", &["a first thing", "a second thing", "a third"])
        .await;
    let closed = server
        .close("s", false)
        .await
        .expect("close")
        .segment
        .expect("closed");
    assert_ne!(state(&closed), pb::SegmentState::Open);
    let done = eventually(Duration::from_secs(10), || async {
        let segs = server.segments("s").await;
        segs.len() == 2
            && segs
                .iter()
                .all(|s| state(s) == pb::SegmentState::Summarised && s.summary.is_some())
    })
    .await;
    assert!(done, "{:?}", server.segments("s").await);
}

#[tokio::test]
async fn flush_summarises_every_segment_of_the_session() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    server
        .append(
            "s",
            &["one thing", "two things", "three things", "four", "five"],
        )
        .await;
    let resp = server
        .client
        .clone()
        .flush_session(pb::FlushSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("flush")
        .into_inner();
    assert!(resp.complete);
    assert_eq!(resp.segments.len(), 3);
    for seg in &resp.segments {
        assert_eq!(state(seg), pb::SegmentState::Summarised);
        assert_eq!(seg.attempts, 1, "each segment's recap is sent once");
    }
}

#[tokio::test]
async fn listing_is_paginated_in_ordinal_order_and_filters_by_state() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 1).await;
    let texts: Vec<String> = (1..=7).map(|i| format!("entry {i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    server.append("other", &["not listed"]).await;

    let mut client = server.client.clone();
    let mut token = String::new();
    let mut pages = Vec::new();
    loop {
        let page = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: "s".into(),
                states: Vec::new(),
                page_size: 3,
                page_token: token,
                levels: Vec::new(),
            })
            .await
            .expect("list")
            .into_inner();
        pages.push(page.segments.iter().map(|s| s.ordinal).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, vec![vec![1, 2, 3], vec![4, 5, 6], vec![7]]);

    let all_done = eventually(Duration::from_secs(10), || async {
        server
            .segments("s")
            .await
            .iter()
            .all(|s| state(s) == pb::SegmentState::Summarised)
    })
    .await;
    assert!(all_done);
    let open_only = client
        .list_segments(pb::ListSegmentsRequest {
            session_id: String::new(),
            states: vec![pb::SegmentState::Open.into()],
            page_size: 0,
            page_token: String::new(),
            levels: Vec::new(),
        })
        .await
        .expect("list")
        .into_inner();
    assert!(open_only.segments.is_empty(), "{:?}", open_only.segments);
    let everything = client
        .list_segments(pb::ListSegmentsRequest {
            session_id: String::new(),
            states: Vec::new(),
            page_size: 0,
            page_token: String::new(),
            levels: Vec::new(),
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(everything.segments.len(), 8);
}

#[tokio::test]
async fn backlog_counts_match_the_segments() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    server.append("s", &["a", "b", "c", "d", "e"]).await;
    let settled = eventually(Duration::from_secs(10), || async {
        let b = server.backlog().await;
        b.open == 1 && b.summarised == 2 && b.pending == 0 && b.parked == 0
    })
    .await;
    assert!(settled);
    let b = server.backlog().await;
    assert!(b.oldest_pending_age.is_none());
    assert!(b.parked_by_class.is_empty());

    // Nothing is owed a recap, so a requeue finds nothing to do.
    let requeued = server.requeue("s", true).await;
    assert_eq!(requeued, 0);
}

#[tokio::test]
async fn a_graceful_restart_keeps_the_open_segment_open() {
    let server = TestServer::start().await;
    server
        .append("s", &["Written before the restart.", "Also before."])
        .await;
    let config = {
        let mut c = archivist::config::Config::default();
        c.reconciler.interval = Duration::from_millis(200);
        c
    };
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, config, None).await;
    // A restart does not cut the conversation in two: the segment is still
    // open, through several reconciler ticks, and takes the next append.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let segs = server.segments("s").await;
    assert_eq!(segs.len(), 1);
    assert_eq!(state(&segs[0]), pb::SegmentState::Open);
    let next = server.append("s", &["after"]).await;
    assert_eq!(next.entries[0].seq, 3);
    assert_eq!(next.open_segment_id, Some(segs[0].id));
    let segs = server.segments("s").await;
    assert_eq!(segs.len(), 1);
    assert_eq!((segs[0].first_seq, segs[0].last_seq), (1, 3));
}

#[tokio::test]
async fn a_segment_with_no_append_for_max_idle_is_closed_and_summarised() {
    let server = TestServer::start_with(|c| {
        c.segment.max_idle = Duration::from_millis(300);
        c.reconciler.interval = Duration::from_millis(100);
    })
    .await;
    server.append("idle", &["Nobody will close this."]).await;
    server.append("busy", &["Kept busy."]).await;
    let busy = async {
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.append("busy", &["still here"]).await;
        }
    };
    let idle_done = eventually(Duration::from_secs(5), || async {
        let segs = server.segments("idle").await;
        segs.len() == 1 && state(&segs[0]) == pb::SegmentState::Summarised
    });
    let ((), done) = tokio::join!(busy, idle_done);
    assert!(done, "{:?}", server.segments("idle").await);
    // A session that keeps taking appends keeps its segment open.
    let busy = server.segments("busy").await;
    assert_eq!(busy.len(), 1);
    assert_eq!(state(&busy[0]), pb::SegmentState::Open);
}

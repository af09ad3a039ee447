//! SQLite's index built just behind the writer by the indexer thread (the
//! tail): it stays under its bound with no search asking, GetBacklog and
//! the metrics count it, what a killed server left in it is indexed when
//! the next one opens, and an erasure passes a session's tail by, leaving
//! its text in no file.

use std::time::Duration;

use archivist::pb;

use crate::binary::Process;
use crate::embed_tenancy::{metrics_at, scrape};
use crate::harness::{TestServer, append_request, entry};
use crate::lifecycle::in_any_file;
use crate::search_fresh::found;

/// A tail that only its bound, a search or a restart indexes during a test.
const BOUND_ONLY: Duration = Duration::from_secs(3600);

/// Segments that never close during a test: no recap among the hits.
fn quiet(c: &mut archivist::config::Config) {
    c.segment.max_entries = 1_000_000;
    c.segment.max_tokens = 1_000_000_000;
    c.segment.max_idle = BOUND_ONLY;
}

async fn backlog(c: &mut archivist::client::Client) -> pb::Backlog {
    c.get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner()
}

/// The texts of call `i`: ten entries holding the call's own word.
fn call(i: usize) -> Vec<String> {
    (0..10)
        .map(|k| format!("tail{i}w entry {k} about the quarterly invoice run"))
        .collect()
}

/// Search finds every entry of the first `calls` calls, by the word only
/// that call's entries hold.
async fn every_call_is_found(c: &mut archivist::client::Client, calls: usize) {
    for i in 0..calls {
        let mut want = call(i);
        want.sort();
        assert_eq!(found(c, &format!("tail{i}w")).await, want, "call {i}");
    }
}

/// GetBacklog once the indexer has brought the tail under `texts` (no
/// search asks it to); a generous ceiling, never reached when it works.
async fn backlog_under(c: &mut archivist::client::Client, texts: u64) -> pb::Backlog {
    for _ in 0..600 {
        let b = backlog(c).await;
        if b.unindexed < texts {
            return b;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the tail stayed at {texts} texts or more for a minute");
}

#[tokio::test]
async fn the_tail_stays_under_its_bound_with_no_search_and_the_backlog_and_metrics_count_it() {
    const TEXTS: u64 = 25;
    let server = TestServer::start_with(|c| {
        quiet(c);
        c.search.tail_texts = TEXTS;
        c.search.tail_wait = BOUND_ONLY;
        c.metrics.listen = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let mut c = server.client.clone();
    for i in 0..20 {
        let texts = call(i);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        c.append_entries(append_request("s", &refs))
            .await
            .expect("append");
        let b = backlog(&mut c).await;
        // An age exactly when something waits.
        assert_eq!(b.oldest_unindexed_age.is_some(), b.unindexed > 0, "{b:?}");
        // Appends wait at twice the policy's texts; one call adds ten.
        assert!(b.unindexed < 2 * TEXTS + 10, "{b:?}");
    }
    // Nothing has searched: the indexer took the tail once it held 25.
    backlog_under(&mut c, TEXTS).await;
    // The metrics say what GetBacklog says, read on both sides of the
    // scrape (a pass woken by the last appends may still be ending).
    let mut said = Vec::new();
    for _ in 0..100 {
        let before = backlog(&mut c).await.unindexed;
        let scraped = scrape(&metrics_at(&server).await).await;
        let after = backlog(&mut c).await.unindexed;
        let line = format!("archivist_search_unindexed_texts {before}");
        if before == after && scraped.lines().any(|l| l == line) {
            said.clear();
            break;
        }
        said.push((before, after));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(said.is_empty(), "the metric never matched: {said:?}");
    // Every call's entries are found, those of the tail too, which the
    // first search indexed.
    every_call_is_found(&mut c, 20).await;
    let b = backlog(&mut c).await;
    assert_eq!((b.unindexed, b.oldest_unindexed_age), (0, None));
}

#[tokio::test]
async fn what_a_killed_server_left_unindexed_is_indexed_when_the_next_one_opens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "1000000000"),
        ("ARCHIVIST_SEGMENT_MAX_IDLE", "1h"),
        ("ARCHIVIST_SEARCH_TAIL_TEXTS", "1000000"),
        ("ARCHIVIST_SEARCH_TAIL_WAIT", "1h"),
    ];
    let mut server = Process::start(dir.path(), &env).await;
    let mut c = server.client().await;
    for i in 0..5 {
        c.append_entries(pb::AppendEntriesRequest {
            session_id: format!("s{}", i % 2),
            entries: call(i).iter().map(|t| entry(t)).collect(),
            ..Default::default()
        })
        .await
        .expect("append");
    }
    assert_eq!(backlog(&mut c).await.unindexed, 50);
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");

    let server = Process::start(dir.path(), &env).await;
    let mut c = server.client().await;
    // With no search asking: the indexer's first pass.
    let b = backlog_under(&mut c, 1).await;
    assert_eq!((b.unindexed, b.oldest_unindexed_age), (0, None));
    let said = server
        .log
        .lock()
        .expect("log")
        .iter()
        .any(|l| l.contains("not yet indexed when the last run ended") && l.contains("50"));
    assert!(said, "the start-up says what it indexed");
    every_call_is_found(&mut c, 5).await;
}

#[tokio::test]
async fn erasing_a_session_whose_entries_are_not_indexed_yet_leaves_them_in_no_file() {
    let server = TestServer::start_with(|c| {
        quiet(c);
        c.search.tail_texts = 1_000_000;
        c.search.tail_wait = BOUND_ONLY;
    })
    .await;
    let mut c = server.client.clone();
    c.append_entries(append_request(
        "gone",
        &[
            "the locker code is quillmarker7731",
            "quillmarker7731 again",
        ],
    ))
    .await
    .expect("append");
    c.append_entries(append_request("kept", &["the kept session's own words"]))
        .await
        .expect("append");
    assert_eq!(backlog(&mut c).await.unindexed, 3);
    c.delete_session(pb::DeleteSessionRequest {
        session_id: "gone".into(),
    })
    .await
    .expect("delete");
    // Out of the tail with the session; the other session's entry waits.
    assert_eq!(backlog(&mut c).await.unindexed, 1);
    let traces = in_any_file(server.data_dir(), "quillmarker7731");
    assert!(traces.is_empty(), "the marker is still in {traces:?}");
    assert!(found(&mut c, "quillmarker7731").await.is_empty());
    assert_eq!(
        found(&mut c, "kept").await,
        vec!["the kept session's own words"]
    );
    assert_eq!(backlog(&mut c).await.unindexed, 0);
}

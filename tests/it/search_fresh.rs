//! Search finds what was just stored, through the real binary on both
//! backends: every acknowledged entry by the very next search
//! (read-your-writes), and every acknowledged entry after a SIGKILL and a
//! restart. An index written behind the appends that Search did not make
//! up for would fail both.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use archivist::pb;

use crate::binary::Process;
use crate::harness::{entry, eventually};

/// Segments that never close (no recap hits beside the entries) and no
/// idle closing during a test; on SQLite, the index's tail indexed by
/// nothing but a search (or a restart) during a test, so that a search
/// that did not index it first would miss what it holds.
const QUIET: [(&str, &str); 5] = [
    ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
    ("ARCHIVIST_SEGMENT_MAX_TOKENS", "1000000000"),
    ("ARCHIVIST_SEGMENT_MAX_IDLE", "1h"),
    ("ARCHIVIST_SEARCH_TAIL_TEXTS", "1000000"),
    ("ARCHIVIST_SEARCH_TAIL_WAIT", "1h"),
];

/// Concurrent writers, so that group commits hold several calls.
const WRITERS: usize = 4;

/// The word that only call `i` of writer `w` holds (in every entry of the
/// call): one token to both backends' tokenizers.
fn word(w: usize, i: usize) -> String {
    format!("fresh{w}q{i}z")
}

/// Entry texts of call `i` of writer `w`: 1 entry, or 10 on every third
/// call, each naming the call's word.
fn texts(w: usize, i: usize) -> Vec<String> {
    let n = if i % 3 == 2 { 10 } else { 1 };
    (0..n)
        .map(|k| {
            format!(
                "{} entry {k}: the agent asked about the billing migration",
                word(w, i)
            )
        })
        .collect()
}

/// The texts of the hits for `query`, every session of the tenant.
pub(crate) async fn found(client: &mut archivist::client::Client, query: &str) -> Vec<String> {
    let mut hits: Vec<String> = client
        .search(pb::SearchRequest {
            query: query.to_owned(),
            limit: 50,
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner()
        .hits
        .into_iter()
        .map(|h| h.text)
        .collect();
    hits.sort();
    hits
}

/// Each writer appends `calls` calls to a session of its own and searches
/// for each call's word as soon as it is acknowledged: every entry of the
/// call must be among the hits, and nothing else.
async fn every_append_is_found_at_once(env: &[(&str, &str)], calls: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Process::start(dir.path(), env).await;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.client().await;
        writers.push(tokio::spawn(async move {
            for i in 0..calls {
                let texts = texts(w, i);
                client
                    .append_entries(pb::AppendEntriesRequest {
                        session_id: format!("fresh-{w}"),
                        entries: texts.iter().map(|t| entry(t)).collect(),
                        ..Default::default()
                    })
                    .await
                    .expect("append");
                let mut want = texts;
                want.sort();
                assert_eq!(
                    found(&mut client, &word(w, i)).await,
                    want,
                    "writer {w}, call {i}: the search right after the append"
                );
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
}

#[tokio::test]
async fn every_acknowledged_entry_is_found_by_the_next_search_on_sqlite() {
    every_append_is_found_at_once(&QUIET, 100).await;
}

#[tokio::test]
async fn every_acknowledged_entry_is_found_by_the_next_search_on_postgres() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let mut env = QUIET.to_vec();
    env.extend([
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
    ]);
    every_append_is_found_at_once(&env, 100).await;
}

/// Writers append as fast as they can and record what was acknowledged;
/// the server is killed (SIGKILL) while they are at it, then started again
/// on the same store: a search for each acknowledged call's word finds
/// every entry of it.
async fn nothing_acknowledged_is_lost_to_search_after_sigkill(env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Process::start(dir.path(), env).await;
    let acked: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.client().await;
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let texts = texts(w, i);
                let request = pb::AppendEntriesRequest {
                    session_id: format!("killed-{w}"),
                    entries: texts.iter().map(|t| entry(t)).collect(),
                    ..Default::default()
                };
                match client.append_entries(request).await {
                    Ok(_) => {
                        let mut want = texts;
                        want.sort();
                        acked.lock().expect("lock").insert(word(w, i), want);
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    let enough = eventually(Duration::from_secs(60), || async {
        acked.lock().expect("lock").len() >= 300
    })
    .await;
    assert!(enough, "appends were acknowledged");
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
    for writer in writers {
        writer.await.expect("writer");
    }
    let acked = acked.lock().expect("lock").clone();

    let server = Process::start(dir.path(), env).await;
    let mut client = server.client().await;
    for (word, want) in &acked {
        assert_eq!(
            &found(&mut client, word).await,
            want,
            "{word}: acknowledged before the kill"
        );
    }
}

#[tokio::test]
async fn nothing_acknowledged_is_lost_to_search_after_sigkill_on_sqlite() {
    nothing_acknowledged_is_lost_to_search_after_sigkill(&QUIET).await;
}

#[tokio::test]
async fn nothing_acknowledged_is_lost_to_search_after_sigkill_on_postgres() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let mut env = QUIET.to_vec();
    env.extend([
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
    ]);
    nothing_acknowledged_is_lost_to_search_after_sigkill(&env).await;
}

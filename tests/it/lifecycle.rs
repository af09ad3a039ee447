//! Session lifecycle: erasure that leaves no trace in the files, fenced
//! against a pass in flight, and watching a session's recaps land.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use archivist::pb;
use tonic::Code;
use wiremock::{Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, append_request, eventually, state};
use crate::provider::{completion, error_json, fast, provider};
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

/// True when `needle` appears in any file of `dir`.
pub(crate) fn in_any_file(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            found.push(path.display().to_string());
        }
    }
    found
}

/// A provider that echoes the marker of the segment into its recap, so the
/// marker is in summaries too.
#[derive(Clone)]
struct Echo;

impl Respond for Echo {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body = String::from_utf8_lossy(&request.body);
        if body.contains("MARKER-") {
            completion("Recap about MARKER-7f3a9 and its plan.")
        } else {
            completion("Recap.")
        }
    }
}

#[tokio::test]
async fn an_erased_session_leaves_no_trace_and_starts_again_at_seq_one() {
    let mock = provider(Echo).await;
    let server = TestServer::start_with(|c| {
        tenants(c);
        fast(c, &mock.uri());
        c.segment.max_entries = 2;
        c.limits.max_tenant_bytes = 4_000;
    })
    .await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    for text in [
        "The secret is MARKER-7f3a9, keep it.",
        "Noted MARKER-7f3a9.",
        "And more about MARKER-7f3a9 here.",
    ] {
        a.append_entries(append_request("s", &[text]))
            .await
            .expect("append");
    }
    b.append_entries(append_request("s", &["Tenant b's own words."]))
        .await
        .expect("append");
    // The first segment is summarised with the marker in its recap.
    a.close_segment(pb::CloseSegmentRequest {
        session_id: "s".into(),
        wait: true,
    })
    .await
    .expect("close");
    assert!(
        eventually(Duration::from_secs(10), || async {
            let page = a
                .clone()
                .list_segments(pb::ListSegmentsRequest {
                    session_id: "s".into(),
                    ..Default::default()
                })
                .await
                .expect("list")
                .into_inner();
            page.segments.iter().filter(|s| s.summary.is_some()).count() == 2
        })
        .await
    );
    // Fill tenant a up to its byte cap.
    let mut filled = 0;
    while a
        .append_entries(append_request("filler", &[&"x".repeat(200)]))
        .await
        .is_ok()
    {
        filled += 1;
        assert!(filled < 100);
    }
    assert!(!in_any_file(server.data_dir(), "MARKER-7f3a9").is_empty());

    let erased = a
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!((erased.entries_deleted, erased.segments_deleted), (3, 2));
    let traces = in_any_file(server.data_dir(), "MARKER-7f3a9");
    assert!(traces.is_empty(), "the marker is still in {traces:?}");

    let status = a
        .get_context(pb::GetContextRequest {
            session_id: "s".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect_err("gone");
    assert_eq!(status.code(), Code::NotFound);
    let again = a
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect_err("already gone");
    assert_eq!(again.code(), Code::NotFound);
    // Tenant b's session of the same name is untouched.
    let theirs = b
        .get_context(pb::GetContextRequest {
            session_id: "s".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect("b's session")
        .into_inner();
    assert_eq!(theirs.items.len(), 1);
    // The tenant's byte count dropped by what was erased: room again, and
    // a new session of the same name starts at seq 1.
    let fresh = a
        .append_entries(append_request("s", &["A new beginning."]))
        .await
        .expect("append after erasure")
        .into_inner();
    assert_eq!(fresh.entries[0].seq, 1);
}

/// A provider that holds every request until released.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<AtomicBool>,
    answered: Arc<AtomicBool>,
}

impl Respond for Gate {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.answered.store(true, Ordering::SeqCst);
        completion("A recap written after the erasure.")
    }
}

#[tokio::test]
async fn an_erasure_racing_a_pass_leaves_nothing_behind() {
    let gate = Gate::default();
    let mock = provider(gate.clone()).await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    server.append("s", &["Something to recap."]).await;
    let mut client = server.client.clone();
    let waiting = tokio::spawn(async move {
        client
            .close_segment(pb::CloseSegmentRequest {
                session_id: "s".into(),
                wait: true,
            })
            .await
    });
    // The pass is in flight at the provider.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let erased = server
        .client
        .clone()
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(erased.segments_deleted, 1);
    // The waiting caller learns it from the erasure, while the pass is
    // still held at the provider.
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("answered before the pass ended")
        .expect("joined");
    let status = answer.expect_err("the session is gone");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(crate::harness::reason(&status), "SESSION_NOT_FOUND");
    gate.open.store(true, Ordering::SeqCst);
    let answered = eventually(Duration::from_secs(10), || async {
        gate.answered.load(Ordering::SeqCst)
    })
    .await;
    assert!(answered);
    // The pass has its recap now; give it the moment its write would take.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The pass wrote nothing: no segment, no summary, no counts.
    let b = server.backlog().await;
    assert_eq!((b.open, b.pending, b.summarised, b.parked), (0, 0, 0, 0));
    assert!(in_any_file(server.data_dir(), "after the erasure").is_empty());
    let fresh = server.append("s", &["Again."]).await;
    assert_eq!(fresh.entries[0].seq, 1);
}

/// A provider that fails while told to, else answers.
#[derive(Clone, Default)]
struct Switch {
    failing: Arc<AtomicBool>,
}

impl Respond for Switch {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        if self.failing.load(Ordering::SeqCst) {
            error_json(503, "overloaded", "try later")
        } else {
            completion("Recap.")
        }
    }
}

/// The next event, waiting at most ten seconds; None when the stream ended.
async fn next(stream: &mut tonic::Streaming<pb::SessionEvent>) -> Option<pb::SessionEvent> {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
}

fn kind(event: &pb::SessionEvent) -> pb::SessionEventKind {
    pb::SessionEventKind::try_from(event.kind).expect("kind")
}

#[tokio::test]
async fn a_watcher_sees_recaps_land_fail_and_the_session_end() {
    let switch = Switch::default();
    let mock = provider(switch.clone()).await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 2;
        c.memory.fanout = 2;
        c.retry.max_attempts = 1;
        c.reconciler.interval = Duration::from_millis(100);
        c.reconciler.concurrency = 1;
    })
    .await;
    server.append("s", &["first"]).await;
    let mut stream = server
        .client
        .clone()
        .watch_session(pb::WatchSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("watch")
        .into_inner();

    // A segment closes and is summarised.
    server.append("s", &["second"]).await;
    let closed = next(&mut stream).await.expect("event");
    assert_eq!(kind(&closed), pb::SessionEventKind::Closed);
    let id = closed.segment.as_ref().expect("segment").id;
    let summarised = next(&mut stream).await.expect("event");
    assert_eq!(kind(&summarised), pb::SessionEventKind::Summarised);
    let seg = summarised.segment.expect("segment");
    assert_eq!(seg.id, id);
    assert!(seg.summary.is_some());

    // The next one fails, with its typed failure.
    switch.failing.store(true, Ordering::SeqCst);
    server.append("s", &["third", "fourth"]).await;
    assert_eq!(
        kind(&next(&mut stream).await.expect("event")),
        pb::SessionEventKind::Closed
    );
    let failed = next(&mut stream).await.expect("event");
    assert_eq!(kind(&failed), pb::SessionEventKind::Failed);
    let failure = failed
        .segment
        .as_ref()
        .and_then(|s| s.last_failure.clone())
        .expect("failure");
    assert!(matches!(
        failure.kind,
        Some(pb::failure::Kind::Unavailable(_))
    ));

    // Once it recovers: that segment, then the roll-up of both.
    switch.failing.store(false, Ordering::SeqCst);
    // The roll-up comes into being PENDING (CLOSED), then is summarised.
    let mut rollup_closed = None;
    let mut rollup_summarised = false;
    while !rollup_summarised {
        let event = next(&mut stream).await.expect("event");
        let Some(node) = event.segment.as_ref().filter(|s| s.level == 2) else {
            continue;
        };
        match kind(&event) {
            pb::SessionEventKind::Closed => {
                assert_eq!(state(node), pb::SegmentState::Pending);
                rollup_closed = Some(node.id);
            }
            pb::SessionEventKind::Summarised => {
                assert_eq!(rollup_closed, Some(node.id), "CLOSED came first");
                rollup_summarised = true;
            }
            _ => {}
        }
    }

    // Erasure: DELETED, then the stream ends cleanly.
    server
        .client
        .clone()
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("delete");
    let deleted = next(&mut stream).await.expect("event");
    assert_eq!(kind(&deleted), pb::SessionEventKind::Deleted);
    assert!(
        next(&mut stream).await.is_none(),
        "the stream ends after DELETED"
    );
}

#[tokio::test]
async fn a_watch_of_a_session_not_there_yet_waits_for_it_and_sees_only_its_tenants() {
    let server = TestServer::start_with(tenants).await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    a.append_entries(append_request("s", &["a's"]))
        .await
        .expect("append");
    // B has no session "s" yet: its watch waits for one.
    let mut watch = b
        .watch_session(pb::WatchSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("a watch of a session to come")
        .into_inner();
    let a_closed = crate::harness::close_now(&a, "s").await;
    b.append_entries(append_request("s", &["b's"]))
        .await
        .expect("append");
    let b_closed = crate::harness::close_now(&b, "s").await;
    assert_ne!(a_closed.id, b_closed.id);
    // B hears of its own session only: its close, then its recap.
    let closed = next(&mut watch).await.expect("event");
    assert_eq!(kind(&closed), pb::SessionEventKind::Closed);
    assert_eq!(closed.segment.map(|s| s.id), Some(b_closed.id));
    let summarised = next(&mut watch).await.expect("event");
    assert_eq!(kind(&summarised), pb::SessionEventKind::Summarised);
    assert_eq!(summarised.segment.map(|s| s.id), Some(b_closed.id));
    let status = b
        .delete_session(pb::DeleteSessionRequest {
            session_id: "nothing-here".into(),
        })
        .await
        .expect_err("b has no such session");
    assert_eq!(status.code(), Code::NotFound);
    b.delete_session(pb::DeleteSessionRequest {
        session_id: "s".into(),
    })
    .await
    .expect("delete b's s");
    let deleted = next(&mut watch).await.expect("event");
    assert_eq!(kind(&deleted), pb::SessionEventKind::Deleted);
    assert!(next(&mut watch).await.is_none(), "ends after DELETED");
    a.get_context(pb::GetContextRequest {
        session_id: "s".into(),
        max_tokens: 0,
        query: String::new(),
        min_similarity: None,
    })
    .await
    .expect("a's session is untouched");
}

#[tokio::test]
async fn a_watch_ends_with_unavailable_at_shutdown() {
    let server = TestServer::start().await;
    server.append("s", &["x"]).await;
    let mut stream = server
        .client
        .clone()
        .watch_session(pb::WatchSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let stopping = tokio::spawn(server.stop());
    let end = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends before the shutdown ceiling");
    let status = end.expect_err("UNAVAILABLE");
    assert_eq!(status.code(), Code::Unavailable);
    stopping.await.expect("stopped");
}

#[tokio::test]
async fn sessions_past_their_ttl_are_erased_and_younger_ones_stay() {
    let server = TestServer::start_with(|c| {
        c.retention.session_ttl = Duration::from_secs(1);
        c.reconciler.interval = Duration::from_millis(100);
    })
    .await;
    server.append("old", &["long ago"]).await;
    let mut watch = server
        .client
        .clone()
        .watch_session(pb::WatchSessionRequest {
            session_id: "old".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    server.append("young", &["just now"]).await;
    let gone = eventually(Duration::from_secs(5), || async {
        server
            .client
            .clone()
            .get_context(pb::GetContextRequest {
                session_id: "old".into(),
                max_tokens: 0,
                query: String::new(),
                min_similarity: None,
            })
            .await
            .is_err_and(|s| s.code() == Code::NotFound)
    })
    .await;
    assert!(gone, "the old session is erased");
    server
        .client
        .clone()
        .get_context(pb::GetContextRequest {
            session_id: "young".into(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect("the young one stays");
    let event = next(&mut watch).await.expect("an event");
    assert_eq!(kind(&event), pb::SessionEventKind::Deleted);
    assert!(next(&mut watch).await.is_none());
    assert_eq!(server.backlog().await.open, 1);
}

async fn watch(
    server: &TestServer,
    session: &str,
) -> Result<tonic::Streaming<pb::SessionEvent>, tonic::Status> {
    server
        .client
        .clone()
        .watch_session(pb::WatchSessionRequest {
            session_id: session.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn open_watches_hold_no_call_slot_and_are_capped_on_their_own() {
    let server = TestServer::start_with(|c| {
        c.limits.max_concurrent_calls = 2;
        c.limits.max_watches = 6;
        c.limits.max_watches_per_tenant = 5;
    })
    .await;
    let mut open = Vec::new();
    for i in 0..5 {
        open.push(watch(&server, &format!("s{i}")).await.expect("watch"));
    }
    // Five watches open, two call slots: both are free.
    let (one, two) = tokio::join!(server.backlog(), server.backlog());
    assert_eq!((one.open, two.open), (0, 0));
    let refused = watch(&server, "s5")
        .await
        .expect_err("the tenant's share is full");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(crate::harness::reason(&refused), "TOO_MANY_WATCHES");
    open.pop();
    let mut freed = false;
    for _ in 0..250 {
        if let Ok(stream) = watch(&server, "s5").await {
            open.push(stream);
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "a closed watch gives its place back");
}

#[tokio::test]
async fn list_sessions_pages_through_one_tenants_sessions_and_no_others() {
    let server = TestServer::start_with(tenants).await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    for i in 0..250 {
        a.append_entries(append_request(&format!("a-{i:03}"), &["x"]))
            .await
            .expect("append");
    }
    for name in ["b-only-1", "b-only-2", "a-007"] {
        b.append_entries(append_request(name, &["y", "z"]))
            .await
            .expect("append");
    }
    let mut names = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = a
            .list_sessions(pb::ListSessionsRequest {
                page_size: 100,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        pages += 1;
        for s in &page.sessions {
            assert_eq!(s.entry_count, 1, "tenant a's own count: {s:?}");
        }
        names.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..250).map(|i| format!("a-{i:03}")).collect();
    assert_eq!(names, want);
    let theirs: Vec<String> = b
        .list_sessions(pb::ListSessionsRequest {
            page_size: 0,
            page_token: String::new(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(theirs, vec!["a-007", "b-only-1", "b-only-2"]);
}

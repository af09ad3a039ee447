//! Session wind-down (FlushSession) and process wind-down (SIGTERM): both
//! bounded, both leaving unfinished segments PENDING with claims released.

use std::time::{Duration, Instant};

use archivist::pb;
use wiremock::ResponseTemplate;

use crate::harness::{TestServer, eventually, state};
use crate::provider::{Script, completion, fast};

fn hang() -> ResponseTemplate {
    completion("never in time").set_delay(Duration::from_secs(600))
}

async fn flush(
    server: &TestServer,
    session: &str,
) -> Result<pb::FlushSessionResponse, tonic::Status> {
    server
        .client
        .clone()
        .flush_session(pb::FlushSessionRequest {
            session_id: session.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_flush_against_a_silent_provider_returns_at_its_ceiling_and_lets_go() {
    let script = Script::new(vec![hang(), completion("The recap.")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.flush.ceiling = Duration::from_secs(1);
        c.retry.attempt_timeout = Duration::from_secs(60);
        c.retry.pass_ceiling = Duration::from_secs(60);
    })
    .await;
    server.append("s", &["something to keep"]).await;
    let started = Instant::now();
    let resp = flush(&server, "s").await.expect("flush answers");
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "{elapsed:?} for a 1 s ceiling"
    );
    assert!(!resp.complete);
    assert_eq!(resp.segments.len(), 1);
    assert_eq!(state(&resp.segments[0]), pb::SegmentState::Pending);
    // The claim was let go with the answer: the segment is taken up again at
    // once (no lease to wait out) and the second request succeeds.
    let done = eventually(Duration::from_secs(5), || async {
        flush(&server, "s").await.is_ok_and(|r| r.complete)
    })
    .await;
    assert!(done);
    assert_eq!(script.calls(), 2);
    let seg = &server.segments("s").await[0];
    assert_eq!(
        seg.passes, 1,
        "the cancelled pass is not counted as a failure"
    );
    assert!(seg.last_failure.is_none());
}

#[tokio::test]
async fn a_flush_returns_before_a_shorter_call_deadline() {
    let script = Script::new(vec![hang()]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.flush.ceiling = Duration::from_secs(30);
        c.retry.attempt_timeout = Duration::from_secs(60);
        c.retry.pass_ceiling = Duration::from_secs(60);
    })
    .await;
    server.append("s", &["something"]).await;
    let mut request = tonic::Request::new(pb::FlushSessionRequest {
        session_id: "s".into(),
    });
    request.set_timeout(Duration::from_millis(800));
    let started = Instant::now();
    let resp = server
        .client
        .clone()
        .flush_session(request)
        .await
        .expect("answered before the deadline, not cut off by it")
        .into_inner();
    assert!(started.elapsed() < Duration::from_millis(800));
    assert!(!resp.complete);
    assert_eq!(state(&resp.segments[0]), pb::SegmentState::Pending);
}

#[tokio::test]
async fn a_flush_against_a_healthy_provider_completes() {
    let script = Script::new(vec![completion("Recap.")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 2;
    })
    .await;
    server.append("s", &["a", "b", "c", "d", "e"]).await;
    let resp = flush(&server, "s").await.expect("flush");
    assert!(resp.complete);
    assert_eq!(resp.segments.len(), 3);
    assert!(
        resp.segments
            .iter()
            .all(|s| state(s) == pb::SegmentState::Summarised)
    );
    assert_eq!(script.calls(), 3);
}

#[tokio::test]
async fn two_concurrent_flushes_send_each_recap_once() {
    let script = Script::new(vec![
        completion("Recap.").set_delay(Duration::from_millis(300)),
    ]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 2;
    })
    .await;
    // Two closed segments and one open: the flushes close it.
    server.append("s", &["a", "b", "c", "d", "e"]).await;
    let (a, b) = tokio::join!(flush(&server, "s"), flush(&server, "s"));
    let (a, b) = (a.expect("flush a"), b.expect("flush b"));
    assert!(a.complete && b.complete);
    assert_eq!(script.calls(), 3, "one request per segment");
    for seg in server.segments("s").await {
        assert_eq!((seg.attempts, seg.passes), (1, 1));
    }
}

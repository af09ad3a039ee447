//! The reconciler: every segment owed a recap gets it, exactly once, at a
//! pace that does not bury a struggling provider. Proved by counting
//! requests at a fake provider and reading segments back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archivist::internals::TRIP_AFTER;
use archivist::pb;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, eventually, state};
use crate::provider::{Script, completion, error_json, fast};

/// A provider that answers 503 while `down`, a completion otherwise,
/// counting both.
#[derive(Clone, Default)]
struct Outage {
    down: Arc<AtomicBool>,
    failed: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl Respond for Outage {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            ResponseTemplate::new(503)
        } else {
            self.answered.fetch_add(1, Ordering::SeqCst);
            completion("Recap after the outage.")
        }
    }
}

/// Counts requests per segment (by the marker each segment's entry
/// carries) and how many of each were in flight at once.
#[derive(Clone, Default)]
pub struct PerSegment {
    sent: Arc<Mutex<HashMap<String, usize>>>,
}

impl PerSegment {
    /// Requests per segment marker so far.
    pub fn sent(&self) -> HashMap<String, usize> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Respond for PerSegment {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body = String::from_utf8_lossy(&request.body);
        let marker = body
            .split("marker-")
            .nth(1)
            .map(|rest| {
                rest.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
            })
            .unwrap_or_default();
        *self.sent.lock().expect("lock").entry(marker).or_default() += 1;
        completion("Recap.").set_delay(Duration::from_millis(50))
    }
}

/// Appends `n` entries with `max_entries = 1`, closing `n` segments.
pub async fn closed_segments(server: &TestServer, session: &str, n: usize) {
    let texts: Vec<String> = (0..n)
        .map(|i| format!("Entry marker-{i} of the backlog."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let resp = server.append(session, &refs).await;
    assert_eq!(resp.closed_segment_ids.len(), n);
}

/// Probes the breaker can start within `window`: the first after `first`,
/// each next after twice the previous spacing, capped at `cap`.
fn probes_within(window: Duration, first: Duration, cap: Duration) -> u32 {
    let (mut at, mut spacing, mut n) = (first, first, 0);
    while at <= window {
        n += 1;
        spacing = (spacing * 2).min(cap);
        at += spacing;
    }
    n
}

#[tokio::test]
async fn an_outage_costs_few_requests_and_every_segment_is_summarised_after() {
    let outage = Outage::default();
    outage.down.store(true, Ordering::SeqCst);
    let mock = crate::provider::provider(outage.clone()).await;
    let interval = Duration::from_millis(200);
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 1;
        c.reconciler.interval = interval;
        c.reconciler.max_spacing = Duration::from_secs(2);
        // Roll-ups off: this test counts the sends of level-1 segments.
        c.memory.fanout = 0;
    })
    .await;
    let segments = 40;
    closed_segments(&server, "s", segments).await;

    let window = Duration::from_secs(3);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let b = server.backlog().await;
    assert_eq!(b.pending, segments as u64);
    assert_eq!(b.summarised, 0);
    assert!(b.oldest_pending_age.is_some());
    let sent_while_down = outage.failed.load(Ordering::SeqCst) as u32;
    let elapsed = started.elapsed();

    // The bound of docs/retries.md: before the breaker opens, a pass per
    // slot and one more per slot freed by the failures that trip it; after
    // that, one probe pass per probe interval.
    let max_attempts = 3;
    let concurrency = 4;
    let probes = probes_within(elapsed, interval, Duration::from_secs(2));
    let bound = max_attempts * (concurrency + TRIP_AFTER - 1 + probes);
    assert!(
        sent_while_down <= bound,
        "{sent_while_down} requests while down, bound {bound}"
    );
    assert!(
        sent_while_down < max_attempts * segments as u32 / 2,
        "{sent_while_down} requests: the backlog was fanned out"
    );

    outage.down.store(false, Ordering::SeqCst);
    let done = eventually(Duration::from_secs(20), || async {
        server.backlog().await.summarised == segments as u64
    })
    .await;
    assert!(done, "{:?}", server.backlog().await);
    let b = server.backlog().await;
    assert_eq!((b.pending, b.parked), (0, 0));
    assert!(b.oldest_pending_age.is_none());
    // One answered request, one summary, per segment.
    assert_eq!(outage.answered.load(Ordering::SeqCst), segments);
    for seg in server.segments("s").await {
        assert_eq!(state(&seg), pb::SegmentState::Summarised);
        assert!(seg.summary.is_some());
    }
}

#[tokio::test]
async fn a_refused_key_parks_until_the_key_changes_or_a_requeue() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-good-key-000000"))
        .respond_with(completion("Recap with the good key."))
        .mount(&mock)
        .await;
    let refusals = Script::new(vec![error_json(
        401,
        "invalid_api_key",
        "Incorrect API key",
    )]);
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(refusals.clone())
        .mount(&mock)
        .await;
    let config = || {
        let mut c = archivist::config::Config::default();
        fast(&mut c, &mock.uri());
        c.reconciler.interval = Duration::from_millis(50);
        c
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = TestServer::start_in(dir, config(), Some("sk-bad-key-111111")).await;
    server.append("s", &["one thing to remember"]).await;
    server.close("s", false).await.expect("close");
    let parked = eventually(Duration::from_secs(10), || async {
        server.backlog().await.parked == 1
    })
    .await;
    assert!(parked);
    let b = server.backlog().await;
    assert_eq!(b.parked_by_class.get("unauthorized"), Some(&1));
    // Many ticks later, still one request: a parked segment is not retried.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(refusals.calls(), 1);
    // A requeue without include_parked leaves it be.
    let requeued = server.requeue("", false).await;
    assert_eq!(requeued, 0);

    // Restarting under another key makes it due by itself.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, config(), Some("sk-good-key-000000")).await;
    let done = eventually(Duration::from_secs(10), || async {
        server.backlog().await.summarised == 1
    })
    .await;
    assert!(done, "{:?}", server.backlog().await);
    assert_eq!(refusals.calls(), 1);

    // A segment parked under a key the provider refuses once:
    // RequeueSegments brings it back without a restart.
    let dir = tempfile::tempdir().expect("temp dir");
    let script = Script::new(vec![
        error_json(401, "invalid_api_key", "key revoked"),
        completion("Recap."),
    ]);
    let mock2 = script.mount().await;
    let server = TestServer::start_in(
        dir,
        {
            let mut c = archivist::config::Config::default();
            fast(&mut c, &mock2.uri());
            c.reconciler.interval = Duration::from_millis(50);
            c
        },
        Some("sk-some-key-222222"),
    )
    .await;
    server.append("t", &["another thing"]).await;
    let closed = server.close("t", true).await.expect("closed");
    let seg = closed.segment.expect("a segment");
    assert_eq!(state(&seg), pb::SegmentState::Parked);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.calls(), 1, "parked: no retry");
    let requeued = server.requeue("t", true).await;
    assert_eq!(requeued, 1);
    let done = eventually(Duration::from_secs(10), || async {
        server.backlog().await.summarised == 1
    })
    .await;
    assert!(done);
    assert_eq!(script.calls(), 2);
}

#[tokio::test]
async fn a_retry_after_is_honoured_across_passes() {
    let limited = error_json(429, "rate_limit_exceeded", "Rate limit reached")
        .insert_header("retry-after", "5");
    let script = Script::new(vec![limited, completion("after five seconds")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        // Too long to wait inside the pass: the reconciler must wait it out.
        c.retry.max_blind_wait = Duration::from_secs(1);
        c.reconciler.interval = Duration::from_millis(100);
    })
    .await;
    server.append("s", &["rate limited"]).await;
    server.close("s", false).await.expect("close");
    let done = eventually(Duration::from_secs(20), || async {
        server.backlog().await.summarised == 1
    })
    .await;
    assert!(done);
    let times: Vec<Instant> = script.requests().into_iter().map(|(t, _)| t).collect();
    assert_eq!(times.len(), 2);
    assert!(
        times[1] - times[0] >= Duration::from_secs(5),
        "sent again after {:?}",
        times[1] - times[0]
    );
    let seg = &server.segments("s").await[0];
    assert_eq!((seg.attempts, seg.passes), (2, 2));
}

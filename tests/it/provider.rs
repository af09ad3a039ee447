//! Summarising through an OpenAI-compatible provider: classification and the
//! bounded pass, proved by counting requests at a real local HTTP server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archivist::config::{Config, ProviderKind};
use archivist::failure::FailureClass;
use archivist::model::estimate_tokens;
use archivist::pb;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, eventually, state};

/// A provider whose n-th answer is `steps[n]` (the last one repeating),
/// recording when each request came and what it carried.
#[derive(Clone)]
pub struct Script {
    steps: Arc<Vec<ResponseTemplate>>,
    calls: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<(Instant, Request)>>>,
}

impl Script {
    pub fn new(steps: Vec<ResponseTemplate>) -> Script {
        Script {
            steps: Arc::new(steps),
            calls: Arc::default(),
            log: Arc::default(),
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<(Instant, Request)> {
        self.log.lock().expect("lock").clone()
    }

    pub async fn mount(&self) -> MockServer {
        provider(self.clone()).await
    }
}

/// A fake provider answering every chat completion with `responder`.
pub async fn provider(responder: impl Respond + 'static) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(responder)
        .mount(&server)
        .await;
    server
}

impl Respond for Script {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.log
            .lock()
            .expect("lock")
            .push((Instant::now(), request.clone()));
        self.steps[n.min(self.steps.len() - 1)].clone()
    }
}

pub fn completion(text: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model-0613",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    }))
}

pub fn error_json(status: u16, code: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(serde_json::json!({
        "error": {"message": message, "type": code, "param": null, "code": code}
    }))
}

fn html(status: u16) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "text/html")
        .set_body_string("<html><body><h1>502 Bad Gateway</h1></body></html>")
}

/// A configuration pointing at `base` with a fast pass, so tests take
/// milliseconds: the counts, not the waits, are what they prove.
pub fn fast(config: &mut Config, base: &str) {
    config.provider.kind = ProviderKind::Openai;
    config.provider.base_url = format!("{base}/v1");
    config.provider.model = "test-model".to_owned();
    // No start-up check: the tests count every request the provider gets.
    config.provider.check_on_start = false;
    config.retry.initial_backoff = Duration::from_millis(10);
    config.retry.max_backoff = Duration::from_millis(40);
    config.retry.attempt_timeout = Duration::from_secs(5);
    config.retry.pass_ceiling = Duration::from_secs(10);
    config.retry.max_blind_wait = Duration::from_secs(5);
    // No second pass by the reconciler while a test counts one pass.
    config.reconciler.interval = Duration::from_secs(3600);
}

/// Appends two entries and closes the segment, waiting for its recap:
/// `Ok` with the segment when it was summarised, `Err` with it (its state
/// and `last_failure`) when the recap did not succeed. The close itself is
/// OK either way.
pub async fn append_and_close(
    server: &TestServer,
    session: &str,
) -> Result<pb::Segment, pb::Segment> {
    server
        .append(
            session,
            &[
                "The billing deploy failed last night because the migration timed out.",
                "We agreed to rerun it with a longer timeout on Friday.",
            ],
        )
        .await;
    let seg = server
        .close(session, true)
        .await
        .expect("a committed close is OK whatever its recap did")
        .segment
        .expect("a segment was open");
    match pb::SegmentState::try_from(seg.state) {
        Ok(pb::SegmentState::Summarised) => Ok(seg),
        _ => Err(seg),
    }
}

/// The class of a Failure, as the Rust client decodes it.
pub fn class_of(f: &pb::Failure) -> Option<FailureClass> {
    archivist::client::decode_failure(f).map(|f| f.class)
}

/// The failure a segment's recap ended with.
pub fn failure_of(seg: &pb::Segment) -> &pb::Failure {
    seg.last_failure.as_ref().expect("a last_failure")
}

async fn only_segment(server: &TestServer, session: &str) -> pb::Segment {
    let segs = server.segments(session).await;
    assert_eq!(segs.len(), 1);
    segs.into_iter().next().expect("one segment")
}

#[tokio::test]
async fn each_retryable_class_succeeds_on_the_last_allowed_attempt() {
    let cases: Vec<(&str, ResponseTemplate)> = vec![
        ("unavailable 503", ResponseTemplate::new(503)),
        (
            "unavailable 500",
            error_json(500, "server_error", "internal error"),
        ),
        ("overloaded 529", ResponseTemplate::new(529)),
        ("HTML gateway page", html(502)),
        ("HTML where JSON was due", html(200)),
        ("timeout 408", ResponseTemplate::new(408)),
        ("timeout 504", ResponseTemplate::new(504)),
        ("empty completion", completion("")),
        (
            "rate limited with Retry-After",
            error_json(429, "rate_limit_exceeded", "Rate limit reached")
                .insert_header("retry-after", "0"),
        ),
        (
            "rate limited without Retry-After",
            error_json(429, "rate_limit_exceeded", "slow down"),
        ),
    ];
    for (name, failure) in cases {
        let script = Script::new(vec![failure.clone(), failure, completion("The recap.")]);
        let mock = script.mount().await;
        let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
        let seg = append_and_close(&server, "s").await.expect(name);
        assert_eq!(state(&seg), pb::SegmentState::Summarised, "{name}");
        assert_eq!(script.calls(), 3, "{name}: exactly max_attempts requests");
        assert_eq!(seg.attempts, 3, "{name}");
        assert_eq!(seg.passes, 1, "{name}");
        let summary = seg.summary.expect("summary");
        assert_eq!(summary.text, "The recap.");
        assert_eq!(summary.provider, "openai");
        assert_eq!(summary.model, "test-model-0613");
        assert_eq!((summary.input_tokens, summary.output_tokens), (42, 7));
    }
}

#[tokio::test]
async fn a_send_that_times_out_is_retried() {
    let slow = completion("too late").set_delay(Duration::from_secs(3));
    let script = Script::new(vec![slow.clone(), slow, completion("in time")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.retry.attempt_timeout = Duration::from_millis(300);
    })
    .await;
    let seg = append_and_close(&server, "s").await.expect("summarised");
    assert_eq!(script.calls(), 3);
    assert_eq!(seg.summary.expect("summary").text, "in time");
}

#[tokio::test]
async fn a_dropped_connection_is_retried() {
    let provider = FlakyTcp::start(2).await;
    let server = TestServer::start_with(|c| fast(c, &provider.base())).await;
    let seg = append_and_close(&server, "s").await.expect("summarised");
    assert_eq!(provider.connections(), 3);
    assert_eq!(seg.attempts, 3);
    assert_eq!(state(&seg), pb::SegmentState::Summarised);
}

#[tokio::test]
async fn a_close_whose_recap_failed_is_ok_and_a_retry_closes_nothing_new() {
    let script = Script::new(vec![ResponseTemplate::new(503)]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    // The close committed and its recap failed: OK, with the segment and
    // its failure, so no retry policy (UNAVAILABLE is retryable) repeats it.
    let closed = append_and_close(&server, "s")
        .await
        .expect_err("503 every time");
    assert_eq!(state(&closed), pb::SegmentState::Pending);
    assert_eq!(
        class_of(failure_of(&closed)),
        Some(FailureClass::Unavailable)
    );
    assert_eq!((closed.attempts, closed.passes), (3, 1));
    assert_eq!(script.calls(), 3);
    // A host that retries anyway closes nothing and starts no pass.
    let again = server.close("s", true).await.expect("close");
    assert!(again.segment.is_none(), "{again:?}");
    assert_eq!(server.segments("s").await.len(), 1);
    assert_eq!(script.calls(), 3, "no second pass");
}

#[tokio::test]
async fn classes_that_cannot_succeed_are_sent_once() {
    let cases: Vec<(&str, ResponseTemplate, FailureClass, pb::SegmentState)> = vec![
        (
            "401",
            error_json(401, "invalid_api_key", "Incorrect API key provided"),
            FailureClass::Unauthorized,
            pb::SegmentState::Parked,
        ),
        (
            "403",
            ResponseTemplate::new(403),
            FailureClass::Unauthorized,
            pb::SegmentState::Parked,
        ),
        (
            "404 model_not_found",
            error_json(
                404,
                "model_not_found",
                "The model `test-model` does not exist",
            ),
            FailureClass::UnknownModel,
            pb::SegmentState::Parked,
        ),
        (
            "429 insufficient_quota",
            error_json(429, "insufficient_quota", "You exceeded your current quota")
                .insert_header("retry-after", "1"),
            FailureClass::QuotaExhausted,
            pb::SegmentState::Pending,
        ),
        (
            "400 context_length_exceeded",
            error_json(
                400,
                "context_length_exceeded",
                "maximum context length is 8192 tokens",
            ),
            FailureClass::InvalidRequest,
            pb::SegmentState::Parked,
        ),
    ];
    for (name, answer, class, after) in cases {
        let script = Script::new(vec![answer, completion("never reached")]);
        let mock = script.mount().await;
        let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
        let closed = append_and_close(&server, "s").await.expect_err(name);
        assert_eq!(class_of(failure_of(&closed)), Some(class), "{name}");
        assert_eq!(script.calls(), 1, "{name}: exactly one request");
        let seg = only_segment(&server, "s").await;
        assert!(seg.summary.is_none(), "{name}: no summary of any kind");
        assert_eq!(state(&seg), after, "{name}");
        assert_eq!(seg.attempts, 1, "{name}");
    }
}

#[tokio::test]
async fn a_retry_after_is_waited_out_before_the_next_send() {
    let limited = error_json(429, "rate_limit_exceeded", "Rate limit reached")
        .insert_header("retry-after", "1");
    let script = Script::new(vec![limited, completion("after the wait")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    let seg = append_and_close(&server, "s").await.expect("summarised");
    assert_eq!(state(&seg), pb::SegmentState::Summarised);
    let times: Vec<Instant> = script.requests().into_iter().map(|(t, _)| t).collect();
    assert_eq!(times.len(), 2);
    assert!(
        times[1] - times[0] >= Duration::from_secs(1),
        "retried after {:?}",
        times[1] - times[0]
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_blind_wait_cap_or_the_time_left_ends_the_pass() {
    // Longer than max_blind_wait (5 s here).
    let too_long = error_json(429, "rate_limit_exceeded", "Rate limit reached")
        .insert_header("retry-after", "3600");
    // Within max_blind_wait but longer than the 2 s the pass has left.
    let too_late = error_json(429, "rate_limit_exceeded", "Rate limit reached")
        .insert_header("retry-after", "4");
    for (name, answer) in [("over the cap", too_long), ("past the ceiling", too_late)] {
        let script = Script::new(vec![answer, completion("never reached")]);
        let mock = script.mount().await;
        let server = TestServer::start_with(|c| {
            fast(c, &mock.uri());
            c.retry.pass_ceiling = Duration::from_secs(2);
        })
        .await;
        let started = Instant::now();
        let closed = append_and_close(&server, "s").await.expect_err(name);
        assert_eq!(script.calls(), 1, "{name}: one request");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{name}: no sleep"
        );
        match &failure_of(&closed).kind {
            Some(pb::failure::Kind::RateLimited(r)) => assert!(r.retry_after.is_some(), "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let seg = only_segment(&server, "s").await;
        assert_eq!(state(&seg), pb::SegmentState::Pending, "{name}");
    }
}

#[tokio::test]
async fn a_provider_that_never_answers_ends_the_pass_within_its_ceiling() {
    for attempt_timeout in [Duration::from_millis(400), Duration::from_secs(60)] {
        let script = Script::new(vec![
            completion("never").set_delay(Duration::from_secs(120)),
        ]);
        let mock = script.mount().await;
        let server = TestServer::start_with(|c| {
            fast(c, &mock.uri());
            c.retry.pass_ceiling = Duration::from_secs(1);
            c.retry.attempt_timeout = attempt_timeout;
        })
        .await;
        let started = Instant::now();
        let closed = append_and_close(&server, "s").await.expect_err("no answer");
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(3),
            "{elapsed:?} (ceiling 1 s)"
        );
        let failure = failure_of(&closed);
        assert!(
            matches!(
                failure.kind,
                Some(pb::failure::Kind::Timeout(_)) | Some(pb::failure::Kind::BudgetExhausted(_))
            ),
            "{:?}",
            failure.kind
        );
        assert!(script.calls() <= 3);
    }
}

#[tokio::test]
async fn concurrent_passes_do_not_retry_in_lockstep() {
    let script = Script::new(vec![ResponseTemplate::new(503)]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.retry.initial_backoff = Duration::from_millis(200);
        c.retry.max_backoff = Duration::from_millis(400);
        c.retry.max_attempts = 2;
    })
    .await;
    let sessions: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    let mut calls = Vec::new();
    for s in &sessions {
        let server_client = server.client.clone();
        server
            .append(s, &[&format!("session {s} talked about its own topic")])
            .await;
        let s = s.clone();
        calls.push(tokio::spawn(async move {
            server_client
                .clone()
                .close_segment(pb::CloseSegmentRequest {
                    session_id: s,
                    wait: true,
                })
                .await
        }));
    }
    for c in calls {
        let seg = c
            .await
            .expect("joined")
            .expect("the close is OK")
            .into_inner()
            .segment
            .expect("a segment");
        assert_eq!(class_of(failure_of(&seg)), Some(FailureClass::Unavailable));
    }
    // The gap between each segment's two sends is its jittered wait.
    let requests = script.requests();
    assert_eq!(requests.len(), 16);
    let mut gaps = Vec::new();
    for s in &sessions {
        let needle = format!("session {s} talked");
        let times: Vec<Instant> = requests
            .iter()
            .filter(|(_, r)| String::from_utf8_lossy(&r.body).contains(&needle))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(times.len(), 2, "{s}");
        gaps.push(times[1] - times[0]);
    }
    let min = gaps.iter().min().copied().unwrap_or_default();
    let max = gaps.iter().max().copied().unwrap_or_default();
    // With jitter 0.5 on 200 ms the waits spread over 100..300 ms; eight in
    // lockstep would sit within a few milliseconds of each other.
    assert!(max - min > Duration::from_millis(20), "gaps {gaps:?}");
    assert!(min >= Duration::from_millis(100), "gaps {gaps:?}");
}

#[tokio::test]
async fn the_exhaustion_warning_names_the_segment_and_the_attempts() {
    let script = Script::new(vec![ResponseTemplate::new(503)]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    // Log lines carry the segment id and its session, named uniquely here.
    let session = "exhaustion-warning-session";
    let closed = append_and_close(&server, session)
        .await
        .expect_err("always 503");
    let seg = only_segment(&server, session).await;
    assert_eq!(
        class_of(failure_of(&closed)),
        Some(FailureClass::Unavailable)
    );
    let needle = format!("segment_id={}", seg.id);
    let lines = crate::logs::lines();
    let gave_up: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("recap pass gave up") && l.contains(&needle) && l.contains(session))
        .filter(|l| l.contains("attempts=3") && l.contains("unavailable"))
        .collect();
    assert!(!gave_up.is_empty(), "no exhaustion warning for {needle}");
    let retries = lines
        .iter()
        .filter(|l| l.contains("retrying") && l.contains(session) && l.contains("WARN"))
        .count();
    assert_eq!(retries, 2, "a WARN per retry");
}

#[tokio::test]
async fn no_entry_point_sends_more_than_max_attempts_in_one_pass() {
    let script = Script::new(vec![
        ResponseTemplate::new(503).set_delay(Duration::from_millis(100)),
    ]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    server.append("s", &["one thing", "another thing"]).await;
    let mut client = server.client.clone();
    // The host retries its calls while the pass runs: close with wait twice
    // and a flush, all at once.
    let close = {
        let mut c = client.clone();
        tokio::spawn(async move {
            c.close_segment(pb::CloseSegmentRequest {
                session_id: "s".into(),
                wait: true,
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let flush = {
        let mut c = client.clone();
        tokio::spawn(async move {
            c.flush_session(pb::FlushSessionRequest {
                session_id: "s".into(),
            })
            .await
        })
    };
    let _ = client
        .close_segment(pb::CloseSegmentRequest {
            session_id: "s".into(),
            wait: true,
        })
        .await;
    let _ = close.await.expect("joined");
    let flushed = flush.await.expect("joined").expect("flush answers");
    assert!(!flushed.into_inner().complete);
    assert_eq!(script.calls(), 3, "one pass, max_attempts sends");
    let seg = only_segment(&server, "s").await;
    assert_eq!((seg.attempts, seg.passes), (3, 1));
}

#[tokio::test]
async fn an_oversized_segment_is_summarised_in_chunks_that_fit_the_budget() {
    let script = Script::new(vec![completion("A partial recap.")]);
    let mock = script.mount().await;
    let max_input_tokens = 300;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.provider.max_input_tokens = max_input_tokens;
        c.provider.max_output_tokens = 64;
    })
    .await;
    let texts: Vec<String> = (0..40)
        .map(|i| format!("Message {i} carries some detail about step {i} of the migration plan."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    // One entry larger than the whole budget too.
    let huge = "word ".repeat(1000);
    server.append("s", &[&huge]).await;
    let seg = server
        .close("s", true)
        .await
        .expect("summarised")
        .segment
        .expect("segment");
    assert_eq!(state(&seg), pb::SegmentState::Summarised);
    let requests = script.requests();
    assert!(requests.len() > 3, "{} requests", requests.len());
    assert_eq!(seg.attempts as usize, requests.len());
    for (_, r) in &requests {
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json body");
        let tokens: u32 = body["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| estimate_tokens(m["content"].as_str().unwrap_or_default()))
            .sum();
        assert!(
            tokens <= max_input_tokens,
            "a request of {tokens} estimated tokens"
        );
        assert_eq!(body["max_tokens"], 64);
    }
    // The last request folds the parts' recaps.
    let last: serde_json::Value =
        serde_json::from_slice(&requests[requests.len() - 1].1.body).expect("json");
    assert!(
        last["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("Part 2:")
    );
    let summary = seg.summary.expect("summary");
    assert_eq!(summary.output_tokens as usize, 7 * requests.len());
}

#[tokio::test]
async fn the_request_is_a_chat_completion_with_the_key_when_one_is_set() {
    let script = Script::new(vec![completion("ok")]);
    let mock = script.mount().await;
    let server =
        TestServer::start_with_key("sk-test-KEY-0123456789", |c| fast(c, &mock.uri())).await;
    append_and_close(&server, "s").await.expect("summarised");
    let (_, request) = script.requests().into_iter().next().expect("a request");
    assert_eq!(
        request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer sk-test-KEY-0123456789")
    );
    let body: serde_json::Value = serde_json::from_slice(&request.body).expect("json");
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["messages"][0]["role"], "system");
    assert!(
        body["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("The billing deploy failed")
    );

    // No key set: no Authorization header at all (local servers need none).
    let script = Script::new(vec![completion("ok")]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    append_and_close(&server, "s").await.expect("summarised");
    let (_, request) = script.requests().into_iter().next().expect("a request");
    assert!(request.headers.get("authorization").is_none());
}

#[tokio::test]
async fn appends_and_plain_closes_never_wait_on_the_provider() {
    let script = Script::new(vec![
        completion("slow recap").set_delay(Duration::from_secs(2)),
    ]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 2;
        c.reconciler.interval = Duration::from_millis(100);
    })
    .await;
    let resp = server.append("s", &["first", "second"]).await;
    let closed = resp.closed_segment_ids[0];
    // The append came back while the recap is still at the provider.
    let seg = server.segment(closed).await;
    assert_eq!(state(&seg), pb::SegmentState::Pending);
    let done = eventually(Duration::from_secs(10), || async {
        let seg = server.segment(closed).await;
        state(&seg) == pb::SegmentState::Summarised
    })
    .await;
    assert!(done);
    assert_eq!(script.calls(), 1);
}

/// A provider on raw TCP that drops the first `fail` connections without a
/// word, then answers every request with a completion.
pub struct FlakyTcp {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl FlakyTcp {
    pub async fn start(fail: usize) -> FlakyTcp {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let n = counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    // Read the request head and body before answering.
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(read) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..read]);
                        if let Some(head_end) = find(&buf, b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= head_end + 4 + length {
                                break;
                            }
                        }
                    }
                    if n < fail {
                        return; // dropped: the client sees the connection closed
                    }
                    let body = serde_json::json!({
                        "choices": [{"message": {"role": "assistant", "content": "Recovered recap."}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3}
                    })
                    .to_string();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        FlakyTcp { addr, connections }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

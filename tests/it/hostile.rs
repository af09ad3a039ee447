//! A hostile provider, tenant or stranger cannot exhaust memory, call
//! slots or descriptors, nor plant a bad summary. Memory is read from
//! /proc for the real binary (its VmHWM, the peak resident set, is the
//! server's alone); everything else runs in process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use archivist::failure::FailureClass;
use archivist::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic_types::StatusExt;

use crate::binary::Process;
use crate::harness::{TestServer, eventually, reason, state};
use crate::provider::{
    Script, append_and_close, class_of, completion, error_json, failure_of, fast,
};

const KEY: &str = "sk-hostile-test-4b7e19c2d8";

/// What the raw provider answers every request with.
#[derive(Clone, Copy)]
enum Answer {
    /// HTTP 200 and a chunked body that never ends.
    Endless,
    /// HTTP 200 and a valid chat completion whose text is this many bytes,
    /// chunked, with no content-length to refuse it by.
    Completion(usize),
}

/// A provider over raw TCP, for bodies wiremock cannot send: endless or
/// huge, streamed in 64 KiB chunks. Counts the requests it answered.
struct Streamer {
    addr: std::net::SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Streamer {
    async fn start(answer: Answer) -> Streamer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    if read_request(&mut socket).await.is_none() {
                        return;
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let filler = vec![b'a'; 64 * 1024];
                    let (open, mut left, close) = match answer {
                        Answer::Endless => (
                            r#"{"choices":[{"message":{"content":""#.to_owned(),
                            usize::MAX,
                            String::new(),
                        ),
                        Answer::Completion(n) => (
                            r#"{"choices":[{"message":{"role":"assistant","content":""#.to_owned(),
                            n,
                            r#""}}],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#.to_owned(),
                        ),
                    };
                    // Stops when the client stops reading and hangs up.
                    if write_chunk(&mut socket, open.as_bytes()).await.is_err() {
                        return;
                    }
                    while left > 0 {
                        let n = left.min(filler.len());
                        if write_chunk(&mut socket, &filler[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    let _ = write_chunk(&mut socket, close.as_bytes()).await;
                    let _ = socket.write_all(b"0\r\n\r\n").await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Streamer { addr, requests }
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn write_chunk(socket: &mut tokio::net::TcpStream, data: &[u8]) -> std::io::Result<()> {
    socket
        .write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    socket.write_all(data).await?;
    socket.write_all(b"\r\n").await
}

/// Reads one HTTP/1.1 request (head and content-length body).
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..read]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Some(());
            }
        }
    }
}

/// The class of a segment's last failure.
fn last_class(seg: &pb::Segment) -> Option<&'static str> {
    use pb::failure::Kind;
    match seg.last_failure.as_ref()?.kind.as_ref()? {
        Kind::MalformedResponse(_) => Some("malformed_response"),
        Kind::RateLimited(_) => Some("rate_limited"),
        Kind::Transport(_) => Some("transport"),
        Kind::Timeout(_) => Some("timeout"),
        _ => Some("other"),
    }
}

/// Appends to a session and closes it without waiting; returns the
/// segment's id.
async fn append_and_close_later(client: &mut archivist::client::Client, session: &str) -> u64 {
    client
        .append_entries(crate::harness::append_request(
            session,
            &["The deploy failed.", "We retry on Friday."],
        ))
        .await
        .expect("append");
    client
        .close_segment(pb::CloseSegmentRequest {
            session_id: session.to_owned(),
            wait: false,
        })
        .await
        .expect("close")
        .into_inner()
        .segment
        .expect("a segment was open")
        .id
}

/// Resident memory the server may reach while a hostile peer does its
/// worst; an idle server sits near 20 MiB.
const RSS_BOUND_KIB: u64 = 96 * 1024;

// ---- 1 and 2: provider bodies ----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_and_huge_provider_bodies_are_cut_at_the_cap_and_nothing_is_stored() {
    for answer in [Answer::Endless, Answer::Completion(100 * 1024 * 1024)] {
        let streamer = Streamer::start(answer).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = [
            ("ARCHIVIST_RETRY_INITIAL_BACKOFF", "10ms"),
            ("ARCHIVIST_RETRY_MAX_BACKOFF", "20ms"),
            ("ARCHIVIST_RECONCILER_INTERVAL", "1h"),
        ];
        let server = Process::start_openai(dir.path(), &streamer.base(), &settings).await;
        let mut client = server.client().await;
        let id = append_and_close_later(&mut client, "s").await;
        // One pass: three sends, each cut at 1 MiB and refused.
        let failed = eventually(Duration::from_secs(8), || {
            let mut client = client.clone();
            async move {
                let seg = client
                    .get_segment(pb::GetSegmentRequest { segment_id: id })
                    .await
                    .expect("get")
                    .into_inner();
                seg.last_failure.is_some()
            }
        })
        .await;
        assert!(failed, "the pass ended");
        assert_eq!(streamer.requests(), 3);
        let peak = server.peak_rss_kib();
        assert!(
            peak < RSS_BOUND_KIB,
            "peak RSS {peak} KiB while the provider streamed"
        );
        eprintln!("provider body cut at the cap: peak RSS {peak} KiB");
        let seg = client
            .get_segment(pb::GetSegmentRequest { segment_id: id })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(state(&seg), pb::SegmentState::Pending);
        assert!(seg.summary.is_none());
        assert_eq!(last_class(&seg), Some("malformed_response"));
        let causes = seg.last_failure.expect("failure").causes.join(" / ");
        assert!(causes.contains("max_response_bytes"), "{causes}");
        // The session stays readable for any default client.
        client
            .get_context(pb::GetContextRequest {
                session_id: "s".into(),
                max_tokens: 0,
                query: String::new(),
                min_similarity: None,
            })
            .await
            .expect("context");
        client
            .flush_session(pb::FlushSessionRequest {
                session_id: "s".into(),
            })
            .await
            .expect("flush");
        crate::harness::list_segments(&mut client, "s").await;
    }
}

#[tokio::test]
async fn a_completion_longer_than_max_output_tokens_allows_is_malformed() {
    // Under the body cap, but far over 64 tokens' worth of text.
    let long = "word ".repeat(20_000);
    let script = Script::new(vec![completion(&long)]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.provider.max_output_tokens = 64;
    })
    .await;
    let closed = append_and_close(&server, "s").await.expect_err("refused");
    let failure = failure_of(&closed);
    assert_eq!(class_of(failure), Some(FailureClass::MalformedResponse));
    assert!(
        failure.causes.join(" ").contains("max_output_tokens"),
        "{:?}",
        failure.causes
    );
    let seg = server.segments("s").await.remove(0);
    assert_eq!(state(&seg), pb::SegmentState::Pending);
    assert!(seg.summary.is_none());
    assert_eq!(script.calls(), 3);
}

// ---- 7: Retry-After as an HTTP date ----------------------------------------

#[tokio::test]
async fn a_retry_after_date_in_2099_schedules_within_the_cap() {
    let answer = error_json(429, "rate_limit_exceeded", "slow down")
        .insert_header("retry-after", "Thu, 01 Jan 2099 00:00:00 GMT");
    let script = Script::new(vec![answer]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    let closed = append_and_close(&server, "s").await.expect_err("limited");
    assert_eq!(
        class_of(failure_of(&closed)),
        Some(FailureClass::RateLimited)
    );
    let seg = server.segments("s").await.remove(0);
    assert_eq!(state(&seg), pb::SegmentState::Pending);
    let due = seg.next_attempt_at.expect("scheduled");
    let due = SystemTime::UNIX_EPOCH + Duration::from_secs(due.seconds as u64);
    let cap = SystemTime::now() + Duration::from_secs(30 * 24 * 3600);
    assert!(due <= cap, "due {due:?}, after the 30-day cap");
    assert!(due > SystemTime::now() + Duration::from_secs(29 * 24 * 3600));
}

// ---- 8: a provider that echoes the key -------------------------------------

#[tokio::test]
async fn an_echoed_key_is_in_no_summary() {
    let echo = format!(
        "Recap: the user asked about billing. (debug: Authorization: Bearer {KEY}; key {KEY})"
    );
    let script = Script::new(vec![completion(&echo)]);
    let mock = script.mount().await;
    let server = TestServer::start_with_key(KEY, |c| fast(c, &mock.uri())).await;
    let seg = append_and_close(&server, "s").await.expect("summarised");
    let text = seg.summary.expect("summary").text;
    assert!(!text.contains(KEY), "{text}");
    assert!(text.contains("[REDACTED]"), "{text}");
    assert!(text.contains("asked about billing"), "{text}");
    let ctx = format!("{:?}", server.context("s", 0).await);
    assert!(!ctx.contains(KEY), "{ctx}");
    let listed = format!("{:?}", server.segments("s").await);
    assert!(!listed.contains(KEY));
    let dir = server.stop().await;
    for file in std::fs::read_dir(dir.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        let bytes = std::fs::read(file.path()).unwrap_or_default();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "the key is in {}",
            file.path().display()
        );
    }
}

// ---- raw HTTP/2, for requests no well-behaved client sends ----------------

/// A bare HTTP/2 connection to `addr`.
async fn h2_connect(addr: std::net::SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

fn grpc_request(addr: std::net::SocketAddr, method: &str) -> http::Request<()> {
    http::Request::post(format!("http://{addr}/archivist.v1.Archivist/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// One gRPC frame: no compression, the length, the message.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Sends `body` whole to `method` and reads the call's status.
async fn raw_unary(addr: std::net::SocketAddr, method: &str, body: Vec<u8>) -> tonic::Status {
    let mut client = h2_connect(addr).await.ready().await.expect("ready");
    let (response, mut send) = client
        .send_request(grpc_request(addr, method), false)
        .expect("send");
    send.send_data(bytes::Bytes::from(body), true)
        .expect("data");
    let response = response.await.expect("response");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.expect("data");
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.expect("trailers").expect("trailers");
    tonic::Status::from_header_map(&trailers).expect("a status")
}

// ---- 9: undecodable requests -----------------------------------------------

#[tokio::test]
async fn undecodable_requests_are_invalid_argument_with_details() {
    let server = TestServer::start().await;
    // AppendEntriesRequest { session_id: "s", entries: [{ role: USER,
    // content: <not UTF-8> }] }
    let not_utf8 = [
        0x0a, 0x01, b's', 0x12, 0x06, 0x10, 0x01, 0x1a, 0x02, 0xff, 0xfe,
    ];
    // A session_id said to be 5 bytes long, of which 1 came.
    let cut_short = [0x0a, 0x05, b's'];
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a string that is not UTF-8",
            frame(&not_utf8),
            "entries.content",
        ),
        ("a message cut short", frame(&cut_short), ""),
        ("a frame cut short", frame(&not_utf8)[..8].to_vec(), ""),
    ];
    for (name, body, field) in cases {
        let status = raw_unary(server.addr, "AppendEntries", body).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert_eq!(reason(&status), "MALFORMED_REQUEST", "{name}");
        let details = status.get_error_details();
        let violations = details
            .bad_request()
            .expect("BadRequest")
            .field_violations
            .clone();
        assert_eq!(violations.len(), 1, "{name}");
        if !field.is_empty() {
            assert_eq!(violations[0].field, field, "{name}");
        }
    }
    // Nothing was stored, and the server still serves.
    assert!(server.segments("s").await.is_empty());
    server.append("s", &["still serving"]).await;
}

// ---- 3: repeated fields ----------------------------------------------------

#[tokio::test]
async fn repeated_states_are_deduplicated_and_checked() {
    let server = TestServer::start().await;
    server.append("s", &["one open segment"]).await;
    let mut client = server.client.clone();
    let many = |states: Vec<i32>| pb::ListSegmentsRequest {
        session_id: "s".into(),
        states,
        page_size: 0,
        page_token: String::new(),
        levels: Vec::new(),
    };
    let page = client
        .list_segments(many(vec![pb::SegmentState::Open as i32; 1_000_000]))
        .await
        .expect("a million repeats of one state")
        .into_inner();
    assert_eq!(page.segments.len(), 1);
    let status = client
        .list_segments(many(vec![42; 1_000_000]))
        .await
        .expect_err("unknown states");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "UNKNOWN_STATE");
    let listed = status
        .get_error_details()
        .bad_request()
        .map_or(0, |b| b.field_violations.len());
    assert!(listed <= 20, "{listed} violations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_megabyte_repeated_field_requests_leave_memory_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Process::start(dir.path(), &[("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1")]).await;
    let mut client = server.client().await;
    client
        .append_entries(crate::harness::append_request("s", &["one", "two"]))
        .await
        .expect("append");
    let states = [1, 2, 3, 4];
    for call in 0..20 {
        // Every call a different list of about a million values (1 MB).
        let list: Vec<i32> = (0..1_000_000)
            .map(|i| states[(i * (call + 1) / 7) % 4])
            .collect();
        let page = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: "s".into(),
                states: list,
                page_size: 0,
                page_token: String::new(),
                levels: Vec::new(),
            })
            .await
            .expect("list")
            .into_inner();
        assert_eq!(page.segments.len(), 2);
    }
    let peak = server.peak_rss_kib();
    eprintln!("20 ListSegments calls of 1 MB: peak RSS {peak} KiB");
    assert!(peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
}

#[tokio::test]
async fn search_filters_are_bounded_and_deduplicated() {
    let server = TestServer::start().await;
    server.append("s", &["the heron nests by the weir"]).await;
    let mut client = server.client.clone();
    let search = |roles: Vec<i32>, levels: Vec<u32>| pb::SearchRequest {
        query: "heron".into(),
        roles,
        levels,
        ..Default::default()
    };
    // Repeats within the caps are one filter each.
    let user = pb::Role::User as i32;
    let hits = client
        .search(search(vec![user; 16], [0; 65].to_vec()))
        .await
        .expect("repeats within the caps")
        .into_inner()
        .hits;
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].text, "the heron nests by the weir");
    // Past them, the field is named and nothing else is looked at.
    for (req, field, why) in [
        (
            search(vec![user; 17], Vec::new()),
            "roles",
            "TOO_MANY_ROLES",
        ),
        (search(Vec::new(), vec![0; 66]), "levels", "TOO_MANY_LEVELS"),
    ] {
        let status = client.search(req).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(reason(&status), why, "{field}");
        let violations = status
            .get_error_details()
            .bad_request()
            .map(|b| b.field_violations.clone())
            .unwrap_or_default();
        assert_eq!(violations.len(), 1, "{field}: {violations:?}");
        assert_eq!(violations[0].field, field);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_megabyte_search_filters_leave_memory_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Process::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client
        .append_entries(crate::harness::append_request("s", &["the heron nests"]))
        .await
        .expect("append");
    // The attack: valid values, millions of times, six calls at once (each
    // cost a quarter of a GiB before the filters were bounded).
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut client = client.clone();
            let mut req = pb::SearchRequest {
                query: "heron".into(),
                ..Default::default()
            };
            if i % 2 == 0 {
                req.levels = vec![1; 4_000_000];
                req.levels.push(0);
            } else {
                req.roles = vec![pb::Role::User as i32; 4_000_000];
            }
            tokio::spawn(async move { client.search(req).await })
        })
        .collect();
    for call in calls {
        let status = call.await.expect("task").expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    let peak = server.peak_rss_kib();
    eprintln!("six 4 MB Search filters at once: peak RSS {peak} KiB");
    // Decoding six such requests costs about 25 MiB each; what follows
    // decoding must add nothing of the sort.
    assert!(peak < 3 * RSS_BOUND_KIB, "peak RSS {peak} KiB");
}

// ---- 4: answers bounded by the server ---------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_context_on_a_long_session_reads_only_what_the_cap_allows() {
    let dir = tempfile::tempdir().expect("temp dir");
    // One open segment holding everything, so every entry stays raw.
    let big = [
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "1000000000"),
    ];
    let server = Process::start(dir.path(), &big).await;
    let mut client = server.client().await;
    // 41 MiB of session: 660 entries of 64 KiB.
    let content = "x".repeat(64 * 1024);
    for _ in 0..11 {
        let texts: Vec<&str> = vec![content.as_str(); 60];
        client
            .append_entries(crate::harness::append_request("long", &texts))
            .await
            .expect("append");
    }
    let before = server.peak_rss_kib();
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .get_context(pb::GetContextRequest {
                        session_id: "long".into(),
                        // No limit asked for, or one past the cap.
                        max_tokens: if i % 2 == 0 { 0 } else { u32::MAX },
                        query: String::new(),
                        min_similarity: None,
                    })
                    .await
                    .expect("context")
                    .into_inner()
            })
        })
        .collect();
    for call in calls {
        let ctx = call.await.expect("joined");
        assert!(ctx.truncated);
        assert!(ctx.estimated_tokens <= 100_000, "{}", ctx.estimated_tokens);
        assert!(!ctx.items.is_empty());
        let last = crate::harness::context_entries(&ctx).last().map(|e| e.0);
        assert_eq!(last, Some(660), "the newest entry is there");
    }
    let peak = server.peak_rss_kib();
    eprintln!(
        "8 GetContext(max_tokens=0) on a 41 MiB session: peak RSS {peak} KiB ({before} KiB before)"
    );
    assert!(peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
}

#[tokio::test]
async fn every_answer_fits_the_message_limit() {
    use prost::Message;
    let limit = 8 * 1024;
    let server = TestServer::start_with(|c| {
        c.limits.max_message_bytes = limit as u32;
        c.segment.max_entries = 1;
        c.provider.max_output_tokens = 200;
        // Level-1 segments only: this test counts them.
        c.memory.fanout = 0;
    })
    .await;
    let texts: Vec<String> = (0..60)
        .map(|i| format!("Entry {i} says something worth remembering about step {i}."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    let mut client = server.client.clone();
    let all_summarised = eventually(Duration::from_secs(10), || async {
        server.backlog().await.summarised == 60
    })
    .await;
    assert!(all_summarised);
    // Pages end where the limit is, and their tokens lead through them all.
    let mut token = String::new();
    let mut seen = 0;
    loop {
        let page = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: "s".into(),
                states: Vec::new(),
                page_size: 1000,
                page_token: token,
                levels: Vec::new(),
            })
            .await
            .expect("list")
            .into_inner();
        assert!(page.encoded_len() <= limit, "{}", page.encoded_len());
        seen += page.segments.len();
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, 60);
    server.append("s", &["one more, owed a recap"]).await;
    let flushed = client
        .flush_session(pb::FlushSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("flush")
        .into_inner();
    assert!(flushed.encoded_len() <= limit);
    assert!(flushed.segments.len() < 61);
    assert_eq!(flushed.segments.last().map(|s| s.ordinal), Some(61));
    let ctx = server.context("s", 0).await;
    assert!(ctx.encoded_len() <= limit);
    assert!(ctx.truncated);
}

// ---- 5: request bodies that never complete -----------------------------------

/// Opens `n` calls to AppendEntries on `connections` connections, each
/// sending its headers and 10 bytes of a message it never finishes; returns
/// the answers to come.
async fn stalled_calls(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    connections: usize,
    n: usize,
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)> {
    let mut calls = Vec::new();
    for c in 0..connections {
        let mut client = h2_connect(addr).await;
        for _ in 0..n / connections + usize::from(c < n % connections) {
            client = client.ready().await.expect("ready");
            let mut request = grpc_request(addr, "AppendEntries");
            if let Some(token) = token {
                request.headers_mut().insert(
                    "authorization",
                    format!("Bearer {token}").parse().expect("header"),
                );
            }
            let (response, mut send) = client.send_request(request, false).expect("send");
            // A frame header promising 1000 bytes, and 5 of them.
            let mut partial = vec![0u8];
            partial.extend_from_slice(&1000u32.to_be_bytes());
            partial.extend_from_slice(b"\x0a\x01s\x12\x10");
            // The server may have answered the stream already (refused it at
            // once, under load): then its answer is what the caller reads.
            let _ = send.send_data(bytes::Bytes::from(partial), false);
            calls.push((response, send));
        }
    }
    calls
}

/// The gRPC status a raw call was answered with.
async fn answered(response: h2::client::ResponseFuture) -> tonic::Status {
    let response = response.await.expect("response");
    tonic::Status::from_header_map(response.headers()).expect("a trailers-only answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_no_slot_and_are_cut_off() {
    use archivist::config::{TenantConfig, token_sha256};
    let timeout = Duration::from_secs(2);
    let server = TestServer::start_with(|c| {
        c.limits.request_timeout = timeout;
        c.auth.tenants = ["attacker", "victim"]
            .into_iter()
            .map(|name| TenantConfig {
                name: name.into(),
                token_sha256: Some(token_sha256(&format!("token-of-{name}"))),
                token_env: None,
            })
            .collect();
    })
    .await;
    // More stalled calls than the server has call slots (256).
    let started = std::time::Instant::now();
    let stalled = stalled_calls(server.addr, Some("token-of-attacker"), 2, 300).await;
    let mut victim = archivist::client::connect_with(&archivist::client::ClientOptions {
        address: format!("http://{}", server.addr),
        token: Some("token-of-victim".into()),
        ..Default::default()
    })
    .await
    .expect("connect");
    let appended = tokio::time::timeout(
        timeout / 2,
        victim.append_entries(crate::harness::append_request("v", &["still served"])),
    )
    .await
    .expect("served before any stalled body timed out")
    .expect("append");
    assert_eq!(appended.into_inner().entries.len(), 1);
    assert!(
        started.elapsed() < timeout,
        "served while all 300 still stalled"
    );
    // Every stalled call is cut off at the request timeout.
    let mut latest = Duration::ZERO;
    for (response, _send) in stalled {
        let status = answered(response).await;
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert_eq!(reason(&status), "REQUEST_TIMEOUT");
        latest = latest.max(started.elapsed());
    }
    eprintln!("300 stalled bodies refused by {latest:?} with a {timeout:?} request timeout");
    assert!(latest < timeout * 4, "{latest:?}");
    // A stranger's stalled calls are refused at once, before any byte of
    // their bodies is read.
    let strangers = stalled_calls(server.addr, None, 1, 50).await;
    let at_once = std::time::Instant::now();
    for (response, _send) in strangers {
        let status = answered(response).await;
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    assert!(at_once.elapsed() < timeout, "{:?}", at_once.elapsed());
}

#[tokio::test]
async fn bodies_still_arriving_share_one_byte_budget() {
    let server = TestServer::start_with(|c| {
        c.limits.max_message_bytes = 2048;
        c.limits.max_receiving_bytes = 4200;
        c.limits.request_timeout = Duration::from_secs(1);
    })
    .await;
    let mut client = h2_connect(server.addr).await;
    let mut open = Vec::new();
    // Two calls hold 2000 bytes each of a 2048-byte message, and stall.
    for _ in 0..2 {
        client = client.ready().await.expect("ready");
        let (response, mut send) = client
            .send_request(grpc_request(server.addr, "AppendEntries"), false)
            .expect("send");
        let mut partial = vec![0u8];
        partial.extend_from_slice(&2048u32.to_be_bytes());
        partial.extend_from_slice(&[0u8; 1995]);
        send.send_data(bytes::Bytes::from(partial), false)
            .expect("data");
        open.push((response, send));
    }
    // Once the server holds what they sent, a larger body finds no room
    // (its 400 bytes would not decode anyway: nothing can be stored).
    let refused = eventually(Duration::from_millis(800), || async {
        let status = raw_unary(server.addr, "AppendEntries", frame(&[b'x'; 400])).await;
        status.code() == Code::ResourceExhausted && reason(&status) == "OVERLOADED"
    })
    .await;
    assert!(refused, "refused while the budget is held");
    let status = raw_unary(server.addr, "AppendEntries", frame(&[b'x'; 400])).await;
    assert!(status.get_error_details().retry_info().is_some());
    // An empty GetBacklog fits in what is left.
    let status = raw_unary(server.addr, "GetBacklog", frame(&[])).await;
    assert_eq!(status.code(), Code::Ok, "{status:?}");
    for (response, _send) in open {
        assert_eq!(answered(response).await.code(), Code::DeadlineExceeded);
    }
    server.append("s", &["the budget is free again"]).await;
}

// ---- 6: idle connections ----------------------------------------------------

/// Opens `n` HTTP/2 connections (TCP and the preface; no call, no token)
/// and counts those the server closes.
async fn idle_connections(addr: std::net::SocketAddr, n: usize) -> Arc<AtomicUsize> {
    let closed = Arc::new(AtomicUsize::new(0));
    for _ in 0..n {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let closed = closed.clone();
        tokio::spawn(async move {
            // The handshake may already fail on a connection closed at once.
            let handshake: Result<(h2::client::SendRequest<bytes::Bytes>, _), _> =
                h2::client::handshake(tcp).await;
            if let Ok((client, connection)) = handshake {
                let _ = connection.await;
                drop(client);
            }
            closed.fetch_add(1, Ordering::SeqCst);
        });
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_cap_make_room_for_a_new_client() {
    let cap = 20;
    let server = TestServer::start_with(|c| c.limits.max_connections = cap).await;
    // 60 idle connections come; no more than the cap stay open.
    let started = std::time::Instant::now();
    let closed = idle_connections(server.addr, 60).await;
    let made_room = eventually(Duration::from_secs(5), || async {
        closed.load(Ordering::SeqCst) >= 60 - cap as usize
    })
    .await;
    assert!(made_room, "{} closed", closed.load(Ordering::SeqCst));
    eprintln!(
        "60 idle connections against a cap of {cap}: {} closed within {:?}",
        closed.load(Ordering::SeqCst),
        started.elapsed()
    );
    // A new client is served.
    let mut fresh = archivist::client::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    fresh
        .append_entries(crate::harness::append_request("s", &["served"]))
        .await
        .expect("a new client is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_idle_past_the_timeout_is_closed_but_not_one_with_a_call() {
    let slow = Script::new(vec![
        completion("Slow recap.").set_delay(Duration::from_secs(1)),
    ]);
    let mock = slow.mount().await;
    let idle = Duration::from_millis(300);
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.limits.idle_timeout = idle;
    })
    .await;
    let closed = idle_connections(server.addr, 5).await;
    let all_closed = eventually(Duration::from_secs(3), || async {
        closed.load(Ordering::SeqCst) == 5
    })
    .await;
    assert!(
        all_closed,
        "{} of 5 idle connections closed",
        closed.load(Ordering::SeqCst)
    );
    // A call longer than the idle timeout keeps its connection.
    let mut client = archivist::client::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    client
        .append_entries(crate::harness::append_request("s", &["a slow recap"]))
        .await
        .expect("append");
    let seg = client
        .close_segment(pb::CloseSegmentRequest {
            session_id: "s".into(),
            wait: true,
        })
        .await
        .expect("the call outlives the idle timeout")
        .into_inner()
        .segment
        .expect("segment");
    assert_eq!(state(&seg), pb::SegmentState::Summarised);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_cap_is_refused_when_none_is_idle() {
    let server = TestServer::start_with(|c| {
        c.limits.max_connections = 2;
        c.limits.request_timeout = Duration::from_secs(3);
    })
    .await;
    // Two connections each with a call running (a body that never ends).
    // The harness's client, idle, makes room for the second.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut client = h2_connect(server.addr).await.ready().await.expect("ready");
        let (response, mut send) = client
            .send_request(grpc_request(server.addr, "AppendEntries"), false)
            .expect("send");
        send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 9]), false)
            .expect("data");
        // A whole call answered after it on the same connection says the
        // server has the stalled one running.
        let mut client = client.ready().await.expect("ready");
        let (answer, mut body) = client
            .send_request(grpc_request(server.addr, "GetBacklog"), false)
            .expect("send");
        body.send_data(bytes::Bytes::from(frame(&[])), true)
            .expect("data");
        answer.await.expect("answered");
        busy.push((client, response, send));
    }
    let refused = idle_connections(server.addr, 3).await;
    let started = std::time::Instant::now();
    let all = eventually(Duration::from_secs(2), || async {
        refused.load(Ordering::SeqCst) == 3
    })
    .await;
    assert!(all, "{} of 3 refused", refused.load(Ordering::SeqCst));
    eprintln!(
        "a connection past the cap is closed within {:?}",
        started.elapsed()
    );
    let logged = crate::logs::lines()
        .iter()
        .filter(|l| l.contains("refused a connection"))
        .count();
    assert!((1..=3).contains(&logged), "{logged} lines for 3 refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_server_backs_off_and_still_serves() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("temp dir");
    // A descriptor limit far under the connection cap: accepts fail with
    // EMFILE long before the cap would refuse anyone.
    let settings = [
        ("ARCHIVIST_LIMITS_MAX_CONNECTIONS", "10000"),
        ("ARCHIVIST_LIMITS_IDLE_TIMEOUT", "1h"),
    ];
    let server = Process::start_adjusted(dir.path(), &settings, |command| {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs here.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 64,
                    rlim_max: 64,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    })
    .await;
    let mut client = server.client().await;
    client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("served before the flood");
    // 200 bare TCP connections that never say a word, held open.
    let addr: std::net::SocketAddr = server
        .address
        .trim_start_matches("http://")
        .parse()
        .expect("addr");
    let cpu_before = server.cpu_time();
    let started = std::time::Instant::now();
    let mut held = Vec::new();
    for _ in 0..200 {
        if let Ok(tcp) = tokio::net::TcpStream::connect(addr).await {
            held.push(tcp);
        }
    }
    // A window to measure CPU over while the connections wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu = server.cpu_time().saturating_sub(cpu_before);
    let wall = started.elapsed();
    eprintln!("200 silent connections under nofile=64: {cpu:?} of CPU in {wall:?}");
    // A spinning accept loop burns most of a core; backing off, almost none.
    assert!(cpu < wall / 4, "{cpu:?} of CPU in {wall:?}");
    // A new client is served: idle connections make room.
    let served = eventually(Duration::from_secs(5), || async {
        match archivist::client::connect(&server.address).await {
            Ok(mut c) => c
                .append_entries(crate::harness::append_request("s", &["served"]))
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(served, "a new client is served");
    let lines = server.log.lock().expect("lock").clone();
    let backoffs = lines
        .iter()
        .filter(|l| l.contains("cannot accept connections"))
        .count();
    assert!(
        (1..=2).contains(&backoffs),
        "{backoffs} log lines about accept errors: {lines:?}"
    );
    drop(held);
}

// ---- health follows the store -----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_while_the_store_cannot_write_and_serving_after() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let server = TestServer::start_with(|c| {
        c.health.probe_interval = Duration::from_millis(100);
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let health = HealthClient::new(channel);
    let status_of = |service: &'static str| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health answers")
                .into_inner()
                .status
        }
    };
    let all_are = |want: ServingStatus| async move {
        status_of("").await == want as i32
            && status_of("archivist.v1.Archivist").await == want as i32
    };
    assert!(all_are(ServingStatus::Serving).await);
    // Another process takes the database's write lock and keeps it: the
    // store cannot write.
    let db = rusqlite::Connection::open(server.data_dir().join("archivist.sqlite3"))
        .expect("open the database");
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    db.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let locked = std::time::Instant::now();
    let down = eventually(Duration::from_secs(5), || {
        all_are(ServingStatus::NotServing)
    })
    .await;
    assert!(down, "NOT_SERVING while the store cannot write");
    eprintln!(
        "health NOT_SERVING {:?} after the store stopped writing",
        locked.elapsed()
    );
    db.execute_batch("ROLLBACK").expect("unlock");
    let released = std::time::Instant::now();
    let up = eventually(Duration::from_secs(5), || all_are(ServingStatus::Serving)).await;
    assert!(up, "SERVING again once it can");
    eprintln!(
        "health SERVING {:?} after the store wrote again",
        released.elapsed()
    );
    server.append("s", &["served again"]).await;
    let said = crate::logs::lines()
        .iter()
        .filter(|l| l.contains("the store cannot write or read"))
        .count();
    assert!(said >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_does_not_hold_the_shutdown_to_its_ceiling() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Process::start(
        dir.path(),
        &[
            ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1"),
            ("ARCHIVIST_SHUTDOWN_CEILING", "15s"),
        ],
    )
    .await;
    let addr: std::net::SocketAddr = server
        .address
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let mut appender = server.client().await;
    appender
        .append_entries(crate::harness::append_request("s", &["turn 0"]))
        .await
        .expect("append");
    // A watcher whose window takes 16 bytes, and that never reads.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(16)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("ready");
    let (response, mut send) = client
        .send_request(grpc_request(addr, "WatchSession"), false)
        .expect("send");
    // WatchSessionRequest { session_id: "s" }
    send.send_data(bytes::Bytes::from(frame(b"\x0a\x01s")), true)
        .expect("data");
    let response = response.await.expect("the watch is open");
    assert_eq!(response.status(), 200);
    assert!(
        tonic::Status::from_header_map(response.headers()).is_none(),
        "the watch was refused"
    );
    // Far more events than its window and the server's buffers hold.
    for i in 1..40 {
        appender
            .append_entries(crate::harness::append_request("s", &[&format!("turn {i}")]))
            .await
            .expect("append");
    }
    let stopping = std::time::Instant::now();
    let pid = server.child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let exited = tokio::task::spawn_blocking(move || {
        let status = server.child.wait();
        (server, status)
    })
    .await
    .expect("join");
    let (server, status) = exited;
    let took = stopping.elapsed();
    assert!(status.expect("exit").success());
    eprintln!("shutdown with a watcher that never reads took {took:?} (ceiling 15 s)");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let log = server.log.lock().expect("log").clone();
    assert!(
        !log.iter().any(|l| l.contains("cancelling recap passes")),
        "no pass was running: {log:?}"
    );
    drop(response);
}

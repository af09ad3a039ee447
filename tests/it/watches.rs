//! Watching through the real binary: watches have a budget of their own
//! (they hold no call slot, so one tenant's watchers lock nobody out), and a
//! watch may come before the session's first append.

use std::time::Duration;

use archivist::client::{ClientOptions, connect_with};
use archivist::config::token_sha256;
use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::binary::Process;
use crate::harness::{append_request, close_now, eventually, reason};

const TOKEN_A: &str = "watch-token-a-81c4";
const TOKEN_B: &str = "watch-token-b-2f9d";

/// Writes a configuration with tenants `a` and `b` and the given watch
/// caps, with metrics on a port of the server's choosing.
fn config(dir: &std::path::Path, max_watches: u32, per_tenant: u32) -> std::path::PathBuf {
    let file = dir.join("archivist.toml");
    let text = format!(
        r#"
[segment]
max_entries = 1000

[limits]
max_watches = {max_watches}
max_watches_per_tenant = {per_tenant}

[metrics]
listen = "127.0.0.1:0"

[[auth.tenants]]
name = "a"
token_sha256 = "{a}"

[[auth.tenants]]
name = "b"
token_sha256 = "{b}"
"#,
        a = token_sha256(TOKEN_A),
        b = token_sha256(TOKEN_B),
    );
    std::fs::write(&file, text).expect("write config");
    file
}

async fn tenant(server: &Process, token: &str) -> archivist::client::Client {
    connect_with(&ClientOptions {
        address: server.address.clone(),
        token: Some(token.to_owned()),
        ..ClientOptions::default()
    })
    .await
    .expect("connect")
}

async fn watch(
    client: &archivist::client::Client,
    session: &str,
) -> Result<tonic::Streaming<pb::SessionEvent>, tonic::Status> {
    client
        .clone()
        .watch_session(pb::WatchSessionRequest {
            session_id: session.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The next event, waiting at most ten seconds.
async fn next(stream: &mut tonic::Streaming<pb::SessionEvent>) -> pb::SessionEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
        .expect("an event before the end")
}

fn kind(event: &pb::SessionEvent) -> pb::SessionEventKind {
    pb::SessionEventKind::try_from(event.kind).expect("kind")
}

/// The value of one series in the server's metrics (0 when absent).
async fn metric(server: &Process, series: &str) -> f64 {
    let addr = {
        let log = server.log.lock().expect("log");
        log.iter()
            .find(|l| l.contains("metrics at /metrics"))
            .and_then(|l| l.split("metrics=").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .expect("the metrics address is logged")
            .to_owned()
    };
    // reqwest is built without a default TLS provider (the server's own
    // client installs one); this test may run before any server in-process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Asserts a refusal for a full watch budget, naming its scope and limit.
fn assert_watch_budget(status: &tonic::Status, scope: &str, limit: u32) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(status), "TOO_MANY_WATCHES");
    let details = status.get_error_details();
    let info = details.error_info().expect("error info");
    assert_eq!(info.metadata.get("scope").map(String::as_str), Some(scope));
    assert_eq!(
        info.metadata.get("limit").map(String::as_str),
        Some(limit.to_string().as_str())
    );
    assert!(details.retry_info().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_watches_lock_no_tenant_out_and_have_a_budget_of_their_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = config(dir.path(), 400, 300);
    let server = Process::start_with(
        dir.path(),
        &[],
        &["--config", file.to_str().expect("utf-8 path")],
    )
    .await;
    let a = tenant(&server, TOKEN_A).await;
    let b = tenant(&server, TOKEN_B).await;
    let idle_kib = server.peak_rss_kib();

    // Tenant A watches 300 sessions over one connection, more than the
    // server has call slots (256); none of them exists yet.
    let mut watches = Vec::new();
    for i in 0..300 {
        watches.push(
            watch(&a, &format!("w-{i}"))
                .await
                .expect("within A's share"),
        );
    }
    assert_eq!(metric(&server, "archivist_watches").await, 300.0);

    // Every call of tenant B is served, and A's own calls on the very
    // connection its watches use.
    let mut refused = 0;
    for i in 0..100 {
        match b
            .clone()
            .append_entries(append_request("b-session", &[&format!("b's entry {i}")]))
            .await
        {
            Ok(_) => {}
            Err(status) if status.code() == Code::ResourceExhausted => refused += 1,
            Err(status) => panic!("append: {status:?}"),
        }
    }
    assert_eq!(refused, 0, "B's appends refused while A's watches are open");
    a.clone()
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("A's unary calls have their slots");

    // A's share is full: refused by name.
    let status = watch(&a, "one-more").await.expect_err("A's share is full");
    assert_watch_budget(&status, "tenant", 300);

    // B has a share of its own, up to the server's cap of 400; B watches
    // the names A watches, which are B's own sessions.
    let mut theirs = Vec::new();
    for i in 0..100 {
        theirs.push(
            watch(&b, &format!("w-{i}"))
                .await
                .expect("within B's share"),
        );
    }
    let status = watch(&b, "w-100").await.expect_err("the server is full");
    assert_watch_budget(&status, "server", 400);
    let full_kib = server.peak_rss_kib();

    // Watch, then append: A's first watch sees its session come into
    // being: CLOSED, then SUMMARISED (the extractive recap).
    a.clone()
        .append_entries(append_request("w-0", &["Ada's invoice number is 4471."]))
        .await
        .expect("append");
    let closed = close_now(&a, "w-0").await;
    let event = next(&mut watches[0]).await;
    assert_eq!(kind(&event), pb::SessionEventKind::Closed);
    assert_eq!(event.segment.as_ref().map(|s| s.id), Some(closed.id));
    let event = next(&mut watches[0]).await;
    assert_eq!(kind(&event), pb::SessionEventKind::Summarised);
    let summary = event.segment.and_then(|s| s.summary).expect("summary");
    assert!(summary.text.contains("4471"), "{}", summary.text);

    // B's watch of its own "w-0" saw none of A's: its first event is the
    // close of B's own segment.
    b.clone()
        .append_entries(append_request("w-0", &["b's own"]))
        .await
        .expect("append");
    let b_closed = close_now(&b, "w-0").await;
    let event = next(&mut theirs[0]).await;
    assert_eq!(kind(&event), pb::SessionEventKind::Closed);
    assert_eq!(event.segment.map(|s| s.id), Some(b_closed.id));
    assert_ne!(b_closed.id, closed.id);

    // Watches that end give their places back.
    watches.truncate(200);
    let given_back = eventually(Duration::from_secs(10), || async {
        metric(&server, "archivist_watches").await == 300.0
    })
    .await;
    assert!(given_back, "ended watches still counted");
    let more = watch(&b, "w-100").await.expect("room again");
    drop((more, theirs, watches));
    let all_gone = eventually(Duration::from_secs(10), || async {
        metric(&server, "archivist_watches").await == 0.0
    })
    .await;
    assert!(all_gone, "every watch gave its place back");
    eprintln!(
        "peak RSS: {idle_kib} KiB idle, {full_kib} KiB with 400 watches open ({} KiB a watch)",
        full_kib.saturating_sub(idle_kib) / 400
    );
    assert!(full_kib < 96 * 1024, "{full_kib} KiB");
}

//! `archivist backfill` through the real binary: the report, the exit code,
//! the dry run, and running beside a live server on the same database.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use wiremock::ResponseTemplate;

use crate::harness::{TestServer, eventually};
use crate::provider::{Script, append_and_close, completion, error_json, fast};

/// Runs `archivist backfill` on `data_dir` against the provider at `base`;
/// returns the exit code and standard output.
async fn backfill(data_dir: &Path, base: &str, args: &[&str]) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_archivist"));
    command
        .arg("backfill")
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("ARCHIVIST_PROVIDER_KIND", "openai")
        .env("ARCHIVIST_PROVIDER_BASE_URL", format!("{base}/v1"))
        // The model the tests' servers are configured with (`fast`).
        .env("ARCHIVIST_PROVIDER_MODEL", "test-model")
        .env("ARCHIVIST_RETRY_INITIAL_BACKOFF", "10ms")
        .env("ARCHIVIST_RETRY_MAX_BACKOFF", "40ms")
        // These tests count level-1 sends and summaries: no roll-ups.
        .env("ARCHIVIST_MEMORY_FANOUT", "0");
    // The fake provider answers on this runtime: wait for the child on a
    // blocking thread.
    let out = tokio::task::spawn_blocking(move || command.output().expect("run backfill"))
        .await
        .expect("joined");
    let code = out.status.code().expect("exit code");
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test]
async fn the_report_counts_what_is_left_and_the_exit_code_says_so() {
    // A database with two summarised segments, one pending (the provider
    // was unavailable) and one parked (the key was refused).
    let script = Script::new(vec![
        completion("a"),
        completion("b"),
        ResponseTemplate::new(503),
        ResponseTemplate::new(503),
        ResponseTemplate::new(503),
        error_json(401, "invalid_api_key", "Incorrect API key"),
    ]);
    let mock = script.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    append_and_close(&server, "a").await.expect("summarised");
    append_and_close(&server, "a").await.expect("summarised");
    append_and_close(&server, "b")
        .await
        .expect_err("unavailable");
    append_and_close(&server, "c").await.expect_err("refused");
    let dir = server.stop().await;

    // Each fake provider below has a URL of its own: another provider than
    // the one the database was served with, which a run must be told is
    // meant (--allow-provider-change); a dry run only reports it.
    let down = Script::new(vec![ResponseTemplate::new(503)]);
    let down_mock = down.mount().await;

    // A dry run lists what a run would take (the pending one; the parked
    // one only with --include-parked), counts what is left, and changes
    // nothing.
    let (code, out) = backfill(dir.path(), &down_mock.uri(), &["--dry-run", "--json"]).await;
    assert_eq!(code, 2, "{out}");
    let report = json(&out);
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["matched"], 1);
    assert_eq!(report["pending"], 1);
    assert_eq!(report["pending_by_class"]["unavailable"], 1);
    assert_eq!(report["parked"], 1);
    assert_eq!(report["parked_by_class"]["unauthorized"], 1);
    assert_eq!(report["segments"].as_array().map(Vec::len), Some(1));
    assert_eq!(report["segments"][0]["claimed_elsewhere"], false);
    assert_eq!(
        report["provider"]["base_url"],
        format!("{}/v1", down_mock.uri())
    );
    assert_eq!(
        report["provider_changed_from"]["base_url"],
        format!("{}/v1", mock.uri()),
        "the dry run says a real run would be refused"
    );
    assert_eq!(down.calls(), 0, "a dry run sends nothing");
    let (_, again) = backfill(dir.path(), &down_mock.uri(), &["--dry-run", "--json"]).await;
    assert_eq!(
        json(&again)["segments"],
        report["segments"],
        "and changes nothing"
    );
    let (_, with_parked) = backfill(
        dir.path(),
        &down_mock.uri(),
        &["--dry-run", "--json", "--include-parked"],
    )
    .await;
    assert_eq!(json(&with_parked)["matched"], 2);

    // Filters narrow it.
    let (code, out) = backfill(
        dir.path(),
        &down_mock.uri(),
        &["--dry-run", "--json", "--session", "c", "--include-parked"],
    )
    .await;
    assert_eq!(code, 2);
    assert_eq!(json(&out)["matched"], 1);
    let (code, out) = backfill(
        dir.path(),
        &down_mock.uri(),
        &["--dry-run", "--json", "--closed-before", "1h"],
    )
    .await;
    assert_eq!(code, 0, "nothing closed an hour ago: {out}");

    // A real run with another provider is refused, naming both, and sends
    // nothing.
    let (code, out) = backfill(dir.path(), &down_mock.uri(), &["--json"]).await;
    assert_eq!(code, 1, "{out}");
    assert_eq!(down.calls(), 0);

    // A real run with the provider still down: one pass for the pending
    // segment, the parked one left alone.
    let (code, out) = backfill(
        dir.path(),
        &down_mock.uri(),
        &["--json", "--allow-provider-change"],
    )
    .await;
    assert_eq!(code, 2, "{out}");
    let report = json(&out);
    assert_eq!(report["summarised"], 0);
    assert_eq!(report["pending_by_class"]["unavailable"], 1);
    assert_eq!(report["parked_by_class"]["unauthorized"], 1);
    assert_eq!(report["stopped_early"], Value::Null);
    assert_eq!(down.calls(), 3, "one pass: max_attempts sends");

    // With a healthy provider and --include-parked, nothing is left.
    let up = Script::new(vec![completion("Recap at last.")]);
    let up_mock = up.mount().await;
    let (code, out) = backfill(
        dir.path(),
        &up_mock.uri(),
        &["--json", "--include-parked", "--allow-provider-change"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let report = json(&out);
    assert_eq!(report["summarised"], 2);
    assert_eq!(
        (report["pending"].clone(), report["parked"].clone()),
        (Value::from(0), Value::from(0))
    );
    assert_eq!(up.calls(), 2);

    let (code, out) = backfill(dir.path(), &up_mock.uri(), &["--allow-provider-change"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("summarised: 0"), "{out}");
    assert!(
        out.contains(&format!("provider: openai at {}/v1", up_mock.uri())),
        "{out}"
    );
    assert_eq!(up.calls(), 2);
}

#[tokio::test]
async fn beside_a_live_server_each_recap_is_sent_once() {
    let counter = crate::reconciler::PerSegment::default();
    let mock = crate::provider::provider(counter.clone()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = archivist::config::Config::default();
    fast(&mut config, &mock.uri());
    config.segment.max_entries = 1;
    config.reconciler.interval = Duration::from_millis(100);
    config.reconciler.concurrency = 1;
    // Roll-ups off: this test counts the sends of level-1 segments.
    config.memory.fanout = 0;
    let server = TestServer::start_at(dir.path(), config, None).await;
    let segments = 60;
    crate::reconciler::closed_segments(&server, "s", segments).await;

    let (code, out) = backfill(dir.path(), &mock.uri(), &["--json", "--concurrency", "4"]).await;
    let report = json(&out);
    assert!(code == 0 || code == 2, "{out}");
    let done = eventually(Duration::from_secs(30), || async {
        let b = server.backlog().await;
        b.summarised == segments as u64
    })
    .await;
    assert!(done);
    let sent = counter.sent();
    assert_eq!(sent.len(), segments);
    for (marker, n) in &sent {
        assert_eq!(*n, 1, "segment marker-{marker} sent {n} times");
    }
    assert!(
        report["summarised"].as_u64().unwrap_or(0) > 0,
        "the backfill took a share: {out}"
    );
}

#[tokio::test]
async fn ctrl_c_stops_a_backfill_cleanly() {
    // One PENDING segment for the backfill: its pass failed at a provider
    // that was not there.
    let server = TestServer::start_with(|c| fast(c, "http://127.0.0.1:9")).await;
    server.append("s", &["something owed a recap"]).await;
    server
        .close("s", true)
        .await
        .expect("closed; nothing answered");
    let dir = server.stop().await;
    interrupt(dir).await;
}

async fn interrupt(dir: tempfile::TempDir) {
    let hanging = Script::new(vec![
        completion("never").set_delay(Duration::from_secs(600)),
    ]);
    let hanging_mock = hanging.mount().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_archivist"))
        .arg("backfill")
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--json")
        .arg("--allow-provider-change")
        .env("ARCHIVIST_PROVIDER_KIND", "openai")
        .env(
            "ARCHIVIST_PROVIDER_BASE_URL",
            format!("{}/v1", hanging_mock.uri()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn backfill");
    let started = eventually(Duration::from_secs(10), || async { hanging.calls() == 1 }).await;
    assert!(started, "the pass reached the provider");
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let out = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            std::io::Read::read_to_string(&mut stdout, &mut out).expect("read");
        }
        (child.wait().expect("wait"), out)
    })
    .await
    .expect("joined");
    let (status, out) = out;
    assert_eq!(status.code(), Some(2), "{out}");
    let report = json(&out);
    assert_eq!(report["interrupted"], true);
    assert_eq!(report["pending"], 1);
    // Nothing half-done: the claim was released, so a second run takes the
    // segment at once and finishes it.
    let up = Script::new(vec![completion("Recap.")]);
    let up_mock = up.mount().await;
    let (code, out) = backfill(
        dir.path(),
        &up_mock.uri(),
        &["--json", "--allow-provider-change"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["summarised"], 1);
}

#[tokio::test]
async fn include_parked_that_fails_again_is_not_stopped_early_nor_told_to_rerun_itself() {
    let refusing = Script::new(vec![error_json(
        401,
        "invalid_api_key",
        "Incorrect API key",
    )]);
    let mock = refusing.mount().await;
    let server = TestServer::start_with(|c| fast(c, &mock.uri())).await;
    for session in ["a", "b", "c"] {
        append_and_close(&server, session)
            .await
            .expect_err("refused");
    }
    let dir = server.stop().await;
    // Three parked segments, and a provider that still refuses the key:
    // three passes, all failed, the breaker open after the last one.
    let (code, out) = backfill(dir.path(), &mock.uri(), &["--include-parked"]).await;
    assert_eq!(code, 2, "{out}");
    assert!(!out.contains("stopped early"), "{out}");
    assert!(
        out.contains("failed again under this provider setup"),
        "{out}"
    );
    assert!(!out.contains("then rerun with --include-parked"), "{out}");
    assert!(out.contains("unauthorized: 3"), "{out}");
    assert_eq!(refusing.calls(), 6, "one send per segment, each time");
}

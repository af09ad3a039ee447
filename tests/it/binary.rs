//! The real `archivist` binary: durability across SIGKILL, refusal of bad
//! configuration, and a clean exit on SIGTERM.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use archivist::pb;

use crate::harness::{context_entries, entry, eventually};

pub(crate) struct Process {
    pub(crate) child: Child,
    pub(crate) address: String,
    /// Every line the server has logged so far.
    pub(crate) log: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// Starts `archivist serve` on `data_dir` on a port of its own choosing
    /// (read back from its start-up line), and waits until it answers.
    pub(crate) async fn start(data_dir: &std::path::Path, env: &[(&str, &str)]) -> Process {
        Process::start_adjusted(data_dir, env, |_| {}).await
    }

    /// As `start`, with more flags for `serve`.
    pub(crate) async fn start_with(
        data_dir: &std::path::Path,
        env: &[(&str, &str)],
        flags: &[&str],
    ) -> Process {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        Process::start_adjusted(data_dir, env, move |c| {
            c.args(&flags);
        })
        .await
    }

    /// As `start`, after `adjust` has its say over the command.
    pub(crate) async fn start_adjusted(
        data_dir: &std::path::Path,
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Process {
        let mut command = Command::new(env!("CARGO_BIN_EXE_archivist"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        adjust(&mut command);
        let mut child = command.spawn().expect("spawn archivist");
        let stderr = child.stderr.take().expect("stderr");
        let (found, listening) = std::sync::mpsc::channel();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let lines = log.clone();
        // Reads the start-up line, then keeps draining so the server never
        // blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().expect("lock").push(line.clone());
                if !line.contains("archivist is serving") {
                    continue;
                }
                if let Some(rest) = line.split("listen=").nth(1) {
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let _ = found.send(addr);
                }
            }
        });
        let addr =
            tokio::task::spawn_blocking(move || listening.recv_timeout(Duration::from_secs(30)))
                .await
                .expect("join")
                .expect("archivist reported its address");
        let address = format!("http://{addr}");
        let process = Process {
            child,
            address,
            log,
        };
        let up = eventually(Duration::from_secs(20), || async {
            archivist::client::connect(&process.address).await.is_ok()
        })
        .await;
        assert!(up, "archivist did not start");
        process
    }

    /// Starts the binary against an OpenAI-compatible provider at `base`.
    /// Each fake provider has a base URL of its own, so a restart with
    /// another one is a provider change the test means.
    pub(crate) async fn start_openai(
        data_dir: &std::path::Path,
        base: &str,
        extra: &[(&str, &str)],
    ) -> Process {
        let url = format!("{base}/v1");
        let mut env = vec![
            ("ARCHIVIST_PROVIDER_KIND", "openai"),
            ("ARCHIVIST_PROVIDER_BASE_URL", url.as_str()),
            ("ARCHIVIST_RECONCILER_INTERVAL", "200ms"),
            // The tests count every request the provider gets.
            ("ARCHIVIST_PROVIDER_CHECK_ON_START", "false"),
        ];
        env.extend_from_slice(extra);
        Process::start_with(data_dir, &env, &["--allow-provider-change"]).await
    }

    /// Waits up to `limit` for `n` segments to be SUMMARISED.
    async fn summarised(&self, n: u64, limit: Duration) -> bool {
        let client = self.client().await;
        eventually(limit, || {
            let mut client = client.clone();
            async move {
                client
                    .get_backlog(pb::GetBacklogRequest {})
                    .await
                    .is_ok_and(|b| b.into_inner().summarised == n)
            }
        })
        .await
    }

    pub(crate) async fn client(&self) -> archivist::client::Client {
        archivist::client::connect(&self.address)
            .await
            .expect("connect")
    }
}

impl Process {
    /// CPU time the server has used so far (user and system), from /proc.
    pub(crate) fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("the server's /proc stat");
        // Fields after the command name (which ends the last ')'): utime
        // and stime are the 12th and 13th, in clock ticks.
        let after = stat.rsplit_once(')').expect("stat").1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / per_second)
    }

    /// The server's peak resident memory so far, in KiB, from /proc.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_append_survives_sigkill() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Segments big enough never to close, so every entry stays raw and its
    // content can be compared after the restart.
    let big = [
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "1000000000"),
    ];
    let mut server = Process::start(dir.path(), &big).await;

    // Four writers append as fast as they can; each records what was
    // acknowledged. The server is killed while they are at it.
    let acked: Arc<Mutex<BTreeMap<(String, u64), String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let mut client = server.client().await;
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            let session = format!("writer-{w}");
            for i in 0.. {
                let texts = [format!("w{w} call {i} a"), format!("w{w} call {i} b")];
                let request = pb::AppendEntriesRequest {
                    session_id: session.clone(),
                    entries: texts.iter().map(|t| entry(t)).collect(),
                    ..Default::default()
                };
                match client.append_entries(request).await {
                    Ok(resp) => {
                        let mut acked = acked.lock().expect("lock");
                        for (e, text) in resp.into_inner().entries.iter().zip(&texts) {
                            acked.insert((session.clone(), e.seq), text.clone());
                        }
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    let enough = eventually(Duration::from_secs(30), || async {
        acked.lock().expect("lock").len() >= 400
    })
    .await;
    assert!(enough, "appends were acknowledged");
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("lock").clone();

    let server = Process::start(dir.path(), &big).await;
    let mut client = server.client().await;
    let mut stored: BTreeMap<(String, u64), String> = BTreeMap::new();
    for w in 0..4 {
        let session = format!("writer-{w}");
        let ctx = client
            .get_context(pb::GetContextRequest {
                session_id: session.clone(),
                max_tokens: 0,
                query: String::new(),
                min_similarity: None,
            })
            .await
            .expect("context")
            .into_inner();
        for (seq, content) in context_entries(&ctx) {
            stored.insert((session.clone(), seq), content);
        }
    }
    for (key, text) in &acked {
        assert_eq!(stored.get(key), Some(text), "acknowledged entry {key:?}");
    }
    // Seqs have no gaps: what was stored is contiguous from 1 per session.
    for w in 0..4 {
        let session = format!("writer-{w}");
        let seqs: Vec<u64> = stored
            .keys()
            .filter(|(s, _)| *s == session)
            .map(|(_, q)| *q)
            .collect();
        let want: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, want, "{session}");
    }
}

#[test]
fn a_bad_configuration_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("archivist.toml");
    std::fs::write(&file, "[retry]\nmax_atempts = 3\n").expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_archivist"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .expect("run archivist");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_atempts"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_archivist"))
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .env("ARCHIVIST_RETRY_JITTER", "2.5")
        .output()
        .expect("run archivist");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("retry.jitter"), "{stderr}");
}

#[tokio::test]
async fn sigterm_and_a_restart_between_two_appends_leave_one_segment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Process::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![entry("before the signal")],
            ..Default::default()
        })
        .await
        .expect("append");
    let pid = server.child.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::task::spawn_blocking(move || server.child.wait().expect("wait"))
        .await
        .expect("join");
    assert!(status.success(), "{status:?}");

    let server = Process::start(dir.path(), &[]).await;
    let mut client = server.client().await;
    // The shutdown left the segment open: the conversation goes on in it.
    let resp = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![entry("after the restart")],
            ..Default::default()
        })
        .await
        .expect("append")
        .into_inner();
    assert_eq!(resp.entries[0].seq, 2);
    let segs = crate::harness::list_segments(&mut client, "s").await;
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert_eq!(segs[0].state, pb::SegmentState::Open as i32);
    assert_eq!((segs[0].first_seq, segs[0].last_seq), (1, 2));
    assert_eq!(Some(segs[0].id), resp.open_segment_id);
}

#[tokio::test]
async fn an_idle_open_segment_is_closed_and_summarised_after_max_idle() {
    let dir = tempfile::tempdir().expect("temp dir");
    let idle = [
        ("ARCHIVIST_SEGMENT_MAX_IDLE", "1s"),
        ("ARCHIVIST_RECONCILER_INTERVAL", "200ms"),
    ];
    let mut server = Process::start(dir.path(), &idle).await;
    let mut client = server.client().await;
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![entry("the host will never close this")],
            ..Default::default()
        })
        .await
        .expect("append");
    // The idle time is in the database: it carries across a restart.
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");
    let server = Process::start(dir.path(), &idle).await;
    let client = server.client().await;
    let done = server.summarised(1, Duration::from_secs(10)).await;
    assert!(done, "the idle segment was closed and summarised");
    let segs = crate::harness::list_segments(&mut client.clone(), "s").await;
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].state, pb::SegmentState::Summarised as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_killed_mid_flight_is_redone_once_after_its_lease() {
    use crate::provider::{Script, completion};

    let hanging = Script::new(vec![
        completion("never sent").set_delay(Duration::from_secs(600)),
    ]);
    let hanging_mock = hanging.mount().await;
    let healthy = Script::new(vec![completion("The recap, at last.")]);
    let healthy_mock = healthy.mount().await;
    let settings = [
        ("ARCHIVIST_RETRY_PASS_CEILING", "2s"),
        ("ARCHIVIST_RETRY_ATTEMPT_TIMEOUT", "2s"),
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Process::start_openai(dir.path(), &hanging_mock.uri(), &settings).await;
    let mut client = server.client().await;
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![entry("Something worth a recap.")],
            ..Default::default()
        })
        .await
        .expect("append");
    client
        .close_segment(pb::CloseSegmentRequest {
            session_id: "s".into(),
            wait: false,
        })
        .await
        .expect("close");
    let waiting = eventually(Duration::from_secs(10), || async { hanging.calls() == 1 }).await;
    assert!(waiting, "the pass reached the provider");
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reaped");

    let server = Process::start_openai(dir.path(), &healthy_mock.uri(), &settings).await;
    let client = server.client().await;
    // The dead worker's claim holds until its lease (twice the ceiling and
    // 5 s) runs out; then the segment is due again and summarised.
    let done = server.summarised(1, Duration::from_secs(30)).await;
    assert!(done, "summarised after the lease");
    assert_eq!(healthy.calls(), 1, "summarised exactly once");
    assert_eq!(hanging.calls(), 1);
    let segs = crate::harness::list_segments(&mut client.clone(), "s").await;
    assert_eq!(segs.len(), 1);
    assert_eq!(
        segs[0].summary.as_ref().map(|s| s.text.as_str()),
        Some("The recap, at last.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_hanging_pass_exits_within_the_ceiling_and_loses_nothing() {
    use crate::provider::{Script, completion};

    let hanging = Script::new(vec![
        completion("never").set_delay(Duration::from_secs(600)),
    ]);
    let hanging_mock = hanging.mount().await;
    let healthy = Script::new(vec![completion("Recap after the restart.")]);
    let healthy_mock = healthy.mount().await;
    let settings = [
        ("ARCHIVIST_SHUTDOWN_CEILING", "2s"),
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "3"),
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Process::start_openai(dir.path(), &hanging_mock.uri(), &settings).await;
    let mut client = server.client().await;
    // One closed segment (its pass hangs) and one open one.
    let texts = ["first", "second", "third", "fourth"];
    let resp = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: texts.iter().map(|t| entry(t)).collect(),
            ..Default::default()
        })
        .await
        .expect("append")
        .into_inner();
    assert_eq!(resp.closed_segment_ids.len(), 1);
    let waiting = eventually(Duration::from_secs(10), || async { hanging.calls() == 1 }).await;
    assert!(waiting, "the pass reached the provider");

    let started = std::time::Instant::now();
    let sent = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::task::spawn_blocking(move || {
        let status = server.child.wait().expect("wait");
        (status, server)
    })
    .await
    .expect("join")
    .0;
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(4), "{took:?} for a 2 s ceiling");

    let server = Process::start_openai(dir.path(), &healthy_mock.uri(), &settings).await;
    let client = server.client().await;
    // The closed segment is owed a recap and does not wait out a lease:
    // the cancelled pass let its claim go. The open one stays open.
    let done = server.summarised(1, Duration::from_secs(4)).await;
    assert!(done, "the closed segment summarised after the restart");
    assert_eq!(healthy.calls(), 1);
    let segs = crate::harness::list_segments(&mut client.clone(), "s").await;
    let covered: Vec<(u64, u64, i32)> = segs
        .iter()
        .map(|s| (s.first_seq, s.last_seq, s.state))
        .collect();
    assert_eq!(
        covered,
        vec![
            (1, 3, pb::SegmentState::Summarised as i32),
            (4, 4, pb::SegmentState::Open as i32)
        ],
        "every acknowledged entry is there"
    );
}

#[test]
fn a_public_address_without_tenants_needs_insecure_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_archivist"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run archivist");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--insecure-open"), "{stderr}");
    assert!(stderr.contains("listen"), "{stderr}");
}

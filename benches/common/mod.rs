//! Helpers shared by the benchmarks: the real server in its own process,
//! an append request, a fake OpenAI-compatible provider in its own
//! process, and the CPU time of this one.

#![allow(dead_code)]

pub mod fake_embedder;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use archivist::config::{Config, ProviderKind};
use archivist::internals::{App, Store, Summariser};
use archivist::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The multi-threaded runtime a bench's rounds run on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// `archivist serve` in its own process, on a free loopback port and a
/// data directory of its own; killed and reaped when dropped.
pub struct Server {
    child: Child,
    pub address: String,
    /// The data directory, removed on drop; None once `stop` has taken it,
    /// and for a directory kept across runs (`start_server_at`).
    dir: Option<tempfile::TempDir>,
    path: std::path::PathBuf,
}

impl Server {
    /// The server's data directory (a SQLite server's database is there).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.path
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time the server's threads have used so far: the sum of each
    /// live thread's run time in `/proc` (nanoseconds, where the process's
    /// own user/system ticks are 10 ms). None where `/proc` does not say.
    pub fn cpu_time(&self) -> Option<Duration> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).ok()?;
        let mut ns = 0u64;
        for task in tasks {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(Duration::from_nanos(ns))
    }
}

impl Server {
    /// Stops the server (kill, reap) and hands back its data directory,
    /// for another server to start on (`start_server_in`).
    pub fn stop(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir.take().expect("a data directory")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Segments too large to close: what is measured is appends, not recaps.
pub const BIG_SEGMENTS: [(&str, &str); 2] = [
    ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
    ("ARCHIVIST_SEGMENT_MAX_TOKENS", "4000000000"),
];

/// Starts `binary serve` with `args` after `serve` and `env` set, and
/// waits until it answers.
pub async fn start_server(binary: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    start_server_in(binary, tempfile::tempdir().expect("temp dir"), args, env).await
}

/// As `start_server`, on the data directory `dir` (a stopped server's).
pub async fn start_server_in(
    binary: &std::path::Path,
    dir: tempfile::TempDir,
    args: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let path = dir.path().to_owned();
    start(binary, Some(dir), path, args, env).await
}

/// As `start_server`, on the data directory at `path`, which outlives the
/// server (a bench's data kept for its next run); `stop` does not apply.
pub async fn start_server_at(
    binary: &std::path::Path,
    path: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Server {
    start(binary, None, path.to_owned(), args, env).await
}

async fn start(
    binary: &std::path::Path,
    dir: Option<tempfile::TempDir>,
    path: std::path::PathBuf,
    args: &[&str],
    env: &[(&str, &str)],
) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut command = Command::new(binary);
    // The benches' own settings are no server's keys: a server refuses an
    // ARCHIVIST_* variable it does not know, and older builds know fewer.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ARCHIVIST_BENCH_") {
            command.env_remove(key);
        }
    }
    let child = command
        .arg("serve")
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&path)
        .env(
            "RUST_LOG",
            std::env::var("ARCHIVIST_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned()),
        )
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn archivist");
    // Owned at once, so that every way out of here kills and reaps it.
    let server = Server {
        child,
        address: format!("http://127.0.0.1:{port}"),
        dir,
        path,
    };
    for _ in 0..200 {
        if archivist::client::connect(&server.address).await.is_ok() {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("archivist did not start");
}

/// Every node of `session` ("" for every session) at `levels` (empty:
/// level 1, the segments of entries), through every page.
pub async fn list_nodes(
    client: &mut archivist::client::Client,
    session: &str,
    levels: &[u32],
) -> Vec<pb::Segment> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: session.to_owned(),
                states: Vec::new(),
                page_size: 1000,
                page_token: token,
                levels: levels.to_vec(),
            })
            .await
            .expect("list segments")
            .into_inner();
        out.extend(page.segments);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

/// Percentile `q` (0 to 1) of `sorted`; 0 when it is empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => sorted[((n as f64 * q) as usize).min(n - 1)],
    }
}

/// An AppendEntries of `batch` entries into `session`, the `n`th of its
/// kind (which its idempotency keys name).
pub fn request(session: &str, batch: usize, n: u64) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        session_id: session.to_owned(),
        entries: (0..batch)
            .map(|i| pb::NewEntry {
                client_entry_id: format!("c{n}-{i}"),
                role: pb::Role::User.into(),
                content: format!(
                    "entry {n}/{i}: the agent asked about the billing migration and the answer was to rerun it"
                ),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

const COMPLETION: &str = r#"{"id":"c","object":"chat.completion","model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"The segment covered the billing migration and its rerun."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":12,"total_tokens":132}}"#;

/// The app (store in `dir`, summariser, breaker, metrics) built as the
/// server builds it, talking to the OpenAI-compatible provider at `base`,
/// with the default configuration otherwise.
pub async fn openai_app(dir: &std::path::Path, base: &str) -> (Config, App) {
    let mut config = Config::default();
    config.provider.kind = ProviderKind::Openai;
    config.provider.base_url = format!("{base}/v1");
    config.data_dir = dir.to_owned();
    let app = App::build(&config, None, "bench").await.expect("app");
    (config, app)
}

/// The store and summariser of an `openai_app`.
pub async fn openai_summariser(
    dir: &std::path::Path,
    base: &str,
) -> (Config, App, Store, Arc<Summariser>) {
    let (config, app) = openai_app(dir, base).await;
    let store = app.store().clone();
    let summariser = app.summariser().clone();
    (config, app, store, summariser)
}

/// Runs the fake provider and returns, when this process was started as
/// one (`--fake-provider DELAY_MS`); every bench calls this first.
pub fn serve_if_provider() -> bool {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--fake-provider") {
        Some(i) => {
            let delay = args.get(i + 1).and_then(|d| d.parse().ok()).unwrap_or(0);
            fake_provider(Duration::from_millis(delay));
            true
        }
        None => false,
    }
}

/// User plus system CPU time of this whole process.
pub fn cpu_time() -> Duration {
    rusage(libc::RUSAGE_SELF)
}

/// User plus system CPU time of this process's children that have been
/// waited for (a load generator run to its end).
pub fn children_cpu_time() -> Duration {
    rusage(libc::RUSAGE_CHILDREN)
}

fn rusage(who: libc::c_int) -> Duration {
    // SAFETY: getrusage only writes into the struct we hand it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(who, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

pub struct ProviderProcess(Child);

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_provider(delay_ms: u64) -> (ProviderProcess, String) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--fake-provider", &delay_ms.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn fake provider");
    let stdout = child.stdout.take().expect("stdout");
    let process = ProviderProcess(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("port line");
    (process, format!("http://{}", line.trim()))
}

/// A minimal HTTP/1.1 server: reads each request (head and
/// content-length body) and answers with COMPLETION after `delay`.
fn fake_provider(delay: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("{}", listener.local_addr().expect("addr"));
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{COMPLETION}",
            COMPLETION.len()
        );
        let response: Arc<[u8]> = response.into_bytes().into();
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let _ = socket.set_nodelay(true);
            let response = response.clone();
            let sent = sent.clone();
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(16 * 1024);
                let mut chunk = vec![0u8; 16 * 1024];
                loop {
                    let needed = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break end + 4 + len;
                            }
                        }
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    if buf.starts_with(b"GET /count") {
                        buf.drain(..needed);
                        let body = sent.load(std::sync::atomic::Ordering::SeqCst).to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    buf.drain(..needed);
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    if socket.write_all(&response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// How many completions the fake provider at `base` has been sent so far.
pub async fn provider_requests(base: &str) -> u64 {
    let addr = base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket
        .write_all(b"GET /count HTTP/1.1\r\nhost: fake\r\ncontent-length: 0\r\n\r\n")
        .await
        .expect("ask");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        let n = socket.read(&mut chunk).await.expect("read");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return body[..len].parse().expect("a count");
            }
        }
        assert!(n > 0, "the fake provider closed the connection");
    }
}

/// PostgreSQL for the benchmarks: `ARCHIVIST_BENCH_PG_URL`, by default the
/// local server as `postgres`. A fresh database per call, dropped with the
/// returned guard; None (with a notice) when the server does not answer.
pub struct PgDatabase {
    pub url: String,
    admin: String,
    name: String,
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&admin, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

pub async fn pg_database(tag: &str) -> Option<PgDatabase> {
    let admin = std::env::var("ARCHIVIST_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let client = match tokio_postgres::connect(&admin, tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            client
        }
        Err(e) => {
            println!(
                "  (PostgreSQL not reachable ({e}): set ARCHIVIST_BENCH_PG_URL for these figures)"
            );
            return None;
        }
    };
    let name = format!("archivist_bench_{tag}_{}", std::process::id());
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .expect("drop an old database");
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let base = admin.split('?').next().unwrap_or(&admin);
    let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
    Some(PgDatabase {
        url: format!("{base}/{name}"),
        admin,
        name,
    })
}

//! The service's own cost of a recap pass (claim, read, send, write) and the
//! throughput of passes against a slow provider.
//!
//! Run: `cargo bench --bench pass`. The fake provider is this same binary
//! re-run as a child process (`--fake-provider DELAY_MS`), a minimal
//! HTTP/1.1 keep-alive server answering every request with a fixed chat
//! completion after DELAY_MS, so that the CPU measured here (getrusage of
//! this process) is archivist's alone: the summariser, the OpenAI client,
//! the store and its writer thread.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archivist::config::{Config, ProviderKind};
use archivist::model::{NewEntry, Role, SegmentId, SessionName, Tenant};
use archivist::provider::Provider;
use archivist::store::Store;
use archivist::summarise::{PassOutcome, Summariser, SummariserConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

const COMPLETION: &str = r#"{"id":"c","object":"chat.completion","model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"The segment covered the billing migration and its rerun."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":12,"total_tokens":132}}"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--fake-provider") {
        let delay = args.get(i + 1).and_then(|d| d.parse().ok()).unwrap_or(0);
        fake_provider(Duration::from_millis(delay));
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("Pass cost against a provider that answers at once:");
        for concurrency in [1, 4] {
            let (_p, base) = spawn_provider(0);
            let bench = Bench::new(&base).await;
            let n = 4000;
            let ids = bench.segments(n).await;
            let cpu0 = cpu_time();
            let t0 = Instant::now();
            bench.run(&ids, concurrency).await;
            let wall = t0.elapsed();
            let cpu = cpu_time() - cpu0;
            println!(
                "  concurrency {concurrency:>2}: {:>6.1} µs CPU per pass, {:>6.1} µs wall per pass, {:>7.0} passes/s ({n} passes)",
                cpu.as_secs_f64() * 1e6 / n as f64,
                wall.as_secs_f64() * 1e6 / n as f64,
                n as f64 / wall.as_secs_f64()
            );
        }
        println!("Throughput against a provider with 200 ms latency:");
        for concurrency in [4, 16, 64] {
            let (_p, base) = spawn_provider(200);
            let bench = Bench::new(&base).await;
            let n = concurrency * 10;
            let ids = bench.segments(n).await;
            let t0 = Instant::now();
            bench.run(&ids, concurrency).await;
            let rate = n as f64 / t0.elapsed().as_secs_f64();
            let ideal = concurrency as f64 / 0.2;
            println!(
                "  concurrency {concurrency:>2}: {rate:>7.1} passes/s, {:>5.1} % of concurrency/latency ({ideal:.0}/s)",
                100.0 * rate / ideal
            );
        }
    });
}

struct Bench {
    store: Store,
    summariser: Arc<Summariser>,
    _dir: tempfile::TempDir,
}

impl Bench {
    async fn new(base: &str) -> Bench {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.provider.kind = ProviderKind::Openai;
        config.provider.base_url = format!("{base}/v1");
        let store = Store::open(dir.path()).await.expect("store");
        let provider = Provider::from_config(&config.provider, None).expect("provider");
        let summariser = Summariser::new(
            store.clone(),
            provider,
            SummariserConfig {
                retry: config.retry.clone(),
                reconciler: config.reconciler.clone(),
                max_input_tokens: config.provider.max_input_tokens,
                max_output_tokens: config.provider.max_output_tokens,
            },
            "bench".to_owned(),
        );
        Bench {
            store,
            summariser,
            _dir: dir,
        }
    }

    /// `n` closed segments of ten entries each, ready for a pass.
    async fn segments(&self, n: usize) -> Vec<SegmentId> {
        let tenant = Tenant::default();
        let policy = archivist::model::SegmentPolicy {
            max_entries: 10,
            max_tokens: 1_000_000,
        };
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let session = SessionName::parse(&format!("s{i}")).expect("name");
            let entries = (0..10)
                .map(|j| NewEntry {
                    client_entry_id: None,
                    role: if j % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    content: format!(
                        "Message {j} about the billing migration, its timeout and the rerun plan."
                    ),
                })
                .collect();
            let out = self
                .store
                .append(&tenant, &session, entries, policy)
                .await
                .expect("append");
            ids.extend(out.closed_segment_ids);
        }
        ids
    }

    async fn run(&self, ids: &[SegmentId], concurrency: usize) {
        let gate = Arc::new(Semaphore::new(concurrency));
        let mut tasks = Vec::with_capacity(ids.len());
        for &id in ids {
            let permit = gate.clone().acquire_owned().await.expect("semaphore");
            let summariser = self.summariser.clone();
            tasks.push(tokio::spawn(async move {
                let outcome = summariser.run_or_join(id).await;
                drop(permit);
                outcome
            }));
        }
        for t in tasks {
            let outcome = t.await.expect("joined");
            assert!(matches!(outcome, PassOutcome::Summarised), "{outcome:?}");
        }
    }
}

/// User plus system CPU time of this whole process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we hand it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct ProviderProcess(Child);

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_provider(delay_ms: u64) -> (ProviderProcess, String) {
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
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let _ = socket.set_nodelay(true);
            let response = response.clone();
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

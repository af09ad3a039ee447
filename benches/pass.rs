//! The service's own cost of a recap pass (claim, read, send, write) and the
//! throughput of passes against a slow provider.
//!
//! Run: `cargo bench --bench pass`. The fake provider is this same binary
//! re-run as a child process (`--fake-provider DELAY_MS`), a minimal
//! HTTP/1.1 keep-alive server answering every request with a fixed chat
//! completion after DELAY_MS, so that the CPU measured here (getrusage of
//! this process) is archivist's alone: the summariser, the OpenAI client,
//! the store and its writer thread.

mod common;

use std::sync::Arc;
use std::time::Instant;

use archivist::internals::{App, Extractive, PassOutcome, Store, Summariser};
use archivist::model::{
    Entry, Millis, NewEntry, Role, SegmentId, SessionName, Tenant, estimate_tokens,
};
use tokio::sync::Semaphore;

use common::{cpu_time, spawn_provider};

fn main() {
    if common::serve_if_provider() {
        return;
    }
    let rt = common::runtime();
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
        extractive_cost();
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

/// The built-in extractive summariser alone, in process: a segment of 50
/// entries of chat (about 30 estimated tokens each, several sentences
/// some of them), and a roll-up of four of its recaps.
fn extractive_cost() {
    let sentences = [
        "The build takes 49 minutes on the CI machine.",
        "Sounds good, thanks!",
        "Our budget is about $1600 for the whole trip, and we land around 9:30 on Thursday.",
        "Knead for about 7 minutes, until the dough is smooth and springs back when you press it.",
        "Noted: your doctor's name is Solveig. I'll keep that in mind.",
        "Pay off high-interest debt first, but keep a small buffer for surprises.",
    ];
    let entries: Vec<Entry> = (0..50u64)
        .map(|i| {
            let content = format!(
                "{} {} (item {i})",
                sentences[i as usize % sentences.len()],
                sentences[(i as usize * 7 + 3) % sentences.len()]
            );
            Entry {
                seq: i + 1,
                client_entry_id: None,
                role: if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                tokens: estimate_tokens(&content),
                content,
                created_at: Millis(0),
                occurred_at: Millis(0),
                name: None,
                metadata: Default::default(),
            }
        })
        .collect();
    let n = 2_000;
    let t0 = Instant::now();
    let mut recap = String::new();
    for _ in 0..n {
        recap = Extractive.summarise(&entries, 512).text;
    }
    let level_one = t0.elapsed();
    let children: Vec<Entry> = (0..4u64)
        .map(|i| Entry {
            seq: i + 1,
            client_entry_id: None,
            role: Role::Assistant,
            tokens: estimate_tokens(&recap),
            content: recap.clone(),
            created_at: Millis(0),
            occurred_at: Millis(0),
            name: None,
            metadata: Default::default(),
        })
        .collect();
    let t0 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(Extractive.summarise_recaps(&children, 512));
    }
    let roll_up = t0.elapsed();
    println!(
        "Extractive summariser alone: {:.0} µs a 50-entry segment ({} estimated tokens in, {} out), {:.0} µs a roll-up of four recaps",
        level_one.as_secs_f64() * 1e6 / f64::from(n),
        entries.iter().map(|e| e.tokens).sum::<u32>(),
        estimate_tokens(&recap),
        roll_up.as_secs_f64() * 1e6 / f64::from(n),
    );
}

struct Bench {
    store: Store,
    summariser: Arc<Summariser>,
    _app: App,
    _dir: tempfile::TempDir,
}

impl Bench {
    async fn new(base: &str) -> Bench {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_, app, store, summariser) = common::openai_summariser(dir.path(), base).await;
        Bench {
            store,
            summariser,
            _app: app,
            _dir: dir,
        }
    }

    /// `n` closed segments of ten entries each, ready for a pass.
    async fn segments(&self, n: usize) -> Vec<SegmentId> {
        let tenant = Tenant::default();
        let policy = archivist::model::SegmentPolicy {
            max_entries: 10,
            max_tokens: 1_000_000,
            max_gap: None,
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
                    occurred_at: None,
                    name: None,
                    metadata: Default::default(),
                })
                .collect();
            let out = self
                .store
                .append(&tenant, &session, entries, policy, 0)
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

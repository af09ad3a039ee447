//! The memory tree.
//!
//! Run: `cargo bench --bench tree` (add `-- --max N` to stop at sessions of
//! N entries; the default builds 1,000, 100,000 and 1,000,000).
//!
//! 1. Provider input spent per 1,000 entries: level-1 recaps alone, with
//!    carried context, and with roll-ups (fanout 4) and carried context;
//!    counted as estimated tokens of every request a fake OpenAI-compatible
//!    provider (wiremock, in process) receives.
//! 2. GetContext at 1k, 100k and 1M entries in one session, every node
//!    summarised (extractive provider, recaps up to 120 tokens), with a
//!    2,000-token budget: latency
//!    (median and p99 of 200 calls), the peak memory the calls add (VmHWM
//!    reset before them), and the cover's size in items.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archivist::config::{Config, ProviderKind};
use archivist::internals::{App, Budget};
use archivist::model::{Millis, NewEntry, Role, SessionName, Tenant};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// The GetContext budget measured: 2,000 tokens, the default recent
/// window, and the default message limit.
const BUDGET: Budget = Budget {
    max_tokens: 2_000,
    max_bytes: 4 * 1024 * 1024,
    recent_tokens: 0,
};

fn main() {
    let mut max = 1_000_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--max" {
            max = args.next().and_then(|n| n.parse().ok()).expect("--max N");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("Provider input per 1,000 entries (50 entries a segment, ~40 tokens an entry):");
        let base = spend(0, 0).await;
        for (label, fanout, carry) in [
            ("level-1 recaps alone", 0, 0),
            ("with carried context (300)", 0, 300),
            ("with roll-ups (fanout 4) and carry", 4, 300),
        ] {
            let (tokens, requests) = spend(fanout, carry).await;
            println!(
                "  {label:<36} {tokens:>7} tokens in {requests:>3} requests ({:+.1} % over level 1 alone)",
                100.0 * (tokens as f64 / base.0 as f64 - 1.0)
            );
        }

        println!("GetContext with a 2,000-token budget, every node summarised:");
        for entries in [1_000usize, 100_000, 1_000_000] {
            if entries > max {
                break;
            }
            context_at(entries).await;
        }
    });
}

/// Counts the estimated tokens (bytes / 4) of every request's messages.
#[derive(Clone, Default)]
struct Spend {
    tokens: Arc<Mutex<(u64, u64)>>,
}

impl Respond for Spend {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = serde_json::from_slice(&request.body).expect("JSON");
        let bytes: usize = body["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|x| x["content"].as_str().map_or(0, str::len))
                    .sum()
            })
            .unwrap_or(0);
        let mut t = self.tokens.lock().expect("lock");
        t.0 += bytes as u64 / 4;
        t.1 += 1;
        // A recap of a realistic length: about 120 tokens.
        let text = "The team reviewed the billing migration. ".repeat(12);
        ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "id": "c", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        }))
    }
}

/// Tokens and requests spent on 1,000 entries.
async fn spend(fanout: u32, carry: u32) -> (u64, u64) {
    let counter = Spend::default();
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(counter.clone())
        .mount(&mock)
        .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        data_dir: dir.path().to_owned(),
        ..Config::default()
    };
    config.provider.kind = ProviderKind::Openai;
    config.provider.base_url = format!("{}/v1", mock.uri());
    config.memory.fanout = fanout;
    config.memory.carry_tokens = carry;
    let app = App::build(&config, None, "bench").await.expect("app");
    fill(&app, "s", 1_000, 1_000).await;
    // One pass at a time, as one session's recaps usually land: each finds
    // the summary before it to carry.
    drain(&app, 1).await;
    *counter.tokens.lock().expect("lock")
}

/// Appends `n` entries of about 160 bytes in batches of `batch`.
async fn fill(app: &App, session: &str, n: usize, batch: usize) {
    let session = SessionName::parse(session).expect("name");
    let policy = archivist::model::SegmentPolicy {
        max_entries: 50,
        max_tokens: 1_000_000,
        max_gap: None,
    };
    let mut done = 0;
    while done < n {
        let entries: Vec<NewEntry> = (done..(done + batch).min(n))
            .map(|i| NewEntry {
                client_entry_id: None,
                role: if i % 2 == 0 { Role::User } else { Role::Assistant },
                content: format!(
                    "Message {i}: the billing migration timed out again; we agreed to rerun it with a longer timeout and to page the owner if it fails."
                ),
                occurred_at: None,
                name: None,
                metadata: Default::default(),
            })
            .collect();
        done += entries.len();
        app.store()
            .append(&Tenant::default(), &session, entries, policy, 0)
            .await
            .expect("append");
    }
}

/// Runs every due pass, `concurrency` at a time, until nothing is left
/// PENDING.
async fn drain(app: &App, concurrency: u32) {
    loop {
        let due = app
            .store()
            .due_segments(Millis::now(), concurrency)
            .await
            .expect("due");
        if due.is_empty() {
            let b = app.store().backlog(None).await.expect("backlog");
            if b.pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let mut tasks = Vec::new();
        for id in due {
            let summariser = app.summariser().clone();
            tasks.push(tokio::spawn(
                async move { summariser.run_or_join(id).await },
            ));
        }
        for t in tasks {
            t.await.expect("joined");
        }
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn context_at(entries: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config {
        data_dir: dir.path().to_owned(),
        ..Config::default()
    };
    // Recaps of about the length an LLM writes (the extractive default of
    // 512 tokens is a ceiling, not a length).
    config.provider.max_output_tokens = 120;
    let app = App::build(&config, None, "bench").await.expect("app");
    let started = Instant::now();
    fill(&app, "s", entries, 1_000).await;
    app.store()
        .close_open_segment(&Tenant::default(), &SessionName::parse("s").expect("name"))
        .await
        .expect("close");
    drain(&app, 64).await;
    let built = started.elapsed();
    let session = SessionName::parse("s").expect("name");
    // Warm the reader pool and the page cache, then reset the peak.
    for _ in 0..5 {
        app.store()
            .context(&Tenant::default(), &session, BUDGET)
            .await
            .expect("context");
    }
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_kib("VmRSS:");
    let mut times = Vec::with_capacity(200);
    let mut items = 0;
    let mut truncated = false;
    for _ in 0..200 {
        let t = Instant::now();
        let ctx = app
            .store()
            .context(&Tenant::default(), &session, BUDGET)
            .await
            .expect("context");
        times.push(t.elapsed());
        items = ctx.items.len();
        truncated = ctx.truncated;
    }
    let peak = status_kib("VmHWM:");
    times.sort();
    println!(
        "  {entries:>9} entries: median {:>7.1} µs, p99 {:>7.1} µs, peak +{} KiB over {} KiB, {items} items{}, (built in {:.1} s)",
        times[times.len() / 2].as_secs_f64() * 1e6,
        times[times.len() * 99 / 100].as_secs_f64() * 1e6,
        peak.saturating_sub(before),
        before,
        if truncated { ", truncated" } else { "" },
        built.as_secs_f64()
    );
}

//! Draining one backlog with 1, 2 and 3 replicas: real `archivist serve`
//! processes on one PostgreSQL database (a fresh one per round, on
//! `ARCHIVIST_BENCH_PG_URL`, by default the local server), each at the
//! default reconciler concurrency (4), against one fake provider (a child
//! process) that answers after a fixed latency and counts what it is sent.
//!
//! Run: `cargo bench --bench replicas` (`-- --segments N`,
//! `--latency-ms N`, `--replicas 1,2,3`). Each round appends the segments
//! through the first replica (one entry each, so each closes at once) and
//! times until all are SUMMARISED; sends per segment come from the
//! provider's count.

mod common;

use common::Server;

use std::time::{Duration, Instant};

use archivist::pb;

async fn start(url: &str, provider: &str) -> Server {
    let base_url = format!("{provider}/v1");
    let env = [
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", url),
        ("ARCHIVIST_PROVIDER_KIND", "openai"),
        ("ARCHIVIST_PROVIDER_BASE_URL", &base_url),
        ("ARCHIVIST_PROVIDER_CHECK_ON_START", "false"),
        // Level-1 segments only: the figures are of the segments appended.
        ("ARCHIVIST_MEMORY_FANOUT", "0"),
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1"),
    ];
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_archivist"));
    common::start_server(binary, &["--allow-provider-change"], &env).await
}

struct Round {
    replicas: usize,
    elapsed: Duration,
    sends: u64,
}

async fn round(replicas: usize, segments: usize, provider: &str) -> Option<Round> {
    let db = common::pg_database(&format!("drain{replicas}")).await?;
    let mut servers = Vec::new();
    for _ in 0..replicas {
        servers.push(start(&db.url, provider).await);
    }
    let mut client = archivist::client::connect(&servers[0].address)
        .await
        .expect("connect");
    let before = common::provider_requests(provider).await;
    let started = Instant::now();
    let mut next = 0;
    while next < segments {
        let n = (segments - next).min(500);
        client
            .append_entries(pb::AppendEntriesRequest {
                session_id: format!("drain-{}", next / 500),
                entries: (next..next + n)
                    .map(|i| pb::NewEntry {
                        client_entry_id: String::new(),
                        role: pb::Role::User.into(),
                        content: format!("Entry {i}: the agent asked about the migration."),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .await
            .expect("append");
        next += n;
    }
    let progress = std::env::var_os("BENCH_PROGRESS").is_some();
    let mut shown = Instant::now();
    loop {
        let backlog = client
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner();
        if backlog.summarised as usize >= segments {
            break;
        }
        if progress && shown.elapsed() >= Duration::from_millis(500) {
            shown = Instant::now();
            eprintln!(
                "    {:>5.2} s: {} summarised, {} pending",
                started.elapsed().as_secs_f64(),
                backlog.summarised,
                backlog.pending
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the drain did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let sends = common::provider_requests(provider).await - before;
    drop(servers);
    drop(db);
    Some(Round {
        replicas,
        elapsed,
        sends,
    })
}

fn main() {
    if common::serve_if_provider() {
        return;
    }
    let mut segments = 600usize;
    let mut latency_ms = 100u64;
    let mut counts = vec![1usize, 2, 3];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--segments" => segments = args.next().and_then(|n| n.parse().ok()).expect("N"),
            "--latency-ms" => latency_ms = args.next().and_then(|n| n.parse().ok()).expect("N"),
            "--replicas" => {
                counts = args
                    .next()
                    .expect("a list")
                    .split(',')
                    .map(|n| n.parse().expect("a number"))
                    .collect()
            }
            _ => {}
        }
    }
    let rt = common::runtime();
    rt.block_on(async {
        let (_provider, base) = common::spawn_provider(latency_ms);
        println!(
            "Drain of {segments} segments on PostgreSQL, provider latency {latency_ms} ms, \
             reconciler concurrency 4 per replica:"
        );
        let mut one: Option<f64> = None;
        for k in counts {
            let Some(r) = round(k, segments, &base).await else {
                return;
            };
            let rate = segments as f64 / r.elapsed.as_secs_f64();
            let ideal = 4.0 * r.replicas as f64 / (latency_ms.max(1) as f64 / 1000.0);
            let speedup = match one {
                Some(base_rate) => format!("{:.2}x one replica", rate / base_rate),
                None => {
                    one = Some(rate);
                    "1.00x".to_owned()
                }
            };
            println!(
                "  {} replica(s): {:>6.2} s, {rate:>6.1} segments/s ({speedup}; {:.0} % of \
                 replicas x concurrency / latency), {:.3} sends per segment ({} sends)",
                r.replicas,
                r.elapsed.as_secs_f64(),
                100.0 * rate / ideal,
                r.sends as f64 / segments as f64,
                r.sends
            );
        }
    });
}

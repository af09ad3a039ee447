//! AppendEntries over real gRPC on loopback, against the real `archivist`
//! binary in its own process (so the figures are the server's, not shared
//! with the load generator's runtime).
//!
//! Run: `cargo bench --bench ratios` (the ratios to the transport that
//! issue 17 asks for; `cargo bench --bench append` has the SQLite and
//! PostgreSQL append rates). Options after `--`:
//!
//! - `--round-seconds F`: the length of each h2load round (default 1);
//! - `--repeat N`: rounds per figure (default 3; the median counts);
//! - `--before PATH` (repeatable): also start the `archivist` binary at
//!   PATH (an older build, say) and run every h2load round against every
//!   server, side by side, taking turns at going first; the servers are
//!   named `before-1`, `before-2`, ... in the order given, then `this`;
//! - `--stages`: instead of the ratios, where a single-entry append's time
//!   goes at 8×1 (below);
//! - `--embedder-hanging`: instead of `this`, two servers of this build:
//!   `off` (no `[embedding]`) and `hanging` (`[embedding]` on, pointed at
//!   a fake embedder in this process that reads each request and never
//!   answers, so every batch waits out `retry.attempt_timeout`, its
//!   retries and the breaker, at the defaults), and the append rates of
//!   `hanging` over `off` at the end. Every entry appended to `hanging` is
//!   owed a vector (a row written with it), so the ratio is the price of
//!   owing plus whatever the stuck embedder costs appends;
//! - `--unindexed PATH`: also start PATH, this code built with the
//!   measurement-only feature `measure-unindexed` (appended entries left out
//!   of the search index; docs/benchmarks.md says how to build it), named
//!   `unindexed`, and print at the end the append rates of `this` over it:
//!   what the index costs an append;
//! - `--search-under-appends`: instead of the ratios, Search's latency on
//!   each server (`this`, and `unindexed` if given) alone and while h2load
//!   appends single entries at 8×1 to the same tenant (below);
//! - `--pg`: every server on PostgreSQL (`storage.backend = "postgres"`, a
//!   fresh database each on `ARCHIVIST_BENCH_PG_URL`, by default the local
//!   server) instead of SQLite.
//!
//! After the rounds, each SQLite server's data directory in bytes per
//! 1,000 entries stored (the database file, and with the write-ahead log),
//! the bench's texts with the index (or without, `unindexed`).
//!
//! **Ratios to the transport** (needs `h2load`, Debian's nghttp2-client; the
//! bench says how to install it and skips this part when it is missing).
//! Against one server, in one run, h2load sends grpc.health.v1 Check (the
//! same transport, listener and call-recording layer, doing no work: the
//! baseline) and AppendEntries of 1 and 10 entries, over 8 connections with
//! 1 and then 4 calls in flight on each (8×1, 8×4), in short rounds taken
//! in turn (health, 1 entry, 10 entries, health, ...); each figure is the
//! median of its rounds, printed with its ratio to the health checks' at
//! the same load, and the p50 and p99 latency h2load saw over all of its
//! calls, and the CPU each call cost the server (its threads' run time in
//! `/proc`) and h2load (its rusage): at 8×1 on two shared cores the rates
//! follow the CPU per call. The machine is shared and noisy: ratios from
//! one run are what count, and the interleaving spreads a burst of noise
//! over every figure.
//! Segments are large enough that no recap runs. After each round the bench
//! counts what the session stored (an HTTP 200 says nothing of
//! grpc-status), so every call in these figures was stored.
//!
//! **Stages** (`--stages`), at 8×1 against one server, by difference
//! between calls that stop at successive stages, interleaved the same way:
//! grpc.health.v1 Check (the transport: HTTP/2, tonic, the layers, the
//! answer), an AppendEntries refused at validation (adds decoding, the
//! tenant, the gate's slot, the checks and an error answer), and a stored
//! single-entry AppendEntries (adds the hop to the writer thread, the
//! transaction, the commit and the answer's wake-up). Then the store alone,
//! in this process: 8 tasks, each appending single entries to a session of
//! its own through `Store::append` (the hop, the transaction and the group
//! commit, without gRPC).
//!
//! **Search under appends** (`--search-under-appends`): on each server, a
//! load of 10,000 entries, then one client searching one after another
//! (`"billing migration"`, limit 10: every text holds both words) for
//! `--round-seconds` × `--repeat` seconds alone, then as long again while
//! h2load appends single entries at 8×1 to the same tenant; p50 and p99 of
//! each, and the append rate beside the searches. On SQLite each search
//! under appends finds a tail and has the writer index it first (fts.rs):
//! this is what read-your-writes costs a search.
//!
//! Every acknowledged append is durable across kill -9 (the tests check
//! that), so the figures are for the durable path.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use prost::Message;

mod common;

use common::fake_embedder::FakeEmbedder;
use common::{BIG_SEGMENTS, Server, request};

// ---- h2load: ratios to the transport ---------------------------------------

/// Connections h2load opens.
const CONNECTIONS: usize = 8;
/// Calls of each warm-up round (which also sizes the round after it).
const WARM_UP_CALLS: u64 = 1000;
/// grpc.health.v1 Check with an empty HealthCheckRequest (the whole
/// server), as one gRPC frame: uncompressed, length 0.
const HEALTH_FRAME: [u8; 5] = [0; 5];
const HEALTH_PATH: &str = "/grpc.health.v1.Health/Check";
const APPEND_PATH: &str = "/archivist.v1.Archivist/AppendEntries";

/// One h2load round: calls/s, how long each call took (µs), and the CPU
/// each call cost the server and h2load (µs; the server's is None where
/// `/proc` does not say).
struct Round {
    rate: f64,
    /// Entries the round stored (warm-up included); 0 for other calls.
    entries: u64,
    took_us: Vec<f64>,
    server_cpu_us: Option<f64>,
    h2load_cpu_us: f64,
}

/// `message` as one gRPC frame.
fn frame(message: &impl Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Whether h2load can be run.
fn have_h2load() -> bool {
    Command::new("h2load")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Sends `calls` requests of `body` to `path` with h2load, `CONNECTIONS`
/// connections with `streams` calls in flight on each; panics unless every
/// one had an HTTP 2xx answer.
fn h2load(server: &Server, path: &str, body: &[u8], calls: u64, streams: usize) -> Round {
    let address = &server.address;
    let data = tempfile::NamedTempFile::new().expect("frame file");
    std::fs::write(data.path(), body).expect("write frame");
    let log = tempfile::NamedTempFile::new().expect("log file");
    let (server_cpu, h2load_cpu) = (server.cpu_time(), common::children_cpu_time());
    let out = Command::new("h2load")
        .args(["-n", &calls.to_string()])
        .args(["-c", &CONNECTIONS.to_string()])
        .args(["-m", &streams.to_string()])
        .args(["-t", "1", "--data"])
        .arg(data.path())
        .arg("--log-file")
        .arg(log.path())
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!("{address}{path}"))
        .output()
        .expect("run h2load");
    let per_call = |cpu: Duration| cpu.as_secs_f64() * 1e6 / calls as f64;
    let server_cpu_us = server_cpu
        .zip(server.cpu_time())
        .map(|(before, after)| per_call(after.saturating_sub(before)));
    let h2load_cpu_us = per_call(common::children_cpu_time().saturating_sub(h2load_cpu));
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text
        .lines()
        .find(|l| l.starts_with("finished in"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.trim_end_matches(" req/s").parse::<f64>().ok())
        .unwrap_or_else(|| panic!("h2load said:\n{text}"));
    let ok = text
        .lines()
        .find(|l| l.starts_with("status codes:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(ok, Some(calls), "h2load: every call answered 2xx:\n{text}");
    // Per request: start (µs since the epoch), HTTP status, µs to the end
    // of its answer.
    let took_us: Vec<f64> = std::fs::read_to_string(log.path())
        .expect("h2load log")
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse().ok())
        .collect();
    assert!(!took_us.is_empty(), "h2load logged no requests");
    Round {
        rate,
        entries: 0,
        took_us,
        server_cpu_us,
        h2load_cpu_us,
    }
}

/// What a round sends.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    Health,
    /// An AppendEntries refused at validation (a session id with a space):
    /// decoded, checked and answered, never sent to the store.
    Refused,
    Append(usize),
}

impl Call {
    const ALL: [Call; 3] = [Call::Health, Call::Append(1), Call::Append(10)];

    fn label(self) -> String {
        match self {
            Call::Health => "health Check (baseline)".to_owned(),
            Call::Refused => "AppendEntries, refused".to_owned(),
            Call::Append(1) => "AppendEntries, 1 entry".to_owned(),
            Call::Append(n) => format!("AppendEntries, {n} entries"),
        }
    }
}

/// The entries stored in `session`.
async fn stored(server: &Server, session: &str) -> u64 {
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    common::list_nodes(&mut client, session, &[])
        .await
        .iter()
        .map(|s| u64::from(s.entry_count))
        .sum()
}

/// A warm-up round, then a measured one of about `seconds` (sized by the
/// warm-up's rate); for appends, into a session of their own (`tag`), and
/// checks that it stored every entry sent (no idempotency keys, so each
/// call stores its entries).
async fn measure(server: &Server, call: Call, streams: usize, seconds: f64, tag: &str) -> Round {
    let (path, body, session) = match call {
        Call::Health => (HEALTH_PATH, HEALTH_FRAME.to_vec(), None),
        Call::Refused => {
            let mut req = request("not a session id", 1, 0);
            req.entries[0].client_entry_id.clear();
            (APPEND_PATH, frame(&req), None)
        }
        Call::Append(batch) => {
            let session = format!("ratio-{tag}");
            let mut req = request(&session, batch, 0);
            for e in &mut req.entries {
                e.client_entry_id.clear();
            }
            (APPEND_PATH, frame(&req), Some((session, batch)))
        }
    };
    let warm = h2load(server, path, &body, WARM_UP_CALLS, streams);
    let calls = ((warm.rate * seconds) as u64).max(WARM_UP_CALLS);
    let mut round = h2load(server, path, &body, calls, streams);
    if let Some((session, batch)) = session {
        let sent = (WARM_UP_CALLS + calls) * batch as u64;
        assert_eq!(
            stored(server, &session).await,
            sent,
            "{session}: every entry sent is stored"
        );
        round.entries = sent;
    }
    round
}

/// Each server's rounds: (calls in flight per connection, call, round).
type Figures = Vec<(usize, Call, Round)>;

/// What a run measures: the calls in flight per connection, and the calls
/// taken in turn at each.
struct Plan<'a> {
    loads: &'a [usize],
    calls: &'a [Call],
    seconds: f64,
    repeat: usize,
}

/// Runs every round `repeat` times against each server, interleaved: at
/// each load, health, 1 entry, 10 entries, health, ...; at each step the
/// servers take turns going first.
async fn ratio_rounds(servers: &[(&str, &Server)], plan: &Plan<'_>) -> Vec<Figures> {
    let (seconds, repeat) = (plan.seconds, plan.repeat);
    let mut figures: Vec<Figures> = servers.iter().map(|_| Vec::new()).collect();
    let mut step = 0usize;
    for &streams in plan.loads {
        for rep in 0..repeat {
            for &call in plan.calls {
                let mut order: Vec<usize> = (0..servers.len()).collect();
                order.rotate_left(step % servers.len());
                step += 1;
                for s in order {
                    let (name, server) = servers[s];
                    let tag = format!("{name}-{streams}-{rep}-{step}");
                    let round = measure(server, call, streams, seconds, &tag).await;
                    figures[s].push((streams, call, round));
                }
            }
        }
    }
    figures
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Prints one server's figures: for each load and call, the median rate of
/// its rounds and that as a percentage of the health checks' median at the
/// same load; p50 and p99 over every call of its rounds; the median CPU
/// per call of the server and of h2load.
fn print_figures(name: &str, figures: &Figures, plan: &Plan<'_>) {
    for &streams in plan.loads {
        let of = |call: Call| {
            figures
                .iter()
                .filter(move |(s, c, _)| *s == streams && *c == call)
                .map(|(_, _, r)| r)
        };
        let baseline = median(of(Call::Health).map(|r| r.rate).collect());
        for &call in plan.calls {
            let mut took: Vec<f64> = of(call).flat_map(|r| r.took_us.iter().copied()).collect();
            took.sort_by(f64::total_cmp);
            let r = median(of(call).map(|r| r.rate).collect());
            let server_cpu: Vec<f64> = of(call).filter_map(|r| r.server_cpu_us).collect();
            let server_cpu = if server_cpu.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1}", median(server_cpu))
            };
            println!(
                "  {name:<8} {CONNECTIONS}×{streams:<3} {:<30} {r:>9.0} {:>7.1} % {:>8.0} {:>8.0} {server_cpu:>8} {:>8.1}",
                call.label(),
                100.0 * r / baseline,
                common::percentile(&took, 0.5),
                common::percentile(&took, 0.99),
                median(of(call).map(|r| r.h2load_cpu_us).collect()),
            );
        }
    }
}

/// The servers to compare: each older build given, then this one (or,
/// with a hanging embedder, this one without and with `[embedding]`).
async fn start_servers(
    before: &[PathBuf],
    hanging: Option<&FakeEmbedder>,
    unindexed: Option<&Path>,
    pg: &mut Vec<common::PgDatabase>,
) -> Vec<(String, Server)> {
    let mut servers = Vec::new();
    for (i, path) in before.iter().enumerate() {
        let name = format!("before-{}", i + 1);
        let server = start(path, &BIG_SEGMENTS, &name, pg).await;
        servers.push((name, server));
    }
    if let Some(path) = unindexed {
        let server = start(path, &BIG_SEGMENTS, "unindexed", pg).await;
        servers.push(("unindexed".to_owned(), server));
    }
    let this = Path::new(env!("CARGO_BIN_EXE_archivist"));
    let Some(fake) = hanging else {
        let server = start(this, &BIG_SEGMENTS, "this", pg).await;
        servers.push(("this".to_owned(), server));
        return servers;
    };
    let server = start(this, &BIG_SEGMENTS, "off", pg).await;
    servers.push(("off".to_owned(), server));
    let mut env = BIG_SEGMENTS.to_vec();
    env.extend([
        ("ARCHIVIST_EMBEDDING_KIND", "openai"),
        ("ARCHIVIST_EMBEDDING_BASE_URL", fake.url.as_str()),
        ("ARCHIVIST_EMBEDDING_MODEL", "fake"),
    ]);
    let server = start(this, &env, "hanging", pg).await;
    servers.push(("hanging".to_owned(), server));
    servers
}

/// Starts `binary` with `env`: on SQLite, or with `--pg` (a database in
/// `pg`, kept until the run ends) on PostgreSQL.
async fn start(
    binary: &Path,
    env: &[(&str, &str)],
    name: &str,
    pg: &mut Vec<common::PgDatabase>,
) -> Server {
    if !PG.load(std::sync::atomic::Ordering::Relaxed) {
        return common::start_server(binary, &[], env).await;
    }
    let db = common::pg_database(&name.replace('-', "_"))
        .await
        .expect("PostgreSQL for --pg");
    let mut env = env.to_vec();
    env.extend([
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
    ]);
    let server = common::start_server(binary, &[], &env).await;
    pg.push(db);
    server
}

/// `--pg`: every server on PostgreSQL.
static PG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn ratios(
    before: &[PathBuf],
    seconds: f64,
    repeat: usize,
    hanging: bool,
    unindexed: Option<&Path>,
) {
    println!(
        "Ratios to the transport: h2load, {CONNECTIONS} connections × calls in flight on each; {repeat} rounds of ~{seconds} s (each after a warm-up) per figure, interleaved."
    );
    println!(
        "calls/s: the median round; ratio: that over the median of grpc.health.v1 Check on the same server at the same load; p50/p99 over every call of the rounds; srv/h2l µs: CPU per call of the server and of h2load (median round)."
    );
    if !have_h2load() {
        println!(
            "  (h2load not found, so these are skipped: `apt-get install nghttp2-client` provides it)"
        );
        return;
    }
    let plan = Plan {
        loads: &[1, 4],
        calls: &Call::ALL,
        seconds,
        repeat,
    };
    let fake = hanging.then(FakeEmbedder::hanging);
    let figures = run_and_print(before, &plan, fake.as_ref(), unindexed).await;
    for (i, path) in before.iter().enumerate() {
        println!("  (before-{}: {})", i + 1, path.display());
    }
    if let Some(fake) = &fake {
        println!(
            "Appends beside a hanging embedder: the median round's calls/s of `hanging` over `off`, and each server's ratio to its own health checks (which cancels some of a shared machine's noise); the fake was sent {} requests and answered none.",
            fake.counts
                .requests
                .load(std::sync::atomic::Ordering::SeqCst)
        );
        print_pair(&figures, &plan, "off", "hanging");
    }
    if let Some(path) = unindexed {
        println!(
            "What the index costs an append: the median round's calls/s of `this` over `unindexed` ({}), and each server's ratio to its own health checks.",
            path.display()
        );
        print_pair(&figures, &plan, "unindexed", "this");
    }
}

/// The append rates of server `b` over server `a`, load by load.
fn print_pair(figures: &[(String, Figures)], plan: &Plan<'_>, a: &str, b: &str) {
    let of = |name: &str| &figures.iter().find(|(n, _)| n == name).expect(name).1;
    let (fa, fb) = (of(a), of(b));
    let rate = |f: &Figures, streams: usize, call: Call| {
        median(
            f.iter()
                .filter(|(s, c, _)| *s == streams && *c == call)
                .map(|(_, _, r)| r.rate)
                .collect(),
        )
    };
    for &streams in plan.loads {
        let (ha, hb) = (
            rate(fa, streams, Call::Health),
            rate(fb, streams, Call::Health),
        );
        for &call in plan.calls {
            let (rb, ra) = (rate(fb, streams, call), rate(fa, streams, call));
            println!(
                "  {CONNECTIONS}×{streams:<3} {:<30} {a} {ra:>9.0}  {b} {rb:>9.0}  {:>6.1} %;  of health: {a} {:>5.1} %, {b} {:>5.1} %",
                call.label(),
                100.0 * rb / ra,
                100.0 * ra / ha,
                100.0 * rb / hb,
            );
        }
    }
}

/// Each SQLite server's data directory per 1,000 entries it stored.
fn print_disk(servers: &[(&str, &Server)], figures: &[Figures]) {
    if PG.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    println!(
        "Data directory per 1,000 entries stored (the bench's texts): the database files (main and search), and with the write-ahead logs."
    );
    for ((name, server), figures) in servers.iter().zip(figures) {
        let entries: u64 = figures.iter().map(|(_, _, r)| r.entries).sum();
        let (mut db, mut all) = (0u64, 0u64);
        for file in std::fs::read_dir(server.data_dir()).expect("data directory") {
            let file = file.expect("data directory entry");
            let len = file.metadata().map_or(0, |m| m.len());
            all += len;
            // The main file and the search file beside it (issue 38).
            if ["archivist.sqlite3", "archivist-search.sqlite3"]
                .iter()
                .any(|name| file.file_name() == *name)
            {
                db += len;
            }
        }
        let per = |bytes: u64| bytes as f64 * 1000.0 / entries.max(1) as f64;
        println!(
            "  {name:<10} {entries:>9} entries  {:>9.0} B (database)  {:>9.0} B (with the log)",
            per(db),
            per(all)
        );
    }
}

/// Starts the servers, runs `plan`'s rounds against them and prints each
/// server's figures; returns them by server name.
async fn run_and_print(
    before: &[PathBuf],
    plan: &Plan<'_>,
    hanging: Option<&FakeEmbedder>,
    unindexed: Option<&Path>,
) -> Vec<(String, Figures)> {
    let mut pg = Vec::new();
    let started = start_servers(before, hanging, unindexed, &mut pg).await;
    let servers: Vec<(&str, &Server)> = started.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let figures = ratio_rounds(&servers, plan).await;
    println!(
        "  {:<8} {:<5} {:<30} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "server", "load", "call", "calls/s", "ratio", "p50 µs", "p99 µs", "srv µs", "h2l µs"
    );
    for ((name, _), figures) in servers.iter().zip(&figures) {
        print_figures(name, figures, plan);
    }
    print_disk(&servers, &figures);
    started
        .iter()
        .map(|(name, _)| name.clone())
        .zip(figures)
        .collect()
}

/// Searches one after another on `client` until `done`, at least once,
/// each finding the load (`finds`) or, on the unindexed build, nothing;
/// each one's time in µs.
async fn searches(
    client: &mut archivist::client::Client,
    finds: bool,
    done: impl Fn() -> bool,
) -> Vec<f64> {
    let mut took = Vec::new();
    loop {
        let start = std::time::Instant::now();
        let found = client
            .search(archivist::pb::SearchRequest {
                query: "billing migration".to_owned(),
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("search")
            .into_inner();
        took.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(
            found.hits.is_empty() != finds,
            "the search finds the load (unless the server never indexes it)"
        );
        if done() {
            return took;
        }
    }
}

/// `--search-under-appends`: Search's latency alone and beside appends.
async fn search_under_appends(seconds: f64, repeat: usize, unindexed: Option<&Path>) {
    println!(
        "Search under appends: one client searching in a loop, alone and while h2load appends single entries at {CONNECTIONS}×1 to the same tenant, ~{:.0} s each.",
        seconds * repeat as f64
    );
    if !have_h2load() {
        println!(
            "  (h2load not found, so this is skipped: `apt-get install nghttp2-client` provides it)"
        );
        return;
    }
    let mut pg = Vec::new();
    let started = start_servers(&[], None, unindexed, &mut pg).await;
    let span = Duration::from_secs_f64(seconds * repeat as f64);
    for (name, server) in &started {
        let mut load = request("search-load", 10, 0);
        for e in &mut load.entries {
            e.client_entry_id.clear();
        }
        h2load(server, APPEND_PATH, &frame(&load), 1000, 1);
        let mut client = archivist::client::connect(&server.address)
            .await
            .expect("connect");
        // The load indexed (a search indexes what waits), then alone; the
        // unindexed build never finds it.
        let finds = name != "unindexed";
        searches(&mut client, finds, || true).await;
        let until = std::time::Instant::now() + span;
        let mut alone = searches(&mut client, finds, || std::time::Instant::now() >= until).await;
        // Beside appends: h2load on a thread of its own, sized by a
        // warm-up to last about as long.
        let mut single = request("search-appends", 1, 0);
        single.entries[0].client_entry_id.clear();
        let body = frame(&single);
        let warm = h2load(server, APPEND_PATH, &body, WARM_UP_CALLS, 1);
        let calls = ((warm.rate * span.as_secs_f64()) as u64).max(WARM_UP_CALLS);
        let finished = std::sync::atomic::AtomicBool::new(false);
        let mut beside = Vec::new();
        // h2load blocks its thread; the searches run on this one meanwhile.
        let appends = std::thread::scope(|scope| {
            let appends = scope.spawn(|| {
                let round = h2load(server, APPEND_PATH, &body, calls, 1);
                finished.store(true, std::sync::atomic::Ordering::SeqCst);
                round
            });
            beside = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(searches(&mut client, finds, || {
                    finished.load(std::sync::atomic::Ordering::SeqCst)
                }))
            });
            appends.join().expect("h2load thread")
        });
        alone.sort_by(f64::total_cmp);
        beside.sort_by(f64::total_cmp);
        println!(
            "  {name:<10} alone: {} searches, p50 {:.0} µs, p99 {:.0} µs;  beside {:.0} appends/s: {} searches, p50 {:.0} µs, p99 {:.0} µs",
            alone.len(),
            common::percentile(&alone, 0.5),
            common::percentile(&alone, 0.99),
            appends.rate,
            beside.len(),
            common::percentile(&beside, 0.5),
            common::percentile(&beside, 0.99),
        );
    }
}

/// `--stages`: calls that stop at successive stages, at 8×1, then the
/// store alone in this process.
async fn stages(before: &[PathBuf], seconds: f64, repeat: usize) {
    println!(
        "Stages of a single-entry append at {CONNECTIONS}×1: h2load, {repeat} interleaved rounds of ~{seconds} s per figure; each stage's cost is the difference of p50s."
    );
    if !have_h2load() {
        println!(
            "  (h2load not found, so this is skipped: `apt-get install nghttp2-client` provides it)"
        );
        return;
    }
    let plan = Plan {
        loads: &[1],
        calls: &[Call::Health, Call::Refused, Call::Append(1)],
        seconds,
        repeat,
    };
    for (name, figures) in run_and_print(before, &plan, None, None).await {
        let p50 = |call: Call| {
            median(
                figures
                    .iter()
                    .filter(|(_, c, _)| *c == call)
                    .flat_map(|(_, _, r)| r.took_us.iter().copied())
                    .collect(),
            )
        };
        let (health, refused, stored) =
            (p50(Call::Health), p50(Call::Refused), p50(Call::Append(1)));
        println!(
            "  {name:<8} p50: transport {health:.0} µs; + decoding, tenant, slot, checks {:.0} µs; + the store and the answer's wake-up {:.0} µs",
            refused - health,
            stored - refused
        );
    }
    store_alone(seconds, repeat).await;
}

/// The store alone: `CONNECTIONS` tasks appending single entries, each to
/// a session of its own, through `Store::append` on a fresh database.
async fn store_alone(seconds: f64, repeat: usize) {
    use archivist::internals::Store;
    use archivist::model::{NewEntry, Role, SegmentPolicy, SessionName, Tenant};
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path()).await.expect("store");
    let policy = SegmentPolicy {
        max_entries: 1_000_000,
        max_tokens: 4_000_000_000,
        max_gap: None,
    };
    let mut took: Vec<f64> = Vec::new();
    let mut rates = Vec::new();
    for round in 0..=repeat {
        let until = std::time::Instant::now() + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..CONNECTIONS)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let session = SessionName::parse(&format!("alone-{t}")).expect("name");
                    let mut took = Vec::new();
                    while std::time::Instant::now() < until {
                        let entry = NewEntry {
                            client_entry_id: None,
                            role: Role::User,
                            content: "the agent asked about the billing migration".to_owned(),
                            occurred_at: None,
                            name: None,
                            metadata: Default::default(),
                        };
                        let start = std::time::Instant::now();
                        store
                            .append(&Tenant::default(), &session, vec![entry], policy, 0)
                            .await
                            .expect("append");
                        took.push(start.elapsed().as_secs_f64() * 1e6);
                    }
                    took
                })
            })
            .collect();
        let mut calls = 0;
        for task in tasks {
            let t = task.await.expect("task");
            calls += t.len();
            // The first round warms up.
            if round > 0 {
                took.extend(t);
            }
        }
        if round > 0 {
            rates.push(calls as f64 / seconds);
        }
    }
    took.sort_by(f64::total_cmp);
    println!(
        "  store alone, in process, {CONNECTIONS} tasks: {:.0} appends/s, p50 {:.0} µs, p99 {:.0} µs",
        median(rates),
        common::percentile(&took, 0.5),
        common::percentile(&took, 0.99)
    );
}

fn main() {
    let mut round_seconds = 1.0;
    let mut repeat = 3;
    let mut before: Vec<PathBuf> = Vec::new();
    let mut only_stages = false;
    let mut hanging = false;
    let mut unindexed: Option<PathBuf> = None;
    let mut under_appends = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--round-seconds" => {
                round_seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--round-seconds F");
            }
            "--repeat" => {
                repeat = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|n| *n > 0)
                    .expect("--repeat N");
            }
            "--before" => before.push(args.next().expect("--before PATH").into()),
            "--stages" => only_stages = true,
            "--embedder-hanging" => hanging = true,
            "--unindexed" => {
                unindexed = Some(PathBuf::from(args.next().expect("--unindexed PATH")))
            }
            "--search-under-appends" => under_appends = true,
            "--pg" => PG.store(true, std::sync::atomic::Ordering::Relaxed),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    let rt = common::runtime();
    rt.block_on(async {
        if only_stages {
            stages(&before, round_seconds, repeat).await;
        } else if under_appends {
            search_under_appends(round_seconds, repeat, unindexed.as_deref()).await;
        } else {
            ratios(
                &before,
                round_seconds,
                repeat,
                hanging,
                unindexed.as_deref(),
            )
            .await;
        }
    });
}

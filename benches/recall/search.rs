//! `--search`: what a lexical Search of a subject's memory finds of the
//! facts planted in it, how fast it answers, and what its index costs,
//! against the real `archivist` binary over gRPC.
//!
//! **The tenant.** `--subjects K` subjects (default 3) share the size (the
//! tenant's entries in all). Each subject is one `fixture::generate`
//! timeline (its 20 facts, 5 updates and filler) cut into `SESSIONS`
//! sessions at even seqs, so that each opens with the user and a confirmed
//! fact's ask stays beside it; an update may land in a later session than
//! its fact, as a correction in a later conversation does. Every session
//! is appended with its subject, session k of up to `PARALLEL` subjects at
//! a time (a subject's sessions in order), in batches
//! of `BATCH` (the server's default cap), and the bench waits until every
//! recap is written. The other subjects hold the same kinds of facts with
//! other answers: the subject scope has to keep them out.
//!
//! **Quality.** Per fact, a Search of `fact.question` (the fact's own
//! words) and one of `fact.paraphrase`, scoped to its subject, limit 10,
//! the default levels (entries and segment recaps). A hit is relevant when
//! it is in the subject and `score::outcome` finds the fact's current
//! answer in it: the planted entry (the update's, for a changed fact), or
//! a recap that kept it. recall_any@k: the share of facts with a relevant
//! hit among the first k; NDCG@10 with binary relevance, the ideal being
//! every relevant text of the subject first (the one entry that holds the
//! answer, and the segment recaps that hold it, listed after the run);
//! corrected: of the changed facts, the share whose current value ranks
//! above the stale one (found, and the old value below it or absent).
//!
//! **Latency.** The quality queries and as many more as make
//! `--search-queries` (default 300), each a few words of a random entry of
//! a random subject, scoped to that subject: all of them once untimed,
//! then each once timed; p50 and p99 seen by the client over loopback.
//!
//! **Embeddings.** With `--embedder URL`, `semantic.rs` instead: the same
//! tenant and questions on a server with embeddings, in each mode.
//!
//! **Index.** SQLite: the FTS5 tables' pages (`dbstat`) over the entries;
//! PostgreSQL: the `tsv` columns (`pg_column_size`) and their GIN indexes
//! (`pg_relation_size`) over the entries. Both index the recaps too, so
//! the documents are also printed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use archivist::pb;

use super::fixture::{self, Fact, Rng, Subject};
use super::score::{self, Outcome, Returned, Source};
use super::{Options, common};

#[path = "embedder.rs"]
mod embedder;
#[path = "semantic.rs"]
mod semantic;

/// Sessions per subject.
const SESSIONS: usize = 30;
/// Hits asked of each search.
const LIMIT: u32 = 10;
/// Sessions appended at once.
const PARALLEL: usize = 4;
/// Entries per AppendEntries: the server's default `max_entries_per_call`.
const BATCH: usize = 1000;

/// The tenant of `size` entries: `k` subjects sharing them.
fn tenant(o: &Options, size: usize) -> Vec<Subject> {
    (0..o.subjects)
        .map(|s| {
            let entries = size / o.subjects + usize::from(s < size % o.subjects);
            Subject::new(
                format!("subject-{s}"),
                entries,
                fixture::session_seed(o.seed, size, s),
                SESSIONS,
            )
        })
        .collect()
}

/// What one hit is to the fact asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// In the subject, holding the current answer.
    Relevant,
    /// In the subject, holding only the old value.
    Stale,
    Other,
    /// In another subject's session: the scope let it through.
    Outside,
}

/// One search for one fact: its hits' marks in rank order, and how many
/// relevant texts the subject holds.
struct Ranking {
    marks: Vec<Mark>,
    /// For `--facts`: the query, the answer looked for, the first hit, and
    /// every hit (its mark, level, when it was said, its text's start).
    query: String,
    answer: String,
    first: Option<String>,
    shown: Vec<String>,
    relevant: usize,
    updated: bool,
    error: Option<String>,
}

impl Ranking {
    fn recall_any(&self, k: usize) -> f64 {
        f64::from(u8::from(
            self.marks.iter().take(k).any(|m| *m == Mark::Relevant),
        ))
    }

    fn ndcg(&self, k: usize) -> f64 {
        let gain = |i: usize| 1.0 / ((i + 2) as f64).log2();
        let dcg: f64 = (self.marks.iter().take(k).enumerate())
            .filter(|(_, m)| **m == Mark::Relevant)
            .map(|(i, _)| gain(i))
            .sum();
        let ideal: f64 = (0..self.relevant.min(k)).map(gain).sum();
        if ideal == 0.0 { 0.0 } else { dcg / ideal }
    }

    /// A changed fact's current value ranks above its old one.
    fn corrected(&self) -> bool {
        let at = |mark| self.marks.iter().position(|m| *m == mark);
        match (at(Mark::Relevant), at(Mark::Stale)) {
            (Some(current), Some(stale)) => current < stale,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// The quality figures of one kind of question over every fact.
struct Quality {
    at5: f64,
    at10: f64,
    ndcg10: f64,
    /// Changed facts whose current value ranked above the old one, of the
    /// changed facts.
    corrected: (usize, usize),
    outside: usize,
    errors: Vec<String>,
    /// The questions with no relevant hit in the first 5: the query, the
    /// answer looked for, and the first hit.
    misses: Vec<String>,
    /// The changed facts whose old value ranked above the current one:
    /// the query, the answer looked for, and every hit.
    uncorrected: Vec<String>,
}

fn quality(rankings: &[Ranking]) -> Quality {
    let updated: Vec<&Ranking> = rankings.iter().filter(|r| r.updated).collect();
    Quality {
        at5: score::mean(rankings.iter().map(|r| r.recall_any(5))),
        at10: score::mean(rankings.iter().map(|r| r.recall_any(10))),
        ndcg10: score::mean(rankings.iter().map(|r| r.ndcg(10))),
        corrected: (
            updated.iter().filter(|r| r.corrected()).count(),
            updated.len(),
        ),
        outside: rankings
            .iter()
            .map(|r| r.marks.iter().filter(|m| **m == Mark::Outside).count())
            .sum(),
        errors: rankings.iter().filter_map(|r| r.error.clone()).collect(),
        misses: rankings
            .iter()
            .filter(|r| r.recall_any(5) == 0.0)
            .map(|r| {
                format!(
                    "{:?} for {}: first hit {:?}",
                    r.query,
                    r.answer,
                    r.first.as_deref().unwrap_or("(none)")
                )
            })
            .collect(),
        uncorrected: updated
            .iter()
            .filter(|r| !r.corrected())
            .map(|r| {
                format!(
                    "{:?} for {}:\n      {}",
                    r.query,
                    r.answer,
                    r.shown.join("\n      ")
                )
            })
            .collect(),
    }
}

/// A backend to run on: its name and the server's environment.
struct Backend {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    /// Dropped after the server: the fresh PostgreSQL database.
    database: Option<common::PgDatabase>,
}

/// Everything measured for one backend and size.
struct Row {
    backend: &'static str,
    size: usize,
    facts: usize,
    question: Quality,
    paraphrase: Quality,
    /// Search latencies, µs, sorted; and the queries that failed.
    took_us: Vec<f64>,
    failed: Vec<String>,
    load: Duration,
    recaps: Duration,
    settled: bool,
    index: Option<Index>,
}

/// An index's size: its bytes, over the entries and documents.
struct Index {
    bytes: u64,
    entries: u64,
    documents: u64,
    note: String,
}

pub async fn run(o: &Options) {
    if let Some(url) = &o.embedder {
        return semantic::run(o, url).await;
    }
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_archivist"));
    let mut rows = Vec::new();
    for &size in &o.search_sizes {
        let started = Instant::now();
        let subjects = Arc::new(tenant(o, size));
        eprintln!(
            "[search] {size} entries: {} subjects of {SESSIONS} sessions generated in {:.1} s",
            subjects.len(),
            started.elapsed().as_secs_f64()
        );
        for backend in backends(o, size).await {
            let env: Vec<(&str, &str)> =
                backend.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let server = common::start_server(&binary, &[], &env).await;
            let row = measure(o, &backend, &server, size, &subjects).await;
            print_row(&row);
            rows.push(row);
            // The server goes before its database.
            drop(server);
            drop(backend);
        }
    }
    print_tables(o, &rows);
}

/// SQLite, and PostgreSQL (a fresh database) with `--pg`.
async fn backends(o: &Options, size: usize) -> Vec<Backend> {
    let mut out = vec![Backend {
        name: "sqlite",
        env: Vec::new(),
        database: None,
    }];
    if o.pg
        && let Some(db) = common::pg_database(&format!("search_{size}")).await
    {
        out.push(Backend {
            name: "postgres",
            env: vec![
                ("ARCHIVIST_STORAGE_BACKEND", "postgres".to_owned()),
                ("ARCHIVIST_STORAGE_URL", db.url.clone()),
            ],
            database: Some(db),
        });
    }
    out
}

async fn measure(
    o: &Options,
    backend: &Backend,
    server: &common::Server,
    size: usize,
    subjects: &Arc<Vec<Subject>>,
) -> Row {
    let tag = format!("[search] {} {size}", backend.name);
    let load = load(server, subjects).await;
    eprintln!(
        "{tag}: appended in {:.1} s ({:.0} entries/s)",
        load.as_secs_f64(),
        size as f64 / load.as_secs_f64()
    );
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let (recaps, settled) = super::settle(&mut client, o.wait).await;
    eprintln!(
        "{tag}: recaps written in {:.1} s{}",
        recaps.as_secs_f64(),
        if settled { "" } else { " (gave up waiting)" }
    );
    let mut question = Vec::new();
    let mut paraphrase = Vec::new();
    for subject in subjects.iter() {
        let recaps = recaps_of(&mut client, subject).await;
        for fact in &subject.timeline.facts {
            let relevant = 1 + recaps.iter().filter(|r| holds_current(fact, r)).count();
            for (text, out) in [
                (fact.question, &mut question),
                (fact.paraphrase, &mut paraphrase),
            ] {
                let answer = search(&mut client, &subject.name, text).await;
                out.push(rank(subject, fact, text, relevant, answer));
            }
        }
    }
    let queries = latency_queries(o, subjects);
    for (subject, text) in &queries {
        let _ = search(&mut client, subject, text).await;
    }
    let mut took_us = Vec::with_capacity(queries.len());
    let mut failed = Vec::new();
    for (subject, text) in &queries {
        let t = Instant::now();
        let answer = search(&mut client, subject, text).await;
        took_us.push(t.elapsed().as_secs_f64() * 1e6);
        if let Err(e) = answer {
            failed.push(format!("{text:?}: {e}"));
        }
    }
    took_us.sort_by(f64::total_cmp);
    let index = match backend.name {
        "sqlite" => sqlite_index(server),
        _ => match &backend.database {
            Some(db) => postgres_index(&db.url).await,
            None => None,
        },
    };
    Row {
        backend: backend.name,
        size,
        facts: question.len(),
        question: quality(&question),
        paraphrase: quality(&paraphrase),
        took_us,
        failed,
        load,
        recaps,
        settled,
        index,
    }
}

/// Appends every subject's sessions, `PARALLEL` at a time (each session's
/// batches in order), and returns how long it took.
async fn load(server: &common::Server, subjects: &Arc<Vec<Subject>>) -> Duration {
    let started = Instant::now();
    // Session k of every subject at once, then k + 1: a subject's sessions
    // are said in its timeline's order, so a correction in a later
    // session is never stamped before what it corrects (which a race
    // between two of one subject's sessions could do).
    let mut clients = Vec::new();
    for _ in 0..subjects.len().min(PARALLEL) {
        clients.push(
            archivist::client::connect(&server.address)
                .await
                .expect("connect"),
        );
    }
    for k in 0..SESSIONS {
        for wave in (0..subjects.len())
            .collect::<Vec<_>>()
            .chunks(clients.len())
        {
            let mut workers = tokio::task::JoinSet::new();
            for (&s, mut client) in wave
                .iter()
                .zip(clients.drain(..wave.len()).collect::<Vec<_>>())
            {
                let subjects = subjects.clone();
                workers.spawn(async move {
                    let subject = &subjects[s];
                    let name = subject.session_name(k);
                    for (b, chunk) in subject.session(k).chunks(BATCH).enumerate() {
                        let answer = client
                            .append_entries(pb::AppendEntriesRequest {
                                session_id: name.clone(),
                                entries: super::new_entries(chunk),
                                subject: subject.name.clone(),
                            })
                            .await
                            .unwrap_or_else(|s| panic!("append to {name}: {s}"))
                            .into_inner();
                        assert_eq!(
                            answer.entries.last().map(|e| e.seq),
                            Some((b * BATCH + chunk.len()) as u64),
                            "{name}: a fresh session numbers its entries from 1"
                        );
                    }
                    client
                });
            }
            while let Some(done) = workers.join_next().await {
                clients.push(done.expect("a loader"));
            }
        }
    }
    started.elapsed()
}

/// A subject's segment recaps (level 1, what Search reads by default).
async fn recaps_of(client: &mut archivist::client::Client, subject: &Subject) -> Vec<Returned> {
    let mut out = Vec::new();
    for k in 0..SESSIONS {
        for node in common::list_nodes(client, &subject.session_name(k), &[1]).await {
            if let Some(summary) = node.summary {
                out.push(Returned::new(Source::Summary(1), summary.text));
            }
        }
    }
    out
}

fn holds_current(fact: &Fact, item: &Returned) -> bool {
    matches!(
        score::outcome(fact, std::slice::from_ref(item)),
        Outcome::Returned(_)
    )
}

async fn search(
    client: &mut archivist::client::Client,
    subject: &str,
    query: &str,
) -> Result<pb::SearchResponse, tonic::Status> {
    client
        .search(pb::SearchRequest {
            query: query.to_owned(),
            subject: subject.to_owned(),
            limit: LIMIT,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

fn rank(
    subject: &Subject,
    fact: &Fact,
    query: &str,
    relevant: usize,
    answer: Result<pb::SearchResponse, tonic::Status>,
) -> Ranking {
    let (hits, error) = match answer {
        Ok(a) => (a.hits, None),
        Err(s) => (Vec::new(), Some(format!("{:?}: {}", s.code(), s.message()))),
    };
    let first = hits.first().map(|h| h.text.clone());
    let shown: Vec<String> = hits
        .iter()
        .map(|h| {
            let start: String = h.text.chars().take(90).collect();
            let said = h.occurred_at.as_ref().map_or(0, |t| t.seconds);
            format!("L{} said {said} {start:?}", h.level)
        })
        .collect();
    let marks: Vec<Mark> = hits
        .into_iter()
        .map(|h| {
            if !subject.owns(&h.session_id) {
                return Mark::Outside;
            }
            let source = match h.level {
                0 => Source::Entry(h.first_seq),
                level => Source::Summary(level),
            };
            match score::outcome(fact, &[Returned::new(source, h.text)]) {
                Outcome::Returned(_) => Mark::Relevant,
                Outcome::Stale => Mark::Stale,
                Outcome::Missing => Mark::Other,
            }
        })
        .collect();
    Ranking {
        query: query.to_owned(),
        answer: fact.current().to_owned(),
        shown: shown
            .into_iter()
            .zip(&marks)
            .map(|(s, m)| format!("{m:?} {s}"))
            .collect(),
        marks,
        first,
        relevant,
        updated: fact.update.is_some(),
        error,
    }
}

/// The facts' questions and paraphrases, then a few words (2 or 3 of at
/// least 4 letters, in order) of random entries, until `--search-queries`.
fn latency_queries(o: &Options, subjects: &[Subject]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = subjects
        .iter()
        .flat_map(|s| {
            s.timeline
                .facts
                .iter()
                .flat_map(|f| [f.question, f.paraphrase].map(|q| (s.name.clone(), q.to_owned())))
        })
        .collect();
    let mut rng = Rng(o.seed ^ 0x5ea7_c400);
    while out.len() < o.search_queries {
        let subject = rng.pick(subjects);
        let entry = rng.pick(&subject.timeline.entries);
        let words: Vec<&str> = entry
            .content
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.len() >= 4)
            .collect();
        if words.len() < 2 {
            continue;
        }
        let n = (2 + rng.below(2)).min(words.len());
        let from = rng.below(words.len() - n + 1);
        out.push((subject.name.clone(), words[from..from + n].join(" ")));
    }
    out
}

/// The FTS5 tables' pages in the server's SQLite files (the index has a
/// file of its own beside the main one).
fn sqlite_index(server: &common::Server) -> Option<Index> {
    let path = server.data_dir().join("archivist.sqlite3");
    let search = server.data_dir().join("archivist-search.sqlite3");
    let read = || -> rusqlite::Result<Index> {
        let db = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        db.execute(
            "ATTACH DATABASE ?1 AS search",
            [search.to_string_lossy().as_ref()],
        )?;
        let bytes: i64 = db.query_row(
            // The tenants' FTS5 tables (search_<k>) and their shadow tables.
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat('search') WHERE name GLOB 'search_[0-9]*'",
            [],
            |r| r.get(0),
        )?;
        let file: i64 = db.query_row(
            "SELECT (SELECT sum(pgsize) FROM dbstat('main')) + (SELECT sum(pgsize) FROM dbstat('search'))",
            [],
            |r| r.get(0),
        )?;
        let entries: i64 = db.query_row("SELECT count(*) FROM entries", [], |r| r.get(0))?;
        let summaries: i64 = db.query_row("SELECT count(*) FROM summaries", [], |r| r.get(0))?;
        Ok(Index {
            bytes: bytes as u64,
            entries: entries as u64,
            documents: (entries + summaries) as u64,
            note: format!(
                "FTS5 tables (dbstat); {:.0} % of the database files' {} MB",
                100.0 * bytes as f64 / file as f64,
                file / 1_000_000
            ),
        })
    };
    read()
        .map_err(|e| eprintln!("[search] reading {}: {e}", path.display()))
        .ok()
}

/// The `tsv` columns and their GIN indexes in the server's database.
async fn postgres_index(url: &str) -> Option<Index> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| eprintln!("[search] connecting to PostgreSQL: {e}"))
        .ok()?;
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT pg_relation_size('entries_search') + pg_relation_size('summaries_search'), \
             (SELECT coalesce(sum(pg_column_size(tsv)), 0) FROM entries) \
             + (SELECT coalesce(sum(pg_column_size(tsv)), 0) FROM summaries), \
             (SELECT count(*) FROM entries), (SELECT count(*) FROM summaries)",
            &[],
        )
        .await
        .map_err(|e| eprintln!("[search] measuring the PostgreSQL index: {e}"))
        .ok()?;
    let (gin, columns, entries, summaries): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    Some(Index {
        bytes: (gin + columns) as u64,
        entries: entries as u64,
        documents: (entries + summaries) as u64,
        note: format!(
            "GIN {:.0} B/entry + tsvector columns {:.0} B/entry",
            gin as f64 / entries as f64,
            columns as f64 / entries as f64
        ),
    })
}

/// Progress: each row as it is measured, on stderr.
fn print_row(r: &Row) {
    eprintln!(
        "[search] {} {}: question @5 {:.3} @10 {:.3} NDCG@10 {:.3}; p50 {:.2} ms p99 {:.2} ms",
        r.backend,
        r.size,
        r.question.at5,
        r.question.at10,
        r.question.ndcg10,
        common::percentile(&r.took_us, 0.5) / 1000.0,
        common::percentile(&r.took_us, 0.99) / 1000.0
    );
}

fn print_tables(o: &Options, rows: &[Row]) {
    println!();
    println!(
        "Search, lexical: {} subject(s) of {SESSIONS} sessions per tenant (seed {}), 20 planted facts and 5 changes each; per fact a search of its question (the fact's words) and of its paraphrase, scoped to its subject, limit {LIMIT}.",
        o.subjects, o.seed
    );
    println!(
        "recall@k: facts with a hit holding the current answer among the first k (the entry or a recap); NDCG@10: binary relevance; corrected: changed facts whose current value ranks above the old; outside: hits from another subject."
    );
    println!(
        "  {:<9} {:>8} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>8}",
        "backend",
        "entries",
        "facts",
        "q @5",
        "q @10",
        "q NDCG",
        "corrected",
        "para @5",
        "para @10",
        "p NDCG",
        "corrected",
        "outside"
    );
    for r in rows {
        let (q, p) = (&r.question, &r.paraphrase);
        println!(
            "  {:<9} {:>8} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>10} {:>8.3} {:>8.3} {:>8.3} {:>10} {:>8}{}",
            r.backend,
            r.size,
            r.facts,
            q.at5,
            q.at10,
            q.ndcg10,
            format!("{}/{}", q.corrected.0, q.corrected.1),
            p.at5,
            p.at10,
            p.ndcg10,
            format!("{}/{}", p.corrected.0, p.corrected.1),
            q.outside + p.outside,
            match q.errors.iter().chain(&p.errors).next() {
                Some(e) => format!("  ({} error(s): {e})", q.errors.len() + p.errors.len()),
                None => String::new(),
            }
        );
    }
    println!(
        "Latency: every query once untimed, then once timed (the facts' questions and paraphrases, then a few words of random entries); loading: session k of up to {PARALLEL} subjects at a time, {BATCH} entries a call; index bytes over the entries (and over the documents: entries and recaps)."
    );
    println!(
        "  {:<9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}  index",
        "backend",
        "entries",
        "queries",
        "p50 ms",
        "p99 ms",
        "load s",
        "entries/s",
        "recaps s",
        "B/entry",
        "B/doc"
    );
    for r in rows {
        let per = |n: u64| {
            r.index
                .as_ref()
                .map_or(0.0, |i| i.bytes as f64 / n.max(1) as f64)
        };
        println!(
            "  {:<9} {:>8} {:>8} {:>8.2} {:>8.2} {:>8.1} {:>10.0} {:>10} {:>10.0} {:>10.0}  {}{}",
            r.backend,
            r.size,
            r.took_us.len(),
            common::percentile(&r.took_us, 0.5) / 1000.0,
            common::percentile(&r.took_us, 0.99) / 1000.0,
            r.load.as_secs_f64(),
            r.size as f64 / r.load.as_secs_f64(),
            format!(
                "{:.1}{}",
                r.recaps.as_secs_f64(),
                if r.settled { "" } else { "!" }
            ),
            per(r.index.as_ref().map_or(0, |i| i.entries)),
            per(r.index.as_ref().map_or(0, |i| i.documents)),
            r.index.as_ref().map_or("not measured", |i| i.note.as_str()),
            match r.failed.first() {
                Some(e) => format!("  ({} failed: {e})", r.failed.len()),
                None => String::new(),
            }
        );
    }
    println!("  (! the wait for every recap ran out)");
    if o.facts {
        for r in rows {
            println!(
                "Questions in the facts' words with no relevant hit in the first 5, {} at {} entries:",
                r.backend, r.size
            );
            for miss in &r.question.misses {
                println!("  {miss}");
            }
            println!(
                "Changed facts whose old value ranked above the current one, {} at {} entries:",
                r.backend, r.size
            );
            for miss in &r.question.uncorrected {
                println!("  {miss}");
            }
        }
    }
}

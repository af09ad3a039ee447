//! `--search --embedder URL`: the same tenant and facts as the lexical
//! Search benchmark, on a SQLite server with `[embedding] kind = "openai"`
//! pointed at a real embedder (through `embedder::Proxy`), once nothing is
//! owed.
//!
//! **Drain.** From the first append until GetBacklog says no recap and no
//! embedding is pending (and its counts held still for a poll): the items
//! embedded over that time, against what the endpoint delivered while it
//! was busy (the texts it embedded over the time at least one request was
//! outstanding): archivist's share of the embedder's own rate.
//!
//! **Quality.** Per fact and kind of question (its own words, a
//! paraphrase), a Search in each mode (LEXICAL, SEMANTIC, AUTO), scored as
//! the lexical bench scores (`rank`, `quality`), and two references
//! computed here from the endpoint's vectors: every text of the subject in
//! the default levels (its entries and its segment recaps) ranked by cosine
//! to the question as written, top 10, the question embedded with the
//! server's model name (*exact*) and with `--embedder-query-model` (e5's
//! query input type: *exact, query*). archivist embeds the query's words
//! as its lexical leg reads them (lowercased, joined by spaces), not the
//! string as written, so its SEMANTIC ranking differs from *exact* by
//! that text (checked by hand: against the lowercased words it matched).
//! *agree@10*: the share of SEMANTIC's first 10 texts that are among the
//! exact reference's first 10.
//!
//! **Latency.** The lexical bench's queries in each mode, all once
//! untimed, then each once timed, with the proxy answering every query it
//! has seen from memory: SEMANTIC's time is archivist's (the vector leg,
//! the store and gRPC), not the model's; the endpoint's own time to embed
//! one query is printed beside it (50 queries, sent directly).

use std::sync::Arc;
use std::time::{Duration, Instant};

use archivist::pb;

use super::embedder::{Proxy, Sent, cosine};
use super::fixture::Fact;
use super::{LIMIT, Quality, Ranking, SESSIONS, Subject, common, load, quality, rank, tenant};
use crate::Options;

/// The modes measured, in the tables' order.
const MODES: [(pb::SearchMode, &str); 3] = [
    (pb::SearchMode::Lexical, "LEXICAL"),
    (pb::SearchMode::Semantic, "SEMANTIC"),
    (pb::SearchMode::Auto, "AUTO"),
];

/// The rankings compared per kind of question, in the tables' order.
const RANKINGS: [&str; 5] = ["LEXICAL", "SEMANTIC", "AUTO", "exact", "exact, query"];

/// Everything measured at one size.
struct Row {
    size: usize,
    facts: usize,
    /// Per kind of question (direct, paraphrase), per ranking of RANKINGS.
    quality: [Vec<Quality>; 2],
    /// SEMANTIC's first 10 among the exact reference's, per kind.
    agree: [f64; 2],
    /// The least embedded_share a SEMANTIC search reported.
    share: f64,
    /// Latencies per mode, µs, sorted.
    took_us: Vec<Vec<f64>>,
    failed: Vec<String>,
    /// The endpoint's time to embed one query, µs, sorted.
    query_us: Vec<f64>,
    load: Duration,
    drain: Duration,
    settled: bool,
    embedded: u64,
    parked: u64,
    last_failure: Option<String>,
    sent: Sent,
    texts: usize,
}

pub async fn run(o: &Options, url: &str) {
    if o.pg {
        eprintln!(
            "[search] --embedder: SQLite only in this bench (benches/embeddings.rs --pgvector measures PostgreSQL's leg); --pg ignored"
        );
    }
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_archivist"));
    let proxy = Proxy::start(url).await;
    eprintln!(
        "[search] embedder {url} (model {:?}, queries also as {:?}) behind {}",
        o.embedder_model, o.embedder_query_model, proxy.url
    );
    let mut rows = Vec::new();
    for &size in &o.search_sizes {
        let subjects = Arc::new(tenant(o, size));
        let mut env = vec![
            ("ARCHIVIST_EMBEDDING_KIND", "openai"),
            ("ARCHIVIST_EMBEDDING_BASE_URL", proxy.url.as_str()),
            ("ARCHIVIST_EMBEDDING_MODEL", o.embedder_model.as_str()),
        ];
        if o.server_query_model {
            env.push((
                "ARCHIVIST_EMBEDDING_QUERY_MODEL",
                o.embedder_query_model.as_str(),
            ));
        }
        let server = common::start_server(&binary, &[], &env).await;
        let row = measure(o, &proxy, &server, size, &subjects).await;
        print_row(&row);
        rows.push(row);
        drop(server);
    }
    print_tables(o, url, &rows);
}

async fn measure(
    o: &Options,
    proxy: &Proxy,
    server: &common::Server,
    size: usize,
    subjects: &Arc<Vec<Subject>>,
) -> Row {
    let tag = format!("[search] sqlite {size} (embeddings)");
    proxy.serve_cached(false);
    let _ = proxy.take_sent();
    let started = Instant::now();
    let load = load(server, subjects).await;
    eprintln!("{tag}: appended in {:.1} s", load.as_secs_f64());
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let (backlog, settled) = drain(&mut client, o.wait, &tag).await;
    let drain = started.elapsed();
    let sent = proxy.take_sent();
    let e = backlog.embeddings.unwrap_or_default();
    eprintln!(
        "{tag}: nothing owed after {:.1} s: {} embedded, {} parked; the endpoint got {} requests of {} inputs, busy {:.1} s",
        drain.as_secs_f64(),
        e.embedded,
        e.parked,
        sent.requests,
        sent.inputs,
        sent.busy.as_secs_f64()
    );

    let mut quality_of: [Vec<Vec<Ranking>>; 2] = [
        (0..RANKINGS.len()).map(|_| Vec::new()).collect(),
        (0..RANKINGS.len()).map(|_| Vec::new()).collect(),
    ];
    let mut agree = [Vec::new(), Vec::new()];
    let mut share = 1.0f64;
    let mut texts = 0;
    for subject in subjects.iter() {
        let corpus = corpus(&mut client, subject).await;
        texts += corpus.len();
        let words: Vec<String> = corpus.iter().map(|h| h.text.clone()).collect();
        let vectors = proxy.embed(&o.embedder_model, &words).await;
        for fact in &subject.timeline.facts {
            let relevant = corpus
                .iter()
                .filter(|h| h.level > 0 && super::holds_current(fact, &returned(h)))
                .count()
                + 1;
            for (kind, text) in [fact.question, fact.paraphrase].into_iter().enumerate() {
                let mut semantic_texts = Vec::new();
                for (m, (mode, _)) in MODES.iter().enumerate() {
                    let answer = search(&mut client, &subject.name, text, *mode).await;
                    if *mode == pb::SearchMode::Semantic
                        && let Ok(a) = &answer
                    {
                        share = share.min(a.embedded_share);
                        semantic_texts = a.hits.iter().map(|h| h.text.clone()).collect();
                    }
                    quality_of[kind][m].push(rank(subject, fact, text, relevant, answer));
                }
                for (r, model) in [(3, &o.embedder_model), (4, &o.embedder_query_model)] {
                    let q = &proxy.embed(model, &[text.to_owned()]).await[0];
                    let hits = exact(&corpus, &vectors, q);
                    if r == 3 {
                        let same = semantic_texts
                            .iter()
                            .filter(|t| hits.iter().any(|h| &&h.text == t))
                            .count();
                        agree[kind].push(same as f64 / hits.len().max(1) as f64);
                    }
                    quality_of[kind][r].push(reference(subject, fact, text, relevant, hits));
                }
            }
        }
    }

    if let Some(path) = &o.dump_legs {
        dump_legs(o, proxy, &mut client, subjects, size, path).await;
    }

    proxy.serve_cached(true);
    let queries = super::latency_queries(o, subjects);
    let mut took_us = Vec::new();
    let mut failed = Vec::new();
    for (mode, _) in MODES {
        for (subject, text) in &queries {
            let _ = search(&mut client, subject, text, mode).await;
        }
        let mut took = Vec::with_capacity(queries.len());
        for (subject, text) in &queries {
            let t = Instant::now();
            let answer = search(&mut client, subject, text, mode).await;
            took.push(t.elapsed().as_secs_f64() * 1e6);
            if let Err(e) = answer {
                failed.push(format!("{mode:?} {text:?}: {e}"));
            }
        }
        took.sort_by(f64::total_cmp);
        took_us.push(took);
    }
    proxy.serve_cached(false);
    let sample: Vec<String> = queries.iter().take(50).map(|(_, q)| q.clone()).collect();
    let query_us = proxy.query_latency(&o.embedder_model, &sample).await;

    let [direct, para] = quality_of;
    Row {
        size,
        facts: direct[0].len(),
        quality: [
            direct.iter().map(|r| quality(r)).collect(),
            para.iter().map(|r| quality(r)).collect(),
        ],
        agree: agree.map(super::score::mean),
        share,
        took_us,
        failed,
        query_us,
        load,
        drain,
        settled,
        embedded: e.embedded,
        parked: e.parked,
        last_failure: e
            .last_failure
            .map(|f| format!("{:?} {:?}", f.kind, f.causes)),
        sent,
        texts,
    }
}

/// Polls GetBacklog until no recap and no embedding is pending (anything
/// parked is reported, not waited for) and its counts held still for a
/// poll, or `wait` runs out; progress every 30 s.
async fn drain(
    client: &mut archivist::client::Client,
    wait: Duration,
    tag: &str,
) -> (pb::Backlog, bool) {
    let started = Instant::now();
    let mut said = Instant::now();
    let mut last = None;
    loop {
        let b = client
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner();
        let e = b.embeddings.clone().unwrap_or_default();
        let now = (b.summarised, e.embedded, e.parked);
        if b.pending == 0 && e.pending == 0 && last == Some(now) {
            return (b, true);
        }
        last = Some(now);
        if started.elapsed() > wait {
            return (b, false);
        }
        if said.elapsed() > Duration::from_secs(30) {
            said = Instant::now();
            eprintln!(
                "{tag}: {} embedded, {} pending, {} parked; {} segments pending",
                e.embedded, e.pending, e.parked, b.pending
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every text of a subject that a default Search reads: its entries, and
/// the recaps of its segments (level 1), each as a hit.
async fn corpus(client: &mut archivist::client::Client, subject: &Subject) -> Vec<pb::SearchHit> {
    let mut out = Vec::new();
    for k in 0..SESSIONS {
        let session_id = subject.session_name(k);
        for (i, m) in subject.session(k).iter().enumerate() {
            out.push(pb::SearchHit {
                session_id: session_id.clone(),
                level: 0,
                first_seq: i as u64 + 1,
                last_seq: i as u64 + 1,
                text: m.content.clone(),
                ..Default::default()
            });
        }
        for node in common::list_nodes(client, &session_id, &[1]).await {
            if let Some(summary) = node.summary {
                out.push(pb::SearchHit {
                    session_id: session_id.clone(),
                    level: 1,
                    first_seq: node.first_seq,
                    last_seq: node.last_seq,
                    segment_id: node.id,
                    text: summary.text,
                    ..Default::default()
                });
            }
        }
    }
    out
}

fn returned(h: &pb::SearchHit) -> super::Returned {
    super::Returned::new(super::Source::Summary(h.level), h.text.clone())
}

/// The first `LIMIT` texts of `corpus` by cosine to `query` (ties in the
/// corpus's order).
fn exact(corpus: &[pb::SearchHit], vectors: &[Arc<[f32]>], query: &[f32]) -> Vec<pb::SearchHit> {
    let mut scored: Vec<(f32, usize)> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| (cosine(v, query), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored
        .iter()
        .take(LIMIT as usize)
        .map(|&(_, i)| corpus[i].clone())
        .collect()
}

fn reference(
    subject: &Subject,
    fact: &Fact,
    text: &str,
    relevant: usize,
    hits: Vec<pb::SearchHit>,
) -> Ranking {
    let answer = pb::SearchResponse {
        hits,
        ..Default::default()
    };
    rank(subject, fact, text, relevant, Ok(answer))
}

async fn search(
    client: &mut archivist::client::Client,
    subject: &str,
    query: &str,
    mode: pb::SearchMode,
) -> Result<pb::SearchResponse, tonic::Status> {
    client
        .search(pb::SearchRequest {
            query: query.to_owned(),
            subject: subject.to_owned(),
            limit: LIMIT,
            mode: mode.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

fn print_row(r: &Row) {
    let q = |k: usize, m: usize| r.quality[k][m].at5;
    eprintln!(
        "[search] sqlite {} (embeddings): @5 direct L {:.3} S {:.3} A {:.3} exact {:.3}; paraphrase L {:.3} S {:.3} A {:.3} exact {:.3} exact-query {:.3}; drain {:.1} items/s",
        r.size,
        q(0, 0),
        q(0, 1),
        q(0, 2),
        q(0, 3),
        q(1, 0),
        q(1, 1),
        q(1, 2),
        q(1, 3),
        q(1, 4),
        r.embedded as f64 / r.drain.as_secs_f64()
    );
}

fn print_tables(o: &Options, url: &str, rows: &[Row]) {
    println!();
    println!(
        "Search with embeddings (SQLite): {} subject(s) of {SESSIONS} sessions per tenant (seed {}); embedder {url}, model {:?} for stored texts and queries; 'exact': the bench's own cosine ranking of every text of the subject (entries and segment recaps) from the same endpoint's vectors, the question as written embedded with the server's model name (archivist embeds the query's words lowercased, as its lexical leg reads them); 'exact, query': the question as written embedded as {:?}.",
        o.subjects, o.seed, o.embedder_model, o.embedder_query_model
    );
    println!(
        "  {:>8} {:>6} {:<11} {:<13} {:>7} {:>7} {:>7} {:>10} {:>8}",
        "entries", "facts", "questions", "ranking", "@5", "@10", "NDCG@10", "corrected", "outside"
    );
    for r in rows {
        for (k, kind) in ["direct", "paraphrase"].iter().enumerate() {
            for (m, name) in RANKINGS.iter().enumerate() {
                let q = &r.quality[k][m];
                println!(
                    "  {:>8} {:>6} {:<11} {:<13} {:>7.3} {:>7.3} {:>7.3} {:>10} {:>8}{}",
                    r.size,
                    r.facts,
                    kind,
                    name,
                    q.at5,
                    q.at10,
                    q.ndcg10,
                    format!("{}/{}", q.corrected.0, q.corrected.1),
                    q.outside,
                    match q.errors.first() {
                        Some(e) => format!("  ({} error(s): {e})", q.errors.len()),
                        None => String::new(),
                    }
                );
            }
        }
        println!(
            "  {:>8} SEMANTIC's first 10 among the exact ranking's first 10: direct {:.3}, paraphrase {:.3}; least embedded_share {:.3}",
            r.size, r.agree[0], r.agree[1], r.share
        );
    }
    println!(
        "Latency (ms, the proxy answering queries it has seen from memory; the endpoint's own time to embed one query beside it) and the drain (first append until nothing is owed)."
    );
    println!(
        "  {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6}",
        "entries",
        "queries",
        "L p50",
        "L p99",
        "S p50",
        "S p99",
        "A p50",
        "A p99",
        "embed p50",
        "embed p99",
        "texts",
        "drain s",
        "items/s",
        "endpoint",
        "requests",
        "share"
    );
    for r in rows {
        let p = |m: usize, q: f64| common::percentile(&r.took_us[m], q) / 1000.0;
        let rate = r.embedded as f64 / r.drain.as_secs_f64();
        let endpoint = r.sent.inputs as f64 / r.sent.busy.as_secs_f64().max(1e-9);
        println!(
            "  {:>8} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>9.1} {:>8} {:>8} {:>9.1} {:>9.1} {:>9} {:>5.0}%{}",
            r.size,
            r.took_us[0].len(),
            p(0, 0.5),
            p(0, 0.99),
            p(1, 0.5),
            p(1, 0.99),
            p(2, 0.5),
            p(2, 0.99),
            common::percentile(&r.query_us, 0.5) / 1000.0,
            common::percentile(&r.query_us, 0.99) / 1000.0,
            r.embedded,
            format!(
                "{:.1}{}",
                r.drain.as_secs_f64(),
                if r.settled { "" } else { "!" }
            ),
            rate,
            endpoint,
            format!("{}/{}", r.sent.requests, r.sent.inputs),
            100.0 * rate / endpoint,
            match r.failed.first() {
                Some(e) => format!("  ({} failed: {e})", r.failed.len()),
                None => String::new(),
            }
        );
        if r.parked > 0 || r.last_failure.is_some() || r.sent.failed > 0 {
            println!(
                "  {:>8} parked {}, requests failed at the endpoint {}, last failure {}",
                r.size,
                r.parked,
                r.sent.failed,
                r.last_failure.as_deref().unwrap_or("none")
            );
        }
        println!(
            "  {:>8} load {:.1} s; {} texts in the subjects' scopes (entries and segment recaps)",
            r.size,
            r.load.as_secs_f64(),
            r.texts
        );
    }
    println!(
        "  (texts: GetBacklog's embedded; items/s: texts over the drain; endpoint: the inputs the endpoint embedded over the time a request was outstanding; share: items/s of endpoint; requests: requests/inputs the server sent; ! the wait ran out)"
    );
}

/// The words archivist embeds for a question (`Query::text`): its words,
/// lowercased, an English clitic ending dropped.
fn query_text(question: &str) -> String {
    let mut out = Vec::new();
    for chunk in question.split_whitespace() {
        let word = chunk.trim_end_matches(|c: char| !c.is_alphanumeric());
        let kept = match word.rfind(['\'', '\u{2019}']) {
            Some(at)
                if matches!(
                    word[at..]
                        .trim_start_matches(['\'', '\u{2019}'])
                        .to_lowercase()
                        .as_str(),
                    "s" | "t" | "d" | "m" | "ll" | "re" | "ve"
                ) =>
            {
                &word[..at]
            }
            _ => chunk,
        };
        out.extend(
            kept.split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase),
        );
    }
    out.join(" ")
}

fn words_of(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// `--dump-legs`: per question, both legs' first 30 with what a fusion
/// needs, one JSON line each (appended to `path`).
async fn dump_legs(
    o: &Options,
    proxy: &Proxy,
    client: &mut archivist::client::Client,
    subjects: &Arc<Vec<Subject>>,
    size: usize,
    path: &std::path::Path,
) {
    use std::io::Write;
    const DEPTH: usize = 30;
    let mut corpora = Vec::new();
    let mut df: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut docs = 0u64;
    for subject in subjects.iter() {
        let corpus = corpus(client, subject).await;
        for h in &corpus {
            docs += 1;
            for w in words_of(&h.text) {
                *df.entry(w).or_default() += 1;
            }
        }
        corpora.push(corpus);
    }
    let model = if o.server_query_model {
        &o.embedder_query_model
    } else {
        &o.embedder_model
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("--dump-legs FILE");
    for (subject, corpus) in subjects.iter().zip(&corpora) {
        let texts: Vec<String> = corpus.iter().map(|h| h.text.clone()).collect();
        let vectors = proxy.embed(&o.embedder_model, &texts).await;
        for fact in &subject.timeline.facts {
            for (kind, question) in ["direct", "paraphrase"]
                .into_iter()
                .zip([fact.question, fact.paraphrase])
            {
                let said = query_text(question);
                let q = &proxy.embed(model, std::slice::from_ref(&said)).await[0];
                let cos: Vec<f32> = vectors.iter().map(|v| cosine(v, q)).collect();
                let mark = |h: &pb::SearchHit| {
                    let source = match h.level {
                        0 => super::score::Source::Entry(h.first_seq),
                        level => super::score::Source::Summary(level),
                    };
                    match super::score::outcome(
                        fact,
                        &[super::Returned::new(source, h.text.clone())],
                    ) {
                        super::score::Outcome::Returned(_) => "relevant",
                        super::score::Outcome::Stale => "stale",
                        super::score::Outcome::Missing => "other",
                    }
                };
                let at = |h: &pb::SearchHit| {
                    corpus.iter().position(|c| {
                        c.session_id == h.session_id
                            && c.level == h.level
                            && c.first_seq == h.first_seq
                    })
                };
                let item = |i: usize, h: &pb::SearchHit| {
                    serde_json::json!({
                        "doc": i,
                        "cos": cos[i],
                        "mark": mark(h),
                        "text": h.text,
                        "level": h.level,
                        "occurred": h.occurred_at.as_ref().map_or(0, |t| t.seconds),
                        "session": h.session_id,
                        "seq": h.first_seq,
                    })
                };
                let lexical = client
                    .search(pb::SearchRequest {
                        query: question.to_owned(),
                        subject: subject.name.clone(),
                        limit: DEPTH as u32,
                        mode: pb::SearchMode::Lexical.into(),
                        ..Default::default()
                    })
                    .await
                    .map(|a| a.into_inner().hits)
                    .unwrap_or_default();
                let lexical: Vec<_> = lexical
                    .iter()
                    .filter_map(|h| at(h).map(|i| item(i, &corpus[i])))
                    .collect();
                let mut order: Vec<usize> = (0..corpus.len()).collect();
                order.sort_by(|&a, &b| cos[b].total_cmp(&cos[a]).then(a.cmp(&b)));
                let semantic: Vec<_> = order
                    .iter()
                    .take(DEPTH)
                    .map(|&i| item(i, &corpus[i]))
                    .collect();
                let relevant = corpus.iter().filter(|h| mark(h) == "relevant").count();
                let qwords: Vec<(String, u64)> = said
                    .split(' ')
                    .map(|w| (w.to_owned(), df.get(w).copied().unwrap_or(0)))
                    .collect();
                let line = serde_json::json!({
                    "size": size,
                    "subject": subject.name,
                    "kind": kind,
                    "question": question,
                    "said": said,
                    "words": qwords,
                    "docs": docs,
                    "relevant": relevant,
                    "updated": fact.update.is_some(),
                    "lexical": lexical,
                    "semantic": semantic,
                });
                writeln!(file, "{line}").expect("write --dump-legs");
            }
        }
    }
}

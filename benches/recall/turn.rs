//! `--turn`: the turn's context, GetContext with the user's message as
//! `query`, against the real `archivist` binary over gRPC.
//!
//! **Across sessions.** `--subjects K` subjects (default 3), each one
//! `fixture::generate` timeline of `--sizes N` entries (its 20 facts, 5
//! of them changed later, and filler) cut into `SESSIONS` older sessions
//! of that subject; the bench waits until every recap (and, with
//! `--embedder`, every embedding) is written. Then, per fact, a new
//! session of the subject gets the question as its one user entry, as a
//! host appends the user's message, and GetContext of that session asks
//! with the question as `query` at each of `CROSS_BUDGETS`; the new
//! session is erased before the next fact, so no question is recalled for
//! another. A fact counts as returned when its current answer occurs in
//! any item (`score::outcome`), stale when only its old value does. Each
//! fact is asked in its own words (`question`) and in other words
//! (`paraphrase`). Every answer's estimated_tokens is checked against its
//! budget.
//!
//! **Within a session.** `--sessions K` sessions of `--sizes N` entries,
//! no subject, as the GetContext bench loads them; at `IN_BUDGET` tokens
//! the cover without a query is scored for all 20 facts at once (the
//! GetContext bench's figure), and then each fact is asked on its own
//! with its question (and its paraphrase) as `query`.
//!
//! With `--embedder URL` (`benches/embedder.sh start`) the server embeds
//! with it (`embedding.model` `--embedder-model`, queries as
//! `--embedder-query-model`), so recall's search is hybrid (AUTO);
//! without it, lexical (the default).
//!
//! `--keep-data DIR` keeps each reading's data directory, loaded and
//! drained, under DIR and reuses it on a run with the same sizes, seed,
//! subjects or sessions and embedding models (`kept_server`): for
//! iterating on the server, when the drain through a real embedder takes
//! longer than the questions.
//!
//! Run: `cargo bench --bench recall -- --turn --sizes 1000,10000`.

use std::time::{Duration, Instant};

use archivist::pb;

use super::fixture::{self, Fact, Message, Session, Subject};
use super::score::{self, Outcome, Returned, Source};
use super::{Options, common, new_entries};

/// Older sessions per subject.
const SESSIONS: usize = 10;
/// Budgets of the cross-session reading.
const CROSS_BUDGETS: [u32; 2] = [1_000, 4_000];
/// The budget of the in-session reading.
const IN_BUDGET: u32 = 400;
/// Entries per AppendEntries: the server's default cap.
const BATCH: usize = 1000;

/// How a fact is asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    Question,
    Paraphrase,
}

impl Asked {
    const BOTH: [Asked; 2] = [Asked::Question, Asked::Paraphrase];

    fn text(self, fact: &Fact) -> &'static str {
        match self {
            Asked::Question => fact.question,
            Asked::Paraphrase => fact.paraphrase,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Asked::Question => "question",
            Asked::Paraphrase => "paraphrase",
        }
    }
}

/// The outcomes of one kind of reading, and what the answers cost.
#[derive(Default)]
struct Figures {
    outcomes: Vec<Outcome>,
    /// Found in a recalled item (not in the cover).
    by_recall: usize,
    tokens: Vec<u64>,
    over_budget: usize,
    took_us: Vec<f64>,
    errors: Vec<String>,
    /// What was asked and not returned, and what recall brought instead.
    misses: Vec<String>,
}

impl Figures {
    fn returned(&self) -> usize {
        (self.outcomes.iter())
            .filter(|o| matches!(o, Outcome::Returned(_)))
            .count()
    }

    fn stale(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| **o == Outcome::Stale)
            .count()
    }

    fn line(&mut self) -> String {
        self.took_us.sort_by(f64::total_cmp);
        let n = self.outcomes.len().max(1);
        format!(
            "{:>3}/{:<3} {:>5.1} % | stale {:>2} | by recall {:>3} | tokens mean {:>5.0} max {:>5} (over budget: {}) | p50 {:>6.1} ms p99 {:>6.1} ms{}",
            self.returned(),
            self.outcomes.len(),
            100.0 * self.returned() as f64 / n as f64,
            self.stale(),
            self.by_recall,
            score::mean(self.tokens.iter().map(|&t| t as f64)),
            self.tokens.iter().max().copied().unwrap_or(0),
            self.over_budget,
            common::percentile(&self.took_us, 0.50) / 1000.0,
            common::percentile(&self.took_us, 0.99) / 1000.0,
            match self.errors.first() {
                Some(e) => format!(" | {} errors, first: {e}", self.errors.len()),
                None => String::new(),
            }
        )
    }

    /// Scores `fact` against one answer, found by recall or by the cover.
    fn add(
        &mut self,
        fact: &Fact,
        budget: u32,
        answer: Result<pb::GetContextResponse, tonic::Status>,
        took: Duration,
    ) {
        self.took_us.push(took.as_secs_f64() * 1e6);
        let answer = match answer {
            Ok(a) => a,
            Err(status) => {
                self.errors
                    .push(format!("{:?}: {}", status.code(), status.message()));
                self.outcomes.push(Outcome::Missing);
                return;
            }
        };
        self.tokens.push(u64::from(answer.estimated_tokens));
        if answer.estimated_tokens > budget {
            self.over_budget += 1;
        }
        let (recalled, cover) = items(answer);
        let (in_cover, in_recall) = (
            score::outcome(fact, &cover),
            score::outcome(fact, &recalled),
        );
        self.outcomes.push(match (in_cover, in_recall) {
            (o @ Outcome::Returned(_), _) => o,
            (_, o @ Outcome::Returned(_)) => {
                self.by_recall += 1;
                o
            }
            (Outcome::Stale, _) | (_, Outcome::Stale) => Outcome::Stale,
            _ => Outcome::Missing,
        });
        if !matches!(self.outcomes.last(), Some(Outcome::Returned(_))) {
            let brought: Vec<String> = recalled
                .iter()
                .map(|r| r.text.chars().take(80).collect())
                .collect();
            self.misses.push(format!(
                "asked {:?} (answer {:?}), recalled {brought:?}",
                fact.question,
                fact.current()
            ));
        }
    }
}

/// An answer's items as the score reads them: the recalled ones, and the
/// cover's.
fn items(answer: pb::GetContextResponse) -> (Vec<Returned>, Vec<Returned>) {
    let (mut recalled, mut cover) = (Vec::new(), Vec::new());
    for item in answer.items.into_iter().filter_map(|i| i.item) {
        match item {
            pb::context_item::Item::Recalled(r) => recalled.push(Returned::new(
                match r.level {
                    0 => Source::Entry(r.first_seq),
                    l => Source::Summary(l),
                },
                r.text,
            )),
            pb::context_item::Item::Summary(s) => cover.push(Returned::new(
                Source::Summary(s.level.max(1)),
                s.summary.map(|s| s.text).unwrap_or_default(),
            )),
            pb::context_item::Item::Entry(e) => {
                cover.push(Returned::new(Source::Entry(e.seq), e.content))
            }
        }
    }
    (recalled, cover)
}

async fn append_all(
    client: &mut archivist::client::Client,
    session: &str,
    subject: &str,
    entries: &[Message],
) {
    for chunk in entries.chunks(BATCH) {
        client
            .append_entries(pb::AppendEntriesRequest {
                session_id: session.to_owned(),
                entries: new_entries(chunk),
                subject: subject.to_owned(),
            })
            .await
            .unwrap_or_else(|s| panic!("append to {session}: {s}"));
    }
}

async fn context(
    client: &mut archivist::client::Client,
    session: &str,
    max_tokens: u32,
    query: &str,
) -> (Result<pb::GetContextResponse, tonic::Status>, Duration) {
    let started = Instant::now();
    let answer = client
        .get_context(pb::GetContextRequest {
            session_id: session.to_owned(),
            max_tokens,
            query: query.to_owned(),
            min_similarity: None,
        })
        .await
        .map(tonic::Response::into_inner);
    (answer, started.elapsed())
}

pub async fn run(o: &Options) {
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_archivist"));
    let mut env: Vec<(&str, &str)> = Vec::new();
    let search = match &o.embedder {
        Some(url) => {
            env.extend([
                ("ARCHIVIST_EMBEDDING_KIND", "openai"),
                ("ARCHIVIST_EMBEDDING_BASE_URL", url.as_str()),
                ("ARCHIVIST_EMBEDDING_MODEL", o.embedder_model.as_str()),
                (
                    "ARCHIVIST_EMBEDDING_QUERY_MODEL",
                    o.embedder_query_model.as_str(),
                ),
            ]);
            format!(
                "hybrid (AUTO with embeddings from {url}, model {}, queries {})",
                o.embedder_model, o.embedder_query_model
            )
        }
        None => "lexical (AUTO without embeddings, the default)".to_owned(),
    };
    println!("# The turn's context: GetContext with the question as query; recall by {search}");
    for &size in &o.sizes {
        cross(o, &binary, &env, size).await;
        within(o, &binary, &env, size).await;
    }
}

/// The server of one reading and whether its data is already loaded: on
/// a new temporary directory, or with `--keep-data` on the one kept there
/// for this reading (`name`), loaded when a run before finished loading
/// it (`mark_loaded`).
async fn kept_server(
    o: &Options,
    binary: &std::path::Path,
    env: &[(&str, &str)],
    name: String,
) -> (common::Server, Option<std::path::PathBuf>, bool) {
    let Some(keep) = &o.keep_data else {
        return (common::start_server(binary, &[], env).await, None, false);
    };
    let models = match &o.embedder {
        Some(_) => format!("{}+{}", o.embedder_model, o.embedder_query_model),
        None => "lexical".to_owned(),
    };
    let dir = keep.join(format!("{name}-seed{}-{models}", o.seed));
    let loaded = dir.join(LOADED).exists();
    if !loaded {
        // A run stopped while loading leaves a part: start again.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("remove a partly loaded data directory");
        }
        std::fs::create_dir_all(&dir).expect("create the kept data directory");
    }
    eprintln!(
        "[turn] data directory {} ({})",
        dir.display(),
        if loaded { "reused" } else { "new, kept" }
    );
    let server = common::start_server_at(binary, &dir, &[], env).await;
    (server, Some(dir), loaded)
}

/// The file in a kept data directory that says its load was drained.
const LOADED: &str = "turn-bench-loaded";

/// Marks a kept directory (`kept_server`) loaded once its load settled.
fn mark_loaded(dir: Option<&std::path::Path>, settled: bool) {
    if let (Some(dir), true) = (dir, settled) {
        std::fs::write(dir.join(LOADED), "").expect("mark the kept data directory loaded");
    }
}

/// Facts of older sessions of a subject, asked in a new one.
async fn cross(o: &Options, binary: &std::path::Path, env: &[(&str, &str)], size: usize) {
    let subjects: Vec<Subject> = (0..o.subjects)
        .map(|s| {
            Subject::new(
                format!("subject-{s}"),
                size,
                fixture::session_seed(o.seed, size, s),
                SESSIONS,
            )
        })
        .collect();
    let (server, kept, loaded) = kept_server(
        o,
        binary,
        env,
        format!("cross-{size}-subjects{}", o.subjects),
    )
    .await;
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let started = Instant::now();
    for subject in subjects.iter().filter(|_| !loaded) {
        for k in 0..SESSIONS {
            let name = subject.session_name(k);
            append_all(&mut client, &name, &subject.name, subject.session(k)).await;
        }
    }
    let (_, settled) = super::settle(&mut client, o.wait).await;
    mark_loaded(kept.as_deref(), settled);
    eprintln!(
        "[turn] {size} entries x {} subjects loaded and drained in {:.1} s (settled: {settled})",
        subjects.len(),
        started.elapsed().as_secs_f64()
    );
    let mut figures: Vec<((u32, Asked), Figures)> = CROSS_BUDGETS
        .iter()
        .flat_map(|&b| Asked::BOTH.map(|a| ((b, a), Figures::default())))
        .collect();
    for subject in &subjects {
        for (i, fact) in subject.timeline.facts.iter().enumerate() {
            for asked in Asked::BOTH {
                let session = format!("{}-now-{i}", subject.name);
                let question = asked.text(fact);
                append_all(
                    &mut client,
                    &session,
                    &subject.name,
                    &[Message {
                        speaker: fixture::Speaker::User,
                        content: question.to_owned(),
                    }],
                )
                .await;
                for &budget in &CROSS_BUDGETS {
                    let (answer, took) = context(&mut client, &session, budget, question).await;
                    if let Some((_, f)) = figures.iter_mut().find(|(k, _)| *k == (budget, asked)) {
                        f.add(fact, budget, answer, took);
                    }
                }
                client
                    .delete_session(pb::DeleteSessionRequest {
                        session_id: session.clone(),
                    })
                    .await
                    .expect("delete");
            }
        }
    }
    println!(
        "\n## Across sessions: {size} entries a subject in {SESSIONS} sessions, {} subjects, each fact asked in a new session",
        subjects.len()
    );
    for ((budget, asked), f) in &mut figures {
        println!("{budget:>5} tokens, {:<10} {}", asked.label(), f.line());
    }
    // The misses of the largest budget in the fact's own words: what
    // ranking has left to win.
    let largest = CROSS_BUDGETS[CROSS_BUDGETS.len() - 1];
    if let Some((_, f)) = figures
        .iter()
        .find(|(k, _)| *k == (largest, Asked::Question))
    {
        for miss in &f.misses {
            eprintln!("[turn] missed at {largest} tokens: {miss}");
        }
    }
    drop(server);
}

/// Facts of a session asked in it, with and without the query.
async fn within(o: &Options, binary: &std::path::Path, env: &[(&str, &str)], size: usize) {
    let sessions: Vec<Session> = (0..o.sessions)
        .map(|k| {
            fixture::generate(
                &format!("recall-{size}-{k}"),
                size,
                fixture::session_seed(o.seed, size, k),
            )
        })
        .collect();
    let (server, kept, loaded) = kept_server(
        o,
        binary,
        env,
        format!("within-{size}-sessions{}", o.sessions),
    )
    .await;
    let mut client = archivist::client::connect(&server.address)
        .await
        .expect("connect");
    let started = Instant::now();
    for s in sessions.iter().filter(|_| !loaded) {
        append_all(&mut client, &s.id, "", &s.entries).await;
    }
    let (_, settled) = super::settle(&mut client, o.wait).await;
    mark_loaded(kept.as_deref(), settled);
    eprintln!(
        "[turn] {} sessions of {size} entries loaded and drained in {:.1} s (settled: {settled})",
        sessions.len(),
        started.elapsed().as_secs_f64()
    );
    let mut plain = Figures::default();
    let mut asked: Vec<(Asked, Figures)> = Asked::BOTH.map(|a| (a, Figures::default())).into();
    for s in &sessions {
        let (answer, took) = context(&mut client, &s.id, IN_BUDGET, "").await;
        match answer {
            Ok(a) => {
                plain.took_us.push(took.as_secs_f64() * 1e6);
                plain.tokens.push(u64::from(a.estimated_tokens));
                plain.over_budget += usize::from(a.estimated_tokens > IN_BUDGET);
                let (_, cover) = items(a);
                plain.outcomes.extend(score::score(&s.facts, &cover));
            }
            Err(status) => {
                plain.errors.push(status.message().to_owned());
                plain
                    .outcomes
                    .extend(s.facts.iter().map(|_| Outcome::Missing));
            }
        }
        for fact in &s.facts {
            for (kind, f) in &mut asked {
                let (answer, took) = context(&mut client, &s.id, IN_BUDGET, kind.text(fact)).await;
                f.add(fact, IN_BUDGET, answer, took);
            }
        }
    }
    println!(
        "\n## Within a session: {} sessions of {size} entries at {IN_BUDGET} tokens",
        sessions.len()
    );
    println!("no query            {}", plain.line());
    for (kind, f) in &mut asked {
        println!("query: {:<12} {}", kind.label(), f.line());
    }
    drop(server);
}

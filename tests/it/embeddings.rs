//! Embeddings through the real server and a fake embedder (a real local
//! HTTP server, wiremock) whose vectors come from a small dictionary of
//! concepts, so that a paraphrase lands near what it paraphrases: every
//! item embedded once, failures parked or retried as their class says,
//! refused answers never stored, SEMANTIC finding what LEXICAL cannot, and
//! erasure taking the vectors out of every file.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archivist::config::{Config, EmbeddingKind};
use archivist::pb;
use serde_json::{Value, json};
use tokio_postgres::NoTls;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, eventually};

/// Words and the concept each stands for; a text's vector counts its
/// concepts, plus a small constant so that no vector is zero.
const CONCEPTS: &[(&str, usize)] = &[
    ("sister", 0),
    ("sibling", 0),
    ("female", 0),
    ("name", 1),
    ("called", 1),
    ("named", 1),
    ("car", 2),
    ("vehicle", 2),
    ("drive", 2),
    ("weather", 3),
    ("rain", 3),
];
const DIMS: usize = 6;

fn concept_vector(text: &str) -> Vec<f64> {
    let mut v = vec![0.0; DIMS];
    v[DIMS - 1] = 0.1;
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.trim_end_matches('s');
        for (w, c) in CONCEPTS {
            if w.trim_end_matches('s') == word {
                v[*c] += 1.0;
            }
        }
    }
    v
}

/// The unit f32 vector archivist stores for `text`, as its bytes.
fn stored_bytes(text: &str) -> Vec<u8> {
    let v = concept_vector(text);
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter()
        .flat_map(|x| ((x / norm) as f32).to_le_bytes())
        .collect()
}

/// A fake embedder: answers with `status` (200: the concept vectors, of
/// `dims` numbers each) and counts requests and inputs.
#[derive(Clone)]
struct Embedder {
    answers: Arc<Mutex<Vec<ResponseTemplate>>>,
    dims: usize,
    requests: Arc<AtomicUsize>,
    /// When each request came.
    times: Arc<Mutex<Vec<Instant>>>,
    inputs: Arc<Mutex<Vec<String>>>,
    /// The model each input was sent for, beside `inputs`.
    models: Arc<Mutex<Vec<String>>>,
}

impl Embedder {
    fn new(dims: usize) -> Embedder {
        Embedder {
            answers: Arc::default(),
            dims,
            requests: Arc::default(),
            times: Arc::default(),
            inputs: Arc::default(),
            models: Arc::default(),
        }
    }

    /// Answers these first, in order, then vectors.
    fn first(self, answers: Vec<ResponseTemplate>) -> Embedder {
        *self.answers.lock().expect("lock") = answers;
        self
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn inputs(&self) -> Vec<String> {
        self.inputs.lock().expect("lock").clone()
    }

    /// The inputs sent for `model`.
    fn inputs_for(&self, model: &str) -> Vec<String> {
        let inputs = self.inputs.lock().expect("lock");
        let models = self.models.lock().expect("lock").clone();
        inputs
            .clone()
            .into_iter()
            .zip(models)
            .filter(|(_, m)| m == model)
            .map(|(i, _)| i)
            .collect()
    }

    async fn mount(&self) -> MockServer {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/embeddings"))
            .respond_with(self.clone())
            .mount(&server)
            .await;
        server
    }
}

impl Respond for Embedder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.times.lock().expect("lock").push(Instant::now());
        let scripted = {
            let mut answers = self.answers.lock().expect("lock");
            (!answers.is_empty()).then(|| answers.remove(0))
        };
        if let Some(answer) = scripted {
            return answer;
        }
        let body: Value = serde_json::from_slice(&request.body).expect("json body");
        let inputs: Vec<String> = body["input"]
            .as_array()
            .expect("input list")
            .iter()
            .map(|i| i.as_str().expect("text").to_owned())
            .collect();
        // A text the embedder refuses, whatever comes with it.
        if inputs.iter().any(|i| i.contains(POISON)) {
            return ResponseTemplate::new(400).set_body_json(json!({"error": {
                "message": "input refused", "type": "invalid_request_error"}}));
        }
        // A model named "...-short" answers one number fewer.
        let dims = match body["model"].as_str() {
            Some(m) if m.ends_with("-short") => self.dims - 1,
            _ => self.dims,
        };
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let mut v = concept_vector(text);
                v.resize(dims, 0.0);
                json!({"object": "embedding", "index": index, "embedding": v})
            })
            .collect();
        let model = body["model"].as_str().unwrap_or_default().to_owned();
        // Both under the inputs' lock, so that they stay side by side.
        let mut all = self.inputs.lock().expect("lock");
        self.models
            .lock()
            .expect("lock")
            .extend(inputs.iter().map(|_| model.clone()));
        all.extend(inputs);
        ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": data}))
    }
}

fn embedding(config: &mut Config, server: &MockServer, batch: u32) {
    config.embedding.kind = EmbeddingKind::Openai;
    config.embedding.base_url = format!("{}/v1", server.uri());
    config.embedding.model = "concepts".into();
    config.embedding.batch = batch;
    config.retry.initial_backoff = Duration::from_millis(10);
    config.retry.max_backoff = Duration::from_millis(50);
    config.reconciler.interval = Duration::from_millis(100);
}

async fn backlog(server: &TestServer) -> pb::EmbeddingBacklog {
    server
        .client
        .clone()
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner()
        .embeddings
        .expect("embedding backlog")
}

async fn drained(server: &TestServer, embedded: u64) -> bool {
    eventually(Duration::from_secs(20), || async {
        let b = backlog(server).await;
        b.pending == 0 && b.embedded == embedded
    })
    .await
}

fn search(query: &str, mode: pb::SearchMode) -> pb::SearchRequest {
    pb::SearchRequest {
        query: query.to_owned(),
        mode: mode as i32,
        ..Default::default()
    }
}

async fn found(server: &TestServer, req: pb::SearchRequest) -> pb::SearchResponse {
    server
        .client
        .clone()
        .search(req)
        .await
        .expect("search")
        .into_inner()
}

fn bytes_in_any_file(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle) {
            found.push(path.display().to_string());
        }
    }
    found
}

const SISTER: &str = "My sister's name is Ingrid";
/// In a text the fake embedder refuses (400).
const POISON: &str = "Poison";
const CAR: &str = "I drive a red car to work";
const RAIN: &str = "It looks like rain today";

#[tokio::test]
async fn every_item_is_embedded_once_and_a_paraphrase_is_found_by_meaning_until_erased() {
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| embedding(c, &mock, 2)).await;
    server
        .append("s", &[SISTER, CAR, RAIN, "ok", "thanks"])
        .await;
    assert!(drained(&server, 5).await, "{:?}", backlog(&server).await);
    // Each text once, in batches of at most two.
    let mut inputs = fake.inputs();
    inputs.sort();
    let mut expected = vec![SISTER, CAR, RAIN, "ok", "thanks"];
    expected.sort();
    assert_eq!(inputs, expected);
    assert_eq!(fake.requests(), 3);

    let question = "female sibling called";
    let lexical = found(&server, search(question, pb::SearchMode::Lexical)).await;
    assert!(
        lexical.hits.iter().all(|h| h.text != SISTER),
        "{:?}",
        lexical.hits
    );
    let semantic = found(&server, search(question, pb::SearchMode::Semantic)).await;
    assert_eq!(semantic.legs, vec![pb::SearchLeg::Semantic as i32]);
    assert_eq!(semantic.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    assert_eq!(semantic.embedded_share, 1.0);
    let auto = found(&server, search(question, pb::SearchMode::Auto)).await;
    assert_eq!(
        auto.legs,
        vec![
            pb::SearchLeg::Lexical as i32,
            pb::SearchLeg::Semantic as i32
        ]
    );
    assert_eq!(auto.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    // A filter applies inside the leg: another session's scope finds nothing.
    let mut elsewhere = search(question, pb::SearchMode::Semantic);
    elsewhere.session_ids = vec!["other".into()];
    assert!(found(&server, elsewhere).await.hits.is_empty());
    // The query was embedded through the same endpoint, once per search.
    assert_eq!(fake.requests(), 3 + 3);

    server
        .client
        .clone()
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("delete");
    let after = found(&server, search(question, pb::SearchMode::Semantic)).await;
    assert!(after.hits.is_empty(), "{:?}", after.hits);
    assert_eq!(backlog(&server).await.embedded, 0);
    let needle = stored_bytes(SISTER);
    assert!(
        bytes_in_any_file(server.data_dir(), &needle).is_empty(),
        "the erased vector is still in a file"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_refused_key_is_sent_once_parks_and_a_new_configuration_unparks_it() {
    let fake = Embedder::new(DIMS)
        .first(vec![ResponseTemplate::new(401).set_body_json(
            json!({"error": {"message": "bad key", "code": "invalid_api_key"}}),
        )]);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| embedding(c, &mock, 8)).await;
    server.append("s", &[SISTER, CAR]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            backlog(&server).await.parked == 2
        })
        .await
    );
    let b = backlog(&server).await;
    assert_eq!(b.parked_by_class.get("unauthorized"), Some(&2));
    let failure = b.last_failure.expect("the last failure");
    assert_eq!(failure.http_status, Some(401));
    // Parked: no second request, however many ticks go by.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fake.requests(), 1);
    // `archivist backlog` says so, with the class, the failure and the fix.
    let shown = backlog_text(&server).await;
    for line in [
        "embeddings:",
        "  embedded: 0",
        "  pending: 0",
        "  parked: 2",
        "    unauthorized: 2",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in {shown}");
    }
    assert!(
        shown.contains("  last failure: unauthorized (HTTP 401) after 1 attempt"),
        "{shown}"
    );
    assert!(shown.contains("  fix: "), "{shown}");
    assert!(
        shown.contains("parked texts wait for another embedder configuration"),
        "{shown}"
    );
    let dir = server.stop().await;

    // The same embedder under another name is another configuration.
    let mut config = Config::default();
    embedding(&mut config, &mock, 8);
    config.embedding.base_url = config.embedding.base_url.replace("127.0.0.1", "localhost");
    let server = TestServer::start_in(dir, config, None).await;
    assert!(drained(&server, 2).await, "{:?}", backlog(&server).await);
    assert_eq!(backlog(&server).await.parked, 0);
    assert_eq!(fake.requests(), 2);
    let shown = backlog_text(&server).await;
    assert!(
        shown.contains("embeddings:\n  embedded: 2\n  pending: 0\n  parked: 0\n"),
        "{shown}"
    );
    assert!(!shown.contains("last failure"), "{shown}");
    server.stop().await;
}

/// `archivist backlog`'s text for `server`.
async fn backlog_text(server: &TestServer) -> String {
    let address = format!("http://{}", server.addr);
    let ran = crate::operator::archivist(&["backlog", "--server", &address], &[], None).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    ran.stdout
}

#[tokio::test]
async fn an_outage_is_drained_after_recovery_and_a_retry_after_is_honoured() {
    let fake = Embedder::new(DIMS).first(vec![
        ResponseTemplate::new(503),
        ResponseTemplate::new(503),
        ResponseTemplate::new(429).insert_header("retry-after", "1"),
    ]);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| {
        embedding(c, &mock, 8);
        c.retry.max_attempts = 2;
    })
    .await;
    server.append("s", &[SISTER, CAR, RAIN]).await;
    assert!(drained(&server, 3).await, "{:?}", backlog(&server).await);
    // Two 503s (one pass), the 429, and the success: nothing more.
    assert_eq!(fake.requests(), 4);
    assert_eq!(fake.inputs().len(), 3);
    // Never sooner than the Retry-After asked.
    let times = fake.times.lock().expect("lock").clone();
    assert!(
        times[3] - times[2] >= Duration::from_secs(1),
        "{:?}",
        times[3] - times[2]
    );
    server.stop().await;
}

#[tokio::test]
async fn an_answer_of_the_wrong_dimension_is_refused_and_nothing_is_stored() {
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| {
        embedding(c, &mock, 8);
        c.embedding.dimensions = 16;
        c.retry.max_attempts = 1;
    })
    .await;
    server.append("s", &[SISTER]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            backlog(&server).await.last_failure.is_some()
        })
        .await
    );
    let b = backlog(&server).await;
    assert_eq!((b.embedded, b.pending, b.parked), (0, 1, 0));
    let failure = b.last_failure.expect("failure");
    assert!(
        failure.causes.iter().any(|c| c.contains("16 are due")),
        "{:?}",
        failure.causes
    );
    assert!(matches!(
        failure.kind,
        Some(pb::failure::Kind::MalformedResponse(_))
    ));
    // The query's embedding is refused the same way: SEMANTIC fails with
    // the class's code, AUTO answers by words and says so.
    let status = server
        .client
        .clone()
        .search(search("sister", pb::SearchMode::Semantic))
        .await
        .expect_err("the query's vector is of the wrong dimension");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(crate::harness::reason(&status), "QUERY_EMBEDDING_FAILED");
    let auto = found(&server, search("sister", pb::SearchMode::Auto)).await;
    assert_eq!(auto.legs, vec![pb::SearchLeg::Lexical as i32]);
    assert_eq!(auto.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    server.stop().await;
}

/// Runs `archivist backfill --embeddings --json` on `data_dir` against the
/// embedder at `base`; returns the exit code, the report and the progress
/// lines on standard error (not a terminal).
async fn backfill_embeddings(
    data_dir: &std::path::Path,
    base: &str,
    model: &str,
    extra: &[&str],
) -> (i32, Value, Vec<String>) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_archivist"));
    command
        .args(["backfill", "--embeddings", "--json", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("ARCHIVIST_EMBEDDING_KIND", "openai")
        .env("ARCHIVIST_EMBEDDING_BASE_URL", format!("{base}/v1"))
        .env("ARCHIVIST_EMBEDDING_MODEL", model)
        .env("ARCHIVIST_EMBEDDING_BATCH", "2")
        .env("ARCHIVIST_RETRY_INITIAL_BACKOFF", "10ms");
    let out = tokio::task::spawn_blocking(move || command.output().expect("run backfill"))
        .await
        .expect("joined");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(1) && text.is_empty() {
        // Refused before any report: the error is the report.
        let error = String::from_utf8_lossy(&out.stderr).into_owned();
        return (1, json!({ "error": error }), Vec::new());
    }
    let report = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let progress = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("backfill: "))
        .map(str::to_owned)
        .collect();
    (out.status.code().expect("exit code"), report, progress)
}

#[tokio::test]
async fn history_stored_with_embeddings_off_is_owed_and_backfill_drains_it() {
    let server = TestServer::start().await;
    server.append("s", &[SISTER, CAR, RAIN]).await;
    let dir = server.stop().await;

    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let (code, report, progress) =
        backfill_embeddings(dir.path(), &mock.uri(), "concepts", &[]).await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["owed"], 3, "{report}");
    assert_eq!(report["embedded"], 3, "{report}");
    assert_eq!(report["embedded_total"], 3, "{report}");
    assert_eq!(report["pending"], 0, "{report}");
    assert_eq!(fake.inputs().len(), 3);
    assert_eq!(fake.requests(), 2);
    // Off a terminal, plain progress lines, none said twice (idle
    // batches end with nothing done), the last one the end.
    assert!(progress.windows(2).all(|w| w[0] != w[1]), "{progress:#?}");
    assert!(
        progress
            .last()
            .is_some_and(|l| l.starts_with("backfill: 3/3 texts, 3 embedded")),
        "{progress:#?}"
    );

    // Nothing is owed now: a second run sends nothing, embeds nothing and
    // counts the vectors the first stored.
    let (code, report, progress) =
        backfill_embeddings(dir.path(), &mock.uri(), "concepts", &[]).await;
    assert_eq!((code, report["owed"].clone()), (0, json!(0)));
    assert_eq!(report["embedded"], 0, "{report}");
    assert_eq!(report["embedded_total"], 3, "{report}");
    assert!(progress.is_empty(), "{progress:#?}");
    assert_eq!(fake.requests(), 2);

    // Another model: the backfill owes and embeds everything again at
    // once, each text once, and drops the old model's vectors.
    // Not without saying so: it would replace the vectors a server
    // searches.
    let (code, refused, _) = backfill_embeddings(dir.path(), &mock.uri(), "concepts-2", &[]).await;
    assert_eq!(code, 1, "{refused}");
    let said = refused["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("concepts@0") && said.contains("--allow-generation-change"),
        "{said}"
    );
    assert_eq!(fake.inputs_for("concepts-2"), Vec::<String>::new());
    let (code, report, _) = backfill_embeddings(
        dir.path(),
        &mock.uri(),
        "concepts-2",
        &["--allow-generation-change"],
    )
    .await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["generation"], "concepts-2@0", "{report}");
    assert_eq!(report["owed"], 3, "{report}");
    assert_eq!(report["embedded"], 3, "{report}");
    assert_eq!(report["embedded_total"], 3, "{report}");
    let mut again = fake.inputs_for("concepts-2");
    again.sort();
    assert_eq!(again, vec![CAR, RAIN, SISTER]);
    let conn = rusqlite::Connection::open(dir.path().join("archivist.sqlite3")).expect("open");
    let generations: Vec<String> = conn
        .prepare("SELECT DISTINCT generation FROM embeddings")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(generations, vec!["concepts-2@0"]);
    drop(conn);

    // The server, embeddings on, finds by meaning what the backfill embedded.
    let mut config = Config::default();
    embedding(&mut config, &mock, 2);
    config.embedding.model = "concepts-2".into();
    let server = TestServer::start_in(dir, config, None).await;
    let semantic = found(
        &server,
        search("female sibling called", pb::SearchMode::Semantic),
    )
    .await;
    assert_eq!(semantic.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    assert_eq!(semantic.embedded_share, 1.0);
    server.stop().await;
}

/// The server with pgvector the PostgreSQL cases use: no default (`.ci/pgvector
/// start` prints one, `.ci/run` exports it).
const VECTOR_URL_ENV: &str = "ARCHIVIST_TEST_PGVECTOR_URL";
const REQUIRE_ENV: &str = "ARCHIVIST_REQUIRE_PG";

/// A database of this test's own on the pgvector server, dropped after.
pub(crate) struct VectorDatabase {
    pub(crate) url: String,
    admin: String,
    name: String,
}

impl Drop for VectorDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((client, conn)) = tokio_postgres::connect(&admin, NoTls).await {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

impl VectorDatabase {
    /// A fresh database on the pgvector server, or None (with a notice)
    /// when none is named and none is required.
    pub(crate) async fn fresh() -> Option<VectorDatabase> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1");
        let Some(admin) = std::env::var(VECTOR_URL_ENV).ok().filter(|u| !u.is_empty()) else {
            assert!(
                !required,
                "{VECTOR_URL_ENV} is not set and {REQUIRE_ENV}=1 (.ci/pgvector start prints one)"
            );
            eprintln!("{VECTOR_URL_ENV} is not set: skipping the PostgreSQL-with-pgvector case");
            return None;
        };
        let (client, conn) = tokio_postgres::connect(&admin, NoTls)
            .await
            .unwrap_or_else(|e| panic!("{VECTOR_URL_ENV} does not answer: {e}"));
        tokio::spawn(conn);
        let name = format!(
            "archivist_vec_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let base = admin.split('?').next().unwrap_or(&admin);
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        Some(VectorDatabase {
            url: format!("{base}/{name}"),
            admin,
            name,
        })
    }

    /// What points the binary at this database.
    pub(crate) fn env(&self) -> [(&'static str, String); 2] {
        [
            ("ARCHIVIST_STORAGE_BACKEND", "postgres".to_owned()),
            ("ARCHIVIST_STORAGE_URL", self.url.clone()),
        ]
    }

    async fn count(&self, sql: &str) -> i64 {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client.query_one(sql, &[]).await.expect(sql).get(0)
    }
}

/// What the binary is given to embed through `mock` on PostgreSQL `url`.
fn binary_env(url: &str, base: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ARCHIVIST_STORAGE_BACKEND", "postgres".to_owned()),
        ("ARCHIVIST_STORAGE_URL", url.to_owned()),
        ("ARCHIVIST_EMBEDDING_KIND", "openai".to_owned()),
        ("ARCHIVIST_EMBEDDING_BASE_URL", format!("{base}/v1")),
        ("ARCHIVIST_EMBEDDING_MODEL", "concepts".to_owned()),
        ("ARCHIVIST_EMBEDDING_BATCH", "2".to_owned()),
        ("ARCHIVIST_RECONCILER_INTERVAL", "100ms".to_owned()),
        ("ARCHIVIST_RETRY_INITIAL_BACKOFF", "10ms".to_owned()),
        // Segments that never close: the texts owed are the entries only.
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "100000".to_owned()),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "10000000".to_owned()),
        ("ARCHIVIST_SEGMENT_MAX_IDLE", "1h".to_owned()),
    ]
}

async fn binary_backlog(client: &archivist::client::Client) -> pb::EmbeddingBacklog {
    client
        .clone()
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner()
        .embeddings
        .expect("embedding backlog")
}

async fn binary_search(
    client: &archivist::client::Client,
    req: pb::SearchRequest,
) -> pb::SearchResponse {
    client
        .clone()
        .search(req)
        .await
        .expect("search")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_with_pgvector_each_text_is_embedded_once_found_by_meaning_in_scope_and_erased()
{
    let Some(db) = VectorDatabase::fresh().await else {
        return;
    };
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let env = binary_env(&db.url, &mock.uri());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = crate::binary::Process::start(dir.path(), &env).await;
    let client = server.client().await;
    client
        .clone()
        .append_entries(crate::harness::append_request(
            "s",
            &[SISTER, CAR, RAIN, "ok", "thanks"],
        ))
        .await
        .expect("append");
    // A crowd outside the scope, every one nearer the question than
    // anything in "s", and more of them than the index's candidate list
    // (ef_search 40 for a limit of 10).
    let crowd: Vec<String> = (0..120)
        .map(|i| format!("sister sibling female called {i}"))
        .collect();
    let crowd: Vec<&str> = crowd.iter().map(String::as_str).collect();
    for chunk in crowd.chunks(40) {
        client
            .clone()
            .append_entries(crate::harness::append_request("crowd", chunk))
            .await
            .expect("append");
    }
    let total = 5 + crowd.len() as u64;
    let drained = eventually(Duration::from_secs(60), || async {
        let b = binary_backlog(&client).await;
        b.pending == 0 && b.embedded == total
    })
    .await;
    assert!(drained, "{:?}", binary_backlog(&client).await);
    // Each text once (every request was answered, so each input seen is
    // one embedded), in batches of at most two.
    let mut inputs = fake.inputs();
    inputs.sort();
    let mut expected: Vec<&str> = vec![SISTER, CAR, RAIN, "ok", "thanks"];
    expected.extend(&crowd);
    expected.sort();
    assert_eq!(inputs, expected);
    let sent = fake.requests();
    assert!(
        (total.div_ceil(2)..=total).contains(&(sent as u64)),
        "{sent} requests for {total} texts"
    );
    // The generation's index is there, and the vectors are counted.
    assert_eq!(
        db.count("SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'embeddings_hnsw_%'")
            .await,
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM embeddings").await,
        total as i64
    );

    let question = "female sibling called";
    let mut in_scope = search(question, pb::SearchMode::Semantic);
    in_scope.session_ids = vec!["s".into()];
    let semantic = binary_search(&client, in_scope.clone()).await;
    assert_eq!(semantic.legs, vec![pb::SearchLeg::Semantic as i32]);
    assert_eq!(semantic.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    // Every text of the scope comes back (five, under the limit of ten),
    // however many nearer ones lie outside it.
    assert_eq!(semantic.hits.len(), 5, "{:?}", semantic.hits);
    assert!(semantic.hits.iter().all(|h| h.session_id == "s"));
    assert_eq!(semantic.embedded_share, 1.0);
    let lexical = binary_search(&client, {
        let mut r = search(question, pb::SearchMode::Lexical);
        r.session_ids = vec!["s".into()];
        r
    })
    .await;
    assert!(lexical.hits.iter().all(|h| h.text != SISTER));
    let mut auto = search(question, pb::SearchMode::Auto);
    auto.session_ids = vec!["s".into()];
    let auto = binary_search(&client, auto).await;
    assert_eq!(auto.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    // The whole tenant: the crowd is nearest.
    let everywhere = binary_search(&client, search(question, pb::SearchMode::Semantic)).await;
    assert_eq!(everywhere.hits.len(), 10);
    // One query embedded per search that needs one (lexical needs none).
    assert_eq!(fake.requests(), sent + 3);

    client
        .clone()
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s".into(),
        })
        .await
        .expect("delete");
    assert!(binary_search(&client, in_scope).await.hits.is_empty());
    // The rows are gone, in the erasure's transaction: only the crowd's
    // vectors are left, and nothing is owed.
    assert_eq!(
        db.count("SELECT count(*) FROM embeddings").await,
        crowd.len() as i64
    );
    assert_eq!(db.count("SELECT count(*) FROM embeddings_owed").await, 0);
    assert_eq!(binary_backlog(&client).await.embedded, crowd.len() as u64);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_without_pgvector_is_refused_at_start_up_by_name() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let available = client
        .query_opt(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'",
            &[],
        )
        .await
        .expect("extensions");
    if available.is_some() {
        eprintln!("the plain PostgreSQL server has pgvector: nothing to refuse here");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let env = binary_env(&db.url, "http://127.0.0.1:9");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_archivist"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn archivist");
    let exited = eventually(Duration::from_secs(30), || {
        let done = matches!(child.try_wait(), Ok(Some(_)));
        async move { done }
    })
    .await;
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(exited, "the server started without pgvector: {stderr}");
    assert!(!out.status.success());
    assert!(
        stderr.contains("`vector` extension") && stderr.contains("pgvector"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_new_model_re_embeds_everything_once_in_the_background_while_search_answers() {
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let fillers: Vec<String> = (0..20).map(|i| format!("filler {i}")).collect();
    let mut history: Vec<&str> = vec![SISTER, CAR, RAIN];
    history.extend(fillers.iter().map(String::as_str));
    let server = TestServer::start_with(|c| embedding(c, &mock, 4)).await;
    server.append("s", &history).await;
    assert!(drained(&server, 23).await, "{:?}", backlog(&server).await);
    assert_eq!(fake.inputs_for("concepts").len(), 23);
    let dir = server.stop().await;

    // Another model: a new generation. A text a tick (reembed_rate 10 a
    // second, ticks of 100 ms): the history comes back over many ticks.
    let mut config = Config::default();
    embedding(&mut config, &mock, 4);
    config.embedding.model = "concepts-2".into();
    config.embedding.reembed_rate = 10;
    let server = TestServer::start_in(dir, config, None).await;
    let question = "female sibling called";
    let appender = {
        let client = server.client.clone();
        tokio::spawn(async move {
            for i in 0..30 {
                client
                    .clone()
                    .append_entries(crate::harness::append_request(
                        "t",
                        &[&format!("fresh {i}")],
                    ))
                    .await
                    .expect("append while re-embedding");
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    // Search answers throughout: the words find the sister lexically every
    // time, the meaning once her new vector is stored; nothing fails.
    let mut searches = 0;
    let mut shares = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        searches += 1;
        let auto = found(&server, search("sister name", pb::SearchMode::Auto)).await;
        assert!(
            auto.hits.iter().any(|h| h.text == SISTER),
            "{:?}",
            auto.hits
        );
        let semantic = found(&server, search(question, pb::SearchMode::Semantic)).await;
        shares.push(semantic.embedded_share);
        let b = backlog(&server).await;
        if appender.is_finished()
            && b.pending == 0
            && b.embedded == 23 + 30
            && semantic.hits.first().map(|h| h.text.as_str()) == Some(SISTER)
        {
            break;
        }
        assert!(Instant::now() < end, "{b:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(searches > 2);
    let last = found(&server, search(question, pb::SearchMode::Semantic)).await;
    assert!(
        shares.first().is_some_and(|s| *s < 1.0) && last.embedded_share == 1.0,
        "{shares:?} then {}",
        last.embedded_share
    );
    // Each text once under the new model (queries aside).
    let mut stored: Vec<String> = fake
        .inputs_for("concepts-2")
        .into_iter()
        .filter(|i| !["female sibling called", "sister name"].contains(&i.as_str()))
        .collect();
    stored.sort();
    let mut expected: Vec<String> = history.iter().map(|t| (*t).to_owned()).collect();
    expected.extend((0..30).map(|i| format!("fresh {i}")));
    expected.sort();
    assert_eq!(stored, expected);
    // Complete: the old model's vectors are dropped.
    let db = server.data_dir().join("archivist.sqlite3");
    let old_vectors = || {
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .expect("open");
        conn.query_row(
            "SELECT count(*) FROM embeddings WHERE generation = 'concepts@0'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .expect("count")
    };
    assert!(
        eventually(Duration::from_secs(20), || async { old_vectors() == 0 }).await,
        "{} old vectors left",
        old_vectors()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_query_model_embeds_the_query_and_only_the_query() {
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| {
        embedding(c, &mock, 8);
        c.embedding.query_model = "concepts-query".into();
    })
    .await;
    server.append("s", &[SISTER, CAR]).await;
    assert!(drained(&server, 2).await, "{:?}", backlog(&server).await);
    let semantic = found(
        &server,
        search("female sibling called", pb::SearchMode::Semantic),
    )
    .await;
    assert_eq!(semantic.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    let mut texts = fake.inputs_for("concepts");
    texts.sort();
    assert_eq!(texts, vec![CAR, SISTER]);
    assert_eq!(
        fake.inputs_for("concepts-query"),
        vec!["female sibling called"]
    );
    // The query model is no other generation: the stored vectors count.
    assert_eq!(semantic.embedded_share, 1.0);
    let dir = server.stop().await;

    // A query model of another length: a configuration to fix, said so,
    // not a failure to retry; AUTO answers by words meanwhile.
    let mut config = Config::default();
    embedding(&mut config, &mock, 8);
    config.embedding.query_model = "concepts-short".into();
    let server = TestServer::start_in(dir, config, None).await;
    let refused = server
        .client
        .clone()
        .search(search("female sibling called", pb::SearchMode::Semantic))
        .await
        .expect_err("another length");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("embedding.query_model"),
        "{}",
        refused.message()
    );
    let auto = found(&server, search("sister name", pb::SearchMode::Auto)).await;
    assert_eq!(auto.legs, vec![pb::SearchLeg::Lexical as i32]);
    assert_eq!(auto.hits.first().map(|h| h.text.as_str()), Some(SISTER));
    server.stop().await;
}

#[tokio::test]
async fn a_text_the_embedder_refuses_parks_alone_and_its_batch_is_embedded_apart() {
    let fake = Embedder::new(DIMS);
    let mock = fake.mount().await;
    let server = TestServer::start_with(|c| embedding(c, &mock, 4)).await;
    server
        .append("s", &[SISTER, "Poison pill text", CAR, RAIN])
        .await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            let b = backlog(&server).await;
            b.embedded == 3 && b.parked == 1
        })
        .await,
        "{:?}",
        backlog(&server).await
    );
    let b = backlog(&server).await;
    assert_eq!(b.parked_by_class.get("invalid_request"), Some(&1));
    // The batch, then its halves, then the refused half's halves: each
    // innocent text stored once, the refused one sent three times.
    let mut stored = fake.inputs();
    stored.sort();
    assert_eq!(stored, vec![CAR, RAIN, SISTER]);
    assert_eq!(fake.requests(), 5);
    // Parked: no request more, however many ticks go by.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.requests(), 5);
    server.stop().await;
}

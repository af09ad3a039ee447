//! Embeddings between tenants and subjects, through the real server and a
//! fake embedder (a real local HTTP server, wiremock): a failure that
//! quotes its inputs (an embedder echoing them in a 422) is stored only
//! with its owner's texts and goes with their erasure; a slow embedder
//! holds neither every call slot in one tenant's searches nor more query
//! embeddings at once than `embedding.max_concurrent_queries`; texts an
//! embedder's Retry-After put off are counted and brought back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archivist::client::Client;
use archivist::config::{Config, EmbeddingKind};
use archivist::pb;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, append_request, eventually, reason};
use crate::lifecycle::in_any_file;
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

const DIMS: usize = 4;
/// The model name queries are embedded with, told apart from the texts'.
const QUERY_MODEL: &str = "concepts-query";

/// Given a request's inputs, an answer other than vectors (or None).
type Answer = dyn Fn(&[String]) -> Option<ResponseTemplate> + Send + Sync;

/// A fake embedder: vectors of `DIMS` numbers, or what `answer` says
/// instead; counts requests and remembers when each came, for texts and for
/// queries apart.
#[derive(Clone, Default)]
struct Embedder {
    /// Given the request's inputs, an answer other than vectors.
    answer: Option<Arc<Answer>>,
    /// How long every query's answer takes.
    query_delay: Duration,
    text_requests: Arc<AtomicUsize>,
    texts_embedded: Arc<Mutex<Vec<String>>>,
    /// When each query request came.
    queries: Arc<Mutex<Vec<Instant>>>,
}

impl Embedder {
    async fn mount(&self) -> MockServer {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/embeddings"))
            .respond_with(self.clone())
            .mount(&server)
            .await;
        server
    }

    fn text_requests(&self) -> usize {
        self.text_requests.load(Ordering::SeqCst)
    }

    fn query_times(&self) -> Vec<Instant> {
        self.queries.lock().expect("lock").clone()
    }

    /// The most query requests the embedder held at once: each is held
    /// from its arrival for `query_delay` at least, so requests that
    /// arrived within `query_delay` of each other were all in flight
    /// together at the client.
    fn most_queries_at_once(&self) -> usize {
        let times = self.query_times();
        times
            .iter()
            .map(|t| {
                times
                    .iter()
                    .filter(|u| *u <= t && t.duration_since(**u) < self.query_delay)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

impl Respond for Embedder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).expect("json body");
        let inputs: Vec<String> = body["input"]
            .as_array()
            .expect("input list")
            .iter()
            .map(|i| i.as_str().expect("text").to_owned())
            .collect();
        let vectors = |inputs: &[String]| {
            let data: Vec<Value> = (0..inputs.len())
                .map(|index| {
                    let mut v = vec![0.1; DIMS];
                    v[index % DIMS] = 1.0;
                    json!({"object": "embedding", "index": index, "embedding": v})
                })
                .collect();
            ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": data}))
        };
        if body["model"].as_str() == Some(QUERY_MODEL) {
            self.queries.lock().expect("lock").push(Instant::now());
            return vectors(&inputs).set_delay(self.query_delay);
        }
        self.text_requests.fetch_add(1, Ordering::SeqCst);
        if let Some(answer) = self.answer.as_ref().and_then(|a| a(&inputs)) {
            return answer;
        }
        self.texts_embedded
            .lock()
            .expect("lock")
            .extend(inputs.iter().cloned());
        vectors(&inputs)
    }
}

fn embedding(config: &mut Config, server: &MockServer) {
    config.embedding.kind = EmbeddingKind::Openai;
    config.embedding.base_url = format!("{}/v1", server.uri());
    config.embedding.model = "concepts".into();
    config.embedding.query_model = QUERY_MODEL.into();
    config.retry.initial_backoff = Duration::from_millis(10);
    config.retry.max_backoff = Duration::from_millis(50);
    config.reconciler.interval = Duration::from_millis(100);
}

async fn embeddings_of(client: &Client) -> pb::EmbeddingBacklog {
    client
        .clone()
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner()
        .embeddings
        .expect("embedding backlog")
}

/// Everything a backlog's last failure says, as one text.
fn quoted(backlog: &pb::EmbeddingBacklog) -> String {
    backlog
        .last_failure
        .as_ref()
        .map(|f| format!("{} {}", f.causes.join(" "), f.hint))
        .unwrap_or_default()
}

fn of(session: &str, subject: &str, text: &str) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        subject: subject.to_owned(),
        ..append_request(session, &[text])
    }
}

const A_SECRET: &str = "card-PIN-ocelot";
const ADA_SECRET: &str = "ada-PIN-heron";
const BOB_NOTE: &str = "bob-note-walrus";
const B_NOTE: &str = "b-note-badger";

#[tokio::test]
async fn an_echoed_input_stays_with_its_owner_and_goes_with_its_erasure() {
    // Every text is owed before the embedder is first asked (the first
    // server has embeddings off), so that one claim could take them all.
    let first = TestServer::start_with(tenants).await;
    let (a, b) = (
        client(&first, Some(TOKEN_A)).await,
        client(&first, Some(TOKEN_B)).await,
    );
    for (c, request) in [
        (&a, of("a1", "", A_SECRET)),
        (&b, of("b1", "", B_NOTE)),
        (&a, of("ada1", "ada", ADA_SECRET)),
        (&a, of("bob1", "bob", BOB_NOTE)),
    ] {
        c.clone().append_entries(request).await.expect("append");
    }
    let dir = first.stop().await;

    // An embedder that refuses every batch, echoing its inputs in a 422
    // as some gateways do.
    let fake = Embedder {
        answer: Some(Arc::new(|inputs: &[String]| {
            Some(ResponseTemplate::new(422).set_body_json(json!({"error": {
                "message": format!("invalid input: {}", inputs.join(" | ")),
                "type": "invalid_request_error"}})))
        })),
        ..Embedder::default()
    };
    let embedder = fake.mount().await;
    let mut config = Config::default();
    tenants(&mut config);
    embedding(&mut config, &embedder);
    let server = TestServer::start_in(dir, config, None).await;
    let (a, b) = (
        client(&server, Some(TOKEN_A)).await,
        client(&server, Some(TOKEN_B)).await,
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            embeddings_of(&a).await.parked == 3 && embeddings_of(&b).await.parked == 1
        })
        .await,
        "every text parked: {:?} {:?}",
        embeddings_of(&a).await,
        embeddings_of(&b).await
    );
    // The echo reaches the stored failure: B sees its own text, and no
    // other tenant's.
    let seen_by_b = quoted(&embeddings_of(&b).await);
    assert!(seen_by_b.contains(B_NOTE), "{seen_by_b}");
    for foreign in [A_SECRET, ADA_SECRET, BOB_NOTE] {
        assert!(!seen_by_b.contains(foreign), "{seen_by_b}");
    }

    // Erasing a subject leaves no failure quoting its text, in the answer
    // or in any file; the other subject's failure stays.
    let erased = a
        .clone()
        .delete_subject(pb::DeleteSubjectRequest {
            subject: "ada".into(),
        })
        .await
        .expect("delete subject")
        .into_inner();
    assert_eq!(erased.sessions_deleted, 1);
    let seen_by_a = quoted(&embeddings_of(&a).await);
    assert!(!seen_by_a.contains(ADA_SECRET), "{seen_by_a}");
    assert_eq!(
        in_any_file(server.data_dir(), ADA_SECRET),
        Vec::<String>::new()
    );
    assert!(!in_any_file(server.data_dir(), BOB_NOTE).is_empty());

    // And erasing a session the same, for every tenant.
    a.clone()
        .delete_session(pb::DeleteSessionRequest {
            session_id: "a1".into(),
        })
        .await
        .expect("delete session");
    for c in [&a, &b] {
        let seen = quoted(&embeddings_of(c).await);
        assert!(!seen.contains(A_SECRET), "{seen}");
    }
    assert_eq!(
        in_any_file(server.data_dir(), A_SECRET),
        Vec::<String>::new()
    );
    let backlog = embeddings_of(&a).await;
    assert_eq!(backlog.parked, 1, "bob's text is still parked");
    assert!(quoted(&backlog).contains(BOB_NOTE));
}

/// An AUTO (or SEMANTIC) search of `query`.
fn search(query: &str, mode: pb::SearchMode) -> pb::SearchRequest {
    pb::SearchRequest {
        query: query.to_owned(),
        mode: mode as i32,
        limit: 5,
        ..pb::SearchRequest::default()
    }
}

#[tokio::test]
async fn a_slow_embedder_holds_neither_every_call_slot_nor_more_queries_than_the_cap() {
    const CAP: usize = 3;
    const SLOTS: u32 = 16;
    const SEARCHES: usize = 40;
    let fake = Embedder {
        query_delay: Duration::from_secs(4),
        ..Embedder::default()
    };
    let embedder = fake.mount().await;
    let server = TestServer::start_with(|c| {
        tenants(c);
        embedding(c, &embedder);
        c.embedding.max_concurrent_queries = CAP as u32;
        c.limits.max_concurrent_calls = SLOTS;
    })
    .await;
    let (a, b) = (
        client(&server, Some(TOKEN_A)).await,
        client(&server, Some(TOKEN_B)).await,
    );
    a.clone()
        .append_entries(append_request("s", &["the heron flies at dawn"]))
        .await
        .expect("append");
    // Found by words first, so that every search has hits either way.
    assert!(
        eventually(Duration::from_secs(10), || async {
            a.clone()
                .search(search("heron", pb::SearchMode::Lexical))
                .await
                .is_ok_and(|r| !r.into_inner().hits.is_empty())
        })
        .await
    );

    // Many searches of A at once, against an embedder that takes 4 s.
    let searches: Vec<_> = (0..SEARCHES)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                a.clone()
                    .search(search("heron", pb::SearchMode::Auto))
                    .await
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || async {
            !fake.query_times().is_empty()
        })
        .await
    );
    // Meanwhile B's appends are served.
    let mut appended = 0;
    for i in 0..10 {
        let text = format!("b text {i}");
        if b.clone()
            .append_entries(append_request("b", &[&text]))
            .await
            .is_ok()
        {
            appended += 1;
        }
    }
    assert_eq!(appended, 10, "B's appends beside A's searches");

    let (mut answered, mut lexical_only, mut refused) = (0, 0, 0);
    for s in searches {
        match s.await.expect("search task") {
            Ok(found) => {
                answered += 1;
                let found = found.into_inner();
                assert!(!found.hits.is_empty(), "found by words at least");
                if found.legs == [pb::SearchLeg::Lexical as i32] {
                    lexical_only += 1;
                }
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert_eq!(reason(&status), "TOO_MANY_SEARCHES");
                assert!(status.get_error_details().retry_info().is_some());
                refused += 1;
            }
        }
    }
    // Half the slots for A's searches; of those, the cap had their query
    // embedded and the rest searched by words after their wait.
    assert!(answered >= SLOTS as usize / 2, "{answered} answered");
    assert!(refused > 0, "A's searches over half the slots are refused");
    assert!(
        lexical_only >= answered - CAP,
        "{lexical_only} by words only"
    );
    let most = fake.most_queries_at_once();
    assert!(most <= CAP, "{most} query embeddings at once");
    assert!(fake.query_times().len() <= answered);

    // With the cap taken, SEMANTIC is refused as rate limited, with a
    // wait to retry after; AUTO answers by words.
    let holding: Vec<_> = (0..CAP)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                a.clone()
                    .search(search("heron", pb::SearchMode::Auto))
                    .await
            })
        })
        .collect();
    let before = fake.query_times().len();
    assert!(
        eventually(Duration::from_secs(10), || async {
            fake.query_times().len() == before + CAP
        })
        .await
    );
    let status = a
        .clone()
        .search(search("heron", pb::SearchMode::Semantic))
        .await
        .expect_err("no turn at the embedder");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "QUERY_EMBEDDING_FAILED");
    let details = status.get_error_details();
    assert_eq!(
        details
            .error_info()
            .and_then(|i| i.metadata.get("class"))
            .map(String::as_str),
        Some("rate_limited")
    );
    assert!(details.retry_info().is_some());
    let found = a
        .clone()
        .search(search("heron", pb::SearchMode::Auto))
        .await
        .expect("AUTO answers")
        .into_inner();
    assert_eq!(found.legs, [pb::SearchLeg::Lexical as i32]);
    assert!(!found.hits.is_empty());
    assert_eq!(fake.query_times().len(), before + CAP);
    for h in holding {
        h.await.expect("task").expect("search");
    }
}

#[tokio::test]
async fn texts_a_retry_after_put_off_for_30_days_are_counted_and_a_requeue_brings_them_back() {
    // One 429 with an absurd Retry-After (capped at 30 days), then vectors.
    let told = Arc::new(AtomicUsize::new(0));
    let fake = Embedder {
        answer: Some(Arc::new(move |_: &[String]| {
            (told.fetch_add(1, Ordering::SeqCst) == 0).then(|| {
                ResponseTemplate::new(429)
                    .insert_header("retry-after", "999999999")
                    .set_body_json(json!({"error": {"message": "slow down"}}))
            })
        })),
        ..Embedder::default()
    };
    let embedder = fake.mount().await;
    let server = TestServer::start_with(|c| {
        embedding(c, &embedder);
        c.metrics.listen = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    server.append("s", &["put off"]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            embeddings_of(&server.client).await.deferred == 1
        })
        .await,
        "{:?}",
        embeddings_of(&server.client).await
    );
    let backlog = embeddings_of(&server.client).await;
    assert_eq!((backlog.pending, backlog.parked), (1, 0));
    assert!(matches!(
        backlog.last_failure.and_then(|f| f.kind),
        Some(pb::failure::Kind::RateLimited(_))
    ));
    // Where an operator looks: the metrics say so too.
    let scraped = scrape(&metrics_at(&server).await).await;
    assert!(
        scraped
            .lines()
            .any(|l| l == "archivist_embeddings{state=\"deferred\"} 1"),
        "{scraped}"
    );
    // Put off: several reconciler rounds ask nothing more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.text_requests(), 1);

    // A requeue of another session makes nothing due; of every session,
    // the text, which is embedded at once.
    let requeue = |session: &str| pb::RequeueSegmentsRequest {
        session_id: session.to_owned(),
        ..pb::RequeueSegmentsRequest::default()
    };
    server.append("other", &["not put off"]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            embeddings_of(&server.client).await.embedded == 1
        })
        .await
    );
    let requeued = server
        .client
        .clone()
        .requeue_segments(requeue("other"))
        .await
        .expect("requeue")
        .into_inner();
    assert_eq!(requeued.embeddings_requeued, 0);
    let requeued = server
        .client
        .clone()
        .requeue_segments(requeue(""))
        .await
        .expect("requeue")
        .into_inner();
    assert_eq!((requeued.requeued, requeued.embeddings_requeued), (0, 1));
    assert!(
        eventually(Duration::from_secs(20), || async {
            embeddings_of(&server.client).await.embedded == 2
        })
        .await
    );
    let backlog = embeddings_of(&server.client).await;
    assert_eq!((backlog.pending, backlog.deferred), (0, 0));
    // The first batch, the other session's, and the one requeued.
    assert_eq!(fake.text_requests(), 3);
}

/// The address the server's metrics endpoint listens at, from its log line.
pub(crate) async fn metrics_at(server: &TestServer) -> String {
    let data_dir = server.data_dir().display().to_string();
    let logged = || {
        crate::logs::lines()
            .into_iter()
            .find(|l| l.contains("metrics at /metrics") && l.contains(&data_dir))
    };
    assert!(eventually(Duration::from_secs(5), || async { logged().is_some() }).await);
    logged()
        .unwrap_or_default()
        .split("metrics=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("address")
        .to_owned()
}

pub(crate) async fn scrape(addr: &str) -> String {
    // reqwest is built without a default TLS provider (the server's own
    // client installs one); a caller may scrape before any is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body")
}

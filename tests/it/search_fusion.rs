//! How Search fuses its two legs, through the real binary on each backend
//! (SQLite; PostgreSQL with pgvector when `ARCHIVIST_TEST_PGVECTOR_URL`
//! names one) and a fake embedder (wiremock) whose vectors are set by
//! hand: a text found only by meaning, and near the question, ranks above
//! texts that share only "what", "is" and "my" with it; `min_similarity`
//! drops what only meaning found below it and keeps what the words found;
//! every hit says its cosine and its place in each leg.

use std::time::Duration;

use archivist::pb;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::embeddings::VectorDatabase;
use crate::harness::{append_request, eventually, reason};

/// Words and the axis each pulls a text towards; every text also has a
/// small constant on the last axis, so no vector is zero.
const AXES: &[(&str, usize)] = &[
    ("profession", 0),
    ("nurse", 0),
    ("weekend", 1),
    ("dog", 2),
    ("quantum", 3),
];
const DIMS: usize = 5;

fn vector(text: &str) -> Vec<f64> {
    let mut v = vec![0.0; DIMS];
    v[DIMS - 1] = 0.1;
    for word in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        for (w, axis) in AXES {
            if *w == word {
                v[*axis] += 1.0;
            }
        }
    }
    v
}

/// The cosine the server computes for two texts (single precision).
pub(crate) fn cosine(a: &str, b: &str) -> f32 {
    let (a, b) = (vector(a), vector(b));
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    (dot / (norm(&a) * norm(&b))) as f32
}

pub(crate) struct Embedder;

impl Respond for Embedder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).expect("json body");
        let data: Vec<Value> = body["input"]
            .as_array()
            .expect("input list")
            .iter()
            .enumerate()
            .map(|(index, text)| {
                json!({"object": "embedding", "index": index,
                       "embedding": vector(text.as_str().expect("text"))})
            })
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": data}))
    }
}

/// Found by meaning only: none of the question's words.
const NURSE: &str = "I work nights as a nurse at the city hospital";
/// Found by words only through "what", "is" and "my".
pub(crate) const SMALL_TALK: &[&str] = &[
    "What is my plan for the weekend?",
    "My dog is called Rex and what a dog he is",
    "What is my sister doing? My guess is she is asleep",
    "Is my coat dry yet? What a day it is",
];
/// Neither: found by meaning only, far from the question.
pub(crate) const BUS: &str = "The bus leaves at noon";
pub(crate) const QUESTION: &str = "What is my profession?";

fn search(mode: pb::SearchMode, min_similarity: Option<f32>) -> pb::SearchRequest {
    pb::SearchRequest {
        query: QUESTION.to_owned(),
        mode: mode as i32,
        min_similarity,
        ..Default::default()
    }
}

async fn run(client: &archivist::client::Client, req: pb::SearchRequest) -> pb::SearchResponse {
    client
        .clone()
        .search(req)
        .await
        .expect("search")
        .into_inner()
}

fn texts(resp: &pb::SearchResponse) -> Vec<&str> {
    resp.hits.iter().map(|h| h.text.as_str()).collect()
}

/// The binary with `env` (which picks the backend) embedding with
/// `Embedder` at a fake provider, its segments never closing (the texts
/// are the entries only); the provider and the data directory live as
/// long as it must.
pub(crate) async fn served_with_embedder(
    env: &[(&str, String)],
) -> (MockServer, tempfile::TempDir, crate::binary::Process) {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/embeddings"))
        .respond_with(Embedder)
        .mount(&mock)
        .await;
    let mut env: Vec<(&str, String)> = env.to_vec();
    env.extend([
        ("ARCHIVIST_EMBEDDING_KIND", "openai".to_owned()),
        ("ARCHIVIST_EMBEDDING_BASE_URL", format!("{}/v1", mock.uri())),
        ("ARCHIVIST_EMBEDDING_MODEL", "axes".to_owned()),
        ("ARCHIVIST_RECONCILER_INTERVAL", "100ms".to_owned()),
        // Segments that never close: the texts are the entries only.
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "100000".to_owned()),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "10000000".to_owned()),
        ("ARCHIVIST_SEGMENT_MAX_IDLE", "1h".to_owned()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let server = crate::binary::Process::start(dir.path(), &env).await;
    (mock, dir, server)
}

/// The whole story on one server: `env` picks the backend.
async fn fusion_on(env: &[(&str, String)]) {
    let (_mock, _dir, server) = served_with_embedder(env).await;
    let client = server.client().await;
    let mut all: Vec<&str> = SMALL_TALK.to_vec();
    all.extend([NURSE, BUS]);
    client
        .clone()
        .append_entries(append_request("s", &all))
        .await
        .expect("append");
    let embedded = eventually(Duration::from_secs(60), || async {
        let b = client
            .clone()
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner()
            .embeddings
            .expect("embedding backlog");
        b.pending == 0 && b.embedded == all.len() as u64
    })
    .await;
    assert!(embedded, "every text embedded");

    // By words: the small talk, through "what", "is" and "my"; never the
    // nurse. No cosine, no semantic place.
    let lexical = run(&client, search(pb::SearchMode::Lexical, None)).await;
    let mut found = texts(&lexical);
    found.sort_unstable();
    let mut small_talk = SMALL_TALK.to_vec();
    small_talk.sort_unstable();
    assert_eq!(found, small_talk);
    // Each hit's place in the leg (what is true now first may move a hit
    // afterwards, so a place need not be its place in the answer).
    let mut places: Vec<u32> = lexical.hits.iter().map(|h| h.lexical_rank).collect();
    places.sort_unstable();
    assert_eq!(places, (1..=SMALL_TALK.len() as u32).collect::<Vec<_>>());
    for h in &lexical.hits {
        assert_eq!((h.semantic_rank, h.similarity), (0, 0.0), "{h:?}");
        assert_eq!(h.legs, vec![pb::SearchLeg::Lexical as i32]);
    }

    // By meaning: the nurse first, with its cosine; every text is in this
    // small scope, each with its own cosine and place.
    let semantic = run(&client, search(pb::SearchMode::Semantic, None)).await;
    assert_eq!(semantic.hits.len(), all.len(), "{:?}", texts(&semantic));
    assert_eq!(semantic.hits[0].text, NURSE);
    assert_eq!(semantic.hits[0].semantic_rank, 1);
    let mut places: Vec<u32> = semantic.hits.iter().map(|h| h.semantic_rank).collect();
    places.sort_unstable();
    assert_eq!(places, (1..=all.len() as u32).collect::<Vec<_>>());
    for h in &semantic.hits {
        assert_eq!(h.lexical_rank, 0, "{h:?}");
        let want = cosine(QUESTION, &h.text);
        assert!((h.similarity - want).abs() < 1e-5, "{h:?}: cosine {want}");
    }
    assert!(semantic.hits[0].similarity > 0.99);

    // Both: the text found only by meaning, and near, comes first; the
    // small talk (found by both legs, by words of no weight) after it.
    let auto = run(&client, search(pb::SearchMode::Auto, None)).await;
    assert_eq!(auto.hits.len(), all.len(), "{:?}", texts(&auto));
    let first = &auto.hits[0];
    assert_eq!(first.text, NURSE, "{:?}", texts(&auto));
    assert_eq!(first.legs, vec![pb::SearchLeg::Semantic as i32]);
    assert_eq!((first.lexical_rank, first.semantic_rank), (0, 1));
    assert!((first.similarity - cosine(QUESTION, NURSE)).abs() < 1e-5);
    for h in &auto.hits[1..] {
        let talk = SMALL_TALK.contains(&h.text.as_str());
        // Each leg's place is the one it had alone.
        let place = |r: &pb::SearchResponse, of: fn(&pb::SearchHit) -> u32| {
            r.hits.iter().find(|o| o.text == h.text).map_or(0, of)
        };
        assert_eq!(
            (h.lexical_rank, h.semantic_rank),
            (
                place(&lexical, |o| o.lexical_rank),
                place(&semantic, |o| o.semantic_rank)
            ),
            "{h:?}"
        );
        assert_eq!(talk, h.lexical_rank > 0, "{h:?}");
        assert!((h.similarity - cosine(QUESTION, &h.text)).abs() < 1e-5);
    }

    // A threshold between the nurse and the rest: what only meaning found
    // below it goes (the bus); what the words found stays, whatever its
    // cosine.
    let least = 0.5;
    assert!(
        cosine(QUESTION, BUS) < least && SMALL_TALK.iter().all(|t| cosine(QUESTION, t) < least)
    );
    let kept = run(&client, search(pb::SearchMode::Auto, Some(least))).await;
    assert_eq!(kept.hits.len(), all.len() - 1, "{:?}", texts(&kept));
    assert_eq!(kept.hits[0].text, NURSE);
    assert!(!texts(&kept).contains(&BUS));
    assert!(SMALL_TALK.iter().all(|t| texts(&kept).contains(t)));
    // By meaning alone, only the nurse is near enough.
    let near = run(&client, search(pb::SearchMode::Semantic, Some(least))).await;
    assert_eq!(texts(&near), vec![NURSE]);
    // A threshold at a hit's own similarity keeps it (both are single
    // precision).
    let at = semantic.hits[1].similarity;
    let exact = run(&client, search(pb::SearchMode::Semantic, Some(at))).await;
    let at_least = semantic.hits.iter().filter(|h| h.similarity >= at).count();
    assert!(at_least >= 2);
    assert_eq!(exact.hits.len(), at_least, "{:?}", texts(&exact));
    // Nothing in memory near a question no word of which is stored:
    // "nothing relevant" is an empty answer, not the nearest texts.
    let mut elsewhere = search(pb::SearchMode::Auto, Some(least));
    elsewhere.query = "quantum chromodynamics".to_owned();
    let none = run(&client, elsewhere.clone()).await;
    assert!(none.hits.is_empty(), "{:?}", texts(&none));
    elsewhere.min_similarity = None;
    assert_eq!(run(&client, elsewhere).await.hits.len(), all.len());

    // A threshold that is no cosine is refused, named.
    for bad in [f32::NAN, 1.5, -1.01, f32::INFINITY] {
        let status = client
            .clone()
            .search(search(pb::SearchMode::Auto, Some(bad)))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
        assert_eq!(reason(&status), "INVALID_MIN_SIMILARITY");
        let violations = status.get_details_bad_request().expect("violations");
        assert_eq!(violations.field_violations[0].field, "min_similarity");
    }
    // Its bounds are cosines' own.
    for fine in [-1.0, 1.0] {
        run(&client, search(pb::SearchMode::Auto, Some(fine))).await;
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_near_text_found_by_meaning_only_ranks_above_small_talk_and_min_similarity_keeps_the_words()
 {
    fusion_on(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_pgvector_a_near_text_found_by_meaning_only_ranks_above_small_talk_and_min_similarity_keeps_the_words()
 {
    let Some(db) = VectorDatabase::fresh().await else {
        return;
    };
    fusion_on(&db.env()).await;
}

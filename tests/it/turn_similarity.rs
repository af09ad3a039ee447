//! The turn's context with embeddings on, through the real binary (SQLite;
//! PostgreSQL with pgvector when `ARCHIVIST_TEST_PGVECTOR_URL` names one)
//! and the fake embedder of `search_fusion`: GetContext's `min_similarity`
//! drops from the recall what only meaning found below it, so a question
//! nothing in memory answers recalls nothing, while what the words found
//! stays; a threshold that is no cosine is refused as Search refuses it;
//! and `archivist session context --min-similarity` passes it on.

use std::time::Duration;

use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::embeddings::VectorDatabase;
use crate::harness::{append_request, eventually, reason};
use crate::operator::context_at_least;
use crate::search_fusion::{BUS, QUESTION, SMALL_TALK, cosine};

/// Found by meaning only (no word of the question), near it but not on
/// it: between the two thresholds below.
const NEAR: &str = "I work nights as a nurse and walk the dog after";
const LOW: f32 = 0.5;
const HIGH: f32 = 0.9;

fn ask(query: &str, min_similarity: Option<f32>) -> pb::GetContextRequest {
    pb::GetContextRequest {
        session_id: "ada-fri".to_owned(),
        max_tokens: 2000,
        query: query.to_owned(),
        min_similarity,
    }
}

/// The recalled texts, best first.
async fn recalled(client: &archivist::client::Client, req: pb::GetContextRequest) -> Vec<String> {
    client
        .clone()
        .get_context(req)
        .await
        .expect("context")
        .into_inner()
        .items
        .into_iter()
        .filter_map(|i| match i.item {
            Some(pb::context_item::Item::Recalled(r)) => Some(r.text),
            _ => None,
        })
        .collect()
}

fn sorted(mut texts: Vec<String>) -> Vec<String> {
    texts.sort_unstable();
    texts
}

fn owned(texts: &[&str]) -> Vec<String> {
    sorted(texts.iter().map(|t| (*t).to_owned()).collect())
}

async fn threshold_on(env: &[(&str, String)]) {
    let (_mock, _dir, server) = crate::search_fusion::served_with_embedder(env).await;
    let client = server.client().await;

    // Monday's session holds the texts; Friday's, of the same subject, is
    // where the question is asked.
    let mut monday: Vec<&str> = SMALL_TALK.to_vec();
    monday.extend([NEAR, BUS]);
    let friday = ["Good morning!"];
    for (session, texts) in [("ada-mon", &monday[..]), ("ada-fri", &friday[..])] {
        client
            .clone()
            .append_entries(pb::AppendEntriesRequest {
                subject: "ada".to_owned(),
                ..append_request(session, texts)
            })
            .await
            .expect("append");
    }
    let all = (monday.len() + friday.len()) as u64;
    let embedded = eventually(Duration::from_secs(60), || async {
        let b = client
            .clone()
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner()
            .embeddings
            .expect("embedding backlog");
        b.pending == 0 && b.embedded == all
    })
    .await;
    assert!(embedded, "every text embedded");
    let near = cosine(QUESTION, NEAR);
    assert!(LOW < near && near < HIGH, "{near}");
    assert!(cosine(QUESTION, BUS) < LOW);
    assert!(SMALL_TALK.iter().all(|t| cosine(QUESTION, t) < LOW));

    // No threshold: every text of Monday is recalled, the far bus too.
    let every = recalled(&client, ask(QUESTION, None)).await;
    assert_eq!(sorted(every), owned(&monday));
    // Low: the near text found by meaning only comes first; the small
    // talk the words found stays, though far; the bus goes.
    let low = recalled(&client, ask(QUESTION, Some(LOW))).await;
    assert_eq!(low.first().map(String::as_str), Some(NEAR), "{low:?}");
    assert_eq!(
        sorted(low),
        owned(&[
            NEAR,
            SMALL_TALK[0],
            SMALL_TALK[1],
            SMALL_TALK[2],
            SMALL_TALK[3]
        ])
    );
    // High: the near text goes too; the words' hits still stay.
    let high = recalled(&client, ask(QUESTION, Some(HIGH))).await;
    assert_eq!(sorted(high), owned(SMALL_TALK));
    // A question no stored word answers: the nearest texts without a
    // threshold, nothing with one.
    let elsewhere = "quantum chromodynamics";
    assert_eq!(
        recalled(&client, ask(elsewhere, None)).await.len(),
        monday.len()
    );
    assert_eq!(
        recalled(&client, ask(elsewhere, Some(LOW))).await,
        Vec::<String>::new()
    );

    // A threshold that is no cosine is refused, named, with or without a
    // query (a bad one is never kept silently).
    for (query, bad) in [
        (QUESTION, f32::NAN),
        (QUESTION, 1.5),
        ("", -1.01),
        ("", f32::INFINITY),
    ] {
        let status = client
            .clone()
            .get_context(ask(query, Some(bad)))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
        assert_eq!(reason(&status), "INVALID_MIN_SIMILARITY");
        let violations = status.get_details_bad_request().expect("violations");
        assert_eq!(violations.field_violations.len(), 1);
        assert_eq!(violations.field_violations[0].field, "min_similarity");
    }

    // The terminal client passes it on.
    let address = &server.address;
    let context = |least| async move {
        let ran = context_at_least(address, "ada-fri", QUESTION, least).await;
        assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
        ran.stdout
    };
    let low = context("0.5").await;
    let high = context("0.9").await;
    assert!(low.contains(NEAR) && low.contains(SMALL_TALK[0]), "{low}");
    assert!(
        !high.contains(NEAR) && high.contains(SMALL_TALK[0]),
        "{high}"
    );
    assert!(!low.contains(BUS) && !high.contains(BUS));
    let refused = context_at_least(address, "ada-fri", QUESTION, "1.5").await;
    assert_eq!(refused.code, 64, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("--min-similarity"),
        "{}",
        refused.stderr
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_min_similarity_keeps_a_near_meaning_out_of_the_recall_above_it_and_the_words_in()
{
    threshold_on(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_pgvector_min_similarity_keeps_a_near_meaning_out_of_the_recall_above_it_and_the_words_in()
 {
    let Some(db) = VectorDatabase::fresh().await else {
        return;
    };
    threshold_on(&db.env()).await;
}

//! Search through the real server: found in its tenant only, gone from the
//! index and from every file after erasure, and hostile queries answered as
//! input (never INTERNAL, never an engine's message).

use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, append_request, reason};
use crate::lifecycle::in_any_file;
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

fn search(query: &str) -> pb::SearchRequest {
    pb::SearchRequest {
        query: query.to_owned(),
        ..Default::default()
    }
}

async fn texts(c: &mut archivist::client::Client, req: pb::SearchRequest) -> Vec<String> {
    c.search(req)
        .await
        .expect("search")
        .into_inner()
        .hits
        .into_iter()
        .map(|h| h.text)
        .collect()
}

#[tokio::test]
async fn a_search_finds_its_tenants_text_and_nothing_after_erasure_not_even_in_the_files() {
    let server = TestServer::start_with(tenants).await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    a.append_entries(append_request(
        "s",
        &["hello", "The vault code is zephyrquill 4471"],
    ))
    .await
    .expect("append");
    b.append_entries(append_request("theirs", &["zephyrquill of tenant b"]))
        .await
        .expect("append");

    let found = a
        .search(search("what is the vault code"))
        .await
        .expect("search")
        .into_inner();
    assert_eq!(found.legs, vec![pb::SearchLeg::Lexical as i32]);
    let hit = found.hits.first().expect("a hit");
    assert_eq!(hit.text, "The vault code is zephyrquill 4471");
    assert_eq!(
        (
            hit.session_id.as_str(),
            hit.level,
            hit.first_seq,
            hit.last_seq,
            hit.segment_id
        ),
        ("s", 0, 2, 2, 0)
    );
    assert_eq!(hit.role, pb::Role::User as i32);
    assert_eq!(hit.score, 1.0 / 61.0);
    // Tenant b's text is never a's hit, and naming b's session finds
    // nothing (no error that would say it exists).
    assert_eq!(texts(&mut a, search("zephyrquill")).await.len(), 1);
    let mut named = search("zephyrquill");
    named.session_ids = vec!["theirs".into()];
    assert!(texts(&mut a, named).await.is_empty());

    a.delete_session(pb::DeleteSessionRequest {
        session_id: "s".into(),
    })
    .await
    .expect("delete");
    assert!(texts(&mut a, search("zephyrquill")).await.is_empty());
    assert_eq!(
        texts(&mut b, search("zephyrquill")).await,
        vec!["zephyrquill of tenant b"]
    );
    b.delete_session(pb::DeleteSessionRequest {
        session_id: "theirs".into(),
    })
    .await
    .expect("delete");
    let traces = in_any_file(server.data_dir(), "zephyrquill");
    assert!(traces.is_empty(), "the marker is still in {traces:?}");
}

#[tokio::test]
async fn hostile_queries_are_input_and_bad_ones_name_the_field() {
    let server = TestServer::start().await;
    let mut c = server.client.clone();
    c.append_entries(append_request("s", &["near the col star of the match"]))
        .await
        .expect("append");
    let long_words = "near ".repeat(1000);
    for q in [
        "\"unbalanced near",
        "NEAR(near col",
        "NEAR(\"a\" \"b\", 2)",
        "col: star*",
        "body:near OR scope:x",
        "^near",
        "near \0 col",
        "'; DROP TABLE entries; --",
        "search_index MATCH 'x'",
        "near AND OR NOT col",
        "!near & col | (star",
        "\"\"\"near\"\"\"",
        &long_words[..4000],
    ] {
        match c.search(search(q)).await {
            Ok(found) => {
                for h in found.into_inner().hits {
                    assert_eq!(h.text, "near the col star of the match");
                }
            }
            Err(status) => {
                assert_ne!(status.code(), Code::Internal, "{q:?}: {status:?}");
                let m = status.message().to_lowercase();
                assert!(
                    !m.contains("fts5") && !m.contains("syntax") && !m.contains("tsquery"),
                    "{q:?}: {m}"
                );
            }
        }
    }
    assert_eq!(texts(&mut c, search("NEAR(near col")).await.len(), 1);

    for (q, want) in [
        ("", "EMPTY_QUERY"),
        ("*** () :", "EMPTY_QUERY"),
        ("-near", "EMPTY_QUERY"),
    ] {
        let status = c.search(search(q)).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{q:?}");
        assert_eq!(reason(&status), want);
        let bad = status.get_details_bad_request().expect("violations");
        assert_eq!(bad.field_violations[0].field, "query");
    }
    let status = c
        .search(search(&"x".repeat(10_000)))
        .await
        .expect_err("too long");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "QUERY_TOO_LONG");
    assert!(status.message().contains("4096"), "{}", status.message());

    let mut semantic = search("near");
    semantic.mode = pb::SearchMode::Semantic as i32;
    let status = c.search(semantic).await.expect_err("no embeddings");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("[embedding]"),
        "{}",
        status.message()
    );
}

/// `[search] language` changed between two runs: the new server indexes
/// every stored text again in the background, batch by batch, while it
/// takes appends, and then finds them by their English stems.
#[tokio::test]
async fn a_language_change_reindexes_in_the_background_while_appends_go_on() {
    let server = TestServer::start().await;
    let builds: Vec<String> = (0..2500)
        .map(|i| format!("we were deploying build {i}"))
        .collect();
    for chunk in builds.chunks(500) {
        let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
        server.append("old", &texts).await;
    }
    let mut c = server.client.clone();
    // The default language: no stemming.
    assert!(texts(&mut c, search("deployed")).await.is_empty());
    let dir = server.stop().await;

    let mut config = archivist::config::Config::default();
    config.search.language = archivist::config::SearchLanguage::English;
    let server = TestServer::start_in(dir, config, None).await;
    let mut c = server.client.clone();
    // Appends are taken while the old texts are indexed again, and found.
    let fresh = server
        .append("new", &["the rollout deployed cleanly"])
        .await;
    assert_eq!(fresh.entries.len(), 1);
    assert!(
        crate::harness::eventually(std::time::Duration::from_secs(60), || {
            let mut c = c.clone();
            async move {
                let mut every = search("\"deployed build\"");
                every.limit = 100;
                let hits = texts(&mut c, every).await.len();
                let last = texts(&mut c, search("deployed build 2499")).await;
                hits == 100
                    && last.first().map(String::as_str) == Some("we were deploying build 2499")
            }
        })
        .await,
        "the old texts were not indexed in the new language"
    );
    assert_eq!(
        texts(&mut c, search("deploys rollout")).await,
        ["the rollout deployed cleanly"]
    );
}

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

//! `archivist search` through the real binary: a planted fact found and
//! printed as a block and as the wire response in JSON, every scope flag
//! narrowing what is found, another tenant's token finding nothing of
//! ours, and hostile or impossible input told as the usage error or the
//! server's typed refusal it is.

use archivist::pb;

use crate::harness::{TestServer, append_request};
use crate::operator::{Ran, archivist};
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

const FACT: &str = "The vault code is zephyrquill 4471";

/// `archivist search --server ADDRESS [--token TOKEN] ARGS`.
async fn search(address: &str, token: Option<&str>, args: &[&str]) -> Ran {
    let mut all = vec!["search", "--server", address];
    if let Some(token) = token {
        all.extend(["--token", token]);
    }
    all.extend_from_slice(args);
    archivist(&all, &[("ARCHIVIST_TOKEN", None)], None).await
}

/// The texts of a `--json` answer's hits, best first, with their sessions.
fn hits(ran: &Ran) -> Vec<(String, String)> {
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    ran.json()["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| {
            (
                h["session_id"].as_str().unwrap_or_default().to_owned(),
                h["text"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn of(subject: &str, session: &str, texts: &[&str]) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        subject: subject.to_owned(),
        ..append_request(session, texts)
    }
}

#[tokio::test]
async fn the_terminal_client_finds_a_planted_fact_as_text_and_json_within_its_scope() {
    let server = TestServer::start_with(tenants).await;
    let address = format!("http://{}", server.addr);
    let mut a = client(&server, Some(TOKEN_A)).await;
    a.append_entries(of("user:ada", "ada-1", &["Hello there.", FACT]))
        .await
        .expect("append");
    a.append_entries(of(
        "user:bob",
        "bob-1",
        &["Bob heard of zephyrquill once, nothing more."],
    ))
    .await
    .expect("append");
    client(&server, Some(TOKEN_B))
        .await
        .append_entries(append_request("theirs", &["zephyrquill of tenant b"]))
        .await
        .expect("append");

    // A question worded as the fact finds it, first, as a block.
    let ran = search(
        &address,
        Some(TOKEN_A),
        &["what", "is", "the", "vault", "code"],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines[0], "1 hit for \"what is the vault code\", best first (matched lexical)",
        "{}",
        ran.stdout
    );
    assert!(
        lines[1].starts_with("1. ada-1 seq 2, user, 20"),
        "{}",
        ran.stdout
    );
    assert!(
        lines[1].ends_with("; score 0.0164 (lexical)"),
        "{}",
        ran.stdout
    );
    assert_eq!(lines[2], format!("    {FACT}"));
    assert_eq!(lines.len(), 3, "{}", ran.stdout);

    // --json: the wire response, every field of the hit.
    let ran = search(&address, Some(TOKEN_A), &["--json", "vault code"]).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let json = ran.json();
    let hit = &json["hits"][0];
    assert_eq!(hit["text"], FACT);
    assert_eq!(hit["session_id"], "ada-1");
    assert_eq!(
        (&hit["level"], &hit["first_seq"], &hit["last_seq"]),
        (&0.into(), &2.into(), &2.into())
    );
    assert_eq!(hit["role"], "ROLE_USER");
    assert_eq!(hit["legs"], serde_json::json!(["SEARCH_LEG_LEXICAL"]));
    assert_eq!(json["legs"], serde_json::json!(["SEARCH_LEG_LEXICAL"]));
    assert_eq!(json["hits"].as_array().map(Vec::len), Some(1));

    // Every scope flag narrows what is found.
    let both = hits(&search(&address, Some(TOKEN_A), &["--json", "zephyrquill"]).await);
    let mut sessions: Vec<&str> = both.iter().map(|(s, _)| s.as_str()).collect();
    sessions.sort_unstable();
    assert_eq!(sessions, ["ada-1", "bob-1"]);
    for (flags, want) in [
        (vec!["--subject", "user:bob"], vec!["bob-1"]),
        (vec!["--session", "ada-1"], vec!["ada-1"]),
        (
            vec!["--session", "bob-1", "--session", "nosuch"],
            vec!["bob-1"],
        ),
        (
            vec!["--role", "user", "--level", "0"],
            vec!["ada-1", "bob-1"],
        ),
        (vec!["--role", "assistant"], vec![]),
        (vec!["--level", "1"], vec![]),
        (
            vec!["--after", "1h", "--before", "2999-01-01T00:00:00Z"],
            vec!["ada-1", "bob-1"],
        ),
        (vec!["--after", "2999-01-01T00:00:00Z"], vec![]),
        (vec!["--before", "2h"], vec![]),
        (vec!["--limit", "1"], vec!["one"]),
    ] {
        let mut args = vec!["--json", "zephyrquill"];
        args.extend(flags.iter().copied());
        let found = hits(&search(&address, Some(TOKEN_A), &args).await);
        let mut got: Vec<&str> = found.iter().map(|(s, _)| s.as_str()).collect();
        got.sort_unstable();
        match want.as_slice() {
            ["one"] => assert_eq!(got.len(), 1, "{flags:?}"),
            _ => assert_eq!(got, want, "{flags:?}"),
        }
    }

    // A recap is found at its level and printed as one.
    a.close_segment(pb::CloseSegmentRequest {
        session_id: "ada-1".into(),
        wait: true,
    })
    .await
    .expect("closed");
    let ran = search(
        &address,
        Some(TOKEN_A),
        &["zephyrquill", "--level", "1", "--session", "ada-1"],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert!(
        lines[1].starts_with("1. ada-1 recap of seq 1..2 (segment "),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("zephyrquill 4471"), "{}", ran.stdout);

    // Another tenant's token finds only its own, and naming our session
    // finds nothing (not an error that would say it exists).
    let theirs = hits(&search(&address, Some(TOKEN_B), &["--json", "zephyrquill"]).await);
    assert_eq!(
        theirs,
        [("theirs".to_owned(), "zephyrquill of tenant b".to_owned())]
    );
    let ran = search(
        &address,
        Some(TOKEN_B),
        &["vault", "code", "--session", "ada-1"],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.starts_with("no hits for \"vault code\""),
        "{}",
        ran.stdout
    );
    let ran = search(&address, None, &["vault"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("MISSING_TOKEN"), "{}", ran.stderr);
    assert!(ran.stderr.contains("hint: "), "{}", ran.stderr);
}

#[tokio::test]
async fn hostile_or_impossible_searches_are_told_as_usage_errors_or_typed_refusals() {
    let server = TestServer::start().await;
    let address = format!("http://{}", server.addr);
    server
        .append("s", &["near the col star of the match"])
        .await;

    // Operators of other engines are words here; a leading - excludes.
    for query in [
        "NEAR(near col",
        "\"near the col",
        "col: star*",
        "near'; DROP TABLE entries; --",
        "near\" OR 1=1 --",
        "near OR nothing",
    ] {
        let found = hits(&search(&address, None, &["--json", "--", query]).await);
        assert_eq!(
            found,
            [("s".to_owned(), "near the col star of the match".to_owned())],
            "{query:?}"
        );
    }
    let found = hits(&search(&address, None, &["--json", "--", "-match", "near"]).await);
    assert!(found.is_empty(), "{found:?}");
    // A negative --min-similarity is a number, not a flag: what the words
    // found stays whatever it is.
    for least in ["-0.5", "-1", "-.25"] {
        let found = hits(
            &search(
                &address,
                None,
                &["--json", "near", "--min-similarity", least],
            )
            .await,
        );
        assert_eq!(found.len(), 1, "{least}");
    }

    // The server's refusals, printed as every command prints one: the
    // status, the reason, the field; exit 1.
    let long = "x".repeat(10_000);
    for (args, reason) in [
        (vec!["--", "***"], "EMPTY_QUERY"),
        (vec!["--", "-near"], "EMPTY_QUERY"),
        (vec![long.as_str()], "QUERY_TOO_LONG"),
        (vec!["near", "--level", "65"], "INVALID_LEVEL"),
    ] {
        let ran = search(&address, None, &args).await;
        assert_eq!(ran.code, 1, "{args:?}: {}", ran.stdout);
        assert!(ran.stderr.contains("InvalidArgument"), "{}", ran.stderr);
        assert!(ran.stderr.contains(reason), "{args:?}: {}", ran.stderr);
        assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    }
    let ran = search(&address, None, &["near", "--mode", "semantic"]).await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("EMBEDDINGS_OFF"), "{}", ran.stderr);

    // What the client can tell is wrong is a usage error, before any call.
    let subject = "s".repeat(10_000);
    for (args, says) in [
        (vec!["near", "--limit", "0"], "--limit"),
        (vec!["near", "--limit", "101"], "--limit"),
        (vec!["near", "--limit=-1"], "--limit"),
        (vec!["near", "--level=-1"], "--level"),
        (vec!["near", "--role", "boss"], "unknown role \"boss\""),
        (vec!["near", "--mode", "fuzzy"], "--mode"),
        (vec!["near", "--session", "bad id!"], "session id contains"),
        (vec!["near", "--subject", subject.as_str()], "subject"),
        (vec!["near", "--after", "yesterday-ish"], "--after"),
        (vec!["near", "--before", "1969-01-01T00:00:00Z"], "--before"),
        (vec![], "QUERY"),
        // The server's words and reason, before any call; -inf is a
        // number here, not a flag.
        (
            vec!["near", "--min-similarity", "-inf"],
            "-inf is no cosine: a similarity is from -1 to 1 [INVALID_MIN_SIMILARITY]",
        ),
        (vec!["near", "--min-similarity", "-NaN"], "NaN is no cosine"),
        (vec!["near", "--min-similarity", "1.5"], "1.5 is no cosine"),
        (vec!["near", "--min-similarity", "high"], "--min-similarity"),
    ] {
        let ran = search(&address, None, &args).await;
        assert_eq!(ran.code, 64, "{args:?}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stderr.contains(says), "{args:?}: {}", ran.stderr);
    }
}

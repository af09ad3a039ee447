//! The turn's context through the real binary, on SQLite and on
//! PostgreSQL: GetContext with the user's message as `query` brings what
//! an older session of the subject said before the session's cover, and
//! without a query (or with one nothing answers) the answer is, byte for
//! byte, what it was; another subject's or another tenant's text never
//! comes; the budget holds; a bad query is refused as Search refuses it;
//! and `archivist session context --query` prints the recalled hits apart.

use archivist::pb;
use prost::Message;
use tonic::Code;

use crate::binary::Process;
use crate::harness::{TestServer, append_request, reason};
use crate::operator::{archivist, context_at_least};
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

const FACT: &str = "My gym locker code is 4711, the one by the boiler.";
const QUESTION: &str = "What is my gym locker code again?";

fn of(subject: &str, session: &str, texts: &[&str]) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        subject: subject.to_owned(),
        ..append_request(session, texts)
    }
}

fn ask(session: &str, max_tokens: u32, query: &str) -> pb::GetContextRequest {
    pb::GetContextRequest {
        session_id: session.to_owned(),
        max_tokens,
        query: query.to_owned(),
        min_similarity: None,
    }
}

/// The recalled items' (session, text), best first.
fn recalled(ctx: &pb::GetContextResponse) -> Vec<(String, String)> {
    ctx.items
        .iter()
        .filter_map(|i| match &i.item {
            Some(pb::context_item::Item::Recalled(r)) => {
                Some((r.session_id.clone(), r.text.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Every text an answer carries, whatever the item.
fn texts(ctx: &pb::GetContextResponse) -> Vec<String> {
    ctx.items
        .iter()
        .filter_map(|i| match &i.item {
            Some(pb::context_item::Item::Recalled(r)) => Some(r.text.clone()),
            Some(pb::context_item::Item::Entry(e)) => Some(e.content.clone()),
            Some(pb::context_item::Item::Summary(s)) => s.summary.as_ref().map(|s| s.text.clone()),
            None => None,
        })
        .collect()
}

/// Monday's fact in Ada's first session, Bob's like words in his, and
/// Friday's question in Ada's new session; then every check of the
/// turn's context through `c`.
async fn monday_to_friday(c: &mut archivist::client::Client) {
    c.append_entries(of("ada", "ada-mon", &["Hello!", FACT, "Noted."]))
        .await
        .expect("append");
    c.append_entries(of("bob", "bob-mon", &["Bob's gym locker code is 9999."]))
        .await
        .expect("append");
    c.append_entries(of("ada", "ada-fri", &["Good morning!", QUESTION]))
        .await
        .expect("append");

    let plain = c
        .get_context(ask("ada-fri", 400, ""))
        .await
        .expect("context")
        .into_inner();
    assert!(recalled(&plain).is_empty());
    assert!(
        texts(&plain).iter().all(|t| !t.contains("4711")),
        "without a query Friday knows nothing of Monday: {plain:?}"
    );

    let turn = c
        .get_context(ask("ada-fri", 400, QUESTION))
        .await
        .expect("context")
        .into_inner();
    // Monday's fact first; the question, which the cover holds verbatim,
    // not again; nothing of Bob's.
    let got = recalled(&turn);
    assert_eq!(got.first(), Some(&("ada-mon".to_owned(), FACT.to_owned())));
    assert!(got.iter().all(|(s, _)| s == "ada-mon"), "{got:?}");
    assert!(texts(&turn).iter().all(|t| !t.contains("9999")), "{turn:?}");
    assert_eq!(
        texts(&turn).iter().filter(|t| *t == QUESTION).count(),
        1,
        "{turn:?}"
    );
    // The cover after the recalled items is the one without a query.
    assert_eq!(turn.items[got.len()..], plain.items[..]);
    assert!(turn.estimated_tokens <= 400, "{}", turn.estimated_tokens);
    let Some(pb::context_item::Item::Recalled(first)) = &turn.items[0].item else {
        panic!("{turn:?}");
    };
    assert_eq!((first.level, first.first_seq, first.last_seq), (0, 2, 2));
    assert!(first.score > 0.0 && first.occurred_at.is_some());

    // A query nothing answers: the answer without one, byte for byte.
    let nothing = c
        .get_context(ask("ada-fri", 400, "zeppelin quartermaster"))
        .await
        .expect("context")
        .into_inner();
    assert_eq!(nothing.encode_to_vec(), plain.encode_to_vec());

    // A small budget holds, recall and cover together.
    for max_tokens in [20, 40, 80] {
        let small = c
            .get_context(ask("ada-fri", max_tokens, QUESTION))
            .await
            .expect("context")
            .into_inner();
        assert!(
            small.estimated_tokens <= max_tokens,
            "{max_tokens}: {small:?}"
        );
    }

    // A message with no word to look for is no query: the cover alone.
    for wordless in ["!!! ???", "👍", "or", "-gym"] {
        let answer = c
            .get_context(ask("ada-fri", 400, wordless))
            .await
            .expect("no query")
            .into_inner();
        assert_eq!(
            answer.encode_to_vec(),
            plain.encode_to_vec(),
            "{wordless:?}"
        );
    }
    // Refused as Search refuses a query.
    for (query, expected) in [(&"word ".repeat(1000)[..], "QUERY_TOO_LONG")] {
        let status = c
            .get_context(ask("ada-fri", 400, query))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(reason(&status), expected);
    }
    let status = c
        .get_context(ask("nobody", 400, QUESTION))
        .await
        .expect_err("no such session");
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn the_binary_on_sqlite_recalls_mondays_fact_into_fridays_context() {
    let dir = tempfile::tempdir().expect("temp dir");
    let process = Process::start(dir.path(), &[]).await;
    monday_to_friday(&mut process.client().await).await;

    // The terminal client prints the recalled hit apart from the cover.
    let address = process.address.clone();
    let ran = archivist(
        &[
            "session",
            "context",
            "ada-fri",
            "--server",
            &address,
            "--max-tokens",
            "400",
            "--query",
            QUESTION,
        ],
        &[("ARCHIVIST_TOKEN", None)],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let mut lines = ran.stdout.lines();
    let head = lines.next().unwrap_or_default();
    assert!(
        head.starts_with("[recalled] 1. ada-mon seq 2, user"),
        "{}",
        ran.stdout
    );
    assert_eq!(
        lines.next(),
        Some(&*format!("    {FACT}")),
        "{}",
        ran.stdout
    );
    assert!(
        ran.stdout.contains(&format!("2 user: {QUESTION}")),
        "{}",
        ran.stdout
    );
    // A negative threshold is a number, not a flag (what the words found
    // stays, whatever it is); one that is no cosine, -inf as much as 1.5,
    // is refused before any call with the server's words and reason.
    let context = |least| context_at_least(&address, "ada-fri", QUESTION, least);
    for least in ["-0.5", "-1", "-1e-3"] {
        let ran = context(least).await;
        assert_eq!(ran.code, 0, "{least}: {}{}", ran.stdout, ran.stderr);
        assert!(ran.stdout.contains(FACT), "{least}: {}", ran.stdout);
    }
    for (least, shown) in [
        ("-inf", "-inf"),
        ("-NaN", "NaN"),
        ("inf", "inf"),
        ("1.5", "1.5"),
    ] {
        let ran = context(least).await;
        assert_eq!(ran.code, 64, "{least}: {}{}", ran.stdout, ran.stderr);
        let says =
            format!("{shown} is no cosine: a similarity is from -1 to 1 [INVALID_MIN_SIMILARITY]");
        assert!(ran.stderr.contains(&says), "{least}: {}", ran.stderr);
        assert!(ran.stderr.contains("--min-similarity"), "{}", ran.stderr);
    }
    let ran = archivist(
        &[
            "session",
            "context",
            "ada-fri",
            "--server",
            &address,
            "--max-tokens",
            "400",
        ],
        &[("ARCHIVIST_TOKEN", None)],
        None,
    )
    .await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(
        !ran.stdout.contains("recalled") && !ran.stdout.contains("4711"),
        "{}",
        ran.stdout
    );
}

#[tokio::test]
async fn the_binary_on_postgresql_recalls_mondays_fact_into_fridays_context() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let process = Process::start(
        dir.path(),
        &[
            ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
            ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
        ],
    )
    .await;
    monday_to_friday(&mut process.client().await).await;
}

#[tokio::test]
async fn another_tenants_memory_of_the_same_subject_is_never_recalled() {
    let server = TestServer::start_with(tenants).await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    a.append_entries(of("ada", "ada-mon", &[FACT]))
        .await
        .expect("append");
    b.append_entries(of("ada", "ada-fri", &["Hi.", QUESTION]))
        .await
        .expect("append");
    let ctx = b
        .get_context(ask("ada-fri", 400, QUESTION))
        .await
        .expect("context")
        .into_inner();
    assert!(recalled(&ctx).is_empty(), "{ctx:?}");
    assert!(texts(&ctx).iter().all(|t| !t.contains("4711")));
    // And tenant a's own question finds it.
    a.append_entries(of("ada", "ada-fri", &[QUESTION]))
        .await
        .expect("append");
    let ctx = a
        .get_context(ask("ada-fri", 400, QUESTION))
        .await
        .expect("context")
        .into_inner();
    assert_eq!(recalled(&ctx), [("ada-mon".to_owned(), FACT.to_owned())]);
}

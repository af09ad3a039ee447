//! One tenant's costly reads cannot take the connections another
//! tenant's appends need, on PostgreSQL, through the real server: with
//! every connection for reads held by searches that cannot finish (the
//! test holds a lock they wait on), another tenant's appends are all
//! served, the searches past the read connections wait in a queue
//! (never more connections) and are then refused as OVERLOADED.
//!
//! The server is `ARCHIVIST_TEST_PG_URL` (see `replicas.rs`); without one
//! these tests say so and pass, unless `ARCHIVIST_REQUIRE_PG=1`.

use std::time::Duration;

use archivist::config::BackendKind;
use archivist::pb;
use tokio_postgres::NoTls;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, append_request, eventually, reason};
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

/// The server's connections for reads (`storage.read_connections`'s
/// default).
const READS: i64 = 8;
/// Searches at once: more than every connection the server had for all
/// its work before reads had their own (16).
const SEARCHES: usize = 20;
/// Appends of the other tenant, one after another.
const APPENDS: usize = 50;

/// The server's searches waiting on a lock in the test's database (each
/// holding a connection).
async fn waiting(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' \
         AND query LIKE '%websearch_to_tsquery(language, $1)%'",
        &[],
    )
    .await
    .expect("pg_stat_activity")
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_holding_every_read_connection_leave_another_tenants_appends_served() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let url = db.url.clone();
    let server = TestServer::start_with(move |c| {
        tenants(c);
        c.storage.backend = BackendKind::Postgres;
        c.storage.url = url;
        // No segment closes, so no recap waits on the lock too.
        c.segment.max_entries = 10_000;
        // The held searches wait on the lock past the default 2 s bound:
        // here they must hold their connections until it is let go.
        c.search.budget = Duration::from_secs(120);
    })
    .await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    a.append_entries(append_request("notes", &["the release is on friday"]))
        .await
        .expect("a's append");

    // Every search reads `summaries`, which no append writes: while the
    // test holds it locked, each search holds its connection, waiting.
    let (locker, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    locker
        .batch_execute("BEGIN; LOCK TABLE summaries IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let (watcher, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);

    let (done, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..SEARCHES {
        let (mut a, done) = (a.clone(), done.clone());
        tokio::spawn(async move {
            let answer = a
                .search(pb::SearchRequest {
                    query: "release".to_owned(),
                    ..Default::default()
                })
                .await;
            let _ = done.send(answer);
        });
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            waiting(&watcher).await >= READS
        })
        .await,
        "the searches never held every read connection: {} waiting",
        waiting(&watcher).await
    );

    // The other tenant's appends are all served meanwhile (within a bound
    // far above what they take, far below the searches' wait).
    let mut served = 0;
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        for i in 0..APPENDS {
            let text = format!("entry {i}");
            match b
                .append_entries(append_request("log", &[text.as_str()]))
                .await
            {
                Ok(_) => served += 1,
                Err(e) => panic!("append {i} refused while reads were held: {e:?}"),
            }
        }
    })
    .await;
    assert_eq!(served, APPENDS);
    assert_eq!(
        waiting(&watcher).await,
        READS,
        "reads held exactly their connections, no more"
    );

    // The searches past the read connections queued, and are refused once
    // they have waited their bound: OVERLOADED, with a RetryInfo.
    for _ in 0..SEARCHES - READS as usize {
        let answer = tokio::time::timeout(Duration::from_secs(60), answers.recv())
            .await
            .expect("a queued search answered")
            .expect("answer");
        let status = answer.expect_err("no connection for it");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(reason(&status), "OVERLOADED");
        assert!(status.get_error_details().retry_info().is_some());
    }
    // Let go, and the searches holding connections are answered.
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    for _ in 0..READS {
        let answer = tokio::time::timeout(Duration::from_secs(60), answers.recv())
            .await
            .expect("a held search answered")
            .expect("answer")
            .expect("found");
        assert_eq!(answer.into_inner().hits.len(), 1);
    }
    let log = b
        .list_entries(pb::ListEntriesRequest {
            session_id: "log".to_owned(),
            ..Default::default()
        })
        .await
        .expect("entries")
        .into_inner();
    assert_eq!(log.entries.len(), APPENDS);
    drop(server.stop().await);
}

/// A read of the server's waiting on a lock in the test's database.
async fn reads_waiting(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .expect("pg_stat_activity")
    .get(0)
}

/// Issue 40: a search whose budget went on waiting for a read connection
/// was refused SEARCH_TOO_COSTLY (no RetryInfo: "change your query"). With
/// the only read connection held by a read waiting on a lock, a search
/// now waits no longer than its budget and is refused as busy: OVERLOADED
/// with a RetryInfo and the budget it waited; let go, it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_waited_its_budget_for_a_connection_is_busy_not_too_costly() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let url = db.url.clone();
    let server = TestServer::start_with(move |c| {
        tenants(c);
        c.storage.backend = BackendKind::Postgres;
        c.storage.url = url;
        c.storage.read_connections = 1;
        c.segment.max_entries = 10_000;
        c.search.budget = Duration::from_millis(300);
    })
    .await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    a.append_entries(append_request("notes", &["the release is on friday"]))
        .await
        .expect("append");

    // The transcript reads `entries`: while the test holds it locked, the
    // read holds the one read connection, waiting.
    let (locker, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    locker
        .batch_execute("BEGIN; LOCK TABLE entries IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let (watcher, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let held = tokio::spawn({
        let mut a = a.clone();
        async move {
            a.list_entries(pb::ListEntriesRequest {
                session_id: "notes".to_owned(),
                ..Default::default()
            })
            .await
        }
    });
    assert!(
        eventually(Duration::from_secs(30), || async {
            reads_waiting(&watcher).await == 1
        })
        .await,
        "the transcript never held the read connection"
    );

    let search = || pb::SearchRequest {
        query: "release".to_owned(),
        mode: pb::SearchMode::Lexical as i32,
        ..Default::default()
    };
    for _ in 0..3 {
        let status = a.search(search()).await.expect_err("no connection for it");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert_eq!(reason(&status), "OVERLOADED", "{status:?}");
        let details = status.get_error_details();
        assert!(details.retry_info().is_some(), "{status:?}");
        assert_eq!(
            details
                .error_info()
                .and_then(|i| i.metadata.get("search_budget_ms"))
                .map(String::as_str),
            Some("300"),
            "{status:?}"
        );
    }
    // Refused while the read still held the connection.
    assert_eq!(reads_waiting(&watcher).await, 1);

    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let transcript = held.await.expect("task").expect("entries").into_inner();
    assert_eq!(transcript.entries.len(), 1);
    let found = a.search(search()).await.expect("search").into_inner();
    assert_eq!(found.hits.len(), 1);
    drop(server.stop().await);
}

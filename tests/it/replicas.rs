//! Three real `archivist serve` processes on one PostgreSQL database, each
//! with a fake provider of its own that counts what it is sent (so the
//! tests can tell which replica sent what): every segment is summarised
//! exactly once; appends to one session through all three at once get
//! seqs 1..N with no gap and no duplicate; after kill -9 of one replica in
//! the middle of a drain, every segment still ends SUMMARISED and only the
//! segments that replica had claimed are sent a second time; a watcher on
//! one replica sees what happens on another.
//!
//! The server is `ARCHIVIST_TEST_PG_URL` (default: the local one as
//! `postgres`, database `test`); each test makes a database of its own and
//! drops it. Without a server these tests say so and pass, unless
//! `ARCHIVIST_REQUIRE_PG=1` (CI), where that is a failure.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use archivist::pb;
use tokio_postgres::NoTls;
use wiremock::{MockServer, Request, Respond, ResponseTemplate};

use crate::binary::Process;
use crate::harness::{entry, eventually};
use crate::provider::completion;

const URL_ENV: &str = "ARCHIVIST_TEST_PG_URL";
const REQUIRE_ENV: &str = "ARCHIVIST_REQUIRE_PG";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn admin_url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A database of this test's own, dropped (connections and all) after.
pub(crate) struct Database {
    pub(crate) url: String,
    name: String,
}

impl Drop for Database {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok((client, conn)) = tokio_postgres::connect(&admin_url(), NoTls).await {
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

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// These tests start three servers each: one at a time, so that they do
/// not starve the rest of the suite (and its timing tests) of the CPU.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fresh database, or None (with a notice) when no server answers and
/// none is required.
pub(crate) async fn database() -> Option<Database> {
    let url = admin_url();
    let connected =
        tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(&url, NoTls)).await;
    let client = match connected {
        Ok(Ok((client, conn))) => {
            tokio::spawn(conn);
            client
        }
        other => {
            let why = match other {
                Ok(Err(e)) => archivist::error_chain(&e),
                _ => "no answer within 5 s".to_owned(),
            };
            let target = url.split('@').next_back().unwrap_or("");
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("PostgreSQL not reachable at {target} and {REQUIRE_ENV}=1: {why}");
            }
            eprintln!("PostgreSQL not reachable at {target} ({why}): skipping the PostgreSQL half");
            return None;
        }
    };
    let name = format!(
        "archivist_it_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b.to_owned(), format!("?{q}")),
        None => (url.clone(), String::new()),
    };
    let base = base
        .rsplit_once('/')
        .map_or(base.clone(), |(b, _)| b.to_owned());
    Some(Database {
        url: format!("{base}/{name}{query}"),
        name,
    })
}

/// A fake provider that answers after `delay` and counts requests per
/// segment marker ("marker-N" in the entry's text).
#[derive(Clone)]
struct Counting {
    sent: Arc<Mutex<HashMap<u32, usize>>>,
    delay: Duration,
}

impl Counting {
    fn new(delay: Duration) -> Counting {
        Counting {
            sent: Arc::default(),
            delay,
        }
    }

    fn sent(&self) -> HashMap<u32, usize> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Respond for Counting {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body = String::from_utf8_lossy(&request.body);
        let marker: u32 = body
            .split("marker-")
            .nth(1)
            .and_then(|rest| {
                rest.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .ok()
            })
            .unwrap_or(u32::MAX);
        *self.sent.lock().expect("lock").entry(marker).or_default() += 1;
        completion("Recap.").set_delay(self.delay)
    }
}

/// A replica: `archivist serve` on the database, with its own provider.
async fn replica(db: &Database, provider: &MockServer, extra: &[(&str, &str)]) -> Process {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut env = vec![
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
        // These tests count level-1 sends: no roll-ups.
        ("ARCHIVIST_MEMORY_FANOUT", "0"),
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1"),
        ("ARCHIVIST_RECONCILER_INTERVAL", "200ms"),
    ];
    env.extend_from_slice(extra);
    let process = Process::start_openai(dir.path(), &provider.uri(), &env).await;
    // The data directory is not used with PostgreSQL.
    drop(dir);
    process
}

async fn counting_provider(delay: Duration) -> (Counting, MockServer) {
    let counting = Counting::new(delay);
    let server = crate::provider::provider(counting.clone()).await;
    (counting, server)
}

/// Appends `n` entries, each closing a segment (max_entries = 1), marked
/// `marker-{first}` on.
async fn closed_segments(process: &Process, session: &str, first: u32, n: u32) {
    let mut client = process.client().await;
    let texts: Vec<String> = (first..first + n)
        .map(|i| format!("Entry marker-{i} of the backlog."))
        .collect();
    let resp = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: session.to_owned(),
            entries: texts.iter().map(|t| entry(t)).collect(),
            ..Default::default()
        })
        .await
        .expect("append")
        .into_inner();
    assert_eq!(resp.closed_segment_ids.len(), n as usize);
}

async fn summarised(process: &Process) -> u64 {
    let mut client = process.client().await;
    client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .map(|b| b.into_inner().summarised)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_drain_one_backlog_each_segment_summarised_exactly_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    let mut providers = Vec::new();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (counting, server) = counting_provider(Duration::from_millis(100)).await;
        replicas.push(replica(&db, &server, &[]).await);
        providers.push((counting, server));
    }
    let segments = 120u32;
    // Closed through two replicas; drained by all three.
    closed_segments(&replicas[0], "a", 0, segments / 2).await;
    closed_segments(&replicas[1], "b", segments / 2, segments / 2).await;
    let done = eventually(Duration::from_secs(60), || async {
        summarised(&replicas[2]).await == u64::from(segments)
    })
    .await;
    assert!(done, "summarised: {}", summarised(&replicas[2]).await);
    let mut total: HashMap<u32, usize> = HashMap::new();
    for (counting, _) in &providers {
        let sent = counting.sent();
        assert!(!sent.is_empty(), "every replica took part in the drain");
        for (marker, n) in sent {
            *total.entry(marker).or_default() += n;
        }
    }
    assert_eq!(total.len(), segments as usize, "every segment was sent");
    for (marker, n) in &total {
        assert_eq!(*n, 1, "segment marker-{marker} sent {n} times");
    }
    let mut client = replicas[1].client().await;
    for session in ["a", "b"] {
        let listed = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: session.to_owned(),
                states: Vec::new(),
                page_size: 1000,
                page_token: String::new(),
                levels: Vec::new(),
            })
            .await
            .expect("list")
            .into_inner()
            .segments;
        assert_eq!(listed.len(), segments as usize / 2);
        for s in listed {
            assert_eq!(s.state, pb::SegmentState::Summarised as i32);
            assert_eq!((s.attempts, s.passes), (1, 1));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_to_one_session_through_three_replicas_get_gapless_seqs() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    let (_counting, server) = counting_provider(Duration::ZERO).await;
    let big = [
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1000000"),
        ("ARCHIVIST_SEGMENT_MAX_TOKENS", "1000000000"),
    ];
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(&db, &server, &big).await);
    }
    let mut writers = Vec::new();
    for (r, process) in replicas.iter().enumerate() {
        for w in 0..4 {
            let mut client = process.client().await;
            writers.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..25 {
                    let texts = [format!("r{r} w{w} {i} a"), format!("r{r} w{w} {i} b")];
                    let resp = client
                        .append_entries(pb::AppendEntriesRequest {
                            session_id: "shared".to_owned(),
                            entries: texts.iter().map(|t| entry(t)).collect(),
                            ..Default::default()
                        })
                        .await
                        .expect("append")
                        .into_inner();
                    let got: Vec<u64> = resp.entries.iter().map(|e| e.seq).collect();
                    assert_eq!(got[1], got[0] + 1, "one call's entries are consecutive");
                    seqs.extend(got);
                }
                seqs
            }));
        }
    }
    let mut all = BTreeSet::new();
    let mut n = 0u64;
    for w in writers {
        for seq in w.await.expect("writer") {
            assert!(all.insert(seq), "seq {seq} given twice");
            n += 1;
        }
    }
    assert_eq!(n, 3 * 4 * 25 * 2);
    assert_eq!(all, (1..=n).collect::<BTreeSet<u64>>(), "no gap");
    // What is stored agrees, read through another replica.
    let mut client = replicas[2].client().await;
    let context = client
        .get_context(pb::GetContextRequest {
            session_id: "shared".to_owned(),
            max_tokens: 0,
            query: String::new(),
            min_similarity: None,
        })
        .await
        .expect("context")
        .into_inner();
    let stored: Vec<u64> = context
        .items
        .iter()
        .filter_map(|i| match &i.item {
            Some(pb::context_item::Item::Entry(e)) => Some(e.seq),
            _ => None,
        })
        .collect();
    assert_eq!(stored, (1..=n).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_of_a_replica_mid_drain_only_its_claims_are_sent_again() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    // A short pass ceiling, so that the lease (2 x ceiling + 5 s) of the
    // killed replica's claims runs out within the test.
    let fast = [
        ("ARCHIVIST_RETRY_ATTEMPT_TIMEOUT", "1500ms"),
        ("ARCHIVIST_RETRY_PASS_CEILING", "2s"),
        ("ARCHIVIST_RECONCILER_CONCURRENCY", "4"),
    ];
    let mut providers = Vec::new();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (counting, server) = counting_provider(Duration::from_millis(700)).await;
        replicas.push(replica(&db, &server, &fast).await);
        providers.push((counting, server));
    }
    let segments = 60u32;
    closed_segments(&replicas[0], "s", 0, segments).await;
    // Wait until the doomed replica has sends in flight, then kill it.
    let doomed = &providers[2].0;
    let busy = eventually(Duration::from_secs(20), || async {
        !doomed.sent().is_empty()
    })
    .await;
    assert!(busy, "the third replica never took a segment");
    tokio::time::sleep(Duration::from_millis(200)).await;
    replicas[2].child.kill().expect("kill -9");
    let _ = replicas[2].child.wait();
    let claimed_by_doomed: BTreeSet<u32> = doomed.sent().keys().copied().collect();

    let done = eventually(Duration::from_secs(60), || async {
        summarised(&replicas[0]).await == u64::from(segments)
    })
    .await;
    assert!(done, "summarised: {}", summarised(&replicas[0]).await);
    let mut total: HashMap<u32, usize> = HashMap::new();
    for (counting, _) in &providers {
        for (marker, n) in counting.sent() {
            *total.entry(marker).or_default() += n;
        }
    }
    assert_eq!(total.len(), segments as usize, "every segment was sent");
    let mut again = BTreeSet::new();
    for (marker, n) in &total {
        assert!(*n <= 2, "segment marker-{marker} sent {n} times");
        if *n == 2 {
            again.insert(*marker);
        }
    }
    assert!(
        again.is_subset(&claimed_by_doomed),
        "sent twice: {again:?}; the killed replica had sent {claimed_by_doomed:?}"
    );
    assert!(
        !again.is_empty(),
        "the killed replica's claims were taken over"
    );
    let mut client = replicas[1].client().await;
    let backlog = client
        .get_backlog(pb::GetBacklogRequest {})
        .await
        .expect("backlog")
        .into_inner();
    assert_eq!(
        (backlog.pending, backlog.parked, backlog.summarised),
        (0, 0, u64::from(segments))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_one_replica_sees_what_another_does() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    let (_counting, server) = counting_provider(Duration::from_millis(20)).await;
    let a = replica(&db, &server, &[]).await;
    let b = replica(&db, &server, &[]).await;
    // The session exists, its first segment summarised.
    let mut client_a = a.client().await;
    client_a
        .append_entries(pb::AppendEntriesRequest {
            session_id: "watched".to_owned(),
            entries: vec![entry("Entry marker-1.")],
            ..Default::default()
        })
        .await
        .expect("append");
    assert!(
        eventually(Duration::from_secs(20), || async {
            summarised(&a).await == 1
        })
        .await
    );
    let mut client_b = b.client().await;
    let mut stream = client_b
        .watch_session(pb::WatchSessionRequest {
            session_id: "watched".to_owned(),
        })
        .await
        .expect("watch")
        .into_inner();
    // Give the LISTEN connection of b a moment to be up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    client_a
        .append_entries(pb::AppendEntriesRequest {
            session_id: "watched".to_owned(),
            entries: vec![entry("Entry marker-2.")],
            ..Default::default()
        })
        .await
        .expect("append");
    let mut kinds = Vec::new();
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(event)) = stream.message().await {
            kinds.push(event.kind);
            if event.kind == pb::SessionEventKind::Summarised as i32 {
                break;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "events seen on b: {kinds:?}");
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == pb::SessionEventKind::Closed as i32)
            .count(),
        1,
        "closed once, not twice: {kinds:?}"
    );
    client_a
        .delete_session(pb::DeleteSessionRequest {
            session_id: "watched".to_owned(),
        })
        .await
        .expect("delete");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(event)) = stream.message().await {
            if event.kind == pb::SessionEventKind::Deleted as i32 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ended.ok(), Some(true), "b's watcher told of a's erasure");
}

/// Runs `archivist backfill` on the database with the provider at `base`.
async fn backfill(db: &Database, base: &str, args: &[&str]) -> (i32, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_archivist"));
    command
        .arg("backfill")
        .args(args)
        .env("ARCHIVIST_STORAGE_BACKEND", "postgres")
        .env("ARCHIVIST_STORAGE_URL", &db.url)
        .env("ARCHIVIST_PROVIDER_KIND", "openai")
        .env("ARCHIVIST_PROVIDER_BASE_URL", format!("{base}/v1"))
        .env("ARCHIVIST_MEMORY_FANOUT", "0")
        .env("RUST_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run backfill");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_drains_a_postgresql_backlog() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    let (counting, server) = counting_provider(Duration::ZERO).await;
    // Nothing to drain in a database nobody served: refused, not created.
    let (code, _) = backfill(&db, &server.uri(), &["--json"]).await;
    assert_eq!(code, 1, "no schema: an error");
    let store = archivist::internals::Store::connect(&db.url)
        .await
        .expect("connect");
    let one = archivist::model::SegmentPolicy {
        max_entries: 1,
        max_tokens: 1_000_000,
        max_gap: None,
    };
    let entries = (0..12)
        .map(|i| archivist::model::NewEntry {
            client_entry_id: None,
            role: archivist::model::Role::User,
            content: format!("Entry marker-{i} of the backlog."),
            occurred_at: None,
            name: None,
            metadata: Default::default(),
        })
        .collect();
    store
        .append(
            &archivist::model::Tenant::default(),
            &archivist::model::SessionName::parse("s").expect("name"),
            entries,
            one,
            0,
        )
        .await
        .expect("append");
    let (code, dry) = backfill(&db, &server.uri(), &["--dry-run", "--json"]).await;
    assert_eq!(code, 2, "a dry run leaves them: {dry}");
    assert!(counting.sent().is_empty(), "a dry run sends nothing");
    let (code, report) = backfill(&db, &server.uri(), &["--json"]).await;
    assert_eq!(code, 0, "{report}");
    let sent = counting.sent();
    assert_eq!(sent.len(), 12);
    assert!(sent.values().all(|n| *n == 1), "{sent:?}");
    let backlog = store.backlog(None).await.expect("backlog");
    assert_eq!((backlog.pending, backlog.summarised), (0, 12));
}

/// Runs `archivist migrate` against the database `url` names, through
/// `DATABASE_URL` as the docs suggest; its exit code, stdout and stderr.
async fn migrate(url: &str) -> (i32, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_archivist"));
    command
        .arg("migrate")
        .env("ARCHIVIST_STORAGE_BACKEND", "postgres")
        .env("ARCHIVIST_STORAGE_URL_ENV", "DATABASE_URL")
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run migrate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn migrate_creates_the_postgresql_schema_once_and_never_prints_the_password() {
    let Some(db) = database().await else {
        return;
    };
    // A password in the URL (the test server trusts any; a URL naming
    // another user is used as given), which no line may show.
    let secret = "hunter2-not-shown";
    let url = db
        .url
        .replacen("://postgres@", &format!("://postgres:{secret}@"), 1);
    let config: tokio_postgres::Config = url.parse().expect("a URL");
    let shown = format!(
        "postgres://{}@",
        config.get_user().expect("a user in the test URL")
    );

    let (code, out, err) = migrate(&url).await;
    assert_eq!(code, 0, "{err}");
    let line = out.trim_end();
    assert_eq!(line.lines().count(), 1, "one line: {line}");
    assert!(line.starts_with("postgres database at "), "{line}");
    assert!(line.contains(&shown) && line.contains(&db.name), "{line}");
    let (from, to) = crate::operator::versions(line);
    assert_eq!((from, to > 0), (0, true), "{line}");

    let (code, out, err) = migrate(&url).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(crate::operator::versions(out.trim_end()), (to, to), "{out}");
    // The database says so too.
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let recorded: i32 = client
        .query_one("SELECT max(version) FROM archivist_schema_version", &[])
        .await
        .expect("read the schema version")
        .get(0);
    assert_eq!(u64::try_from(recorded).ok(), Some(to));
    drop(client);

    // A database that does not exist: refused, naming it, exit 1.
    let missing = url.replacen(&db.name, &format!("{}_missing", db.name), 1);
    let (code, out, err) = migrate(&missing).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("cannot connect to the database at"), "{err}");
    assert!(err.contains(&format!("{}_missing", db.name)), "{err}");
    for text in [&out, &err] {
        assert!(!text.contains(secret), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_hears_a_gap_when_its_replica_loses_the_listen_connection() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(db) = database().await else {
        return;
    };
    let (_counting, server) = counting_provider(Duration::ZERO).await;
    let a = replica(&db, &server, &[]).await;
    let b = replica(&db, &server, &[]).await;
    let mut client_a = a.client().await;
    let mut client_b = b.client().await;
    // Watched before the session exists.
    let mut stream = client_b
        .watch_session(pb::WatchSessionRequest {
            session_id: "watched".to_owned(),
        })
        .await
        .expect("watch")
        .into_inner();
    let (admin, conn) = tokio_postgres::connect(&db.url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    for round in 1..=3u32 {
        // Both replicas listen (again).
        let listening = eventually(Duration::from_secs(10), || async {
            admin
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                     AND query = 'LISTEN archivist_events'",
                    &[],
                )
                .await
                .is_ok_and(|rows| rows.len() == 2)
        })
        .await;
        assert!(listening, "round {round}: both replicas listen");
        // Every replica's LISTEN connection is terminated, as a database
        // restart or a failover would.
        let terminated = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND query = 'LISTEN archivist_events' \
                 AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("terminate");
        assert_eq!(terminated.len(), 2, "round {round}: both replicas listen");
        // b's watcher is told: once for the loss, once when b listens again.
        for _ in 0..2 {
            let event = next(&mut stream).await;
            assert_eq!(event.kind, pb::SessionEventKind::Gap as i32, "{event:?}");
            assert_eq!(event.missed, 0, "how many is unknown");
        }
        // Listening again: a's events reach b's watcher.
        let closed = client_a
            .append_entries(pb::AppendEntriesRequest {
                session_id: "watched".to_owned(),
                entries: vec![entry(&format!("Entry marker-{round}."))],
                ..Default::default()
            })
            .await
            .expect("append")
            .into_inner()
            .closed_segment_ids;
        // Its close, then its recap (whichever replica writes it), so
        // that nothing of this round is left for the next.
        let mut kinds = Vec::new();
        while kinds.last() != Some(&(pb::SessionEventKind::Summarised as i32)) {
            let event = next(&mut stream).await;
            assert_eq!(
                event.segment.map(|s| s.id),
                closed.first().copied(),
                "round {round}"
            );
            kinds.push(event.kind);
        }
        assert_eq!(
            kinds,
            [
                pb::SessionEventKind::Closed as i32,
                pb::SessionEventKind::Summarised as i32
            ],
            "round {round}"
        );
    }
    drop(client_b);
}

/// The next event, within 20 seconds.
async fn next(stream: &mut tonic::Streaming<pb::SessionEvent>) -> pb::SessionEvent {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
        .expect("an event")
}

//! The reconciler's scan and drain.
//!
//! Run: `cargo bench --bench reconciler` (add `-- --drain N` to drain fewer
//! than the default 10,000 segments).
//!
//! 1. One scan (the due-segment query the reconciler runs on every tick)
//!    over a database of 1,000,000 SUMMARISED segments and 1,000 PENDING
//!    ones, against the same backlog in an otherwise empty database. The big
//!    database is seeded with plain SQL straight into the file, which is
//!    much faster than a million appends and touches nothing the scan reads
//!    differently.
//! 2. The drain rate of PENDING segments through the real reconciler at its
//!    default concurrency, against a fake provider (a child process) with
//!    50 ms latency, compared with concurrency / latency.

mod common;

use std::time::{Duration, Instant};

use archivist::internals::Store;
use archivist::model::{Millis, NewEntry, Role, SegmentPolicy, SessionName, Tenant};

use tokio_util::sync::CancellationToken;

use common::spawn_provider;

const PENDING: usize = 1_000;

fn main() {
    if common::serve_if_provider() {
        return;
    }
    let mut drain = 10_000;
    let mut latency_ms = 50u64;
    let mut skip_scan = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--drain" => drain = args.next().and_then(|n| n.parse().ok()).expect("--drain N"),
            "--latency-ms" => {
                latency_ms = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--latency-ms N")
            }
            "--skip-scan" => skip_scan = true,
            _ => {}
        }
    }
    let rt = common::runtime();
    rt.block_on(async {
        println!("Reconciler scan, {PENDING} PENDING segments due:");
        let sizes: &[usize] = if skip_scan { &[] } else { &[0, 1_000_000] };
        for &summarised in sizes {
            let dir = tempfile::tempdir().expect("temp dir");
            seed(dir.path(), summarised, PENDING).await;
            let store = Store::open(dir.path()).await.expect("store");
            let t = Instant::now();
            let backlog = store.backlog(None).await.expect("backlog");
            println!(
                "  {summarised:>9} SUMMARISED, GetBacklog counts: {:>9.1} µs ({} pending)",
                t.elapsed().as_secs_f64() * 1e6,
                backlog.pending
            );
            for limit in [4u32, PENDING as u32] {
                let (median, p99) = time_scans(&store, limit).await;
                println!(
                    "  {summarised:>9} SUMMARISED, scan of {limit:>4}: median {:>7.1} µs, p99 {:>7.1} µs",
                    median.as_secs_f64() * 1e6,
                    p99.as_secs_f64() * 1e6
                );
            }
        }

        let (_provider, base) = spawn_provider(latency_ms);
        let dir = tempfile::tempdir().expect("temp dir");
        let (config, app, store, _) = common::openai_summariser(dir.path(), &base).await;
        closed_segments(&store, drain).await;
        let wake = app.wake();
        let reconciler = app.reconciler();
        let cancel = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn(reconciler.run(cancel.clone()));
        wake.notify_one();
        loop {
            let backlog = store.backlog(Some(&Tenant::default())).await.expect("backlog");
            if backlog.summarised as usize == drain {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let elapsed = started.elapsed();
        cancel.cancel();
        let _ = task.await;
        let rate = drain as f64 / elapsed.as_secs_f64();
        let ideal = f64::from(config.reconciler.concurrency) / (latency_ms.max(1) as f64 / 1000.0);
        println!(
            "Drain of {drain} PENDING segments, concurrency {}, provider latency {latency_ms} ms: {rate:.1} segments/s, {:.1} % of concurrency/latency ({ideal:.0}/s), {:.1} s",
            config.reconciler.concurrency,
            100.0 * rate / ideal,
            elapsed.as_secs_f64()
        );
    });
}

/// Median and 99th percentile of 2,000 scans returning at most `limit`.
async fn time_scans(store: &Store, limit: u32) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t = Instant::now();
        let due = store
            .due_segments(Millis::now(), limit)
            .await
            .expect("scan");
        times.push(t.elapsed());
        assert_eq!(due.len(), limit as usize);
    }
    times.sort();
    (times[times.len() / 2], times[times.len() * 99 / 100])
}

/// Creates the schema through the store, then inserts `summarised` and
/// `pending` segments of one session with plain SQL.
async fn seed(dir: &std::path::Path, summarised: usize, pending: usize) {
    drop(Store::open(dir).await.expect("schema"));
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || seed_rows(&dir, summarised, pending))
        .await
        .expect("seeded");
}

fn seed_rows(dir: &std::path::Path, summarised: usize, pending: usize) {
    let mut conn = rusqlite::Connection::open(dir.join("archivist.sqlite3")).expect("open");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    let tx = conn.transaction().expect("tx");
    let now = Millis::now().0;
    tx.execute(
        "INSERT INTO sessions (id, tenant, name, created_at) VALUES (1, '', 'seeded', ?1)",
        [now],
    )
    .expect("session");
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO segments (session_id, ordinal, state, first_seq, last_seq, \
                 entry_count, token_estimate, attempts, passes, next_attempt_at, closed_at, \
                 created_at) VALUES (1, ?1, ?2, ?3, ?3, 1, 10, ?4, ?4, ?5, ?6, ?6)",
            )
            .expect("prepare");
        for i in 0..summarised + pending {
            let is_pending = i >= summarised;
            let state: i64 = if is_pending { 2 } else { 3 };
            let passes: i64 = i64::from(!is_pending);
            let due: Option<i64> = is_pending.then_some(now - 1000);
            insert
                .execute(rusqlite::params![
                    i as i64 + 1,
                    state,
                    i as i64 + 1,
                    passes,
                    due,
                    now
                ])
                .expect("segment");
        }
    }
    tx.commit().expect("commit");
}

/// `n` closed segments of three entries each, through the store.
async fn closed_segments(store: &Store, n: usize) {
    let policy = SegmentPolicy {
        max_entries: 3,
        max_tokens: 1_000_000,
        max_gap: None,
    };
    let session = SessionName::parse("drain").expect("name");
    for chunk in 0..n.div_ceil(300) {
        let entries = (0..(n - chunk * 300).min(300) * 3)
            .map(|i| NewEntry {
                client_entry_id: None,
                role: Role::User,
                content: format!("Entry {i} of chunk {chunk}, about the migration."),
                occurred_at: None,
                name: None,
                metadata: Default::default(),
            })
            .collect();
        store
            .append(&Tenant::default(), &session, entries, policy, 0)
            .await
            .expect("append");
    }
}

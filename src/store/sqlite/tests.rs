//! What only the SQLite backend promises: its writer's group commit never
//! lets an acknowledged write be lost or an unacknowledged one be stored,
//! it commits with the durability asked for, its trigger-kept counts
//! equal a recount, and its log is checkpointed beside the writer.

use super::*;
use crate::model::{ContextItem, SegmentPolicy, SegmentState, Tenant};
use crate::store::Budget;
use crate::store::tests::{entries, session};

const POLICY: SegmentPolicy = SegmentPolicy {
    max_entries: 1,
    max_tokens: 1_000_000,
    max_gap: None,
};

async fn open() -> (tempfile::TempDir, Sqlite) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Create)
        .await
        .expect("open");
    (dir, store)
}

async fn append(store: &Sqlite, name: &str, texts: &[&str]) -> bool {
    store
        .append(
            &Tenant::default(),
            &session(name),
            entries(texts),
            POLICY,
            0,
        )
        .await
        .is_ok()
}

async fn count_entries(store: &Sqlite, name: &str) -> usize {
    match store
        .context(
            &Tenant::default(),
            &session(name),
            Budget::bytes(usize::MAX),
        )
        .await
    {
        Ok(ctx) => ctx.items.len(),
        Err(StoreError::SessionNotFound(_)) => 0,
        Err(e) => panic!("{e}"),
    }
}

/// Runs `bad` among many concurrent appends and checks the writer's
/// promise: an append that was acknowledged is stored, one that was not
/// is not, and the writer goes on working.
async fn acknowledged_means_stored(
    bad: impl FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
) {
    let (_dir, store) = open().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("s{i}");
            let ok = append(&store, &name, &["x"]).await;
            (name, ok)
        }));
    }
    let bad_result = store.write(bad).await;
    assert!(bad_result.is_err());
    for t in tasks {
        let (name, ok) = t.await.expect("joined");
        assert_eq!(
            count_entries(&store, &name).await,
            usize::from(ok),
            "{name}"
        );
    }
    assert!(
        append(&store, "after", &["y"]).await,
        "the writer still works"
    );
    assert_eq!(count_entries(&store, "after").await, 1);
}

#[tokio::test]
async fn a_failing_job_undoes_only_itself() {
    let (_dir, store) = open().await;
    let result = store
        .write(|conn| {
            conn.execute(
                "INSERT INTO sessions (tenant, name, created_at) VALUES ('', 'ghost', 0)",
                [],
            )?;
            Err::<(), _>(StoreError::Corrupt("on purpose".to_owned()))
        })
        .await;
    assert!(matches!(result, Err(StoreError::Corrupt(_))));
    assert!(matches!(
        store
            .context(
                &Tenant::default(),
                &session("ghost"),
                Budget::bytes(usize::MAX)
            )
            .await,
        Err(StoreError::SessionNotFound(_))
    ));
    acknowledged_means_stored(|conn| {
        conn.execute(
            "INSERT INTO sessions (tenant, name, created_at) VALUES ('', 'ghost', 0)",
            [],
        )?;
        Err(StoreError::Corrupt("on purpose".to_owned()))
    })
    .await;
}

#[tokio::test]
async fn a_job_that_ends_the_transaction_aborts_its_batch() {
    acknowledged_means_stored(|conn| {
        conn.execute_batch("ROLLBACK")?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_panicking_job_aborts_its_batch() {
    acknowledged_means_stored(|_| panic!("a bug in a write job")).await;
}

#[tokio::test]
async fn the_writer_commits_with_the_durability_asked_for() {
    for (durability, level) in [(Durability::Process, 1), (Durability::Power, 2)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Sqlite::open(dir.path(), durability, OpenMode::Create)
            .await
            .expect("open");
        let synchronous: i64 = store
            .write(|conn| Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?))
            .await
            .expect("pragma");
        assert_eq!(synchronous, level, "{durability:?}");
    }
}

#[tokio::test]
async fn kept_counts_equal_a_recount() {
    let (dir, store) = open().await;
    assert!(append(&store, "a", &["1", "2", "3"]).await);
    assert!(append(&store, "b", &["4"]).await);
    store
        .append(
            &Tenant("other".to_owned()),
            &session("a"),
            entries(&["5", "6"]),
            POLICY,
            0,
        )
        .await
        .expect("append");
    let due = store
        .due_segments(crate::model::Millis::now(), 10)
        .await
        .expect("due");
    store.unpark(due.clone()).await.expect("unpark");
    let conn = raw(dir.path());
    let recount: Vec<(String, i64, i64)> = conn
        .prepare(
            "SELECT x.tenant, s.state, count(*) FROM segments s \
             JOIN sessions x ON x.id = s.session_id GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let kept: Vec<(String, i64, i64)> = conn
        .prepare("SELECT tenant, state, n FROM segment_counts WHERE n > 0 ORDER BY 1, 2")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(kept, recount);
    assert!(!recount.is_empty());
}

#[tokio::test]
async fn a_database_from_before_the_tree_keeps_its_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let conn = raw(dir.path());
        for sql in &schema::MIGRATIONS[..3] {
            conn.execute_batch(sql).expect("old schema");
        }
        conn.pragma_update(None, "user_version", 3)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO sessions (id, tenant, name, next_seq, next_ordinal, created_at) \
                 VALUES (1, '', 'old', 3, 2, 0);
             INSERT INTO entries VALUES (1, 1, NULL, 1, 'first', 5, 0), (1, 2, NULL, 1, 'second', 5, 0);
             INSERT INTO segments (id, session_id, ordinal, state, first_seq, last_seq, \
                 entry_count, token_estimate, attempts, passes, created_at) \
                 VALUES (7, 1, 1, 3, 1, 2, 2, 10, 1, 1, 0);
             INSERT INTO summaries VALUES (7, 'old recap', 'p', 'm', 'v', 1, 1, 0);",
        )
        .expect("old rows");
    }
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Create)
        .await
        .expect("migrated");
    let seg = store.segment(&Tenant::default(), 7).await.expect("segment");
    assert_eq!((seg.level, seg.ordinal), (1, 1));
    assert!(seg.child_ids.is_empty());
    assert_eq!(seg.summary.expect("summary").text, "old recap");
    let backlog = store.backlog(None).await.expect("backlog");
    assert_eq!(backlog.summarised, 1);
    // What was stored before the search file is owed to it as its tail
    // (entries) and in `search_owed` (recaps), not by the backlog: a
    // search finds it at once.
    let search = |q: &'static str| leveled_hits(&store, q);
    assert_eq!(store.index_backlog().await.expect("backlog"), 0);
    assert_eq!(search("second").await, vec![(0, "second".to_owned())]);
    // Appends go on beside it, at the next ordinal, found at once.
    assert!(append(&store, "old", &["third"]).await);
    assert_eq!(search("third").await, vec![(0, "third".to_owned())]);
    assert_eq!(search("recap").await, vec![(1, "old recap".to_owned())]);
    let ctx = store
        .context(
            &Tenant::default(),
            &session("old"),
            Budget::bytes(usize::MAX),
        )
        .await
        .expect("context");
    assert_eq!(ctx.items.len(), 3);
    // Room for the old recap and the new entry, not for the entries it
    // stands for: the recap.
    let third = crate::model::estimate_tokens("third");
    let budget = Budget {
        max_tokens: third + crate::model::estimate_tokens("old recap") + 2,
        max_bytes: usize::MAX,
        recent_tokens: third,
    };
    let ctx = store
        .context(&Tenant::default(), &session("old"), budget)
        .await
        .expect("context");
    assert_eq!(ctx.items.len(), 2, "{ctx:?}");
    assert!(
        matches!(&ctx.items[0], ContextItem::Summary { summary, .. } if summary.text == "old recap"),
        "{ctx:?}"
    );
    // Every reference still points at the live tables.
    let conn = raw(dir.path());
    let dangling: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .expect("check");
    assert_eq!(dangling, 0);
    let schema: String = conn
        .query_row(
            "SELECT group_concat(sql, ' ') FROM sqlite_master WHERE sql IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("schema");
    assert!(
        !schema.contains("_v3") && !schema.contains("_v4"),
        "{schema}"
    );
    // The tenant's index is whole, and erasing the old session (which
    // unindexes the exact indexed values) leaves it so.
    let check = |conn: &Connection| {
        let k: i64 = conn
            .query_row("SELECT id FROM search_tables WHERE tenant = ''", [], |r| {
                r.get(0)
            })
            .expect("the tenant's table");
        conn.execute_batch(&format!(
            "INSERT INTO search_{k} (search_{k}, rank) VALUES ('integrity-check', 1)"
        ))
        .expect("index in step");
    };
    check(&conn);
    drop(conn);
    store
        .delete_session(&Tenant::default(), &session("old"))
        .await
        .expect("erase");
    assert!(search("second or recap or third").await.is_empty());
    let conn = raw(dir.path());
    check(&conn);
}

#[tokio::test]
async fn a_full_disk_is_told_apart_and_the_probe_reports_it() {
    let (_dir, store) = open().await;
    assert!(append(&store, "s", &["fits"]).await);
    store
        .probe()
        .await
        .expect("a healthy store answers the probe");
    // The database may not grow past the pages it has: what SQLite says
    // when the disk is full.
    store
        .write(|conn| {
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))?;
            Ok(())
        })
        .await
        .expect("cap the size");
    let big = "x".repeat(256 * 1024);
    let err = store
        .append(
            &Tenant::default(),
            &session("s"),
            entries(&[&big]),
            POLICY,
            0,
        )
        .await
        .expect_err("no room");
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    // Nothing of it was stored; the next probe reports the full disk even
    // though its own row still fits, and the one after, with no write
    // refused meanwhile, passes.
    assert_eq!(count_entries(&store, "s").await, 1);
    assert!(matches!(store.probe().await, Err(StoreError::Full(_))));
    store.probe().await.expect("nothing refused since");
}

#[tokio::test]
async fn the_log_is_checkpointed_into_the_database_file() {
    // SQLite's own automatic checkpoint is replaced (`checkpoint.rs`): the
    // log must still be copied into the database file, by the checkpoint
    // thread, and stay bounded.
    let (dir, store) = open().await;
    let db = Sqlite::database_path(dir.path());
    let wal = dir.path().join(format!("{DATABASE_FILE}-wal"));
    let text = "x".repeat(2000);
    // Each append stores an entry and closes a segment: several pages of
    // log each, thousands in all.
    for _ in 0..600 {
        assert!(append(&store, "s", &[&text]).await);
    }
    let copied = 600 * 2000;
    let mut waited = 0;
    while std::fs::metadata(&db).expect("database file").len() < copied {
        // A generous ceiling (20 s): the machine may be busy with other
        // tests.
        assert!(waited < 400, "the log was not checkpointed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    // Bounded: the inline checkpoint's 10,000 pages, and what commits add
    // while a background checkpoint holds the log; each append now also
    // writes its search index pages (a segment, the structure record), so
    // that overshoot is larger than before the index (12,850 pages seen).
    let log = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(log < 16_000 * 4200, "the log grew to {log} bytes");
    assert_eq!(count_entries(&store, "s").await, 600);
}

/// The rows appends keep in the writer's memory (`kept.rs`), read back
/// from the file: each session's next seq, its open segment's counts and
/// the tenant's bytes, against a recount of the entries.
fn recount_kept_rows(dir: &std::path::Path) {
    let conn = raw(dir);
    let sessions: Vec<(String, i64, i64)> = conn
        .prepare(
            "SELECT x.name, x.next_seq, (SELECT coalesce(max(seq), 0) FROM entries \
             WHERE session_id = x.id) FROM sessions x ORDER BY 1",
        )
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(!sessions.is_empty());
    for (name, next_seq, last) in sessions {
        assert_eq!(
            next_seq,
            last + 1,
            "{name}: next_seq follows its last entry"
        );
    }
    let segments: Vec<(i64, i64, i64, i64)> = conn
        .prepare(
            "SELECT s.id, s.entry_count, s.last_seq, (SELECT count(*) FROM entries e \
             WHERE e.session_id = s.session_id AND e.seq BETWEEN s.first_seq AND s.last_seq) \
             FROM segments s WHERE s.level = 1",
        )
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(!segments.is_empty());
    for (id, count, _, recount) in &segments {
        assert_eq!(count, recount, "segment {id}: entry_count");
    }
    // A session's open segment is the one segment of its own still OPEN,
    // and every entry is in exactly one segment.
    /// Name, open_segment_id, its OPEN segments, entries in its segments,
    /// its entries.
    type Row = (String, Option<i64>, Vec<i64>, i64, i64);
    let sessions: Vec<Row> = conn
        .prepare(
            "SELECT x.name, x.open_segment_id, \
             (SELECT group_concat(id) FROM segments WHERE session_id = x.id AND state = ?1), \
             (SELECT coalesce(sum(entry_count), 0) FROM segments \
              WHERE session_id = x.id AND level = 1), \
             (SELECT count(*) FROM entries WHERE session_id = x.id) FROM sessions x",
        )
        .expect("prepare")
        .query_map([SegmentState::Open.code()], |r| {
            let open: Option<String> = r.get(2)?;
            let open = open
                .map(|o| o.split(',').filter_map(|id| id.parse().ok()).collect())
                .unwrap_or_default();
            Ok((r.get(0)?, r.get(1)?, open, r.get(3)?, r.get(4)?))
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    for (name, open_id, open, in_segments, entries) in sessions {
        assert_eq!(
            open_id.into_iter().collect::<Vec<_>>(),
            open,
            "{name}: open segment"
        );
        assert_eq!(in_segments, entries, "{name}: entries in segments");
    }
    let (stored, recount): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT stored_bytes FROM tenant_usage WHERE tenant = ''), \
             (SELECT sum(length(CAST(content AS BLOB)) \
              + coalesce(length(CAST(client_entry_id AS BLOB)), 0) + ?1) FROM entries) \
             + (SELECT sum(length(CAST(name AS BLOB)) + ?1) FROM sessions)",
            [sessions::ROW_OVERHEAD_BYTES],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("bytes");
    assert_eq!(stored, recount, "the tenant's stored bytes");
}

/// Segments of `max_entries` entries.
fn policy(max_entries: u32) -> SegmentPolicy {
    SegmentPolicy {
        max_entries,
        max_tokens: 1_000_000,
        max_gap: None,
    }
}

/// Two entries with one idempotency key and other contents: an append
/// of them is refused (CLIENT_ENTRY_ID_REUSED) and stores nothing.
fn one_key_twice(key: &str) -> Vec<crate::model::NewEntry> {
    let mut e = entries(&["first", "second"]);
    e[0].client_entry_id = Some(key.to_owned());
    e[1].client_entry_id = Some(key.to_owned());
    e
}

#[tokio::test]
async fn rows_kept_by_appends_are_written_before_each_commit() {
    // Many appends to a few sessions at once, so batches hold several
    // appends to one session, mixed with closes (another kind of job, which
    // must see the kept rows written) and appends that fail (whose changes
    // must not be kept).
    let (dir, store) = open().await;
    let policy = policy(7);
    let mut tasks = Vec::new();
    for i in 0..300u32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let name = session(&format!("s{}", i % 4));
            let t = Tenant::default();
            match i % 10 {
                3 => match store.close_open_segment(&t, &name).await {
                    // Closed before its first append ran.
                    Ok(_) | Err(StoreError::SessionNotFound(_)) => Ok(()),
                    Err(e) => Err(e),
                },
                7 => {
                    // An idempotency key reused for other content: refused.
                    let e = one_key_twice(&format!("k{i}"));
                    let refused = store.append(&t, &name, e, policy, 0).await;
                    assert!(matches!(
                        refused,
                        Err(StoreError::ClientEntryIdReused { .. })
                    ));
                    Ok(())
                }
                _ => store
                    .append(&t, &name, entries(&["a", "bb"]), policy, 0)
                    .await
                    .map(|_| ()),
            }
        }));
    }
    for t in tasks {
        t.await.expect("joined").expect("stored");
    }
    recount_kept_rows(dir.path());
    // And the kept rows go on from where they were.
    assert!(append(&store, "s0", &["last"]).await);
    recount_kept_rows(dir.path());
}

#[tokio::test]
async fn kept_rows_are_forgotten_when_another_connection_commits() {
    // A backfill beside the server opens the same file with a writer of
    // its own; whatever it commits, the server's kept rows must not hide.
    let (dir, store) = open().await;
    let policy = policy(100);
    let t = Tenant::default();
    let s = session("shared");
    for round in 1..=3u64 {
        let ours = store
            .append(&t, &s, entries(&["ours"]), policy, 0)
            .await
            .expect("append");
        assert_eq!(ours.entries[0].seq, 2 * round - 1);
        let other = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
            .await
            .expect("a second writer");
        let theirs = other
            .append(&t, &s, entries(&["theirs"]), policy, 0)
            .await
            .expect("append");
        assert_eq!(theirs.entries[0].seq, 2 * round);
    }
    recount_kept_rows(dir.path());
}

/// Jobs queued behind a job that holds the writer until `release`, so that
/// they all run in its batch, in the order they were queued.
struct HeldBatch {
    release: std::sync::mpsc::Sender<()>,
    held: tokio::task::JoinHandle<()>,
}

impl HeldBatch {
    async fn start(store: &Sqlite) -> HeldBatch {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let holder = store.clone();
        let held = tokio::spawn(async move {
            holder
                .write(move |_| {
                    let _ = started.send(());
                    let _ = wait.recv();
                    Ok(())
                })
                .await
                .expect("the holding job");
        });
        running.await.expect("the writer runs the holding job");
        HeldBatch { release, held }
    }

    /// Queues `call` behind the held job and the calls queued before it.
    async fn queue<T: Send + 'static>(
        &self,
        store: &Sqlite,
        call: impl std::future::Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        let jobs = store.inner.jobs.as_ref().expect("a writer");
        let before = jobs.capacity();
        let task = tokio::spawn(call);
        while jobs.capacity() == before {
            tokio::task::yield_now().await;
        }
        task
    }

    async fn release(self) {
        self.release.send(()).expect("the holding job waits");
        self.held.await.expect("joined");
    }
}

#[tokio::test]
async fn jobs_in_one_batch_see_what_the_appends_before_them_kept() {
    let (dir, store) = open().await;
    let policy = policy(100);
    let t = Tenant::default();
    let append = |texts: &'static [&'static str]| {
        let (store, t) = (store.clone(), t.clone());
        async move {
            store
                .append(&t, &session("s"), entries(texts), policy, 0)
                .await
        }
    };
    let close = || {
        let (store, t) = (store.clone(), t.clone());
        async move { store.close_open_segment(&t, &session("s")).await }
    };

    // One batch: a new session's appends, a close (not an append: it must
    // see the rows they kept), an append after it and one refused.
    let batch = HeldBatch::start(&store).await;
    let first = batch.queue(&store, append(&["a", "b"])).await;
    let second = batch.queue(&store, append(&["c", "d"])).await;
    let closed = batch.queue(&store, close()).await;
    let after = batch.queue(&store, append(&["e"])).await;
    let refused = {
        let (store, t) = (store.clone(), t.clone());
        let e = one_key_twice("k");
        batch
            .queue(&store.clone(), async move {
                store.append(&t, &session("s"), e, policy, 0).await
            })
            .await
    };
    let last = batch.queue(&store, append(&["h"])).await;
    batch.release().await;

    let first = first.await.expect("joined").expect("first");
    let second = second.await.expect("joined").expect("second");
    let closed = closed.await.expect("joined").expect("close");
    let after = after.await.expect("joined").expect("after");
    let refused = refused.await.expect("joined");
    let last = last.await.expect("joined").expect("last");
    assert_eq!(first.open_segment_id, second.open_segment_id);
    assert_eq!(
        closed, first.open_segment_id,
        "the close found the open segment"
    );
    assert_ne!(
        after.open_segment_id, closed,
        "a new segment after the close"
    );
    assert!(matches!(
        refused,
        Err(StoreError::ClientEntryIdReused { .. })
    ));
    assert_eq!(last.open_segment_id, after.open_segment_id);
    let seqs: Vec<u64> = [&first, &second, &after, &last]
        .iter()
        .flat_map(|o| o.entries.iter().map(|e| e.seq))
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
    recount_kept_rows(dir.path());

    // The next batch starts from the kept rows: a close first (so they
    // are forgotten: the open segment is no longer open), then an append.
    let batch = HeldBatch::start(&store).await;
    let closed_again = batch.queue(&store, close()).await;
    let next = batch.queue(&store, append(&["i"])).await;
    batch.release().await;
    let closed_again = closed_again.await.expect("joined").expect("close");
    let next = next.await.expect("joined").expect("append");
    assert_eq!(closed_again, after.open_segment_id);
    assert_ne!(
        next.open_segment_id, closed_again,
        "a new segment after the close"
    );
    assert_eq!(next.entries[0].seq, 7);
    recount_kept_rows(dir.path());
}

/// Rows of the sessions table still being erased, and all entries stored.
fn erasing_and_entries(dir: &std::path::Path) -> (i64, i64) {
    let conn = raw(dir);
    conn.query_row(
        "SELECT (SELECT count(*) FROM sessions WHERE erasing IS NOT NULL), \
         (SELECT count(*) FROM entries)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .expect("count")
}

#[tokio::test]
async fn a_begun_erasure_is_gone_to_readers_and_finishes_after_a_crash() {
    let (dir, store) = open().await;
    let t = Tenant::default();
    let s = session("big");
    // Past one batch by rows and by bytes (3,000 entries of ~600 bytes).
    let text = "x".repeat(600);
    for _ in 0..30 {
        let texts: Vec<&str> = (0..100).map(|_| text.as_str()).collect();
        assert!(append(&store, "big", &texts).await);
    }
    assert!(append(&store, "other", &["kept"]).await);
    // Only the first transaction, as a crash right after it would leave.
    let erased = store.begin_erasure_only(&t, &s).await.expect("begin");
    assert_eq!(erased.entries, 3_000);
    assert_eq!(erased.segments, 3_000);
    assert_eq!(count_entries(&store, "big").await, 0);
    let listed: Vec<String> = store
        .list_sessions(&t, None, None, 100)
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(listed, ["other"]);
    assert!(!store.has_session(&t, &s).await.expect("has"));
    // The name is free at once: a new append starts a fresh session.
    let fresh = store
        .append(&t, &s, entries(&["new"]), POLICY, 0)
        .await
        .expect("append");
    assert_eq!(fresh.entries[0].seq, 1);
    assert_eq!(erasing_and_entries(dir.path()), (1, 3_002));
    drop(store);

    // Start-up finishes the erasure, and only that one.
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("reopen");
    assert_eq!(erasing_and_entries(dir.path()), (0, 2));
    assert_eq!(count_entries(&store, "big").await, 1);
    assert_eq!(count_entries(&store, "other").await, 1);
    drop(store);
    recount_kept_rows(dir.path());
}

/// A connection of the test's own to the data directory's main file, with
/// the search file attached once there is one.
fn raw(dir: &std::path::Path) -> Connection {
    let conn = Connection::open(dir.join(DATABASE_FILE)).expect("open");
    let search = dir.join(fts::FILE);
    if search.is_file() {
        fts::attach(&conn, &search).expect("attach");
    }
    conn
}

/// The number of the database's one search table (tests of one tenant).
fn only_search_table(conn: &Connection) -> i64 {
    conn.query_row("SELECT id FROM search_tables", [], |r| r.get(0))
        .expect("a search table")
}

/// The tenant's recaps in its search table, and the recap texts an erasure
/// has yet to take out of it.
fn recaps_indexed_and_waiting(dir: &std::path::Path) -> (i64, i64) {
    let conn = raw(dir);
    let k = only_search_table(&conn);
    conn.query_row(
        &format!(
            "SELECT (SELECT count(*) FROM {}_docsize WHERE id < 0), \
             (SELECT count(*) FROM erasing_texts)",
            fts::name(k)
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .expect("count")
}

#[tokio::test]
async fn a_begun_erasures_recaps_leave_the_index_in_its_batches_even_after_a_crash() {
    let (dir, store) = open().await;
    let t = Tenant::default();
    assert!(append(&store, "big", &["one", "two", "three"]).await);
    let lease = std::time::Duration::from_secs(60);
    for (id, text) in [(1, "recap flamingo one"), (2, "recap flamingo two")] {
        let (claim, _) = store
            .claim(id, "w", lease)
            .await
            .expect("claim")
            .expect("free");
        let summary = crate::model::Summary {
            text: text.to_owned(),
            provider: "p".to_owned(),
            model: "m".to_owned(),
            prompt_version: "v".to_owned(),
            input_tokens: 1,
            output_tokens: 1,
            created_at: crate::model::Millis::now(),
        };
        assert!(
            store
                .complete(&claim, summary, 1, 0)
                .await
                .expect("complete")
                .held
        );
    }
    // Owed to the index; a search has the indexer index them.
    store.index_tail_of(&t.0).await.expect("index");
    assert_eq!(recaps_indexed_and_waiting(dir.path()), (2, 0));
    // The first transaction makes the recaps gone and leaves their texts
    // for the batches; a crash right after it leaves them waiting.
    store
        .begin_erasure_only(&t, &session("big"))
        .await
        .expect("begin");
    assert_eq!(recaps_indexed_and_waiting(dir.path()), (2, 2));
    drop(store);
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("reopen");
    assert_eq!(recaps_indexed_and_waiting(dir.path()), (0, 0));
    assert_eq!(erasing_and_entries(dir.path()), (0, 0));
    drop(store);
}

#[tokio::test]
async fn an_erasure_in_batches_lets_other_appends_through_and_counts_right() {
    let (dir, store) = open().await;
    let t = Tenant::default();
    let text = "y".repeat(2_000);
    for _ in 0..20 {
        let texts: Vec<&str> = (0..100).map(|_| text.as_str()).collect();
        assert!(append(&store, "big", &texts).await);
    }
    let store = std::sync::Arc::new(store);
    let eraser = {
        let store = store.clone();
        let t = t.clone();
        tokio::spawn(async move { store.delete_session(&t, &session("big")).await })
    };
    // Appends queued beside the erasure all succeed.
    let mut ok = 0;
    for i in 0..50 {
        if append(&store, &format!("beside-{i}"), &["a"]).await {
            ok += 1;
        }
    }
    let erased = eraser.await.expect("join").expect("erase");
    assert_eq!((ok, erased.entries, erased.segments), (50, 2_000, 2_000));
    assert_eq!(erasing_and_entries(dir.path()), (0, 50));
    drop(store);
    recount_kept_rows(dir.path());
}

/// Claims every owed item and stores `vector(text)` for each.
async fn embed_all(
    store: &Sqlite,
    generation: &crate::model::Generation,
    vector: fn(&str) -> Vec<f32>,
) {
    let lease = std::time::Duration::from_secs(60);
    // A batch holds one owner's texts: one claim per tenant and subject.
    while let Some(batch) = store.claim_owed("w", lease, 1000).await.expect("claim") {
        let vectors = batch
            .items
            .iter()
            .map(|i| (i.doc, vector(&i.text)))
            .collect();
        store
            .store_vectors(&batch.claim, generation, vectors)
            .await
            .expect("store");
    }
}

/// A unit vector the nearer [1, 0] the larger the number a text ends with.
fn nearer_the_larger(text: &str) -> Vec<f32> {
    let n: f32 = text
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let x = n / 10.0;
    vec![x, (1.0 - x * x).sqrt()]
}

#[tokio::test]
async fn the_vector_cache_follows_another_process_and_every_deletion() {
    use crate::model::Generation;
    use crate::store::search::SearchScope;
    let (dir, server) = open().await;
    server
        .set_embedding_generation(&Generation::new("m", 2))
        .await
        .expect("generation");
    // Another process on the same file (a backfill beside the server).
    let backfill = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("open");
    let raw = Connection::open(Sqlite::database_path(dir.path())).expect("raw");
    raw.busy_timeout(std::time::Duration::from_secs(5))
        .expect("timeout");
    let t = Tenant::default();
    let g = Generation::new("m", 2);
    let search = |limit: u32| {
        let (server, t, g) = (server.clone(), t.clone(), g.clone());
        async move {
            let leg = server
                .semantic_leg(&t, &SearchScope::default(), &g, vec![1.0, 0.0], limit)
                .await
                .expect("leg");
            let texts: Vec<String> = leg.hits.iter().map(|h| h.text.clone()).collect();
            (texts, leg.embedded_share)
        }
    };
    assert!(append(&server, "s", &["e 1", "e 2"]).await);
    let segment: i64 = raw
        .query_row("SELECT min(id) FROM segments", [], |r| r.get(0))
        .expect("a segment");
    raw.execute(
        "INSERT INTO summaries (segment_id, text, provider, model, prompt_version, \
         input_tokens, output_tokens, created_at) VALUES (?1, 'r 3', 'p', 'm', 'v', 1, 1, 1)",
        [segment],
    )
    .expect("a summary");
    assert_eq!(search(10).await, (vec![], 0.0));
    embed_all(&backfill, &g, nearer_the_larger).await;
    assert_eq!(
        search(10).await,
        (vec!["r 3".into(), "e 2".into(), "e 1".into()], 1.0)
    );

    // A summary's new text drops its vector (the trigger) until embedded
    // again; the old one is never found.
    raw.execute(
        "UPDATE summaries SET text = 'r 0' WHERE segment_id = ?1",
        [segment],
    )
    .expect("update");
    let (texts, share) = search(10).await;
    assert_eq!(texts, vec!["e 2", "e 1"]);
    assert!((share - 2.0 / 3.0).abs() < 1e-9, "{share}");
    embed_all(&backfill, &g, nearer_the_larger).await;
    assert_eq!(
        search(10).await,
        (vec!["e 2".into(), "e 1".into(), "r 0".into()], 1.0)
    );
    assert_eq!(server.cached_vectors(&t.0), Some((4, 1)));

    // A whole generation deleted by another process, in batches.
    while raw
        .execute(
            "DELETE FROM embeddings WHERE generation = ?1 AND doc IN \
             (SELECT doc FROM embeddings WHERE generation = ?1 LIMIT 2)",
            [g.as_str()],
        )
        .expect("delete")
        > 0
    {}
    assert_eq!(search(10).await, (vec![], 0.0));
    assert_eq!(server.cached_vectors(&t.0), Some((4, 4)));

    // Vectors written straight into the table (no claim) are found too;
    // past the budget the leg scans in SQL and finds the same.
    for (doc, x) in [((1i64 << 32) | 1, 0.1f32), ((1 << 32) | 2, 0.2)] {
        raw.execute(
            "INSERT INTO embeddings (doc, generation, session_id, vector) VALUES (?1, ?2, 1, ?3)",
            rusqlite::params![
                doc,
                g.as_str(),
                crate::store::embeddings::to_bytes(&[x, (1.0 - x * x).sqrt()])
            ],
        )
        .expect("insert");
    }
    let expected = (vec!["e 2".to_owned(), "e 1".to_owned()], 2.0 / 3.0);
    let close = |(texts, share): (Vec<String>, f64)| (texts, (share * 1e6).round() / 1e6);
    let rounded = |(texts, share): (Vec<String>, f64)| (texts, (share * 1e6).round() / 1e6);
    assert_eq!(close(search(10).await), rounded(expected.clone()));
    server.set_vector_budget(0);
    assert_eq!(close(search(10).await), rounded(expected.clone()));
    assert_eq!(server.cached_vectors(&t.0), None);
    server.set_vector_budget(1 << 20);
    assert_eq!(
        close(search(1).await),
        rounded((vec!["e 2".to_owned()], 2.0 / 3.0))
    );
    assert_eq!(server.cached_vectors(&t.0), Some((2, 0)));
}

/// Appends `texts` to session `s` of `tenant`, each its own segment.
async fn append_as(store: &Sqlite, tenant: &str, texts: &[&str]) {
    store
        .append(
            &Tenant(tenant.to_owned()),
            &session("s"),
            entries(texts),
            POLICY,
            0,
        )
        .await
        .expect("append");
}

/// Two tenants' vectors (2 dimensions: 88 bytes each in a cache): `small`
/// has 2, `large` 6; a budget of 600 bytes holds either alone, not both.
async fn two_tenants() -> (tempfile::TempDir, Sqlite, crate::model::Generation) {
    let (dir, store) = open().await;
    // Embeddings on (a run with them starts its generation first).
    store
        .set_embedding_generation(&crate::model::Generation::new("m", 2))
        .await
        .expect("generation");
    append_as(&store, "small", &["e 1", "e 2"]).await;
    append_as(&store, "large", &["e 1", "e 2", "e 3", "e 4", "e 5", "e 6"]).await;
    let g = crate::model::Generation::new("m", 2);
    embed_all(&store, &g, nearer_the_larger).await;
    store.set_vector_budget(600);
    (dir, store, g)
}

async fn nearest(store: &Sqlite, tenant: &str, g: &crate::model::Generation) -> String {
    let leg = store
        .semantic_leg(
            &Tenant(tenant.to_owned()),
            &crate::store::search::SearchScope::default(),
            g,
            vec![1.0, 0.0],
            1,
        )
        .await
        .expect("leg");
    leg.hits.first().map(|h| h.text.clone()).unwrap_or_default()
}

#[tokio::test]
async fn one_tenants_searches_never_evict_a_smaller_working_cache() {
    let (_dir, store, g) = two_tenants().await;
    assert_eq!(nearest(&store, "small", &g).await, "e 2");
    assert_eq!(store.cached_vectors("small"), Some((2, 0)));
    for _ in 0..3 {
        // The larger tenant's search does not fit beside the smaller
        // one's cache, and does not push it out: it scans in SQL, and
        // finds the same.
        assert_eq!(nearest(&store, "large", &g).await, "e 6");
        assert_eq!(store.cached_vectors("small"), Some((2, 0)));
        assert_eq!(store.cached_vectors("large"), None);
        assert_eq!(nearest(&store, "small", &g).await, "e 2");
    }
    assert!(store.vector_bytes() <= 600, "{}", store.vector_bytes());
}

#[tokio::test]
async fn two_loads_at_once_never_hold_more_than_the_budget() {
    let (_dir, store, g) = two_tenants().await;
    // The larger tenant's load is held once it has reserved its bytes.
    let (entered, loading) = tokio::sync::oneshot::channel::<()>();
    let entered = std::sync::Mutex::new(Some(entered));
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = std::sync::Mutex::new(released);
    store.before_vector_load(move |tenant| {
        if tenant == "large"
            && let Some(entered) = entered.lock().expect("lock").take()
        {
            let _ = entered.send(());
            let _ = released.lock().expect("lock").recv();
        }
    });
    let large = tokio::spawn({
        let (store, g) = (store.clone(), g.clone());
        async move { nearest(&store, "large", &g).await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(60), loading)
        .await
        .expect("the large load began")
        .expect("the large load began");
    assert_eq!(store.vector_bytes(), 6 * 88);
    // Meanwhile the smaller tenant finds no room: its search scans in SQL.
    assert_eq!(nearest(&store, "small", &g).await, "e 2");
    assert_eq!(store.cached_vectors("small"), None);
    assert!(store.vector_bytes() <= 600, "{}", store.vector_bytes());
    release.send(()).expect("release");
    assert_eq!(large.await.expect("large"), "e 6");
    assert_eq!(store.cached_vectors("large"), Some((6, 0)));
    assert!(store.vector_bytes() <= 600, "{}", store.vector_bytes());
}

/// A search whose budget went on waiting for a thread to read on (every
/// one of them held) is refused as busy, not as too costly: it did no
/// work. The clock is the runtime's, paused and moved by hand, so nothing
/// here depends on how fast the machine is.
#[test]
fn a_search_whose_budget_went_on_waiting_is_busy_not_too_costly() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::Store::open(dir.path()).await.expect("open");
        let t = Tenant::default();
        store
            .append(
                &t,
                &session("s"),
                entries(&["the release is on friday"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        let query = crate::search::query::Query::parse("release").expect("query");
        let scope = crate::store::SearchScope::default();
        let budget = std::time::Duration::from_millis(100);

        // The one thread for blocking work, held until let go.
        let (let_go, held) = std::sync::mpsc::channel::<()>();
        let (holding, hold_taken) = tokio::sync::oneshot::channel();
        let holder = tokio::task::spawn_blocking(move || {
            let _ = holding.send(());
            let _ = held.recv();
        });
        hold_taken.await.expect("the thread is held");

        tokio::time::pause();
        let search = tokio::spawn({
            let (store, query, scope, t) = (store.clone(), query.clone(), scope.clone(), t.clone());
            async move { store.search(&t, &scope, &query, 10, budget).await }
        });
        // The search starts, queues its read behind the held thread, and
        // waits; then its whole budget passes.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(budget * 2).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let_go.send(()).expect("let go");
        holder.await.expect("holder");
        let refused = search
            .await
            .expect("search task")
            .expect_err("waited its budget");
        assert!(
            matches!(refused, StoreError::SearchBusy { budget: b } if b == budget),
            "{refused:?}"
        );

        // With the thread free, the same search answers.
        tokio::time::resume();
        let hits = store
            .search(&t, &scope, &query, 10, crate::store::tests::SEARCH_BUDGET)
            .await
            .expect("search");
        assert_eq!(hits.len(), 1);
    });
}

/// The automerge of the tenant's search table, as FTS5 keeps it.
fn automerge_of_search_table(dir: &std::path::Path) -> Option<i64> {
    use rusqlite::OptionalExtension;
    let conn = raw(dir);
    let k = only_search_table(&conn);
    conn.query_row(
        &format!(
            "SELECT v FROM {}_config WHERE k = 'automerge'",
            fts::name(k)
        ),
        [],
        |r| r.get(0),
    )
    .optional()
    .expect("config")
}

#[tokio::test]
async fn search_tables_merge_at_this_builds_automerge_new_or_made_before() {
    let (dir, store) = open().await;
    assert!(append(&store, "s", &["a text to index"]).await);
    // A search indexes the tail, making the tenant's table.
    store
        .index_tail_of(Tenant::default().0.as_str())
        .await
        .expect("index");
    assert_eq!(
        automerge_of_search_table(dir.path()),
        Some(i64::from(fts::AUTOMERGE))
    );
    drop(store);
    // A table as an earlier build made it: FTS5's own default.
    let conn = raw(dir.path());
    let k = only_search_table(&conn);
    conn.execute(
        &format!("DELETE FROM {}_config WHERE k = 'automerge'", fts::name(k)),
        [],
    )
    .expect("forget");
    drop(conn);
    assert_eq!(automerge_of_search_table(dir.path()), None);
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("reopen");
    assert_eq!(
        automerge_of_search_table(dir.path()),
        Some(i64::from(fts::AUTOMERGE))
    );
    drop(store);
}

/// The hits (level, text) a search of the default tenant finds for `q`,
/// best first, after having the indexer index its tail (as `Store::search`
/// does).
async fn leveled_hits(store: &Sqlite, q: &str) -> Vec<(u32, String)> {
    let query = crate::search::query::Query::parse(q).expect("query");
    store
        .index_tail_of(&Tenant::default().0)
        .await
        .expect("tail");
    store
        .search(
            &Tenant::default(),
            &crate::store::SearchScope::default(),
            &query,
            100,
            true,
            &crate::store::bound::SearchBound::new(crate::store::tests::SEARCH_BUDGET),
        )
        .await
        .expect("search")
        .into_iter()
        .map(|h| (h.level, h.text))
        .collect()
}

/// The texts of `leveled_hits`, sorted.
async fn hits(store: &Sqlite, q: &str) -> Vec<String> {
    let mut texts: Vec<String> = leveled_hits(store, q)
        .await
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    texts.sort();
    texts
}

/// Holds the search file's write lock, as a long pass of the indexer (or
/// another process's) would, until dropped.
struct SearchFileHeld(Connection);

impl SearchFileHeld {
    fn take(dir: &std::path::Path) -> SearchFileHeld {
        let conn = raw(dir);
        conn.execute_batch("BEGIN; DELETE FROM search.search_marks WHERE 0;")
            .expect("the search file's lock");
        SearchFileHeld(conn)
    }
}

impl Drop for SearchFileHeld {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("COMMIT");
    }
}

#[tokio::test]
async fn appends_never_wait_for_the_indexer_below_the_bound_and_wait_at_it() {
    let (dir, store) = open().await;
    // A whole pass at 5 texts; appends wait at 10.
    store.set_tail_policy(5, std::time::Duration::from_secs(3600));
    let held = SearchFileHeld::take(dir.path());
    // The indexer cannot write, and appends up to the bound go through:
    // the writer takes the main file's lock alone.
    for i in 0..10 {
        assert!(
            append(&store, "s", &[&format!("held{i} text")]).await,
            "{i}"
        );
    }
    let store = std::sync::Arc::new(store);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { append(&store, "s", &["past the bound"]).await })
    };
    // At the bound it waits for a pass. (Not a measure of time: while the
    // lock is held no pass can end, however slow the machine.)
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    drop(held);
    assert!(waiting.await.expect("joined"));
    let want: Vec<String> = (0..10).map(|i| format!("held{i} text")).collect();
    assert_eq!(hits(&store, "text").await, want);
    assert_eq!(hits(&store, "bound").await, ["past the bound"]);
}

#[tokio::test]
async fn a_lost_search_file_is_made_again_with_everything_in_it() {
    let (dir, store) = open().await;
    assert!(append(&store, "s", &["the heron at the weir", "a second heron"]).await);
    assert_eq!(hits(&store, "heron").await.len(), 2);
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("{}{suffix}", fts::FILE)));
    }
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("reopen");
    assert_eq!(
        hits(&store, "heron").await,
        ["a second heron", "the heron at the weir"]
    );
    assert!(append(&store, "s", &["a third heron"]).await);
    assert_eq!(hits(&store, "heron").await.len(), 3);
}

#[tokio::test]
async fn a_pass_that_stops_at_its_limit_inside_a_session_says_more_is_left() {
    let (dir, store) = open().await;
    store.set_tail_policy(1_000_000, std::time::Duration::from_secs(3600));
    // A search waits for the indexer's start-up pass (which would index
    // what is appended before it runs); after it, nothing is due.
    assert!(append(&store, "warm", &["warm"]).await);
    assert_eq!(hits(&store, "warm").await, ["warm"]);
    let texts: Vec<String> = (1..=5).map(|i| format!("limit{i} word")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert!(append(&store, "one", &refs).await);
    // As the indexer does, with a limit of 3 entries a transaction.
    let conn = raw(dir.path());
    let pass = |conn: &Connection| {
        conn.execute_batch("BEGIN").expect("begin");
        fts::lock(conn).expect("lock");
        let pass = fts::index_tail(conn, None, 3).expect("pass");
        conn.execute_batch("COMMIT").expect("commit");
        pass
    };
    let first = pass(&conn);
    assert_eq!((first.texts, first.more), (3, true));
    let second = pass(&conn);
    assert_eq!((second.texts, second.more), (2, false));
    assert_eq!(pass(&conn).texts, 0);
    drop(conn);
    assert_eq!(hits(&store, "word").await, texts);
}

#[tokio::test]
async fn an_erasure_kept_from_the_search_file_answers_pending_and_finishes_once_it_is_free() {
    let (dir, store) = open().await;
    let t = Tenant::default();
    assert!(append(&store, "gone", &["marker one", "marker two"]).await);
    assert_eq!(hits(&store, "marker").await.len(), 2);
    assert!(append(&store, "gone", &["marker three"]).await);
    assert!(append(&store, "kept", &["other words"]).await);
    let held = SearchFileHeld::take(dir.path());
    let erased = store.delete_session(&t, &session("gone")).await;
    assert!(
        matches!(erased, Err(StoreError::CheckpointBusy)),
        "{erased:?}"
    );
    // Gone to readers at once, and counted as pending.
    assert_eq!(count_entries(&store, "gone").await, 0);
    assert_eq!(
        store.backlog(None).await.expect("backlog").erasures_pending,
        1
    );
    // Appends go on meanwhile.
    assert!(append(&store, "kept", &["more words"]).await);
    drop(held);
    // It finishes in the background, with no restart (a generous ceiling).
    for _ in 0..300 {
        if erasing_and_entries(dir.path()) == (0, 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(erasing_and_entries(dir.path()), (0, 2));
    assert!(hits(&store, "marker").await.is_empty());
    assert_eq!(hits(&store, "words").await, ["more words", "other words"]);
}

#[tokio::test]
async fn a_search_file_from_another_database_is_made_again_from_this_one() {
    let (dir, store) = open().await;
    assert!(append(&store, "s", &["alpha one", "alpha two"]).await);
    assert_eq!(hits(&store, "alpha").await.len(), 2);
    drop(store);
    let (other, store) = open().await;
    assert!(append(&store, "s", &["beta one", "beta two", "beta three"]).await);
    assert_eq!(hits(&store, "beta").await.len(), 3);
    drop(store);
    // Let both stores' threads end before the files are copied.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for suffix in ["", "-wal", "-shm"] {
        let name = format!("{}{suffix}", fts::FILE);
        let _ = std::fs::remove_file(dir.path().join(&name));
        if other.path().join(&name).is_file() {
            std::fs::copy(other.path().join(&name), dir.path().join(&name)).expect("copy");
        }
    }
    let store = Sqlite::open(dir.path(), Durability::Process, OpenMode::Existing)
        .await
        .expect("reopen");
    assert_eq!(hits(&store, "alpha").await, ["alpha one", "alpha two"]);
    assert!(hits(&store, "beta").await.is_empty());
}

#[tokio::test]
async fn the_backlog_of_a_language_change_and_the_tail_never_index_one_entry_twice() {
    let (dir, store) = open().await;
    store.set_tail_policy(1_000_000, std::time::Duration::from_secs(3600));
    assert!(append(&store, "a", &["alpha one"]).await);
    assert!(append(&store, "b", &["beta one"]).await);
    assert_eq!(hits(&store, "one").await.len(), 2);
    assert!(
        store
            .set_search_language(crate::config::SearchLanguage::English)
            .await
            .expect("language")
    );
    // Stored after the change, inside the backlog's range (session a's
    // documents come before b's): the tail's, not the backlog's.
    assert!(append(&store, "a", &["alpha two"]).await);
    while !store.index_some(100).await.expect("backlog").done {}
    // The backlog left it to the tail: indexing it there too would count
    // its terms twice in bm25's statistics (FTS5 lists it once either way).
    let conn = raw(dir.path());
    let table = fts::name(only_search_table(&conn));
    let listed = |word: &str| -> i64 {
        conn.query_row(
            &format!("SELECT count(*) FROM {table} WHERE {table} MATCH ?1"),
            [word],
            |r| r.get(0),
        )
        .expect("match")
    };
    assert_eq!(listed("two"), 0);
    assert_eq!(hits(&store, "alpha").await, ["alpha one", "alpha two"]);
    // Indexed once, by the tail.
    assert_eq!(listed("two"), 1);
    conn.execute(
        &format!("INSERT INTO {table} ({table}) VALUES ('integrity-check')"),
        [],
    )
    .expect("the index is whole");
}

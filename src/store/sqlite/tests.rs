//! What only the SQLite backend promises: its writer's group commit never
//! lets an acknowledged write be lost or an unacknowledged one be stored,
//! it commits with the durability asked for, its trigger-kept counts
//! equal a recount, and its log is checkpointed beside the writer.

use super::*;
use crate::model::{SegmentPolicy, Tenant};
use crate::store::tests::{entries, session};

const POLICY: SegmentPolicy = SegmentPolicy {
    max_entries: 1,
    max_tokens: 1_000_000,
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
        .context(&Tenant::default(), &session(name), 0, usize::MAX)
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
            .context(&Tenant::default(), &session("ghost"), 0, usize::MAX)
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
    let conn = Connection::open(dir.path().join(DATABASE_FILE)).expect("open");
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
        let conn = Connection::open(dir.path().join(DATABASE_FILE)).expect("open");
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
    // Appends go on after it, at the next ordinal.
    assert!(append(&store, "old", &["third"]).await);
    let ctx = store
        .context(&Tenant::default(), &session("old"), 0, usize::MAX)
        .await
        .expect("context");
    assert_eq!(ctx.items.len(), 2);
    // Every reference still points at the live tables.
    let conn = Connection::open(dir.path().join(DATABASE_FILE)).expect("open");
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
        assert!(waited < 100, "the log was not checkpointed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    let log = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(log < 11_000 * 4200, "the log grew to {log} bytes");
    assert_eq!(count_entries(&store, "s").await, 600);
}

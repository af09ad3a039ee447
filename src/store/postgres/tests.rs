//! What only the PostgreSQL backend promises: several processes on one
//! database (here, several stores, each with its own pool and writers, as
//! replicas have) append to one session with gapless seqs, honour one
//! another's idempotency keys and claims, make each roll-up once, and
//! migrate a new database together; its kept counts equal a recount.

use std::collections::BTreeSet;
use std::time::Duration;

use super::testing::fresh_database;
use crate::model::{NewEntry, Role, SegmentPolicy, SegmentState, Summary, Tenant};
use crate::store::tests::{entries, session};
use crate::store::{Durability, OpenMode, Store, StoreError};

const BIG: SegmentPolicy = SegmentPolicy {
    max_entries: 1_000_000,
    max_tokens: 1_000_000_000,
    max_gap: None,
};
/// Segments of one entry each: every append closes what it stores.
const ONE: SegmentPolicy = SegmentPolicy {
    max_entries: 1,
    max_tokens: 1_000_000,
    max_gap: None,
};
const LEASE: Duration = Duration::from_secs(60);

/// Erases the default tenant's session `name` on a task of its own (to
/// be caught waiting for a lock).
fn erase_in_background(
    store: &Store,
    name: &str,
) -> tokio::task::JoinHandle<Result<crate::store::Erased, StoreError>> {
    let (store, name) = (store.clone(), session(name));
    tokio::spawn(async move { store.delete_session(&Tenant::default(), &name).await })
}

/// A plain client of the test database, for holding locks and watching
/// who waits.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

fn summary() -> Summary {
    Summary {
        text: "recap".to_owned(),
        provider: "test".to_owned(),
        model: "m".to_owned(),
        prompt_version: "v".to_owned(),
        input_tokens: 1,
        output_tokens: 1,
        created_at: crate::model::Millis::now(),
    }
}

/// `n` stores on one fresh database, as `n` replicas would have.
async fn replicas(n: usize) -> Option<(super::testing::TestDatabase, Vec<Store>)> {
    let db = fresh_database().await?;
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(Store::connect(&db.url).await.expect("open"));
    }
    Some((db, stores))
}

#[tokio::test]
async fn the_server_answers() {
    // Under ARCHIVIST_REQUIRE_PG=1 (CI) an unreachable server fails here.
    if let Some(db) = fresh_database().await {
        Store::connect(&db.url).await.expect("connect and migrate");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_a_new_database_together_take_turns() {
    let Some(db) = fresh_database().await else {
        return;
    };
    let mut opening = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        opening.push(tokio::spawn(async move { Store::connect(&url).await }));
    }
    for o in opening {
        o.await.expect("joined").expect("each replica opens");
    }
}

#[tokio::test]
async fn an_existing_or_read_only_open_needs_the_schema_and_never_writes() {
    let Some(db) = fresh_database().await else {
        return;
    };
    for mode in [OpenMode::Existing, OpenMode::ReadOnly] {
        let opened = Store::open_postgres(&db.url, mode, Durability::Process).await;
        assert!(
            matches!(opened, Err(StoreError::NoDatabase { .. })),
            "{mode:?}"
        );
    }
    let store = Store::connect(&db.url).await.expect("create");
    let t = Tenant::default();
    store
        .append(&t, &session("s"), entries(&["x"]), BIG, 0)
        .await
        .expect("append");
    let read_only = Store::open_postgres(&db.url, OpenMode::ReadOnly, Durability::Process)
        .await
        .expect("read-only");
    assert_eq!(
        read_only
            .flushed(&t, &session("s"), usize::MAX)
            .await
            .expect("read")
            .0
            .len(),
        1
    );
    assert!(matches!(
        read_only
            .append(&t, &session("s"), entries(&["y"]), BIG, 0)
            .await,
        Err(StoreError::ReadOnly)
    ));
    let existing = Store::open_postgres(&db.url, OpenMode::Existing, Durability::Process)
        .await
        .expect("existing");
    assert!(existing.has_session(&t, &session("s")).await.expect("has"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_to_one_session_from_replicas_get_gapless_seqs() {
    let Some((_db, stores)) = replicas(3).await else {
        return;
    };
    let small = SegmentPolicy {
        max_entries: 7,
        max_tokens: 1_000_000,
        max_gap: None,
    };
    let mut tasks = Vec::new();
    for (r, store) in stores.iter().enumerate() {
        for w in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..25 {
                    let texts = [
                        format!("r{r} w{w} call {i} a"),
                        format!("r{r} w{w} call {i} b"),
                    ];
                    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                    let out = store
                        .append(
                            &Tenant::default(),
                            &session("shared"),
                            entries(&refs),
                            small,
                            0,
                        )
                        .await
                        .expect("append");
                    seqs.extend(out.entries.iter().map(|e| e.seq));
                    // A call's entries are consecutive.
                    assert_eq!(out.entries[1].seq, out.entries[0].seq + 1);
                }
                seqs
            }));
        }
    }
    let mut all = BTreeSet::new();
    let mut n = 0;
    for t in tasks {
        for seq in t.await.expect("joined") {
            assert!(all.insert(seq), "seq {seq} given twice");
            n += 1;
        }
    }
    assert_eq!(all, (1..=n as u64).collect(), "gapless");
    // The segments tile the seqs too: each closed at 7 entries.
    let t = Tenant::default();
    let (segments, _) = stores[0]
        .flushed(&t, &session("shared"), usize::MAX)
        .await
        .expect("segments");
    let mut next = 1;
    for s in &segments {
        assert_eq!(s.first_seq, next);
        assert_eq!(s.entry_count as u64, s.last_seq - s.first_seq + 1);
        next = s.last_seq + 1;
    }
    assert_eq!(next, n as u64 + 1);
    let b = stores[1].backlog(Some(&t)).await.expect("backlog");
    assert_eq!(b.pending + b.open, segments.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_sent_through_two_replicas_at_once_is_stored_once() {
    let Some((_db, stores)) = replicas(2).await else {
        return;
    };
    let t = Tenant::default();
    let s = session("s");
    for i in 0..20 {
        let keyed = vec![NewEntry {
            client_entry_id: Some(format!("k{i}")),
            role: Role::User,
            content: format!("entry {i}"),
            occurred_at: None,
            name: None,
            metadata: Default::default(),
        }];
        let (a, b) = tokio::join!(
            stores[0].append(&t, &s, keyed.clone(), BIG, 0),
            stores[1].append(&t, &s, keyed, BIG, 0)
        );
        let (a, b) = (a.expect("a"), b.expect("b"));
        assert_eq!(a.entries[0].seq, b.entries[0].seq, "one seq for one key");
        assert_eq!(
            u8::from(a.entries[0].duplicate) + u8::from(b.entries[0].duplicate),
            1,
            "stored once"
        );
        assert_eq!(a.entries[0].seq, i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_is_claimed_by_one_replica_at_a_time() {
    let Some((_db, stores)) = replicas(3).await else {
        return;
    };
    let t = Tenant::default();
    let texts: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = stores[0]
        .append(&t, &session("s"), entries(&refs), ONE, 0)
        .await
        .expect("append");
    // Every replica tries every segment at once: each is claimed once.
    let mut tasks = Vec::new();
    for (r, store) in stores.iter().enumerate() {
        let store = store.clone();
        let ids = out.closed_segment_ids.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for id in ids {
                if let Some((claim, _)) = store
                    .claim(id, &format!("replica-{r}"), LEASE)
                    .await
                    .expect("claim")
                {
                    won.push(claim);
                }
            }
            won
        }));
    }
    let mut claimed = BTreeSet::new();
    let mut claims = Vec::new();
    for task in tasks {
        for claim in task.await.expect("joined") {
            assert!(claimed.insert(claim.segment_id), "claimed twice");
            claims.push(claim);
        }
    }
    assert_eq!(claimed.len(), 30);
    for claim in &claims {
        assert!(
            stores[2]
                .complete(claim, summary(), 1, 0)
                .await
                .expect("complete")
                .held
        );
    }
    let b = stores[1].backlog(Some(&t)).await.expect("backlog");
    assert_eq!((b.pending, b.summarised), (0, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_completed_on_two_replicas_at_once_make_their_roll_up_once() {
    let Some((_db, stores)) = replicas(2).await else {
        return;
    };
    let t = Tenant::default();
    for round in 0..10 {
        let name = format!("s{round}");
        let out = stores[0]
            .append(&t, &session(&name), entries(&["a", "b"]), ONE, 0)
            .await
            .expect("append");
        let ids = out.closed_segment_ids;
        let (a, _) = stores[0]
            .claim(ids[0], "a", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let (b, _) = stores[1]
            .claim(ids[1], "b", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let (ra, rb) = tokio::join!(
            stores[0].complete(&a, summary(), 1, 2),
            stores[1].complete(&b, summary(), 1, 2)
        );
        let made: Vec<_> = [ra.expect("a"), rb.expect("b")]
            .into_iter()
            .flat_map(|c| c.rollups)
            .collect();
        assert_eq!(made.len(), 1, "round {round}: one roll-up, made once");
        let rollup = stores[1].segment(&t, made[0]).await.expect("roll-up");
        assert_eq!((rollup.level, rollup.state), (2, SegmentState::Pending));
        assert_eq!(rollup.child_ids, ids);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_character_refuses_its_call_only() {
    let Some((_db, stores)) = replicas(1).await else {
        return;
    };
    let store = &stores[0];
    let t = Tenant::default();
    // Calls queued together commit in one batch: the refused one is left
    // out, the others are stored.
    let (s, o) = (session("s"), session("o"));
    let (good, bad, other) = tokio::join!(
        store.append(&t, &s, entries(&["fine"]), BIG, 0),
        store.append(&t, &s, entries(&["ok", "not\0ok"]), BIG, 0),
        store.append(&t, &o, entries(&["fine too"]), BIG, 0),
    );
    assert!(
        matches!(bad, Err(StoreError::Unstorable { index: 1, .. })),
        "{bad:?}"
    );
    assert_eq!(good.expect("good").entries[0].seq, 1);
    assert_eq!(other.expect("other").entries[0].seq, 1);
    let next = store
        .append(&t, &s, entries(&["next"]), BIG, 0)
        .await
        .expect("append");
    assert_eq!(next.entries[0].seq, 2, "the refused call took no seq");
}

/// Counts per state of every segment, by reading them all.
async fn recount(store: &Store) -> [u64; 4] {
    let all = store
        .backfill_segments(crate::store::BackfillFilter {
            states: SegmentState::ALL.to_vec(),
            ..Default::default()
        })
        .await
        .expect("segments");
    let mut counts = [0u64; 4];
    for (s, _) in all {
        counts[s.state.code() as usize - 1] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_counts_equal_a_recount_through_every_change_and_fold() {
    let Some((_db, stores)) = replicas(2).await else {
        return;
    };
    let two = SegmentPolicy {
        max_entries: 2,
        max_tokens: 1_000_000,
        max_gap: None,
    };
    let texts: Vec<String> = (0..21).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for tenant in ["a", "b"] {
        stores[0]
            .append(
                &Tenant(tenant.to_owned()),
                &session("s"),
                entries(&refs),
                two,
                0,
            )
            .await
            .expect("append");
    }
    let check = || async {
        let b = stores[1].backlog(None).await.expect("backlog");
        assert_eq!(
            [b.open, b.pending, b.summarised, b.parked],
            recount(&stores[0]).await
        );
    };
    check().await;
    let due = stores[0]
        .due_segments(crate::model::Millis::now(), 100)
        .await
        .expect("due");
    for (i, id) in due.iter().enumerate() {
        let (claim, _) = stores[i % 2]
            .claim(*id, "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        if i % 3 == 0 {
            let parked = crate::store::EndedPass {
                disposition: crate::model::Disposition::Park,
                attempts: 1,
                failure: None,
                provider_fingerprint: "f".to_owned(),
            };
            assert!(stores[i % 2].end_pass(&claim, parked).await.expect("park"));
        } else {
            assert!(
                stores[i % 2]
                    .complete(&claim, summary(), 1, 2)
                    .await
                    .expect("complete")
                    .held
            );
        }
        if i % 5 == 0 {
            // A probe folds the deltas in, as a replica's health check does.
            stores[i % 2].probe().await.expect("probe");
        }
    }
    check().await;
    stores[0]
        .delete_session(&Tenant("a".to_owned()), &session("s"))
        .await
        .expect("erase");
    check().await;
    stores[1].probe().await.expect("probe");
    check().await;
    let b = stores[0]
        .backlog(Some(&Tenant("a".to_owned())))
        .await
        .expect("backlog");
    assert_eq!([b.open, b.pending, b.summarised, b.parked], [0, 0, 0, 0]);
}

/// Completes `claim` on `store` and then, while the session lasts, claims
/// and completes each roll-up that completing makes: a pass's chain up the
/// memory tree. Every roll-up made, in order.
async fn complete_up_the_tree(store: Store, claim: crate::store::Claim) -> Vec<u64> {
    let mut made = Vec::new();
    let mut claim = claim;
    loop {
        let done = store
            .complete(&claim, summary(), 1, 2)
            .await
            .unwrap_or_else(|e| panic!("complete {}: {e:?}", claim.segment_id));
        let Some(&rollup) = done.rollups.last() else {
            return made;
        };
        made.push(rollup);
        match store.claim(rollup, "up", LEASE).await {
            Ok(Some((next, _))) => claim = next,
            // Erased meanwhile, or taken by another pass.
            Ok(None) => return made,
            Err(e) => panic!("claim roll-up {rollup}: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_racing_passes_that_make_roll_ups_never_deadlocks() {
    let Some((db, stores)) = replicas(2).await else {
        return;
    };
    let t = Tenant::default();
    let texts: Vec<String> = (0..8).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    // A session nobody erases: it must come through whole.
    stores[0]
        .append(&t, &session("bystander"), entries(&refs), ONE, 0)
        .await
        .expect("append");
    for round in 0..24u64 {
        let name = format!("s{round}");
        let out = stores[0]
            .append(&t, &session(&name), entries(&refs), ONE, 0)
            .await
            .expect("append");
        let mut claims = Vec::new();
        for (i, id) in out.closed_segment_ids.iter().enumerate() {
            let (claim, _) = stores[i % 2]
                .claim(*id, "w", LEASE)
                .await
                .expect("claim")
                .expect("free");
            claims.push(claim);
        }
        // Every pass completes at once, on both replicas, while the
        // session is erased (at a point that moves from round to round)
        // and requeued.
        let mut passes = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            passes.push(tokio::spawn(complete_up_the_tree(
                stores[i % 2].clone(),
                claim,
            )));
        }
        let eraser = stores[(round % 2) as usize].clone();
        let erased_name = name.clone();
        let erasure = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(250 * (round % 6))).await;
            eraser
                .delete_session(&Tenant::default(), &session(&erased_name))
                .await
        });
        let requeuer = stores[((round + 1) % 2) as usize].clone();
        let requeued_name = name.clone();
        let requeue = tokio::spawn(async move {
            requeuer
                .requeue(
                    &Tenant::default(),
                    crate::store::SegmentFilter {
                        session: Some(session(&requeued_name)),
                        states: vec![SegmentState::Pending],
                        ..Default::default()
                    },
                )
                .await
        });
        let mut made = Vec::new();
        for pass in passes {
            made.extend(pass.await.expect("joined"));
        }
        let erased = erasure
            .await
            .expect("joined")
            .unwrap_or_else(|e| panic!("round {round}: erase: {e:?}"));
        assert_eq!(erased.entries, 8, "round {round}");
        assert!(erased.segments >= 8, "round {round}: {erased:?}");
        requeue
            .await
            .expect("joined")
            .unwrap_or_else(|e| panic!("round {round}: requeue: {e:?}"));
        // Nothing of the session is left, roll-ups made during the race
        // included.
        assert!(
            !stores[1]
                .has_session(&t, &session(&name))
                .await
                .expect("has")
        );
        for id in made {
            assert!(
                matches!(
                    stores[0].segment_any(id).await,
                    Err(StoreError::SegmentNotFound(_))
                ),
                "round {round}: roll-up {id} outlived its session"
            );
        }
    }
    let left = stores[0]
        .backfill_segments(crate::store::BackfillFilter {
            states: SegmentState::ALL.to_vec(),
            ..Default::default()
        })
        .await
        .expect("segments");
    assert_eq!(left.len(), 8, "only the bystander's segments are left");
    assert!(left.iter().all(|(s, _)| s.session == "bystander"));
    stores[1].probe().await.expect("probe");
    let b = stores[0].backlog(None).await.expect("backlog");
    assert_eq!(
        [b.open, b.pending, b.summarised, b.parked],
        recount(&stores[0]).await
    );
    drop(stores);
    assert_eq!(db.deadlocks().await, 0, "the server broke a deadlock");
}

/// The statements of the connections to the database of `observer` that
/// wait for a lock, in no particular order.
async fn waiting_statements(observer: &tokio_postgres::Client) -> Vec<String> {
    observer
        .query(
            "SELECT query FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("read pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Waits (up to 10 s) until exactly `n` connections wait for a lock, and
/// returns their statements.
async fn until_waiting(observer: &tokio_postgres::Client, n: usize, what: &str) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let waiting = waiting_statements(observer).await;
            if waiting.len() == n {
                return waiting;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: never {n} connections waiting for a lock"))
}

/// The lock order of the module doc, step by step: an erasure and a
/// completing pass of one session meet at the session, never on its
/// segments. Whichever locks the session first, the other waits for it
/// there, before it has locked a segment; neither ever waits for the
/// other while holding segments the other wants (the cycle a CI run once
/// reported: the erasure deleting the session's row, waiting for a pass's
/// key-share lock, while the pass waited for a segment the erasure held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_and_a_completing_pass_meet_at_the_session() {
    let Some((db, stores)) = replicas(2).await else {
        return;
    };
    let t = Tenant::default();
    let holder = connect(&db.url).await;
    let observer = connect(&db.url).await;
    // The statements that lock a session's segments: the erasure's and a
    // pass's (its level's nodes).
    let locks_segments = |q: &String| q.contains("FROM segments WHERE session_id");

    // The erasure first: another transaction holds the session's newest
    // segment, so the erasure stops inside its transaction with the
    // session's row and its older segments locked.
    let out = stores[0]
        .append(&t, &session("e"), entries(&["a", "b", "c", "d"]), ONE, 0)
        .await
        .expect("append");
    let ids = out.closed_segment_ids.clone();
    assert_eq!(ids.len(), 4);
    let mut claims = Vec::new();
    for id in &ids {
        let (claim, _) = stores[1]
            .claim(*id, "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        claims.push(claim);
    }
    let newest = i64::try_from(*ids.iter().max().expect("ids")).expect("id");
    holder.execute("BEGIN", &[]).await.expect("begin");
    holder
        .execute(
            "SELECT id FROM segments WHERE id = $1 FOR UPDATE",
            &[&newest],
        )
        .await
        .expect("lock the newest segment");
    let erasure = erase_in_background(&stores[0], "e");
    let waiting = until_waiting(&observer, 1, "the erasure").await;
    assert!(
        waiting[0].contains("FROM segments WHERE session_id"),
        "the erasure waits at {waiting:?}"
    );
    // A pass completing the oldest segment now waits for the erasure at the
    // session: it has locked no segment the erasure will want.
    let oldest = claims.remove(0);
    let pass = tokio::spawn({
        let store = stores[1].clone();
        async move { store.complete(&oldest, summary(), 1, 2).await }
    });
    let waiting = until_waiting(&observer, 2, "the pass").await;
    assert_eq!(
        waiting.iter().filter(|q| locks_segments(q)).count(),
        1,
        "the pass must wait at the session, not at segments: {waiting:?}"
    );
    holder.execute("ROLLBACK", &[]).await.expect("unlock");
    let erased = erasure
        .await
        .expect("joined")
        .expect("the erasure finishes");
    assert_eq!(erased.entries, 4);
    let done = pass.await.expect("joined").expect("the pass finishes");
    assert!(!done.held, "the session was erased under the pass");

    // The pass first: it holds its session's key-share lock and waits for
    // the forming of its level's roll-ups (held here), so the erasure waits
    // for it at the session's row, before locking any segment.
    let out = stores[0]
        .append(&t, &session("p"), entries(&["a", "b"]), ONE, 0)
        .await
        .expect("append");
    let (claim, _) = stores[1]
        .claim(out.closed_segment_ids[0], "w", LEASE)
        .await
        .expect("claim")
        .expect("free");
    let session_id: i64 = observer
        .query_one("SELECT id FROM sessions WHERE name = 'p'", &[])
        .await
        .expect("session id")
        .get(0);
    holder
        .execute(
            "SELECT pg_advisory_lock(($1::BIGINT << 8) | 1)",
            &[&session_id],
        )
        .await
        .expect("hold the level");
    let pass = tokio::spawn({
        let store = stores[1].clone();
        async move { store.complete(&claim, summary(), 1, 2).await }
    });
    let waiting = until_waiting(&observer, 1, "the pass").await;
    assert!(
        waiting[0].contains("pg_advisory_xact_lock"),
        "the pass waits at {waiting:?}"
    );
    let erasure = erase_in_background(&stores[0], "p");
    let waiting = until_waiting(&observer, 2, "the erasure").await;
    assert!(
        !waiting.iter().any(locks_segments),
        "the erasure must wait at the session, not at segments: {waiting:?}"
    );
    holder
        .execute(
            "SELECT pg_advisory_unlock(($1::BIGINT << 8) | 1)",
            &[&session_id],
        )
        .await
        .expect("let the level go");
    let done = pass.await.expect("joined").expect("the pass finishes");
    assert!(done.held);
    let erased = erasure
        .await
        .expect("joined")
        .expect("the erasure finishes");
    assert_eq!(erased.entries, 2);

    drop((holder, observer, stores));
    assert_eq!(db.deadlocks().await, 0, "the server broke a deadlock");
}

/// A deadlock the server breaks is retried, but not silently: the losing
/// transaction logs the server's account of the cycle. Forced here: the
/// erasure waits for a segment another transaction holds, which then
/// waits for the erasure's session row; the other transaction's
/// `deadlock_timeout` is long, so the erasure is the one failed. On one
/// thread, so that the capture sees the erasure's log.
#[tokio::test]
async fn a_deadlock_broken_by_the_server_is_logged_with_its_cycle() {
    let Some((db, stores)) = replicas(1).await else {
        return;
    };
    let t = Tenant::default();
    let out = stores[0]
        .append(&t, &session("s"), entries(&["a", "b"]), ONE, 0)
        .await
        .expect("append");
    let newest = i64::try_from(*out.closed_segment_ids.iter().max().expect("ids")).expect("id");
    let holder = std::sync::Arc::new(connect(&db.url).await);
    let observer = connect(&db.url).await;
    let session_id: i64 = observer
        .query_one("SELECT id FROM sessions WHERE name = 's'", &[])
        .await
        .expect("session id")
        .get(0);
    holder
        .batch_execute("SET deadlock_timeout = '60s'; BEGIN")
        .await
        .expect("begin");
    holder
        .execute(
            "SELECT id FROM segments WHERE id = $1 FOR UPDATE",
            &[&newest],
        )
        .await
        .expect("lock the newest segment");
    let log = crate::test_log::LogCapture::start();
    log.rearm();
    let erasure = erase_in_background(&stores[0], "s");
    until_waiting(&observer, 1, "the erasure").await;
    // Waits for the erasure, which waits for it: the erasure's check, a
    // second in, finds the cycle and fails the erasure's transaction; the
    // retry then waits for this key-share lock until the ROLLBACK.
    holder
        .execute(
            "SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE",
            &[&session_id],
        )
        .await
        .expect("the erasure lost the deadlock, not this");
    holder.batch_execute("ROLLBACK").await.expect("unlock");
    let erased = erasure.await.expect("joined").expect("the retry erases");
    assert_eq!(erased.entries, 2);
    let text = log.text();
    assert!(
        text.contains("PostgreSQL broke a deadlock") && text.contains("transaction=\"erasure\""),
        "{text}"
    );
    assert!(
        text.contains("waits for ShareLock on transaction"),
        "{text}"
    );
    drop((holder, observer, stores));
    assert_eq!(db.deadlocks().await, 1);
}

/// How many connections to the database of `observer` (other than its
/// own) are in `state`, or waiting for a lock when `state` is "lock".
async fn backends(observer: &tokio_postgres::Client, state: &str) -> i64 {
    observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND (state = $1 OR ($1 = 'lock' AND wait_event_type = 'Lock'))",
            &[&state],
        )
        .await
        .expect("read pg_stat_activity")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_inside_a_transaction_is_closed_not_reused() {
    let Some((db, stores)) = replicas(1).await else {
        return;
    };
    let store = stores[0].clone();
    let t = Tenant::default();
    store
        .append(&t, &session("s"), entries(&["a", "b", "c"]), ONE, 0)
        .await
        .expect("append");
    // Another transaction holds the session's segments, so an erasure
    // stops inside its transaction, waiting for them.
    let holder = connect(&db.url).await;
    let observer = connect(&db.url).await;
    holder
        .batch_execute("BEGIN; SELECT id FROM segments FOR UPDATE")
        .await
        .expect("lock the segments");
    let erasure = erase_in_background(&store, "s");
    let waiting = tokio::time::timeout(Duration::from_secs(10), async {
        while backends(&observer, "lock").await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waiting.is_ok(), "the erasure never waited for the lock");
    // Cancelled mid-transaction: its connection must not go back to the
    // pool with the transaction open.
    erasure.abort();
    assert!(erasure.await.is_err_and(|e| e.is_cancelled()));
    // Its statement is cancelled, not left waiting for the lock (and
    // holding the erasure's own) until the holder lets go.
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        while backends(&observer, "lock").await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        cancelled.is_ok(),
        "the cancelled erasure still waits for the lock"
    );
    holder.batch_execute("ROLLBACK").await.expect("unlock");

    // Every pooled connection, used in turn, sees the session whole: none
    // runs its statements inside the erasure's transaction (which would
    // show the session gone, and commit its erasure with the next COMMIT),
    // and none holds its locks (an append would wait for them forever).
    let t = Tenant::default();
    let checks = tokio::time::timeout(Duration::from_secs(10), async {
        for i in 0..(2 * 16) {
            assert!(
                store.has_session(&t, &session("s")).await.expect("has"),
                "check {i}: the session looks erased"
            );
        }
        store
            .append(&t, &session("s"), entries(&["d"]), ONE, 0)
            .await
            .expect("append after")
    })
    .await
    .expect("the erasure's locks outlived its cancellation");
    assert_eq!(checks.entries[0].seq, 4);
    // The dropped connection's server process is gone: nothing is left
    // idle inside a transaction.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while backends(&observer, "idle in transaction").await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "a connection stays idle in a transaction");
    let (segments, _) = store
        .flushed(&t, &session("s"), usize::MAX)
        .await
        .expect("segments");
    assert_eq!(segments.len(), 4, "nothing of the erasure was committed");
}

#[test]
fn a_described_url_never_shows_a_password_even_with_an_unencoded_at() {
    for (url, secret) in [
        ("postgres://u:S3cr@tPW@127.0.0.1:5432/db", ["S3cr", "tPW"]),
        (
            "postgres://u:Pq7@Xz9@Wk4@db.example:5432/db",
            ["Pq7", "Xz9@Wk4"],
        ),
        (
            "postgres://u:Plain-Secret@127.0.0.1:5432/db",
            ["Plain-Secret", "Secret"],
        ),
    ] {
        let config: tokio_postgres::Config = url.parse().expect("a URL");
        let described = super::describe(&config);
        for part in secret {
            assert!(!described.contains(part), "{described} shows {part}");
        }
        assert!(described.starts_with("postgres://u@"), "{described}");
    }
    let config: tokio_postgres::Config = "postgres://u:S3cr@tPW@127.0.0.1:5432/db"
        .parse()
        .expect("a URL");
    assert!(
        super::describe(&config).contains("%40"),
        "says how to write it"
    );
}

/// The texts a search of the default tenant finds.
async fn found(store: &Store, q: &str) -> Vec<String> {
    let scope = crate::store::SearchScope::default();
    crate::store::tests::found(store, &Tenant::default(), &scope, q).await
}

/// Takes the database back to before the search index's backlog
/// migration (the fourth) and those after it (embeddings, their
/// generation), then `then` changes its columns as an older build left
/// them.
async fn before_the_backlog(url: &str, then: &str) {
    const BACKLOG: i32 = 4;
    let client = connect(url).await;
    client
        .execute(
            "DELETE FROM archivist_schema_version WHERE version >= $1",
            &[&BACKLOG],
        )
        .await
        .expect("version");
    client
        .batch_execute(&format!(
            "DROP TABLE search_state; \
             DROP TABLE embedding_state, embeddings, embedding_generations, embeddings_owed; \
             DROP FUNCTION archivist_owe_entries, archivist_owe_summary CASCADE; {then}"
        ))
        .await
        .expect("older columns");
}

#[tokio::test]
async fn a_database_from_before_the_index_backlog_keeps_or_owes_its_vectors() {
    let Some(db) = fresh_database().await else {
        return;
    };
    let t = Tenant::default();
    // Generated columns (the first search build): their vectors are kept,
    // the columns become plain ones the writes fill.
    let store = Store::connect(&db.url).await.expect("open");
    store
        .append(
            &t,
            &session("a"),
            entries(&["alpha was said before"]),
            BIG,
            0,
        )
        .await
        .expect("append");
    drop(store);
    before_the_backlog(
        &db.url,
        "ALTER TABLE entries DROP COLUMN tsv; \
         ALTER TABLE entries ADD COLUMN tsv tsvector \
             GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, content)) STORED; \
         CREATE INDEX entries_search ON entries USING GIN (tsv);",
    )
    .await;
    let store = Store::connect(&db.url).await.expect("migrated");
    assert_eq!(store.index_backlog().await.expect("backlog"), 0);
    assert_eq!(found(&store, "alpha").await, ["alpha was said before"]);
    store
        .append(&t, &session("a"), entries(&["beta came after"]), BIG, 0)
        .await
        .expect("append to a plain column");
    assert_eq!(found(&store, "beta").await, ["beta came after"]);
    drop(store);

    // Rows stored before the index (no vector): owed, found once indexed.
    before_the_backlog(&db.url, "UPDATE entries SET tsv = NULL;").await;
    let store = Store::connect(&db.url).await.expect("migrated");
    assert_eq!(store.index_backlog().await.expect("backlog"), 2);
    assert!(found(&store, "alpha or beta").await.is_empty());
    let step = store.index_some(1).await.expect("index");
    assert_eq!((step.texts, step.done), (1, false));
    assert_eq!(
        found(&store, "alpha or beta").await,
        ["alpha was said before"]
    );
    let step = store.index_some(1).await.expect("index");
    assert_eq!((step.texts, step.done), (1, true));
    assert_eq!(found(&store, "beta").await, ["beta came after"]);
    assert_eq!(store.index_backlog().await.expect("backlog"), 0);
}

//! The store's behaviour, as one suite that every backend runs: each test
//! takes its stores from `stores()`, so a new backend joins by adding
//! itself there.

use std::any::Any;
use std::time::Duration;

use super::*;
use crate::failure::FailureClass;
use crate::model::{Context, ContextItem, Role};

const POLICY: SegmentPolicy = SegmentPolicy {
    max_entries: 1000,
    max_tokens: 1_000_000,
    max_gap: None,
};

/// A fresh, empty store on every backend, each with what keeps its
/// database alive: SQLite in a temporary directory, and PostgreSQL in a
/// database of its own (dropped after the test) when a server is reachable
/// (`postgres::testing`: otherwise that half is skipped with a notice, or
/// fails under `ARCHIVIST_REQUIRE_PG=1`).
pub(super) async fn stores() -> Vec<(Box<dyn Any>, Store)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = Store::open(dir.path()).await.expect("open sqlite");
    let mut all: Vec<(Box<dyn Any>, Store)> = vec![(Box::new(dir), sqlite)];
    if let Some(db) = postgres::testing::fresh_database().await {
        let store = Store::open_postgres(&db.url, OpenMode::Create, Durability::Process)
            .await
            .expect("open postgres");
        all.push((Box::new(db), store));
    }
    all
}

pub(super) fn entries(texts: &[&str]) -> Vec<NewEntry> {
    texts
        .iter()
        .map(|t| NewEntry {
            client_entry_id: None,
            role: Role::User,
            content: (*t).to_owned(),
            occurred_at: None,
            name: None,
            metadata: Default::default(),
        })
        .collect()
}

pub(super) fn session(name: &str) -> SessionName {
    SessionName::parse(name).expect("valid name")
}

fn summary(text: &str) -> Summary {
    Summary {
        text: text.to_owned(),
        provider: "test".to_owned(),
        model: "m".to_owned(),
        prompt_version: "v".to_owned(),
        input_tokens: 1,
        output_tokens: 1,
        created_at: Millis::now(),
    }
}

fn failure(class: FailureClass) -> Failure {
    Failure {
        class,
        retry_after: None,
        causes: vec!["cause".to_owned()],
        attempts: 1,
        elapsed: Duration::ZERO,
        http_status: None,
        provider: "p".to_owned(),
        model: "m".to_owned(),
        hint: String::new(),
    }
}

/// One closed (PENDING) segment of `texts` in session "s".
async fn closed_segment(store: &Store, texts: &[&str]) -> SegmentId {
    let t = Tenant::default();
    store
        .append(&t, &session("s"), entries(texts), POLICY, 0)
        .await
        .expect("append");
    store
        .close_open_segment(&t, &session("s"))
        .await
        .expect("close")
        .expect("was open")
}

const LEASE: Duration = Duration::from_secs(60);

/// Claims the PENDING segment `id` and writes `text` as its summary.
async fn summarise(store: &Store, id: SegmentId, text: &str) {
    let (claim, _) = store
        .claim(id, "w", LEASE)
        .await
        .expect("claim")
        .expect("free");
    assert!(
        store
            .complete(&claim, summary(text), 1, 0)
            .await
            .expect("complete")
            .held
    );
}

#[tokio::test]
async fn claims_are_exclusive_and_fenced() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let id = closed_segment(&store, &["a", "b"]).await;
        let (first, input) = store
            .claim(id, "one", LEASE)
            .await
            .expect("claim")
            .expect("free");
        assert!(
            matches!(input.material, Material::Entries { ref entries, .. } if entries.len() == 2)
        );
        assert!(
            store
                .claim(id, "two", LEASE)
                .await
                .expect("claim")
                .is_none(),
            "held"
        );
        let stale = Claim {
            token: first.token - 1,
            ..first.clone()
        };
        assert!(
            !store
                .complete(&stale, summary("r"), 1, 0)
                .await
                .expect("complete")
                .held
        );
        assert!(
            store
                .complete(&first, summary("r"), 2, 0)
                .await
                .expect("complete")
                .held
        );
        // Done once: the same claim cannot write twice.
        assert!(
            !store
                .complete(&first, summary("r"), 1, 0)
                .await
                .expect("complete")
                .held
        );
        let seg = store.segment(&t, id).await.expect("segment");
        assert_eq!(seg.state, SegmentState::Summarised);
        assert_eq!((seg.attempts, seg.passes), (2, 1));
    }
}

#[tokio::test]
async fn an_expired_claim_can_be_taken_over() {
    for (_db, store) in stores().await {
        let id = closed_segment(&store, &["a"]).await;
        let crashed = store
            .claim(id, "crashed", Duration::ZERO)
            .await
            .expect("claim")
            .expect("free")
            .0;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let next = store
            .claim(id, "next", LEASE)
            .await
            .expect("claim")
            .expect("the lease ran out")
            .0;
        assert!(next.token > crashed.token);
        assert!(!store.renew(&crashed, LEASE).await.expect("renew"));
        assert!(store.renew(&next, LEASE).await.expect("renew"));
    }
}

#[tokio::test]
async fn each_disposition_leaves_its_state() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let ended = |disposition, failure| EndedPass {
            disposition,
            attempts: 2,
            failure,
            provider_fingerprint: "f".to_owned(),
        };

        let id = closed_segment(&store, &["a"]).await;
        let (claim, _) = store
            .claim(id, "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let at = Millis::now().saturating_add(Duration::from_secs(600));
        let retry = ended(
            Disposition::Retry { at },
            Some(failure(FailureClass::Unavailable)),
        );
        assert!(store.end_pass(&claim, retry).await.expect("end"));
        let seg = store.segment(&t, id).await.expect("segment");
        assert_eq!(seg.state, SegmentState::Pending);
        assert_eq!(seg.next_attempt_at, Some(at));
        assert_eq!((seg.attempts, seg.passes), (2, 1));
        assert_eq!(seg.last_failure, Some(failure(FailureClass::Unavailable)));
        // Not due yet, so nobody scans it up.
        assert!(
            !store
                .due_segments(Millis::now(), 10)
                .await
                .expect("due")
                .contains(&id)
        );

        // A released pass gives its sends back, keeps the later due time,
        // and records nothing.
        store
            .requeue(
                &t,
                SegmentFilter {
                    ids: vec![id],
                    ..Default::default()
                },
            )
            .await
            .expect("requeue");
        let (claim, _) = store
            .claim(id, "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let before = store.segment(&t, id).await.expect("segment");
        assert!(
            store
                .end_pass(&claim, ended(Disposition::Release, None))
                .await
                .expect("end")
        );
        let seg = store.segment(&t, id).await.expect("segment");
        assert_eq!(seg.state, SegmentState::Pending);
        assert_eq!((seg.attempts, seg.passes), (4, 1));
        assert_eq!(seg.last_failure, before.last_failure);
        assert!(seg.next_attempt_at >= before.next_attempt_at);
        assert!(
            store
                .due_segments(Millis::now(), 10)
                .await
                .expect("due")
                .contains(&id)
        );

        let (claim, _) = store
            .claim(id, "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let park = ended(Disposition::Park, Some(failure(FailureClass::Unauthorized)));
        assert!(store.end_pass(&claim, park.clone()).await.expect("end"));
        let seg = store.segment(&t, id).await.expect("segment");
        assert_eq!(seg.state, SegmentState::Parked);
        assert_eq!(seg.passes, 2);
        assert!(
            !store
                .due_segments(Millis::now(), 10)
                .await
                .expect("due")
                .contains(&id)
        );
        // The claim is gone with the pass: it cannot write again.
        assert!(!store.end_pass(&claim, park).await.expect("end"));
        assert_eq!(store.unpark_changed("f").await.expect("unpark"), 0);
        assert_eq!(store.unpark_changed("g").await.expect("unpark"), 1);
        assert!(
            store
                .due_segments(Millis::now(), 10)
                .await
                .expect("due")
                .contains(&id)
        );
    }
}

#[tokio::test]
async fn backlog_counts_follow_every_state_change() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        let small = SegmentPolicy {
            max_entries: 1,
            max_tokens: 1_000_000,
            max_gap: None,
        };
        store
            .append(&t, &session("s"), entries(&["a", "b", "c", "d"]), small, 0)
            .await
            .expect("append");
        store
            .append(&other, &session("s"), entries(&["x", "y"]), POLICY, 0)
            .await
            .expect("append");
        let due = store.due_segments(Millis::now(), 10).await.expect("due");
        let (first, _) = store
            .claim(due[0], "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        assert!(
            store
                .complete(&first, summary("r"), 1, 0)
                .await
                .expect("complete")
                .held
        );
        let (second, _) = store
            .claim(due[1], "w", LEASE)
            .await
            .expect("claim")
            .expect("free");
        let parked = EndedPass {
            disposition: Disposition::Park,
            attempts: 1,
            failure: Some(failure(FailureClass::Unauthorized)),
            provider_fingerprint: "f".to_owned(),
        };
        assert!(store.end_pass(&second, parked).await.expect("fail"));
        let b = store.backlog(Some(&t)).await.expect("backlog");
        assert_eq!((b.open, b.pending, b.summarised, b.parked), (0, 2, 1, 1));
        assert_eq!(b.parked_by_class, vec![("unauthorized".to_owned(), 1)]);
        assert!(b.oldest_pending_age.is_some());
        let o = store.backlog(Some(&other)).await.expect("backlog");
        assert_eq!((o.open, o.pending, o.summarised, o.parked), (1, 0, 0, 0));
        let all = store.backlog(None).await.expect("backlog");
        assert_eq!(
            (all.open, all.pending, all.summarised, all.parked),
            (1, 2, 1, 1)
        );

        store.unpark(vec![due[1]]).await.expect("unpark");
        let b = store.backlog(Some(&t)).await.expect("backlog");
        assert_eq!((b.pending, b.parked), (3, 0));
    }
}

#[tokio::test]
async fn context_keeps_the_newest_that_fits() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let s = session("s");
        let id = closed_segment(&store, &["old one", "old two"]).await;
        summarise(&store, id, "recap").await;
        store
            .append(&t, &s, entries(&["new one", "new two"]), POLICY, 0)
            .await
            .expect("append");

        // No limit: every entry raw, the summarised ones too.
        let all = store
            .context(&t, &s, Budget::bytes(usize::MAX))
            .await
            .expect("context");
        assert!(!all.truncated);
        let texts = |ctx: &Context| -> Vec<String> {
            ctx.items
                .iter()
                .map(|i| match i {
                    ContextItem::Entry(e) => e.content.clone(),
                    ContextItem::Summary { summary, .. } => format!("summary {}", summary.text),
                    ContextItem::Recalled(r) => format!("recalled {}", r.text),
                })
                .collect()
        };
        assert_eq!(texts(&all), ["old one", "old two", "new one", "new two"]);
        assert_eq!(
            all.tokens,
            all.items.iter().map(ContextItem::tokens).sum::<u32>()
        );

        // Room for the recap and the two newest raw: that, the window
        // holding exactly the two.
        let window = all.items[2].tokens() + all.items[3].tokens();
        let recap = crate::model::estimate_tokens("recap");
        let budget = Budget {
            max_tokens: window + recap,
            max_bytes: usize::MAX,
            recent_tokens: window,
        };
        let two = store.context(&t, &s, budget).await.expect("context");
        assert!(!two.truncated);
        assert_eq!(texts(&two), ["summary recap", "new one", "new two"]);
        assert!(
            matches!(two.items[0], ContextItem::Summary { segment_id, .. } if segment_id == id)
        );

        // A budget for one entry keeps the newest one only.
        let newest = all.items[3].tokens();
        let one = store
            .context(
                &t,
                &s,
                Budget {
                    max_tokens: newest,
                    ..budget
                },
            )
            .await
            .expect("context");
        assert!(one.truncated);
        assert_eq!(one.items, all.items[3..]);
        // One token less returns nothing, and says what would.
        assert!(matches!(
            store
                .context(&t, &s, Budget { max_tokens: newest - 1, ..budget })
                .await,
            Err(StoreError::BudgetTooSmall { needed }) if needed == newest
        ));

        // So does a byte budget for one entry (its text and 128 bytes of
        // framing), whatever the token budget.
        let one = store
            .context(&t, &s, Budget::bytes("new two".len() + 128))
            .await
            .expect("context");
        assert!(one.truncated);
        assert_eq!(one.items, all.items[3..]);

        assert!(matches!(
            store
                .context(&t, &session("nosuch"), Budget::bytes(usize::MAX))
                .await,
            Err(StoreError::SessionNotFound(_))
        ));
    }
}

#[tokio::test]
async fn listings_and_flushes_read_only_what_an_answer_carries() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let s = session("s");
        // Four summarised segments with 10 KiB summaries, then one PENDING.
        let mut ids = Vec::new();
        for i in 0..5 {
            let id = closed_segment(&store, &[&format!("entry {i}")]).await;
            if i < 4 {
                summarise(&store, id, &"y".repeat(10 * 1024)).await;
            }
            ids.push(id);
        }
        let one = segment_bytes(&store.segment(&t, ids[0]).await.expect("segment"));
        let filter = || SegmentFilter {
            session: Some(s.clone()),
            ..SegmentFilter::default()
        };
        // Room for two: the page stops there and says it was cut.
        let (page, cut) = store
            .list_segments(&t, filter(), 0, 100, 2 * one)
            .await
            .expect("list");
        assert!(cut);
        assert_eq!(page.iter().map(|s| s.id).collect::<Vec<_>>(), ids[..2]);
        // Room for none still gives one, and all fit when there is room.
        let (page, cut) = store
            .list_segments(&t, filter(), 0, 100, 1)
            .await
            .expect("list");
        assert!(cut);
        assert_eq!(page.len(), 1);
        let (page, cut) = store
            .list_segments(&t, filter(), 0, 100, usize::MAX)
            .await
            .expect("list");
        assert!(!cut);
        assert_eq!(page.len(), 5);

        // A flush with room for two keeps the PENDING one and the newest
        // summarised one, in ordinal order.
        let (kept, complete) = store.flushed(&t, &s, 2 * one).await.expect("flushed");
        assert!(!complete);
        assert_eq!(
            kept.iter().map(|s| s.id).collect::<Vec<_>>(),
            [ids[3], ids[4]]
        );
        let pending = store.pending_in_session(&t, &s).await.expect("pending");
        assert_eq!(pending.iter().map(|p| p.0).collect::<Vec<_>>(), [ids[4]]);
        assert!(matches!(
            store.flushed(&t, &session("nosuch"), usize::MAX).await,
            Err(StoreError::SessionNotFound(_))
        ));
    }
}

#[tokio::test]
async fn entries_read_back_in_pages_summarised_or_not_for_their_tenant_only() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let s = session("s");
        // Seqs 1-3 in a summarised segment, 4-5 in the open one; seq 2 with
        // an idempotency key and another role.
        let id = closed_segment(&store, &["one", "two", "three"]).await;
        summarise(&store, id, "recap").await;
        store
            .append(&t, &s, entries(&["four", "five"]), POLICY, 0)
            .await
            .expect("append");
        let keyed = NewEntry {
            client_entry_id: Some("k6".to_owned()),
            role: Role::Assistant,
            content: "six".to_owned(),
            occurred_at: None,
            name: None,
            metadata: Default::default(),
        };
        store
            .append(&t, &s, vec![keyed], POLICY, 0)
            .await
            .expect("append");
        let page = |after: u64, limit: u32, max_bytes: usize| {
            let (store, t, s) = (store.clone(), t.clone(), s.clone());
            async move {
                let (entries, cut) = store
                    .entries(&t, &s, after, limit, max_bytes)
                    .await
                    .expect("entries");
                let texts: Vec<String> = entries.iter().map(|e| e.content.clone()).collect();
                let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
                (seqs, texts, cut, entries)
            }
        };

        let (seqs, texts, cut, _) = page(0, 2, usize::MAX).await;
        assert_eq!(
            (seqs, texts, cut),
            (vec![1, 2], vec!["one".into(), "two".into()], false)
        );
        // From the middle, across the summarised segment into the open one.
        let (seqs, texts, cut, all) = page(2, 100, usize::MAX).await;
        assert_eq!(seqs, [3, 4, 5, 6]);
        assert_eq!(texts, ["three", "four", "five", "six"]);
        assert!(!cut);
        let six = &all[3];
        assert_eq!(six.client_entry_id.as_deref(), Some("k6"));
        assert_eq!(six.role, Role::Assistant);
        assert_eq!(all[0].role, Role::User);
        // Past the end, however far: nothing, and no error.
        for after in [6, 7, i64::MAX as u64, u64::MAX] {
            let (seqs, _, cut, _) = page(after, 100, usize::MAX).await;
            assert!(seqs.is_empty() && !cut, "after {after}: {seqs:?}");
        }
        // The bytes bound: room for two, then for none (the first is always
        // given), each saying it was cut.
        let two = entry_bytes(&all[0]) + entry_bytes(&all[1]);
        let (seqs, _, cut, _) = page(2, 100, two).await;
        assert_eq!((seqs, cut), (vec![3, 4], true));
        let (seqs, _, cut, _) = page(0, 100, 1).await;
        assert_eq!((seqs, cut), (vec![1], true));

        // Another tenant's session of that name, a missing one, an erased
        // one: not found.
        let other = Tenant("other".to_owned());
        for (tenant, name) in [(&other, "s"), (&t, "nosuch")] {
            assert!(matches!(
                store
                    .entries(tenant, &session(name), 0, 10, usize::MAX)
                    .await,
                Err(StoreError::SessionNotFound(_))
            ));
        }
        store.delete_session(&t, &s).await.expect("erase");
        assert!(matches!(
            store.entries(&t, &s, 0, 10, usize::MAX).await,
            Err(StoreError::SessionNotFound(_))
        ));
    }
}

/// An entry said at `at` (ms) by `name`, with one metadata pair.
fn said(text: &str, at: i64, name: &str) -> NewEntry {
    let mut e = NewEntry::new(Role::User, text);
    e.occurred_at = Some(Millis(at));
    e.name = Some(name.to_owned());
    e.metadata
        .insert("source".to_owned(), format!("import-{at}"));
    e
}

#[tokio::test]
async fn entries_keep_when_and_who_and_their_order_is_the_conversations() {
    const DAY: i64 = 24 * 3600 * 1000;
    let monday = 1_700_000_000_000;
    let gap_policy = SegmentPolicy {
        max_gap: Some(Duration::from_secs(3600)),
        ..POLICY
    };
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let s = session("s");
        // Two days of a conversation in one call: the second day starts a
        // segment of its own (the gap), the first day's closes.
        let call = vec![
            said("the spare key is under the flowerpot", monday, "Tom"),
            said("noted", monday + 60_000, "Maya"),
            said("I moved the key to Mrs Lindqvist", monday + DAY, "Tom"),
        ];
        let out = store
            .append(&t, &s, call, gap_policy, 0)
            .await
            .expect("append");
        assert_eq!(out.closed_segment_ids.len(), 1, "{out:?}");
        let (all, _) = store
            .entries(&t, &s, 0, 10, usize::MAX)
            .await
            .expect("entries");
        let when: Vec<i64> = all.iter().map(|e| e.occurred_at.0).collect();
        assert_eq!(when, [monday, monday + 60_000, monday + DAY]);
        let who: Vec<&str> = all.iter().filter_map(|e| e.name.as_deref()).collect();
        assert_eq!(who, ["Tom", "Maya", "Tom"]);
        assert_eq!(
            all[2].metadata.get("source").map(String::as_str),
            Some(format!("import-{}", monday + DAY).as_str())
        );
        let filter = SegmentFilter {
            session: Some(s.clone()),
            levels: vec![1],
            ..Default::default()
        };
        let (segs, _) = store
            .list_segments(&t, filter, 0, 10, usize::MAX)
            .await
            .expect("segments");
        let ranges: Vec<(u64, u64)> = segs.iter().map(|g| (g.first_seq, g.last_seq)).collect();
        assert_eq!(ranges, [(1, 2), (3, 3)]);

        // Before the newest, within the call or against the session: the
        // whole call is refused, nothing of it stored.
        for (call, index) in [
            (vec![said("earlier", monday + DAY - 1, "Tom")], 0),
            (
                vec![
                    said("later", monday + DAY + 5, "Tom"),
                    said("back again", monday + DAY + 4, "Tom"),
                ],
                1,
            ),
        ] {
            match store.append(&t, &s, call, gap_policy, 0).await {
                Err(StoreError::OccurredOutOfOrder { index: i, newest }) => {
                    assert_eq!(i, index);
                    assert!(newest.0 >= monday + DAY);
                }
                other => panic!("{other:?}"),
            }
        }
        let (after, _) = store
            .entries(&t, &s, 0, 10, usize::MAX)
            .await
            .expect("entries");
        assert_eq!(after.len(), 3, "nothing of a refused call is stored");
        // An entry with no time of its own is said now: after the newest,
        // and with its created_at.
        store
            .append(&t, &s, entries(&["live"]), gap_policy, 0)
            .await
            .expect("append live");
        let (all, _) = store
            .entries(&t, &s, 3, 10, usize::MAX)
            .await
            .expect("entries");
        assert_eq!(all[0].occurred_at, all[0].created_at);
        assert!(all[0].name.is_none() && all[0].metadata.is_empty());
        // The same time again is in order.
        store
            .append(
                &t,
                &s,
                vec![said("same ms", all[0].occurred_at.0, "Tom")],
                POLICY,
                0,
            )
            .await
            .expect("equal times keep their order");
    }
}

#[tokio::test]
async fn idle_open_segments_close_and_busy_ones_do_not() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        for name in ["idle", "busy"] {
            store
                .append(&t, &session(name), entries(&["x"]), POLICY, 0)
                .await
                .expect("append");
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let cutoff = Millis::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        store
            .append(&t, &session("busy"), entries(&["y"]), POLICY, 0)
            .await
            .expect("append");
        let closed = store
            .close_idle_segments(cutoff, 100)
            .await
            .expect("close idle");
        assert_eq!(closed.len(), 1);
        let idle = store
            .flushed(&t, &session("idle"), usize::MAX)
            .await
            .expect("segments")
            .0;
        assert_eq!(idle[0].state, SegmentState::Pending);
        assert!(idle[0].next_attempt_at.is_some(), "due at once");
        let busy = store
            .flushed(&t, &session("busy"), usize::MAX)
            .await
            .expect("segments")
            .0;
        assert_eq!(busy[0].state, SegmentState::Open);
        // Nothing is left to close, and the idle session's next append
        // opens a new segment.
        assert!(
            store
                .close_idle_segments(cutoff, 100)
                .await
                .expect("again")
                .is_empty()
        );
        let next = store
            .append(&t, &session("idle"), entries(&["z"]), POLICY, 0)
            .await
            .expect("append");
        assert_ne!(next.open_segment_id, Some(idle[0].id));
    }
}

#[tokio::test]
async fn sessions_list_by_name_for_their_tenant_only() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        for name in ["b", "a", "c"] {
            store
                .append(&t, &session(name), entries(&["x", "y"]), POLICY, 0)
                .await
                .expect("append");
        }
        store
            .append(&other, &session("a"), entries(&["z"]), POLICY, 0)
            .await
            .expect("append");
        let all = store.list_sessions(&t, None, 10).await.expect("list");
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!((all[0].entry_count, all[0].last_seq), (2, 2));
        assert!(all[0].open_segment_id.is_some());
        assert!(all[0].last_append_at >= all[0].created_at);
        let page = store
            .list_sessions(&t, Some(session("a")), 1)
            .await
            .expect("page");
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].name, "b");
        let theirs = store.list_sessions(&other, None, 10).await.expect("list");
        assert_eq!(theirs.len(), 1);
        assert_eq!(theirs[0].entry_count, 1);
    }
}

#[tokio::test]
async fn a_reused_client_entry_id_with_other_content_stores_nothing() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let keyed = |id: &str, text: &str| NewEntry {
            client_entry_id: Some(id.to_owned()),
            role: Role::User,
            content: text.to_owned(),
            occurred_at: None,
            name: None,
            metadata: Default::default(),
        };
        store
            .append(&t, &session("s"), vec![keyed("k", "first")], POLICY, 0)
            .await
            .expect("append");
        let refused = store
            .append(
                &t,
                &session("s"),
                vec![keyed("new", "would be 2"), keyed("k", "other")],
                POLICY,
                0,
            )
            .await;
        assert!(
            matches!(
                refused,
                Err(StoreError::ClientEntryIdReused { index: 1, seq: 1, ref client_entry_id, .. })
                    if client_entry_id == "k"
            ),
            "{refused:?}"
        );
        let again = store
            .append(&t, &session("s"), vec![keyed("new", "now 2")], POLICY, 0)
            .await
            .expect("append");
        assert_eq!(again.entries[0].seq, 2, "the refused call stored nothing");
    }
}

#[tokio::test]
async fn provider_records_are_kept_per_role() {
    for (_db, store) in stores().await {
        assert!(
            store
                .provider_identity("serve")
                .await
                .expect("read")
                .is_none()
        );
        let served = ProviderIdentity {
            kind: "openai".to_owned(),
            base_url: "http://127.0.0.1:11434/v1".to_owned(),
            model: "llama3.2".to_owned(),
        };
        store
            .record_provider_identity("serve", &served)
            .await
            .expect("record");
        let changed = ProviderIdentity {
            model: "llama3.3".to_owned(),
            ..served.clone()
        };
        store
            .record_provider_identity("backfill", &changed)
            .await
            .expect("record");
        assert_eq!(
            store.provider_identity("serve").await.expect("read"),
            Some(served)
        );
        assert_eq!(
            store.provider_identity("backfill").await.expect("read"),
            Some(changed)
        );
    }
}

#[tokio::test]
async fn an_existing_or_read_only_open_never_creates_a_database() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope");
    for mode in [OpenMode::Existing, OpenMode::ReadOnly] {
        let opened = Store::open_as(&missing, Durability::Process, mode).await;
        assert!(
            matches!(opened, Err(StoreError::NoDatabase { .. })),
            "{mode:?}"
        );
        assert!(!missing.exists(), "{mode:?} created the directory");
    }
    let store = Store::open(dir.path()).await.expect("create");
    store
        .append(
            &Tenant::default(),
            &session("s"),
            entries(&["x"]),
            POLICY,
            0,
        )
        .await
        .expect("append");
    let read_only = Store::open_as(dir.path(), Durability::Process, OpenMode::ReadOnly)
        .await
        .expect("read-only");
    assert_eq!(
        read_only
            .flushed(&Tenant::default(), &session("s"), usize::MAX)
            .await
            .expect("read")
            .0
            .len(),
        1
    );
    assert!(matches!(
        read_only
            .append(
                &Tenant::default(),
                &session("s"),
                entries(&["y"]),
                POLICY,
                0
            )
            .await,
        Err(StoreError::ReadOnly)
    ));
}

#[tokio::test]
async fn erasure_removes_everything_of_one_session_and_expiry_takes_the_old() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let id = closed_segment(&store, &["a", "b"]).await;
        summarise(&store, id, "r").await;
        store
            .append(&t, &session("s"), entries(&["c"]), POLICY, 0)
            .await
            .expect("append");
        let erased = store
            .delete_session(&t, &session("s"))
            .await
            .expect("erase");
        assert_eq!(
            erased,
            Erased {
                entries: 3,
                segments: 2
            }
        );
        assert!(!store.has_session(&t, &session("s")).await.expect("has"));
        let b = store.backlog(Some(&t)).await.expect("backlog");
        assert_eq!((b.open, b.pending, b.summarised, b.parked), (0, 0, 0, 0));
        assert!(matches!(
            store.delete_session(&t, &session("s")).await,
            Err(StoreError::SessionNotFound(_))
        ));

        store
            .append(&t, &session("old"), entries(&["x"]), POLICY, 0)
            .await
            .expect("append");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let cutoff = Millis::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        store
            .append(&t, &session("young"), entries(&["y"]), POLICY, 0)
            .await
            .expect("append");
        let expired = store.expire_sessions(cutoff, 10).await.expect("expire");
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].0.session, "old");
        assert!(store.has_session(&t, &session("young")).await.expect("has"));
        assert!(
            store
                .expire_sessions(cutoff, 10)
                .await
                .expect("expire")
                .is_empty()
        );
    }
}

#[tokio::test]
async fn a_tenant_cap_refuses_the_call_that_would_pass_it_and_erasure_gives_room_back() {
    for (_db, store) in stores().await {
        let t = Tenant("capped".to_owned());
        // The session's name and two entries of ten bytes, each with the
        // 64 bytes counted for its row: exactly the cap.
        let cap = 1 + 64 + 2 * (10 + 64);
        let ten = ["0123456789", "abcdefghij"];
        store
            .append(&t, &session("s"), entries(&ten), POLICY, cap)
            .await
            .expect("fits exactly");
        for name in ["s", "t"] {
            let refused = store
                .append(&t, &session(name), entries(&["x"]), POLICY, cap)
                .await;
            assert!(
                matches!(refused, Err(StoreError::TenantFull { limit, .. }) if limit == cap),
                "{refused:?}"
            );
        }
        assert!(!store.has_session(&t, &session("t")).await.expect("has"));
        // Another tenant has room of its own.
        store
            .append(
                &Tenant::default(),
                &session("s"),
                entries(&ten),
                POLICY,
                cap,
            )
            .await
            .expect("another tenant");
        store
            .delete_session(&t, &session("s"))
            .await
            .expect("erase");
        // A call past the cap stores nothing of itself, not even its session.
        let three = ["0123456789", "abcdefghij", "klmnopqrst"];
        assert!(matches!(
            store
                .append(&t, &session("u"), entries(&three), POLICY, cap)
                .await,
            Err(StoreError::TenantFull { .. })
        ));
        assert!(!store.has_session(&t, &session("u")).await.expect("has"));
        let again = store
            .append(&t, &session("s"), entries(&ten), POLICY, cap)
            .await
            .expect("room again after the erasure");
        assert_eq!(again.entries[0].seq, 1);
    }
}

#[tokio::test]
async fn a_retry_of_what_is_stored_answers_at_the_cap() {
    // A client whose answer was lost sends the same entries again: at the
    // cap, that must still say "already stored", not refuse them.
    for (_db, store) in stores().await {
        let t = Tenant("capped".to_owned());
        let mut sent = entries(&["0123456789"]);
        sent[0].client_entry_id = Some("k1".to_owned());
        // The session's name and one entry of ten bytes and a two-byte id,
        // each with the 64 bytes counted for its row: exactly the cap.
        let cap = 1 + 64 + (10 + 2 + 64);
        let first = store
            .append(&t, &session("s"), sent.clone(), POLICY, cap)
            .await
            .expect("fits exactly");
        let again = store
            .append(&t, &session("s"), sent.clone(), POLICY, cap)
            .await
            .expect("a retry at the cap");
        assert_eq!(again.entries[0].seq, first.entries[0].seq);
        assert!(again.entries[0].duplicate);
        // A retry that also carries something new is refused whole.
        sent.extend(entries(&["x"]));
        assert!(matches!(
            store.append(&t, &session("s"), sent, POLICY, cap).await,
            Err(StoreError::TenantFull { .. })
        ));
    }
}

fn subject(name: &str) -> Subject {
    Subject::parse(name).expect("valid subject")
}

#[tokio::test]
async fn a_session_keeps_the_subject_it_was_created_with_and_a_mismatch_stores_nothing() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let (ada, bob) = (subject("user:ada@example.com"), subject("bob"));
        store
            .append_as(&t, &session("s"), Some(&ada), entries(&["one"]), POLICY, 0)
            .await
            .expect("append");
        // Once from what the writer keeps of the session, once (after a
        // write that is not an append) from its row.
        for round in 0..2 {
            let refused = store
                .append_as(&t, &session("s"), Some(&bob), entries(&["no"]), POLICY, 0)
                .await;
            assert!(
                matches!(
                    refused,
                    Err(StoreError::SubjectMismatch { ref session, subject: Some(ref s), ref requested })
                        if session == "s" && s == ada.as_str() && requested == "bob"
                ),
                "round {round}: {refused:?}"
            );
            store
                .close_open_segment(&t, &session("s"))
                .await
                .expect("close");
        }
        // No subject, or the same one, is taken.
        let next = store
            .append(&t, &session("s"), entries(&["two"]), POLICY, 0)
            .await
            .expect("append");
        assert_eq!(next.entries[0].seq, 2, "the refused calls stored nothing");
        store
            .append_as(
                &t,
                &session("s"),
                Some(&ada),
                entries(&["three"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        let page = store
            .entries(&t, &session("s"), 0, 10, usize::MAX)
            .await
            .expect("read");
        let texts: Vec<&str> = page.0.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(texts, ["one", "two", "three"]);

        // A session created without a subject takes none later.
        store
            .append(&t, &session("plain"), entries(&["x"]), POLICY, 0)
            .await
            .expect("append");
        let refused = store
            .append_as(
                &t,
                &session("plain"),
                Some(&ada),
                entries(&["y"]),
                POLICY,
                0,
            )
            .await;
        assert!(
            matches!(
                refused,
                Err(StoreError::SubjectMismatch { subject: None, .. })
            ),
            "{refused:?}"
        );
        let listed = store.list_sessions(&t, None, 10).await.expect("list");
        let subjects: Vec<(&str, Option<&str>, u64)> = listed
            .iter()
            .map(|s| (s.name.as_str(), s.subject.as_deref(), s.entry_count))
            .collect();
        assert_eq!(subjects, [("plain", None, 1), ("s", Some(ada.as_str()), 3)]);

        // Two calls creating one session at once, in one batch or not:
        // whichever creates it fixes its subject and the other is refused.
        let race = session("race");
        let (a, b) = tokio::join!(
            store.append_as(&t, &race, Some(&ada), entries(&["a"]), POLICY, 0),
            store.append_as(&t, &race, Some(&bob), entries(&["b"]), POLICY, 0),
        );
        let won = match (&a, &b) {
            (Ok(_), Err(StoreError::SubjectMismatch { .. })) => &ada,
            (Err(StoreError::SubjectMismatch { .. }), Ok(_)) => &bob,
            other => panic!("one wins, one is refused: {other:?}"),
        };
        let listed = store
            .list_subject_sessions(&t, Some(won), None, 10)
            .await
            .expect("list");
        let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"race"), "{names:?}");
        let page = store
            .entries(&t, &session("race"), 0, 10, usize::MAX)
            .await
            .expect("read");
        assert_eq!(page.0.len(), 1);
    }
}

#[tokio::test]
async fn sessions_list_by_subject_and_a_subject_is_erased_whole_in_its_tenant_only() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        let (ada, bob) = (subject("ada"), subject("bob"));
        for (name, of, texts) in [
            ("a", Some(&ada), &["1", "2"][..]),
            ("b", Some(&bob), &["3"][..]),
            ("c", Some(&ada), &["4", "5", "6"][..]),
            ("d", None, &["7"][..]),
        ] {
            store
                .append_as(&t, &session(name), of, entries(texts), POLICY, 0)
                .await
                .expect("append");
        }
        store
            .append_as(
                &other,
                &session("a"),
                Some(&ada),
                entries(&["theirs"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        // One of ada's segments closed and summarised: it goes too.
        let closed = store
            .close_open_segment(&t, &session("c"))
            .await
            .expect("close")
            .expect("open segment");
        summarise(&store, closed, "ada's recap").await;

        let names =
            |list: Vec<SessionInfo>| -> Vec<String> { list.into_iter().map(|s| s.name).collect() };
        let of_ada = store
            .list_subject_sessions(&t, Some(&ada), None, 10)
            .await
            .expect("list");
        assert!(of_ada.iter().all(|s| s.subject.as_deref() == Some("ada")));
        assert_eq!(names(of_ada), ["a", "c"]);
        let page = store
            .list_subject_sessions(&t, Some(&ada), Some(session("a")), 1)
            .await
            .expect("page");
        assert_eq!(names(page), ["c"]);
        let nobody = store
            .list_subject_sessions(&t, Some(&subject("nobody")), None, 10)
            .await
            .expect("list");
        assert!(nobody.is_empty());

        let erased = store.delete_subject(&t, &ada).await.expect("erase");
        assert_eq!(
            erased,
            [
                (
                    "a".to_owned(),
                    Erased {
                        entries: 2,
                        segments: 1
                    }
                ),
                (
                    "c".to_owned(),
                    Erased {
                        entries: 3,
                        segments: 1
                    }
                ),
            ]
        );
        for gone in ["a", "c"] {
            assert!(!store.has_session(&t, &session(gone)).await.expect("has"));
        }
        let left = store.list_sessions(&t, None, 10).await.expect("list");
        assert_eq!(names(left), ["b", "d"]);
        assert!(store.has_session(&other, &session("a")).await.expect("has"));
        let theirs = store
            .entries(&other, &session("a"), 0, 10, usize::MAX)
            .await
            .expect("read");
        assert_eq!(theirs.0[0].content, "theirs");
        let b = store.backlog(Some(&t)).await.expect("backlog");
        assert_eq!(
            (b.summarised, b.open),
            (0, 2),
            "only b's and d's segments are left"
        );
        assert!(
            store
                .delete_subject(&t, &ada)
                .await
                .expect("again")
                .is_empty()
        );
        // A new session of the subject starts afresh.
        let again = store
            .append_as(&t, &session("a"), Some(&ada), entries(&["new"]), POLICY, 0)
            .await
            .expect("append");
        assert_eq!(again.entries[0].seq, 1);
    }
}

/// A search's budget in these tests: far above what any of them takes,
/// so that only a search that cannot end would reach it.
pub(super) const SEARCH_BUDGET: Duration = Duration::from_secs(60);

/// The texts of a search's hits, best first.
pub(super) async fn found(store: &Store, t: &Tenant, scope: &SearchScope, q: &str) -> Vec<String> {
    let query = crate::search::query::Query::parse(q).expect("query");
    store
        .search(t, scope, &query, 10, SEARCH_BUDGET)
        .await
        .expect("search")
        .into_iter()
        .map(|h| h.text)
        .collect()
}

#[tokio::test]
async fn a_question_in_one_form_of_a_verb_finds_the_fact_in_another() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let all = SearchScope::default();
        let fact = "I grew up in Bilbao, my parents still live there.";
        let texts = [
            "Are leeks hard to grow from seed?",
            fact,
            "Rent keeps going up.",
            "We went to the market.",
        ];
        store
            .append(&t, &session("f"), entries(&texts), POLICY, 0)
            .await
            .expect("append");
        let hits = found(&store, &t, &all, "Where did I grow up?").await;
        assert_eq!(hits.first().map(String::as_str), Some(fact), "{hits:?}");
        // Every form finds every other, and an exclusion excludes them all.
        assert_eq!(found(&store, &t, &all, "grown").await.len(), 2);
        assert_eq!(
            found(&store, &t, &all, "market -go").await,
            Vec::<String>::new()
        );
        // A phrase is matched as written.
        assert_eq!(
            found(&store, &t, &all, "\"grow up\"").await,
            Vec::<String>::new()
        );
    }
}

/// Appends `fact` to session "f", then `COMMON_DOCS` + 50 texts of
/// `filler` (numbered), so that every word of `filler` is common; returns
/// the filler texts.
async fn append_beside_common(store: &Store, t: &Tenant, fact: &str, filler: &str) -> Vec<String> {
    let filler: Vec<String> = (0..crate::store::search::COMMON_DOCS + 50)
        .map(|i| format!("{filler}, number {i}"))
        .collect();
    let mut texts: Vec<&str> = vec![fact];
    texts.extend(filler.iter().map(String::as_str));
    store
        .append(t, &session("f"), entries(&texts), POLICY, 0)
        .await
        .expect("append");
    filler
}

#[tokio::test]
async fn a_rare_word_whose_other_form_is_common_still_finds_its_own_texts() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let all = SearchScope::default();
        let fact = "The cat has gone missing since Tuesday.";
        append_beside_common(&store, &t, fact, "Let us go for a walk").await;
        // "go" is in thousands of texts: it joins neither "gone" nor
        // "cat gone", which find the fact first as without the forms.
        for q in ["gone", "cat gone", "gone missing"] {
            let hits = found(&store, &t, &all, q).await;
            assert_eq!(
                hits.first().map(String::as_str),
                Some(fact),
                "{q}: {hits:?}"
            );
        }
    }
}

#[tokio::test]
async fn common_words_leave_the_ranking_and_only_common_words_find_the_newest() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let all = SearchScope::default();
        let fact = "My plan: the trip to Kyoto in April";
        let filler = append_beside_common(&store, &t, fact, "I told you my plan for the day").await;
        // "plan" is in every text: the rare word decides, and the fact
        // comes first although thousands of texts share the rest.
        assert_eq!(found(&store, &t, &all, "plan Kyoto").await, vec![fact]);
        let hits = found(&store, &t, &all, "what is my plan in Kyoto").await;
        assert_eq!(hits.first().map(String::as_str), Some(fact), "{hits:?}");
        // Only common words: the newest texts holding them all.
        let hits = found(&store, &t, &all, "my plan for the day").await;
        let newest: Vec<String> = filler.iter().rev().take(10).cloned().collect();
        assert_eq!(hits, newest);
    }
}

/// A search's budget is the store's own bound, on every backend: with
/// none left the search is stopped, with enough the same search answers.
#[tokio::test]
async fn a_search_past_its_budget_is_too_costly_and_within_it_answers() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let all = SearchScope::default();
        // Every text a candidate of the phrase, none a match.
        let texts: Vec<String> = (0..2000)
            .map(|i| format!("{}u{i}", "a b c ".repeat(100)))
            .collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        store
            .append(&t, &session("c"), entries(&texts), POLICY, 0)
            .await
            .expect("append");
        let query = crate::search::query::Query::parse(&format!("\"{}\" zz", "b a ".repeat(32)))
            .expect("query");
        let stopped = store
            .search(&t, &all, &query, 10, Duration::ZERO)
            .await
            .expect_err("no budget left");
        assert!(
            matches!(stopped, StoreError::SearchTooCostly),
            "{stopped:?}"
        );
        let hits = store
            .search(&t, &all, &query, 10, SEARCH_BUDGET)
            .await
            .expect("search within its budget");
        assert!(hits.is_empty(), "{hits:?}");
    }
}

#[tokio::test]
async fn search_finds_planted_facts_in_scope_and_never_erased_or_foreign_text() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        let all = SearchScope::default();
        let fact = "My sister Maren moved to Trondheim last spring";
        let ada = subject("ada");
        store
            .append_as(
                &t,
                &session("a"),
                Some(&ada),
                entries(&["hello there", fact, "the weather is grey"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        store
            .append(
                &t,
                &session("b"),
                entries(&["Trondheim has a cathedral"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        store
            .append(
                &other,
                &session("a"),
                entries(&["Trondheim secret of theirs"]),
                POLICY,
                0,
            )
            .await
            .expect("append");

        // Strict first: the question worded like the fact finds it first,
        // then the relaxed leg adds what shares a rarer word.
        let hits = found(&store, &t, &all, "where did my sister Maren move").await;
        assert_eq!(hits.first().map(String::as_str), Some(fact), "{hits:?}");
        let hits = found(&store, &t, &all, "sister Trondheim").await;
        assert_eq!(
            hits,
            vec![fact.to_owned(), "Trondheim has a cathedral".to_owned()]
        );
        // Phrases, exclusions, alternatives. (Diacritics: SQLite folds
        // them, PostgreSQL's 'simple' keeps them; not part of the contract.)
        assert_eq!(
            found(&store, &t, &all, "\"sister maren\"").await,
            vec![fact]
        );
        assert!(found(&store, &t, &all, "\"maren sister\"").await.is_empty());
        assert_eq!(
            found(&store, &t, &all, "trondheim -cathedral").await,
            vec![fact]
        );
        assert_eq!(
            found(&store, &t, &all, "cathedral or weather").await.len(),
            2
        );
        // Another tenant's text is never found, nor theirs ours.
        let theirs = found(&store, &other, &all, "trondheim").await;
        assert_eq!(theirs, vec!["Trondheim secret of theirs"]);
        assert!(
            !found(&store, &t, &all, "secret")
                .await
                .iter()
                .any(|h| h.contains("theirs"))
        );

        // Filters: sessions, subject, roles, time, levels.
        let only_b = SearchScope {
            sessions: vec![session("b")],
            ..SearchScope::default()
        };
        assert_eq!(found(&store, &t, &only_b, "trondheim").await.len(), 1);
        assert!(found(&store, &other, &only_b, "trondheim").await.is_empty());
        let of_ada = SearchScope {
            subject: Some(ada.clone()),
            ..SearchScope::default()
        };
        assert_eq!(found(&store, &t, &of_ada, "trondheim").await, vec![fact]);
        let assistant = SearchScope {
            roles: vec![Role::Assistant],
            ..SearchScope::default()
        };
        assert!(found(&store, &t, &assistant, "trondheim").await.is_empty());
        let later = SearchScope {
            after: Some(Millis(Millis::now().0 + 60_000)),
            ..SearchScope::default()
        };
        assert!(found(&store, &t, &later, "trondheim").await.is_empty());
        let earlier = SearchScope {
            before: Some(Millis(Millis::now().0 + 60_000)),
            ..SearchScope::default()
        };
        assert_eq!(found(&store, &t, &earlier, "trondheim").await.len(), 2);

        // A recap is found at level 1 (by default), and not at level 0.
        let id = store
            .close_open_segment(&t, &session("b"))
            .await
            .expect("close")
            .expect("open");
        summarise(&store, id, "Recap: a talk about the Nidaros cathedral").await;
        let hits = store
            .search(
                &t,
                &all,
                &crate::search::query::Query::parse("nidaros").expect("query"),
                10,
                SEARCH_BUDGET,
            )
            .await
            .expect("search");
        assert_eq!(hits.len(), 1);
        assert_eq!((hits[0].level, hits[0].segment_id), (1, Some(id)));
        assert_eq!(hits[0].score, 1.0 / 61.0);
        let entries_only = SearchScope {
            levels: vec![0],
            ..SearchScope::default()
        };
        assert!(found(&store, &t, &entries_only, "nidaros").await.is_empty());

        // Erasure: session, subject, expiry; nothing of them is found.
        store
            .delete_session(&t, &session("b"))
            .await
            .expect("erase");
        assert!(
            found(&store, &t, &all, "cathedral or nidaros")
                .await
                .is_empty()
        );
        store.delete_subject(&t, &ada).await.expect("erase");
        assert!(
            found(&store, &t, &all, "trondheim or maren")
                .await
                .is_empty()
        );
        store
            .append(&t, &session("c"), entries(&["quokka sighting"]), POLICY, 0)
            .await
            .expect("append");
        assert_eq!(found(&store, &t, &all, "quokka").await.len(), 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        store
            .expire_sessions(Millis::now(), 10)
            .await
            .expect("expire");
        assert!(found(&store, &t, &all, "quokka").await.is_empty());
        // Expiry is by age, in every tenant.
        assert!(found(&store, &other, &all, "trondheim").await.is_empty());
    }
}

/// Drains the search index's backlog a `batch` at a time; the texts each
/// batch indexed.
async fn drain_index(store: &Store, batch: u32) -> Vec<u64> {
    let mut steps = Vec::new();
    loop {
        let step = store.index_some(batch).await.expect("index");
        steps.push(step.texts);
        if step.done {
            return steps;
        }
        assert!(steps.len() < 1000, "the backlog never ends: {steps:?}");
    }
}

#[tokio::test]
async fn a_language_change_reindexes_in_batches_beside_appends_and_erasure() {
    use crate::config::SearchLanguage;
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let all = SearchScope::default();
        // A fresh database owes nothing, in the default language.
        assert_eq!(store.index_backlog().await.expect("backlog"), 0);
        assert_eq!(drain_index(&store, 10).await, [0]);
        assert!(
            !store
                .set_search_language(SearchLanguage::Simple)
                .await
                .expect("same")
        );
        let old: Vec<String> = (0..25)
            .map(|i| format!("we were deploying build {i}"))
            .collect();
        let old: Vec<&str> = old.iter().map(String::as_str).collect();
        store
            .append(&t, &session("a"), entries(&old), POLICY, 0)
            .await
            .expect("append");
        store
            .append(
                &t,
                &session("gone"),
                entries(&["deploying the doomed branch"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        // No stemming: the word as written only.
        assert!(found(&store, &t, &all, "deployed").await.is_empty());
        assert_eq!(
            found(&store, &t, &all, "deploying build 7").await[0],
            "we were deploying build 7"
        );

        assert!(
            store
                .set_search_language(SearchLanguage::English)
                .await
                .expect("change")
        );
        assert_eq!(store.index_backlog().await.expect("backlog"), 26);
        // Beside the backlog: an append is found at once, in the new
        // language, and an erasure of owed texts leaves nothing behind.
        store
            .append(
                &t,
                &session("a"),
                entries(&["the rollout deployed cleanly"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        assert_eq!(
            found(&store, &t, &all, "deploys").await,
            ["the rollout deployed cleanly"]
        );
        store
            .delete_session(&t, &session("gone"))
            .await
            .expect("erase");
        // The 25 old texts; PostgreSQL also recomputes the new one, which
        // is within the backlog's range (the work is the same either way).
        let owed = store.index_backlog().await.expect("backlog");
        assert!((25..=26).contains(&owed), "{owed}");
        let steps = drain_index(&store, 10).await;
        assert_eq!(steps.iter().sum::<u64>(), owed, "{steps:?}");
        assert!(steps.iter().all(|&n| n <= 10), "{steps:?}");
        assert_eq!(store.index_backlog().await.expect("backlog"), 0);
        // Every old text is found by its stem now, the erased one by none.
        let hits = found(&store, &t, &all, "deployed build 7").await;
        assert_eq!(hits[0], "we were deploying build 7");
        assert_eq!(
            found(&store, &t, &all, "\"deployed build\"").await.len(),
            10
        );
        assert!(found(&store, &t, &all, "doomed").await.is_empty());
        assert!(
            !store
                .set_search_language(SearchLanguage::English)
                .await
                .expect("same")
        );
    }
}

#[tokio::test]
async fn hostile_queries_are_words_on_every_backend() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        store
            .append(
                &t,
                &session("s"),
                entries(&["near the col star"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        for q in [
            "NEAR(near col",
            "col: star*",
            "\"unbalanced near",
            "^near \0 col",
            "'; DROP TABLE entries; -- near",
            "near AND OR NOT col",
            "-near star",
            "{near} [col] (star)",
        ] {
            let query = crate::search::query::Query::parse(q).expect("query");
            store
                .search(&t, &SearchScope::default(), &query, 10, SEARCH_BUDGET)
                .await
                .unwrap_or_else(|e| panic!("{q:?}: {e}"));
        }
        assert!(
            found(&store, &t, &SearchScope::default(), "near AND OR NOT col")
                .await
                .len()
                == 1
        );
    }
}

/// A fresh, empty store on every backend that keeps vectors: SQLite, and
/// PostgreSQL with pgvector when `ARCHIVIST_TEST_PGVECTOR_URL` names one
/// (`postgres::testing`: otherwise that half is skipped with a notice, or
/// fails under `ARCHIVIST_REQUIRE_PG=1`), made ready as a run with
/// embeddings on makes it.
async fn vector_stores() -> Vec<(Box<dyn Any>, Store)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = Store::open(dir.path()).await.expect("open sqlite");
    let mut all: Vec<(Box<dyn Any>, Store)> = vec![(Box::new(dir), sqlite)];
    if let Some(db) = postgres::testing::fresh_vector_database().await {
        let store = Store::open_postgres(&db.url, OpenMode::Create, Durability::Process)
            .await
            .expect("open postgres");
        all.push((Box::new(db), store));
    }
    for (_, store) in &all {
        store.require_vectors().await.expect("vectors can be kept");
        // A run with embeddings on starts its generation before it stores
        // anything, so every text from then on is owed.
        store
            .set_embedding_generation(&crate::model::Generation::new("m", 2))
            .await
            .expect("generation");
    }
    all
}

/// Claims every owed item (a batch per owner) and stores `vector(text)`
/// for each; returns how many were stored.
async fn embed_all(
    store: &Store,
    generation: &crate::model::Generation,
    vector: impl Fn(&str) -> Vec<f32>,
) -> u64 {
    let mut stored = 0;
    while let Some(batch) = store.claim_owed("w", LEASE, 2000).await.expect("claim") {
        let vectors = batch
            .items
            .iter()
            .map(|i| (i.doc, vector(&i.text)))
            .collect();
        stored += store
            .store_vectors(&batch.claim, generation, vectors)
            .await
            .expect("store");
    }
    stored
}

#[tokio::test]
async fn a_batch_holds_one_owners_texts_and_erasure_forgets_the_failures_that_may_quote_them() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let generation = Generation::new("m", 2);
        let (a, b) = (Tenant("a".to_owned()), Tenant("b".to_owned()));
        let (ada, bob) = (subject("ada"), subject("bob"));
        // Interleaved, so that a claim in debt order alone would mix them.
        let owners: [(&Tenant, &str, Option<&Subject>, &str); 6] = [
            (&a, "a1", None, "a secret"),
            (&b, "b1", None, "b text"),
            (&a, "ada1", Some(&ada), "ada's PIN"),
            (&a, "bob1", Some(&bob), "bob text"),
            (&a, "a2", None, "a other"),
            (&a, "ada2", Some(&ada), "ada more"),
        ];
        for (t, name, who, text) in owners {
            store
                .append_as(t, &session(name), who, entries(&[text]), POLICY, 0)
                .await
                .expect("append");
        }
        let mut batches: Vec<Vec<String>> = Vec::new();
        while let Some(batch) = store.claim_owed("w", LEASE, 10).await.expect("claim") {
            let texts: Vec<String> = batch.items.iter().map(|i| i.text.clone()).collect();
            // Each batch fails with a failure quoting its texts, as an
            // embedder echoing its inputs would.
            let mut quoting = failure(FailureClass::InvalidRequest);
            quoting.causes = vec![format!("invalid input: {texts:?}")];
            store
                .end_batch(
                    &batch.claim,
                    embeddings::EndedBatch {
                        disposition: Disposition::Park,
                        attempts: 1,
                        failure: Some(quoting),
                        fingerprint: "f".to_owned(),
                    },
                )
                .await
                .expect("end");
            batches.push(texts);
        }
        batches.sort();
        assert_eq!(
            batches,
            vec![
                vec!["a secret".to_owned(), "a other".to_owned()],
                vec!["ada's PIN".to_owned(), "ada more".to_owned()],
                vec!["b text".to_owned()],
                vec!["bob text".to_owned()],
            ]
        );
        let quoted = |f: Option<Failure>| f.map(|f| f.causes.join(" ")).unwrap_or_default();
        let b_failure = store
            .embedding_backlog(Some(&b), &generation)
            .await
            .expect("backlog")
            .last_failure;
        assert!(quoted(b_failure).contains("b text"));

        // Erasing one session of an owner forgets every failure of that
        // owner's (which may quote it); other owners' stay.
        store
            .delete_session(&a, &session("ada1"))
            .await
            .expect("delete");
        store
            .delete_session(&a, &session("a1"))
            .await
            .expect("delete");
        let backlog = store
            .embedding_backlog(Some(&a), &generation)
            .await
            .expect("backlog");
        // ada2, a2 and bob1 are still parked, by class.
        assert_eq!(backlog.parked, 3);
        assert_eq!(
            backlog.parked_by_class,
            vec![("invalid_request".to_owned(), 3)]
        );
        let left = quoted(backlog.last_failure);
        assert!(left.contains("bob text"), "{left}");
        for erased in ["ada's PIN", "a secret"] {
            assert!(!left.contains(erased), "{left}");
        }
        let b_failure = store
            .embedding_backlog(Some(&b), &generation)
            .await
            .expect("backlog")
            .last_failure;
        assert!(quoted(b_failure).contains("b text"));
    }
}

#[tokio::test]
async fn an_erasure_lets_go_of_its_owners_claims_so_a_batch_in_flight_stores_no_failure() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let generation = Generation::new("m", 2);
        let t = Tenant::default();
        for (name, text) in [("gone", "erased text"), ("kept", "kept text")] {
            store
                .append(&t, &session(name), entries(&[text]), POLICY, 0)
                .await
                .expect("append");
        }
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("a batch");
        assert_eq!(batch.items.len(), 2);
        store
            .delete_session(&t, &session("gone"))
            .await
            .expect("delete");
        let mut quoting = failure(FailureClass::InvalidRequest);
        quoting.causes = vec!["invalid input: erased text".to_owned()];
        let ended = embeddings::EndedBatch {
            disposition: Disposition::Park,
            attempts: 1,
            failure: Some(quoting),
            fingerprint: "f".to_owned(),
        };
        assert_eq!(store.end_batch(&batch.claim, ended).await.expect("end"), 0);
        let backlog = store
            .embedding_backlog(Some(&t), &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.parked), (1, 0));
        assert!(backlog.last_failure.is_none());
        // Its text is claimed again.
        let again = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("due again");
        assert_eq!(again.items.len(), 1);
        assert_eq!(again.items[0].text, "kept text");
    }
}

#[tokio::test]
async fn erasure_takes_vectors_and_debts_with_the_text_and_a_racing_batch_writes_nothing() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let generation = Generation::new("m", 2);
        let append = |name: &'static str, texts: &'static [&'static str]| {
            let store = store.clone();
            let t = t.clone();
            async move {
                store
                    .append(&t, &session(name), entries(texts), POLICY, 0)
                    .await
                    .expect("append");
            }
        };
        append("kept", &["a"]).await;
        append("gone", &["b", "c"]).await;
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (3, 0));
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("a batch");
        assert_eq!(batch.items.len(), 3);
        // A second worker finds nothing while the claim lives.
        assert!(
            store
                .claim_owed("v", LEASE, 10)
                .await
                .expect("claim")
                .is_none()
        );
        // A stale claim (another token) stores nothing.
        let stale = embeddings::BatchClaim {
            owner: batch.claim.owner.clone(),
            token: batch.claim.token.wrapping_add(1),
        };
        let vectors: Vec<(i64, Vec<f32>)> = batch
            .items
            .iter()
            .map(|i| (i.doc, vec![0.6, 0.8]))
            .collect();
        assert_eq!(
            store
                .store_vectors(&stale, &generation, vectors.clone())
                .await
                .expect("store"),
            0
        );
        assert_eq!(
            store
                .store_vectors(&batch.claim, &generation, vectors)
                .await
                .expect("store"),
            3
        );
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (0, 3));
        assert_eq!(
            store
                .generation_dimensions(&generation)
                .await
                .expect("dims"),
            Some(2)
        );

        store
            .delete_session(&t, &session("gone"))
            .await
            .expect("delete");
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.embedded, backlog.pending), (1, 0));

        // A batch claimed before an erasure stores nothing after it.
        append("racing", &["d"]).await;
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("a batch");
        store
            .delete_session(&t, &session("racing"))
            .await
            .expect("delete");
        let late: Vec<(i64, Vec<f32>)> = batch
            .items
            .iter()
            .map(|i| (i.doc, vec![1.0, 0.0]))
            .collect();
        assert_eq!(
            store
                .store_vectors(&batch.claim, &generation, late)
                .await
                .expect("store"),
            0
        );
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.embedded, backlog.pending), (1, 0));

        // Expiry erases as DeleteSession does.
        store
            .expire_sessions(Millis::now(), 10)
            .await
            .expect("expire");
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.embedded, backlog.pending), (0, 0));
    }
}

#[tokio::test]
async fn a_parked_batch_waits_for_another_embedder_configuration() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let generation = Generation::new("m", 2);
        store
            .append(&t, &session("s"), entries(&["a", "b"]), POLICY, 0)
            .await
            .expect("append");
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("a batch");
        let ended = |disposition| embeddings::EndedBatch {
            disposition,
            attempts: 1,
            failure: Some(failure(FailureClass::Unauthorized)),
            fingerprint: "key-1".to_owned(),
        };
        assert_eq!(
            store
                .end_batch(&batch.claim, ended(Disposition::Park))
                .await
                .expect("end"),
            2
        );
        let backlog = store
            .embedding_backlog(Some(&t), &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.parked), (0, 2));
        assert_eq!(
            backlog.parked_by_class,
            vec![("unauthorized".to_owned(), 2)]
        );
        assert_eq!(
            backlog.last_failure.map(|f| f.class),
            Some(FailureClass::Unauthorized)
        );
        // Parked: not claimed again, and the same configuration unparks
        // nothing.
        assert!(
            store
                .claim_owed("w", LEASE, 10)
                .await
                .expect("claim")
                .is_none()
        );
        assert_eq!(store.unpark_owed("key-1").await.expect("unpark"), 0);
        assert_eq!(store.unpark_owed("key-2").await.expect("unpark"), 2);
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("due again");
        assert_eq!(batch.passes, 1);
        // A retry later leaves them owed, not due.
        let later = Millis::now().saturating_add(Duration::from_secs(3600));
        store
            .end_batch(&batch.claim, ended(Disposition::Retry { at: later }))
            .await
            .expect("end");
        assert!(
            store
                .claim_owed("w", LEASE, 10)
                .await
                .expect("claim")
                .is_none()
        );
        let backlog = store
            .embedding_backlog(Some(&t), &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.parked), (2, 0));
    }
}

#[tokio::test]
async fn texts_put_off_by_the_embedder_are_counted_and_a_requeue_or_another_embedder_brings_them_back()
 {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let (t, other) = (Tenant::default(), Tenant("other".to_owned()));
        let generation = Generation::new("m", 2);
        store
            .append(&t, &session("s"), entries(&["a", "b"]), POLICY, 0)
            .await
            .expect("append");
        let month = Millis::now().saturating_add(Duration::from_secs(30 * 86_400));
        let put_off = |class| embeddings::EndedBatch {
            disposition: Disposition::Retry { at: month },
            attempts: 1,
            failure: Some(failure(class)),
            fingerprint: "key-1".to_owned(),
        };
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("a batch");
        store
            .end_batch(&batch.claim, put_off(FailureClass::RateLimited))
            .await
            .expect("end");
        let backlog = store
            .embedding_backlog(Some(&t), &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.deferred), (2, 2));
        assert!(
            store
                .claim_owed("w", LEASE, 10)
                .await
                .expect("claim")
                .is_none()
        );
        // Another tenant's, or another session's, requeue reaches nothing.
        assert_eq!(
            store
                .requeue_owed(&other, None, true)
                .await
                .expect("requeue"),
            0
        );
        assert_eq!(
            store
                .requeue_owed(&t, Some(&session("nope")), true)
                .await
                .expect("requeue"),
            0
        );
        assert_eq!(
            store
                .requeue_owed(&t, Some(&session("s")), false)
                .await
                .expect("requeue"),
            2
        );
        let batch = store
            .claim_owed("w", LEASE, 10)
            .await
            .expect("claim")
            .expect("due again");
        // Put off again (out of quota this time): the same embedder
        // configuration leaves them so, another makes them due.
        store
            .end_batch(&batch.claim, put_off(FailureClass::QuotaExhausted))
            .await
            .expect("end");
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!(backlog.deferred, 2);
        assert_eq!(store.unpark_owed("key-1").await.expect("unpark"), 0);
        assert_eq!(store.unpark_owed("key-2").await.expect("unpark"), 2);
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.deferred), (2, 0));
        assert!(
            store
                .claim_owed("w", LEASE, 10)
                .await
                .expect("claim")
                .is_some()
        );
    }
}

#[tokio::test]
async fn the_semantic_leg_finds_every_hit_within_its_scope_however_many_are_nearer_outside() {
    use crate::model::Generation;
    // Far more texts outside the scope lie nearer the query than the
    // index's candidate list holds (ef_search 40): a filter applied after
    // the index's limit would find none of those inside.
    const OUTSIDE: usize = 300;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let other = Tenant("other".to_owned());
        let generation = Generation::new("m", 3);
        let near: Vec<String> = (0..OUTSIDE).map(|i| format!("near {i}")).collect();
        let near: Vec<&str> = near.iter().map(String::as_str).collect();
        store
            .append(&t, &session("outside"), entries(&near), POLICY, 0)
            .await
            .expect("append");
        store
            .append(&other, &session("inside"), entries(&near[..50]), POLICY, 0)
            .await
            .expect("append");
        store
            .append(
                &t,
                &session("inside"),
                entries(&["in 1", "in 2", "in 3", "in 4", "in 5"]),
                POLICY,
                0,
            )
            .await
            .expect("append");
        // Not yet embedded: the leg finds nothing and says so.
        let query = vec![1.0f32, 0.0, 0.0];
        let scope = SearchScope {
            sessions: vec![session("inside")],
            ..SearchScope::default()
        };
        let leg = store
            .semantic_leg(&t, &scope, &generation, query.clone(), 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        assert_eq!(leg.embedded_share, 0.0);

        let unit = |x: f32| {
            let y = (1.0 - x * x).sqrt();
            vec![x, y, 0.0]
        };
        let stored = embed_all(&store, &generation, |text| {
            if let Some(n) = text.strip_prefix("in ") {
                // Further from the query the larger n: 0.5 .. 0.1.
                let n: f32 = n.parse().expect("number");
                unit(0.6 - n / 10.0)
            } else {
                unit(0.99)
            }
        })
        .await;
        assert_eq!(stored as usize, OUTSIDE + 50 + 5);

        let leg = store
            .semantic_leg(&t, &scope, &generation, query.clone(), 10)
            .await
            .expect("leg");
        let texts: Vec<&str> = leg.hits.iter().map(|h| h.text.as_str()).collect();
        assert_eq!(texts, vec!["in 1", "in 2", "in 3", "in 4", "in 5"]);
        assert!(leg.hits.iter().all(|h| h.session == "inside"));
        assert_eq!(leg.embedded_share, 1.0);
        // The limit holds within the scope too.
        let leg = store
            .semantic_leg(&t, &scope, &generation, query.clone(), 2)
            .await
            .expect("leg");
        assert_eq!(leg.hits.len(), 2);
        // Every filter is inside the leg: no entry of another role, none
        // before a time, no summary among entries only.
        let roles = SearchScope {
            roles: vec![Role::Assistant],
            ..scope.clone()
        };
        let leg = store
            .semantic_leg(&t, &roles, &generation, query.clone(), 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        let later = SearchScope {
            after: Some(Millis::now().saturating_add(Duration::from_secs(60))),
            ..scope.clone()
        };
        let leg = store
            .semantic_leg(&t, &later, &generation, query.clone(), 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        let recaps = SearchScope {
            levels: vec![1],
            ..scope.clone()
        };
        let leg = store
            .semantic_leg(&t, &recaps, &generation, query.clone(), 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        // The whole tenant: the nearest are outside, and another tenant's
        // (as near) are never among them.
        let leg = store
            .semantic_leg(&t, &SearchScope::default(), &generation, query.clone(), 10)
            .await
            .expect("leg");
        assert_eq!(leg.hits.len(), 10);
        assert!(leg.hits.iter().all(|h| h.session == "outside"));
        // A query of another length is of another generation.
        let leg = store
            .semantic_leg(&t, &scope, &generation, vec![1.0, 0.0], 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        // Another tenant sees its own only.
        let leg = store
            .semantic_leg(&other, &scope, &generation, query.clone(), 100)
            .await
            .expect("leg");
        assert_eq!(leg.hits.len(), 50);
    }
}

#[tokio::test]
async fn nothing_is_owed_while_embeddings_are_off_and_turning_them_on_walks_what_was_stored() {
    use crate::model::Generation;
    use crate::store::generations::Reowed;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let generation = Generation::new("m", 2);
        store.stop_owing_embeddings().await.expect("off");
        let id = closed_segment(&store, &["one", "two", "three"]).await;
        summarise(&store, id, "the recap").await;
        // No row was written for the three entries nor the summary.
        assert!(
            store
                .claim_owed("w", LEASE, 100)
                .await
                .expect("claim")
                .is_none()
        );
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (0, 0));
        // On again with the same generation: the walk owes what was
        // stored meanwhile (counted as pending before it walks), and a
        // text stored now is owed by its append.
        assert_eq!(
            store
                .set_embedding_generation(&generation)
                .await
                .expect("on"),
            None
        );
        let backlog = store
            .embedding_backlog(None, &generation)
            .await
            .expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (4, 0));
        // Entries first, then the summary.
        let mut owed = 0;
        loop {
            let step = store.reowe(&generation, 100).await.expect("walk");
            owed += step.owed;
            if step.done {
                break;
            }
        }
        assert_eq!(owed, 4);
        store
            .append(&t, &session("b"), entries(&["four"]), POLICY, 0)
            .await
            .expect("append");
        assert_eq!(embed_all(&store, &generation, |_| vec![0.6, 0.8]).await, 5);
        assert_eq!(
            store.reowe(&generation, 100).await.expect("walk"),
            Reowed {
                owed: 0,
                done: true
            }
        );
    }
}

#[tokio::test]
async fn a_new_generation_owes_everything_again_in_bounded_steps_and_drops_the_old_once_complete() {
    use crate::model::Generation;
    use crate::store::generations::Reowed;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let old = Generation::new("m", 2);
        let new = Generation::new("n", 3);
        // Active already (vector_stores), and owing.
        assert_eq!(
            store.set_embedding_generation(&old).await.expect("set"),
            None
        );
        let id = closed_segment(&store, &["one", "two", "three", "four", "five"]).await;
        summarise(&store, id, "the recap").await;
        store
            .append(&t, &session("b"), entries(&["six"]), POLICY, 0)
            .await
            .expect("append");
        // Turning embeddings on owes nothing twice: the history is owed.
        assert_eq!(
            store.reowe(&old, 100).await.expect("walk"),
            Reowed {
                owed: 0,
                done: true
            }
        );
        assert_eq!(embed_all(&store, &old, |_| vec![0.6, 0.8]).await, 7);
        assert_eq!(
            store.drop_old_vectors(&old, 100).await.expect("drop"),
            Dropped::Vectors(0)
        );
        assert_eq!(
            store.set_embedding_generation(&old).await.expect("set"),
            None
        );

        // Another model: every text is owed again, counted before it is
        // walked, and walked a bounded step at a time.
        assert_eq!(
            store.set_embedding_generation(&new).await.expect("set"),
            Some(Some("m@2".to_owned()))
        );
        let backlog = store.embedding_backlog(None, &new).await.expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (7, 0));
        let other = Tenant("other".to_owned());
        let backlog = store
            .embedding_backlog(Some(&other), &new)
            .await
            .expect("backlog");
        assert_eq!(backlog.pending, 0);
        assert_eq!(
            store.drop_old_vectors(&new, 100).await.expect("drop"),
            Dropped::Waiting
        );
        assert_eq!(
            store.reowe(&new, 2).await.expect("walk"),
            Reowed {
                owed: 2,
                done: false
            }
        );
        // Appended now: owed by its append. Erased mid-walk: owed no more.
        store
            .append(&t, &session("b"), entries(&["seven"]), POLICY, 0)
            .await
            .expect("append");
        store
            .delete_session(&t, &session("b"))
            .await
            .expect("delete");
        let mut owed = 2;
        let mut steps = 1;
        loop {
            let step = store.reowe(&new, 2).await.expect("walk");
            assert!(step.owed <= 2);
            owed += step.owed;
            steps += 1;
            if step.done {
                break;
            }
        }
        assert_eq!(owed, 6, "five entries and the recap of session s");
        assert!(steps >= 3);
        let backlog = store.embedding_backlog(None, &new).await.expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (6, 0));
        // Search uses the new generation only: nothing yet.
        let leg = store
            .semantic_leg(&t, &SearchScope::default(), &new, vec![0.0, 0.0, 1.0], 10)
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());
        assert_eq!(leg.embedded_share, 0.0);
        // Owed texts with only an old vector keep it.
        assert_eq!(
            store.drop_old_vectors(&new, 100).await.expect("drop"),
            Dropped::Waiting
        );
        let embedded = embed_all(&store, &new, |text| {
            if text == "the recap" {
                vec![0.0, 0.0, 1.0]
            } else {
                vec![0.0, 1.0, 0.0]
            }
        })
        .await;
        assert_eq!(embedded, 6);
        let leg = store
            .semantic_leg(&t, &SearchScope::default(), &new, vec![0.0, 0.0, 1.0], 10)
            .await
            .expect("leg");
        assert_eq!(leg.hits.len(), 6);
        assert_eq!(leg.hits[0].text, "the recap");
        assert_eq!(leg.embedded_share, 1.0);
        // Complete: the old vectors go, a bounded batch at a time.
        let mut dropped = Vec::new();
        loop {
            match store.drop_old_vectors(&new, 4).await.expect("drop") {
                Dropped::Vectors(0) => break,
                Dropped::Vectors(n) => dropped.push(n),
                Dropped::Waiting => panic!("complete, yet waiting"),
            }
        }
        assert_eq!(dropped, vec![4, 2]);
        assert_eq!(
            store
                .embedding_backlog(None, &old)
                .await
                .expect("backlog")
                .embedded,
            0
        );
        assert_eq!(store.generation_dimensions(&old).await.expect("dims"), None);
        let backlog = store.embedding_backlog(None, &new).await.expect("backlog");
        assert_eq!((backlog.pending, backlog.embedded), (0, 6));
    }
}

/// The texts of a leg's hits, in order.
fn texts_of(leg: &embeddings::SemanticLeg) -> Vec<&str> {
    leg.hits.iter().map(|h| h.text.as_str()).collect()
}

#[tokio::test]
async fn the_semantic_leg_finds_what_was_stored_since_and_nothing_erased_or_out_of_scope() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let generation = Generation::new("m", 3);
        // The nearer the query ([1, 0, 0]) the larger the number a text
        // ends with.
        let vector = |text: &str| {
            let n: f32 = text
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0.0);
            let x = n / 10.0;
            vec![x, (1.0 - x * x).sqrt(), 0.0]
        };
        let search = |scope: SearchScope| {
            let (store, t, generation) = (store.clone(), t.clone(), generation.clone());
            async move {
                store
                    .semantic_leg(&t, &scope, &generation, vec![1.0, 0.0, 0.0], 10)
                    .await
                    .expect("leg")
            }
        };
        store
            .append(&t, &session("a"), entries(&["a 1", "a 2"]), POLICY, 0)
            .await
            .expect("append");
        store
            .append(&t, &session("b"), entries(&["b 3"]), POLICY, 0)
            .await
            .expect("append");
        embed_all(&store, &generation, vector).await;
        let leg = search(SearchScope::default()).await;
        assert_eq!(texts_of(&leg), vec!["b 3", "a 2", "a 1"]);
        assert_eq!(leg.embedded_share, 1.0);

        // Stored after a search: the next one finds it.
        store
            .append(&t, &session("a"), entries(&["a 5"]), POLICY, 0)
            .await
            .expect("append");
        let leg = search(SearchScope::default()).await;
        assert_eq!(texts_of(&leg), vec!["b 3", "a 2", "a 1"]);
        assert_eq!(leg.embedded_share, 0.75);
        embed_all(&store, &generation, vector).await;
        let leg = search(SearchScope::default()).await;
        assert_eq!(texts_of(&leg), vec!["a 5", "b 3", "a 2", "a 1"]);
        assert_eq!(leg.embedded_share, 1.0);

        // Within the scope only, however near what is outside.
        let only_a = SearchScope {
            sessions: vec![session("a")],
            ..SearchScope::default()
        };
        assert_eq!(
            texts_of(&search(only_a.clone()).await),
            vec!["a 5", "a 2", "a 1"]
        );
        let assistant = SearchScope {
            roles: vec![Role::Assistant],
            ..SearchScope::default()
        };
        assert!(search(assistant).await.hits.is_empty());
        let later = SearchScope {
            after: Some(Millis::now().saturating_add(Duration::from_secs(60))),
            ..SearchScope::default()
        };
        let leg = search(later).await;
        assert!(leg.hits.is_empty());
        assert_eq!(leg.embedded_share, 0.0);
        let recaps = SearchScope {
            levels: vec![1],
            ..SearchScope::default()
        };
        assert!(search(recaps).await.hits.is_empty());
        let other = Tenant("other".to_owned());
        let leg = store
            .semantic_leg(
                &other,
                &SearchScope::default(),
                &generation,
                vec![1.0, 0.0, 0.0],
                10,
            )
            .await
            .expect("leg");
        assert!(leg.hits.is_empty());

        // Erased after a search: no later one finds it, nor the new
        // session of the same name (not embedded yet) in its place.
        store
            .delete_session(&t, &session("b"))
            .await
            .expect("delete");
        let leg = search(SearchScope::default()).await;
        assert_eq!(texts_of(&leg), vec!["a 5", "a 2", "a 1"]);
        assert_eq!(leg.embedded_share, 1.0);
        store
            .append(&t, &session("b"), entries(&["b 4"]), POLICY, 0)
            .await
            .expect("append");
        let leg = search(SearchScope::default()).await;
        assert_eq!(texts_of(&leg), vec!["a 5", "a 2", "a 1"]);
        assert_eq!(leg.embedded_share, 0.75);
        let only_b = SearchScope {
            sessions: vec![session("b")],
            ..SearchScope::default()
        };
        let leg = search(only_b.clone()).await;
        assert!(leg.hits.is_empty());
        assert_eq!(leg.embedded_share, 0.0);
        embed_all(&store, &generation, vector).await;
        assert_eq!(texts_of(&search(only_b).await), vec!["b 4"]);
        assert_eq!(
            texts_of(&search(SearchScope::default()).await),
            vec!["a 5", "b 4", "a 2", "a 1"]
        );
    }
}

/// Five days of an imported history (noon of each), each said by "Tom"
/// with its day as metadata, the first two also on channel "sms"; the
/// times and the texts.
fn imported_week() -> (Vec<i64>, Vec<NewEntry>) {
    const DAY: i64 = 24 * 3600 * 1000;
    let monday = 1_700_000_000_000;
    let times: Vec<i64> = (0..5).map(|d| monday + d * DAY).collect();
    let entries = times
        .iter()
        .enumerate()
        .map(|(d, &at)| {
            let mut e = NewEntry::new(Role::User, format!("spare key note {}", d + 1));
            e.occurred_at = Some(Millis(at));
            e.name = Some("Tom".to_owned());
            e.metadata = [("day".to_owned(), (d + 1).to_string())].into();
            if d < 2 {
                e.metadata.insert("channel".to_owned(), "sms".to_owned());
            }
            e
        })
        .collect();
    (times, entries)
}

#[tokio::test]
async fn both_legs_read_when_it_was_said_and_every_metadata_pair_before_their_limit() {
    use crate::model::Generation;
    for (_db, store) in vector_stores().await {
        let t = Tenant::default();
        let generation = Generation::new("m", 2);
        let (times, week) = imported_week();
        store
            .append(&t, &session("chat"), week, POLICY, 0)
            .await
            .expect("append");
        // Every text as near the query as the others: the filters alone
        // decide what the semantic leg finds.
        embed_all(&store, &generation, |_| vec![1.0, 0.0]).await;
        let query = crate::search::query::Query::parse("spare key").expect("query");
        let both = |scope: SearchScope| {
            let (store, t, generation, query) =
                (store.clone(), t.clone(), generation.clone(), query.clone());
            async move {
                let words = store
                    .search(&t, &scope, &query, 1, SEARCH_BUDGET)
                    .await
                    .expect("lexical");
                let meaning = store
                    .semantic_leg(&t, &scope, &generation, vec![1.0, 0.0], 1)
                    .await
                    .expect("semantic")
                    .hits;
                let texts = |hits: &[SearchHit]| -> Vec<String> {
                    hits.iter().map(|h| h.text.clone()).collect()
                };
                (texts(&words), texts(&meaning), words)
            }
        };
        // Day 4, by when it was said (every entry was stored just now);
        // the limit of 1 is met inside each leg, after the filter.
        let (words, meaning, hits) = both(SearchScope {
            after: Some(Millis(times[3] - 1)),
            before: Some(Millis(times[4])),
            ..SearchScope::default()
        })
        .await;
        assert_eq!(words, ["spare key note 4"]);
        assert_eq!(meaning, ["spare key note 4"]);
        assert_eq!(hits[0].occurred_at, Millis(times[3]));
        assert_eq!(hits[0].name.as_deref(), Some("Tom"));
        assert_eq!(hits[0].metadata.get("day").map(String::as_str), Some("4"));
        assert!(hits[0].created_at > Millis(times[4]));
        // Nothing was said after day 5, though all of it was stored now.
        let (words, meaning, _) = both(SearchScope {
            after: Some(Millis(times[4])),
            ..SearchScope::default()
        })
        .await;
        assert!(words.is_empty() && meaning.is_empty());

        // Metadata: every pair must hold.
        let pairs = |pairs: &[(&str, &str)]| SearchScope {
            metadata: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..SearchScope::default()
        };
        let (words, meaning, _) = both(pairs(&[("day", "2")])).await;
        assert_eq!(
            (words, meaning),
            (
                vec!["spare key note 2".to_owned()],
                vec!["spare key note 2".to_owned()]
            )
        );
        let (words, meaning, _) = both(pairs(&[("channel", "sms"), ("day", "1")])).await;
        assert_eq!(
            (words, meaning),
            (
                vec!["spare key note 1".to_owned()],
                vec!["spare key note 1".to_owned()]
            )
        );
        let (words, meaning, _) = both(pairs(&[("channel", "sms"), ("day", "3")])).await;
        assert!(words.is_empty() && meaning.is_empty());
        let (words, meaning, _) = both(pairs(&[("channel", "fax")])).await;
        assert!(words.is_empty() && meaning.is_empty());

        // A summary has no metadata: a pair never finds one, though
        // without it the recap is found.
        let id = store
            .close_open_segment(&t, &session("chat"))
            .await
            .expect("close")
            .expect("open");
        summarise(&store, id, "Recap: the spare key, all week").await;
        embed_all(&store, &generation, |_| vec![1.0, 0.0]).await;
        let recaps = SearchScope {
            levels: vec![1],
            ..SearchScope::default()
        };
        let (words, meaning, hits) = both(recaps.clone()).await;
        assert_eq!(words, ["Recap: the spare key, all week"]);
        assert_eq!(meaning, words);
        // Said when its last entry was, by nobody.
        assert_eq!(hits[0].occurred_at, Millis(times[4]));
        assert!(hits[0].name.is_none() && hits[0].metadata.is_empty());
        let (words, meaning, _) = both(SearchScope {
            metadata: [("day".to_owned(), "5".to_owned())].into(),
            ..recaps
        })
        .await;
        assert!(words.is_empty() && meaning.is_empty());
    }
}

#[tokio::test]
async fn a_session_expires_by_when_its_newest_entry_was_said() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let (_, week) = imported_week();
        // Imported today, said in 2023.
        store
            .append(&t, &session("imported"), week.clone(), POLICY, 0)
            .await
            .expect("append");
        // Imported too, and then appended to live.
        store
            .append(&t, &session("resumed"), week, POLICY, 0)
            .await
            .expect("append");
        store
            .append(&t, &session("resumed"), entries(&["back again"]), POLICY, 0)
            .await
            .expect("append");
        store
            .append(&t, &session("live"), entries(&["hello"]), POLICY, 0)
            .await
            .expect("append");
        // A ttl of a day: only the imported history is older than that.
        let cutoff = Millis(Millis::now().0 - 24 * 3600 * 1000);
        let expired = store.expire_sessions(cutoff, 10).await.expect("expire");
        let names: Vec<&str> = expired.iter().map(|(s, _)| s.session.as_str()).collect();
        assert_eq!(names, ["imported"]);
        assert!(
            !store
                .has_session(&t, &session("imported"))
                .await
                .expect("has")
        );
        assert!(
            store
                .has_session(&t, &session("resumed"))
                .await
                .expect("has")
        );
        assert!(store.has_session(&t, &session("live")).await.expect("has"));
    }
}

/// What a context recalls for `q` within the session's subject (or the
/// session alone without one), as the service asks for it.
async fn recalling(store: &Store, t: &Tenant, s: &str, q: &str, budget: Budget) -> Context {
    let query = crate::search::query::Query::parse(q).expect("query");
    let scope = match store
        .session_subject(t, &session(s))
        .await
        .expect("subject")
    {
        Some(name) => SearchScope {
            subject: Some(subject(&name)),
            ..Default::default()
        },
        None => SearchScope {
            sessions: vec![session(s)],
            ..Default::default()
        },
    };
    let hits = store
        .search(t, &scope, &query, 20, SEARCH_BUDGET)
        .await
        .expect("search");
    store
        .context_recalling(t, &session(s), budget, budget.max_tokens / 4, &hits)
        .await
        .expect("context")
}

/// The recalled items' (session, text), best first.
fn recalled(ctx: &Context) -> Vec<(String, String)> {
    ctx.items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Recalled(r) => Some((r.session.clone(), r.text.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_query_recalls_what_other_sessions_of_the_subject_said_and_nothing_twice() {
    for (_db, store) in stores().await {
        let t = Tenant::default();
        let ada = subject("ada");
        let budget = Budget {
            max_tokens: 400,
            max_bytes: usize::MAX,
            recent_tokens: 0,
        };
        let append = |tenant: Tenant,
                      s: &'static str,
                      who: Option<Subject>,
                      texts: &'static [&'static str]| {
            let store = store.clone();
            async move {
                store
                    .append_as(
                        &tenant,
                        &session(s),
                        who.as_ref(),
                        entries(texts),
                        POLICY,
                        0,
                    )
                    .await
                    .expect("append");
            }
        };
        // Monday: the fact, in Ada's first session.
        append(
            t.clone(),
            "mon",
            Some(ada.clone()),
            &["My gym locker code is 4711, by the boiler.", "Noted."],
        )
        .await;
        // The same words in another subject's session and another tenant's.
        append(
            t.clone(),
            "bob",
            Some(subject("bob")),
            &["Bob's gym locker code is 9999."],
        )
        .await;
        append(
            Tenant("other".to_owned()),
            "mon",
            Some(ada.clone()),
            &["The gym locker code is 1234."],
        )
        .await;
        // Friday: Ada asks.
        append(
            t.clone(),
            "fri",
            Some(ada.clone()),
            &["Good morning!", "What is my gym locker code?"],
        )
        .await;

        let plain = store
            .context(&t, &session("fri"), budget)
            .await
            .expect("context");
        let ctx = recalling(&store, &t, "fri", "What is my gym locker code?", budget).await;
        // Monday's fact first; the question, which the cover holds
        // verbatim, not again; nothing of Bob's or the other tenant's.
        assert_eq!(
            recalled(&ctx),
            [(
                "mon".to_owned(),
                "My gym locker code is 4711, by the boiler.".to_owned()
            )]
        );
        // The cover after it is the one without a query (it all fits).
        assert_eq!(ctx.items[1..], plain.items[..]);
        assert_eq!(
            ctx.tokens,
            ctx.items.iter().map(ContextItem::tokens).sum::<u32>()
        );
        assert!(ctx.tokens <= budget.max_tokens);

        // A query no text answers adds nothing: the answer without one.
        let none = recalling(&store, &t, "fri", "zeppelin quartermaster", budget).await;
        assert_eq!(none, plain);

        // A session of no subject recalls from itself alone: its own older
        // entries that the cover only summarises.
        const FILLER: &str = "A long story about the garden, the roses, the hedge, the shed \
            and the neighbours' cat, told at length one afternoon over tea and biscuits.";
        append(
            t.clone(),
            "solo",
            None,
            &["The wifi password is hunter2.", FILLER, FILLER],
        )
        .await;
        let id = store
            .close_open_segment(&t, &session("solo"))
            .await
            .expect("close")
            .expect("was open");
        summarise(&store, id, "Talk of the wifi.").await;
        append(
            t.clone(),
            "solo",
            None,
            &["Many words that fill the window of the newest entries for a while."],
        )
        .await;
        let small = Budget {
            max_tokens: 100,
            ..budget
        };
        let solo = recalling(&store, &t, "solo", "wifi password", small).await;
        assert_eq!(
            recalled(&solo),
            [(
                "solo".to_owned(),
                "The wifi password is hunter2.".to_owned()
            )]
        );
        assert!(solo.tokens <= small.max_tokens, "{solo:?}");
        // And never what another session holds, though it says the same.
        let plain_solo = store
            .context(&t, &session("solo"), small)
            .await
            .expect("context");
        assert!(
            plain_solo
                .items
                .iter()
                .all(|i| !matches!(i, ContextItem::Entry(e) if e.content.contains("hunter2"))),
            "the budget covers the old entry only by its recap: {plain_solo:?}"
        );
        // Newer turns that fill most of a budget leave recall's share to
        // come out of the recap of the oldest: the cover says it was cut.
        append(
            t.clone(),
            "solo",
            None,
            &[
                "We talked about the weather for a while and then the train.",
                "The train was late again, the third time this week, sadly.",
                "Then lunch: soup and bread at the corner cafe by the station.",
                "After lunch a walk along the river to the old mill and back.",
                "In the evening we read for an hour and went to bed early.",
            ],
        )
        .await;
        for max_tokens in (40..=200).step_by(5) {
            let b = Budget {
                max_tokens,
                ..budget
            };
            let Ok(plain) = store.context(&t, &session("solo"), b).await else {
                continue;
            };
            let asked = recalling(&store, &t, "solo", "wifi password", b).await;
            // A cut cover says so; recall never passes the budget.
            let first_seq = |c: &Context| {
                c.items.iter().find_map(|i| match i {
                    ContextItem::Entry(e) => Some(e.seq),
                    ContextItem::Summary { first_seq, .. } => Some(*first_seq),
                    ContextItem::Recalled(_) => None,
                })
            };
            assert!(
                asked.truncated || first_seq(&asked) == Some(1) || first_seq(&asked).is_none(),
                "at {max_tokens}: {asked:?} against {plain:?}"
            );
            assert!(asked.tokens <= max_tokens);
        }
    }
}

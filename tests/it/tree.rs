//! The memory tree through the real server: roll-ups of recaps, the
//! context carried into a recap, and a GetContext cover that zooms out
//! instead of forgetting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use archivist::pb;
use wiremock::{Request, Respond, ResponseTemplate};

use crate::harness::{TestServer, eventually, levels, state};
use crate::provider::{completion, error_json, fast, provider};

/// A provider that answers level-1 recaps with a long text naming the
/// entries they saw, and roll-ups with a short one naming the recaps; it
/// keeps every request's user message, and fails roll-ups while told to.
#[derive(Clone, Default)]
struct TreeProvider {
    recaps: Arc<Mutex<Vec<String>>>,
    rollups: Arc<Mutex<Vec<String>>>,
    fail_rollups: Arc<AtomicBool>,
}

/// The numbers of the "entry-N" markers in `text`.
fn markers(text: &str, prefix: &str) -> Vec<u32> {
    text.split(prefix)
        .skip(1)
        .filter_map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .collect()
}

impl Respond for TreeProvider {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = serde_json::from_slice(&request.body).expect("JSON body");
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let user = body["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if system.contains("condense consecutive recaps") {
            self.rollups.lock().expect("lock").push(user.clone());
            if self.fail_rollups.load(Ordering::SeqCst) {
                return error_json(503, "overloaded", "try later");
            }
            let n = markers(&user, "covers-").len();
            return completion(&format!("Roll-up of {n} recaps."));
        }
        // What the segment itself holds, after any carried context.
        let segment = user
            .rsplit("The conversation segment to recap:")
            .next()
            .unwrap_or_default();
        let seen = markers(segment, "entry-");
        self.recaps.lock().expect("lock").push(user.clone());
        let first = seen.first().copied().unwrap_or(0);
        let last = seen.last().copied().unwrap_or(0);
        // Long on purpose: sixteen of these do not fit a small budget.
        completion(&format!(
            "Recap covers-{first} to {last}: the team discussed the billing migration, its \
             timeout, the rerun plan and who owns the follow-up in some detail."
        ))
    }
}

async fn tree_server(responder: TreeProvider) -> (wiremock::MockServer, TestServer) {
    let mock = provider(responder).await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 4;
        c.memory.fanout = 4;
        c.reconciler.interval = Duration::from_millis(100);
        c.reconciler.max_spacing = Duration::from_millis(400);
        c.retry.max_attempts = 1;
        // One pass at a time, so that each recap finds the one before it
        // written (a recap never waits for its predecessor).
        c.reconciler.concurrency = 1;
    })
    .await;
    (mock, server)
}

async fn append_entries(server: &TestServer, session: &str, n: u32) {
    for i in 1..=n {
        server
            .append(
                session,
                &[&format!("Message entry-{i} of the conversation.")],
            )
            .await;
    }
}

/// The seq ranges of a cover's items, oldest first.
fn ranges(ctx: &pb::GetContextResponse) -> Vec<(u64, u64, u32)> {
    ctx.items
        .iter()
        .map(|item| match item.item.as_ref().expect("item") {
            pb::context_item::Item::Summary(s) => (s.first_seq, s.last_seq, s.level),
            pb::context_item::Item::Entry(e) => (e.seq, e.seq, 0),
            pb::context_item::Item::Recalled(r) => {
                panic!("nothing recalled without a query: {r:?}")
            }
        })
        .collect()
}

/// Asserts the cover runs from seq 1 to `last` with no gap, and overlaps
/// only where the raw entries at its end reach back into the summary
/// before them (the recent window inside that node).
fn assert_full_cover(ctx: &pb::GetContextResponse, last: u64) {
    let ranges = ranges(ctx);
    assert!(!ctx.truncated, "{ranges:?}");
    let mut next = 1;
    let mut overlapped = false;
    for (i, (first, end, level)) in ranges.iter().enumerate() {
        let after_summary = i > 0 && ranges[i - 1].2 > 0;
        if *level == 0 && after_summary && *first < next && !overlapped {
            overlapped = true;
        } else {
            assert_eq!(*first, next, "gap or overlap in {ranges:?}");
            assert!(
                !(overlapped && *level > 0),
                "a summary after raw: {ranges:?}"
            );
        }
        next = end + 1;
    }
    assert_eq!(next, last + 1, "the cover ends at the last seq: {ranges:?}");
}

/// Estimated tokens of the level-1 recaps of `session`, all together.
async fn level_one_tokens(server: &TestServer, session: &str) -> u32 {
    levels(server, session, vec![1])
        .await
        .iter()
        .filter_map(|s| s.summary.as_ref())
        .map(|s| (s.text.len() as u32).div_ceil(4) + 4)
        .sum()
}

#[tokio::test]
async fn sixty_four_entries_make_a_tree_and_each_node_is_summarised_once() {
    let responder = TreeProvider::default();
    let (_mock, server) = tree_server(responder.clone()).await;
    append_entries(&server, "s", 64).await;
    let done = eventually(Duration::from_secs(20), || async {
        let b = server.backlog().await;
        b.summarised == 21 && b.pending == 0
    })
    .await;
    assert!(done, "{:?}", server.backlog().await);

    let l1 = levels(&server, "s", vec![1]).await;
    let l2 = levels(&server, "s", vec![2]).await;
    let l3 = levels(&server, "s", vec![3]).await;
    assert_eq!((l1.len(), l2.len(), l3.len()), (16, 4, 1));
    // Level 1 is what a v1 client lists by default.
    assert_eq!(levels(&server, "s", vec![]).await.len(), 16);
    for node in l1.iter().chain(&l2).chain(&l3) {
        assert_eq!(state(node), pb::SegmentState::Summarised);
        assert_eq!((node.attempts, node.passes), (1, 1), "node {}", node.id);
    }
    for (i, node) in l2.iter().enumerate() {
        assert_eq!(node.ordinal as usize, i + 1);
        let children: Vec<u64> = l1[i * 4..i * 4 + 4].iter().map(|s| s.id).collect();
        assert_eq!(node.child_ids, children);
        assert_eq!(
            (node.first_seq, node.last_seq),
            (16 * i as u64 + 1, 16 * i as u64 + 16)
        );
        assert_eq!(node.entry_count, 16);
    }
    let top = &l3[0];
    assert_eq!(top.child_ids, l2.iter().map(|s| s.id).collect::<Vec<_>>());
    assert_eq!((top.first_seq, top.last_seq, top.entry_count), (1, 64, 64));
    assert_eq!(top.level, 3);
    let got = server.segment(top.id).await;
    assert_eq!(got.summary.expect("summary").prompt_version, "rollup-v2");

    // Sixteen recaps and five roll-ups, each sent once.
    let recaps = responder.recaps.lock().expect("lock").clone();
    let rollups = responder.rollups.lock().expect("lock").clone();
    assert_eq!(recaps.len(), 16);
    assert_eq!(rollups.len(), 5);
    // A roll-up carries its children's summaries and no raw entry: four
    // recaps of level 1 for each level-2 node, four roll-ups for the top.
    let mut of_recaps = 0;
    for request in &rollups {
        let labelled = (1..=4)
            .filter(|i| request.contains(&format!("Recap {i}:\n")))
            .count();
        assert_eq!(labelled, 4, "{request}");
        assert!(!request.contains("entry-"), "{request}");
        match markers(request, "covers-").len() {
            4 => of_recaps += 1,
            0 => assert_eq!(request.matches("Roll-up of 4 recaps.").count(), 4),
            n => panic!("{n} recaps in {request}"),
        }
    }
    assert_eq!(of_recaps, 4);
    // Every level-1 recap after the first carries the previous summary as
    // context not to be retold, and recaps only its own entries.
    let mut carried = 0;
    for request in &recaps {
        let own = markers(
            request
                .rsplit("The conversation segment to recap:")
                .next()
                .unwrap_or_default(),
            "entry-",
        );
        assert_eq!(own.len(), 4, "{request}");
        if own[0] > 1 {
            assert!(
                request.contains("Earlier in this conversation (context only; do not retell it):"),
                "{request}"
            );
            // The newest summary ending just before: the previous recap, or
            // a roll-up it completed.
            match markers(request, "covers-").first() {
                Some(first) => assert_eq!(*first, own[0] - 4, "{request}"),
                None => assert!(request.contains("Roll-up of 4 recaps."), "{request}"),
            }
            carried += 1;
        } else {
            assert!(
                !request.contains("Earlier in this conversation"),
                "{request}"
            );
        }
    }
    assert_eq!(carried, 15);
}

#[tokio::test]
async fn a_tight_budget_zooms_out_instead_of_forgetting() {
    let responder = TreeProvider::default();
    let (_mock, server) = tree_server(responder.clone()).await;
    append_entries(&server, "s", 64).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            server.backlog().await.summarised == 21
        })
        .await
    );
    // With room for all, every entry comes raw.
    let everything = server.context("s", 0).await;
    assert_eq!(
        ranges_of_entries(&everything),
        (1..=64).collect::<Vec<u64>>()
    );
    // Level-1 recaps alone do not fit.
    let level_one = level_one_tokens(&server, "s").await;
    let budget = level_one / 3;
    let ctx = server.context("s", budget).await;
    assert_full_cover(&ctx, 64);
    assert!(ctx.estimated_tokens <= budget);
    let ranges = ranges(&ctx);
    assert!(
        ranges.iter().any(|(_, _, level)| *level >= 2),
        "zoomed out: {ranges:?}"
    );
    // The newest history is the finest: raw.
    assert_eq!(ranges.last().map(|r| r.2), Some(0), "{ranges:?}");
    // The coarsest cover is one summary ("Roll-up of 4 recaps.", 9
    // tokens): a budget below it has nothing to return, and says so.
    let one = server.context("s", 9).await;
    assert_eq!(self::ranges(&one), [(1, 64, 3)]);
    let none = server.try_context("s", 8).await.expect_err("too small");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);

    // Raw entries of the open segment come after the tree, newest kept.
    append_entries_from(&server, "s", 65, 2).await;
    let ctx = server.context("s", budget + 40).await;
    assert_full_cover(&ctx, 66);
    assert!(ranges_of_entries(&ctx).ends_with(&[65, 66]), "{ctx:?}");
}

async fn append_entries_from(server: &TestServer, session: &str, from: u32, n: u32) {
    for i in from..from + n {
        server
            .append(
                session,
                &[&format!("Message entry-{i} of the conversation.")],
            )
            .await;
    }
}

fn ranges_of_entries(ctx: &pb::GetContextResponse) -> Vec<u64> {
    ctx.items
        .iter()
        .filter_map(|item| match item.item.as_ref() {
            Some(pb::context_item::Item::Entry(e)) => Some(e.seq),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn failed_roll_ups_leave_no_hole_and_are_completed_later() {
    let responder = TreeProvider::default();
    responder.fail_rollups.store(true, Ordering::SeqCst);
    let (_mock, server) = tree_server(responder.clone()).await;
    append_entries(&server, "s", 64).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            levels(&server, "s", vec![1])
                .await
                .iter()
                .filter(|s| state(s) == pb::SegmentState::Summarised)
                .count()
                == 16
        })
        .await
    );
    // Roll-ups exist and failed as segments do: PENDING with their Failure.
    assert!(
        eventually(Duration::from_secs(10), || async {
            levels(&server, "s", vec![2])
                .await
                .iter()
                .any(|s| s.last_failure.is_some())
        })
        .await
    );
    let l2 = levels(&server, "s", vec![2]).await;
    assert_eq!(l2.len(), 4);
    for node in &l2 {
        assert_eq!(state(node), pb::SegmentState::Pending, "{node:?}");
    }
    let failed = l2
        .iter()
        .find(|s| s.last_failure.is_some())
        .expect("failed");
    let failure = failed.last_failure.as_ref().expect("failure");
    assert!(matches!(
        failure.kind,
        Some(pb::failure::Kind::Unavailable(_))
    ));
    // The cover falls back to level-1 recaps: complete, no hole.
    let ctx = server
        .context("s", 2 * level_one_tokens(&server, "s").await)
        .await;
    assert_full_cover(&ctx, 64);
    assert!(ranges(&ctx).iter().all(|(_, _, level)| *level <= 1));

    // Once the provider recovers, the reconciler completes the tree.
    responder.fail_rollups.store(false, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(30), || async {
            let b = server.backlog().await;
            b.summarised == 21 && b.pending == 0
        })
        .await,
        "{:?}",
        server.backlog().await
    );
    let ctx = server.context("s", 60).await;
    assert_full_cover(&ctx, 64);
}

#[tokio::test]
async fn fanout_zero_makes_no_roll_ups() {
    let mock = provider(TreeProvider::default()).await;
    let server = TestServer::start_with(|c| {
        fast(c, &mock.uri());
        c.segment.max_entries = 4;
        c.memory.fanout = 0;
        c.memory.carry_tokens = 0;
    })
    .await;
    append_entries(&server, "s", 32).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            server.backlog().await.summarised == 8
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.backlog().await.summarised, 8);
    assert!(levels(&server, "s", vec![2, 3]).await.is_empty());
}

/// Runs `archivist session ARGS…` against `server`; returns its stdout.
async fn session_cli(server: &TestServer, args: &[&str]) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_archivist"));
    command
        .arg("session")
        .arg("--server")
        .arg(format!("http://{}", server.addr))
        .args(args);
    let out = tokio::task::spawn_blocking(move || command.output().expect("run the client"))
        .await
        .expect("joined");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_terminal_client_shows_the_tree_and_each_items_level() {
    let responder = TreeProvider::default();
    let (_mock, server) = tree_server(responder).await;
    append_entries(&server, "s", 32).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            server.backlog().await.summarised == 10
        })
        .await
    );
    let tree = session_cli(&server, &["tree", "s"]).await;
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 10, "{tree}");
    assert!(
        lines[0].starts_with("L2 #1 ") && lines[0].contains("seq 1..16"),
        "{tree}"
    );
    assert!(
        lines[1].starts_with("  L1 #1 ") && lines[1].contains("seq 1..4"),
        "{tree}"
    );
    assert!(lines[5].starts_with("L2 #2 "), "{tree}");
    // With room for everything, everything comes raw.
    let context = session_cli(&server, &["context", "s"]).await;
    assert!(
        context.contains("Message entry-1 of the conversation.")
            && context.contains("Message entry-32 of the conversation."),
        "{context}"
    );
    assert!(!context.contains("summary of seq"), "{context}");
    let zoomed = session_cli(&server, &["context", "s", "--max-tokens", "100"]).await;
    assert!(zoomed.contains("[level 2 summary of seq 1..16"), "{zoomed}");

    // --json is the wire message, every field: read back, it is what the
    // server sent, so a script rebuilds the tree from it.
    let tree = session_cli(&server, &["tree", "s", "--json"]).await;
    let tree: serde_json::Value = serde_json::from_str(&tree).expect("JSON");
    let printed: Vec<pb::Segment> = tree["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(from_json)
        .collect();
    let mut listed = levels(&server, "s", (1..=3).collect()).await;
    listed.sort_by_key(|n| n.id);
    let mut sorted = printed.clone();
    sorted.sort_by_key(|n| n.id);
    assert_eq!(sorted, listed);
    // Each roll-up's children name their parent: 8 leaves under 2 roll-ups.
    let parents: Vec<(u32, usize)> = printed
        .iter()
        .filter(|n| !n.child_ids.is_empty())
        .map(|n| (n.level, n.child_ids.len()))
        .collect();
    assert_eq!(parents, [(2, 4), (2, 4)]);
    // The first roll-up's children are the segments of seq 1..16, in order.
    let first = tree["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["level"] == 2 && n["first_seq"] == 1)
        .unwrap_or_else(|| panic!("no roll-up of seq 1.. in {tree}"));
    let mut children: Vec<&pb::Segment> = printed
        .iter()
        .filter(|n| n.level == 1 && n.last_seq <= 16)
        .collect();
    children.sort_by_key(|n| n.first_seq);
    let ids: Vec<u64> = children.iter().map(|n| n.id).collect();
    assert_eq!(first["child_ids"], serde_json::json!(ids), "{tree}");

    let printed = session_cli(&server, &["context", "s", "--max-tokens", "100", "--json"]).await;
    let printed: pb::GetContextResponse = from_json(&serde_json::from_str(&printed).expect("JSON"));
    let served = server.context("s", 100).await;
    assert_eq!(printed, served);
    assert!(
        printed.items.iter().any(|i| matches!(
            &i.item,
            Some(pb::context_item::Item::Summary(s)) if s.level == 2
        )),
        "{printed:?}"
    );
}

/// A wire message read back from the terminal client's JSON.
fn from_json<M: prost::Message + prost::Name + Default>(json: &serde_json::Value) -> M {
    use prost_reflect::{DescriptorPool, DynamicMessage};
    let pool = DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("descriptors");
    let descriptor = pool
        .get_message_by_name(&M::full_name())
        .expect("a message of archivist.v1");
    DynamicMessage::deserialize(descriptor, json)
        .unwrap_or_else(|e| panic!("{}: {e}: {json}", M::full_name()))
        .transcode_to()
        .expect("transcode")
}

/// A provider that counts the requests it answers.
#[derive(Clone, Default)]
struct Tally {
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl Respond for Tally {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        self.requests.fetch_add(1, Ordering::SeqCst);
        completion("Recap of the talk so far.")
    }
}

/// Every node of `session` at levels 1 to 4.
async fn nodes(process: &crate::binary::Process, session: &str) -> Vec<pb::Segment> {
    let mut client = process.client().await;
    crate::harness::list_segments_at(&mut client, session, vec![1, 2, 3, 4]).await
}

/// Appends `n` entries to `session`, each closing a segment, then flushes;
/// asserts the flush completes.
async fn segments_flushed(process: &crate::binary::Process, session: &str, from: u32, n: u32) {
    let mut client = process.client().await;
    for i in from..from + n {
        client
            .append_entries(crate::harness::append_request(
                session,
                &[&format!("Turn {i} of the planning talk.")],
            ))
            .await
            .expect("append");
    }
    let flushed = client
        .flush_session(pb::FlushSessionRequest {
            session_id: session.to_owned(),
        })
        .await
        .expect("flush")
        .into_inner();
    assert!(flushed.complete, "{:?}", flushed.segments);
}

/// Serves `session` under fanout 2, then restarts under fanout 4 and
/// carries on: every node ends SUMMARISED after exactly one send (the
/// provider is asked once per node, no pass fails), and the groups formed
/// after the change have four children.
async fn fanout_raised_between_restarts(env: &[(&str, &str)], dir: &std::path::Path) {
    let tally = Tally::default();
    let mock = provider(tally.clone()).await;
    let start = |fanout: &'static str| {
        let mut env = env.to_vec();
        env.extend_from_slice(&[
            ("ARCHIVIST_MEMORY_FANOUT", fanout),
            ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1"),
            ("ARCHIVIST_RETRY_MAX_ATTEMPTS", "1"),
        ]);
        let uri = mock.uri();
        async move { crate::binary::Process::start_openai(dir, &uri, &env).await }
    };
    let before = start("2").await;
    // Six segments: roll-ups [1,2] [3,4] [5,6] at level 2, [1,2] at level 3.
    segments_flushed(&before, "s", 1, 6).await;
    let settled = eventually(Duration::from_secs(20), || async {
        let all = nodes(&before, "s").await;
        all.len() == 10 && all.iter().all(|n| state(n) == pb::SegmentState::Summarised)
    })
    .await;
    assert!(settled, "{:?}", nodes(&before, "s").await);
    drop(before);

    let after = start("4").await;
    // Ten more: level-1 groups [7..10] and [11..14] roll up in fours;
    // 15 and 16 wait for two more.
    segments_flushed(&after, "s", 7, 10).await;
    let settled = eventually(Duration::from_secs(30), || async {
        let all = nodes(&after, "s").await;
        all.len() == 22 && all.iter().all(|n| state(n) == pb::SegmentState::Summarised)
    })
    .await;
    let all = nodes(&after, "s").await;
    assert!(settled, "{all:?}");
    for node in &all {
        assert_eq!(
            (node.attempts, node.passes, node.last_failure.is_some()),
            (1, 1, false),
            "node {} (level {}, ordinal {})",
            node.id,
            node.level,
            node.ordinal
        );
    }
    assert_eq!(
        tally.requests.load(Ordering::SeqCst),
        all.len(),
        "one send per node"
    );
    let shape = |level: u32| -> Vec<(u32, usize)> {
        all.iter()
            .filter(|n| n.level == level)
            .map(|n| (n.ordinal, n.child_ids.len()))
            .collect()
    };
    assert_eq!(shape(2), vec![(1, 2), (2, 2), (3, 2), (4, 4), (5, 4)]);
    assert_eq!(shape(3), vec![(1, 2)]);
    // Nothing is owed: the reconciler has nothing left to send.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(tally.requests.load(Ordering::SeqCst), all.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_fanout_between_restarts_summarises_every_node_once_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    fanout_raised_between_restarts(&[], dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_fanout_between_restarts_summarises_every_node_once_on_postgres() {
    let Some(db) = crate::replicas::database().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("ARCHIVIST_STORAGE_BACKEND", "postgres"),
        ("ARCHIVIST_STORAGE_URL", db.url.as_str()),
    ];
    fanout_raised_between_restarts(&env, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recap_the_store_refuses_is_a_counted_store_failure_not_a_silent_retry() {
    let tally = Tally::default();
    let mock = provider(tally.clone()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("ARCHIVIST_MEMORY_FANOUT", "0"),
        ("ARCHIVIST_SEGMENT_MAX_ENTRIES", "1"),
        ("ARCHIVIST_RETRY_MAX_ATTEMPTS", "1"),
    ];
    let server = crate::binary::Process::start_openai(dir.path(), &mock.uri(), &env).await;
    // A fault injector beside the server: the database refuses every
    // summary.
    let db = rusqlite::Connection::open(dir.path().join("archivist.sqlite3")).expect("open");
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    db.execute_batch(
        "CREATE TRIGGER inject_store_fault BEFORE INSERT ON summaries \
         BEGIN SELECT RAISE(ABORT, 'injected store fault'); END;",
    )
    .expect("trigger");
    let mut client = server.client().await;
    let id = client
        .append_entries(crate::harness::append_request("s", &["Refused once."]))
        .await
        .expect("append")
        .into_inner()
        .closed_segment_ids[0];
    let segment = |mut client: archivist::client::Client| async move {
        client
            .get_segment(pb::GetSegmentRequest { segment_id: id })
            .await
            .expect("segment")
            .into_inner()
    };
    let failed = eventually(Duration::from_secs(10), || async {
        segment(client.clone()).await.passes >= 2
    })
    .await;
    let seen = segment(client.clone()).await;
    assert!(failed, "{seen:?}");
    assert_eq!(state(&seen), pb::SegmentState::Pending);
    let failure = seen.last_failure.clone().expect("the failure is recorded");
    assert!(
        matches!(failure.kind, Some(pb::failure::Kind::Store(_))),
        "{failure:?}"
    );
    assert!(failure.retryable);
    assert!(
        failure
            .causes
            .iter()
            .any(|c| c.contains("injected store fault")),
        "{:?}",
        failure.causes
    );
    assert!(seen.next_attempt_at.is_some(), "spaced by the schedule");
    // Once the store takes summaries again, the segment is summarised; and
    // every send the provider got was counted by a pass.
    db.execute_batch("DROP TRIGGER inject_store_fault")
        .expect("drop trigger");
    let done = eventually(Duration::from_secs(30), || async {
        state(&segment(client.clone()).await) == pb::SegmentState::Summarised
    })
    .await;
    let last = segment(client.clone()).await;
    assert!(done, "{last:?}");
    let sent = tally.requests.load(Ordering::SeqCst);
    assert_eq!(
        (last.attempts as usize, last.passes as usize),
        (sent, sent),
        "every send counted by a pass"
    );
}

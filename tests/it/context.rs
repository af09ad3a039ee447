//! GetContext through the real server: the newest turns raw whatever
//! their segment, the budget spent down to raw history, a refusal naming
//! the smallest budget, and roll-ups that keep a line of every child at
//! the size of one.

use std::time::Duration;

use archivist::pb;
use tonic_types::StatusExt;

use crate::harness::{TestServer, context_entries, eventually, state};

fn shape(ctx: &pb::GetContextResponse) -> Vec<String> {
    ctx.items
        .iter()
        .map(|i| match &i.item {
            Some(pb::context_item::Item::Summary(s)) => {
                format!("summary {}..{}", s.first_seq, s.last_seq)
            }
            Some(pb::context_item::Item::Entry(e)) => format!("entry {}", e.seq),
            Some(pb::context_item::Item::Recalled(r)) => {
                format!("recalled {} {}", r.session_id, r.first_seq)
            }
            None => "nothing".to_owned(),
        })
        .collect()
}

async fn wait_summarised(server: &TestServer, session: &str, n: usize) {
    let ok = eventually(Duration::from_secs(10), || async {
        server
            .segments(session)
            .await
            .iter()
            .filter(|s| state(s) == pb::SegmentState::Summarised)
            .count()
            == n
    })
    .await;
    assert!(ok, "{n} segments summarised");
}

fn turns(n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| format!("Turn {i:02}: we went over item number {i} of the checklist."))
        .collect()
}

#[tokio::test]
async fn the_newest_turns_come_raw_though_their_segment_is_closed_and_summarised() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 100).await;
    let texts = turns(12);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    let closed = server.close("s", true).await;
    assert!(closed.expect("close").segment.is_some());
    wait_summarised(&server, "s", 1).await;
    // Each turn is 60 bytes, 19 tokens: a quarter of 120 holds one, and
    // what the recap leaves is spent on more of the newest turns.
    let ctx = server.context("s", 120).await;
    let items = shape(&ctx);
    assert!(items[0].starts_with("summary 1..12"), "{items:?}");
    assert_eq!(
        items.last().map(String::as_str),
        Some("entry 12"),
        "{items:?}"
    );
    let raw = context_entries(&ctx);
    assert!(raw.len() >= 2, "{items:?}");
    for (seq, content) in &raw {
        assert_eq!(content, &texts[*seq as usize - 1]);
    }
    assert!(ctx.estimated_tokens <= 120);
    assert!(ctx.estimated_tokens > 120 - 19, "{}", ctx.estimated_tokens);
    assert!(!ctx.truncated);
}

#[tokio::test]
async fn a_large_budget_returns_the_raw_history_of_summarised_segments() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 4).await;
    let texts = turns(12);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    wait_summarised(&server, "s", 3).await;
    let total = server.context("s", 0).await.estimated_tokens;
    for budget in [0, total] {
        let ctx = server.context("s", budget).await;
        let raw: Vec<String> = context_entries(&ctx).into_iter().map(|(_, c)| c).collect();
        assert_eq!(raw, texts, "budget {budget}");
        assert_eq!(ctx.items.len(), 12);
        assert!(!ctx.truncated);
    }
    // One turn less: a recap stands for the oldest segment, whose entries
    // no longer fit, and the rest stays raw.
    let ctx = server.context("s", total - 1).await;
    assert!(
        shape(&ctx)[0].starts_with("summary 1..4"),
        "{:?}",
        shape(&ctx)
    );
    assert_eq!(context_entries(&ctx).last().map(|(s, _)| *s), Some(12));
}

#[tokio::test]
async fn a_budget_too_small_for_the_newest_entry_is_refused_naming_the_smallest() {
    let server = TestServer::start().await;
    let long = "x".repeat(400);
    server.append("s", &["short and kept", &long]).await;
    // 400 bytes: 100 + 4 = 104 tokens.
    let status = server.try_context("s", 103).await.expect_err("too small");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let details = status.get_error_details();
    let info = details.error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "CONTEXT_BUDGET_TOO_SMALL");
    assert_eq!(
        info.metadata.get("min_max_tokens").map(String::as_str),
        Some("104")
    );
    let bad = details.bad_request().expect("BadRequest");
    assert!(
        bad.field_violations
            .iter()
            .any(|v| v.field == "max_tokens" && v.description.contains("104")),
        "{bad:?}"
    );
    // The budget it names returns the newest entry, and nothing was lost.
    let ctx = server.context("s", 104).await;
    assert_eq!(shape(&ctx), ["entry 2"]);
    assert!(ctx.truncated);
    let all = server.context("s", 0).await;
    assert_eq!(context_entries(&all)[0].1, "short and kept");

    // The terminal client says the same and fails.
    let out = tokio::task::spawn_blocking({
        let addr = format!("http://{}", server.addr);
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_archivist"))
                .args([
                    "session",
                    "--server",
                    &addr,
                    "context",
                    "s",
                    "--max-tokens",
                    "10",
                ])
                .output()
                .expect("run the client")
        }
    })
    .await
    .expect("joined");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("104"), "{err}");
}

/// A segment of five entries whose third carries a fact that names the
/// segment: `Z{k}-{code}`.
fn fact_segment(k: usize) -> Vec<String> {
    vec![
        format!("Good morning, let us pick up where we left off in part {k}."),
        "Sounds good, thanks!".to_owned(),
        format!(
            "My locker for project number {k} has the code Z{k}-{}.",
            4000 + 37 * k
        ),
        "Okay, noted. Anything else on the list for today?".to_owned(),
        "We should look at the weekly report again next week.".to_owned(),
    ]
}

#[tokio::test]
async fn roll_ups_keep_a_line_of_every_child_and_stay_the_size_of_one() {
    let server = TestServer::start_with(|c| {
        c.segment.max_entries = 5;
        c.memory.fanout = 4;
    })
    .await;
    let texts: Vec<String> = (1..=16).flat_map(fact_segment).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    let done = eventually(Duration::from_secs(20), || async {
        server.backlog().await.summarised == 16 + 4 + 1
    })
    .await;
    assert!(done, "{:?}", server.backlog().await);
    let nodes = crate::harness::levels(&server, "s", vec![1, 2, 3]).await;
    let by_id: std::collections::HashMap<u64, &pb::Segment> =
        nodes.iter().map(|n| (n.id, n)).collect();
    let text = |n: &pb::Segment| {
        n.summary
            .as_ref()
            .map(|s| s.text.clone())
            .unwrap_or_default()
    };
    let tokens = |n: &pb::Segment| (text(n).len() as u32).div_ceil(4) + 4;
    // Every level-1 recap keeps its fact, and leaves the greeting out.
    for n in nodes.iter().filter(|n| n.level == 1) {
        let k = n.ordinal as usize;
        assert!(
            text(n).contains(&format!("Z{k}-{}", 4000 + 37 * k)),
            "{}",
            text(n)
        );
        assert!(!text(n).contains("Sounds good"), "{}", text(n));
    }
    for n in nodes.iter().filter(|n| n.level >= 2) {
        assert_eq!(n.child_ids.len(), 4);
        let children: Vec<&pb::Segment> = n.child_ids.iter().map(|id| by_id[id]).collect();
        // A line of every child: each child's fact, at level 2; at level 3,
        // a fact from beneath each child.
        for child in &children {
            let first = child.first_seq as usize / 5 + 1;
            let last = child.last_seq as usize / 5;
            assert!(
                (first..=last).any(|k| text(n).contains(&format!("Z{k}-"))),
                "level {} misses child {}..{}: {}",
                n.level,
                child.first_seq,
                child.last_seq,
                text(n)
            );
        }
        // The size of one recap (150 tokens) whatever the level, though
        // level 3 stands for sixteen facts of about 20 tokens each.
        assert!(tokens(n) <= 150, "level {}: {}", n.level, tokens(n));
    }
}

#[tokio::test]
async fn within_a_segment_the_oldest_entries_go_first() {
    let server = TestServer::start().await;
    let texts: Vec<String> = (1..=20).map(|i| format!("message {i:02}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    server.append("s", &refs).await;
    // "message NN" is 10 bytes: 3 + 4 = 7 tokens each; 30 tokens hold four.
    let ctx = server.context("s", 30).await;
    assert!(ctx.truncated);
    let seqs: Vec<u64> = context_entries(&ctx).into_iter().map(|(s, _)| s).collect();
    assert_eq!(seqs, vec![17, 18, 19, 20]);
    assert_eq!(ctx.estimated_tokens, 28);
}

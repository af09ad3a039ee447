//! GetContext: summaries where they exist, raw entries elsewhere, oldest
//! dropped first to fit the budget.

use std::time::Duration;

use archivist::pb;

use crate::harness::{TestServer, context_entries, eventually, state};

fn shape(ctx: &pb::GetContextResponse) -> Vec<String> {
    ctx.items
        .iter()
        .map(|i| match &i.item {
            Some(pb::context_item::Item::Summary(s)) => {
                format!("summary {}..{}", s.first_seq, s.last_seq)
            }
            Some(pb::context_item::Item::Entry(e)) => format!("entry {}", e.seq),
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

#[tokio::test]
async fn summaries_stand_for_summarised_segments_and_entries_for_the_rest() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    server
        .append(
            "s",
            &[
                "We planned the billing migration.",
                "The migration needs a longer timeout.",
                "Then we talked about the release notes.",
                "Release notes go out on Friday.",
                "What about the dashboard?",
            ],
        )
        .await;
    wait_summarised(&server, "s", 2).await;
    let ctx = server.context("s", 0).await;
    assert_eq!(shape(&ctx), vec!["summary 1..2", "summary 3..4", "entry 5"]);
    assert!(!ctx.truncated);
    let first = match &ctx.items[0].item {
        Some(pb::context_item::Item::Summary(s)) => s.clone(),
        other => panic!("expected a summary, got {other:?}"),
    };
    let segs = server.segments("s").await;
    assert_eq!(first.segment_id, segs[0].id);
    assert_eq!(
        first.summary.map(|s| s.provider),
        Some("extractive".to_owned())
    );
}

#[tokio::test]
async fn the_oldest_items_are_dropped_first_to_fit_the_budget() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 2).await;
    server
        .append(
            "s",
            &[
                "Alpha topic sentence about databases.",
                "Beta topic sentence about databases.",
                "gamma",
                "delta",
                "epsilon",
            ],
        )
        .await;
    wait_summarised(&server, "s", 2).await;
    let full = server.context("s", 0).await;
    assert_eq!(full.items.len(), 3);
    let total = full.estimated_tokens;

    // A budget one token short of everything drops the oldest item only.
    let cut = server.context("s", total - 1).await;
    assert!(cut.truncated);
    assert_eq!(shape(&cut), shape(&full)[1..].to_vec());
    assert!(cut.estimated_tokens < total);

    // Exactly enough keeps everything.
    let exact = server.context("s", total).await;
    assert!(!exact.truncated);
    assert_eq!(exact.items.len(), 3);

    // A budget smaller than the newest item returns nothing, truncated.
    let tiny = server.context("s", 1).await;
    assert!(tiny.truncated);
    assert!(tiny.items.is_empty());
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

//! ListEntries: the transcript read back page by page, summarised or not,
//! within the message limit, for its own tenant only; and `archivist
//! session entries`, which reads it from a terminal.

use std::time::Duration;

use archivist::pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::harness::{TestServer, entry, eventually, reason, state};
use crate::operator::archivist;
use crate::security::{TOKEN_A, TOKEN_B, client, tenants};

fn request(session: &str, after_seq: u64, page_size: u32) -> pb::ListEntriesRequest {
    pb::ListEntriesRequest {
        session_id: session.to_owned(),
        after_seq,
        page_size,
    }
}

async fn page(
    client: &mut archivist::client::Client,
    session: &str,
    after_seq: u64,
    page_size: u32,
) -> pb::ListEntriesResponse {
    client
        .list_entries(request(session, after_seq, page_size))
        .await
        .expect("list entries")
        .into_inner()
}

/// Every entry after `after_seq`, following next_after_seq; with each
/// page's count of entries and encoded size.
async fn all_pages(
    client: &mut archivist::client::Client,
    session: &str,
    after_seq: u64,
    page_size: u32,
) -> (Vec<pb::Entry>, Vec<(usize, usize)>) {
    use prost::Message;
    let (mut entries, mut sizes) = (Vec::new(), Vec::new());
    let mut after = after_seq;
    loop {
        let resp = page(client, session, after, page_size).await;
        sizes.push((resp.entries.len(), resp.encoded_len()));
        if resp.next_after_seq != 0 {
            let last = resp.entries.last().map(|e| e.seq);
            assert_eq!(Some(resp.next_after_seq), last, "next is the last sent");
        }
        entries.extend(resp.entries);
        if resp.next_after_seq == 0 {
            return (entries, sizes);
        }
        after = resp.next_after_seq;
    }
}

fn texts(entries: &[pb::Entry]) -> Vec<String> {
    entries.iter().map(|e| e.content.clone()).collect()
}

fn seqs(entries: &[pb::Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn the_transcript_comes_back_in_pages_oldest_first_even_once_summarised() {
    // Segments of three: seqs 1-9 are summarised, 10 stays open.
    let server = TestServer::start_with(|c| c.segment.max_entries = 3).await;
    let mut client = server.client.clone();
    let said: Vec<String> = (1..=10)
        .map(|i| format!("Fact {i}: the deploy key of region {i} is K-{}.", i * 7))
        .collect();
    for text in &said[..9] {
        server.append("s", &[text]).await;
    }
    // The last with an idempotency key, from the assistant.
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: "s".into(),
            entries: vec![pb::NewEntry {
                client_entry_id: "k-10".into(),
                role: pb::Role::Assistant.into(),
                content: said[9].clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("append");
    let summarised = eventually(Duration::from_secs(20), || async {
        let segments = server.segments("s").await;
        segments.len() == 4
            && segments[..3]
                .iter()
                .all(|s| state(s) == pb::SegmentState::Summarised)
    })
    .await;
    assert!(summarised, "{:?}", server.segments("s").await);

    // Pages of four: 1-4, 5-8, 9-10; each says where the next starts.
    let first = page(&mut client, "s", 0, 4).await;
    assert_eq!(seqs(&first.entries), [1, 2, 3, 4]);
    assert_eq!(first.next_after_seq, 4);
    let second = page(&mut client, "s", 4, 4).await;
    assert_eq!(seqs(&second.entries), [5, 6, 7, 8]);
    assert_eq!(second.next_after_seq, 8);
    let last = page(&mut client, "s", 8, 4).await;
    assert_eq!(seqs(&last.entries), [9, 10]);
    assert_eq!(last.next_after_seq, 0, "no more");
    // Exactly a page's worth left: the page is full and says no more.
    let exact = page(&mut client, "s", 6, 4).await;
    assert_eq!(seqs(&exact.entries), [7, 8, 9, 10]);
    assert_eq!(exact.next_after_seq, 0);

    // The raw text of every entry, the summarised ones included, in order.
    let (all, sizes) = all_pages(&mut client, "s", 0, 3).await;
    assert_eq!(texts(&all), said);
    let counts: Vec<usize> = sizes.iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, [3, 3, 3, 1]);
    let tenth = &all[9];
    assert_eq!(tenth.role, pb::Role::Assistant as i32);
    assert_eq!(tenth.client_entry_id, "k-10");
    assert!(all.iter().all(|e| e.created_at.is_some()));
    assert!(all[..9].iter().all(|e| e.role == pb::Role::User as i32));

    // From the middle (the default page size), and past the end.
    let middle = page(&mut client, "s", 5, 0).await;
    assert_eq!(texts(&middle.entries), said[5..]);
    assert_eq!(middle.next_after_seq, 0);
    for after in [10, 11, u64::MAX] {
        let past = page(&mut client, "s", after, 0).await;
        assert!(past.entries.is_empty(), "after {after}: {past:?}");
        assert_eq!(past.next_after_seq, 0);
    }
}

#[tokio::test]
async fn page_sizes_default_to_100_and_stop_at_1000() {
    let server = TestServer::start_with(|c| c.segment.max_entries = 10_000).await;
    let mut client = server.client.clone();
    let texts_in = |from: usize, to: usize| -> Vec<String> {
        (from..to).map(|i| format!("line {i}")).collect()
    };
    for chunk in texts_in(0, 1200).chunks(600) {
        client
            .append_entries(pb::AppendEntriesRequest {
                session_id: "long".into(),
                entries: chunk.iter().map(|t| entry(t)).collect(),
                ..Default::default()
            })
            .await
            .expect("append");
    }
    let default = page(&mut client, "long", 0, 0).await;
    assert_eq!(texts(&default.entries), texts_in(0, 100));
    assert_eq!(default.next_after_seq, 100);
    let capped = page(&mut client, "long", 0, 5000).await;
    assert_eq!(texts(&capped.entries), texts_in(0, 1000));
    assert_eq!(capped.next_after_seq, 1000);
    let rest = page(&mut client, "long", 1000, 5000).await;
    assert_eq!(texts(&rest.entries), texts_in(1000, 1200));
    assert_eq!(rest.next_after_seq, 0);
}

#[tokio::test]
async fn a_page_is_cut_to_the_message_limit_and_says_where_to_go_on() {
    let server = TestServer::start_with(|c| {
        c.limits.max_message_bytes = 16 * 1024;
        c.limits.max_content_bytes = 4 * 1024;
        c.segment.max_entries = 4;
    })
    .await;
    let mut client = server.client.clone();
    let said: Vec<String> = (0..30)
        .map(|i| format!("{i:02} {}", "x".repeat(3000)))
        .collect();
    for text in &said {
        server.append("big", &[text]).await;
    }
    let first = page(&mut client, "big", 0, 100).await;
    let n = first.entries.len();
    assert!((1..30).contains(&n), "cut short: {n}");
    assert_eq!(
        first.next_after_seq, n as u64,
        "goes on after the last sent"
    );
    let (all, sizes) = all_pages(&mut client, "big", 0, 100).await;
    assert_eq!(texts(&all), said, "every entry, once, in order");
    assert!(sizes.len() > 2, "{sizes:?}");
    assert!(
        sizes.iter().all(|(_, bytes)| *bytes <= 16 * 1024),
        "every page within the limit: {sizes:?}"
    );
}

#[tokio::test]
async fn another_tenants_missing_and_erased_sessions_are_not_found() {
    let server = TestServer::start_with(tenants).await;
    let mut a = client(&server, Some(TOKEN_A)).await;
    let mut b = client(&server, Some(TOKEN_B)).await;
    a.append_entries(crate::harness::append_request(
        "shared",
        &["a's secret plan"],
    ))
    .await
    .expect("append");

    let not_found = |status: tonic::Status| {
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_eq!(reason(&status), "SESSION_NOT_FOUND", "{status:?}");
    };
    not_found(
        b.list_entries(request("shared", 0, 0))
            .await
            .expect_err("another tenant's"),
    );
    not_found(
        a.list_entries(request("nosuch", 0, 0))
            .await
            .expect_err("missing"),
    );

    // B's own session of the same name holds only B's entries.
    b.append_entries(crate::harness::append_request("shared", &["b's own"]))
        .await
        .expect("append");
    assert_eq!(
        texts(&page(&mut b, "shared", 0, 0).await.entries),
        ["b's own"]
    );
    assert_eq!(
        texts(&page(&mut a, "shared", 0, 0).await.entries),
        ["a's secret plan"]
    );

    // Erased: not found, and a new session of that name starts afresh.
    a.delete_session(pb::DeleteSessionRequest {
        session_id: "shared".into(),
    })
    .await
    .expect("delete");
    not_found(
        a.list_entries(request("shared", 0, 0))
            .await
            .expect_err("erased"),
    );
    assert_eq!(
        texts(&page(&mut b, "shared", 0, 0).await.entries),
        ["b's own"],
        "B's is untouched"
    );
    a.append_entries(crate::harness::append_request("shared", &["a again"]))
        .await
        .expect("append");
    let fresh = page(&mut a, "shared", 0, 0).await;
    assert_eq!(texts(&fresh.entries), ["a again"]);
    assert_eq!(fresh.entries[0].seq, 1);
}

#[tokio::test]
async fn a_bad_session_id_is_invalid_argument_naming_the_field() {
    let server = TestServer::start().await;
    let mut client = server.client.clone();
    let too_long = "s".repeat(129);
    for bad in ["", "has space", "slash/no", too_long.as_str()] {
        let status = client
            .list_entries(request(bad, 0, 0))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
        assert_eq!(reason(&status), "INVALID_SESSION_ID");
        let details = status.get_error_details();
        let violations = &details.bad_request().expect("bad request").field_violations;
        assert_eq!(violations[0].field, "session_id");
    }
}

#[tokio::test]
async fn the_terminal_client_prints_the_transcript_through_every_page() {
    // Small messages, so the transcript takes several pages.
    let server = TestServer::start_with(|c| {
        c.limits.max_message_bytes = 8 * 1024;
        c.segment.max_entries = 5;
    })
    .await;
    let address = format!("http://{}", server.addr);
    let said: Vec<String> = (1..=40)
        .map(|i| format!("turn {i} {}", "y".repeat(900)))
        .collect();
    for text in &said {
        server.append("demo", &[text]).await;
    }
    let run = |args: &[&str]| {
        let mut all = vec!["session", "--server", address.as_str(), "entries"];
        all.extend_from_slice(args);
        all.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>()
    };
    let cli = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        archivist(&args, &[], None).await
    };

    let ran = cli(run(&["demo"])).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let want: Vec<String> = said
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{} user: {t}", i + 1))
        .collect();
    assert_eq!(ran.stdout.lines().collect::<Vec<_>>(), want);

    let ran = cli(run(&["demo", "--after", "10", "--limit", "5"])).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.stdout.lines().collect::<Vec<_>>(), want[10..15]);

    // One JSON object per line, every field of the entry.
    let ran = cli(run(&["demo", "--after", "35", "--json"])).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let objects: Vec<serde_json::Value> = ran
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    assert_eq!(objects.len(), 5);
    for (object, i) in objects.iter().zip(36..) {
        assert_eq!(object["seq"], i);
        assert_eq!(object["role"], "ROLE_USER");
        assert_eq!(object["content"], said[i as usize - 1]);
        assert_eq!(object["client_entry_id"], "");
        assert!(object["created_at"].as_str().is_some(), "{object}");
    }

    // Past the end: nothing printed, said on standard error; exit 0.
    let ran = cli(run(&["demo", "--after", "40"])).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("no entries after seq 40"),
        "{}",
        ran.stderr
    );

    // A missing session is NOT_FOUND (exit 1); --limit 0 is a usage error.
    let ran = cli(run(&["nosuch"])).await;
    assert_eq!(ran.code, 1, "{}", ran.stdout);
    assert!(ran.stderr.contains("SESSION_NOT_FOUND"), "{}", ran.stderr);
    let ran = cli(run(&["demo", "--limit", "0"])).await;
    assert_eq!(ran.code, 64, "{}", ran.stderr);
}

//! `--history DAYS`: the recall fixture imported as a history that
//! happened, against the real `archivist` binary over gRPC.
//!
//! Each session of `--sizes` is loaded twice into one server: once live
//! (as the GetContext bench does: no time, no name, so every entry is said
//! now) and once as an import, each entry with its `occurred_at` spread
//! over `DAYS` days from Monday 13 November 2023 (09:00 to 21:00 each day,
//! evenly) and a speaker's `name` (the user is Maya, the assistant Tom).
//! A fact's update falls on a later day than the fact where the fixture
//! puts it far enough on, as a correction told on another day is.
//!
//! What it reads:
//! - GetContext of both at every budget: facts returned and stale values,
//!   scored as the GetContext bench scores them (the imported recaps are
//!   cut at each day and carry dated speaker labels; the live ones carry
//!   today's date).
//! - Search, in the imported session only: each fact's question asked of
//!   the day it was said (`after` / `before` that day) and of the speaker
//!   who said it (`roles`, one per name here): "what did Maya say on
//!   Monday about her locker code"; relevant is the value said that day
//!   (the first value on the fact's day, the update's on the update's).
//!   Then each changed fact's question over the whole history: corrected
//!   when the update ranks above the value it replaced.

use std::time::Duration;

use archivist::pb;

use super::fixture::{self, Session, Speaker};
use super::score::{Returned, Source};
use super::{Options, common};

/// Monday 13 November 2023, 00:00 UTC.
const FIRST_DAY: i64 = 1_699_833_600;
const DAY: i64 = 86_400;
/// Each day's entries are said between 09:00 and 21:00.
const DAY_STARTS: i64 = 9 * 3600;
const DAY_LENGTH: i64 = 12 * 3600;
const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
/// Hits asked of each day's search.
const LIMIT: u32 = 5;

/// The day (from 0) on which entry `index` of `entries` is said.
fn day_of(index: usize, entries: usize, days: usize) -> usize {
    index * days / entries
}

/// When entry `index` of `entries` is said, in seconds since the epoch.
pub fn said_at(index: usize, entries: usize, days: usize) -> i64 {
    let day = day_of(index, entries, days);
    // The day's first and last index: those whose day is `day`.
    let first = (day * entries).div_ceil(days);
    let next = ((day + 1) * entries).div_ceil(days);
    let step = DAY_LENGTH / (next - first).max(1) as i64;
    FIRST_DAY + day as i64 * DAY + DAY_STARTS + (index - first) as i64 * step
}

/// Who says an entry, by name.
pub fn name_of(speaker: Speaker) -> &'static str {
    match speaker {
        Speaker::User => "Maya",
        Speaker::Assistant => "Tom",
    }
}

fn role_of(speaker: Speaker) -> pb::Role {
    match speaker {
        Speaker::User => pb::Role::User,
        Speaker::Assistant => pb::Role::Assistant,
    }
}

/// The session's entries from `from`, as an import sends them.
fn imported(session: &Session, from: usize, to: usize, days: usize) -> Vec<pb::NewEntry> {
    let n = session.entries.len();
    (from..to)
        .map(|i| {
            let m = &session.entries[i];
            pb::NewEntry {
                role: role_of(m.speaker).into(),
                content: m.content.clone(),
                name: name_of(m.speaker).to_owned(),
                occurred_at: Some(prost_types::Timestamp {
                    seconds: said_at(i, n, days),
                    nanos: 0,
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// One day question's outcome.
struct Asked {
    fact: usize,
    day: usize,
    speaker: Speaker,
    query: &'static str,
    answer: String,
    /// The first LIMIT hits: whether each holds the answer.
    found: bool,
    first: Option<String>,
}

/// What one size's imported sessions gave.
#[derive(Default)]
struct SearchTally {
    asked: usize,
    found: usize,
    updates_asked: usize,
    updates_found: usize,
    changed: usize,
    corrected: usize,
    misses: Vec<String>,
}

pub async fn run(o: &Options, days: usize) {
    for &size in &o.sizes {
        check_schedule(size, days);
    }
    let path = std::path::PathBuf::from(env!("CARGO_BIN_EXE_archivist"));
    println!(
        "Recall of an imported history: {} session(s) per size (seed {}), {days} days from Mon 13 Nov 2023, speakers Maya (user) and Tom (assistant); the same sessions appended live beside them.",
        o.sessions, o.seed
    );
    for &size in &o.sizes {
        let server = common::start_server(&path, &[], &[]).await;
        let live: Vec<Session> = (0..o.sessions)
            .map(|k| {
                fixture::generate(
                    &format!("live-{size}-{k}"),
                    size,
                    fixture::session_seed(o.seed, size, k),
                )
            })
            .collect();
        let history: Vec<Session> = live
            .iter()
            .map(|s| Session {
                id: s.id.replacen("live", "history", 1),
                seed: s.seed,
                entries: s.entries.clone(),
                facts: s.facts.clone(),
            })
            .collect();
        let mut client = archivist::client::connect(&server.address)
            .await
            .expect("connect");
        eprintln!("[history] {size}: loading {} sessions twice", o.sessions);
        for (sessions, dated) in [(&live, false), (&history, true)] {
            for s in sessions {
                for chunk in (0..s.entries.len()).step_by(super::BATCH) {
                    let end = (chunk + super::BATCH).min(s.entries.len());
                    let entries = match dated {
                        true => imported(s, chunk, end, days),
                        false => super::new_entries(&s.entries[chunk..end]),
                    };
                    let request = pb::AppendEntriesRequest {
                        session_id: s.id.clone(),
                        entries,
                        ..Default::default()
                    };
                    client.append_entries(request).await.expect("append");
                }
            }
        }
        let (took, settled) = super::settle(&mut client, o.wait).await;
        eprintln!(
            "[history] {size}: recaps written in {:.1} s{}",
            took.as_secs_f64(),
            if settled { "" } else { " (gave up waiting)" }
        );
        println!();
        println!(
            "{size} entries: GetContext, facts returned / stale (of changed) over the sessions"
        );
        println!("  {:>6} {:>16} {:>16}", "budget", "live", "imported");
        for &budget in &o.budgets {
            let a = super::measure(&server, "live", size, budget, &live, 1).await;
            let b = super::measure(&server, "history", size, budget, &history, 1).await;
            let cell = |c: &super::Cell| {
                let returned: usize = c.context.iter().map(|r| r.tally.returned).sum();
                let stale: usize = c.context.iter().map(|r| r.tally.stale).sum();
                let updated: usize = c.context.iter().map(|r| r.tally.updated).sum();
                let facts: usize = c.context.iter().map(|r| r.tally.facts).sum();
                format!(
                    "{:>5.1} % {stale:>2}/{updated:<2}",
                    100.0 * returned as f64 / facts.max(1) as f64
                )
            };
            println!("  {budget:>6} {:>16} {:>16}", cell(&a), cell(&b));
        }
        let mut tally = SearchTally::default();
        let mut asked = Vec::new();
        for s in &history {
            ask_by_day(&mut client, s, days, &mut tally, &mut asked).await;
        }
        println!(
            "{size} entries: Search of the imported sessions: by day and speaker @{LIMIT} {}/{} ({:.1} %), of them corrections on their own day {}/{}; corrected first over the whole history {}/{}",
            tally.found,
            tally.asked,
            100.0 * tally.found as f64 / tally.asked.max(1) as f64,
            tally.updates_found,
            tally.updates_asked,
            tally.corrected,
            tally.changed
        );
        if o.facts {
            for a in asked.iter().filter(|a| !a.found) {
                println!(
                    "  missed: fact {} on {} ({:?}) {:?} → {:?}; first hit {:?}",
                    a.fact,
                    WEEKDAYS[a.day % 7],
                    a.speaker,
                    a.query,
                    a.answer,
                    a.first
                );
            }
            for m in &tally.misses {
                println!("  not corrected first: {m}");
            }
        }
        drop(server);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each fact's question on the day (and of the speaker) it was said, and
/// its update's; then the changed facts over the whole history.
async fn ask_by_day(
    client: &mut archivist::client::Client,
    session: &Session,
    days: usize,
    tally: &mut SearchTally,
    asked: &mut Vec<Asked>,
) {
    let n = session.entries.len();
    for (k, fact) in session.facts.iter().enumerate() {
        let mut said = vec![(fact.seq, fact.answer.clone(), false)];
        if let Some(u) = &fact.update {
            said.push((u.seq, u.answer.clone(), true));
        }
        for (seq, answer, is_update) in said {
            let index = seq as usize - 1;
            let day = day_of(index, n, days);
            let speaker = session.entries[index].speaker;
            let start = FIRST_DAY + day as i64 * DAY;
            let hits = client
                .search(pb::SearchRequest {
                    query: fact.question.to_owned(),
                    session_ids: vec![session.id.clone()],
                    after: Some(prost_types::Timestamp {
                        seconds: start - 1,
                        nanos: 0,
                    }),
                    before: Some(prost_types::Timestamp {
                        seconds: start + DAY,
                        nanos: 0,
                    }),
                    roles: vec![role_of(speaker).into()],
                    levels: vec![0],
                    limit: LIMIT,
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().hits)
                .unwrap_or_default();
            let found = hits
                .iter()
                .any(|h| Returned::new(Source::Entry(h.first_seq), h.text.clone()).holds(&answer));
            tally.asked += 1;
            tally.found += usize::from(found);
            if is_update {
                tally.updates_asked += 1;
                tally.updates_found += usize::from(found);
            }
            asked.push(Asked {
                fact: k,
                day,
                speaker,
                query: fact.question,
                answer,
                found,
                first: hits.first().map(|h| h.text.clone()),
            });
        }
        if fact.update.is_some() {
            tally.changed += 1;
            let hits = client
                .search(pb::SearchRequest {
                    query: fact.question.to_owned(),
                    session_ids: vec![session.id.clone()],
                    limit: 10,
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().hits)
                .unwrap_or_default();
            let place = |value: &str| {
                hits.iter().position(|h| {
                    Returned::new(Source::Entry(h.first_seq), h.text.clone()).holds(value)
                })
            };
            let (now, old) = (place(fact.current()), place(&fact.answer));
            let first = matches!((now, old), (Some(a), Some(b)) if a < b)
                || matches!((now, old), (Some(_), None));
            if first {
                tally.corrected += 1;
            } else {
                tally.misses.push(format!(
                    "{}: {:?} now at {now:?}, old at {old:?}",
                    session.id, fact.question
                ));
            }
        }
    }
}

/// Checks the schedule: times never go backwards, each day's entries fall
/// within it, and every day gets some.
pub fn check_schedule(entries: usize, days: usize) {
    let mut last = i64::MIN;
    for i in 0..entries {
        let at = said_at(i, entries, days);
        assert!(at >= last, "entry {i} goes back in time");
        let day = day_of(i, entries, days) as i64;
        assert!(at >= FIRST_DAY + day * DAY + DAY_STARTS);
        assert!(at < FIRST_DAY + day * DAY + DAY_STARTS + DAY_LENGTH);
        last = at;
    }
    assert_eq!(day_of(entries - 1, entries, days), days - 1);
}

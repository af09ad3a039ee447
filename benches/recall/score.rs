//! What came back, scored against the planted facts: the same rules for
//! every reader of the memory (GetContext's cover, raw truncation, and a
//! search's hits later), so their figures sit in one table. A reader's
//! items are `Returned`s (text and where it came from); `score` looks for
//! every fact in one reading, `outcome` for one fact in its own.
//!
//! - A fact is **returned** when its current answer occurs in the text of
//!   any item returned (case-insensitive: a recap may capitalise a code
//!   differently).
//! - A fact is **stale** when it changed, its old value occurs in what was
//!   returned and its current value does not: a reader would answer with
//!   the old value.
//! - Where the answer was found says why: in a raw entry, or in a summary
//!   of some level (the coarsest that holds it is not the point: the first
//!   found is reported, oldest first).

use super::fixture::{Fact, Message};

/// Where an item returned came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A raw entry, at its seq.
    Entry(u64),
    /// A summary of a node of this level (1: a segment's recap).
    Summary(u32),
}

/// One item a reader returned, with its text lowercased once.
pub struct Returned {
    pub source: Source,
    pub text: String,
    lower: String,
}

impl Returned {
    pub fn new(source: Source, text: String) -> Returned {
        let lower = text.to_lowercase();
        Returned {
            source,
            text,
            lower,
        }
    }

    pub fn holds(&self, answer: &str) -> bool {
        self.lower.contains(&answer.to_lowercase())
    }
}

/// How one fact fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its current answer came back, first found in this item.
    Returned(Source),
    /// Only its old value came back.
    Stale,
    Missing,
}

/// The facts' outcomes against one reading (a cover: every fact is looked
/// for in the same items), in the facts' order.
pub fn score(facts: &[Fact], items: &[Returned]) -> Vec<Outcome> {
    facts.iter().map(|fact| outcome(fact, items)).collect()
}

/// How `fact` fared in `items`. A reader that answers each question on
/// its own (a search for `fact.question` or `fact.paraphrase`) scores
/// each fact against its own hits with this, and tallies the outcomes as a
/// cover's are.
pub fn outcome(fact: &Fact, items: &[Returned]) -> Outcome {
    if let Some(item) = items.iter().find(|i| i.holds(fact.current())) {
        return Outcome::Returned(item.source);
    }
    match fact.stale() {
        Some(old) if items.iter().any(|i| i.holds(old)) => Outcome::Stale,
        _ => Outcome::Missing,
    }
}

/// Counts of a scored reading.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub facts: usize,
    pub returned: usize,
    pub stale: usize,
    /// Facts that changed (what `stale` is out of).
    pub updated: usize,
}

pub fn tally(facts: &[Fact], outcomes: &[Outcome]) -> Tally {
    Tally {
        facts: facts.len(),
        returned: outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Returned(_)))
            .count(),
        stale: outcomes.iter().filter(|o| **o == Outcome::Stale).count(),
        updated: facts.iter().filter(|f| f.update.is_some()).count(),
    }
}

/// archivist's estimate of an entry's tokens, ceil(bytes / 4) + 4, kept
/// here rather than taken from the library so that the bench measures any
/// build by one rule.
pub fn tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4) + 4
}

/// Raw truncation: the newest entries whose estimated tokens fit `budget`,
/// as items (what a host keeping a plain window would send).
pub fn newest_within(entries: &[Message], budget: u64) -> Vec<Returned> {
    let mut left = budget;
    let mut out = Vec::new();
    for (i, m) in entries.iter().enumerate().rev() {
        let t = tokens(&m.content);
        if t > left {
            break;
        }
        left -= t;
        out.push(Returned::new(
            Source::Entry(i as u64 + 1),
            m.content.clone(),
        ));
    }
    out.reverse();
    out
}

/// How many of the newest `n` entries came back verbatim as raw entries
/// (same seq, same content).
pub fn newest_verbatim(entries: &[Message], items: &[Returned], n: usize) -> usize {
    let first = entries.len().saturating_sub(n);
    (first..entries.len())
        .filter(|&i| {
            let seq = i as u64 + 1;
            items
                .iter()
                .any(|r| r.source == Source::Entry(seq) && r.text == entries[i].content)
        })
        .count()
}

pub fn mean(xs: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = xs
        .into_iter()
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

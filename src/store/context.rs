//! GetContext's rule, the same for every backend: a **cover** of the
//! session, oldest first, built from the memory tree.
//!
//! - **The recent window.** The newest entries come raw, closed segment or
//!   not, up to `recent` tokens (by default a quarter of the budget): a
//!   host that has just closed a segment still sees its last turns.
//! - **The coarsest cover** of what is older: the session's roots (the
//!   nodes no roll-up covers yet), each as its summary; a node without a
//!   summary stands as its children, down to a level-1 segment's raw
//!   entries: never a hole. A node that lies wholly inside the window is
//!   left out; the one node that reaches into it from before stays as it
//!   is (its summary then also covers the window's oldest entries, the
//!   only overlap a cover has) until it is zoomed into.
//! - **Zooming in spends the budget.** While the cover fits, nodes are
//!   replaced by their children, level by level from the top and newest
//!   first within a level, down to the raw entries of closed segments:
//!   every node that fits is zoomed, so a large budget returns raw
//!   history and a small one recaps of every part of it.
//! - **Truncation** happens only when even the coarsest cover does not
//!   fit: the newest history is kept in the finest detail that fits (a node
//!   too large is replaced by its children, a level-1 recap by its newest
//!   raw entries), and the older history is dropped (`truncated`).
//! - **Nothing fits**: a budget too small for the newest entry is refused
//!   (`StoreError::BudgetTooSmall`, naming the smallest budget that
//!   returns something), never answered with an empty cover.
//!
//! Every limit is two: the estimated tokens asked for, and the bytes the
//! answer may carry on the wire (the server's message limit), so that no
//! cover is ever too large to send.
//!
//! A backend supplies the tree (`Tree`); the cost of a call follows the
//! budget and the number of roots, never the session's length: entries are
//! read newest first and only as far as they are returned.

use crate::model::{Context, ContextItem, Entry, Segment, SegmentState, estimate_tokens};
use crate::store::StoreError;

/// What a backend gives the cover.
pub(super) trait Tree {
    /// Up to `limit` of the session's roots (nodes no roll-up covers yet)
    /// that start before the seq `before`, newest first.
    fn roots_before(&mut self, before: u64, limit: u32) -> Result<Vec<Segment>, StoreError>;
    /// A roll-up's children, oldest first.
    fn children(&mut self, node: &Segment) -> Result<Vec<Segment>, StoreError>;
    /// The session's entries with seqs `first..=last`, newest first, until
    /// `visit` says stop.
    fn entries(
        &mut self,
        first: u64,
        last: u64,
        visit: &mut dyn FnMut(Entry) -> bool,
    ) -> Result<(), StoreError>;
}

/// What one GetContext may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Estimated tokens; 0: no limit.
    pub max_tokens: u32,
    /// Bytes the answer may carry on the wire.
    pub max_bytes: usize,
    /// Estimated tokens of the recent window; 0: a quarter of `max_tokens`.
    pub recent_tokens: u32,
}

impl Budget {
    /// No limit but the bytes: every entry raw.
    pub fn bytes(max_bytes: usize) -> Budget {
        Budget {
            max_tokens: 0,
            max_bytes,
            recent_tokens: 0,
        }
    }
}

/// Roots one read of the cover fetches.
const ROOT_PAGE: u32 = 16;

/// What an item costs on the wire beyond its texts, at most: ids, seqs,
/// role, timestamps, counts and the framing of each message.
pub(super) const ITEM_OVERHEAD_BYTES: u64 = 128;

/// What a part of a cover costs: estimated tokens, and bytes on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cost {
    tokens: u64,
    bytes: u64,
}

impl Cost {
    fn plus(self, other: Cost) -> Cost {
        Cost {
            tokens: self.tokens.saturating_add(other.tokens),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }

    /// What is left of `self` after `spent`; None when it does not fit.
    fn minus(self, spent: Cost) -> Option<Cost> {
        Some(Cost {
            tokens: self.tokens.checked_sub(spent.tokens)?,
            bytes: self.bytes.checked_sub(spent.bytes)?,
        })
    }

    fn sum<'a>(units: impl IntoIterator<Item = &'a Unit>) -> Cost {
        units
            .into_iter()
            .map(Unit::cost)
            .fold(Cost::default(), Cost::plus)
    }
}

fn summary_cost(summary: &crate::model::Summary) -> Cost {
    Cost {
        tokens: u64::from(estimate_tokens(&summary.text)),
        bytes: ITEM_OVERHEAD_BYTES
            + (summary.text.len()
                + summary.provider.len()
                + summary.model.len()
                + summary.prompt_version.len()) as u64,
    }
}

fn entry_cost(entry: &Entry) -> Cost {
    Cost {
        tokens: u64::from(entry.tokens),
        bytes: ITEM_OVERHEAD_BYTES
            + (entry.content.len() + entry.client_entry_id.as_ref().map_or(0, String::len)) as u64,
    }
}

/// A part of a cover before its items are read: a summarised node, or
/// raw entries of a level-1 segment up to `last` (all of them, or those
/// older than the recent window).
enum Unit {
    Summary(Segment),
    Entries {
        segment: Segment,
        last: u64,
        /// Estimated tokens of those entries.
        tokens: u64,
        /// How many they are.
        count: u64,
    },
}

impl Unit {
    /// The unit's cost; for entries not read yet, a bound: an entry's
    /// estimated tokens are at least a quarter of its bytes.
    fn cost(&self) -> Cost {
        match self {
            Unit::Summary(node) => node.summary.as_ref().map_or(Cost::default(), summary_cost),
            Unit::Entries { tokens, count, .. } => Cost {
                tokens: *tokens,
                bytes: 4 * tokens + ITEM_OVERHEAD_BYTES * count,
            },
        }
    }

    /// The level of a summary; 0 for raw entries.
    fn level(&self) -> u32 {
        match self {
            Unit::Summary(node) => node.level,
            Unit::Entries { .. } => 0,
        }
    }
}

/// The newest entries, kept raw whatever else the cover holds: their
/// seqs and estimated tokens (the entries themselves go straight to the
/// output).
#[derive(Default)]
struct Window {
    /// (seq, tokens), newest first.
    entries: Vec<(u64, u64)>,
    cost: Cost,
}

impl Window {
    /// Estimated tokens and count of the window's entries in `first..=last`.
    fn within(&self, first: u64, last: u64) -> (u64, u64) {
        self.entries
            .iter()
            .filter(|(seq, _)| (first..=last).contains(seq))
            .fold((0, 0), |(t, n), (_, tokens)| (t + tokens, n + 1))
    }
}

/// The cover in the making: the window's edge, and what stands for
/// whatever is older.
struct Cover<'t, T: Tree> {
    tree: &'t mut T,
    window: Window,
    /// The window's first seq: units end before it or reach into it.
    edge: u64,
}

impl<T: Tree> Cover<'_, T> {
    /// The coarsest units standing for `node`, oldest first, appended to
    /// `out`; nothing of what lies wholly inside the window.
    fn coarsest(&mut self, node: Segment, out: &mut Vec<Unit>) -> Result<(), StoreError> {
        if node.first_seq >= self.edge {
            return Ok(());
        }
        match (node.state, &node.summary) {
            (SegmentState::Summarised, Some(_)) => out.push(Unit::Summary(node)),
            _ if node.level <= 1 => out.push(self.raw(node)),
            _ => {
                for child in self.tree.children(&node)? {
                    self.coarsest(child, out)?;
                }
            }
        }
        Ok(())
    }

    /// The coarsest units of the session, oldest first: its roots read
    /// newest first, a page at a time, and no further once what they cost
    /// is past `left` (the newest of them are all a truncated cover can
    /// hold), so that the read follows the budget even when thousands of
    /// segments still wait for their recaps.
    fn coarsest_roots(&mut self, left: Cost) -> Result<Vec<Unit>, StoreError> {
        let mut newest_first: Vec<Vec<Unit>> = Vec::new();
        let mut cost = Cost::default();
        let mut before = u64::MAX;
        loop {
            let page = self.tree.roots_before(before, ROOT_PAGE)?;
            let full = page.len() == ROOT_PAGE as usize;
            for root in page {
                before = root.first_seq;
                let mut units = Vec::new();
                self.coarsest(root, &mut units)?;
                cost = cost.plus(Cost::sum(&units));
                newest_first.push(units);
                if left.minus(cost).is_none() {
                    return Ok(newest_first.into_iter().rev().flatten().collect());
                }
            }
            if !full {
                return Ok(newest_first.into_iter().rev().flatten().collect());
            }
        }
    }

    /// A level-1 segment as its raw entries older than the window.
    fn raw(&self, segment: Segment) -> Unit {
        let last = segment.last_seq.min(self.edge.saturating_sub(1));
        let (in_window, n) = self.window.within(segment.first_seq, segment.last_seq);
        Unit::Entries {
            tokens: u64::from(segment.token_estimate).saturating_sub(in_window),
            count: u64::from(segment.entry_count).saturating_sub(n),
            last,
            segment,
        }
    }

    /// What a summary gives way to: a roll-up its children's coarsest
    /// units, a level-1 recap its raw entries.
    fn finer(&mut self, node: &Segment) -> Result<Vec<Unit>, StoreError> {
        let mut out = Vec::new();
        match node.level {
            0 | 1 => out.push(self.raw(node.clone())),
            _ => {
                for child in self.tree.children(node)? {
                    self.coarsest(child, &mut out)?;
                }
            }
        }
        Ok(out)
    }

    /// Zooms into `units` (oldest first) while the cover stays within
    /// `slack` more: level by level from the top, newest first within a
    /// level, every node whose children fit.
    /// What is left of `slack` is returned.
    fn zoom(&mut self, units: &mut Vec<Unit>, mut slack: Cost) -> Result<Cost, StoreError> {
        let top = units.iter().map(Unit::level).max().unwrap_or(0);
        for level in (1..=top).rev() {
            let mut i = units.len();
            while i > 0 {
                i -= 1;
                let Unit::Summary(node) = &units[i] else {
                    continue;
                };
                if node.level != level {
                    continue;
                }
                let node = node.clone();
                let finer = self.finer(&node)?;
                let room = slack.plus(units[i].cost());
                if let Some(left) = room.minus(Cost::sum(&finer)) {
                    slack = left;
                    units.splice(i..=i, finer);
                }
            }
        }
        Ok(slack)
    }

    /// Spends what zooming left on raw entries just older than the raw end
    /// of the cover, so that the budget is used: the newest summary before
    /// that end is read back into raw entries from its end (the summary
    /// then also covers them), and once all of it is read it gives way to
    /// them, its cost refunded. Raw units at the end are emitted as they
    /// come.
    fn fill(
        &mut self,
        units: &mut Vec<Unit>,
        mut slack: Cost,
        out: &mut Output,
    ) -> Result<(), StoreError> {
        while let Some(unit) = units.last() {
            let Unit::Summary(node) = unit else {
                if let Some(unit) = units.pop() {
                    self.emit(vec![unit], out)?;
                }
                continue;
            };
            let (first, cost) = (node.first_seq, unit.cost());
            let last = out.oldest_seq().map_or(node.last_seq, |seq| {
                seq.saturating_sub(1).min(node.last_seq)
            });
            let mut reached = last < first;
            self.tree.entries(
                first,
                last,
                &mut |entry| match slack.minus(entry_cost(&entry)) {
                    Some(rest) => {
                        slack = rest;
                        reached = entry.seq == first;
                        out.push_entry(entry);
                        true
                    }
                    None => false,
                },
            )?;
            if !reached {
                return Ok(());
            }
            units.pop();
            slack = slack.plus(cost);
        }
        Ok(())
    }

    /// The newest part of `units` that fits `left`, in the finest detail
    /// that fits: a unit too large gives way to its finer units, and the
    /// first raw entry that does not fit ends the cover. Returns the
    /// fewest tokens of a unit or entry that did not fit: the smallest
    /// budget that returns something when nothing did.
    fn truncate(
        &mut self,
        mut units: Vec<Unit>,
        mut left: Cost,
        out: &mut Output,
    ) -> Result<Option<u64>, StoreError> {
        let mut smallest: Option<u64> = None;
        let mut refuse = |cost: Cost| {
            smallest = Some(smallest.map_or(cost.tokens, |s| s.min(cost.tokens)));
        };
        while let Some(unit) = units.pop() {
            match unit {
                Unit::Summary(node) => {
                    let cost = node.summary.as_ref().map_or(Cost::default(), summary_cost);
                    match left.minus(cost) {
                        Some(rest) => {
                            left = rest;
                            out.push_summary(node);
                        }
                        None => {
                            refuse(cost);
                            units.extend(self.finer(&node)?);
                        }
                    }
                }
                Unit::Entries { segment, last, .. } => {
                    let mut full = false;
                    self.tree.entries(segment.first_seq, last, &mut |entry| {
                        let cost = entry_cost(&entry);
                        match left.minus(cost) {
                            Some(rest) => {
                                left = rest;
                                out.push_entry(entry);
                                true
                            }
                            None => {
                                refuse(cost);
                                full = true;
                                false
                            }
                        }
                    })?;
                    if full {
                        break;
                    }
                }
            }
        }
        Ok(smallest)
    }

    /// Every unit's items, newest first, into `out`.
    fn emit(&mut self, units: Vec<Unit>, out: &mut Output) -> Result<(), StoreError> {
        for unit in units.into_iter().rev() {
            match unit {
                Unit::Summary(node) => out.push_summary(node),
                Unit::Entries { segment, last, .. } => {
                    self.tree.entries(segment.first_seq, last, &mut |entry| {
                        out.push_entry(entry);
                        true
                    })?
                }
            }
        }
        Ok(())
    }
}

/// The cover of the session `tree` reads, within `budget`.
pub(super) fn cover(tree: &mut impl Tree, budget: Budget) -> Result<Context, StoreError> {
    let limit = Cost {
        tokens: match budget.max_tokens {
            0 => u64::MAX,
            n => u64::from(n),
        },
        bytes: budget.max_bytes as u64,
    };
    let recent = match (budget.recent_tokens, budget.max_tokens) {
        (0, 0) => u64::MAX,
        (0, n) => u64::from(n / 4),
        (r, _) => u64::from(r),
    };
    let Some(newest) = tree.roots_before(u64::MAX, 1)?.pop() else {
        return Ok(Output::default().finish());
    };
    let session_last = newest.last_seq;

    // The window: the newest entries that fit its share.
    // The window's share of the bytes is its share of the tokens, so that
    // a budget larger than the message limit cannot let it crowd out the
    // older history.
    let window_limit = Cost {
        tokens: recent.min(limit.tokens),
        bytes: match budget.max_tokens {
            0 => limit.bytes,
            n => {
                (u128::from(limit.bytes) * u128::from(recent.min(u64::from(n))) / u128::from(n))
                    as u64
            }
        },
    };
    let mut window = Window::default();
    let mut out = Output::default();
    tree.entries(1, session_last, &mut |entry| {
        let cost = entry_cost(&entry);
        match window_limit.minus(window.cost.plus(cost)) {
            Some(_) => {
                window.cost = window.cost.plus(cost);
                window.entries.push((entry.seq, cost.tokens));
                out.push_entry(entry);
                true
            }
            None => false,
        }
    })?;
    let edge = out.oldest_seq().unwrap_or(session_last.saturating_add(1));
    let window_cost = window.cost;
    let mut c = Cover { tree, window, edge };
    let left = limit.minus(window_cost).unwrap_or_default();
    let mut units = c.coarsest_roots(left)?;
    match left.minus(Cost::sum(&units)) {
        Some(slack) => {
            let slack = c.zoom(&mut units, slack)?;
            c.fill(&mut units, slack, &mut out)?;
            c.emit(units, &mut out)?;
        }
        None => {
            let smallest = c.truncate(units, left, &mut out)?;
            if let (true, Some(needed)) = (out.items.is_empty(), smallest) {
                // Not even the newest item fits: say what would.
                return Err(StoreError::BudgetTooSmall {
                    needed: u32::try_from(needed).unwrap_or(u32::MAX),
                });
            }
        }
    }
    Ok(out.finish())
}

/// A cover being built from its newest item back.
#[derive(Default)]
struct Output {
    items: Vec<ContextItem>,
    tokens: u64,
}

impl Output {
    fn push_summary(&mut self, node: Segment) {
        let Some(summary) = node.summary else {
            return;
        };
        let item = ContextItem::Summary {
            segment_id: node.id,
            level: node.level,
            first_seq: node.first_seq,
            last_seq: node.last_seq,
            summary,
            said: (node.first_occurred_at, node.last_occurred_at),
        };
        self.tokens += u64::from(item.tokens());
        self.items.push(item);
    }

    fn push_entry(&mut self, entry: Entry) {
        self.tokens += u64::from(entry.tokens);
        self.items.push(ContextItem::Entry(entry));
    }

    /// The first seq of the oldest item so far.
    fn oldest_seq(&self) -> Option<u64> {
        self.items.last().map(|item| match item {
            ContextItem::Summary { first_seq, .. } => *first_seq,
            ContextItem::Entry(entry) => entry.seq,
            // A cover holds none; what it recalls comes after it is built.
            ContextItem::Recalled(hit) => hit.first_seq,
        })
    }

    /// The cover, oldest first; truncated when it does not reach back to
    /// the session's first entry.
    fn finish(mut self) -> Context {
        let truncated = self.oldest_seq().is_some_and(|seq| seq > 1);
        self.items.reverse();
        Context {
            items: self.items,
            truncated,
            tokens: u32::try_from(self.tokens).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::model::{Millis, Role, SegmentId, Summary};

    /// A tree in memory: nodes by id, entries by seq.
    #[derive(Default)]
    struct Fake {
        nodes: HashMap<SegmentId, Segment>,
        roots: Vec<SegmentId>,
        entries: BTreeMap<u64, Entry>,
        reads: usize,
    }

    fn node(id: SegmentId, level: u32, seqs: (u64, u64), summary: Option<&str>) -> Segment {
        Segment {
            id,
            session: "s".to_owned(),
            ordinal: 1,
            state: if summary.is_some() {
                SegmentState::Summarised
            } else {
                SegmentState::Pending
            },
            first_seq: seqs.0,
            last_seq: seqs.1,
            entry_count: (seqs.1 - seqs.0 + 1) as u32,
            token_estimate: 10 * (seqs.1 - seqs.0 + 1) as u32,
            summary: summary.map(|text| Summary {
                text: text.to_owned(),
                provider: "p".to_owned(),
                model: "m".to_owned(),
                prompt_version: "v".to_owned(),
                input_tokens: 0,
                output_tokens: 0,
                created_at: Millis(0),
            }),
            attempts: 0,
            passes: 0,
            last_failure: None,
            next_attempt_at: None,
            closed_at: None,
            level,
            child_ids: Vec::new(),
            first_occurred_at: None,
            last_occurred_at: None,
        }
    }

    fn entry(seq: u64, content: &str, tokens: u32) -> Entry {
        Entry {
            seq,
            client_entry_id: None,
            role: Role::User,
            content: content.to_owned(),
            created_at: Millis(0),
            tokens,
            occurred_at: Millis(0),
            name: None,
            metadata: Default::default(),
        }
    }

    impl Fake {
        /// Eight level-1 segments of two entries of 10 tokens (seqs 1..=16),
        /// rolled up by fours into two level-2 nodes, rolled up into one
        /// level-3 node. Summaries of level 1 cost 8 tokens, level 2 cost
        /// 6, level 3 5.
        fn eight(summarised_l2: [bool; 2], top: bool) -> Fake {
            let mut f = Fake::default();
            for i in 0..8u64 {
                let mut n = node(i + 1, 1, (2 * i + 1, 2 * i + 2), Some("level one recap"));
                n.ordinal = i as u32 + 1;
                for seq in n.first_seq..=n.last_seq {
                    f.entries.insert(seq, entry(seq, &"x".repeat(24), 10));
                }
                f.nodes.insert(n.id, n);
            }
            for (k, done) in summarised_l2.iter().enumerate() {
                let id = 100 + k as u64;
                let mut n = node(
                    id,
                    2,
                    (8 * k as u64 + 1, 8 * k as u64 + 8),
                    done.then_some("a roll"),
                );
                n.child_ids = (1..=4).map(|c| 4 * k as u64 + c).collect();
                f.nodes.insert(id, n);
            }
            let mut t = node(200, 3, (1, 16), top.then_some("all"));
            t.child_ids = vec![100, 101];
            f.nodes.insert(200, t);
            f.roots = vec![200];
            f
        }

        /// `eight` with no level-1 segment summarised either.
        fn eight_raw() -> Fake {
            let mut f = Fake::eight([false, false], false);
            for n in f.nodes.values_mut() {
                n.summary = None;
                n.state = SegmentState::Pending;
            }
            f
        }
    }

    impl Tree for Fake {
        fn roots_before(&mut self, before: u64, limit: u32) -> Result<Vec<Segment>, StoreError> {
            let mut roots: Vec<Segment> = self
                .roots
                .iter()
                .map(|id| self.nodes[id].clone())
                .filter(|n| n.first_seq < before)
                .collect();
            roots.sort_by_key(|n| std::cmp::Reverse(n.first_seq));
            roots.truncate(limit as usize);
            self.reads += roots.len();
            Ok(roots)
        }

        fn children(&mut self, node: &Segment) -> Result<Vec<Segment>, StoreError> {
            self.reads += node.child_ids.len();
            Ok(node
                .child_ids
                .iter()
                .map(|id| self.nodes[id].clone())
                .collect())
        }

        fn entries(
            &mut self,
            first: u64,
            last: u64,
            visit: &mut dyn FnMut(Entry) -> bool,
        ) -> Result<(), StoreError> {
            for e in self.entries.range(first..=last).rev().map(|(_, e)| e) {
                self.reads += 1;
                if !visit(e.clone()) {
                    break;
                }
            }
            Ok(())
        }
    }

    fn tokens(max_tokens: u32) -> Budget {
        Budget {
            max_tokens,
            max_bytes: usize::MAX,
            recent_tokens: 0,
        }
    }

    /// (first seq, last seq, level; 0 for a raw entry) of each item.
    fn shape(ctx: &Context) -> Vec<(u64, u64, u32)> {
        ctx.items
            .iter()
            .map(|i| match i {
                ContextItem::Summary {
                    first_seq,
                    last_seq,
                    level,
                    ..
                } => (*first_seq, *last_seq, *level),
                ContextItem::Entry(e) => (e.seq, e.seq, 0),
                ContextItem::Recalled(r) => panic!("a cover recalls nothing: {r:?}"),
            })
            .collect()
    }

    /// The cover's rule of order: the items end at `to` and leave no gap;
    /// they start at 1 unless truncated; raw entries run in seq order one
    /// after another; only one summary, the last, may cover raw entries
    /// that follow it (the recent window reaching into its node).
    fn well_formed(ctx: &Context, to: u64) -> Result<(), String> {
        let items = shape(ctx);
        let Some(first) = items.first() else {
            return Err("empty".to_owned());
        };
        if (first.0 == 1) == ctx.truncated {
            return Err(format!(
                "starts at {} with truncated {}",
                first.0, ctx.truncated
            ));
        }
        let mut next = first.0;
        let mut overlapped = false;
        for (i, &(a, b, level)) in items.iter().enumerate() {
            let after_summary = i > 0 && items[i - 1].2 > 0;
            match level {
                0 if after_summary && a < next => {
                    if overlapped || a <= items[i - 1].0 {
                        return Err(format!("entry {a} overlaps badly: {items:?}"));
                    }
                    overlapped = true;
                }
                _ if a != next => {
                    return Err(format!("item {i} starts at {a}, not {next}: {items:?}"));
                }
                _ if level > 0 && overlapped => {
                    return Err(format!("a summary after the overlap: {items:?}"));
                }
                _ => {}
            }
            next = b + 1;
        }
        match next == to + 1 {
            true => Ok(()),
            false => Err(format!("ends at {}, not {to}: {items:?}", next - 1)),
        }
    }

    #[test]
    fn no_limit_returns_every_entry_raw() {
        let ctx = cover(&mut Fake::eight([true, true], true), tokens(0)).expect("cover");
        assert_eq!(shape(&ctx), (1..=16).map(|s| (s, s, 0)).collect::<Vec<_>>());
        assert!(!ctx.truncated);
        assert_eq!(ctx.tokens, 160);
    }

    #[test]
    fn the_newest_entries_come_raw_though_their_segment_is_summarised() {
        // A quarter of 80 is two entries; the level-1 recap they belong to
        // also covers them, and the rest zooms down to level-1 recaps.
        let ctx = cover(&mut Fake::eight([true, true], true), tokens(80)).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        let items = shape(&ctx);
        assert_eq!(items[items.len() - 2..], [(15, 15, 0), (16, 16, 0)]);
        assert!(items.iter().all(|i| i.2 <= 1), "{items:?}");
        assert!(ctx.tokens <= 80 && ctx.tokens + 10 > 80, "{}", ctx.tokens);
        // The window's share is a setting.
        let mut budget = tokens(80);
        budget.recent_tokens = 40;
        let ctx = cover(&mut Fake::eight([true, true], true), budget).expect("cover");
        let raw = shape(&ctx).iter().rev().take_while(|i| i.2 == 0).count();
        assert!(raw >= 4, "{:?}", shape(&ctx));
    }

    #[test]
    fn the_budget_is_spent_zooming_level_by_level_then_on_raw_entries() {
        // Every level-1 recap (8 × 8) and the window (2 entries of 10).
        let ctx = cover(&mut Fake::eight([true, true], true), tokens(90)).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        // The window holds the newest segment's two entries; the rest zooms
        // to level 1, and the newest recap that fits gives way to its
        // entries.
        let levels: Vec<u32> = shape(&ctx).iter().map(|i| i.2).collect();
        assert_eq!(levels, [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(ctx.tokens, 6 * 8 + 4 * 10);
        // Enough for all raw: all raw, not truncated.
        let ctx = cover(&mut Fake::eight([true, true], true), tokens(160)).expect("cover");
        assert_eq!(shape(&ctx).len(), 16);
        assert!(shape(&ctx).iter().all(|i| i.2 == 0));
    }

    #[test]
    fn a_node_without_a_summary_stands_as_its_children() {
        // The top and the first level-2 node failed: the coarsest cover is
        // four level-1 recaps and the second level-2 node.
        let ctx = cover(&mut Fake::eight([false, true], false), tokens(38)).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        assert_eq!(
            shape(&ctx)[..4],
            [(1, 2, 1), (3, 4, 1), (5, 6, 1), (7, 8, 1)]
        );
        // And a level-1 segment without one, as its raw entries.
        let mut f = Fake::eight([false, true], false);
        if let Some(n) = f.nodes.get_mut(&1) {
            n.summary = None;
            n.state = SegmentState::Pending;
        }
        let ctx = cover(&mut f, tokens(60)).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        assert_eq!(shape(&ctx)[..3], [(1, 1, 0), (2, 2, 0), (3, 4, 1)]);
    }

    /// Whatever the budget and whichever nodes have summaries: a cover of
    /// the rule's order within the budget, nothing left unspent that one
    /// more entry would fill, and a refusal only for a budget below the
    /// newest entry.
    #[test]
    fn every_budget_gives_a_well_formed_cover_that_spends_it() {
        // Each tree, and the cheapest of the items that end at its last
        // seq (the newest recap at some level, or the newest entry).
        let trees: [(fn() -> Fake, u32); 4] = [
            (|| Fake::eight([true, true], true), 5),
            (|| Fake::eight([false, true], false), 6),
            (|| Fake::eight([true, false], false), 8),
            (Fake::eight_raw, 10),
        ];
        for (t, (tree, smallest)) in trees.iter().enumerate() {
            for budget in 1..=200u32 {
                for recent in [0, 1, 25, 1000] {
                    let mut b = tokens(budget);
                    b.recent_tokens = recent;
                    let case = format!("tree {t}, budget {budget}, recent {recent}");
                    let ctx = match cover(&mut tree(), b) {
                        Err(StoreError::BudgetTooSmall { needed }) => {
                            assert!(budget < *smallest && needed == *smallest, "{case}");
                            continue;
                        }
                        other => other.expect("cover"),
                    };
                    assert!(budget >= *smallest, "{case}");
                    well_formed(&ctx, 16).unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert!(ctx.tokens <= budget, "{case}: {}", ctx.tokens);
                    let all_raw = ctx.items.len() == 16;
                    assert!(
                        all_raw || ctx.tokens + 10 > budget,
                        "{case}: {} unspent: {:?}",
                        budget - ctx.tokens,
                        shape(&ctx)
                    );
                }
            }
        }
    }

    #[test]
    fn a_root_too_large_gives_way_to_the_children_that_fit() {
        // The top's recap alone is larger than the budget; the level-2
        // nodes beneath it fit: they are kept, not nothing.
        let mut f = Fake::eight([true, true], true);
        if let Some(top) = f.nodes.get_mut(&200)
            && let Some(s) = top.summary.as_mut()
        {
            s.text = "y".repeat(400);
        }
        let ctx = cover(&mut f, tokens(30)).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        assert!(!ctx.truncated);
        assert_eq!(shape(&ctx)[0], (1, 8, 2));
    }

    #[test]
    fn a_budget_below_the_newest_entry_names_the_smallest_that_returns_something() {
        // An open segment after the tree, its one entry of 40 tokens.
        let with_open = || {
            let mut f = Fake::eight([true, true], true);
            let mut open = node(9, 1, (17, 17), None);
            open.token_estimate = 40;
            f.nodes.insert(9, open);
            f.roots.push(9);
            f.entries.insert(17, entry(17, "z", 40));
            f
        };
        match cover(&mut with_open(), tokens(39)) {
            Err(StoreError::BudgetTooSmall { needed }) => assert_eq!(needed, 40),
            other => panic!("{other:?}"),
        }
        let ctx = cover(&mut with_open(), tokens(40)).expect("cover");
        assert_eq!(shape(&ctx), [(17, 17, 0)]);
        assert!(ctx.truncated);
        well_formed(&ctx, 17).expect("well formed");
    }

    /// On the wire a summary carries its text, the provider, the model and
    /// the prompt version, and up to 128 bytes of framing: a byte limit of
    /// exactly that keeps it, one byte less cannot.
    #[test]
    fn a_byte_limit_counts_every_text_a_summary_carries() {
        let mut f = Fake::default();
        let mut n = node(1, 1, (1, 2), Some("a recap of twenty by"));
        if let Some(s) = n.summary.as_mut() {
            s.provider = "abc".to_owned();
            s.model = "model".to_owned();
            s.prompt_version = "v1.2.3x".to_owned();
        }
        f.nodes.insert(1, n);
        f.roots = vec![1];
        // Entries too large for the window, whose recap stands for them.
        for seq in 1..=2 {
            f.entries.insert(seq, entry(seq, &"e".repeat(400), 104));
        }
        let carried = 128 + 20 + 3 + 5 + 7;
        let budget = |bytes| Budget {
            max_tokens: 100,
            max_bytes: bytes,
            recent_tokens: 0,
        };
        let ctx = cover(&mut f, budget(carried)).expect("cover");
        assert_eq!(shape(&ctx), vec![(1, 2, 1)]);
        assert!(!ctx.truncated);
        assert!(cover(&mut f, budget(carried - 1)).is_err());
    }

    /// One level-1 segment, not summarised, of `contents` as entries of 10
    /// tokens each (seqs from 1), each with `client_id` if given.
    fn raw(contents: &[&str], client_id: Option<&str>) -> Fake {
        let mut f = Fake::default();
        let n = node(1, 1, (1, contents.len() as u64), None);
        for (content, seq) in contents.iter().zip(1..) {
            let mut e = entry(seq, content, 10);
            e.client_entry_id = client_id.map(str::to_owned);
            f.entries.insert(seq, e);
        }
        f.nodes.insert(1, n);
        f.roots = vec![1];
        f
    }

    /// On the wire an entry carries its content, its client id and up to
    /// 128 bytes of framing: a byte limit of exactly that keeps it, one
    /// byte less cannot.
    #[test]
    fn a_byte_limit_counts_an_entrys_content_and_its_client_id() {
        let carried = 128 + 24 + 8;
        let one = || raw(&[&"x".repeat(24)], Some("id-12345"));
        let ctx = cover(&mut one(), Budget::bytes(carried)).expect("cover");
        assert_eq!(shape(&ctx), vec![(1, 1, 0)]);
        assert!(cover(&mut one(), Budget::bytes(carried - 1)).is_err());
    }

    /// Whatever the byte limit, a cover never carries more than it (each
    /// entry: its content and 128 bytes of framing); one the entries fit
    /// in with room to spare is whole and not truncated.
    #[test]
    fn a_cover_of_raw_entries_never_carries_more_bytes_than_the_limit() {
        let content = "x".repeat(24);
        let contents = [content.as_str(); 2];
        for limit in 128 + 24..=700 {
            let ctx = cover(&mut raw(&contents, None), Budget::bytes(limit)).expect("cover");
            let carried = ctx.items.len() * (128 + 24);
            assert!(carried <= limit, "{limit}: {carried} bytes");
            assert_eq!(
                shape(&ctx),
                [(1, 1, 0), (2, 2, 0)][2 - ctx.items.len()..],
                "{limit}: the newest kept"
            );
            if limit >= 2 * (128 + 24) {
                assert!(ctx.items.len() == 2 && !ctx.truncated, "{limit}");
            }
        }
    }

    #[test]
    fn a_cover_reads_what_its_budget_returns_not_the_session() {
        // Nothing summarised: sixteen raw entries of 10 tokens each.
        let mut f = Fake::eight_raw();
        let ctx = cover(&mut f, tokens(35)).expect("cover");
        assert!(ctx.truncated);
        assert_eq!(shape(&ctx), vec![(14, 14, 0), (15, 15, 0), (16, 16, 0)]);
        // The window's entry and the one past it, the three kept and the
        // one that did not fit, and the tree's nodes: not all sixteen.
        assert!(f.reads <= 2 + 4 + 11, "{} reads", f.reads);
    }

    #[test]
    fn the_window_takes_its_share_of_the_bytes_not_all_of_them() {
        // Tokens for every entry raw, bytes for four entries (152 each) and
        // not much more: the window takes a quarter of the bytes (one
        // entry), and the recap of everything older still fits.
        let budget = Budget {
            max_tokens: 160,
            max_bytes: 700,
            recent_tokens: 40,
        };
        let ctx = cover(&mut Fake::eight([true, true], true), budget).expect("cover");
        well_formed(&ctx, 16).expect("well formed");
        assert!(!ctx.truncated, "{:?}", shape(&ctx));
        assert_eq!(shape(&ctx).last(), Some(&(16, 16, 0)));
    }

    /// A session whose segments all still wait for their recaps: the
    /// roots are read newest first, a page at a time, only as far as the
    /// budget reaches, not all thousand of them.
    #[test]
    fn a_long_backlog_is_read_only_as_far_as_the_budget_goes() {
        let mut f = Fake::default();
        for i in 0..1000u64 {
            let n = node(i + 1, 1, (2 * i + 1, 2 * i + 2), None);
            for seq in n.first_seq..=n.last_seq {
                f.entries.insert(seq, entry(seq, &"x".repeat(24), 10));
            }
            f.roots.push(n.id);
            f.nodes.insert(n.id, n);
        }
        let ctx = cover(&mut f, tokens(100)).expect("cover");
        assert!(ctx.truncated);
        assert_eq!(ctx.items.len(), 10);
        assert!(f.reads < 60, "{} reads", f.reads);
    }
}

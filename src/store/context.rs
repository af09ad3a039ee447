//! GetContext's rule, the same for every backend: a **cover** of the
//! session, oldest first, whose seq ranges are contiguous and never
//! overlap, built from the memory tree.
//!
//! - The coarsest cover is the session's roots (the nodes no roll-up covers
//!   yet), each as its summary; a node without a summary stands as its
//!   children, down to a level-1 segment's raw entries: never a hole.
//! - When the coarsest cover fits `max_tokens`, the newest summarised
//!   roll-up is replaced by its children (zoomed in), newest first, for as
//!   long as the cover still fits; the first that does not fit ends the
//!   zooming, so recent history comes in the finest detail that fits and
//!   older history stays zoomed out.
//! - Only when the coarsest cover does not fit is the oldest history
//!   dropped, item by item from the oldest end (`truncated`).
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
    /// The session's roots (nodes no roll-up covers yet), oldest first.
    fn roots(&mut self) -> Result<Vec<Segment>, StoreError>;
    /// A roll-up's children, oldest first.
    fn children(&mut self, node: &Segment) -> Result<Vec<Segment>, StoreError>;
    /// A level-1 segment's entries, newest first, until `visit` says stop.
    fn entries(
        &mut self,
        segment: &Segment,
        visit: &mut dyn FnMut(Entry) -> bool,
    ) -> Result<(), StoreError>;
}

/// What an item costs on the wire beyond its texts, at most: ids, seqs,
/// role, timestamps, counts and the framing of each message.
const ITEM_OVERHEAD_BYTES: u64 = 128;

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

    fn within(self, limit: Cost) -> bool {
        self.tokens <= limit.tokens && self.bytes <= limit.bytes
    }

    /// What is left of `self` after `spent`; None when it does not fit.
    fn minus(self, spent: Cost) -> Option<Cost> {
        Some(Cost {
            tokens: self.tokens.checked_sub(spent.tokens)?,
            bytes: self.bytes.checked_sub(spent.bytes)?,
        })
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

/// A part of a cover before its items are read: a summarised node, or a
/// level-1 segment without a summary, which stands as its entries.
enum Unit {
    Summary(Segment),
    Entries(Segment),
}

impl Unit {
    /// The unit's cost; for entries not read yet, a bound: an entry's
    /// estimated tokens are at least a quarter of its bytes.
    fn cost(&self) -> Cost {
        match self {
            Unit::Summary(node) => node.summary.as_ref().map_or(Cost::default(), summary_cost),
            Unit::Entries(segment) => Cost {
                tokens: u64::from(segment.token_estimate),
                bytes: 4 * u64::from(segment.token_estimate)
                    + ITEM_OVERHEAD_BYTES * u64::from(segment.entry_count),
            },
        }
    }

    /// A summarised roll-up, which can be zoomed into.
    fn zoomable(&self) -> bool {
        matches!(self, Unit::Summary(node) if node.level > 1)
    }
}

/// The coarsest units standing for `node`, oldest first, appended to `out`.
fn coarsest(tree: &mut impl Tree, node: Segment, out: &mut Vec<Unit>) -> Result<(), StoreError> {
    match (node.state, &node.summary) {
        (SegmentState::Summarised, Some(_)) => out.push(Unit::Summary(node)),
        _ if node.level <= 1 => out.push(Unit::Entries(node)),
        _ => {
            for child in tree.children(&node)? {
                coarsest(tree, child, out)?;
            }
        }
    }
    Ok(())
}

/// The cover of the session `tree` reads, within `max_tokens` (0: no
/// limit) and `max_bytes` on the wire.
pub(super) fn cover(
    tree: &mut impl Tree,
    max_tokens: u32,
    max_bytes: usize,
) -> Result<Context, StoreError> {
    let limit = Cost {
        tokens: match max_tokens {
            0 => u64::MAX,
            n => u64::from(n),
        },
        bytes: max_bytes as u64,
    };
    let mut units = Vec::new();
    for root in tree.roots()? {
        coarsest(tree, root, &mut units)?;
    }
    let total = units
        .iter()
        .map(Unit::cost)
        .fold(Cost::default(), Cost::plus);
    let mut out = Output::default();
    if !total.within(limit) {
        // Even the coarsest cover is too long: keep its newest part.
        out.truncated = true;
        let mut left = limit;
        while let Some(unit) = units.pop() {
            match unit {
                Unit::Summary(node) => {
                    let Some(rest) = node
                        .summary
                        .as_ref()
                        .and_then(|s| left.minus(summary_cost(s)))
                    else {
                        break;
                    };
                    left = rest;
                    out.push_summary(node);
                }
                Unit::Entries(segment) => {
                    let mut full = false;
                    tree.entries(
                        &segment,
                        &mut |entry| match left.minus(entry_cost(&entry)) {
                            Some(rest) => {
                                left = rest;
                                out.push_entry(entry);
                                true
                            }
                            None => {
                                full = true;
                                false
                            }
                        },
                    )?;
                    if full {
                        break;
                    }
                }
            }
        }
        return Ok(out.finish());
    }
    // It fits: zoom into the newest roll-ups while the slack allows.
    let mut slack = limit.minus(total).unwrap_or_default();
    let mut zooming = true;
    while let Some(unit) = units.pop() {
        if zooming && unit.zoomable() {
            let Unit::Summary(node) = &unit else {
                unreachable!("zoomable units are summaries")
            };
            let mut finer = Vec::new();
            for child in tree.children(node)? {
                coarsest(tree, child, &mut finer)?;
            }
            let finer_cost = finer
                .iter()
                .map(Unit::cost)
                .fold(Cost::default(), Cost::plus);
            // What is left if the node gives way to its children.
            let after = slack.plus(unit.cost()).minus(finer_cost);
            if let (false, Some(after)) = (finer.is_empty(), after) {
                slack = after;
                units.extend(finer);
                continue;
            }
            zooming = false;
        }
        match unit {
            Unit::Summary(node) => out.push_summary(node),
            Unit::Entries(segment) => tree.entries(&segment, &mut |entry| {
                out.push_entry(entry);
                true
            })?,
        }
    }
    Ok(out.finish())
}

/// A cover being built from its newest item back.
#[derive(Default)]
struct Output {
    items: Vec<ContextItem>,
    tokens: u64,
    truncated: bool,
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
        };
        self.tokens += u64::from(item.tokens());
        self.items.push(item);
    }

    fn push_entry(&mut self, entry: Entry) {
        self.tokens += u64::from(entry.tokens);
        self.items.push(ContextItem::Entry(entry));
    }

    /// The cover, oldest first.
    fn finish(mut self) -> Context {
        self.items.reverse();
        Context {
            items: self.items,
            truncated: self.truncated,
            tokens: u32::try_from(self.tokens).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::{Millis, Role, SegmentId, Summary};

    /// A tree in memory: nodes by id, children by parent.
    #[derive(Default)]
    struct Fake {
        nodes: HashMap<SegmentId, Segment>,
        roots: Vec<SegmentId>,
        entries: HashMap<SegmentId, Vec<Entry>>,
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
        }
    }

    impl Fake {
        /// Eight level-1 segments of two entries (seqs 1..=16), rolled up
        /// by fours into two level-2 nodes, rolled up into one level-3 node.
        /// Summaries of level 1 cost 8 tokens, level 2 cost 6, level 3 5.
        fn eight(summarised_l2: [bool; 2], top: bool) -> Fake {
            let mut f = Fake::default();
            for i in 0..8u64 {
                let mut n = node(i + 1, 1, (2 * i + 1, 2 * i + 2), Some("level one recap"));
                n.ordinal = i as u32 + 1;
                f.entries.insert(
                    n.id,
                    (n.first_seq..=n.last_seq)
                        .map(|seq| Entry {
                            seq,
                            client_entry_id: None,
                            role: Role::User,
                            content: "x".repeat(24),
                            created_at: Millis(0),
                            tokens: 10,
                        })
                        .collect(),
                );
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
    }

    impl Tree for Fake {
        fn roots(&mut self) -> Result<Vec<Segment>, StoreError> {
            self.reads += self.roots.len();
            Ok(self.roots.iter().map(|id| self.nodes[id].clone()).collect())
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
            segment: &Segment,
            visit: &mut dyn FnMut(Entry) -> bool,
        ) -> Result<(), StoreError> {
            for e in self.entries[&segment.id].iter().rev() {
                self.reads += 1;
                if !visit(e.clone()) {
                    break;
                }
            }
            Ok(())
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
            })
            .collect()
    }

    fn contiguous(ctx: &Context, from: u64, to: u64) -> bool {
        let mut next = from;
        for (first, last, _) in shape(ctx) {
            if first != next {
                return false;
            }
            next = last + 1;
        }
        next == to + 1
    }

    #[test]
    fn no_limit_is_the_finest_cover() {
        let ctx = cover(&mut Fake::eight([true, true], true), 0, usize::MAX).expect("cover");
        assert_eq!(shape(&ctx).len(), 8);
        assert!(shape(&ctx).iter().all(|s| s.2 == 1));
        assert!(contiguous(&ctx, 1, 16) && !ctx.truncated);
        assert_eq!(ctx.tokens, 8 * 8);
    }

    #[test]
    fn a_tight_budget_zooms_out_the_oldest_first() {
        // The top alone costs 5; both level-2 nodes 12; one level-2 and four
        // level-1 summaries 6 + 32 = 38; everything at level 1, 64.
        let cases = [
            (5, vec![(1, 16, 3)]),
            (36, vec![(1, 8, 2), (9, 16, 2)]),
            (37, vec![(1, 8, 2), (9, 16, 2)]),
            (
                38,
                vec![(1, 8, 2), (9, 10, 1), (11, 12, 1), (13, 14, 1), (15, 16, 1)],
            ),
            (
                63,
                vec![(1, 8, 2), (9, 10, 1), (11, 12, 1), (13, 14, 1), (15, 16, 1)],
            ),
        ];
        for (budget, want) in cases {
            let ctx =
                cover(&mut Fake::eight([true, true], true), budget, usize::MAX).expect("cover");
            assert_eq!(shape(&ctx), want, "budget {budget}");
            assert!(!ctx.truncated && ctx.tokens <= budget, "budget {budget}");
        }
    }

    #[test]
    fn a_node_without_a_summary_stands_as_its_children() {
        // The top and the first level-2 node failed: the coarsest cover is
        // four level-1 recaps and the second level-2 node.
        let ctx = cover(&mut Fake::eight([false, true], false), 38, usize::MAX).expect("cover");
        assert_eq!(
            shape(&ctx),
            vec![(1, 2, 1), (3, 4, 1), (5, 6, 1), (7, 8, 1), (9, 16, 2)]
        );
        assert!(contiguous(&ctx, 1, 16) && !ctx.truncated);
        // And a level-1 segment without one, as its raw entries.
        let mut f = Fake::eight([false, true], false);
        if let Some(n) = f.nodes.get_mut(&1) {
            n.summary = None;
            n.state = SegmentState::Pending;
        }
        let ctx = cover(&mut f, 0, usize::MAX).expect("cover");
        assert_eq!(shape(&ctx)[..3], [(1, 1, 0), (2, 2, 0), (3, 4, 1)]);
        assert!(contiguous(&ctx, 1, 16));
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
        let carried = 128 + 20 + 3 + 5 + 7;
        let ctx = cover(&mut f, 0, carried).expect("cover");
        assert_eq!(shape(&ctx), vec![(1, 2, 1)]);
        assert!(!ctx.truncated);
        let ctx = cover(&mut f, 0, carried - 1).expect("cover");
        assert!(ctx.items.is_empty() && ctx.truncated, "{:?}", shape(&ctx));
    }

    /// One level-1 segment, not summarised, of `contents` as entries of 10
    /// tokens each (seqs from 1), each with `client_id` if given.
    fn raw(contents: &[&str], client_id: Option<&str>) -> Fake {
        let mut f = Fake::default();
        let n = node(1, 1, (1, contents.len() as u64), None);
        let entries = contents
            .iter()
            .zip(1..)
            .map(|(content, seq)| Entry {
                seq,
                client_entry_id: client_id.map(str::to_owned),
                role: Role::User,
                content: (*content).to_owned(),
                created_at: Millis(0),
                tokens: 10,
            })
            .collect();
        f.entries.insert(1, entries);
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
        let ctx = cover(&mut raw(&[&"x".repeat(24)], Some("id-12345")), 0, carried).expect("cover");
        assert_eq!(shape(&ctx), vec![(1, 1, 0)]);
        let ctx = cover(
            &mut raw(&[&"x".repeat(24)], Some("id-12345")),
            0,
            carried - 1,
        )
        .expect("cover");
        assert!(ctx.items.is_empty() && ctx.truncated, "{:?}", shape(&ctx));
    }

    /// Whatever the byte limit, a cover never carries more than it (each
    /// entry: its content and 128 bytes of framing); one the entries fit
    /// in with room to spare is whole and not truncated.
    #[test]
    fn a_cover_of_raw_entries_never_carries_more_bytes_than_the_limit() {
        let content = "x".repeat(24);
        let contents = [content.as_str(); 2];
        for limit in 0..=700 {
            let ctx = cover(&mut raw(&contents, None), 0, limit).expect("cover");
            let carried = ctx.items.len() * (128 + 24);
            assert!(carried <= limit, "{limit}: {carried} bytes");
            assert_eq!(
                shape(&ctx),
                [(1, 1, 0), (2, 2, 0)][2 - ctx.items.len()..],
                "{limit}: the newest kept"
            );
            // Twice what the two entries carry.
            if limit >= 2 * 2 * (128 + 24) {
                assert!(ctx.items.len() == 2 && !ctx.truncated, "{limit}");
            }
        }
    }

    #[test]
    fn only_a_cover_too_long_at_its_coarsest_is_truncated_and_reads_little() {
        // Nothing summarised: sixteen raw entries of 10 tokens each.
        let mut f = Fake::eight([false, false], false);
        for n in f.nodes.values_mut() {
            n.summary = None;
            n.state = SegmentState::Pending;
        }
        let ctx = cover(&mut f, 35, usize::MAX).expect("cover");
        assert!(ctx.truncated);
        assert_eq!(shape(&ctx), vec![(14, 14, 0), (15, 15, 0), (16, 16, 0)]);
        // The three entries kept and the one that did not fit, plus the
        // tree's nodes: not the other twelve entries.
        assert!(f.reads <= 4 + 11, "{} reads", f.reads);
    }
}

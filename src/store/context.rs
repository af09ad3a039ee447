//! The budget rule of GetContext, the same for every backend: walking a
//! session from its newest segment back, a SUMMARISED segment contributes
//! its summary and any other its raw entries (newest first), until the next
//! item would pass `max_tokens`, or the bytes the answer may carry; then
//! the walk stops and the context is `truncated`. A backend feeds the walk
//! and stops reading when it says so, so a long session costs only what
//! fits, in time and in memory.

use crate::model::{Context, ContextItem, Entry, Segment, SegmentState, Summary};

/// What one segment contributes to a context.
pub(super) enum Contribution {
    /// Its summary, as one item.
    Summary(Summary),
    /// Its raw entries, which the backend reads newest first.
    Entries,
}

/// What a segment contributes: its summary once it has one, else its
/// entries.
pub(super) fn contribution(segment: &mut Segment) -> Contribution {
    match (segment.state, segment.summary.take()) {
        (SegmentState::Summarised, Some(summary)) => Contribution::Summary(summary),
        _ => Contribution::Entries,
    }
}

/// What an item costs on the wire beyond its texts, at most: ids, seqs,
/// role, timestamps, counts and the framing of each message.
const ITEM_OVERHEAD_BYTES: usize = 128;

/// The most bytes an item takes in an answer: its texts and the overhead.
fn item_bytes(item: &ContextItem) -> usize {
    ITEM_OVERHEAD_BYTES
        + match item {
            ContextItem::Summary { summary, .. } => {
                summary.text.len()
                    + summary.provider.len()
                    + summary.model.len()
                    + summary.prompt_version.len()
            }
            ContextItem::Entry(e) => {
                e.content.len() + e.client_entry_id.as_ref().map_or(0, String::len)
            }
        }
}

/// A context being filled from the newest item back.
pub(super) struct Budget {
    limit: u32,
    total: u32,
    max_bytes: usize,
    bytes: usize,
    items: Vec<ContextItem>,
    truncated: bool,
}

impl Budget {
    /// At most `max_tokens` (0 means no limit) estimated tokens, and at most
    /// `max_bytes` bytes of items on the wire.
    pub(super) fn new(max_tokens: u32, max_bytes: usize) -> Budget {
        Budget {
            limit: if max_tokens == 0 {
                u32::MAX
            } else {
                max_tokens
            },
            total: 0,
            max_bytes,
            bytes: 0,
            items: Vec::new(),
            truncated: false,
        }
    }

    /// Takes the next older item if it fits; false (and the context is
    /// truncated) when it does not, and the walk must stop.
    fn take(&mut self, item: ContextItem) -> bool {
        let bytes = self.bytes.saturating_add(item_bytes(&item));
        match self.total.checked_add(item.tokens()) {
            Some(t) if t <= self.limit && bytes <= self.max_bytes => {
                self.total = t;
                self.bytes = bytes;
                self.items.push(item);
                true
            }
            _ => {
                self.truncated = true;
                false
            }
        }
    }

    /// Takes a segment's summary; false when the walk must stop.
    pub(super) fn take_summary(&mut self, segment: &Segment, summary: Summary) -> bool {
        self.take(ContextItem::Summary {
            segment_id: segment.id,
            first_seq: segment.first_seq,
            last_seq: segment.last_seq,
            summary,
        })
    }

    /// Takes the next older raw entry; false when the walk must stop.
    pub(super) fn take_entry(&mut self, entry: Entry) -> bool {
        self.take(ContextItem::Entry(entry))
    }

    /// The context, oldest first.
    pub(super) fn finish(mut self) -> Context {
        self.items.reverse();
        Context {
            items: self.items,
            truncated: self.truncated,
            tokens: self.total,
        }
    }
}

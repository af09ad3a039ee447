//! Every answer within the message limit (`limits.max_message_bytes`), so
//! that any client that can send to this server can read what it says: a
//! page of segments or entries ends early (its page token or next seq says
//! where to go on), a context drops its oldest items (`truncated`), a flush
//! keeps the segments still owed a recap first, and a lone segment's
//! summary, from a build that stored whatever the provider sent, is clipped
//! with a marker (as is a lone entry stored before the limit was lowered).
//! Only an
//! answer that would pass the limit is touched; the store's own bounds
//! (the context budget, summaries checked against `max_output_tokens`) keep
//! that rare.

use prost::Message;

use crate::model::{Context, ContextItem};
use crate::pb;
use crate::text::prefix;
use crate::wire::context_to_pb;

/// Room kept for an answer's own fields (a page token, flags, counts).
const MARGIN: usize = 1024;
/// What stands at the end of a clipped summary.
const CLIPPED: &str = "… [clipped to fit the message limit]";

/// The bytes one element of a repeated message field takes: its tag, its
/// length and the message.
fn field_len(message: &impl Message) -> usize {
    let n = message.encoded_len();
    1 + prost::length_delimiter_len(n) + n
}

/// The bytes an answer's elements may take in all.
fn budget(limit: usize) -> usize {
    limit.saturating_sub(MARGIN)
}

/// Shortens `text` by at least `over` bytes (on a character boundary) and
/// marks it clipped.
fn clip(text: &mut String, over: usize) {
    let keep = text.len().saturating_sub(over + CLIPPED.len());
    let cut = prefix(text, keep).len();
    text.truncate(cut);
    text.push_str(CLIPPED);
}

/// Clips the summary of a segment that alone would not fit the limit.
pub(super) fn fit_segment(segment: &mut pb::Segment, limit: usize) {
    let over = segment.encoded_len().saturating_sub(budget(limit));
    if over == 0 {
        return;
    }
    if let Some(summary) = &mut segment.summary {
        clip(&mut summary.text, over);
    }
}

/// Clips the content of an entry that alone would not fit the limit.
pub(super) fn fit_entry(entry: &mut pb::Entry, limit: usize) {
    let over = entry.encoded_len().saturating_sub(budget(limit));
    if over > 0 {
        clip(&mut entry.content, over);
    }
}

/// A listing's page that the store read, made to fit the limit: the
/// longest run of `items`, from the first, that fits (always the first,
/// made to fit alone by `fit_one`). Returns where the next page starts:
/// after the last one kept when some were cut off here, else the store's
/// own `next_after`.
pub(super) fn fit_page<M: Message>(
    items: &mut Vec<M>,
    limit: usize,
    fit_one: impl Fn(&mut M, usize),
    key: impl Fn(&M) -> u64,
    next_after: Option<u64>,
) -> Option<u64> {
    let budget = budget(limit);
    let mut used = 0usize;
    for (i, item) in items.iter_mut().enumerate() {
        fit_one(item, limit);
        let n = field_len(item);
        if i > 0 && used + n > budget {
            items.truncate(i);
            return items.last().map(key);
        }
        used += n;
    }
    next_after
}

/// Keeps, of a session's segments (ordinal order), those still owed a
/// recap and then the summarised ones, newest first in each, as far as the
/// limit allows; the kept ones stay in ordinal order.
pub(super) fn fit_flush(segments: &mut Vec<pb::Segment>, limit: usize) {
    let budget = budget(limit);
    for segment in segments.iter_mut() {
        fit_segment(segment, limit);
    }
    let sizes: Vec<usize> = segments.iter().map(field_len).collect();
    if sizes.iter().sum::<usize>() <= budget {
        return;
    }
    let summarised = pb::SegmentState::Summarised as i32;
    let mut order: Vec<usize> = (0..segments.len()).rev().collect();
    // Stable: newest first within each group.
    order.sort_by_key(|&i| segments[i].state == summarised);
    let mut keep = vec![false; segments.len()];
    let mut used = 0usize;
    for i in order {
        if used + sizes[i] <= budget {
            keep[i] = true;
            used += sizes[i];
        }
    }
    let mut kept = keep.into_iter();
    segments.retain(|_| kept.next().unwrap_or(false));
}

/// The context as an answer within the limit: its oldest items are
/// dropped (and it says `truncated`) if it would pass it.
pub(super) fn fit_context(context: Context, limit: usize) -> pb::GetContextResponse {
    let tokens: Vec<u32> = context.items.iter().map(ContextItem::tokens).collect();
    let mut response = context_to_pb(context);
    let sizes: Vec<usize> = response.items.iter().map(field_len).collect();
    let mut over = sizes.iter().sum::<usize>().saturating_sub(budget(limit));
    let mut drop = 0;
    while over > 0 && drop < sizes.len() {
        over = over.saturating_sub(sizes[drop]);
        drop += 1;
    }
    if drop > 0 {
        response.items.drain(..drop);
        response.truncated = true;
        let dropped: u32 = tokens[..drop].iter().sum();
        response.estimated_tokens = response.estimated_tokens.saturating_sub(dropped);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(id: u64, state: pb::SegmentState, text_bytes: usize) -> pb::Segment {
        pb::Segment {
            id,
            state: state as i32,
            summary: (text_bytes > 0).then(|| pb::Summary {
                text: "é".repeat(text_bytes / 2),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lone_oversized_summary_is_clipped_to_fit() {
        let limit = 64 * 1024;
        let mut s = segment(1, pb::SegmentState::Summarised, 1024 * 1024);
        fit_segment(&mut s, limit);
        assert!(s.encoded_len() <= limit);
        let text = &s.summary.expect("summary").text;
        assert!(text.ends_with(CLIPPED));
        let mut small = segment(2, pb::SegmentState::Summarised, 100);
        let before = small.clone();
        fit_segment(&mut small, limit);
        assert_eq!(small, before, "what fits is untouched");
    }

    #[test]
    fn a_page_ends_where_the_limit_is() {
        let limit = 64 * 1024;
        let fit =
            |page: &mut Vec<pb::Segment>, next| fit_page(page, limit, fit_segment, |s| s.id, next);
        let mut page: Vec<pb::Segment> = (1..=100)
            .map(|i| segment(i, pb::SegmentState::Summarised, 4000))
            .collect();
        let next = fit(&mut page, None);
        let size: usize = page.iter().map(field_len).sum();
        assert!(size <= limit, "{size}");
        assert!(page.len() > 10, "{}", page.len());
        assert_eq!(page[0].id, 1);
        assert_eq!(
            next,
            page.last().map(|s| s.id),
            "goes on after the last sent"
        );
        let mut small: Vec<pb::Segment> = (1..=3)
            .map(|i| segment(i, pb::SegmentState::Summarised, 100))
            .collect();
        assert_eq!(fit(&mut small, Some(3)), Some(3), "the store's own next");
        assert_eq!(small.len(), 3);
        assert_eq!(fit(&mut small, None), None);
    }

    #[test]
    fn a_lone_oversized_entry_is_clipped_and_the_page_goes_on() {
        let limit = 64 * 1024;
        let entry = |seq: u64, bytes: usize| pb::Entry {
            seq,
            content: "é".repeat(bytes / 2),
            ..Default::default()
        };
        let mut page = vec![entry(7, 200 * 1024), entry(8, 100)];
        let next = fit_page(&mut page, limit, fit_entry, |e| e.seq, None);
        assert_eq!(next, Some(7));
        assert_eq!(page.len(), 1);
        assert!(page[0].encoded_len() <= limit);
        assert!(page[0].content.ends_with(CLIPPED));
        let mut fits = vec![entry(1, 100)];
        let before = fits.clone();
        assert_eq!(fit_page(&mut fits, limit, fit_entry, |e| e.seq, None), None);
        assert_eq!(fits, before, "what fits is untouched");
    }

    #[test]
    fn a_flush_keeps_what_is_owed_a_recap_first() {
        let limit = 64 * 1024;
        let mut all: Vec<pb::Segment> = (1..=100)
            .map(|i| {
                let state = if i % 10 == 0 {
                    pb::SegmentState::Pending
                } else {
                    pb::SegmentState::Summarised
                };
                segment(i, state, 4000)
            })
            .collect();
        fit_flush(&mut all, limit);
        let size: usize = all.iter().map(field_len).sum();
        assert!(size <= limit, "{size}");
        let pending = all
            .iter()
            .filter(|s| s.state == pb::SegmentState::Pending as i32)
            .count();
        assert_eq!(pending, 10, "every segment owed a recap is there");
        let ids: Vec<u64> = all.iter().map(|s| s.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ordinal order");
        assert_eq!(ids.last(), Some(&100), "the newest are kept");
    }
}

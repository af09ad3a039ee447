//! Recap planning: a segment over the provider's input budget is cut into
//! chunks that each fit, and their recaps are folded in groups that each
//! fit, round after round, until one is left. Pure functions; the pass
//! pipeline (`pipeline.rs`) drives them.

use crate::model::{Entry, estimate_tokens};
use crate::text::prefix;

/// Splits entries into runs whose estimated tokens fit `budget`; an entry
/// larger than the budget is cut into pieces that each fit.
pub(crate) fn plan_chunks(entries: &[Entry], budget: u32) -> Vec<Vec<Entry>> {
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut used = 0u32;
    for entry in entries {
        let label = crate::provider::label_tokens(entry);
        for piece in split_entry(entry, budget.saturating_sub(label)) {
            let cost = piece.tokens.saturating_add(label);
            if used.saturating_add(cost) > budget && !current.is_empty() {
                chunks.push(std::mem::take(&mut current));
                used = 0;
            }
            used = used.saturating_add(cost);
            current.push(piece);
        }
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    chunks
}

fn split_entry(entry: &Entry, budget: u32) -> Vec<Entry> {
    if entry.tokens <= budget {
        return vec![entry.clone()];
    }
    // estimate_tokens is bytes / 4 + 4; leave room for the role prefix too.
    let max_bytes = (budget.saturating_sub(8).max(1) as usize) * 4;
    let mut pieces = Vec::new();
    let mut rest = entry.content.as_str();
    while !rest.is_empty() {
        let mut end = prefix(rest, max_bytes).len();
        if end == 0 {
            // A single character wider than the budget: take it whole.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        pieces.push(Entry {
            content: piece.to_owned(),
            tokens: estimate_tokens(piece),
            ..entry.clone()
        });
        rest = tail;
    }
    pieces
}

/// Groups recaps for folding so that each group fits `budget`, each part
/// first cut to half the budget so that any two fit together: every group
/// but perhaps the last holds two parts or more, so each round of folds
/// shrinks the count.
pub(crate) fn plan_folds(parts: Vec<String>, budget: u32) -> Vec<Vec<String>> {
    let half_bytes = (budget / 2).saturating_sub(8).max(1) as usize * 4;
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut used = 0u32;
    for mut part in parts {
        let keep = prefix(&part, half_bytes).len();
        part.truncate(keep);
        let cost = estimate_tokens(&part);
        match groups.last_mut() {
            Some(group) if used.saturating_add(cost) <= budget => group.push(part),
            _ => {
                groups.push(vec![part]);
                used = 0;
            }
        }
        used = used.saturating_add(cost);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Millis, Role};

    fn entry(seq: u64, bytes: usize) -> Entry {
        let content = "a".repeat(bytes);
        Entry {
            seq,
            client_entry_id: None,
            role: Role::User,
            tokens: estimate_tokens(&content),
            content,
            created_at: Millis(0),
            occurred_at: Millis(0),
            name: None,
            metadata: Default::default(),
        }
    }

    #[test]
    fn chunks_fit_the_budget_and_keep_every_byte_in_order() {
        let entries: Vec<Entry> = (1..=50).map(|i| entry(i, 37 * i as usize)).collect();
        let budget = 300;
        let chunks = plan_chunks(&entries, budget);
        assert!(chunks.len() > 1);
        for c in &chunks {
            let tokens: u32 = c.iter().map(|e| e.tokens).sum();
            assert!(tokens <= budget, "{tokens}");
        }
        let joined: String = chunks
            .iter()
            .flatten()
            .map(|e| e.content.as_str())
            .collect();
        let original: String = entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(joined, original);
        let seqs: Vec<u64> = chunks.iter().flatten().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_segment_within_budget_is_one_chunk() {
        let entries: Vec<Entry> = (1..=3).map(|i| entry(i, 10)).collect();
        assert_eq!(plan_chunks(&entries, 1000).len(), 1);
    }

    #[test]
    fn folds_fit_and_shrink() {
        let budget = 200;
        let parts: Vec<String> = (0..9).map(|i| format!("{i}").repeat(500)).collect();
        let groups = plan_folds(parts, budget);
        assert!(groups.len() < 9);
        for g in &groups[..groups.len() - 1] {
            assert!(g.len() >= 2, "{}", g.len());
        }
        for g in &groups {
            let tokens: u32 = g.iter().map(|p| estimate_tokens(p)).sum();
            assert!(tokens <= budget, "{tokens}");
        }
    }
}

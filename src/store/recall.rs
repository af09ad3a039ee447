//! GetContext with a query, the same for every backend: Search's hits for
//! the host's question placed before the cover (`context.rs`), within one
//! budget.
//!
//! - **Recall first, within its share.** Up to `recall_tokens` of the
//!   budget (and the same share of the bytes) are set aside; the cover is
//!   built within the rest, its recent window as large as the whole budget
//!   would make it, so the newest turns stay verbatim as without a query.
//! - **Nothing twice.** A hit the cover holds verbatim (an entry of the
//!   session among its raw entries, a summary it carries as it is) is
//!   dropped; the session's own older entries and recaps that the cover
//!   only summarises may be recalled. Of an entry and a recap over it
//!   that quotes it, only the recap is recalled (in the better one's
//!   place, when it fits).
//! - **Best first, what fits.** Hits are taken in Search's order; one too
//!   large for what is left is passed over for the next.
//! - **Nothing unspent.** What recall leaves unused goes back to the
//!   cover, built once more within the larger share; a hit that cover now
//!   holds verbatim is dropped again.
//! - **The cover before recall.** A budget whose cover would not fit
//!   beside recall's share at all is answered as without a query; one
//!   that fits only by dropping its oldest history keeps recall and says
//!   `truncated`.

use super::context::ITEM_OVERHEAD_BYTES;
use super::{Backend, Budget, SearchHit, Store, StoreError};
use crate::model::{Context, ContextItem, Recalled, SessionName, Tenant, estimate_tokens};

/// What a recalled hit costs: estimated tokens of its text, and bytes on
/// the wire (its texts and the framing of an item).
fn cost(hit: &SearchHit) -> (u64, u64) {
    let bytes = ITEM_OVERHEAD_BYTES
        + (hit.text.len() + hit.session.len() + hit.name.as_ref().map_or(0, String::len)) as u64;
    (u64::from(estimate_tokens(&hit.text)), bytes)
}

/// Whether `cover` (of `session`) holds `hit` verbatim: the entry among
/// its raw entries, or the node's summary as one of its items.
fn verbatim(hit: &SearchHit, session: &SessionName, cover: &Context) -> bool {
    hit.session == session.as_str()
        && cover.items.iter().any(|item| match item {
            ContextItem::Entry(e) => hit.level == 0 && e.seq == hit.first_seq,
            ContextItem::Summary { segment_id, .. } => {
                hit.level > 0 && hit.segment_id == Some(*segment_id)
            }
            ContextItem::Recalled(_) => false,
        })
}

/// The hits, best first, that `cover` does not hold verbatim and that fit
/// within `tokens` and `bytes`, each passed over when it does not fit what
/// is left; and what they cost.
fn choose(
    hits: &[SearchHit],
    session: &SessionName,
    cover: &Context,
    tokens: u64,
    bytes: u64,
) -> (Vec<SearchHit>, u64, u64) {
    let (mut spent_tokens, mut spent_bytes) = (0u64, 0u64);
    let mut chosen: Vec<SearchHit> = Vec::new();
    for hit in hits {
        if verbatim(hit, session, cover) {
            continue;
        }
        let (t, b) = cost(hit);
        match said_already(&chosen, hit) {
            Said::Holds => continue,
            Said::HeldBy(quoted) => {
                // The recap quoting chosen entries takes the place of the
                // first of them and drops the rest, if what it adds fits.
                let (qt, qb) = (quoted.iter().map(|&i| cost(&chosen[i])))
                    .fold((0, 0), |(a, b), (t, b2)| (a + t, b + b2));
                if spent_tokens - qt + t <= tokens && spent_bytes - qb + b <= bytes {
                    spent_tokens = spent_tokens - qt + t;
                    spent_bytes = spent_bytes - qb + b;
                    // It ranks where the better one did, and says so.
                    let mut recap = hit.clone();
                    recap.score = recap.score.max(chosen[quoted[0]].score);
                    chosen[quoted[0]] = recap;
                    for &i in quoted[1..].iter().rev() {
                        chosen.remove(i);
                    }
                }
                continue;
            }
            Said::New => {}
        }
        if spent_tokens + t <= tokens && spent_bytes + b <= bytes {
            spent_tokens += t;
            spent_bytes += b;
            chosen.push(hit.clone());
        }
    }
    (chosen, spent_tokens, spent_bytes)
}

/// How a hit stands to the chosen ones of its session that cover the
/// same entries (an entry and a recap or roll-up over it).
enum Said {
    /// A chosen hit already holds its text: it adds nothing.
    Holds,
    /// Its text holds these chosen hits' texts, in order (a recap quoting
    /// the entries).
    HeldBy(Vec<usize>),
    New,
}

fn said_already(chosen: &[SearchHit], hit: &SearchHit) -> Said {
    let text = hit.text.trim();
    let over = |c: &SearchHit| {
        c.session == hit.session
            && c.level != hit.level
            && c.first_seq <= hit.last_seq
            && hit.first_seq <= c.last_seq
    };
    if chosen.iter().any(|c| over(c) && c.text.contains(text)) {
        return Said::Holds;
    }
    let quoted: Vec<usize> = (chosen.iter().enumerate())
        .filter(|(_, c)| over(c) && text.contains(c.text.trim()))
        .map(|(i, _)| i)
        .collect();
    if quoted.is_empty() {
        Said::New
    } else {
        Said::HeldBy(quoted)
    }
}

fn recalled(hit: SearchHit) -> ContextItem {
    ContextItem::Recalled(Recalled {
        session: hit.session,
        level: hit.level,
        first_seq: hit.first_seq,
        last_seq: hit.last_seq,
        segment_id: hit.segment_id,
        role: hit.role,
        name: hit.name,
        occurred_at: hit.occurred_at,
        text: hit.text,
        score: hit.score,
    })
}

/// The recalled hits, then the cover.
fn joined(chosen: Vec<SearchHit>, cover: Context) -> Context {
    let recalled_tokens: u32 = chosen.iter().map(|h| estimate_tokens(&h.text)).sum();
    let mut items: Vec<ContextItem> = chosen.into_iter().map(recalled).collect();
    items.extend(cover.items);
    Context {
        items,
        truncated: cover.truncated,
        tokens: cover.tokens.saturating_add(recalled_tokens),
    }
}

impl Store {
    /// The session's subject (None: it has none); `SessionNotFound` when
    /// the tenant has no such session.
    pub(crate) async fn session_subject(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Option<String>, StoreError> {
        on_backend!(self, b => b.session_subject(tenant, session).await)
    }

    /// The context of `budget` (whose `max_tokens` is not 0) with up to
    /// `recall_tokens` of it spent on `hits` (Search's, best first), by the
    /// rule above.
    pub(crate) async fn context_recalling(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        budget: Budget,
        recall_tokens: u32,
        hits: &[SearchHit],
    ) -> Result<Context, StoreError> {
        // The cover keeps one token at least: a budget of 0 is no limit.
        let recall = recall_tokens.min(budget.max_tokens.saturating_sub(1));
        if hits.is_empty() || recall == 0 {
            return self.context(tenant, session, budget).await;
        }
        let recent = match budget.recent_tokens {
            0 => budget.max_tokens / 4,
            r => r,
        };
        // Recall's share of the bytes is its share of the tokens.
        let recall_bytes = (budget.max_bytes as u128 * u128::from(recall)
            / u128::from(budget.max_tokens)) as usize;
        let within = |tokens: u64, bytes: u64| Budget {
            max_tokens: budget.max_tokens - u32::try_from(tokens).unwrap_or(u32::MAX),
            max_bytes: budget.max_bytes - usize::try_from(bytes).unwrap_or(usize::MAX),
            recent_tokens: recent,
        };
        let first = match self
            .context(tenant, session, within(recall.into(), recall_bytes as u64))
            .await
        {
            Ok(cover) => cover,
            Err(StoreError::BudgetTooSmall { .. }) => {
                return self.context(tenant, session, budget).await;
            }
            Err(e) => return Err(e),
        };
        let (chosen, tokens, bytes) =
            choose(hits, session, &first, recall.into(), recall_bytes as u64);
        let (chosen, cover) = if tokens == u64::from(recall) {
            (chosen, first)
        } else {
            // What recall left goes back to the cover; the larger cover
            // may hold some of the chosen verbatim now.
            let cover = self.context(tenant, session, within(tokens, bytes)).await?;
            let chosen: Vec<SearchHit> = chosen
                .into_iter()
                .filter(|h| !verbatim(h, session, &cover))
                .collect();
            (chosen, cover)
        };
        // The cover has the rest of the budget, as any cover has its
        // budget: it may drop its oldest history where the whole budget
        // would have kept it (`truncated` says so). Answering without
        // recall then instead cost the turn's context most of what it
        // recalled (within a session at 400 tokens: 90 % of the facts
        // asked found, 50 % with that rule).
        Ok(joined(chosen, cover))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Entry, Millis, Role};

    fn hit(session: &str, seq: u64, text: &str) -> SearchHit {
        SearchHit {
            session: session.to_owned(),
            level: 0,
            first_seq: seq,
            last_seq: seq,
            segment_id: None,
            role: Some(Role::User),
            created_at: Millis(0),
            occurred_at: Millis(0),
            name: None,
            metadata: Default::default(),
            text: text.to_owned(),
            score: 0.0,
            legs: Vec::new(),
            similarity: 0.0,
            lexical_rank: 0,
            semantic_rank: 0,
            held: 0.0,
        }
    }

    fn cover_of(seqs: &[u64]) -> Context {
        Context {
            items: seqs
                .iter()
                .map(|&seq| {
                    ContextItem::Entry(Entry {
                        seq,
                        role: Role::User,
                        content: format!("entry {seq}"),
                        tokens: 3,
                        client_entry_id: None,
                        created_at: Millis(0),
                        occurred_at: Millis(0),
                        name: None,
                        metadata: Default::default(),
                    })
                })
                .collect(),
            truncated: false,
            tokens: 3 * seqs.len() as u32,
        }
    }

    #[test]
    fn what_the_cover_holds_verbatim_is_not_recalled_and_the_rest_fits_best_first() {
        let s = SessionName::parse("b").expect("name");
        let hits = vec![
            // The session's own entry, raw in the cover: dropped.
            hit("b", 7, "the question itself"),
            // Another session's (same seq): kept.
            hit("a", 7, "the locker code is 4711"),
            // Too large for what is left: passed over.
            hit("a", 9, &"long ".repeat(200)),
            // The session's own older entry, not in the cover: kept.
            hit("b", 2, "an older word"),
        ];
        let (chosen, tokens, _) = choose(&hits, &s, &cover_of(&[6, 7]), 40, u64::MAX);
        let picked: Vec<(&str, u64)> = chosen
            .iter()
            .map(|h| (h.session.as_str(), h.first_seq))
            .collect();
        assert_eq!(picked, [("a", 7), ("b", 2)]);
        assert_eq!(
            tokens,
            u64::from(
                estimate_tokens("the locker code is 4711") + estimate_tokens("an older word")
            )
        );
        // The bytes bound too: room for one hit's framing and text only.
        let one = ITEM_OVERHEAD_BYTES + 1 + "the locker code is 4711".len() as u64;
        let (chosen, _, bytes) = choose(&hits, &s, &cover_of(&[6, 7]), 40, one);
        assert_eq!(chosen.len(), 1);
        assert_eq!(bytes, one);
    }

    fn recap(session: &str, seqs: (u64, u64), text: &str) -> SearchHit {
        SearchHit {
            level: 1,
            first_seq: seqs.0,
            last_seq: seqs.1,
            segment_id: Some(seqs.0),
            role: None,
            ..hit(session, seqs.0, text)
        }
    }

    #[test]
    fn an_entry_and_a_recap_quoting_it_are_recalled_once() {
        let s = SessionName::parse("now").expect("name");
        let quoted = "I park in spot K7 at the office garage.";
        let recap_text = format!("Maya (14 Nov 2023): {quoted} Tom: noted.");
        let texts = |chosen: &[SearchHit]| -> Vec<String> {
            chosen.iter().map(|h| h.text.clone()).collect()
        };
        // The entry first: the recap quoting it takes its place.
        let hits = vec![
            hit("a", 3, quoted),
            hit("b", 1, "other"),
            recap("a", (1, 5), &recap_text),
        ];
        let (chosen, tokens, _) = choose(&hits, &s, &cover_of(&[1]), 1000, u64::MAX);
        assert_eq!(texts(&chosen), [recap_text.clone(), "other".into()]);
        assert_eq!(
            tokens,
            u64::from(estimate_tokens(&recap_text) + estimate_tokens("other"))
        );
        // Every entry it quotes goes, the recap in the first one's place.
        let hits = vec![
            hit("a", 3, quoted),
            hit("b", 1, "other"),
            hit("a", 4, "Tom: noted."),
            recap("a", (1, 5), &recap_text),
        ];
        let (chosen, tokens, _) = choose(&hits, &s, &cover_of(&[1]), 1000, u64::MAX);
        assert_eq!(texts(&chosen), [recap_text.clone(), "other".into()]);
        assert_eq!(
            tokens,
            u64::from(estimate_tokens(&recap_text) + estimate_tokens("other"))
        );
        // The recap first: the entry it quotes adds nothing.
        let hits = vec![recap("a", (1, 5), &recap_text), hit("a", 3, quoted)];
        let (chosen, _, _) = choose(&hits, &s, &cover_of(&[1]), 1000, u64::MAX);
        assert_eq!(texts(&chosen), [recap_text.as_str()]);
        // An entry the recap does not quote, or of another range or
        // session, is its own hit.
        let hits = vec![
            recap("a", (1, 5), &recap_text),
            hit("a", 4, "Tom said something else."),
            hit("a", 9, quoted),
            hit("c", 3, quoted),
        ];
        let (chosen, _, _) = choose(&hits, &s, &cover_of(&[1]), 1000, u64::MAX);
        assert_eq!(chosen.len(), 4);
        // A recap that would not fit in the entry's place leaves it.
        let hits = vec![hit("a", 3, quoted), recap("a", (1, 5), &recap_text)];
        let room = u64::from(estimate_tokens(quoted));
        let (chosen, _, _) = choose(&hits, &s, &cover_of(&[1]), room, u64::MAX);
        assert_eq!(texts(&chosen), [quoted]);
    }

    #[test]
    fn recalled_items_come_first_and_count_in_the_tokens() {
        let ctx = joined(vec![hit("a", 1, "four words right here")], cover_of(&[1]));
        assert!(matches!(&ctx.items[0], ContextItem::Recalled(r) if r.session == "a"));
        assert!(matches!(&ctx.items[1], ContextItem::Entry(e) if e.seq == 1));
        assert_eq!(
            ctx.tokens,
            3 + estimate_tokens("four words right here"),
            "{ctx:?}"
        );
        assert_eq!(
            ctx.tokens,
            ctx.items.iter().map(ContextItem::tokens).sum::<u32>()
        );
    }
}

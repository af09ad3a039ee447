//! Search's ranking, shared by the backends: a strict leg (every term that
//! is not common in the tenant's index, or every term if all are) and,
//! when it finds fewer than asked, a relaxed leg (any of the terms that are
//! not common, the exclusions kept) after it. Each
//! backend runs one leg (`search_leg`) with every filter inside it, before
//! its limit, and says which terms are common (`common_terms`).
//!
//! A search's bound lives here, so that every caller has it: all its
//! statements (the probe and both legs) share one deadline, its budget from
//! when it began (`bound.rs`). Each backend stops its statement at the
//! deadline (`SearchTooCostly`, or `SearchBusy` when the search mostly
//! waited) and as soon as the caller's future is dropped (a
//! client gone, a deadline of its own): a search left behind runs on no
//! longer than it takes the engine to notice, and holds no read
//! transaction (on SQLite, what keeps an erasure's text in the log).

use std::time::Duration;

use super::bound::SearchBound;
use super::{Backend, Store, StoreError};
use crate::model::{Metadata, Millis, Role, SegmentId, SessionName, Subject, Tenant};
use crate::search::query::{Query, Term};

/// A term found in at least this many of the tenant's documents is left
/// out of the legs (it would rank almost everything, and weighing it reads
/// its whole posting list), unless every term is.
pub(crate) const COMMON_DOCS: u32 = 2000;

/// The most matching texts of each kind (entries, summaries) a leg ranks,
/// the newest that pass its filters: what bounds a leg's work whatever
/// its words hold. A leg over words in fewer texts than this (every rare
/// word is) ranks them all.
pub(crate) const CANDIDATES: u32 = 1000;

/// What a search may return: all given filters hold for every hit.
#[derive(Debug, Clone, Default)]
pub(crate) struct SearchScope {
    /// Only these sessions (empty: any of the tenant's).
    pub(crate) sessions: Vec<SessionName>,
    pub(crate) subject: Option<Subject>,
    /// Said strictly after / before these times: an entry's
    /// `occurred_at`, a summary's last entry's.
    pub(crate) after: Option<Millis>,
    pub(crate) before: Option<Millis>,
    /// Only entries of these roles (summaries have none, so any role
    /// leaves them out); empty: any.
    pub(crate) roles: Vec<Role>,
    /// 0 entries, 1 segment recaps, 2+ roll-ups; empty: 0 and 1.
    pub(crate) levels: Vec<u32>,
    /// Only entries whose metadata holds every one of these pairs
    /// (summaries have none, so any pair leaves them out); empty: any.
    pub(crate) metadata: Metadata,
    /// Hits only the semantic leg found are kept only at this cosine to
    /// the query or above. Not a filter of either leg: it is applied when
    /// the legs are fused (`fuse`), since a hit the words found stays
    /// whatever its similarity.
    pub(crate) min_similarity: Option<f32>,
}

impl SearchScope {
    /// The levels searched, defaults applied.
    pub(crate) fn levels(&self) -> Vec<u32> {
        if self.levels.is_empty() {
            vec![0, 1]
        } else {
            self.levels.clone()
        }
    }
}

/// One entry (level 0, no segment) or one node's summary found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SearchHit {
    pub(crate) session: String,
    pub(crate) level: u32,
    pub(crate) first_seq: u64,
    pub(crate) last_seq: u64,
    pub(crate) segment_id: Option<SegmentId>,
    pub(crate) role: Option<Role>,
    pub(crate) created_at: Millis,
    /// When an entry was said; a summary's last entry's.
    pub(crate) occurred_at: Millis,
    /// An entry's speaker (a summary has none).
    pub(crate) name: Option<String>,
    /// An entry's metadata (a summary has none).
    pub(crate) metadata: Metadata,
    pub(crate) text: String,
    /// 1 / (60 + rank), rank counted from 1: a reciprocal-rank score, so
    /// that legs fuse by adding them.
    pub(crate) score: f64,
    /// The legs that found it.
    pub(crate) legs: Vec<Leg>,
    /// The cosine of its vector to the query's, as the semantic leg
    /// computed it; 0 when that leg did not find it.
    pub(crate) similarity: f32,
    /// Its place, from 1, in each leg's own ranking; 0 when that leg did
    /// not find it.
    pub(crate) lexical_rank: u32,
    pub(crate) semantic_rank: u32,
    /// The share of the query the lexical leg found in it: its terms'
    /// weights (`weigh`) that the text holds, over all of them; 0 from the
    /// semantic leg. Not on the wire: fusion reads it.
    pub(crate) held: f32,
}

/// A leg of Search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leg {
    /// The words (FTS5, or a tsvector).
    Lexical,
    /// The meaning (embeddings).
    Semantic,
}

/// The constant of reciprocal rank fusion: a hit's score in a leg is
/// 1 / (K + rank).
const RRF_K: f64 = 60.0;

/// Scores hits, best first, by their reciprocal rank, and marks them as
/// found by `leg`, at that place in it.
pub(crate) fn rank(hits: &mut [SearchHit], leg: Leg) {
    for (i, h) in hits.iter_mut().enumerate() {
        let place = i as u32 + 1;
        h.score = 1.0 / (RRF_K + f64::from(place));
        h.legs = vec![leg];
        match leg {
            Leg::Lexical => h.lexical_rank = place,
            Leg::Semantic => h.semantic_rank = place,
        }
    }
}

/// How much each of the query's terms weighs, by how few of the tenant's
/// texts hold it (`docs`, counted up to `COMMON_DOCS`): an inverse
/// document frequency, so that "is" and "my" weigh next to nothing
/// against "profession".
fn term_weight(docs: u32) -> f32 {
    (1.0 + COMMON_DOCS as f32 / (1.0 + docs as f32)).ln()
}

/// Sets each lexical hit's `held`: the weight of the query's groups its
/// text holds, over the weight of all of them (1 for a query of one group,
/// which every hit of the leg holds). A group (a word and its alternatives,
/// `or`'s or its other forms) weighs as its rarest term and is held by any
/// of them, so "grew" answers for "grow" in full; a phrase is held when all
/// its words are. `docs` counts each term's texts, in the groups' order.
pub(crate) fn weigh(hits: &mut [SearchHit], groups: &[Vec<Term>], docs: &[u32]) {
    if groups.len() < 2 {
        for h in hits {
            h.held = 1.0;
        }
        return;
    }
    let mut counts = docs.iter();
    let weighed: Vec<(&[Term], f32)> = groups
        .iter()
        .map(|g| {
            let weight = (counts.by_ref().take(g.len()))
                .map(|n| term_weight(*n))
                .fold(0.0, f32::max);
            (g.as_slice(), weight)
        })
        .collect();
    let all: f32 = weighed.iter().map(|(_, w)| w).sum();
    for h in hits {
        let mut said = crate::search::query::words(&h.text);
        said.sort_unstable();
        said.dedup();
        let has = |w: &String| said.binary_search(w).is_ok();
        let held: f32 = (weighed.iter())
            .filter(|(g, _)| g.iter().any(|t| t.0.iter().all(has)))
            .map(|(_, w)| w)
            .sum();
        h.held = if all > 0.0 { held / all } else { 1.0 };
    }
}

/// Fuses the legs ranked by `rank` into the best `limit` hits, best first
/// (ties in the legs' order), what is true now first (`newer_first`).
///
/// One leg alone keeps its order and its reciprocal-rank scores. With two,
/// a hit's score is the sum of its votes, 1 / (60 + rank) in each leg that
/// found it (reciprocal rank fusion), each vote weighted by how sure its
/// leg is of the hit, on a scale of 0 to 1:
///
/// - a lexical vote by the share of the query the hit holds (`held`: its
///   terms weighted by how rare they are), so a text that shares only
///   "what", "is" and "my" with the question barely counts as a match by
///   words, and one holding every word that matters counts in full;
/// - a semantic vote by where the hit's cosine stands between the lowest
///   and the highest the leg found (`standing`), so a text much nearer the
///   question than the rest keeps its lead, and the leg's tail, which it
///   returns however far it is, weighs next to nothing.
///
/// Plain reciprocal rank fusion gave any text both legs found, however
/// weakly, more than the best text one leg found (1/62 + 1/63 against
/// 1/61): small talk sharing "is my" ranked above the paraphrased answer
/// the semantic leg put first (docs/benchmarks.md, "Fusion that weighs
/// each leg's votes").
///
/// With `min_similarity`, a hit only the semantic leg found is dropped
/// when its cosine is below it; what the lexical leg found stays.
pub(crate) fn fuse(
    legs: Vec<Vec<SearchHit>>,
    limit: usize,
    query: &Query,
    min_similarity: Option<f32>,
) -> Vec<SearchHit> {
    let both = legs.iter().filter(|l| !l.is_empty()).count() > 1;
    let standing = standing(&legs);
    let mut fused: Vec<SearchHit> = Vec::new();
    for mut hit in legs.into_iter().flatten() {
        if both {
            let sure = match hit.legs.first() {
                Some(Leg::Semantic) => standing(hit.similarity),
                Some(Leg::Lexical) | None => hit.held,
            };
            hit.score *= f64::from(sure);
        }
        match fused.iter_mut().find(|f| key(f) == key(&hit)) {
            Some(f) => {
                f.score += hit.score;
                f.legs.extend(hit.legs);
                f.lexical_rank = f.lexical_rank.max(hit.lexical_rank);
                f.semantic_rank = f.semantic_rank.max(hit.semantic_rank);
                if hit.semantic_rank > 0 {
                    f.similarity = hit.similarity;
                }
                f.held = f.held.max(hit.held);
            }
            None => fused.push(hit),
        }
    }
    if let Some(least) = min_similarity {
        fused.retain(|h| h.lexical_rank > 0 || h.similarity >= least);
    }
    // A stable sort: equal scores keep the order they came in.
    fused.sort_by(|a, b| b.score.total_cmp(&a.score));
    fused.truncate(limit);
    newer_first(&mut fused, query);
    fused
}

/// Where a cosine stands among the semantic leg's: 0 at the lowest it
/// found, 1 at the highest (1 for all when they are equal).
fn standing(legs: &[Vec<SearchHit>]) -> impl Fn(f32) -> f32 + use<> {
    let cosines = legs
        .iter()
        .flatten()
        .filter(|h| h.semantic_rank > 0)
        .map(|h| h.similarity);
    let (low, high) = cosines.fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), c| {
        (l.min(c), h.max(c))
    });
    move |cosine| {
        if high > low {
            ((cosine - low) / (high - low)).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// The query's words shorter than this are left out of telling what a
/// hit is about ("what is my", "the", "for"): a subject's words are longer.
const KEY_WORD_CHARS: usize = 4;
/// How far apart (in places) two alike hits may be to trade places: a
/// correction shares the subject's words with what it corrects, so they
/// rank near each other, and an older hit that is merely alike to a newer
/// one far below it is not pushed down the answer.
const BAND: usize = 1;
/// How far a newer hit that states a value of its own and says as much of
/// what was asked may reach up to what it corrects.
const VALUE_BAND: usize = 3;

/// Whether two words are one word in two forms: the same, or sharing a
/// stem of `KEY_WORD_CHARS` letters or more that leaves at most three of
/// the shorter one ("park" and "parking", "renewed" and "renewal").
fn same_stem(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let shorter = a.chars().count().min(b.chars().count());
    common >= KEY_WORD_CHARS && common + 3 >= shorter
}

/// Whether `b` was said after `a`: by `occurred_at`, and within one
/// session at one time (a batch appended at once) by its seq.
fn newer(a: &SearchHit, b: &SearchHit) -> bool {
    b.occurred_at > a.occurred_at
        || (b.occurred_at == a.occurred_at && b.session == a.session && b.first_seq > a.first_seq)
}

/// What is true now first: of any two hits near each other (`BAND`) that
/// say the same thing about one subject, the newer takes the better
/// place, so a correction ranks above what it corrects. Two hits are
/// alike when they share at least one of the query's key words (of
/// `KEY_WORD_CHARS` or more) and at least half of those the one holding
/// fewer holds ("the contractor doing our kitchen is Mira" and "my
/// contractor's name is now Leopold"), and the newer holds no fewer of
/// them than the older (or one fewer, and states a value: a correction
/// worded its own way). Only such hits trade places, each
/// place keeping its score (scores stay best first); every other hit keeps
/// its place.
pub(crate) fn newer_first(hits: &mut [SearchHit], query: &Query) {
    let mut asked: Vec<&str> = query
        .positive()
        .flat_map(|t| t.0.iter().map(String::as_str))
        .filter(|w| w.chars().count() >= KEY_WORD_CHARS)
        .collect();
    asked.sort_unstable();
    asked.dedup();
    // The query's key words each hit holds, as a bit set (at most 64).
    let held: Vec<u64> = hits
        .iter()
        .map(|h| {
            let mut said: Vec<String> = crate::search::query::words(&h.text);
            said.sort_unstable();
            said.dedup();
            asked.iter().take(64).enumerate().fold(0u64, |set, (i, w)| {
                if said.iter().any(|s| same_stem(s, w)) {
                    set | (1 << i)
                } else {
                    set
                }
            })
        })
        .collect();
    let valued: Vec<bool> = hits
        .iter()
        .map(|h| states_a_value(&h.text, &asked))
        .collect();
    let alike = |a: u64, b: u64| {
        let shared = (a & b).count_ones();
        shared >= 1 && shared * 2 >= a.count_ones().min(b.count_ones())
    };
    // Alike hits out of time order trade places until no such pair is
    // left, within a bound (a trade need not undo an earlier one's order
    // when times tie across sessions).
    let mut order: Vec<usize> = (0..hits.len()).collect();
    let mut trades = hits.len() * hits.len();
    'trade: while trades > 0 {
        for j in 1..order.len() {
            // A correction that states a value reaches further up: what
            // it corrects may have a recap holding the old value, or
            // other talk, between them.
            let reach = if valued[order[j]] { VALUE_BAND } else { BAND };
            for i in j.saturating_sub(reach)..j {
                let (a, b) = (order[i], order[j]);
                if j - i > BAND && held[b].count_ones() < held[a].count_ones() {
                    continue;
                }
                // The newer must say as much of what was asked, or all
                // but one of it with a value of its own ("I changed the
                // staging server: it is now Orion" against "the staging
                // server we deploy to is Vega"): an acknowledgement naming
                // one of the words ("noted, the locker") corrects nothing
                // of the fact that holds them all.
                let (older, newer_holds) = (held[a].count_ones(), held[b].count_ones());
                if newer(&hits[a], &hits[b])
                    && alike(held[a], held[b])
                    && (newer_holds >= older
                        || (newer_holds >= 2 && newer_holds + 1 >= older && valued[b]))
                {
                    order.swap(i, j);
                    trades -= 1;
                    continue 'trade;
                }
            }
        }
        break;
    }
    let placed: Vec<SearchHit> = hits.to_vec();
    for (place, &member) in order.iter().enumerate() {
        let score = placed[place].score;
        hits[place] = placed[member].clone();
        hits[place].score = score;
    }
}

/// Whether `text` states a value the query does not name: a word holding
/// a digit (`K7-4417`, `4711`) or a capitalised word inside a sentence
/// (a name, a place); a sentence's first word and "I" are no value.
fn states_a_value(text: &str, asked: &[&str]) -> bool {
    let mut starts = true;
    for raw in text.split_whitespace() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
        let value = word.chars().any(|c| c.is_ascii_digit())
            || (!starts && word != "I" && word.chars().next().is_some_and(char::is_uppercase));
        if value && !asked.contains(&word.to_lowercase().as_str()) {
            return true;
        }
        starts = raw.ends_with(['.', '!', '?', ':']);
    }
    false
}

/// A hit's identity, for dropping the relaxed leg's repeats.
fn key(h: &SearchHit) -> (&str, Option<SegmentId>, u64) {
    (&h.session, h.segment_id, h.first_seq)
}

impl Store {
    /// The tenant's best `limit` hits for `query` within `scope`, or
    /// `SearchTooCostly` (or `SearchBusy`, `bound.rs`) once its statements
    /// have taken `budget`.
    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        budget: Duration,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let deadline = SearchBound::new(budget);
        // Every text acknowledged before this search began is in the index
        // when its statements run (read-your-writes). That work is the
        // writer's, not the query's: waiting on it past the budget is the
        // server being busy (`spent` with no work counted), and the
        // indexing goes on for the next search.
        match tokio::time::timeout_at(deadline.deadline(), self.index_tail_of(tenant)).await {
            Ok(indexed) => indexed?,
            Err(_) => return Err(deadline.spent()),
        }
        // How many texts hold each term (and each of its other forms,
        // `search::forms`) is asked only where it can matter (which terms
        // are common, how much each weighs against the others): a query of
        // one term is run as it is.
        let every_form = query.with_forms(&|_| true);
        let probed: Vec<Term> = every_form.positive().cloned().collect();
        let counts: Vec<u32> = if probed.len() > 1 {
            self.term_docs(tenant, &probed, &deadline).await?
        } else {
            vec![0; probed.len()]
        };
        let docs_of = |t: &Term| {
            (probed.iter().zip(&counts))
                .find(|(p, _)| *p == t)
                .map_or(0, |(_, n)| *n)
        };
        // "grow" finds "grew" too, but a form common in the tenant joins
        // no word: "gone" alone must still find the texts that say "gone"
        // where thousands say "go".
        let forms = query.with_forms(&|t| docs_of(t) < COMMON_DOCS);
        let query = &forms;
        let terms: Vec<Term> = query.positive().cloned().collect();
        let docs: Vec<u32> = terms.iter().map(docs_of).collect();
        let common: Vec<Term> = terms
            .iter()
            .zip(&docs)
            .filter(|(_, n)| **n >= COMMON_DOCS)
            .map(|(t, _)| t.clone())
            .collect();
        let is_common = |t: &Term| common.contains(t);
        // The strict leg leaves the common terms out, unless nothing else
        // is left: they add next to nothing to the ranking, and weighing
        // one reads its whole posting list (what made a query's cost grow
        // with the tenant's size).
        // Only common words: no weight tells the texts apart, and weighing
        // them is the costly part; the newest texts that hold them all come
        // first.
        let (strict, weighed) = match query.without(&is_common) {
            Some(strict) => (strict, true),
            None => (query.clone(), false),
        };
        let mut hits = self
            .search_leg(tenant, scope, &strict, limit, weighed, &deadline)
            .await?;
        if hits.len() < limit as usize
            && let Some(relaxed) = query.relaxed(&is_common)
            && relaxed != strict
        {
            let more = self
                .search_leg(tenant, scope, &relaxed, limit, true, &deadline)
                .await?;
            for h in more {
                if hits.len() == limit as usize {
                    break;
                }
                if !hits.iter().any(|k| key(k) == key(&h)) {
                    hits.push(h);
                }
            }
        }
        rank(&mut hits, Leg::Lexical);
        weigh(&mut hits, &query.all, &docs);
        Ok(hits)
    }

    async fn search_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        weighed: bool,
        deadline: &SearchBound,
    ) -> Result<Vec<SearchHit>, StoreError> {
        on_backend!(self, b => b.search(tenant, scope, query, limit, weighed, deadline).await)
    }

    async fn term_docs(
        &self,
        tenant: &Tenant,
        terms: &[Term],
        deadline: &SearchBound,
    ) -> Result<Vec<u32>, StoreError> {
        on_backend!(self, b => b.term_docs(tenant, terms, deadline).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(session: &str, seq: u64) -> SearchHit {
        SearchHit {
            session: session.to_owned(),
            level: 0,
            first_seq: seq,
            last_seq: seq,
            segment_id: None,
            role: None,
            created_at: Millis(0),
            occurred_at: Millis(0),
            name: None,
            metadata: Metadata::new(),
            text: String::new(),
            score: 0.0,
            legs: Vec::new(),
            similarity: 0.0,
            lexical_rank: 0,
            semantic_rank: 0,
            held: 0.0,
        }
    }

    /// A query no test text holds, so no two hits are alike.
    fn nothing_alike() -> Query {
        Query::parse("zzz").expect("query")
    }

    fn said(seq: u64, at: i64, text: &str) -> SearchHit {
        SearchHit {
            occurred_at: Millis(at),
            text: text.to_owned(),
            ..hit("a", seq)
        }
    }

    #[test]
    fn a_correction_takes_the_place_of_what_it_corrects() {
        let query = Query::parse("What is my gym locker code?").expect("query");
        let mut hits = vec![
            said(1, 100, "My gym locker code is A1-1234."),
            said(2, 300, "Update on my gym locker code: it's K7-4417 now."),
            said(3, 50, "What is my plan for the weekend?"),
            said(4, 400, "Did you lock the gym door?"),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        let seqs: Vec<u64> = hits.iter().map(|h| h.first_seq).collect();
        // 1 and 2 say the same of the locker code: the newer takes the
        // first place. 4 is newer than 3 but about nothing 3 is (no key
        // word of the query in common: "gym" and "is" are too short).
        assert_eq!(seqs, vec![2, 1, 3, 4]);
        // The scores stay with the places.
        assert_eq!(hits[0].score, 1.0 / 61.0);
        assert_eq!(hits[1].score, 1.0 / 62.0);
    }

    #[test]
    fn within_a_session_at_one_time_the_later_seq_is_the_newer() {
        let query = Query::parse("locker code").expect("query");
        let mut hits = vec![
            said(1, 100, "The locker code is A1-1234."),
            said(7, 100, "The locker code is now K7-4417."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        assert_eq!(hits[0].first_seq, 7);
    }

    #[test]
    fn a_newer_text_saying_less_of_what_was_asked_corrects_nothing() {
        let query = Query::parse("What is Ada's locker code?").expect("query");
        let mut hits = vec![
            said(2, 100, "Ada's locker code is 4711, by the boiler."),
            said(3, 100, "Noted, I will remember where the locker is."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        assert_eq!(hits[0].first_seq, 2);
    }

    #[test]
    fn a_correction_in_its_own_words_with_a_value_takes_the_place() {
        // The question's key words: which, staging, server, deploy. The
        // fact holds three of them; its correction two, and a value.
        let query = Query::parse("Which staging server do we deploy to?").expect("query");
        let mut hits = vec![
            said(1, 100, "The staging server we deploy to is Vega."),
            said(9, 900, "I changed the staging server: it is now Orion."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        assert_eq!(hits[0].first_seq, 9);
        // The same words without a value of its own correct nothing.
        let mut hits = vec![
            said(1, 100, "The staging server we deploy to is Vega."),
            said(9, 900, "Remind me, the staging server again?"),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        assert_eq!(hits[0].first_seq, 1);
        // Other forms of the query's words are its words.
        let query = Query::parse("Which spot do I park in at the office garage?").expect("query");
        let mut hits = vec![
            said(1, 100, "I park in spot Z2-2219 at the office garage."),
            said(
                9,
                900,
                "Update on my office parking spot: it's 5144-SH now.",
            ),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        assert_eq!(hits[0].first_seq, 9);
        assert!(same_stem("renewed", "renewal") && same_stem("park", "parking"));
        assert!(!same_stem("garden", "garlic") && !same_stem("wed", "wedding"));
        // A value the query names is none of the text's own.
        assert!(!states_a_value(
            "Where does Vega deploy?",
            &["vega", "deploy"]
        ));
        assert!(states_a_value("my code is now K7-4417", &[]));
        assert!(!states_a_value(
            "Noted. I will remember where the locker is.",
            &[]
        ));
    }

    #[test]
    fn a_correction_stating_a_value_reaches_past_what_lies_between() {
        let query = Query::parse("Where is our wedding venue?").expect("query");
        let hits = || {
            vec![
                said(1, 100, "Got it, the town of your wedding venue is Ghent."),
                said(2, 50, "I'll tell you the town of our wedding venue now."),
                said(3, 50, "The pasta sauce needs more salt."),
                said(
                    9,
                    900,
                    "Okay, the town of your wedding venue is Ushuaia now.",
                ),
            ]
        };
        let mut found = hits();
        rank(&mut found, Leg::Lexical);
        newer_first(&mut found, &query);
        assert_eq!(found[0].first_seq, 9);
        // Without a value of its own it stays where it was found.
        let mut found = hits();
        found[3].text = "Okay, the town of your wedding venue is the one I said.".to_owned();
        rank(&mut found, Leg::Lexical);
        newer_first(&mut found, &query);
        let seqs: Vec<u64> = found.iter().map(|h| h.first_seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 9]);
    }

    #[test]
    fn hits_about_other_things_or_far_apart_keep_their_order_whatever_their_age() {
        let query = Query::parse("locker code cabin password").expect("query");
        let mut hits = vec![
            said(1, 100, "The locker code is A1-1234."),
            said(2, 300, "The cabin wifi password is hunter2."),
            said(3, 400, "The locker code is the one I had."),
            said(4, 250, "The cabin password, again?"),
            said(5, 200, "The cabin is cold."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        let seqs: Vec<u64> = hits.iter().map(|h| h.first_seq).collect();
        // 2, 4 and 5 are about something else (and each older than the
        // one above); 3 is alike to 1 and says as much, but two places
        // below it with no value of its own, past the band.
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
        // A correction stating a value five places below is past its reach.
        let mut hits = vec![
            said(1, 100, "The locker code is A1-1234."),
            said(2, 300, "The cabin wifi password is hunter2."),
            said(3, 250, "The cabin password, again?"),
            said(4, 200, "The cabin is cold."),
            said(5, 150, "The cabin key is lost."),
            said(6, 400, "The locker code is now K7-4417."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        let seqs: Vec<u64> = hits.iter().map(|h| h.first_seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
    }

    /// Lexical hits holding `held` of the query, ranked.
    fn by_words(found: &[(u64, f32)]) -> Vec<SearchHit> {
        let mut hits: Vec<SearchHit> = found
            .iter()
            .map(|&(seq, held)| SearchHit {
                held,
                ..hit("a", seq)
            })
            .collect();
        rank(&mut hits, Leg::Lexical);
        hits
    }

    /// Semantic hits at these cosines, ranked (nearest first, as given).
    fn by_meaning(found: &[(u64, f32)]) -> Vec<SearchHit> {
        let mut hits: Vec<SearchHit> = found
            .iter()
            .map(|&(seq, similarity)| SearchHit {
                similarity,
                ..hit("a", seq)
            })
            .collect();
        rank(&mut hits, Leg::Semantic);
        hits
    }

    #[test]
    fn fusion_adds_reciprocal_ranks_of_sure_votes_and_names_both_legs() {
        // Every lexical hit holds the whole query, and every cosine is the
        // same: each vote counts in full, as plain reciprocal rank fusion.
        let lexical = by_words(&[(1, 1.0), (2, 1.0), (3, 1.0)]);
        let semantic = by_meaning(&[(3, 0.8), (4, 0.8)]);
        let fused = fuse(
            vec![lexical.clone(), semantic.clone()],
            4,
            &nothing_alike(),
            None,
        );
        let seqs: Vec<u64> = fused.iter().map(|h| h.first_seq).collect();
        // 3: 1/63 + 1/61 beats 1: 1/61; 2 and 4 tie at 1/62, in the order
        // the legs came.
        assert_eq!(seqs, vec![3, 1, 2, 4]);
        assert!((fused[0].score - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert_eq!(fused[0].legs, vec![Leg::Lexical, Leg::Semantic]);
        assert_eq!(
            (
                fused[0].lexical_rank,
                fused[0].semantic_rank,
                fused[0].similarity
            ),
            (3, 1, 0.8)
        );
        assert_eq!(fused[3].legs, vec![Leg::Semantic]);
        assert_eq!((fused[3].lexical_rank, fused[3].semantic_rank), (0, 2));
        assert_eq!((fused[1].lexical_rank, fused[1].semantic_rank), (1, 0));
        assert_eq!(fused[1].similarity, 0.0);
        // The limit cuts after fusing.
        assert_eq!(
            fuse(vec![lexical, semantic], 1, &nothing_alike(), None).len(),
            1
        );
    }

    #[test]
    fn a_near_text_found_by_meaning_alone_outranks_small_talk_both_legs_found() {
        // 1 is the answer, found by meaning only (cosine 0.92); 2..5 share
        // only "what is my" with the question (a fifth of its weight) and
        // are far by meaning. Plain fusion put 2 first (1/61 + 1/62).
        let lexical = by_words(&[(2, 0.2), (3, 0.2), (4, 0.2), (5, 0.2)]);
        let semantic = by_meaning(&[(1, 0.92), (2, 0.78), (3, 0.77), (4, 0.76), (5, 0.75)]);
        let fused = fuse(vec![lexical, semantic], 10, &nothing_alike(), None);
        assert_eq!(fused[0].first_seq, 1);
        assert_eq!(fused[0].legs, vec![Leg::Semantic]);
        // A text holding every word that matters counts in full: a little
        // nearer than the farthest, it ranks first.
        let lexical = by_words(&[(6, 1.0), (2, 0.2)]);
        let semantic = by_meaning(&[(1, 0.92), (6, 0.80), (2, 0.78)]);
        let fused = fuse(vec![lexical, semantic], 10, &nothing_alike(), None);
        let seqs: Vec<u64> = fused.iter().map(|h| h.first_seq).collect();
        assert_eq!(seqs, vec![6, 1, 2]);
        assert!((fused[1].score - 1.0 / 61.0).abs() < 1e-12);
    }

    #[test]
    fn one_leg_alone_keeps_its_order_and_its_scores() {
        let lexical = by_words(&[(1, 0.1), (2, 1.0)]);
        let fused = fuse(vec![lexical, Vec::new()], 10, &nothing_alike(), None);
        let scored: Vec<(u64, f64)> = fused.iter().map(|h| (h.first_seq, h.score)).collect();
        assert_eq!(scored, vec![(1, 1.0 / 61.0), (2, 1.0 / 62.0)]);
        let semantic = by_meaning(&[(1, 0.9), (2, 0.1)]);
        let fused = fuse(vec![semantic], 10, &nothing_alike(), None);
        assert_eq!(fused[1].score, 1.0 / 62.0);
    }

    #[test]
    fn min_similarity_drops_what_only_meaning_found_below_it() {
        let lexical = by_words(&[(1, 0.5)]);
        let semantic = by_meaning(&[(2, 0.9), (3, 0.6), (1, 0.3), (4, 0.2)]);
        let fused = fuse(vec![lexical, semantic], 10, &nothing_alike(), Some(0.6));
        let mut seqs: Vec<u64> = fused.iter().map(|h| h.first_seq).collect();
        seqs.sort_unstable();
        // 4 goes; 1 stays (the words found it), 3 stays (at the bound).
        assert_eq!(seqs, vec![1, 2, 3]);
        let semantic = by_meaning(&[(2, 0.9), (3, 0.6)]);
        assert!(fuse(vec![semantic], 10, &nothing_alike(), Some(0.95)).is_empty());
    }

    #[test]
    fn a_hit_holds_the_weight_of_the_query_terms_in_it() {
        let query = Query::parse("what is my \"night shift\" profession").expect("query");
        // "is" and "my" in every text (capped), "what" in 300, the phrase
        // in 20, "profession" in none.
        let docs = [300, COMMON_DOCS, COMMON_DOCS, 20, 0];
        let mut hits = vec![
            said(1, 0, "What is my plan?"),
            said(2, 0, "The night shift is my profession."),
            said(3, 0, "The night bus."),
        ];
        weigh(&mut hits, &query.all, &docs);
        let w = |n: u32| term_weight(n);
        let all = w(300) + 2.0 * w(COMMON_DOCS) + w(20) + w(0);
        assert!((hits[0].held - (w(300) + 2.0 * w(COMMON_DOCS)) / all).abs() < 1e-6);
        assert!((hits[1].held - (all - w(300)) / all).abs() < 1e-6);
        // A phrase is held only when all its words are (not "night" alone).
        assert_eq!(hits[2].held, 0.0);
        // Common words weigh far less than rare ones.
        assert!(hits[0].held < 0.3, "{}", hits[0].held);
        // A query of one term: every hit holds all of it.
        let one = Query::parse("shift").expect("query");
        weigh(&mut hits, &one.all, &[0]);
        assert!(hits.iter().all(|h| h.held == 1.0));
    }

    #[test]
    fn any_form_of_a_word_holds_its_weight_in_full() {
        let query = Query::parse("where did I grow up")
            .expect("query")
            .with_forms(&|_| true);
        // "grow" in 40 texts, "grew" in 1, "grown" in none.
        let docs = [300, 500, COMMON_DOCS, 40, 1, 0, 900];
        let mut hits = vec![
            said(1, 0, "I grew up in Bilbao."),
            said(2, 0, "Are leeks hard to grow from seed?"),
        ];
        weigh(&mut hits, &query.all, &docs);
        let w = |n: u32| term_weight(n);
        let all = w(300) + w(500) + w(COMMON_DOCS) + w(0) + w(900);
        assert!((hits[0].held - (w(COMMON_DOCS) + w(0) + w(900)) / all).abs() < 1e-6);
        assert!((hits[1].held - w(0) / all).abs() < 1e-6);
    }
}

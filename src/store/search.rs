//! Search's ranking, shared by the backends: a strict leg (every term that
//! is not common in the tenant's index, or every term if all are) and,
//! when it finds fewer than asked, a relaxed leg (any of the terms that are
//! not common, the exclusions kept) after it. Each
//! backend runs one leg (`search_leg`) with every filter inside it, before
//! its limit, and says which terms are common (`common_terms`).
//!
//! A search's bound lives here, so that every caller has it: all its
//! statements (the probe and both legs) share one deadline, its budget from
//! when it began. Each backend stops its statement at the deadline
//! (`SearchTooCostly`) and as soon as the caller's future is dropped (a
//! client gone, a deadline of its own): a search left behind runs on no
//! longer than it takes the engine to notice, and holds no read
//! transaction (on SQLite, what keeps an erasure's text in the log).

use std::time::Duration;

use tokio::time::Instant;

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
/// found by `leg`.
pub(crate) fn rank(hits: &mut [SearchHit], leg: Leg) {
    for (i, h) in hits.iter_mut().enumerate() {
        h.score = 1.0 / (RRF_K + (i + 1) as f64);
        h.legs = vec![leg];
    }
}

/// Reciprocal rank fusion of legs ranked by `rank`: a hit's score is the
/// sum of its scores in the legs that found it, and the best `limit` come
/// back, best first (ties in the first leg's order), what is true now
/// first (`newer_first`).
pub(crate) fn fuse(legs: Vec<Vec<SearchHit>>, limit: usize, query: &Query) -> Vec<SearchHit> {
    let mut fused: Vec<SearchHit> = Vec::new();
    for hit in legs.into_iter().flatten() {
        match fused.iter_mut().find(|f| key(f) == key(&hit)) {
            Some(f) => {
                f.score += hit.score;
                f.legs.extend(hit.legs);
            }
            None => fused.push(hit),
        }
    }
    // A stable sort: equal scores keep the order they came in.
    fused.sort_by(|a, b| b.score.total_cmp(&a.score));
    fused.truncate(limit);
    newer_first(&mut fused, query);
    fused
}

/// The query's words shorter than this are left out of telling what a
/// hit is about ("what is my", "the", "for"): a subject's words are longer.
const KEY_WORD_CHARS: usize = 4;
/// How far apart (in places) two alike hits may be to trade places: a
/// correction shares the subject's words with what it corrects, so they
/// rank near each other, and an older hit that is merely alike to a newer
/// one far below it is not pushed down the answer.
const BAND: usize = 1;

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
                if said.binary_search_by(|s| s.as_str().cmp(w)).is_ok() {
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
            for i in j.saturating_sub(BAND)..j {
                let (a, b) = (order[i], order[j]);
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
    /// `SearchTooCostly` once its statements have taken `budget`.
    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        budget: Duration,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let deadline = Instant::now() + budget;
        // Which terms are common is asked only where it can matter: a
        // query of one term is run as it is.
        let terms: Vec<Term> = query.positive().cloned().collect();
        let common: Vec<Term> = if terms.len() > 1 {
            let flags = self.common_terms(tenant, &terms, deadline).await?;
            terms
                .into_iter()
                .zip(flags)
                .filter_map(|(t, c)| c.then_some(t))
                .collect()
        } else {
            Vec::new()
        };
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
            .search_leg(tenant, scope, &strict, limit, weighed, deadline)
            .await?;
        if hits.len() < limit as usize
            && let Some(relaxed) = query.relaxed(&is_common)
            && relaxed != strict
        {
            let more = self
                .search_leg(tenant, scope, &relaxed, limit, true, deadline)
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
        Ok(hits)
    }

    async fn search_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
        weighed: bool,
        deadline: Instant,
    ) -> Result<Vec<SearchHit>, StoreError> {
        on_backend!(self, b => b.search(tenant, scope, query, limit, weighed, deadline).await)
    }

    async fn common_terms(
        &self,
        tenant: &Tenant,
        terms: &[Term],
        deadline: Instant,
    ) -> Result<Vec<bool>, StoreError> {
        on_backend!(self, b => b.common_terms(tenant, terms, deadline).await)
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
    fn hits_about_other_things_or_far_apart_keep_their_order_whatever_their_age() {
        let query = Query::parse("locker code cabin password").expect("query");
        let mut hits = vec![
            said(1, 100, "The locker code is A1-1234."),
            said(2, 300, "The cabin wifi password is hunter2."),
            said(3, 400, "The locker code is now K7-4417."),
        ];
        rank(&mut hits, Leg::Lexical);
        newer_first(&mut hits, &query);
        let seqs: Vec<u64> = hits.iter().map(|h| h.first_seq).collect();
        // 2 is about something else; 3 is alike to 1 but two places
        // below it, past the band.
        assert_eq!(seqs, vec![1, 2, 3]);
    }

    #[test]
    fn fusion_adds_reciprocal_ranks_and_names_both_legs() {
        let mut lexical = vec![hit("a", 1), hit("a", 2), hit("a", 3)];
        let mut semantic = vec![hit("a", 3), hit("a", 4)];
        rank(&mut lexical, Leg::Lexical);
        rank(&mut semantic, Leg::Semantic);
        let fused = fuse(vec![lexical.clone(), semantic.clone()], 4, &nothing_alike());
        let seqs: Vec<u64> = fused.iter().map(|h| h.first_seq).collect();
        // 3: 1/63 + 1/61 beats 1: 1/61; 2 and 4 tie at 1/62, in the order
        // the legs came.
        assert_eq!(seqs, vec![3, 1, 2, 4]);
        assert!((fused[0].score - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert_eq!(fused[0].legs, vec![Leg::Lexical, Leg::Semantic]);
        assert_eq!(fused[3].legs, vec![Leg::Semantic]);
        // The limit cuts after fusing.
        assert_eq!(fuse(vec![lexical, semantic], 1, &nothing_alike()).len(), 1);
    }
}

//! A change of embedding generation (model or dimensions), the
//! backend-neutral face. The store remembers the active generation; when
//! a server starts under another, every text stored until then is owed a
//! vector of the new one through a range walked in key order (the
//! `embedding_state` row), as the lexical index's language change is: each
//! step looks at a bounded number of texts past the range's lower bound and
//! owes those that lack a vector of the generation and are not owed
//! already (texts stored since the change are owed by the statement that
//! stores them). Turning embeddings on walks the same way: while they are
//! off no text is owed (nothing is written for them). The old vectors
//! stay, unused by Search, until nothing owed has one and the range is
//! walked: then they go, a bounded batch a step (and, on PostgreSQL, the
//! old generation's HNSW index with the last of them).

use super::{Backend, Store, StoreError};
use crate::model::{Generation, Tenant};

/// Texts one step looks at, at most: the work of a step is bounded
/// whatever the range holds.
pub(crate) const SCAN: u32 = 5_000;

/// Old vectors one step drops at most.
pub(crate) const DROP_BATCH: u32 = 5_000;

/// What a step of the walk did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reowed {
    /// Texts made owed by this step.
    pub(crate) owed: u64,
    /// Nothing of the range is left to walk.
    pub(crate) done: bool,
}

/// What a step of dropping the old generations' vectors did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// The new generation is not complete yet (the range is still being
    /// walked, or an owed text still has only an old vector).
    Waiting,
    /// This many old vectors went (0: none was left).
    Vectors(u64),
}

/// One key of a walked range: the key itself, the document and session it
/// names, and whether it lacks a vector of the generation and a debt.
pub(super) struct Walked {
    pub(super) key: i64,
    pub(super) doc: i64,
    pub(super) session: i64,
    pub(super) lacking: bool,
}

/// From the texts a step looked at (`scanned`, in key order, asked for at
/// most `SCAN`), those to owe (at most `limit`) and where the range's lower
/// bound goes next: None when the part is walked (fewer than asked came
/// back, or the last reaches `until`).
pub(super) fn pick(scanned: &[Walked], limit: u64, until: i64) -> (Vec<(i64, i64)>, Option<i64>) {
    let mut owe = Vec::new();
    for w in scanned {
        if w.lacking {
            owe.push((w.doc, w.session));
            if owe.len() as u64 >= limit.max(1) {
                return (owe, (w.key < until).then_some(w.key));
            }
        }
    }
    let next = match scanned.last() {
        Some(last) if scanned.len() as u32 >= SCAN && last.key < until => Some(last.key),
        _ => None,
    };
    (owe, next)
}

impl Store {
    /// Makes `generation` the active one and has every text stored from
    /// now on owed a vector. When it was another, or embeddings were off
    /// (nothing stored meanwhile is owed), every text stored so far is
    /// walked for it; returns the generation before, when it changed
    /// (`Some(None)`: there was none).
    pub(crate) async fn set_embedding_generation(
        &self,
        generation: &Generation,
    ) -> Result<Option<Option<String>>, StoreError> {
        on_backend!(self, b => b.set_embedding_generation(generation).await)
    }

    /// Embeddings are off: no text stored from now on is owed a vector
    /// (nothing is written for embeddings; turning them on again walks
    /// what was stored meanwhile). The generation stays, so a backfill
    /// still knows what the vectors are of.
    pub(crate) async fn stop_owing_embeddings(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.stop_owing_embeddings().await)
    }

    /// The active generation, if embeddings ever ran.
    pub(crate) async fn embedding_generation(&self) -> Result<Option<String>, StoreError> {
        on_backend!(self, b => b.embedding_generation().await)
    }

    /// One step of the walk: owes at most `limit` of the next `SCAN` texts
    /// that lack a vector of `generation`. Nothing (done) when `generation`
    /// is no longer the active one: a run under another took over.
    pub(crate) async fn reowe(
        &self,
        generation: &Generation,
        limit: u64,
    ) -> Result<Reowed, StoreError> {
        on_backend!(self, b => b.reowe(generation, limit).await)
    }

    /// Texts of the walk still to look at that lack a vector of
    /// `generation` and are not owed (the backlog counts them as pending);
    /// one tenant's, or with `None` every tenant's.
    pub(crate) async fn unwalked(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.unwalked(tenant, generation).await)
    }

    /// Once `generation` is complete, drops at most `limit` vectors of the
    /// others (with the last of a generation, its index and its row).
    /// Waiting, and nothing dropped, when `generation` is not the active
    /// one: the vectors of the active one are never a stale run's to drop.
    pub(crate) async fn drop_old_vectors(
        &self,
        generation: &Generation,
        limit: u32,
    ) -> Result<Dropped, StoreError> {
        on_backend!(self, b => b.drop_old_vectors(generation, limit).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walked(keys: &[(i64, bool)]) -> Vec<Walked> {
        keys.iter()
            .map(|&(key, lacking)| Walked {
                key,
                doc: key,
                session: 1,
                lacking,
            })
            .collect()
    }

    #[test]
    fn a_step_owes_at_most_its_limit_and_resumes_after_the_last_it_owed() {
        let scanned = walked(&[(1, true), (2, false), (3, true), (4, true)]);
        let (owe, next) = pick(&scanned, 2, 100);
        assert_eq!(owe, vec![(1, 1), (3, 1)]);
        assert_eq!(next, Some(3));
        // Fewer than SCAN came back: the part is walked.
        let (owe, next) = pick(&scanned, 10, 100);
        assert_eq!(owe.len(), 3);
        assert_eq!(next, None);
        // The limit reached at the range's end: walked too.
        let (_, next) = pick(&walked(&[(100, true)]), 1, 100);
        assert_eq!(next, None);
    }

    #[test]
    fn a_full_scan_with_nothing_lacking_moves_past_what_it_looked_at() {
        let scanned: Vec<Walked> = (1..=i64::from(SCAN))
            .map(|key| Walked {
                key,
                doc: key,
                session: 1,
                lacking: false,
            })
            .collect();
        let (owe, next) = pick(&scanned, 10, i64::MAX);
        assert!(owe.is_empty());
        assert_eq!(next, Some(i64::from(SCAN)));
    }
}

//! What is owed an embedding, and the vectors: the backend-neutral face.
//! An entry or a summary is owed a vector from the transaction that stores
//! its text; a batch of owed items is claimed (owner, fencing token, lease)
//! as a segment is, its vectors written only while the claim holds, and
//! what follows a failed pass is a `Disposition` as for recaps. Erasing
//! the text takes its vector and its debt in the same transaction.
//!
//! SQLite keeps vectors beside the rows and compares them exactly, in
//! Rust (`sqlite/embeddings.rs`); PostgreSQL through pgvector's HNSW index
//! (`postgres/embeddings.rs`), on a server that has the extension: one
//! without it is refused at start-up when embeddings are on
//! (`require_vectors`).

use std::time::Duration;

use super::search::{SearchHit, SearchScope};
use super::{Backend, Store, StoreError};
use crate::failure::Failure;
use crate::model::{Disposition, EmbeddingBacklog, Generation, SessionName, Tenant};

/// A held claim on a batch of owed items.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchClaim {
    pub(crate) owner: String,
    pub(crate) token: i64,
}

/// One item of a batch: its document id and the text to embed.
#[derive(Clone, Debug)]
pub(crate) struct Owed {
    pub(crate) doc: i64,
    pub(crate) text: String,
}

/// A claimed batch.
#[derive(Clone, Debug)]
pub(crate) struct Batch {
    pub(crate) claim: BatchClaim,
    pub(crate) items: Vec<Owed>,
    /// The most passes any of its items has had (for the spacing).
    pub(crate) passes: u32,
}

/// What a pass that stored no vectors leaves on its batch.
#[derive(Clone, Debug)]
pub(crate) struct EndedBatch {
    pub(crate) disposition: Disposition,
    pub(crate) attempts: u32,
    pub(crate) failure: Option<Failure>,
    /// The embedder configuration the pass ran under; a parked item is due
    /// again once the server runs under another.
    pub(crate) fingerprint: String,
}

/// What a semantic leg found: its hits, best first, and the share of the
/// scope's texts that have a vector of the generation.
#[derive(Clone, Debug, Default)]
pub(crate) struct SemanticLeg {
    pub(crate) hits: Vec<SearchHit>,
    pub(crate) embedded_share: f64,
}

impl Store {
    /// Makes sure the store can keep vectors, before a run with
    /// embeddings on starts: PostgreSQL needs the `vector` extension
    /// (pgvector), created here when the server has it and the role may;
    /// otherwise the run is refused by name (`VectorsMissing`). SQLite,
    /// and a detached store (a probe), need nothing.
    pub(crate) async fn require_vectors(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Postgres(b) => b.require_vectors().await,
            Backend::Sqlite(_) | Backend::Detached => Ok(()),
        }
    }

    /// Claims up to `limit` owed items that are due and not claimed by a
    /// live worker, oldest debt first, for `lease`; None when none is due.
    /// Items of a session being erased are left alone.
    ///
    /// A batch holds the texts of one owner only: the owner of the oldest
    /// due debt, a tenant and a subject (a tenant's sessions without one
    /// are one owner). A failed batch's failure, which may quote its texts
    /// (an embedder echoing its inputs in a 400), is stored on each of its
    /// items, so it can show a text only to its own owner; erasing a
    /// session forgets its owner's stored failures (`forget_owner_failures`
    /// in each backend).
    pub(crate) async fn claim_owed(
        &self,
        owner: &str,
        lease: Duration,
        limit: u32,
    ) -> Result<Option<Batch>, StoreError> {
        on_backend!(self, b => b.claim_owed(owner, lease, limit).await)
    }

    /// Stores the vectors (doc, unit vector) of `generation` for the items
    /// `claim` still holds, and clears their debt, in one transaction;
    /// returns how many were stored (an item erased meanwhile is not).
    pub(crate) async fn store_vectors(
        &self,
        claim: &BatchClaim,
        generation: &Generation,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.store_vectors(claim, generation, vectors).await)
    }

    /// Records a pass that stored nothing on the items `claim` still holds,
    /// as its disposition says, and lets them go; returns how many.
    pub(crate) async fn end_batch(
        &self,
        claim: &BatchClaim,
        ended: EndedBatch,
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.end_batch(claim, ended).await)
    }

    /// Makes every item parked or put off (not due yet) after a pass that
    /// failed under an embedder configuration other than `fingerprint` due
    /// now; returns how many. A Retry-After of the old embedder (up to 30
    /// days) says nothing of the new one.
    pub(crate) async fn unpark_owed(&self, fingerprint: &str) -> Result<u64, StoreError> {
        on_backend!(self, b => b.unpark_owed(fingerprint).await)
    }

    /// Makes the tenant's owed items (of `session` only, if given) that
    /// are not due yet due now, and with `include_parked` the parked ones
    /// too: RequeueSegments' part for embeddings. Returns how many.
    pub(crate) async fn requeue_owed(
        &self,
        tenant: &Tenant,
        session: Option<&SessionName>,
        include_parked: bool,
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.requeue_owed(tenant, session, include_parked).await)
    }

    /// The length of the generation's vectors, once one is stored.
    pub(crate) async fn generation_dimensions(
        &self,
        generation: &Generation,
    ) -> Result<Option<usize>, StoreError> {
        on_backend!(self, b => b.generation_dimensions(generation).await)
    }

    /// What is owed, parked and embedded in `generation`; one tenant's, or
    /// with `None` every tenant's. Pending counts the texts a change of
    /// generation has still to walk too.
    pub(crate) async fn embedding_backlog(
        &self,
        tenant: Option<&Tenant>,
        generation: &Generation,
    ) -> Result<EmbeddingBacklog, StoreError> {
        let mut backlog = on_backend!(self, b => b.embedding_backlog(tenant, generation).await)?;
        // Texts a change of generation has yet to owe are owed all the same.
        backlog.pending += self.unwalked(tenant, generation).await?;
        Ok(backlog)
    }

    /// The tenant's `limit` texts within `scope` nearest `query` (a unit
    /// vector of `generation`) by cosine, every filter applied before the
    /// limit; scores are reciprocal ranks as the lexical leg's.
    pub(crate) async fn semantic_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        generation: &Generation,
        query: Vec<f32>,
        limit: u32,
    ) -> Result<SemanticLeg, StoreError> {
        let mut leg =
            on_backend!(self, b => b.semantic_leg(tenant, scope, generation, query, limit).await)?;
        super::search::rank(&mut leg.hits, super::search::Leg::Semantic);
        Ok(leg)
    }
}

/// The cosine of two unit vectors: their dot product. Summed in 16
/// independent lanes, which the compiler vectorises (a single running sum
/// is a chain of dependent additions it may not reorder); the sum is as
/// exact, only in another order.
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = [0f32; LANES];
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A unit vector as the bytes the store keeps (little-endian f32).
pub(crate) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Stored bytes back to a vector; None when they are not whole f32s.
pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_through_their_bytes() {
        let v = vec![0.6f32, -0.8, 0.0];
        assert_eq!(from_bytes(&to_bytes(&v)), Some(v.clone()));
        assert_eq!(from_bytes(&[1, 2, 3]), None);
        assert!((cosine(&v, &v) - 1.0).abs() < 1e-6);
        assert!(cosine(&v, &[0.8, 0.6, 0.0]).abs() < 1e-6);
    }
}

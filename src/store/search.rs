//! Search's ranking, shared by the backends: a strict leg (every term) and,
//! when it finds fewer than asked, a relaxed leg (any of the terms that are
//! not common in the tenant's index, the exclusions kept) after it. Each
//! backend runs one leg (`search_leg`) with every filter inside it, before
//! its limit, and says whether a term is common (`is_common`).

use super::{Backend, Store, StoreError};
use crate::model::{Millis, Role, SegmentId, SessionName, Subject, Tenant};
use crate::search::query::{Query, Term};

/// A term found in at least this many of the tenant's documents is left
/// out of the relaxed leg (it would rank almost everything).
pub(crate) const COMMON_DOCS: u32 = 2000;

/// What a search may return: all given filters hold for every hit.
#[derive(Debug, Clone, Default)]
pub(crate) struct SearchScope {
    /// Only these sessions (empty: any of the tenant's).
    pub(crate) sessions: Vec<SessionName>,
    pub(crate) subject: Option<Subject>,
    /// Stored strictly after / before these times.
    pub(crate) after: Option<Millis>,
    pub(crate) before: Option<Millis>,
    /// Only entries of these roles (summaries have none, so any role
    /// leaves them out); empty: any.
    pub(crate) roles: Vec<Role>,
    /// 0 entries, 1 segment recaps, 2+ roll-ups; empty: 0 and 1.
    pub(crate) levels: Vec<u32>,
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
    pub(crate) text: String,
    /// 1 / (60 + rank), rank counted from 1: a reciprocal-rank score, so
    /// that legs fuse by adding them.
    pub(crate) score: f64,
}

/// A hit's identity, for dropping the relaxed leg's repeats.
fn key(h: &SearchHit) -> (&str, Option<SegmentId>, u64) {
    (&h.session, h.segment_id, h.first_seq)
}

impl Store {
    /// The tenant's best `limit` hits for `query` within `scope`.
    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let mut hits = self.search_leg(tenant, scope, query, limit).await?;
        if hits.len() < limit as usize && query.positive().count() > 1 {
            let mut common = Vec::new();
            for term in query.positive() {
                if self.is_common(tenant, term).await? {
                    common.push(term.clone());
                }
            }
            if let Some(relaxed) = query.relaxed(&|t| common.contains(t)) {
                let more = self.search_leg(tenant, scope, &relaxed, limit).await?;
                for h in more {
                    if hits.len() == limit as usize {
                        break;
                    }
                    if !hits.iter().any(|k| key(k) == key(&h)) {
                        hits.push(h);
                    }
                }
            }
        }
        for (i, h) in hits.iter_mut().enumerate() {
            h.score = 1.0 / (60.0 + (i + 1) as f64);
        }
        Ok(hits)
    }

    async fn search_leg(
        &self,
        tenant: &Tenant,
        scope: &SearchScope,
        query: &Query,
        limit: u32,
    ) -> Result<Vec<SearchHit>, StoreError> {
        on_backend!(self, b => b.search(tenant, scope, query, limit).await)
    }

    async fn is_common(&self, tenant: &Tenant, term: &Term) -> Result<bool, StoreError> {
        on_backend!(self, b => b.is_common(tenant, term).await)
    }
}

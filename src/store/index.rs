//! The lexical index's language and its backlog, behind the store
//! boundary: texts stored before the index existed, or before a change of
//! language, are indexed in batches beside appends (`search::indexer`
//! drives it), never in one transaction that would hold writes back. Until
//! a text is indexed Search does not find it; nothing else waits on it.

use std::time::Duration;

use super::{Backend, Store, StoreError};
use crate::config::SearchLanguage;
use crate::model::Tenant;

/// What one batch of the backlog did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Indexed {
    /// Texts indexed by this batch.
    pub(crate) texts: u64,
    /// Nothing is owed any more.
    pub(crate) done: bool,
}

impl Store {
    /// Makes `language` the index's: when the database's is another, the
    /// index starts over in it and every stored text is owed again (true).
    /// Replicas of one database must share the setting.
    pub(crate) async fn set_search_language(
        &self,
        language: SearchLanguage,
    ) -> Result<bool, StoreError> {
        on_backend!(self, b => b.set_search_language(language).await)
    }

    /// When the index built behind the appends (SQLite's tail) is
    /// indexed: at `texts` texts waiting, and at least every `wait` while
    /// any wait. PostgreSQL indexes in the storing transaction (its GIN
    /// pending list is read by every query), so it has nothing to set.
    pub(crate) fn set_index_tail(&self, texts: u64, wait: Duration) {
        if let Backend::Sqlite(b) = &self.backend {
            b.set_tail_policy(texts, wait);
        }
    }

    /// Makes every text of the tenant stored before now findable by the
    /// index: on SQLite, indexes the tenant's tail (the search's first
    /// step: read-your-writes).
    pub(crate) async fn index_tail_of(&self, tenant: &Tenant) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(b) => b.index_tail_of(&tenant.0).await,
            Backend::Postgres(_) => Ok(()),
            Backend::Detached => Err(StoreError::Detached),
        }
    }

    /// How many stored texts the index still owes.
    pub(crate) async fn index_backlog(&self) -> Result<u64, StoreError> {
        on_backend!(self, b => b.index_backlog().await)
    }

    /// Indexes up to `batch` owed texts, oldest first, in one transaction.
    pub(crate) async fn index_some(&self, batch: u32) -> Result<Indexed, StoreError> {
        on_backend!(self, b => b.index_some(batch).await)
    }
}

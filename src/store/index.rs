//! The lexical index's language and its backlog, behind the store
//! boundary: texts stored before the index existed, or before a change of
//! language, are indexed in batches beside appends (`search::indexer`
//! drives it), never in one transaction that would hold writes back. Until
//! a text is indexed Search does not find it; nothing else waits on it.

use super::{Backend, Store, StoreError};
use crate::config::SearchLanguage;

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

    /// How many stored texts the index still owes.
    pub(crate) async fn index_backlog(&self) -> Result<u64, StoreError> {
        on_backend!(self, b => b.index_backlog().await)
    }

    /// Indexes up to `batch` owed texts, oldest first, in one transaction.
    pub(crate) async fn index_some(&self, batch: u32) -> Result<Indexed, StoreError> {
        on_backend!(self, b => b.index_some(batch).await)
    }
}

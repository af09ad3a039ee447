//! Search: the caller's query, parsed once here and rendered for each
//! backend's engine (the store runs it), and the indexer that drains the
//! lexical index's backlog.

pub(crate) mod forms;
pub(crate) mod indexer;
pub(crate) mod query;

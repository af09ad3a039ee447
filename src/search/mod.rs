//! Search: the caller's query, parsed once here and rendered for each
//! backend's engine (the store runs it).

pub(crate) mod query;

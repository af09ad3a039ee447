//! Command-line entry points other than `serve`.

pub mod session;

//! archivist: a memory summarisation service for LLM agents.
//!
//! An agent host streams conversation entries into sessions over gRPC;
//! archivist groups them into segments and, when a segment closes, has a
//! summariser write a recap of it. A recap that fails is retried by one
//! bounded pass, and a reconciler drains whatever is still owed a recap, so
//! nothing is left as a permanent hole in an agent's recall.
//!
//! # Codemap
//!
//! - `config`: the TOML / environment / flag configuration and its checks.
//! - `model`: plain domain types (sessions, entries, segments, summaries).
//! - `failure`: the failure taxonomy and the `Failure` record.
//! - `store`: the only place with SQL; migrations, group commit, claims.
//! - `provider`: summarisers: the OpenAI-compatible client and the
//!   built-in extractive one; one attempt each, classified failures.
//! - `retry`: the pass, the one bounded retry loop; knows nothing of HTTP.
//! - `summarise`: one segment's pass end to end, and joining a running one.
//! - `reconciler`: the background drain of due PENDING segments, and the
//!   schedule of passes after a failure.
//! - `breaker`: the provider-wide circuit breaker the reconciler obeys.
//! - `service`: the operations behind the RPCs, free of wire types.
//! - `grpc`: the tonic service, validation, conversions, status mapping.
//! - `server`: wiring for `archivist serve`, health and reflection, and
//!   the bounded shutdown.
//! - `backfill`: the operator's drain of unsummarised segments and its report.
//! - `client`: connecting to a server (the terminal client uses it).
//! - `auth`: tenants and their bearer tokens (hashes, constant-time).
//! - `metrics`: the Prometheus metrics, one registry per server.
//! - `pb`: the generated `archivist.v1` wire types, client and server.
//!
//! # Invariants
//!
//! - Only `grpc` sees tonic request and status types; only `store` sees SQL;
//!   only `provider` sees reqwest.
//! - Retries happen in one place, `retry::run_pass`; nothing wraps a pass in
//!   another retry loop and no HTTP layer retries on its own.
//! - An acknowledged append is committed before its answer is sent.
//! - A summary is written only by the holder of a live claim on its
//!   segment, and only by a pass that succeeded; nothing else ever stands in
//!   for a recap.
//! - Passes run in their own tasks: a caller that stops waiting never
//!   cancels one.

pub mod auth;
pub mod backfill;
pub mod breaker;
pub mod cli;
pub mod client;
pub mod config;
pub mod failure;
pub mod grpc;
pub mod metrics;
pub mod model;
pub mod provider;
pub mod reconciler;
pub mod retry;
pub mod server;
pub mod service;
pub mod store;
pub mod summarise;

/// The generated `archivist.v1` types, client and server.
pub mod pb {
    #![allow(clippy::all)]
    tonic::include_proto!("archivist.v1");

    /// The encoded descriptors of `archivist.v1`, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("archivist_descriptor");
}

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
//! Public (what a user of the library calls):
//! - `config`: the TOML / environment / flag configuration (`load.rs`
//!   layers the sources, `validate.rs` checks what types cannot).
//! - `model`: plain domain types (sessions, entries, segments, summaries).
//! - `failure`: the failure taxonomy and the `Failure` record
//!   (`classify.rs` reads a provider's answer, `redact.rs` keeps secrets
//!   out of every text).
//! - `client`: connecting to a server, and `CallError`, which decodes every
//!   error detail.
//! - `server`: `archivist serve`: wiring, health, reflection, metrics
//!   endpoint, the bounded shutdown.
//! - `cli`: the binary's commands other than `serve`: `backfill`, `check`
//!   (one probe of the provider through a real pass), `migrate` (the
//!   schema, as a deploy step), and the terminal client (`session.rs` its
//!   commands, `reads.rs` and `waits.rs` the longer ones, `search.rs`
//!   `archivist search`, `import.rs` `archivist import` (a history from
//!   JSON Lines, as it happened), `terminal.rs` the flags, connection and
//!   exit status they share, `output.rs` what they print, as text or
//!   JSON).
//! - `mcp`: `archivist mcp`, the Model Context Protocol server (stdio or
//!   streamable HTTP, on `rmcp`) in front of a running archivist: the
//!   tools (`tools.rs`, `recall.rs` the search), their arguments checked
//!   before any call (`args.rs`), every failure a tool error (`error.rs`),
//!   answers within a cap (`answer.rs`), the handler and its shared
//!   connection (`handler.rs`), the HTTP endpoint and its session cap
//!   (`http.rs`).
//! - `pb`: the generated `archivist.v1` wire types, client and server.
//! - `internals`: what the benchmarks and integration tests drive directly.
//!
//! Private:
//! - `app`: the composition root; builds store, provider, breaker, metrics
//!   and summariser once, for serve, backfill, check and the benches, and
//!   holds a run to the provider the database was served with.
//! - `store/`: the backend-neutral store (`mod.rs`), the GetContext cover
//!   over the memory tree (`context.rs`), what a GetContext with a query
//!   recalls before the cover (`recall.rs`), Search's legs and their fusion
//!   (`search.rs`), what is owed an embedding and the vectors
//!   (`embeddings.rs`), the SQLite backend (`sqlite/`: `writer.rs` group commit,
//!   `schema.rs` migrations, `rows.rs` decoding, `sessions.rs` appends,
//!   idle closing and the session listing, `segments.rs` reads, `entries.rs`
//!   the transcript (ListEntries), `claims.rs` claims, `runs.rs` the provider each kind of run last used,
//!   `checkpoint.rs` checkpoints off the writer and the scrub of erasures,
//!   `fts.rs` the search file and the FTS5 table of each tenant,
//!   `indexer.rs` the thread that indexes the tail beside the writer,
//!   `search.rs` the lexical leg, `index.rs` the index's backlog,
//!   `embeddings.rs` batch claims, vectors and the exact cosine leg,
//!   `vectors.rs` the cosine leg's cache of each tenant's vectors), the
//!   PostgreSQL backend for replicas (`postgres/`: the same files by
//!   concern, the append writers' group commit in `sessions.rs`,
//!   `embeddings.rs` pgvector's HNSW leg and the check for it, `notes.rs`
//!   LISTEN/NOTIFY between replicas, `testing.rs` a database per test), and
//!   one suite for every backend (`tests.rs`).
//! - `provider/`: summarisers, one attempt each: the OpenAI-compatible
//!   client and the built-in extractive one; every prompt and its version
//!   in `prompts.rs`; the embeddings client (`embed.rs`); the HTTP
//!   plumbing both OpenAI-compatible clients share (`http.rs`: bounded
//!   bodies, Retry-After, classification, redaction).
//! - `pass/`: recap passes: `retry.rs` the one bounded retry loop,
//!   `schedule.rs` what follows a pass without a recap (`Disposition`) and
//!   the lease, `recap.rs` chunk-and-fold planning, `record.rs` the Failure
//!   of a pass and its hint, `pipeline.rs` claim-recap-write and the
//!   provider probe, `embed.rs` a batch's embedding (claim, pass, write)
//!   and the query's, `mod.rs` the registry of running passes.
//! - `breaker`: the provider-wide circuit breaker.
//! - `reconciler`: the background drain of due PENDING segments and
//!   roll-ups, the closing of segments idle for `segment.max_idle`, and the
//!   erasure of sessions past `retention.session_ttl`.
//! - `events`: the hub `WatchSession` streams from, in-process, bounded
//!   per watcher, with the watch budget (server-wide and per tenant),
//!   relayed to the other replicas through the store's notes when it has
//!   them (a GAP to every watcher when notes may be lost).
//! - `backfill`: the operator's drain and its report.
//! - `service`: the operations behind the RPCs, free of wire types.
//! - `grpc/`: the tonic service (`mod.rs`), request checks (`validate.rs`),
//!   statuses (`status.rs`), the layers around every call (`gate.rs`),
//!   answers kept within the message limit (`fit.rs`), and the accept loop
//!   with its connection cap and idle timeout (`conn.rs`).
//! - `wire`: domain ⇄ `pb`, both ways, for server and client.
//! - `auth`: tenants and their bearer tokens; `metrics`: Prometheus;
//!   `text`: UTF-8-safe cutting and hex; `throttle`: log lines a flood
//!   cannot multiply; `test_log` (tests only): log lines captured.
//!
//! # Invariants (and how to check each)
//!
//! - Only `store/sqlite/` sees SQL and rusqlite, and only `store/postgres/`
//!   sees tokio-postgres and its pool:
//!   `grep -rl 'rusqlite::\|use rusqlite' src` lists `src/store/sqlite/`
//!   files only, `grep -rl 'tokio_postgres\|deadpool' src` lists
//!   `src/store/postgres/` files only.
//! - Only the provider sees reqwest: `grep -rl 'reqwest::' src` lists
//!   `src/provider/` files only.
//! - tonic is seen by the gRPC edge and the client only:
//!   `grep -rl 'tonic' src` lists `grpc/`, `server.rs`, `client.rs`,
//!   `wire.rs`, the terminal client in `cli/`, the MCP server's calls and
//!   errors in `mcp/` and this file (for `pb`).
//! - Only `mcp/` sees the MCP SDK: `grep -rl 'rmcp' src` lists `mcp/`
//!   files only.
//! - Only `wire.rs` converts between domain and `pb` types:
//!   `grep -rn 'fn .*_to_pb\|fn .*_from_pb' src` finds them in `wire.rs`.
//! - Retries happen in one place, `pass/retry.rs`'s `run_pass`; nothing
//!   wraps a pass in another retry loop and the HTTP clients are built with
//!   `retry::never()`: `grep -rn 'run_pass(' src` finds two callers, the
//!   recap's (`pass/pipeline.rs`) and the embedding's (`pass/embed.rs`).
//! - What follows a failed pass is decided in one place:
//!   `grep -rn 'Disposition::' src` finds it built only in `pass/`.
//! - An acknowledged append is committed before its answer is sent (the
//!   writer answers after COMMIT: `store/sqlite/writer.rs`,
//!   `store/postgres/writer.rs`'s `run_batch`).
//! - A summary is written only by the holder of a live claim on its
//!   segment, and only by a pass that succeeded: every write under a claim
//!   matches `HELD` in `store/sqlite/claims.rs` (and in
//!   `store/postgres/claims.rs`).
//! - Passes run in their own tasks: a caller that stops waiting never
//!   cancels one (`pass/mod.rs`, `run_or_join_until`).
//! - No two modules import each other. The layers, bottom up: `text`,
//!   `throttle` and `failure`; `model`; `config`; `auth`, `store`, `provider`, `breaker`
//!   and `metrics`; `events`; `pass`; `reconciler` and `service`; `app`; `backfill`,
//!   `wire`, `grpc` and `client`; `server` and `cli`; `mcp`. A module's non-test
//!   `crate::` paths name only modules in its own layer or below.

mod app;
mod auth;
mod backfill;
mod breaker;
pub mod cli;
pub mod client;
pub mod config;
mod events;
pub mod failure;
mod grpc;
pub mod mcp;
mod metrics;
pub mod model;
mod pass;
mod provider;
mod reconciler;
mod search;
pub mod server;
mod service;
mod store;
#[cfg(test)]
mod test_log;
mod text;
mod throttle;
mod wire;

/// What the benchmarks and integration tests drive directly; not a stable
/// API.
#[doc(hidden)]
pub mod internals {
    pub use crate::app::App;
    pub use crate::breaker::TRIP_AFTER;
    pub use crate::pass::{PassOutcome, Summariser};
    pub use crate::provider::Extractive;
    pub use crate::reconciler::Reconciler;
    pub use crate::store::{Budget, Store, StoreError};
}

/// An error and every source beneath it, joined for one log line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    failure::cause_chain(err).join(": ")
}

/// The generated `archivist.v1` types, client and server.
pub mod pb {
    #![allow(clippy::all)]
    tonic::include_proto!("archivist.v1");

    /// The encoded descriptors of `archivist.v1`, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("archivist_descriptor");
}

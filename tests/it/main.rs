//! Integration tests through the real server and the generated client, and
//! through the real binary where a process boundary matters.

mod backfill;
mod binary;
mod context;
mod embed_tenancy;
mod embeddings;
mod entries;
mod erasure;
mod errors;
mod failures;
mod harness;
mod hostile;
mod import;
mod lifecycle;
mod logs;
mod operator;
mod pool_cache;
mod provider;
mod reconciler;
mod replicas;
mod search;
mod search_bounds;
mod search_cli;
mod search_fresh;
mod search_fusion;
mod search_tail;
mod security;
mod segments;
mod subjects;
mod time;
mod time_search;
mod tooling;
mod tree;
mod turn;
mod watches;
mod winddown;

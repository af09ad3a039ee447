//! Drains the search index's backlog beside appends: the texts stored
//! before the index existed, or before its language changed, indexed a
//! batch per transaction with a pause between, so appends and erasures
//! interleave with it. It ends when nothing is owed; a store error is
//! logged and tried again. Replicas of one PostgreSQL database each run it
//! and take turns on the backlog's row.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::failure::cause_chain;
use crate::store::Store;

/// Texts indexed per transaction: a few milliseconds of the writer.
const BATCH: u32 = 1000;
/// Between batches: room for the appends queued meanwhile.
const PAUSE: Duration = Duration::from_millis(10);
/// After a failed batch.
const RETRY: Duration = Duration::from_secs(5);
/// How often progress is logged.
const REPORT: Duration = Duration::from_secs(10);

/// Indexes what the index owes until nothing is, or `stop`.
pub(crate) async fn run(store: Store, stop: CancellationToken) {
    let owed = match store.index_backlog().await {
        Ok(0) => return,
        Ok(n) => n,
        Err(e) => {
            warn!(error = %cause_chain(&e).join(": "), "reading the search index's backlog failed");
            0
        }
    };
    info!(
        owed,
        "indexing stored texts for search in the background; until it is done, search finds only what is indexed"
    );
    let (started, mut reported) = (Instant::now(), Instant::now());
    let mut indexed = 0u64;
    loop {
        let wait = match store.index_some(BATCH).await {
            Ok(step) => {
                indexed += step.texts;
                if step.done {
                    info!(
                        indexed,
                        seconds = started.elapsed().as_secs(),
                        "the search index holds every stored text"
                    );
                    return;
                }
                PAUSE
            }
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "indexing for search failed; trying again");
                RETRY
            }
        };
        if reported.elapsed() >= REPORT {
            info!(indexed, owed, "indexing stored texts for search");
            reported = Instant::now();
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

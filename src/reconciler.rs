//! The reconciler: a background task inside `serve` that drains PENDING
//! segments that are due (after a crash, a failed pass, a deferred
//! Retry-After). The database is the queue; the notify from the close path
//! only makes it look sooner, and a missed notify loses nothing because
//! every tick scans again.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::breaker::Breaker;
use crate::config::ReconcilerConfig;
use crate::failure::{AfterPass, Failure, FailureClass, cause_chain};
use crate::model::{Millis, SegmentId};
use crate::store::Store;
use crate::summarise::{PassOutcome, Summariser};

pub struct Reconciler {
    store: Store,
    summariser: Arc<Summariser>,
    config: ReconcilerConfig,
    wake: Arc<Notify>,
}

/// Sleeps until the breaker's next probe, or forever when it is closed.
async fn probe_time(breaker: &Breaker) {
    match breaker.next_probe() {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Reconciler {
    pub fn new(
        store: Store,
        summariser: Arc<Summariser>,
        config: ReconcilerConfig,
        wake: Arc<Notify>,
    ) -> Reconciler {
        Reconciler {
            store,
            summariser,
            config,
            wake,
        }
    }

    /// Runs until `cancel` fires: scans on every tick, on every wake-up and
    /// whenever a pass ends, keeping at most `concurrency` passes running.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut running: JoinSet<PassOutcome> = JoinSet::new();
        loop {
            self.fill(&mut running).await;
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
                _ = self.wake.notified() => {}
                _ = probe_time(self.summariser.breaker()) => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        // The passes themselves run in the summariser's tasks; shutdown
        // waits for them there, bounded by its ceiling.
        running.detach_all();
    }

    /// One scan and its passes, run to the end. Returns how many passes ran.
    pub async fn step(&self) -> usize {
        let mut running = JoinSet::new();
        self.fill(&mut running).await;
        let n = running.len();
        while running.join_next().await.is_some() {}
        n
    }

    async fn fill(&self, running: &mut JoinSet<PassOutcome>) {
        let free = (self.config.concurrency as usize).saturating_sub(running.len());
        if free == 0 {
            return;
        }
        let due = match self.due(free).await {
            Ok(due) => due,
            Err(e) => {
                warn!(error = %e, "reconciler scan failed");
                return;
            }
        };
        for id in due {
            // While the provider is failing for everyone, one probe at a
            // time instead of a pass for every due segment.
            if !self.summariser.breaker().admit(id) {
                break;
            }
            let summariser = self.summariser.clone();
            running.spawn(async move { summariser.run_or_join(id).await });
        }
    }

    async fn due(&self, free: usize) -> Result<Vec<SegmentId>, String> {
        // Passes this process has just started may not have committed their
        // claims yet, so the scan can still return them; skip those, and
        // scan further when that left slots empty and there may be more.
        let mut limit = free + self.summariser.running();
        loop {
            self.summariser.metrics().scan();
            let ids = self
                .store
                .due_segments(Millis::now(), u32::try_from(limit).unwrap_or(u32::MAX))
                .await
                .map_err(|e| cause_chain(&e).join(": "))?;
            let exhausted = ids.len() < limit;
            let fresh: Vec<SegmentId> = ids
                .into_iter()
                .filter(|id| !self.summariser.is_running(*id))
                .take(free)
                .collect();
            if fresh.len() == free || exhausted || limit > MAX_SCAN {
                return Ok(fresh);
            }
            limit *= 2;
        }
    }
}

/// The most due segments one scan reads.
const MAX_SCAN: usize = 4096;

/// When a segment whose pass failed is due again: spacing that doubles with
/// every pass (from the reconciler's interval, with up to 50 % jitter
/// subtracted so that a batch that failed together does not come back
/// together), capped at `max_spacing`; never sooner than a Retry-After;
/// `quota_delay` for an exhausted quota; at once for a cancelled pass.
pub fn next_due_after(
    failure: &Failure,
    passes: u32,
    config: &ReconcilerConfig,
    now: Millis,
) -> Millis {
    match failure.class.after_pass() {
        AfterPass::Release => return now,
        // A parked segment is not scanned; its due time only matters once
        // a requeue sets a new one.
        AfterPass::Park => return now,
        AfterPass::Reschedule => {}
    }
    if failure.class == FailureClass::QuotaExhausted {
        return now.saturating_add(config.quota_delay);
    }
    let exp = passes.saturating_sub(1).min(30);
    let base = config
        .interval
        .saturating_mul(1u32 << exp)
        .min(config.max_spacing);
    let jittered = base.mul_f64(1.0 - 0.5 * rand::random::<f64>());
    let spacing = match failure.retry_after {
        Some(wait) => jittered.max(wait),
        None => jittered,
    };
    now.saturating_add(spacing)
}

//! The reconciler: a background task inside `serve` that drains PENDING
//! segments that are due (after a crash, a failed pass, a deferred
//! Retry-After). The database is the queue; the notify from the close path
//! only makes it look sooner, and a missed notify loses nothing because
//! every tick scans again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::breaker::Breaker;
use crate::config::ReconcilerConfig;
use crate::failure::cause_chain;
use crate::metrics::Metrics;
use crate::model::{Millis, SegmentId};
use crate::pass::{PassOutcome, Summariser};
use crate::store::Store;

pub struct Reconciler {
    store: Store,
    summariser: Arc<Summariser>,
    breaker: Arc<Breaker>,
    metrics: Arc<Metrics>,
    config: ReconcilerConfig,
    /// `segment.max_idle`: an OPEN segment with no append this long is
    /// closed; zero: never.
    max_idle: Duration,
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
    pub(crate) fn new(
        store: Store,
        summariser: Arc<Summariser>,
        breaker: Arc<Breaker>,
        metrics: Arc<Metrics>,
        config: ReconcilerConfig,
        max_idle: Duration,
        wake: Arc<Notify>,
    ) -> Reconciler {
        Reconciler {
            store,
            summariser,
            breaker,
            metrics,
            config,
            max_idle,
            wake,
        }
    }

    /// Runs until `cancel` fires: closes idle segments on every tick, and
    /// scans on every tick, on every wake-up and whenever a pass ends,
    /// keeping at most `concurrency` passes running.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut running: JoinSet<PassOutcome> = JoinSet::new();
        let mut ticked = true;
        loop {
            if std::mem::take(&mut ticked) {
                self.close_idle().await;
            }
            self.fill(&mut running).await;
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => ticked = true,
                _ = self.wake.notified() => {}
                _ = probe_time(&self.breaker) => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        // The passes themselves run in the summariser's tasks; shutdown
        // waits for them there, bounded by its ceiling.
        running.detach_all();
    }

    /// Closes the OPEN segments nobody has appended to for `max_idle`, so
    /// that a conversation whose host went away without closing it still
    /// gets its recap. The store reads the idle ones through an index; the
    /// idle time is in the database, so it carries across restarts.
    async fn close_idle(&self) {
        if self.max_idle.is_zero() {
            return;
        }
        let cutoff = Millis(
            Millis::now()
                .0
                .saturating_sub(i64::try_from(self.max_idle.as_millis()).unwrap_or(i64::MAX)),
        );
        loop {
            match self.store.close_idle_segments(cutoff, IDLE_BATCH).await {
                Ok(closed) => {
                    if !closed.is_empty() {
                        info!(
                            closed = closed.len(),
                            max_idle = %crate::text::human_duration(self.max_idle),
                            "closed segments with no append for segment.max_idle; their recaps are due"
                        );
                    }
                    if closed.len() < IDLE_BATCH as usize {
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %cause_chain(&e).join(": "), "closing idle segments failed");
                    return;
                }
            }
        }
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
            if !self.breaker.admit(id) {
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
            self.metrics.scan();
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
/// The most idle segments closed in one write.
const IDLE_BATCH: u32 = 256;

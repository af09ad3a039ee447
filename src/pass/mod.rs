//! Recap passes. A pass is one bounded retry loop around the provider
//! (`retry.rs`, the only place anything is retried); the pipeline
//! (`pipeline.rs`) claims a segment, plans its recap (`recap.rs`), runs the
//! passes and writes the summary, or the failure (`record.rs`) with what
//! follows it (`schedule.rs`), under the claim. This file is the registry of
//! passes running in this process, so that a second caller for a segment
//! joins the pass under way instead of starting another.

pub(crate) mod embed;
mod pipeline;
mod recap;
mod record;
pub(crate) mod retry;
pub(crate) mod schedule;

pub(crate) use pipeline::ProbeOutcome;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::field::Empty;
use tracing::{Instrument, info_span};

use crate::breaker::{Breaker, Signal};
use crate::config::{Config, ReconcilerConfig, RetryConfig};
use crate::events::Hub;
use crate::failure::Failure;
use crate::metrics::Metrics;
use crate::model::SegmentId;
use crate::provider::Provider;
use crate::store::{Store, StoreError};

/// How a pass ended, as every waiter on it sees it.
#[derive(Clone, Debug)]
pub enum PassOutcome {
    /// The summary is written.
    Summarised,
    /// The pass failed; the segment records the same failure.
    Failed(Failure),
    /// The pass was cancelled (shutdown, a flush at its bound); the segment
    /// is due again with nothing counted against it.
    Cancelled,
    /// Another worker holds the segment's claim, or it is not PENDING.
    NotClaimed,
    /// The store failed; nothing was written.
    StoreFailed(Arc<StoreError>),
    /// The pass's task panicked; nothing was written.
    Panicked,
}

impl PassOutcome {
    /// What the outcome says of the provider.
    fn signal(&self) -> Signal {
        match self {
            PassOutcome::Summarised => Signal::Success,
            PassOutcome::Failed(f) => Signal::of_failure(f.class),
            PassOutcome::Cancelled
            | PassOutcome::NotClaimed
            | PassOutcome::StoreFailed(_)
            | PassOutcome::Panicked => Signal::Neutral,
        }
    }
}

/// What the summariser needs of the configuration.
#[derive(Clone, Debug)]
pub(crate) struct SummariserConfig {
    pub(crate) retry: RetryConfig,
    pub(crate) reconciler: ReconcilerConfig,
    pub(crate) max_input_tokens: u32,
    pub(crate) max_output_tokens: u32,
    /// Children per roll-up (0: none).
    pub(crate) fanout: u32,
    /// Estimated tokens of context carried into a level-1 recap (0: none).
    pub(crate) carry_tokens: u32,
}

impl From<&Config> for SummariserConfig {
    fn from(config: &Config) -> SummariserConfig {
        SummariserConfig {
            retry: config.retry.clone(),
            reconciler: config.reconciler.clone(),
            max_input_tokens: config.provider.max_input_tokens,
            max_output_tokens: config.provider.max_output_tokens,
            fanout: config.memory.fanout,
            carry_tokens: config.memory.carry_tokens,
        }
    }
}

/// Whom a summariser tells how its passes went.
pub(crate) struct Reports {
    pub(crate) breaker: Arc<Breaker>,
    pub(crate) metrics: Arc<Metrics>,
    /// The reconciler, of new work (a roll-up owed).
    pub(crate) wake: Arc<Notify>,
    pub(crate) events: Arc<Hub>,
}

/// Runs passes and keeps the registry of those running in this process.
pub struct Summariser {
    store: Store,
    provider: Provider,
    breaker: Arc<Breaker>,
    metrics: Arc<Metrics>,
    /// Tells the reconciler there is work (a roll-up just became owed).
    wake: Arc<Notify>,
    /// Tells watchers how passes end.
    events: Arc<Hub>,
    config: SummariserConfig,
    owner: String,
    running: Mutex<HashMap<SegmentId, watch::Receiver<Option<PassOutcome>>>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Summariser {
    pub(crate) fn new(
        store: Store,
        provider: Provider,
        reports: Reports,
        config: SummariserConfig,
        owner: String,
    ) -> Arc<Summariser> {
        Arc::new(Summariser {
            store,
            provider,
            breaker: reports.breaker,
            metrics: reports.metrics,
            wake: reports.wake,
            events: reports.events,
            config,
            owner,
            running: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        })
    }

    fn lease(&self) -> Duration {
        schedule::lease(&self.config.retry)
    }

    /// Runs a pass over `id`, or joins the one this process already runs.
    /// The pass itself runs in its own task: a waiter that gives up (a
    /// deadline, a client gone) does not cancel it.
    pub async fn run_or_join(self: &Arc<Self>, id: SegmentId) -> PassOutcome {
        self.run_or_join_until(id, None).await
    }

    /// As `run_or_join`, but a pass this call starts is cancelled at
    /// `cancel_at` (its segment released, due again at once, nothing counted
    /// against it), so that the call's answer comes with the claim let go.
    /// A pass joined here keeps its own bounds.
    pub(crate) async fn run_or_join_until(
        self: &Arc<Self>,
        id: SegmentId,
        cancel_at: Option<Instant>,
    ) -> PassOutcome {
        let mut rx = {
            let mut running = lock(&self.running);
            match running.get(&id) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    running.insert(id, rx.clone());
                    let this = self.clone();
                    let span = info_span!("pass", segment_id = id, session = Empty);
                    self.tracker.spawn(
                        async move {
                            // Leaves the registry however the pass ends, a
                            // panic included, so the segment is never
                            // taken for running forever.
                            let _registered = Registered {
                                summariser: &this,
                                id,
                            };
                            let cancel = this.cancel.child_token();
                            let pass = this.pass(id, &cancel);
                            let outcome = match cancel_at {
                                None => pass.await,
                                Some(at) => {
                                    tokio::pin!(pass);
                                    tokio::select! {
                                        outcome = &mut pass => outcome,
                                        () = tokio::time::sleep_until(at) => {
                                            cancel.cancel();
                                            pass.await
                                        }
                                    }
                                }
                            };
                            this.breaker.record(id, outcome.signal());
                            // Out of the registry before the answer, so that
                            // nobody joins a pass that has already reported.
                            lock(&this.running).remove(&id);
                            let _ = tx.send(Some(outcome));
                        }
                        .instrument(span),
                    );
                    rx
                }
            }
        };
        match rx.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone().unwrap_or(PassOutcome::NotClaimed),
            // The pass task ended without answering: it panicked. Its claim
            // runs out and the reconciler takes the segment up again.
            Err(_) => PassOutcome::Panicked,
        }
    }

    pub(crate) fn is_running(&self, id: SegmentId) -> bool {
        lock(&self.running).contains_key(&id)
    }

    /// How many passes this process runs now.
    pub(crate) fn running(&self) -> usize {
        lock(&self.running).len()
    }

    /// Every pass task this summariser started; for shutdown.
    pub(crate) fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Whether `cancel_all` was called (the process is stopping).
    pub(crate) fn is_stopping(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Cancels every running pass: sleeps and sends stop at once, and their
    /// segments are released, due again, with nothing counted against them.
    pub(crate) fn cancel_all(&self) {
        self.cancel.cancel();
    }
}

/// A pass's entry in the registry, removed when the pass's task ends.
struct Registered<'a> {
    summariser: &'a Summariser,
    id: SegmentId,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        lock(&self.summariser.running).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

//! One segment's recap pass, end to end: claim the segment, read its
//! entries, ask the provider, write the summary (or the failure) under the
//! claim. Also the registry of passes running in this process, so that a
//! second caller for the same segment joins the pass under way instead of
//! starting another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info_span, warn};

use crate::config::{ReconcilerConfig, RetryConfig};
use crate::failure::{AfterPass, Failure, cause_chain};
use crate::model::{Millis, SegmentId, SegmentState, Summary};
use crate::provider::{Provider, RecapRequest};
use crate::reconciler::next_due_after;
use crate::store::{FailedPass, Store, StoreError};

/// How a pass ended, as every waiter on it sees it.
#[derive(Clone, Debug)]
pub enum PassOutcome {
    /// The summary is written.
    Summarised,
    /// The pass failed; the segment records the same failure.
    Failed(Failure),
    /// Another worker holds the segment's claim, or it is not PENDING.
    NotClaimed,
    /// The store failed; nothing was written.
    StoreFailed(Arc<StoreError>),
}

pub struct Summariser {
    store: Store,
    provider: Provider,
    retry: RetryConfig,
    reconciler: ReconcilerConfig,
    max_output_tokens: u32,
    owner: String,
    running: Mutex<HashMap<SegmentId, watch::Receiver<Option<PassOutcome>>>>,
    tracker: TaskTracker,
}

impl Summariser {
    pub fn new(
        store: Store,
        provider: Provider,
        retry: RetryConfig,
        reconciler: ReconcilerConfig,
        max_output_tokens: u32,
        owner: String,
    ) -> Arc<Summariser> {
        Arc::new(Summariser {
            store,
            provider,
            retry,
            reconciler,
            max_output_tokens,
            owner,
            running: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
        })
    }

    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// A claim outlives the longest pass, so that a live worker never loses
    /// its claim to an expiry while still inside the ceiling.
    pub fn lease(&self) -> Duration {
        self.retry.pass_ceiling * 2 + Duration::from_secs(30)
    }

    /// Runs a pass over `id`, or joins the one this process already runs.
    /// The pass itself runs in its own task: a waiter that gives up (a
    /// deadline, a client gone) does not cancel it.
    pub async fn run_or_join(self: &Arc<Self>, id: SegmentId) -> PassOutcome {
        let mut rx = {
            let mut running = lock(&self.running);
            match running.get(&id) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    running.insert(id, rx.clone());
                    let this = self.clone();
                    let span = info_span!("pass", segment_id = id);
                    self.tracker.spawn(
                        async move {
                            let outcome = this.pass(id).await;
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
            // The pass task ended without answering: it panicked.
            Err(_) => PassOutcome::StoreFailed(Arc::new(StoreError::Closed)),
        }
    }

    pub fn is_running(&self, id: SegmentId) -> bool {
        lock(&self.running).contains_key(&id)
    }

    /// Every pass task this summariser started; for shutdown.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    async fn pass(&self, id: SegmentId) -> PassOutcome {
        match self.try_pass(id).await {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "recap pass could not use the store");
                PassOutcome::StoreFailed(Arc::new(e))
            }
        }
    }

    async fn try_pass(&self, id: SegmentId) -> Result<PassOutcome, StoreError> {
        let Some(claim) = self.store.claim(id, &self.owner, self.lease()).await? else {
            return Ok(PassOutcome::NotClaimed);
        };
        let input = self.store.pass_input(id).await?;
        let started = Instant::now();
        let request = RecapRequest {
            entries: &input.entries,
            max_output_tokens: self.max_output_tokens,
        };
        let timeout = self.retry.attempt_timeout.min(self.retry.pass_ceiling);
        let result = self.provider.summarise(&request, timeout).await;
        let attempts = 1;
        match result {
            Ok(recap) => {
                let summary = Summary {
                    text: recap.text,
                    provider: self.provider.name().to_owned(),
                    model: recap.model,
                    prompt_version: recap.prompt_version,
                    input_tokens: recap.input_tokens,
                    output_tokens: recap.output_tokens,
                    created_at: Millis::now(),
                };
                Ok(if self.store.complete(&claim, summary, attempts).await? {
                    PassOutcome::Summarised
                } else {
                    PassOutcome::NotClaimed
                })
            }
            Err(e) => {
                let failure = Failure {
                    class: e.class,
                    retry_after: e.retry_after,
                    causes: cause_chain(&e),
                    attempts,
                    elapsed: started.elapsed(),
                    http_status: e.http_status,
                    provider: self.provider.name().to_owned(),
                    model: self.provider.model().to_owned(),
                };
                let (state, counts_as_pass) = match failure.class.after_pass() {
                    AfterPass::Reschedule => (SegmentState::Pending, true),
                    AfterPass::Park => (SegmentState::Parked, true),
                    AfterPass::Release => (SegmentState::Pending, false),
                };
                let next = next_due_after(
                    &failure,
                    input.segment.passes + 1,
                    &self.reconciler,
                    Millis::now(),
                );
                warn!(
                    class = failure.class.as_str(),
                    attempts,
                    elapsed_ms = failure.elapsed.as_millis() as u64,
                    "recap pass failed"
                );
                let pass = FailedPass {
                    failure: failure.clone(),
                    attempts,
                    state,
                    next_attempt_at: next,
                    counts_as_pass,
                };
                Ok(if self.store.fail(&claim, pass).await? {
                    PassOutcome::Failed(failure)
                } else {
                    PassOutcome::NotClaimed
                })
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

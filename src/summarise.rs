//! One segment's recap, end to end: claim the segment, read its entries,
//! run the pass (or, for a segment over the provider's input budget, one
//! pass per chunk and per fold), and write the summary or the failure under
//! the claim. Also the registry of passes running in this process, so that
//! a second caller for the same segment joins the pass under way instead of
//! starting another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::field::Empty;
use tracing::{Instrument, Span, info_span, warn};

use crate::breaker::{Breaker, MAX_PROBE_SPACING, Signal};
use crate::config::{Config, ReconcilerConfig, RetryConfig};
use crate::failure::{AfterPass, Failure, FailureClass, cause_chain};
use crate::metrics::{Metrics, Outcome};
use crate::model::{Entry, Millis, SegmentId, SegmentState, Summary, estimate_tokens};
use crate::provider::{Provider, ProviderError, Recap, RecapInput};
use crate::reconciler::next_due_after;
use crate::retry::{PassEnd, run_pass};
use crate::store::{Claim, FailedPass, Store, StoreError};

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
    /// The pass's task panicked; nothing was written.
    Panicked,
}

/// What the summariser needs of the configuration.
#[derive(Clone, Debug)]
pub struct SummariserConfig {
    pub retry: RetryConfig,
    pub reconciler: ReconcilerConfig,
    pub max_input_tokens: u32,
    pub max_output_tokens: u32,
}

impl From<&Config> for SummariserConfig {
    fn from(config: &Config) -> SummariserConfig {
        SummariserConfig {
            retry: config.retry.clone(),
            reconciler: config.reconciler.clone(),
            max_input_tokens: config.provider.max_input_tokens,
            max_output_tokens: config.provider.max_output_tokens,
        }
    }
}

pub struct Summariser {
    store: Store,
    provider: Provider,
    breaker: Breaker,
    config: SummariserConfig,
    owner: String,
    running: Mutex<HashMap<SegmentId, watch::Receiver<Option<PassOutcome>>>>,
    metrics: Arc<Metrics>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// A pass that ended without a recap, with everything its Failure needs.
#[derive(Debug, thiserror::Error)]
#[error("recap of segment {segment_id} failed ({}) after {attempts} attempt(s)", class.as_str())]
struct PassFailed {
    segment_id: SegmentId,
    class: FailureClass,
    attempts: u32,
    #[source]
    cause: Option<PassCause>,
}

#[derive(Debug, thiserror::Error)]
enum PassCause {
    #[error(transparent)]
    Provider(ProviderError),
    #[error("no answer within the attempt's {0:?}")]
    TimedOut(Duration),
    #[error("the pass ceiling of {0:?} ran out")]
    Ceiling(Duration, #[source] Option<ProviderError>),
    #[error("the pass was cancelled (shutdown or caller gone)")]
    Cancelled,
}

/// Sends and usage added up over the passes of one segment.
#[derive(Default)]
struct Tally {
    attempts: u32,
    /// Provider passes run (more than one for a chunked segment).
    passes: u32,
    input_tokens: u32,
    output_tokens: u32,
}

impl Summariser {
    pub fn new(
        store: Store,
        provider: Provider,
        config: SummariserConfig,
        owner: String,
    ) -> Arc<Summariser> {
        let probe_spacing = config.reconciler.interval;
        Arc::new(Summariser {
            store,
            provider,
            breaker: Breaker::new(
                probe_spacing,
                config.reconciler.max_spacing.min(MAX_PROBE_SPACING),
                config.retry.pass_ceiling * 2 + Duration::from_secs(5),
            ),
            config,
            owner,
            running: Mutex::new(HashMap::new()),
            metrics: Arc::new(Metrics::new()),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        })
    }

    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// The metrics every pass updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The provider-wide breaker every pass reports to.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// A claim outlives the longest pass (twice its ceiling, and a margin
    /// for the store), so that a live worker never loses its claim while
    /// still inside the ceiling; a chunked recap renews it before each of
    /// its passes. A crashed worker's segment is due again after this.
    pub fn lease(&self) -> Duration {
        self.config.retry.pass_ceiling * 2 + Duration::from_secs(5)
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
    pub async fn run_or_join_until(
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
                            this.breaker.record(id, signal(&outcome));
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

    pub fn is_running(&self, id: SegmentId) -> bool {
        lock(&self.running).contains_key(&id)
    }

    /// How many passes this process runs now.
    pub fn running(&self) -> usize {
        lock(&self.running).len()
    }

    /// Every pass task this summariser started; for shutdown.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Whether `cancel_all` was called (the process is stopping).
    pub fn is_stopping(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Cancels every running pass: sleeps and sends stop at once, and their
    /// segments are released, due again, with nothing counted against them.
    pub fn cancel_all(&self) {
        self.cancel.cancel();
    }

    async fn pass(&self, id: SegmentId, cancel: &CancellationToken) -> PassOutcome {
        match self.try_pass(id, cancel).await {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "recap pass could not use the store");
                PassOutcome::StoreFailed(Arc::new(e))
            }
        }
    }

    async fn try_pass(
        &self,
        id: SegmentId,
        cancel: &CancellationToken,
    ) -> Result<PassOutcome, StoreError> {
        let Some((claim, input)) = self.store.claim(id, &self.owner, self.lease()).await? else {
            return Ok(PassOutcome::NotClaimed);
        };
        Span::current().record("session", input.segment.session.as_str());
        let started = Instant::now();
        let mut tally = Tally::default();
        let result = self.recap(&claim, &input.entries, &mut tally, cancel).await;
        let outcome = match &result {
            Ok(_) => Outcome::Success,
            Err(end) => Outcome::Failure(end.class()),
        };
        self.metrics.pass(
            outcome,
            started.elapsed().as_secs_f64(),
            tally.attempts.saturating_sub(tally.passes),
        );
        match result {
            Ok(Some(recap)) => {
                self.metrics.tokens(tally.input_tokens, tally.output_tokens);
                let summary = Summary {
                    text: recap.text,
                    provider: self.provider.name().to_owned(),
                    model: recap.model,
                    prompt_version: recap.prompt_version,
                    input_tokens: tally.input_tokens,
                    output_tokens: tally.output_tokens,
                    created_at: Millis::now(),
                };
                Ok(
                    match self.store.complete(&claim, summary, tally.attempts).await? {
                        true => PassOutcome::Summarised,
                        false => PassOutcome::NotClaimed,
                    },
                )
            }
            // The claim was lost between parts: someone else owns it now.
            Ok(None) => Ok(PassOutcome::NotClaimed),
            Err(end) => {
                let failure = self.failure(id, end, &tally, started.elapsed());
                let (state, counts_as_pass) = match failure.class.after_pass() {
                    AfterPass::Reschedule => (SegmentState::Pending, true),
                    AfterPass::Park => (SegmentState::Parked, true),
                    AfterPass::Release => (SegmentState::Pending, false),
                };
                let next = next_due_after(
                    &failure,
                    input.segment.passes + 1,
                    &self.config.reconciler,
                    Millis::now(),
                );
                let pass = FailedPass {
                    failure: failure.clone(),
                    attempts: tally.attempts,
                    state,
                    next_attempt_at: next,
                    counts_as_pass,
                    provider_fingerprint: self.provider.fingerprint(),
                };
                Ok(match self.store.fail(&claim, pass).await? {
                    true => PassOutcome::Failed(failure),
                    false => PassOutcome::NotClaimed,
                })
            }
        }
    }

    /// The segment's recap: one pass when it fits the provider's input
    /// budget; otherwise one pass per chunk, then folds of the chunks'
    /// recaps until one is left. Ok(None) when the claim was lost.
    async fn recap(
        &self,
        claim: &Claim,
        entries: &[Entry],
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Option<Recap>, PassEnd<ProviderError>> {
        let budget = self.provider.content_budget(self.config.max_input_tokens);
        let chunks = match budget {
            Some(budget) => plan_chunks(entries, budget),
            None => vec![entries.to_vec()],
        };
        if let [only] = chunks.as_slice() {
            return self
                .one_pass(RecapInput::Entries(only), tally, cancel)
                .await
                .map(Some);
        }
        let budget = budget.unwrap_or(u32::MAX);
        let mut parts = Vec::with_capacity(chunks.len());
        for chunk in &chunks {
            if !self.renew(claim).await {
                return Ok(None);
            }
            parts.push(
                self.one_pass(RecapInput::Entries(chunk), tally, cancel)
                    .await?
                    .text,
            );
        }
        loop {
            if let [_] = parts.as_slice() {
                // Not reached by construction (each round keeps two or more
                // parts until the last fold), but never loop on one part.
                return self
                    .one_pass(RecapInput::Parts(&parts), tally, cancel)
                    .await
                    .map(Some);
            }
            let groups = plan_folds(parts, budget);
            let last_round = groups.len() == 1;
            parts = Vec::with_capacity(groups.len());
            for group in groups {
                // A lone part has nothing to fold with: it goes on as it is.
                if group.len() == 1 {
                    parts.extend(group);
                    continue;
                }
                if !self.renew(claim).await {
                    return Ok(None);
                }
                let folded = self
                    .one_pass(RecapInput::Parts(&group), tally, cancel)
                    .await?;
                if last_round {
                    return Ok(Some(folded));
                }
                parts.push(folded.text);
            }
        }
    }

    async fn renew(&self, claim: &Claim) -> bool {
        match self.store.renew(claim, self.lease()).await {
            Ok(held) => held,
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "cannot renew a claim");
                false
            }
        }
    }

    /// One pass (the bounded retry loop) over one provider request.
    async fn one_pass(
        &self,
        input: RecapInput<'_>,
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Recap, PassEnd<ProviderError>> {
        let max_output = self.config.max_output_tokens;
        let answered = std::sync::atomic::AtomicU32::new(0);
        let report = run_pass(&self.config.retry, cancel, |_, _| async {
            let result = self.provider.summarise(input, max_output).await;
            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.metrics.attempt(match &result {
                Ok(_) => Outcome::Success,
                Err(e) => Outcome::Failure(e.class),
            });
            result
        })
        .await;
        // Sends cut off by their timeout never answered.
        for _ in answered.into_inner()..report.attempts {
            self.metrics
                .attempt(Outcome::Failure(FailureClass::Timeout));
        }
        tally.attempts += report.attempts;
        tally.passes += 1;
        let recap = report.result?;
        tally.input_tokens = tally.input_tokens.saturating_add(recap.input_tokens);
        tally.output_tokens = tally.output_tokens.saturating_add(recap.output_tokens);
        Ok(recap)
    }

    fn failure(
        &self,
        segment_id: SegmentId,
        end: PassEnd<ProviderError>,
        tally: &Tally,
        elapsed: Duration,
    ) -> Failure {
        let class = end.class();
        let last = end.last_error();
        let http_status = last.and_then(|e| e.http_status);
        let retry_after = last.and_then(|e| e.retry_after);
        let cause = match end {
            PassEnd::Failed(e) => Some(PassCause::Provider(e)),
            PassEnd::TimedOut { timeout } => Some(PassCause::TimedOut(timeout)),
            PassEnd::BudgetExhausted { last } => {
                Some(PassCause::Ceiling(self.config.retry.pass_ceiling, last))
            }
            PassEnd::Cancelled => Some(PassCause::Cancelled),
        };
        let error = PassFailed {
            segment_id,
            class,
            attempts: tally.attempts,
            cause,
        };
        Failure {
            class,
            retry_after,
            causes: cause_chain(&error)
                .iter()
                .map(|c| self.provider.redact(c))
                .collect(),
            attempts: tally.attempts,
            elapsed,
            http_status,
            provider: self.provider.name().to_owned(),
            model: self.provider.model().to_owned(),
        }
    }
}

/// Splits entries into runs whose estimated tokens fit `budget`; an entry
/// larger than the budget is cut into pieces that each fit.
pub fn plan_chunks(entries: &[Entry], budget: u32) -> Vec<Vec<Entry>> {
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut used = 0u32;
    for entry in entries {
        for piece in split_entry(entry, budget) {
            if used.saturating_add(piece.tokens) > budget && !current.is_empty() {
                chunks.push(std::mem::take(&mut current));
                used = 0;
            }
            used = used.saturating_add(piece.tokens);
            current.push(piece);
        }
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    chunks
}

fn split_entry(entry: &Entry, budget: u32) -> Vec<Entry> {
    if entry.tokens <= budget {
        return vec![entry.clone()];
    }
    // estimate_tokens is bytes / 4 + 4; leave room for the role prefix too.
    let max_bytes = (budget.saturating_sub(8).max(1) as usize) * 4;
    let mut pieces = Vec::new();
    let mut rest = entry.content.as_str();
    while !rest.is_empty() {
        let mut end = max_bytes.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // A single character wider than the budget: take it whole.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        pieces.push(Entry {
            content: piece.to_owned(),
            tokens: estimate_tokens(piece),
            ..entry.clone()
        });
        rest = tail;
    }
    pieces
}

/// Groups recaps for folding so that each group fits `budget`, each part
/// first cut to half the budget so that any two fit together: every group
/// but perhaps the last holds two parts or more, so each round of folds
/// shrinks the count.
fn plan_folds(parts: Vec<String>, budget: u32) -> Vec<Vec<String>> {
    let half_bytes = (budget / 2).saturating_sub(8).max(1) as usize * 4;
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut used = 0u32;
    for mut part in parts {
        if part.len() > half_bytes {
            let mut end = half_bytes;
            while !part.is_char_boundary(end) {
                end -= 1;
            }
            part.truncate(end);
        }
        let cost = estimate_tokens(&part);
        match groups.last_mut() {
            Some(group) if used.saturating_add(cost) <= budget => group.push(part),
            _ => {
                groups.push(vec![part]);
                used = 0;
            }
        }
        used = used.saturating_add(cost);
    }
    groups
}

/// What a pass's outcome says of the provider.
fn signal(outcome: &PassOutcome) -> Signal {
    match outcome {
        PassOutcome::Summarised => Signal::Success,
        PassOutcome::Failed(f) => Signal::of_failure(f.class),
        PassOutcome::NotClaimed | PassOutcome::StoreFailed(_) | PassOutcome::Panicked => {
            Signal::Neutral
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    fn entry(seq: u64, bytes: usize) -> Entry {
        let content = "a".repeat(bytes);
        Entry {
            seq,
            client_entry_id: None,
            role: Role::User,
            tokens: estimate_tokens(&content),
            content,
            created_at: Millis(0),
        }
    }

    #[test]
    fn chunks_fit_the_budget_and_keep_every_byte_in_order() {
        let entries: Vec<Entry> = (1..=50).map(|i| entry(i, 37 * i as usize)).collect();
        let budget = 300;
        let chunks = plan_chunks(&entries, budget);
        assert!(chunks.len() > 1);
        for c in &chunks {
            let tokens: u32 = c.iter().map(|e| e.tokens).sum();
            assert!(tokens <= budget, "{tokens}");
        }
        let joined: String = chunks
            .iter()
            .flatten()
            .map(|e| e.content.as_str())
            .collect();
        let original: String = entries.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(joined, original);
        let seqs: Vec<u64> = chunks.iter().flatten().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_segment_within_budget_is_one_chunk() {
        let entries: Vec<Entry> = (1..=3).map(|i| entry(i, 10)).collect();
        assert_eq!(plan_chunks(&entries, 1000).len(), 1);
    }

    #[test]
    fn folds_fit_and_shrink() {
        let budget = 200;
        let parts: Vec<String> = (0..9).map(|i| format!("{i}").repeat(500)).collect();
        let groups = plan_folds(parts, budget);
        assert!(groups.len() < 9);
        for g in &groups[..groups.len() - 1] {
            assert!(g.len() >= 2, "{}", g.len());
        }
        for g in &groups {
            let tokens: u32 = g.iter().map(|p| estimate_tokens(p)).sum();
            assert!(tokens <= budget, "{tokens}");
        }
    }
}

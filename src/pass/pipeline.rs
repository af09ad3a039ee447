//! One segment's recap, end to end: claim the segment and read its entries,
//! run the pass (or, for a segment over the provider's input budget, one
//! pass per chunk and per fold), and write the summary, or the failure and
//! what follows it, under the claim.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Span, warn};

use super::recap::{plan_chunks, plan_folds};
use super::retry::{Classified, Logged, PassEnd, run_pass};
use super::schedule::after_failure;
use super::{PassOutcome, Summariser, record};
use crate::config::RetryConfig;
use crate::events::EventKind;
use crate::failure::{Failure, FailureClass, cause_chain};
use crate::metrics::Outcome;
use crate::model::{Disposition, Entry, Millis, Role, SegmentId, Summary, estimate_tokens};
use crate::provider::{ProviderError, Recap, RecapInput};
use crate::store::{Claim, EndedPass, Material, PassInput, StoreError};
use crate::text::prefix;

/// What the pass needs of a provider's failed attempt.
impl Classified for ProviderError {
    fn detail(&self) -> String {
        self.detail.clone()
    }

    fn class(&self) -> FailureClass {
        self.class
    }

    fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// What a probe sends: one short user entry, so that the request costs a
/// handful of tokens.
const PROBE_TEXT: &str =
    "archivist check: this is a connectivity test. Reply with one short sentence.";
/// The most a probe's answer may be.
const PROBE_OUTPUT_TOKENS: u32 = 32;

/// What a probe of the provider found.
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) outcome: ProbeOutcome,
    /// Sends made.
    pub(crate) attempts: u32,
    pub(crate) elapsed: Duration,
}

#[derive(Debug)]
pub(crate) enum ProbeOutcome {
    /// The provider answered with a completion.
    Answered(Recap),
    /// The pass gave up; the failure says why, with its hint.
    Failed(Failure),
    /// The probe was cancelled (shutdown) before it ended.
    Cancelled,
}

/// What the last request of a combination is.
#[derive(Clone, Copy)]
enum Combined {
    /// A fold of one segment's parts.
    Parts,
    /// A roll-up of its children's summaries.
    Children,
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
    pub(super) async fn pass(&self, id: SegmentId, cancel: &CancellationToken) -> PassOutcome {
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
        let result = self
            .recap(&claim, &input.material, &mut tally, cancel)
            .await;
        let outcome = match &result {
            Ok(_) => Outcome::Success,
            Err(PassEnd::GaveUp(end)) => Outcome::Failure(end.class()),
            Err(PassEnd::Cancelled) => Outcome::Cancelled,
        };
        self.metrics.pass(
            outcome,
            started.elapsed().as_secs_f64(),
            tally.attempts.saturating_sub(tally.passes),
        );
        let failure = match result {
            Ok(Some(recap)) => {
                self.metrics.tokens(tally.input_tokens, tally.output_tokens);
                // A provider may echo a secret (its key) inside a completion
                // it calls a success: summaries pass the same redaction as
                // failures before they are stored or served.
                let summary = Summary {
                    text: self.provider.redact(&recap.text),
                    provider: self.provider.name().to_owned(),
                    model: recap.model,
                    prompt_version: recap.prompt_version,
                    input_tokens: tally.input_tokens,
                    output_tokens: tally.output_tokens,
                    created_at: Millis::now(),
                };
                match self
                    .store
                    .complete(&claim, summary, tally.attempts, self.config.fanout)
                    .await
                {
                    Ok(completed) => {
                        if !completed.rollups.is_empty() {
                            // A roll-up is owed now: have the reconciler look.
                            self.wake.notify_one();
                        }
                        if !completed.held {
                            return Ok(PassOutcome::NotClaimed);
                        }
                        self.tell(&input, EventKind::Summarised).await;
                        // A roll-up comes into being PENDING, owed a recap,
                        // as a segment does when it closes: CLOSED.
                        for rollup in completed.rollups {
                            self.tell_node(&input, EventKind::Closed, rollup).await;
                        }
                        return Ok(PassOutcome::Summarised);
                    }
                    // Shutting down: the lease lets the claim go.
                    Err(e @ StoreError::Closed) => return Err(e),
                    // The provider was asked and answered: a store that
                    // refuses what the pass writes ends it as a failure,
                    // counted and spaced like any other, so the provider is
                    // not asked again and again in silence.
                    Err(e) => {
                        warn!(error = %cause_chain(&e).join(": "), "the recap could not be stored");
                        Some(record::store_failure(
                            &self.provider,
                            record::Subject::Segment(id),
                            e,
                            tally.attempts,
                            started.elapsed(),
                            &self.config.retry,
                        ))
                    }
                }
            }
            // The claim was lost between parts: someone else owns it now.
            Ok(None) => return Ok(PassOutcome::NotClaimed),
            Err(PassEnd::Cancelled) => None,
            Err(PassEnd::GaveUp(end)) => Some(record::failure(
                &self.provider,
                record::Subject::Segment(id),
                end,
                tally.attempts,
                started.elapsed(),
                &self.config.retry,
            )),
        };
        let disposition = match &failure {
            None => Disposition::Release,
            Some(failure) => after_failure(
                failure,
                input.segment.passes + 1,
                &self.config.reconciler,
                Millis::now(),
                &mut rand::thread_rng(),
            ),
        };
        let ended = EndedPass {
            disposition,
            attempts: tally.attempts,
            failure: failure.clone(),
            provider_fingerprint: self.provider.fingerprint(),
        };
        if !self.store.end_pass(&claim, ended).await? {
            return Ok(PassOutcome::NotClaimed);
        }
        match disposition {
            Disposition::Retry { .. } => self.tell(&input, EventKind::Failed).await,
            Disposition::Park => self.tell(&input, EventKind::Parked).await,
            Disposition::Release => {}
        }
        Ok(match failure {
            Some(failure) => PassOutcome::Failed(failure),
            None => PassOutcome::Cancelled,
        })
    }

    /// The node's recap. A level-1 segment: one pass when it fits the
    /// provider's input budget, else one pass per chunk and then their
    /// recaps combined. A roll-up: its children's summaries combined.
    /// Ok(None) when the claim was lost between parts.
    async fn recap(
        &self,
        claim: &Claim,
        material: &Material,
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Option<Recap>, PassEnd<ProviderError>> {
        let budget = self.provider.content_budget(self.config.max_input_tokens);
        match material {
            Material::Entries { entries, carry } => {
                let carry = match self.config.carry_tokens {
                    0 => None,
                    n => carry
                        .as_deref()
                        .map(|c| prefix(c, (n as usize).saturating_mul(4))),
                };
                let carry_cost = carry.map_or(0, estimate_tokens);
                let chunks = match budget {
                    Some(budget) => plan_chunks(entries, budget.saturating_sub(carry_cost).max(16)),
                    None => vec![entries.clone()],
                };
                if let [only] = chunks.as_slice() {
                    let input = RecapInput::Entries {
                        entries: only,
                        carry,
                    };
                    return self.one_pass(input, tally, cancel).await.map(Some);
                }
                let mut parts = Vec::with_capacity(chunks.len());
                for chunk in &chunks {
                    if !self.renew(claim).await {
                        return Ok(None);
                    }
                    let input = RecapInput::Entries {
                        entries: chunk,
                        carry,
                    };
                    parts.push(self.one_pass(input, tally, cancel).await?.text);
                }
                let budget = budget.unwrap_or(u32::MAX);
                self.combine(claim, parts, budget, Combined::Parts, tally, cancel)
                    .await
            }
            Material::Summaries(children) => {
                let budget = budget.unwrap_or(u32::MAX);
                self.combine(
                    claim,
                    children.clone(),
                    budget,
                    Combined::Children,
                    tally,
                    cancel,
                )
                .await
            }
        }
    }

    /// One recap of `parts` in order: a single request (`last`) once they
    /// fit `budget` together, else rounds of folds of groups that each fit
    /// until they do. Every round shrinks the count, and no request exceeds
    /// the budget.
    async fn combine(
        &self,
        claim: &Claim,
        mut parts: Vec<String>,
        budget: u32,
        last: Combined,
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Option<Recap>, PassEnd<ProviderError>> {
        loop {
            let cost = parts
                .iter()
                .fold(0u32, |sum, p| sum.saturating_add(estimate_tokens(p)));
            if cost <= budget || parts.len() < 2 {
                if let [only] = parts.as_mut_slice() {
                    // One part longer than the budget: send what fits.
                    let keep = prefix(only, budget.saturating_sub(8) as usize * 4).len();
                    only.truncate(keep);
                }
                if tally.passes > 0 && !self.renew(claim).await {
                    return Ok(None);
                }
                let input = match last {
                    Combined::Parts => RecapInput::Parts(&parts),
                    Combined::Children => RecapInput::Children(&parts),
                };
                return self.one_pass(input, tally, cancel).await.map(Some);
            }
            let groups = plan_folds(parts, budget);
            parts = Vec::with_capacity(groups.len());
            for group in groups {
                // A lone part has nothing to fold with: it goes on as it is.
                if group.len() == 1 {
                    parts.extend(group);
                    continue;
                }
                if tally.passes > 0 && !self.renew(claim).await {
                    return Ok(None);
                }
                let folded = self
                    .one_pass(RecapInput::Parts(&group), tally, cancel)
                    .await?;
                parts.push(folded.text);
            }
        }
    }

    /// Tells the watchers of the node's session how its pass ended, with the
    /// node as it is now.
    async fn tell(&self, input: &PassInput, kind: EventKind) {
        self.tell_node(input, kind, input.segment.id).await;
    }

    /// Tells the watchers of the session of `input` that `kind` happened
    /// to its node `id`.
    async fn tell_node(&self, input: &PassInput, kind: EventKind, id: SegmentId) {
        self.events
            .tell(
                &self.store,
                &input.tenant,
                &input.segment.session,
                kind,
                Some(id),
            )
            .await;
    }

    /// Extends the claim before the next part of a chunked recap; false
    /// when it was lost.
    async fn renew(&self, claim: &Claim) -> bool {
        match self.store.renew(claim, self.lease()).await {
            Ok(held) => held,
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "cannot renew a claim");
                false
            }
        }
    }

    /// Sends one tiny synthetic recap through a pass under `retry`,
    /// touching no store and no claim: what `archivist check` and the
    /// start-up check of `serve` see of the provider.
    pub(crate) async fn probe(&self, retry: &RetryConfig, cancel: &CancellationToken) -> Probe {
        let entries = [Entry {
            seq: 1,
            client_entry_id: None,
            role: Role::User,
            content: PROBE_TEXT.to_owned(),
            created_at: Millis::now(),
            tokens: estimate_tokens(PROBE_TEXT),
            occurred_at: Millis::now(),
            name: None,
            metadata: Default::default(),
        }];
        let started = Instant::now();
        let mut tally = Tally::default();
        let result = self
            .send_pass(
                RecapInput::Entries {
                    entries: &entries,
                    carry: None,
                },
                &mut tally,
                cancel,
                retry,
                PROBE_OUTPUT_TOKENS,
                Logged::No,
            )
            .await;
        let elapsed = started.elapsed();
        let outcome = match result {
            Ok(recap) => ProbeOutcome::Answered(recap),
            Err(PassEnd::Cancelled) => ProbeOutcome::Cancelled,
            Err(PassEnd::GaveUp(end)) => ProbeOutcome::Failed(record::failure(
                &self.provider,
                record::Subject::Probe,
                end,
                tally.attempts,
                elapsed,
                retry,
            )),
        };
        Probe {
            outcome,
            attempts: tally.attempts,
            elapsed,
        }
    }

    /// One pass over one provider request, under the configured bounds.
    async fn one_pass(
        &self,
        input: RecapInput<'_>,
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Recap, PassEnd<ProviderError>> {
        let retry = &self.config.retry;
        let max_output = self.config.max_output_tokens;
        self.send_pass(input, tally, cancel, retry, max_output, Logged::Recap)
            .await
    }

    /// One pass (the bounded retry loop) over one provider request.
    async fn send_pass(
        &self,
        input: RecapInput<'_>,
        tally: &mut Tally,
        cancel: &CancellationToken,
        retry: &RetryConfig,
        max_output: u32,
        logged: Logged,
    ) -> Result<Recap, PassEnd<ProviderError>> {
        let answered = AtomicU32::new(0);
        let report = run_pass(retry, cancel, logged, |_, _| async {
            let result = self.provider.summarise(input, max_output).await;
            answered.fetch_add(1, Ordering::Relaxed);
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
}

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
use super::retry::{Classified, PassEnd, run_pass};
use super::schedule::after_failure;
use super::{PassOutcome, Summariser, record};
use crate::failure::{FailureClass, cause_chain};
use crate::metrics::Outcome;
use crate::model::{Disposition, Entry, Millis, SegmentId, Summary};
use crate::provider::{ProviderError, Recap, RecapInput};
use crate::store::{Claim, EndedPass, StoreError};

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
        let result = self.recap(&claim, &input.entries, &mut tally, cancel).await;
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
        let end = match result {
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
                let held = self.store.complete(&claim, summary, tally.attempts).await?;
                return Ok(if held {
                    PassOutcome::Summarised
                } else {
                    PassOutcome::NotClaimed
                });
            }
            // The claim was lost between parts: someone else owns it now.
            Ok(None) => return Ok(PassOutcome::NotClaimed),
            Err(end) => end,
        };
        let (failure, disposition) = match end {
            PassEnd::Cancelled => (None, Disposition::Release),
            PassEnd::GaveUp(end) => {
                let failure = record::failure(
                    &self.provider,
                    id,
                    end,
                    tally.attempts,
                    started.elapsed(),
                    self.config.retry.pass_ceiling,
                );
                let disposition = after_failure(
                    &failure,
                    input.segment.passes + 1,
                    &self.config.reconciler,
                    Millis::now(),
                    &mut rand::thread_rng(),
                );
                (Some(failure), disposition)
            }
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
        Ok(match failure {
            Some(failure) => PassOutcome::Failed(failure),
            None => PassOutcome::Cancelled,
        })
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

    /// One pass (the bounded retry loop) over one provider request.
    async fn one_pass(
        &self,
        input: RecapInput<'_>,
        tally: &mut Tally,
        cancel: &CancellationToken,
    ) -> Result<Recap, PassEnd<ProviderError>> {
        let max_output = self.config.max_output_tokens;
        let answered = AtomicU32::new(0);
        let report = run_pass(&self.config.retry, cancel, |_, _| async {
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

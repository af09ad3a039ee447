//! Embedding passes: a batch of owed entries and summaries claimed, sent
//! to the embedder through the one retry loop (`retry.rs`'s `run_pass`),
//! and their vectors written under the claim; or the failure recorded on
//! every item of the batch with what follows it (`schedule.rs`: spacing,
//! Retry-After as a floor, parking for the classes retrying cannot fix,
//! sent once). Also the query's embedding for Search: one attempt, within
//! `retry.attempt_timeout`, on the caller's time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::record::{self, Source, Subject};
use super::retry::{Logged, PassEnd, run_pass};
use super::schedule::{after_failure, lease};
use crate::breaker::{Breaker, Guarded, Signal};
use crate::config::{Config, ReconcilerConfig, RetryConfig};
use crate::failure::{Failure, FailureClass, cause_chain, redact};
use crate::model::{Disposition, Generation, Millis};
use crate::provider::ProviderError;
use crate::provider::embed::Embedder;
use crate::store::{Batch, DROP_BATCH, Dropped, EndedBatch, Store, StoreError};
use crate::text::prefix;

/// The most bytes of one text sent to the embedder: about 2,000 tokens,
/// within what common embedding models read (a longer text is embedded by
/// its beginning).
const MAX_INPUT_BYTES: usize = 8192;

/// The breaker's key for embedding batches: one probe at a time, whichever
/// batch it is.
const BREAKER_KEY: u64 = 0;

/// Steps of the walk one round of re-embedding takes at most (each looks
/// at `store::generations::SCAN` texts).
const WALK_STEPS: u32 = 20;

/// What one round of re-embedding after a change of generation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reembedded {
    /// Made this many texts owed (the walk goes on).
    Owed(u64),
    /// Walked, and some text owed still has only an old vector.
    Waiting,
    /// Dropped this many old vectors.
    Dropped(u64),
    /// Every text is walked and no old vector is left.
    Complete,
}

/// How one embedding step ended.
#[derive(Clone, Debug)]
pub(crate) enum BatchOutcome {
    /// Vectors stored for the batch: this many (its items not erased
    /// meanwhile).
    Embedded(u64),
    /// The pass gave up; every item of the batch records the failure.
    Failed(Failure),
    /// Cancelled (shutdown): the batch is let go, nothing counted.
    Cancelled,
    /// Nothing was due.
    Idle,
    /// The store failed; nothing was written.
    StoreFailed,
}

impl BatchOutcome {
    fn signal(&self) -> Signal {
        match self {
            BatchOutcome::Embedded(_) => Signal::Success,
            BatchOutcome::Failed(f) => Signal::of_failure(f.class),
            BatchOutcome::Cancelled | BatchOutcome::Idle | BatchOutcome::StoreFailed => {
                Signal::Neutral
            }
        }
    }
}

/// The embedder's passes, with its own breaker.
pub(crate) struct Embedding {
    store: Store,
    embedder: Embedder,
    breaker: Breaker,
    retry: RetryConfig,
    reconciler: ReconcilerConfig,
    owner: String,
    cancel: CancellationToken,
    /// Search queries being embedded (`embedding.max_concurrent_queries`).
    queries: Semaphore,
    max_queries: u32,
}

/// The longest a search waits for its turn to have its query embedded:
/// past it AUTO searches by words and SEMANTIC is refused, instead of
/// holding its call slot in a queue behind a slow embedder.
const QUERY_TURN_WAIT: Duration = Duration::from_secs(1);

/// What a search refused its turn at the embedder is told to wait.
const QUERY_TURN_RETRY: Duration = Duration::from_secs(1);

impl Embedding {
    pub(crate) fn new(
        store: Store,
        embedder: Embedder,
        config: &Config,
        owner: String,
    ) -> Arc<Embedding> {
        Arc::new(Embedding {
            store,
            embedder,
            breaker: Breaker::new(
                Guarded::Embedding,
                config.reconciler.interval,
                config
                    .reconciler
                    .max_spacing
                    .min(crate::breaker::MAX_PROBE_SPACING),
                lease(&config.retry),
            ),
            retry: config.retry.clone(),
            reconciler: config.reconciler.clone(),
            owner,
            cancel: CancellationToken::new(),
            queries: Semaphore::new(config.embedding.max_concurrent_queries as usize),
            max_queries: config.embedding.max_concurrent_queries,
        })
    }

    /// The generation this embedder makes.
    pub(crate) fn generation(&self) -> Generation {
        self.embedder.generation()
    }

    /// Where the embedder is asked (credentials redacted).
    pub(crate) fn endpoint(&self) -> String {
        self.embedder.endpoint()
    }

    pub(crate) fn fingerprint(&self) -> String {
        self.embedder.fingerprint()
    }

    pub(crate) fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// May a step start now (the breaker closed, or this is its probe)?
    pub(crate) fn admit(&self) -> bool {
        self.breaker.admit(BREAKER_KEY)
    }

    /// Cancels every running step: its batch is let go, due again.
    pub(crate) fn cancel_all(&self) {
        self.cancel.cancel();
    }

    /// Makes this embedder's generation the store's active one; when it
    /// was another, says so: every stored text is walked again for it.
    pub(crate) async fn start_generation(&self) -> Result<(), StoreError> {
        let generation = self.generation();
        // From none (embeddings turned on) nothing is said: the walk finds
        // the history owed already.
        if let Some(Some(before)) = self.store.set_embedding_generation(&generation).await? {
            info!(
                from = before,
                to = generation.as_str(),
                "the embedding model or dimensions changed: stored texts are embedded \
                 again in the background (embedding.reembed_rate a second at most); \
                 Search uses only the new vectors, the lexical leg carries the rest"
            );
        }
        Ok(())
    }

    /// One round of the background re-embedding after a change of
    /// generation: owes at most `limit` more texts for the new generation
    /// (walking at most `WALK_STEPS` steps of the range); once the walk is
    /// done and nothing owed has only an old vector, drops a batch of the
    /// old generations' vectors. Returns what it did.
    pub(crate) async fn reembed(&self, limit: u64) -> Result<Reembedded, StoreError> {
        let generation = self.generation();
        let mut owed = 0;
        for _ in 0..WALK_STEPS {
            let step = self.store.reowe(&generation, limit - owed).await?;
            owed += step.owed;
            if owed >= limit {
                return Ok(Reembedded::Owed(owed));
            }
            if step.done {
                break;
            }
        }
        if owed > 0 {
            return Ok(Reembedded::Owed(owed));
        }
        Ok(
            match self.store.drop_old_vectors(&generation, DROP_BATCH).await? {
                Dropped::Waiting => Reembedded::Waiting,
                Dropped::Vectors(0) => Reembedded::Complete,
                Dropped::Vectors(n) => Reembedded::Dropped(n),
            },
        )
    }

    /// The query's vector for Search: one attempt within
    /// `retry.attempt_timeout`, on the caller's time (a search does not
    /// wait through a retry schedule; AUTO falls back to the lexical leg).
    /// At most `embedding.max_concurrent_queries` at once: a search that
    /// has not had its turn within `QUERY_TURN_WAIT` is refused as rate
    /// limited (a slow embedder would otherwise gather every search, and
    /// their call slots, in front of it).
    pub(crate) async fn embed_query(&self, query: &str) -> Result<Vec<f32>, ProviderError> {
        let wait = QUERY_TURN_WAIT.min(self.retry.attempt_timeout);
        let _turn = match tokio::time::timeout(wait, self.queries.acquire()).await {
            Ok(Ok(turn)) => turn,
            // Never closed; and past the wait, refused all the same.
            Ok(Err(_)) | Err(_) => return Err(no_turn(self.max_queries, wait)),
        };
        let expected = self
            .store
            .generation_dimensions(&self.generation())
            .await
            .ok()
            .flatten();
        let text = prefix(query, MAX_INPUT_BYTES);
        // The length is checked here, not by the embedder: a query model
        // of another length is a configuration to fix, not an answer to
        // try again.
        let vector = match tokio::time::timeout(
            self.retry.attempt_timeout,
            self.embedder.embed_query(text, None),
        )
        .await
        {
            Ok(Ok(mut vectors)) => vectors
                .pop()
                .ok_or_else(|| no_answer(self.retry.attempt_timeout))?,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(no_answer(self.retry.attempt_timeout)),
        };
        match expected {
            Some(want) if vector.len() != want => Err(other_length(
                self.embedder.query_model(),
                vector.len(),
                self.embedder.model(),
                want,
            )),
            _ => Ok(vector),
        }
    }

    /// One step: claims a batch of owed items, runs its pass, and writes
    /// its vectors or its failure under the claim. Tells the breaker.
    pub(crate) async fn step(&self) -> BatchOutcome {
        let outcome = match self.try_step().await {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %cause_chain(&e).join(": "), "embedding pass could not use the store");
                BatchOutcome::StoreFailed
            }
        };
        self.breaker.record(BREAKER_KEY, outcome.signal());
        outcome
    }

    async fn try_step(&self) -> Result<BatchOutcome, StoreError> {
        let generation = self.generation();
        let Some(batch) = self
            .store
            .claim_owed(&self.owner, lease(&self.retry), self.embedder.batch())
            .await?
        else {
            return Ok(BatchOutcome::Idle);
        };
        let expected = self.store.generation_dimensions(&generation).await?;
        let texts: Vec<&str> = batch
            .items
            .iter()
            .map(|i| prefix(&i.text, MAX_INPUT_BYTES))
            .collect();
        let started = Instant::now();
        let report = run_pass(&self.retry, &self.cancel, Logged::Embedding, |_, _| {
            self.embedder.embed(&texts, expected)
        })
        .await;
        let subject = Subject::Embedding(batch.items.len());
        // What embedding a refused batch apart stored, if it came to that.
        let mut apart = Apart::default();
        let failure = match report.result {
            Ok(vectors) => {
                let docs = batch.items.iter().map(|i| i.doc);
                match self
                    .store
                    .store_vectors(&batch.claim, &generation, docs.zip(vectors).collect())
                    .await
                {
                    Ok(stored) => {
                        tracing::debug!(stored, attempts = report.attempts, "embedded a batch");
                        return Ok(BatchOutcome::Embedded(stored));
                    }
                    Err(e @ StoreError::Closed) => return Err(e),
                    Err(e) => record::store_failure(
                        &self.embedder,
                        subject,
                        e,
                        report.attempts,
                        started.elapsed(),
                        &self.retry,
                    ),
                }
            }
            Err(PassEnd::Cancelled) => {
                self.end(&batch, Disposition::Release, report.attempts, None)
                    .await?;
                return Ok(BatchOutcome::Cancelled);
            }
            Err(PassEnd::GaveUp(end)) => {
                // One text the embedder refuses must not park the others:
                // the batch is embedded apart, and only what is refused on
                // its own is left to the failure.
                if end.class() == FailureClass::InvalidRequest && batch.items.len() > 1 {
                    apart = self
                        .embed_apart(&batch, &texts, &generation, expected)
                        .await?;
                    if apart.cancelled {
                        self.end(&batch, Disposition::Release, report.attempts, None)
                            .await?;
                        return Ok(BatchOutcome::Cancelled);
                    }
                }
                record::failure(
                    &self.embedder,
                    subject,
                    end,
                    report.attempts,
                    started.elapsed(),
                    &self.retry,
                )
            }
        };
        let disposition = after_failure(
            &failure,
            batch.passes + 1,
            &self.reconciler,
            Millis::now(),
            &mut rand::thread_rng(),
        );
        self.end(
            &batch,
            disposition,
            report.attempts + apart.attempts,
            Some(failure.clone()),
        )
        .await?;
        Ok(match apart.stored {
            0 => BatchOutcome::Failed(failure),
            n => BatchOutcome::Embedded(n),
        })
    }

    /// After a batch refused as invalid: embeds its halves apart, and
    /// theirs while they are refused, storing what comes back under the
    /// claim, so that only the texts refused on their own stay held (at
    /// most about 2 × log2(batch) requests more per such text).
    async fn embed_apart(
        &self,
        batch: &Batch,
        texts: &[&str],
        generation: &Generation,
        expected: Option<usize>,
    ) -> Result<Apart, StoreError> {
        let mut apart = Apart::default();
        let mut parts = halves(0..texts.len()).to_vec();
        while let Some(part) = parts.pop() {
            let report = run_pass(&self.retry, &self.cancel, Logged::Embedding, |_, _| {
                self.embedder.embed(&texts[part.clone()], expected)
            })
            .await;
            apart.attempts += report.attempts;
            match report.result {
                Ok(vectors) => {
                    let docs = batch.items[part].iter().map(|i| i.doc);
                    apart.stored += self
                        .store
                        .store_vectors(&batch.claim, generation, docs.zip(vectors).collect())
                        .await?;
                }
                Err(PassEnd::GaveUp(end))
                    if end.class() == FailureClass::InvalidRequest && part.len() > 1 =>
                {
                    parts.extend(halves(part));
                }
                Err(PassEnd::GaveUp(_)) => {}
                Err(PassEnd::Cancelled) => {
                    apart.cancelled = true;
                    break;
                }
            }
        }
        Ok(apart)
    }

    async fn end(
        &self,
        batch: &Batch,
        disposition: Disposition,
        attempts: u32,
        failure: Option<Failure>,
    ) -> Result<u64, StoreError> {
        self.store
            .end_batch(
                &batch.claim,
                EndedBatch {
                    disposition,
                    attempts,
                    failure,
                    fingerprint: self.fingerprint(),
                },
            )
            .await
    }
}

/// What embedding a refused batch apart did.
#[derive(Default)]
struct Apart {
    stored: u64,
    attempts: u32,
    cancelled: bool,
}

/// A range cut in two (the first half the shorter).
fn halves(r: std::ops::Range<usize>) -> [std::ops::Range<usize>; 2] {
    let mid = r.start + r.len() / 2;
    [r.start..mid, mid..r.end]
}

/// A query's vector of another length than the stored ones': the query
/// model is not the stored texts' model under another input type.
fn other_length(query_model: &str, got: usize, model: &str, want: usize) -> ProviderError {
    let detail = format!(
        "the query was embedded with {query_model:?} as {got} numbers, but the stored vectors \
         ({model:?}) have {want}: embedding.query_model must be the same model as \
         embedding.model under another input type (or empty)"
    );
    ProviderError {
        provider: crate::provider::embed::NAME,
        class: FailureClass::InvalidRequest,
        http_status: None,
        retry_after: None,
        symptom: None,
        source: detail.clone().into(),
        detail,
    }
}

/// A query that had no turn at the embedder within `wait`.
fn no_turn(cap: u32, wait: Duration) -> ProviderError {
    let detail = format!(
        "{cap} search queries were being embedded already and none finished within {wait:?} \
         (embedding.max_concurrent_queries); try again shortly"
    );
    ProviderError {
        provider: crate::provider::embed::NAME,
        class: FailureClass::RateLimited,
        http_status: None,
        retry_after: Some(QUERY_TURN_RETRY),
        symptom: None,
        source: detail.clone().into(),
        detail,
    }
}

/// A query's embedding that did not come back in time.
fn no_answer(timeout: Duration) -> ProviderError {
    ProviderError {
        provider: crate::provider::embed::NAME,
        class: FailureClass::Timeout,
        http_status: None,
        retry_after: None,
        symptom: None,
        detail: format!("no embedding of the query within {timeout:?} (retry.attempt_timeout)"),
        source: format!("no embedding of the query within {timeout:?}").into(),
    }
}

impl Source for Embedder {
    fn name(&self) -> &'static str {
        crate::provider::embed::NAME
    }

    fn model(&self) -> &str {
        Embedder::model(self)
    }

    fn redact(&self, text: &str) -> String {
        redact(text, &self.secrets())
    }

    /// Decided on the class alone: the embedder's answers carry no
    /// symptom the hint would change for.
    fn hint(
        &self,
        class: FailureClass,
        _last: Option<&ProviderError>,
        _retry: &RetryConfig,
    ) -> String {
        let base_url = self.base_url();
        let later = "the server tries again by itself, with growing spacing";
        match class {
            FailureClass::Unauthorized => format!(
                "the embedder refused the key (or none was sent): check that {} (named by \
                 embedding.api_key_env) holds a valid key for {base_url}; parked items are \
                 embedded once the server runs with another key",
                self.key_env()
            ),
            FailureClass::UnknownModel => format!(
                "{} does not serve the model {:?} (or is not an embeddings endpoint): check \
                 embedding.model and embedding.base_url (archivist appends /embeddings); parked \
                 items are embedded once the configuration changes",
                self.endpoint(),
                self.model()
            ),
            FailureClass::InvalidRequest => "the embedder refused the request as invalid: the \
                 cause says why (embedding.dimensions is not taken by every model); parked items \
                 are embedded once the configuration changes"
                .to_owned(),
            FailureClass::MalformedResponse => format!(
                "the answer was not a usable list of embeddings (the cause says why: a count, an \
                 index, a length or a number); check that {base_url} is an OpenAI-compatible \
                 embeddings API and embedding.dimensions; {later}"
            ),
            FailureClass::QuotaExhausted => "the account behind the embedder's key is out of \
                 quota; the batch is tried again after reconciler.quota_delay (`archivist \
                 session requeue` makes it due now)"
                .to_owned(),
            FailureClass::RateLimited => format!(
                "the embedder at {base_url} is rate limiting; {later}, never before its \
                 Retry-After (up to 30 days; `archivist session requeue` makes the texts due now)"
            ),
            FailureClass::Store => {
                format!("the vectors came back but the database refused to store them; {later}")
            }
            FailureClass::Transport
            | FailureClass::Timeout
            | FailureClass::Unavailable
            | FailureClass::BudgetExhausted => format!(
                "the embedder at {base_url} did not answer usably ({}); {later}",
                class.as_str()
            ),
        }
    }
}

//! The reconciler: a background task inside `serve` that drains PENDING
//! segments that are due (after a crash, a failed pass, a deferred
//! Retry-After). The database is the queue; the notify from the close path
//! only makes it look sooner, and a missed notify loses nothing because
//! every tick scans again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::breaker::Breaker;
use crate::config::{Config, ReconcilerConfig};
use crate::events::{EventKind, Hub};
use crate::failure::cause_chain;
use crate::metrics::Metrics;
use crate::model::{Millis, SegmentId};
use crate::pass::embed::{BatchOutcome, Embedding, Reembedded};
use crate::pass::{PassOutcome, Reports, Summariser};
use crate::store::{SessionRef, Store};

pub struct Reconciler {
    store: Store,
    summariser: Arc<Summariser>,
    /// The embedder's passes, when `[embedding]` is on.
    embedding: Option<Arc<Embedding>>,
    breaker: Arc<Breaker>,
    metrics: Arc<Metrics>,
    events: Arc<Hub>,
    config: ReconcilerConfig,
    /// `segment.max_idle`: an OPEN segment with no append this long is
    /// closed; zero: never.
    max_idle: Duration,
    /// `retention.session_ttl`: a session with no append this long is
    /// erased; zero: never.
    session_ttl: Duration,
    /// `embedding.reembed_rate`: texts a second.
    reembed_rate: u32,
    wake: Arc<Notify>,
    /// Told once the first round (idle closing, expiry, the first scan and
    /// the passes it starts) is done.
    ready: Option<oneshot::Sender<()>>,
}

/// Sleeps until the embedder's breaker's next probe, or forever.
async fn embedding_probe(embedding: Option<&Embedding>) {
    match embedding {
        Some(e) => probe_time(e.breaker()).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until the breaker's next probe, or forever when it is closed.
async fn probe_time(breaker: &Breaker) {
    match breaker.next_probe() {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Reconciler {
    /// Built by the composition root (`App::reconciler`).
    pub(crate) fn new(
        store: Store,
        summariser: Arc<Summariser>,
        embedding: Option<Arc<Embedding>>,
        reports: Reports,
        config: &Config,
    ) -> Reconciler {
        Reconciler {
            store,
            summariser,
            embedding,
            breaker: reports.breaker,
            metrics: reports.metrics,
            events: reports.events,
            config: config.reconciler.clone(),
            max_idle: config.segment.max_idle,
            session_ttl: config.retention.session_ttl,
            reembed_rate: config.embedding.reembed_rate,
            wake: reports.wake,
            ready: None,
        }
    }

    /// Says on `ready` when the first round is done: the server serves
    /// only after it, so that what was owed before the start is taken up
    /// first and the first calls do not race the start-up scan.
    pub(crate) fn with_ready(mut self, ready: oneshot::Sender<()>) -> Reconciler {
        self.ready = Some(ready);
        self
    }

    /// Runs until `cancel` fires: closes idle segments on every tick, and
    /// scans on every tick, on every wake-up and whenever a pass ends,
    /// keeping at most `concurrency` passes running.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // An interval's first tick is at once: this first round is it.
        tick.tick().await;
        let mut running: JoinSet<PassOutcome> = JoinSet::new();
        let mut embedding: JoinSet<BatchOutcome> = JoinSet::new();
        // Whether owed embeddings may be due: cleared when a step finds
        // none, set again by a tick, a wake-up or a step that did work.
        let mut owed = self.start_embeddings().await;
        // The last embedding step found nothing due: a change of
        // generation's re-embedding may owe more (fresh texts go first).
        let mut caught_up = false;
        // The re-embedding after a change of generation is over.
        let mut reembedded = false;
        // This run owed or dropped something for it (and says when it is
        // over).
        let mut reembedding = false;
        let mut ticked = true;
        let mut ready = self.ready.take();
        loop {
            if std::mem::take(&mut ticked) {
                self.close_idle().await;
                self.expire().await;
                if caught_up && !reembedded {
                    match self.reembed().await {
                        Some(Reembedded::Owed(_)) => {
                            caught_up = false;
                            reembedding = true;
                        }
                        Some(Reembedded::Dropped(_)) => reembedding = true,
                        Some(Reembedded::Complete) => {
                            reembedded = true;
                            if reembedding {
                                self.say_reembedded();
                            }
                        }
                        _ => {}
                    }
                }
            }
            self.fill(&mut running).await;
            if owed {
                self.fill_embedding(&mut embedding);
            }
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => { ticked = true; owed = true; }
                _ = self.wake.notified() => owed = true,
                _ = probe_time(&self.breaker) => {}
                _ = embedding_probe(self.embedding.as_deref()) => owed = true,
                Some(_) = running.join_next(), if !running.is_empty() => {}
                Some(done) = embedding.join_next(), if !embedding.is_empty() => {
                    owed = !matches!(done, Ok(BatchOutcome::Idle | BatchOutcome::StoreFailed));
                    caught_up = matches!(done, Ok(BatchOutcome::Idle));
                }
            }
        }
        // The passes themselves run in the summariser's tasks; shutdown
        // waits for them there, bounded by its ceiling.
        running.detach_all();
        // Embedding steps stop at once when cancelled, letting their
        // batches go; waited for so that no write follows the shutdown.
        if let Some(e) = &self.embedding {
            e.cancel_all();
        }
        while embedding.join_next().await.is_some() {}
    }

    /// Makes the embedder's generation the active one (a change starts
    /// the re-embedding) and owed embeddings parked under another embedder
    /// configuration due again (as recaps are at start-up); true when
    /// embeddings are on. When they are off, the store stops owing texts
    /// vectors.
    async fn start_embeddings(&self) -> bool {
        let Some(e) = &self.embedding else {
            // Off: nothing is written for embeddings from now on.
            if let Err(err) = self.store.stop_owing_embeddings().await {
                warn!(error = %cause_chain(&err).join(": "), "recording that embeddings are off failed");
            }
            return false;
        };
        if let Err(err) = e.start_generation().await {
            warn!(error = %cause_chain(&err).join(": "), "recording the embedding generation failed");
        }
        match self.store.unpark_owed(&e.fingerprint()).await {
            Ok(0) => {}
            Ok(n) => info!(
                unparked = n,
                "the embedder's configuration changed: parked embeddings are due again"
            ),
            Err(err) => {
                warn!(error = %cause_chain(&err).join(": "), "unparking embeddings failed");
            }
        }
        true
    }

    /// One round of the re-embedding after a change of generation: at
    /// most `embedding.reembed_rate` texts a second on average, a tick's
    /// worth at a time. None when embeddings are off or the store failed.
    async fn reembed(&self) -> Option<Reembedded> {
        let e = self.embedding.as_ref()?;
        let limit = (self.reembed_rate as f64 * self.config.interval.as_secs_f64()).ceil() as u64;
        match e.reembed(limit.max(1)).await {
            Ok(done) => {
                match done {
                    Reembedded::Owed(n) => {
                        debug!(owed = n, "texts owed for the new embedding generation")
                    }
                    Reembedded::Dropped(n) => debug!(dropped = n, "old embedding vectors dropped"),
                    Reembedded::Complete | Reembedded::Waiting => {}
                }
                Some(done)
            }
            Err(err) => {
                warn!(error = %cause_chain(&err).join(": "), "re-embedding after a change of generation could not use the store");
                None
            }
        }
    }

    fn say_reembedded(&self) {
        if let Some(e) = &self.embedding {
            info!(
                generation = e.generation().as_str(),
                "every stored text has a vector of the embedding generation; no older vectors are left"
            );
        }
    }

    /// Starts embedding steps up to `concurrency`, one at a time while the
    /// embedder's breaker is open.
    fn fill_embedding(&self, running: &mut JoinSet<BatchOutcome>) {
        let Some(e) = &self.embedding else {
            return;
        };
        while running.len() < self.config.concurrency as usize && e.admit() {
            let e = e.clone();
            running.spawn(async move { e.step().await });
        }
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
                    for (session, id) in &closed {
                        self.tell_closed(session, *id).await;
                    }
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

    /// Tells the watchers of `session` that the segment `id` closed.
    async fn tell_closed(&self, session: &SessionRef, id: SegmentId) {
        self.events
            .tell(
                &self.store,
                &session.tenant,
                &session.session,
                EventKind::Closed,
                Some(id),
            )
            .await;
    }

    /// Erases the sessions nobody has appended to for `session_ttl`, in
    /// batches, oldest first, each as DeleteSession would.
    async fn expire(&self) {
        if self.session_ttl.is_zero() {
            return;
        }
        let cutoff = Millis(
            Millis::now()
                .0
                .saturating_sub(i64::try_from(self.session_ttl.as_millis()).unwrap_or(i64::MAX)),
        );
        let mut sessions = 0u64;
        let mut entries = 0u64;
        loop {
            match self.store.expire_sessions(cutoff, EXPIRE_BATCH).await {
                Ok(expired) => {
                    for (session, erased) in &expired {
                        sessions += 1;
                        entries += erased.entries;
                        self.events
                            .tell(
                                &self.store,
                                &session.tenant,
                                &session.session,
                                EventKind::Deleted,
                                None,
                            )
                            .await;
                    }
                    self.metrics.sessions_expired(expired.len() as u64);
                    if expired.len() < EXPIRE_BATCH as usize {
                        break;
                    }
                }
                Err(e) => {
                    warn!(error = %cause_chain(&e).join(": "), "erasing expired sessions failed");
                    break;
                }
            }
        }
        if sessions > 0 {
            info!(
                sessions,
                entries,
                session_ttl = %crate::text::human_duration(self.session_ttl),
                "erased sessions with no append for retention.session_ttl"
            );
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
/// The most expired sessions erased in one write.
const EXPIRE_BATCH: u32 = 64;
/// The most idle segments closed in one write.
const IDLE_BATCH: u32 = 256;

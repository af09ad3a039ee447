//! The operations behind the RPCs, free of any wire type: append, close,
//! flush, read and operate. `grpc/` validates and converts at the edge and
//! calls these.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::config::LimitsConfig;
use crate::events::{EventKind, Hub, Watch, WatchRefused};
use crate::model::{
    AppendOutcome, Backlog, Context, Entry, Millis, NewEntry, Segment, SegmentId, SegmentPolicy,
    SegmentState, SessionInfo, SessionName, Subject, Tenant,
};
use crate::pass::embed::Embedding;
use crate::pass::{PassOutcome, Summariser};
use crate::provider::ProviderError;
use crate::store::{Budget, Erased, Leg, SegmentFilter, Store, StoreError, fuse};

/// How long before a flush answers the passes it started are cancelled, so
/// their claims are released by the time it does.
const RELEASE_ALLOWANCE: Duration = Duration::from_millis(200);

/// How often a caller waiting on a pass run by another process looks again.
const FOREIGN_PASS_POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    #[error(transparent)]
    WatchRefused(#[from] WatchRefused),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A semantic search of a server with no `[embedding]`.
    #[error("semantic search needs `[embedding]` configured on the server")]
    EmbeddingsOff,
    /// The query's embedding failed (a semantic search only).
    #[error("the query could not be embedded")]
    QueryEmbedding(#[source] Arc<ProviderError>),
}

/// Which legs a search runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SearchMode {
    Auto,
    Lexical,
    Semantic,
}

/// What a search found, and how.
pub(crate) struct Searched {
    pub(crate) hits: Vec<crate::store::SearchHit>,
    pub(crate) legs: Vec<Leg>,
    /// The share of the scope's texts with a vector of the active
    /// generation, when the semantic leg ran (else 0).
    pub(crate) embedded_share: f64,
}

/// How many times `limit` each leg of a search fetches, and the most any
/// leg fetches.
const OVERFETCH: u32 = 3;
const MAX_LEG: u32 = 300;

/// What a context recalls for: the host's query, and the least similarity
/// a hit only the semantic leg found needs to be recalled.
#[derive(Clone, Debug)]
pub(crate) struct Recall {
    pub(crate) query: crate::search::query::Query,
    pub(crate) min_similarity: Option<f32>,
}

/// How many hits a context's recall asks Search for: enough to fill
/// `recall` tokens with short hits (about 16 tokens each) after the cover's
/// own are dropped, within Search's own limit of 100.
fn recall_limit(recall: u32) -> u32 {
    (recall / 16).clamp(20, 100)
}

/// Why waiting on a pass ended without the pass's own end; the segment
/// stays PENDING either way.
#[derive(Debug, thiserror::Error)]
enum WaitError {
    #[error("the recap pass of segment {0} was cancelled (the server is stopping)")]
    Cancelled(SegmentId),
    #[error("the recap pass of segment {0} panicked")]
    Panicked(SegmentId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The service's state: the store, the summariser, the reconciler's
/// wake-up and the watchers' hub.
pub(crate) struct Service {
    store: Store,
    summariser: Arc<Summariser>,
    /// The embedder, when `[embedding]` is on: the query's vector.
    embedding: Option<Arc<Embedding>>,
    wake: Arc<Notify>,
    events: Arc<Hub>,
    /// Cancelled when the server stops: watch streams end with UNAVAILABLE.
    stopping: CancellationToken,
    policy: SegmentPolicy,
    limits: LimitsConfig,
    recent_tokens: u32,
    recall_tokens: u32,
    flush_ceiling: Duration,
    flush_concurrency: usize,
    /// The most one search's statements may take (`search.budget`).
    search_budget: Duration,
}

/// A page of a listing (segments by id, entries by seq) and the key to
/// continue after, if there is more.
pub(crate) struct Page<T> {
    pub(crate) items: Vec<T>,
    pub(crate) next_after: Option<u64>,
}

impl<T> Page<T> {
    /// The page of `page_size` from a read of one more than that: the one
    /// more tells whether another page follows, and so does a read `cut`
    /// short to fit the message limit.
    fn of(mut items: Vec<T>, cut: bool, page_size: u32, key: impl Fn(&T) -> u64) -> Page<T> {
        let more = cut || items.len() > page_size as usize;
        items.truncate(page_size as usize);
        let next_after = if more { items.last().map(key) } else { None };
        Page { items, next_after }
    }
}

/// A flushed session's segments (those still owed a recap, then the newest
/// summarised ones, as far as an answer can carry) and whether all are
/// summarised.
pub(crate) struct Flushed {
    pub(crate) segments: Vec<Segment>,
    pub(crate) complete: bool,
}

impl Service {
    /// Built by the composition root (`App::service`).
    pub(crate) fn new(
        store: Store,
        summariser: Arc<Summariser>,
        embedding: Option<Arc<Embedding>>,
        wake: Arc<Notify>,
        events: Arc<Hub>,
        config: &Config,
    ) -> Service {
        Service {
            store,
            summariser,
            embedding,
            wake,
            events,
            stopping: CancellationToken::new(),
            policy: config.segment_policy(),
            limits: config.limits.clone(),
            recent_tokens: config.context.recent_tokens,
            recall_tokens: config.context.recall_tokens,
            flush_ceiling: config.flush.ceiling,
            flush_concurrency: (config.reconciler.concurrency as usize).max(1),
            search_budget: config.search.budget,
        }
    }

    /// Ends every watch stream (with UNAVAILABLE): the server is stopping.
    pub(crate) fn stop_watchers(&self) {
        self.stopping.cancel();
    }

    /// Tells the session's watchers that the segments `ids` closed.
    async fn closed(&self, tenant: &Tenant, session: &SessionName, ids: &[SegmentId]) {
        for id in ids {
            self.events
                .tell(
                    &self.store,
                    tenant,
                    session.as_str(),
                    EventKind::Closed,
                    Some(*id),
                )
                .await;
        }
    }

    /// Erases the session (see `Store::delete_session`) and tells its
    /// watchers, whose streams then end.
    pub(crate) async fn delete(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<Erased, ServiceError> {
        let erased = self.store.delete_session(tenant, session).await?;
        self.events
            .tell(
                &self.store,
                tenant,
                session.as_str(),
                EventKind::Deleted,
                None,
            )
            .await;
        Ok(erased)
    }

    /// The tenant's best `limit` texts for `query` within `scope`, by the
    /// legs `mode` asks for: LEXICAL the words; SEMANTIC the meaning (the
    /// query embedded by one attempt; its failure is the answer); AUTO
    /// both, fused by reciprocal rank, or the words alone when embeddings
    /// are off or the query's embedding failed (the legs say which ran).
    pub(crate) async fn search(
        &self,
        tenant: &Tenant,
        scope: &crate::store::SearchScope,
        query: &crate::search::query::Query,
        limit: u32,
        mode: SearchMode,
    ) -> Result<Searched, ServiceError> {
        let semantic = match (&self.embedding, mode) {
            (_, SearchMode::Lexical) | (None, SearchMode::Auto) => None,
            (None, SearchMode::Semantic) => return Err(ServiceError::EmbeddingsOff),
            (Some(embedding), SearchMode::Semantic) => Some(
                embedding
                    .embed_query(&query.text())
                    .await
                    .map_err(|e| ServiceError::QueryEmbedding(Arc::new(e)))
                    .map(|v| (embedding, v))?,
            ),
            (Some(embedding), SearchMode::Auto) => match embedding.embed_query(&query.text()).await
            {
                Ok(v) => Some((embedding, v)),
                Err(e) => {
                    tracing::warn!(class = e.class.as_str(), error = %e.detail, "the query could not be embedded; searching by words only");
                    None
                }
            },
        };
        // With two legs each over-fetches, so that fusion ranks from more
        // than it keeps.
        let fetch = match (&semantic, mode) {
            (Some(_), SearchMode::Auto) => limit.saturating_mul(OVERFETCH).min(MAX_LEG),
            _ => limit,
        };
        let mut legs = Vec::new();
        let mut ran = Vec::new();
        if mode != SearchMode::Semantic {
            legs.push(
                self.store
                    .search(tenant, scope, query, fetch, self.search_budget)
                    .await?,
            );
            ran.push(Leg::Lexical);
        }
        let mut embedded_share = 0.0;
        if let Some((embedding, vector)) = semantic {
            let leg = self
                .store
                .semantic_leg(tenant, scope, &embedding.generation(), vector, fetch)
                .await?;
            embedded_share = leg.embedded_share;
            legs.push(leg.hits);
            ran.push(Leg::Semantic);
        }
        Ok(Searched {
            hits: fuse(legs, limit as usize, query, scope.min_similarity),
            legs: ran,
            embedded_share,
        })
    }

    /// Erases every session of the subject (see `Store::delete_subject`)
    /// and tells each one's watchers; what each erased session held.
    pub(crate) async fn delete_subject(
        &self,
        tenant: &Tenant,
        subject: &Subject,
    ) -> Result<Vec<(String, Erased)>, ServiceError> {
        let erased = self.store.delete_subject(tenant, subject).await?;
        for (session, _) in &erased {
            self.events
                .tell(&self.store, tenant, session, EventKind::Deleted, None)
                .await;
        }
        Ok(erased)
    }

    /// A watcher of the tenant's session, and what ends its stream at
    /// shutdown. The session need not exist yet: sessions come into being
    /// with their first append, and "watch, then append" is the one order
    /// that cannot miss the first CLOSED, so a watch of a session with no
    /// entry waits for its events. The watch budget bounds what such
    /// waiting holds.
    pub(crate) fn watch(
        &self,
        tenant: &Tenant,
        session: &SessionName,
    ) -> Result<(Watch, CancellationToken), WatchRefused> {
        let watch = self.events.subscribe(tenant, session.as_str())?;
        Ok((watch, self.stopping.clone()))
    }

    pub(crate) async fn append(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        subject: Option<&Subject>,
        entries: Vec<NewEntry>,
    ) -> Result<AppendOutcome, ServiceError> {
        let outcome = self
            .store
            .append_as(
                tenant,
                session,
                subject,
                entries,
                self.policy,
                self.limits.max_tenant_bytes,
            )
            .await?;
        if !outcome.closed_segment_ids.is_empty() {
            // Watchers hear of the close before a recap can land; recaps
            // run in the background and the append never waits on them.
            self.closed(tenant, session, &outcome.closed_segment_ids)
                .await;
            self.wake.notify_one();
        }
        Ok(outcome)
    }

    /// Closes the open segment. With a `wait_until`, runs (or joins) its
    /// pass and returns when the pass ends or the instant comes, whichever
    /// is first. Once the close is committed the answer is the segment as
    /// it stands, whatever its recap did: its state and `last_failure` say
    /// that. An error would read as "not closed" to a caller that retries
    /// (UNAVAILABLE is retryable to gRPC retry policies), and its retry
    /// would close the next segment early and lose this one's answer.
    pub(crate) async fn close_segment(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        wait_until: Option<Instant>,
    ) -> Result<Option<Segment>, ServiceError> {
        let Some(id) = self.store.close_open_segment(tenant, session).await? else {
            return Ok(None);
        };
        self.closed(tenant, session, &[id]).await;
        let Some(deadline) = wait_until else {
            self.wake.notify_one();
            return Ok(Some(self.store.segment(tenant, id).await?));
        };
        let pass = self.await_pass(id, deadline);
        if let Err(e) = self.unless_erased(tenant, session, pass).await? {
            tracing::warn!(
                segment_id = id,
                error = %crate::error_chain(&e),
                "waiting on the recap of a closed segment ended early; answering with the segment as it stands"
            );
        }
        Ok(Some(self.store.segment(tenant, id).await?))
    }

    /// Wind-down: closes the open segment and awaits the pass of every
    /// PENDING segment, until all end or the flush ceiling or `deadline`
    /// comes. What is unfinished stays PENDING for the reconciler.
    pub(crate) async fn flush(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        deadline: Option<Instant>,
    ) -> Result<Flushed, ServiceError> {
        let ceiling = Instant::now() + self.flush_ceiling;
        let until = deadline.map_or(ceiling, |d| d.min(ceiling));
        // Passes this flush starts are cancelled a little before `until`, so
        // that their claims are let go by the time the answer is sent.
        let cancel_at = until.checked_sub(RELEASE_ALLOWANCE).unwrap_or(until);
        if let Some(id) = self.store.close_open_segment(tenant, session).await? {
            self.closed(tenant, session, &[id]).await;
        }
        // Only what is due (or already running, to join it): a segment
        // waiting out a Retry-After or its spacing is not sent sooner because
        // a host flushes, however often it does.
        let now = Millis::now();
        let pending: Vec<SegmentId> = self
            .store
            .pending_in_session(tenant, session)
            .await?
            .into_iter()
            .filter(|&(id, due)| due.is_none_or(|due| due <= now) || self.summariser.is_running(id))
            .map(|(id, _)| id)
            .collect();
        let passes = tokio::time::timeout_at(until, self.run_all(pending, cancel_at, until));
        let _ = self.unless_erased(tenant, session, passes).await?;
        let (segments, complete) = self
            .store
            .flushed(tenant, session, self.limits.max_message_bytes as usize)
            .await?;
        if !complete {
            self.wake.notify_one();
        }
        Ok(Flushed { segments, complete })
    }

    async fn run_all(&self, ids: Vec<SegmentId>, cancel_at: Instant, until: Instant) {
        let mut set = JoinSet::new();
        let mut ids = ids.into_iter();
        loop {
            while set.len() < self.flush_concurrency {
                let Some(id) = ids.next() else { break };
                let summariser = self.summariser.clone();
                let store = self.store.clone();
                set.spawn(async move {
                    await_pass_with(&summariser, &store, id, Some(cancel_at), until).await
                });
            }
            if set.join_next().await.is_none() {
                return;
            }
        }
    }

    /// `wait`'s result, or NOT_FOUND as soon as the session is erased: a
    /// caller waiting on a pass of an erased session learns it when the
    /// erasure lands, not when the pass ends (the pass goes on in its own
    /// task and writes nothing).
    async fn unless_erased<T>(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        wait: impl std::future::Future<Output = T>,
    ) -> Result<T, ServiceError> {
        let erased = self.events.erased(tenant, session.as_str());
        tokio::select! {
            result = wait => Ok(result),
            () = erased => Err(StoreError::SessionNotFound(session.as_str().to_owned()).into()),
        }
    }

    /// Runs or joins the pass over `id`, until it ends or `deadline`; how
    /// it ended is on the segment.
    async fn await_pass(&self, id: SegmentId, deadline: Instant) -> Result<(), WaitError> {
        await_pass_with(&self.summariser, &self.store, id, None, deadline).await
    }

    pub(crate) async fn segment(
        &self,
        tenant: &Tenant,
        id: SegmentId,
    ) -> Result<Segment, ServiceError> {
        Ok(self.store.segment(tenant, id).await?)
    }

    pub(crate) async fn list_segments(
        &self,
        tenant: &Tenant,
        filter: SegmentFilter,
        after: SegmentId,
        page_size: u32,
    ) -> Result<Page<Segment>, ServiceError> {
        let max_bytes = self.limits.max_message_bytes as usize;
        let (segments, cut) = self
            .store
            .list_segments(tenant, filter, after, page_size + 1, max_bytes)
            .await?;
        Ok(Page::of(segments, cut, page_size, |s| s.id))
    }

    /// A page of the session's transcript: its entries after the seq
    /// `after`, oldest first, summarised or not, within `page_size` and the
    /// message limit.
    pub(crate) async fn entries(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        after: u64,
        page_size: u32,
    ) -> Result<Page<Entry>, ServiceError> {
        let max_bytes = self.limits.max_message_bytes as usize;
        let (entries, cut) = self
            .store
            .entries(tenant, session, after, page_size + 1, max_bytes)
            .await?;
        Ok(Page::of(entries, cut, page_size, |e| e.seq))
    }

    /// The context within `max_tokens`, which 0 (or anything larger than
    /// the server's cap) makes `limits.max_context_tokens`, and within the
    /// message limit: what one call reads and holds follows these caps,
    /// never the session's length. With a `query`, up to
    /// `context.recall_tokens` of it (0: a quarter) go to Search's hits for
    /// it (AUTO, bounded as a search is) within the session's subject, or
    /// the session alone when it has none (`store/recall.rs`).
    pub(crate) async fn context(
        &self,
        tenant: &Tenant,
        session: &SessionName,
        max_tokens: u32,
        recall: Option<&Recall>,
    ) -> Result<Context, ServiceError> {
        let cap = self.limits.max_context_tokens;
        let max_tokens = match max_tokens {
            0 => cap,
            n => n.min(cap),
        };
        let budget = Budget {
            max_tokens,
            max_bytes: self.limits.max_message_bytes as usize,
            recent_tokens: self.recent_tokens,
        };
        let Some(Recall {
            query,
            min_similarity,
        }) = recall
        else {
            return Ok(self.store.context(tenant, session, budget).await?);
        };
        let recall = match self.recall_tokens {
            0 => max_tokens / 4,
            n => n.min(max_tokens),
        };
        if recall == 0 {
            return Ok(self.store.context(tenant, session, budget).await?);
        }
        let scope = match self.store.session_subject(tenant, session).await? {
            Some(subject) => crate::store::SearchScope {
                subject: Some(Subject::parse(&subject).map_err(|e| {
                    StoreError::Corrupt(format!("session {session}'s subject: {e}"))
                })?),
                min_similarity: *min_similarity,
                ..Default::default()
            },
            None => crate::store::SearchScope {
                sessions: vec![session.clone()],
                min_similarity: *min_similarity,
                ..Default::default()
            },
        };
        let searched = self
            .search(
                tenant,
                &scope,
                query,
                recall_limit(recall),
                SearchMode::Auto,
            )
            .await?;
        Ok(self
            .store
            .context_recalling(tenant, session, budget, recall, &searched.hits)
            .await?)
    }

    /// Makes the matching segments due now; and, when no segment is named
    /// and embeddings are on, the texts of the same scope owed an
    /// embedding that are put off (parked too with `include_parked`).
    /// How many of each.
    pub(crate) async fn requeue(
        &self,
        tenant: &Tenant,
        session: Option<SessionName>,
        ids: Vec<SegmentId>,
        include_parked: bool,
    ) -> Result<(u64, u64), ServiceError> {
        let mut states = vec![SegmentState::Pending];
        if include_parked {
            states.push(SegmentState::Parked);
        }
        let owed = match (&self.embedding, ids.is_empty()) {
            (Some(_), true) => {
                self.store
                    .requeue_owed(tenant, session.as_ref(), include_parked)
                    .await?
            }
            _ => 0,
        };
        let n = self
            .store
            .requeue(
                tenant,
                SegmentFilter {
                    session,
                    states,
                    ids,
                    levels: Vec::new(),
                },
            )
            .await?;
        if n > 0 || owed > 0 {
            self.wake.notify_one();
        }
        Ok((n, owed))
    }

    /// A page of the tenant's sessions in name order, and the name to
    /// continue after, if there is more.
    pub(crate) async fn list_sessions(
        &self,
        tenant: &Tenant,
        subject: Option<&Subject>,
        after: Option<SessionName>,
        page_size: u32,
    ) -> Result<(Vec<SessionInfo>, Option<SessionName>), ServiceError> {
        // One more than asked tells whether another page follows.
        let mut sessions = self
            .store
            .list_subject_sessions(tenant, subject, after, page_size + 1)
            .await?;
        let more = sessions.len() > page_size as usize;
        sessions.truncate(page_size as usize);
        let next = match (more, sessions.last()) {
            (true, Some(last)) => Some(
                SessionName::parse(&last.name)
                    .map_err(|e| StoreError::Corrupt(format!("stored session name: {e}")))?,
            ),
            _ => None,
        };
        Ok((sessions, next))
    }

    pub(crate) async fn backlog(&self, tenant: &Tenant) -> Result<Backlog, ServiceError> {
        let mut backlog = self.store.backlog(Some(tenant)).await?;
        if let Some(embedding) = &self.embedding {
            backlog.embeddings = self
                .store
                .embedding_backlog(Some(tenant), &embedding.generation())
                .await?;
        }
        Ok(backlog)
    }
}

/// Runs or joins the pass over `id` until it ends or `deadline`; a pass
/// started here is cancelled at `cancel_at`. Returns the failure of a pass
/// that failed.
async fn await_pass_with(
    summariser: &Arc<Summariser>,
    store: &Store,
    id: SegmentId,
    cancel_at: Option<Instant>,
    deadline: Instant,
) -> Result<(), WaitError> {
    // Passes so far, to tell a pass that ended elsewhere from an older one.
    let passes_before = store.segment_any(id).await?.0.passes;
    loop {
        let pass = summariser.run_or_join_until(id, cancel_at);
        let outcome = match tokio::time::timeout_at(deadline, pass).await {
            Ok(outcome) => outcome,
            // The pass goes on in its own task; the caller gets the state as is.
            Err(_) => return Ok(()),
        };
        let not_claimed = matches!(outcome, PassOutcome::NotClaimed);
        match outcome {
            PassOutcome::Summarised => return Ok(()),
            // A pass someone else started and then cancelled (a flush at its
            // bound) says nothing of this caller's: run it again while there
            // is time, unless the server itself is stopping.
            PassOutcome::Cancelled if cancel_at.is_none() && !summariser.is_stopping() => {}
            PassOutcome::Cancelled => return Err(WaitError::Cancelled(id)),
            PassOutcome::Failed(_) => return Ok(()),
            PassOutcome::StoreFailed(e) => {
                return Err(WaitError::Store(StoreError::Shared(e)));
            }
            PassOutcome::Panicked => return Err(WaitError::Panicked(id)),
            PassOutcome::NotClaimed => {}
        }
        // Another process holds the claim, or the segment left PENDING:
        // watch it until the claim is let go.
        let (segment, _) = loop {
            let (segment, claimed) = store.segment_any(id).await?;
            if segment.state != SegmentState::Pending || !claimed {
                break (segment, claimed);
            }
            if Instant::now() + FOREIGN_PASS_POLL >= deadline {
                return Ok(());
            }
            tokio::time::sleep(FOREIGN_PASS_POLL).await;
        };
        let ran_elsewhere = segment.passes > passes_before;
        match segment.state {
            SegmentState::Summarised | SegmentState::Open | SegmentState::Parked => {
                return Ok(());
            }
            SegmentState::Pending if ran_elsewhere => return Ok(()),
            // Let go without a pass counted (a cancelled one): due again,
            // so run it here.
            SegmentState::Pending if !not_claimed => {}
            // Pending, unclaimed, yet the claim failed: its row is locked
            // for a moment (on PostgreSQL, by a sibling's completing pass).
            // Look again shortly rather than spin.
            SegmentState::Pending => {
                if Instant::now() + FOREIGN_PASS_POLL >= deadline {
                    return Ok(());
                }
                tokio::time::sleep(FOREIGN_PASS_POLL).await;
            }
        }
    }
}

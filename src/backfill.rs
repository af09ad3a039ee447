//! `archivist backfill`'s drain: every unsummarised segment that matches the
//! operator's filters gets one pass, through the same summariser, claims
//! and breaker as the server, so it can run beside a live server on the
//! same database. Ends with a report of what is summarised and what is left.
//! With `--embeddings`, the same for what is owed an embedding.
//! The terminal side (flags, progress bar, printing) is in `cli/backfill.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::breaker::{BreakerState, TRIP_AFTER};
use crate::model::{Millis, ProviderIdentity, Segment, SegmentId, SegmentState, SessionName};
use crate::pass::PassOutcome;
use crate::pass::embed::{BatchOutcome, Embedding};
use crate::store::{BackfillFilter, DROP_BATCH, Dropped, StoreError};

#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) session: Option<SessionName>,
    pub(crate) closed_before: Option<Millis>,
    pub(crate) closed_after: Option<Millis>,
    pub(crate) concurrency: usize,
    pub(crate) include_parked: bool,
    pub(crate) dry_run: bool,
}

/// How far a run has got, for a progress display.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    pub(crate) total: u64,
    pub(crate) done: u64,
    pub(crate) summarised: u64,
}

/// One segment as the report lists it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) id: SegmentId,
    pub(crate) session: String,
    pub(crate) state: String,
    pub(crate) attempts: u32,
    /// The class of its last failure (`not_attempted` when it has none).
    pub(crate) class: String,
    /// A live claim holds it: a server is running its pass right now.
    pub(crate) claimed_elsewhere: bool,
}

/// What a run did and what is left.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Report {
    /// The provider the run summarised with (or, for a dry run, would).
    pub(crate) provider: Option<ProviderIdentity>,
    /// The provider the database last ran with, when it was another
    /// (a dry run reports it; a real run only gets here with
    /// --allow-provider-change).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider_changed_from: Option<ProviderIdentity>,
    pub(crate) dry_run: bool,
    /// PARKED segments were taken too.
    pub(crate) include_parked: bool,
    /// Ctrl-C (or SIGTERM) ended the run early.
    pub(crate) interrupted: bool,
    /// Why the run stopped starting passes before the end, if it did.
    pub(crate) stopped_early: Option<String>,
    /// Unsummarised segments that matched the filters.
    pub(crate) matched: u64,
    /// Segments taken up by this run that are now summarised (by this run,
    /// or by a server working beside it).
    pub(crate) summarised: u64,
    /// Left PENDING, by the class of the last failure (`not_attempted`
    /// when there was none).
    pub(crate) pending: u64,
    pub(crate) pending_by_class: BTreeMap<String, u64>,
    /// Of those left PENDING, how many a live claim held when the report
    /// was made (a server was running their passes).
    pub(crate) claimed_elsewhere: u64,
    /// Left PARKED, by class.
    pub(crate) parked: u64,
    pub(crate) parked_by_class: BTreeMap<String, u64>,
    /// The segments a dry run would take (a real run lists none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) segments: Vec<Listed>,
}

impl Report {
    /// Segments still without a summary.
    pub(crate) fn left(&self) -> u64 {
        self.pending + self.parked
    }
}

/// Runs the backfill. `progress` is called as passes end; `cancel` stops it
/// cleanly (running passes are cancelled and release their claims).
pub(crate) async fn run(
    app: &App,
    options: &Options,
    cancel: &CancellationToken,
    mut progress: impl FnMut(Progress),
) -> Result<Report, StoreError> {
    let filter = |states: Vec<SegmentState>| BackfillFilter {
        session: options.session.clone(),
        closed_before: options.closed_before,
        closed_after: options.closed_after,
        states,
    };
    let store = &app.store;
    let summariser = &app.summariser;
    let mut report = Report {
        provider: Some(app.provider_identity.clone()),
        dry_run: options.dry_run,
        include_parked: options.include_parked,
        ..Report::default()
    };
    if options.dry_run {
        // What a real run would take: PENDING segments, and PARKED ones
        // only with --include-parked; parked ones are counted either way,
        // as a real run's report counts them as left.
        let states = vec![SegmentState::Pending, SegmentState::Parked];
        for (segment, claimed) in store.backfill_segments(filter(states)).await? {
            let class = class_of(&segment);
            tally(&mut report, &segment, claimed);
            if segment.state == SegmentState::Parked && !options.include_parked {
                continue;
            }
            report.matched += 1;
            report.segments.push(Listed {
                id: segment.id,
                session: segment.session,
                state: segment.state.as_str().to_owned(),
                attempts: segment.attempts,
                class,
                claimed_elsewhere: claimed,
            });
        }
        return Ok(report);
    }

    if options.include_parked {
        let parked = store
            .backfill_segments(filter(vec![SegmentState::Parked]))
            .await?;
        store
            .unpark(parked.into_iter().map(|(s, _)| s.id).collect())
            .await?;
    }
    let candidates: Vec<SegmentId> = store
        .backfill_segments(filter(vec![SegmentState::Pending]))
        .await?
        .into_iter()
        .map(|(s, _)| s.id)
        .collect();
    let mut state = Progress {
        total: candidates.len() as u64,
        ..Progress::default()
    };
    progress(state);

    let mut running = JoinSet::new();
    let mut queue = candidates.iter().copied().peekable();
    let concurrency = options.concurrency.max(1);
    loop {
        while running.len() < concurrency
            && report.stopped_early.is_none()
            && !cancel.is_cancelled()
            && queue.peek().is_some()
        {
            if app.breaker.state() != BreakerState::Closed {
                let left = queue.len() as u64;
                report.stopped_early = Some(format!(
                    "{TRIP_AFTER} passes in a row failed on the provider's side, so no more were \
                     started: {} not attempted. `archivist check` shows what the provider \
                     answers; a running server keeps probing it",
                    crate::text::count(left, "segment was", "segments were")
                ));
                break;
            }
            let Some(id) = queue.next() else { break };
            let summariser = summariser.clone();
            running.spawn(async move { summariser.run_or_join(id).await });
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled(), if !report.interrupted => {
                // Running passes stop at once and let their claims go.
                report.interrupted = true;
                summariser.cancel_all();
            }
            Some(outcome) = running.join_next() => {
                state.done += 1;
                if matches!(outcome, Ok(PassOutcome::Summarised)) {
                    state.summarised += 1;
                }
                progress(state);
            }
        }
    }

    // The report reads the segments back, so what another worker did while
    // this run went on counts too; what matches and is still unsummarised is
    // left, whether or not this run took it up.
    let mut still = 0u64;
    let left = store
        .backfill_segments(filter(vec![SegmentState::Pending, SegmentState::Parked]))
        .await?;
    let candidates: HashSet<SegmentId> = candidates.into_iter().collect();
    for (segment, claimed) in left {
        if candidates.contains(&segment.id) {
            still += 1;
        }
        tally(&mut report, &segment, claimed);
    }
    report.summarised = candidates.len() as u64 - still;
    report.matched = report.summarised + report.pending + report.parked;
    Ok(report)
}

/// What the report files an unsummarised segment under: its last
/// failure's class, or not attempted yet.
fn class_of(segment: &Segment) -> String {
    match &segment.last_failure {
        Some(f) => f.class.as_str().to_owned(),
        None => "not_attempted".to_owned(),
    }
}

fn tally(report: &mut Report, segment: &Segment, claimed: bool) {
    let class = class_of(segment);
    match segment.state {
        // Counted from the candidates, not listed one by one.
        SegmentState::Summarised => {}
        SegmentState::Pending => {
            report.pending += 1;
            if claimed {
                report.claimed_elsewhere += 1;
            }
            *report.pending_by_class.entry(class).or_default() += 1;
        }
        SegmentState::Parked => {
            report.parked += 1;
            *report.parked_by_class.entry(class).or_default() += 1;
        }
        SegmentState::Open => {}
    }
}

/// What an embedding drain (`backfill --embeddings`) did and what is left.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct EmbeddingReport {
    /// The model and dimensions the vectors are made with.
    pub(crate) generation: String,
    /// Owed when the run began.
    pub(crate) owed: u64,
    /// Texts this run embedded (stored a vector for).
    pub(crate) embedded: u64,
    /// Texts with a vector of the generation now, whoever embedded them
    /// (this run, a server beside it, earlier runs), of every tenant.
    pub(crate) embedded_total: u64,
    /// Still owed and not parked (their next try is later, or a server's
    /// claim holds them).
    pub(crate) pending: u64,
    pub(crate) parked: u64,
    pub(crate) parked_by_class: BTreeMap<String, u64>,
    /// The last failure's class and causes, while it is still owed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_failure: Option<String>,
    pub(crate) interrupted: bool,
    pub(crate) stopped_early: Option<String>,
}

impl EmbeddingReport {
    /// Texts still without a vector.
    pub(crate) fn left(&self) -> u64 {
        self.pending + self.parked
    }
}

/// Drains what is owed an embedding with `concurrency` batches at once,
/// through the same passes, claims and breaker as the server's reconciler,
/// until nothing is due: a batch that failed is due again only after its
/// spacing, so the run ends and reports it as pending. Items parked under
/// another embedder configuration are made due first, as at a server's
/// start.
pub(crate) async fn run_embeddings(
    app: &App,
    embedding: &Arc<Embedding>,
    concurrency: usize,
    cancel: &CancellationToken,
    mut progress: impl FnMut(Progress),
) -> Result<EmbeddingReport, StoreError> {
    let store = &app.store;
    let generation = embedding.generation();
    store.unpark_owed(&embedding.fingerprint()).await?;
    // A change of generation: everything stored is owed for the new one
    // now (the operator asked for the drain; no rate applies).
    embedding.start_generation().await?;
    while !store.reowe(&generation, u64::MAX).await?.done {}
    let before = store.embedding_backlog(None, &generation).await?;
    let mut report = EmbeddingReport {
        generation: generation.as_str().to_owned(),
        owed: before.pending,
        ..EmbeddingReport::default()
    };
    let mut state = Progress {
        total: before.pending,
        ..Progress::default()
    };
    progress(state);
    let mut running = JoinSet::new();
    // Cleared when a step finds nothing due: no more are started.
    let mut due = true;
    loop {
        while due
            && running.len() < concurrency.max(1)
            && report.stopped_early.is_none()
            && !cancel.is_cancelled()
        {
            if embedding.breaker().state() != BreakerState::Closed {
                report.stopped_early = Some(format!(
                    "{TRIP_AFTER} embedding passes in a row failed on the embedder's side, so no \
                     more were started; a running server keeps probing it"
                ));
                break;
            }
            let e = embedding.clone();
            running.spawn(async move { e.step().await });
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled(), if !report.interrupted => {
                report.interrupted = true;
                embedding.cancel_all();
            }
            Some(outcome) = running.join_next() => {
                match outcome {
                    Ok(BatchOutcome::Embedded(stored)) => report.embedded += stored,
                    Ok(BatchOutcome::Idle | BatchOutcome::StoreFailed) => due = false,
                    _ => {}
                }
                let now = store.embedding_backlog(None, &generation).await?;
                state.done = before.pending.saturating_sub(now.pending);
                state.summarised = report.embedded;
                progress(state);
            }
        }
    }
    // Complete: the old generations' vectors go.
    if !report.interrupted {
        while let Dropped::Vectors(1..) = store.drop_old_vectors(&generation, DROP_BATCH).await? {}
    }
    let after = store.embedding_backlog(None, &generation).await?;
    report.embedded_total = after.embedded;
    report.pending = after.pending;
    report.parked = after.parked;
    report.parked_by_class = after.parked_by_class.into_iter().collect();
    report.last_failure = after
        .last_failure
        .map(|f| format!("{}: {}", f.class.as_str(), f.causes.join(": ")));
    Ok(report)
}

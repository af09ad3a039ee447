//! `archivist backfill`'s drain: every unsummarised segment that matches the
//! operator's filters gets one pass, through the same summariser, claims
//! and breaker as the server, so it can run beside a live server on the
//! same database. Ends with a report of what is summarised and what is left.
//! The terminal side (flags, progress bar, printing) is in `cli/backfill.rs`.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::breaker::{BreakerState, TRIP_AFTER};
use crate::model::{Millis, ProviderIdentity, Segment, SegmentId, SegmentState, SessionName};
use crate::pass::PassOutcome;
use crate::store::{BackfillFilter, StoreError};

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
#[derive(Clone, Copy, Debug, Default)]
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

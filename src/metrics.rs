//! The service's Prometheus metrics: one registry per server (so that
//! servers in one process, as in tests, keep their own counts), the
//! counters and histograms the code updates as it goes, and the gauges
//! read from the store at scrape time.

use crate::breaker::BreakerState;
use crate::failure::FailureClass;
use crate::model::Backlog;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

pub(crate) struct Metrics {
    registry: Registry,
    attempts: IntCounterVec,
    passes: IntCounterVec,
    retries: IntCounter,
    pass_duration: Histogram,
    tokens: IntCounterVec,
    segments: IntGaugeVec,
    embeddings: IntGaugeVec,
    oldest_pending_age: Gauge,
    unindexed: IntGauge,
    oldest_unindexed_age: Gauge,
    scans: IntCounter,
    sessions_expired: IntCounter,
    breaker_state: IntGauge,
    grpc_calls: IntCounterVec,
    watches: IntGauge,
    notes_lost: IntCounterVec,
}

/// Why session events did not reach the other replicas' watchers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NotesLost {
    /// The queue of notes to send was full: these were dropped.
    QueueFull,
    /// Sending them to the database failed.
    PublishFailed,
    /// The connection hearing the others' notes was lost (each loss a GAP
    /// to every watcher of this replica).
    ListenLost,
}

/// How a pass or an attempt ended, as a label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Success,
    Failure(FailureClass),
    /// A pass cancelled by shutdown or its caller: not a failure.
    Cancelled,
}

impl Outcome {
    fn labels(self) -> [&'static str; 2] {
        match self {
            Outcome::Success => ["success", ""],
            Outcome::Cancelled => ["cancelled", "cancelled"],
            Outcome::Failure(class) => ["failure", class.as_str()],
        }
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let registry = Registry::new_custom(Some("archivist".to_owned()), None).unwrap_or_default();
        // The definitions below are constants: a failure here is a typo in
        // this file, caught by its test.
        let m = Metrics {
            attempts: IntCounterVec::new(
                Opts::new(
                    "summarise_attempts_total",
                    "Sends to the provider, by outcome and failure class",
                ),
                &["outcome", "class"],
            )
            .expect("valid metric"),
            passes: IntCounterVec::new(
                Opts::new("passes_total", "Recap passes, by outcome and failure class"),
                &["outcome", "class"],
            )
            .expect("valid metric"),
            retries: IntCounter::new(
                "retries_total",
                "Sends that retried a failed one within a pass",
            )
            .expect("valid metric"),
            pass_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "pass_duration_seconds",
                    "Wall time of a recap pass, waits included",
                )
                .buckets(vec![
                    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
                ]),
            )
            .expect("valid metric"),
            tokens: IntCounterVec::new(
                Opts::new(
                    "provider_tokens_total",
                    "Tokens the provider reported, by direction",
                ),
                &["direction"],
            )
            .expect("valid metric"),
            segments: IntGaugeVec::new(
                Opts::new("segments", "Segments by state, at the last scrape"),
                &["state"],
            )
            .expect("valid metric"),
            embeddings: IntGaugeVec::new(
                Opts::new(
                    "embeddings",
                    "Texts owed or holding a vector of the active embedding generation, by state \
                     (deferred: of pending, put off by the embedder's Retry-After or quota), at \
                     the last scrape",
                ),
                &["state"],
            )
            .expect("valid metric"),
            oldest_pending_age: Gauge::new(
                "oldest_pending_age_seconds",
                "Age of the oldest PENDING segment (0 when none)",
            )
            .expect("valid metric"),
            unindexed: IntGauge::new(
                "search_unindexed_texts",
                "Entries stored and not yet in the search index (SQLite's tail, indexed just behind the appends)",
            )
            .expect("valid metric"),
            oldest_unindexed_age: Gauge::new(
                "search_oldest_unindexed_age_seconds",
                "Age of the oldest entry not yet in the search index (0 when none)",
            )
            .expect("valid metric"),
            scans: IntCounter::new(
                "reconciler_scans_total",
                "Reconciler scans for due segments",
            )
            .expect("valid metric"),
            sessions_expired: IntCounter::new(
                "sessions_expired_total",
                "Sessions erased by retention.session_ttl",
            )
            .expect("valid metric"),
            breaker_state: IntGauge::new(
                "breaker_state",
                "Provider circuit breaker: 0 closed, 1 open, 2 probing",
            )
            .expect("valid metric"),
            grpc_calls: IntCounterVec::new(
                Opts::new("grpc_calls_total", "gRPC calls by method and status code"),
                &["method", "code"],
            )
            .expect("valid metric"),
            watches: IntGauge::new("watches", "WatchSession streams open now")
                .expect("valid metric"),
            notes_lost: IntCounterVec::new(
                Opts::new(
                    "event_notes_lost_total",
                    "Session events between replicas that were not delivered: notes dropped from a full queue or a failed send, and losses of the connection hearing them",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            registry,
        };
        for collector in [
            Box::new(m.attempts.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.passes.clone()),
            Box::new(m.retries.clone()),
            Box::new(m.pass_duration.clone()),
            Box::new(m.tokens.clone()),
            Box::new(m.segments.clone()),
            Box::new(m.embeddings.clone()),
            Box::new(m.oldest_pending_age.clone()),
            Box::new(m.unindexed.clone()),
            Box::new(m.oldest_unindexed_age.clone()),
            Box::new(m.scans.clone()),
            Box::new(m.sessions_expired.clone()),
            Box::new(m.breaker_state.clone()),
            Box::new(m.grpc_calls.clone()),
            Box::new(m.watches.clone()),
            Box::new(m.notes_lost.clone()),
        ] {
            // Each name is registered once, here.
            let _ = m.registry.register(collector);
        }
        m
    }

    pub(crate) fn attempt(&self, outcome: Outcome) {
        self.attempts.with_label_values(&outcome.labels()).inc();
    }

    pub(crate) fn pass(&self, outcome: Outcome, seconds: f64, retries: u32) {
        self.passes.with_label_values(&outcome.labels()).inc();
        self.pass_duration.observe(seconds);
        self.retries.inc_by(u64::from(retries));
    }

    pub(crate) fn tokens(&self, input: u32, output: u32) {
        self.tokens
            .with_label_values(&["input"])
            .inc_by(u64::from(input));
        self.tokens
            .with_label_values(&["output"])
            .inc_by(u64::from(output));
    }

    pub(crate) fn scan(&self) {
        self.scans.inc();
    }

    /// Sessions erased for having no append within the retention period.
    pub(crate) fn sessions_expired(&self, n: u64) {
        self.sessions_expired.inc_by(n);
    }

    /// A finished gRPC call; `code` is the status code's name (`Ok`,
    /// `NotFound`, ...), from the fixed set gRPC defines.
    pub(crate) fn grpc_call(&self, method: &str, code: &str) {
        self.grpc_calls.with_label_values(&[method, code]).inc();
    }

    /// The watches open now.
    pub(crate) fn watches(&self, n: usize) {
        self.watches.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `n` notes between replicas lost (for `ListenLost`, `n` losses of the
    /// connection), for `why`.
    pub(crate) fn notes_lost(&self, why: NotesLost, n: u64) {
        let reason = match why {
            NotesLost::QueueFull => "queue_full",
            NotesLost::PublishFailed => "publish_failed",
            NotesLost::ListenLost => "listen_lost",
        };
        self.notes_lost.with_label_values(&[reason]).inc_by(n);
    }

    /// The Prometheus text exposition, with the gauges set from `backlog`
    /// and the breaker's state as they are now.
    pub(crate) fn render(&self, backlog: &Backlog, breaker: BreakerState) -> String {
        for (state, n) in [
            ("open", backlog.open),
            ("pending", backlog.pending),
            ("summarised", backlog.summarised),
            ("parked", backlog.parked),
        ] {
            self.segments
                .with_label_values(&[state])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let e = &backlog.embeddings;
        for (state, n) in [
            ("pending", e.pending),
            ("deferred", e.deferred),
            ("parked", e.parked),
            ("embedded", e.embedded),
        ] {
            self.embeddings
                .with_label_values(&[state])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.oldest_pending_age
            .set(backlog.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()));
        self.unindexed
            .set(i64::try_from(backlog.unindexed).unwrap_or(i64::MAX));
        self.oldest_unindexed_age.set(
            backlog
                .oldest_unindexed_age
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        self.breaker_state.set(match breaker {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::Probing => 2,
        });
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exposed() {
        let m = Metrics::new();
        m.attempt(Outcome::Failure(FailureClass::Unavailable));
        m.pass(Outcome::Success, 0.2, 2);
        m.tokens(10, 3);
        m.scan();
        m.grpc_call("AppendEntries", "Ok");
        m.watches(3);
        m.notes_lost(NotesLost::QueueFull, 1);
        let text = m.render(&Backlog::default(), BreakerState::Open);
        for name in [
            "archivist_summarise_attempts_total{class=\"unavailable\",outcome=\"failure\"} 1",
            "archivist_passes_total{class=\"\",outcome=\"success\"} 1",
            "archivist_retries_total 2",
            "archivist_pass_duration_seconds_count 1",
            "archivist_provider_tokens_total{direction=\"input\"} 10",
            "archivist_segments{state=\"pending\"} 0",
            "archivist_embeddings{state=\"deferred\"} 0",
            "archivist_oldest_pending_age_seconds 0",
            "archivist_search_unindexed_texts 0",
            "archivist_search_oldest_unindexed_age_seconds 0",
            "archivist_reconciler_scans_total 1",
            "archivist_breaker_state 1",
            "archivist_grpc_calls_total{code=\"Ok\",method=\"AppendEntries\"} 1",
            "archivist_watches 3",
            "archivist_event_notes_lost_total{reason=\"queue_full\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}

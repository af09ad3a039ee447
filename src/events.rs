//! Session events for `WatchSession`: an in-process hub with one bounded
//! broadcast channel per watched session. Publishing never waits: a watcher
//! that falls behind loses its oldest events and is told how many, so a
//! slow watcher never slows a pass or an append. Nothing is kept for
//! sessions nobody watches: a watch's registration goes with its stream.
//!
//! Watches have a budget of their own, apart from the unary calls' slots:
//! at most `limits.max_watches` open at once, and at most
//! `limits.max_watches_per_tenant` of one tenant, each refused by name when
//! full. A watch may name a session that has no entry yet (it waits for the
//! session's first events), so these caps are what bound what watchers
//! hold.
//!
//! Across processes: when the store carries notes between the processes
//! that share its database (PostgreSQL's LISTEN/NOTIFY), every event is
//! also sent as a small note (tenant, session, kind, segment id, when, and
//! which process sent it; never the segment's text), and every process
//! hears every note: one that is not its own and whose session it has
//! watchers for reads the segment itself and tells them. So a watcher on
//! any replica sees the events of all, and none twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::metrics::{Metrics, NotesLost};
use crate::model::{Millis, Segment, SegmentId, Tenant};
use crate::store::{Heard, Store};
use crate::throttle::Throttle;

/// Events one watcher may fall behind by before it loses the oldest.
const BUFFER: usize = 256;
/// Erasures a caller waiting on a pass may fall behind by.
const ERASURES: usize = 64;

/// How many watches may be open at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WatchLimits {
    /// On the whole server (`limits.max_watches`).
    pub(crate) max: usize,
    /// Of one tenant (`limits.max_watches_per_tenant`).
    pub(crate) per_tenant: usize,
}

/// A watch refused because its budget is full.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchRefused {
    #[error(
        "the server has {limit} watches open, as many as it holds (limits.max_watches); retry once one ends"
    )]
    Server { limit: usize },
    #[error(
        "this tenant has {limit} watches open, as many as one tenant may (limits.max_watches_per_tenant); end one or retry later"
    )]
    Tenant { limit: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    Closed,
    Summarised,
    Failed,
    Parked,
    Deleted,
    /// Events may have been lost before this one, how many unknown (the
    /// replica's notes from the others were interrupted): read again.
    /// Never sent between replicas.
    Gap,
}

/// Something that happened to a session.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) kind: EventKind,
    /// The node as it is after the event (none for a deletion).
    pub(crate) segment: Option<Segment>,
    pub(crate) at: Millis,
}

impl EventKind {
    fn as_str(self) -> &'static str {
        match self {
            EventKind::Closed => "closed",
            EventKind::Summarised => "summarised",
            EventKind::Failed => "failed",
            EventKind::Parked => "parked",
            EventKind::Deleted => "deleted",
            EventKind::Gap => "gap",
        }
    }

    /// A kind another replica may send (never `Gap`).
    fn parse(text: &str) -> Option<EventKind> {
        [
            EventKind::Closed,
            EventKind::Summarised,
            EventKind::Failed,
            EventKind::Parked,
            EventKind::Deleted,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

type Key = (String, String);

/// The channels of the sessions being watched, by tenant and session name.
pub(crate) struct Hub {
    watched: Mutex<Watched>,
    /// Every erasure this process hears of (its own and, relayed, the
    /// other replicas'), for callers waiting on a pass of the session.
    erasures: broadcast::Sender<Arc<Key>>,
    limits: WatchLimits,
    metrics: Arc<Metrics>,
    /// The other processes on the same database, when the store reaches
    /// them.
    relay: Option<Relay>,
}

/// What the open watches hold, counted against their budget.
#[derive(Default)]
struct Watched {
    /// One channel per watched session; a channel is removed with its
    /// last watch.
    channels: HashMap<Key, broadcast::Sender<Arc<Event>>>,
    /// Open watches per tenant (tenants with none are not kept).
    per_tenant: HashMap<String, usize>,
    total: usize,
}

/// One open watch: its events, and its place in the budget, given back
/// (with the session's channel, when it was the last watch of it) when the
/// watch is dropped.
pub(crate) struct Watch {
    // Dropped before `_slot`, so the slot sees this receiver gone.
    events: broadcast::Receiver<Arc<Event>>,
    _slot: Slot,
}

impl Watch {
    /// The next event, or how many were lost (`Lagged`), or `Closed`.
    pub(crate) async fn recv(&mut self) -> Result<Arc<Event>, broadcast::error::RecvError> {
        self.events.recv().await
    }
}

struct Slot {
    hub: Arc<Hub>,
    key: Key,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut watched = lock(&self.hub.watched);
        watched.total = watched.total.saturating_sub(1);
        if let Some(n) = watched.per_tenant.get_mut(&self.key.0) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                watched.per_tenant.remove(&self.key.0);
            }
        }
        if watched
            .channels
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            watched.channels.remove(&self.key);
        }
        self.hub.metrics.watches(watched.total);
    }
}

/// What sends this process's events to the others.
struct Relay {
    /// Names this process in its notes, so that it skips its own.
    origin: String,
    publish: mpsc::Sender<String>,
    /// Ends the task that hears the other processes' notes.
    _stop: DropGuard,
}

/// What another process's note asks of this one besides telling watchers:
/// a segment it closed is work for this process's reconciler too.
pub(crate) type Wake = Arc<tokio::sync::Notify>;

/// An event as it travels between processes: small (PostgreSQL takes at
/// most 8000 bytes), and without any text of the session.
#[derive(Serialize, Deserialize)]
struct Note {
    origin: String,
    tenant: String,
    session: String,
    kind: String,
    segment: Option<SegmentId>,
    at: i64,
}

/// Logs a dropped note once per interval, not once per note.
static DROPPED: Throttle = Throttle::new(std::time::Duration::from_secs(60));

impl Hub {
    /// A hub that also tells, and hears, the other processes sharing
    /// `store`'s database, when the store carries notes between them;
    /// `origin` names this process.
    pub(crate) fn relayed(
        store: &Store,
        origin: String,
        wake: Wake,
        limits: WatchLimits,
        metrics: Arc<Metrics>,
    ) -> Arc<Hub> {
        let Some(notes) = store.notes(metrics.clone()) else {
            return Arc::new(Hub::new(limits, metrics));
        };
        let stop = CancellationToken::new();
        let hub = Arc::new(Hub {
            watched: Mutex::default(),
            erasures: broadcast::channel(ERASURES).0,
            limits,
            metrics,
            relay: Some(Relay {
                origin,
                publish: notes.publish,
                _stop: stop.clone().drop_guard(),
            }),
        });
        tokio::spawn(hear(
            Arc::downgrade(&hub),
            store.clone(),
            notes.received,
            stop,
            wake,
        ));
        hub
    }

    /// A hub of this process alone.
    fn new(limits: WatchLimits, metrics: Arc<Metrics>) -> Hub {
        Hub {
            watched: Mutex::default(),
            erasures: broadcast::channel(ERASURES).0,
            limits,
            metrics,
            relay: None,
        }
    }

    /// Tells the watchers of `session`, here and on every process sharing
    /// the database, that `kind` happened to the node `id` (None: to the
    /// session); each event carries the node as it is read then.
    pub(crate) async fn tell(
        &self,
        store: &Store,
        tenant: &Tenant,
        session: &str,
        kind: EventKind,
        id: Option<SegmentId>,
    ) {
        let at = Millis::now();
        if let Some(relay) = &self.relay {
            let note = Note {
                origin: relay.origin.clone(),
                tenant: tenant.0.clone(),
                session: session.to_owned(),
                kind: kind.as_str().to_owned(),
                segment: id,
                at: at.0,
            };
            if let Ok(json) = serde_json::to_string(&note)
                && relay.publish.try_send(json).is_err()
            {
                self.metrics.notes_lost(NotesLost::QueueFull, 1);
                if let Some(more) = DROPPED.hit() {
                    tracing::warn!(
                        more,
                        "the queue of session events for the other replicas is full: their watchers miss some"
                    );
                }
            }
        }
        self.tell_here(store, tenant, session, kind, id, at).await;
    }

    /// Tells this process's watchers of `session`, if it has any.
    async fn tell_here(
        &self,
        store: &Store,
        tenant: &Tenant,
        session: &str,
        kind: EventKind,
        id: Option<SegmentId>,
        at: Millis,
    ) {
        if kind == EventKind::Deleted {
            let _ = self
                .erasures
                .send(Arc::new((tenant.0.clone(), session.to_owned())));
        }
        if !self.is_watched(&tenant.0, session) {
            return;
        }
        let segment = match id {
            // A node that cannot be read (erased meanwhile) has nothing to
            // tell.
            Some(id) => match store.segment(tenant, id).await {
                Ok(segment) => Some(segment),
                Err(_) => return,
            },
            None => None,
        };
        self.publish(&tenant.0, session, Event { kind, segment, at });
    }

    /// Resolves once `session` of `tenant` is erased (heard from now on):
    /// what a caller waiting on one of its passes races the pass with.
    pub(crate) fn erased(
        &self,
        tenant: &Tenant,
        session: &str,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut erasures = self.erasures.subscribe();
        let key = (tenant.0.clone(), session.to_owned());
        async move {
            loop {
                match erasures.recv().await {
                    Ok(erased) if *erased == key => return,
                    // Another session's, or some missed: the pass (or the
                    // store) tells of this one's soon enough.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    /// A new watcher of `session` (which need not exist yet: its events
    /// come once it does), within the watch budget.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        tenant: &Tenant,
        session: &str,
    ) -> Result<Watch, WatchRefused> {
        let mut watched = lock(&self.watched);
        if watched.total >= self.limits.max {
            return Err(WatchRefused::Server {
                limit: self.limits.max,
            });
        }
        let of_tenant = watched.per_tenant.get(&tenant.0).copied().unwrap_or(0);
        if of_tenant >= self.limits.per_tenant {
            return Err(WatchRefused::Tenant {
                limit: self.limits.per_tenant,
            });
        }
        let key = (tenant.0.clone(), session.to_owned());
        let events = watched
            .channels
            .entry(key.clone())
            .or_insert_with(|| broadcast::channel(BUFFER).0)
            .subscribe();
        *watched.per_tenant.entry(tenant.0.clone()).or_insert(0) += 1;
        watched.total += 1;
        self.metrics.watches(watched.total);
        Ok(Watch {
            events,
            _slot: Slot {
                hub: self.clone(),
                key,
            },
        })
    }

    /// Whether anyone watches `session` (so that the caller can skip
    /// reading what an event would carry).
    pub(crate) fn is_watched(&self, tenant: &str, session: &str) -> bool {
        lock(&self.watched)
            .channels
            .contains_key(&(tenant.to_owned(), session.to_owned()))
    }

    /// Tells every watcher of every session that events may have been lost
    /// (how many unknown); never waits.
    fn gap_everywhere(&self) {
        let watched = lock(&self.watched);
        let at = Millis::now();
        for tx in watched.channels.values() {
            let _ = tx.send(Arc::new(Event {
                kind: EventKind::Gap,
                segment: None,
                at,
            }));
        }
    }

    /// Tells every watcher of `session`; never waits.
    pub(crate) fn publish(&self, tenant: &str, session: &str, event: Event) {
        let key = (tenant.to_owned(), session.to_owned());
        let watched = lock(&self.watched);
        if let Some(tx) = watched.channels.get(&key) {
            // A channel lives only while it has watchers, so a send fails
            // only in the moment its last watcher is going.
            let _ = tx.send(Arc::new(event));
        }
    }
}

/// Hears the notes of every process on the database and tells this one's
/// watchers of the others' events, until the hub is gone.
async fn hear(
    hub: Weak<Hub>,
    store: Store,
    mut received: mpsc::Receiver<Heard>,
    stop: CancellationToken,
    wake: Wake,
) {
    loop {
        let heard = tokio::select! {
            _ = stop.cancelled() => return,
            heard = received.recv() => match heard {
                Some(heard) => heard,
                None => return,
            },
        };
        let Some(hub) = hub.upgrade() else {
            return;
        };
        let payload = match heard {
            Heard::Note(payload) => payload,
            Heard::Lost => {
                // Another replica's events may be gone: every watcher here
                // is told to read again, and the reconciler looks for work
                // a missed CLOSED would have brought.
                hub.gap_everywhere();
                wake.notify_one();
                continue;
            }
        };
        let Ok(note) = serde_json::from_str::<Note>(&payload) else {
            continue;
        };
        let Some(kind) = EventKind::parse(&note.kind) else {
            continue;
        };
        if hub.relay.as_ref().is_some_and(|r| r.origin == note.origin) {
            continue;
        }
        hub.tell_here(
            &store,
            &Tenant(note.tenant),
            &note.session,
            kind,
            note.segment,
            Millis(note.at),
        )
        .await;
        // Another replica closed a segment: this one's reconciler scans
        // now rather than at its next tick, so every replica drains. Only
        // once the watchers here are told: woken first, this replica's pass
        // could tell SUMMARISED before they hear of the CLOSED.
        if kind == EventKind::Closed {
            wake.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind) -> Event {
        Event {
            kind,
            segment: None,
            at: Millis(0),
        }
    }

    fn hub(max: usize, per_tenant: usize) -> Arc<Hub> {
        Arc::new(Hub::new(
            WatchLimits { max, per_tenant },
            Arc::new(Metrics::new()),
        ))
    }

    #[test]
    fn watchers_see_only_their_tenants_session_and_a_slow_one_lags() {
        let hub = hub(10, 10);
        let mut mine = hub.subscribe(&Tenant("a".to_owned()), "s").expect("room");
        let mut theirs = hub.subscribe(&Tenant("b".to_owned()), "s").expect("room");
        assert!(hub.is_watched("a", "s"));
        assert!(!hub.is_watched("a", "t"));
        hub.publish("a", "s", event(EventKind::Closed));
        assert_eq!(
            mine.events.try_recv().expect("event").kind,
            EventKind::Closed
        );
        assert!(theirs.events.try_recv().is_err());
        for _ in 0..BUFFER + 10 {
            hub.publish("a", "s", event(EventKind::Summarised));
        }
        assert!(matches!(
            mine.events.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(10))
        ));
        drop(mine);
        assert!(
            !hub.is_watched("a", "s"),
            "the last watch takes its channel"
        );
        assert!(hub.is_watched("b", "s"));
    }

    #[test]
    fn watches_are_capped_per_tenant_and_in_all_and_given_back() {
        let hub = hub(3, 2);
        let a = Tenant("a".to_owned());
        let b = Tenant("b".to_owned());
        let first = hub.subscribe(&a, "x").expect("room");
        let _second = hub.subscribe(&a, "y").expect("room");
        assert!(matches!(
            hub.subscribe(&a, "z"),
            Err(WatchRefused::Tenant { limit: 2 })
        ));
        let _theirs = hub.subscribe(&b, "x").expect("b has its own share");
        assert!(matches!(
            hub.subscribe(&b, "y"),
            Err(WatchRefused::Server { limit: 3 })
        ));
        drop(first);
        assert!(!hub.is_watched("a", "x"));
        let _again = hub
            .subscribe(&a, "z")
            .expect("a dropped watch gives its place back");
        let watched = lock(&hub.watched);
        assert_eq!(watched.total, 3);
        assert_eq!(watched.channels.len(), 3);
    }
}

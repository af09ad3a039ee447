//! Session events for `WatchSession`: an in-process hub with one bounded
//! broadcast channel per watched session. Publishing never waits: a watcher
//! that falls behind loses its oldest events and is told how many, so a
//! slow watcher never slows a pass or an append. Nothing is kept for
//! sessions nobody watches.
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

use crate::model::{Millis, Segment, SegmentId, Tenant};
use crate::store::Store;
use crate::throttle::Throttle;

/// Events one watcher may fall behind by before it loses the oldest.
const BUFFER: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    Closed,
    Summarised,
    Failed,
    Parked,
    Deleted,
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
        }
    }

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
#[derive(Default)]
pub(crate) struct Hub {
    channels: Mutex<HashMap<Key, broadcast::Sender<Event>>>,
    /// The other processes on the same database, when the store reaches
    /// them.
    relay: Option<Relay>,
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
    pub(crate) fn relayed(store: &Store, origin: String, wake: Wake) -> Arc<Hub> {
        let Some(notes) = store.notes() else {
            return Arc::new(Hub::default());
        };
        let stop = CancellationToken::new();
        let hub = Arc::new(Hub {
            channels: Mutex::default(),
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
                && let Some(more) = DROPPED.hit()
            {
                tracing::warn!(
                    more,
                    "the queue of session events for the other replicas is full: their watchers miss some"
                );
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

    /// A new watcher of `session`.
    pub(crate) fn subscribe(&self, tenant: &Tenant, session: &str) -> broadcast::Receiver<Event> {
        let mut channels = lock(&self.channels);
        if channels.len() >= 1024 {
            // Forget sessions whose watchers have all gone.
            channels.retain(|_, tx| tx.receiver_count() > 0);
        }
        channels
            .entry((tenant.0.clone(), session.to_owned()))
            .or_insert_with(|| broadcast::channel(BUFFER).0)
            .subscribe()
    }

    /// Whether anyone watches `session` (so that the caller can skip
    /// reading what an event would carry).
    pub(crate) fn is_watched(&self, tenant: &str, session: &str) -> bool {
        lock(&self.channels)
            .get(&(tenant.to_owned(), session.to_owned()))
            .is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Tells every watcher of `session`; never waits.
    pub(crate) fn publish(&self, tenant: &str, session: &str, event: Event) {
        let key = (tenant.to_owned(), session.to_owned());
        let mut channels = lock(&self.channels);
        let Some(tx) = channels.get(&key) else {
            return;
        };
        if tx.send(event).is_err() {
            // Nobody is listening any more.
            channels.remove(&key);
        }
    }
}

/// Hears the notes of every process on the database and tells this one's
/// watchers of the others' events, until the hub is gone.
async fn hear(
    hub: Weak<Hub>,
    store: Store,
    mut received: mpsc::Receiver<String>,
    stop: CancellationToken,
    wake: Wake,
) {
    loop {
        let payload = tokio::select! {
            _ = stop.cancelled() => return,
            payload = received.recv() => match payload {
                Some(payload) => payload,
                None => return,
            },
        };
        let Some(hub) = hub.upgrade() else {
            return;
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
        // Another replica closed a segment: this one's reconciler scans
        // now rather than at its next tick, so every replica drains.
        if kind == EventKind::Closed {
            wake.notify_one();
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

    #[test]
    fn watchers_see_only_their_tenants_session_and_a_slow_one_lags() {
        let hub = Hub::default();
        let mut mine = hub.subscribe(&Tenant("a".to_owned()), "s");
        let mut theirs = hub.subscribe(&Tenant("b".to_owned()), "s");
        assert!(hub.is_watched("a", "s"));
        assert!(!hub.is_watched("a", "t"));
        hub.publish("a", "s", event(EventKind::Closed));
        assert_eq!(mine.try_recv().expect("event").kind, EventKind::Closed);
        assert!(theirs.try_recv().is_err());
        for _ in 0..BUFFER + 10 {
            hub.publish("a", "s", event(EventKind::Summarised));
        }
        assert!(matches!(
            mine.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(10))
        ));
        drop(mine);
        hub.publish("a", "s", event(EventKind::Closed));
        assert!(!hub.is_watched("a", "s"));
    }
}

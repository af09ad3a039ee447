//! Session events for `WatchSession`: an in-process hub with one bounded
//! broadcast channel per watched session. Publishing never waits: a watcher
//! that falls behind loses its oldest events and is told how many, so a
//! slow watcher never slows a pass or an append. Nothing is kept for
//! sessions nobody watches.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::model::{Millis, Segment, Tenant};

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

type Key = (String, String);

/// The channels of the sessions being watched, by tenant and session name.
#[derive(Default)]
pub(crate) struct Hub {
    channels: Mutex<HashMap<Key, broadcast::Sender<Event>>>,
}

impl Hub {
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

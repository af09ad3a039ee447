//! Notes between replicas: what one replica publishes with NOTIFY, every
//! replica (itself included) receives on a connection of its own that
//! LISTENs. The payloads are opaque here (the event hub writes and reads
//! them); PostgreSQL delivers each once a transaction commits, in commit
//! order, to every listening connection; nothing is kept for a replica
//! that was not listening at the time. So whenever the listening
//! connection is lost (and once it listens again), and whenever a note
//! could not be passed on, the receiving end hears `Heard::Lost`: some
//! notes may be missing, and the hub tells every watcher so (a GAP). Notes
//! lost on either side are counted in the metrics.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::warn;

use super::Postgres;
use crate::failure::cause_chain;
use crate::metrics::{Metrics, NotesLost};
use std::sync::Arc;

/// The channel every replica listens on.
const CHANNEL: &str = "archivist_events";
/// The largest payload sent: PostgreSQL refuses 8000 bytes and more.
pub(crate) const MAX_PAYLOAD: usize = 7900;
/// Notes waiting to be sent, or to be read, before new ones are dropped.
const DEPTH: usize = 4096;
/// Most notes sent in one statement.
const BATCH: usize = 256;
/// How long the listener waits before connecting again after losing its
/// connection.
const RECONNECT: Duration = Duration::from_secs(1);

/// Both ends of a replica's notes.
pub struct Notes {
    /// Payloads to publish to every replica; a full queue drops the note.
    pub publish: mpsc::Sender<String>,
    /// What this replica hears: payloads published by any replica (this
    /// one's included), and word of notes it may have missed.
    pub received: mpsc::Receiver<Heard>,
}

/// What the listening end passes on.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    Note(String),
    /// Notes may have been missed: the listening connection was lost, or
    /// listens again after a loss, or notes came faster than they were
    /// read.
    Lost,
}

impl Postgres {
    /// Starts the tasks that publish and receive notes; they end when both
    /// ends of `Notes` are dropped. Notes lost are counted in `metrics`.
    pub(crate) fn notes(&self, metrics: Arc<Metrics>) -> Notes {
        let (publish, outgoing) = mpsc::channel(DEPTH);
        let (incoming, received) = mpsc::channel(DEPTH);
        tokio::spawn(publisher(
            self.inner.pool.clone(),
            outgoing,
            metrics.clone(),
        ));
        tokio::spawn(listener(self.inner.config.clone(), incoming, metrics));
        Notes { publish, received }
    }
}

/// Sends queued notes, in order, as many at a time as have queued up.
async fn publisher(pool: Pool, mut outgoing: mpsc::Receiver<String>, metrics: Arc<Metrics>) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = outgoing.recv().await {
        batch.clear();
        batch.push(first);
        while batch.len() < BATCH {
            match outgoing.try_recv() {
                Ok(note) => batch.push(note),
                Err(_) => break,
            }
        }
        batch.retain(|n| n.len() < MAX_PAYLOAD);
        let sent = async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client
                .execute(
                    "SELECT pg_notify($1, n) FROM unnest($2::text[]) AS n",
                    &[&CHANNEL, &batch],
                )
                .await
                .map_err(|e| cause_chain(&e).join(": "))
        };
        if let Err(e) = sent.await {
            metrics.notes_lost(NotesLost::PublishFailed, batch.len() as u64);
            warn!(error = %e, notes = batch.len(), "cannot tell the other replicas of session events; their watchers miss these");
        }
    }
}

/// Listens on a connection of its own, connecting again whenever it is
/// lost, until nobody reads what it receives. A loss is passed on as
/// `Heard::Lost` twice: when it happens, and once the new connection
/// listens (what came in between is gone).
async fn listener(
    config: tokio_postgres::Config,
    incoming: mpsc::Sender<Heard>,
    metrics: Arc<Metrics>,
) {
    let mut lost = false;
    while !incoming.is_closed() {
        let ended = listen_once(&config, &incoming, lost).await;
        if let Err(e) = &ended.result {
            warn!(error = %e, "the connection listening for other replicas' session events failed; connecting again");
        }
        if ended.listened {
            metrics.notes_lost(NotesLost::ListenLost, 1);
            lost = true;
            if incoming.send(Heard::Lost).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// How one listening connection ended.
struct Ended {
    /// It had started listening (so notes may be lost from here).
    listened: bool,
    result: Result<(), String>,
}

async fn listen_once(
    config: &tokio_postgres::Config,
    incoming: &mpsc::Sender<Heard>,
    after_loss: bool,
) -> Ended {
    let not_listening = |result| Ended {
        listened: false,
        result,
    };
    let (client, mut connection) = match config.connect(NoTls).await {
        Ok(c) => c,
        Err(e) => return not_listening(Err(cause_chain(&e).join(": "))),
    };
    let forward = incoming.clone();
    let driver = tokio::spawn(async move {
        // Notes dropped for a full queue: say so once there is room.
        let mut dropped = false;
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if dropped {
                        match forward.try_send(Heard::Lost) {
                            Ok(()) => dropped = false,
                            Err(mpsc::error::TrySendError::Full(_)) => {}
                            Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
                        }
                    }
                    match forward.try_send(Heard::Note(n.payload().to_owned())) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => dropped = true,
                        Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(cause_chain(&e).join(": ")),
                None => return Err("the connection closed".to_owned()),
            }
        }
    });
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        driver.abort();
        return not_listening(Err(cause_chain(&e).join(": ")));
    }
    // Listening again after a loss: whatever was sent meanwhile is gone.
    if after_loss && incoming.send(Heard::Lost).await.is_err() {
        driver.abort();
        return not_listening(Ok(()));
    }
    let ended = driver.await.map_err(|e| e.to_string()).and_then(|r| r);
    drop(client);
    Ended {
        listened: !incoming.is_closed(),
        result: ended,
    }
}

//! Notes between replicas: what one replica publishes with NOTIFY, every
//! replica (itself included) receives on a connection of its own that
//! LISTENs. The payloads are opaque here (the event hub writes and reads
//! them); PostgreSQL delivers each once a transaction commits, in commit
//! order, to every listening connection; nothing is kept for a replica
//! that was not listening at the time.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::warn;

use super::Postgres;
use crate::failure::cause_chain;

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
    /// Payloads published by any replica, this one's included.
    pub received: mpsc::Receiver<String>,
}

impl Postgres {
    /// Starts the tasks that publish and receive notes; they end when both
    /// ends of `Notes` are dropped.
    pub(crate) fn notes(&self) -> Notes {
        let (publish, outgoing) = mpsc::channel(DEPTH);
        let (incoming, received) = mpsc::channel(DEPTH);
        tokio::spawn(publisher(self.inner.pool.clone(), outgoing));
        tokio::spawn(listener(self.inner.config.clone(), incoming));
        Notes { publish, received }
    }
}

/// Sends queued notes, in order, as many at a time as have queued up.
async fn publisher(pool: Pool, mut outgoing: mpsc::Receiver<String>) {
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
            warn!(error = %e, notes = batch.len(), "cannot tell the other replicas of session events; their watchers miss these");
        }
    }
}

/// Listens on a connection of its own, connecting again whenever it is
/// lost, until nobody reads what it receives.
async fn listener(config: tokio_postgres::Config, incoming: mpsc::Sender<String>) {
    while !incoming.is_closed() {
        if let Err(e) = listen_once(&config, &incoming).await {
            warn!(error = %e, "the connection listening for other replicas' session events failed; connecting again");
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    incoming: &mpsc::Sender<String>,
) -> Result<(), String> {
    let (client, mut connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| cause_chain(&e).join(": "))?;
    let forward = incoming.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Err(mpsc::error::TrySendError::Closed(_)) =
                        forward.try_send(n.payload().to_owned())
                    {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(cause_chain(&e).join(": ")),
                None => return Err("the connection closed".to_owned()),
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(|e| cause_chain(&e).join(": "))?;
    let ended = driver.await.map_err(|e| e.to_string())?;
    drop(client);
    ended
}

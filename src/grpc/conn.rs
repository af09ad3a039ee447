//! The listener's connections, so that no stranger can hold the server's
//! descriptors: at most `limits.max_connections` are open at once; one with
//! no call running for `limits.idle_timeout` is closed; at the cap, a new
//! connection takes the place of the one idle the longest, and is refused
//! (closed at once) only when every open connection has a call running. An
//! accept that fails for want of descriptors or memory (EMFILE, ENFILE,
//! ENOBUFS) frees an idle connection and backs off instead of spinning.
//! Refusals and accept errors are logged at most once per interval.
//!
//! `RecordCalls` (in `gate.rs`) marks each call on its connection through
//! the `ConnInfo` tonic puts in every request's extensions, so an idle
//! connection can be told from a busy one.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;
use tracing::{info, warn};

use crate::throttle::{LOG_INTERVAL, Throttle};

/// The first wait after an accept failed for want of resources; it doubles
/// while they stay short, up to MAX_BACKOFF.
const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connections open now, shared by the listener, the idle sweep and
/// each connection (which leaves when it closes).
struct Registry {
    max: usize,
    idle_timeout: Duration,
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
    refused: Throttle,
    evicted: Throttle,
    accept_failed: Throttle,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the connection idle the longest, if one is; true if it did.
    fn close_longest_idle(open: &HashMap<u64, Arc<ConnState>>) -> bool {
        let victim = open
            .values()
            .filter(|c| !c.closing.is_cancelled() && c.calls.load(Ordering::SeqCst) == 0)
            .min_by_key(|c| c.idle_since.load(Ordering::SeqCst));
        match victim {
            Some(c) => {
                c.closing.cancel();
                true
            }
            None => false,
        }
    }

    /// Closes every connection whose running calls are all watch streams
    /// (at shutdown, once their watchers have been told: a watcher that
    /// does not read would otherwise hold its stream, and the shutdown,
    /// open to the ceiling).
    fn close_watching(&self) {
        for c in self.open().values() {
            let calls = c.calls.load(Ordering::SeqCst);
            if calls > 0 && calls == c.watches.load(Ordering::SeqCst) {
                c.closing.cancel();
            }
        }
    }

    /// Closes every connection idle for `idle_timeout` or more.
    fn sweep(&self) {
        let now = self.now_ms();
        let timeout = u64::try_from(self.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        for c in self.open().values() {
            if c.calls.load(Ordering::SeqCst) == 0
                && now.saturating_sub(c.idle_since.load(Ordering::SeqCst)) >= timeout
            {
                c.closing.cancel();
            }
        }
    }
}

/// One open connection's state.
pub(crate) struct ConnState {
    registry: Weak<Registry>,
    /// Calls running on it now.
    calls: AtomicUsize,
    /// Of those, the watch streams.
    watches: AtomicUsize,
    /// When its last call ended (or it opened), in ms since the registry's
    /// epoch.
    idle_since: AtomicU64,
    /// Cancelled to close it.
    closing: CancellationToken,
}

impl ConnState {
    /// Marks a call (a watch stream, if `watch`) running on this
    /// connection until the guard is dropped.
    pub(crate) fn begin_call(self: &Arc<Self>, watch: bool) -> CallOnConn {
        if watch {
            self.watches.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        CallOnConn {
            conn: self.clone(),
            watch,
        }
    }
}

/// A call running on a connection.
pub(crate) struct CallOnConn {
    conn: Arc<ConnState>,
    watch: bool,
}

impl Drop for CallOnConn {
    fn drop(&mut self) {
        if let Some(registry) = self.conn.registry.upgrade() {
            self.conn
                .idle_since
                .store(registry.now_ms(), Ordering::SeqCst);
        }
        self.conn.calls.fetch_sub(1, Ordering::SeqCst);
        if self.watch {
            self.conn.watches.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What the server's shutdown asks of the open connections.
#[derive(Clone)]
pub(crate) struct Connections(Arc<Registry>);

impl Connections {
    /// Closes the connections whose running calls are all watch streams.
    pub(crate) fn close_watching(&self) {
        self.0.close_watching();
    }
}

/// What tonic puts in each request's extensions for its connection.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    pub(crate) state: Arc<ConnState>,
}

/// An accepted connection; closes itself (its reads fail) when told to.
pub(crate) struct Conn {
    stream: TcpStream,
    id: u64,
    info: ConnInfo,
    registry: Arc<Registry>,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.registry.open().remove(&self.id);
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The server always has a read pending on a connection, so this
        // is where a close is noticed; the error ends the connection.
        if self.closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed: idle, or making room under limits.max_connections",
            )));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections the server serves: accepted from the listener within the
/// cap. Never yields an error: what goes wrong is handled (and logged) here.
pub(crate) struct Incoming {
    listener: TcpListener,
    registry: Arc<Registry>,
    backoff: Duration,
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Incoming {
    /// Serves `listener` with at most `max_connections` open, closing those
    /// idle for `idle_timeout`. Starts the idle sweep, which ends once the
    /// listener and every connection are gone.
    pub(crate) fn new(
        listener: TcpListener,
        max_connections: usize,
        idle_timeout: Duration,
    ) -> Incoming {
        let registry = Arc::new(Registry {
            max: max_connections.max(1),
            idle_timeout,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            refused: Throttle::new(LOG_INTERVAL),
            evicted: Throttle::new(LOG_INTERVAL),
            accept_failed: Throttle::new(LOG_INTERVAL),
        });
        let tick = (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        let weak = Arc::downgrade(&registry);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                match weak.upgrade() {
                    Some(registry) => registry.sweep(),
                    None => return,
                }
            }
        });
        Incoming {
            listener,
            registry,
            backoff: MIN_BACKOFF,
            waiting: None,
        }
    }

    /// What the shutdown uses to close the connections left to watchers.
    pub(crate) fn connections(&self) -> Connections {
        Connections(self.registry.clone())
    }

    /// Takes a new connection in, making room by closing the longest-idle
    /// one if the cap is reached; None (and the socket closed at once) when
    /// every open connection is busy.
    fn admit(&self, stream: TcpStream, peer: SocketAddr) -> Option<Conn> {
        let registry = &self.registry;
        let mut open = registry.open();
        let live = open.values().filter(|c| !c.closing.is_cancelled()).count();
        if live >= registry.max {
            if Registry::close_longest_idle(&open) {
                if let Some(held_back) = registry.evicted.hit() {
                    info!(
                        max_connections = registry.max,
                        more = held_back,
                        "closed the longest-idle connection to make room for a new one"
                    );
                }
            } else {
                drop(open);
                drop(stream);
                if let Some(held_back) = registry.refused.hit() {
                    warn!(
                        %peer,
                        max_connections = registry.max,
                        more = held_back,
                        "refused a connection: limits.max_connections are open and every one has a call running"
                    );
                }
                return None;
            }
        }
        let _ = stream.set_nodelay(true);
        let id = registry.next_id.fetch_add(1, Ordering::Relaxed);
        let closing = CancellationToken::new();
        let state = Arc::new(ConnState {
            registry: Arc::downgrade(registry),
            calls: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            idle_since: AtomicU64::new(registry.now_ms()),
            closing: closing.clone(),
        });
        open.insert(id, state.clone());
        drop(open);
        Some(Conn {
            stream,
            id,
            info: ConnInfo { state },
            registry: registry.clone(),
            closing: Box::pin(closing.cancelled_owned()),
        })
    }
}

/// An accept error that only concerns the connection being accepted (it
/// went away meanwhile); anything else is the server short of resources.
fn concerns_one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::BrokenPipe
    )
}

impl Stream for Incoming {
    type Item = Result<Conn, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(waiting) = &mut self.waiting {
                ready!(waiting.as_mut().poll(cx));
                self.waiting = None;
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok((stream, peer)) => {
                    self.backoff = MIN_BACKOFF;
                    if let Some(conn) = self.admit(stream, peer) {
                        return Poll::Ready(Some(Ok(conn)));
                    }
                }
                Err(e) if concerns_one_connection(&e) => {}
                Err(e) => {
                    // Out of descriptors or memory: free an idle
                    // connection's descriptor, and wait rather than spin on
                    // a listener that will fail again at once.
                    let freed = Registry::close_longest_idle(&self.registry.open());
                    if let Some(held_back) = self.registry.accept_failed.hit() {
                        warn!(
                            error = %e,
                            freed_idle_connection = freed,
                            backoff = ?self.backoff,
                            more = held_back,
                            "cannot accept connections; backing off"
                        );
                    }
                    let wait = self.backoff;
                    self.backoff = (wait * 2).min(MAX_BACKOFF);
                    self.waiting = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
    }
}

//! Tests only: the log lines code under test writes, captured.

use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// Captures what this thread logs (INFO and above, without colours) while
/// it lives.
pub(crate) struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

#[derive(Clone)]
struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    pub(crate) fn start() -> LogCapture {
        let buffer = Arc::<Mutex<Vec<u8>>>::default();
        let writer = Writer(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        LogCapture {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Makes sure the callsites reached since `start` log here, and forgets
    /// what they wrote. tracing caches each callsite's interest
    /// process-wide, computed by whichever thread first reaches it: a
    /// sibling test without a subscriber can cache "never" and blind this
    /// capture. Reached first (a warm-up), then rebuilt against the
    /// dispatchers alive now (this one among them), they stay enabled.
    pub(crate) fn rearm(&self) {
        tracing::callsite::rebuild_interest_cache();
        self.buffer.lock().expect("lock").clear();
    }

    /// What was logged since `start` (or the last `rearm`).
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().expect("lock")).into_owned()
    }
}

//! Captures the in-process servers' log lines, so tests can assert on what
//! an operator would read (and on what must never appear there).

use std::io::Write;
use std::sync::{Mutex, OnceLock};

static LINES: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

fn buffer() -> &'static Mutex<Vec<u8>> {
    LINES.get_or_init(|| Mutex::new(Vec::new()))
}

struct Sink;

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        buffer()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber once for the whole test binary.
pub fn capture() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("archivist=debug")
            .with_ansi(false)
            .with_writer(|| Sink)
            .try_init();
    });
}

/// Every line logged so far by any server of this test binary.
pub fn lines() -> Vec<String> {
    let bytes = buffer().lock().unwrap_or_else(|e| e.into_inner()).clone();
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_owned)
        .collect()
}

//! Log lines that a flood cannot multiply: one line per interval for a
//! kind of event, saying how many were held back since the last one. A
//! refused connection, a full disk or a broken store may happen thousands
//! of times a second; the log says so once every few seconds.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a throttled event is logged at most.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

pub(crate) struct Throttle {
    interval: Duration,
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl Throttle {
    pub(crate) const fn new(interval: Duration) -> Throttle {
        Throttle {
            interval,
            last: Mutex::new(None),
            held_back: AtomicU64::new(0),
        }
    }

    /// Counts an event; Some(n) when it should be logged now, n being how
    /// many were held back since the last line.
    pub(crate) fn hit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match *last {
            Some(at) if now.duration_since(at) < self.interval => {
                self.held_back.fetch_add(1, Ordering::Relaxed);
                None
            }
            _ => {
                *last = Some(now);
                Some(self.held_back.swap(0, Ordering::Relaxed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.hit(), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.hit(), None);
        }
        let t = Throttle::new(Duration::ZERO);
        assert_eq!(t.hit(), Some(0));
        assert_eq!(t.hit(), Some(0));
    }
}

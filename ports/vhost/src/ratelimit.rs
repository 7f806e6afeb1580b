//! A log limiter for lines a peer can make the switch write as often as it likes (a frontend
//! reconnecting in a loop writes two lines a connection): at most [`LINES`] per [`WINDOW`]
//! per port, and the first line after a quiet spell says how many were left out.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Lines let through per window.
pub const LINES: u32 = 6;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct LogLimit {
    /// The current window's start, in seconds since the epoch.
    window: AtomicU64,
    lines: AtomicU32,
    suppressed: AtomicU32,
}

impl LogLimit {
    pub const fn new() -> LogLimit {
        LogLimit {
            window: AtomicU64::new(0),
            lines: AtomicU32::new(0),
            suppressed: AtomicU32::new(0),
        }
    }

    /// Whether a line may be written now (`Some`: with how many were left out before it).
    pub fn allow(&self) -> Option<u32> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.allow_at(now)
    }

    fn allow_at(&self, now: u64) -> Option<u32> {
        let start = self.window.load(Ordering::Relaxed);
        if now >= start + WINDOW.as_secs()
            && self
                .window
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.lines.store(0, Ordering::Relaxed);
        }
        if self.lines.fetch_add(1, Ordering::Relaxed) < LINES {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_burst_is_cut_and_the_next_window_says_how_much() {
        let l = LogLimit::default();
        let t = 1_000_000;
        let got: Vec<Option<u32>> = (0..10).map(|_| l.allow_at(t)).collect();
        assert_eq!(got.iter().filter(|g| g.is_some()).count(), LINES as usize);
        assert!(got[LINES as usize..].iter().all(Option::is_none));
        assert_eq!(l.allow_at(t + 5), None, "same window");
        assert_eq!(l.allow_at(t + WINDOW.as_secs()), Some(5), "five left out");
        assert_eq!(l.allow_at(t + WINDOW.as_secs()), Some(0));
    }
}

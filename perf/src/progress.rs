//! A run's progress: every trial's line, and how far the run is with the time left. On a
//! terminal a bar (`indicatif`) below the lines; elsewhere (a log, CI) each line ends with
//! the share done and the time left.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

/// Progress measured in planned seconds: each step advances by what it was planned to
/// take, so the estimate of the time left follows the run's real pace.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A run planned to take about `planned`.
    pub fn new(planned: Duration) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(planned.as_millis().max(1) as u64),
            ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {percent:>3} % · {eta} left · {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        if !bar.is_hidden() {
            bar.enable_steady_tick(Duration::from_millis(500));
        }
        Progress { bar }
    }

    /// A progress that only prints lines (tests, `report`).
    pub fn quiet() -> Progress {
        Progress { bar: ProgressBar::hidden() }
    }

    /// One line of what happened.
    pub fn line(&self, s: &str) {
        if self.bar.is_hidden() {
            match self.left() {
                Some(left) => {
                    eprintln!("{s} [{:.0} %, ~{} left]", self.done() * 100.0, minutes(left))
                }
                None => eprintln!("{s}"),
            }
        } else {
            self.bar.println(s);
            self.bar.set_message(s.to_string());
        }
    }

    /// A step planned to take `planned` is done.
    pub fn advance(&self, planned: Duration) {
        self.bar.inc(planned.as_millis() as u64);
    }

    fn done(&self) -> f64 {
        let len = self.bar.length().unwrap_or(1).max(1);
        (self.bar.position() as f64 / len as f64).min(1.0)
    }

    /// The time left at the pace so far (none before any step, or with no plan).
    fn left(&self) -> Option<Duration> {
        let len = self.bar.length()?;
        let pos = self.bar.position();
        (pos > 0 && len > 1).then(|| left_at_pace(self.bar.elapsed(), pos, len))
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// What is left of `len` units when `pos` took `elapsed`.
fn left_at_pace(elapsed: Duration, pos: u64, len: u64) -> Duration {
    elapsed.mul_f64(len.saturating_sub(pos) as f64 / pos.max(1) as f64)
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s < 90 { format!("{s} s") } else { format!("{} min", (s + 30) / 60) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_follows_the_pace() {
        // A quarter done in a minute: three minutes left, whatever was planned.
        assert_eq!(left_at_pace(Duration::from_secs(60), 250, 1000), Duration::from_secs(180));
        assert_eq!(left_at_pace(Duration::from_secs(60), 1000, 1000), Duration::ZERO);
        assert_eq!(
            left_at_pace(Duration::from_secs(60), 1200, 1000),
            Duration::ZERO,
            "a run longer than planned"
        );
        assert_eq!(minutes(Duration::from_secs(45)), "45 s");
        assert_eq!(minutes(Duration::from_secs(400)), "7 min");
    }
}

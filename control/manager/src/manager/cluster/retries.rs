//! Per-object backoff for the controller's writes to the apiserver (what kube-runtime's
//! `Controller` gives each object): a write that failed is tried again after
//! [`RETRY`](super::networks::RETRY), twice as long after each failure in a row, up to
//! [`MAX_RETRY`](super::networks::MAX_RETRY) — or at once when the object itself changed
//! (its `resourceVersion` moved) — so one object the apiserver keeps refusing (a permanent
//! 403, an admission webhook) is not written again on every change of the others, and the
//! others are not made to wait for it.

use super::networks::{MAX_RETRY, RETRY};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The wait after `failures` failures in a row (the first one: none before it): [`RETRY`],
/// doubled for each, at most [`MAX_RETRY`].
pub fn retry_wait(failures: u32) -> Duration {
    RETRY.saturating_mul(1 << failures.min(16)).min(MAX_RETRY)
}

/// One object's failed write: how many in a row, over which version, and when it is due.
#[derive(Debug, Clone)]
struct Failure {
    count: u32,
    version: Option<String>,
    due: Instant,
}

/// The writes that failed, by a key naming the object and the write
/// (`networks.knitter.io media status`, `nad red/media`, `nad list`).
#[derive(Debug, Default)]
pub struct Retries {
    failed: HashMap<String, Failure>,
}

impl Retries {
    /// Whether the write `key` of the object at `version` may be tried now: it never failed,
    /// its wait is over, or the object changed since.
    pub fn due(&self, key: &str, version: Option<&str>, now: Instant) -> bool {
        self.failed.get(key).is_none_or(|f| now >= f.due || f.version.as_deref() != version)
    }

    /// Takes a write's outcome.
    pub fn record(&mut self, key: &str, version: Option<&str>, ok: bool, now: Instant) {
        if ok {
            self.failed.remove(key);
            return;
        }
        let count = self.failed.get(key).map_or(0, |f| f.count);
        let wait = retry_wait(count);
        let failure = Failure {
            count: count.saturating_add(1),
            version: version.map(str::to_string),
            due: now + wait,
        };
        self.failed.insert(key.to_string(), failure);
    }

    /// How long until the first failed write is due again, if any failed.
    pub fn next(&self, now: Instant) -> Option<Duration> {
        self.failed.values().map(|f| f.due.saturating_duration_since(now)).min()
    }

    /// Gives the writes that were due but not tried (the pass stopped before them: the NAD
    /// list or the manager's store failed) their wait again from `now`, so that they keep
    /// their place on the backoff schedule and never make the passes run back to back.
    pub fn defer_overdue(&mut self, now: Instant) {
        for f in self.failed.values_mut().filter(|f| f.due <= now) {
            f.due = now + retry_wait(f.count.saturating_sub(1));
        }
    }

    /// Forgets writes of objects no longer in view (`keep` says which keys still are).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.failed.retain(|k, _| keep(k));
    }

    /// How many writes are waiting to be tried again.
    pub fn waiting(&self) -> usize {
        self.failed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Retries;
    use std::time::{Duration, Instant};

    #[test]
    fn a_failing_write_waits_longer_each_time_unless_its_object_changed() {
        let (mut r, t0) = (Retries::default(), Instant::now());
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(r.due("networks/a status", Some("1"), t0));
        r.record("networks/a status", Some("1"), false, t0);
        assert!(!r.due("networks/a status", Some("1"), at(1)), "waits 2 s");
        assert!(r.due("networks/a status", Some("1"), at(2)));
        let mut overdue = Retries::default();
        overdue.record("nad a/b", None, false, t0);
        overdue.record("nad a/b", None, false, t0);
        overdue.defer_overdue(at(10));
        assert_eq!(overdue.next(at(10)), Some(Duration::from_secs(4)), "its own wait, from now");
        assert!(r.due("networks/a status", Some("2"), at(1)), "a changed object: at once");
        assert!(r.due("networks/b status", Some("1"), at(1)), "others never wait for it");
        let mut t = at(2);
        let mut waits = vec![];
        for _ in 0..6 {
            r.record("networks/a status", Some("1"), false, t);
            let wait = r.next(t).unwrap();
            waits.push(wait.as_secs());
            t += wait;
        }
        assert_eq!(waits, vec![4, 8, 16, 30, 30, 30]);
        r.record("networks/a status", Some("1"), true, t);
        assert_eq!(r.next(t), None);
        r.record("nad x/a", None, false, t);
        r.retain(|k| k != "nad x/a");
        assert_eq!(r.waiting(), 0);
    }
}

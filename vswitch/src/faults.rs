//! Ports put in error by a panic while a PMD thread processed one of their bursts: the port
//! is no longer polled, its device is told ([`crate::port::Port::fail`]), and every view of
//! the node shows why, until the port is registered again (deleted and added, or its device
//! opened again). The PMD thread goes on with its other ports.
//!
//! Written only on a panic and read by PMD threads when its generation moved (they compare
//! it once a poll round, a relaxed load), so the map's lock is never taken on the fast path.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Faults {
    ports: Mutex<BTreeMap<String, String>>,
    generation: AtomicU64,
}

impl Faults {
    fn ports(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.ports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts port `name` in error for `why` (the first reason stays).
    pub fn set(&self, name: &str, why: String) {
        self.ports().entry(name.to_string()).or_insert(why);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The port was registered again: its error goes.
    pub fn clear(&self, name: &str) {
        if self.ports().remove(name).is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Why port `name` is in error, if it is.
    pub fn get(&self, name: &str) -> Option<String> {
        self.ports().get(name).cloned()
    }

    /// Every port in error, with why.
    pub fn all(&self) -> BTreeMap<String, String> {
        self.ports().clone()
    }

    /// Moves on every change.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The port whose transmit burst the thread is in (its id + 1; 0: none).
    static EGRESS: Cell<u32> = const { Cell::new(0) };
}

/// The thread enters port `p`'s transmit burst: a panic there is that port's (the code that
/// ran was its, on its receive ring), not the ingress port's.
#[inline(always)]
pub fn entering_tx(p: u16) {
    EGRESS.with(|c| c.set(p as u32 + 1));
}

/// The thread left the transmit burst it entered.
#[inline(always)]
pub fn left_tx() {
    EGRESS.with(|c| c.set(0));
}

/// The port whose transmit burst a panic interrupted, if it was in one (and forgets it).
pub fn take_egress() -> Option<u16> {
    EGRESS.with(|c| c.replace(0)).checked_sub(1).map(|p| p as u16)
}

/// A panic's message, as `std` prints it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

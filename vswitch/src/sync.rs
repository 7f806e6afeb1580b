//! The atomics under the lock-free structures several threads share (the FDB's seqlock, the
//! SPSC ring, counters): std's, or loom's when built with `RUSTFLAGS="--cfg loom"`, so the
//! models in `tests/loom.rs` explore the interleavings of the real code, not of a copy.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, fence};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

//! Knitter's vhost-user virtio-net backend, the port VNF pods live on.
//!
//! rust-vmm's `vhost` crate parses the vhost-user protocol; [`backend`] answers its messages
//! (features, memory tables, rings) on the daemon's side, and the PMD threads never see a
//! message. This crate owns the fast path the rust-vmm crates leave to the device: guest
//! memory as host mappings with every guest-named range checked once ([`memory`]), split
//! and packed virtqueues polled in batches with each descriptor chain validated before use
//! ([`vring`], [`packed`], one type for both in [`queue`]), the virtio-net header with the copies between guest buffers and pool
//! packets ([`net`]), and the switch port ([`port`]). Everything a frontend controls is
//! hostile input: its descriptors are checked ([`eventfd`]) and every call on them bounded
//! ([`stall`]), its socket directory is never followed through ([`socket`]), its memory
//! file may shrink ([`sigbus`]), and what it makes the port log is rate-limited per port
//! ([`ratelimit`]). With the `testkit` feature, `driver` is the
//! driver side of split virtqueues (the perf lab's generator) and `testkit` a simulated
//! guest for tests built on its layout.

pub mod backend;
#[cfg(any(test, feature = "testkit"))]
pub mod driver;
pub mod eventfd;
pub mod memory;
pub mod net;
pub mod packed;
pub mod port;
pub mod queue;
pub mod ratelimit;
pub mod sigbus;
pub mod socket;
pub mod stall;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod vring;

//! The switch under test as every trial sees it, whichever switch it is (`switches.rs`
//! starts Knitter, the yardstick and the Linux bridge, `ovs.rs` Open vSwitch): the sockets
//! it serves, and what its own counters say about a window.

use serde::Serialize;
use std::path::PathBuf;

/// A switch a trial runs: stopped when dropped.
pub trait SwitchUnderTest {
    /// The switch's own counters, when it has a way to read them.
    fn own(&self) -> Option<Own>;
}

/// What the switch's own counters say about a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Own {
    pub busy_cycles: u64,
    pub idle_cycles: u64,
    pub packets: u64,
    pub drops: u64,
    /// Frames flooded for want of a known destination (Knitter's bridges; none: not told).
    /// In a steady trial a learning switch floods nothing: flooding means it never learned
    /// where B is (its learning frame dropped — by port security, say).
    pub flooded: Option<u64>,
}

impl Own {
    /// The window between two readings, as cycles per packet.
    pub fn cycles_per_packet(before: Own, after: Own) -> Option<f64> {
        let p = after.packets.checked_sub(before.packets)?;
        (p > 0).then(|| after.busy_cycles.saturating_sub(before.busy_cycles) as f64 / p as f64)
    }

    /// The share of the window the forwarding thread spent on packets.
    pub fn busy_fraction(before: Own, after: Own) -> Option<f64> {
        let busy = after.busy_cycles.checked_sub(before.busy_cycles)? as f64;
        let idle = after.idle_cycles.checked_sub(before.idle_cycles)? as f64;
        (busy + idle > 0.0).then(|| busy / (busy + idle))
    }
}

/// The two vhost-user sockets a switch serves: `a` a pod's, `b` another pod's (L2) or the
/// VTEP's underlay (VXLAN scenarios).
pub struct Sockets {
    pub a: PathBuf,
    pub b: PathBuf,
}

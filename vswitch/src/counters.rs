//! Counters: drop reasons and pipeline events with their names, and the per-thread counter
//! blocks (per port, per bridge domain) that PMD threads write and readers sum.
//!
//! Each PMD thread owns one [`ThreadStats`]. It is the only writer, so updates are a relaxed
//! load and store (plain moves on x86), never a locked read-modify-write; readers on other
//! threads sum the blocks of every thread.

use crate::fdb::{MAX_BDS, MAX_PORTS};
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

macro_rules! named_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($var:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($var),+ }
        impl $name {
            /// Every value, in order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// Snake-case names, for the CLI and metrics.
            pub const NAMES: &'static [&'static str] = &[$($s),+];
            pub const COUNT: usize = Self::ALL.len();
            pub fn name(self) -> &'static str { Self::NAMES[self as usize] }
        }
    };
}

named_enum! {
    /// Why the switch dropped a frame. The bridge drops only for L2 reasons and for headers a
    /// decision needed (VXLAN decap, port security, suppression).
    pub enum DropReason {
        Runt => "runt",
        Oversize => "oversize",
        TaggedOnAccess => "tagged_on_access",
        WrongTpid => "wrong_tpid",
        VlanNotAllowed => "vlan_not_allowed",
        UntaggedNotAllowed => "untagged_not_allowed",
        NoBridgeDomain => "no_bridge_domain",
        SrcMacGroup => "src_mac_group",
        SecurityMac => "security_mac",
        SecurityIp => "security_ip",
        SecurityArp => "security_arp",
        SecurityNd => "security_nd",
        SecurityRa => "security_ra",
        SecurityDhcp => "security_dhcp",
        Reflect => "reflect",
        PortDown => "port_down",
        TxFull => "tx_full",
        NoBuffer => "no_buffer",
        EgressMtu => "egress_mtu",
        EncapTooBig => "encap_too_big",
        UnderlayNotVxlan => "underlay_not_vxlan",
        UnderlayForeignMac => "underlay_foreign_mac",
        VxlanMalformed => "vxlan_malformed",
        VxlanBadChecksum => "vxlan_bad_checksum",
        VxlanBadFlags => "vxlan_bad_flags",
        VxlanUnknownVni => "vxlan_unknown_vni",
        VxlanUnknownVtep => "vxlan_unknown_vtep",
        VxlanNoRoute => "vxlan_no_route",
        NoEgress => "no_egress",
        NeighborQueueFull => "neighbor_queue_full",
        NeighborUnresolved => "neighbor_unresolved",
        Policed => "policed",
        VxlanCeNotEct => "vxlan_ce_not_ect",
    }
}

named_enum! {
    /// Things the pipeline did that are not drops.
    pub enum Event {
        Learned => "learned",
        MacMoved => "mac_moved",
        StaticMoveRefused => "static_move_refused",
        LearnLimit => "learn_limit",
        LearnBusy => "learn_busy",
        KnownUnicast => "known_unicast",
        // Known-unicast frames forwarded from the exact-match cache (a subset of the above).
        CacheHits => "emc_hits",
        // Known-unicast frames forwarded from the second-level cache's two halves
        // (`megaflow`), for ports the exact-match cache churns on.
        MegaflowHits => "megaflow_hits",
        Flooded => "flooded",
        FloodCopies => "flood_copies",
        FloodCopyFailed => "flood_copy_failed",
        ArpSuppressed => "arp_suppressed",
        NdSuppressed => "nd_suppressed",
        VtepAnswered => "vtep_answered",
        Encapsulated => "encapsulated",
        Decapsulated => "decapsulated",
        StaleFdb => "stale_fdb",
        NeighborRequests => "neighbor_requests",
        NeighborLearned => "neighbor_learned",
        ConfigAdopted => "config_adopted",
        // Frames of priority bridge domains sent to a shared egress (the underlay, a trunk)
        // ahead of the others.
        PriorityFirst => "priority_first",
        // Priority frames a shared egress's tx ring had no room for, held for its next flush
        // (each counted once, however long it waits).
        PriorityHeld => "priority_held",
        // Flushes in which a port's ordinary frames went before its priority ones, after
        // several in a row lost ordinary frames behind them (the guard of the lowest class).
        PriorityGuard => "priority_guard",
        // Priority frames sent as ordinary ones: a thread's queues ahead of shared egresses
        // all held frames for other ports.
        PriorityNoSlot => "priority_no_slot",
    }
}

/// A counter written by one thread (a relaxed load and store: a second writer would lose
/// counts). Counters that several threads add to are [`SharedCounter`]s.
#[derive(Default)]
pub struct Counter(AtomicU64);

/// A counter several threads add to (a port's queue counters, which every PMD thread
/// sending on the queue updates): one atomic add per burst, exact under contention.
#[derive(Default)]
pub struct SharedCounter(AtomicU64);

impl SharedCounter {
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value one thread sets and others read (how many buffers a queue has lent out now).
#[derive(Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value; a store only when it changed, so the line stays shared while it holds.
    #[inline(always)]
    pub fn set(&self, v: u64) {
        if self.0.load(Relaxed) != v {
            self.0.store(v, Relaxed);
        }
    }
    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Counter {
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Per-port counters of one thread.
#[derive(Default)]
pub struct PortCounters {
    pub rx_packets: Counter,
    pub rx_bytes: Counter,
    pub tx_packets: Counter,
    pub tx_bytes: Counter,
    pub drops: Counter,
    /// Frames its ingress policer dropped (also in `drops`).
    pub policed: Counter,
    /// Frames of priority bridge domains sent ahead of the others (also in `tx_packets`).
    pub tx_priority: Counter,
    /// Priority frames its ring had no room for, held for the next flush (each counted once).
    pub priority_held: Counter,
    /// Priority frames dropped (also in `drops`): more than a batch held, or the port down.
    pub priority_dropped: Counter,
}

/// Per-bridge-domain counters of one thread.
#[derive(Default)]
pub struct BdCounters {
    pub packets: Counter,
    pub bytes: Counter,
    pub flooded: Counter,
    pub learned: Counter,
    /// Frames its policer dropped (also counted on their ports).
    pub policed: Counter,
}

/// Everything one PMD thread counts.
pub struct ThreadStats {
    pub drops: [Counter; DropReason::COUNT],
    pub events: [Counter; Event::COUNT],
    pub ports: Box<[PortCounters; MAX_PORTS]>,
    pub bds: Box<[BdCounters; MAX_BDS]>,
    /// TSC cycles spent in iterations that moved packets, and in those that did not.
    pub busy_cycles: Counter,
    pub idle_cycles: Counter,
    /// Packets received by this thread (for cycles/packet).
    pub packets: Counter,
    pub sleeps: Counter,
}

impl Default for ThreadStats {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadStats {
    pub fn new() -> ThreadStats {
        fn boxed<T: Default, const N: usize>() -> Box<[T; N]> {
            let v: Box<[T]> = (0..N).map(|_| T::default()).collect();
            v.try_into().unwrap_or_else(|_| unreachable!("length is N"))
        }
        ThreadStats {
            drops: std::array::from_fn(|_| Counter::default()),
            events: std::array::from_fn(|_| Counter::default()),
            ports: boxed(),
            bds: boxed(),
            busy_cycles: Counter::default(),
            idle_cycles: Counter::default(),
            packets: Counter::default(),
            sleeps: Counter::default(),
        }
    }

    #[inline(always)]
    pub fn count_drop(&self, r: DropReason, port: u16) {
        self.drops[r as usize].add(1);
        self.port(port).drops.add(1);
    }

    /// A port's counters (ids are 12 bits; the mask keeps the index in bounds).
    #[inline(always)]
    pub fn port(&self, id: u16) -> &PortCounters {
        &self.ports[id as usize & (MAX_PORTS - 1)]
    }

    #[inline(always)]
    pub fn bd(&self, id: u16) -> &BdCounters {
        &self.bds[id as usize & (MAX_BDS - 1)]
    }

    #[inline(always)]
    pub fn event(&self, e: Event, n: u64) {
        self.events[e as usize].add(n);
    }
}

/// A summed snapshot of counters for reports, tests and the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortTotals {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: u64,
    pub policed: u64,
    pub tx_priority: u64,
    pub priority_held: u64,
    pub priority_dropped: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BdTotals {
    pub packets: u64,
    pub bytes: u64,
    pub flooded: u64,
    pub learned: u64,
    pub policed: u64,
}

impl PortTotals {
    /// What was counted since `base` was read.
    pub fn since(&self, base: &PortTotals) -> PortTotals {
        PortTotals {
            rx_packets: self.rx_packets.saturating_sub(base.rx_packets),
            rx_bytes: self.rx_bytes.saturating_sub(base.rx_bytes),
            tx_packets: self.tx_packets.saturating_sub(base.tx_packets),
            tx_bytes: self.tx_bytes.saturating_sub(base.tx_bytes),
            drops: self.drops.saturating_sub(base.drops),
            policed: self.policed.saturating_sub(base.policed),
            tx_priority: self.tx_priority.saturating_sub(base.tx_priority),
            priority_held: self.priority_held.saturating_sub(base.priority_held),
            priority_dropped: self.priority_dropped.saturating_sub(base.priority_dropped),
        }
    }
}

impl BdTotals {
    /// What was counted since `base` was read.
    pub fn since(&self, base: &BdTotals) -> BdTotals {
        BdTotals {
            packets: self.packets.saturating_sub(base.packets),
            bytes: self.bytes.saturating_sub(base.bytes),
            flooded: self.flooded.saturating_sub(base.flooded),
            learned: self.learned.saturating_sub(base.learned),
            policed: self.policed.saturating_sub(base.policed),
        }
    }
}

/// Sums of every thread's counters.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub drops: Vec<u64>,
    pub events: Vec<u64>,
    pub ports: Vec<PortTotals>,
    pub bds: Vec<BdTotals>,
    pub busy_cycles: u64,
    pub idle_cycles: u64,
    pub packets: u64,
    pub sleeps: u64,
}

impl Totals {
    pub fn sum<'a>(threads: impl IntoIterator<Item = &'a ThreadStats>) -> Totals {
        let mut t = Totals {
            drops: vec![0; DropReason::COUNT],
            events: vec![0; Event::COUNT],
            ..Default::default()
        };
        for s in threads {
            for (a, c) in t.drops.iter_mut().zip(&s.drops) {
                *a += c.get();
            }
            for (a, c) in t.events.iter_mut().zip(&s.events) {
                *a += c.get();
            }
            if t.ports.len() < s.ports.len() {
                t.ports.resize(s.ports.len(), PortTotals::default());
            }
            for (a, c) in t.ports.iter_mut().zip(s.ports.iter()) {
                a.rx_packets += c.rx_packets.get();
                a.rx_bytes += c.rx_bytes.get();
                a.tx_packets += c.tx_packets.get();
                a.tx_bytes += c.tx_bytes.get();
                a.drops += c.drops.get();
                a.policed += c.policed.get();
                a.tx_priority += c.tx_priority.get();
                a.priority_held += c.priority_held.get();
                a.priority_dropped += c.priority_dropped.get();
            }
            if t.bds.len() < s.bds.len() {
                t.bds.resize(s.bds.len(), BdTotals::default());
            }
            for (a, c) in t.bds.iter_mut().zip(s.bds.iter()) {
                a.packets += c.packets.get();
                a.bytes += c.bytes.get();
                a.flooded += c.flooded.get();
                a.learned += c.learned.get();
                a.policed += c.policed.get();
            }
            t.busy_cycles += s.busy_cycles.get();
            t.idle_cycles += s.idle_cycles.get();
            t.packets += s.packets.get();
            t.sleeps += s.sleeps.get();
        }
        t
    }

    pub fn drop(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    pub fn event(&self, e: Event) -> u64 {
        self.events[e as usize]
    }

    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Non-zero drop reasons as (name, count), for reports.
    pub fn nonzero_drops(&self) -> Vec<(&'static str, u64)> {
        DropReason::ALL
            .iter()
            .filter(|r| self.drop(**r) > 0)
            .map(|r| (r.name(), self.drop(*r)))
            .collect()
    }

    /// Busy cycles per received packet, as `pmd-stats-show` reports "processing cycles".
    pub fn cycles_per_packet(&self) -> Option<f64> {
        (self.packets > 0).then(|| self.busy_cycles as f64 / self.packets as f64)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn names_line_up() {
        assert_eq!(DropReason::NAMES.len(), DropReason::COUNT);
        assert_eq!(DropReason::VxlanUnknownVtep.name(), "vxlan_unknown_vtep");
        assert_eq!(Event::Flooded.name(), "flooded");
    }

    #[test]
    fn sums_threads() {
        let a = ThreadStats::new();
        let b = ThreadStats::new();
        a.count_drop(DropReason::Runt, 1);
        b.count_drop(DropReason::Runt, 1);
        b.ports[2].rx_packets.add(5);
        let t = Totals::sum([&a, &b]);
        assert_eq!(t.drop(DropReason::Runt), 2);
        assert_eq!(t.ports[1].drops, 2);
        assert_eq!(t.ports[2].rx_packets, 5);
        assert_eq!(t.nonzero_drops(), vec![("runt", 2)]);
    }
}

//! The port abstraction every kind of port implements (ring here; vhost-user in `knitter-vhost`,
//! AF_XDP and AF_PACKET in `knitter-kernel-ports`):
//! bursts of packets per queue, link state, a wake descriptor per rx queue for the adaptive
//! idle policy, and per-queue counters.

pub mod ring;

use crate::batch::Batch;
use crate::buf::PoolCache;
use crate::wire::MacAddr;
use std::os::fd::RawFd;

/// Per-queue counters a port keeps itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub rx_packets: u64,
    /// Frames the port received but could not hand over (malformed, no buffer).
    pub rx_dropped: u64,
    pub tx_packets: u64,
    /// Packets the queue could not take (ring full).
    pub tx_full: u64,
    /// GSO super-frames the port received and cut into segments itself (counted once each;
    /// their segments count in `rx_packets`).
    pub rx_gso: u64,
    /// Frames whose L4 checksum the sender left partial and the port finished.
    pub rx_csum: u64,
    /// Frames the queue took but could not send (longer than its slots), dropped.
    pub tx_dropped: u64,
    /// Times the queue's receive buffers ran out with the buffer pool empty (AF_XDP: its
    /// fill ring; frames arriving then are dropped by the kernel).
    pub rx_starved: u64,
    /// Pool buffers the queue has lent out for receiving now (AF_XDP: those in its fill ring,
    /// which the kernel keeps until frames arrive in them); a gauge.
    pub rx_lent: u64,
}

/// The counters behind [`QueueStats`], kept by the thread that owns the queue side.
#[derive(Default)]
pub struct QueueCounters {
    pub rx_packets: crate::counters::SharedCounter,
    pub rx_dropped: crate::counters::SharedCounter,
    pub tx_packets: crate::counters::SharedCounter,
    pub tx_full: crate::counters::SharedCounter,
    pub rx_gso: crate::counters::SharedCounter,
    pub rx_csum: crate::counters::SharedCounter,
    pub tx_dropped: crate::counters::SharedCounter,
    pub rx_starved: crate::counters::SharedCounter,
    pub rx_lent: crate::counters::Gauge,
}

impl QueueCounters {
    pub fn read(&self) -> QueueStats {
        QueueStats {
            rx_packets: self.rx_packets.get(),
            rx_dropped: self.rx_dropped.get(),
            tx_packets: self.tx_packets.get(),
            tx_full: self.tx_full.get(),
            rx_gso: self.rx_gso.get(),
            rx_csum: self.rx_csum.get(),
            tx_dropped: self.tx_dropped.get(),
            rx_starved: self.rx_starved.get(),
            rx_lent: self.rx_lent.get(),
        }
    }
}

/// A switch port.
///
/// Concurrency contract: the PMD layer polls each rx queue from one thread at a time, but may
/// transmit on a tx queue from several threads when a port has fewer tx queues than there are
/// PMD threads; ports serialise that themselves (for example with a per-queue try-lock) and
/// say how in their docs.
pub trait Port: Send + Sync {
    fn name(&self) -> &str;

    fn rx_queues(&self) -> u16 {
        1
    }

    fn tx_queues(&self) -> u16 {
        1
    }

    /// Whether rx queues of this port come and go at run time (a vhost-user guest enables
    /// as many queue pairs as it likes), and may be polled by two threads at once for a
    /// moment while PMD threads rebalance (the port serialises each queue itself, e.g. with
    /// a try-lock). Such queues are spread over the PMD threads by [`Port::rx_queue_active`]
    /// and re-spread when that changes; the others are assigned once per configuration.
    fn rx_queues_dynamic(&self) -> bool {
        false
    }

    /// Whether rx queue `q` has anything to poll now (only asked when
    /// [`Port::rx_queues_dynamic`]).
    fn rx_queue_active(&self, _q: u16) -> bool {
        true
    }

    /// Receives up to `batch.room()` packets from queue `q` into `batch`; returns how many.
    /// Two threads may call it for one queue at once for a moment (a queue moving to another
    /// PMD thread): a port serialises each queue itself (a try-lock: the second returns 0).
    fn rx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize;

    /// Sends packets from the front of `batch` on queue `q`. Sent packets leave the batch;
    /// packets the queue could not take stay in it, in order, for the caller to count and free.
    fn tx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize;

    /// The burst last received on rx queue `q` is processed: a port that lent packets
    /// (`PoolCache::alloc_lent`: frames left in a guest's buffers) gives those buffers back.
    /// Called by the pipeline when the cache says it lent, after the burst's packets were
    /// sent, freed or linearized.
    fn rx_done(&self, _q: u16) {}

    /// The switch gave up on this port (a PMD thread panicked on one of its bursts): it is
    /// not polled again, and it should stop what it can (a vhost-user port stops its rings,
    /// keeping lent descriptors and their memory, which packets in flight may still read).
    fn fail(&self, _why: &str) {}

    /// Whether `tx_burst` copies a lent packet's tail out of the guest itself (before it
    /// returns); the pipeline [linearizes](crate::Pool::linearize) lent packets for every
    /// other port, which may keep a buffer beyond the burst.
    fn takes_lent(&self) -> bool {
        false
    }

    /// Whether the link is up (a vhost-user frontend connected, a netdev running...). Read
    /// on the fast path: an atomic load, never a syscall.
    fn link_up(&self) -> bool {
        true
    }

    /// Asks the device for its link state and records it for [`Port::link_up`]. Called by
    /// the control plane now and then (never by PMD threads); ports that always know
    /// (vhost-user, rings) need nothing here.
    fn refresh_link(&self) {}

    /// A descriptor that becomes readable when rx queue `q` has packets while armed.
    fn wake_fd(&self, _q: u16) -> Option<RawFd> {
        None
    }

    /// Arms (true) or disarms (false) wake-ups on rx queue `q`. When arming, returns true if
    /// the queue already has packets, in which case the caller must not sleep.
    fn arm_wake(&self, _q: u16, _armed: bool) -> bool {
        false
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        Vec::new()
    }

    /// The pool the port takes its buffers from and lends to the kernel or a guest, when it
    /// holds one itself (AF_XDP's UMEM, vhost-user): it must be the switch's, or the
    /// indices it hands over would name another pool's chunks. [`crate::Switch`] refuses a
    /// port whose pool is not its own.
    fn pool(&self) -> Option<&std::sync::Arc<crate::buf::Pool>> {
        None
    }

    /// The port's own MAC address, where it has one (an underlay's source MAC).
    fn mac(&self) -> Option<MacAddr> {
        None
    }

    /// The longest frame (with one VLAN tag) the port can carry; configurations asking for
    /// a larger MTU are refused.
    fn max_frame(&self) -> usize {
        crate::buf::MAX_FRAME
    }
}

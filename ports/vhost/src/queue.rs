//! A virtqueue of either layout the frontend negotiated — split ([`crate::vring`]) or packed
//! ([`crate::packed`], `VIRTIO_F_RING_PACKED`) — behind one type, so the port's bursts and the
//! virtio-net copies are written once. Both layouts keep the same contract: chains popped
//! and returned in ring order, a popped chain's `head` handed back to `push_used`, completions
//! published once per burst and when the ring is dropped.

use crate::memory::GuestMemory;
use crate::packed::{self, PackedQueue};
use crate::vring::{self, Chain, ChainError, Flat, QueueError, SplitQueue};

/// A virtqueue's device-side state, in the layout its frontend negotiated.
#[derive(Debug, Clone)]
pub enum Virtqueue {
    Split(SplitQueue),
    Packed(PackedQueue),
}

impl From<SplitQueue> for Virtqueue {
    fn from(q: SplitQueue) -> Virtqueue {
        Virtqueue::Split(q)
    }
}

impl From<PackedQueue> for Virtqueue {
    fn from(q: PackedQueue) -> Virtqueue {
        Virtqueue::Packed(q)
    }
}

/// `$e` on whichever layout `$q` has, as `$v`.
macro_rules! either {
    ($q:expr, $v:ident => $e:expr) => {
        match $q {
            Virtqueue::Split($v) => $e,
            Virtqueue::Packed($v) => $e,
        }
    };
}

/// The same for a [`Ring`].
macro_rules! either_ring {
    ($r:expr, $v:ident => $e:expr) => {
        match $r {
            Ring::Split($v) => $e,
            Ring::Packed($v) => $e,
        }
    };
}

impl Virtqueue {
    /// See [`SplitQueue::id`].
    pub fn id(&self) -> u64 {
        either!(self, q => q.id())
    }

    pub fn is_packed(&self) -> bool {
        matches!(self, Virtqueue::Packed(_))
    }

    pub fn set_features(&mut self, event_idx: bool, indirect: bool) {
        either!(self, q => q.set_features(event_idx, indirect))
    }

    /// `VIRTIO_F_IN_ORDER` was negotiated: a packed ring returns read-only chains a burst at
    /// a time ([`Ring::push_read`]); a split ring returns every chain alike.
    pub fn set_in_order(&mut self, on: bool) {
        if let Virtqueue::Packed(q) = self {
            q.set_in_order(on);
        }
    }

    pub fn size(&self) -> u16 {
        either!(self, q => q.size())
    }

    /// The driver broke the queue, or a caller stopped it: it stays stopped until the
    /// frontend sets it up again.
    pub fn is_broken(&self) -> bool {
        either!(self, q => q.health.broken)
    }

    /// See [`SplitQueue::stop`].
    pub fn stop(&mut self, why: &'static str) -> bool {
        either!(self, q => q.health.stop(why))
    }

    /// Why the queue stopped, while it is stopped.
    pub fn broken_reason(&self) -> Option<&'static str> {
        either!(self, q => q.health.broken_reason())
    }

    /// See [`SplitQueue::newly_broken`].
    pub fn newly_broken(&mut self) -> bool {
        either!(self, q => q.health.newly_broken())
    }

    /// Where the device got, as GET_VRING_BASE returns it (for a packed ring with its wrap
    /// counter in bit 15).
    pub fn next_avail(&self) -> u16 {
        either!(self, q => q.next_avail())
    }

    /// See [`SplitQueue::resume_from_used`]. A packed ring starts where SET_VRING_BASE says
    /// (its used descriptors do not say where a device stopped; DPDK's virtio-user resets
    /// its packed rings when it reconnects).
    pub fn resume_from_used(&mut self, mem: &GuestMemory) -> Result<Option<u16>, QueueError> {
        match self {
            Virtqueue::Split(q) => q.resume_from_used(mem),
            Virtqueue::Packed(_) => Ok(None),
        }
    }

    /// Takes over `old`'s progress (where the device got, what it took and has not returned,
    /// its identity) when the same ring is set up again while it runs: a new memory table,
    /// new addresses, enabled again. Nothing when the layout or size changed.
    pub fn continue_from(&mut self, old: &Virtqueue) {
        match (self, old) {
            (Virtqueue::Split(q), Virtqueue::Split(o)) => q.continue_from(o),
            (Virtqueue::Packed(q), Virtqueue::Packed(o)) => q.continue_from(o),
            _ => {}
        }
    }

    /// One burst's access to the rings (see [`SplitQueue::ring`]).
    #[inline]
    pub fn ring<'m>(&'m mut self, mem: &'m GuestMemory) -> Result<Ring<'m>, QueueError> {
        Ok(match self {
            Virtqueue::Split(q) => Ring::Split(q.ring(mem)?),
            Virtqueue::Packed(q) => Ring::Packed(q.ring(mem)?),
        })
    }
}

/// What SET_VRING_BASE gives a ring of this layout that starts afresh.
pub fn fresh_base(packed: bool) -> u16 {
    if packed { packed::FRESH_BASE } else { 0 }
}

/// One burst's work on a ring: implemented by each layout's ring, so that the port's burst
/// loops are compiled once for each (the port matches on [`Ring`] once a burst, not once a
/// chain: dispatching per call put both layouts' code in every loop, and a split ring's
/// burst paid ~20 cycles a packet more in one thread, from instruction-cache misses and
/// branches), and by [`Ring`] itself, dispatching per call, for the paths that are not hot.
pub trait Burst<'m> {
    /// Chains available (a packed ring says only whether there is one: 0 or 1).
    fn pending(&mut self) -> u16;
    fn pop(&mut self, chain: &mut Chain) -> Option<Result<(), ChainError>>;
    fn pop_flat(&mut self, writable: bool) -> Option<Flat<'m>>;
    fn unpop(&mut self);
    fn push_used(&mut self, head: u16, len: u32);
    /// Returns a chain the device only read (see [`packed::Ring::push_read`]).
    fn push_read(&mut self, head: u16);
    fn needs_interrupt(&mut self) -> bool;
    fn set_kicks(&mut self, on: bool);
    fn memory(&self) -> &GuestMemory;
}

/// [`Burst`] for a ring type with the same methods of its own (which take precedence over
/// the trait's in method calls: no recursion).
macro_rules! burst_by_inherent {
    ($t:ty, $r:ident, $h:ident => $read:expr) => {
        impl<'m> Burst<'m> for $t {
            #[inline(always)]
            fn pending(&mut self) -> u16 {
                <$t>::pending(self)
            }
            #[inline(always)]
            fn pop(&mut self, chain: &mut Chain) -> Option<Result<(), ChainError>> {
                <$t>::pop(self, chain)
            }
            #[inline(always)]
            fn pop_flat(&mut self, writable: bool) -> Option<Flat<'m>> {
                <$t>::pop_flat(self, writable)
            }
            #[inline(always)]
            fn unpop(&mut self) {
                <$t>::unpop(self)
            }
            #[inline(always)]
            fn push_used(&mut self, head: u16, len: u32) {
                <$t>::push_used(self, head, len)
            }
            #[inline(always)]
            fn push_read(&mut self, $h: u16) {
                let $r = self;
                $read
            }
            #[inline(always)]
            fn needs_interrupt(&mut self) -> bool {
                <$t>::needs_interrupt(self)
            }
            #[inline(always)]
            fn set_kicks(&mut self, on: bool) {
                <$t>::set_kicks(self, on)
            }
            #[inline(always)]
            fn memory(&self) -> &GuestMemory {
                <$t>::memory(self)
            }
        }
    };
}

burst_by_inherent!(vring::Ring<'m>, r, head => r.push_used(head, 0));
burst_by_inherent!(packed::Ring<'m>, r, head => r.push_read(head));

/// One burst's access to a queue's rings, of either layout; publishes when dropped.
pub enum Ring<'m> {
    Split(vring::Ring<'m>),
    Packed(packed::Ring<'m>),
}

/// Each call dispatches on the layout: for the paths that are not hot (the hot bursts are
/// compiled for each layout, see [`Burst`]).
impl<'m> Burst<'m> for Ring<'m> {
    fn pending(&mut self) -> u16 {
        either_ring!(self, r => r.pending())
    }

    fn pop(&mut self, chain: &mut Chain) -> Option<Result<(), ChainError>> {
        either_ring!(self, r => r.pop(chain))
    }

    fn pop_flat(&mut self, writable: bool) -> Option<Flat<'m>> {
        either_ring!(self, r => r.pop_flat(writable))
    }

    fn unpop(&mut self) {
        either_ring!(self, r => r.unpop())
    }

    fn push_used(&mut self, head: u16, len: u32) {
        either_ring!(self, r => r.push_used(head, len))
    }

    fn push_read(&mut self, head: u16) {
        either_ring!(self, r => Burst::push_read(r, head))
    }

    fn needs_interrupt(&mut self) -> bool {
        either_ring!(self, r => r.needs_interrupt())
    }

    fn set_kicks(&mut self, on: bool) {
        either_ring!(self, r => r.set_kicks(on))
    }

    fn memory(&self) -> &GuestMemory {
        either_ring!(self, r => r.memory())
    }
}

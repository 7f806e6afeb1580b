//! Split virtqueues (virtio 1.x, 2.6) driven by a polling device: descriptor chains popped
//! from the available ring and validated once, completions pushed to the used ring and
//! published once per burst, notification suppression both ways (flags or `EVENT_IDX`).
//!
//! The guest is not trusted. Every chain is checked before any of its bytes is used: head
//! and `next` indices inside the table, no loops, no more descriptors in all than the queue
//! has entries (the virtio spec's rule, indirect ones and empty ones included: a chain of
//! thousands of zero-length descriptors would otherwise cost the PMD thread that polls it a
//! descriptor read each, for nothing),
//! indirect tables only when negotiated, never nested and never with `NEXT`, 16-byte
//! aligned (as drivers allocate them), a length that is a whole number of descriptors, device-readable descriptors before device-writable
//! ones, every buffer inside one guest memory region, at most [`MAX_SEGS`] buffers. A chain
//! that fails is still consumed: the caller returns its head with length 0 (so the guest
//! gets the buffers back) and counts it. An available index more than a queue ahead of the
//! device's is a broken driver: the queue stops ([`SplitQueue::is_broken`]) until the
//! frontend sets it up again, rather than re-reading ring slots as new chains.
//!
//! # Safety
//! [`Ring`] holds host pointers to the three ring areas, obtained from the [`GuestMemory`]
//! it borrows (so the mappings outlive it), each checked for its whole size and alignment.
//! All reads and writes of ring fields are volatile or atomic: the guest writes them
//! concurrently and the code never assumes two reads agree.

use crate::memory::{GuestAddr, GuestMemory, GuestSlice, MemError};
use std::sync::atomic::{AtomicU16, Ordering, fence};

/// Why a queue stops when its driver claims more than a queue's worth of chains.
pub const OVERRUN: &str = "the guest made more than a queue's worth of chains available";

pub const VIRTQ_DESC_F_NEXT: u16 = 1;
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Buffers one chain may have (a 64 KiB frame in 4 KiB pages, plus a header).
pub const MAX_SEGS: usize = 18;
/// Largest queue (virtio's limit for split rings).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Most descriptors one chain may have, direct and indirect together, however large its
/// queue: drivers use a few (Linux at most 19 for a 64 KiB frame; DPDK's vhost library
/// refuses more than 256), and a queue of 32,768 entries would otherwise let every chain of
/// a burst walk 32,768 empty descriptors.
pub const MAX_CHAIN: u32 = 1024;
pub(crate) const DESC: u64 = 16;

/// Why a queue cannot be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("queue size {0} is not a power of two in 1..=32768")]
    Size(u16),
    #[error("packed queue size {0} is not in 1..=32768")]
    PackedSize(u16),
    #[error("ring base {0:#x} names a descriptor outside the queue")]
    Base(u16),
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// Why a chain was refused (it is consumed all the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("descriptor index {0} is outside its table")]
    Index(u16),
    #[error("descriptor chain loops or is longer than its table")]
    Loop,
    #[error("descriptor chain has more descriptors than the queue has entries")]
    TooManyDescriptors,
    #[error("indirect descriptor not negotiated, nested, chained or of a bad length")]
    Indirect,
    #[error("a device-readable descriptor follows a device-writable one")]
    ReadAfterWrite,
    #[error("more than {MAX_SEGS} buffers in one chain")]
    TooLong,
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// One buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddr,
    pub len: u32,
    /// Device-writable (the device fills it) rather than device-readable.
    pub writable: bool,
}

/// A popped descriptor chain: its head (to return in the used ring) and its buffers, the
/// device-readable ones first.
#[derive(Debug, Clone)]
pub struct Chain {
    pub head: u16,
    segs: [Segment; MAX_SEGS],
    n: usize,
    /// Total bytes of the device-readable, and of the device-writable, buffers.
    pub readable: u64,
    pub writable: u64,
}

impl Default for Chain {
    fn default() -> Chain {
        Chain {
            head: 0,
            segs: [Segment { addr: GuestAddr(0), len: 0, writable: false }; MAX_SEGS],
            n: 0,
            readable: 0,
            writable: 0,
        }
    }
}

impl Chain {
    pub fn segments(&self) -> &[Segment] {
        &self.segs[..self.n]
    }

    pub(crate) fn clear(&mut self, head: u16) {
        (self.head, self.n, self.readable, self.writable) = (head, 0, 0, 0);
    }

    pub(crate) fn push(&mut self, s: Segment) -> Result<(), ChainError> {
        if s.writable {
            self.writable += s.len as u64;
        } else if self.writable > 0 {
            return Err(ChainError::ReadAfterWrite);
        } else {
            self.readable += s.len as u64;
        }
        *self.segs.get_mut(self.n).ok_or(ChainError::TooLong)? = s;
        self.n += 1;
        Ok(())
    }
}

/// A chain of one buffer, the shape DPDK's virtio-user and Linux's virtio-net post for every
/// frame that fits one buffer: its head and its bytes in guest memory, checked against the
/// memory table (`'m` is the table's borrow).
#[derive(Debug, Clone, Copy)]
pub struct Flat<'m> {
    pub head: u16,
    pub(crate) addr: GuestAddr,
    pub(crate) buf: GuestSlice<'m>,
}

impl<'m> Flat<'m> {
    /// A placeholder for arrays of flat chains.
    pub const EMPTY: Flat<'static> = Flat { head: 0, addr: GuestAddr(0), buf: GuestSlice::EMPTY };

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Where the buffer is in guest memory.
    pub fn addr(&self) -> GuestAddr {
        self.addr
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The buffer, to copy out of (a transmit chain) or into (a receive chain popped as
    /// writable) at once: the guest may change it any time.
    pub fn buffer(&self) -> GuestSlice<'m> {
        self.buf
    }
}

/// Asks for the cache line at `p` ahead of its use (no memory effect, never faults).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: prefetch has no architectural effect and does not fault on any address.
        unsafe { _mm_prefetch(p.cast(), _MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Descriptor `i` of a table of 16-byte descriptors as its four fields, in the split
/// layout's order (address, length, flags, next) — the packed layout's (address, length,
/// buffer id, flags) are the same words.
pub(crate) fn read_desc(table: *const u8, i: u16) -> (u64, u32, u16, u16) {
    // SAFETY: `i` is below the table's length (checked by every caller), the table was
    // checked for its whole size and 16-byte alignment; volatile because the guest owns
    // it. Two 8-byte loads: the address, then length and the two 16-bit fields.
    let (a, b) = unsafe {
        let p = table.add(i as usize * DESC as usize) as *const u64;
        (std::ptr::read_volatile(p), std::ptr::read_volatile(p.add(1)))
    };
    let (a, b) = (u64::from_le(a), u64::from_le(b));
    (a, b as u32, (b >> 32) as u16, (b >> 48) as u16)
}

/// A split virtqueue's device-side state: where its rings are and how far it got.
#[derive(Debug, Clone)]
pub struct SplitQueue {
    size: u16,
    desc: GuestAddr,
    avail: GuestAddr,
    used: GuestAddr,
    event_idx: bool,
    indirect: bool,
    last_avail: u16,
    used_idx: u16,
    /// The used index when the guest was last notified (for `EVENT_IDX`).
    signalled: u16,
    pub(crate) health: Health,
    /// Which queue this is (see [`SplitQueue::id`]).
    id: u64,
}

/// Whether a queue stopped, why, and whether that was reported: the same for both ring
/// layouts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Health {
    pub(crate) broken: bool,
    /// `broken` was reported (see [`Health::newly_broken`]).
    reported: bool,
    /// Why the queue stopped, when a caller said ([`Health::stop`]).
    why: Option<&'static str>,
}

impl Health {
    /// The driver broke the queue: stopped, to be counted and logged once.
    pub(crate) fn fail(&mut self, why: &'static str) {
        (self.broken, self.why) = (true, Some(why));
    }

    pub(crate) fn stop(&mut self, why: &'static str) -> bool {
        let new = !self.reported;
        (self.broken, self.reported, self.why) = (true, true, Some(why));
        new
    }

    pub(crate) fn broken_reason(&self) -> Option<&'static str> {
        self.broken.then(|| self.why.unwrap_or(OVERRUN))
    }

    pub(crate) fn newly_broken(&mut self) -> bool {
        let new = self.broken && !self.reported;
        self.reported |= self.broken;
        new
    }
}

/// The next queue id (see [`SplitQueue::id`]), for queues of either layout.
static NEXT_QUEUE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(crate) fn next_queue_id() -> u64 {
    NEXT_QUEUE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl SplitQueue {
    /// A queue of `size` descriptors with its rings at these guest addresses, starting at
    /// `base` (the frontend's SET_VRING_BASE). The rings are checked when first used.
    pub fn new(
        size: u16,
        desc: GuestAddr,
        avail: GuestAddr,
        used: GuestAddr,
        base: u16,
    ) -> Result<SplitQueue, QueueError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(QueueError::Size(size));
        }
        Ok(SplitQueue {
            size,
            desc,
            avail,
            used,
            event_idx: false,
            indirect: false,
            last_avail: base,
            used_idx: base,
            signalled: base,
            health: Health::default(),
            id: next_queue_id(),
        })
    }

    /// A number no other queue made by this process has: descriptors taken from a queue
    /// are given back only to the same queue, not to one the frontend set up since.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Negotiated features that change the rings' behaviour.
    pub fn set_features(&mut self, event_idx: bool, indirect: bool) {
        (self.event_idx, self.indirect) = (event_idx, indirect);
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// The driver made more than a queue's worth available: the queue has stopped.
    pub fn is_broken(&self) -> bool {
        self.health.broken
    }

    /// Stops the queue for a reason the caller reports itself (its memory went away);
    /// whether that is news (the stop was not reported before).
    pub fn stop(&mut self, why: &'static str) -> bool {
        self.health.stop(why)
    }

    /// Why the queue stopped, while it is stopped.
    pub fn broken_reason(&self) -> Option<&'static str> {
        self.health.broken_reason()
    }

    /// True once, the first time it is asked after the queue stopped (to count and log a
    /// broken driver once, not every burst).
    pub fn newly_broken(&mut self) -> bool {
        self.health.newly_broken()
    }

    /// Takes over `old`'s progress (see [`crate::queue::Virtqueue::continue_from`]).
    pub fn continue_from(&mut self, old: &SplitQueue) {
        if old.size == self.size {
            (self.last_avail, self.used_idx, self.signalled) =
                (old.last_avail, old.used_idx, old.signalled);
            self.id = old.id;
        }
    }

    /// The next available index to read (what GET_VRING_BASE returns).
    pub fn next_avail(&self) -> u16 {
        self.last_avail
    }

    /// Starts from the used index in guest memory when `base` (the frontend's
    /// SET_VRING_BASE) disagrees with it, as DPDK's vhost library does: a frontend that
    /// outlived the device (the switch restarted; DPDK's virtio-user then sends base 0)
    /// resumes where the device's last published completion left it. Chains the old device
    /// had taken without completing are lost (no inflight tracking). Returns the index
    /// taken when it differed from `base`.
    pub fn resume_from_used(&mut self, mem: &GuestMemory) -> Result<Option<u16>, QueueError> {
        let ring = self.ring(mem)?;
        let used = load16(ring.used, 2, Ordering::Acquire);
        drop(ring);
        if used == self.last_avail {
            return Ok(None);
        }
        (self.last_avail, self.used_idx, self.signalled) = (used, used, used);
        Ok(Some(used))
    }

    /// The ring areas in `mem`, checked for size and alignment, for one burst.
    pub fn ring<'m>(&'m mut self, mem: &'m GuestMemory) -> Result<Ring<'m>, QueueError> {
        let n = self.size as u64;
        let desc = mem.field(self.desc, DESC * n, 16)?;
        let avail = mem.field(self.avail, 6 + 2 * n, 2)?;
        let used = mem.field(self.used, 6 + 8 * n, 4)?;
        let seen = self.last_avail;
        Ok(Ring { q: self, mem, desc, avail, used, published: true, seen })
    }
}

/// One burst's access to a queue's rings; publishes the used index when dropped.
pub struct Ring<'m> {
    q: &'m mut SplitQueue,
    mem: &'m GuestMemory,
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    published: bool,
    /// The available index as last read: chains up to it are popped without reading the
    /// index again. The guest writes that index all the time; reading it per chain pulled
    /// its cache line from the guest's core once per packet.
    seen: u16,
}

fn atomic16<'a>(area: *mut u8, off: usize) -> &'a AtomicU16 {
    // SAFETY: callers (both ring layouts) pass offsets inside a ring area checked for its
    // whole size when their ring was made (`SplitQueue::ring`, `PackedQueue::ring`), at even
    // offsets of 2-aligned areas; AtomicU16 has u16's layout. Callers use the reference at
    // once, within their ring's (and so the memory's) life.
    unsafe { &*(area.add(off) as *const AtomicU16) }
}

pub(crate) fn load16(area: *mut u8, off: usize, o: Ordering) -> u16 {
    atomic16(area, off).load(o)
}

pub(crate) fn store16(area: *mut u8, off: usize, v: u16, o: Ordering) {
    atomic16(area, off).store(v, o)
}

impl<'m> Ring<'m> {
    fn avail_idx(&self) -> u16 {
        load16(self.avail, 2, Ordering::Acquire)
    }

    /// Chains the guest has made available and the device has not taken yet; 0 (and the
    /// queue stops) if the guest claims more than a queue's worth.
    #[inline]
    pub fn pending(&mut self) -> u16 {
        let seen = self.avail_idx();
        let n = seen.wrapping_sub(self.q.last_avail);
        if n > self.q.size || self.q.health.broken {
            self.q.health.broken = true;
            return 0;
        }
        self.seen = seen;
        n
    }

    /// Pops the next available chain into `chain`: `None` when there is none, `Some(Err)`
    /// for a chain that failed validation (consumed: return `chain.head` with length 0).
    #[inline]
    pub fn pop(&mut self, chain: &mut Chain) -> Option<Result<(), ChainError>> {
        if self.seen == self.q.last_avail && self.pending() == 0 {
            return None;
        }
        let slot = (self.q.last_avail & (self.q.size - 1)) as usize;
        let head = load16(self.avail, 4 + 2 * slot, Ordering::Relaxed);
        self.q.last_avail = self.q.last_avail.wrapping_add(1);
        chain.clear(head);
        Some(self.walk(head, chain))
    }

    /// Pops the next available chain if it is one buffer, device-writable or not as asked,
    /// inside guest memory; `None` (nothing consumed) when there is no chain or it has
    /// another shape, which [`Ring::pop`] then takes (and refuses, if it must). The buffer's
    /// first lines are prefetched: a burst pops its chains first and copies after, so the
    /// guest's cache lines arrive in parallel instead of one packet after the other.
    #[inline]
    pub fn pop_flat(&mut self, writable: bool) -> Option<Flat<'m>> {
        if self.seen == self.q.last_avail && self.pending() == 0 {
            return None;
        }
        let slot = (self.q.last_avail & (self.q.size - 1)) as usize;
        let head = load16(self.avail, 4 + 2 * slot, Ordering::Relaxed);
        if head >= self.q.size {
            return None;
        }
        let (addr, len, flags, _) = Self::read_desc(self.desc, head);
        let want = if writable { VIRTQ_DESC_F_WRITE } else { 0 };
        if flags & (VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_WRITE) != want
            || len == 0
        {
            return None;
        }
        let buf = self.mem.slice(GuestAddr(addr), len as usize).ok()?;
        prefetch(buf.as_ptr());
        prefetch(buf.as_ptr().wrapping_add(64));
        self.q.last_avail = self.q.last_avail.wrapping_add(1);
        Some(Flat { head, addr: GuestAddr(addr), buf })
    }

    fn read_desc(table: *const u8, i: u16) -> (u64, u32, u16, u16) {
        read_desc(table, i)
    }

    #[inline]
    fn walk(&mut self, head: u16, chain: &mut Chain) -> Result<(), ChainError> {
        let (mut table, mut table_len) = (self.desc as *const u8, self.q.size);
        let (mut i, mut seen, mut indirect) = (head, 0u32, false);
        // Descriptors this chain may still have, direct and indirect together: the queue's
        // size (the spec's bound), but never more than MAX_CHAIN, so a large queue does not
        // let a frontend make each of a burst's chains cost the PMD thread tens of thousands
        // of empty-descriptor reads.
        let mut budget = (self.q.size as u32).min(MAX_CHAIN);
        loop {
            if i >= table_len {
                return Err(ChainError::Index(i));
            }
            seen += 1;
            if seen > table_len as u32 {
                return Err(ChainError::Loop);
            }
            budget = budget.checked_sub(1).ok_or(ChainError::TooManyDescriptors)?;
            let (addr, len, flags, next) = Self::read_desc(table, i);
            if flags & VIRTQ_DESC_F_INDIRECT != 0 {
                if !self.q.indirect
                    || indirect
                    || flags & VIRTQ_DESC_F_NEXT != 0
                    || len == 0
                    || !(len as u64).is_multiple_of(DESC)
                {
                    return Err(ChainError::Indirect);
                }
                let n = len as u64 / DESC;
                if n > MAX_QUEUE_SIZE as u64 {
                    return Err(ChainError::Indirect);
                }
                table = self
                    .mem
                    .field(GuestAddr(addr), len as u64, DESC)
                    .map_err(|_| ChainError::Indirect)?;
                (table_len, i, seen, indirect) = (n as u16, 0, 0, true);
                continue;
            }
            let writable = flags & VIRTQ_DESC_F_WRITE != 0;
            if len > 0 {
                self.mem.host(GuestAddr(addr), len as u64)?;
                chain.push(Segment { addr: GuestAddr(addr), len, writable })?;
            }
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                return Ok(());
            }
            i = next;
        }
    }

    /// Puts the chain popped last back, untouched, for a later pop (a receive chain too small
    /// for this frame may fit the next one). Only right after [`Ring::pop`].
    pub fn unpop(&mut self) {
        self.q.last_avail = self.q.last_avail.wrapping_sub(1);
    }

    /// Returns a chain to the guest with `len` bytes written into it (0 for a read-only or
    /// refused chain). Visible to the guest once published.
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = (self.q.used_idx & (self.q.size - 1)) as usize;
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&(head as u32).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        // SAFETY: the used ring was checked for 6 + 8 * size bytes; slot < size.
        unsafe { std::ptr::write_volatile(self.used.add(4 + 8 * slot) as *mut [u8; 8], e) };
        self.q.used_idx = self.q.used_idx.wrapping_add(1);
        self.published = false;
    }

    /// Makes every pushed completion visible to the guest (one index store per burst).
    pub fn publish(&mut self) {
        if !self.published {
            // The entries before the index: release ordering on the index store.
            store16(self.used, 2, self.q.used_idx, Ordering::Release);
            self.published = true;
        }
    }

    /// Whether the guest wants an interrupt for what was published since the last one
    /// (and records that it gets one).
    pub fn needs_interrupt(&mut self) -> bool {
        self.publish();
        // The index store before reading the guest's wish (virtio's full barrier).
        fence(Ordering::SeqCst);
        let (new, old) = (self.q.used_idx, self.q.signalled);
        let want = if self.q.event_idx {
            let event = load16(self.avail, 4 + 2 * self.q.size as usize, Ordering::Relaxed);
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            new != old && load16(self.avail, 0, Ordering::Relaxed) & VIRTQ_AVAIL_F_NO_INTERRUPT == 0
        };
        if want {
            self.q.signalled = new;
        }
        want
    }

    /// Asks the guest to kick (or not) when it makes chains available. While a PMD thread
    /// polls the queue, kicks are suppressed; before it sleeps it enables them and must
    /// check [`Ring::pending`] again (a chain may have come meanwhile).
    pub fn set_kicks(&mut self, on: bool) {
        if self.q.event_idx {
            if on {
                store16(
                    self.used,
                    4 + 8 * self.q.size as usize,
                    self.q.last_avail,
                    Ordering::Relaxed,
                );
            }
        } else {
            let f = load16(self.used, 0, Ordering::Relaxed);
            let f = if on { f & !VIRTQ_USED_F_NO_NOTIFY } else { f | VIRTQ_USED_F_NO_NOTIFY };
            store16(self.used, 0, f, Ordering::Relaxed);
        }
        if on {
            fence(Ordering::SeqCst);
        }
    }

    /// Guest memory, for copying a popped chain's bytes.
    pub fn memory(&self) -> &GuestMemory {
        self.mem
    }
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

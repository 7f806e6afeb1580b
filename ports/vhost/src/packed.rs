//! Packed virtqueues (virtio 1.1, 2.8) driven by a polling device: what DPDK's virtio-user
//! asks for with `packed_vq=1` and QEMU's virtio-net with `packed=on`. One ring of 16-byte
//! descriptors both sides write, plus two 4-byte event-suppression areas (the driver's, which
//! vhost-user's SET_VRING_ADDR calls the available ring, and the device's, its used ring).
//!
//! A descriptor is available when its `AVAIL` flag equals the device's wrap counter and its
//! `USED` flag does not; a chain is consecutive descriptors joined by `NEXT` (wrapping at the
//! ring's end), its buffer id in its last one. The device returns a chain by writing one
//! descriptor where its used position is (the buffer id, the bytes written, `AVAIL` and
//! `USED` both equal to its own wrap counter) and moving that position by the chain's length
//! in descriptors. The port pops and returns chains in ring order (one thread per ring at a
//! time, `IN_ORDER`), so a chain's used descriptor lands where its head was.
//!
//! A popped chain's `head` (what callers hand back to [`Ring::push_used`]) is the ring slot
//! of its first descriptor, not the driver's buffer id: the queue keeps, per slot, the id
//! and the chain's length ([`PackedQueue::meta`]), so nothing the driver wrote after the pop
//! decides where the device writes. Ids are echoed as the driver gave them.
//!
//! The guest is not trusted, as for split rings (`vring.rs`): every chain is checked before
//! its bytes are used (buffers inside one memory region, at most [`crate::vring::MAX_SEGS`] buffers,
//! readable before writable, indirect tables only when negotiated, 16-byte aligned, whole
//! descriptors, not with `NEXT`, never nested; no more descriptors in all than the queue has
//! entries or [`MAX_CHAIN`]); a chain that fails is consumed whole (returned with length 0)
//! so the device stays in step with the driver. A chain whose `NEXT` flags run on past
//! [`MAX_CHAIN`] descriptors (or round the whole ring) stops the queue
//! ([`crate::queue::Virtqueue::is_broken`]); nothing is returned on a stopped queue.
//!
//! # Safety
//! [`Ring`] holds host pointers to the descriptor ring and both event areas, obtained from
//! the [`GuestMemory`] it borrows (so the mappings outlive it), each checked for its whole
//! size and alignment. Every read and write of ring memory is volatile or atomic: the guest
//! writes it concurrently and the code never assumes two reads agree.

use crate::memory::{GuestAddr, GuestMemory};
use crate::vring::{
    Chain, ChainError, DESC, Flat, Health, MAX_CHAIN, MAX_QUEUE_SIZE, QueueError, Segment,
    VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE, load16, prefetch, read_desc,
    store16,
};
use std::sync::atomic::{Ordering, fence};

pub const F_AVAIL: u16 = 1 << 7;
pub const F_USED: u16 = 1 << 15;
/// Event-suppression flags (`desc_event_flags`): always notify, never, at one descriptor.
const EVENT_ENABLE: u16 = 0;
const EVENT_DISABLE: u16 = 1;
const EVENT_DESC: u16 = 2;
/// Why a queue stops when a chain's `NEXT` flags run on past [`MAX_CHAIN`] descriptors (or
/// round the whole ring): walking them would let each pop cost the PMD thread thousands of
/// descriptor reads; DPDK's vhost library gives such a queue up too.
pub const ENDLESS: &str = "a packed chain's NEXT flags run on past 1,024 descriptors";
/// Pops one burst can take back ([`Ring::unpop`]): a merged frame's chains and its first.
const UNPOP_DEPTH: usize = 32;
/// What SET_VRING_BASE gives a packed ring that starts afresh: slot 0, wrap counter 1.
pub const FRESH_BASE: u16 = 1 << 15;

/// A place in the ring: a slot and the wrap counter of the lap it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    slot: u16,
    wrap: bool,
}

impl Position {
    /// vhost-user's encoding (SET/GET_VRING_BASE): the slot in bits 0-14, the wrap counter
    /// in bit 15.
    fn decode(base: u16) -> Position {
        Position { slot: base & 0x7fff, wrap: base & FRESH_BASE != 0 }
    }

    fn encode(self) -> u16 {
        self.slot | if self.wrap { FRESH_BASE } else { 0 }
    }

    fn advance(&mut self, n: u16, size: u16) {
        let s = self.slot as u32 + n as u32;
        if s >= size as u32 {
            self.slot = (s - size as u32) as u16;
            self.wrap = !self.wrap;
        } else {
            self.slot = s as u16;
        }
    }

    /// Where it is in two laps of `size` (what event offsets are compared in).
    fn linear(self, size: u16) -> u32 {
        self.slot as u32 + if self.wrap { 0 } else { size as u32 }
    }
}

/// A packed virtqueue's device-side state: where its ring and event areas are, how far the
/// device got, and what it popped.
#[derive(Debug, Clone)]
pub struct PackedQueue {
    size: u16,
    desc: GuestAddr,
    driver: GuestAddr,
    device: GuestAddr,
    event_idx: bool,
    indirect: bool,
    /// `VIRTIO_F_IN_ORDER`: read-only chains may go back a burst at a time.
    in_order: bool,
    avail: Position,
    used: Position,
    /// The used position when the driver's wish for an interrupt was last checked, and the
    /// descriptors returned since (a lap or more makes the positions ambiguous: notify).
    signalled: Position,
    since_signal: u32,
    /// Per slot, for the chain popped with its head there: the driver's buffer id and the
    /// chain's length in ring descriptors (where the next used descriptor goes after it).
    meta: Box<[(u16, u16)]>,
    /// Whether it stopped and why (asked through [`crate::queue::Virtqueue`]).
    pub(crate) health: Health,
    id: u64,
}

impl PackedQueue {
    /// A queue of `size` descriptors (any size up to 32,768: packed rings need not be a power
    /// of two) with its ring and event areas at these guest addresses, starting at `base`
    /// (SET_VRING_BASE's encoding: slot and wrap counter). The areas are checked when used.
    pub fn new(
        size: u16,
        desc: GuestAddr,
        driver: GuestAddr,
        device: GuestAddr,
        base: u16,
    ) -> Result<PackedQueue, QueueError> {
        if size == 0 || size > MAX_QUEUE_SIZE {
            return Err(QueueError::PackedSize(size));
        }
        let at = Position::decode(base);
        if at.slot >= size {
            return Err(QueueError::Base(base));
        }
        Ok(PackedQueue {
            size,
            desc,
            driver,
            device,
            event_idx: false,
            indirect: false,
            in_order: false,
            avail: at,
            used: at,
            signalled: at,
            since_signal: 0,
            meta: vec![(0, 1); size as usize].into_boxed_slice(),
            health: Health::default(),
            id: crate::vring::next_queue_id(),
        })
    }

    /// See [`crate::vring::SplitQueue::id`].
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn set_features(&mut self, event_idx: bool, indirect: bool) {
        (self.event_idx, self.indirect) = (event_idx, indirect);
    }

    /// `VIRTIO_F_IN_ORDER` was negotiated (see [`Ring::push_read`]).
    pub fn set_in_order(&mut self, on: bool) {
        self.in_order = on;
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// Takes over `old`'s progress (see [`crate::queue::Virtqueue::continue_from`]).
    pub fn continue_from(&mut self, old: &PackedQueue) {
        if old.size == self.size {
            (self.avail, self.used, self.signalled) = (old.avail, old.used, old.signalled);
            self.since_signal = old.since_signal;
            self.meta.copy_from_slice(&old.meta);
            self.id = old.id;
        }
    }

    /// The next descriptor to read, encoded as GET_VRING_BASE returns it.
    pub fn next_avail(&self) -> u16 {
        self.avail.encode()
    }

    /// The ring and event areas in `mem`, checked for size and alignment, for one burst.
    pub fn ring<'m>(&'m mut self, mem: &'m GuestMemory) -> Result<Ring<'m>, QueueError> {
        let desc = mem.field(self.desc, DESC * self.size as u64, 16)?;
        let driver = mem.field(self.driver, 4, 4)?;
        let device = mem.field(self.device, 4, 4)?;
        Ok(Ring {
            q: self,
            mem,
            desc,
            driver,
            device,
            first_used: None,
            merged: None,
            history: [Position { slot: 0, wrap: true }; UNPOP_DEPTH],
            popped: 0,
        })
    }
}

/// One burst's access to a packed queue; publishes its completions when dropped.
pub struct Ring<'m> {
    q: &'m mut PackedQueue,
    mem: &'m GuestMemory,
    desc: *mut u8,
    driver: *mut u8,
    device: *mut u8,
    /// The burst's first used descriptor (its slot and flags), whose flags are written last
    /// ([`Ring::publish`]): the driver, which polls that descriptor, then finds the burst's
    /// others complete (DPDK's vhost library returns bursts so too).
    first_used: Option<(u16, u16)>,
    /// Read-only chains returned as one used descriptor ([`Ring::push_read`]): its slot,
    /// flags and the last chain's buffer id.
    merged: Option<(u16, u16, u16)>,
    /// Where the burst's last pops started, for [`Ring::unpop`].
    history: [Position; UNPOP_DEPTH],
    popped: usize,
}

impl<'m> Ring<'m> {
    fn flags_at(&self, slot: u16) -> u16 {
        // Acquire: the descriptor's other fields are read after its flags said it is ours.
        load16(self.desc, slot as usize * DESC as usize + 14, Ordering::Acquire)
    }

    fn head_available(&self) -> bool {
        let f = self.flags_at(self.q.avail.slot);
        let wrap = self.q.avail.wrap;
        (f & F_AVAIL != 0) == wrap && (f & F_USED != 0) != wrap
    }

    /// 1 when the driver made a chain available the device has not taken yet, else 0
    /// (a packed ring does not say how many without reading them all).
    #[inline]
    pub fn pending(&mut self) -> u16 {
        (!self.q.health.broken && self.head_available()) as u16
    }

    fn remember(&mut self) {
        self.history[self.popped % UNPOP_DEPTH] = self.q.avail;
        self.popped = self.popped.wrapping_add(1);
    }

    /// Pops the next available chain into `chain` (see [`crate::vring::Ring::pop`]).
    #[inline]
    pub fn pop(&mut self, chain: &mut Chain) -> Option<Result<(), ChainError>> {
        if self.pending() == 0 {
            return None;
        }
        self.remember();
        let head = self.q.avail;
        chain.clear(head.slot);
        let (mut at, mut n) = (head, 0u16);
        let mut id;
        let mut budget = (self.q.size as u32).min(MAX_CHAIN);
        let mut result = Ok(());
        loop {
            if n == self.q.size || n as u32 == MAX_CHAIN {
                self.q.health.fail(ENDLESS);
                return Some(Err(ChainError::Loop));
            }
            let (addr, len, buf_id, flags) = read_desc(self.desc, at.slot);
            (n, id) = (n + 1, buf_id);
            at.advance(1, self.q.size);
            if result.is_ok() {
                result = self.segment(addr, len, flags, n == 1, chain, &mut budget);
            }
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
        }
        self.q.meta[head.slot as usize] = (id, n);
        self.q.avail = at;
        Some(result)
    }

    /// Adds one ring descriptor's buffers to `chain`: its own, or an indirect table's (only
    /// as a chain's one descriptor: with `NEXT` it is refused, after others too).
    fn segment(
        &self,
        addr: u64,
        len: u32,
        flags: u16,
        first: bool,
        chain: &mut Chain,
        budget: &mut u32,
    ) -> Result<(), ChainError> {
        if flags & VIRTQ_DESC_F_INDIRECT == 0 {
            *budget = budget.checked_sub(1).ok_or(ChainError::TooManyDescriptors)?;
            return self.buffer(addr, len, flags & VIRTQ_DESC_F_WRITE != 0, chain);
        }
        if !self.q.indirect
            || !first
            || flags & VIRTQ_DESC_F_NEXT != 0
            || len == 0
            || !(len as u64).is_multiple_of(DESC)
            || len as u64 / DESC > MAX_QUEUE_SIZE as u64
        {
            return Err(ChainError::Indirect);
        }
        let table =
            self.mem.field(GuestAddr(addr), len as u64, DESC).map_err(|_| ChainError::Indirect)?;
        // In an indirect table only WRITE counts; NEXT and the ids are ignored (2.8.13).
        for i in 0..(len as u64 / DESC) as u16 {
            *budget = budget.checked_sub(1).ok_or(ChainError::TooManyDescriptors)?;
            let (addr, len, _, flags) = read_desc(table, i);
            self.buffer(addr, len, flags & VIRTQ_DESC_F_WRITE != 0, chain)?;
        }
        Ok(())
    }

    fn buffer(
        &self,
        addr: u64,
        len: u32,
        writable: bool,
        chain: &mut Chain,
    ) -> Result<(), ChainError> {
        if len > 0 {
            self.mem.host(GuestAddr(addr), len as u64)?;
            chain.push(Segment { addr: GuestAddr(addr), len, writable })?;
        }
        Ok(())
    }

    /// Pops the next available chain if it is one buffer (see
    /// [`crate::vring::Ring::pop_flat`]).
    #[inline(always)]
    pub fn pop_flat(&mut self, writable: bool) -> Option<Flat<'m>> {
        if self.pending() == 0 {
            return None;
        }
        let slot = self.q.avail.slot;
        let (addr, len, id, flags) = read_desc(self.desc, slot);
        let want = if writable { VIRTQ_DESC_F_WRITE } else { 0 };
        if flags & (VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_WRITE) != want
            || len == 0
        {
            return None;
        }
        let buf = self.mem.slice(GuestAddr(addr), len as usize).ok()?;
        prefetch(buf.as_ptr());
        prefetch(buf.as_ptr().wrapping_add(64));
        self.remember();
        self.q.meta[slot as usize] = (id, 1);
        self.q.avail.advance(1, self.q.size);
        Some(Flat { head: slot, addr: GuestAddr(addr), buf })
    }

    /// Puts the chain popped last back (see [`crate::vring::Ring::unpop`]); up to
    /// [`UNPOP_DEPTH`] pops of one burst, most recent first.
    pub fn unpop(&mut self) {
        debug_assert!(self.popped > 0, "unpop without a pop");
        self.popped = self.popped.wrapping_sub(1);
        self.q.avail = self.history[self.popped % UNPOP_DEPTH];
    }

    /// Returns the chain popped at slot `head` with `len` bytes written into it: one used
    /// descriptor with its buffer id where the used position is, which moves past the chain.
    /// Visible to the guest once published.
    #[inline(always)]
    pub fn push_used(&mut self, head: u16, len: u32) {
        if self.q.health.broken {
            return; // where its chains end is not known
        }
        self.flush_merged();
        let (id, n) = self.meta(head);
        let (slot, flags) = (self.q.used.slot, self.used_flags());
        self.write_used(slot, id, len, flags);
        self.advance_used(n);
    }

    /// Returns a chain the device only read (a transmit chain, length 0). With `IN_ORDER`, a
    /// burst of them goes back as one used descriptor — the last one's id where the first
    /// one's head was, the used position past them all (virtio 1.1, 2.8.9) — which the
    /// driver reads once instead of once a frame; without, as [`Ring::push_used`].
    #[inline(always)]
    pub fn push_read(&mut self, head: u16) {
        if !self.q.in_order {
            return self.push_used(head, 0);
        }
        if self.q.health.broken {
            return;
        }
        let (id, n) = self.meta(head);
        match &mut self.merged {
            Some(m) => m.2 = id,
            None => self.merged = Some((self.q.used.slot, self.used_flags(), id)),
        }
        self.advance_used(n);
    }

    fn meta(&self, head: u16) -> (u16, u16) {
        self.q.meta.get(head as usize).copied().unwrap_or((head, 1))
    }

    fn used_flags(&self) -> u16 {
        if self.q.used.wrap { F_AVAIL | F_USED } else { 0 }
    }

    fn advance_used(&mut self, n: u16) {
        self.q.used.advance(n, self.q.size);
        self.q.since_signal = self.q.since_signal.saturating_add(n as u32);
    }

    /// Writes one used descriptor; its flags wait for [`Ring::publish`] if it is the burst's
    /// first.
    fn write_used(&mut self, slot: u16, id: u16, len: u32, flags: u16) {
        // SAFETY: the ring was checked for 16 * size bytes and slot < size (a used position);
        // the length and id words (bytes 8..14 of the descriptor) are written before its
        // flags.
        unsafe {
            let d = self.desc.add(slot as usize * DESC as usize);
            std::ptr::write_volatile(d.add(8) as *mut [u8; 4], len.to_le_bytes());
            std::ptr::write_volatile(d.add(12) as *mut [u8; 2], id.to_le_bytes());
        }
        if self.first_used.is_none() {
            self.first_used = Some((slot, flags));
        } else {
            store16(self.desc, slot as usize * DESC as usize + 14, flags, Ordering::Release);
        }
    }

    /// Writes the used descriptor [`Ring::push_read`] was gathering, if any.
    fn flush_merged(&mut self) {
        if let Some((slot, flags, id)) = self.merged.take() {
            self.write_used(slot, id, 0, flags);
        }
    }

    /// Makes every pushed completion visible to the guest: the burst's first used
    /// descriptor's flags, after every other's.
    pub fn publish(&mut self) {
        self.flush_merged();
        if let Some((slot, flags)) = self.first_used.take() {
            store16(self.desc, slot as usize * DESC as usize + 14, flags, Ordering::Release);
        }
    }

    /// Whether the driver wants an interrupt for what was returned since it was last asked
    /// (its event area: always, never, or once the used position passes a descriptor).
    pub fn needs_interrupt(&mut self) -> bool {
        self.publish();
        // The flags' stores before reading the driver's wish (virtio's full barrier).
        fence(Ordering::SeqCst);
        let (new, old) = (self.q.used, self.q.signalled);
        let moved = std::mem::take(&mut self.q.since_signal);
        if moved == 0 {
            return false;
        }
        self.q.signalled = new;
        match load16(self.driver, 2, Ordering::Relaxed) {
            EVENT_DISABLE => false,
            EVENT_DESC if self.q.event_idx && moved < self.q.size as u32 => {
                let off_wrap = load16(self.driver, 0, Ordering::Relaxed);
                let size = self.q.size;
                let event = Position::decode(off_wrap);
                if event.slot >= size {
                    return true; // a driver's nonsense: notify rather than go quiet
                }
                // In two laps' numbering: the event lies in [old, new).
                let lap = 2 * size as u32;
                let (n, o, e) = (new.linear(size), old.linear(size), event.linear(size));
                (n + lap - e - 1) % lap < (n + lap - o) % lap
            }
            _ => true,
        }
    }

    /// Asks the driver to notify (kick) when it makes chains available, or not (see
    /// [`crate::vring::Ring::set_kicks`]).
    pub fn set_kicks(&mut self, on: bool) {
        let want = if on { EVENT_ENABLE } else { EVENT_DISABLE };
        if load16(self.device, 2, Ordering::Relaxed) != want {
            store16(self.device, 2, want, Ordering::Relaxed);
        }
        if on {
            fence(Ordering::SeqCst);
        }
    }

    pub fn memory(&self) -> &GuestMemory {
        self.mem
    }
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Mapping;

    const RING: u64 = 0;
    const DRIVER: u64 = 0x4000;
    const DEVICE: u64 = 0x4010;
    const BUFS: u64 = 0x8000;

    fn memory() -> GuestMemory {
        let map = Mapping::anonymous(0x1_0000).unwrap();
        GuestMemory::new(vec![(0, 0x7000_0000_0000, map)]).unwrap()
    }

    fn queue(size: u16) -> PackedQueue {
        PackedQueue::new(size, GuestAddr(RING), GuestAddr(DRIVER), GuestAddr(DEVICE), FRESH_BASE)
            .unwrap()
    }

    /// The driver makes descriptor `slot` available in the lap of wrap counter `wrap`.
    fn post(mem: &GuestMemory, slot: u16, addr: u64, len: u32, id: u16, flags: u16, wrap: bool) {
        let lap = if wrap { F_AVAIL } else { F_USED };
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&id.to_le_bytes());
        d[14..].copy_from_slice(&(flags | lap).to_le_bytes());
        mem.slice(GuestAddr(RING + 16 * slot as u64), 16).unwrap().write(&d);
    }

    /// Descriptor `slot` as the device left it: (id, len, flags).
    fn used(mem: &GuestMemory, slot: u16) -> (u16, u32, u16) {
        let d: [u8; 16] =
            mem.slice(GuestAddr(RING + 16 * slot as u64), 16).unwrap().read_array().unwrap();
        let w = |a: usize| u16::from_le_bytes([d[a], d[a + 1]]);
        (w(12), u32::from_le_bytes([d[8], d[9], d[10], d[11]]), w(14))
    }

    fn set_driver_event(mem: &GuestMemory, off_wrap: u16, flags: u16) {
        let mut e = [0u8; 4];
        e[..2].copy_from_slice(&off_wrap.to_le_bytes());
        e[2..].copy_from_slice(&flags.to_le_bytes());
        mem.slice(GuestAddr(DRIVER), 4).unwrap().write(&e);
    }

    #[test]
    fn chains_go_back_where_their_heads_were_lap_after_lap() {
        let mem = memory();
        let mut q = queue(4);
        post(&mem, 0, BUFS, 60, 10, 0, true);
        post(&mem, 1, BUFS + 0x100, 12, 99, VIRTQ_DESC_F_NEXT, true);
        post(&mem, 2, BUFS + 0x200, 60, 11, 0, true);
        post(&mem, 3, BUFS + 0x300, 60, 12, 0, true);
        let mut r = q.ring(&mem).unwrap();
        assert_eq!(r.pop_flat(false).map(|f| (f.head, f.len())), Some((0, 60)));
        assert!(r.pop_flat(false).is_none(), "a chain of two is not flat");
        let mut chain = Chain::default();
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        assert_eq!((chain.head, chain.segments().len(), chain.readable), (1, 2, 72));
        assert_eq!(r.pop_flat(false).map(|f| f.head), Some(3));
        assert!(r.pop_flat(false).is_none() && r.pending() == 0, "the ring is empty");
        for (head, len) in [(0, 5), (1, 6), (3, 7)] {
            r.push_used(head, len);
        }
        assert_eq!(used(&mem, 0).2 & F_USED, 0, "the burst's first waits for the publish");
        drop(r);
        let both = F_AVAIL | F_USED;
        assert_eq!(used(&mem, 0), (10, 5, both));
        assert_eq!(used(&mem, 1), (11, 6, both), "the chain's id is its last descriptor's");
        assert_eq!(used(&mem, 3), (12, 7, both));
        // The next lap: the driver's and the device's wrap counters are 0.
        post(&mem, 0, BUFS, 60, 20, VIRTQ_DESC_F_WRITE, false);
        let mut r = q.ring(&mem).unwrap();
        assert!(r.pop_flat(false).is_none(), "not device-readable");
        let f = r.pop_flat(true).unwrap();
        r.push_used(f.head, 42);
        drop(r);
        assert_eq!(used(&mem, 0), (20, 42, 0));
        assert_eq!(q.next_avail(), 1, "slot 1, wrap counter 0");
    }

    /// With IN_ORDER, read-only chains go back a burst at a time: one used descriptor with
    /// the last one's id where the first one's head was; written ones go back each.
    #[test]
    fn in_order_read_chains_go_back_as_one_used_descriptor() {
        let mem = memory();
        let mut q = queue(4);
        q.set_in_order(true);
        post(&mem, 0, BUFS, 60, 10, 0, true);
        post(&mem, 1, BUFS, 60, 11, VIRTQ_DESC_F_NEXT, true);
        post(&mem, 2, BUFS, 60, 12, 0, true);
        post(&mem, 3, BUFS, 60, 13, VIRTQ_DESC_F_WRITE, true);
        let mut r = q.ring(&mem).unwrap();
        let a = r.pop_flat(false).unwrap().head;
        let mut chain = Chain::default();
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        let w = r.pop_flat(true).unwrap().head;
        r.push_read(a);
        r.push_read(chain.head);
        r.push_used(w, 9);
        drop(r);
        let both = F_AVAIL | F_USED;
        assert_eq!(used(&mem, 0), (12, 0, both), "the last read chain's id, at the first's slot");
        assert_eq!(used(&mem, 1).2 & F_USED, 0, "skipped: not written");
        assert_eq!(used(&mem, 3), (13, 9, both));
        assert_eq!(q.next_avail(), 0, "a lap later");
    }

    /// A burst of read chains that crosses the ring's end goes back as one used descriptor
    /// with the flags of the lap its first chain is in.
    #[test]
    fn a_merged_return_across_the_wrap_keeps_its_first_laps_flags() {
        let mem = memory();
        let mut q = queue(4);
        q.set_in_order(true);
        for slot in 0..4 {
            post(&mem, slot, BUFS, 60, 10 + slot, 0, true);
        }
        let mut r = q.ring(&mem).unwrap();
        for _ in 0..2 {
            let f = r.pop_flat(false).unwrap();
            r.push_used(f.head, 1);
        }
        drop(r);
        post(&mem, 0, BUFS, 60, 20, 0, false); // the next lap
        let mut r = q.ring(&mem).unwrap();
        let heads: Vec<u16> = std::iter::from_fn(|| r.pop_flat(false).map(|f| f.head)).collect();
        assert_eq!(heads, [2, 3, 0]);
        for h in heads {
            r.push_read(h);
        }
        drop(r);
        assert_eq!(used(&mem, 2), (20, 0, F_AVAIL | F_USED), "the last id, the first lap's flags");
        assert_eq!(used(&mem, 3).2, F_AVAIL, "skipped: as the driver left it");
        assert_eq!(used(&mem, 0).2, F_USED, "skipped: as the driver left it");
        assert_eq!(q.next_avail(), 1, "slot 1 of the lap with wrap counter 0");
    }

    #[test]
    fn a_refused_chain_is_consumed_whole() {
        let mem = memory();
        let mut q = queue(8);
        post(&mem, 0, 0x10_0000, 60, 1, VIRTQ_DESC_F_NEXT, true); // outside guest memory
        post(&mem, 1, BUFS, 60, 2, 0, true);
        post(&mem, 2, BUFS, 60, 3, VIRTQ_DESC_F_INDIRECT, true); // indirect not negotiated
        post(&mem, 3, BUFS, 60, 4, 0, true);
        let mut r = q.ring(&mem).unwrap();
        let mut chain = Chain::default();
        assert!(matches!(r.pop(&mut chain), Some(Err(ChainError::Memory(_)))));
        assert_eq!(chain.head, 0);
        r.push_used(0, 0);
        assert_eq!(r.pop(&mut chain), Some(Err(ChainError::Indirect)));
        r.push_used(chain.head, 0);
        assert_eq!(r.pop_flat(false).map(|f| f.head), Some(3), "in step with the driver");
        r.push_used(3, 0);
        drop(r);
        assert_eq!((used(&mem, 0).0, used(&mem, 2).0, used(&mem, 3).0), (2, 3, 4));
    }

    #[test]
    fn an_endless_chain_stops_the_queue() {
        let mem = memory();
        let mut q = queue(4);
        for slot in 0..4 {
            post(&mem, slot, BUFS, 60, slot, VIRTQ_DESC_F_NEXT, true);
        }
        let mut r = q.ring(&mem).unwrap();
        let mut chain = Chain::default();
        assert_eq!(r.pop(&mut chain), Some(Err(ChainError::Loop)));
        assert_eq!(r.pending(), 0);
        r.push_used(chain.head, 0);
        drop(r);
        assert_eq!(used(&mem, 0).2, VIRTQ_DESC_F_NEXT | F_AVAIL, "nothing returned");
        assert_eq!(q.health.broken_reason(), Some(ENDLESS));
        assert!(q.health.newly_broken() && !q.health.newly_broken());
    }

    /// A chain may be as long as its ring, but not longer than MAX_CHAIN descriptors: in a
    /// large ring, each pop would otherwise read thousands of them.
    #[test]
    fn a_chain_past_max_chain_stops_the_queue() {
        let mem = memory();
        let size = MAX_CHAIN as u16 + 100;
        let mut q = PackedQueue::new(
            size,
            GuestAddr(RING),
            GuestAddr(0xf000),
            GuestAddr(0xf010),
            FRESH_BASE,
        )
        .unwrap();
        for slot in 0..size {
            let next = if slot < MAX_CHAIN as u16 + 10 { VIRTQ_DESC_F_NEXT } else { 0 };
            post(&mem, slot, BUFS + 0x4000, 0, slot, next, true);
        }
        let mut r = q.ring(&mem).unwrap();
        assert_eq!(r.pop(&mut Chain::default()), Some(Err(ChainError::Loop)));
        drop(r);
        assert_eq!(q.health.broken_reason(), Some(ENDLESS));
    }

    /// The same ring set up again while it runs (a new memory table, say) keeps what the
    /// device took: chains popped before are returned in their places after.
    #[test]
    fn a_ring_set_up_again_returns_what_it_took_before() {
        let mem = memory();
        let mut q = queue(8);
        post(&mem, 0, BUFS, 60, 7, VIRTQ_DESC_F_NEXT, true);
        post(&mem, 1, BUFS, 60, 8, 0, true);
        post(&mem, 2, BUFS, 60, 9, 0, true);
        let mut r = q.ring(&mem).unwrap();
        assert_eq!(r.pop(&mut Chain::default()), Some(Ok(())));
        assert_eq!(r.pop_flat(false).map(|f| f.head), Some(2));
        drop(r);
        let mut again = PackedQueue::new(
            8,
            GuestAddr(RING),
            GuestAddr(DRIVER),
            GuestAddr(DEVICE),
            q.next_avail(),
        )
        .unwrap();
        again.continue_from(&q);
        assert_eq!(again.id(), q.id(), "lent descriptors come back to it");
        let mut r = again.ring(&mem).unwrap();
        r.push_used(0, 1);
        r.push_used(2, 2);
        drop(r);
        assert_eq!((used(&mem, 0).0, used(&mem, 2).0), (8, 9));
    }

    #[test]
    fn indirect_tables_only_alone_and_without_next() {
        let mem = memory();
        let mut q = queue(8);
        q.set_features(false, true);
        let table = BUFS + 0x1000;
        for (i, (len, flags)) in [(14u32, 0u16), (1500, VIRTQ_DESC_F_WRITE)].iter().enumerate() {
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&(BUFS + 0x800 * i as u64).to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[14..].copy_from_slice(&flags.to_le_bytes());
            mem.slice(GuestAddr(table + 16 * i as u64), 16).unwrap().write(&d);
        }
        post(&mem, 0, table, 32, 1, VIRTQ_DESC_F_INDIRECT, true);
        post(&mem, 1, table, 32, 2, VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT, true);
        post(&mem, 2, BUFS, 60, 3, 0, true);
        post(&mem, 3, BUFS, 60, 4, VIRTQ_DESC_F_NEXT, true);
        post(&mem, 4, table, 32, 5, VIRTQ_DESC_F_INDIRECT, true);
        let mut r = q.ring(&mem).unwrap();
        let mut chain = Chain::default();
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        assert_eq!((chain.readable, chain.writable), (14, 1500));
        assert_eq!(r.pop(&mut chain), Some(Err(ChainError::Indirect)), "with NEXT");
        assert_eq!(chain.head, 1, "consumed with the descriptor its NEXT names");
        assert_eq!(r.pop(&mut chain), Some(Err(ChainError::Indirect)), "after another");
        assert_eq!(chain.head, 3);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn unpop_goes_back_chain_by_chain() {
        let mem = memory();
        let mut q = queue(8);
        post(&mem, 0, BUFS, 60, 1, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, true);
        post(&mem, 1, BUFS, 60, 1, VIRTQ_DESC_F_WRITE, true);
        post(&mem, 2, BUFS, 60, 2, VIRTQ_DESC_F_WRITE, true);
        let mut r = q.ring(&mem).unwrap();
        let mut chain = Chain::default();
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        assert_eq!(chain.head, 2);
        r.unpop();
        r.unpop();
        assert_eq!(r.pop(&mut chain), Some(Ok(())));
        assert_eq!((chain.head, chain.writable), (0, 120));
    }

    #[test]
    fn interrupts_follow_the_drivers_event_area() {
        let mem = memory();
        let mut q = queue(4);
        q.set_features(true, false);
        let lap = |mem: &GuestMemory, wrap: bool| {
            for slot in 0..4 {
                post(mem, slot, BUFS, 60, slot, 0, wrap);
            }
        };
        lap(&mem, true);
        let mut r = q.ring(&mem).unwrap();
        assert!(!r.needs_interrupt(), "nothing returned yet");
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0);
        set_driver_event(&mem, 0, EVENT_DISABLE);
        assert!(!r.needs_interrupt());
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0);
        set_driver_event(&mem, 0, EVENT_ENABLE);
        assert!(r.needs_interrupt());
        assert!(!r.needs_interrupt(), "nothing new since");
        // At a descriptor: once the used position passes slot 3 of this lap.
        set_driver_event(&mem, 3 | FRESH_BASE, EVENT_DESC);
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0); // slot 2
        assert!(!r.needs_interrupt());
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0); // slot 3
        assert!(r.needs_interrupt());
        drop(r);
        // Slot 1 of the next lap (wrap counter 0).
        lap(&mem, false);
        set_driver_event(&mem, 1, EVENT_DESC);
        let mut r = q.ring(&mem).unwrap();
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0);
        assert!(!r.needs_interrupt());
        let f = r.pop_flat(false).unwrap();
        r.push_used(f.head, 0);
        assert!(r.needs_interrupt());
        // A whole lap returned since the last check (slots 2, 3, then 0, 1 of the third lap):
        // the positions alone cannot say whether the event passed; notify.
        for slot in 0..2 {
            post(&mem, slot, BUFS, 60, slot, 0, true);
        }
        set_driver_event(&mem, 3, EVENT_DESC);
        let mut heads = vec![];
        while let Some(f) = r.pop_flat(false) {
            heads.push(f.head);
        }
        assert_eq!(heads.len(), 4);
        for h in heads {
            r.push_used(h, 0);
        }
        assert!(r.needs_interrupt());
        // Kicks: asked for and suppressed through the device's area.
        r.set_kicks(true);
        let flags =
            |mem: &GuestMemory| mem.slice(GuestAddr(DEVICE + 2), 2).unwrap().read_array::<2>();
        assert_eq!(flags(&mem), Some(EVENT_ENABLE.to_le_bytes()));
        r.set_kicks(false);
        assert_eq!(flags(&mem), Some(EVENT_DISABLE.to_le_bytes()));
    }

    #[test]
    fn sizes_and_bases_are_checked() {
        let at = |size, base| {
            PackedQueue::new(size, GuestAddr(RING), GuestAddr(DRIVER), GuestAddr(DEVICE), base)
                .map(|q| q.next_avail())
        };
        assert_eq!(at(1000, FRESH_BASE | 999), Ok(FRESH_BASE | 999), "any size");
        assert_eq!(at(4, FRESH_BASE | 4), Err(QueueError::Base(FRESH_BASE | 4)));
        assert_eq!(at(0, 0), Err(QueueError::PackedSize(0)));
        assert_eq!(at(32768, 0).map(|_| ()), Ok(()));
        let mut q = queue(4);
        let mem = memory();
        post(&mem, 0, BUFS, 60, 1, 0, false);
        assert!(q.ring(&mem).unwrap().pop_flat(false).is_none(), "last lap's flags");
    }
}

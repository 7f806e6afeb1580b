//! The driver side of split virtqueues (virtio 1.x, 2.6), as a guest's virtio-net driver
//! runs them: the rings' layout and entry formats ([`layout`], [`desc_bytes`],
//! [`used_entry`]) shared with the test kit's simulated guest ([`crate::testkit::Guest`]),
//! and [`Queue`], the fast driver the perf lab's generator runs in memory this process owns
//! and shares with the switch under test (a vhost-user backend): descriptors set once, heads
//! posted in bursts, completions polled, interrupts off.
//!
//! The switch is the thing being measured, not trusted: a completion naming a descriptor
//! outside the queue, or a used index running more than a queue ahead, is counted and
//! ignored, never used to index memory.
//!
//! # Safety
//! [`Shared`] owns one `MAP_SHARED` mapping of a memfd; every [`Queue`] keeps an `Arc` of
//! it, so the ring pointers stay valid while the queue lives. Ring areas are placed by
//! [`Shared::queue`] inside the mapping, aligned as virtio requires, and each access is at
//! an offset below the area's size for the queue's `size`. The backend writes the used ring
//! and reads the rest concurrently: ring fields are read and written with atomics
//! (indices, with acquire/release) or volatile accesses. Buffers are reached only through
//! [`Shared::buffer`], which checks the range.

use crate::memory::Mapping;
pub use crate::vring::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering, fence};

const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Bytes reserved for one queue's three rings (up to 1024 descriptors).
const RING_AREA: usize = 64 << 10;
const MAX_SIZE: u16 = 1024;

/// Where a queue of `size` descriptors whose table starts at `desc` has its available and
/// used rings, as a driver lays them out: [descriptor table, available ring, used ring]
/// (the table 16-byte entries, the available ring right after it, the used ring after that,
/// 4-aligned).
pub fn layout(desc: u64, size: u16) -> [u64; 3] {
    let n = size as u64;
    let avail = desc + 16 * n;
    [desc, avail, (avail + 6 + 2 * n).next_multiple_of(4)]
}

/// A descriptor as the table holds it (little-endian): buffer address, length, flags, next.
pub fn desc_bytes(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..].copy_from_slice(&next.to_le_bytes());
    d
}

/// A used ring entry: (descriptor id, bytes written).
pub fn used_entry(e: [u8; 8]) -> (u32, u32) {
    (u32::from_le_bytes([e[0], e[1], e[2], e[3]]), u32::from_le_bytes([e[4], e[5], e[6], e[7]]))
}

/// Memory shared with the switch: the memfd (handed over in SET_MEM_TABLE) and its mapping.
/// Guest "physical" addresses are offsets into it; the frontend's own addresses (for
/// SET_VRING_ADDR) are the mapping's.
pub struct Shared {
    map: Arc<Mapping>,
    fd: OwnedFd,
}

impl Shared {
    /// `len` bytes, on hugepages when `huge` (rounded up to 2 MiB), else plain pages.
    pub fn new(len: usize, huge: bool) -> std::io::Result<Shared> {
        let (flags, len) = if huge {
            (libc::MFD_HUGETLB, len.next_multiple_of(2 << 20))
        } else {
            (0, len.next_multiple_of(4096))
        };
        // SAFETY: memfd_create with a static name; the descriptor is owned at once.
        let raw =
            unsafe { libc::memfd_create(c"knitter-perf".as_ptr(), libc::MFD_CLOEXEC | flags) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let map = Mapping::shared(fd.as_fd(), 0, len)?;
        Ok(Shared { map: Arc::new(map), fd })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The frontend address of guest address 0.
    pub fn user_base(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// The queue whose rings live in ring area `k` (areas start at offset 0, one
    /// [`RING_AREA`] each; buffers go after the last one the caller uses).
    pub fn queue(&self, k: usize, size: u16) -> Option<Queue> {
        if size == 0
            || size > MAX_SIZE
            || !size.is_power_of_two()
            || (k + 1) * RING_AREA > self.len()
        {
            return None;
        }
        let base = k * RING_AREA;
        let [desc, avail, used] = layout(base as u64, size).map(|a| a as usize);
        // SAFETY: the three areas end at `used + 6 + 8n` ≤ base + 16n + 2n + 10 + 8n, inside
        // the RING_AREA bytes at `base` (n ≤ 1024), inside the mapping (checked above).
        let at = |off: usize| unsafe { self.map.as_ptr().add(off) };
        let q = Queue {
            size,
            offsets: [desc as u64, avail as u64, used as u64],
            desc: at(desc),
            avail: at(avail),
            used: at(used),
            next_avail: 0,
            last_used: 0,
            seen_used: 0,
            bad_completions: 0,
            _map: self.map.clone(),
        };
        q.store16(q.avail, 0, VIRTQ_AVAIL_F_NO_INTERRUPT); // polled: no interrupts
        Some(q)
    }

    /// Where buffers may go: after the first `rings` ring areas.
    pub fn buffers_from(rings: usize) -> u64 {
        (rings * RING_AREA) as u64
    }

    /// `len` bytes at guest address `addr`; `None` outside the mapping.
    ///
    /// # Safety
    /// The memory is shared with the switch: the caller may hold the slice only while the
    /// switch does not touch those bytes (a buffer whose descriptor is not posted, or one the
    /// switch has returned in the used ring), and no other slice of them may be alive.
    #[allow(clippy::mut_from_ref)] // memory shared with the switch; see the module doc
    pub unsafe fn buffer(&self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let end = (addr as usize).checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: in bounds of the live mapping; bytes, so every value is valid; the bytes are
        // the caller's alone while the slice lives (the contract).
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(addr as usize), len) })
    }
}

/// One split virtqueue, driver side.
pub struct Queue {
    pub size: u16,
    /// Offsets (guest addresses) of the descriptor table, available and used rings.
    pub offsets: [u64; 3],
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    /// The next available index to publish.
    next_avail: u16,
    /// The used index up to which completions were taken ...
    last_used: u16,
    /// ... and the one last read from the ring.
    seen_used: u16,
    /// Completions that named no descriptor of this queue, or used indices more than a
    /// queue ahead (a switch bug; counted, ignored).
    pub bad_completions: u64,
    _map: Arc<Mapping>,
}

// SAFETY: the pointers are into the Arc'd mapping the queue keeps; one thread drives a
// queue at a time (`&mut self`).
unsafe impl Send for Queue {}

impl Queue {
    fn atomic16<'a>(area: *mut u8, off: usize) -> &'a AtomicU16 {
        // SAFETY: callers pass even offsets inside a ring area laid out by `Shared::queue`
        // (2-aligned); AtomicU16 has u16's layout; used at once, while the mapping lives.
        unsafe { &*(area.add(off) as *const AtomicU16) }
    }

    fn store16(&self, area: *mut u8, off: usize, v: u16) {
        Self::atomic16(area, off).store(v, Ordering::Release)
    }

    /// Sets descriptor `i` to one buffer (no chaining).
    pub fn set_desc(&mut self, i: u16, addr: u64, len: u32, flags: u16) {
        assert!(i < self.size, "descriptor {i} outside a queue of {}", self.size);
        let d = desc_bytes(addr, len, flags, 0);
        // SAFETY: i < size: the 16 bytes are inside the descriptor table.
        unsafe { std::ptr::write_volatile(self.desc.add(16 * i as usize) as *mut [u8; 16], d) };
    }

    /// Makes descriptor `head` available (visible at the next [`Queue::publish`]).
    #[inline]
    pub fn post(&mut self, head: u16) {
        let slot = (self.next_avail & (self.size - 1)) as usize;
        // SAFETY: slot < size: inside the available ring's entries.
        unsafe { std::ptr::write_volatile(self.avail.add(4 + 2 * slot) as *mut u16, head.to_le()) };
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publishes what was posted; true when the device asks to be kicked for it.
    #[inline]
    pub fn publish(&mut self) -> bool {
        self.store16(self.avail, 2, self.next_avail);
        // The index store before reading the device's wish (virtio's full barrier).
        fence(Ordering::SeqCst);
        Self::atomic16(self.used, 0).load(Ordering::Relaxed) & VIRTQ_USED_F_NO_NOTIFY == 0
    }

    /// Completions returned since the last call (the used index read once).
    #[inline]
    pub fn completed(&mut self) -> u16 {
        let idx = Self::atomic16(self.used, 2).load(Ordering::Acquire);
        let n = idx.wrapping_sub(self.last_used);
        if n > self.size {
            self.bad_completions += 1;
            return 0;
        }
        self.seen_used = idx;
        n
    }

    /// The next completion ([`Queue::completed`] said how many): descriptor and bytes
    /// written; `None` when the switch named a descriptor outside the queue (counted).
    #[inline]
    pub fn take_used(&mut self) -> Option<(u16, u32)> {
        debug_assert!(self.last_used != self.seen_used, "take_used past completed()");
        let slot = (self.last_used & (self.size - 1)) as usize;
        // SAFETY: slot < size: inside the used ring's entries (8-byte, 4-aligned).
        let e = unsafe { std::ptr::read_volatile(self.used.add(4 + 8 * slot) as *const [u8; 8]) };
        self.last_used = self.last_used.wrapping_add(1);
        let (id, len) = used_entry(e);
        if id >= self.size as u32 {
            self.bad_completions += 1;
            return None;
        }
        Some((id as u16, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_inside_their_area_and_completions_checked() {
        let m = Shared::new(1 << 20, false).unwrap();
        assert!(m.queue(0, 1000).is_none(), "not a power of two");
        assert!(m.queue(16, 256).is_none(), "past the memory");
        let mut q = m.queue(1, 1024).unwrap();
        let [d, a, u] = q.offsets;
        assert_eq!((d, a), (RING_AREA as u64, RING_AREA as u64 + 16 * 1024));
        assert!(u % 4 == 0 && u + 6 + 8 * 1024 <= 2 * RING_AREA as u64);
        q.set_desc(3, 0x1000, 64, 0);
        q.post(3);
        assert!(q.publish(), "the device has not asked for silence");
        // SAFETY: no device runs in this test; the queue reads these rings through raw
        // pointers only, and each slice is the only one of its bytes.
        let avail = unsafe { m.buffer(a, 6) }.unwrap();
        assert_eq!(&avail[..6], &[1, 0, 1, 0, 3, 0], "no interrupts, index 1, head 3");
        // The device completes head 3 and, wrongly, head 5000.
        // SAFETY: as above.
        let used = unsafe { m.buffer(u, 20) }.unwrap();
        used[4..12].copy_from_slice(&[3, 0, 0, 0, 64, 0, 0, 0]);
        used[12..20].copy_from_slice(&[0x88, 0x13, 0, 0, 0, 0, 0, 0]);
        used[2] = 2;
        assert_eq!(q.completed(), 2);
        assert_eq!(q.take_used(), Some((3, 64)));
        assert_eq!(q.take_used(), None);
        assert_eq!(q.bad_completions, 1);
        // A used index a queue and more ahead is ignored.
        used[2..4].copy_from_slice(&5000u16.to_le_bytes());
        assert_eq!(q.completed(), 0);
        assert_eq!(q.bad_completions, 2);
        // SAFETY: refused before any slice is made.
        let outside = unsafe { m.buffer(m.len() as u64 - 4, 8) };
        assert!(outside.is_none());
    }
}

//! A bounded lock-free single-producer single-consumer ring of buffer indices, with an
//! eventfd the producer writes when the consumer has said it is going to sleep.
//!
//! Single producer and single consumer are the types' promise, not the caller's: [`channel`]
//! makes one [`Producer`] and one [`Consumer`], neither of which can be cloned, and pushing
//! or popping takes `&mut` of its handle, so two threads can never push (or pop) at once
//! without a lock around the handle ([`crate::port::ring`] keeps a try-lock per side).
//!
//! ```compile_fail
//! // Two producers cannot be made: a handle is not Clone, and push needs `&mut`.
//! let (producer, _consumer) = vswitch::spsc::channel(8).unwrap();
//! let second = producer.clone();
//! ```
//! ```compile_fail
//! fn push_through_a_shared_reference(p: &vswitch::spsc::Producer) {
//!     p.push(&[1]);
//! }
//! ```
//!
//! Slots are plain memory copied in bulk (two `memcpy`s at most per
//! burst): the producer writes only slots in `[tail, head + size)`, the consumer reads only
//! slots in `[head, tail)`, and the release/acquire pair on `tail` (and on `head` for reuse)
//! orders those accesses, so the two sides never touch a slot at the same time. The wake protocol is Dekker-style: the consumer stores
//! `sleeping = true`, fences, and re-checks the ring before it sleeps; the producer publishes,
//! fences, and then reads `sleeping`. One of the two always sees the other, so no wake-up is lost.

use crate::sync::{AtomicBool, AtomicUsize, fence};
use slot::Slot;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering::*;

/// A slot: a plain cell copied in bulk, or under loom a tracked cell, so the models catch a
/// slot read while it is written.
#[cfg(not(loom))]
mod slot {
    pub(super) type Slot = std::cell::UnsafeCell<u32>;

    /// Writes `ids` into `slots[at..]`.
    ///
    /// # Safety
    /// `at + ids.len() <= slots.len()`, and no other thread touches those slots meanwhile.
    #[inline(always)]
    pub(super) unsafe fn write(slots: &[Slot], at: usize, ids: &[u32]) {
        // SAFETY: in bounds and unshared (the caller's promise); UnsafeCell<u32> has u32's
        // layout, so the slots are a contiguous run of u32s.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ids.as_ptr(),
                Slot::raw_get(slots.as_ptr()).add(at),
                ids.len(),
            )
        }
    }

    /// Reads `slots[at..at + out.len()]` into `out`.
    ///
    /// # Safety
    /// In bounds, and no other thread writes those slots meanwhile.
    #[inline(always)]
    pub(super) unsafe fn read(slots: &[Slot], at: usize, out: &mut [u32]) {
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                Slot::raw_get(slots.as_ptr()).add(at),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }
}

#[cfg(loom)]
mod slot {
    pub(super) type Slot = loom::cell::UnsafeCell<u32>;

    /// # Safety
    /// As the plain version's.
    pub(super) unsafe fn write(slots: &[Slot], at: usize, ids: &[u32]) {
        for (s, v) in slots[at..at + ids.len()].iter().zip(ids) {
            // SAFETY: unshared (the caller's promise; loom checks it).
            s.with_mut(|p| unsafe { *p = *v });
        }
    }

    /// # Safety
    /// As the plain version's.
    pub(super) unsafe fn read(slots: &[Slot], at: usize, out: &mut [u32]) {
        for (s, o) in slots[at..at + out.len()].iter().zip(out) {
            // SAFETY: as above.
            *o = s.with(|p| unsafe { *p });
        }
    }
}

#[repr(align(64))]
struct Padded<T>(T);

/// The ring both handles share: its length and the consumer's wake protocol are open to
/// anyone holding it; slots are reached only through [`Producer`] and [`Consumer`].
pub struct Spsc {
    slots: Box<[Slot]>,
    mask: usize,
    /// Next slot to read (consumer-owned).
    head: Padded<AtomicUsize>,
    /// Next slot to write (producer-owned).
    tail: Padded<AtomicUsize>,
    sleeping: Padded<AtomicBool>,
    wake: OwnedFd,
}

// SAFETY: slot access is partitioned between one producer and one consumer by the
// head/tail protocol described above, and only the one `Producer` (`&mut`) pushes and the
// one `Consumer` (`&mut`) pops; everything else is atomic.
unsafe impl Sync for Spsc {}

/// The one writer of a ring.
pub struct Producer(Arc<Spsc>);

/// The one reader of a ring.
pub struct Consumer(Arc<Spsc>);

/// A ring of `size` slots (rounded up to a power of two) and its two ends.
pub fn channel(size: usize) -> std::io::Result<(Producer, Consumer)> {
    let ring = Arc::new(Spsc::new(size)?);
    Ok((Producer(ring.clone()), Consumer(ring)))
}

impl Producer {
    /// Appends as many of `ids` as fit; returns how many.
    #[inline]
    pub fn push(&mut self, ids: &[u32]) -> usize {
        self.0.push(ids)
    }

    pub fn ring(&self) -> &Arc<Spsc> {
        &self.0
    }
}

impl Consumer {
    /// Takes up to `out.len()` indices; returns how many.
    #[inline]
    pub fn pop(&mut self, out: &mut [u32]) -> usize {
        self.0.pop(out)
    }

    pub fn ring(&self) -> &Arc<Spsc> {
        &self.0
    }
}

impl Spsc {
    fn new(size: usize) -> std::io::Result<Spsc> {
        let size = size.next_power_of_two().max(2);
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Spsc {
            slots: (0..size).map(|_| Slot::new(0)).collect(),
            mask: size - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            sleeping: Padded(AtomicBool::new(false)),
            // SAFETY: fd was just created and is owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    pub fn len(&self) -> usize {
        self.tail.0.load(Acquire).wrapping_sub(self.head.0.load(Acquire))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Only through the one [`Producer`] (see the `Sync` impl).
    #[inline]
    fn push(&self, ids: &[u32]) -> usize {
        let tail = self.tail.0.load(Relaxed);
        let head = self.head.0.load(Acquire);
        let n = ids.len().min(self.capacity() - tail.wrapping_sub(head));
        let at = tail & self.mask;
        let first = n.min(self.capacity() - at);
        // SAFETY: slots [tail, tail + n) are free (n <= size - (tail - head)), so the consumer
        // does not read them until the release store of `tail` below; `at + first` and
        // `n - first` stay within the slot array.
        unsafe {
            slot::write(&self.slots, at, &ids[..first]);
            slot::write(&self.slots, 0, &ids[first..n]);
        }
        if n > 0 {
            self.tail.0.store(tail.wrapping_add(n), Release);
            fence(SeqCst);
            if self.sleeping.0.load(Relaxed) {
                self.notify();
            }
        }
        n
    }

    /// Only through the one [`Consumer`] (see the `Sync` impl).
    #[inline]
    fn pop(&self, out: &mut [u32]) -> usize {
        let head = self.head.0.load(Relaxed);
        let tail = self.tail.0.load(Acquire);
        let n = out.len().min(tail.wrapping_sub(head));
        let at = head & self.mask;
        let first = n.min(self.capacity() - at);
        // SAFETY: slots [head, head + n) were published by the producer's release store of
        // `tail` (acquired above) and are not rewritten until our release store of `head`;
        // the ranges stay within the slot array.
        unsafe {
            let (a, b) = out[..n].split_at_mut(first);
            slot::read(&self.slots, at, a);
            slot::read(&self.slots, 0, b);
        }
        if n > 0 {
            self.head.0.store(head.wrapping_add(n), Release);
        }
        n
    }

    /// Consumer: says it will sleep (true) or is awake (false). When arming, returns whether
    /// the ring already has work (the caller must then not sleep).
    pub fn arm(&self, sleeping: bool) -> bool {
        self.sleeping.0.store(sleeping, Relaxed);
        if !sleeping {
            self.drain_wake();
            return false;
        }
        fence(SeqCst);
        !self.is_empty()
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our own eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain_wake(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a valid u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn fifo_and_bounds() {
        let (mut p, mut c) = channel(4).unwrap();
        assert_eq!(p.push(&[1, 2, 3, 4, 5]), 4);
        let mut out = [0; 3];
        assert_eq!(c.pop(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(p.push(&[6, 7]), 2);
        let mut out = [0; 8];
        assert_eq!(c.pop(&mut out), 3);
        assert_eq!(&out[..3], &[4, 6, 7]);
        assert!(c.ring().is_empty());
    }

    #[test]
    fn two_threads_keep_order() {
        let (mut p, mut r) = channel(64).unwrap();
        let t = std::thread::spawn(move || {
            let mut next = 0u32;
            while next < 100_000 {
                let ids: Vec<u32> = (next..next + 16).collect();
                next += p.push(&ids) as u32;
            }
        });
        let mut expect = 0u32;
        let mut out = [0u32; 32];
        while expect < 100_000 {
            let n = r.pop(&mut out);
            for v in &out[..n] {
                assert_eq!(*v, expect);
                expect += 1;
            }
        }
        t.join().unwrap();
    }

    #[test]
    fn armed_consumer_is_woken() {
        let (mut p, c) = channel(8).unwrap();
        let r = c.ring();
        assert!(!r.arm(true));
        p.push(&[1]);
        let mut pfd = libc::pollfd { fd: r.wake_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        assert_eq!(n, 1);
        r.arm(false);
        assert!(r.arm(true), "work pending: must not sleep");
    }
}

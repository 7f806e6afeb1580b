//! A batch of up to [`BATCH`] packets: the unit every port and pipeline stage works on.
//!
//! Fixed capacity, no heap: the slots are an array of owned [`BufId`]s, so moving packets in
//! and out never allocates. Slots at and beyond `len` own nothing (their contents are stale
//! and never read).

use crate::buf::BufId;

/// Packets per burst, as in DPDK and VPP.
pub const BATCH: usize = 32;

pub struct Batch {
    bufs: [BufId; BATCH],
    len: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch::new()
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Batch({} packets)", self.len)
    }
}

impl Batch {
    pub const fn new() -> Batch {
        Batch { bufs: [const { BufId::EMPTY }; BATCH], len: 0 }
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    pub fn is_full(&self) -> bool {
        self.len == BATCH
    }

    /// Free slots.
    #[inline(always)]
    pub fn room(&self) -> usize {
        BATCH - self.len
    }

    /// Adds a packet; gives it back when the batch is full.
    #[inline(always)]
    pub fn push(&mut self, b: BufId) -> Result<(), BufId> {
        // `>=`, not `==`: then the compiler knows the index below is in bounds.
        if self.len >= BATCH {
            return Err(b);
        }
        self.bufs[self.len] = b;
        self.len += 1;
        Ok(())
    }

    /// Moves as many of `other`'s packets as fit to the end of this batch, in order; the rest
    /// move to the front of `other`.
    #[inline(always)]
    pub fn append(&mut self, other: &mut Batch) {
        let n = other.len.min(self.room());
        // Swapping leaves this batch's stale free slots in `other`, past its new length.
        self.bufs[self.len..self.len + n].swap_with_slice(&mut other.bufs[..n]);
        self.len += n;
        other.consume_front(n);
    }

    /// Removes the last packet.
    #[inline(always)]
    pub fn pop(&mut self) -> Option<BufId> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(std::mem::replace(&mut self.bufs[self.len], BufId::EMPTY))
    }

    /// Takes packet `i` out, leaving an empty slot (see [`Batch::take_all`]).
    #[inline(always)]
    pub fn take(&mut self, i: usize) -> BufId {
        debug_assert!(i < self.len);
        std::mem::replace(&mut self.bufs[i & (BATCH - 1)], BufId::EMPTY)
    }

    /// Marks the batch empty after every packet was taken with [`Batch::take`].
    #[inline(always)]
    pub fn clear_taken(&mut self) {
        debug_assert!(self.bufs[..self.len].iter().all(|b| *b == BufId::EMPTY));
        self.len = 0;
    }

    /// Appends packets that `fill` writes as raw chunk indices into the free slots; `fill`
    /// returns how many it wrote.
    ///
    /// # Safety
    /// Every index written must come from [`BufId::into_index`] on a buffer of the pool this
    /// batch's packets belong to, and be used once (a port's ring hands them back).
    #[inline(always)]
    pub unsafe fn fill_raw(&mut self, fill: impl FnOnce(&mut [u32]) -> usize) -> usize {
        let free = &mut self.bufs[self.len..];
        // SAFETY: BufId is repr(transparent) over u32, so the slices have the same layout;
        // the slots are free (they own nothing), so overwriting them leaks nothing.
        let raw =
            unsafe { std::slice::from_raw_parts_mut(free.as_mut_ptr().cast::<u32>(), free.len()) };
        let n = fill(raw).min(raw.len());
        self.len += n;
        n
    }

    /// The packets as raw chunk indices (for a port that passes indices on).
    #[inline(always)]
    pub fn as_raw(&self) -> &[u32] {
        // SAFETY: BufId is repr(transparent) over u32.
        unsafe { std::slice::from_raw_parts(self.bufs.as_ptr().cast::<u32>(), self.len) }
    }

    /// Drops ownership of the first `n` packets, which a port has handed on as raw indices
    /// (see [`Batch::as_raw`]); the rest move to the front in order.
    #[inline(always)]
    pub fn handed_on(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == self.len {
            self.len = 0;
            return;
        }
        for i in n..self.len {
            self.bufs.swap(i - n, i);
        }
        self.len -= n;
    }

    /// The packets in order.
    #[inline(always)]
    pub fn as_slice(&self) -> &[BufId] {
        &self.bufs[..self.len]
    }

    #[inline(always)]
    pub fn as_mut_slice(&mut self) -> &mut [BufId] {
        &mut self.bufs[..self.len]
    }

    /// Removes the first `n` packets (those a port accepted), keeping the rest in order.
    #[inline]
    pub fn consume_front(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        for i in n..self.len {
            self.bufs.swap(i - n, i);
        }
        self.len -= n;
    }

    /// Keeps, in order, the packets `keep` says yes to; hands the others to `gone`.
    #[inline]
    pub fn retain(&mut self, mut keep: impl FnMut(&BufId) -> bool, mut gone: impl FnMut(BufId)) {
        let mut n = 0;
        for i in 0..self.len {
            let b = std::mem::replace(&mut self.bufs[i], BufId::EMPTY);
            if keep(&b) {
                self.bufs[n] = b;
                n += 1;
            } else {
                gone(b);
            }
        }
        self.len = n;
    }

    /// Moves every packet out, in order.
    pub fn drain(&mut self) -> impl Iterator<Item = BufId> + '_ {
        let n = std::mem::take(&mut self.len);
        self.bufs[..n].iter_mut().map(|b| std::mem::replace(b, BufId::EMPTY))
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // A batch dropped with packets in it leaks them from the pool: a bug in the caller.
        debug_assert!(
            self.len == 0 || std::thread::panicking(),
            "batch dropped holding {} packets",
            self.len
        );
    }
}

//! Packet buffers: a fixed pool of 2 KiB chunks in one [`Region`], handed out as owned
//! [`BufId`] handles, with per-thread caches, chains for jumbo frames and reference-counted
//! shared segments for flooding.
//!
//! Layout of a chunk: `[ headroom | data .. | tailroom ]`. Every fresh buffer starts its data
//! [`HEADROOM`] bytes in, so VLAN push and VXLAN encapsulation prepend in place and never
//! move a payload. Metadata (data offset, length, next segment, packet length, reference
//! count) lives in a separate array, so the region holds frame bytes only and can be an
//! AF_XDP UMEM.
//!
//! Ownership rules, which make the safe API sound:
//! - a `BufId` is not `Copy`/`Clone`; the pool creates one only for a chunk it took off the
//!   free list, so a `BufId` is the unique owner of its head segment and of every private
//!   segment chained behind it;
//! - a head can be turned into a [`SharedSeg`] (`into_shared`), which gives read access only;
//!   it can be linked behind many heads (`link_shared`), each link holding one reference.
//!   Shared segments are never written again and return to the pool with their last reference;
//! - therefore `&mut BufId` proves no other handle can read or write the head's bytes.
//!
//! Exhaustion is an `Option::None` to the caller, who counts it; nothing here allocates after
//! [`Pool::new`] or panics on the packet path.
//!
//! A **lent** packet (the single-copy vhost-user path) holds only its first bytes in its head
//! segment; the rest is still in the buffer a guest transmitted from, which the port lends
//! for one poll: see [`LentTail`] and [`PoolCache::alloc_lent`]. Pool code never reads a
//! lent tail except to copy it out ([`Pool::linearize`], [`Pool::read_frame`]); chains,
//! shared segments and kernel ports see only linearized packets.

use crate::region::{Backing, Region};
use crossbeam_queue::ArrayQueue;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Size of one chunk of the region.
pub const BUF_SIZE: usize = 2048;
/// Bytes kept free in front of fresh data: room for an outer IPv6 VXLAN header with a VLAN tag.
pub const HEADROOM: usize = 128;
/// Largest frame the switch accepts (jumbo), carried as a chain.
pub const MAX_FRAME: usize = 9216;
/// Per-thread cache size and the bulk size moved to and from the shared free list.
const CACHE_MAX: usize = 512;
const CACHE_BULK: usize = 128;
const NIL: u32 = u32::MAX;
/// `next` of a lent packet's head: its frame goes on in guest memory ([`LentTail`]). Never a
/// chunk index (a pool has at most `4 << 20` chunks), so walks stop at `idx >= LENT`.
const LENT: u32 = NIL - 1;
/// Where a lent packet's [`LentTail`] is kept: the last bytes of its head chunk, which its
/// head (at most [`LENT_HEAD_MAX`] bytes from [`HEADROOM`] on) never reaches.
const TAIL_AT: usize = BUF_SIZE - std::mem::size_of::<LentTail>();
/// The most a lent packet's head may hold.
pub const LENT_HEAD_MAX: usize = 256;

/// The rest of a lent packet's frame: `len` bytes at `ptr`, in a buffer a vhost-user guest
/// transmitted from and the port has not given back yet.
///
/// Invariant (kept by the port that lends, see [`PoolCache::alloc_lent`]): the bytes stay
/// mapped until the port's `rx_done` for the burst, which the pipeline calls after the
/// burst's `process` returned — by then every lent packet was sent (copied out), freed or
/// linearized. The guest may still write them (they are its memory): they are only ever
/// copied, with `copy_nonoverlapping`, never seen through a Rust reference.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct LentTail {
    pub ptr: *const u8,
    pub len: u32,
}

/// Errors creating a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("buffer pool size {0} is out of range (16 ..= 4194304 buffers)")]
    Size(u32),
    #[error("cannot map {bytes} bytes for the buffer pool: {source}")]
    Map { bytes: usize, source: std::io::Error },
}

/// The unique owner of one packet (its head segment and private chain).
#[derive(Debug, PartialEq, Eq)]
#[repr(transparent)]
#[must_use = "a buffer that is neither sent nor freed leaks from the pool"]
pub struct BufId(u32);

impl BufId {
    /// A placeholder that owns nothing, used to fill empty batch slots. Its index masks to
    /// the pool's last chunk, which is never handed out (see [`Pool::new`]): a placeholder
    /// used by mistake reads and writes a chunk no packet owns, and freeing it does nothing.
    pub const EMPTY: BufId = BufId(NIL);

    /// The chunk index, for ports that exchange buffers as indices (rings, UMEM descriptors).
    pub fn index(&self) -> u32 {
        self.0
    }

    /// Rebuilds a handle from an index produced by [`BufId::into_index`].
    ///
    /// # Safety
    /// `idx` must come from `into_index` of a handle of the same pool, and be used once.
    pub unsafe fn from_index(idx: u32) -> BufId {
        BufId(idx)
    }

    /// Gives up the handle as a bare index (for passing through a ring).
    pub fn into_index(self) -> u32 {
        self.0
    }
}

/// The pool's layout (metadata array, region base, index mask) by value. A burst loop that
/// also stores to memory keeps these in registers, where a `&Pool` would be re-read after
/// every store the compiler cannot prove unrelated. Reads anyone may do; the writes it has
/// take the packet's `&mut BufId`, as `Pool`'s do.
#[derive(Clone, Copy)]
pub struct PoolView<'a> {
    meta: &'a [Meta],
    region: *mut u8,
    mask: u32,
}

impl<'a> PoolView<'a> {
    #[inline(always)]
    fn m(self, idx: u32) -> &'a Meta {
        debug_assert!(idx != NIL);
        // SAFETY: `meta.len() == mask + 1`, so the masked index is in bounds.
        unsafe { self.meta.get_unchecked((idx & self.mask) as usize) }
    }

    #[inline(always)]
    fn chunk(self, idx: u32) -> *mut u8 {
        // SAFETY: the region holds `mask + 1` chunks of BUF_SIZE bytes, so the masked offset
        // stays inside it.
        unsafe { self.region.add((idx & self.mask) as usize * BUF_SIZE) }
    }

    #[inline(always)]
    fn seg(self, idx: u32) -> &'a [u8] {
        let m = self.m(idx);
        let (off, len) = (m.off.load(Relaxed) as usize, m.len.load(Relaxed) as usize);
        debug_assert!(off + len <= BUF_SIZE);
        // SAFETY: off + len <= BUF_SIZE is kept by every writer of off/len in `Pool`; readers
        // of a segment are its unique owner or holders of a shared (immutable) reference.
        unsafe { std::slice::from_raw_parts(self.chunk(idx).add(off), len) }
    }

    /// As [`Pool::head_mut`].
    #[inline(always)]
    pub fn head_mut<'b>(self, b: &'b mut BufId) -> &'b mut [u8]
    where
        'a: 'b,
    {
        let m = self.m(b.0);
        debug_assert_eq!(m.refcnt.load(Relaxed), 1, "a head segment is never shared");
        let (off, len) = (m.off.load(Relaxed) as usize, m.len.load(Relaxed) as usize);
        // SAFETY: as in `seg`, and the chunk is exclusively owned through `b`.
        unsafe { std::slice::from_raw_parts_mut(self.chunk(b.0).add(off), len) }
    }

    /// As [`Pool::strip`] (the owner `b` may write its metadata through a view).
    #[inline(always)]
    pub fn strip(self, b: &mut BufId, n: usize) -> bool {
        let m = self.m(b.0);
        let len = m.len.load(Relaxed) as usize;
        if n > len {
            return false;
        }
        m.off.store(m.off.load(Relaxed) + n as u16, Relaxed);
        m.len.store((len - n) as u16, Relaxed);
        m.pkt_len.store(m.pkt_len.load(Relaxed) - n as u32, Relaxed);
        true
    }

    /// As [`Pool::truncate`].
    pub fn truncate(self, b: &mut BufId, len: usize) -> bool {
        let m = self.m(b.0);
        if m.next.load(Relaxed) != NIL || len >= m.len.load(Relaxed) as usize {
            return false;
        }
        m.len.store(len as u16, Relaxed);
        m.pkt_len.store(len as u32, Relaxed);
        true
    }

    /// [`PoolView::truncate`] of a lent packet: its tail shortens, or goes when `len` ends
    /// inside the head.
    #[cold]
    #[inline(never)]
    fn truncate_lent(self, b: &mut BufId, len: usize) -> bool {
        let m = self.m(b.0);
        let (head, total) = (m.len.load(Relaxed) as usize, m.pkt_len.load(Relaxed) as usize);
        if len >= total {
            return false;
        }
        if len <= head {
            m.len.store(len as u16, Relaxed);
            m.next.store(NIL, Relaxed);
        } else {
            let mut t = self.lent_tail(b.0);
            t.len = (len - head) as u32;
            self.set_lent_tail(b.0, t);
        }
        m.pkt_len.store(len as u32, Relaxed);
        true
    }

    /// The tail descriptor kept in lent head `idx`'s chunk.
    fn lent_tail(self, idx: u32) -> LentTail {
        // SAFETY: TAIL_AT + size_of::<LentTail>() == BUF_SIZE: inside the chunk; written by
        // `set_lent_tail` when the packet was lent (read unaligned: a chunk is only 2 KiB
        // aligned, which is enough, but the compiler need not know).
        unsafe { self.chunk(idx).add(TAIL_AT).cast::<LentTail>().read_unaligned() }
    }

    fn set_lent_tail(self, idx: u32, t: LentTail) {
        // SAFETY: as in `lent_tail`; the caller owns the chunk.
        unsafe { self.chunk(idx).add(TAIL_AT).cast::<LentTail>().write_unaligned(t) }
    }

    /// As [`Pool::head_and_len`].
    #[inline(always)]
    pub fn head_and_len<'b>(self, b: &'b BufId) -> (&'b [u8], usize)
    where
        'a: 'b,
    {
        (self.seg(b.0), self.m(b.0).pkt_len.load(Relaxed) as usize)
    }
}

/// A read-only segment shared by several packets (one reference per link, one for its maker).
#[derive(Debug)]
#[must_use = "release the maker's reference with PoolCache::release_shared"]
pub struct SharedSeg(u32);

/// A chunk's metadata. Only the reference count is atomic: the other fields are written only
/// by the chunk's unique owner (a `BufId`, or the pool while the chunk is free) and read by its
/// owner or, once shared, by holders of a reference while nobody writes (see [`Owned`]).
#[derive(Default)]
struct Meta {
    off: Owned<u16>,
    len: Owned<u16>,
    next: Owned<u32>,
    pkt_len: Owned<u32>,
    refcnt: AtomicU32,
}

/// A metadata field that the ownership rules of this module keep free of data races: one
/// thread writes it while it owns the chunk; ownership moves between threads only through
/// synchronizing hand-offs (the free list, SPSC rings, AF_XDP rings with release/acquire
/// indices, the reference count's `AcqRel` decrement). A plain cell rather than an atomic,
/// so the compiler may keep a value it just read or wrote in a register (atomic loads are
/// never merged, which cost every packet several reloads). The `Ordering` arguments mirror
/// the atomic API and are ignored.
#[derive(Default)]
struct Owned<T>(std::cell::UnsafeCell<T>);

// SAFETY: see the type's documentation: no two threads access one field at the same time
// unless both only read it.
unsafe impl<T: Send> Sync for Owned<T> {}

impl<T: Copy> Owned<T> {
    #[inline(always)]
    fn load(&self, _: std::sync::atomic::Ordering) -> T {
        // SAFETY: no concurrent writer (see the type's documentation).
        unsafe { *self.0.get() }
    }

    #[inline(always)]
    fn store(&self, v: T, _: std::sync::atomic::Ordering) {
        // SAFETY: the caller owns the chunk, so no other thread reads or writes this field.
        unsafe { *self.0.get() = v }
    }
}

/// The pool: the region, its metadata, and the shared free list.
pub struct Pool {
    region: Region,
    /// One entry per chunk; the length is a power of two and every index is masked with
    /// `mask`, so no index (not even a forged or `EMPTY` one) can reach outside the arrays.
    meta: Box<[Meta]>,
    mask: u32,
    free: ArrayQueue<u32>,
    alloc_failures: AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("capacity", &self.capacity())
            .field("backing", &self.region.backing())
            .finish()
    }
}

impl Pool {
    /// Maps `n` buffers, rounded up to a power of two (hugepage-backed when `try_huge` and
    /// available), and logs the backing. One of them is kept back for [`BufId::EMPTY`].
    pub fn new(n: u32, try_huge: bool) -> Result<Arc<Pool>, PoolError> {
        if !(16..=4 << 20).contains(&n) {
            return Err(PoolError::Size(n));
        }
        let n = n.next_power_of_two();
        let bytes = n as usize * BUF_SIZE;
        let region =
            Region::new(bytes, try_huge).map_err(|source| PoolError::Map { bytes, source })?;
        tracing::info!(buffers = n, bytes, backing = %region.backing(), "packet buffer pool mapped");
        // The last chunk stays out of the free list: it is where `BufId::EMPTY` (and any
        // index masked like it) lands, so no packet may own it.
        let free = ArrayQueue::new(n as usize - 1);
        for i in 0..n - 1 {
            let _ = free.push(i);
        }
        let meta = (0..n).map(|_| Meta::default()).collect();
        Ok(Arc::new(Pool { region, meta, mask: n - 1, free, alloc_failures: AtomicU64::new(0) }))
    }

    /// Buffers packets can own: one less than the chunks mapped (the last is the
    /// placeholder's, see [`BufId::EMPTY`]).
    pub fn capacity(&self) -> u32 {
        self.meta.len() as u32 - 1
    }

    pub fn backing(&self) -> Backing {
        self.region.backing()
    }

    /// Buffers on the shared free list (per-thread caches not included).
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Allocation attempts that found the pool empty.
    pub fn alloc_failures(&self) -> u64 {
        self.alloc_failures.load(Relaxed)
    }

    /// Base address and length of the region (for registering it as an AF_XDP UMEM).
    pub fn region(&self) -> (*mut u8, usize) {
        (self.region.as_ptr(), self.region.len())
    }

    /// The pool's layout as a copyable value, for burst loops (see [`PoolView`]).
    #[inline(always)]
    pub fn view(&self) -> PoolView<'_> {
        PoolView { meta: &self.meta, region: self.region.as_ptr(), mask: self.mask }
    }

    #[inline(always)]
    fn m(&self, idx: u32) -> &Meta {
        self.view().m(idx)
    }

    #[inline(always)]
    fn chunk(&self, idx: u32) -> *mut u8 {
        self.view().chunk(idx)
    }

    /// Data of the head segment.
    #[inline(always)]
    pub fn head<'a>(&'a self, b: &'a BufId) -> &'a [u8] {
        self.seg(b.0)
    }

    #[inline(always)]
    fn seg(&self, idx: u32) -> &[u8] {
        self.view().seg(idx)
    }

    /// Mutable data of the head segment; `&mut BufId` proves exclusive ownership.
    #[inline(always)]
    pub fn head_mut<'a>(&'a self, b: &'a mut BufId) -> &'a mut [u8] {
        self.view().head_mut(b)
    }

    /// Data of the head segment and the total length of the packet, from one metadata read.
    #[inline(always)]
    pub fn head_and_len<'a>(&'a self, b: &'a BufId) -> (&'a [u8], usize) {
        self.view().head_and_len(b)
    }

    /// Total length of the packet (all segments).
    #[inline(always)]
    pub fn pkt_len(&self, b: &BufId) -> usize {
        self.m(b.0).pkt_len.load(Relaxed) as usize
    }

    /// Whether the packet has more than its head segment (more segments, or a lent tail).
    #[inline(always)]
    pub fn is_chained(&self, b: &BufId) -> bool {
        self.m(b.0).next.load(Relaxed) != NIL
    }

    /// The guest bytes a lent packet's frame goes on with, `None` for every other packet.
    #[inline(always)]
    pub fn lent_tail(&self, b: &BufId) -> Option<LentTail> {
        (self.m(b.0).next.load(Relaxed) == LENT).then(|| self.view().lent_tail(b.0))
    }

    /// Copies a lent packet's tail into pool buffers (the head's chunk when it fits, else a
    /// chain behind it): the packet no longer depends on the guest. `false` when the pool ran
    /// dry (the packet is unchanged, still lent: the caller drops it). Nothing to do for
    /// other packets.
    pub fn linearize(&self, b: &mut BufId, cache: &mut PoolCache) -> bool {
        let Some(t) = self.lent_tail(b) else { return true };
        let m = self.m(b.0);
        let (off, len) = (m.off.load(Relaxed) as usize, m.len.load(Relaxed) as usize);
        let n = t.len as usize;
        if off + len + n <= BUF_SIZE {
            // SAFETY: `t` is readable for `n` bytes (the lending invariant, see `LentTail`);
            // the destination is inside chunk `b`, owned through `&mut BufId`; guest memory
            // and the pool never overlap.
            unsafe { std::ptr::copy_nonoverlapping(t.ptr, self.chunk(b.0).add(off + len), n) };
            m.len.store((len + n) as u16, Relaxed);
            m.next.store(NIL, Relaxed);
            return true;
        }
        let mut at = 0;
        let Some(rest) = cache.alloc_filled(n, |dst| {
            // SAFETY: as above; `fill` is called with consecutive pieces that add up to `n`,
            // so `at + dst.len() <= n`.
            unsafe { std::ptr::copy_nonoverlapping(t.ptr.add(at), dst.as_mut_ptr(), dst.len()) };
            at += dst.len();
        }) else {
            return false;
        };
        // The head's length already counts the tail; the tail's first segment keeps a
        // headroom it does not need (harmless).
        m.next.store(rest.into_index(), Relaxed);
        true
    }

    /// Free bytes in front of the head's data.
    #[inline(always)]
    pub fn headroom(&self, b: &BufId) -> usize {
        self.m(b.0).off.load(Relaxed) as usize
    }

    /// Grows the head segment `n` bytes to the front and returns the new head data,
    /// or `None` when the headroom is too small.
    #[inline(always)]
    pub fn prepend<'a>(&'a self, b: &'a mut BufId, n: usize) -> Option<&'a mut [u8]> {
        self.prepend_counted(b, n).map(|(h, _)| h)
    }

    /// [`Pool::prepend`], also returning the packet's length before it grew (one metadata
    /// read for both).
    #[inline(always)]
    pub fn prepend_counted<'a>(
        &'a self,
        b: &'a mut BufId,
        n: usize,
    ) -> Option<(&'a mut [u8], usize)> {
        let m = self.m(b.0);
        let off = m.off.load(Relaxed) as usize;
        if n > off {
            return None;
        }
        let (off, len, pkt_len) =
            (off - n, m.len.load(Relaxed) as usize + n, m.pkt_len.load(Relaxed));
        // The chunk's address before the stores below, which the compiler cannot tell from
        // the pool's own fields (it would load those again).
        let chunk = self.chunk(b.0);
        m.off.store(off as u16, Relaxed);
        m.len.store(len as u16, Relaxed);
        m.pkt_len.store(pkt_len + n as u32, Relaxed);
        // SAFETY: the new segment [off, off + len) is the old one grown into its headroom, so
        // it stays inside the chunk; `b` (borrowed mutably) owns it.
        Some((unsafe { std::slice::from_raw_parts_mut(chunk.add(off), len) }, pkt_len as usize))
    }

    /// Removes `n` bytes from the front of the head segment; false if it is shorter.
    #[inline(always)]
    pub fn strip(&self, b: &mut BufId, n: usize) -> bool {
        self.view().strip(b, n)
    }

    /// Shortens a single-segment packet to `len` bytes (drops trailing padding), or a lent
    /// one (its tail shortens or goes); false for chained packets or when `len` is not
    /// shorter. ([`PoolView::truncate`], on the decapsulation path, leaves lent packets
    /// as chained ones: whole.)
    pub fn truncate(&self, b: &mut BufId, len: usize) -> bool {
        if self.m(b.0).next.load(Relaxed) == LENT {
            return self.view().truncate_lent(b, len);
        }
        self.view().truncate(b, len)
    }

    /// Appends bytes to the head segment's tailroom (unchained packets being built only).
    pub fn append(&self, b: &mut BufId, data: &[u8]) -> bool {
        let m = self.m(b.0);
        let (off, len) = (m.off.load(Relaxed) as usize, m.len.load(Relaxed) as usize);
        if off + len + data.len() > BUF_SIZE || m.next.load(Relaxed) != NIL {
            return false;
        }
        // SAFETY: bounds checked just above; exclusive through `&mut BufId`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.chunk(b.0).add(off + len),
                data.len(),
            );
        }
        m.len.store((len + data.len()) as u16, Relaxed);
        m.pkt_len.store(m.pkt_len.load(Relaxed) + data.len() as u32, Relaxed);
        true
    }

    /// Offset of the head segment's data in the region, and its length (for a port that
    /// hands the buffer to the kernel by address, as an AF_XDP UMEM descriptor).
    pub fn head_addr(&self, b: &BufId) -> (u64, usize) {
        let m = self.m(b.0);
        let base = ((b.0 & self.mask) as usize * BUF_SIZE) as u64;
        (base + m.off.load(Relaxed) as u64, m.len.load(Relaxed) as usize)
    }

    /// Takes back a buffer the kernel filled: chunk `idx` now holds `len` bytes at `off`.
    /// A range that does not fit the chunk is `Err` with the buffer (empty), which the
    /// caller frees: the chunk comes back to the pool either way.
    ///
    /// # Safety
    /// `idx` must come from `BufId::into_index` or [`PoolCache::alloc_index`] of this pool
    /// (given to the kernel or a device) and be claimed once.
    pub unsafe fn claim_filled(&self, idx: u32, off: usize, len: usize) -> Result<BufId, BufId> {
        let fits = off.checked_add(len).is_some_and(|end| end <= BUF_SIZE);
        let (off, len) = if fits { (off, len) } else { (HEADROOM, 0) };
        let m = self.m(idx);
        m.off.store(off as u16, Relaxed);
        m.len.store(len as u16, Relaxed);
        m.pkt_len.store(len as u32, Relaxed);
        m.next.store(NIL, Relaxed);
        m.refcnt.store(1, Relaxed);
        if fits { Ok(BufId(idx)) } else { Err(BufId(idx)) }
    }

    /// Iterates over the data of every segment, head first. A lent packet must be
    /// [linearized](Pool::linearize) first (its tail is not in the pool).
    pub fn segments<'a>(&'a self, b: &'a BufId) -> Segments<'a> {
        debug_assert!(self.lent_tail(b).is_none(), "segments of a lent packet: linearize it first");
        Segments { pool: self, idx: b.0 }
    }

    /// Calls `f` with the packet's bytes in order, a piece at a time: each segment, then a
    /// lent tail through a bounce buffer (it is guest memory, only ever copied).
    pub fn each_piece(&self, b: &BufId, mut f: impl FnMut(&[u8])) {
        let mut i = b.0;
        while i < LENT {
            f(self.seg(i));
            i = self.m(i).next.load(Relaxed);
        }
        if let Some(t) = self.lent_tail(b) {
            let mut bounce = [0u8; 256];
            let mut at = 0;
            while at < t.len as usize {
                let n = (t.len as usize - at).min(bounce.len());
                // SAFETY: the lending invariant (see `LentTail`): `at + n <= t.len`.
                unsafe { std::ptr::copy_nonoverlapping(t.ptr.add(at), bounce.as_mut_ptr(), n) };
                f(&bounce[..n]);
                at += n;
            }
        }
    }

    /// Copies the whole packet into `out` (tests, slow paths).
    pub fn read_frame(&self, b: &BufId, out: &mut Vec<u8>) {
        out.clear();
        self.each_piece(b, |p| out.extend_from_slice(p));
    }

    /// Makes a head into a read-only shared segment, holding one reference for the caller
    /// (not a lent one: [linearize](Pool::linearize) it first).
    pub fn into_shared(&self, b: BufId) -> SharedSeg {
        debug_assert!(self.lent_tail(&b).is_none(), "a lent packet cannot be shared");
        SharedSeg(b.into_index())
    }

    /// Links `s` behind the single-segment packet `head` (one more reference on `s`).
    pub fn link_shared(&self, head: &mut BufId, s: &SharedSeg) {
        let h = self.m(head.0);
        debug_assert_eq!(h.next.load(Relaxed), NIL);
        self.m(s.0).refcnt.fetch_add(1, Relaxed);
        h.next.store(s.0, Relaxed);
        let total = h.len.load(Relaxed) as u32 + self.m(s.0).pkt_len.load(Relaxed);
        h.pkt_len.store(total, Relaxed);
    }
}

/// A packet built a segment at a time (a port receiving a frame in several buffers, as
/// multi-buffer AF_XDP delivers jumbo frames).
pub struct Chain {
    head: BufId,
    tail: u32,
}

impl Chain {
    pub fn new(head: BufId) -> Chain {
        let tail = head.0;
        Chain { head, tail }
    }

    /// Appends the packet `seg` (a lone buffer, as ports append, or a chain of its own).
    pub fn push(&mut self, pool: &Pool, seg: BufId) {
        let add = pool.m(seg.0).pkt_len.load(Relaxed);
        let idx = seg.into_index();
        pool.m(self.tail).next.store(idx, Relaxed);
        let mut tail = idx;
        while let next = pool.m(tail).next.load(Relaxed)
            && next < LENT
        {
            tail = next;
        }
        let h = pool.m(self.head.0);
        h.pkt_len.store(h.pkt_len.load(Relaxed) + add, Relaxed);
        self.tail = tail;
    }

    pub fn finish(self) -> BufId {
        self.head
    }
}

impl Pool {
    /// Splits a packet into its segments as lone buffers (a port handing each to a device
    /// that takes a frame in pieces), when no segment is shared with another packet and
    /// there are at most `out.len()`: how many were written to `out`; otherwise the packet
    /// comes back whole.
    pub fn split(&self, head: BufId, out: &mut [BufId]) -> Result<usize, BufId> {
        debug_assert!(
            self.lent_tail(&head).is_none(),
            "split of a lent packet: linearize it first"
        );
        let (mut n, mut i) = (0, head.0);
        while i < LENT {
            if n == out.len() || self.m(i).refcnt.load(Acquire) != 1 {
                return Err(head);
            }
            n += 1;
            i = self.m(i).next.load(Relaxed);
        }
        let mut i = head.into_index();
        for slot in out.iter_mut().take(n) {
            let m = self.m(i);
            let next = m.next.load(Relaxed);
            m.next.store(NIL, Relaxed);
            m.pkt_len.store(m.len.load(Relaxed) as u32, Relaxed);
            *slot = BufId(i);
            i = next;
        }
        Ok(n)
    }
}

/// Iterator over a packet's segments.
pub struct Segments<'a> {
    pool: &'a Pool,
    idx: u32,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.idx >= LENT {
            return None;
        }
        let s = self.pool.seg(self.idx);
        self.idx = self.pool.m(self.idx).next.load(Relaxed);
        Some(s)
    }
}

/// A thread's cache of free buffers in front of the shared free list.
pub struct PoolCache {
    pool: Arc<Pool>,
    stack: Vec<u32>,
    /// Packets were lent this burst ([`PoolCache::alloc_lent`]).
    lending: bool,
}

impl PoolCache {
    pub fn new(pool: Arc<Pool>) -> PoolCache {
        PoolCache { pool, stack: Vec::with_capacity(CACHE_MAX), lending: false }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// A fresh empty buffer with [`HEADROOM`] in front, or `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&mut self) -> Option<BufId> {
        let idx = match self.stack.pop() {
            Some(i) => i,
            None => self.refill()?,
        };
        let m = self.pool.m(idx);
        m.off.store(HEADROOM as u16, Relaxed);
        m.len.store(0, Relaxed);
        m.next.store(NIL, Relaxed);
        m.pkt_len.store(0, Relaxed);
        m.refcnt.store(1, Relaxed);
        Some(BufId(idx))
    }

    #[cold]
    fn refill(&mut self) -> Option<u32> {
        while self.stack.len() < CACHE_BULK {
            match self.pool.free.pop() {
                Some(i) => self.stack.push(i),
                None => break,
            }
        }
        let got = self.stack.pop();
        if got.is_none() {
            self.pool.alloc_failures.fetch_add(1, Relaxed);
        }
        got
    }

    /// Copies `frame` into a new packet, chained over several buffers when longer than one.
    #[inline]
    pub fn alloc_frame(&mut self, frame: &[u8]) -> Option<BufId> {
        let mut at = 0;
        self.alloc_filled(frame.len(), |dst| {
            dst.copy_from_slice(&frame[at..at + dst.len()]);
            at += dst.len();
        })
    }

    /// Copies the concatenation of `parts` into a new packet, filling each buffer before
    /// chaining the next (a port that must insert bytes, such as a VLAN tag, builds the frame
    /// this way without a temporary copy).
    pub fn alloc_gather(&mut self, parts: &[&[u8]]) -> Option<BufId> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let (mut parts, mut cur): (_, &[u8]) = (parts.iter(), &[]);
        self.alloc_filled(total, |mut dst| {
            while !dst.is_empty() {
                while cur.is_empty() {
                    let Some(next) = parts.next() else { return };
                    cur = next;
                }
                let n = dst.len().min(cur.len());
                dst[..n].copy_from_slice(&cur[..n]);
                (dst, cur) = (&mut dst[n..], &cur[n..]);
            }
        })
    }

    /// A new packet of `len` bytes (chained over several buffers when longer than one) whose
    /// bytes `fill` writes, in order, one buffer's part at a time: for sources that are not
    /// one Rust slice (parts to gather; guest memory, which is only ever copied). `None` when
    /// `len` is over [`MAX_FRAME`] or the pool runs dry.
    #[inline(always)]
    pub fn alloc_filled(&mut self, len: usize, mut fill: impl FnMut(&mut [u8])) -> Option<BufId> {
        // The common case, a frame that fits one buffer behind its headroom: one call.
        if len <= BUF_SIZE - HEADROOM {
            let b = self.alloc()?;
            let m = self.pool.m(b.0);
            // SAFETY: HEADROOM + len <= BUF_SIZE inside chunk `b`, which we own and no other
            // handle reaches yet.
            fill(unsafe {
                std::slice::from_raw_parts_mut(self.pool.chunk(b.0).add(HEADROOM), len)
            });
            m.len.store(len as u16, Relaxed);
            m.pkt_len.store(len as u32, Relaxed);
            return Some(b);
        }
        self.alloc_chained(len, fill)
    }

    /// [`PoolCache::alloc_filled`] for a packet longer than one buffer.
    #[cold]
    #[inline(never)]
    fn alloc_chained(&mut self, len: usize, mut fill: impl FnMut(&mut [u8])) -> Option<BufId> {
        if len > MAX_FRAME {
            return None;
        }
        let head = self.alloc()?;
        let (mut cur, mut rest) = (head.0, len);
        loop {
            let m = self.pool.m(cur);
            let used = m.off.load(Relaxed) as usize + m.len.load(Relaxed) as usize;
            let n = rest.min(BUF_SIZE - used);
            // SAFETY: `used + n <= BUF_SIZE` within chunk `cur`, which this packet owns and no
            // other handle reaches yet.
            fill(unsafe { std::slice::from_raw_parts_mut(self.pool.chunk(cur).add(used), n) });
            m.len.store(m.len.load(Relaxed) + n as u16, Relaxed);
            rest -= n;
            if rest == 0 {
                break;
            }
            let Some(seg) = self.alloc() else {
                self.free(head);
                return None;
            };
            // Continuation segments need no headroom.
            self.pool.m(seg.0).off.store(0, Relaxed);
            self.pool.m(cur).next.store(seg.0, Relaxed);
            cur = seg.into_index();
        }
        self.pool.m(head.0).pkt_len.store(len as u32, Relaxed);
        Some(head)
    }

    /// A lent packet: a head of `head_len` bytes (at most [`LENT_HEAD_MAX`]) that `fill`
    /// writes, followed by `tail`, which stays in guest memory. The cache remembers that it
    /// lent ([`PoolCache::lending`]) until [`PoolCache::end_lending`].
    ///
    /// # Safety
    /// `tail.ptr` must be readable for `tail.len` bytes until the lending port's `rx_done`
    /// for this burst (see [`LentTail`]); the caller's pipeline calls it once the burst is
    /// processed, when no lent packet is left.
    #[inline]
    pub unsafe fn alloc_lent(
        &mut self,
        head_len: usize,
        fill: impl FnOnce(&mut [u8]),
        tail: LentTail,
    ) -> Option<BufId> {
        if head_len > LENT_HEAD_MAX || head_len + tail.len as usize > MAX_FRAME {
            return None;
        }
        let b = self.alloc()?;
        let view = self.pool.view();
        let m = self.pool.m(b.0);
        // SAFETY: HEADROOM + head_len <= HEADROOM + LENT_HEAD_MAX < TAIL_AT inside chunk
        // `b`, which we own and no other handle reaches yet.
        fill(unsafe {
            std::slice::from_raw_parts_mut(self.pool.chunk(b.0).add(HEADROOM), head_len)
        });
        m.len.store(head_len as u16, Relaxed);
        m.pkt_len.store((head_len + tail.len as usize) as u32, Relaxed);
        m.next.store(LENT, Relaxed);
        view.set_lent_tail(b.0, tail);
        self.lending = true;
        Some(b)
    }

    /// Whether packets were lent since [`PoolCache::end_lending`].
    #[inline(always)]
    pub fn lending(&self) -> bool {
        self.lending
    }

    /// The lending port got its buffers back: no lent packet is left.
    #[inline(always)]
    pub fn end_lending(&mut self) {
        self.lending = false;
    }

    /// Builds one packet from several pieces, one segment each (as a port receiving a
    /// descriptor chain would); `None` if a piece is too large or the pool runs dry.
    pub fn alloc_chain(&mut self, pieces: &[&[u8]]) -> Option<BufId> {
        let (first, rest) = pieces.split_first()?;
        let mut head = self.alloc()?;
        let mut total = first.len();
        if !self.pool.append(&mut head, first) {
            self.free(head);
            return None;
        }
        let mut tail = head.0;
        for p in rest {
            let Some(mut seg) = self.alloc() else {
                self.free(head);
                return None;
            };
            self.pool.m(seg.0).off.store(0, Relaxed);
            let ok = self.pool.append(&mut seg, p);
            self.pool.m(tail).next.store(seg.0, Relaxed);
            tail = seg.into_index();
            if !ok {
                self.free(head);
                return None;
            }
            total += p.len();
        }
        self.pool.m(head.0).pkt_len.store(total as u32, Relaxed);
        Some(head)
    }

    /// Returns a packet to the pool: private segments at once, shared ones with their last
    /// reference.
    #[inline]
    pub fn free(&mut self, b: BufId) {
        self.release(b.into_index());
    }

    /// A free chunk's index, its metadata left as it was: for a port that lends chunks bare
    /// to a device (a packet is made of one by [`Pool::claim_filled`]).
    #[inline]
    pub fn alloc_index(&mut self) -> Option<u32> {
        match self.stack.pop() {
            Some(i) => Some(i),
            None => self.refill(),
        }
    }

    /// Gives back a chunk no packet is made of: one from [`PoolCache::alloc_index`], or a
    /// packet's given up with [`BufId::into_index`] (its metadata is not read: what was
    /// chained to it is not freed).
    ///
    /// # Safety
    /// `idx` is a chunk of this pool that no `BufId`, shared segment or device refers to any
    /// more, given back once.
    #[inline]
    pub unsafe fn free_index(&mut self, idx: u32) {
        if self.stack.len() == CACHE_MAX {
            self.spill();
        }
        self.stack.push(idx);
    }

    /// Drops the maker's reference on a shared segment.
    pub fn release_shared(&mut self, s: SharedSeg) {
        self.release(s.0);
    }

    #[inline]
    fn release(&mut self, mut idx: u32) {
        // A lent packet's walk ends at its head: its tail is the guest's.
        while idx < LENT {
            let m = self.pool.m(idx);
            // The common case (sole owner) needs no atomic read-modify-write.
            if m.refcnt.load(Acquire) != 1 && m.refcnt.fetch_sub(1, AcqRel) != 1 {
                return; // still referenced by another packet, which owns the rest of the chain
            }
            let next = m.next.load(Relaxed);
            if self.stack.len() == CACHE_MAX {
                self.spill();
            }
            self.stack.push(idx);
            idx = next;
        }
    }

    #[cold]
    fn spill(&mut self) {
        for _ in 0..CACHE_BULK {
            if let Some(i) = self.stack.pop() {
                let _ = self.pool.free.push(i);
            }
        }
    }

    /// Returns every cached buffer to the shared free list.
    pub fn flush(&mut self) {
        for i in self.stack.drain(..) {
            let _ = self.pool.free.push(i);
        }
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn pool(n: u32) -> Arc<Pool> {
        Pool::new(n, false).unwrap()
    }

    /// A frame of `len` bytes (each byte its offset, mod 251) lent from `guest`: its first
    /// `head` bytes copied, the rest left there.
    fn lend(c: &mut PoolCache, guest: &[u8], head: usize) -> BufId {
        let tail = LentTail { ptr: guest[head..].as_ptr(), len: (guest.len() - head) as u32 };
        // SAFETY: `guest` outlives every packet of these tests.
        unsafe { c.alloc_lent(head, |d| d.copy_from_slice(&guest[..head]), tail) }.unwrap()
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// What may happen to a lent packet in the pipeline, against a model of its bytes.
    #[derive(Debug, Clone)]
    enum Op {
        Prepend(usize),
        Strip(usize),
        Truncate(usize),
        Linearize,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (1usize..=74).prop_map(Op::Prepend),
            (1usize..=60).prop_map(Op::Strip),
            (0usize..9300).prop_map(Op::Truncate),
            Just(Op::Linearize)
        ]
    }

    proptest::proptest! {
        /// Headers prepended and stripped, truncation and linearizing in any order: the
        /// packet always reads as the model says, its length agrees, and freeing it returns
        /// every pool buffer (the guest's bytes never counted as the pool's).
        #[test]
        fn a_lent_packet_reads_as_its_model_whatever_happens_to_it(len in 129usize..=MAX_FRAME, ops in proptest::collection::vec(op(), 0..8)) {
            let p = pool(64);
            let mut c = PoolCache::new(p.clone());
            let free = p.free_count() + c.stack.len();
            let guest = pattern(len);
            let mut model = guest.clone();
            let mut b = lend(&mut c, &guest, 128);
            for o in ops {
                match o {
                    Op::Prepend(n) => {
                        if let Some(h) = p.prepend(&mut b, n) {
                            h[..n].fill(0xee);
                            model.splice(0..0, std::iter::repeat_n(0xee, n));
                        }
                    }
                    Op::Strip(n) => {
                        if p.strip(&mut b, n) {
                            model.drain(..n);
                        }
                    }
                    Op::Truncate(n) => {
                        if p.truncate(&mut b, n) {
                            model.truncate(n);
                        }
                    }
                    Op::Linearize => proptest::prop_assert!(p.linearize(&mut b, &mut c)),
                }
                let mut out = Vec::new();
                p.read_frame(&b, &mut out);
                proptest::prop_assert_eq!(&out, &model);
                proptest::prop_assert_eq!(p.pkt_len(&b), model.len());
            }
            c.free(b);
            proptest::prop_assert_eq!(p.free_count() + c.stack.len(), free);
        }
    }

    /// A chunk lent bare (a port's device holds it by index) comes back by index, and a
    /// packet claimed from it is whole; the pool counts every chunk back.
    #[test]
    fn chunks_lent_by_index_come_back_whole() {
        let p = pool(64);
        let free = p.free_count();
        let mut c = PoolCache::new(p.clone());
        let idx: Vec<u32> = (0..40).map(|_| c.alloc_index().unwrap()).collect();
        let mut uniq = idx.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 40, "each chunk handed out once");
        // SAFETY: taken above, given back once each; the first becomes a packet first.
        let b = unsafe { p.claim_filled(idx[0], HEADROOM + 2, 60) }.unwrap();
        assert_eq!((p.pkt_len(&b), p.headroom(&b), p.is_chained(&b)), (60, HEADROOM + 2, false));
        c.free(b);
        for &i in &idx[1..] {
            // SAFETY: as above.
            unsafe { c.free_index(i) };
        }
        drop(c);
        assert_eq!(p.free_count(), free);
    }

    /// A lent packet reads as the whole frame; linearized it is an ordinary packet (in its
    /// head's chunk, or chained for a jumbo frame), truncated it shortens its tail or loses
    /// it; freeing returns only pool buffers; the cache says it lent until told it ended.
    #[test]
    fn lent_packets_read_linearize_truncate_and_free_whole() {
        let p = pool(64);
        let mut c = PoolCache::new(p.clone());
        let free = p.free_count() + c.stack.len();
        for len in [600, 1514, 9000] {
            let guest = pattern(len);
            let mut b = lend(&mut c, &guest, 128);
            assert!(c.lending());
            assert_eq!((p.pkt_len(&b), p.head(&b).len(), p.is_chained(&b)), (len, 128, true));
            assert_eq!(p.lent_tail(&b).map(|t| t.len as usize), Some(len - 128));
            let mut out = Vec::new();
            p.read_frame(&b, &mut out);
            assert_eq!(out, guest, "{len}: head and tail in order");
            let mut pieces = Vec::new();
            p.each_piece(&b, |x| pieces.extend_from_slice(x));
            assert_eq!(pieces, guest);
            assert!(p.linearize(&mut b, &mut c));
            assert!(p.lent_tail(&b).is_none());
            assert_eq!(
                p.is_chained(&b),
                len > BUF_SIZE - HEADROOM,
                "{len}: in the head's chunk when it fits"
            );
            let got: Vec<u8> = p.segments(&b).flatten().copied().collect();
            assert_eq!((got, p.pkt_len(&b)), (guest.clone(), len));
            c.free(b);
        }
        let guest = pattern(1000);
        let mut b = lend(&mut c, &guest, 128);
        assert!(p.truncate(&mut b, 900), "inside the tail");
        let mut out = Vec::new();
        p.read_frame(&b, &mut out);
        assert_eq!((out.as_slice(), p.lent_tail(&b).map(|t| t.len)), (&guest[..900], Some(772)));
        assert!(p.truncate(&mut b, 100), "inside the head: the tail goes");
        assert!(p.lent_tail(&b).is_none() && !p.is_chained(&b));
        assert_eq!(p.head(&b), &guest[..100]);
        assert!(!p.truncate(&mut b, 100), "not shorter");
        c.free(b);
        let b = lend(&mut c, &guest, 128);
        c.free(b); // only its head is the pool's
        c.end_lending();
        assert!(!c.lending());
        assert_eq!(p.free_count() + c.stack.len(), free, "every buffer back");
        let too_long = LentTail { ptr: guest.as_ptr(), len: MAX_FRAME as u32 };
        // SAFETY: refused before anything is read.
        let refused = unsafe { c.alloc_lent(128, |_| (), too_long) }.is_none();
        assert!(refused, "longer than the largest frame");
    }

    /// Pieces chained as a port receives them make one packet; split, each piece is a lone
    /// buffer again; a packet with a shared segment, or more pieces than room, stays whole;
    /// every buffer comes back.
    #[test]
    fn chains_are_built_and_split_piece_by_piece() {
        let p = pool(64);
        let mut c = PoolCache::new(p.clone());
        let pieces: Vec<BufId> = [&[1u8; 100][..], &[2; 2000], &[3; 50]]
            .iter()
            .map(|d| c.alloc_frame(d).unwrap())
            .collect();
        let mut it = pieces.into_iter();
        let mut chain = Chain::new(it.next().unwrap());
        for seg in it {
            chain.push(&p, seg);
        }
        let head = chain.finish();
        assert_eq!(p.pkt_len(&head), 2150);
        let mut flat = Vec::new();
        p.read_frame(&head, &mut flat);
        assert_eq!((flat[0], flat[100], flat[2100], flat.len()), (1, 2, 3, 2150));
        // The 2 000-byte piece took two buffers (1 920 after the headroom, and 80).
        let mut three = [BufId::EMPTY, BufId::EMPTY, BufId::EMPTY];
        let head = p.split(head, &mut three).expect_err("four pieces, room for three");
        let mut out = [BufId::EMPTY, BufId::EMPTY, BufId::EMPTY, BufId::EMPTY];
        assert_eq!(p.split(head, &mut out), Ok(4));
        let lens: Vec<usize> = out.iter().map(|b| p.pkt_len(b)).collect();
        assert_eq!(lens, vec![100, 1920, 80, 50]);
        assert!(out.iter().all(|b| !p.is_chained(b)));
        for b in out.iter_mut() {
            c.free(std::mem::replace(b, BufId::EMPTY));
        }
        // A packet whose payload another packet shares is not split.
        let shared = p.into_shared(c.alloc_frame(&[9; 64]).unwrap());
        let mut head = c.alloc_frame(&[8; 14]).unwrap();
        p.link_shared(&mut head, &shared);
        let head = p.split(head, &mut out).expect_err("a shared segment");
        c.free(head);
        c.release_shared(shared);
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize);
    }

    #[test]
    fn alloc_free_round_trip_and_exhaustion() {
        let p = pool(64);
        let mut c = PoolCache::new(p.clone());
        let mut held = Vec::new();
        while let Some(b) = c.alloc() {
            held.push(b);
        }
        assert_eq!(held.len(), 63, "64 chunks, one kept for the placeholder");
        assert_eq!(p.capacity(), 63);
        assert!(p.alloc_failures() >= 1);
        for b in held {
            c.free(b);
        }
        c.flush();
        assert_eq!(p.free_count(), 63);
    }

    /// A kernel descriptor whose range does not fit its chunk still gives the chunk back
    /// (it was leaked: neither lent any more nor in the pool).
    #[test]
    fn a_filled_buffer_with_a_bad_range_comes_back() {
        let p = pool(16);
        let mut c = PoolCache::new(p.clone());
        let idx = c.alloc().unwrap().into_index();
        // SAFETY: `idx` came from `into_index` of this pool and is claimed once.
        let claimed = unsafe { p.claim_filled(idx, BUF_SIZE - 10, 100) };
        let empty = claimed.expect_err("a range past the chunk's end is refused");
        assert_eq!(p.pkt_len(&empty), 0);
        c.free(empty);
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize);
    }

    /// `BufId::EMPTY` masks to the last chunk: no packet ever owns it, so a placeholder used
    /// by mistake aliases nobody's data, and freeing one leaves the pool as it was.
    #[test]
    fn the_placeholder_aliases_no_packet() {
        let p = pool(16);
        let last = p.mask;
        assert_eq!(BufId::EMPTY.index() & p.mask, last);
        let mut c = PoolCache::new(p.clone());
        let mut held = Vec::new();
        while let Some(b) = c.alloc() {
            assert_ne!(b.index() & p.mask, last, "a packet got the placeholder's chunk");
            held.push(b);
        }
        c.free(BufId::EMPTY);
        for b in held {
            c.free(b);
        }
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize, "freeing the placeholder added nothing");
    }

    #[test]
    fn headroom_prepend_strip() {
        let p = pool(16);
        let mut c = PoolCache::new(p.clone());
        let mut b = c.alloc_frame(&[1, 2, 3, 4]).unwrap();
        assert_eq!(p.headroom(&b), HEADROOM);
        p.prepend(&mut b, 2).unwrap().copy_from_slice(&[9, 9, 1, 2, 3, 4]);
        assert_eq!(p.head(&b), &[9, 9, 1, 2, 3, 4]);
        assert_eq!(p.pkt_len(&b), 6);
        assert!(p.strip(&mut b, 3));
        assert_eq!(p.head(&b), &[2, 3, 4]);
        assert!(p.prepend(&mut b, HEADROOM + 100).is_none());
        c.free(b);
    }

    #[test]
    fn jumbo_chain_round_trip() {
        let p = pool(32);
        let mut c = PoolCache::new(p.clone());
        let frame: Vec<u8> = (0..9000u32).map(|i| (i * 7) as u8).collect();
        let b = c.alloc_frame(&frame).unwrap();
        assert!(p.is_chained(&b));
        assert_eq!(p.pkt_len(&b), 9000);
        let mut out = Vec::new();
        p.read_frame(&b, &mut out);
        assert_eq!(out, frame);
        c.free(b);
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize);
        assert!(c.alloc_frame(&vec![0; MAX_FRAME + 1]).is_none());
    }

    /// A pool that runs dry in the middle of a chained packet gets every buffer back: the
    /// ones the packet already held are freed with it.
    #[test]
    fn a_packet_the_pool_cannot_finish_leaves_nothing_taken() {
        let p = pool(64);
        let mut c = PoolCache::new(p.clone());
        // All but three buffers held elsewhere.
        let held: Vec<BufId> = (0..p.free_count() - 3).map(|_| c.alloc().unwrap()).collect();
        c.flush();
        let before = p.free_count();
        assert!(c.alloc_gather(&[&[1u8; 12], &vec![2u8; 8000]]).is_none(), "needs five buffers");
        assert!(c.alloc_filled(8000, |d| d.fill(3)).is_none());
        c.flush();
        assert_eq!(p.free_count(), before);
        for b in held {
            c.free(b);
        }
    }

    #[test]
    fn gather_packs_parts_across_segments() {
        let p = pool(32);
        let mut c = PoolCache::new(p.clone());
        let a: Vec<u8> = (0..12u8).collect();
        let big: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let b = c.alloc_gather(&[&a, &[0x81, 0, 0, 100], &big]).unwrap();
        let mut out = Vec::new();
        p.read_frame(&b, &mut out);
        assert_eq!(out.len(), 12 + 4 + 5000);
        assert_eq!(&out[..12], &a[..]);
        assert_eq!(&out[12..16], &[0x81, 0, 0, 100]);
        assert_eq!(&out[16..], &big[..]);
        assert_eq!(p.head(&b).len(), BUF_SIZE - HEADROOM, "the head is filled before chaining");
        c.free(b);
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize);
    }

    #[test]
    fn shared_segment_freed_with_last_reference() {
        let p = pool(32);
        let mut c = PoolCache::new(p.clone());
        let payload = c.alloc_frame(&vec![5u8; 3000]).unwrap(); // 2 segments
        let s = p.into_shared(payload);
        let mut heads = Vec::new();
        for i in 0..3u8 {
            let mut h = c.alloc().unwrap();
            assert!(p.append(&mut h, &[i; 14]));
            p.link_shared(&mut h, &s);
            assert_eq!(p.pkt_len(&h), 3014);
            heads.push(h);
        }
        c.release_shared(s);
        let mut out = Vec::new();
        p.read_frame(&heads[1], &mut out);
        assert_eq!(&out[..14], &[1; 14]);
        assert!(out[14..].iter().all(|&x| x == 5));
        for h in heads {
            c.free(h);
        }
        c.flush();
        assert_eq!(p.free_count(), p.capacity() as usize);
    }
}

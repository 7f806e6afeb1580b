//! Zero copy at a `dpdk` port's edge: the port's mempool holds bare mbuf headers (no data
//! room of their own, as VPP's dpdk plugin lays mbufs over its own buffers), each carrying one
//! chunk of the switch's buffer pool as its buffer (`buf_addr`, `buf_len` of a chunk; the
//! pool tells drivers a data room of [`BUF_SIZE`], headroom included). A received frame becomes a switch packet by trading chunks — the packet
//! keeps the chunk the device filled, the mbuf takes a fresh one before it goes back to the
//! mempool — and a packet is sent by lending its chunk to a fresh mbuf, whose own chunk goes
//! back to the switch's pool. Frames in several segments (jumbo mbufs, chained or flooded
//! switch packets) and mbufs of another mempool are copied.
//!
//! Which devices: those whose drivers read and write mbuf data with the CPU through its
//! virtual address and give back every mbuf when they close (vdevs, as their devargs
//! configure them: [`crate::device_copies`]). A device that DMAs (a NIC, a VF) would need
//! the switch's region mapped for it (`rte_extmem_register`, `rte_dev_dma_map`): not built,
//! such ports copy at the edge.
//!
//! # Safety
//! Invariant: a chunk index an mbuf of the mempool carries (its `buf_addr`, when it is one
//! whole chunk of the region: the shim's `carried`; a buffer a driver attached is never
//! taken for one) was taken off the switch's pool (`BufId::into_index`) and is owned by that
//! mbuf alone: no `BufId` of it exists, and no other mbuf carries it. It is kept by
//! - [`ZeroCopy::create`]: each object gets a distinct chunk fresh from the pool before the
//!   device can take any;
//! - [`ZeroCopy::receive`]: an mbuf of the rx burst (the port's until freed) hands its chunk
//!   to a packet (`claim_filled`) only in exchange for a fresh one, written before the
//!   burst's mbufs are freed;
//! - [`ZeroCopy::lend`] / [`ZeroCopy::settle`]: a fresh mbuf takes a packet's chunk (the
//!   packet's `BufId` forgotten once the device took the mbuf) and its old chunk becomes a
//!   packet again; an mbuf the device refused gets its old chunk back before it is freed.
//!   Between the device taking the mbuf and `settle` both name the chunk; nothing reads or
//!   writes it through the `BufId` in that window (a loopback may already deliver it);
//! - [`ZeroCopy::release`]: after the device closed (every mbuf back in the mempool: devices
//!   whose mbufs outlive them, such as rings shared with another port, are not shared), each
//!   object's chunk returns to the pool, then the mempool is freed.
//!
//! The `Arc<Pool>` held here keeps the region mapped while any mbuf points into it.
//!
//! Why bare headers rather than DPDK's pinned external-buffer pools
//! (`rte_pktmbuf_pool_create_extbuf`, which a first version used): their mbufs are not
//! "direct", and every free takes the external-buffer path (the pool's flags, the shared
//! info's reference count on a third cache line): ~46 more instructions a frame out and back
//! in, 5–6 more cycles (`perf/examples/dpdk_edge.rs`). A bare header is freed as any mbuf.
//! DPDK never moves a direct mbuf's buffer; one that a driver attaches elsewhere (cloning)
//! is not taken for a chunk (`carried`), and its chunk is then lost to the pool, not shared.

use std::ffi::CStr;
use std::sync::Arc;
use vswitch::batch::{BATCH, Batch};
use vswitch::buf::BUF_SIZE;
use vswitch::{BufId, Pool, PoolCache};

/// `UINT32_MAX` in the shim's arrays: "no chunk here" (the mbuf is left as it is).
const NONE: u32 = u32::MAX;
/// The shim's "astray": an mbuf of the port's own mempool whose buffer is not a chunk (DPDK
/// or a driver moved it; none of the devices zero copy serves does). It is never written
/// into nor taken for a chunk: it gets a fresh chunk, or is kept out of the mempool.
const ASTRAY: u32 = u32::MAX - 1;
/// Per-lcore mbuf cache of the mempool: every idle mbuf in a thread's cache (up to 1.5× this)
/// holds one of the switch's buffers, so it is smaller than DPDK's usual 256.
const MEMPOOL_CACHE: u32 = 128;
/// `RTE_BAD_IOVA`, which bindgen does not expand (`(rte_iova_t)-1`).
const BAD_IOVA: u64 = u64::MAX;

/// The switch's pool as a port's mempool's buffers.
pub struct ZeroCopy {
    pool: Arc<Pool>,
    base: *mut u8,
    /// The region's IO address (IOVA as VA) or [`BAD_IOVA`].
    iova: u64,
    /// Chunks in the pool: an index an mbuf reports at or above it is not one of ours.
    chunks: u32,
    mbufs: u32,
    /// mbufs found astray (see [`ASTRAY`]): their chunks are lost to the pool.
    astray: std::sync::atomic::AtomicU64,
}

// SAFETY: `base` is the address of the pool's region, which the held `Arc<Pool>` keeps
// mapped; it is only used to compute chunk addresses.
unsafe impl Send for ZeroCopy {}
// SAFETY: as above; every other field is Sync.
unsafe impl Sync for ZeroCopy {}

impl ZeroCopy {
    /// Creates a mempool of `n` mbufs named `name`, each carrying a chunk taken from `pool`.
    /// `Err` (with the reason) leaves the pool as it was.
    pub fn create(
        name: &CStr,
        pool: &Arc<Pool>,
        n: u32,
        socket: i32,
    ) -> Result<(*mut dpdk_sys::rte_mempool, ZeroCopy), String> {
        let (base, _) = pool.region();
        let chunks = pool.capacity();
        // Other ports (AF_XDP pods' fill rings, frames in flight) keep at least a quarter.
        let keep = chunks as usize / 4;
        if pool.free_count() < n as usize + keep {
            return Err(format!(
                "{n} of the switch's buffers for the port's mbufs would leave fewer than {keep} \
                 of {chunks} free ({} free now)",
                pool.free_count()
            ));
        }
        let mut cache = PoolCache::new(pool.clone());
        let mut taken = Vec::with_capacity(n as usize);
        while taken.len() < n as usize {
            match cache.alloc_index() {
                Some(i) => taken.push(i),
                None => break,
            }
        }
        let give_back = |cache: &mut PoolCache, taken: &[u32]| {
            for &i in taken {
                // SAFETY: taken off this pool above and given to no one.
                unsafe { cache.free_index(i) };
            }
        };
        if taken.len() < n as usize {
            give_back(&mut cache, &taken);
            return Err(format!(
                "the switch's buffer pool has fewer than {n} free buffers for the port's mbufs"
            ));
        }
        // SAFETY: a valid name; the pool's objects are bare mbuf headers, each rebased to a
        // chunk of its own below, before the mempool is used.
        let mp = unsafe {
            dpdk_sys::shim_pool_create_bare(
                name.as_ptr(),
                n,
                // DPDK refuses a cache larger than n / 1.5.
                MEMPOOL_CACHE.min(n / 2),
                BUF_SIZE as u16,
                socket,
            )
        };
        if mp.is_null() {
            give_back(&mut cache, &taken);
            return Err(crate::eal::errno_text());
        }
        // SAFETY: plain query.
        let iova = if unsafe { dpdk_sys::shim_iova_is_va() } != 0 { base as u64 } else { BAD_IOVA };
        // SAFETY: our fresh mempool, not yet given to a device; `taken` holds `n` chunks.
        let seen = unsafe {
            dpdk_sys::shim_pool_give_chunks(mp, base, iova, taken.as_ptr(), n, BUF_SIZE as u32)
        };
        if seen != n {
            // SAFETY: no device has the mempool; its objects carry nothing we must get back
            // (every chunk is still in `taken`).
            unsafe { dpdk_sys::rte_mempool_free(mp) };
            give_back(&mut cache, &taken);
            return Err(format!("the mempool has {seen} mbufs, not {n}"));
        }
        let astray = Default::default();
        Ok((mp, ZeroCopy { pool: pool.clone(), base, iova, chunks, mbufs: n, astray }))
    }

    /// Gives an astray mbuf a fresh chunk; without one, keeps it out of the mempool for good
    /// (`*m` becomes null: the caller must not free or use it).
    fn repair(&self, m: &mut *mut dpdk_sys::rte_mbuf, cache: &mut PoolCache) {
        if self.astray.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            tracing::warn!("an mbuf's buffer is not one of the switch's: given a fresh one");
        }
        match cache.alloc_index() {
            // SAFETY: our mbuf, not in the device's hands; `f` was taken off the pool for it.
            Some(f) => unsafe {
                dpdk_sys::shim_rebase(m, 1, self.base, self.iova, &f, BUF_SIZE as u32)
            },
            None => *m = std::ptr::null_mut(),
        }
    }

    /// The switch's pool the mbufs' buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Whether `cache` serves the pool the mbufs' chunks come from.
    pub fn serves(&self, cache: &PoolCache) -> bool {
        Arc::ptr_eq(cache.pool(), &self.pool)
    }

    /// Turns an rx burst into packets: each single-segment frame in an mbuf of `mp` (the
    /// mempool [`ZeroCopy::create`] made) keeps the chunk the device filled and its mbuf
    /// takes a fresh chunk; other frames go through `copy`. The caller frees the mbufs
    /// afterwards, but for any made null (astray ones kept). Returns the packets pushed;
    /// `dropped` counts the rest.
    pub fn receive(
        &self,
        mp: *const dpdk_sys::rte_mempool,
        mbufs: &mut [*mut dpdk_sys::rte_mbuf],
        cache: &mut PoolCache,
        batch: &mut Batch,
        mut copy: impl FnMut(*mut dpdk_sys::rte_mbuf, &mut PoolCache) -> Option<BufId>,
        mut dropped: impl FnMut(),
    ) -> usize {
        let n = mbufs.len().min(BATCH);
        let (mut chunk, mut off, mut len, mut segs) =
            ([NONE; BATCH], [0u16; BATCH], [0u16; BATCH], [0u16; BATCH]);
        // SAFETY: `n` mbufs of an rx burst, ours until freed; the out arrays hold BATCH. Only
        // mbufs of `mp` (the port's mempool, the caller's) report a chunk.
        unsafe {
            dpdk_sys::shim_rx_chunks(
                mp,
                mbufs.as_ptr(),
                n as u16,
                self.base,
                self.chunks,
                BUF_SIZE as u32,
                chunk.as_mut_ptr(),
                off.as_mut_ptr(),
                len.as_mut_ptr(),
                segs.as_mut_ptr(),
            )
        };
        let mut fresh = [NONE; BATCH];
        let mut got = 0;
        for i in 0..n {
            if chunk[i] == ASTRAY {
                // Its bytes are not where a chunk is: not read; the mbuf is mended.
                dropped();
                self.repair(&mut mbufs[i], cache);
                continue;
            }
            let b = if segs[i] == 1 && chunk[i] < self.chunks {
                cache.alloc_index().and_then(|f| {
                    fresh[i] = f;
                    // SAFETY: mbuf i carried chunk[i], owned by it alone (module invariant);
                    // from here it carries fresh[i] instead (rebased below, before the caller
                    // frees it), so chunk[i] is claimed once.
                    unsafe { self.pool.claim_filled(chunk[i], off[i] as usize, len[i] as usize) }
                        .map_err(|b| cache.free(b))
                        .ok()
                })
            } else {
                copy(mbufs[i], cache)
            };
            match b.map(|b| batch.push(b)) {
                Some(Ok(())) => got += 1,
                Some(Err(b)) => cache.free(b), // the burst asked for no more than the room
                None => dropped(),
            }
        }
        // SAFETY: the burst's mbufs, ours; fresh[i] was taken off the pool for mbuf i.
        unsafe {
            dpdk_sys::shim_rebase(
                mbufs.as_ptr(),
                n as u16,
                self.base,
                self.iova,
                fresh.as_ptr(),
                BUF_SIZE as u32,
            )
        };
        got
    }

    /// Lends each unchained packet's chunk to its fresh mbuf (`mbufs[i]` for `frames[i]`)
    /// and copies the chained ones with `copy` (false: stop there). Returns how many mbufs
    /// are ready to send; `old` gets each lending mbuf's own chunk ([`NONE`] for copies),
    /// which [`ZeroCopy::settle`] needs. `None` (nothing lent, every mbuf as fresh): an mbuf
    /// was astray, has a fresh chunk now, and the caller copies the burst; `Some(0)` with a
    /// null mbuf: one astray could not be mended, and is kept (the caller skips nulls).
    pub fn lend(
        &self,
        frames: &[BufId],
        mbufs: &mut [*mut dpdk_sys::rte_mbuf],
        old: &mut [u32; BATCH],
        cache: &mut PoolCache,
        mut copy: impl FnMut(&BufId, *mut dpdk_sys::rte_mbuf) -> bool,
    ) -> Option<usize> {
        let have = frames.len().min(mbufs.len()).min(BATCH);
        let (mut chunk, mut off, mut len) = ([NONE; BATCH], [0u16; BATCH], [0u16; BATCH]);
        let mut chained = false;
        for (i, b) in frames[..have].iter().enumerate() {
            if self.pool.is_chained(b) {
                chained = true;
                continue;
            }
            let (at, l) = self.pool.head_addr(b);
            chunk[i] = (at / BUF_SIZE as u64) as u32;
            off[i] = (at % BUF_SIZE as u64) as u16;
            len[i] = l as u16;
        }
        // SAFETY: `have` fresh mbufs of ours; each lending one reports its chunk into `old` and
        // points at its packet's bytes (inside the packet's chunk), which stay the packet's
        // until `settle`.
        let astray = unsafe {
            dpdk_sys::shim_tx_lend(
                mbufs.as_ptr(),
                have as u16,
                self.base,
                self.iova,
                self.chunks,
                BUF_SIZE as u32,
                chunk.as_ptr(),
                off.as_ptr(),
                len.as_ptr(),
                old.as_mut_ptr(),
            )
        };
        if astray > 0 {
            self.unlend(&mbufs[..have], &mut old[..have]);
            for (m, o) in mbufs[..have].iter_mut().zip(&mut old[..have]) {
                if *o == ASTRAY {
                    self.repair(m, cache);
                    *o = NONE;
                }
            }
            // Copied whole once every mbuf has a chunk; none sent if one is kept.
            return if mbufs[..have].iter().all(|m| !m.is_null()) { None } else { Some(0) };
        }
        let k = if chained {
            frames[..have]
                .iter()
                .zip(&mbufs[..have])
                .position(|(b, &m)| self.pool.is_chained(b) && !copy(b, m))
                .unwrap_or(have)
        } else {
            have
        };
        if k < have {
            self.unlend(&mbufs[k..have], &mut old[k..have]);
        }
        Some(k)
    }

    /// Gives mbufs that lent their chunks back their own and resets them (`old` then says
    /// nothing was lent; astray ones are left as they are).
    fn unlend(&self, mbufs: &[*mut dpdk_sys::rte_mbuf], old: &mut [u32]) {
        // SAFETY: fresh mbufs of ours that `shim_tx_lend` went over, not given to the device;
        // old[i] is the chunk mbuf i carried before it (or NONE: it lent nothing).
        unsafe {
            dpdk_sys::shim_unlend(
                mbufs.as_ptr(),
                mbufs.len() as u16,
                self.base,
                self.iova,
                old.as_ptr(),
                BUF_SIZE as u32,
            )
        };
        for o in old.iter_mut().filter(|o| **o != ASTRAY) {
            *o = NONE;
        }
    }

    /// After the device took the first `sent` of `k` lent-or-copied mbufs: each sent packet
    /// that lent its chunk gives its handle up (the mbuf carries the chunk now) and the mbuf's
    /// old chunk goes back to the pool; copied packets are freed. Mbufs the device refused get
    /// their old chunks back (the caller frees them; their packets stay in the batch).
    pub fn settle(
        &self,
        mbufs: &[*mut dpdk_sys::rte_mbuf],
        old: &[u32; BATCH],
        k: usize,
        sent: usize,
        cache: &mut PoolCache,
        batch: &mut Batch,
    ) {
        if sent < k {
            // SAFETY: mbufs the device did not take, still ours; old[i] is the chunk each
            // carried before `lend` (or NONE: left alone).
            unsafe {
                dpdk_sys::shim_rebase(
                    mbufs[sent..].as_ptr(),
                    (k - sent) as u16,
                    self.base,
                    self.iova,
                    old[sent..].as_ptr(),
                    BUF_SIZE as u32,
                )
            };
        }
        for (i, &o) in old[..sent].iter().enumerate() {
            let b = batch.take(i);
            if o == NONE {
                cache.free(b);
                continue;
            }
            // The sent mbuf carries the packet's chunk from here.
            let _ = b.into_index();
            // SAFETY: o was the chunk the mbuf carried, owned by it alone; the mbuf carries
            // the packet's chunk now, so o goes back once, and nothing refers to it.
            unsafe { cache.free_index(o) };
        }
    }

    /// Returns every object's chunk to the pool and frees the mempool.
    ///
    /// # Safety
    /// `mp` is the mempool [`ZeroCopy::create`] made, no device uses it any more and every
    /// mbuf is back in it; nothing uses it after this call.
    pub unsafe fn release(&self, mp: *mut dpdk_sys::rte_mempool) {
        let mut idx = vec![NONE; self.mbufs as usize];
        // SAFETY: our mempool (caller's contract), room for `mbufs` indices.
        unsafe {
            dpdk_sys::shim_pool_take_chunks(
                mp,
                self.base,
                self.chunks,
                idx.as_mut_ptr(),
                self.mbufs,
                BUF_SIZE as u32,
            )
        };
        let mut cache = PoolCache::new(self.pool.clone());
        for i in idx.into_iter().filter(|&i| i < self.chunks) {
            // SAFETY: each object's chunk, owned by it alone; the mempool goes below.
            unsafe { cache.free_index(i) };
        }
        // SAFETY: our mempool, its chunks returned; nothing uses it after this.
        unsafe { dpdk_sys::rte_mempool_free(mp) };
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use vswitch::Batch;

    /// An mbuf whose buffer something moved off its chunk is never written into nor taken
    /// for a chunk, on either path: it is mended with a fresh chunk (the frame it held
    /// dropped; a burst it would send in copied), and every other chunk comes back.
    #[test]
    fn an_astray_mbuf_is_mended_not_trusted() {
        // Plain pages: no huge page taken from tests that reserve them for their peers.
        let prefix = format!("knitter-zc-unit-{}", std::process::id());
        let args = ["knitter", "-l", "0", "--no-telemetry", "--no-pci", "--no-huge", "-m", "64"];
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string())
            .chain(["--no-shconf".into(), "--file-prefix".into(), prefix])
            .collect();
        crate::eal::init(&args).expect("EAL");
        crate::eal::register_thread();
        let pool = vswitch::Pool::new(1024, false).unwrap();
        let free = pool.free_count();
        let name = std::ffi::CString::new(format!("zc_unit_{}", std::process::id())).unwrap();
        let (mp, zc) = ZeroCopy::create(&name, &pool, 64, 0).expect("the mempool");
        let mut cache = PoolCache::new(pool.clone());
        let mut mbufs = [std::ptr::null_mut::<dpdk_sys::rte_mbuf>(); 4];
        // SAFETY: our mempool, room for four.
        assert_eq!(unsafe { dpdk_sys::shim_pktmbuf_alloc_bulk(mp, mbufs.as_mut_ptr(), 4) }, 0);
        let move_off = |m: *mut dpdk_sys::rte_mbuf| {
            // SAFETY: our mbuf; its buffer moved 100 bytes into its chunk, as a driver that
            // attached one of its own would leave it.
            unsafe { (*m).buf_addr = (*m).buf_addr.cast::<u8>().add(100).cast() };
        };
        // Transmit: four packets, the second mbuf astray.
        move_off(mbufs[1]);
        let mut batch = Batch::new();
        for _ in 0..4 {
            let b = cache.alloc_frame(&[0x11; 60]).unwrap();
            assert!(batch.push(b).is_ok());
        }
        let mut old = [NONE; BATCH];
        let lent = zc.lend(batch.as_slice(), &mut mbufs, &mut old, &mut cache, |_, _| true);
        assert_eq!(lent, None, "nothing lent: the burst is copied");
        assert!(old.iter().all(|&o| o == NONE));
        let (mut chunk, mut off, mut len, mut segs) = ([0; 4], [0u16; 4], [0u16; 4], [0u16; 4]);
        // SAFETY: four mbufs of ours; the out arrays hold four.
        unsafe {
            dpdk_sys::shim_rx_chunks(
                mp,
                mbufs.as_ptr(),
                4,
                zc.base,
                zc.chunks,
                BUF_SIZE as u32,
                chunk.as_mut_ptr(),
                off.as_mut_ptr(),
                len.as_mut_ptr(),
                segs.as_mut_ptr(),
            )
        };
        assert!(chunk.iter().all(|&c| c < zc.chunks), "each carries a chunk again: {chunk:?}");
        // Receive: the third astray; its frame is dropped, the others become packets.
        move_off(mbufs[2]);
        for i in 0..batch.len() {
            cache.free(batch.take(i));
        }
        batch.handed_on(4);
        let mut dropped = 0;
        let got = zc.receive(mp, &mut mbufs, &mut cache, &mut batch, |_, _| None, || dropped += 1);
        assert_eq!((got, dropped), (3, 1));
        assert!(mbufs.iter().all(|m| !m.is_null()), "mended, not kept");
        // SAFETY: the four mbufs, ours, each freed once.
        unsafe { dpdk_sys::rte_pktmbuf_free_bulk(mbufs.as_mut_ptr(), 4) };
        for i in 0..batch.len() {
            cache.free(batch.take(i));
        }
        batch.handed_on(3);
        assert_eq!(zc.astray.load(std::sync::atomic::Ordering::Relaxed), 2);
        drop(cache);
        // SAFETY: no device used the mempool; every mbuf is back in it.
        unsafe { zc.release(mp) };
        assert_eq!(pool.free_count(), free - 2, "all back but the two chunks moved off");
    }
}

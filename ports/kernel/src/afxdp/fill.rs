//! How many buffers each AF_XDP queue lends the kernel through its fill ring: a pod's
//! first share of the shared pool, an underlay's, growing a ring a busy queue empties, the
//! refill every burst, and a queue that starves said once.

use super::{AfXdpPort, RING, RxSide};
use std::sync::atomic::Ordering::*;
use vswitch::buf::{BUF_SIZE, Pool, PoolCache};
use vswitch::port::QueueCounters;

/// Buffers a pod-facing port keeps in its fill ring at first. Every port lends them from the
/// shared pool while idle, so this bounds what idle pods hold (see [`pool_for_pods`]); a
/// polled port refills every burst, so a few bursts' worth is enough while its PMD
/// runs. A port whose fill ring runs dry drops what arrives (the kernel counts it on the
/// interface): when its traffic empties the ring by half between two refills, the ring
/// grows (see [`RxSide::grow`]).
pub(super) const FILL_POD: u32 = 128;
/// A pod queue's fill ring when the pool is already half lent out (see [`pod_fill`]): a
/// burst's worth, refilled every time a PMD thread polls it.
const FILL_MIN: u32 = 32;

/// A fill ring holding fewer buffers than this, with the pool unable to top it up, starves.
const STARVED: u32 = 8;

/// A pod port's fill ring per queue at first: [`FILL_POD`] while the pool keeps more than
/// half its buffers free after lending them, else [`FILL_MIN`]. Idle pods keep what their
/// rings hold (the kernel owns it until frames arrive), so the share given at open is what
/// many pods hold for good: on the default 16 384 buffers the first ~60 pods get 128 and the
/// rest 32 (200 pods hold ~12 000, where 128 each, 25 600, left the last 72 none). A busy
/// pod's ring still doubles while the pool is more than half free ([`RxSide::grow`]).
pub(super) fn pod_fill(pool: &Pool, queues: u32) -> u32 {
    let lent = FILL_POD as usize * queues as usize;
    if pool.free_count().saturating_sub(lent) > pool.capacity() as usize / 2 {
        FILL_POD
    } else {
        FILL_MIN
    }
}

/// The buffers a pool needs for `pods` single-queue AF_XDP pod ports and an underlay to each
/// keep their full first fill ring ([`pod_fill`] gives [`FILL_POD`] only while the pool stays
/// more than half free): twice what the rings take, the other half for frames in flight,
/// rounded up to a power of two. 110 pods (Kubernetes' default): 32 768 buffers (64 MiB).
/// A UMEM cannot grow once sockets are bound to it, so the pool is sized up front.
pub fn pool_for_pods(pods: u32) -> u32 {
    let rings = pods as u64 * FILL_POD as u64 + RING as u64;
    (2 * rings).next_power_of_two().min(1 << 30) as u32
}

/// An underlay's fill ring per queue: a full ring on one queue, less per queue on many
/// (traffic spreads), growing with it.
pub(super) fn underlay_fill(queues: u32) -> u32 {
    (RING / queues.max(1)).max(2 * FILL_POD)
}

impl RxSide {
    /// The kernel took more than half the fill ring since the last refill: a PMD that
    /// misses a few turns (preempted, or a VM's vCPU stopped for milliseconds) would see it
    /// run dry and the kernel drop frames. The ring doubles, up to `RING`, while the pool
    /// has more than half its buffers free: buffers in a fill ring stay lent until frames
    /// arrive in them, so growth is bounded by what the pool can spare, and idle pods,
    /// which never grow, keep `FILL_POD` each.
    #[cold]
    fn grow(&mut self, cache: &PoolCache) {
        let pool = cache.pool();
        if pool.free_count() > pool.capacity() as usize / 2 {
            self.fill_target = (self.fill_target * 2).min(RING);
        }
    }
}

impl AfXdpPort {
    /// Tops the fill ring up with fresh pool buffers. A ring the pool could not keep above
    /// [`STARVED`] buffers starves: frames arriving then are dropped by the kernel, so the
    /// queue counts it (`rx_starved`, once per time it runs short) and says it once.
    pub(super) fn refill(
        side: &mut RxSide,
        cache: &mut PoolCache,
        counters: &QueueCounters,
        port: &str,
    ) {
        let prod = side.fill.prod().load(Relaxed);
        let held = prod.wrapping_sub(side.fill.cons().load(Acquire));
        if side.elastic && side.fill_target < RING && held < side.fill_target / 2 {
            side.grow(cache);
        }
        let free = side.fill_target.saturating_sub(held);
        let mut n = 0;
        while n < free {
            let Some(b) = cache.alloc() else { break };
            let idx = b.into_index();
            side.lent.set(idx);
            side.fill.write_addr(prod.wrapping_add(n), (idx as u64) * BUF_SIZE as u64);
            n += 1;
        }
        if n > 0 {
            side.fill.prod().store(prod.wrapping_add(n), Release);
        }
        counters.rx_lent.set((held + n) as u64);
        let starved = n < free && held + n < STARVED;
        if starved != side.starved {
            side.starved = starved;
            if starved {
                Self::starving(counters, cache, port);
            }
        }
    }

    #[cold]
    fn starving(counters: &QueueCounters, cache: &PoolCache, port: &str) {
        counters.rx_starved.add(1);
        let pool = cache.pool();
        tracing::warn!(
            port,
            free = pool.free_count(),
            buffers = pool.capacity(),
            "an AF_XDP queue's fill ring ran dry with the buffer pool empty: frames arriving on it are dropped until buffers come back (raise --pods, or --buffers: 256 per pod queue, 2 048 per underlay)"
        );
    }
}

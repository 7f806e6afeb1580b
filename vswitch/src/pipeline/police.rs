//! Node `police`: the ingress policer of a port's queue (token buckets per queue, see
//! [`crate::policer`]) and its network's policer on the node (one bucket all its ports
//! share), before the burst enters the graph; what they do not admit is dropped as `policed`.

use super::Pipeline;
use crate::batch::{BATCH, Batch};
use crate::buf::{PoolCache, PoolView};
use crate::counters::{DropReason, ThreadStats};
use crate::policer;
use crate::snapshot::PortEntry;

/// Drops the frames of `batch` (from port `port`) that `keep` refuses, given each frame's
/// length in order; counts them as received, policed and dropped. Returns how many.
fn drop_policed(
    pool: PoolView,
    cache: &mut PoolCache,
    stats: &ThreadStats,
    port: u16,
    batch: &mut Batch,
    mut keep: impl FnMut(u32) -> bool,
) -> u64 {
    let (mut dropped, mut bytes) = (0u64, 0u64);
    batch.retain(
        |b| keep(pool.head_and_len(b).1 as u32),
        |b| {
            dropped += 1;
            bytes += pool.head_and_len(&b).1 as u64;
            stats.count_drop(DropReason::Policed, port);
            cache.free(b);
        },
    );
    if dropped > 0 {
        let pc = stats.port(port);
        pc.rx_packets.add(dropped);
        pc.rx_bytes.add(bytes);
        pc.policed.add(dropped);
        stats.packets.add(dropped);
    }
    dropped
}

impl Pipeline {
    /// Drops the frames of a burst from `pe` that its own policer (one for the port, shared by
    /// every thread that polls one of its queues) does not admit; they count as received and
    /// as dropped (`policed`).
    #[inline(never)]
    pub(super) fn police(
        &mut self,
        pe: &PortEntry,
        bucket: &policer::SharedBucket,
        batch: &mut Batch,
    ) {
        self.take_or_drop(pe, bucket, batch);
    }

    /// Drops the frames of a burst from `pe` that its network's policer (shared by the
    /// network's ports and every thread) does not admit; they count on the bridge too.
    #[inline(never)]
    pub(super) fn police_network(
        &mut self,
        pe: &PortEntry,
        bucket: &policer::SharedBucket,
        bd: u16,
        batch: &mut Batch,
    ) {
        let dropped = self.take_or_drop(pe, bucket, batch);
        if dropped > 0 {
            self.stats.bd(bd).policed.add(dropped);
        }
    }

    /// Takes a burst's tokens from `bucket` (whole when they are there, else frame by frame)
    /// and drops the frames it does not admit; returns how many.
    #[inline(always)]
    fn take_or_drop(
        &mut self,
        pe: &PortEntry,
        bucket: &policer::SharedBucket,
        batch: &mut Batch,
    ) -> u64 {
        bucket.refill((self.clock)());
        let pool = self.pool.view();
        let burst_bytes: u64 = batch.as_slice().iter().map(|b| pool.head_and_len(b).1 as u64).sum();
        let n = batch.len();
        if bucket.take_all(n as u64, burst_bytes) {
            return 0;
        }
        let mut lens = [0u32; BATCH];
        for (l, b) in lens.iter_mut().zip(batch.as_slice()) {
            *l = pool.head_and_len(b).1 as u32;
        }
        let admitted = bucket.take(&lens[..n]);
        if admitted == policer::first(n as u64) {
            return 0;
        }
        let mut i = 0;
        drop_policed(pool, &mut self.cache, &self.stats, pe.id, batch, |_| {
            let keep = admitted >> i & 1 == 1;
            i += 1;
            keep
        })
    }
}

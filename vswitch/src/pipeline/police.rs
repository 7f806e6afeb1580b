//! Node `police`: the ingress policer of a port's queue (token buckets per queue, see
//! [`crate::policer`]), before the burst enters the graph; what it does not admit is dropped
//! as `policed`.

use super::*;

impl Pipeline {
    /// Drops the frames of a burst from (`pe`, `queue`) that its policer does not admit; they
    /// count as received and as dropped (`policed`).
    #[inline(never)]
    pub(super) fn police(&mut self, pe: &PortEntry, limits: &policer::Limits, queue: u16, batch: &mut Batch) {
        let bucket = self.policers.get(pe.id, limits, queue, pe.port.rx_queues(), (self.clock)());
        let pool = self.pool.view();
        let burst_bytes: u64 = batch.as_slice().iter().map(|b| pool.head_and_len(b).1 as u64).sum();
        if bucket.admit_all(batch.len() as u64, burst_bytes) {
            return;
        }
        let (mut dropped, mut bytes) = (0u64, 0u64);
        let (cache, stats) = (&mut self.cache, &self.stats);
        batch.retain(
            |b| bucket.admit(pool.head_and_len(b).1 as u32),
            |b| {
                dropped += 1;
                bytes += pool.head_and_len(&b).1 as u64;
                stats.count_drop(DropReason::Policed, pe.id);
                cache.free(b);
            },
        );
        if dropped > 0 {
            let pc = self.stats.port(pe.id);
            pc.rx_packets.add(dropped);
            pc.rx_bytes.add(bytes);
            pc.policed.add(dropped);
            self.stats.packets.add(dropped);
        }
    }
}

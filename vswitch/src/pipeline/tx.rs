//! Node `tx`: per-port tx batches filled by the egress nodes and flushed once per burst (a
//! priority batch first on the underlay); what a ring does not take is dropped and counted
//! (`tx_full`, `port_down`).

use super::*;

/// Sends `batch` on port `p` as far as its ring takes it (lent tails linearized first for a
/// port that may keep buffers beyond the burst) and counts what went; what the ring did not
/// take stays in `batch`. `None`: the port is down or gone (nothing sent).
#[inline(always)]
pub(super) fn send_batch(pool: &Pool, cache: &mut PoolCache, stats: &ThreadStats, thread: usize, snap: &Snapshot, p: u16, batch: &mut Batch) -> Option<usize> {
    let pe = snap.port(p).filter(|pe| pe.port.link_up())?;
    if cache.lending() && !pe.port.takes_lent() {
        Pipeline::linearize_all(pool, cache, stats, p, batch);
    }
    let bytes: usize = batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum();
    let n = batch.len();
    let q = (thread % pe.port.tx_queues().max(1) as usize) as u16;
    let sent = pe.port.tx_burst(q, cache, batch);
    let unsent: usize = if sent < n { batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum() } else { 0 };
    let pc = stats.port(p);
    pc.tx_packets.add(sent as u64);
    pc.tx_bytes.add((bytes - unsent) as u64);
    Some(sent)
}

impl Pipeline {
    /// Adds a packet to a port's tx batch, sending the batch first if it is full (head-end
    /// replication can put several copies of one packet on the underlay port).
    #[inline(always)]
    pub(super) fn enqueue(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        let tx = &mut self.tx[port as usize & (fdb::MAX_PORTS - 1)];
        if tx.is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        }
        if let Err(b) = tx.push(b) {
            self.enqueue_full(snap, port, b);
        }
    }

    /// A full tx batch: send it (the port stays on the dirty list), then queue the packet.
    #[cold]
    #[inline(never)]
    pub(super) fn enqueue_full(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        self.flush_port(snap, port);
        if let Err(b) = self.tx[port as usize & (fdb::MAX_PORTS - 1)].push(b) {
            self.discard(b, DropReason::TxFull, port); // flush_port empties the batch: unreachable
        }
    }

    /// Queues a priority domain's encapsulated frame ahead of the underlay port's tx batch
    /// (see [`Pipeline::flush_port`]).
    #[cold]
    #[inline(never)]
    pub(super) fn enqueue_first(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        if self.tx_first.0 != port && !self.tx_first.1.is_empty() {
            // The underlay moved: what waits for the old one goes (or drops) now.
            let old = self.tx_first.0;
            self.flush_port(snap, old);
            let mut left = std::mem::take(&mut self.tx_first.1);
            for b in left.drain() {
                self.discard(b, DropReason::TxFull, old);
            }
        }
        if self.tx[port as usize & (fdb::MAX_PORTS - 1)].is_empty() && self.tx_first.1.is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        }
        self.tx_first.0 = port;
        if let Err(b) = self.tx_first.1.push(b) {
            self.flush_port(snap, port);
            if let Err(b) = self.tx_first.1.push(b) {
                // A batch of priority frames still waits for room: this one is dropped.
                self.discard(b, DropReason::TxFull, port);
            }
        }
    }

    /// [`Pipeline::enqueue`] for a batch of frames to one port: one move of the indices.
    #[inline(always)]
    pub(super) fn enqueue_batch(&mut self, snap: &Snapshot, port: u16, frames: &mut Batch) {
        if frames.is_empty() {
            return;
        }
        let i = port as usize & (fdb::MAX_PORTS - 1);
        if self.tx[i].is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        } else if self.tx[i].room() < frames.len() {
            self.flush_port(snap, port);
        }
        self.tx[i].append(frames);
        // The tx batch was empty or had room for all: nothing is left (defensive).
        for b in frames.drain() {
            self.discard(b, DropReason::TxFull, port);
        }
    }

    /// Sends every pending tx batch; what a port does not take is dropped and counted.
    pub fn flush(&mut self, snap: &Snapshot) {
        for i in 0..self.n_dirty {
            let p = self.dirty[i & (fdb::MAX_PORTS - 1)];
            self.flush_port(snap, p);
        }
        self.n_dirty = 0;
        if !self.tx_first.1.is_empty() {
            // Priority frames held for room: the port stays dirty, they go first next time.
            self.dirty[0] = self.tx_first.0;
            self.n_dirty = 1;
        }
    }

    /// Sends one port's tx batch (it stays on the dirty list; an empty batch costs nothing):
    /// the priority frames waiting for it first, then the batch, whose frames the ring did
    /// not take are dropped.
    pub(super) fn flush_port(&mut self, snap: &Snapshot, p: u16) {
        if p == self.tx_first.0 && !self.tx_first.1.is_empty() {
            self.flush_first(snap, p);
        }
        let batch = &mut self.tx[p as usize & (fdb::MAX_PORTS - 1)];
        if batch.is_empty() {
            return;
        }
        let (reason, left) = match send_batch(&self.pool, &mut self.cache, &self.stats, self.thread, snap, p, batch) {
            Some(_) => (DropReason::TxFull, batch.len()),
            None => (DropReason::PortDown, batch.len()),
        };
        if left > 0 {
            for b in batch.drain() {
                self.stats.count_drop(reason, p);
                self.cache.free(b);
            }
        }
    }

    /// Sends the priority frames waiting for underlay port `p`; those its ring has no room
    /// for stay, first in line for the next flush (a down or removed port drops them).
    #[cold]
    #[inline(never)]
    pub(super) fn flush_first(&mut self, snap: &Snapshot, p: u16) {
        let batch = &mut self.tx_first.1;
        let n = batch.len();
        match send_batch(&self.pool, &mut self.cache, &self.stats, self.thread, snap, p, batch) {
            Some(sent) => {
                self.stats.event(Event::PriorityFirst, sent as u64);
                self.stats.event(Event::PriorityHeld, (n - sent) as u64);
                // Held past this burst: no frame may keep a tail lent by a guest (a port
                // that takes lent tails, vhost-user, copies only those it sends).
                if sent < n && self.cache.lending() {
                    Self::linearize_all(&self.pool, &mut self.cache, &self.stats, p, batch);
                }
            }
            None => {
                for b in batch.drain() {
                    self.stats.count_drop(DropReason::PortDown, p);
                    self.cache.free(b);
                }
            }
        }
    }

    /// Copies the lent tails of a tx batch for a port that may keep its buffers beyond the
    /// burst (kernel ports, rings); a packet that finds no buffer is dropped.
    #[cold]
    #[inline(never)]
    pub(super) fn linearize_all(pool: &Pool, cache: &mut PoolCache, stats: &ThreadStats, port: u16, batch: &mut Batch) {
        let mut kept = Batch::new();
        for mut b in batch.drain() {
            if pool.linearize(&mut b, cache) {
                let _ = kept.push(b).map_err(|b| cache.free(b)); // never fuller than `batch` was
            } else {
                stats.count_drop(DropReason::NoBuffer, port);
                cache.free(b);
            }
        }
        std::mem::swap(batch, &mut kept);
    }
}

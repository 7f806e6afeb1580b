//! Node `tx`: per-port tx batches filled by the egress nodes and flushed once per burst (a
//! priority batch first on the underlay); what a ring does not take is dropped and counted
//! (`tx_full`, `port_down`).

use super::Pipeline;
use crate::batch::Batch;
use crate::buf::{BufId, Pool, PoolCache};
use crate::counters::{DropReason, Event, ThreadStats};
use crate::descriptor::{Descriptor, Next};
use crate::fdb;
use crate::snapshot::Snapshot;
use crate::trace::Node;
use crate::wire::MacAddr;

/// Node `tx` (with `police`'s drops: the port's policer counts where the port's frames are counted).
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Tx,
    name: "tx",
    nexts: &[Next::Drop],
    drops: &[
        DropReason::PortDown,
        DropReason::TxFull,
        DropReason::EgressMtu,
        DropReason::NoBuffer,
        DropReason::Policed,
    ],
    counts: &[
        Event::PriorityFirst,
        Event::PriorityHeld,
        Event::PriorityGuard,
        Event::PriorityNoSlot,
    ],
};

/// Flushes that sent priority frames and lost every ordinary one, with no ordinary frame
/// sent between them, after which a port's ordinary batch goes first once (see
/// [`Pipeline::flush_classes`]).
pub(super) const GUARD_AFTER: u8 = 4;

/// Shared egresses a thread can hold priority frames for at once (the underlay, trunks).
const FIRST_PORTS: usize = 4;

/// Batches of priority frames a queue holds for its port: 256 frames, 25 ms of a 10 000
/// frames/s control plane waiting out a stalled ring.
const HOLD_BATCHES: usize = 8;

/// One port's priority frames, sent ahead of its tx batch: a FIFO of batches.
#[derive(Default)]
pub(super) struct FirstQueue {
    port: u16,
    batches: [Batch; HOLD_BATCHES],
    /// The first batch in use, and how many are (from `head` on, wrapping).
    head: usize,
    used: usize,
    /// Flushes the ordinary class lost to this queue (see [`GUARD_AFTER`]).
    starved: u8,
    /// The frames at its front already counted as held (each is counted once, however many
    /// flushes it waits).
    counted: usize,
}

impl FirstQueue {
    fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Queues a frame at the back; gives it back when the queue is full.
    fn push(&mut self, b: BufId) -> Result<(), BufId> {
        if self.used == 0 {
            (self.head, self.used) = (0, 1);
        }
        let last = (self.head + self.used - 1) % HOLD_BATCHES;
        match self.batches[last].push(b) {
            Ok(()) => Ok(()),
            Err(b) if self.used < HOLD_BATCHES => {
                self.used += 1;
                self.batches[(last + 1) % HOLD_BATCHES].push(b)
            }
            Err(b) => Err(b),
        }
    }

    /// The batch at the front.
    fn front(&mut self) -> &mut Batch {
        &mut self.batches[self.head]
    }

    /// Drops the front batch from the queue once it is empty; whether any is left.
    fn advance(&mut self) -> bool {
        if self.batches[self.head].is_empty() && self.used > 0 {
            self.head = (self.head + 1) % HOLD_BATCHES;
            self.used -= 1;
        }
        self.used > 0
    }

    /// The batches in use, front first.
    fn in_use(&mut self) -> impl Iterator<Item = &mut Batch> {
        let (head, used) = (self.head, self.used);
        let (back, front) = self.batches.split_at_mut(head);
        front.iter_mut().chain(back.iter_mut()).take(used)
    }

    fn len(&mut self) -> usize {
        self.in_use().map(|b| b.len()).sum()
    }
}

/// A thread's priority queues ahead of shared egresses: a few, found by port (only priority
/// frames, a trickle, come here).
/// Node `tx`'s state: the pending batch per port id, and the ids with a non-empty batch
/// (each once).
pub(super) struct TxQueues {
    pub(super) batches: Box<[Batch; fdb::MAX_PORTS]>,
    /// Frames of priority bridge domains for shared egresses (the underlay, trunks), sent
    /// before the port's batch and held (not dropped) while its ring is full.
    pub(super) first: Box<FirstQueues>,
    pub(super) dirty: Box<[u16; fdb::MAX_PORTS]>,
    pub(super) n_dirty: usize,
}

impl TxQueues {
    pub(super) fn new() -> TxQueues {
        TxQueues {
            batches: super::boxed_array(Batch::new),
            first: Box::default(),
            dirty: Box::new([0; fdb::MAX_PORTS]),
            n_dirty: 0,
        }
    }
}

#[derive(Default)]
pub(super) struct FirstQueues {
    queues: [FirstQueue; FIRST_PORTS],
    /// Some queue may hold frames (set when one is queued, worked out again after each
    /// flush): the one test a flush of ordinary traffic makes.
    any: bool,
}

impl FirstQueues {
    /// Gives every held frame to `free` (the pipeline's teardown).
    pub(super) fn release(&mut self, mut free: impl FnMut(BufId)) {
        for q in &mut self.queues {
            for b in q.in_use() {
                b.drain().for_each(&mut free);
            }
            (q.used, q.counted) = (0, 0);
        }
    }

    /// Whether any priority frame may wait.
    #[inline(always)]
    pub(super) fn holding(&self) -> bool {
        self.any
    }

    /// The queue holding frames for `port`.
    fn held_for(&self, port: u16) -> Option<usize> {
        self.queues.iter().position(|q| q.port == port && !q.is_empty())
    }

    /// The queue for `port`: the one holding frames for it, else the one it had (its guard
    /// count kept), else an empty one; none when all hold frames for other ports.
    fn slot_for(&self, port: u16) -> Option<usize> {
        self.held_for(port)
            .or_else(|| self.queues.iter().position(|q| q.port == port))
            .or_else(|| self.queues.iter().position(FirstQueue::is_empty))
    }
}

/// Sends `batch` on port `p` as far as its ring takes it (lent tails linearized first for a
/// port that may keep buffers beyond the burst) and counts what went; what the ring did not
/// take stays in `batch`. `None`: the port is down or gone (nothing sent).
#[inline(always)]
pub(super) fn send_batch(
    pool: &Pool,
    cache: &mut PoolCache,
    stats: &ThreadStats,
    thread: usize,
    snap: &Snapshot,
    p: u16,
    batch: &mut Batch,
) -> Option<usize> {
    let pe = snap.port(p).filter(|pe| pe.port.link_up())?;
    if cache.lending() && !pe.port.takes_lent() {
        Pipeline::linearize_all(pool, cache, stats, p, batch);
    }
    if let Some((gateway, own)) = pe.deliver_as {
        address_to_port(pool, batch, gateway, own);
    }
    let bytes: usize = batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum();
    let n = batch.len();
    let q = (thread % pe.port.tx_queues().max(1) as usize) as u16;
    crate::faults::entering_tx(p);
    let sent = pe.port.tx_burst(q, cache, batch);
    crate::faults::left_tx();
    let unsent: usize =
        if sent < n { batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum() } else { 0 };
    let pc = stats.port(p);
    pc.tx_packets.add(sent as u64);
    pc.tx_bytes.add((bytes - unsent) as u64);
    Some(sent)
}

/// A gateway's port: the frames addressed to the gateway's MAC leave addressed to the port's
/// own (its kernel takes only those), once per batch on that port only.
#[cold]
fn address_to_port(pool: &Pool, batch: &mut Batch, gateway: MacAddr, own: MacAddr) {
    for b in batch.as_mut_slice() {
        let h = pool.head_mut(b);
        if let Some(dst) = h.get_mut(..6)
            && *dst == gateway.0
        {
            dst.copy_from_slice(&own.0);
        }
    }
}

impl Pipeline {
    /// Adds a packet to a port's tx batch, sending the batch first if it is full (head-end
    /// replication can put several copies of one packet on the underlay port).
    #[inline(always)]
    pub(super) fn hand_to_tx(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        let tx = &mut self.tx.batches[port as usize & (fdb::MAX_PORTS - 1)];
        if tx.is_empty() {
            self.tx.dirty[self.tx.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.tx.n_dirty += 1;
        }
        if let Err(b) = tx.push(b) {
            self.queue_when_full(snap, port, b);
        }
    }

    /// A full tx batch: send it (the port stays on the dirty list), then queue the packet.
    #[cold]
    #[inline(never)]
    pub(super) fn queue_when_full(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        self.flush_port(snap, port);
        if let Err(b) = self.tx.batches[port as usize & (fdb::MAX_PORTS - 1)].push(b) {
            self.discard(b, DropReason::TxFull, port); // flush_port empties the batch: unreachable
        }
    }

    /// Queues a priority domain's frame ahead of a shared egress's tx batch (the underlay's
    /// encapsulated frames, a trunk's; see [`Pipeline::flush_port`]). When every queue ahead
    /// holds frames for other ports, the frame joins the ordinary batch (`priority_no_slot`).
    #[cold]
    #[inline(never)]
    pub(super) fn hand_to_tx_first(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        let Some(i) = self.tx.first.slot_for(port) else {
            self.stats.event(Event::PriorityNoSlot, 1);
            return self.hand_to_tx(snap, port, b);
        };
        if self.tx.batches[port as usize & (fdb::MAX_PORTS - 1)].is_empty()
            && self.tx.first.queues[i].is_empty()
        {
            self.tx.dirty[self.tx.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.tx.n_dirty += 1;
        }
        self.tx.first.any = true;
        let q = &mut self.tx.first.queues[i];
        if q.port != port {
            (q.port, q.starved) = (port, 0);
        }
        if let Err(b) = self.tx.first.queues[i].push(b) {
            self.flush_port(snap, port);
            if let Err(b) = self.tx.first.queues[i].push(b) {
                // A batch of priority frames still waits for room: this one is dropped.
                self.stats.port(port).priority_dropped.add(1);
                self.discard(b, DropReason::TxFull, port);
            }
        }
    }

    /// [`Pipeline::hand_to_tx`] for a batch of frames to one port: one move of the indices.
    #[inline(always)]
    pub(super) fn hand_batch_to_tx(&mut self, snap: &Snapshot, port: u16, frames: &mut Batch) {
        if frames.is_empty() {
            return;
        }
        let i = port as usize & (fdb::MAX_PORTS - 1);
        if self.tx.batches[i].is_empty() {
            self.tx.dirty[self.tx.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.tx.n_dirty += 1;
        } else if self.tx.batches[i].room() < frames.len() {
            self.flush_port(snap, port);
        }
        self.tx.batches[i].append(frames);
        // The tx batch was empty or had room for all: nothing is left (defensive).
        for b in frames.drain() {
            self.discard(b, DropReason::TxFull, port);
        }
    }

    /// Sends every pending tx batch; what a port does not take is dropped and counted.
    pub fn flush(&mut self, snap: &Snapshot) {
        for i in 0..self.tx.n_dirty {
            let p = self.tx.dirty[i & (fdb::MAX_PORTS - 1)];
            self.flush_port(snap, p);
        }
        self.tx.n_dirty = 0;
        if self.tx.first.holding() {
            // Priority frames held for room: their ports stay dirty, they go first next time.
            for q in self.tx.first.queues.iter().filter(|q| !q.is_empty()) {
                self.tx.dirty[self.tx.n_dirty] = q.port;
                self.tx.n_dirty += 1;
            }
            self.tx.first.any = self.tx.n_dirty > 0;
        }
    }

    /// Sends one port's tx batch (it stays on the dirty list; an empty batch costs nothing),
    /// after the priority frames waiting for it (see [`Pipeline::flush_classes`]); frames of
    /// the batch the ring did not take are dropped.
    pub(super) fn flush_port(&mut self, snap: &Snapshot, p: u16) {
        if self.tx.first.holding()
            && let Some(i) = self.tx.first.held_for(p)
        {
            return self.flush_classes(snap, p, i);
        }
        self.flush_ordinary(snap, p);
    }

    /// Sends port `p`'s ordinary tx batch and drops what its ring did not take; returns the
    /// frames it held and those it dropped.
    #[inline(always)]
    fn flush_ordinary(&mut self, snap: &Snapshot, p: u16) -> (usize, usize) {
        if self.taps.requests.tx_armed(p) {
            return self.flush_ordinary_captured(snap, p);
        }
        self.flush_ordinary_with::<false>(snap, p)
    }

    /// [`Pipeline::flush_ordinary`] for a captured port: its frames are copied as they leave
    /// ([`capture`](super::capture)). Out of line, so the uncaptured path keeps its code.
    #[cold]
    #[inline(never)]
    fn flush_ordinary_captured(&mut self, snap: &Snapshot, p: u16) -> (usize, usize) {
        self.flush_ordinary_with::<true>(snap, p)
    }

    #[inline(always)]
    fn flush_ordinary_with<const CAPTURE: bool>(
        &mut self,
        snap: &Snapshot,
        p: u16,
    ) -> (usize, usize) {
        let batch = &mut self.tx.batches[p as usize & (fdb::MAX_PORTS - 1)];
        let n = batch.len();
        if n == 0 {
            return (0, 0);
        }
        let captured = CAPTURE && self.taps.copy_tx(snap, p, &self.pool, batch, self.thread);
        let (reason, left) =
            match send_batch(&self.pool, &mut self.cache, &self.stats, self.thread, snap, p, batch)
            {
                Some(_) => (DropReason::TxFull, batch.len()),
                None => (DropReason::PortDown, batch.len()),
            };
        if captured {
            self.taps.sent(batch, Some(reason));
        }
        if left > 0 {
            for b in batch.drain() {
                self.stats.count_drop(reason, p);
                self.cache.free(b);
            }
        }
        (n, left)
    }

    /// Strict priority with a guard for the lowest class: port `p`'s priority frames (in
    /// `first.queues[i]`) go before its ordinary batch, and those the ring has no room for
    /// wait, first in line; but after [`GUARD_AFTER`] flushes in which the ring took priority
    /// frames and none of the ordinary ones (with none taking an ordinary frame between
    /// them), the ordinary batch goes first once
    /// (`priority_guard`), so a flood of a priority class cannot starve the lowest entirely:
    /// it gets at least one contended flush in `GUARD_AFTER + 1`, and priority frames wait
    /// at most one flush more.
    #[cold]
    #[inline(never)]
    pub(super) fn flush_classes(&mut self, snap: &Snapshot, p: u16, i: usize) {
        let waiting = !self.tx.batches[p as usize & (fdb::MAX_PORTS - 1)].is_empty();
        if waiting && self.tx.first.queues[i].starved >= GUARD_AFTER {
            // Until the ring takes some of the ordinary frames (a full ring takes nothing of
            // either class), they keep going first.
            let (n, dropped) = self.flush_ordinary(snap, p);
            if dropped < n {
                self.stats.event(Event::PriorityGuard, 1);
                self.tx.first.queues[i].starved = 0;
            }
            self.flush_first(snap, p, i);
            return;
        }
        let went_first = self.flush_first(snap, p, i);
        let (n, dropped) = self.flush_ordinary(snap, p);
        let q = &mut self.tx.first.queues[i];
        if dropped < n {
            q.starved = 0;
        } else if n > 0 && went_first > 0 {
            q.starved = q.starved.saturating_add(1);
        }
    }

    /// Sends the priority frames waiting for port `p` (in `first.queues[i]`), a batch at a
    /// time; those its ring has no room for stay, first in line for the next flush (a down
    /// or removed port drops them). Returns how many it sent.
    #[cold]
    #[inline(never)]
    pub(super) fn flush_first(&mut self, snap: &Snapshot, p: u16, i: usize) -> usize {
        let q = &mut self.tx.first.queues[i];
        let pc = self.stats.port(p);
        let mut total = 0;
        while !q.is_empty() {
            let n = q.front().len();
            let captured = self.taps.requests.tx_armed(p)
                && self.taps.copy_tx(snap, p, &self.pool, q.front(), self.thread);
            let result = send_batch(
                &self.pool,
                &mut self.cache,
                &self.stats,
                self.thread,
                snap,
                p,
                q.front(),
            );
            if captured {
                // Frames the ring had no room for wait, first in line: copied when they go.
                self.taps.sent(q.front(), result.is_none().then_some(DropReason::PortDown));
            }
            match result {
                Some(sent) => {
                    total += sent;
                    if sent < n || !q.advance() {
                        break;
                    }
                }
                None => {
                    let mut dropped = 0;
                    for batch in q.in_use() {
                        for b in batch.drain() {
                            dropped += 1;
                            self.stats.count_drop(DropReason::PortDown, p);
                            self.cache.free(b);
                        }
                    }
                    q.used = 0;
                    pc.priority_dropped.add(dropped);
                    break;
                }
            }
        }
        let held = q.len();
        self.stats.event(Event::PriorityFirst, total as u64);
        pc.tx_priority.add(total as u64);
        // What was sent left from the front, where the frames already counted are.
        let newly = held.saturating_sub(q.counted.saturating_sub(total));
        q.counted = held;
        if newly > 0 {
            self.stats.event(Event::PriorityHeld, newly as u64);
            pc.priority_held.add(newly as u64);
        }
        if held > 0 {
            // Held past this burst: no frame may keep a tail lent by a guest (a port that
            // takes lent tails, vhost-user, copies only those it sends).
            if self.cache.lending() {
                for batch in q.in_use() {
                    Self::linearize_all(&self.pool, &mut self.cache, &self.stats, p, batch);
                }
            }
        }
        total
    }

    /// Copies the lent tails of a tx batch for a port that may keep its buffers beyond the
    /// burst (kernel ports, rings); a packet that finds no buffer is dropped.
    #[cold]
    #[inline(never)]
    pub(super) fn linearize_all(
        pool: &Pool,
        cache: &mut PoolCache,
        stats: &ThreadStats,
        port: u16,
        batch: &mut Batch,
    ) {
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

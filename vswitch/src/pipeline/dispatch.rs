//! The fused dispatcher ([`super::Dispatch::Fused`]): a burst from a port goes to the
//! cache (stage 0) or, missed, cache off or traced, through stages 1 and 2 — classification
//! or decapsulation over the whole burst, then learning and forwarding frame by frame — and
//! what the slow path decides is remembered in the cache. The per-node dispatcher is
//! [`super::nodes`]; a traced burst's frames are recorded by [`super::trace`].

use super::classify::classify_port_burst;
use super::{BdRun, Ctx, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::BufId;
use crate::counters::{DropReason, Event};
use crate::emc::Decision;
use crate::snapshot::{NO_BD, PortEntry, PortKind, Snapshot};
use crate::trace::Step;
use crate::wire::ethernet;

impl Pipeline {
    /// Forwards a batch received on `in_port` and flushes the resulting tx batches.
    pub fn process(&mut self, snap: &Snapshot, in_port: u16, batch: &mut Batch) {
        let Some(port) = snap.port(in_port) else {
            for b in batch.drain() {
                self.stats.count_drop(DropReason::NoEgress, in_port);
                self.cache.free(b);
            }
            return;
        };
        if self.trace.requests.armed_for(in_port) && self.process_traced(snap, port, batch) {
            return;
        }
        self.process_port::<false>(snap, port, batch);
    }

    /// A burst from a port a trace request is armed on: its first frames (as many as the
    /// request still wants) traced through the slow path. False if the request wants no
    /// more (another thread took the last).
    #[cold]
    #[inline(never)]
    pub(super) fn process_traced(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
    ) -> bool {
        self.begin_trace(snap, port, batch, false);
        if !self.trace.on {
            return false;
        }
        self.process_port::<true>(snap, port, batch);
        self.end_trace();
        true
    }

    /// [`Pipeline::process`] for an existing port; `TRACE`: the burst is traced (it takes
    /// the slow path, compiled to record what each node decides).
    #[inline(always)]
    pub(super) fn process_port<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
    ) {
        let (in_port, n) = (port.id, batch.len());
        self.flows.emc.sync(snap.generation, self.fdb.generation(), self.now);
        // The cache serves every port (a port with port security only for the frames whose
        // key covers what the check reads: `Key::from_secured_port`) and an underlay with a
        // VTEP. When set, every path below fills `miss_keys` for the frames it hands to
        // stage 2.
        let cache_on = !TRACE && self.flows.emc.capacity() > 0 && self.worth_looking_up(in_port);
        // A local port's frames the exact-match cache misses, or all of them when it churns
        // there (or is off), are looked up by halves in the second level (`megaflow`), while
        // that pays (`forward_port_partly` decides for the misses).
        // (`exact`, `halves`: which of them the slow path's decisions fill, set where a
        // burst may take the slow path.)
        let bytes = if port.kind != PortKind::Underlay {
            if cache_on {
                self.flows.cached = true;
                self.forward_port_cached(snap, port, batch, false)
            } else if !TRACE && self.worth_halving(in_port) {
                (self.flows.cached, self.flows.halves) = (true, true);
                self.forward_port_cached(snap, port, batch, true)
            } else {
                self.flows.cached = false;
                self.forward_slow::<TRACE>(snap, port, batch)
            }
        } else {
            match snap.vtep.as_ref().filter(|_| cache_on) {
                Some(vtep) => {
                    (self.flows.cached, self.flows.exact, self.flows.halves) = (true, true, false);
                    let before = self.flows.emc.free_fills();
                    let (bytes, hits) = if self.nodes.on() {
                        self.forward_underlay_cached::<true>(snap, vtep, port, batch)
                    } else {
                        self.forward_underlay_cached::<false>(snap, vtep, port, batch)
                    };
                    if hits == n as u64 {
                        self.note_hit_burst(port.id, n);
                    } else {
                        self.note_burst(port.id, hits, n, before, 0);
                    }
                    bytes
                }
                None => {
                    self.flows.cached = false;
                    self.forward_slow::<TRACE>(snap, port, batch)
                }
            }
        };
        let pc = self.stats.port(in_port);
        pc.rx_packets.add(n as u64);
        pc.rx_bytes.add(bytes);
        self.stats.packets.add(n as u64);
        if self.known > 0 {
            self.stats.event(Event::KnownUnicast, std::mem::take(&mut self.known));
        }
        if !self.hold.parked.is_empty()
            && self.hold.parked.due(self.hold.shared.generation(), self.now)
        {
            self.retry_parked(snap);
        }
        self.flush(snap);
    }

    /// Stages 1 and 2 for a whole burst; returns its bytes. `TRACE`: record what each node
    /// decides (a traced burst; untraced ones compile without a check).
    #[inline(never)]
    pub(super) fn forward_slow<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
    ) -> u64 {
        if !TRACE && self.nodes.on() {
            return self.forward_slow_per_node(snap, port, batch);
        }
        self.stages_1_2::<TRACE, false>(snap, port, batch)
    }

    /// [`Pipeline::forward_slow`] by the per-node dispatcher ([`nodes`]).
    #[inline(never)]
    pub(super) fn forward_slow_per_node(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
    ) -> u64 {
        self.stages_1_2::<false, true>(snap, port, batch)
    }

    /// [`Pipeline::forward_slow`]'s work; `PER_NODE`: `l2-forward` hands frames onto the
    /// egress nodes' frames, run at the end ([`nodes`]).
    #[inline(always)]
    pub(super) fn stages_1_2<const TRACE: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
    ) -> u64 {
        let in_port = port.id;
        let n = batch.len();
        let mut ctxs = [Ctx::default(); BATCH];
        let bytes = if port.kind == PortKind::Underlay {
            self.classify_underlay_burst(snap, batch, &mut ctxs)
        } else {
            classify_port_burst(&self.pool, &self.fdb, port, snap, batch, &mut ctxs)
        };
        if TRACE {
            self.trace_classified(snap, port, &ctxs);
        }

        // Consecutive packets usually share a bridge domain: look it up once per run, and
        // count its packets and bytes once per run.
        let (mut run, mut run_entry) = (BdRun::new(NO_BD), None);
        for (i, c) in ctxs.iter().enumerate().take(n) {
            let b = batch.take(i);
            if TRACE {
                self.trace.burst.cur = i;
            }
            if let Some(r) = c.drop {
                self.discard(b, r, in_port);
                continue;
            }
            if c.reply {
                self.stats.event(Event::VtepAnswered, 1);
                if TRACE {
                    self.record(Step::VtepAnswer);
                }
                self.hand_to_port(snap, in_port, b, false);
                continue;
            }
            if c.taken {
                if TRACE {
                    self.record(Step::VtepLearned);
                }
                self.cache.free(b);
                continue;
            }
            if let Some(done) = run.switch_to(c.bd) {
                self.count_run(done);
                run_entry = snap.bd(c.bd);
            }
            let Some(bd) = run_entry else {
                self.discard(b, DropReason::NoBridgeDomain, in_port);
                continue;
            };
            run.count(c.len as usize);
            // `learn` stays fused with `l2-forward` per node too: a frame is forwarded with
            // the FDB the frames ahead of it left.
            let learnt = self.learn_source::<TRACE>(port, bd, c);
            self.decide::<TRACE, PER_NODE>(snap, port, bd, b, c, i, learnt);
        }
        self.count_run(run);
        batch.clear_taken();
        if PER_NODE {
            self.run_nodes(snap);
        }
        bytes
    }

    /// Remembers the slow path's decision for its `i`th frame in the caches the burst looked
    /// up (the exact-match cache, the second level, or both).
    #[inline(always)]
    pub(super) fn remember(&mut self, i: usize, decision: impl FnOnce() -> Option<Decision>) {
        if self.flows.cached
            && let Some(k) = self.flows.miss_keys[i & (BATCH - 1)]
            // A priority-tagged frame was classified after its tag was removed.
            && !(ethernet::is_tpid(k.ethertype()) && k.tci() & 0xfff == 0)
            && let Some(d) = decision()
        {
            if self.flows.exact {
                self.flows.emc.insert(&k, d.hit);
            }
            if self.flows.halves {
                self.flows.mega.insert(&k, d.source, d.destination);
            }
        }
    }

    /// After stage 1 of one frame: its drop, its answer, or stage 2 in its bridge domain.
    #[inline(always)]
    pub(super) fn forward_ctx(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        b: BufId,
        c: &Ctx,
        i: usize,
    ) {
        if let Some(r) = c.drop {
            return self.discard(b, r, port.id);
        }
        if c.reply {
            self.stats.event(Event::VtepAnswered, 1);
            return self.hand_to_tx(snap, port.id, b);
        }
        if c.taken {
            return self.cache.free(b);
        }
        let Some(bd) = snap.bd(c.bd) else {
            return self.discard(b, DropReason::NoBridgeDomain, port.id);
        };
        self.count_bd(c.bd, 1, c.len as u64);
        self.forward::<false>(snap, port, bd, b, c, i);
    }
}

//! Packet trace ([`crate::trace`]): a traced burst takes the slow path compiled with
//! `TRACE` (`forward_slow::<true>`), whose nodes record what they decided through
//! [`Pipeline::record`]; untraced bursts pay one check per burst (`Tracing::armed_for`), and
//! a test of `traced` only where a frame is dropped, waits for a next hop or learns
//! something new (paths shared with the cache's).

use super::{Ctx, NO_PEER, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::BufId;
use crate::emc::{self, Action, Hit, Key};
use crate::fdb::Dest;
use crate::snapshot::{PortEntry, PortKind, Snapshot};
use crate::trace::{FrameTrace, Step, Tracing};
use crate::vtep;
use crate::wire::MacAddr;
use std::sync::Arc;

/// The traces of one traced burst: the first `k` frames, `cur` the one being forwarded;
/// `dry`: a synthetic frame, which learns nothing and is not sent.
/// The packet trace's state: the switch's trace request (checked once per burst) and, while
/// a burst is traced (`on`), its frames' traces.
pub(super) struct Traces {
    pub(super) requests: Arc<Tracing>,
    pub(super) on: bool,
    pub(super) burst: Box<BurstTrace>,
}

impl Traces {
    pub(super) fn new() -> Traces {
        let burst = Box::new(BurstTrace {
            frames: std::array::from_fn(|_| FrameTrace::default()),
            k: 0,
            cur: 0,
            dry: false,
        });
        Traces { requests: Arc::new(Tracing::default()), on: false, burst }
    }
}

pub(super) struct BurstTrace {
    pub(super) frames: [FrameTrace; BATCH],
    pub(super) k: usize,
    pub(super) cur: usize,
    pub(super) dry: bool,
}

/// The MAC address in an FDB key.
pub(super) fn key_mac(key: u64) -> MacAddr {
    let b = key.to_be_bytes();
    MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl Pipeline {
    /// Records `s` for the frame being forwarded when this burst is traced.
    #[inline(always)]
    pub(super) fn note(&mut self, s: Step) {
        if self.trace.on {
            self.record(s);
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn record(&mut self, s: Step) {
        let t = &mut *self.trace.burst;
        if t.cur < t.k
            && let Some(f) = t.frames.get_mut(t.cur)
        {
            f.push(s);
        }
    }

    /// A synthetic frame is being traced: nothing may be learned, asked or sent.
    #[inline(always)]
    pub(super) fn dry(&self) -> bool {
        self.trace.on && self.trace.burst.dry
    }

    /// Queues a frame the slow path forwards on `port` (`first`: ahead of its tx batch); a
    /// synthetic frame is recorded and freed instead.
    #[inline(always)]
    pub(super) fn hand_to_port(&mut self, snap: &Snapshot, port: u16, b: BufId, first: bool) {
        if self.trace.on {
            return self.hand_to_port_traced(snap, port, b, first);
        }
        if first { self.hand_to_tx_first(snap, port, b) } else { self.hand_to_tx(snap, port, b) }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn hand_to_port_traced(
        &mut self,
        snap: &Snapshot,
        port: u16,
        b: BufId,
        first: bool,
    ) {
        let dry = self.trace.burst.dry;
        self.record(Step::Tx { port, first, sent: !dry });
        match (dry, first) {
            (true, _) => self.cache.free(b),
            (false, true) => self.hand_to_tx_first(snap, port, b),
            (false, false) => self.hand_to_tx(snap, port, b),
        }
    }

    /// Starts tracing the frames of a burst from `port` (the first the request still wants,
    /// or every one of a synthetic `batch`): their heads, and what the caches would decide
    /// (the exact-match cache's decision, or the second level's by the frame's halves).
    #[cold]
    #[inline(never)]
    pub(super) fn begin_trace(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &Batch,
        dry: bool,
    ) {
        let k = if dry { batch.len() } else { self.trace.requests.claim(batch.len()) };
        if k == 0 {
            return;
        }
        self.trace.on = true;
        self.flows.cached = false;
        let t = &mut *self.trace.burst;
        (t.k, t.cur, t.dry) = (k, 0, dry);
        let emc = (self.flows.emc.capacity() > 0).then(|| self.flows.emc.view());
        // A local port's frames the exact-match cache misses may be found by halves.
        let local = port.kind != PortKind::Underlay;
        if local && self.flows.mega.capacity() > 0 {
            self.flows.mega.sync(snap.generation, self.fdb.generation(), self.now);
        }
        let mega = (local && self.flows.mega.capacity() > 0).then(|| self.flows.mega.view());
        // An underlay's frames are looked up by their inner frame, when their outer headers
        // are what the cache's decapsulation admits.
        let underlay = snap.vtep.as_ref().filter(|_| port.kind == PortKind::Underlay);
        if underlay.is_some() {
            self.decap_cache.sync(snap.generation);
        }
        let decap_cache = self.decap_cache;
        let dest = |hit: Hit| {
            let to = match hit.action() {
                Action::Port { port, .. } => Dest::Port(port),
                Action::Peer { peer, .. } => Dest::Peer(peer),
            };
            (hit.bd(), to)
        };
        for (f, b) in t.frames.iter_mut().zip(batch.as_slice()).take(k) {
            let (h, len) = self.pool.head_and_len(b);
            f.start(port.id, len, h);
            (f.thread, f.dry, f.seq) = (self.thread, dry, self.trace.requests.next_seq());
            if emc.is_none() && mega.is_none() {
                continue;
            }
            let hit = match underlay {
                Some(vtep) => h
                    .first_chunk::<{ vtep::PLAIN_OUTER + emc::KEY_BYTES }>()
                    .map(|h| h.split_at(vtep::PLAIN_OUTER))
                    .and_then(|(outer, inner)| {
                        let d = outer
                            .first_chunk()
                            .and_then(|o| vtep.classify_plain(o, len, &decap_cache))?;
                        Key::from_peer(d.peer, d.bd, inner)
                            .and_then(|k| emc.as_ref()?.lookup_either(&k))
                            .filter(|hit| hit.admits(d.inner_len))
                    }),
                None if port.kind == PortKind::Underlay => None,
                None => {
                    let secured = port.security.is_some();
                    let key = if secured {
                        Key::lookup_from_secured_port(port.id, h)
                    } else {
                        Key::from_port(port.id, h)
                    };
                    key.and_then(|k| {
                        emc.as_ref()
                            .and_then(|e| e.lookup_either(&k))
                            .or_else(|| mega.as_ref()?.lookup(&k))
                    })
                    .filter(|hit| hit.admits(len as u32))
                }
            };
            f.push(Step::Cache { hit: hit.map(dest) });
        }
    }

    /// Hands the burst's traces to the control side.
    #[cold]
    #[inline(never)]
    pub(super) fn end_trace(&mut self) {
        self.trace.on = false;
        for f in &self.trace.burst.frames[..self.trace.burst.k] {
            self.trace.requests.hand_over(f.clone());
        }
    }

    /// Stage 1's decisions for the traced frames (drops, answers and what the VTEP takes
    /// are recorded where stage 2 acts on them).
    #[cold]
    #[inline(never)]
    pub(super) fn trace_classified(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        ctxs: &[Ctx; BATCH],
    ) {
        let t = &mut *self.trace.burst;
        for (c, f) in ctxs.iter().zip(t.frames.iter_mut()).take(t.k) {
            match c.drop {
                // Port security runs after classification, which passed.
                Some(r) if crate::trace::Node::dropping(r) == crate::trace::Node::PortSecurity => {
                    f.push(Step::Classify { bd: port.untagged_bd, vid: 0, pcp: 0 });
                }
                Some(_) => {}
                None if c.reply || c.taken => {}
                None if c.from_peer != NO_PEER => {
                    f.push(Step::Decap { peer: c.from_peer, bd: c.bd })
                }
                None => {
                    let vid = if c.tagged { snap.bd(c.bd).map_or(0, |b| b.vlan) } else { 0 };
                    f.push(Step::Classify { bd: c.bd, vid, pcp: (c.pcp >> 13) as u8 });
                    if port.security.is_some() {
                        f.push(Step::PortSecurity);
                    }
                }
            }
        }
    }

    /// Runs `frame`, as if received on port id `in_port`, through `snap` (VPP's `trace` of a
    /// made-up packet, OVS's `ofproto/trace`): stage 1 and 2 as for any frame, but nothing is
    /// learned, no next hop asked for and nothing sent; the cache and the ingress policer
    /// are not consulted. `None`: no such port, or no buffer holds the frame.
    pub fn trace_dry(&mut self, snap: &Snapshot, in_port: u16, frame: &[u8]) -> Option<FrameTrace> {
        let port = snap.port(in_port)?;
        let mut b = self.cache.alloc()?;
        if !self.pool.append(&mut b, frame) {
            self.cache.free(b);
            return None;
        }
        let mut batch = Batch::new();
        if let Err(b) = batch.push(b) {
            self.cache.free(b); // an empty batch takes a frame: unreachable
            return None;
        }
        self.begin_trace(snap, port, &batch, true);
        self.forward_slow::<true>(snap, port, &mut batch);
        self.trace.on = false;
        Some(std::mem::take(&mut self.trace.burst.frames[0]))
    }
}

//! The per-node dispatcher ([`Dispatch::PerNode`]): the egress nodes each run over a frame
//! of their own (VPP's vectors). Stage 1 runs over the burst (as fused), then `learn` and
//! `l2-forward` frame by frame, handing each frame to its next node's frame (`flood`,
//! `vlan-rewrite`, `vxlan-encap`; [`crate::graph`] lists every node's next nodes); those run
//! in the graph's order once the burst is decided (a frame full before then runs its node
//! early). The cache's hits that need a new tag go through `vlan-rewrite`'s frame too.
//!
//! It is the yardstick for fusing: `ci/insn-count.sh` with `PER_NODE=1` counts what the
//! per-node frames cost each workload (docs/perf/pipeline.md "Fused or per-node"). The fused
//! dispatcher ([`Dispatch::Fused`]) is the default. A port's frames of one burst leave in
//! the order they came, not in node order as in VPP: a frame for another node than the
//! frame before it runs the pending nodes first (a burst to one node stays one vector).
//! `learn` stays fused with `l2-forward` here too: run
//! over the burst first, a source learned late in a burst would change where an earlier
//! frame goes (a flood became a reflect drop against the reference model). Traced bursts
//! and the misses of a burst the cache partly hit take the fused path.

use super::forward::Verdict;
use super::rewrite::tci_of;
use super::{Ctx, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::BufId;
use crate::counters::DropReason;
use crate::snapshot::{BdEntry, PortEntry, Snapshot};
use crate::trace::Node;

/// How a pipeline runs its nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dispatch {
    /// Nodes fused where a measurement showed it pays (the default).
    #[default]
    Fused,
    /// Every node over a frame of its own.
    PerNode,
}

/// What a frame carries to its next node (VPP's buffer metadata).
#[derive(Clone, Copy, Default)]
pub(super) struct Meta {
    /// The egress port (`vlan-rewrite`), the peer (`vxlan-encap`), the ingress (`flood`).
    pub(super) port: u16,
    pub(super) bd: u16,
    pub(super) pcp: u16,
    pub(super) from_peer: u16,
    pub(super) want: Option<u16>,
    pub(super) len: u32,
    pub(super) tagged: bool,
    /// A cache hit: its length was checked against the egress when the hit was filled.
    pub(super) cached: bool,
}

/// One node's pending frames.
pub(super) struct Frame {
    bufs: Batch,
    meta: [Meta; BATCH],
}

impl Frame {
    fn new() -> Frame {
        Frame { bufs: Batch::new(), meta: [Meta::default(); BATCH] }
    }

    /// Adds a frame, or gives it back when full.
    #[inline(always)]
    fn push(&mut self, b: BufId, m: Meta) -> Result<(), BufId> {
        let i = self.bufs.len();
        self.bufs.push(b)?;
        self.meta[i & (BATCH - 1)] = m;
        Ok(())
    }
}

/// The per-node dispatcher's state: whether it runs ([`Dispatch::PerNode`]) and its nodes'
/// frames.
pub(super) struct PerNode {
    on: bool,
    pub(super) frames: Box<Frames>,
}

impl PerNode {
    pub(super) fn new() -> PerNode {
        PerNode { on: false, frames: Box::new(Frames::new()) }
    }

    /// Whether the per-node dispatcher runs: a constant `false` where it is not built in,
    /// so the fused path carries no test for it.
    #[inline(always)]
    pub(super) fn on(&self) -> bool {
        cfg!(feature = "per-node") && self.on
    }
}

/// The order the nodes with frames run in: the graph's ([`crate::graph::check`], which a
/// test compares it with; `flood` hands frames to the other two).
const ORDER: [Node; 3] = [Node::Flood, Node::VlanRewrite, Node::Encap];

/// The frames of the nodes `l2-forward`, `flood` and the cache hand frames to, and the
/// order to run them in ([`ORDER`]).
pub(super) struct Frames {
    flood: Frame,
    rewrite: Frame,
    encap: Frame,
    order: [Node; 3],
    /// The node the last frame of the burst was handed to: a frame for another node runs
    /// what is pending first, so a port's frames leave in the order they came.
    last: Option<Node>,
}

impl Frames {
    pub(super) fn new() -> Frames {
        Frames {
            flood: Frame::new(),
            rewrite: Frame::new(),
            encap: Frame::new(),
            order: ORDER,
            last: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.flood.bufs.is_empty() && self.rewrite.bufs.is_empty() && self.encap.bufs.is_empty()
    }

    /// The frame of node `n`, if the dispatcher holds one for it.
    #[inline(always)]
    fn of(&mut self, n: Node) -> Option<&mut Frame> {
        match n {
            Node::Flood => Some(&mut self.flood),
            Node::VlanRewrite => Some(&mut self.rewrite),
            Node::Encap => Some(&mut self.encap),
            _ => None,
        }
    }
}

impl Pipeline {
    /// Runs this pipeline's nodes as `d` says.
    ///
    /// Without the `per-node` feature only [`Dispatch::Fused`] runs: asked for per node, the
    /// pipeline stays fused and says so in the log.
    pub fn set_dispatch(&mut self, d: Dispatch) {
        if d == Dispatch::PerNode && !cfg!(feature = "per-node") {
            tracing::warn!(
                "the per-node dispatcher is not built in (feature per-node): the pipeline stays fused"
            );
        }
        self.nodes.on = d == Dispatch::PerNode && cfg!(feature = "per-node");
    }

    /// A cache hit that needs a new tag, onto `vlan-rewrite`'s frame (out of line: the fused
    /// hit path around it stays as it compiles without it).
    #[inline(never)]
    pub(super) fn hand_hit_to_rewrite(
        &mut self,
        snap: &Snapshot,
        b: BufId,
        port: u16,
        tagged: bool,
        want: Option<(u16, u16)>,
    ) {
        // The hit's TPID is its port's (filled from it; the cache empties when the snapshot
        // changes): vlan-rewrite reads it from the port, as for the slow path's frames.
        let m = Meta { port, tagged, want: want.map(|(_, v)| v), cached: true, ..Meta::default() };
        self.in_order(snap, Node::VlanRewrite);
        self.hand_to_frame(snap, Node::Cache, Node::VlanRewrite, b, m);
    }

    /// Puts a frame on the frame of the node `l2-forward` chose for it.
    #[inline(always)]
    pub(super) fn hand_on_per_node(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        bd: &BdEntry,
        b: BufId,
        c: &Ctx,
        v: Verdict,
    ) {
        let m = Meta {
            bd: bd.id,
            tagged: c.tagged,
            pcp: c.pcp,
            from_peer: c.from_peer,
            len: c.len,
            ..Meta::default()
        };
        let (to, m) = match v {
            Verdict::Drop(r, p) => return self.discard(b, r, p),
            Verdict::Port(pe, want, len) => {
                (Node::VlanRewrite, Meta { port: pe.id, want, len: len as u32, ..m })
            }
            Verdict::Peer(p) => (Node::Encap, Meta { port: p, ..m }),
            Verdict::Flood => (Node::Flood, Meta { port: port.id, ..m }),
        };
        self.in_order(snap, to);
        self.hand_to_frame(snap, Node::Forward, to, b, m);
    }

    /// Before a frame goes onto node `to`'s frame: when the frame before it went to another
    /// node, the pending nodes run first. Without it a burst's unicast frame could leave
    /// before a flooded one that came first (flood's copies join `vxlan-encap`'s frame after
    /// it) — and the far switch, learning the later frame's source first, dropped the earlier
    /// one as `reflect` (issue 48's seed).
    #[inline(always)]
    fn in_order(&mut self, snap: &Snapshot, to: Node) {
        if self.nodes.frames.last.is_some_and(|n| n != to) {
            self.run_nodes(snap);
        }
        self.nodes.frames.last = Some(to);
    }

    /// Hands a frame from node `from` to node `to`'s frame (an edge of the graph), running
    /// `to` first if its frame is full.
    #[inline(always)]
    pub(super) fn hand_to_frame(
        &mut self,
        snap: &Snapshot,
        from: Node,
        to: Node,
        b: BufId,
        m: Meta,
    ) {
        debug_assert!(
            from.next_index(crate::descriptor::Next::Node(to)).is_some(),
            "{} → {} is not an edge of the graph",
            from.name(),
            to.name()
        );
        let Some(f) = self.nodes.frames.of(to) else {
            return self.discard(b, DropReason::NoEgress, m.port); // not a node with a frame: unreachable
        };
        let Err(b) = f.push(b, m) else { return };
        self.run_node(snap, to);
        let again = match self.nodes.frames.of(to) {
            Some(f) => f.push(b, m),
            None => Err(b),
        };
        if let Err(b) = again {
            self.discard(b, DropReason::NoEgress, m.port); // the node emptied its frame: unreachable
        }
    }

    /// Runs the nodes holding frames, in the graph's order (`flood` hands frames to the
    /// other two).
    #[inline(always)]
    pub(super) fn run_nodes(&mut self, snap: &Snapshot) {
        self.nodes.frames.last = None;
        if !self.nodes.frames.is_empty() {
            for n in self.nodes.frames.order {
                self.run_node(snap, n);
            }
        }
    }

    #[inline(never)]
    fn run_node(&mut self, snap: &Snapshot, node: Node) {
        match node {
            Node::Flood => self.run_flood(snap),
            Node::VlanRewrite => self.run_rewrite(snap),
            Node::Encap => self.run_encap(snap),
            _ => {}
        }
    }

    /// Node `flood` over its frame.
    fn run_flood(&mut self, snap: &Snapshot) {
        for i in 0..self.nodes.frames.flood.bufs.len() {
            let (b, m) = (
                self.nodes.frames.flood.bufs.take(i),
                self.nodes.frames.flood.meta[i & (BATCH - 1)],
            );
            let Some(bd) = snap.bd(m.bd) else {
                self.discard(b, DropReason::NoBridgeDomain, m.port);
                continue;
            };
            let c = Ctx {
                tagged: m.tagged,
                pcp: m.pcp,
                from_peer: m.from_peer,
                len: m.len,
                ..Ctx::default()
            };
            self.flood::<false, true>(snap, bd, m.port, b, &c);
        }
        self.nodes.frames.flood.bufs.clear_taken();
    }

    /// Node `vlan-rewrite` over its frame, handing each frame to `tx`.
    fn run_rewrite(&mut self, snap: &Snapshot) {
        for i in 0..self.nodes.frames.rewrite.bufs.len() {
            let (mut b, m) = (
                self.nodes.frames.rewrite.bufs.take(i),
                self.nodes.frames.rewrite.meta[i & (BATCH - 1)],
            );
            let Some(pe) = snap.port(m.port) else {
                self.discard(b, DropReason::NoEgress, m.port);
                continue;
            };
            if !m.cached {
                self.hand_to_rewrite::<false>(
                    snap,
                    pe,
                    m.bd,
                    b,
                    m.tagged,
                    m.pcp,
                    m.want,
                    m.len as usize,
                );
                continue;
            }
            let pcp = if m.tagged { tci_of(self.pool.head(&b)) & 0xf000 } else { 0 };
            if self.retag(&mut b, m.tagged, pcp, m.want.map(|v| (pe.tpid, v))) {
                self.hand_to_tx(snap, pe.id, b);
            } else {
                self.drop_counted(b, DropReason::Runt, pe.id);
            }
        }
        self.nodes.frames.rewrite.bufs.clear_taken();
    }

    /// Node `vxlan-encap` over its frame (the slow path's; the cache's hits to peers have
    /// their own, [`Pipeline::encap_pending`]).
    fn run_encap(&mut self, snap: &Snapshot) {
        for i in 0..self.nodes.frames.encap.bufs.len() {
            let (b, m) = (
                self.nodes.frames.encap.bufs.take(i),
                self.nodes.frames.encap.meta[i & (BATCH - 1)],
            );
            match snap.bd(m.bd) {
                Some(bd) => self.hand_to_encap::<false>(snap, bd, b, m.tagged, m.port),
                None => self.discard(b, DropReason::NoBridgeDomain, m.port),
            }
        }
        self.nodes.frames.encap.bufs.clear_taken();
    }
}

#[cfg(test)]
mod tests {
    /// The nodes with frames run in the graph's order.
    #[test]
    fn the_frames_run_in_the_graphs_order() {
        let all = crate::graph::check().expect("one graph");
        let graphs: Vec<_> = all.into_iter().filter(|n| super::ORDER.contains(n)).collect();
        assert_eq!(graphs, super::ORDER);
    }
}

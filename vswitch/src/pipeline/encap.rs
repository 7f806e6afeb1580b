//! Node `vxlan-encap`: frames to remote VTEPs encapsulated ([`crate::vtep`]) with their
//! network's marking, one at a time from the slow path or a burst at a time from the cache
//! (the outer layout chosen once, the peer looked up once per run), and queued on the
//! underlay (priority networks' frames ahead).

use super::{BdRun, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::BufId;
use crate::counters::{DropReason, Event};
use crate::descriptor::{Descriptor, Next};
use crate::emc::{Action, Hit};
use crate::snapshot::{BdEntry, NO_BD, PortEntry, PortKind, Snapshot};
use crate::trace::{Node, Step};
use crate::vtep::{Layout, Marking, PeerEntry, VtepEntry};
use crate::wire::MacAddr;

/// Node `vxlan-encap`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Encap,
    name: "vxlan-encap",
    nexts: &[Next::Node(Node::NeighborHold), Next::Node(Node::Tx), Next::Drop],
    drops: &[DropReason::EncapTooBig, DropReason::VxlanNoRoute],
    counts: &[Event::Encapsulated],
};

/// What consecutive frames of an encapsulated burst share, looked up again only when it
/// changes: the peer, and the marking of the bridge domain.
pub(super) struct LastPeer<'s> {
    peer: Option<&'s PeerEntry>,
    bd: u16,
    mark: Marking,
}

impl Default for LastPeer<'_> {
    fn default() -> Self {
        LastPeer { peer: None, bd: NO_BD, mark: Marking::UNMARKED }
    }
}

impl LastPeer<'_> {
    #[inline(always)]
    fn marking(&mut self, snap: &Snapshot, bd: u16) -> Marking {
        if bd != self.bd {
            (self.bd, self.mark) = (bd, snap.marking(bd));
        }
        self.mark
    }
}

impl Pipeline {
    /// Egress to a remote VTEP: untag, encapsulate, enqueue on the underlay port.
    #[inline(always)]
    pub(super) fn hand_to_encap<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        bd: &BdEntry,
        mut b: BufId,
        tagged: bool,
        peer: u16,
    ) {
        let (Some(vtep), Some(pe), Some(vni)) = (snap.vtep.as_ref(), snap.peer(peer), bd.vni)
        else {
            return self.discard(b, DropReason::VxlanNoRoute, 0);
        };
        if let Err(r) = self.untag(&mut b, tagged) {
            return self.discard(b, r, vtep.underlay_port);
        }
        let mark = snap.marking(bd.id);
        if TRACE {
            self.record(Step::Encap { peer, vni, dscp: mark.dscp, priority: mark.priority });
        }
        let Ok(mac) = self.next_hop(snap, vtep, pe) else {
            return self.hand_to_hold(vtep, b, peer, vni);
        };
        let r = vtep.encap(&self.pool, &mut b, pe, vni, mark);
        if self.sent_encapsulated(snap, vtep, b, r, (mac, mark.priority)) {
            self.stats.event(Event::Encapsulated, 1);
        }
    }

    /// Queues an encapsulated frame on the underlay port (to the resolved next hop `mac`,
    /// when given), or drops it for the reason the encapsulation gave; true if queued.
    #[inline(always)]
    pub(super) fn sent_encapsulated(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        mut b: BufId,
        r: Result<(), DropReason>,
        (mac, first): (Option<MacAddr>, bool),
    ) -> bool {
        match r {
            Ok(()) => {
                if let Some(m) = mac {
                    self.set_next_hop(&mut b, m);
                }
                self.hand_to_port(snap, vtep.underlay_port, b, first);
                true
            }
            Err(r) => {
                self.discard(b, r, vtep.underlay_port);
                false
            }
        }
    }

    /// Encapsulates the frames the cache sent to remote VTEPs (VPP's encap node): the outer
    /// layout chosen once, the peer looked up once per run of frames to it.
    #[inline(never)]
    pub(super) fn encap_pending(&mut self, snap: &Snapshot) {
        let Some(vtep) = snap.vtep.as_ref() else {
            for b in self.flows.to_peer.drain() {
                self.stats.count_drop(DropReason::VxlanNoRoute, 0);
                self.cache.free(b);
            }
            return;
        };
        // Marking (a bridge domain's DSCP, ECN copied) costs only where some domain has it.
        match (vtep.layout(), snap.marked) {
            (Layout::V4, false) => self.encap_pending_as::<true, 14, 50, false>(snap, vtep),
            (Layout::V4Tagged, false) => self.encap_pending_as::<true, 18, 54, false>(snap, vtep),
            (Layout::V6, false) => self.encap_pending_as::<false, 14, 70, false>(snap, vtep),
            (Layout::V6Tagged, false) => self.encap_pending_as::<false, 18, 74, false>(snap, vtep),
            (Layout::V4, true) => self.encap_pending_as::<true, 14, 50, true>(snap, vtep),
            (Layout::V4Tagged, true) => self.encap_pending_as::<true, 18, 54, true>(snap, vtep),
            (Layout::V6, true) => self.encap_pending_as::<false, 14, 70, true>(snap, vtep),
            (Layout::V6Tagged, true) => self.encap_pending_as::<false, 18, 74, true>(snap, vtep),
        }
    }

    #[inline(always)]
    pub(super) fn encap_pending_as<
        const V4: bool,
        const L2: usize,
        const OUTER: usize,
        const MARK: bool,
    >(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
    ) {
        let (mut last, mut out) = (LastPeer::default(), [Batch::new(), Batch::new()]);
        for i in 0..self.flows.to_peer.len() {
            let b = self.flows.to_peer.take(i);
            let hit = self.flows.to_peer_hits[i & (BATCH - 1)];
            self.encap_hit::<V4, L2, OUTER, MARK>(snap, vtep, &mut last, b, hit, &mut out);
        }
        self.flows.to_peer.clear_taken();
        self.send_encapsulated::<MARK>(snap, vtep, &mut out);
    }

    /// A burst from a local port whose every frame the cache sends to a remote VTEP (the
    /// common case of a pod talking across nodes): straight from the probe to encapsulation,
    /// without the in-order pass and the encapsulation queue. `bytes`: the burst's. (The
    /// caller counts the hits.)
    #[inline(never)]
    pub(super) fn encap_burst(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
        found: &[(Hit, u32); BATCH],
        bytes: u64,
    ) {
        // Bridge domain counters first, apart from the loop: an access port's frames all
        // belong to its one domain.
        let burst = &found[..batch.len()];
        if port.kind == PortKind::Access {
            self.count_bd(port.untagged_bd, burst.len() as u64, bytes);
        } else {
            let mut run = BdRun::new(NO_BD);
            for (hit, len) in burst {
                if let Some(done) = run.add(hit.bd(), *len as usize) {
                    self.count_run(done);
                }
            }
            self.count_run(run);
        }
        match snap.vtep.as_ref().map(|v| (v, v.layout(), snap.marked)) {
            Some((vtep, Layout::V4, false)) => {
                self.encap_burst_as::<true, 14, 50, false>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V4Tagged, false)) => {
                self.encap_burst_as::<true, 18, 54, false>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V6, false)) => {
                self.encap_burst_as::<false, 14, 70, false>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V6Tagged, false)) => {
                self.encap_burst_as::<false, 18, 74, false>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V4, true)) => {
                self.encap_burst_as::<true, 14, 50, true>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V4Tagged, true)) => {
                self.encap_burst_as::<true, 18, 54, true>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V6, true)) => {
                self.encap_burst_as::<false, 14, 70, true>(snap, vtep, batch, found)
            }
            Some((vtep, Layout::V6Tagged, true)) => {
                self.encap_burst_as::<false, 18, 74, true>(snap, vtep, batch, found)
            }
            None => {
                for b in batch.drain() {
                    self.discard(b, DropReason::VxlanNoRoute, 0);
                }
            }
        }
    }

    #[inline(always)]
    pub(super) fn encap_burst_as<
        const V4: bool,
        const L2: usize,
        const OUTER: usize,
        const MARK: bool,
    >(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        batch: &mut Batch,
        found: &[(Hit, u32); BATCH],
    ) {
        let (mut last, mut out) = (LastPeer::default(), [Batch::new(), Batch::new()]);
        for i in 0..batch.len() {
            let b = batch.take(i);
            self.encap_hit::<V4, L2, OUTER, MARK>(
                snap,
                vtep,
                &mut last,
                b,
                found[i & (BATCH - 1)].0,
                &mut out,
            );
        }
        batch.clear_taken();
        self.send_encapsulated::<MARK>(snap, vtep, &mut out);
    }

    /// Encapsulates one frame the cache sends to a peer (`last`: the previous frame's peer,
    /// looked up again only when it changes) and adds it to `out`, for the underlay; true if
    /// added.
    #[inline(always)]
    pub(super) fn encap_hit<
        's,
        const V4: bool,
        const L2: usize,
        const OUTER: usize,
        const MARK: bool,
    >(
        &mut self,
        snap: &'s Snapshot,
        vtep: &VtepEntry,
        last: &mut LastPeer<'s>,
        mut b: BufId,
        hit: Hit,
        out: &mut [Batch; 2],
    ) -> bool {
        let Action::Peer { peer, vni } = hit.action() else {
            self.discard(b, DropReason::NoEgress, 0); // only peer hits come here
            return false;
        };
        let pe = match last.peer {
            Some(pe) if pe.id == peer => pe,
            _ => match snap.peer(peer) {
                Some(pe) => *last.peer.insert(pe),
                None => {
                    self.discard(b, DropReason::VxlanNoRoute, 0);
                    return false;
                }
            },
        };
        if let Err(r) = self.untag(&mut b, hit.tagged_in()) {
            self.discard(b, r, vtep.underlay_port);
            return false;
        }
        // A peer whose next hop is resolved: the MAC first (or the frame waits).
        let mac = if pe.resolve.is_some() {
            match self.next_hop(snap, vtep, pe) {
                Ok(mac) => mac,
                Err(()) => {
                    self.hand_to_hold(vtep, b, peer, vni);
                    return false;
                }
            }
        } else {
            None
        };
        let mark = if MARK { last.marking(snap, hit.bd()) } else { Marking::UNMARKED };
        if let Err(r) = vtep.encap_as::<V4, L2, OUTER, MARK>(&self.pool, &mut b, pe, vni, mark) {
            self.discard(b, r, vtep.underlay_port);
            return false;
        }
        if let Some(m) = mac {
            self.set_next_hop(&mut b, m);
        }
        match out[mark.priority as usize].push(b) {
            Ok(()) => true,
            Err(b) => {
                self.discard(b, DropReason::NoEgress, 0); // `out` holds a burst: unreachable
                false
            }
        }
    }

    /// Writes the next hop's MAC as an encapsulated frame's destination.
    #[inline(always)]
    pub(super) fn set_next_hop(&self, b: &mut BufId, mac: MacAddr) {
        if let Some(dst) = self.pool.head_mut(b).first_chunk_mut::<6>() {
            *dst = mac.0;
        }
    }

    /// Queues a burst's encapsulated frames on the underlay port at once: `out[0]` in its tx
    /// batch, `out[1]` (priority domains') ahead of it.
    #[inline(always)]
    pub(super) fn send_encapsulated<const MARK: bool>(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        out: &mut [Batch; 2],
    ) {
        self.stats.event(Event::Encapsulated, out[0].len() as u64);
        self.hand_batch_to_tx(snap, vtep.underlay_port, &mut out[0]);
        if MARK && !out[1].is_empty() {
            self.stats.event(Event::Encapsulated, out[1].len() as u64);
            for b in out[1].drain() {
                self.hand_to_tx_first(snap, vtep.underlay_port, b);
            }
        }
    }
}

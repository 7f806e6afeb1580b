//! Node `vlan-rewrite`: a frame given its egress port's tagging (push, pop, TPID) and
//! checked against its MTU, then handed to `tx` (a priority domain's frame on a trunk ahead
//! of the others).

use super::Pipeline;
use crate::buf::BufId;
use crate::counters::DropReason;
use crate::descriptor::{Descriptor, Next};
use crate::snapshot::{PortEntry, PortKind, Snapshot};
use crate::trace::{Node, Retag, Step};
use crate::vlan;
use crate::wire::ethernet;

/// Node `vlan-rewrite`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::VlanRewrite,
    name: "vlan-rewrite",
    nexts: &[Next::Node(Node::Tx), Next::Drop],
    drops: &[],
    counts: &[],
};

/// The TCI of a tagged frame whose head holds its tag.
#[inline(always)]
pub(super) fn tci_of(h: &[u8]) -> u16 {
    let tci = ethernet::field::TCI;
    h.get(tci..tci + 2).map_or(0, |t| u16::from_be_bytes([t[0], t[1]]))
}

/// Whether a frame of bridge domain `bd` leaves port `pe` ahead of the others: a priority
/// domain's frame on a trunk, which several domains share. Such frames are not cached (the
/// cache's hits go to the ordinary batch); a priority plane is a trickle.
#[inline(always)]
pub(super) fn leaves_first(snap: &Snapshot, bd: u16, pe: &PortEntry) -> bool {
    snap.marked && pe.kind == PortKind::Trunk && snap.marking(bd).priority
}

impl Pipeline {
    /// Egress to a local port: VLAN rewrite for the port's mode, MTU check, enqueue.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hand_to_rewrite<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        pe: &PortEntry,
        bd: u16,
        mut b: BufId,
        tagged: bool,
        pcp: u16,
        want: Option<u16>,
        len: usize,
    ) {
        if TRACE {
            let op = match (tagged, want) {
                (false, None) => Retag::Keep,
                (false, Some(vid)) => Retag::Push { tpid: pe.tpid, vid },
                (true, None) => Retag::Pop,
                (true, Some(_)) => Retag::Tpid(pe.tpid),
            };
            self.record(Step::VlanRewrite { port: pe.id, op });
        }
        if !self.retag(&mut b, tagged, pcp, want.map(|v| (pe.tpid, v))) {
            return self.discard(b, DropReason::Runt, pe.id);
        }
        // The L3 length is the same whatever the tagging: `len` less the ingress L2 header.
        let l3 = len - ethernet::header_len(tagged);
        if l3 > pe.mtu as usize {
            return self.discard(b, DropReason::EgressMtu, pe.id);
        }
        let first = leaves_first(snap, bd, pe);
        if TRACE {
            return self.hand_to_port_traced(snap, pe.id, b, first);
        }
        if first {
            return self.hand_to_tx_first(snap, pe.id, b);
        }
        self.hand_to_tx(snap, pe.id, b);
    }

    /// Gives a frame the tagging of its egress: `want` is the (TPID, VLAN ID) it leaves with,
    /// or none; `pcp` is the priority of a pushed tag. False if the frame is too short.
    #[inline(always)]
    pub(super) fn retag(
        &self,
        b: &mut BufId,
        tagged: bool,
        pcp: u16,
        want: Option<(u16, u16)>,
    ) -> bool {
        match (tagged, want) {
            (false, None) => true,
            (false, Some((tpid, v))) => vlan::push(&self.pool, b, tpid, pcp | v),
            (true, None) => vlan::pop(self.pool.view(), b),
            (true, Some((tpid, _))) => {
                vlan::set_tpid(&self.pool, b, tpid);
                true
            }
        }
    }

    /// Removes the tag of a frame that arrived tagged (VXLAN carries inner frames untagged).
    #[inline(always)]
    pub(super) fn untag(&self, b: &mut BufId, tagged: bool) -> Result<(), DropReason> {
        if tagged && !vlan::pop(self.pool.view(), b) { Err(DropReason::Runt) } else { Ok(()) }
    }
}

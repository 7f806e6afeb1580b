//! Node `vxlan-decap` (stage 1, the underlay): outer headers checked and stripped
//! ([`crate::vtep`]), (source, VNI) → bridge domain; the VTEP's own neighbor traffic
//! (answers to its requests learned, requests for its address answered).

use super::classify::fill_l2;
use super::{Ctx, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::{BufId, Pool};
use crate::counters::{DropReason, Event};
use crate::descriptor::{Descriptor, Next};
use crate::neigh;
use crate::snapshot::Snapshot;
use crate::suppress;
use crate::trace::Node;
use std::net::IpAddr;

/// Node `vxlan-decap`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Decap,
    name: "vxlan-decap",
    nexts: &[Next::Node(Node::Learn), Next::Drop],
    drops: &[
        DropReason::UnderlayNotVxlan,
        DropReason::UnderlayForeignMac,
        DropReason::VxlanMalformed,
        DropReason::VxlanBadChecksum,
        DropReason::VxlanBadFlags,
        DropReason::VxlanUnknownVni,
        DropReason::VxlanUnknownVtep,
        DropReason::VxlanCeNotEct,
    ],
    counts: &[Event::Decapsulated],
};

/// Node `vtep`: an answer to the VTEP's own request is learned and ends here.
pub(crate) const VTEP: Descriptor = Descriptor {
    node: Node::Vtep,
    name: "vtep",
    nexts: &[Next::Node(Node::Tx)],
    drops: &[],
    counts: &[Event::VtepAnswered, Event::NeighborLearned],
};

impl Pipeline {
    /// Stage 1 for a burst from the underlay: VXLAN decap, then the inner frames' keys.
    pub(super) fn classify_underlay_burst(
        &mut self,
        snap: &Snapshot,
        batch: &mut Batch,
        ctxs: &mut [Ctx; BATCH],
    ) -> u64 {
        self.decap_cache.sync(snap.generation);
        let (mut bytes, mut decapsulated) = (0u64, 0u64);
        for (b, ctx) in batch.as_mut_slice().iter_mut().zip(ctxs.iter_mut()) {
            bytes += self.pool.pkt_len(b) as u64;
            let r = self.decap(snap, b);
            decapsulated += r.is_ok() as u64;
            self.underlay_ctx(snap, b, r, ctx);
        }
        if decapsulated > 0 {
            self.stats.event(Event::Decapsulated, decapsulated);
        }
        bytes
    }

    /// Validates and strips the outer headers of an underlay frame: (bridge domain, peer).
    #[inline(always)]
    pub(super) fn decap(
        &mut self,
        snap: &Snapshot,
        b: &mut BufId,
    ) -> Result<(u16, u16), DropReason> {
        match snap.vtep.as_ref() {
            None => Err(DropReason::UnderlayNotVxlan),
            Some(vtep) => vtep.decap(snap, &self.pool, b, &mut self.decap_cache),
        }
    }

    /// Stage 1 for an underlay frame after [`Pipeline::decap`]: the inner frame's keys, or an
    /// answer for a neighbor asking for the VTEP's address, or a drop.
    #[inline(always)]
    pub(super) fn underlay_ctx(
        &self,
        snap: &Snapshot,
        b: &mut BufId,
        r: Result<(u16, u16), DropReason>,
        ctx: &mut Ctx,
    ) {
        let pool = &*self.pool;
        let r = r.and_then(|(bd, peer)| {
            let (h, len) = pool.head_and_len(b);
            fill_l2(&self.fdb, ctx, h, bd, peer, None, false, 0, len)
        });
        match (r, snap.vtep.as_ref()) {
            (Ok(()), _) => {}
            // Not VXLAN: maybe a next hop's answer, or a neighbor asking for the VTEP's own
            // address (a next hop's request teaches its MAC too).
            (Err(DropReason::UnderlayNotVxlan), Some(v)) if !v.shared => {
                let learned = self.learn_next_hop(snap, pool, b, v.local);
                if suppress::answer_for(pool, b, v.local, v.mac, v.underlay_vlan).is_some() {
                    *ctx = Ctx { reply: true, ..Ctx::default() };
                } else if learned {
                    *ctx = Ctx { taken: true, ..Ctx::default() };
                } else {
                    ctx.drop = Some(DropReason::UnderlayNotVxlan);
                }
            }
            (Err(r), _) => ctx.drop = Some(r),
        }
    }

    /// Learns a next hop's MAC from an ARP packet or neighbor advertisement in `b`.
    #[cold]
    pub(super) fn learn_next_hop(
        &self,
        snap: &Snapshot,
        pool: &Pool,
        b: &BufId,
        local: IpAddr,
    ) -> bool {
        if self.dry() {
            return false;
        }
        let Some((ip, mac)) = neigh::answer_in(pool, b, local) else { return false };
        let Some(peers) = snap.next_hops.get(&ip) else { return false };
        for p in peers {
            self.hold.shared.learn(*p, mac, self.now);
        }
        self.stats.event(Event::NeighborLearned, 1);
        true
    }
}

//! Node `neighbor-hold`: a peer's next-hop MAC resolved (a request at most once a second
//! across threads) and the frames waiting for it held, retried and given up.

use super::Pipeline;
use crate::buf::BufId;
use crate::counters::{DropReason, Event};
use crate::descriptor::{self, Descriptor};
use crate::neigh::{self, Neighbors, Next, Parked, Waiting};
use crate::snapshot::Snapshot;
use crate::trace::{Node, Step};
use crate::vtep::{PeerEntry, VtepEntry};
use crate::wire::MacAddr;
use std::net::IpAddr;
use std::sync::Arc;

/// Node `neighbor-hold`: held frames go back to `vxlan-encap` once their next hop resolves.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::NeighborHold,
    name: "neighbor-hold",
    nexts: &[descriptor::Next::Node(Node::Encap), descriptor::Next::Drop],
    drops: &[DropReason::NeighborQueueFull, DropReason::NeighborUnresolved],
    counts: &[Event::NeighborRequests],
};

/// Node `neighbor-hold`'s state: next-hop resolution shared with the other threads, and
/// this thread's frames waiting for a next hop.
pub(super) struct Hold {
    pub(super) shared: Arc<Neighbors>,
    pub(super) parked: Parked,
}

impl Hold {
    pub(super) fn new() -> Hold {
        Hold { shared: Arc::new(Neighbors::new(0)), parked: Parked::new() }
    }
}

impl Pipeline {
    /// The next hop of a frame to `pe`: `Ok(None)` the template's (configured), `Ok(mac)`
    /// the resolved one, `Err` not known yet (the caller parks the frame). Sends this
    /// second's request when this thread is elected.
    #[inline(always)]
    pub(super) fn next_hop(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        pe: &PeerEntry,
    ) -> Result<Option<MacAddr>, ()> {
        let Some(target) = pe.resolve else {
            return Ok(None);
        };
        // The common case, a MAC confirmed recently, without any write.
        if let Some(m) = self.hold.shared.fresh_mac(pe.id, self.now) {
            return Ok(Some(m));
        }
        self.resolve(snap, vtep, pe.id, target).map(Some).ok_or(())
    }

    /// Leaves an (untagged, not yet encapsulated) frame waiting for its peer's next hop, or
    /// drops it when too many wait.
    #[cold]
    pub(super) fn hand_to_hold(&mut self, vtep: &VtepEntry, mut b: BufId, peer: u16, vni: u32) {
        self.note(Step::NeighborHold { peer });
        if self.dry() {
            return self.cache.free(b);
        }
        // It waits beyond this burst: nothing of it may stay in a guest's buffer.
        if !self.pool.linearize(&mut b, &mut self.cache) {
            return self.discard(b, DropReason::NoBuffer, vtep.underlay_port);
        }
        if let Err(w) = self.hold.parked.park(Waiting { b, peer, vni, since: self.now }) {
            self.discard(w.b, DropReason::NeighborQueueFull, vtep.underlay_port);
        }
    }

    /// Asks for `target` (at most once a second across threads) and returns the MAC to use
    /// now, if any.
    #[cold]
    #[inline(never)]
    pub(super) fn resolve(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        peer: u16,
        target: IpAddr,
    ) -> Option<MacAddr> {
        if self.dry() {
            return None; // a synthetic frame asks nobody
        }
        let (next, ask) = self.hold.shared.next(peer, self.now, !vtep.shared);
        if ask {
            match neigh::request(&mut self.cache, vtep.local, vtep.mac, vtep.underlay_vlan, target)
            {
                Some(req) => {
                    self.stats.event(Event::NeighborRequests, 1);
                    self.hand_to_tx(snap, vtep.underlay_port, req);
                }
                None => self.stats.count_drop(DropReason::NoBuffer, vtep.underlay_port),
            }
        }
        match next {
            Next::Send(m) => Some(m),
            Next::Wait => None,
        }
    }

    /// Sends or drops the frames waiting for resolution, now that an answer came or a second
    /// passed; the others keep waiting, in order.
    #[cold]
    #[inline(never)]
    pub(super) fn retry_parked(&mut self, snap: &Snapshot) {
        let mut parked = std::mem::take(&mut self.hold.parked);
        let mut sent = 0;
        parked.retry(|w| {
            let (Some(vtep), Some(pe)) = (snap.vtep.as_ref(), snap.peer(w.peer)) else {
                self.discard(w.b, DropReason::VxlanNoRoute, 0);
                return None;
            };
            let Some(target) = pe.resolve else {
                // Configured with a MAC since the frame was parked.
                let (mut b, mark) = (w.b, snap.marking_of_vni(w.vni));
                let r = vtep.encap(&self.pool, &mut b, pe, w.vni, mark);
                sent += self.sent_encapsulated(snap, vtep, b, r, (None, mark.priority)) as u64;
                return None;
            };
            match self.resolve(snap, vtep, pe.id, target) {
                Some(m) => {
                    let (mut b, mark) = (w.b, snap.marking_of_vni(w.vni));
                    let r = vtep.encap(&self.pool, &mut b, pe, w.vni, mark);
                    sent +=
                        self.sent_encapsulated(snap, vtep, b, r, (Some(m), mark.priority)) as u64;
                    None
                }
                None if self.hold.shared.given_up(w.peer, w.since, self.now) => {
                    self.discard(w.b, DropReason::NeighborUnresolved, vtep.underlay_port);
                    None
                }
                None => Some(w),
            }
        });
        self.hold.parked = parked;
        self.stats.event(Event::Encapsulated, sent);
    }

    /// Work that does not wait for a burst: frames waiting for next-hop resolution are sent
    /// or given up (checked at most once per answer learned or second; cheap when idle), and
    /// priority frames held for a full ring are offered to it again.
    #[inline]
    pub fn housekeeping(&mut self, snap: &Snapshot) {
        if self.hold.parked.due(self.hold.shared.generation(), self.now) {
            self.retry_parked(snap);
            self.flush(snap);
        } else if self.tx.first.holding() {
            // Priority frames held for a full ring leave once it has room, traffic or not.
            self.flush(snap);
        }
    }
}

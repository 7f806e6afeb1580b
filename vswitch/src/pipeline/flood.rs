//! Node `flood`: copies to every member of the bridge domain but the ingress, and to remote
//! VTEPs unless the frame came from one (split horizon); small frames copied, large ones a
//! private header over a shared payload. Each copy goes to `vlan-rewrite` or `vxlan-encap`.

use super::{Ctx, NO_PEER, Pipeline, nodes};
use crate::buf::BufId;
use crate::counters::{DropReason, Event};
use crate::descriptor::{Descriptor, Next};
use crate::snapshot::{BdEntry, Snapshot};
use crate::trace::{Node, Step};
use crate::wire::ethernet;

/// Node `flood`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Flood,
    name: "flood",
    nexts: &[Next::Node(Node::VlanRewrite), Next::Node(Node::Encap), Next::Drop],
    drops: &[],
    counts: &[Event::Flooded, Event::FloodCopies, Event::FloodCopyFailed],
};

/// Flooded frames up to this size are copied per egress; larger ones share their payload.
pub(super) const COPY_MAX: usize = 256;

/// A flood egress: a local port with the tag frames carry there, or a remote VTEP.
#[derive(Clone, Copy)]
pub(super) enum Target {
    Port(u16, Option<u16>),
    Peer(u16),
}

impl Pipeline {
    /// Floods to every member but the ingress, and to remote VTEPs unless the frame came from
    /// one (split horizon). Every egress but the last gets a copy (small frames) or a private
    /// header segment over the shared payload (large ones); the last gets the original.
    #[inline(never)]
    pub(super) fn flood<const TRACE: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        bd: &BdEntry,
        in_port: u16,
        mut b: BufId,
        c: &Ctx,
    ) {
        // Copies share the payload: it must be in the pool.
        if !self.pool.linearize(&mut b, &mut self.cache) {
            return self.discard(b, DropReason::NoBuffer, in_port);
        }
        let from_peer = c.from_peer != NO_PEER;
        let ingress_member = !from_peer && bd.ports.iter().any(|(p, _)| *p == in_port);
        let peers: &[u16] = if from_peer { &[] } else { &bd.peers };
        let k = bd.ports.len() - ingress_member as usize + peers.len();
        if k == 0 {
            return self.discard(b, DropReason::NoEgress, in_port);
        }
        self.stats.event(Event::Flooded, 1);
        if TRACE {
            self.record(Step::Flood { bd: bd.id, copies: k as u16 });
        }
        self.stats.bd(bd.id).flooded.add(1);
        self.stats.event(Event::FloodCopies, (k - 1) as u64);
        let len = self.pool.pkt_len(&b);
        let targets = bd
            .ports
            .iter()
            .filter(|(p, _)| from_peer || *p != in_port)
            .map(|&(p, want)| Target::Port(p, want))
            .chain(peers.iter().map(|&p| Target::Peer(p)));
        if k == 1 || (len <= COPY_MAX && !self.pool.is_chained(&b)) {
            let mut original = Some(b);
            for (i, t) in targets.enumerate() {
                let frame = if i + 1 == k {
                    original.take()
                } else {
                    let copy = self.cache.alloc().map(|mut copy| {
                        if let Some(o) = &original {
                            self.pool.append(&mut copy, self.pool.head(o));
                        }
                        copy
                    });
                    if copy.is_none() {
                        self.flood_copy_failed(in_port);
                    }
                    copy
                };
                if let Some(f) = frame {
                    self.hand_copy_to::<TRACE, PER_NODE>(snap, bd, f, c, t, len);
                }
            }
            if let Some(o) = original {
                self.discard(o, DropReason::NoEgress, in_port); // only if `k` miscounted
            }
            return;
        }
        // Large frame: each egress gets a private header segment; the payload is shared.
        let l2 = ethernet::header_len(c.tagged);
        let mut hdr = [0u8; 18];
        hdr[..l2].copy_from_slice(&self.pool.head(&b)[..l2]);
        let mut payload = b;
        self.pool.strip(&mut payload, l2);
        let shared = self.pool.into_shared(payload);
        for t in targets {
            match self.cache.alloc() {
                Some(mut h) => {
                    self.pool.append(&mut h, &hdr[..l2]);
                    self.pool.link_shared(&mut h, &shared);
                    self.hand_copy_to::<TRACE, PER_NODE>(snap, bd, h, c, t, len);
                }
                None => self.flood_copy_failed(in_port),
            }
        }
        self.cache.release_shared(shared);
    }

    #[cold]
    pub(super) fn flood_copy_failed(&mut self, port: u16) {
        self.stats.event(Event::FloodCopyFailed, 1);
        self.stats.count_drop(DropReason::NoBuffer, port);
    }

    /// A copy to one egress: straight to its node, or (`PER_NODE`) onto the node's frame.
    #[inline(always)]
    pub(super) fn hand_copy_to<const TRACE: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        bd: &BdEntry,
        b: BufId,
        c: &Ctx,
        t: Target,
        len: usize,
    ) {
        if PER_NODE {
            let m = nodes::Meta {
                bd: bd.id,
                tagged: c.tagged,
                pcp: c.pcp,
                len: len as u32,
                ..nodes::Meta::default()
            };
            return match t {
                Target::Port(p, want) => self.hand_to_frame(
                    snap,
                    Node::Flood,
                    Node::VlanRewrite,
                    b,
                    nodes::Meta { port: p, want, ..m },
                ),
                Target::Peer(p) => self.hand_to_frame(
                    snap,
                    Node::Flood,
                    Node::Encap,
                    b,
                    nodes::Meta { port: p, ..m },
                ),
            };
        }
        match t {
            Target::Port(p, want) => match snap.port(p) {
                Some(pe) => {
                    self.hand_to_rewrite::<TRACE>(snap, pe, bd.id, b, c.tagged, c.pcp, want, len)
                }
                None => self.discard(b, DropReason::NoEgress, p),
            },
            Target::Peer(p) => self.hand_to_encap::<TRACE>(snap, bd, b, c.tagged, p),
        }
    }
}

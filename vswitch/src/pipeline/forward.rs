//! Node `l2-forward` (stage 2): the source handed to `learn`, ARP/ND suppression (node
//! `arp-nd-suppress`, [`crate::suppress`]), the FDB lookup of the destination, and the
//! hand-off to the egress nodes (`decide`, then `act` straight to them or, per node, onto
//! their frames): `vlan-rewrite` + `tx` for a local port, `vxlan-encap` for a peer, `flood`
//! for an unknown or group destination.

use super::rewrite::leaves_first;
use super::trace::key_mac;
use super::{Ctx, NO_PEER, Pipeline};
use crate::buf::BufId;
use crate::counters::{DropReason, Event};
use crate::descriptor::{Descriptor, Next};
use crate::emc::Decision;
use crate::fdb::Dest;
use crate::snapshot::{BdEntry, PortEntry, Snapshot};
use crate::suppress::{self, Answer};
use crate::trace::{Learned, Node, Step};
use crate::wire::ethernet::{self, MacAddr, ethertype};

/// Node `l2-forward`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Forward,
    name: "l2-forward",
    nexts: &[
        Next::Node(Node::VlanRewrite),
        Next::Node(Node::Encap),
        Next::Node(Node::Flood),
        Next::Drop,
    ],
    drops: &[DropReason::Reflect, DropReason::NoEgress],
    counts: &[Event::KnownUnicast, Event::StaleFdb],
};

/// Node `arp-nd-suppress` ([`crate::suppress`]): a request the table cannot answer goes on as if it had not come here (learn → l2-forward).
pub(crate) const SUPPRESS: Descriptor = Descriptor {
    node: Node::Suppress,
    name: "arp-nd-suppress",
    nexts: &[Next::Node(Node::VlanRewrite), Next::Node(Node::Encap), Next::Drop],
    drops: &[],
    counts: &[Event::ArpSuppressed, Event::NdSuppressed],
};

/// Where `l2-forward` sends a frame: the next node, with what it needs.
pub(super) enum Verdict<'s> {
    /// Dropped for a reason, counted against a port.
    Drop(DropReason, u16),
    /// `vlan-rewrite` then `tx` on a local port: the VLAN it leaves with, the frame's length.
    Port(&'s PortEntry, Option<u16>, usize),
    /// `vxlan-encap` to a remote VTEP.
    Peer(u16),
    Flood,
}

impl Pipeline {
    /// Stage 2 of the `i`th packet: learning, then suppression, lookup and egress.
    #[inline(always)]
    pub(super) fn forward<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        bd: &BdEntry,
        b: BufId,
        c: &Ctx,
        i: usize,
    ) {
        let learnt = self.learn_source::<TRACE>(port, bd, c);
        self.decide::<TRACE, false>(snap, port, bd, b, c, i, learnt);
    }

    /// Node `learn`: whether the FDB now holds the frame's source as learning wants it (else
    /// its forwarding is not cacheable).
    #[inline(always)]
    pub(super) fn learn_source<const TRACE: bool>(
        &mut self,
        port: &PortEntry,
        bd: &BdEntry,
        c: &Ctx,
    ) -> bool {
        let from_peer = c.from_peer != NO_PEER;
        let src = if from_peer { Dest::Peer(c.from_peer) } else { Dest::Port(port.id) };
        let learning = if from_peer { bd.remote_learning } else { bd.learning };
        if learning && !self.fdb.is_fresh(c.src_key, c.src_loc, src, self.now) {
            return self.learn(port, bd, c, src);
        }
        if TRACE {
            self.record(Step::Learn {
                bd: bd.id,
                mac: key_mac(c.src_key),
                outcome: if learning { Learned::Fresh } else { Learned::Off },
            });
        }
        true
    }

    /// Whether the frame (an L2 header of `l2` bytes) is ARP or IPv6: to the gateway's MAC,
    /// those are answered by their payload, so the second level keeps their destination
    /// halves apart from IPv4's (see [`crate::emc::Hit::from_source`]).
    #[inline(always)]
    fn is_neighbor_protocol(&self, b: &BufId, l2: usize) -> bool {
        let h = self.pool.head(b);
        let et = h.get(l2 - 2..l2).map_or(0, |e| u16::from_be_bytes([e[0], e[1]]));
        et == ethertype::ARP || et == ethertype::IPV6
    }

    /// Nodes `arp-nd-suppress` and `l2-forward`: where the `i`th frame goes (`learnt`: see
    /// [`Pipeline::learn_source`]), handed on there: straight to the next node, or
    /// (`PER_NODE`) onto its frame. A known unicast frame fills the cache here.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide<const TRACE: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        bd: &BdEntry,
        mut b: BufId,
        c: &Ctx,
        i: usize,
        learnt: bool,
    ) {
        let from_peer = c.from_peer != NO_PEER;
        let l2 = ethernet::header_len(c.tagged);
        // Whether the decision below may be cached: learning left nothing to do, and no
        // byte outside the caches' keys decided it.
        let mut cacheable = learnt;

        if bd.arp_suppression
            && (c.dst_key & MacAddr::GROUP_BIT_U64 != 0 || c.dst_key == bd.gateway_key)
        {
            let h = self.pool.head(&b);
            let et = u16::from_be_bytes([h[l2 - 2], h[l2 - 1]]);
            // An ARP or IPv6 frame to the gateway that suppression did not answer (a reply,
            // TCP to the router) is forwarded, but the next one with the same key may be a
            // request it answers: its payload decides, so it is never cached.
            cacheable &= et != ethertype::ARP && et != ethertype::IPV6;
            if (et == ethertype::ARP || et == ethertype::IPV6)
                && let Some(a) = suppress::answer(&self.pool, bd, &mut b, l2, et)
            {
                self.stats.event(
                    if a == Answer::Arp { Event::ArpSuppressed } else { Event::NdSuppressed },
                    1,
                );
                if TRACE {
                    self.record(Step::Suppress { arp: a == Answer::Arp });
                }
                let back = if from_peer { Dest::Peer(c.from_peer) } else { Dest::Port(port.id) };
                let v = self.to_dest(snap, bd, &b, back);
                return self.hand_on::<TRACE, PER_NODE>(snap, port, bd, b, c, v);
            }
        }

        if c.dst_key & MacAddr::GROUP_BIT_U64 == 0
            && let Some(v) = self.fdb.lookup(c.dst_key, c.dst_loc)
        {
            if TRACE {
                self.record(Step::Forward { mac: key_mac(c.dst_key), found: Some(v.dest()) });
            }
            match v.dest() {
                Dest::Port(p) if p == port.id && !from_peer => {
                    return self.hand_on::<TRACE, PER_NODE>(
                        snap,
                        port,
                        bd,
                        b,
                        c,
                        Verdict::Drop(DropReason::Reflect, port.id),
                    );
                }
                Dest::Peer(_) if from_peer => {
                    return self.hand_on::<TRACE, PER_NODE>(
                        snap,
                        port,
                        bd,
                        b,
                        c,
                        Verdict::Drop(DropReason::Reflect, port.id),
                    );
                }
                Dest::Port(p) => {
                    if let Some(pe) = snap.port(p)
                        && let Some(want) = pe.egress_tag(bd.id, bd.vlan)
                    {
                        self.known += 1;
                        if cacheable && !leaves_first(snap, bd.id, pe) {
                            // Decapsulated frames have no ingress MTU (the underlay's bounds the outer frame).
                            let ingress = (!from_peer).then_some(l2 + port.mtu as usize);
                            let egress = l2 + pe.mtu as usize;
                            let want = want.map(|v| (pe.tpid, v));
                            let (tagged, nb) = (c.tagged, self.is_neighbor_protocol(&b, l2));
                            self.remember(i, || {
                                Decision::to_port(bd.id, p, tagged, nb, want, ingress, egress)
                            });
                        }
                        return self.hand_on::<TRACE, PER_NODE>(
                            snap,
                            port,
                            bd,
                            b,
                            c,
                            Verdict::Port(pe, want, c.len as usize),
                        );
                    }
                }
                Dest::Peer(p) => {
                    if bd.peers.contains(&p) {
                        self.known += 1;
                        if cacheable && let Some(vni) = bd.vni {
                            let max = l2 + port.mtu as usize;
                            let nb = self.is_neighbor_protocol(&b, l2);
                            self.remember(i, || {
                                Decision::to_peer(bd.id, p, c.tagged, nb, vni, max)
                            });
                        }
                        return self.hand_on::<TRACE, PER_NODE>(
                            snap,
                            port,
                            bd,
                            b,
                            c,
                            Verdict::Peer(p),
                        );
                    }
                }
            }
            // The entry points somewhere no longer in this bridge domain: flood.
            self.stats.event(Event::StaleFdb, 1);
            if TRACE {
                self.record(Step::Stale { mac: key_mac(c.dst_key) });
            }
        } else if TRACE {
            self.record(Step::Forward { mac: key_mac(c.dst_key), found: None });
        }
        self.hand_on::<TRACE, PER_NODE>(snap, port, bd, b, c, Verdict::Flood)
    }

    #[inline(always)]
    fn hand_on<const TRACE: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        bd: &BdEntry,
        b: BufId,
        c: &Ctx,
        v: Verdict,
    ) {
        if PER_NODE {
            self.hand_on_per_node(snap, port, bd, b, c, v)
        } else {
            self.hand_on_fused::<TRACE>(snap, port, bd, b, c, v)
        }
    }

    /// Hands a frame to the node `decide` chose.
    #[inline(always)]
    pub(super) fn hand_on_fused<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        bd: &BdEntry,
        b: BufId,
        c: &Ctx,
        v: Verdict,
    ) {
        match v {
            Verdict::Drop(r, p) => self.discard(b, r, p),
            Verdict::Port(pe, want, len) => {
                self.hand_to_rewrite::<TRACE>(snap, pe, bd.id, b, c.tagged, c.pcp, want, len)
            }
            Verdict::Peer(p) => self.hand_to_encap::<TRACE>(snap, bd, b, c.tagged, p),
            Verdict::Flood => self.flood::<TRACE, false>(snap, bd, port.id, b, c),
        }
    }

    /// The verdict for a frame going to `d` (an answer back to where its question came from).
    #[inline(always)]
    pub(super) fn to_dest<'s>(
        &self,
        snap: &'s Snapshot,
        bd: &BdEntry,
        b: &BufId,
        d: Dest,
    ) -> Verdict<'s> {
        match d {
            Dest::Port(p) => match snap.port(p).map(|pe| (pe, pe.egress_tag(bd.id, bd.vlan))) {
                Some((pe, Some(want))) => Verdict::Port(pe, want, self.pool.pkt_len(b)),
                _ => Verdict::Drop(DropReason::NoEgress, p),
            },
            Dest::Peer(p) => Verdict::Peer(p),
        }
    }
}

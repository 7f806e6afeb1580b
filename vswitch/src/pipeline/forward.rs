//! Node `l2-forward` (stage 2): ARP/ND suppression (node `arp-nd-suppress`,
//! [`crate::suppress`]), the FDB lookup of the destination, and the hand-off to the egress
//! nodes: `vlan-rewrite` + `tx` for a local port, `vxlan-encap` for a peer, `flood` for an
//! unknown or group destination.

use super::*;

impl Pipeline {
    /// Stage 2: security, learning, suppression, lookup and egress of the `i`th packet.
    #[inline(always)]
    pub(super) fn forward<const TRACE: bool>(&mut self, snap: &Snapshot, port: &PortEntry, bd: &BdEntry, mut b: BufId, c: &Ctx, i: usize) {
        let from_peer = c.from_peer != NO_PEER;
        let l2 = if c.tagged { 18 } else { 14 };

        let src = if from_peer { Dest::Peer(c.from_peer) } else { Dest::Port(port.id) };
        // Whether the FDB now holds the source as learning wants it (else, not cacheable).
        let mut learnt = true;
        let learning = if from_peer { bd.remote_learning } else { bd.learning };
        if learning && !self.fdb.is_fresh(c.src_key, c.src_loc, src, self.now) {
            learnt = self.learn(port, bd, c, src);
        } else if TRACE {
            self.record(Step::Learn { bd: bd.id, mac: key_mac(c.src_key), outcome: if learning { Learned::Fresh } else { Learned::Off } });
        }

        if bd.arp_suppression && c.dst_key & (1 << 40) != 0 {
            let h = self.pool.head(&b);
            let et = u16::from_be_bytes([h[l2 - 2], h[l2 - 1]]);
            if (et == ethertype::ARP || et == ethertype::IPV6)
                && let Some(a) = suppress::answer(&self.pool, bd, &mut b, l2, et) {
                    self.stats.event(if a == Answer::Arp { Event::ArpSuppressed } else { Event::NdSuppressed }, 1);
                    if TRACE {
                        self.record(Step::Suppress { arp: a == Answer::Arp });
                    }
                    return self.emit::<TRACE>(snap, bd, b, c, src);
                }
        }

        if c.dst_key & (1 << 40) == 0
            && let Some(v) = self.fdb.lookup(c.dst_key, c.dst_loc) {
                if TRACE {
                    self.record(Step::Forward { mac: key_mac(c.dst_key), found: Some(v.dest()) });
                }
                match v.dest() {
                    Dest::Port(p) if p == port.id && !from_peer => return self.discard(b, DropReason::Reflect, port.id),
                    Dest::Peer(_) if from_peer => return self.discard(b, DropReason::Reflect, port.id),
                    Dest::Port(p) => {
                        if let Some(pe) = snap.port(p)
                            && let Some(want) = pe.egress_tag(bd.id, bd.vlan) {
                                self.known += 1;
                                if learnt && !leaves_first(snap, bd.id, pe) {
                                    // Decapsulated frames have no ingress MTU (the underlay's bounds the outer frame).
                                    let max = l2 + if from_peer { pe.mtu } else { port.mtu.min(pe.mtu) } as usize;
                                    let want = want.map(|v| (pe.tpid, v));
                                    self.remember(i, || Hit::to_port(bd.id, p, c.tagged, want, max));
                                }
                                return self.emit_port::<TRACE>(snap, pe, bd.id, b, c.tagged, c.pcp, want, c.len as usize);
                            }
                    }
                    Dest::Peer(p) => {
                        if bd.peers.contains(&p) {
                            self.known += 1;
                            if learnt && let Some(vni) = bd.vni {
                                let max = l2 + port.mtu as usize;
                                self.remember(i, || Hit::to_peer(bd.id, p, c.tagged, vni, max));
                            }
                            return self.emit_peer::<TRACE>(snap, bd, b, c.tagged, p);
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
        self.flood::<TRACE>(snap, bd, port.id, b, c);
    }

    #[inline(always)]
    pub(super) fn emit<const TRACE: bool>(&mut self, snap: &Snapshot, bd: &BdEntry, b: BufId, c: &Ctx, d: Dest) {
        match d {
            Dest::Port(p) => match snap.port(p).map(|pe| (pe, pe.egress_tag(bd.id, bd.vlan))) {
                Some((pe, Some(want))) => {
                    let len = self.pool.pkt_len(&b);
                    self.emit_port::<TRACE>(snap, pe, bd.id, b, c.tagged, c.pcp, want, len)
                }
                _ => self.discard(b, DropReason::NoEgress, p),
            },
            Dest::Peer(p) => self.emit_peer::<TRACE>(snap, bd, b, c.tagged, p),
        }
    }
}

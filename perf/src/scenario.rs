//! What a run measures, beyond the frame size: plain L2 between two vhost-user pods, VLAN
//! from an access port to a trunk (the second port carries the pod's VLAN tagged), or
//! VXLAN with the VTEP's underlay on the second vhost-user port, encapsulation (inner
//! frames offered on the pod port, VXLAN frames counted on the underlay) and decapsulation
//! (VXLAN frames offered on the underlay, inner frames counted on the pod port) measured
//! separately; or plain L2 between two kernel interfaces (`veth`: veth pairs from the
//! generator's namespace to the switch's, which serves them with AF_XDP or AF_PACKET
//! ports, or bridges them). The switch under test is the VTEP `LOCAL`; the generator plays the remote
//! VTEP `PEER` (a learning switch hears from it first, so the inner destination is known
//! on both sides and nothing is flooded). The yardstick does no switching: in a VXLAN
//! scenario it forwards plain frames of the outer size (64 B inner: 114 B), as FD.io CSIT
//! compares.

use crate::frames::{self, A, B, Endpoint, FrameSize};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    L2,
    VlanPush,
    /// The other way: tagged frames offered on the trunk, counted untagged on the access port.
    VlanPop,
    VxlanEncap,
    VxlanDecap,
    /// L2 between two veths (`veth.rs`), the generator on AF_XDP sockets at their other ends.
    Veth,
    /// Two Knitter switches as VTEPs, a vhost-user pod on each, VXLAN between them over a
    /// veth underlay served by AF_XDP ports (each switch answers ARP for its VTEP address
    /// and resolves the other's): pod → encap → underlay → decap → pod.
    #[value(name = "vxlan-2vteps")]
    #[serde(rename = "vxlan-2vteps")]
    VxlanTwoVteps,
}

/// The switch's VTEP and the remote one the generator plays.
pub const LOCAL: Endpoint = Endpoint { mac: [0x02, 0, 0, 0, 0x01, 0x01], ip: [10, 99, 1, 1] };
pub const PEER: Endpoint = Endpoint { mac: [0x02, 0, 0, 0, 0x01, 0x02], ip: [10, 99, 1, 2] };
pub const VNI: u32 = 100;
/// The pod's VLAN on the trunk (`VlanPush`, `VlanPop`).
pub const VLAN: u16 = 100;

/// Bytes VXLAN adds on the wire.
const OVERHEAD: usize = 50;

/// The frames of one trial and where they go. Socket `a` is the pod port, `b` the second
/// pod port (L2) or the underlay (VXLAN).
pub struct Traffic {
    pub offered: Vec<Vec<u8>>,
    /// What the receiving side sends first, so a learning switch knows where it is: one
    /// frame, or one a host behind it (`--macs`).
    pub back: Vec<Vec<u8>>,
    /// Offered on socket `b` and counted on `a` (decapsulation), not the other way round.
    pub reversed: bool,
    /// Where the inner UDP payload starts in an offered and in a received frame: the
    /// latency stamp goes there (a VXLAN or VLAN header moves it).
    pub stamp_offered: usize,
    pub stamp_received: usize,
}

/// Where a plain frame's UDP payload starts.
const UDP_PAYLOAD: usize = 42;

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::L2 => "l2",
            Scenario::VlanPush => "vlan-push",
            Scenario::VlanPop => "vlan-pop",
            Scenario::VxlanEncap => "vxlan-encap",
            Scenario::VxlanDecap => "vxlan-decap",
            Scenario::Veth => "veth",
            Scenario::VxlanTwoVteps => "vxlan-2vteps",
        }
    }

    /// What the scenario measures, for a report's title.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::L2 => "L2 vhost-user ↔ vhost-user",
            Scenario::VlanPush => "VLAN, vhost-user access port → vhost-user trunk (tag pushed)",
            Scenario::VlanPop => "VLAN, vhost-user trunk → vhost-user access port (tag popped)",
            Scenario::VxlanEncap => {
                "VXLAN encapsulation, vhost-user pod → vhost-user underlay (sizes: inner frames)"
            }
            Scenario::VxlanDecap => {
                "VXLAN decapsulation, vhost-user underlay → vhost-user pod (sizes: inner frames)"
            }
            Scenario::Veth => "L2 veth ↔ veth (kernel interfaces)",
            Scenario::VxlanTwoVteps => {
                "VXLAN between two Knitter switches (vhost-user pod → VTEP → AF_XDP veth underlay → VTEP → vhost-user pod)"
            }
        }
    }

    /// Whether DPDK's testpmd can generate it (`mrr`): two vhost-user sockets of one switch.
    pub fn on_two_vhost_user_sockets(self) -> bool {
        !matches!(self, Scenario::Veth | Scenario::VxlanTwoVteps)
    }

    /// Whether the switch's ports are kernel interfaces (veths), not vhost-user sockets.
    pub fn is_kernel(self) -> bool {
        self == Scenario::Veth
    }

    /// An access port and a trunk.
    pub fn is_vlan(self) -> bool {
        matches!(self, Scenario::VlanPush | Scenario::VlanPop)
    }

    pub fn is_vxlan(self) -> bool {
        matches!(self, Scenario::VxlanEncap | Scenario::VxlanDecap)
    }

    /// The frames for a switch (`switching`: false for the yardstick), `size` on the wire
    /// (the inner frames' in VXLAN scenarios), over `flows` UDP source ports (the outer
    /// one too in VXLAN, as a VTEP hashes the inner flow into it). With `hosts` > 1 (L2
    /// only: `--macs`), as many hosts a side ([`frames::host_pairs`]), every one behind the
    /// receiving side speaking first.
    pub fn traffic(self, switching: bool, size: FrameSize, flows: u16, hosts: u32) -> Traffic {
        let wrap = |inner: &[u8], i: usize| {
            frames::vxlan(PEER, LOCAL, VNI, 49152 + (i % flows.max(1) as usize) as u16, inner)
        };
        let sizes = size.pattern();
        let hello = |from, to| frames::udp(from, to, frames::MIN_SIZE, 1024);
        match self {
            Scenario::L2 if hosts > 1 => {
                let (offered, back) = frames::host_pairs(A, B, &sizes, flows, hosts);
                Traffic {
                    offered,
                    back,
                    reversed: false,
                    stamp_offered: UDP_PAYLOAD,
                    stamp_received: UDP_PAYLOAD,
                }
            }
            Scenario::L2 | Scenario::Veth | Scenario::VxlanTwoVteps => Traffic {
                offered: frames::flows(A, B, &sizes, flows),
                back: vec![hello(B, A)],
                reversed: false,
                stamp_offered: UDP_PAYLOAD,
                stamp_received: UDP_PAYLOAD,
            },
            _ if !switching => {
                let grown = if self.is_vlan() { 4 } else { OVERHEAD };
                Traffic {
                    offered: frames::flows(A, B, &size.grown(grown), flows),
                    back: vec![hello(B, A)],
                    reversed: false,
                    stamp_offered: UDP_PAYLOAD,
                    stamp_received: UDP_PAYLOAD,
                }
            }
            Scenario::VlanPush => Traffic {
                offered: frames::flows(A, B, &sizes, flows),
                // B speaks first, tagged, on the trunk.
                back: vec![frames::tagged(&hello(B, A), VLAN)],
                reversed: false,
                stamp_offered: UDP_PAYLOAD,
                stamp_received: UDP_PAYLOAD + 4,
            },
            Scenario::VlanPop => Traffic {
                offered: frames::flows(B, A, &sizes, flows)
                    .iter()
                    .map(|f| frames::tagged(f, VLAN))
                    .collect(),
                // A speaks first, untagged, on its access port.
                back: vec![hello(A, B)],
                reversed: true,
                stamp_offered: UDP_PAYLOAD + 4,
                stamp_received: UDP_PAYLOAD,
            },
            Scenario::VxlanEncap => Traffic {
                offered: frames::flows(A, B, &sizes, flows),
                // From B behind the remote VTEP: the switch learns B there, and (OVS) the
                // remote VTEP's MAC on the underlay.
                back: vec![wrap(&hello(B, A), 0)],
                reversed: false,
                stamp_offered: UDP_PAYLOAD,
                stamp_received: OVERHEAD + UDP_PAYLOAD,
            },
            Scenario::VxlanDecap => Traffic {
                offered: frames::flows(B, A, &sizes, flows)
                    .iter()
                    .enumerate()
                    .map(|(i, f)| wrap(f, i))
                    .collect(),
                back: vec![hello(A, B)],
                reversed: true,
                stamp_offered: OVERHEAD + UDP_PAYLOAD,
                stamp_received: UDP_PAYLOAD,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scenario_offers_what_its_side_expects() {
        let l2 = Scenario::L2.traffic(true, FrameSize::Bytes(64), 2, 1);
        assert_eq!((l2.offered.len(), l2.offered[0].len(), l2.reversed), (2, 60, false));
        let encap = Scenario::VxlanEncap.traffic(true, FrameSize::Bytes(64), 1, 1);
        assert_eq!(encap.offered[0].len(), 60, "inner frames into the pod port");
        assert_eq!(encap.back[0].len(), 110, "the remote VTEP speaks VXLAN");
        assert_eq!(&encap.back[0][0..6], &LOCAL.mac);
        let decap = Scenario::VxlanDecap.traffic(true, FrameSize::Bytes(64), 3, 1);
        assert!(decap.reversed);
        // The stamps land in the inner UDP payload, never on a header the switch reads.
        for t in [&l2, &encap, &decap] {
            assert_eq!(
                t.offered[0][t.stamp_offered - 8..t.stamp_offered - 6],
                1024u16.to_be_bytes()[..],
                "the inner UDP source port"
            );
        }
        assert_eq!(encap.stamp_received, 92);
        assert_eq!(decap.offered[0].len(), 110, "114 bytes on the wire");
        assert_ne!(
            decap.offered[0][34..36],
            decap.offered[1][34..36],
            "flows differ in the outer source port"
        );
        assert_eq!(&decap.offered[0][50..56], &A.mac, "inner frames to the pod");
        let vlan = Scenario::VlanPush.traffic(true, FrameSize::Bytes(64), 1, 1);
        assert_eq!(
            (vlan.offered[0].len(), vlan.back[0].len()),
            (60, 64),
            "untagged in, B tagged on the trunk"
        );
        assert_eq!(&vlan.back[0][12..16], &[0x81, 0, 0, 100]);
        let pop = Scenario::VlanPop.traffic(true, FrameSize::Bytes(64), 1, 1);
        assert_eq!(
            (pop.offered[0].len(), pop.back[0].len(), pop.reversed),
            (64, 60, true),
            "tagged in on the trunk, A untagged"
        );
        assert_eq!(&pop.offered[0][12..16], &[0x81, 0, 0, 100]);
        assert_eq!(&pop.offered[0][0..6], &A.mac, "to the pod behind the access port");
        assert_eq!(
            pop.offered[0][pop.stamp_offered - 8..pop.stamp_offered - 6],
            1024u16.to_be_bytes()[..]
        );
        let hosts = Scenario::L2.traffic(true, FrameSize::Bytes(64), 1, 8000);
        assert_eq!(
            (hosts.offered.len(), hosts.back.len()),
            (8000, 8000),
            "a frame a host each way"
        );
        assert_eq!(&hosts.back[7][0..6], &hosts.offered[7][6..12], "host 7 answers host 7");
        let yard = Scenario::VxlanDecap.traffic(false, FrameSize::Bytes(64), 1, 1);
        assert_eq!(
            (yard.offered[0].len(), yard.reversed),
            (110, false),
            "the yardstick forwards the outer size"
        );
    }
}

//! A network as the manager defines it (Knitter's network: one subnet per family on one
//! segment), checked against the networks and nodes that exist: its kind and segment (a
//! VXLAN VNI or a VLAN ID, given or taken from the configured range), its plane, its
//! addressing (IPv4 and/or IPv6, no overlap with another network of the same tenant or a
//! shared one), and its MTU (defaulting to the smallest node underlay MTU minus the
//! encapsulation, larger values refused). Every refusal names what is wrong.

use crate::ipam::{Addressing, IpamError, Pool, Subnet};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::ops::RangeInclusive;

/// How a network's frames travel between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Vxlan,
    Vlan,
}

/// Knitter's planes (network functions): which traffic a network carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Plane {
    #[default]
    Std,
    Control,
    Media,
    Eio,
    Oam,
}

impl Plane {
    pub const ALL: [Plane; 5] = [Plane::Std, Plane::Control, Plane::Media, Plane::Eio, Plane::Oam];

    pub fn name(self) -> &'static str {
        match self {
            Plane::Std => "std",
            Plane::Control => "control",
            Plane::Media => "media",
            Plane::Eio => "eio",
            Plane::Oam => "oam",
        }
    }
}

/// How a plane's frames are marked for the underlay: the DSCP of their VXLAN outer header
/// and the 802.1p priority on a tagged underlay (nodes copy the inner ECN field too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Marking {
    pub dscp: u8,
    pub pcp: u8,
}

impl Plane {
    /// Planes whose frames leave a node's underlay port first and wait for room rather than
    /// being dropped when it is full: signalling and OAM must outlive a media flood.
    pub fn has_priority(self) -> bool {
        matches!(self, Plane::Control | Plane::Oam)
    }
}

/// Every plane's marking (`None`: unmarked, as Linux's and OVS's VXLAN by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneMarkings([Option<Marking>; 5]);

impl Default for PlaneMarkings {
    /// After RFC 4594's classes: `control` as signalling (CS5, priority 5), `oam` as OAM
    /// (CS2, priority 2), `media` as multimedia (AF41, priority 4 — an assured class, not
    /// EF's strict priority, so a media flood cannot starve the others in the underlay);
    /// `std` and `eio` unmarked.
    fn default() -> Self {
        let m = |dscp, pcp| Some(Marking { dscp, pcp });
        PlaneMarkings([None, m(40, 5), m(34, 4), None, m(16, 2)])
    }
}

impl PlaneMarkings {
    pub fn of(&self, p: Plane) -> Option<Marking> {
        self.0[p as usize]
    }

    /// The defaults with `spec`'s changes: `plane=DSCP/PCP` or `plane=none`, comma-separated
    /// (`media=46/5,eio=none`).
    pub fn parse(spec: &str) -> Result<PlaneMarkings, String> {
        let mut m = PlaneMarkings::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (plane, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not plane=DSCP/PCP or plane=none"))?;
            let p = Plane::ALL.into_iter().find(|p| p.name() == plane.trim()).ok_or_else(|| {
                format!("plane {plane:?} is not one of std, control, media, eio, oam")
            })?;
            m.0[p as usize] = match value.trim() {
                "none" => None,
                v => {
                    let (d, c) = v
                        .split_once('/')
                        .ok_or_else(|| format!("{item:?}: give DSCP/PCP, like 40/5"))?;
                    let dscp: u8 = d
                        .trim()
                        .parse()
                        .ok()
                        .filter(|d| *d <= 63)
                        .ok_or_else(|| format!("{item:?}: DSCP {d:?} is not 0..=63"))?;
                    let pcp: u8 =
                        c.trim().parse().ok().filter(|c| *c <= 7).ok_or_else(|| {
                            format!("{item:?}: 802.1p priority {c:?} is not 0..=7")
                        })?;
                    Some(Marking { dscp, pcp })
                }
            };
        }
        Ok(m)
    }
}

/// One family's addressing as asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetSpec {
    pub cidr: String,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    #[serde(default)]
    pub pools: Vec<Pool>,
}

/// Whether `name` may name an object (it becomes part of store keys): 1-253 characters,
/// none of them '/', whitespace or control.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// A network as asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    pub name: String,
    pub tenant: String,
    pub kind: Kind,
    #[serde(default)]
    pub plane: Plane,
    /// The VNI (vxlan) or VLAN ID (vlan); absent: the first free one of the range.
    #[serde(default)]
    pub segment: Option<u32>,
    #[serde(default)]
    pub ipv4: Option<SubnetSpec>,
    #[serde(default)]
    pub ipv6: Option<SubnetSpec>,
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Usable by every tenant.
    #[serde(default)]
    pub shared: bool,
    /// Ingress policing for every pod port of the network (copied onto each port created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policer: Option<PodPolicer>,
    /// The node SR-IOV pool whose VFs back the network's VF pods (`[sriov.pools]` on the
    /// nodes); absent: each node's default PFs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov_pool: Option<String>,
    /// A pod may name its own VF (`deviceID` in its cni-args, `pci_address` in Knitter's
    /// annotation): one of the pool's, free. Without it only the device plugin names VFs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pod_chooses_vf: bool,
    /// Every node with pods on the network is their gateway (the subnets' gateway addresses,
    /// answered by its switch) and gives it a host port into its own stack: pods reach their
    /// node, its Services and, with `masquerade`, the world beyond (docs/pod-network.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_gateway: bool,
    /// Pods' traffic for anything but the pod networks leaves the node with the node's
    /// address (needs `node_gateway`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub masquerade: bool,
    /// The clusters whose nodes may attach pods to it ([`LOCAL_CLUSTER`] for the manager's
    /// own); empty: every cluster's.
    ///
    /// [`LOCAL_CLUSTER`]: crate::manager::objects::LOCAL_CLUSTER
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
}

/// A pod port's ingress policer, as the node applies it (`vswitch::policer`): packets and
/// bits a second, bursts (0: the node's defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodPolicer {
    pub pps: u64,
    pub bps: u64,
    pub burst_packets: u64,
    pub burst_bytes: u64,
}

/// A network the manager holds: the spec with its segment and MTU decided, its addressing
/// checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub spec: NetworkSpec,
    pub segment: u32,
    pub mtu: u32,
    pub ipv4: Option<Addressing>,
    pub ipv6: Option<Addressing>,
}

/// The manager's limits for new networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub vni_range: RangeInclusive<u32>,
    pub vlan_range: RangeInclusive<u32>,
    /// The smallest underlay MTU of the nodes (or the default when there are none yet).
    pub underlay_mtu: u32,
    /// Bytes VXLAN adds (50 over an IPv4 underlay, 70 over IPv6).
    pub vxlan_overhead: u32,
}

impl Default for Limits {
    fn default() -> Self {
        // Knitter's embedded VNI range; VLANs 1 and 4095 are never ours.
        Limits {
            vni_range: 5000..=15000,
            vlan_range: 2..=4094,
            underlay_mtu: 1500,
            vxlan_overhead: 50,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkError {
    #[error("network name must be 1-63 characters of a-z, 0-9 and '-', got {0:?}")]
    BadName(String),
    #[error("network {0:?} has no subnet: give ipv4, ipv6 or both")]
    NoSubnet(String),
    #[error("network {name:?}: {family} subnet {cidr} is not {family}")]
    WrongFamily { name: String, family: &'static str, cidr: String },
    #[error("network {name:?}: {source}")]
    Addressing { name: String, source: IpamError },
    #[error("network {name:?}: subnet {cidr} overlaps {other_cidr} of network {other:?}")]
    Overlap { name: String, cidr: String, other: String, other_cidr: String },
    #[error("network {name:?}: {what} {segment} is not a valid {what} ({lo}-{hi})")]
    SegmentOutOfRange { name: String, what: &'static str, segment: u32, lo: u32, hi: u32 },
    #[error("network {0:?}: a pod policer needs a rate: pps or bps")]
    PolicerWithoutRate(String),
    #[error(
        "network {0:?}: an SR-IOV pool backs VLAN networks only (a VF's frames leave on its PF's wire, tagged by the PF)"
    )]
    SriovPoolNotVlan(String),
    #[error("network {name:?}: {what} {segment} is already used by network {other:?}")]
    SegmentTaken { name: String, what: &'static str, segment: u32, other: String },
    #[error("no free {what} left in {lo}-{hi} (the range networks that name none get theirs from)")]
    SegmentsExhausted { what: &'static str, lo: u32, hi: u32 },
    #[error(
        "network {name:?}: MTU {mtu} is larger than the underlay allows ({max}: the smallest node underlay MTU {underlay} minus {overhead} bytes of encapsulation)"
    )]
    MtuTooLarge { name: String, mtu: u32, max: u32, underlay: u32, overhead: u32 },
    #[error("network {name:?}: MTU {mtu} is below 576 (IPv4) or 1280 (IPv6)")]
    MtuTooSmall { name: String, mtu: u32 },
    #[error(
        "network {name:?}: a node gateway needs the {family} subnet's gateway address (give {field}.gateway)"
    )]
    NodeGatewayWithoutAddress { name: String, family: &'static str, field: &'static str },
    #[error("network {0:?}: masquerade goes through the node gateway: set node_gateway too")]
    MasqueradeWithoutGateway(String),
    #[error(
        "network {name:?}: cluster {cluster:?} must be 1-253 characters without '/', spaces or control characters"
    )]
    ClusterName { name: String, cluster: String },
    #[error(
        "network {0:?}: a node gateway routes through the node's stack, an SR-IOV VF's frames never reach the switch"
    )]
    NodeGatewayOnVfs(String),
}

fn addressing(
    name: &str,
    family: &'static str,
    v4: bool,
    s: &SubnetSpec,
) -> Result<Addressing, NetworkError> {
    let wrap = |source| NetworkError::Addressing { name: name.into(), source };
    let subnet: Subnet = s.cidr.parse().map_err(wrap)?;
    if subnet.is_ipv4() != v4 {
        return Err(NetworkError::WrongFamily { name: name.into(), family, cidr: s.cidr.clone() });
    }
    Addressing::new(subnet, s.gateway, &s.pools, &[]).map_err(wrap)
}

impl Network {
    /// The name and each family's addressing of `spec`, checked.
    fn addressings(
        spec: &NetworkSpec,
    ) -> Result<(Option<Addressing>, Option<Addressing>), NetworkError> {
        let name = &spec.name;
        let valid_name = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_name {
            return Err(NetworkError::BadName(name.clone()));
        }
        let ipv4 = spec.ipv4.as_ref().map(|s| addressing(name, "IPv4", true, s)).transpose()?;
        let ipv6 = spec.ipv6.as_ref().map(|s| addressing(name, "IPv6", false, s)).transpose()?;
        if ipv4.is_none() && ipv6.is_none() {
            return Err(NetworkError::NoSubnet(name.clone()));
        }
        Ok((ipv4, ipv6))
    }

    /// The spec as stored: the segment and MTU decided.
    pub fn record(&self) -> NetworkSpec {
        NetworkSpec { segment: Some(self.segment), mtu: Some(self.mtu), ..self.spec.clone() }
    }

    /// A network from its stored spec ([`Network::record`]): the addressing is checked
    /// again, the segment and MTU are taken as decided (ranges and nodes may have changed
    /// since).
    pub fn restore(stored: NetworkSpec) -> Result<Network, NetworkError> {
        let (ipv4, ipv6) = Network::addressings(&stored)?;
        let (segment, mtu) = (stored.segment.unwrap_or(0), stored.mtu.unwrap_or(0));
        Ok(Network { spec: stored, segment, mtu, ipv4, ipv6 })
    }

    /// Whether `spec` asks for what this network is (an idempotent create): the same
    /// definition, with the segment and MTU either left open or as decided.
    pub fn matches(&self, spec: &NetworkSpec) -> bool {
        let decided = NetworkSpec {
            segment: spec.segment.or(Some(self.segment)),
            mtu: spec.mtu.or(Some(self.mtu)),
            ..spec.clone()
        };
        decided == self.record()
    }

    /// Each family's addressing, IPv4 first.
    pub fn families(&self) -> impl Iterator<Item = &Addressing> {
        self.ipv4.iter().chain(&self.ipv6)
    }

    /// Checks `spec` against the networks that exist and decides its segment and MTU.
    pub fn define(
        spec: NetworkSpec,
        existing: &[Network],
        limits: &Limits,
    ) -> Result<Network, NetworkError> {
        let (ipv4, ipv6) = Network::addressings(&spec)?;
        let name = spec.name.clone();
        if spec.pod_policer.is_some_and(|p| p.pps == 0 && p.bps == 0) {
            return Err(NetworkError::PolicerWithoutRate(name));
        }
        if (spec.sriov_pool.is_some() || spec.pod_chooses_vf) && spec.kind != Kind::Vlan {
            return Err(NetworkError::SriovPoolNotVlan(name));
        }
        if spec.masquerade && !spec.node_gateway {
            return Err(NetworkError::MasqueradeWithoutGateway(name));
        }
        if let Some(c) = spec.clusters.iter().find(|c| !valid_name(c)) {
            return Err(NetworkError::ClusterName { name, cluster: c.clone() });
        }
        if spec.node_gateway {
            if spec.sriov_pool.is_some() || spec.pod_chooses_vf {
                return Err(NetworkError::NodeGatewayOnVfs(name));
            }
            for (a, family, field) in [(&ipv4, "IPv4", "ipv4"), (&ipv6, "IPv6", "ipv6")] {
                if a.as_ref().is_some_and(|a| a.gateway().is_none()) {
                    return Err(NetworkError::NodeGatewayWithoutAddress { name, family, field });
                }
            }
        }
        // Overlap: with the tenant's own networks and with shared ones (a pod may join both),
        // and between networks with node gateways whoever owns them (their host ports share
        // each node's routing table).
        let may_meet = |o: &Network| {
            o.spec.tenant == spec.tenant
                || o.spec.shared
                || spec.shared
                || (o.spec.node_gateway && spec.node_gateway)
        };
        for other in existing.iter().filter(|o| o.spec.name != name && may_meet(o)) {
            for (mine, theirs) in [(&ipv4, &other.ipv4), (&ipv6, &other.ipv6)] {
                if let (Some(m), Some(t)) = (mine, theirs)
                    && m.subnet().overlaps(&t.subnet())
                {
                    return Err(NetworkError::Overlap {
                        name,
                        cidr: m.subnet().to_string(),
                        other: other.spec.name.clone(),
                        other_cidr: t.subnet().to_string(),
                    });
                }
            }
        }
        // The configured range is where networks that name no segment get theirs; one that
        // names its own may use any the protocol allows.
        let (what, range, valid) = match spec.kind {
            Kind::Vxlan => ("VNI", &limits.vni_range, 1..=0xff_ffff),
            Kind::Vlan => ("VLAN", &limits.vlan_range, 1..=4094),
        };
        let taken = |seg: u32| {
            existing
                .iter()
                .find(|o| o.spec.kind == spec.kind && o.segment == seg && o.spec.name != spec.name)
        };
        let segment = match spec.segment {
            Some(seg) => {
                if !valid.contains(&seg) {
                    return Err(NetworkError::SegmentOutOfRange {
                        name,
                        what,
                        segment: seg,
                        lo: *valid.start(),
                        hi: *valid.end(),
                    });
                }
                if let Some(o) = taken(seg) {
                    return Err(NetworkError::SegmentTaken {
                        name,
                        what,
                        segment: seg,
                        other: o.spec.name.clone(),
                    });
                }
                seg
            }
            None => range.clone().find(|s| taken(*s).is_none()).ok_or(
                NetworkError::SegmentsExhausted { what, lo: *range.start(), hi: *range.end() },
            )?,
        };
        let overhead = if spec.kind == Kind::Vxlan { limits.vxlan_overhead } else { 0 };
        let max = limits.underlay_mtu.saturating_sub(overhead);
        let mtu = spec.mtu.unwrap_or(max);
        if mtu > max {
            return Err(NetworkError::MtuTooLarge {
                name,
                mtu,
                max,
                underlay: limits.underlay_mtu,
                overhead,
            });
        }
        if mtu < if ipv6.is_some() { 1280 } else { 576 } {
            return Err(NetworkError::MtuTooSmall { name, mtu });
        }
        Ok(Network { spec, segment, mtu, ipv4, ipv6 })
    }
}

#[cfg(test)]
mod tests {

    /// Each plane's marking: the defaults, changed by `plane=DSCP/PCP` or `plane=none`;
    /// anything else refused with what is wrong.
    #[test]
    fn plane_markings_default_and_change() {
        let d = PlaneMarkings::default();
        assert_eq!(d.of(Plane::Control), Some(Marking { dscp: 40, pcp: 5 }));
        assert_eq!(d.of(Plane::Media), Some(Marking { dscp: 34, pcp: 4 }));
        assert_eq!(d.of(Plane::Oam), Some(Marking { dscp: 16, pcp: 2 }));
        assert_eq!((d.of(Plane::Std), d.of(Plane::Eio)), (None, None));
        assert_eq!(PlaneMarkings::parse("").unwrap(), d);
        let m = PlaneMarkings::parse("media=46/5, eio=10/1,control=none").unwrap();
        assert_eq!(
            (m.of(Plane::Media), m.of(Plane::Eio), m.of(Plane::Control)),
            (Some(Marking { dscp: 46, pcp: 5 }), Some(Marking { dscp: 10, pcp: 1 }), None)
        );
        assert_eq!(m.of(Plane::Oam), d.of(Plane::Oam), "the rest keep their defaults");
        for (bad, why) in [
            ("voice=1/1", "is not one of"),
            ("media=64/1", "DSCP \"64\" is not 0..=63"),
            ("media=1/8", "priority \"8\" is not 0..=7"),
            ("media", "is not plane=DSCP/PCP"),
            ("media=46", "give DSCP/PCP"),
        ] {
            let e = PlaneMarkings::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    use super::*;

    fn spec(name: &str, tenant: &str, kind: Kind, cidr: &str) -> NetworkSpec {
        NetworkSpec {
            name: name.into(),
            tenant: tenant.into(),
            kind,
            plane: Plane::Media,
            segment: None,
            ipv4: Some(SubnetSpec { cidr: cidr.into(), gateway: None, pools: vec![] }),
            ipv6: None,
            mtu: None,
            shared: false,
            pod_policer: None,
            sriov_pool: None,
            pod_chooses_vf: false,
            node_gateway: false,
            masquerade: false,
            clusters: vec![],
        }
    }

    #[test]
    fn node_gateways_need_gateway_addresses_and_their_own_subnets() {
        let l = Limits::default();
        let gw = |cidr: &str, g: &str| {
            Some(SubnetSpec { cidr: cidr.into(), gateway: Some(g.parse().unwrap()), pools: vec![] })
        };
        let a = Network::define(
            NetworkSpec {
                node_gateway: true,
                masquerade: true,
                ipv4: gw("10.0.0.0/24", "10.0.0.1"),
                ..spec("a", "t1", Kind::Vlan, "")
            },
            &[],
            &l,
        )
        .unwrap();
        let existing = [a];
        let err = |s: NetworkSpec| Network::define(s, &existing, &l).unwrap_err().to_string();
        assert_eq!(
            err(NetworkSpec { node_gateway: true, ..spec("b", "t2", Kind::Vlan, "10.1.0.0/24") }),
            "network \"b\": a node gateway needs the IPv4 subnet's gateway address (give ipv4.gateway)"
        );
        assert!(
            err(NetworkSpec { masquerade: true, ..spec("b", "t2", Kind::Vlan, "10.1.0.0/24") })
                .contains("set node_gateway too")
        );
        assert!(
            err(NetworkSpec {
                node_gateway: true,
                ipv4: gw("10.1.0.0/24", "10.1.0.1"),
                sriov_pool: Some("p".into()),
                ..spec("b", "t2", Kind::Vlan, "")
            })
            .contains("SR-IOV VF")
        );
        assert!(
            err(NetworkSpec {
                node_gateway: true,
                ipv4: gw("10.0.0.0/25", "10.0.0.1"),
                ..spec("b", "t2", Kind::Vlan, "")
            })
            .contains("overlaps 10.0.0.0/24 of network \"a\""),
            "another tenant's, but both meet in every node's routing table"
        );
        assert!(
            Network::define(spec("b", "t2", Kind::Vlan, "10.0.0.0/24"), &existing, &l).is_ok(),
            "without a node gateway another tenant's subnet may repeat"
        );
    }

    #[test]
    fn segments_and_mtu_are_decided() {
        let l = Limits::default();
        let a =
            Network::define(spec("media-a", "t1", Kind::Vxlan, "10.0.0.0/24"), &[], &l).unwrap();
        assert_eq!(
            (a.segment, a.mtu),
            (5000, 1450),
            "the first VNI of the range; the underlay MTU minus VXLAN"
        );
        let b = Network::define(
            spec("media-b", "t1", Kind::Vxlan, "10.0.1.0/24"),
            std::slice::from_ref(&a),
            &l,
        )
        .unwrap();
        assert_eq!(b.segment, 5001);
        let v = Network::define(
            spec("oam", "t1", Kind::Vlan, "10.0.2.0/24"),
            &[a.clone(), b.clone()],
            &l,
        )
        .unwrap();
        assert_eq!((v.segment, v.mtu), (2, 1500), "VLANs have no encapsulation to subtract");
    }

    #[test]
    fn bad_networks_are_refused_with_the_reason() {
        let l = Limits::default();
        let a = Network::define(
            NetworkSpec { segment: Some(7000), ..spec("a", "t1", Kind::Vxlan, "10.0.0.0/24") },
            &[],
            &l,
        )
        .unwrap();
        let existing = [a];
        let err = |s: NetworkSpec| Network::define(s, &existing, &l).unwrap_err().to_string();
        assert_eq!(
            err(spec("b", "t1", Kind::Vxlan, "10.0.0.128/25")),
            "network \"b\": subnet 10.0.0.128/25 overlaps 10.0.0.0/24 of network \"a\""
        );
        assert!(
            Network::define(spec("b", "t2", Kind::Vxlan, "10.0.0.0/24"), &existing, &l).is_ok(),
            "another tenant's private subnet may repeat"
        );
        assert_eq!(
            err(NetworkSpec { segment: Some(7000), ..spec("b", "t1", Kind::Vxlan, "10.9.0.0/24") }),
            "network \"b\": VNI 7000 is already used by network \"a\""
        );
        // The configured range is for networks that name no segment; a named one may be any
        // the protocol allows.
        assert!(
            Network::define(
                NetworkSpec { segment: Some(1), ..spec("b", "t1", Kind::Vxlan, "10.9.0.0/24") },
                &existing,
                &l
            )
            .is_ok()
        );
        assert_eq!(
            err(NetworkSpec { segment: Some(0), ..spec("b", "t1", Kind::Vxlan, "10.9.0.0/24") }),
            "network \"b\": VNI 0 is not a valid VNI (1-16777215)"
        );
        assert!(
            err(NetworkSpec {
                segment: Some(1 << 24),
                ..spec("b", "t1", Kind::Vxlan, "10.9.0.0/24")
            })
            .contains("not a valid VNI")
        );
        assert!(
            err(NetworkSpec { segment: Some(4095), ..spec("b", "t1", Kind::Vlan, "10.9.0.0/24") })
                .contains("VLAN 4095 is not a valid VLAN (1-4094)")
        );
        assert!(
            err(NetworkSpec { mtu: Some(1500), ..spec("b", "t1", Kind::Vxlan, "10.9.0.0/24") })
                .contains("MTU 1500 is larger than the underlay allows (1450")
        );
        assert!(err(spec("B_", "t1", Kind::Vxlan, "10.9.0.0/24")).contains("network name"));
        assert!(
            err(NetworkSpec { ipv4: None, ..spec("b", "t1", Kind::Vxlan, "") })
                .contains("no subnet")
        );
        assert!(err(spec("b", "t1", Kind::Vxlan, "2001:db8::/64")).contains("is not IPv4"));
        assert!(err(spec("b", "t1", Kind::Vxlan, "10.9.0.1/24")).contains("host bits are set"));
        let gw = SubnetSpec {
            cidr: "10.9.0.0/24".into(),
            gateway: Some("10.8.0.1".parse().unwrap()),
            pools: vec![],
        };
        assert!(
            err(NetworkSpec { ipv4: Some(gw), ..spec("b", "t1", Kind::Vxlan, "") })
                .contains("gateway 10.8.0.1 is outside subnet 10.9.0.0/24")
        );
        let tiny = Limits { vlan_range: 10..=10, ..Limits::default() };
        let v = Network::define(spec("v", "t1", Kind::Vlan, "10.5.0.0/24"), &[], &tiny).unwrap();
        let e =
            Network::define(spec("w", "t1", Kind::Vlan, "10.6.0.0/24"), &[v], &tiny).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no free VLAN left in 10-10 (the range networks that name none get theirs from)"
        );
    }
}

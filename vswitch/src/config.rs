//! The switch's declarative configuration: bridge domains, ports with their VLAN modes and
//! port security, and the local VTEP with its remote peers. It is what a config file, the
//! node API or `apply -f` describe; [`crate::snapshot`] validates it whole and compiles it.
//!
//! Model: a bridge domain (one per network on the node) may have a `vlan` (its tag on trunk
//! ports) and a `vni` (its VXLAN segment). An access port belongs to one bridge domain and is
//! untagged; a trunk port carries the bridge domains whose VLAN it allows, tagged, plus
//! optionally one native VLAN untagged. The underlay port carries VXLAN only.

use crate::policer::PolicerConfig;
use crate::wire::MacAddr;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv6Addr};

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{kind} name must not be empty")]
    EmptyName { kind: &'static str },
    #[error("{kind} {name:?} is defined twice")]
    Duplicate { kind: &'static str, name: String },
    #[error("bridge {bridge:?}: VLAN {vlan} is out of range 1..=4094")]
    BadVlan { bridge: String, vlan: u16 },
    #[error("bridge {bridge:?}: VLAN {vlan} is already used by bridge {other:?}")]
    VlanTaken { bridge: String, vlan: u16, other: String },
    #[error("bridge {bridge:?}: VNI {vni} is out of range 1..=16777215")]
    BadVni { bridge: String, vni: u32 },
    #[error("bridge {bridge:?}: VNI {vni} is already used by bridge {other:?}")]
    VniTaken { bridge: String, vni: u32, other: String },
    #[error("bridge {bridge:?}: a flood list needs a VNI and a configured VTEP")]
    FloodWithoutVxlan { bridge: String },
    #[error("bridge {bridge:?}: {ip} is not a peer of the VTEP")]
    UnknownPeer { bridge: String, ip: IpAddr },
    #[error("bridge {bridge:?}: static MAC {mac} must name exactly one of port or remote")]
    StaticMacTarget { bridge: String, mac: MacAddr },
    #[error("bridge {bridge:?}: static MAC {mac} points at {target}, which is not in this bridge")]
    StaticMacNotMember { bridge: String, mac: MacAddr, target: String },
    #[error("bridge {bridge:?}: {what} {mac} is a group address")]
    GroupMac { bridge: String, what: &'static str, mac: MacAddr },
    #[error("port {port:?} is not registered with the switch (no such interface or socket)")]
    UnknownPort { port: String },
    #[error("port {port:?}: bridge {bridge:?} does not exist")]
    UnknownBridge { port: String, bridge: String },
    #[error("port {port:?}: VLAN {vlan} is out of range 1..=4094")]
    PortBadVlan { port: String, vlan: u16 },
    #[error("port {port:?}: PMD thread {pmd} does not exist (this switch runs {threads}: 0-{last})", last = threads - 1)]
    NoSuchPmd { port: String, pmd: u16, threads: usize },
    #[error("port {port:?}: MTU {mtu} is out of range 68..=9198")]
    BadMtu { port: String, mtu: u16 },
    #[error("port {port:?}: MTU {mtu} is more than this port can carry (at most {max})")]
    MtuAbovePort { port: String, mtu: u16, max: usize },
    #[error("port {port:?}: TPID {tpid:#06x} is not 0x8100, 0x88a8 or 0x9100")]
    BadTpid { port: String, tpid: u16 },
    #[error("port {port:?}: port security needs at least one MAC, and unicast ones")]
    BadSecurity { port: String },
    #[error("port {port:?}: policer: {why}")]
    BadPolicer { port: String, why: String },
    #[error("bridge {bridge:?}: pod policer: {why}")]
    BadPodPolicer { bridge: String, why: String },
    #[error("bridge {bridge:?}: policer: {why}")]
    BadBridgePolicer { bridge: String, why: String },
    #[error("too many {kind} (at most {max})")]
    TooMany { kind: &'static str, max: usize },
    #[error("VTEP: underlay port {port:?} is not configured with mode underlay")]
    VtepUnderlay { port: String },
    #[error("VTEP: port {port:?} has mode underlay but the VTEP's underlay port is {vtep_port:?}")]
    StrayUnderlay { port: String, vtep_port: String },
    #[error("VTEP: no source MAC (set vtep.mac or give the underlay port a MAC)")]
    VtepNoMac,
    #[error("VTEP: {what}")]
    Vtep { what: String },
    #[error("bridge {bridge:?}: gateway: {why}")]
    BadGateway { bridge: String, why: String },
    #[error("bridge {bridge:?}: {what} {value} is out of range 0..={max}")]
    BadMarking { bridge: String, what: &'static str, value: u8, max: u8 },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    #[serde(default)]
    pub bridges: Vec<BridgeConfig>,
    #[serde(default)]
    pub ports: Vec<PortConfig>,
    #[serde(default)]
    pub vtep: Option<VtepConfig>,
}

/// A bridge domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    pub name: String,
    /// Tag of this bridge domain on trunk ports (1..=4094).
    #[serde(default)]
    pub vlan: Option<u16>,
    /// VXLAN network identifier (1..=16777215).
    #[serde(default)]
    pub vni: Option<u32>,
    /// Remote VTEPs (underlay addresses) that receive this domain's BUM traffic and from
    /// which it accepts VXLAN; each must be one of the VTEP's peers.
    #[serde(default)]
    pub flood: Vec<IpAddr>,
    #[serde(default = "yes")]
    pub mac_learning: bool,
    /// Learn inner source MACs behind remote VTEPs (off when the control plane pushes MACs).
    #[serde(default = "yes")]
    pub remote_learning: bool,
    #[serde(default = "default_age")]
    pub mac_age_secs: u32,
    #[serde(default = "default_bd_limit")]
    pub mac_limit: u32,
    /// Answer ARP requests (and IPv6 neighbor solicitations) for addresses in `neighbors`.
    #[serde(default)]
    pub arp_suppression: bool,
    #[serde(default)]
    pub neighbors: Vec<Neighbor>,
    #[serde(default)]
    pub static_macs: Vec<StaticMac>,
    /// The DSCP (0..=63) of this domain's VXLAN frames' outer header, so the underlay can
    /// tell its planes apart (a network's plane, set by the manager); default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp: Option<u8>,
    /// The 802.1p priority (0..=7) of those frames on a tagged underlay; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcp: Option<u8>,
    /// This domain's VXLAN frames leave the underlay port ahead of the other domains', and
    /// wait for room rather than being dropped when its ring is full (a control plane that
    /// must keep flowing when a media plane floods the uplink).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub priority: bool,
    /// The policer each access port of this domain gets when it has none of its own (a
    /// network's per-pod rate, from the manager): every such port is held to this rate on
    /// its own, not all of them together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policer: Option<crate::policer::PolicerConfig>,
    /// One policer for everything this domain's access ports (its pods on this node) send
    /// together, whichever PMD threads poll them (a network's aggregate on a node); frames
    /// over it are dropped as `policed`, after each port's own policer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policer: Option<crate::policer::PolicerConfig>,
    /// The pods' gateway in this bridge domain, answered by the switch on every node alike
    /// (a distributed gateway): see [`GatewayConfig`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayConfig>,
}

/// A bridge domain's distributed gateway: the switch answers ARP and neighbor
/// solicitations for `ips` with `mac` (the same on every node, so a pod's neighbor entry
/// holds wherever it runs), and frames to `mac` go to the local `port`, addressed to that
/// port's own MAC: the node's host port, whose kernel routes them (to the host itself, a
/// Service, the outside world). Pods keep talking to each other switched, as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's addresses (a subnet's gateway). With an IPv6 one, the gateway also has
    /// a link-local address ([`GatewayConfig::link_local`]) unless one is given here.
    pub ips: Vec<IpAddr>,
    /// Default: `0a:58` and the first IPv4 address (`0a:59` and the last four bytes of the
    /// first IPv6 one), the manager's convention for pods' MACs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    /// The access port of this bridge domain that frames to the gateway leave by (a port
    /// whose device has a MAC of its own: a `host` device).
    pub port: String,
}

impl GatewayConfig {
    /// The gateway's MAC: the configured one or the one derived from its first address.
    pub fn mac(&self) -> Option<MacAddr> {
        self.mac.or_else(|| {
            let first = self.ips.iter().find(|ip| ip.is_ipv4()).or(self.ips.first())?;
            Some(match first {
                IpAddr::V4(a) => {
                    let o = a.octets();
                    MacAddr([0x0a, 0x58, o[0], o[1], o[2], o[3]])
                }
                IpAddr::V6(a) => {
                    let o = a.octets();
                    MacAddr([0x0a, 0x59, o[12], o[13], o[14], o[15]])
                }
            })
        })
    }
}

impl GatewayConfig {
    /// The link-local address the gateway has as an IPv6 router has one, when it routes IPv6
    /// (one of its addresses is IPv6) and none is configured: `fe80::` and the modified EUI-64
    /// of its MAC (RFC 4291), the same on every node, so a pod may route through it.
    pub fn link_local(&self) -> Option<Ipv6Addr> {
        let v6: Vec<Ipv6Addr> = self
            .ips
            .iter()
            .filter_map(|ip| if let IpAddr::V6(a) = ip { Some(*a) } else { None })
            .collect();
        if v6.is_empty() || v6.iter().any(Ipv6Addr::is_unicast_link_local) {
            return None;
        }
        Some(self.mac()?.link_local())
    }
}

impl BridgeConfig {
    /// The address bindings the switch answers for: `neighbors` and the gateway's (its
    /// derived link-local address too).
    pub fn answered(&self) -> Vec<Neighbor> {
        let mut all = self.neighbors.clone();
        if let Some(g) = &self.gateway
            && let Some(mac) = g.mac()
        {
            all.extend(
                g.ips
                    .iter()
                    .copied()
                    .chain(g.link_local().map(IpAddr::V6))
                    .map(|ip| Neighbor { ip, mac }),
            );
        }
        all
    }

    /// The MACs pinned in the FDB: `static_macs` and the gateway's (to its port).
    pub fn pinned(&self) -> Vec<StaticMac> {
        let mut all = self.static_macs.clone();
        if let Some(g) = &self.gateway
            && let Some(mac) = g.mac()
        {
            all.push(StaticMac { mac, port: Some(g.port.clone()), remote: None });
        }
        all
    }
}

/// An IP → MAC binding the control plane knows (for ARP/ND suppression).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbor {
    pub ip: IpAddr,
    pub mac: MacAddr,
}

/// A MAC pinned to a local port or a remote VTEP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticMac {
    pub mac: MacAddr,
    #[serde(default)]
    pub port: Option<String>,
    #[serde(default)]
    pub remote: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// The name the port was registered under.
    pub name: String,
    pub mode: PortMode,
    /// Largest L3 payload (the interface MTU); larger frames are dropped and counted.
    #[serde(default = "default_mtu")]
    pub mtu: u16,
    /// TPID of this port's tags (0x8100; 0x88a8 for 802.1ad trunks).
    #[serde(default = "default_tpid")]
    pub tpid: u16,
    #[serde(default = "default_port_limit")]
    pub mac_limit: u32,
    /// Anti-spoofing for pod ports; `None` means the port is trusted.
    #[serde(default)]
    pub security: Option<PortSecurity>,
    /// Ingress policing (`policer.rs`); `None`: every frame received is forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policer: Option<PolicerConfig>,
    /// The PMD thread (its index) that polls this port's rx queues, as OVS's
    /// `pmd-rxq-affinity`; such a thread polls only pinned queues. `None`: dealt in turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmd: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum PortMode {
    /// Untagged member of one bridge domain.
    Access { bridge: String },
    /// Tagged member of the bridge domains whose VLANs are allowed, untagged on `native`.
    Trunk {
        allowed: Vec<u16>,
        #[serde(default)]
        native: Option<u16>,
    },
    /// Carries the VTEP's VXLAN traffic.
    Underlay,
}

/// Allowed source addresses of a pod port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSecurity {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The pod's MAC(s).
    pub macs: Vec<MacAddr>,
    /// The pod's IPs; sources from the pod's MACs must be one of these.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Extra (MAC, IP) pairs a VNF may use, such as VRRP's 00:00:5e:00:01:xx; `ip: None`
    /// allows any source IP with that MAC.
    #[serde(default)]
    pub allowed_address_pairs: Vec<AddressPair>,
    /// Let router advertisements and ICMPv6 redirects from the port through (a router VNF);
    /// off, the RA guard (RFC 6105) drops them.
    #[serde(default)]
    pub allow_router: bool,
    /// Let DHCP server and relay messages from the port through (a DHCP VNF: UDP from port
    /// 67, DHCPv6 from port 547); off, the DHCP guard drops them.
    #[serde(default)]
    pub allow_dhcp_server: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddressPair {
    pub mac: MacAddr,
    #[serde(default)]
    pub ip: Option<IpAddr>,
}

/// The local VXLAN tunnel endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VtepConfig {
    pub local_ip: IpAddr,
    /// The underlay port (mode `underlay`).
    pub underlay_port: String,
    /// Source MAC of encapsulated frames; defaults to the underlay port's own MAC.
    #[serde(default)]
    pub mac: Option<MacAddr>,
    /// Tag the underlay frames carry, if the underlay is a VLAN.
    #[serde(default)]
    pub underlay_vlan: Option<u16>,
    #[serde(default = "default_vxlan_port")]
    pub udp_port: u16,
    /// Range of UDP source ports, chosen by inner flow hash (RFC 7348 recommends 49152..).
    #[serde(default = "default_src_lo")]
    pub src_port_min: u16,
    #[serde(default = "default_src_hi")]
    pub src_port_max: u16,
    #[serde(default = "default_ttl")]
    pub ttl: u8,
    /// Send IPv6 VXLAN with a zero UDP checksum (only for peers configured to accept it).
    #[serde(default)]
    pub ipv6_zero_checksum: bool,
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// The VTEP's address is the node's own (the kernel answers ARP/ND for it and resolves
    /// next hops; the switch follows the kernel's neighbor table, see
    /// `kernel_ports::kernel_neigh::KernelNeighbors` (knitter-kernel-ports)). Default: a dedicated address the switch answers for
    /// and resolves from.
    #[serde(default)]
    pub shared_address: bool,
}

/// A remote VTEP and how its frames reach it on the underlay: to a configured next-hop MAC,
/// or to the MAC that ARP / neighbor discovery finds for `next_hop` (default: the peer's own
/// address, for a peer on the underlay's subnet; a gateway's address otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub ip: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_mac: Option<MacAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop: Option<IpAddr>,
}

fn yes() -> bool {
    true
}
fn default_age() -> u32 {
    300
}
fn default_bd_limit() -> u32 {
    65536
}
fn default_port_limit() -> u32 {
    8192
}
fn default_mtu() -> u16 {
    1500
}
fn default_tpid() -> u16 {
    0x8100
}
fn default_vxlan_port() -> u16 {
    crate::wire::vxlan::DEFAULT_PORT
}
fn default_src_lo() -> u16 {
    49152
}
fn default_src_hi() -> u16 {
    65535
}
fn default_ttl() -> u8 {
    64
}

impl BridgeConfig {
    /// A bridge domain with defaults (learning on, 300 s ageing).
    pub fn new(name: &str) -> BridgeConfig {
        BridgeConfig {
            name: name.into(),
            vlan: None,
            vni: None,
            flood: Vec::new(),
            mac_learning: true,
            remote_learning: true,
            mac_age_secs: default_age(),
            mac_limit: default_bd_limit(),
            arp_suppression: false,
            neighbors: Vec::new(),
            static_macs: Vec::new(),
            dscp: None,
            pcp: None,
            priority: false,
            pod_policer: None,
            policer: None,
            gateway: None,
        }
    }

    pub fn vlan(mut self, v: u16) -> Self {
        self.vlan = Some(v);
        self
    }

    pub fn vni(mut self, v: u32) -> Self {
        self.vni = Some(v);
        self
    }

    pub fn flood(mut self, peers: &[IpAddr]) -> Self {
        self.flood = peers.to_vec();
        self
    }
}

impl PortConfig {
    fn with_mode(name: &str, mode: PortMode) -> PortConfig {
        PortConfig {
            name: name.into(),
            mode,
            mtu: default_mtu(),
            tpid: default_tpid(),
            mac_limit: default_port_limit(),
            security: None,
            policer: None,
            pmd: None,
        }
    }

    /// This port with an ingress policer.
    pub fn policed(mut self, p: PolicerConfig) -> PortConfig {
        self.policer = Some(p);
        self
    }

    /// A trusted untagged port in `bridge`.
    pub fn access(name: &str, bridge: &str) -> PortConfig {
        PortConfig::with_mode(name, PortMode::Access { bridge: bridge.into() })
    }

    /// A pod port: untagged in `bridge`, port security on for the pod's MAC and IPs.
    pub fn pod(name: &str, bridge: &str, mac: MacAddr, ips: &[IpAddr]) -> PortConfig {
        let mut p = PortConfig::access(name, bridge);
        p.security = Some(PortSecurity {
            enabled: true,
            macs: vec![mac],
            ips: ips.to_vec(),
            allowed_address_pairs: Vec::new(),
            allow_router: false,
            allow_dhcp_server: false,
        });
        p
    }

    pub fn trunk(name: &str, allowed: &[u16], native: Option<u16>) -> PortConfig {
        PortConfig::with_mode(name, PortMode::Trunk { allowed: allowed.to_vec(), native })
    }

    pub fn underlay(name: &str) -> PortConfig {
        PortConfig::with_mode(name, PortMode::Underlay)
    }
}

impl VtepConfig {
    pub fn new(local_ip: IpAddr, underlay_port: &str) -> VtepConfig {
        VtepConfig {
            local_ip,
            underlay_port: underlay_port.into(),
            mac: None,
            underlay_vlan: None,
            udp_port: default_vxlan_port(),
            src_port_min: default_src_lo(),
            src_port_max: default_src_hi(),
            ttl: default_ttl(),
            ipv6_zero_checksum: false,
            peers: Vec::new(),
            shared_address: false,
        }
    }

    /// A peer reached through a configured next-hop MAC.
    pub fn peer(mut self, ip: IpAddr, next_hop_mac: MacAddr) -> Self {
        self.peers.push(PeerConfig { ip, next_hop_mac: Some(next_hop_mac), next_hop: None });
        self
    }

    /// A peer whose next hop (itself, or `via`) the switch resolves.
    pub fn peer_resolved(mut self, ip: IpAddr, via: Option<IpAddr>) -> Self {
        self.peers.push(PeerConfig { ip, next_hop_mac: None, next_hop: via });
        self
    }

    /// Bytes VXLAN adds to an inner frame on this underlay: 50 over IPv4, 70 over IPv6,
    /// plus 4 on a tagged underlay. The control plane subtracts it to size network MTUs.
    pub fn overhead(&self) -> u16 {
        let base = if self.local_ip.is_ipv4() { 50 } else { 70 };
        base + if self.underlay_vlan.is_some() { 4 } else { 0 }
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| serde::de::Error::custom(format!("invalid MAC address {s:?}")))
    }
}

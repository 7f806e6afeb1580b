//! The compiled, immutable form of a [`SwitchConfig`] that PMD threads read.
//!
//! Built off the fast path by the control side, validated whole (an invalid configuration is
//! refused with a precise reason and nothing changes), and published RCU-style: PMD threads
//! pick up a new `Arc<Snapshot>` between batches. Everything the per-packet code needs is
//! precomputed here: VLAN → bridge domain table, per-port VLAN sets and egress tagging,
//! per-domain flood lists, VNI and VTEP maps, and VXLAN header templates per peer.

use crate::config::*;
use crate::fdb::{MAX_BDS, MAX_PORTS};
use crate::policer::SharedBucket;
use crate::port::Port;
use crate::util::{FxMap, FxSet, VlanSet};
use crate::vtep::{Admission, Marking, PeerEntry, VtepEntry};
use crate::wire::MacAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Remote VTEPs one switch knows (their ids are below this): a VXLAN network spanning a
/// large cluster has thousands. A configured peer costs its header template and its next
/// hop's slot (24 bytes, reserved for every id up front). The exact-match cache holds decisions
/// for the first 4 096 ids only (12 bits of its 64-bit entry, `emc::Hit`); frames to peers
/// with higher ids take the slow path (docs/operations.md "Limits").
pub const MAX_PEERS: usize = 16384;

/// "No bridge domain" in lookup tables.
pub const NO_BD: u16 = u16::MAX;

pub use crate::config::ConfigError;

/// A port as the fast path sees it.
pub struct PortEntry {
    pub id: u16,
    pub name: String,
    pub port: Arc<dyn Port>,
    pub kind: PortKind,
    /// VLANs accepted tagged (trunks).
    pub allowed: VlanSet,
    /// Bridge domain of untagged frames (access bridge, or the trunk's native VLAN's).
    pub untagged_bd: u16,
    pub tpid: u16,
    pub mtu: u16,
    pub mac_limit: u32,
    pub security: Option<Security>,
    /// Ingress policing: the port's buckets (every thread that polls one of its queues draws
    /// from them; kept, tokens and all, by the next snapshot while its limits stay the same).
    pub policer: Option<Arc<SharedBucket>>,
    /// The policer of its access bridge's frames from all its ports together (shared with
    /// them and every PMD thread), and that bridge domain.
    pub net_policer: Option<(Arc<SharedBucket>, u16)>,
    /// A gateway's port ([`crate::config::GatewayConfig`]): frames to the first MAC leave it
    /// addressed to the second (the port's own).
    pub deliver_as: Option<(MacAddr, MacAddr)>,
    /// The PMD thread its rx queues are pinned to (see [`crate::pmd::assignment`]).
    pub pmd: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    Access,
    Trunk,
    Underlay,
}

impl PortEntry {
    /// The tag a frame of `bd` (with trunk VLAN `vlan`) carries when leaving this port:
    /// `Some(None)` untagged, `Some(Some(vid))` tagged, `None` when the port is not a member
    /// of that bridge domain.
    #[inline(always)]
    pub fn egress_tag(&self, bd: u16, vlan: u16) -> Option<Option<u16>> {
        if bd == self.untagged_bd {
            Some(None)
        } else if self.kind == PortKind::Trunk && vlan != 0 && self.allowed.contains(vlan) {
            Some(Some(vlan))
        } else {
            None
        }
    }
}

/// Compiled port security.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub macs: Vec<u64>,
    pub ips: Vec<IpAddr>,
    /// (MAC, IP or any).
    pub pairs: Vec<(u64, Option<IpAddr>)>,
    /// The shape the CNI gives a pod — one MAC, one IPv4 address, no pairs — as (MAC,
    /// address, its bytes in frame order as a native-endian `u32`): checked with two compares
    /// instead of walking the lists.
    pub one_v4: Option<(u64, u32)>,
    /// Router advertisements and redirects from the port pass (a router VNF); otherwise the
    /// RA guard drops them.
    pub allow_router: bool,
    /// DHCP server and relay messages from the port pass (a DHCP VNF); otherwise the DHCP
    /// guard drops them.
    pub allow_dhcp_server: bool,
}

impl Security {
    pub fn new(macs: Vec<u64>, ips: Vec<IpAddr>, pairs: Vec<(u64, Option<IpAddr>)>) -> Security {
        let one_v4 = match (macs.as_slice(), ips.as_slice(), pairs.is_empty()) {
            ([mac], [IpAddr::V4(ip)], true) => Some((*mac, u32::from_ne_bytes(ip.octets()))),
            _ => None,
        };
        Security { macs, ips, pairs, one_v4, allow_router: false, allow_dhcp_server: false }
    }

    /// Whether `a` is one of the port's own IPv6 link-local addresses: one an allowed MAC
    /// makes (modified EUI-64, RFC 4291 appendix A: what Linux and DPDK form unless told
    /// otherwise), or one listed outright (in the port's addresses or its pairs). A port with
    /// MACs only, which may use any address, still has only its own link-local ones: it
    /// cannot claim its router's.
    pub fn own_link_local(&self, mac: u64, a: &std::net::Ipv6Addr) -> bool {
        let eui64 = |m: u64| {
            let b = m.to_be_bytes();
            std::net::Ipv6Addr::from([
                0xfe,
                0x80,
                0,
                0,
                0,
                0,
                0,
                0,
                b[2] ^ 0x02,
                b[3],
                b[4],
                0xff,
                0xfe,
                b[5],
                b[6],
                b[7],
            ])
        };
        let listed = (self.macs.contains(&mac) && self.ips.contains(&IpAddr::V6(*a)))
            || self.pairs.iter().any(|(m, i)| *m == mac && *i == Some(IpAddr::V6(*a)));
        listed || self.macs.iter().chain(self.pairs.iter().map(|(m, _)| m)).any(|m| eui64(*m) == *a)
    }

    #[inline]
    pub fn mac_allowed(&self, mac: u64) -> bool {
        self.macs.contains(&mac) || self.pairs.iter().any(|(m, _)| *m == mac)
    }

    /// Whether `mac` may send from `ip`. With no IPs configured, the port's own MACs may use
    /// any IP (MAC-only security).
    #[inline]
    pub fn ip_allowed(&self, mac: u64, ip: IpAddr) -> bool {
        (self.macs.contains(&mac) && (self.ips.is_empty() || self.ips.contains(&ip)))
            || self.pairs.iter().any(|(m, i)| *m == mac && i.is_none_or(|i| i == ip))
    }
}

/// A bridge domain as the fast path sees it.
pub struct BdEntry {
    pub id: u16,
    pub name: String,
    /// Trunk tag (0: none).
    pub vlan: u16,
    pub vni: Option<u32>,
    /// Local member ports and the tag frames of this domain carry on each, for flooding.
    pub ports: Vec<(u16, Option<u16>)>,
    /// Remote VTEPs (peer ids), for flooding and decap admission.
    pub peers: Vec<u16>,
    pub learning: bool,
    pub remote_learning: bool,
    pub age_secs: u32,
    pub mac_limit: u32,
    pub arp_suppression: bool,
    pub arp: FxMap<Ipv4Addr, MacAddr>,
    pub nd: FxMap<Ipv6Addr, MacAddr>,
    /// The FDB key of the gateway's MAC in this domain (0: no gateway): neighbor requests
    /// sent to it unicast (a pod confirming its entry) are answered like broadcast ones.
    pub gateway_key: u64,
}

/// Stable ids for names across snapshots (so learned state survives unrelated changes).
/// Each map is shared with the previous `Ids` until a change touches it (so keeping a copy
/// to go back to on error costs nothing).
#[derive(Debug, Clone, Default)]
pub struct Ids {
    pub ports: Arc<FxMap<String, u16>>,
    pub bds: Arc<FxMap<String, u16>>,
    pub peers: Arc<FxMap<IpAddr, u16>>,
}

impl Ids {
    /// Gives every name in `cfg` an id, keeping existing ones and reusing the lowest free.
    pub fn assign(&mut self, cfg: &SwitchConfig) -> Result<(), ConfigError> {
        fn sync<'a, K: std::hash::Hash + Eq + Clone + 'a>(
            map: &mut Arc<FxMap<K, u16>>,
            want: impl Iterator<Item = &'a K> + Clone,
            kind: &'static str,
            max: usize,
        ) -> Result<(), ConfigError> {
            // The same names as before (a change to one object leaves the others' alone):
            // nothing to do, and nothing allocated.
            let mut n = 0;
            if want.clone().all(|k| {
                n += 1;
                map.contains_key(k)
            }) && n == map.len()
            {
                return Ok(());
            }
            let keep: FxSet<&K> = want.clone().collect();
            let map = Arc::make_mut(map);
            map.retain(|k, _| keep.contains(k));
            let mut used: Vec<bool> = vec![false; max];
            for id in map.values() {
                used[*id as usize] = true;
            }
            let mut next = 0usize;
            for k in want {
                if map.contains_key(k) {
                    continue;
                }
                while next < max && used[next] {
                    next += 1;
                }
                if next == max {
                    return Err(ConfigError::TooMany { kind, max });
                }
                used[next] = true;
                map.insert(k.clone(), next as u16);
            }
            Ok(())
        }
        sync(&mut self.ports, cfg.ports.iter().map(|p| &p.name), "ports", MAX_PORTS)?;
        sync(&mut self.bds, cfg.bridges.iter().map(|b| &b.name), "bridges", MAX_BDS)?;
        sync(
            &mut self.peers,
            cfg.vtep.iter().flat_map(|v| v.peers.iter().map(|p| &p.ip)),
            "VTEP peers",
            MAX_PEERS,
        )
    }
}

/// The previous snapshot's bridge domains, found by the position of their configuration
/// (the same, when a change leaves the order alone) or else by name.
struct PrevBridges<'a> {
    prev: &'a Snapshot,
    by_name: Option<FxMap<&'a str, usize>>,
}

impl<'a> PrevBridges<'a> {
    fn new(prev: &'a Snapshot) -> Self {
        PrevBridges { prev, by_name: None }
    }

    /// The previous entry of bridge `b` (at `i` in the new configuration, id `id`), when its
    /// configuration was the same and so was its id.
    fn entry(&mut self, i: usize, b: &BridgeConfig, id: u16) -> Option<&'a Arc<BdEntry>> {
        let bridges = &self.prev.config.bridges;
        let at = match bridges.get(i) {
            Some(p) if p.name == b.name => i,
            _ => *self
                .by_name
                .get_or_insert_with(|| {
                    bridges.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect()
                })
                .get(b.name.as_str())?,
        };
        let e = self.prev.bds.get(id as usize)?.as_ref()?;
        (bridges[at] == *b && e.name == b.name).then_some(e)
    }
}

/// The immutable configuration PMD threads read.
///
/// The costly pieces are shared with the snapshot before it while what they were compiled
/// from stays the same (see [`Snapshot::build`]): each bridge domain's entry, and the peers
/// with their maps.
pub struct Snapshot {
    pub generation: u64,
    pub ports: Vec<Option<PortEntry>>,
    pub bds: Vec<Option<Arc<BdEntry>>>,
    /// Trunk VLAN → bridge domain.
    pub vlan_bd: Box<[u16; 4096]>,
    pub vni_bd: FxMap<u32, u16>,
    /// Bridge domain → how its encapsulated frames are marked (indexed by id; 8 KiB, read
    /// without a bounds check on the encapsulation fast path).
    pub marks: Box<[Marking; MAX_BDS]>,
    /// Some bridge domain is marked or has priority (encapsulation takes the marking path
    /// only then).
    pub marked: bool,
    pub vtep: Option<VtepEntry>,
    pub peers: Arc<[Option<PeerEntry>]>,
    pub peer_by_ip: Arc<FxMap<IpAddr, u16>>,
    /// Next-hop address → the peers that resolve it.
    pub next_hops: Arc<FxMap<IpAddr, Vec<u16>>>,
    /// Every (port, rx queue) to poll.
    pub rxqs: Vec<(u16, u16)>,
    /// Bridge domains' policers by name (kept, tokens and all, by the next snapshot while
    /// their limits stay the same).
    pub net_policers: FxMap<String, Arc<SharedBucket>>,
    pub config: SwitchConfig,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Snapshot(gen {}, {} ports, {} bridges)",
            self.generation,
            self.port_count(),
            self.bd_count()
        )
    }
}

fn check_name<'a>(
    kind: &'static str,
    name: &'a str,
    seen: &mut FxSet<&'a str>,
) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::EmptyName { kind });
    }
    if !seen.insert(name) {
        return Err(ConfigError::Duplicate { kind, name: name.to_owned() });
    }
    Ok(())
}

fn vlan_ok(v: u16) -> bool {
    (1..=4094).contains(&v)
}

impl Snapshot {
    /// An empty configuration.
    pub fn empty() -> Snapshot {
        Snapshot {
            generation: 0,
            ports: Vec::new(),
            bds: Vec::new(),
            vlan_bd: Box::new([NO_BD; 4096]),
            vni_bd: FxMap::default(),
            marks: Box::new([Marking::default(); MAX_BDS]),
            marked: false,
            vtep: None,
            peers: Arc::new([]),
            peer_by_ip: Arc::default(),
            next_hops: Arc::default(),
            rxqs: Vec::new(),
            net_policers: FxMap::default(),
            config: SwitchConfig::default(),
        }
    }

    #[inline(always)]
    pub fn port(&self, id: u16) -> Option<&PortEntry> {
        self.ports.get(id as usize).and_then(Option::as_ref)
    }

    /// How bridge domain `id`'s encapsulated frames are marked.
    #[inline(always)]
    pub fn marking(&self, id: u16) -> Marking {
        self.marks[id as usize & (MAX_BDS - 1)]
    }

    /// [`Snapshot::marking`] of the bridge domain of VNI `vni` (frames that waited).
    pub fn marking_of_vni(&self, vni: u32) -> Marking {
        self.vni_bd.get(&vni).map_or(Marking::default(), |bd| self.marking(*bd))
    }

    #[inline(always)]
    pub fn bd(&self, id: u16) -> Option<&BdEntry> {
        self.bds.get(id as usize).and_then(Option::as_deref)
    }

    #[inline(always)]
    pub fn peer(&self, id: u16) -> Option<&PeerEntry> {
        self.peers.get(id as usize).and_then(Option::as_ref)
    }

    pub fn port_count(&self) -> usize {
        self.ports.iter().flatten().count()
    }

    pub fn bd_count(&self) -> usize {
        self.bds.iter().flatten().count()
    }

    pub fn port_id(&self, name: &str) -> Option<u16> {
        self.ports.iter().flatten().find(|p| p.name == name).map(|p| p.id)
    }

    pub fn bd_id(&self, name: &str) -> Option<u16> {
        self.bds.iter().flatten().find(|b| b.name == name).map(|b| b.id)
    }

    /// Every bridge domain's local members (`max_bd` domains, whose VLANs are in `vlan_bd`
    /// already) and the tag each carries there, in port order: [`PortEntry::egress_tag`]
    /// for every (port, domain), from one pass over the ports and their VLANs.
    fn members(&self, max_bd: usize) -> Vec<Vec<(u16, Option<u16>)>> {
        let mut members = vec![Vec::new(); max_bd];
        for p in self.ports.iter().flatten() {
            if let Some(m) = members.get_mut(p.untagged_bd as usize) {
                m.push((p.id, None));
            }
            if p.kind == PortKind::Trunk {
                for v in p.allowed.iter() {
                    let bd = self.vlan_bd[v as usize];
                    if bd != p.untagged_bd
                        && let Some(m) = members.get_mut(bd as usize)
                    {
                        m.push((p.id, Some(v)));
                    }
                }
            }
        }
        members
    }

    /// Validates `cfg` whole and compiles it. `lookup` finds registered ports by name.
    ///
    /// `prev` is the snapshot this one follows (ids in `ids` kept for names that stayed):
    /// the VTEP's peers, their maps and templates are taken from it whole while the VTEP's
    /// configuration, its underlay port's MAC and MTU stay the same, and each bridge domain's
    /// entry while its configuration and its local members do too (and the peers were
    /// taken). What is taken is not validated again: the same configuration passed before.
    /// A change therefore costs the validation of the names, VLANs and VNIs of the whole
    /// configuration and the compilation of what it touched (docs/perf/scale.md "Scale").
    pub fn build(
        cfg: SwitchConfig,
        ids: &Ids,
        lookup: &dyn Fn(&str) -> Option<Arc<dyn Port>>,
        generation: u64,
        prev: &Snapshot,
    ) -> Result<Snapshot, ConfigError> {
        let mut s = Snapshot::empty();
        s.generation = generation;
        s.compile(&cfg, ids, lookup, prev)?;
        s.config = cfg;
        Ok(s)
    }

    fn compile(
        &mut self,
        cfg: &SwitchConfig,
        ids: &Ids,
        lookup: &dyn Fn(&str) -> Option<Arc<dyn Port>>,
        prev: &Snapshot,
    ) -> Result<(), ConfigError> {
        check_bridges(cfg)?;
        check_vtep(cfg)?;
        self.compile_net_policers(cfg, prev)?;
        let mut pnames = FxSet::default();
        let max_port = ids.ports.values().copied().max().map_or(0, |m| m as usize + 1);
        self.ports.resize_with(max_port, || None);
        for p in &cfg.ports {
            check_name("port", &p.name, &mut pnames)?;
            let entry = self.compile_port(p, cfg, ids, lookup, prev)?;
            for q in 0..entry.port.rx_queues() {
                self.rxqs.push((entry.id, q));
            }
            let id = entry.id as usize;
            self.ports[id] = Some(entry);
        }
        let peers_taken = self.compile_vtep(cfg, ids, prev)?;
        self.compile_bridges(cfg, ids, prev, peers_taken)?;
        self.compile_gateways(cfg, ids)
    }

    /// Each gateway's port: frames to the gateway's MAC leave it addressed to the port's own.
    fn compile_gateways(&mut self, cfg: &SwitchConfig, ids: &Ids) -> Result<(), ConfigError> {
        for b in &cfg.bridges {
            let Some(g) = &b.gateway else { continue };
            let bad = |why: String| ConfigError::BadGateway { bridge: b.name.clone(), why };
            let mac = g.mac().ok_or_else(|| bad("it needs at least one address".into()))?;
            if mac.is_group() || mac.0 == [0; 6] {
                return Err(bad(format!("MAC {mac} is not a unicast address")));
            }
            let Some(pe) = ids
                .ports
                .get(&g.port)
                .and_then(|id| self.ports.get_mut(*id as usize))
                .and_then(Option::as_mut)
            else {
                return Err(bad(format!(
                    "it names port {:?}, which the switch does not have",
                    g.port
                )));
            };
            if pe.kind != PortKind::Access || pe.untagged_bd != ids.bds[&b.name] {
                return Err(bad(format!("port {:?} is not an access port of this bridge", g.port)));
            }
            let own = pe.port.mac().ok_or_else(|| {
                bad(format!("port {:?} has no MAC of its own to address the frames to", g.port))
            })?;
            if own == mac {
                return Err(bad(format!(
                    "port {:?} has the gateway's own MAC {mac}: give the host port an address of its own",
                    g.port
                )));
            }
            if pe.deliver_as.is_some_and(|(m, _)| m != mac) {
                return Err(bad(format!("port {:?} is already another gateway's", g.port)));
            }
            pe.deliver_as = Some((mac, own));
        }
        Ok(())
    }

    /// Each bridge domain's network policer on the node: the one it had while its limits hold.
    fn compile_net_policers(
        &mut self,
        cfg: &SwitchConfig,
        prev: &Snapshot,
    ) -> Result<(), ConfigError> {
        for b in &cfg.bridges {
            if let Some(c) = &b.pod_policer {
                c.limits(0)
                    .map_err(|why| ConfigError::BadPodPolicer { bridge: b.name.clone(), why })?;
            }
            if let Some(c) = &b.policer {
                // Its largest frame: its access ports' (a standard one without any).
                let max_mtu = cfg
                    .ports
                    .iter()
                    .filter(|p| matches!(&p.mode, PortMode::Access { bridge } if *bridge == b.name))
                    .map(|p| p.mtu)
                    .max();
                let limits = c
                    .limits(max_mtu.unwrap_or(1500) as u32 + 18)
                    .map_err(|why| ConfigError::BadBridgePolicer { bridge: b.name.clone(), why })?;
                let bucket = match prev.net_policers.get(&b.name) {
                    Some(kept) if kept.holds_to(&limits) => kept.clone(),
                    // Full from the start: its clock (0) only ever moves on with the pipelines'.
                    _ => Arc::new(SharedBucket::new(&limits, 0)),
                };
                self.net_policers.insert(b.name.clone(), bucket);
            }
        }
        Ok(())
    }

    /// A port's entry: its mode checked and resolved, port security, its policer (kept while
    /// its limits hold).
    fn compile_port(
        &self,
        p: &PortConfig,
        cfg: &SwitchConfig,
        ids: &Ids,
        lookup: &dyn Fn(&str) -> Option<Arc<dyn Port>>,
        prev: &Snapshot,
    ) -> Result<PortEntry, ConfigError> {
        let bd_of = |name: &str| ids.bds.get(name).copied();
        let port =
            lookup(&p.name).ok_or_else(|| ConfigError::UnknownPort { port: p.name.clone() })?;
        if !(68..=9198).contains(&p.mtu) {
            return Err(ConfigError::BadMtu { port: p.name.clone(), mtu: p.mtu });
        }
        // The MTU bounds the L3 packet; the port carries it with an Ethernet header and a tag.
        let max = port.max_frame().saturating_sub(18);
        if p.mtu as usize > max {
            return Err(ConfigError::MtuAbovePort { port: p.name.clone(), mtu: p.mtu, max });
        }
        if !crate::wire::ethernet::is_tpid(p.tpid) {
            return Err(ConfigError::BadTpid { port: p.name.clone(), tpid: p.tpid });
        }
        let mut allowed = VlanSet::default();
        let (kind, untagged_bd) = match &p.mode {
            PortMode::Access { bridge } => {
                let bd = bd_of(bridge).ok_or_else(|| ConfigError::UnknownBridge {
                    port: p.name.clone(),
                    bridge: bridge.clone(),
                })?;
                (PortKind::Access, bd)
            }
            PortMode::Trunk { allowed: vl, native } => {
                for v in vl.iter().chain(native) {
                    if !vlan_ok(*v) {
                        return Err(ConfigError::PortBadVlan { port: p.name.clone(), vlan: *v });
                    }
                }
                for v in vl {
                    allowed.insert(*v);
                }
                let native_bd = native
                    .and_then(|n| cfg.bridges.iter().find(|b| b.vlan == Some(n)))
                    .and_then(|b| bd_of(&b.name))
                    .unwrap_or(NO_BD);
                (PortKind::Trunk, native_bd)
            }
            PortMode::Underlay => (PortKind::Underlay, NO_BD),
        };
        let security = match &p.security {
            Some(sec) if sec.enabled => {
                if sec.macs.is_empty() || sec.macs.iter().any(MacAddr::is_group) {
                    return Err(ConfigError::BadSecurity { port: p.name.clone() });
                }
                let mut s = Security::new(
                    sec.macs.iter().map(|m| m.to_u64()).collect(),
                    sec.ips.clone(),
                    sec.allowed_address_pairs.iter().map(|a| (a.mac.to_u64(), a.ip)).collect(),
                );
                (s.allow_router, s.allow_dhcp_server) = (sec.allow_router, sec.allow_dhcp_server);
                Some(s)
            }
            _ => None,
        };
        // The largest frame: the MTU, an Ethernet header and, on trunks, a tag.
        let max_frame = p.mtu as u32 + 18;
        // The port's own policer, else its access bridge's per-pod one (not on the bridge's
        // gateway port: that carries every pod's traffic from the node).
        let pod_policer = || match &p.mode {
            PortMode::Access { bridge } => cfg
                .bridges
                .iter()
                .find(|b| &b.name == bridge && b.gateway.as_ref().is_none_or(|g| g.port != p.name))
                .and_then(|b| b.pod_policer.as_ref()),
            _ => None,
        };
        let limits = match (&p.policer, pod_policer()) {
            (Some(c), _) => Some(
                c.limits(max_frame)
                    .map_err(|why| ConfigError::BadPolicer { port: p.name.clone(), why })?,
            ),
            (None, Some(c)) => {
                Some(c.limits(max_frame).map_err(|why| ConfigError::BadPolicer {
                    port: p.name.clone(),
                    why: format!("its bridge's pod policer: {why}"),
                })?)
            }
            (None, None) => None,
        };
        let id = ids.ports[&p.name];
        let policer = limits.map(|limits| {
            match prev.port(id).filter(|e| e.name == p.name).and_then(|e| e.policer.as_ref()) {
                Some(kept) if kept.holds_to(&limits) => kept.clone(),
                // Full from the start: its clock (0) only ever moves on with the pipelines'.
                _ => Arc::new(SharedBucket::new(&limits, 0)),
            }
        });
        let net_policer = match &p.mode {
            PortMode::Access { bridge } => {
                self.net_policers.get(bridge).map(|b| (b.clone(), untagged_bd))
            }
            _ => None,
        };
        Ok(PortEntry {
            id,
            name: p.name.clone(),
            port,
            kind,
            allowed,
            untagged_bd,
            tpid: p.tpid,
            mtu: p.mtu,
            mac_limit: p.mac_limit,
            security,
            policer,
            net_policer,
            deliver_as: None,
            pmd: p.pmd,
        })
    }

    /// The VTEP's entry and its peers' templates (taken from `prev` while the VTEP, its
    /// underlay's MAC and MTU stay the same); returns whether they were taken.
    fn compile_vtep(
        &mut self,
        cfg: &SwitchConfig,
        ids: &Ids,
        prev: &Snapshot,
    ) -> Result<bool, ConfigError> {
        let mut peers_taken = false;
        if let Some(v) = &cfg.vtep {
            let underlay_id = ids.ports[&v.underlay_port];
            let underlay = self.port(underlay_id).expect("underlay validated above");
            let mac = v.mac.or_else(|| underlay.port.mac()).ok_or(ConfigError::VtepNoMac)?;
            peers_taken = prev.config.vtep.as_ref() == Some(v)
                && prev.vtep.as_ref().is_some_and(|p| {
                    (p.underlay_port, p.mac, p.mtu) == (underlay_id, mac, underlay.mtu)
                });
            if peers_taken {
                (self.peers, self.peer_by_ip, self.next_hops) =
                    (prev.peers.clone(), prev.peer_by_ip.clone(), prev.next_hops.clone());
                self.vtep = prev.vtep.clone();
            } else {
                self.compile_peers(v, ids, VtepEntry::new(v, underlay_id, mac, underlay.mtu)?)?;
            }
        }
        Ok(peers_taken)
    }

    /// The bridge domains' entries with their members (an entry taken from `prev` while its
    /// configuration and its local members stay the same and the peers were taken).
    fn compile_bridges(
        &mut self,
        cfg: &SwitchConfig,
        ids: &Ids,
        prev: &Snapshot,
        peers_taken: bool,
    ) -> Result<(), ConfigError> {
        let max_bd = ids.bds.values().copied().max().map_or(0, |m| m as usize + 1);
        self.bds.resize_with(max_bd, || None);
        (self.marks, self.marked) = (Box::new([Marking::default(); MAX_BDS]), false);
        for b in &cfg.bridges {
            if let Some(v) = b.vlan.filter(|v| *v != 0) {
                self.vlan_bd[v as usize] = ids.bds[&b.name];
            }
        }
        let mut members = self.members(max_bd);
        let mut flooded = vec![false; self.peers.len()];
        let mut before = PrevBridges::new(prev);
        for (i, b) in cfg.bridges.iter().enumerate() {
            let id = ids.bds[&b.name];
            let vlan = b.vlan.unwrap_or(0);
            if let Some(n) = b.vni {
                self.vni_bd.insert(n, id);
            }
            self.marks[id as usize] = Marking::of(b)?;
            self.marked |= self.marks[id as usize].set || b.priority;
            let ports = std::mem::take(&mut members[id as usize]);
            if peers_taken && let Some(e) = before.entry(i, b, id).filter(|e| e.ports == ports) {
                self.bds[id as usize] = Some(e.clone());
                continue;
            }
            let entry = self.compile_bridge(b, ids, id, vlan, ports, &mut flooded)?;
            self.bds[id as usize] = Some(Arc::new(entry));
        }
        Ok(())
    }

    /// One bridge domain's entry: its flood list's peers, ARP/ND table, static MACs checked.
    fn compile_bridge(
        &self,
        b: &BridgeConfig,
        ids: &Ids,
        id: u16,
        vlan: u16,
        ports: Vec<(u16, Option<u16>)>,
        flooded: &mut [bool],
    ) -> Result<BdEntry, ConfigError> {
        let mut peers = Vec::with_capacity(b.flood.len());
        for ip in &b.flood {
            let pid = *self
                .peer_by_ip
                .get(ip)
                .ok_or_else(|| ConfigError::UnknownPeer { bridge: b.name.clone(), ip: *ip })?;
            if !std::mem::replace(&mut flooded[pid as usize], true) {
                peers.push(pid);
            }
        }
        for p in &peers {
            flooded[*p as usize] = false;
        }
        let mut arp = FxMap::default();
        let mut nd = FxMap::default();
        for n in &b.answered() {
            if n.mac.is_group() {
                return Err(ConfigError::GroupMac {
                    bridge: b.name.clone(),
                    what: "neighbor",
                    mac: n.mac,
                });
            }
            match n.ip {
                IpAddr::V4(a) => arp.insert(a, n.mac),
                IpAddr::V6(a) => nd.insert(a, n.mac),
            };
        }
        // The gateway's own pin is checked with the gateway (`compile_gateways`).
        for m in &b.static_macs {
            if m.mac.is_group() {
                return Err(ConfigError::GroupMac {
                    bridge: b.name.clone(),
                    what: "static MAC",
                    mac: m.mac,
                });
            }
            let member = match (&m.port, &m.remote) {
                (Some(p), None) => {
                    ids.ports.get(p).is_some_and(|id| ports.iter().any(|(q, _)| q == id))
                }
                (None, Some(ip)) => self.peer_by_ip.get(ip).is_some_and(|id| peers.contains(id)),
                _ => {
                    return Err(ConfigError::StaticMacTarget {
                        bridge: b.name.clone(),
                        mac: m.mac,
                    });
                }
            };
            if !member {
                let target = m
                    .port
                    .clone()
                    .unwrap_or_else(|| m.remote.map(|r| r.to_string()).unwrap_or_default());
                return Err(ConfigError::StaticMacNotMember {
                    bridge: b.name.clone(),
                    mac: m.mac,
                    target,
                });
            }
        }
        Ok(BdEntry {
            id,
            name: b.name.clone(),
            vlan,
            vni: b.vni,
            ports,
            peers,
            learning: b.mac_learning,
            remote_learning: b.remote_learning,
            age_secs: b.mac_age_secs.max(1),
            mac_limit: b.mac_limit,
            arp_suppression: b.arp_suppression || b.gateway.is_some(),
            arp,
            nd,
            gateway_key: b
                .gateway
                .as_ref()
                .and_then(|g| g.mac())
                .map_or(0, |m| crate::fdb::key(id, m.to_u64())),
        })
    }

    /// The VTEP `entry` of configuration `v`, its peers' templates and their maps.
    fn compile_peers(
        &mut self,
        v: &VtepConfig,
        ids: &Ids,
        entry: VtepEntry,
    ) -> Result<(), ConfigError> {
        let max_peer = ids.peers.values().copied().max().map_or(0, |m| m as usize + 1);
        let mut peers: Vec<Option<PeerEntry>> = Vec::new();
        peers.resize_with(max_peer, || None);
        let (mut by_ip, mut next_hops) = (FxMap::default(), FxMap::<IpAddr, Vec<u16>>::default());
        by_ip.reserve(v.peers.len());
        for pc in &v.peers {
            let id = ids.peers[&pc.ip];
            if by_ip.insert(pc.ip, id).is_some() {
                return Err(ConfigError::Duplicate { kind: "VTEP peer", name: pc.ip.to_string() });
            }
            let pe = entry.peer(id, pc)?;
            if let Some(nh) = pe.resolve {
                next_hops.entry(nh).or_default().push(id);
            }
            peers[id as usize] = Some(pe);
        }
        (self.peers, self.peer_by_ip, self.next_hops) =
            (peers.into(), Arc::new(by_ip), Arc::new(next_hops));
        self.vtep = Some(entry);
        Ok(())
    }
}

impl Admission for Snapshot {
    #[inline(always)]
    fn bd_of_vni(&self, vni: u32) -> Option<u16> {
        self.vni_bd.get(&vni).copied()
    }

    #[inline(always)]
    fn peer_of(&self, ip: &IpAddr) -> Option<u16> {
        self.peer_by_ip.get(ip).copied()
    }

    #[inline(always)]
    fn floods_to(&self, bd: u16, peer: u16) -> bool {
        self.bd(bd).is_some_and(|e| e.peers.contains(&peer))
    }
}

/// The bridge domains' names, VLANs and VNIs (each once), and flood lists only with VXLAN.
fn check_bridges(cfg: &SwitchConfig) -> Result<(), ConfigError> {
    let mut names = FxSet::default();
    names.reserve(cfg.bridges.len());
    let mut by_vlan: FxMap<u16, &str> = FxMap::default();
    let mut by_vni: FxMap<u32, &str> = FxMap::default();
    for b in &cfg.bridges {
        check_name("bridge", &b.name, &mut names)?;
        if let Some(v) = b.vlan {
            if !vlan_ok(v) {
                return Err(ConfigError::BadVlan { bridge: b.name.clone(), vlan: v });
            }
            if let Some(o) = by_vlan.insert(v, &b.name) {
                return Err(ConfigError::VlanTaken {
                    bridge: b.name.clone(),
                    vlan: v,
                    other: o.into(),
                });
            }
        }
        if let Some(n) = b.vni {
            if !(1..=0xff_ffff).contains(&n) {
                return Err(ConfigError::BadVni { bridge: b.name.clone(), vni: n });
            }
            if let Some(o) = by_vni.insert(n, &b.name) {
                return Err(ConfigError::VniTaken {
                    bridge: b.name.clone(),
                    vni: n,
                    other: o.into(),
                });
            }
        }
        if !b.flood.is_empty() && (b.vni.is_none() || cfg.vtep.is_none()) {
            return Err(ConfigError::FloodWithoutVxlan { bridge: b.name.clone() });
        }
    }

    Ok(())
}

/// The VTEP's underlay port is an underlay port, and no other port is one.
fn check_vtep(cfg: &SwitchConfig) -> Result<(), ConfigError> {
    if let Some(v) = &cfg.vtep {
        let underlay = cfg.ports.iter().find(|p| p.name == v.underlay_port);
        if !matches!(underlay.map(|p| &p.mode), Some(PortMode::Underlay)) {
            return Err(ConfigError::VtepUnderlay { port: v.underlay_port.clone() });
        }
    }
    // An underlay port may come before its VTEP (it drops what it receives until then,
    // counted as `underlay_not_vxlan`): the node API adds one object at a time.
    for p in &cfg.ports {
        if let Some(v) =
            cfg.vtep.as_ref().filter(|v| p.mode == PortMode::Underlay && v.underlay_port != p.name)
        {
            return Err(ConfigError::StrayUnderlay {
                port: p.name.clone(),
                vtep_port: v.underlay_port.clone(),
            });
        }
    }

    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::port::ring::RingPort;

    /// The members computed in one pass over the ports are those `PortEntry::egress_tag`
    /// names for every (port, domain): access ports, trunks with and without a native VLAN
    /// (one whose native VLAN is also allowed tagged counts once, untagged).
    #[test]
    fn members_are_what_egress_tag_says() {
        let cfg = SwitchConfig {
            bridges: vec![
                BridgeConfig::new("a").vlan(10),
                BridgeConfig::new("b").vlan(20),
                BridgeConfig::new("c"),
            ],
            ports: vec![
                PortConfig::access("p0", "a"),
                PortConfig::trunk("t1", &[10, 20, 30], Some(10)),
                PortConfig::trunk("t2", &[20], None),
                PortConfig::access("p3", "c"),
            ],
            vtep: None,
        };
        let mut ids = Ids::default();
        ids.assign(&cfg).unwrap();
        let ports: FxMap<String, Arc<dyn Port>> = cfg
            .ports
            .iter()
            .map(|p| (p.name.clone(), RingPort::new(&p.name, 1, 64).unwrap().0 as Arc<dyn Port>))
            .collect();
        let s =
            Snapshot::build(cfg, &ids, &|n| ports.get(n).cloned(), 1, &Snapshot::empty()).unwrap();
        for bd in s.bds.iter().flatten() {
            let scan: Vec<(u16, Option<u16>)> = s
                .ports
                .iter()
                .flatten()
                .filter_map(|p| Some((p.id, p.egress_tag(bd.id, bd.vlan)?)))
                .collect();
            assert_eq!(bd.ports, scan, "bridge {}", bd.name);
        }
        let t1 = s.port_id("t1").unwrap();
        assert_eq!(
            s.bd(s.bd_id("a").unwrap()).unwrap().ports.iter().filter(|(p, _)| *p == t1).count(),
            1
        );
    }
}

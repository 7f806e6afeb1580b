//! Node sync, the manager's side: what each node should run, derived from one view of the
//! cluster, and node liveness. A node's sync stream writes a heartbeat every lease/3; a
//! node not heard from for a lease is `down`, and after a further grace `gone`: only then
//! does it leave the other nodes' flood lists and peers (a manager restart or a short
//! network cut must not tear tunnels down). Desired states are whole (not deltas): a
//! stream starts with one and sends another whenever it changes, so a reconnect needs no
//! history and survives etcd compaction or a manager restart as it is. The view is re-read
//! when the store changes (an etcd watch; the embedded store is polled).

use super::objects::{Node, Port, alive_key};
use super::{Manager, Result};
use crate::network::{Kind, NetworkSpec, PlaneMarkings};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// How long a node counts as alive after a heartbeat, and how much longer it stays in
/// flood lists once down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub lease_secs: u64,
    pub grace_secs: u64,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness { lease_secs: 15, grace_secs: 60 }
    }
}

impl Liveness {
    pub fn heartbeat_every(&self) -> std::time::Duration {
        std::time::Duration::from_secs((self.lease_secs / 3).max(1))
    }

    /// `alive`, `down`, `gone` or `unknown` for a node last heard from at `seen`.
    pub fn state(&self, seen: Option<u64>, now: u64) -> &'static str {
        match seen {
            None => "unknown",
            Some(s) if now.saturating_sub(s) <= self.lease_secs => "alive",
            Some(s) if now.saturating_sub(s) <= self.lease_secs + self.grace_secs => "down",
            Some(_) => "gone",
        }
    }

    /// Whether a node heard from at `seen` still belongs in flood lists.
    fn in_flood_lists(&self, seen: Option<u64>, now: u64) -> bool {
        matches!(self.state(seen, now), "alive" | "down")
    }
}

/// A port of a network, as nodes need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub mac: String,
    pub ips: Vec<IpAddr>,
    pub node: String,
    pub vtep: IpAddr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetworkOnNode {
    pub name: String,
    pub kind: Kind,
    pub segment: u32,
    pub mtu: u32,
    pub flood: Vec<IpAddr>,
    pub endpoints: Vec<Endpoint>,
    /// The network's plane's marking on the underlay (none: unmarked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dscp: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcp: Option<u8>,
    /// The plane's frames leave the node's underlay first (control, oam).
    pub priority: bool,
    /// The network's per-pod rate, for every pod port of it on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_policer: Option<crate::network::PodPolicer>,
    /// The network's gateway addresses, which the node answers (node gateway networks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<IpAddr>,
    /// The node's host port on the network, once the manager has made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostPortOnNode>,
}

/// A node's host port on a network (`hostports.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostPortOnNode {
    pub ifname: String,
    /// CIDR: the address and the subnet's prefix.
    pub addresses: Vec<String>,
    pub masquerade: bool,
}

/// What one node should run (the `DesiredState` message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Desired {
    pub revision: u64,
    pub networks: Vec<NetworkOnNode>,
    pub peers: Vec<IpAddr>,
}

/// The records every desired state derives from, read at one revision.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub revision: u64,
    networks: Vec<NetworkSpec>,
    ports: Vec<Port>,
    nodes: Vec<Node>,
    seen: HashMap<String, u64>,
}

impl ClusterView {
    /// What `node` should run at time `now`.
    pub fn desired_for(
        &self,
        node: &str,
        now: u64,
        live: &Liveness,
        marks: &PlaneMarkings,
    ) -> Desired {
        let in_flood =
            |n: &Node| n.name != node && live.in_flood_lists(self.seen.get(&n.name).copied(), now);
        let vtep_of: HashMap<&str, IpAddr> = self
            .nodes
            .iter()
            .filter(|n| n.name == node || in_flood(n))
            .map(|n| (n.name.as_str(), n.vtep))
            .collect();
        let mut networks = Vec::new();
        for net in &self.networks {
            let ports: Vec<&Port> = self
                .ports
                .iter()
                .filter(|p| p.spec.network == net.name && !p.addresses.is_empty())
                .collect();
            if !ports.iter().any(|p| p.spec.node == node) {
                continue;
            }
            let endpoints: Vec<Endpoint> = ports
                .iter()
                .filter_map(|p| {
                    let vtep = *vtep_of.get(p.spec.node.as_str())?;
                    Some(Endpoint {
                        mac: p.mac.clone(),
                        ips: p.addresses.iter().map(|a| a.address).collect(),
                        node: p.spec.node.clone(),
                        vtep,
                    })
                })
                .collect();
            let flood: BTreeSet<IpAddr> =
                endpoints.iter().filter(|e| e.node != node).map(|e| e.vtep).collect();
            let host = ports
                .iter()
                .find(|p| p.spec.node == node && super::host_port_node(p) == Some(node))
                .filter(|_| net.node_gateway)
                .map(|p| HostPortOnNode {
                    ifname: p.spec.interface.clone(),
                    addresses: p
                        .addresses
                        .iter()
                        .map(|a| format!("{}/{}", a.address, a.prefix))
                        .collect(),
                    masquerade: net.masquerade,
                });
            let gateways = if net.node_gateway {
                [&net.ipv4, &net.ipv6].into_iter().flatten().filter_map(|s| s.gateway).collect()
            } else {
                vec![]
            };
            networks.push(NetworkOnNode {
                name: net.name.clone(),
                kind: net.kind,
                segment: net.segment.unwrap_or(0),
                mtu: net.mtu.unwrap_or(0),
                flood: flood.into_iter().collect(),
                endpoints,
                dscp: marks.of(net.plane).map(|m| m.dscp),
                pcp: marks.of(net.plane).map(|m| m.pcp),
                priority: net.plane.has_priority(),
                pod_policer: net.pod_policer,
                gateways,
                host,
            });
        }
        let peers = self.nodes.iter().filter(|n| in_flood(n)).map(|n| n.vtep).collect();
        Desired { revision: self.revision, networks, peers }
    }
}

impl Manager {
    /// Every record node states derive from, read at one revision (re-read if the store
    /// moved while reading).
    pub fn cluster_view(&self) -> Result<ClusterView> {
        loop {
            let revision = self.store.revision()?;
            let view = ClusterView {
                revision,
                networks: self.load_all("networks/")?.into_iter().map(|(n, _)| n).collect(),
                ports: self
                    .load_all::<Port>("ports/")?
                    .into_iter()
                    .map(|(p, _)| p)
                    .filter(Port::is_complete)
                    .collect(),
                nodes: self.load_all("nodes/")?.into_iter().map(|(n, _)| n).collect(),
                seen: self.heartbeats()?,
            };
            if self.store.revision()? == revision {
                return Ok(view);
            }
        }
    }

    pub(super) fn heartbeats(&self) -> Result<HashMap<String, u64>> {
        let rows = self.store.list("alive/")?;
        Ok(rows
            .into_iter()
            .filter_map(|(k, v)| {
                Some((k.strip_prefix("alive/")?.to_string(), v.value.parse().ok()?))
            })
            .collect())
    }

    /// Records that `node` was heard from now. The record expires (an etcd lease) an hour
    /// after the node is `gone`, so nodes that never come back leave no heartbeat behind.
    pub fn heartbeat(&self, node: &str) -> Result<()> {
        let live = self.config.liveness;
        self.store.put_expiring(
            &alive_key(node),
            &super::now().to_string(),
            live.lease_secs + live.grace_secs + 3600,
        )?;
        Ok(())
    }

    /// `n` with its liveness filled in.
    pub(super) fn with_liveness(&self, mut n: Node, seen: &HashMap<String, u64>) -> Node {
        n.last_seen = seen.get(&n.name).copied().unwrap_or(0);
        n.state = self.config.liveness.state(seen.get(&n.name).copied(), super::now()).into();
        n
    }
}

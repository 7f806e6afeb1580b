//! The manager's objects as the APIs and the store see them (JSON), and the store keys they
//! live under. Networks are stored as their [`NetworkSpec`] with the segment and MTU decided.

use crate::network::{Kind, Plane, PodPolicer};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Bumped by every network create and delete: commits that change the set of networks
/// compare its version, so overlap, segment and quota checks see a consistent set.
/// Networks change rarely (not per pod), so this key is not an allocation hot spot.
pub const NETWORKS_GUARD: &str = "meta/networks";

/// A namespace's tenant as its `knitter.io/tenant` label names it (the Kubernetes controller
/// writes these; every replica reads them).
pub fn labelled_namespace_key(name: &str) -> String {
    format!("namespaces/{name}")
}

pub fn tenant_key(name: &str) -> String {
    format!("tenants/{name}")
}

pub fn network_key(name: &str) -> String {
    format!("networks/{name}")
}

pub fn group_key(network: &str, name: &str) -> String {
    format!("ipgroups/{network}/{name}")
}

pub fn port_key(container: &str, interface: &str) -> String {
    format!("ports/{container}/{interface}")
}

/// A requested MAC held by a port of `network` (the value: the port's key).
pub fn mac_key(network: &str, mac: &str) -> String {
    format!("macs/{network}/{mac}")
}

pub fn node_key(name: &str) -> String {
    format!("nodes/{name}")
}

pub fn cluster_key(name: &str) -> String {
    format!("clusters/{name}")
}

/// A node's last heartbeat (Unix seconds), written while its sync stream is open.
pub fn alive_key(name: &str) -> String {
    format!("alive/{name}")
}

/// What a tenant may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Networks the tenant may own (Knitter's `quotas.network`).
    pub networks: u32,
}

impl Default for Quota {
    fn default() -> Self {
        // Knitter's default for a tenant that is not admin.
        Quota { networks: 10 }
    }
}

/// A tenant as asked for: the quota defaults to the manager's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub name: String,
    #[serde(default)]
    pub quota: Option<Quota>,
    /// Namespaces that belong to the tenant without a `knitter.io/tenant` label (see
    /// `tenancy.rs`).
    #[serde(default)]
    pub namespaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub name: String,
    #[serde(default)]
    pub quota: Quota,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Namespaces that belong to the tenant without a label (see `tenancy.rs`).
    #[serde(default)]
    pub namespaces: Vec<String>,
}

/// An IP group as asked for: its members, or how many free addresses to take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpGroupSpec {
    pub name: String,
    pub network: String,
    #[serde(default)]
    pub members: Vec<IpAddr>,
    /// Without members: take this many free addresses of the network.
    #[serde(default)]
    pub size: Option<u32>,
    /// How long a released member stays reserved for its pod (seconds); default 300.
    #[serde(default)]
    pub grace_secs: Option<u64>,
}

impl IpGroupSpec {
    pub fn grace(&self) -> u64 {
        self.grace_secs.unwrap_or(300)
    }
}

/// An IP group as held: its members decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpGroupRecord {
    pub name: String,
    pub network: String,
    pub members: Vec<IpAddr>,
    pub grace_secs: u64,
}

/// A port as asked for (by the CNI, or an operator): a container's interface on a network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    pub network: String,
    pub container: String,
    pub interface: String,
    /// The pod as namespace/name (IP groups give a re-created pod its address back by it).
    #[serde(default)]
    pub pod: String,
    #[serde(default)]
    pub node: String,
    /// Fixed addresses, at most one per family.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    #[serde(default)]
    pub ip_group: Option<String>,
    /// A MAC the pod asks for (a VNF's fixed or licensed MAC) instead of the one derived from
    /// its address: unicast, outside the derived ranges (0a:58, 0a:59), and no other port's
    /// in the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_mac: Option<String>,
    /// The pod's UID, when a Kubernetes pod asked (CNI_ARGS `K8S_POD_UID`): the manager's
    /// Kubernetes controller releases the port once that pod is gone (docs/kubernetes.md).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// The interface's NPWG device-info (a JSON object as text; a vhost-user socket, say),
    /// published in the pod's `network-status` by the Kubernetes controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_info: Option<String>,
}

/// One address of a port, with what the pod needs to configure it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortIp {
    pub address: IpAddr,
    pub prefix: u8,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

/// A port as held: addresses, MAC and the network's segment and MTU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    #[serde(flatten)]
    pub spec: PortSpec,
    pub tenant: String,
    pub kind: Kind,
    pub plane: Plane,
    pub segment: u32,
    pub mtu: u32,
    /// Empty while the port is being created (its record is written before its addresses
    /// are claimed, so a delete always finds what to release).
    pub addresses: Vec<PortIp>,
    pub mac: String,
    pub created: u64,
    /// The network's pod policer when the port was created (the node polices the port so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policer: Option<PodPolicer>,
    /// The network's SR-IOV pool when the port was created (the node picks a VF there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov_pool: Option<String>,
    /// The network's `pod_chooses_vf` when the port was created (the node lets the pod name
    /// its VF).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pod_chooses_vf: bool,
    /// The cluster of the port's node when the port was created (empty: the manager's own):
    /// its pod is (cluster, namespace/name, UID).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
}

impl Port {
    /// The port's pod across clusters: `namespace/name` in the manager's own cluster,
    /// `cluster/namespace/name` in another (what an IP group's member sticks to).
    pub fn pod_identity(&self) -> String {
        if self.cluster.is_empty() {
            self.spec.pod.clone()
        } else {
            format!("{}/{}", self.cluster, self.spec.pod)
        }
    }

    /// Whether the port is cluster `name`'s ([`LOCAL_CLUSTER`]: the manager's own).
    pub fn in_cluster(&self, name: &str) -> bool {
        shown_cluster(&self.cluster) == name
    }

    /// Whether the port was created whole. Every network has a subnet, so a finished port
    /// has an address; one without is a create in progress, or one a crash cut off (it is
    /// never served: not listed, not found, not sent to nodes; `Manager::sweep_placeholders`
    /// removes it).
    pub fn is_complete(&self) -> bool {
        !self.addresses.is_empty()
    }
}

/// A node as it registers: its switch's VTEP and underlay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub vtep: IpAddr,
    #[serde(default = "default_underlay_mtu")]
    pub underlay_mtu: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub registered: u64,
    /// Unix seconds of the last heartbeat (filled in when read; not stored here).
    #[serde(default)]
    pub last_seen: u64,
    /// alive, down, gone or unknown (filled in when read).
    #[serde(default)]
    pub state: String,
    /// The Kubernetes cluster the node is in ([`Cluster`]); empty: the manager's own
    /// ([`LOCAL_CLUSTER`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
}

/// The name the manager's own cluster goes by (its nodes register without one).
pub const LOCAL_CLUSTER: &str = "local";

/// A cluster's name as records keep it: the own cluster's as `""` (what records from
/// before clusters have).
pub fn stored_cluster(name: &str) -> &str {
    if name == LOCAL_CLUSTER { "" } else { name }
}

/// A cluster's name as records keep it, as users name it ([`LOCAL_CLUSTER`] for `""`).
pub fn shown_cluster(stored: &str) -> &str {
    if stored.is_empty() { LOCAL_CLUSTER } else { stored }
}

/// A Kubernetes cluster the manager serves besides its own, as asked for: how the manager
/// reaches its apiserver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    /// A kubeconfig file the manager reads (in Kubernetes: a Secret mounted into its pod),
    /// read again whenever the cluster's controller starts. Empty for the own cluster.
    #[serde(default)]
    pub kubeconfig: String,
}

/// A cluster as the manager keeps it, with what it holds (filled in when read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    #[serde(flatten)]
    pub spec: ClusterSpec,
    /// A random id given at creation (the original Knitter's `cluster_uuid`).
    pub id: String,
    pub created: u64,
    /// The manager's own cluster (`--kubernetes`): not stored, not deletable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own: bool,
    /// Nodes registered in it and their ports (filled in when read).
    #[serde(default)]
    pub nodes: u64,
    #[serde(default)]
    pub ports: u64,
    /// Its controller's state (filled in when read; absent while none runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<super::cluster::StatusReport>,
    /// Why its controller does not run (its credentials could not be read or used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Node {
    /// The cluster the node is in, by name.
    pub fn cluster_name(&self) -> &str {
        shown_cluster(&self.cluster)
    }
}

fn default_underlay_mtu() -> u32 {
    1500
}

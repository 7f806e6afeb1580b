//! What the node keeps about each pod attachment (in its state file, beside the port): the
//! model the attach service (`attach.rs`) writes, and the node and its state persist.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// An attachment's key: the container's interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    pub ip: IpAddr,
    pub prefix: u8,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpAddr,
    pub prefix: u8,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

/// An attachment as the node keeps it (in its state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub network: String,
    pub cni_network: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addresses: Vec<Address>,
    pub routes: Vec<Route>,
    pub host_ifname: String,
    pub network_kind: String,
    pub segment: u32,
    /// A vhost-user interface's hand-off; `None`: a veth (or a VF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<VhostHandoff>,
    /// An SR-IOV VF given to the pod instead of a veth; `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<VfHeld>,
}

/// The SR-IOV VF an attachment holds, and what DEL needs to give it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfHeld {
    /// The VF's PCI address: its identity (a DEL finds it by this, as the device plugin
    /// names it) and what no two attachments may hold.
    pub pci: String,
    pub pf: String,
    pub pf_pci: String,
    pub index: u32,
    /// Its netdev's name and MAC on the node before it went into the pod (restored at DEL);
    /// `None`: bound to vfio-pci (nothing moved).
    pub netdev: Option<String>,
    #[serde(default)]
    pub netdev_mac: Option<[u8; 6]>,
    /// The node set its MAC and VLAN through the PF (reset at DEL).
    pub pf_settings: bool,
}

/// Where a vhost-user interface's socket is and who listens on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostHandoff {
    /// The host directory pods mount (the shared layout).
    pub dir: std::path::PathBuf,
    pub switch_listens: bool,
    /// The pod's own emptyDir volume, where the hand-off is instead of `dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<PodVolume>,
}

/// A pod's emptyDir volume, as the kubelet lays it out on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolume {
    /// The kubelet's pods directory, the pod's UID and the volume's name.
    pub pods: std::path::PathBuf,
    pub uid: String,
    pub name: String,
    /// Where the pod mounts it (what its app is told the socket's path is).
    pub mount_path: String,
}

impl VhostHandoff {
    /// Where its directory is, for container `container_id`.
    pub fn place(&self, container_id: &str) -> crate::handoff::Place {
        match &self.volume {
            Some(v) => crate::handoff::Place::Volume {
                pods: v.pods.clone(),
                uid: v.uid.clone(),
                volume: v.name.clone(),
            },
            None => crate::handoff::Place::Shared {
                base: self.dir.clone(),
                container_id: container_id.to_string(),
            },
        }
    }

    /// The socket's path as the pod's app sees it (for its network-status).
    pub fn path_in_pod(&self, container_id: &str, ifname: &str) -> Option<String> {
        match &self.volume {
            Some(v) => Some(format!("{}/{ifname}.sock", v.mount_path.trim_end_matches('/'))),
            None => crate::handoff::layout(self.place(container_id), ifname)
                .ok()
                .map(|l| l.socket.display().to_string()),
        }
    }
}

impl Record {
    pub fn key(&self) -> Key {
        Key { container_id: self.container_id.clone(), ifname: self.ifname.clone() }
    }
}

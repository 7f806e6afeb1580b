//! Pod attachments (`knitter.node.v1.Attach`, after the KNI proposal): the node's side of
//! knitter-cni. Attaching asks the manager for the port (addresses, MAC, segment, MTU),
//! makes sure the network's bridge domain runs here, plumbs the pod's interface
//! (`plumb.rs`) and attaches its host end to the switch with port security, recording the
//! attachment in the node's persisted state together with the port (owner `attach`).
//! Detaching undoes it without needing the pod's namespace and releases the port on the
//! manager, or queues the release (persisted) and retries it while the manager is away.
//! A DPDK pod's interface is a vhost-user socket instead of a veth (`handoff.rs`): the
//! switch connects to the socket the pod's app makes, or listens on it. An SR-IOV VF
//! (`vf.rs`) goes into the pod, or stays bound to vfio-pci for its DPDK app, and has no
//! switch port.

use crate::from_manager;
use crate::grpc::{blocking, status as node_status};
use crate::handoff::{self, Layout};
use crate::manager::Manager;
use crate::node::Node;
use crate::plumb::{self, Plan};
use crate::records::{Key, PodVolume, Record, Route, VhostHandoff};
use crate::state::{Device, Owner, PortSpec};
use crate::vf::{VfError, Vfs};
use knitter_api::manager as mpb;
use knitter_api::node as pb;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};
use vswitch::config::PortConfig;
use vswitch::wire::MacAddr;

impl Record {
    fn plan(&self) -> Plan {
        Plan {
            host: self.host_ifname.clone(),
            netns: self.netns.clone(),
            ifname: self.ifname.clone(),
            mac: self.mac,
            mtu: self.mtu,
            addresses: self.addresses.iter().map(|a| (a.ip, a.prefix)).collect(),
            routes: self.routes.iter().map(|r| (r.dst, r.prefix, r.gateway)).collect(),
        }
    }

    /// The vhost-user files of this attachment, if it is one.
    fn layout(&self) -> Option<Layout> {
        self.vhost
            .as_ref()
            .and_then(|v| handoff::layout(v.place(&self.container_id), &self.ifname).ok())
    }

    fn to_pb(&self, problems: Vec<String>, connected: bool) -> pb::Attachment {
        pb::Attachment {
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
            netns: self.netns.clone(),
            network: self.network.clone(),
            cni_network: self.cni_network.clone(),
            pod_namespace: self.pod_namespace.clone(),
            pod_name: self.pod_name.clone(),
            mac: plumb::mac_text(self.mac),
            mtu: self.mtu,
            ips: self
                .addresses
                .iter()
                .map(|a| pb::IpConfig {
                    address: format!("{}/{}", a.ip, a.prefix),
                    gateway: a.gateway.map(|g| g.to_string()),
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|r| pb::RouteConfig {
                    dst: format!("{}/{}", r.dst, r.prefix),
                    gateway: r.gateway.map(|g| g.to_string()),
                })
                .collect(),
            host_ifname: self.host_ifname.clone(),
            network_kind: self.network_kind.clone(),
            segment: self.segment,
            problems,
            socket_path: self
                .vhost
                .as_ref()
                .and_then(|v| v.path_in_pod(&self.container_id, &self.ifname))
                .unwrap_or_default(),
            switch_listens: self.vhost.as_ref().is_some_and(|v| v.switch_listens),
            connected,
            pci_id: self.vf.as_ref().map(|v| v.pci.clone()).unwrap_or_default(),
            pf: self.vf.as_ref().map(|v| v.pf.clone()).unwrap_or_default(),
            pf_pci: self.vf.as_ref().map(|v| v.pf_pci.clone()).unwrap_or_default(),
            vf_index: self.vf.as_ref().map_or(0, |v| v.index),
            vfio: self.vf.as_ref().is_some_and(|v| v.netdev.is_none()),
        }
    }
}

/// A key's interface on the node: `kn` and a hash of the key (≤ 15 bytes).
fn host_name(k: &Key) -> String {
    knitter_api::names::short_name("kn", &[&k.container_id, &k.ifname])
}

/// The attach service over a node and, when configured, its manager.
#[derive(Clone)]
pub struct Attacher {
    node: Arc<Node>,
    /// The manager, when the node has one (pods get their addresses from it).
    manager: Option<Manager>,
    vfs: Arc<Vfs>,
    /// Where the kubelet keeps its pods' volumes (a pod's vhost-user volume is found there).
    kubelet_pods: std::path::PathBuf,
}

/// How often queued releases are retried.
const RELEASE_RETRY: Duration = Duration::from_secs(5);
/// How long an attach waits for a node that is joining the manager.
const JOIN_WAIT: Duration = Duration::from_secs(10);

impl Attacher {
    pub fn new(
        node: Arc<Node>,
        manager: Option<Manager>,
        vfs: Arc<Vfs>,
        kubelet_pods: std::path::PathBuf,
    ) -> Attacher {
        Attacher { node, manager, vfs, kubelet_pods }
    }

    /// Where a vhost-user attachment's hand-off goes: the pod's own volume when the request
    /// names one (with the pod's UID), else the shared directory.
    fn vhost_handoff(
        &self,
        r: &pb::AttachRequest,
        v: &pb::VhostUserHandoff,
    ) -> Result<VhostHandoff, Status> {
        let volume = match v.pod_volume.as_str() {
            "" => None,
            name if r.pod_uid.is_empty() => {
                return Err(Status::invalid_argument(format!(
                    "the vhost-user hand-off in volume {name:?} needs the pod's UID (K8S_POD_UID)"
                )));
            }
            name => Some(PodVolume {
                pods: self.kubelet_pods.clone(),
                uid: r.pod_uid.clone(),
                name: name.to_string(),
                mount_path: if v.mount_path.is_empty() {
                    handoff::DEFAULT_MOUNT_PATH.into()
                } else {
                    v.mount_path.clone()
                },
            }),
        };
        let h = VhostHandoff { dir: handoff_dir(v), switch_listens: v.switch_listens, volume };
        handoff::layout(h.place(&r.container_id), &r.ifname)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(h)
    }

    fn manager(&self) -> Result<&Manager, Status> {
        self.manager.as_ref().ok_or_else(|| Status::failed_precondition("knitter-vswitchd has no manager configured (--manager): pods get their addresses from it"))
    }

    pub async fn attach(&self, r: pb::AttachRequest) -> Result<pb::Attachment, Status> {
        if r.container_id.is_empty() || r.network.is_empty() || r.netns.is_empty() {
            return Err(Status::invalid_argument("container_id, network and netns are required"));
        }
        knitter_api::names::interface_name(&r.ifname).map_err(Status::invalid_argument)?;
        let key = Key { container_id: r.container_id.clone(), ifname: r.ifname.clone() };
        if let Some(have) = self.node.state().attachments.iter().find(|a| a.key() == key) {
            if have.network == r.network && have.netns == r.netns {
                return Ok(have.to_pb(
                    Vec::new(),
                    self.node.vhost_connected(&have.host_ifname).unwrap_or(false),
                ));
            }
            return Err(Status::already_exists(format!(
                "{}/{} is attached to network {} in {}",
                key.container_id, key.ifname, have.network, have.netns
            )));
        }
        let mac_override = r
            .mac
            .as_deref()
            .map(|m| {
                m.parse::<MacAddr>()
                    .map_err(|_| Status::invalid_argument(format!("MAC {m:?} is malformed")))
            })
            .transpose()?;
        let manager = self.manager()?;
        let link = manager.link();
        if link.join.is_some() {
            // A pod scheduled as the node starts: its ADD waits for the node to join.
            link.token.ready(JOIN_WAIT).await;
        }
        let spec = mpb::PortSpec {
            network: r.network.clone(),
            container: r.container_id.clone(),
            interface: r.ifname.clone(),
            pod: if r.pod_namespace.is_empty() && r.pod_name.is_empty() {
                String::new()
            } else {
                format!("{}/{}", r.pod_namespace, r.pod_name)
            },
            node: link.node_name.clone(),
            ips: r.ips.clone(),
            ip_group: r.ip_group.clone(),
            requested_mac: r.mac.clone(),
            pod_uid: r.pod_uid.clone(),
            device_info: match (&r.vhost_user, &r.sriov) {
                (Some(v), _) => self
                    .vhost_handoff(&r, v)
                    .ok()
                    .and_then(|h| h.path_in_pod(&r.container_id, &r.ifname))
                    .map(|path| {
                        knitter_api::device_info::vhost_user(&path, v.switch_listens).to_string()
                    }),
                (None, Some(sriov)) => self.vfs.device_info(&sriov.device_id),
                (None, None) => None,
            },
        };
        let port = manager.create_port(spec).await?;
        let made = self.plumb_and_attach(&r, &key, &port, mac_override).await;
        if made.is_err() {
            self.release(&key).await;
        }
        made
    }

    /// Everything after the manager's port: the bridge, the interface, the switch port.
    async fn plumb_and_attach(
        &self,
        r: &pb::AttachRequest,
        key: &Key,
        port: &mpb::Port,
        mac: Option<MacAddr>,
    ) -> Result<pb::Attachment, Status> {
        let (mac, addresses) = from_manager::port_addressing(port, mac)
            .map_err(|e| Status::internal(format!("the manager sent a malformed port: {e}")))?;
        let routes = if r.default_route {
            addresses
                .iter()
                .filter_map(|a| {
                    let any = if a.ip.is_ipv4() {
                        IpAddr::from([0u8; 4])
                    } else {
                        IpAddr::from([0u16; 8])
                    };
                    a.gateway.map(|g| Route { dst: any, prefix: 0, gateway: Some(g) })
                })
                .collect()
        } else {
            Vec::new()
        };
        let record = Record {
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            netns: r.netns.clone(),
            network: r.network.clone(),
            cni_network: r.cni_network.clone(),
            pod_namespace: r.pod_namespace.clone(),
            pod_name: r.pod_name.clone(),
            mac: mac.0,
            mtu: port.mtu,
            addresses,
            routes,
            host_ifname: host_name(key),
            network_kind: port.kind.clone(),
            segment: port.segment,
            vhost: r.vhost_user.as_ref().map(|v| self.vhost_handoff(r, v)).transpose()?,
            vf: None,
        };
        if let Some(sriov) = &r.sriov {
            return self.attach_vf(record, sriov, port).await;
        }
        let bridge = from_manager::bridge(&r.network, &port.kind, port.segment)
            .map_err(|why| Status::internal(format!("the manager sent {why}")))?;
        let node = self.node.clone();
        blocking(move || node.ensure_manager_bridge(bridge)).await?.map_err(node_status)?;
        let device = self.make_interface(&record, r.vhost_user.as_ref()).await?;
        let ips: Vec<IpAddr> = record.addresses.iter().map(|a| a.ip).collect();
        let mut config = PortConfig::pod(&record.host_ifname, &record.network, mac, &ips);
        config.mtu = u16::try_from(record.mtu).unwrap_or(u16::MAX);
        // The network's pod policer, as the manager recorded it on the port.
        config.policer = port.policer.as_ref().map(from_manager::policer);
        let spec = PortSpec { device, config };
        let (node, rec) = (self.node.clone(), record.clone());
        let attached = blocking(move || node.attach_port(spec, rec)).await?;
        if let Err(e) = attached {
            let _ = self.remove_interface(&record).await;
            return Err(node_status(e));
        }
        if record.vhost.is_none() {
            self.wait_for_carrier(&record.host_ifname).await;
        }
        tracing::info!(container = %key.container_id, ifname = %key.ifname, network = %record.network, port = %record.host_ifname, "pod attached");
        Ok(record.to_pb(Vec::new(), false))
    }

    /// An SR-IOV VF for the pod: chosen and recorded as held, then given to the pod (or, bound
    /// to vfio-pci, left for its DPDK app); the record forgotten again when that fails.
    /// A VF the pod named itself is refused unless the network lets pods choose
    /// (`pod_chooses_vf`), and then it must be a free one of the network's pool.
    async fn attach_vf(
        &self,
        mut record: Record,
        sriov: &pb::SriovRequest,
        port: &mpb::Port,
    ) -> Result<pb::Attachment, Status> {
        if record.network_kind != "vlan" {
            return Err(Status::failed_precondition(format!(
                "network {} is a {} network: an SR-IOV VF reaches only VLAN networks (its PF tags the VF's frames on the wire); attach it as a veth or vhost-user interface",
                record.network, record.network_kind
            )));
        }
        let pods_choice = sriov.chosen_by_pod && !sriov.device_id.is_empty();
        if pods_choice && !port.pod_chooses_vf {
            return Err(Status::permission_denied(format!(
                "the pod names VF {} itself (deviceID in its cni-args or annotation) and network {} does not let pods choose their VF (pod_chooses_vf): the SR-IOV device plugin allocates it (the NAD's resourceName), or the node picks one",
                sriov.device_id, record.network
            )));
        }
        let (device_id, pool) = (sriov.device_id.as_str(), port.sriov_pool.clone());
        let vlan = u16::try_from(record.segment)
            .map_err(|_| Status::internal(format!("the manager sent VLAN {}", record.segment)))?;
        record.host_ifname = String::new();
        let (node, vfs, dev, rec) =
            (self.node.clone(), self.vfs.clone(), device_id.to_string(), record.clone());
        let vf = blocking(move || {
            vfs.choose_and_claim(
                &dev,
                pods_choice,
                pool.as_deref(),
                || node.held_vfs(),
                |vf| {
                    let mut r = rec;
                    r.vf = Some(vf.clone());
                    node.add_vf_attachment(r).map(|()| vf).map_err(|e| match e {
                        crate::node::NodeError::VfHeld { pci, by } => VfError::Held { pci, by },
                        other => VfError::Io(std::io::Error::other(other.to_string())),
                    })
                },
            )
        })
        .await?
        .map_err(vf_status)?;
        record.vf = Some(vf.clone());
        let (vfs, plan) = (self.vfs.clone(), record.plan());
        let given = blocking(move || vfs.give(&vf, &plan, vlan)).await?;
        if let Err(e) = given {
            let (node, key) = (self.node.clone(), record.key());
            let _ = blocking(move || node.detach_port(&key)).await;
            return Err(match e.kind() {
                std::io::ErrorKind::AlreadyExists => Status::already_exists(e.to_string()),
                _ => Status::internal(format!("giving the pod its VF: {e}")),
            });
        }
        let held = record.vf.as_ref().map(|v| (v.pci.as_str(), v.netdev.is_none()));
        tracing::info!(container = %record.container_id, ifname = %record.ifname, network = %record.network, vf = ?held, "pod attached (SR-IOV VF)");
        Ok(record.to_pb(Vec::new(), false))
    }

    /// Waits (at most [`CARRIER_WAIT`]) until the switch sees a freshly plumbed veth's link
    /// up: the kernel turns the carrier on a moment after both ends are up (its link watch
    /// runs apart), and until the link watcher's next poll the switch dropped the pod's
    /// first frames as `port_down`. ADD returns once the pod's frames are forwarded.
    async fn wait_for_carrier(&self, port: &str) {
        let deadline = tokio::time::Instant::now() + CARRIER_WAIT;
        while !self.node.link_up_now(port) {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(port, waited = ?CARRIER_WAIT, "the pod's interface has no carrier yet; attached anyway");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// The pod's side of an attachment: a veth plumbed into its namespace, or the vhost-user
    /// hand-off files; the switch's device for it.
    async fn make_interface(
        &self,
        record: &Record,
        vhost: Option<&pb::VhostUserHandoff>,
    ) -> Result<Device, Status> {
        let Some(v) = vhost else {
            let plan = record.plan();
            blocking(move || plumb::plumb(&plan)).await?.map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Status::already_exists(e.to_string())
                } else {
                    Status::internal(format!("plumbing the pod's interface: {e}"))
                }
            })?;
            return Ok(Device::AfXdp { ifname: record.host_ifname.clone(), netns: None });
        };
        let place = record
            .vhost
            .as_ref()
            .map(|h| h.place(&record.container_id))
            .ok_or_else(|| Status::internal("a vhost-user attachment without its hand-off"))?;
        let layout = handoff::layout(place, &record.ifname)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let access = handoff::Access { mode: v.mode, owner: v.owner, group: v.group };
        let info = handoff::Info {
            interface: record.ifname.clone(),
            socket: format!("{}.sock", record.ifname),
            mode: if v.switch_listens { "client" } else { "server" },
            mac: plumb::mac_text(record.mac),
            mtu: record.mtu,
            ips: record.addresses.iter().map(|a| format!("{}/{}", a.ip, a.prefix)).collect(),
            gateways: record
                .addresses
                .iter()
                .filter_map(|a| a.gateway.map(|g| g.to_string()))
                .collect(),
            routes: record
                .routes
                .iter()
                .map(|r| handoff::InfoRoute {
                    dst: format!("{}/{}", r.dst, r.prefix),
                    gw: r.gateway.map(|g| g.to_string()),
                })
                .collect(),
        };
        let l = layout.clone();
        blocking(move || handoff::prepare(&l, access, &info)).await?.map_err(|e| {
            match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput => {
                    Status::failed_precondition(format!("preparing the vhost-user hand-off: {e}"))
                }
                _ => Status::internal(format!("preparing the vhost-user hand-off: {e}")),
            }
        })?;
        // A socket the switch listens on gets the same mode and owner as the directory.
        let socket_mode = v.mode.map(|m| m & 0o666);
        Ok(Device::VhostUser {
            socket: layout.socket,
            client: !v.switch_listens,
            mode: socket_mode,
            owner: v.owner,
            group: v.group,
        })
    }

    /// Undoes [`Attacher::make_interface`] or [`Attacher::attach_vf`] (nothing there: nothing
    /// done).
    async fn remove_interface(&self, record: &Record) -> Result<(), Status> {
        if let Some(vf) = record.vf.clone() {
            let (vfs, netns, ifname) =
                (self.vfs.clone(), record.netns.clone(), record.ifname.clone());
            let problems = blocking(move || vfs.take_back(&vf, &netns, &ifname)).await?;
            if !problems.is_empty() {
                tracing::warn!(container = %record.container_id, ifname = %record.ifname, ?problems, "the VF was not all given back");
            }
            return Ok(());
        }
        if let Some(l) = record.layout() {
            return blocking(move || handoff::remove(&l)).await;
        }
        let host = record.host_ifname.clone();
        blocking(move || plumb::unplumb(&host))
            .await?
            .map(drop)
            .map_err(|e| Status::internal(format!("removing the pod's interface: {e}")))
    }

    /// Releases the key's port on the manager, or queues the release when it cannot be
    /// reached; says whether it was queued.
    async fn release(&self, key: &Key) -> bool {
        let Ok(manager) = self.manager() else { return false };
        let msg =
            mpb::PortName { container: key.container_id.clone(), interface: key.ifname.clone() };
        let done = match manager.delete_port(msg).await {
            Ok(()) => true,
            Err(s) => {
                tracing::warn!(container = %key.container_id, ifname = %key.ifname, error = %s.message(), "port release queued");
                false
            }
        };
        if !done {
            let (node, k) = (self.node.clone(), key.clone());
            let _ = blocking(move || {
                node.edit_state(|s| {
                    if !s.pending_releases.contains(&k) {
                        s.pending_releases.push(k);
                    }
                })
            })
            .await;
        }
        !done
    }

    pub async fn detach(&self, r: pb::DetachRequest) -> Result<pb::DetachReply, Status> {
        if r.container_id.is_empty() {
            return Err(Status::invalid_argument("container_id is required"));
        }
        let keys: Vec<Key> = match r.ifname.as_str() {
            "" => self
                .node
                .state()
                .attachments
                .iter()
                .filter(|a| a.container_id == r.container_id)
                .map(Record::key)
                .collect(),
            i => vec![Key { container_id: r.container_id.clone(), ifname: i.into() }],
        };
        let mut reply = pb::DetachReply::default();
        for key in keys {
            let (node, k) = (self.node.clone(), key.clone());
            let record = blocking(move || node.detach_port(&k)).await?.map_err(node_status)?;
            if let Some(rec) = &record {
                self.remove_interface(rec).await?;
                reply.detached.push(key.ifname.clone());
                tracing::info!(container = %key.container_id, ifname = %key.ifname, "pod detached");
            }
            reply.release_queued |= self.release(&key).await;
        }
        Ok(reply)
    }

    pub async fn query(&self, r: pb::QueryPodRequest) -> Result<pb::PodNetwork, Status> {
        let records: Vec<Record> = self
            .node
            .state()
            .attachments
            .into_iter()
            .filter(|a| {
                a.container_id == r.container_id && (r.ifname.is_empty() || a.ifname == r.ifname)
            })
            .collect();
        let mut out = pb::PodNetwork::default();
        for rec in records {
            let problems = if r.verify {
                let (node, rec2) = (self.node.clone(), rec.clone());
                blocking(move || {
                    let mut p = match (rec2.layout(), &rec2.vf) {
                        (Some(l), _) => handoff::verify(&l),
                        (None, Some(vf)) if vf.netdev.is_some() => {
                            plumb::verify_in_pod(&rec2.plan())
                        }
                        (None, Some(_)) => Vec::new(),
                        (None, None) => plumb::verify(&rec2.plan()),
                    };
                    if rec2.vf.is_some() {
                        // No switch port: the VF's frames go through the NIC.
                    } else if node.state().port(&rec2.host_ifname).is_none() {
                        p.push(format!("switch port {} is gone", rec2.host_ifname));
                    } else if let Some(why) = node.failed_ports().get(&rec2.host_ifname) {
                        p.push(format!("switch port {} is not running: {why}", rec2.host_ifname));
                    }
                    p
                })
                .await?
            } else {
                Vec::new()
            };
            let connected = self.node.vhost_connected(&rec.host_ifname).unwrap_or(false);
            out.attachments.push(rec.to_pb(problems, connected));
        }
        Ok(out)
    }

    pub fn node_networks(&self) -> pb::NodeNetworks {
        let state = self.node.state();
        let mut names: Vec<String> = state
            .bridges
            .iter()
            .filter(|b| b.owner == Owner::Manager)
            .map(|b| b.item.name.clone())
            .collect();
        names.extend(state.attachments.iter().map(|a| a.network.clone()));
        names.sort();
        names.dedup();
        let networks = names
            .into_iter()
            .map(|n| pb::NodeNetwork {
                ready: state.bridge(&n).is_some(),
                attachments: state.attachments.iter().filter(|a| a.network == n).count() as u32,
                name: n,
            })
            .collect();
        pb::NodeNetworks { networks, pfs: self.vfs.report(&self.node.held_vfs()) }
    }

    pub async fn gc(&self, r: pb::GcRequest) -> Result<pb::GcReply, Status> {
        let valid: Vec<Key> = r
            .valid
            .iter()
            .map(|k| Key { container_id: k.container_id.clone(), ifname: k.ifname.clone() })
            .collect();
        let stale: Vec<Key> = self
            .node
            .state()
            .attachments
            .iter()
            .filter(|a| a.cni_network == r.cni_network)
            .map(Record::key)
            .filter(|k| !valid.contains(k))
            .collect();
        let mut reply = pb::GcReply::default();
        for k in stale {
            self.detach(pb::DetachRequest {
                container_id: k.container_id.clone(),
                ifname: k.ifname.clone(),
            })
            .await?;
            reply
                .removed
                .push(pb::AttachmentKey { container_id: k.container_id, ifname: k.ifname });
        }
        Ok(reply)
    }

    pub async fn status(&self) -> pb::AttachStatus {
        let mut s = pb::AttachStatus {
            switch_running: self.node.running(),
            manager_reachable: false,
            reason: String::new(),
        };
        match self.manager() {
            Err(e) => s.reason = e.message().to_string(),
            Ok(m) => match m.reachable().await {
                Ok(()) => s.manager_reachable = true,
                Err(why) => {
                    s.reason = format!("the manager at {} is unreachable: {why}", m.link().address)
                }
            },
        }
        if !s.switch_running {
            s.reason = "the switch's PMD threads are not running".into();
        }
        s
    }

    /// Retries queued releases until the daemon stops.
    pub async fn retry_releases(self) {
        loop {
            tokio::time::sleep(RELEASE_RETRY).await;
            for key in self.node.state().pending_releases {
                let (node, k) = (self.node.clone(), key.clone());
                let _ =
                    blocking(move || node.edit_state(|s| s.pending_releases.retain(|p| *p != k)))
                        .await;
                if !self.release(&key).await {
                    tracing::info!(container = %key.container_id, ifname = %key.ifname, "queued port release done");
                }
            }
        }
    }
}

#[tonic::async_trait]
impl pb::attach_server::Attach for Attacher {
    async fn attach_interface(
        &self,
        r: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::Attachment>, Status> {
        self.attach(r.into_inner()).await.map(Response::new)
    }

    async fn detach_interface(
        &self,
        r: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachReply>, Status> {
        self.detach(r.into_inner()).await.map(Response::new)
    }

    async fn query_pod_network(
        &self,
        r: Request<pb::QueryPodRequest>,
    ) -> Result<Response<pb::PodNetwork>, Status> {
        self.query(r.into_inner()).await.map(Response::new)
    }

    async fn query_node_networks(
        &self,
        _: Request<pb::QueryNodeNetworksRequest>,
    ) -> Result<Response<pb::NodeNetworks>, Status> {
        Ok(Response::new(self.node_networks()))
    }

    async fn garbage_collect(
        &self,
        r: Request<pb::GcRequest>,
    ) -> Result<Response<pb::GcReply>, Status> {
        self.gc(r.into_inner()).await.map(Response::new)
    }

    async fn status(
        &self,
        _: Request<pb::AttachStatusRequest>,
    ) -> Result<Response<pb::AttachStatus>, Status> {
        Ok(Response::new(self.status().await))
    }
}

/// The longest ADD waits for a pod's new interface to carry frames.
const CARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The host directory of a vhost-user hand-off (the default when the request names none).
/// How a VF refusal reaches the CNI.
fn vf_status(e: VfError) -> Status {
    let msg = e.to_string();
    match e {
        VfError::NoPool | VfError::UnknownPool(..) | VfError::Unusable { .. } => {
            Status::failed_precondition(msg)
        }
        VfError::NotInPool { .. } => Status::permission_denied(msg),
        VfError::Exhausted { .. } => Status::resource_exhausted(msg),
        VfError::Held { .. } => Status::already_exists(msg),
        VfError::Io(_) => Status::internal(msg),
    }
}

fn handoff_dir(v: &pb::VhostUserHandoff) -> std::path::PathBuf {
    if v.dir.is_empty() { handoff::DEFAULT_DIR.into() } else { v.dir.clone().into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_on_the_node_are_short_stable_and_distinct() {
        let k = |c: &str, i: &str| Key { container_id: c.into(), ifname: i.into() };
        let a = host_name(&k("3f2a9c", "eth0"));
        assert_eq!(a.len(), 12);
        assert_eq!(a, host_name(&k("3f2a9c", "eth0")));
        assert_ne!(a, host_name(&k("3f2a9c", "net1")));
        assert_ne!(host_name(&k("ab", "c")), host_name(&k("a", "bc")), "the separator counts");
    }
}

//! What the cluster's pods and nodes say about the manager's ports: which ports no pod holds
//! any more. Pure decisions over a view of the cluster, so the rules are tested without one.
//!
//! The rules (docs/kubernetes.md):
//! - Only ports that name a pod (`namespace/name`, as the CNI creates them) are the
//!   cluster's; a port an operator made without a pod is never touched.
//! - A port that recorded its pod's UID is released when no pod has that UID: a pod
//!   re-created under the same name (a StatefulSet's) is another pod, with another port.
//! - A port without a UID (made before the CNI passed one) is released only when no pod
//!   has its name: while one does, it may be the holder.
//! - Nothing created at or after the cut-off (the start of the relist the view came from)
//!   is collected: a port made while the list was read may belong to a pod the list missed.
//! - A port on a node the cluster no longer has is released with the node.
//! - A complete list releases a port only if it shows at least one pod on the port's node
//!   (every node runs DaemonSet pods: Knitter's own, kube-proxy's). A list with none there
//!   — an empty list, another cluster's (a wrong kubeconfig), a listing the RBAC filtered —
//!   is no evidence that the port's pod went: its ports are held, and said so, until a list
//!   shows the node's pods again or the node is deleted.

use crate::manager::objects::Port;
use std::collections::{HashMap, HashSet};

/// A pod as the controller keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// `namespace/name`.
    pub name: String,
    pub node: String,
    /// Its `k8s.v1.cni.cncf.io/network-status` annotation.
    pub network_status: Option<String>,
}

/// The cluster's pods (by UID) and nodes, as the last complete list and the events since
/// made them.
#[derive(Debug, Default, Clone)]
pub struct Cluster {
    pods: HashMap<String, PodRef>,
    /// `namespace/name` → how many pods have it (two, briefly, while a StatefulSet's pod
    /// is replaced).
    names: HashMap<String, usize>,
    nodes: HashSet<String>,
    /// Pods by the node they run on (scheduled ones).
    on_node: HashMap<String, usize>,
    /// Moves on every change to the pods.
    generation: u64,
    /// When the complete list the pods came from started (Unix seconds): ports made before
    /// it are the ones this view may judge.
    pub listed_at: u64,
}

impl Cluster {
    pub fn pod_applied(&mut self, uid: &str, pod: PodRef) {
        self.generation += 1;
        if let Some(old) = self.pods.insert(uid.to_string(), pod.clone()) {
            self.forget_name(&old.name);
            self.leave_node(&old.node);
        }
        if !pod.node.is_empty() {
            *self.on_node.entry(pod.node).or_default() += 1;
        }
        *self.names.entry(pod.name).or_default() += 1;
    }

    /// Forgets a pod; returns it if it was known.
    pub fn pod_deleted(&mut self, uid: &str) -> Option<PodRef> {
        self.generation += 1;
        let old = self.pods.remove(uid)?;
        self.forget_name(&old.name);
        self.leave_node(&old.node);
        Some(old)
    }

    fn leave_node(&mut self, node: &str) {
        if let Some(n) = self.on_node.get_mut(node) {
            *n -= 1;
            if *n == 0 {
                self.on_node.remove(node);
            }
        }
    }

    /// Whether this view is evidence about the pods of `node`: it shows at least one pod
    /// there (for a port that names no node, any pod at all).
    pub fn vouches_for(&self, node: &str) -> bool {
        if node.is_empty() { !self.pods.is_empty() } else { self.on_node.contains_key(node) }
    }
    fn forget_name(&mut self, name: &str) {
        if let Some(n) = self.names.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                self.names.remove(name);
            }
        }
    }

    pub fn node_applied(&mut self, name: &str) {
        self.nodes.insert(name.to_string());
    }

    pub fn node_deleted(&mut self, name: &str) -> bool {
        self.nodes.remove(name)
    }

    /// Whether a pod has `name` (`namespace/name`).
    pub fn has_pod_named(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    pub fn has_node(&self, name: &str) -> bool {
        self.nodes.contains(name)
    }

    /// Moves on every change to the pods (what [`network_status`] depends on besides ports).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn pods(&self) -> impl Iterator<Item = (&String, &PodRef)> {
        self.pods.iter()
    }

    /// Records the network-status a pod was just given (before its watch event says so).
    pub fn set_network_status(&mut self, uid: &str, value: String) {
        if let Some(p) = self.pods.get_mut(uid) {
            p.network_status = Some(value);
        }
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Replaces the pods with a complete list's.
    pub fn set_pods(&mut self, pods: impl IntoIterator<Item = (String, PodRef)>) {
        (self.pods, self.names, self.on_node) = Default::default();
        for (uid, p) in pods {
            self.pod_applied(&uid, p);
        }
    }

    /// Replaces the nodes with a complete list's.
    pub fn set_nodes(&mut self, nodes: impl IntoIterator<Item = String>) {
        self.nodes = nodes.into_iter().collect();
    }

    /// Whether a pod may still hold `port`.
    pub fn holds(&self, port: &Port) -> bool {
        if port.spec.pod.is_empty() {
            return true;
        }
        if port.spec.pod_uid.is_empty() {
            self.has_pod_named(&port.spec.pod)
        } else {
            self.pods.contains_key(&port.spec.pod_uid)
        }
    }
}

/// The annotation Multus and NPWG define for a pod's interfaces.
pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// `ports` by the pod they name (`namespace/name`), each pod's by interface.
pub fn ports_by_pod(ports: &[Port]) -> HashMap<&str, Vec<&Port>> {
    let mut by: HashMap<&str, Vec<&Port>> = HashMap::new();
    for p in ports.iter().filter(|p| !p.spec.pod.is_empty()) {
        by.entry(p.spec.pod.as_str()).or_default().push(p);
    }
    for v in by.values_mut() {
        v.sort_by(|a, b| a.spec.interface.cmp(&b.spec.interface));
    }
    by
}

/// The ports of [`ports_by_pod`] that are pod `uid`'s (`name`: namespace/name), by interface.
pub fn ports_of<'a>(by_pod: &HashMap<&str, Vec<&'a Port>>, uid: &str, name: &str) -> Vec<&'a Port> {
    let Some(named) = by_pod.get(name) else { return Vec::new() };
    named.iter().copied().filter(|p| p.spec.pod_uid == uid || p.spec.pod_uid.is_empty()).collect()
}

/// The `network-status` value (NPWG `NetworkStatus` list, JSON) of a pod's ports: network,
/// interface, addresses, MAC, MTU and, where the node recorded one, the device-info (a
/// vhost-user socket).
pub fn network_status(ports: &[&Port]) -> String {
    let entries: Vec<serde_json::Value> = ports
        .iter()
        .map(|p| {
            let mut e = serde_json::json!({
                "name": p.spec.network,
                "interface": p.spec.interface,
                "ips": p.addresses.iter().map(|a| a.address.to_string()).collect::<Vec<_>>(),
                "mac": p.mac,
                "mtu": p.mtu,
            });
            if let Some(info) = p
                .spec
                .device_info
                .as_deref()
                .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            {
                e["device-info"] = info;
            }
            e
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

/// The ports of `ports` no pod of `cluster` holds, made before `cutoff` (Unix seconds):
/// those to release (their node vouched for), and those held (no pod listed on their node).
pub fn orphans<'a>(
    ports: &'a [Port],
    cluster: &Cluster,
    cutoff: u64,
) -> (Vec<&'a Port>, Vec<&'a Port>) {
    ports
        .iter()
        .filter(|p| p.created < cutoff && !cluster.holds(p))
        .partition(|p| cluster.vouches_for(&p.spec.node))
}

/// The ports of a pod just deleted (UID `uid`, `name`): those that recorded its UID, and
/// those without a UID that name it unless another pod has the name now (`name_held`).
pub fn of_deleted_pod<'a>(
    ports: &'a [Port],
    uid: &str,
    name: &str,
    name_held: bool,
) -> Vec<&'a Port> {
    ports
        .iter()
        .filter(|p| {
            p.spec.pod == name
                && (p.spec.pod_uid == uid || (p.spec.pod_uid.is_empty() && !name_held))
        })
        .collect()
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::manager::objects::PortSpec;
    use crate::network::{Kind, Plane};

    fn port(container: &str, pod: &str, uid: &str, created: u64) -> Port {
        Port {
            spec: PortSpec {
                network: "red".into(),
                container: container.into(),
                interface: "eth0".into(),
                pod: pod.into(),
                node: "n1".into(),
                ips: vec![],
                ip_group: None,
                requested_mac: None,
                pod_uid: uid.into(),
                device_info: None,
            },
            tenant: "admin".into(),
            kind: Kind::Vxlan,
            plane: Plane::default(),
            segment: 5000,
            mtu: 1450,
            addresses: vec![],
            mac: String::new(),
            created,
            policer: None,
            sriov_pool: None,
            pod_chooses_vf: false,
            cluster: String::new(),
        }
    }

    fn pod(name: &str) -> PodRef {
        PodRef { name: name.into(), node: "n1".into(), network_status: None }
    }

    #[test]
    fn a_port_is_released_only_when_no_pod_can_hold_it() {
        let mut c = Cluster::default();
        c.set_pods([("u1".to_string(), pod("ns/web-0")), ("u3".to_string(), pod("ns/old"))]);
        let ports = [
            port("a", "ns/web-0", "u1", 10), // its pod lives
            port("b", "ns/web-0", "u0", 10), // the same name, an earlier pod: gone
            port("c", "ns/old", "", 10),     // no UID, a pod has the name
            port("d", "ns/gone", "", 10),    // no UID, no pod has the name
            port("e", "", "", 10),           // an operator's port
            port("f", "ns/gone", "u9", 100), // made after the list started
        ];
        let out: Vec<&str> =
            orphans(&ports, &c, 50).0.iter().map(|p| p.spec.container.as_str()).collect();
        assert_eq!(out, ["b", "d"]);
    }

    #[test]
    fn a_list_that_shows_no_pod_on_a_node_releases_nothing_there() {
        let on = |node: &str, mut p: Port| {
            p.spec.node = node.into();
            p
        };
        let ports = [
            on("n1", port("a", "ns/gone-1", "u1", 1)),
            on("n2", port("b", "ns/gone-2", "u2", 1)),
            on("", port("c", "ns/gone-3", "u3", 1)),
        ];
        let names = |ps: &[&Port]| ps.iter().map(|p| p.spec.container.clone()).collect::<Vec<_>>();
        // An empty list (another cluster, a broken apiserver): nothing is evidence.
        let (gone, held) = orphans(&ports, &Cluster::default(), 50);
        assert_eq!(
            (names(&gone), names(&held)),
            (vec![], vec!["a".to_string(), "b".into(), "c".into()])
        );
        // Pods on n1 only: n1's orphan goes, n2's is held; a port naming no node goes with
        // any pod listed.
        let mut c = Cluster::default();
        c.set_pods([("u7".to_string(), pod("kube-system/kube-proxy-x"))]);
        let (gone, held) = orphans(&ports, &c, 50);
        assert_eq!(
            (names(&gone), names(&held)),
            (vec!["a".to_string(), "c".into()], vec!["b".to_string()])
        );
        // The node's last pod deleted: no longer vouched for.
        c.pod_deleted("u7");
        assert!(!c.vouches_for("n1") && !c.vouches_for(""));
    }

    #[test]
    fn a_deleted_pod_takes_its_ports_and_no_namesakes() {
        let mut c = Cluster::default();
        c.pod_applied("u1", pod("ns/web-0"));
        c.pod_applied("u2", pod("ns/web-0")); // its replacement, briefly beside it
        let ports = [
            port("a", "ns/web-0", "u1", 1),
            port("b", "ns/web-0", "u2", 1),
            port("c", "ns/web-0", "", 1),
        ];
        assert_eq!(c.pod_deleted("u1"), Some(pod("ns/web-0")));
        let out: Vec<&str> = of_deleted_pod(&ports, "u1", "ns/web-0", c.has_pod_named("ns/web-0"))
            .iter()
            .map(|p| p.spec.container.as_str())
            .collect();
        assert_eq!(out, ["a"], "the name is still held: the port without a UID stays");
        c.pod_deleted("u2");
        let out: Vec<&str> = of_deleted_pod(&ports, "u2", "ns/web-0", c.has_pod_named("ns/web-0"))
            .iter()
            .map(|p| p.spec.container.as_str())
            .collect();
        assert_eq!(out, ["b", "c"]);
    }
}

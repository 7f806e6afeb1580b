//! The manager's nodes: registered (their VTEPs unique), listed with their liveness,
//! forgotten.

use super::objects::{Node, alive_key, node_key};
use super::{Manager, ManagerError, ROUNDS, Result, auth, check_name, json, now};
use crate::network::Kind;
use crate::store::Op;

impl Manager {
    /// Registers (or updates) a node. Refused when its underlay could not carry a network
    /// that exists, or its VTEP address is another node's.
    pub fn register_node(&self, mut node: Node) -> Result<Node> {
        check_name("node", &node.name)?;
        if node.vtep.is_unspecified() || node.vtep.is_multicast() {
            return Err(ManagerError::Invalid(format!(
                "node {:?}: VTEP address {} is not a unicast address",
                node.name, node.vtep
            )));
        }
        if !(576..=65535).contains(&node.underlay_mtu) {
            return Err(ManagerError::Invalid(format!(
                "node {:?}: underlay MTU {} is outside 576..=65535",
                node.name, node.underlay_mtu
            )));
        }
        let key = node_key(&node.name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let nodes: Vec<(Node, u64)> = self.load_all("nodes/")?;
            if let Some((other, _)) =
                nodes.iter().find(|(n, _)| n.vtep == node.vtep && n.name != node.name)
            {
                return Err(ManagerError::Conflict(format!(
                    "VTEP address {} is node {:?}'s",
                    node.vtep, other.name
                )));
            }
            for net in self.networks()? {
                let overhead = if net.spec.kind == Kind::Vxlan {
                    self.config.limits.vxlan_overhead
                } else {
                    0
                };
                if net.mtu + overhead > node.underlay_mtu {
                    return Err(ManagerError::Conflict(format!(
                        "node {:?}: underlay MTU {} cannot carry network {:?} (MTU {} + {overhead} bytes of encapsulation); raise the underlay MTU or recreate the network smaller",
                        node.name, node.underlay_mtu, net.spec.name, net.mtu
                    )));
                }
            }
            let have = nodes.iter().find(|(n, _)| n.name == node.name);
            let (cluster, still) = self.check_node_cluster(&node, have.map(|(n, _)| n))?;
            node.cluster = cluster;
            node.registered = have.map_or_else(now, |(n, _)| n.registered);
            (node.last_seen, node.state) = (0, String::new());
            let mut ops = vec![
                self.bump_guard(guard),
                Op::replace(&key, have.map(|(_, v)| *v), json(&node)?),
            ];
            ops.extend(still);
            if self.store.commit(&ops)? {
                return Ok(self.with_liveness(node, &self.heartbeats()?));
            }
        }
        Err(ManagerError::Busy("nodes kept changing".into()))
    }

    /// A node with its liveness.
    pub fn get_node(&self, name: &str) -> Result<Node> {
        let (n, _) = self
            .load::<Node>(&node_key(name))?
            .ok_or_else(|| ManagerError::NotFound { what: "node", name: name.into() })?;
        Ok(self.with_liveness(n, &self.heartbeats()?))
    }

    pub fn list_nodes(&self) -> Result<Vec<Node>> {
        let seen = self.heartbeats()?;
        Ok(self
            .load_all("nodes/")?
            .into_iter()
            .map(|(n, _)| self.with_liveness(n, &seen))
            .collect())
    }

    /// Forgets a node (it leaves flood lists at once); `None` if there was none. The node
    /// comes back as it was, its liveness filled in as `get_node` does.
    pub fn delete_node(&self, name: &str) -> Result<Option<Node>> {
        let Some((n, v)) = self.load::<Node>(&node_key(name))? else { return Ok(None) };
        let n = self.with_liveness(n, &self.heartbeats()?);
        let mut ops = vec![Op::delete(node_key(name), v)];
        if let Some(a) = self.store.get(&alive_key(name))? {
            ops.push(Op::delete(alive_key(name), a.version));
        }
        // A node deleted and made again (a reinstalled host) joins again with the
        // bootstrap token, as kubeadm's nodes do.
        if let Some(c) = self.store.get(&auth::credential_key(name))? {
            ops.push(Op::delete(auth::credential_key(name), c.version));
        }
        if self.store.commit(&ops)? {
            Ok(Some(n))
        } else {
            Err(ManagerError::Busy(format!("node {name:?} changed meanwhile")))
        }
    }
}

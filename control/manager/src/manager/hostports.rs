//! Host ports: each node's port on each network with a node gateway that has ports on the
//! node (docs/pod-network.md). The node agent makes the interface; the manager holds its
//! record like a pod's port (addresses from the network, a MAC from the first), under the
//! container `knitter-host.<node>` and the interface the node names it by, so every node's
//! switch knows where each node's host address is. Made when a port of the network lands on
//! the node, removed with the network, and mended by a sweep (at start and every minute): a
//! host port no port of its network on its node needs any more goes, a missing one is made.

use super::objects::{Port, PortSpec, port_key};
use super::{Manager, Result};
use crate::network::Network;
use crate::store::{Op, OwnerKey};
use knitter_api::names::{HOST_PORT_PREFIX, host_port};
use std::collections::{BTreeMap, BTreeSet};

/// The node a host port's record is for, when `port` is one.
pub fn host_port_node(port: &Port) -> Option<&str> {
    let node = port.spec.container.strip_prefix(HOST_PORT_PREFIX)?;
    (host_port(&port.spec.network, node).1 == port.spec.interface).then_some(node)
}

impl Manager {
    /// Gives `node` its host port on `net` unless it has one; whether it has one now.
    /// Failures are logged (the next port created there, or the sweep, tries again). An
    /// existing record is written again as it is: a sweep that found the node without ports
    /// a moment ago then fails to remove it (its delete compares the record's version).
    pub(super) fn ensure_host_port(&self, net: &Network, node: &str) -> bool {
        let (container, interface) = host_port(&net.spec.name, node);
        let key = port_key(&container, &interface);
        if let Ok(Some((p, v))) = self.load::<Port>(&key)
            && p.is_complete()
            && let Ok(text) = serde_json::to_string(&p)
            && matches!(self.store.commit(&[Op::replace(&key, Some(v), text)]), Ok(true))
        {
            return true;
        }
        // None, or it changed (a sweep removed it meanwhile): made (or finished) anew.
        let spec = PortSpec {
            network: net.spec.name.clone(),
            container,
            interface,
            pod: String::new(),
            node: node.into(),
            ips: vec![],
            ip_group: None,
            requested_mac: None,
            pod_uid: String::new(),
            device_info: None,
        };
        match self.create_port_in(net, spec) {
            Ok((p, new)) => {
                if new {
                    tracing::info!(network = %net.spec.name, node, ifname = %p.spec.interface, addresses = ?p.addresses.iter().map(|a| a.address).collect::<Vec<_>>(), "host port made");
                }
                true
            }
            Err(e) => {
                tracing::warn!(network = %net.spec.name, node, error = %e, "no host port yet: the node's pods on the network reach neither their node nor beyond it");
                false
            }
        }
    }

    /// Makes the host ports that are missing and removes those no port needs: (made,
    /// removed). A host port goes only when two reads in a row find no port needing it and
    /// its record is as the sweep read it: a port created meanwhile keeps its node's host
    /// port ([`Manager::ensure_host_port`] writes the record again).
    pub fn sweep_host_ports(&self) -> Result<(usize, usize)> {
        let networks: BTreeMap<String, Network> = self
            .networks()?
            .into_iter()
            .filter(|n| n.spec.node_gateway)
            .map(|n| (n.spec.name.clone(), n))
            .collect();
        let ports: Vec<(Port, u64)> = self.load_all("ports/")?;
        let (needed, held) = needs(&ports, &networks);
        let mut made = 0;
        for (network, node) in &needed {
            if !held
                .iter()
                .any(|(h, _)| h.spec.network == *network && h.spec.node == *node && h.is_complete())
                && self.ensure_host_port(&networks[network], node)
            {
                made += 1;
            }
        }
        // Records of creates in progress are left to their create (or the placeholder sweep).
        let unneeded: Vec<(&Port, u64)> = held
            .into_iter()
            .filter(|(h, _)| {
                h.is_complete() && !needed.contains(&(h.spec.network.clone(), h.spec.node.clone()))
            })
            .collect();
        if unneeded.is_empty() {
            return Ok((made, 0));
        }
        let again: Vec<(Port, u64)> = self.load_all("ports/")?;
        let (needed, _) = needs(&again, &networks);
        let mut removed = 0;
        for (h, v) in unneeded {
            if needed.contains(&(h.spec.network.clone(), h.spec.node.clone())) {
                continue;
            }
            if self.remove_host_port(networks.get(&h.spec.network), h, v)? {
                tracing::info!(network = %h.spec.network, node = %h.spec.node, "host port removed: no port of its network is left on its node");
                removed += 1;
            }
        }
        Ok((made, removed))
    }
}

impl Manager {
    /// Deletes host port record `port` (at version `v`), then gives back its addresses;
    /// false when the record changed meanwhile (a create relied on it: nothing is released).
    /// Unlike a pod's port (released first, so a delete always finds what to release), a
    /// crash between the two leaves the addresses with the host port's owner, and the
    /// node's next host port on the network gets them back (claims are per owner).
    pub(super) fn remove_host_port(
        &self,
        net: Option<&Network>,
        port: &Port,
        v: u64,
    ) -> Result<bool> {
        if !self
            .store
            .commit(&[Op::delete(port_key(&port.spec.container, &port.spec.interface), v)])?
        {
            return Ok(false);
        }
        if let Some(net) = net {
            self.release_addresses(
                net,
                port,
                None,
                &OwnerKey::new(&port.spec.container, &port.spec.interface),
            )?;
        }
        Ok(true)
    }
}

/// Host port records, with their versions.
type Held<'p> = Vec<(&'p Port, u64)>;

/// The (network, node) pairs that need a host port (a node with a port of a network with a
/// node gateway), and the host ports held.
fn needs<'p>(
    ports: &'p [(Port, u64)],
    networks: &BTreeMap<String, Network>,
) -> (BTreeSet<(String, String)>, Held<'p>) {
    let mut needed = BTreeSet::new();
    let mut held = Vec::new();
    for (p, v) in ports {
        match host_port_node(p) {
            Some(_) => held.push((p, *v)),
            None if !p.spec.node.is_empty() && networks.contains_key(&p.spec.network) => {
                needed.insert((p.spec.network.clone(), p.spec.node.clone()));
            }
            None => {}
        }
    }
    (needed, held)
}

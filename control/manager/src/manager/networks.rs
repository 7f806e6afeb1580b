//! The manager's networks: created and deleted under the networks guard (overlaps,
//! segments, MTUs and quotas checked against a consistent set), each one's address spaces.

use super::managed::ManagedBy;
use super::objects::{Node, Port, Tenant, network_key, tenant_key};
use super::{Filter, Manager, ManagerError, ROUNDS, Result, json, space};
use crate::network::{Limits, Network, NetworkSpec};
use crate::store::{Cond, Op, StoreError};

impl Manager {
    pub(super) fn networks(&self) -> Result<Vec<Network>> {
        let stored: Vec<(NetworkSpec, u64)> = self.load_all("networks/")?;
        stored
            .into_iter()
            .map(|(s, _)| {
                Network::restore(s)
                    .map_err(|e| ManagerError::Store(StoreError(format!("corrupt network: {e}"))))
            })
            .collect()
    }

    pub(super) fn network(&self, name: &str) -> Result<(Network, u64)> {
        let (spec, v) = self
            .load::<NetworkSpec>(&network_key(name))?
            .ok_or_else(|| ManagerError::NotFound { what: "network", name: name.into() })?;
        let n = Network::restore(spec).map_err(|e| {
            ManagerError::Store(StoreError(format!("corrupt network {name:?}: {e}")))
        })?;
        Ok((n, v))
    }

    /// The limits for a new network: the configured ranges, the smallest registered
    /// underlay MTU (the configured default while no node has registered).
    pub(super) fn limits(&self) -> Result<Limits> {
        let nodes: Vec<(Node, u64)> = self.load_all("nodes/")?;
        let underlay_mtu = nodes
            .iter()
            .map(|(n, _)| n.underlay_mtu)
            .min()
            .unwrap_or(self.config.limits.underlay_mtu);
        Ok(Limits { underlay_mtu, ..self.config.limits.clone() })
    }

    /// Defines a network; the same definition again is a no-op (`false`).
    pub fn create_network(&self, spec: NetworkSpec) -> Result<(NetworkSpec, bool)> {
        self.create_network_by(spec, None)
    }

    /// Defines a network for `by` (a Kubernetes resource, recorded with it in one commit),
    /// or over the API (`None`). The same definition again is a no-op (`false`) — for a
    /// resource, only if that resource made it.
    pub fn create_network_by(
        &self,
        spec: NetworkSpec,
        by: Option<&ManagedBy>,
    ) -> Result<(NetworkSpec, bool)> {
        let key = network_key(&spec.name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let (tenant, tv) =
                self.load::<Tenant>(&tenant_key(&spec.tenant))?.ok_or_else(|| {
                    ManagerError::NotFound { what: "tenant", name: spec.tenant.clone() }
                })?;
            let existing = self.networks()?;
            if let Some(have) = existing.iter().find(|n| n.spec.name == spec.name) {
                self.check_made_by(&key, "network", &spec.name, by)?;
                if have.matches(&spec) {
                    return Ok((have.record(), false));
                }
                return Err(ManagerError::Conflict(format!(
                    "network {:?} exists with another definition (see it with a get; delete it first to change it)",
                    spec.name
                )));
            }
            let owned = existing.iter().filter(|n| n.spec.tenant == spec.tenant).count();
            if owned >= tenant.quota.networks as usize {
                return Err(ManagerError::Quota(format!(
                    "tenant {:?} has {owned} networks, its quota is {}",
                    spec.tenant, tenant.quota.networks
                )));
            }
            let net = Network::define(spec.clone(), &existing, &self.limits()?)?;
            let record = net.record();
            let mut ops = vec![
                self.bump_guard(guard),
                Op::create(&key, json(&record)?),
                Op::check(tenant_key(&record.tenant), Cond::Version(tv)),
            ];
            ops.extend(by.map(|b| b.record(&key)).transpose()?);
            if self.store.commit(&ops)? {
                return Ok((record, true));
            }
        }
        Err(ManagerError::Busy("networks kept changing".into()))
    }

    pub fn get_network(&self, name: &str) -> Result<NetworkSpec> {
        Ok(self.network(name)?.0.record())
    }

    pub fn list_networks(&self, f: &Filter) -> Result<Vec<NetworkSpec>> {
        let all = self.networks()?.into_iter().map(|n| n.record());
        Ok(all
            .filter(|n| {
                (f.tenant.is_empty() || n.tenant == f.tenant || n.shared)
                    && f.kind.is_none_or(|k| k == n.kind)
            })
            .collect())
    }

    /// Deletes a network nothing uses; `None` if there was none. A network a Kubernetes
    /// resource made is refused: deleting the resource deletes it.
    pub fn delete_network(&self, name: &str) -> Result<Option<NetworkSpec>> {
        self.delete_network_by(name, None)
    }

    /// Deletes a network nothing uses for `by` (the resource that made it) or over the API.
    pub fn delete_network_by(
        &self,
        name: &str,
        by: Option<&ManagedBy>,
    ) -> Result<Option<NetworkSpec>> {
        let key = network_key(name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let (net, v) = match self.network(name) {
                Err(ManagerError::NotFound { .. }) => return Ok(None),
                r => r?,
            };
            let made_by = self.check_deleted_by(&key, "network", name, by)?;
            // Creates in progress count: their records would outlive the network.
            let mut ports: Vec<(Port, u64)> = self
                .load_all::<Port>("ports/")?
                .into_iter()
                .filter(|(p, _)| p.spec.network == name)
                .collect();
            // The nodes' host ports go with the network once no other port is left (a host
            // port being made is left to finish: the network waits for it).
            if ports.iter().all(|(p, _)| super::host_port_node(p).is_some()) {
                for (p, v) in ports.iter().filter(|(p, _)| p.is_complete()) {
                    self.remove_host_port(Some(&net), p, *v)?;
                }
                ports.retain(|(p, _)| !p.is_complete());
                // What a crash between a host port's delete and its release left.
                for a in net.families() {
                    let sp = space(name, a.subnet().is_ipv4());
                    for (_, owner) in self.store.allocations(&sp)? {
                        if owner.container.starts_with(knitter_api::names::HOST_PORT_PREFIX)
                            && ports.is_empty()
                        {
                            self.store.release(&sp, &owner)?;
                        }
                    }
                }
            }
            let pods: Vec<&Port> = ports
                .iter()
                .map(|(p, _)| p)
                .filter(|p| super::host_port_node(p).is_none())
                .collect();
            if let Some(p) = pods.first() {
                return Err(ManagerError::InUse(format!(
                    "network {name:?} still has {} ports (first: {}/{} of pod {:?})",
                    pods.len(),
                    p.spec.container,
                    p.spec.interface,
                    p.spec.pod
                )));
            }
            if let Some((p, _)) = ports.first() {
                return Err(ManagerError::Busy(format!(
                    "network {name:?}: node {}'s host port is being made; try again",
                    p.spec.node
                )));
            }
            let groups = self.list_groups(name)?;
            if !groups.is_empty() {
                let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
                return Err(ManagerError::InUse(format!(
                    "network {name:?} still has IP groups {}: delete them first",
                    names.join(", ")
                )));
            }
            for a in net.families() {
                if let Some((ip, by)) =
                    self.store.allocations(&space(name, a.subnet().is_ipv4()))?.first()
                {
                    return Err(ManagerError::InUse(format!(
                        "network {name:?} still has address {ip} allocated to {by}"
                    )));
                }
            }
            let mut ops = vec![self.bump_guard(guard), Op::delete(&key, v)];
            ops.extend(made_by);
            if self.store.commit(&ops)? {
                return Ok(Some(net.record()));
            }
        }
        Err(ManagerError::Busy("networks kept changing".into()))
    }

    /// Each network's address use, per family it has: what its pools hold and how many of
    /// those ports and IP groups hold (read from the store: every address is listed).
    pub fn address_use(&self) -> Result<Vec<AddressUse>> {
        let mut out = Vec::new();
        for net in self.networks()? {
            for a in net.families() {
                let v4 = a.subnet().is_ipv4();
                let used = self.store.allocations(&space(&net.spec.name, v4))?.len();
                out.push(AddressUse {
                    network: net.spec.name.clone(),
                    family: if v4 { "ipv4" } else { "ipv6" },
                    size: a.size(),
                    used,
                });
            }
        }
        Ok(out)
    }
}

/// One network's address use in one family ([`Manager::address_use`]).
pub struct AddressUse {
    pub network: String,
    pub family: &'static str,
    /// Addresses its pools hold.
    pub size: u128,
    /// Of them, held by ports and IP groups.
    pub used: usize,
}

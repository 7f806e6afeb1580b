//! The manager's ports: a pod interface's record written before its addresses are claimed
//! (a delete always finds what to release, a retried create finishes the first), its MAC,
//! placeholders swept.

use super::objects::{IpGroupRecord, Port, PortIp, PortSpec, mac_key, port_key};
use super::{
    Filter, Manager, ManagerError, PLACEHOLDER_AGE_SECS, ROUNDS, Result, another_request,
    check_name, family, group_space, json, mac_text, now, requested_mac, space, tenancy,
};
use crate::ipam::{self, Addressing, IpGroup, IpamError};
use crate::network::Network;
use crate::store::{Op, OwnerKey, StoreError, nothing};
use std::net::IpAddr;

impl Manager {
    /// Creates a port: addresses (fixed, from an IP group, or the next free ones), a MAC
    /// derived from the first. The same request again returns the same port (`false`).
    /// On a network with a node gateway, the port's node gets its host port on it too
    /// (`hostports.rs`; best effort: the sweep mends a failure).
    pub fn create_port(&self, spec: PortSpec) -> Result<(Port, bool)> {
        if spec.container.starts_with(knitter_api::names::HOST_PORT_PREFIX) {
            return Err(ManagerError::Invalid(format!(
                "container {:?}: names starting with {:?} are the nodes' host ports, which the manager makes itself",
                spec.container,
                knitter_api::names::HOST_PORT_PREFIX
            )));
        }
        let (net, _) = self.network(&spec.network)?;
        let (port, new) = self.create_port_in(&net, spec)?;
        if net.spec.node_gateway && !port.spec.node.is_empty() {
            let _ = self.ensure_host_port(&net, &port.spec.node);
        }
        Ok((port, new))
    }

    /// [`Manager::create_port`] in `net`, without the host port.
    pub(super) fn create_port_in(&self, net: &Network, mut spec: PortSpec) -> Result<(Port, bool)> {
        check_name("container", &spec.container)?;
        spec.requested_mac = spec.requested_mac.as_deref().map(requested_mac).transpose()?;
        knitter_api::names::interface_name(&spec.interface).map_err(ManagerError::Invalid)?;
        if let Some(info) = &spec.device_info
            && !serde_json::from_str::<serde_json::Value>(info).is_ok_and(|v| v.is_object())
        {
            return Err(ManagerError::Invalid(format!(
                "device_info {info:?} is not a JSON object (NPWG device-info)"
            )));
        }
        let cluster = self.port_cluster(net, &spec.node)?;
        if !spec.pod.is_empty() {
            let ns = tenancy::pod_namespace(&spec.pod);
            self.check_attachment(&cluster, ns, &net.spec, &spec)?;
        }
        for (i, ip) in spec.ips.iter().enumerate() {
            if spec.ips[..i].iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
                return Err(ManagerError::Invalid(format!(
                    "at most one fixed {} address per port",
                    family(ip)
                )));
            }
            Self::addressing_for(net, ip.is_ipv4())?;
        }
        let group =
            spec.ip_group.as_deref().map(|g| self.get_group(&spec.network, g)).transpose()?;
        let group_v4 = group.as_ref().map(|g| g.members.first().is_none_or(IpAddr::is_ipv4));
        if let Some(ip) = spec.ips.iter().find(|ip| Some(ip.is_ipv4()) == group_v4) {
            return Err(ManagerError::Invalid(format!(
                "a fixed {} address and an IP group of that family are exclusive",
                family(ip)
            )));
        }
        let key = port_key(&spec.container, &spec.interface);
        let mut pending = None;
        // One dynamic address: the claim writes the whole port in its transaction.
        let mut whole = self.single_dynamic(net, &spec, group.as_ref());
        for _ in 0..ROUNDS {
            match self.load::<Port>(&key)? {
                // A create cut off long ago: whatever it asked for, it is nobody's now.
                Some((have, v))
                    if !have.is_complete()
                        && now().saturating_sub(have.created) >= PLACEHOLDER_AGE_SECS =>
                {
                    self.remove_port(&key, &have, v)?;
                }
                Some((have, _)) if have.spec.network != spec.network => {
                    return Err(ManagerError::Conflict(format!(
                        "container {} interface {} is already a port of network {:?}",
                        spec.container, spec.interface, have.spec.network
                    )));
                }
                // A retry gets the same port; the same container and interface asking for
                // something else is another request, refused.
                Some((have, _)) if let Some(field) = another_request(&have.spec, &spec) => {
                    return Err(ManagerError::Conflict(format!(
                        "container {} interface {} is already a port with another {field}",
                        spec.container, spec.interface
                    )));
                }
                Some((have, _)) if !have.addresses.is_empty() => return Ok((have, false)),
                Some((have, v)) => {
                    pending = Some((have, v));
                    break;
                }
                None => {
                    let port = Port {
                        spec: spec.clone(),
                        tenant: net.spec.tenant.clone(),
                        kind: net.spec.kind,
                        plane: net.spec.plane,
                        segment: net.segment,
                        mtu: net.mtu,
                        addresses: vec![],
                        mac: String::new(),
                        created: now(),
                        policer: net.spec.pod_policer,
                        sriov_pool: net.spec.sriov_pool.clone(),
                        pod_chooses_vf: net.spec.pod_chooses_vf,
                        cluster: cluster.clone(),
                    };
                    if let Some(a) = whole {
                        match self.create_whole(&key, &port, a)? {
                            Some(port) => return Ok((port, true)),
                            // The record appeared meanwhile (a retry of this request through
                            // another replica): read it again; if something else is odd,
                            // the three-step path sorts it out.
                            None => {
                                whole = None;
                                continue;
                            }
                        }
                    }
                    if let Some(v) = self.store.commit_at(&[Op::create(&key, json(&port)?)])? {
                        pending = Some((port, v));
                        break;
                    }
                }
            }
        }
        let Some((mut port, v)) = pending else {
            return Err(ManagerError::Busy(format!("port {key} kept changing")));
        };
        let owner = OwnerKey::new(&spec.container, &spec.interface);
        let claimed =
            self.claim_addresses(net, &port, group.as_ref(), &owner).and_then(|addresses| {
                let mac = self.mac_claim(&port.spec, &key)?;
                Ok((addresses, mac))
            });
        let mac_claim = match claimed {
            Ok((addresses, mac_claim)) => {
                port.mac = match &port.spec.requested_mac {
                    Some(m) => m.clone(),
                    None => addresses.first().map(|a| mac_text(a.address)).unwrap_or_default(),
                };
                port.addresses = addresses;
                mac_claim
            }
            Err(e) => {
                self.release_addresses(net, &port, group.as_ref(), &owner)?;
                let _ = self.store.commit(&[Op::delete(&key, v)])?;
                return Err(e);
            }
        };
        // The port and its requested MAC's claim are written in one transaction: two ports
        // asking for one MAC at once cannot both get it.
        let mut ops = vec![Op::replace(&key, Some(v), json(&port)?)];
        ops.extend(mac_claim);
        if self.store.commit(&ops)? {
            return Ok((port, true));
        }
        if let Err(e) = self.mac_claim(&port.spec, &key) {
            self.release_addresses(net, &port, group.as_ref(), &owner)?;
            let _ = self.store.commit(&[Op::delete(&key, v)])?;
            return Err(e);
        }
        // A retry of this very request finished first (same owner, same addresses), or a
        // delete raced the create.
        match self.load::<Port>(&key)? {
            Some((have, _)) if have.addresses == port.addresses => Ok((have, false)),
            _ => {
                self.release_addresses(net, &port, group.as_ref(), &owner)?;
                Err(ManagerError::Conflict(format!("port {key} was deleted while being created")))
            }
        }
    }

    /// The addressing of a port that gets exactly one address, dynamic, from its network
    /// (one family, no fixed address, no IP group, no requested MAC): its claim can carry
    /// the whole record ([`Manager::create_whole`]).
    pub(super) fn single_dynamic<'n>(
        &self,
        net: &'n Network,
        spec: &PortSpec,
        group: Option<&IpGroupRecord>,
    ) -> Option<&'n Addressing> {
        let mut families = net.families();
        let (Some(a), None) = (families.next(), families.next()) else { return None };
        (spec.ips.is_empty() && group.is_none() && spec.requested_mac.is_none()).then_some(a)
    }

    /// Creates `port` (its record as yet without addresses) whole in one transaction with
    /// its address's claim: it exists with its address or not at all (no placeholder to
    /// finish or sweep), one write instead of three. `None` when the record appeared
    /// meanwhile (nothing claimed).
    pub(super) fn create_whole(
        &self,
        key: &str,
        port: &Port,
        a: &Addressing,
    ) -> Result<Option<Port>> {
        let owner = OwnerKey::new(&port.spec.container, &port.spec.interface);
        let whole = |ip: IpAddr| Port {
            addresses: vec![PortIp {
                address: ip,
                prefix: a.subnet().prefix(),
                gateway: a.gateway(),
            }],
            mac: mac_text(ip),
            ..port.clone()
        };
        let record = |ip: IpAddr| -> Result<Vec<Op>, StoreError> {
            let v = serde_json::to_string(&whole(ip))
                .map_err(|e| StoreError(format!("port record: {e}")))?;
            Ok(vec![Op::create(key, v)])
        };
        match self.allocate(&space(&port.spec.network, a.subnet().is_ipv4()), a, &owner, &record) {
            Ok(ip) => Ok(Some(whole(ip))),
            Err(IpamError::RecordsChanged) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn claim_addresses(
        &self,
        net: &Network,
        port: &Port,
        group: Option<&IpGroupRecord>,
        owner: &OwnerKey,
    ) -> Result<Vec<PortIp>> {
        let spec = &port.spec;
        let mut out = Vec::new();
        for a in net.families() {
            let v4 = a.subnet().is_ipv4();
            let sp = space(&net.spec.name, v4);
            let fixed = spec.ips.iter().find(|ip| ip.is_ipv4() == v4);
            let ip = match (
                fixed,
                group.filter(|g| g.members.first().is_none_or(|m| m.is_ipv4() == v4)),
            ) {
                (Some(ip), _) => ipam::allocate_fixed(self.store.as_ref(), &sp, a, owner, *ip)?,
                (None, Some(g)) => {
                    let ipg = IpGroup {
                        name: g.name.clone(),
                        members: g.members.clone(),
                        grace_secs: g.grace_secs,
                    };
                    ipg.allocate(
                        self.store.as_ref(),
                        &group_space(&net.spec.name, v4, &g.name),
                        owner,
                        &port.pod_identity(),
                        now(),
                    )?
                }
                (None, None) => self.allocate(&sp, a, owner, &nothing)?,
            };
            out.push(PortIp { address: ip, prefix: a.subnet().prefix(), gateway: a.gateway() });
        }
        Ok(out)
    }

    /// Gives back whatever `owner` holds for `port` (idempotent): plain addresses to the
    /// network, a group member to its group (kept for the pod for the group's grace).
    pub(super) fn release_addresses(
        &self,
        net: &Network,
        port: &Port,
        group: Option<&IpGroupRecord>,
        owner: &OwnerKey,
    ) -> Result<()> {
        for a in net.families() {
            let v4 = a.subnet().is_ipv4();
            self.store.release(&space(&net.spec.name, v4), owner)?;
            if let Some(g) = group.filter(|g| g.members.first().is_none_or(|m| m.is_ipv4() == v4)) {
                let ipg = IpGroup {
                    name: g.name.clone(),
                    members: g.members.clone(),
                    grace_secs: g.grace_secs,
                };
                ipg.release(
                    self.store.as_ref(),
                    &group_space(&net.spec.name, v4, &g.name),
                    owner,
                    &port.pod_identity(),
                    now(),
                )?;
            }
        }
        Ok(())
    }

    pub fn get_port(&self, container: &str, interface: &str) -> Result<Port> {
        self.load::<Port>(&port_key(container, interface))?
            .map(|(p, _)| p)
            .filter(Port::is_complete)
            .ok_or_else(|| ManagerError::NotFound {
                what: "port",
                name: format!("{container}/{interface}"),
            })
    }

    /// The ports created whole (not the records of creates in progress or cut off).
    pub fn list_ports(&self, f: &Filter) -> Result<Vec<Port>> {
        let all: Vec<(Port, u64)> = self.load_all("ports/")?;
        let all = all.into_iter().filter(|(p, _)| p.is_complete());
        let keep = |p: &Port| {
            (f.network.is_empty() || p.spec.network == f.network)
                && (f.node.is_empty() || p.spec.node == f.node)
                && (f.pod.is_empty() || p.spec.pod == f.pod)
                && (f.tenant.is_empty() || p.tenant == f.tenant)
        };
        Ok(all.map(|(p, _)| p).filter(keep).collect())
    }

    /// Removes the records of port creates cut off (by a crash, a kill, a lost connection,
    /// never retried) at least `age_secs` ago, giving back what they had claimed; how many.
    /// A create retried before the sweep finishes its port instead. Runs at the manager's
    /// start and every minute ([`PLACEHOLDER_AGE_SECS`]).
    pub fn sweep_placeholders(&self, age_secs: u64) -> Result<usize> {
        let now = now();
        let mut swept = 0;
        for (port, v) in self.load_all::<Port>("ports/")? {
            if port.is_complete() || now.saturating_sub(port.created) < age_secs {
                continue;
            }
            let key = port_key(&port.spec.container, &port.spec.interface);
            if self.remove_port(&key, &port, v)? {
                tracing::warn!(port = %key, network = %port.spec.network, pod = %port.spec.pod, "removed a port whose create was cut off");
                swept += 1;
            }
        }
        Ok(swept)
    }

    /// Deletes a port and releases its addresses; `None` if there was none (deletes are
    /// idempotent, as CNI DEL must be).
    /// The write that claims `spec`'s requested MAC for the port `key` (none when it asks for
    /// none, or holds it already); refused when another port of the network holds it.
    pub(super) fn mac_claim(&self, spec: &PortSpec, key: &str) -> Result<Option<Op>> {
        let Some(mac) = &spec.requested_mac else { return Ok(None) };
        let claim = mac_key(&spec.network, mac);
        match self.load::<String>(&claim)? {
            None => Ok(Some(Op::create(&claim, json(&key.to_string())?))),
            Some((holder, _)) if holder == key => Ok(None),
            Some((holder, _)) => Err(ManagerError::Conflict(format!(
                "MAC {mac} is already port {}'s in network {:?}",
                holder.trim_start_matches("ports/"),
                spec.network
            ))),
        }
    }

    pub fn delete_port(&self, container: &str, interface: &str) -> Result<Option<Port>> {
        if container.starts_with(knitter_api::names::HOST_PORT_PREFIX) {
            return Err(ManagerError::Invalid(format!(
                "container {container:?} is a node's host port: the manager removes it when the node's last port of the network goes"
            )));
        }
        self.delete_port_record(container, interface)
    }

    pub(super) fn delete_port_record(
        &self,
        container: &str,
        interface: &str,
    ) -> Result<Option<Port>> {
        let key = port_key(container, interface);
        for _ in 0..ROUNDS {
            let Some((port, v)) = self.load::<Port>(&key)? else { return Ok(None) };
            if self.remove_port(&key, &port, v)? {
                return Ok(Some(port));
            }
        }
        Err(ManagerError::Busy(format!("port {key} kept changing")))
    }

    /// Gives back what port record `key` (at version `v`) holds — its owner's addresses,
    /// its requested MAC's claim — and deletes it; false when the record changed meanwhile.
    pub(super) fn remove_port(&self, key: &str, port: &Port, v: u64) -> Result<bool> {
        match self.network(&port.spec.network) {
            Ok((net, _)) => {
                let group = match port
                    .spec
                    .ip_group
                    .as_deref()
                    .map(|g| self.get_group(&port.spec.network, g))
                {
                    Some(Err(ManagerError::NotFound { .. })) | None => None,
                    Some(r) => Some(r?),
                };
                self.release_addresses(
                    &net,
                    port,
                    group.as_ref(),
                    &OwnerKey::new(&port.spec.container, &port.spec.interface),
                )?;
            }
            Err(ManagerError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        let mut ops = vec![Op::delete(key, v)];
        if let Some(mac) = &port.spec.requested_mac {
            let claim = mac_key(&port.spec.network, mac);
            if let Some((holder, mv)) = self.load::<String>(&claim)?
                && holder == key
            {
                ops.push(Op::delete(&claim, mv));
            }
        }
        Ok(self.store.commit(&ops)?)
    }
}

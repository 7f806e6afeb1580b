//! knitter-manager's core: tenants, networks, IP groups, ports and nodes over a [`Store`],
//! with one error table ([`ManagerError`]) that both APIs map to their codes. Every
//! operation is blocking (the store is) and safe to run from several threads and several
//! manager replicas on one store:
//! - a port's record is written (empty) before its addresses are claimed, so a delete
//!   always finds what to release, and a retried create finishes the first attempt's work
//!   with the same addresses (claims are keyed by container and interface);
//! - network and node changes compare the version of one guard key, so overlap, segment,
//!   MTU and quota checks see a consistent set of networks and nodes;
//! - an IP group's members are held in the network's address space by the group itself
//!   (so nothing else takes them) and handed to pods in the group's own address space.

pub mod auth;
pub mod cluster;
pub mod grpc;
pub mod limits;
pub mod managed;
pub mod objects;
pub mod rest;
pub mod sync;
pub mod tenancy;
pub mod tls;

use crate::ipam::{self, Addressing, IpGroup, IpamError};
use crate::network::{Kind, Limits, Network, NetworkError, NetworkSpec};
use crate::store::{Cond, Op, OwnerKey, Store, StoreError, With, nothing};
use managed::ManagedBy;
use objects::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Everything an operation can refuse or fail with; each has one HTTP status and one gRPC
/// code (see `rest.rs`).
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("{0}")]
    Invalid(String),
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },
    /// Exists with another definition, or an address/segment someone else holds.
    #[error("{0}")]
    Conflict(String),
    /// Refused because something still uses it.
    #[error("{0}")]
    InUse(String),
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    Quota(String),
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller may not do this (a pod's namespace and another tenant's network, a node
    /// and another node's objects).
    #[error("{0}")]
    Forbidden(String),
    /// Concurrent changes kept winning; the request may be retried.
    #[error("{0}; try again")]
    Busy(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ManagerError {
    /// The one error table: the REST code, the HTTP status, the gRPC code.
    pub fn codes(&self) -> (&'static str, u16, tonic::Code) {
        use tonic::Code;
        match self {
            ManagerError::Invalid(_) => ("invalid_argument", 400, Code::InvalidArgument),
            ManagerError::NotFound { .. } => ("not_found", 404, Code::NotFound),
            ManagerError::Conflict(_) => ("conflict", 409, Code::AlreadyExists),
            ManagerError::InUse(_) => ("in_use", 409, Code::FailedPrecondition),
            ManagerError::Exhausted(_) => ("exhausted", 409, Code::ResourceExhausted),
            ManagerError::Quota(_) => ("quota_exceeded", 403, Code::ResourceExhausted),
            ManagerError::Unauthenticated(_) => ("unauthenticated", 401, Code::Unauthenticated),
            ManagerError::Forbidden(_) => ("permission_denied", 403, Code::PermissionDenied),
            ManagerError::Busy(_) => ("busy", 503, Code::Unavailable),
            ManagerError::Store(_) => ("store_unavailable", 503, Code::Unavailable),
        }
    }
}

impl From<NetworkError> for ManagerError {
    fn from(e: NetworkError) -> Self {
        match e {
            NetworkError::Overlap { .. } | NetworkError::SegmentTaken { .. } => ManagerError::Conflict(e.to_string()),
            NetworkError::SegmentsExhausted { .. } => ManagerError::Exhausted(e.to_string()),
            _ => ManagerError::Invalid(e.to_string()),
        }
    }
}

impl From<IpamError> for ManagerError {
    fn from(e: IpamError) -> Self {
        match e {
            IpamError::Taken { .. } => ManagerError::Conflict(e.to_string()),
            IpamError::Exhausted(_) => ManagerError::Exhausted(e.to_string()),
            IpamError::Store(s) => ManagerError::Store(s),
            IpamError::Contended(_) | IpamError::RecordsChanged => ManagerError::Busy(e.to_string()),
            _ => ManagerError::Invalid(e.to_string()),
        }
    }
}

pub type Result<T, E = ManagerError> = std::result::Result<T, E>;

/// The manager's settings that shape new objects.
#[derive(Debug, Clone)]
#[derive(Default)]
pub struct Config {
    pub limits: Limits,
    pub default_quota: Quota,
    pub liveness: sync::Liveness,
    /// How each plane's frames are marked on the underlay (sent to nodes with each network).
    pub plane_markings: crate::network::PlaneMarkings,
}

/// The tenant every manager starts with (Knitter's `admin`, with its larger quota).
pub const ADMIN: &str = "admin";

/// How many times an operation re-reads and retries when a concurrent change wins.
const ROUNDS: usize = 8;

/// A port record still without addresses this long after it was written is a create that
/// was cut off (a create writes it, claims the addresses and finishes it within
/// milliseconds, seconds under heavy contention): `sweep_placeholders` removes it.
pub const PLACEHOLDER_AGE_SECS: u64 = 120;

/// Filters of the list operations; empty fields match everything.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Filter {
    pub tenant: String,
    pub network: String,
    pub node: String,
    pub pod: String,
    pub kind: Option<Kind>,
}

pub struct Manager {
    store: Arc<dyn Store>,
    config: Config,
    /// Per address space, where the last allocation ended (spreads concurrent allocations).
    cursors: Mutex<HashMap<String, u128>>,
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Names become store keys: 1-253 characters, none of them '/', whitespace or control.
fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty() && name.len() <= 253 && !name.chars().any(|c| c == '/' || c.is_whitespace() || c.is_control());
    if ok { Ok(()) } else { Err(ManagerError::Invalid(format!("{what} {name:?} must be 1-253 characters without '/', spaces or control characters"))) }
}

fn json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| ManagerError::Store(StoreError::from(e)))
}

/// A network's address space for one family (its addresses and owners in the store).
fn space(network: &str, v4: bool) -> String {
    format!("{network}.{}", if v4 { "v4" } else { "v6" })
}

/// An IP group's own address space: which pod holds which member.
fn group_space(network: &str, v4: bool, group: &str) -> String {
    format!("{}~{group}", space(network, v4))
}

/// The owner that holds an IP group's `i`th member in the network's address space.
fn member_owner(group: &str, i: usize) -> OwnerKey {
    OwnerKey::new(&format!("ipgroup:{group}"), &format!("#{i}"))
}

fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// A requested MAC in its canonical form (lower case, colons), or why it cannot be one.
fn requested_mac(text: &str) -> Result<String> {
    let bad = |why: &str| Err(ManagerError::Invalid(format!("requested MAC {text:?} {why}")));
    let bytes: Option<Vec<u8>> = text.split(':').map(|b| (b.len() == 2).then(|| u8::from_str_radix(b, 16).ok()).flatten()).collect();
    let Some(&[a, b, c, d, e, f]) = bytes.as_deref() else { return bad("is not six hexadecimal bytes separated by colons") };
    if a & 1 != 0 {
        return bad("is a group (multicast) address");
    }
    if [a, b, c, d, e, f] == [0; 6] {
        return bad("is all zeros");
    }
    if a == 0x0a && (b == 0x58 || b == 0x59) {
        return bad("is in the range of MACs derived from addresses (0a:58, 0a:59)");
    }
    Ok(format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}"))
}

/// The first field in which `want` asks for another port than `have` is (the pod, the node,
/// the fixed addresses, the IP group, the MAC); `None` for a retry of the same request.
fn another_request(have: &PortSpec, want: &PortSpec) -> Option<&'static str> {
    let sorted = |ips: &[IpAddr]| {
        let mut v = ips.to_vec();
        v.sort();
        v
    };
    if have.pod != want.pod {
        Some("pod")
    } else if have.node != want.node {
        Some("node")
    } else if sorted(&have.ips) != sorted(&want.ips) {
        Some("fixed address")
    } else if have.ip_group != want.ip_group {
        Some("IP group")
    } else if have.requested_mac != want.requested_mac {
        Some("requested MAC")
    } else {
        None
    }
}

fn mac_text(ip: IpAddr) -> String {
    let m = ipam::mac_for(ip);
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

impl Manager {
    /// A manager over `store`; makes sure the admin tenant exists.
    pub fn new(store: Arc<dyn Store>, config: Config) -> Result<Manager> {
        let m = Manager { store, config, cursors: Mutex::default() };
        if m.load::<Tenant>(&tenant_key(ADMIN))?.is_none() {
            m.create_tenant(ADMIN, Some(Quota { networks: 100 }))?;
        }
        Ok(m)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn liveness(&self) -> sync::Liveness {
        self.config.liveness
    }

    pub fn plane_markings(&self) -> crate::network::PlaneMarkings {
        self.config.plane_markings
    }

    fn load<T: DeserializeOwned>(&self, key: &str) -> Result<Option<(T, u64)>> {
        let Some(v) = self.store.get(key)? else { return Ok(None) };
        let t = serde_json::from_str(&v.value).map_err(|e| StoreError(format!("corrupt record {key}: {e}")))?;
        Ok(Some((t, v.version)))
    }

    fn load_all<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(T, u64)>> {
        let rows = self.store.list(prefix)?;
        rows.into_iter()
            .map(|(k, v)| {
                let t = serde_json::from_str(&v.value).map_err(|e| StoreError(format!("corrupt record {k}: {e}")))?;
                Ok((t, v.version))
            })
            .collect()
    }

    fn guard(&self) -> Result<(Option<u64>, u64)> {
        let g = self.store.get(NETWORKS_GUARD)?;
        let count = g.as_ref().and_then(|g| g.value.parse().ok()).unwrap_or(0);
        Ok((g.map(|g| g.version), count))
    }

    fn bump_guard(&self, guard: (Option<u64>, u64)) -> Op {
        Op::replace(NETWORKS_GUARD, guard.0, (guard.1 + 1).to_string())
    }

    // ---- tenants ----

    /// Creates a tenant (with the configured default quota unless given); the same tenant
    /// again is a no-op (`false`), another quota a conflict.
    pub fn create_tenant(&self, name: &str, quota: Option<Quota>) -> Result<(Tenant, bool)> {
        self.create_tenant_with(TenantSpec { name: name.into(), quota, namespaces: Vec::new() })
    }

    /// [`Manager::create_tenant`] with the namespaces that belong to it without a label
    /// (`tenancy.rs`); the same tenant with other namespaces is a conflict.
    pub fn create_tenant_with(&self, spec: TenantSpec) -> Result<(Tenant, bool)> {
        let TenantSpec { name, quota, namespaces } = spec;
        let name = name.as_str();
        check_name("tenant", name)?;
        for ns in &namespaces {
            check_name("namespace", ns)?;
        }
        let t = Tenant { name: name.into(), quota: quota.unwrap_or(self.config.default_quota), created: now(), namespaces: namespaces.clone() };
        let key = tenant_key(name);
        for _ in 0..ROUNDS {
            if let Some((have, _)) = self.load::<Tenant>(&key)? {
                if quota.is_some_and(|q| q != have.quota) {
                    return Err(ManagerError::Conflict(format!("tenant {name:?} exists with another quota (change it with a quota update)")));
                }
                if !namespaces.is_empty() && namespaces != have.namespaces {
                    return Err(ManagerError::Conflict(format!("tenant {name:?} exists with other namespaces (change them with a namespaces update)")));
                }
                return Ok((have, false));
            }
            self.check_unlisted(name, &namespaces)?;
            if self.store.commit(&[Op::create(&key, json(&t)?)])? {
                return Ok((t, true));
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    pub fn tenant(&self, name: &str) -> Result<Tenant> {
        self.load(&tenant_key(name))?.map(|(t, _)| t).ok_or_else(|| ManagerError::NotFound { what: "tenant", name: name.into() })
    }

    pub fn tenants(&self) -> Result<Vec<Tenant>> {
        Ok(self.load_all("tenants/")?.into_iter().map(|(t, _)| t).collect())
    }

    pub fn set_quota(&self, name: &str, quota: Quota) -> Result<Tenant> {
        let key = tenant_key(name);
        for _ in 0..ROUNDS {
            let (mut t, v) = self.load::<Tenant>(&key)?.ok_or_else(|| ManagerError::NotFound { what: "tenant", name: name.into() })?;
            t.quota = quota;
            if self.store.commit(&[Op::replace(&key, Some(v), json(&t)?)])? {
                return Ok(t);
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    /// Deletes a tenant that owns no network; `None` if there was none.
    pub fn delete_tenant(&self, name: &str) -> Result<Option<Tenant>> {
        if name == ADMIN {
            return Err(ManagerError::Invalid("the admin tenant cannot be deleted".into()));
        }
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let Some((t, v)) = self.load::<Tenant>(&tenant_key(name))? else { return Ok(None) };
            let owned: Vec<String> = self.networks()?.into_iter().filter(|n| n.spec.tenant == name).map(|n| n.spec.name).collect();
            if !owned.is_empty() {
                return Err(ManagerError::InUse(format!("tenant {name:?} still owns networks {}: delete them first", owned.join(", "))));
            }
            if self.store.commit(&[self.bump_guard(guard), Op::delete(tenant_key(name), v)])? {
                return Ok(Some(t));
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    // ---- networks ----

    fn networks(&self) -> Result<Vec<Network>> {
        let stored: Vec<(NetworkSpec, u64)> = self.load_all("networks/")?;
        stored.into_iter().map(|(s, _)| Network::restore(s).map_err(|e| ManagerError::Store(StoreError(format!("corrupt network: {e}"))))).collect()
    }

    fn network(&self, name: &str) -> Result<(Network, u64)> {
        let (spec, v) = self.load::<NetworkSpec>(&network_key(name))?.ok_or_else(|| ManagerError::NotFound { what: "network", name: name.into() })?;
        let n = Network::restore(spec).map_err(|e| ManagerError::Store(StoreError(format!("corrupt network {name:?}: {e}"))))?;
        Ok((n, v))
    }

    /// The limits for a new network: the configured ranges, the smallest registered
    /// underlay MTU (the configured default while no node has registered).
    fn limits(&self) -> Result<Limits> {
        let nodes: Vec<(Node, u64)> = self.load_all("nodes/")?;
        let underlay_mtu = nodes.iter().map(|(n, _)| n.underlay_mtu).min().unwrap_or(self.config.limits.underlay_mtu);
        Ok(Limits { underlay_mtu, ..self.config.limits.clone() })
    }

    /// Defines a network; the same definition again is a no-op (`false`).
    pub fn create_network(&self, spec: NetworkSpec) -> Result<(NetworkSpec, bool)> {
        self.create_network_by(spec, None)
    }

    /// Defines a network for `by` (a Kubernetes resource, recorded with it in one commit),
    /// or over the API (`None`). The same definition again is a no-op (`false`) — for a
    /// resource, only if that resource made it.
    pub fn create_network_by(&self, spec: NetworkSpec, by: Option<&ManagedBy>) -> Result<(NetworkSpec, bool)> {
        let key = network_key(&spec.name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let (tenant, tv) = self.load::<Tenant>(&tenant_key(&spec.tenant))?.ok_or_else(|| ManagerError::NotFound { what: "tenant", name: spec.tenant.clone() })?;
            let existing = self.networks()?;
            if let Some(have) = existing.iter().find(|n| n.spec.name == spec.name) {
                self.check_made_by(&key, "network", &spec.name, by)?;
                if have.matches(&spec) {
                    return Ok((have.record(), false));
                }
                return Err(ManagerError::Conflict(format!("network {:?} exists with another definition (see it with a get; delete it first to change it)", spec.name)));
            }
            let owned = existing.iter().filter(|n| n.spec.tenant == spec.tenant).count();
            if owned >= tenant.quota.networks as usize {
                return Err(ManagerError::Quota(format!("tenant {:?} has {owned} networks, its quota is {}", spec.tenant, tenant.quota.networks)));
            }
            let net = Network::define(spec.clone(), &existing, &self.limits()?)?;
            let record = net.record();
            let mut ops = vec![self.bump_guard(guard), Op::create(&key, json(&record)?), Op::check(tenant_key(&record.tenant), Cond::Version(tv))];
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
        Ok(all.filter(|n| (f.tenant.is_empty() || n.tenant == f.tenant || n.shared) && f.kind.is_none_or(|k| k == n.kind)).collect())
    }

    /// Deletes a network nothing uses; `None` if there was none. A network a Kubernetes
    /// resource made is refused: deleting the resource deletes it.
    pub fn delete_network(&self, name: &str) -> Result<Option<NetworkSpec>> {
        self.delete_network_by(name, None)
    }

    /// Deletes a network nothing uses for `by` (the resource that made it) or over the API.
    pub fn delete_network_by(&self, name: &str, by: Option<&ManagedBy>) -> Result<Option<NetworkSpec>> {
        let key = network_key(name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let (net, v) = match self.network(name) {
                Err(ManagerError::NotFound { .. }) => return Ok(None),
                r => r?,
            };
            let made_by = self.check_deleted_by(&key, "network", name, by)?;
            // Creates in progress count: their records would outlive the network.
            let ports: Vec<Port> = self.load_all::<Port>("ports/")?.into_iter().map(|(p, _)| p).filter(|p| p.spec.network == name).collect();
            if let Some(p) = ports.first() {
                return Err(ManagerError::InUse(format!("network {name:?} still has {} ports (first: {}/{} of pod {:?})", ports.len(), p.spec.container, p.spec.interface, p.spec.pod)));
            }
            let groups = self.list_groups(name)?;
            if !groups.is_empty() {
                let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
                return Err(ManagerError::InUse(format!("network {name:?} still has IP groups {}: delete them first", names.join(", "))));
            }
            for a in net.families() {
                if let Some((ip, by)) = self.store.allocations(&space(name, a.subnet().is_ipv4()))?.first() {
                    return Err(ManagerError::InUse(format!("network {name:?} still has address {ip} allocated to {by}")));
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

    // ---- IP groups ----

    fn addressing_for(net: &Network, v4: bool) -> Result<&Addressing> {
        net.families().find(|a| a.subnet().is_ipv4() == v4).ok_or_else(|| {
            ManagerError::Invalid(format!("network {:?} has no {} subnet", net.spec.name, if v4 { "IPv4" } else { "IPv6" }))
        })
    }

    /// Where an allocation in `space` starts looking: each concurrent request gets the
    /// next ticket, so requests in flight on this manager try different addresses instead
    /// of racing for one.
    fn ticket(&self, space: &str, a: &Addressing) -> u128 {
        let Ok(mut c) = self.cursors.lock() else { return a.start_point() };
        let t = c.entry(space.to_string()).or_insert_with(|| a.start_point());
        let mine = *t;
        *t = t.wrapping_add(1);
        mine
    }

    /// After an allocation from ticket `t` got `ip`: skip what it found taken, or follow
    /// it back to the pools' start when it wrapped.
    fn advance(&self, space: &str, t: u128, ip: IpAddr) {
        let n = ipam::hint_of(ip);
        if n == t.wrapping_add(1) {
            return;
        }
        if let Ok(mut c) = self.cursors.lock() {
            let cur = c.entry(space.to_string()).or_insert(0);
            *cur = if n <= t { n } else { (*cur).max(n) };
        }
    }

    /// An address of `space` for `owner` from this manager's cursor, with the records `with`
    /// makes for it written in the claim's transaction ([`ipam::allocate_with`]).
    fn allocate(&self, space: &str, a: &Addressing, owner: &OwnerKey, with: With) -> Result<IpAddr, IpamError> {
        let t = self.ticket(space, a);
        let ip = ipam::allocate_with(self.store.as_ref(), space, a, owner, t, with)?;
        self.advance(space, t, ip);
        Ok(ip)
    }

    /// Reserves a group's members in the network's address space (claimed by the group).
    pub fn create_group(&self, spec: IpGroupSpec) -> Result<(IpGroupRecord, bool)> {
        self.create_group_by(spec, None)
    }

    /// [`Manager::create_group`] for `by` (a Kubernetes resource, recorded with the group in
    /// one commit) or over the API (`None`).
    pub fn create_group_by(&self, spec: IpGroupSpec, by: Option<&ManagedBy>) -> Result<(IpGroupRecord, bool)> {
        check_name("IP group", &spec.name)?;
        let (net, _) = self.network(&spec.network)?;
        let key = group_key(&spec.network, &spec.name);
        let same = |have: &IpGroupRecord| {
            have.grace_secs == spec.grace()
                && if spec.members.is_empty() { spec.size == Some(have.members.len() as u32) } else { have.members == spec.members }
        };
        if let Some((have, _)) = self.load::<IpGroupRecord>(&key)? {
            self.check_made_by(&key, "IP group", &format!("{}/{}", spec.network, spec.name), by)?;
            return if same(&have) { Ok((have, false)) } else { Err(ManagerError::Conflict(format!("IP group {:?} of network {:?} exists with other members", spec.name, spec.network))) };
        }
        let count = if spec.members.is_empty() { spec.size.unwrap_or(0) as usize } else { spec.members.len() };
        if !(1..=32).contains(&count) || (!spec.members.is_empty() && spec.size.is_some_and(|s| s as usize != count)) {
            return Err(ManagerError::Invalid("an IP group has 1-32 members: give `members`, or `size` for that many free addresses".into()));
        }
        let v4 = spec.members.first().map_or(net.ipv4.is_some(), IpAddr::is_ipv4);
        if let Some(m) = spec.members.iter().find(|m| m.is_ipv4() != v4) {
            return Err(ManagerError::Invalid(format!("IP group members are of one family: {m} is not {}", family(&spec.members[0]))));
        }
        if let Some((i, m)) = spec.members.iter().enumerate().find(|(i, m)| spec.members[..*i].contains(m)) {
            return Err(ManagerError::Invalid(format!("IP group member {m} is listed twice (position {i})")));
        }
        let a = Self::addressing_for(&net, v4)?;
        let sp = space(&spec.network, v4);
        let mut members = Vec::with_capacity(count);
        for i in 0..count {
            let owner = member_owner(&spec.name, i);
            let r = match spec.members.get(i) {
                Some(m) => ipam::allocate_fixed(self.store.as_ref(), &sp, a, &owner, *m).map_err(ManagerError::from),
                None => self.allocate(&sp, a, &owner, &nothing).map_err(ManagerError::from),
            };
            match r {
                Ok(ip) => members.push(ip),
                Err(e) => {
                    self.release_members(&sp, &spec.name, i)?;
                    return Err(e);
                }
            }
        }
        let record = IpGroupRecord { name: spec.name.clone(), network: spec.network.clone(), members, grace_secs: spec.grace() };
        let mut ops = vec![Op::create(&key, json(&record)?), Op::check(network_key(&spec.network), Cond::Version(self.network(&spec.network)?.1))];
        ops.extend(by.map(|b| b.record(&key)).transpose()?);
        if self.store.commit(&ops)? {
            return Ok((record, true));
        }
        // A concurrent create of the same group won (it holds these very claims): its record
        // is ours. Anything else: give the members back.
        match self.load::<IpGroupRecord>(&key)? {
            Some((have, _)) if have == record => Ok((have, false)),
            _ => {
                self.release_members(&sp, &spec.name, count)?;
                Err(ManagerError::Conflict(format!("IP group {:?} of network {:?} changed while being created", spec.name, spec.network)))
            }
        }
    }

    fn release_members(&self, sp: &str, group: &str, count: usize) -> Result<()> {
        for i in 0..count {
            self.store.release(sp, &member_owner(group, i))?;
        }
        Ok(())
    }

    pub fn get_group(&self, network: &str, name: &str) -> Result<IpGroupRecord> {
        self.load(&group_key(network, name))?.map(|(g, _)| g).ok_or_else(|| ManagerError::NotFound { what: "IP group", name: format!("{network}/{name}") })
    }

    /// The IP groups of `network` (every network's when empty).
    pub fn list_groups(&self, network: &str) -> Result<Vec<IpGroupRecord>> {
        let prefix = if network.is_empty() { "ipgroups/".to_string() } else { format!("ipgroups/{network}/") };
        Ok(self.load_all(&prefix)?.into_iter().map(|(g, _)| g).collect())
    }

    /// Deletes a group none of whose members a pod holds; its members go back to the network.
    /// A group a Kubernetes resource made is refused: deleting the resource deletes it.
    pub fn delete_group(&self, network: &str, name: &str) -> Result<Option<IpGroupRecord>> {
        self.delete_group_by(network, name, None)
    }

    /// [`Manager::delete_group`] for `by` (the resource that made it) or over the API.
    pub fn delete_group_by(&self, network: &str, name: &str, by: Option<&ManagedBy>) -> Result<Option<IpGroupRecord>> {
        let key = group_key(network, name);
        let Some((g, v)) = self.load::<IpGroupRecord>(&key)? else { return Ok(None) };
        let made_by = self.check_deleted_by(&key, "IP group", &format!("{network}/{name}"), by)?;
        let v4 = g.members.first().is_none_or(IpAddr::is_ipv4);
        let held = self.store.allocations(&group_space(network, v4, name))?;
        if let Some((ip, by)) = held.first() {
            return Err(ManagerError::InUse(format!("IP group {name:?} still has {} members in use ({ip} by {by})", held.len())));
        }
        let mut ops = vec![Op::delete(&key, v)];
        ops.extend(made_by);
        if !self.store.commit(&ops)? {
            return Err(ManagerError::Busy(format!("IP group {name:?} changed meanwhile")));
        }
        self.release_members(&space(network, v4), name, g.members.len())?;
        Ok(Some(g))
    }

    // ---- ports ----

    /// Creates a port: addresses (fixed, from an IP group, or the next free ones), a MAC
    /// derived from the first. The same request again returns the same port (`false`).
    pub fn create_port(&self, mut spec: PortSpec) -> Result<(Port, bool)> {
        check_name("container", &spec.container)?;
        spec.requested_mac = spec.requested_mac.as_deref().map(requested_mac).transpose()?;
        knitter_api::names::interface_name(&spec.interface).map_err(ManagerError::Invalid)?;
        if let Some(info) = &spec.device_info
            && !serde_json::from_str::<serde_json::Value>(info).is_ok_and(|v| v.is_object())
        {
            return Err(ManagerError::Invalid(format!("device_info {info:?} is not a JSON object (NPWG device-info)")));
        }
        let (net, _) = self.network(&spec.network)?;
        if !spec.pod.is_empty() {
            self.check_attachment(tenancy::pod_namespace(&spec.pod), &net.spec, &spec)?;
        }
        for (i, ip) in spec.ips.iter().enumerate() {
            if spec.ips[..i].iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
                return Err(ManagerError::Invalid(format!("at most one fixed {} address per port", family(ip))));
            }
            Self::addressing_for(&net, ip.is_ipv4())?;
        }
        let group = spec.ip_group.as_deref().map(|g| self.get_group(&spec.network, g)).transpose()?;
        let group_v4 = group.as_ref().map(|g| g.members.first().is_none_or(IpAddr::is_ipv4));
        if let Some(ip) = spec.ips.iter().find(|ip| Some(ip.is_ipv4()) == group_v4) {
            return Err(ManagerError::Invalid(format!("a fixed {} address and an IP group of that family are exclusive", family(ip))));
        }
        let key = port_key(&spec.container, &spec.interface);
        let mut pending = None;
        // One dynamic address: the claim writes the whole port in its transaction.
        let mut whole = self.single_dynamic(&net, &spec, group.as_ref());
        for _ in 0..ROUNDS {
            match self.load::<Port>(&key)? {
                // A create cut off long ago: whatever it asked for, it is nobody's now.
                Some((have, v)) if !have.is_complete() && now().saturating_sub(have.created) >= PLACEHOLDER_AGE_SECS => {
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
        let Some((mut port, v)) = pending else { return Err(ManagerError::Busy(format!("port {key} kept changing"))) };
        let owner = OwnerKey::new(&spec.container, &spec.interface);
        let claimed = self.claim_addresses(&net, &port.spec, group.as_ref(), &owner).and_then(|addresses| {
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
                self.release_addresses(&net, &port, group.as_ref(), &owner)?;
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
            self.release_addresses(&net, &port, group.as_ref(), &owner)?;
            let _ = self.store.commit(&[Op::delete(&key, v)])?;
            return Err(e);
        }
        // A retry of this very request finished first (same owner, same addresses), or a
        // delete raced the create.
        match self.load::<Port>(&key)? {
            Some((have, _)) if have.addresses == port.addresses => Ok((have, false)),
            _ => {
                self.release_addresses(&net, &port, group.as_ref(), &owner)?;
                Err(ManagerError::Conflict(format!("port {key} was deleted while being created")))
            }
        }
    }

    /// The addressing of a port that gets exactly one address, dynamic, from its network
    /// (one family, no fixed address, no IP group, no requested MAC): its claim can carry
    /// the whole record ([`Manager::create_whole`]).
    fn single_dynamic<'n>(&self, net: &'n Network, spec: &PortSpec, group: Option<&IpGroupRecord>) -> Option<&'n Addressing> {
        let mut families = net.families();
        let (Some(a), None) = (families.next(), families.next()) else { return None };
        (spec.ips.is_empty() && group.is_none() && spec.requested_mac.is_none()).then_some(a)
    }

    /// Creates `port` (its record as yet without addresses) whole in one transaction with
    /// its address's claim: it exists with its address or not at all (no placeholder to
    /// finish or sweep), one write instead of three. `None` when the record appeared
    /// meanwhile (nothing claimed).
    fn create_whole(&self, key: &str, port: &Port, a: &Addressing) -> Result<Option<Port>> {
        let owner = OwnerKey::new(&port.spec.container, &port.spec.interface);
        let whole = |ip: IpAddr| Port { addresses: vec![PortIp { address: ip, prefix: a.subnet().prefix(), gateway: a.gateway() }], mac: mac_text(ip), ..port.clone() };
        let record = |ip: IpAddr| -> Result<Vec<Op>, StoreError> {
            let v = serde_json::to_string(&whole(ip)).map_err(|e| StoreError(format!("port record: {e}")))?;
            Ok(vec![Op::create(key, v)])
        };
        match self.allocate(&space(&port.spec.network, a.subnet().is_ipv4()), a, &owner, &record) {
            Ok(ip) => Ok(Some(whole(ip))),
            Err(IpamError::RecordsChanged) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn claim_addresses(&self, net: &Network, spec: &PortSpec, group: Option<&IpGroupRecord>, owner: &OwnerKey) -> Result<Vec<PortIp>> {
        let mut out = Vec::new();
        for a in net.families() {
            let v4 = a.subnet().is_ipv4();
            let sp = space(&net.spec.name, v4);
            let fixed = spec.ips.iter().find(|ip| ip.is_ipv4() == v4);
            let ip = match (fixed, group.filter(|g| g.members.first().is_none_or(|m| m.is_ipv4() == v4))) {
                (Some(ip), _) => ipam::allocate_fixed(self.store.as_ref(), &sp, a, owner, *ip)?,
                (None, Some(g)) => {
                    let ipg = IpGroup { name: g.name.clone(), members: g.members.clone(), grace_secs: g.grace_secs };
                    ipg.allocate(self.store.as_ref(), &group_space(&net.spec.name, v4, &g.name), owner, &spec.pod, now())?
                }
                (None, None) => self.allocate(&sp, a, owner, &nothing)?,
            };
            out.push(PortIp { address: ip, prefix: a.subnet().prefix(), gateway: a.gateway() });
        }
        Ok(out)
    }

    /// Gives back whatever `owner` holds for `port` (idempotent): plain addresses to the
    /// network, a group member to its group (kept for the pod for the group's grace).
    fn release_addresses(&self, net: &Network, port: &Port, group: Option<&IpGroupRecord>, owner: &OwnerKey) -> Result<()> {
        for a in net.families() {
            let v4 = a.subnet().is_ipv4();
            self.store.release(&space(&net.spec.name, v4), owner)?;
            if let Some(g) = group.filter(|g| g.members.first().is_none_or(|m| m.is_ipv4() == v4)) {
                let ipg = IpGroup { name: g.name.clone(), members: g.members.clone(), grace_secs: g.grace_secs };
                ipg.release(self.store.as_ref(), &group_space(&net.spec.name, v4, &g.name), owner, &port.spec.pod, now())?;
            }
        }
        Ok(())
    }

    pub fn get_port(&self, container: &str, interface: &str) -> Result<Port> {
        self.load::<Port>(&port_key(container, interface))?
            .map(|(p, _)| p)
            .filter(Port::is_complete)
            .ok_or_else(|| ManagerError::NotFound { what: "port", name: format!("{container}/{interface}") })
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
    fn mac_claim(&self, spec: &PortSpec, key: &str) -> Result<Option<Op>> {
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
    fn remove_port(&self, key: &str, port: &Port, v: u64) -> Result<bool> {
        match self.network(&port.spec.network) {
            Ok((net, _)) => {
                let group = match port.spec.ip_group.as_deref().map(|g| self.get_group(&port.spec.network, g)) {
                    Some(Err(ManagerError::NotFound { .. })) | None => None,
                    Some(r) => Some(r?),
                };
                self.release_addresses(&net, port, group.as_ref(), &OwnerKey::new(&port.spec.container, &port.spec.interface))?;
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

    // ---- nodes ----

    /// Registers (or updates) a node. Refused when its underlay could not carry a network
    /// that exists, or its VTEP address is another node's.
    pub fn register_node(&self, mut node: Node) -> Result<Node> {
        check_name("node", &node.name)?;
        if node.vtep.is_unspecified() || node.vtep.is_multicast() {
            return Err(ManagerError::Invalid(format!("node {:?}: VTEP address {} is not a unicast address", node.name, node.vtep)));
        }
        if !(576..=65535).contains(&node.underlay_mtu) {
            return Err(ManagerError::Invalid(format!("node {:?}: underlay MTU {} is outside 576..=65535", node.name, node.underlay_mtu)));
        }
        let key = node_key(&node.name);
        for _ in 0..ROUNDS {
            let guard = self.guard()?;
            let nodes: Vec<(Node, u64)> = self.load_all("nodes/")?;
            if let Some((other, _)) = nodes.iter().find(|(n, _)| n.vtep == node.vtep && n.name != node.name) {
                return Err(ManagerError::Conflict(format!("VTEP address {} is node {:?}'s", node.vtep, other.name)));
            }
            for net in self.networks()? {
                let overhead = if net.spec.kind == Kind::Vxlan { self.config.limits.vxlan_overhead } else { 0 };
                if net.mtu + overhead > node.underlay_mtu {
                    return Err(ManagerError::Conflict(format!(
                        "node {:?}: underlay MTU {} cannot carry network {:?} (MTU {} + {overhead} bytes of encapsulation); raise the underlay MTU or recreate the network smaller",
                        node.name, node.underlay_mtu, net.spec.name, net.mtu
                    )));
                }
            }
            let have = nodes.iter().find(|(n, _)| n.name == node.name);
            node.registered = have.map_or_else(now, |(n, _)| n.registered);
            (node.last_seen, node.state) = (0, String::new());
            if self.store.commit(&[self.bump_guard(guard), Op::replace(&key, have.map(|(_, v)| *v), json(&node)?)])? {
                return Ok(self.with_liveness(node, &self.heartbeats()?));
            }
        }
        Err(ManagerError::Busy("nodes kept changing".into()))
    }

    /// A node with its liveness.
    pub fn get_node(&self, name: &str) -> Result<Node> {
        let (n, _) = self.load::<Node>(&node_key(name))?.ok_or_else(|| ManagerError::NotFound { what: "node", name: name.into() })?;
        Ok(self.with_liveness(n, &self.heartbeats()?))
    }

    pub fn list_nodes(&self) -> Result<Vec<Node>> {
        let seen = self.heartbeats()?;
        Ok(self.load_all("nodes/")?.into_iter().map(|(n, _)| self.with_liveness(n, &seen)).collect())
    }

    /// Forgets a node (it leaves flood lists at once); `None` if there was none.
    pub fn delete_node(&self, name: &str) -> Result<Option<Node>> {
        let Some((n, v)) = self.load::<Node>(&node_key(name))? else { return Ok(None) };
        let mut ops = vec![Op::delete(node_key(name), v)];
        if let Some(a) = self.store.get(&alive_key(name))? {
            ops.push(Op::delete(alive_key(name), a.version));
        }
        // A node deleted and made again (a reinstalled host) joins again with the
        // bootstrap token, as kubeadm's nodes do.
        if let Some(c) = self.store.get(&auth::credential_key(name))? {
            ops.push(Op::delete(auth::credential_key(name), c.version));
        }
        if self.store.commit(&ops)? { Ok(Some(n)) } else { Err(ManagerError::Busy(format!("node {name:?} changed meanwhile"))) }
    }
}

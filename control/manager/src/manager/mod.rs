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
mod clusters;
mod groups;
pub mod grpc;
mod hostports;
pub use hostports::host_port_node;
pub mod limits;
pub mod managed;
pub mod metrics;
mod networks;
pub use networks::AddressUse;
mod nodes;
pub mod objects;
mod ports;
pub mod rest;
pub mod sync;
pub mod tenancy;
mod tenants;
pub mod tls;

use crate::ipam::{self, IpamError};
use crate::network::{Kind, Limits, NetworkError};
use crate::store::{Op, OwnerKey, Store, StoreError};
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
            NetworkError::Overlap { .. } | NetworkError::SegmentTaken { .. } => {
                ManagerError::Conflict(e.to_string())
            }
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
            IpamError::Contended(_) | IpamError::RecordsChanged => {
                ManagerError::Busy(e.to_string())
            }
            _ => ManagerError::Invalid(e.to_string()),
        }
    }
}

pub type Result<T, E = ManagerError> = std::result::Result<T, E>;

/// The manager's settings that shape new objects.
#[derive(Debug, Clone, Default)]
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
    if crate::network::valid_name(name) {
        Ok(())
    } else {
        Err(ManagerError::Invalid(format!(
            "{what} {name:?} must be 1-253 characters without '/', spaces or control characters"
        )))
    }
}

fn json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| ManagerError::Store(StoreError::from(e)))
}

/// The store's format: the records' shapes (JSON under relative keys: `tenants/red`) and
/// the address spaces' names. 1 is every store so far (those from before formats were
/// numbered have no mark); a manager reads every format up to its own, migrating older ones,
/// and refuses a newer one. `tests/fixtures/store-format-1.redb` is a format 1 store each
/// version must keep reading (`tests/manager.rs`).
pub const STORE_FORMAT: u64 = 1;

/// Where the store's format is kept.
const FORMAT_KEY: &str = "meta/format";

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
    let bytes: Option<Vec<u8>> = text
        .split(':')
        .map(|b| (b.len() == 2).then(|| u8::from_str_radix(b, 16).ok()).flatten())
        .collect();
    let Some(&[a, b, c, d, e, f]) = bytes.as_deref() else {
        return bad("is not six hexadecimal bytes separated by colons");
    };
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
        m.check_format()?;
        if m.load::<Tenant>(&tenant_key(ADMIN))?.is_none() {
            m.create_tenant(ADMIN, Some(Quota { networks: 100 }))?;
        }
        Ok(m)
    }

    /// Reads the store's format ([`STORE_FORMAT`]): a store without one is format 1 and
    /// gets the mark; a newer one than this manager's is refused, before anything is read
    /// or written (a rollback must not misread what a newer manager wrote). Checked at start
    /// only: replicas of an older version that run on while a newer one migrates the store
    /// are not stopped by it (a format change is rolled out with the old replicas stopped).
    fn check_format(&self) -> Result<()> {
        let v = loop {
            if let Some(v) = self.store.get(FORMAT_KEY)? {
                break v;
            }
            // Marked by another manager meanwhile (a replica, or a newer one): read again.
            if self.store.commit(&[Op::create(FORMAT_KEY, STORE_FORMAT.to_string())])? {
                return Ok(());
            }
        };
        let format: u64 = v.value.trim().parse().map_err(|_| {
            ManagerError::Store(StoreError(format!(
                "the store's format {:?} ({FORMAT_KEY}) is not a number",
                v.value
            )))
        })?;
        if format > STORE_FORMAT {
            return Err(ManagerError::Store(StoreError(format!(
                "the store is in format {format}, newer than this knitter-manager's ({STORE_FORMAT}): run the knitter-manager that wrote it, or a newer one"
            ))));
        }
        Ok(())
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
        let t = serde_json::from_str(&v.value)
            .map_err(|e| StoreError(format!("corrupt record {key}: {e}")))?;
        Ok(Some((t, v.version)))
    }

    fn load_all<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(T, u64)>> {
        let rows = self.store.list(prefix)?;
        rows.into_iter()
            .map(|(k, v)| {
                let t = serde_json::from_str(&v.value)
                    .map_err(|e| StoreError(format!("corrupt record {k}: {e}")))?;
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
}

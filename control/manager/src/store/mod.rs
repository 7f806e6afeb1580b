//! The manager's store: one trait, two backends (embedded `redb`, etcd). Two kinds of
//! state live in it:
//! - **addresses**: the IPAM's atomic step: an address is claimed by creating its address
//!   key and its owner's key together, only if neither exists, so two allocators never hand
//!   out one address and a retried request finds the address its first attempt took;
//! - **records**: the manager's objects (tenants, networks, IP groups, ports, nodes) as JSON
//!   under relative keys (`networks/red`), each with a version (the revision of its last
//!   change), changed by [`Store::commit`]: every condition holds and every change happens,
//!   or nothing does.

pub mod embedded;
pub mod etcd;

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Who holds an address: a container's interface (as CNI names it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OwnerKey {
    pub container: String,
    pub interface: String,
}

impl OwnerKey {
    pub fn new(container: &str, interface: &str) -> OwnerKey {
        OwnerKey { container: container.into(), interface: interface.into() }
    }
}

impl std::fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.container, self.interface)
    }
}

/// An address as a key part: fixed-width hex after the family, so key order is address
/// order within a family.
pub(crate) fn ip_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("4{:08x}", u32::from(a)),
        IpAddr::V6(a) => format!("6{:032x}", u128::from(a)),
    }
}

/// The address an [`ip_key`] names.
pub(crate) fn parse_ip_key(k: &str) -> Result<IpAddr, StoreError> {
    let ip = match k.split_at_checked(1) {
        Some(("4", h)) => u32::from_str_radix(h, 16).ok().map(|n| IpAddr::V4(n.into())),
        Some(("6", h)) => u128::from_str_radix(h, 16).ok().map(|n| IpAddr::V6(n.into())),
        _ => None,
    };
    ip.ok_or_else(|| StoreError(format!("corrupt address key {k:?}")))
}

/// An owner as a stored value.
pub(crate) fn owner_value(o: &OwnerKey) -> String {
    format!("{}\0{}", o.container, o.interface)
}

pub(crate) fn parse_owner(v: &str) -> OwnerKey {
    let (c, i) = v.split_once('\0').unwrap_or((v, ""));
    OwnerKey::new(c, i)
}

pub(crate) fn parse_ip(v: &str) -> Result<IpAddr, StoreError> {
    v.parse().map_err(|_| StoreError(format!("corrupt address {v:?} in the store")))
}

/// A remembered pod as a stored value, and back.
pub(crate) fn sticky_value(pod: &str, until: u64) -> String {
    format!("{pod}\0{until}")
}

pub(crate) fn parse_sticky(v: &str) -> Result<(String, u64), StoreError> {
    let bad = || StoreError(format!("corrupt sticky record {v:?}"));
    let (pod, until) = v.rsplit_once('\0').ok_or_else(bad)?;
    Ok((pod.to_string(), until.parse().map_err(|_| bad())?))
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Both keys created: the address is the owner's now.
    Claimed,
    /// The owner already held this very address (a retry).
    AlreadyYours,
    /// The owner already holds another address of the network; nothing changed.
    OwnerHas(IpAddr),
    /// Someone else holds the address; nothing changed.
    Taken(OwnerKey),
}

/// What [`Store::claim_near`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// The address is the owner's now (or already was: a retry).
    Claimed(IpAddr),
    /// Every candidate is held.
    AllTaken,
    /// A candidate read as free was claimed by someone else first: another allocator (a
    /// request of another replica) works in the same place, and the caller does better
    /// elsewhere than racing it address by address.
    Raced,
    /// A record written with the claim was not in the state its op asked for: nothing was
    /// written, no address claimed.
    Refused,
}

/// Records to write in a claim's own transaction, made for the address claimed (a port's
/// whole record: the claim and the port exist together or not at all).
pub type With<'a> = &'a dyn Fn(IpAddr) -> Result<Vec<Op>, StoreError>;

/// No records with the claim.
pub fn nothing(_: IpAddr) -> Result<Vec<Op>, StoreError> {
    Ok(Vec::new())
}

/// A store that failed (I/O, corruption, a lost connection); never "not found".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("store: {0}")]
pub struct StoreError(pub String);

impl StoreError {
    pub fn from(e: impl std::fmt::Display) -> StoreError {
        StoreError(e.to_string())
    }
}

/// A record's value and version (the store revision that last changed it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    pub value: String,
    pub version: u64,
}

/// What must hold of a key for a commit to happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// The key does not exist.
    Absent,
    /// The key exists at exactly this version.
    Version(u64),
}

/// One step of a [`Store::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub key: String,
    pub cond: Option<Cond>,
    /// `Some`: write this value; `None` with `delete`: remove the key; neither: only check.
    pub put: Option<String>,
    pub delete: bool,
}

impl Op {
    /// Creates `key` only if it does not exist.
    pub fn create(key: impl Into<String>, value: impl Into<String>) -> Op {
        Op { key: key.into(), cond: Some(Cond::Absent), put: Some(value.into()), delete: false }
    }
    /// Writes `key` only if it is still at `version` (`None`: only if it is absent).
    pub fn replace(key: impl Into<String>, version: Option<u64>, value: impl Into<String>) -> Op {
        Op {
            key: key.into(),
            cond: Some(version.map_or(Cond::Absent, Cond::Version)),
            put: Some(value.into()),
            delete: false,
        }
    }
    /// Deletes `key` only if it is still at `version`.
    pub fn delete(key: impl Into<String>, version: u64) -> Op {
        Op { key: key.into(), cond: Some(Cond::Version(version)), put: None, delete: true }
    }
    /// Changes nothing; the commit happens only if `key` is in this state.
    pub fn check(key: impl Into<String>, cond: Cond) -> Op {
        Op { key: key.into(), cond: Some(cond), put: None, delete: false }
    }
}

/// Whether `cond` holds of a key currently at `version` (`None`: absent).
pub(crate) fn holds(cond: Option<Cond>, version: Option<u64>) -> bool {
    match cond {
        None => true,
        Some(Cond::Absent) => version.is_none(),
        Some(Cond::Version(v)) => version == Some(v),
    }
}

/// Address ownership per network, and the manager's records. Every method is atomic on
/// its own.
pub trait Store: Send + Sync {
    /// Creates `network`'s key for `ip` and `owner`'s key together, only if neither exists.
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError>;
    /// Claims for `owner` the first of `candidates` nobody holds, or returns the address the
    /// owner already holds; `None` when every candidate is taken. Backends that can look
    /// at many keys in one transaction do so; the default claims one candidate at a time.
    fn claim_first(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
    ) -> Result<Option<IpAddr>, StoreError> {
        for ip in candidates {
            match self.claim(network, ip, owner)? {
                Claim::Claimed | Claim::AlreadyYours => return Ok(Some(ip)),
                Claim::OwnerHas(held) => return Ok(Some(held)),
                Claim::Taken(_) => {}
            }
        }
        Ok(None)
    }
    /// As [`Store::claim_first`], but stops at the first race it loses ([`First::Raced`])
    /// instead of following the winner address by address, and writes the records `with`
    /// makes for the address in the claim's transaction (for an address the owner already
    /// holds too): they happen together or not at all ([`First::Refused`]).
    fn claim_near(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        with: With,
    ) -> Result<First, StoreError>;
    /// The address `owner` holds in `network`.
    fn owned(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError>;
    /// Deletes both keys of `owner`'s address, if it holds one; returns the address.
    fn release(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError>;
    /// Remembers that `pod` (namespace/name) held `ip` until `until` (Unix seconds): an IP
    /// group's address sticks to its pod for a grace period after release.
    fn remember(&self, network: &str, ip: IpAddr, pod: &str, until: u64) -> Result<(), StoreError>;
    /// Which pod `ip` is remembered for, and until when.
    fn remembered(&self, network: &str, ip: IpAddr) -> Result<Option<(String, u64)>, StoreError>;
    /// Every address of `network` and who holds it, in address order.
    fn allocations(&self, network: &str) -> Result<Vec<(IpAddr, OwnerKey)>, StoreError>;
    /// Increases with every change.
    fn revision(&self) -> Result<u64, StoreError>;
    /// The record at `key`.
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError>;
    /// Every record whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError>;
    /// Applies every op if every op's condition holds, else none; says which.
    fn commit(&self, ops: &[Op]) -> Result<bool, StoreError> {
        Ok(self.commit_at(ops)?.is_some())
    }
    /// As [`Store::commit`], returning the revision it wrote at (the version of every record
    /// it wrote), so a writer need not read its record back; `None`: a condition failed.
    fn commit_at(&self, ops: &[Op]) -> Result<Option<u64>, StoreError>;
    /// Writes the record `key` for `ttl_secs`: unless written again, it is gone after that
    /// (etcd: a lease; embedded: reads skip it and the next write replaces it).
    fn put_expiring(&self, key: &str, value: &str, ttl_secs: u64) -> Result<(), StoreError>;
    /// Returns once a record changed after revision `after` (the revision then), or when
    /// `timeout` passed (the revision now). etcd watches; the default polls.
    fn wait_change(&self, after: u64, timeout: std::time::Duration) -> Result<u64, StoreError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let rev = self.revision()?;
            if rev != after || std::time::Instant::now() >= deadline {
                return Ok(rev);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

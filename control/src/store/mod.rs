//! The manager's store: one trait, two backends (embedded `redb` here; etcd to come). The
//! IPAM's atomic step lives here: an address is claimed by creating its address key and its
//! owner's key together, only if neither exists, so two allocators never hand out one
//! address and a retried request finds the address its first attempt took.

pub mod embedded;

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

/// A store that failed (I/O, corruption, a lost connection); never "not found".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("store: {0}")]
pub struct StoreError(pub String);

impl StoreError {
    pub fn from(e: impl std::fmt::Display) -> StoreError {
        StoreError(e.to_string())
    }
}

/// Address ownership per network. Every method is atomic on its own.
pub trait Store: Send + Sync {
    /// Creates `network`'s key for `ip` and `owner`'s key together, only if neither exists.
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError>;
    /// Claims for `owner` the first of `candidates` nobody holds, or returns the address the
    /// owner already holds; `None` when every candidate is taken. Backends that can look
    /// at many keys in one transaction do so; the default claims one candidate at a time.
    fn claim_first(&self, network: &str, candidates: &mut dyn Iterator<Item = IpAddr>, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        for ip in candidates {
            match self.claim(network, ip, owner)? {
                Claim::Claimed | Claim::AlreadyYours => return Ok(Some(ip)),
                Claim::OwnerHas(held) => return Ok(Some(held)),
                Claim::Taken(_) => {}
            }
        }
        Ok(None)
    }
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
}

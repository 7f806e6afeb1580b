//! Address management for one network's subnet: parsing and checking the subnet, its
//! gateway and allocation pools, the order addresses are offered in, and the allocator that
//! claims them through a [`Store`](crate::store::Store). The store makes each claim atomic
//! (an address key and an owner key created together, or neither); this module decides which
//! addresses may be claimed: never the network or broadcast address, never the gateway or a
//! reserved one, only inside the pools.

use crate::store::{Claim, First, OwnerKey, Store, StoreError, With, nothing};
use std::net::IpAddr;

/// Why a subnet, a pool or an address was refused, or an allocation failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IpamError {
    #[error("{0:?} is not a subnet (address/prefix, e.g. 10.0.0.0/24 or 2001:db8::/64)")]
    BadCidr(String),
    #[error("subnet {cidr}: host bits are set (did you mean {network}/{prefix}?)")]
    HostBits { cidr: String, network: IpAddr, prefix: u8 },
    #[error("subnet {0} is too small to hand out addresses")]
    TooSmall(String),
    #[error("{what} {ip} is outside subnet {subnet}")]
    Outside { what: &'static str, ip: IpAddr, subnet: String },
    #[error("allocation pool {start}-{end} is empty (start after end)")]
    EmptyPool { start: IpAddr, end: IpAddr },
    #[error(
        "IPv6 allocation pool {start}-{end} spans more than one /96: ports' MACs come from the last 32 bits of their address, so a pool must stay within one /96"
    )]
    PoolTooWide { start: IpAddr, end: IpAddr },
    #[error("allocation pools {a} and {b} overlap")]
    PoolsOverlap { a: String, b: String },
    #[error("{ip} cannot be allocated: it is the subnet's {what}")]
    Reserved { ip: IpAddr, what: &'static str },
    #[error("{ip} is already allocated to {by}")]
    Taken { ip: IpAddr, by: String },
    /// What ran out: "subnet 10.0.0.0/24", "IP group \"sbc\"".
    #[error("{0} has no free address left")]
    Exhausted(String),
    /// Other allocators kept claiming the addresses this one had read as free.
    #[error("allocating in subnet {0} kept losing races to other allocators")]
    Contended(String),
    /// A record to be written with the claim changed meanwhile: nothing was claimed.
    #[error("a record written with the address changed meanwhile")]
    RecordsChanged,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A subnet: an address family, a network address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    network: IpAddr,
    prefix: u8,
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(a) => (u32::from(a) as u128, 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

fn addr(v4: bool, n: u128) -> IpAddr {
    if v4 { IpAddr::V4((n as u32).into()) } else { IpAddr::V6(n.into()) }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl std::str::FromStr for Subnet {
    type Err = IpamError;

    fn from_str(s: &str) -> Result<Subnet, IpamError> {
        let bad = || IpamError::BadCidr(s.into());
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let ip: IpAddr = a.parse().map_err(|_| bad())?;
        let prefix: u8 = p.parse().map_err(|_| bad())?;
        let (n, width) = bits(ip);
        if prefix > width {
            return Err(bad());
        }
        let sub = Subnet { network: addr(ip.is_ipv4(), n & Subnet::mask(prefix, width)), prefix };
        if sub.network != ip {
            return Err(IpamError::HostBits { cidr: s.into(), network: sub.network, prefix });
        }
        Ok(sub)
    }
}

impl Subnet {
    /// The network part of an address of `width` bits.
    fn mask(prefix: u8, width: u8) -> u128 {
        let all = if width == 32 { u32::MAX as u128 } else { u128::MAX };
        match width - prefix {
            _ if prefix == 0 => 0,
            0 => all,
            host => all & !((1u128 << host) - 1),
        }
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    fn width(&self) -> u8 {
        if self.is_ipv4() { 32 } else { 128 }
    }

    /// The first and last address of the subnet.
    fn span(&self) -> (u128, u128) {
        let (n, w) = bits(self.network);
        let host = match w - self.prefix {
            128 => u128::MAX,
            h => (1u128 << h) - 1,
        };
        (n, n | host)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.is_ipv4() {
            return false;
        }
        let (lo, hi) = self.span();
        (lo..=hi).contains(&bits(ip).0)
    }

    /// Whether two subnets share an address.
    pub fn overlaps(&self, other: &Subnet) -> bool {
        let ((a0, a1), (b0, b1)) = (self.span(), other.span());
        self.is_ipv4() == other.is_ipv4() && a0 <= b1 && b0 <= a1
    }

    /// The addresses a host may use: all but the network and (IPv4) broadcast addresses;
    /// for IPv6 all but the subnet-router anycast address (the network address).
    fn hosts(&self) -> Option<(u128, u128)> {
        let (lo, hi) = self.span();
        let (lo, hi) = match (self.is_ipv4(), self.width() - self.prefix) {
            (true, 0) | (false, 0) => return None,
            (true, 1) => (lo, hi), // a /31 point-to-point link: both usable (RFC 3021)
            (true, _) => (lo + 1, hi - 1),
            (false, _) => (lo + 1, hi),
        };
        (lo <= hi).then_some((lo, hi))
    }
}

/// An inclusive range of addresses to hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pool {
    pub start: IpAddr,
    pub end: IpAddr,
}

/// A network's addressing: its subnet, gateway, pools and reserved addresses, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addressing {
    subnet: Subnet,
    gateway: Option<IpAddr>,
    /// Inclusive ranges (as numbers), sorted, not overlapping, inside the hosts.
    pools: Vec<(u128, u128)>,
    reserved: Vec<IpAddr>,
}

impl Addressing {
    /// Checks a subnet with its gateway, pools (none: every host address) and reserved
    /// addresses.
    pub fn new(
        subnet: Subnet,
        gateway: Option<IpAddr>,
        pools: &[Pool],
        reserved: &[IpAddr],
    ) -> Result<Addressing, IpamError> {
        let (hlo, hhi) = subnet.hosts().ok_or_else(|| IpamError::TooSmall(subnet.to_string()))?;
        let inside = |what, ip: IpAddr| {
            if subnet.contains(ip) {
                Ok(bits(ip).0)
            } else {
                Err(IpamError::Outside { what, ip, subnet: subnet.to_string() })
            }
        };
        if let Some(g) = gateway {
            inside("gateway", g)?;
        }
        for r in reserved {
            inside("reserved address", *r)?;
        }
        let mut ranges = Vec::new();
        for p in pools {
            let (s, e) = (inside("pool start", p.start)?, inside("pool end", p.end)?);
            if s > e {
                return Err(IpamError::EmptyPool { start: p.start, end: p.end });
            }
            ranges.push((s.max(hlo), e.min(hhi)));
        }
        if ranges.is_empty() {
            // A large IPv6 subnet hands out its first /96 only (see `mac_for`).
            ranges.push((hlo, if subnet.is_ipv4() { hhi } else { hhi.min(hlo | 0xffff_ffff) }));
        }
        if !subnet.is_ipv4()
            && let Some(&(s, e)) = ranges.iter().find(|(s, e)| s >> 32 != e >> 32)
        {
            return Err(IpamError::PoolTooWide { start: addr(false, s), end: addr(false, e) });
        }
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 <= w[0].1 {
                let v4 = subnet.is_ipv4();
                let show = |r: (u128, u128)| format!("{}-{}", addr(v4, r.0), addr(v4, r.1));
                return Err(IpamError::PoolsOverlap { a: show(w[0]), b: show(w[1]) });
            }
        }
        Ok(Addressing { subnet, gateway, pools: ranges, reserved: reserved.to_vec() })
    }

    pub fn subnet(&self) -> Subnet {
        self.subnet
    }

    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway
    }

    /// Why `ip` may not be handed out, if it may not.
    pub fn check(&self, ip: IpAddr) -> Result<(), IpamError> {
        if !self.subnet.contains(ip) {
            return Err(IpamError::Outside {
                what: "address",
                ip,
                subnet: self.subnet.to_string(),
            });
        }
        let n = bits(ip).0;
        let (lo, hi) = self.subnet.span();
        let what = if Some(ip) == self.gateway {
            Some("gateway")
        } else if self.reserved.contains(&ip) {
            Some("reserved address")
        } else if n == lo && self.subnet.hosts().is_some_and(|h| h.0 != lo) {
            Some("network address")
        } else if n == hi && self.subnet.hosts().is_some_and(|h| h.1 != hi) {
            Some("broadcast address")
        } else {
            None
        };
        match what {
            Some(what) => Err(IpamError::Reserved { ip, what }),
            None => Ok(()),
        }
    }

    /// Every address that may be handed out, in pool order, starting after `after` (so
    /// successive allocations do not all contend for the lowest free address) and wrapping.
    pub fn candidates(&self, after: u128) -> impl Iterator<Item = IpAddr> + '_ {
        let v4 = self.subnet.is_ipv4();
        // The ranges from just after `after` to the end, then from the start up to `after`.
        let tail = self
            .pools
            .iter()
            .filter(move |p| p.1 > after)
            .map(move |&(s, e)| (s.max(after.saturating_add(1)), e));
        let head =
            self.pools.iter().filter(move |p| p.0 <= after).map(move |&(s, e)| (s, e.min(after)));
        tail.chain(head)
            .flat_map(|(s, e)| s..=e)
            .map(move |n| addr(v4, n))
            .filter(|ip| self.check(*ip).is_ok())
    }

    /// The pools' beginning, as a `candidates` start.
    pub fn start_point(&self) -> u128 {
        self.pools.first().map_or(0, |p| p.0.saturating_sub(1))
    }

    /// A random place of the pools, as a `candidates` start (uniform over their addresses).
    pub fn random_point(&self) -> u128 {
        let mut i = random_u128() % self.size().max(1);
        for &(s, e) in &self.pools {
            if i <= e - s {
                return (s + i).saturating_sub(1);
            }
            i -= e - s + 1;
        }
        0
    }

    /// How many addresses the pools hold (before reservations).
    pub fn size(&self) -> u128 {
        self.pools.iter().map(|(s, e)| e - s + 1).sum()
    }
}

/// How many candidates after the hint an allocation tries before it moves to a random place
/// of the pools.
pub const NEAR: usize = 256;

/// How many random places an allocation tries (NEAR candidates each) when it keeps finding
/// them held or losing races there, before it looks through the whole pool.
const JUMPS: usize = 8;

/// Allocates an address of `network` for `owner`: the address the owner already holds (a
/// request retried after a timeout gets the same address), or a free one, claimed atomically
/// in the store. Addresses are handed out in order from just after `hint`; where the next
/// [`NEAR`] are all held (another replica's run, a pool that wrapped, a manager new to a
/// network whose first thousands are taken) or a race for one was lost to another allocator,
/// the search moves to a random place of the pools and goes on in order from there. So
/// replicas sharing a store separate after their first collision instead of racing address
/// by address, and nobody walks a long taken run.
pub fn allocate(
    store: &dyn Store,
    network: &str,
    a: &Addressing,
    owner: &OwnerKey,
    hint: u128,
) -> Result<IpAddr, IpamError> {
    allocate_with(store, network, a, owner, hint, &nothing)
}

/// As [`allocate`], writing the records `with` makes for the address in the claim's own
/// transaction: the address and the records exist together or not at all
/// ([`IpamError::RecordsChanged`] when a record was not as its op expected).
pub fn allocate_with(
    store: &dyn Store,
    network: &str,
    a: &Addressing,
    owner: &OwnerKey,
    hint: u128,
    with: With,
) -> Result<IpAddr, IpamError> {
    let near = store.claim_near(network, &mut a.candidates(hint).take(NEAR), owner, with)?;
    match near {
        First::Claimed(ip) => return Ok(ip),
        First::Refused => return Err(IpamError::RecordsChanged),
        First::AllTaken | First::Raced => {}
    }
    let mut whole_pool_seen = near == First::AllTaken && a.size() <= NEAR as u128;
    // Random places, NEAR candidates each (a place inside a long held run is left for
    // another rather than walked); the last looks through the whole pool from its place.
    for jump in 0..=JUMPS {
        if whole_pool_seen {
            break;
        }
        let last = jump == JUMPS;
        let candidates = a.candidates(a.random_point()).take(if last { usize::MAX } else { NEAR });
        match store.claim_near(network, &mut { candidates }, owner, with)? {
            First::Claimed(ip) => return Ok(ip),
            First::Refused => return Err(IpamError::RecordsChanged),
            First::AllTaken => whole_pool_seen = last,
            First::Raced => {}
        }
    }
    // Every address is held; a retry of a request that got the last one still gets it
    // (when records were to go with it, they were not written: the caller finds out).
    match store.owned(network, owner)? {
        Some(_) if !with(a.subnet.network)?.is_empty() => Err(IpamError::RecordsChanged),
        Some(ip) => Ok(ip),
        None if whole_pool_seen => Err(IpamError::Exhausted(format!("subnet {}", a.subnet))),
        None => Err(IpamError::Contended(a.subnet.to_string())),
    }
}

/// Not for secrets: where an allocation jumps to. `RandomState` is seeded from the OS once
/// per thread and moves on with every instance.
fn random_u128() -> u128 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let (hi, lo) = (
        std::hash::RandomState::new().hash_one(nanos),
        std::hash::RandomState::new().hash_one(nanos),
    );
    (hi as u128) << 64 | lo as u128
}

/// Allocates exactly `ip` for `owner` (a fixed address, an IP group member).
pub fn allocate_fixed(
    store: &dyn Store,
    network: &str,
    a: &Addressing,
    owner: &OwnerKey,
    ip: IpAddr,
) -> Result<IpAddr, IpamError> {
    a.check(ip)?;
    match store.claim(network, ip, owner)? {
        Claim::Claimed | Claim::AlreadyYours => Ok(ip),
        Claim::OwnerHas(other) => {
            Err(IpamError::Taken { ip: other, by: format!("{owner} (it already holds {other})") })
        }
        Claim::Taken(by) => Err(IpamError::Taken { ip, by: by.to_string() }),
    }
}

/// A numeric hint from an address (for `allocate`'s starting point).
pub fn hint_of(ip: IpAddr) -> u128 {
    bits(ip).0
}

/// An IP group (Knitter's): a named set of addresses of one network. A pod naming the group
/// takes a free member; released, a member sticks to its pod (namespace/name) for `grace`
/// seconds, so a re-created pod gets its own address back even when several members restart
/// at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpGroup {
    pub name: String,
    pub members: Vec<IpAddr>,
    pub grace_secs: u64,
}

impl IpGroup {
    /// Checks every member against the network's addressing.
    pub fn new(
        name: &str,
        a: &Addressing,
        members: &[IpAddr],
        grace_secs: u64,
    ) -> Result<IpGroup, IpamError> {
        for m in members {
            a.check(*m)?;
        }
        Ok(IpGroup { name: name.into(), members: members.to_vec(), grace_secs })
    }

    /// An address of the group for `owner` of `pod` at time `now` (Unix seconds): the one it
    /// holds; else the member remembered for this pod; else a member nobody else's grace
    /// holds; else one whose grace ran out.
    pub fn allocate(
        &self,
        store: &dyn Store,
        network: &str,
        owner: &OwnerKey,
        pod: &str,
        now: u64,
    ) -> Result<IpAddr, IpamError> {
        if let Some(ip) = store.owned(network, owner)? {
            return Ok(ip);
        }
        let mut mine = Vec::new();
        let mut free = Vec::new();
        let mut expired = Vec::new();
        for ip in &self.members {
            match store.remembered(network, *ip)? {
                Some((p, _)) if p == pod => mine.push(*ip),
                Some((_, until)) if until > now => {}
                Some(_) => expired.push(*ip),
                None => free.push(*ip),
            }
        }
        let mut order = mine.into_iter().chain(free).chain(expired);
        store
            .claim_first(network, &mut order, owner)?
            .ok_or_else(|| IpamError::Exhausted(format!("IP group {:?}", self.name)))
    }

    /// Releases `owner`'s address and keeps it for `pod` for the group's grace period.
    pub fn release(
        &self,
        store: &dyn Store,
        network: &str,
        owner: &OwnerKey,
        pod: &str,
        now: u64,
    ) -> Result<Option<IpAddr>, IpamError> {
        let ip = store.release(network, owner)?;
        if let Some(ip) = ip.filter(|ip| self.members.contains(ip)) {
            store.remember(network, ip, pod, now + self.grace_secs)?;
        }
        Ok(ip)
    }
}

/// The MAC of the port that holds `ip` (`0a:58` and an IPv4 address, `0a:59` and an IPv6
/// one's last 4 bytes): for IPv6 [`Addressing::new`] refuses pools that span more than
/// those bits, so that every address's MAC is its own.
pub use knitter_api::mac::mac_for;

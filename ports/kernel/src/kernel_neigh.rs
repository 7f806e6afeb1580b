//! Next hops in the shared-address mode: the VTEP's address is the node's own, so the kernel
//! answers ARP/ND for it and resolves neighbors; the switch follows the kernel's neighbor
//! table (as OVS's tnl-neigh and VPP's linux-cp do) instead of asking itself.
//!
//! A control thread subscribes to the kernel's neighbor and route notifications (rtnetlink
//! `RTMGRP_NEIGH`, `RTMGRP_IPV4_ROUTE`, `RTMGRP_IPV6_ROUTE`): a neighbor that becomes usable
//! is copied at once into the next-hop slots of the peers behind it (which the PMD threads
//! read per frame); a route change, a new configuration, lost notifications and a periodic
//! resync (a safety net) read the whole view again. A next hop is where the kernel's
//! routing table sends the peer's address: the peer itself when it is on the underlay's link,
//! else the route's gateway (asked with `RTM_GETROUTE`, as `ip route get` does, at each full
//! read only). For a next hop the kernel does not know, it makes the kernel resolve it (a
//! zero-length UDP datagram to the peer's discard port starts ARP/ND for the route's next
//! hop), once a second, counting each as a request: the slot's timers (waiting frames given
//! up, a MAC forgotten) then work as in the dedicated mode.

use plumbing::netlink::{self, Msg, NETLINK_ROUTE, NLM_F_ACK, NLM_F_DUMP, Socket};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vswitch::Switch;
use vswitch::util::coarse_secs;
use vswitch::wire::MacAddr;

const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
/// `RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE`.
const GROUPS: u32 = 0x4 | 0x40 | 0x400;
/// How often a next hop the kernel does not know is asked for again.
const ASK_AGAIN: Duration = Duration::from_secs(1);
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTA_GATEWAY: u16 = 5;
const RTMSG_LEN: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NDMSG_LEN: usize = 12;
/// NUD states whose link-layer address can be used (REACHABLE, STALE, DELAY, PROBE,
/// NOARP, PERMANENT).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// The kernel's neighbor table of one address family: address → link-layer address, for
/// entries in a usable state.
pub fn kernel_neighbors(v4: bool) -> io::Result<HashMap<IpAddr, MacAddr>> {
    let mut sock = Socket::open(NETLINK_ROUTE)?;
    let family = if v4 { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let mut ndmsg = [0u8; NDMSG_LEN];
    ndmsg[0] = family;
    let replies = sock.request(&mut Msg::new(RTM_GETNEIGH, NLM_F_DUMP, &ndmsg))?;
    Ok(replies.iter().filter_map(|r| usable_neighbor(r, family)).collect())
}

/// A neighbor message's (address, link-layer address) when it is of address family
/// `family` (not a bridge's forwarding entry, `AF_BRIDGE`, which a kernel VXLAN device's
/// remote MACs are) and its state makes the address usable.
fn usable_neighbor(r: &[u8], family: u8) -> Option<(IpAddr, MacAddr)> {
    let (nd, attrs) = (r.get(..NDMSG_LEN)?, r.get(NDMSG_LEN..)?);
    if nd[0] != family {
        return None;
    }
    let state = u16::from_ne_bytes([nd[8], nd[9]]);
    if state & NUD_USABLE == 0 {
        return None;
    }
    let (dst, ll) = (netlink::find(attrs, NDA_DST)?, netlink::find(attrs, NDA_LLADDR)?);
    (ll.len() == 6).then(|| Some((ip_of(dst)?, MacAddr::from_bytes(ll)))).flatten()
}

/// Where the kernel's routing table sends `dst`: the gateway of its route, or `None` when
/// `dst` is on a link (or unreachable: then there is nothing to follow either).
pub fn kernel_route_gateway(dst: IpAddr) -> io::Result<Option<IpAddr>> {
    let mut sock = Socket::open(NETLINK_ROUTE)?;
    let (family, bits, addr) = match dst {
        IpAddr::V4(a) => (libc::AF_INET as u8, 32, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, 128, a.octets().to_vec()),
    };
    let mut rtmsg = [0u8; RTMSG_LEN];
    (rtmsg[0], rtmsg[1]) = (family, bits);
    let replies = match sock.request(Msg::new(RTM_GETROUTE, NLM_F_ACK, &rtmsg).attr(RTA_DST, &addr))
    {
        Ok(r) => r,
        Err(e)
            if e.raw_os_error() == Some(libc::ENETUNREACH)
                || e.raw_os_error() == Some(libc::EHOSTUNREACH) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let gateway =
        replies.iter().filter_map(|r| netlink::find(r.get(RTMSG_LEN..)?, RTA_GATEWAY)).next();
    Ok(gateway.and_then(ip_of))
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        16 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(b);
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

/// Makes the kernel resolve `ip`: a zero-length UDP datagram to its discard port.
fn kick_kernel(ip: IpAddr) -> io::Result<()> {
    let any: IpAddr =
        if ip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    UdpSocket::bind((any, 0))?.send_to(&[], (ip, 9)).map(drop)
}

/// Copies the kernel's view of the switch's next hops into its next-hop slots, once.
/// Returns how many next hops had a usable entry.
pub fn sync_once(switch: &Switch, now: u32) -> io::Result<usize> {
    Follower::default().full(switch, now)
}

/// What the follower knows between full reads: where each next hop's frames go (the route's
/// gateway, or itself), and which of those the kernel did not know.
#[derive(Default)]
struct Follower {
    /// Where frames go → the next hops that go there.
    behind: HashMap<IpAddr, Vec<IpAddr>>,
    unresolved: Vec<IpAddr>,
    /// What the last full read was for: the VTEP (its address) and the next hops (taken
    /// whole by a new configuration whose peers did not change).
    read_for: Option<(IpAddr, NextHops)>,
}

/// A snapshot's next hops and the peers behind each.
type NextHops = Arc<vswitch::util::FxMap<IpAddr, Vec<u16>>>;

impl Follower {
    /// Whether the switch's VTEP or next hops changed since the last full read (a change of
    /// anything else, a pod's port, needs no read).
    fn stale(&self, switch: &Switch) -> bool {
        let snap = switch.snapshot();
        let now = snap.vtep.as_ref().filter(|v| v.shared).map(|v| v.local);
        match (&self.read_for, now) {
            (Some((local, hops)), Some(l)) => *local != l || !Arc::ptr_eq(hops, &snap.next_hops),
            (None, None) => false,
            _ => true,
        }
    }

    /// The VTEP's address family (`AF_INET`, `AF_INET6`), 0 without a shared VTEP.
    fn family(&self) -> u8 {
        match self.read_for.as_ref().map(|r| r.0) {
            Some(IpAddr::V4(_)) => libc::AF_INET as u8,
            Some(IpAddr::V6(_)) => libc::AF_INET6 as u8,
            None => 0,
        }
    }
}

impl Follower {
    /// Reads the routes of every next hop and the neighbor table; copies what is known,
    /// asks the kernel for the rest. Returns how many next hops were known.
    fn full(&mut self, switch: &Switch, now: u32) -> io::Result<usize> {
        let snap = switch.snapshot();
        self.behind.clear();
        self.unresolved.clear();
        self.read_for = None;
        let Some(vtep) = snap.vtep.as_ref().filter(|v| v.shared) else { return Ok(0) };
        self.read_for = Some((vtep.local, snap.next_hops.clone()));
        if snap.next_hops.is_empty() {
            return Ok(0);
        }
        let table = kernel_neighbors(vtep.local.is_ipv4())?;
        let slots = switch.neighbor_table();
        let mut known = 0;
        for (nh, peers) in snap.next_hops.iter() {
            // The peer behind a router: the route's gateway is the hop whose MAC frames need.
            let via = match kernel_route_gateway(*nh) {
                Ok(gw) => gw.unwrap_or(*nh),
                Err(e) => {
                    tracing::debug!(next_hop = %nh, error = %e, "no route lookup: the peer taken as on-link");
                    *nh
                }
            };
            self.behind.entry(via).or_default().push(*nh);
            match table.get(&via) {
                Some(mac) => {
                    known += 1;
                    for p in peers {
                        slots.learn(*p, *mac, now);
                    }
                }
                None => self.unresolved.push(*nh),
            }
        }
        self.ask(switch, now);
        Ok(known)
    }

    /// A neighbor the kernel now holds usable: the peers whose next hop it is learn its MAC.
    fn neighbor(&mut self, switch: &Switch, ip: IpAddr, mac: MacAddr, now: u32) {
        let snap = switch.snapshot();
        let slots = switch.neighbor_table();
        let Some(hops) = self.behind.get(&ip) else { return };
        for nh in hops {
            for p in snap.next_hops.get(nh).into_iter().flatten() {
                slots.learn(*p, mac, now);
            }
        }
        self.unresolved.retain(|nh| !hops.contains(nh));
    }

    /// Makes the kernel resolve the next hops it did not know, once a second each (counted
    /// as a request of each peer's slot).
    fn ask(&self, switch: &Switch, now: u32) {
        let snap = switch.snapshot();
        let slots = switch.neighbor_table();
        for nh in &self.unresolved {
            // Every peer's slot counts the request (no short circuit).
            let due = snap
                .next_hops
                .get(nh)
                .into_iter()
                .flatten()
                .filter(|p| slots.request_due(**p, now))
                .count()
                > 0;
            if due && let Err(e) = kick_kernel(*nh) {
                tracing::debug!(next_hop = %nh, error = %e, "could not make the kernel resolve a next hop");
            }
        }
    }
}

/// The control thread following the kernel's neighbor and route tables for a switch, in the
/// network namespace it was started in (the underlay's); stops on drop.
pub struct KernelNeighbors {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KernelNeighbors {
    /// Starts following the kernel's notifications, with a full read every `resync` as a
    /// safety net, in the calling thread's network namespace.
    pub fn start(switch: Arc<Switch>, resync: Duration) -> io::Result<KernelNeighbors> {
        let mut sock = Socket::subscribe(NETLINK_ROUTE, GROUPS)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("knitter-neigh".into()).spawn(move || {
            let (mut f, mut warned, mut warned_read) = (Follower::default(), false, false);
            let now = Instant::now;
            let (mut full_at, mut ask_at) = (now(), now() + ASK_AGAIN);
            while !flag.load(Acquire) {
                if now() >= full_at || f.stale(&switch) {
                    let read = f.full(&switch, coarse_secs());
                    // A failed read is tried again soon: until one works, notifications have
                    // nothing to apply to.
                    let next = if read.is_ok() { resync } else { ASK_AGAIN };
                    match read {
                        Ok(_) => warned = false,
                        Err(e) if !warned => {
                            tracing::warn!(error = %e, "cannot read the kernel's neighbor table");
                            warned = true;
                        }
                        Err(_) => {}
                    }
                    (full_at, ask_at) = (now() + next, now() + ASK_AGAIN);
                } else if now() >= ask_at {
                    f.ask(&switch, coarse_secs());
                    ask_at = now() + ASK_AGAIN;
                }
                // Woken by a notification, or in time to see the stop flag, a new configuration
                // or the next deadline.
                let wait = full_at.min(ask_at).saturating_duration_since(now()).min(Duration::from_millis(100));
                let mut reread = false;
                let family = f.family();
                let got = sock.read(wait, |ty, msg| match ty {
                    RTM_NEWNEIGH => {
                        if let Some((ip, mac)) = usable_neighbor(msg, family) {
                            f.neighbor(&switch, ip, mac, coarse_secs());
                        }
                    }
                    RTM_NEWROUTE | RTM_DELROUTE => reread = true,
                    _ => {}
                });
                match got {
                    Ok(Some(lost)) if lost || reread => full_at = now(),
                    Ok(_) => warned_read = false,
                    Err(e) => {
                        if !warned_read {
                            tracing::warn!(error = %e, "rtnetlink notifications failed: the kernel's tables are read every resync only");
                            warned_read = true;
                        }
                        std::thread::sleep(wait);
                    }
                }
            }
        })?;
        Ok(KernelNeighbors { stop, thread: Some(thread) })
    }
}

impl Drop for KernelNeighbors {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

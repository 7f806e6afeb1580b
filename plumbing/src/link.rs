//! Kernel links over rtnetlink, for plumbing pods (control side, never the packet path):
//! veth pairs, moving a link into a network namespace, names, MACs, MTUs, addresses, routes,
//! and reading them back to check. Every call works in the calling thread's namespace;
//! [`in_netns`] runs a closure on a short-lived thread inside another one.

use crate::netlink::{Msg, NETLINK_ROUTE, NLM_F_ACK, NLM_F_DUMP, Socket, find, text};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_GROUP: u16 = 27;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const IFF_UP: u32 = 1;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;

/// `struct ifinfomsg`: family, type, index, flags, change.
pub(crate) fn ifinfo(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() { libc::AF_INET as u8 } else { libc::AF_INET6 as u8 }
}

fn octets(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

pub(crate) fn named(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: i32,
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub up: bool,
}

fn parse_link(reply: &[u8]) -> Option<LinkInfo> {
    let hdr = reply.get(..16)?;
    let index = i32::from_ne_bytes(hdr[4..8].try_into().ok()?);
    let flags = u32::from_ne_bytes(hdr[8..12].try_into().ok()?);
    let attrs = &reply[16..];
    let mut mac = [0u8; 6];
    if let Some(a) = find(attrs, IFLA_ADDRESS).filter(|a| a.len() == 6) {
        mac.copy_from_slice(a);
    }
    let mtu = find(attrs, IFLA_MTU)
        .and_then(|m| Some(u32::from_ne_bytes(m.get(..4)?.try_into().ok()?)))
        .unwrap_or(0);
    Some(LinkInfo {
        index,
        name: find(attrs, IFLA_IFNAME).map(text).unwrap_or("").to_string(),
        mac,
        mtu,
        up: flags & IFF_UP != 0,
    })
}

/// The link called `name`, if there is one.
pub fn link(name: &str) -> io::Result<Option<LinkInfo>> {
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut m = Msg::new(RTM_GETLINK, NLM_F_ACK, &ifinfo(0, 0, 0));
    m.str(IFLA_IFNAME, name);
    match s.request(&mut m) {
        Ok(r) => Ok(r.first().and_then(|r| parse_link(r))),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(named(e, format!("reading link {name}"))),
    }
}

pub(crate) fn index_of(name: &str) -> io::Result<i32> {
    link(name)?
        .map(|l| l.index)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no link {name}")))
}

/// Creates a veth pair `name` — `peer` in this namespace.
pub fn add_veth(name: &str, peer: &str) -> io::Result<()> {
    add_veth_to(name, None, &VethPeer { name: peer, ..Default::default() })
}

/// The far end of a veth pair as it is created: its name, namespace (an open namespace
/// file; `None`: this one), MAC and MTU.
#[derive(Debug, Default)]
pub struct VethPeer<'a> {
    pub name: &'a str,
    pub netns: Option<&'a std::fs::File>,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
}

/// Creates a veth pair `name` (with `mtu`) — `peer`, the peer made directly in its namespace
/// under its final name: moving a link between namespaces afterwards waits for RCU grace
/// periods (about 20 ms here), creating it there does not.
pub fn add_veth_to(name: &str, mtu: Option<u32>, peer: &VethPeer) -> io::Result<()> {
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &ifinfo(0, 0, 0));
    m.str(IFLA_IFNAME, name);
    if let Some(mtu) = mtu {
        m.u32(IFLA_MTU, mtu);
    }
    m.nest(IFLA_LINKINFO).str(IFLA_INFO_KIND, "veth").nest(IFLA_INFO_DATA).nest(VETH_INFO_PEER);
    // The peer's attributes follow its own ifinfomsg inside VETH_INFO_PEER.
    m.raw(&ifinfo(0, 0, 0));
    m.str(IFLA_IFNAME, peer.name);
    if let Some(ns) = peer.netns {
        m.u32(IFLA_NET_NS_FD, ns.as_raw_fd() as u32);
    }
    if let Some(mac) = peer.mac {
        m.attr(IFLA_ADDRESS, &mac);
    }
    if let Some(mtu) = peer.mtu {
        m.u32(IFLA_MTU, mtu);
    }
    m.end().end().end();
    s.request(&mut m).map(drop).map_err(|e| named(e, format!("creating veth {name}/{}", peer.name)))
}

/// Deletes link `name`; `false` when there was none (a veth's peer goes with it).
pub fn delete(name: &str) -> io::Result<bool> {
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut m = Msg::new(RTM_DELLINK, NLM_F_ACK, &ifinfo(0, 0, 0));
    m.str(IFLA_IFNAME, name);
    match s.request(&mut m) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(false),
        Err(e) => Err(named(e, format!("deleting link {name}"))),
    }
}

/// Changes link `name`: moves it into the namespace `netns` (an open namespace file), renames
/// it, sets its MAC and MTU, brings it up or down. One request; absent fields stay as they
/// are.
#[derive(Debug, Default)]
pub struct LinkChange<'a> {
    pub netns: Option<&'a std::fs::File>,
    pub rename: Option<&'a str>,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    pub up: bool,
    /// Takes the link down (ignored with `up`).
    pub down: bool,
    /// The link's group (what nftables' `iifgroup`/`oifgroup` match).
    pub group: Option<u32>,
}

pub fn change(name: &str, c: &LinkChange) -> io::Result<()> {
    let index = index_of(name)?;
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let (flags, mask) = match (c.up, c.down) {
        (true, _) => (IFF_UP, IFF_UP),
        (false, true) => (0, IFF_UP),
        (false, false) => (0, 0),
    };
    let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK, &ifinfo(index, flags, mask));
    if let Some(ns) = c.netns {
        m.u32(IFLA_NET_NS_FD, ns.as_raw_fd() as u32);
    }
    if let Some(n) = c.rename {
        m.str(IFLA_IFNAME, n);
    }
    if let Some(mac) = c.mac {
        m.attr(IFLA_ADDRESS, &mac);
    }
    if let Some(mtu) = c.mtu {
        m.u32(IFLA_MTU, mtu);
    }
    if let Some(g) = c.group {
        m.u32(IFLA_GROUP, g);
    }
    s.request(&mut m).map(drop).map_err(|e| named(e, format!("changing link {name}")))
}

/// Adds `ip/prefix` to link `name`.
pub fn add_address(name: &str, ip: IpAddr, prefix: u8) -> io::Result<()> {
    address_request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, name, ip, prefix)
        .map_err(|e| named(e, format!("adding {ip}/{prefix} to {name}")))
}

/// Removes `ip/prefix` from link `name`.
pub fn delete_address(name: &str, ip: IpAddr, prefix: u8) -> io::Result<()> {
    address_request(RTM_DELADDR, NLM_F_ACK, name, ip, prefix)
        .map_err(|e| named(e, format!("removing {ip}/{prefix} from {name}")))
}

fn address_request(kind: u16, flags: u16, name: &str, ip: IpAddr, prefix: u8) -> io::Result<()> {
    let index = index_of(name)?;
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut hdr = [0u8; 8];
    hdr[0] = family(&ip);
    hdr[1] = prefix;
    hdr[4..8].copy_from_slice(&(index as u32).to_ne_bytes());
    let mut m = Msg::new(kind, flags, &hdr);
    m.attr(IFA_LOCAL, &octets(&ip)).attr(IFA_ADDRESS, &octets(&ip));
    s.request(&mut m).map(drop)
}

/// The addresses of link `name` with their prefixes.
pub fn addresses(name: &str) -> io::Result<Vec<(IpAddr, u8)>> {
    Ok(address_entries(name)?.into_iter().map(|(ip, prefix, _)| (ip, prefix)).collect())
}

/// `ifa_flags`: duplicate address detection failed, so the kernel never uses the address.
const IFA_F_DADFAILED: u8 = 0x08;

/// The addresses of link `name` whose duplicate address detection failed (the kernel keeps
/// them, tentative, and never uses them: not as a source either).
pub fn dad_failed(name: &str) -> io::Result<Vec<(IpAddr, u8)>> {
    Ok(address_entries(name)?
        .into_iter()
        .filter(|(_, _, flags)| flags & IFA_F_DADFAILED != 0)
        .map(|(ip, prefix, _)| (ip, prefix))
        .collect())
}

/// The addresses of link `name`: each with its prefix and `ifa_flags`.
fn address_entries(name: &str) -> io::Result<Vec<(IpAddr, u8, u8)>> {
    let index = index_of(name)?;
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut m = Msg::new(RTM_GETADDR, NLM_F_DUMP, &[0u8; 8]);
    let mut out = Vec::new();
    for r in s.request(&mut m)? {
        let Some(h) = r.get(..8) else { continue };
        if u32::from_ne_bytes([h[4], h[5], h[6], h[7]]) as i32 != index {
            continue;
        }
        let prefix = h[1];
        let a = find(&r[8..], IFA_LOCAL).or_else(|| find(&r[8..], IFA_ADDRESS));
        let ip = match a {
            Some(a) if a.len() == 4 => {
                IpAddr::from(<[u8; 4]>::try_from(a).map_err(io::Error::other)?)
            }
            Some(a) if a.len() == 16 => {
                IpAddr::from(<[u8; 16]>::try_from(a).map_err(io::Error::other)?)
            }
            _ => continue,
        };
        out.push((ip, prefix, h[2]));
    }
    Ok(out)
}

/// Adds a route to `dst/prefix` (0.0.0.0/0 or ::/0: the default route) out of link `name`,
/// via `gateway` or on the link.
pub fn add_route(name: &str, dst: IpAddr, prefix: u8, gateway: Option<IpAddr>) -> io::Result<()> {
    let index = index_of(name)?;
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let scope = if gateway.is_some() { RT_SCOPE_UNIVERSE } else { RT_SCOPE_LINK };
    let hdr =
        [family(&dst), prefix, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0, 0, 0, 0];
    let mut m = Msg::new(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &hdr);
    if prefix > 0 {
        m.attr(RTA_DST, &octets(&dst));
    }
    if let Some(gw) = gateway {
        m.attr(RTA_GATEWAY, &octets(&gw));
    }
    m.u32(RTA_OIF, index as u32);
    let via = gateway.map_or(String::new(), |g| format!(" via {g}"));
    s.request(&mut m)
        .map(drop)
        .map_err(|e| named(e, format!("adding route {dst}/{prefix}{via} on {name}")))
}

/// Every link of this namespace.
pub fn links() -> io::Result<Vec<LinkInfo>> {
    let mut s = Socket::open(NETLINK_ROUTE)?;
    let mut m = Msg::new(RTM_GETLINK, NLM_F_DUMP, &ifinfo(0, 0, 0));
    Ok(s.request(&mut m)?.iter().filter_map(|r| parse_link(r)).collect())
}

/// Runs `f` on a fresh thread inside the network namespace at `path` (`/run/netns/NAME`,
/// `/proc/PID/ns/net`), so the sockets it opens live there while the caller's threads
/// stay where they are.
pub fn in_netns<R: Send + 'static>(
    path: &str,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let ns = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {path}: {e}")))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a descriptor we own; it moves only this short-lived thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

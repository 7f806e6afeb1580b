//! A pod's kernel interface: a veth pair whose host end stays with the daemon (the switch
//! attaches to it) and whose other end goes into the pod's network namespace, renamed, with
//! its MAC, MTU, addresses, routes and offloads off (frames leave the pod whole and
//! checksummed: AF_XDP in copy mode finishes nothing). Blocking (netlink); a failure
//! removes what was made.

use plumbing::link::{self, LinkChange, VethPeer};
use std::io;
use std::net::IpAddr;

/// What to make.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The host end (also the switch port's name).
    pub host: String,
    /// The pod's namespace (a path) and the interface's name there.
    pub netns: String,
    pub ifname: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addresses: Vec<(IpAddr, u8)>,
    /// (destination, prefix, gateway)
    pub routes: Vec<(IpAddr, u8, Option<IpAddr>)>,
}

/// Makes the interface; refuses when the pod already has one of that name.
pub fn plumb(p: &Plan) -> io::Result<()> {
    name_free_in_pod(&p.netns, &p.ifname)?;
    let ns = std::fs::File::open(&p.netns)
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {}: {e}", p.netns)))?;
    link::add_veth_to(
        &p.host,
        Some(p.mtu),
        &VethPeer { name: &p.ifname, netns: Some(&ns), mac: Some(p.mac), mtu: Some(p.mtu) },
    )?;
    let made = configure(p);
    if made.is_err() {
        let _ = link::delete(&p.host);
    }
    made
}

fn configure(p: &Plan) -> io::Result<()> {
    link::change(&p.host, &LinkChange { up: true, ..Default::default() })?;
    configure_in_pod(p, true)
}

/// Brings the pod's interface up with its addresses and routes, in its namespace; with
/// `offloads_off`, what a veth to AF_XDP needs (a VF keeps its NIC's offloads).
pub fn configure_in_pod(p: &Plan, offloads_off: bool) -> io::Result<()> {
    let plan = p.clone();
    link::in_netns(&p.netns, move || {
        // The IPv6 link-local address from the MAC (modified EUI-64), whatever the pod's
        // defaults: the one port security lets the pod use. No IPv6 there: nothing to set.
        let _ =
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{}/addr_gen_mode", plan.ifname), "0");
        link::change(&plan.ifname, &LinkChange { up: true, ..Default::default() })?;
        for (ip, prefix) in &plan.addresses {
            link::add_address(&plan.ifname, *ip, *prefix)?;
        }
        for (dst, prefix, gw) in &plan.routes {
            link::add_route(&plan.ifname, *dst, *prefix, *gw)?;
        }
        if offloads_off {
            plumbing::ethtool::pod_offloads_off(&plan.ifname)?;
        }
        Ok(())
    })
}

/// Refuses when the pod already has an interface called `ifname`.
pub fn name_free_in_pod(netns: &str, ifname: &str) -> io::Result<()> {
    let name = ifname.to_string();
    if link::in_netns(netns, move || link::link(&name))?.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("the pod already has an interface {ifname}"),
        ));
    }
    Ok(())
}

/// Removes the pair by its host end; `false` when it was gone already.
pub fn unplumb(host: &str) -> io::Result<bool> {
    link::delete(host)
}

/// What differs between `p` and the kernel (empty: all as planned).
pub fn verify(p: &Plan) -> Vec<String> {
    let mut problems = Vec::new();
    match link::link(&p.host) {
        Ok(Some(l)) if !l.up => problems.push(format!("host interface {} is down", p.host)),
        Ok(Some(_)) => {}
        Ok(None) => problems.push(format!("host interface {} is gone", p.host)),
        Err(e) => problems.push(e.to_string()),
    }
    problems.extend(verify_in_pod(p));
    problems
}

/// What differs between `p` and the pod's interface.
pub fn verify_in_pod(p: &Plan) -> Vec<String> {
    let mut problems = Vec::new();
    let plan = p.clone();
    let pod = link::in_netns(&p.netns, move || {
        Ok((link::link(&plan.ifname)?, link::addresses(&plan.ifname).unwrap_or_default()))
    });
    match pod {
        Err(e) => problems.push(e.to_string()),
        Ok((None, _)) => problems.push(format!("the pod has no interface {}", p.ifname)),
        Ok((Some(l), addrs)) => {
            if l.mac != p.mac {
                problems.push(format!(
                    "{} has MAC {} instead of {}",
                    p.ifname,
                    mac_text(l.mac),
                    mac_text(p.mac)
                ));
            }
            if l.mtu != p.mtu {
                problems.push(format!("{} has MTU {} instead of {}", p.ifname, l.mtu, p.mtu));
            }
            for (ip, prefix) in &p.addresses {
                if !addrs.contains(&(*ip, *prefix)) {
                    problems.push(format!("{} lacks its address {ip}/{prefix}", p.ifname));
                }
            }
        }
    }
    problems
}

pub fn mac_text(m: [u8; 6]) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

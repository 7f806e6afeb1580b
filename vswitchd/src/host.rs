//! A node's host port: the node's own interface into a bridge domain, so that the host
//! (its kubelet's probes, host-network pods, kube-proxy's Services, the way out) and the
//! pods of a network reach each other. A veth pair the daemon makes in its namespace:
//! `<ifname>` carries the node's addresses in the network, `<ifname>-sw` is the switch's
//! port (AF_XDP). Both ends have the MAC of the first address (`0a:58` and the IPv4
//! address), which the switch addresses the gateway's frames to (`GatewayConfig`).
//!
//! The rules are one nftables table per host port (`inet knitter-<ifname>`), replaced
//! whole: the host forwards from a host port only what comes from its network's subnets,
//! never routes between two host ports (each network is its tenant's: a
//! pod must not reach another network through its node), traffic kube-proxy translated
//! toward this network leaves from the node's address here (the backend may run on
//! another node, and its reply must come back through the one that translated it), and
//! with `masquerade` pods' traffic routed anywhere but back into this network leaves from
//! the node's address on the way out. Host ends are told apart from the node's other
//! interfaces by their link group, [`GROUP`].

use plumbing::link::{self, LinkChange, VethPeer};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::Duration;

/// The link group of every host end: the rules that keep networks apart match it.
pub const GROUP: u32 = 0x6b6e;

/// The switch's end of host port `ifname`.
pub fn switch_end(ifname: &str) -> String {
    format!("{ifname}-sw")
}

/// Parsed and checked host port settings.
struct Plan {
    ifname: String,
    addresses: Vec<(IpAddr, u8)>,
    mac: [u8; 6],
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

fn plan(ifname: &str, addresses: &[String]) -> io::Result<Plan> {
    knitter_api::names::host_port_name(ifname).map_err(invalid)?;
    let addresses = addresses.iter().map(|a| cidr(a)).collect::<io::Result<Vec<_>>>()?;
    let Some((first, _)) = addresses.first() else {
        return Err(invalid(
            "a host port needs the node's address in the network (addresses = [\"10.1.0.254/24\"])"
                .into(),
        ));
    };
    Ok(Plan { ifname: ifname.into(), mac: knitter_api::mac::mac_for(*first), addresses })
}

/// `10.1.0.254/24` → (address, prefix).
fn cidr(s: &str) -> io::Result<(IpAddr, u8)> {
    let bad = || {
        invalid(format!(
            "host port address {s:?} is not an address with its prefix (10.1.0.254/24)"
        ))
    };
    let (ip, prefix) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max || ip.is_unspecified() || ip.is_multicast() {
        return Err(bad());
    }
    Ok((ip, prefix))
}

/// Makes (or brings back to its settings) host port `ifname` with `mtu`, its addresses,
/// forwarding on and its table; returns whether it made the interface (and then removes it
/// again when a step fails). An interface of that name that is not a host port (no
/// `<ifname>-sw` beside it) is refused, never changed.
pub fn make(ifname: &str, addresses: &[String], mtu: u32, masquerade: bool) -> io::Result<bool> {
    let p = plan(ifname, addresses)?;
    let sw = switch_end(&p.ifname);
    let fresh = link::link(&p.ifname)?.is_none();
    if fresh {
        link::add_veth_to(
            &sw,
            Some(mtu),
            &VethPeer { name: &p.ifname, netns: None, mac: Some(p.mac), mtu: Some(mtu) },
        )?;
    } else if link::link(&sw)?.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("interface {ifname} exists and is not a host port (no {sw} beside it)"),
        ));
    }
    let made = configure(&p, &sw, mtu, masquerade);
    if made.is_err() && fresh {
        let _ = link::delete(&sw);
    }
    made.map(|()| fresh)
}

/// Two addresses of `a` and `b` whose subnets overlap, if any.
pub fn overlap(a: &[String], b: &[String]) -> Option<(String, String)> {
    let nets = |l: &[String]| {
        l.iter()
            .filter_map(|s| cidr(s).ok().map(|(ip, prefix)| (s.clone(), ip, prefix)))
            .collect::<Vec<_>>()
    };
    let within = |ip: IpAddr, net: IpAddr, prefix: u8| subnet(ip, prefix) == subnet(net, prefix);
    for (sa, ia, pa) in nets(a) {
        for (sb, ib, pb) in nets(b) {
            if ia.is_ipv4() == ib.is_ipv4() && (within(ia, ib, pb) || within(ib, ia, pa)) {
                return Some((sa, sb));
            }
        }
    }
    None
}

fn configure(p: &Plan, sw: &str, mtu: u32, masquerade: bool) -> io::Result<()> {
    // The switch's end is no host interface: with IPv6 on it would take the same link-local
    // address as the host end (the same MAC), and each end's duplicate address detection
    // would see the other's: the host end's link-local failed, and with it every neighbor
    // solicitation the node sends for traffic it forwards to a pod (their source), so pods'
    // IPv6 replies from beyond the node never came back. Before the ends come up.
    if let Err(e) = std::fs::write(format!("/proc/sys/net/ipv6/conf/{sw}/disable_ipv6"), "1") {
        tracing::warn!(port = %sw, error = %e, "IPv6 not turned off on the host port's switch end: the host end's link-local address may fail");
    }
    // The node's addresses here are its own by configuration (or the manager's IPAM): no
    // duplicate address detection holding an IPv6 one back for a second.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{}/accept_dad", p.ifname), "0");
    link::change(
        sw,
        &LinkChange { mac: Some(p.mac), mtu: Some(mtu), up: true, ..Default::default() },
    )?;
    link::change(
        &p.ifname,
        &LinkChange {
            mac: Some(p.mac),
            mtu: Some(mtu),
            up: true,
            group: Some(GROUP),
            ..Default::default()
        },
    )?;
    // Frames leave the host whole and checksummed: AF_XDP in copy mode finishes nothing.
    plumbing::ethtool::pod_offloads_off(&p.ifname)?;
    // A port an older daemon made has its link-local address failed: removed, and the
    // address the host end should have (given again if a repair was cut short) added back
    // (no detection now). The kernel may be adding it itself as the link comes up.
    for (ip, prefix) in link::dad_failed(&p.ifname)? {
        link::delete_address(&p.ifname, ip, prefix)?;
    }
    let link_local = IpAddr::V6(vswitch::wire::MacAddr(p.mac).link_local());
    if !link::addresses(&p.ifname)?.contains(&(link_local, 64)) {
        match link::add_address(&p.ifname, link_local, 64) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    let have = link::addresses(&p.ifname)?;
    // An address the port no longer has (the manager gave it another) would make the node
    // take a pod's traffic as its own once the address is a pod's. Removed first: the same
    // address with another prefix is then added anew.
    for (ip, prefix) in have.iter().filter(|a| !p.addresses.contains(a) && !is_link_local(a.0)) {
        link::delete_address(&p.ifname, *ip, *prefix)?;
    }
    for (ip, prefix) in &p.addresses {
        if !have.contains(&(*ip, *prefix)) {
            link::add_address(&p.ifname, *ip, *prefix)?;
        }
    }
    forwarding_on(p)?;
    nat(p, masquerade)
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// The host routes between its port and the rest (a node running pods has it on already).
fn forwarding_on(p: &Plan) -> io::Result<()> {
    let write = |path: &str| {
        std::fs::write(path, "1").map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
    };
    if p.addresses.iter().any(|(ip, _)| ip.is_ipv4()) {
        write("/proc/sys/net/ipv4/ip_forward")?;
    }
    if p.addresses.iter().any(|(ip, _)| ip.is_ipv6()) {
        write("/proc/sys/net/ipv6/conf/all/forwarding")?;
    }
    Ok(())
}

fn table(ifname: &str) -> String {
    format!("knitter-{ifname}")
}

/// The subnet of `ip/prefix`, as nftables writes it.
fn subnet(ip: IpAddr, prefix: u8) -> String {
    let net = match ip {
        IpAddr::V4(a) => IpAddr::V4(
            (u32::from(a) & u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0)).into(),
        ),
        IpAddr::V6(a) => IpAddr::V6(
            (u128::from(a) & u128::MAX.checked_shl(128 - prefix as u32).unwrap_or(0)).into(),
        ),
    };
    format!("{net}/{prefix}")
}

/// The host port's table, as one nftables script that replaces it whole.
fn nat_rules(p: &Plan, masquerade: bool) -> String {
    let (t, i) = (table(&p.ifname), &p.ifname);
    let subnets = |v4: bool| {
        p.addresses
            .iter()
            .filter(|(ip, _)| ip.is_ipv4() == v4)
            .map(|(ip, prefix)| subnet(*ip, *prefix))
            .collect::<Vec<_>>()
    };
    let mut forward = vec![
        // Never between two networks, either way.
        format!("iifname \"{i}\" oifgroup {GROUP} oifname != \"{i}\" drop"),
        format!("oifname \"{i}\" iifgroup {GROUP} iifname != \"{i}\" drop"),
        // Into the network, only what kube-proxy translated (Services, NodePorts) and the
        // replies to the network's own traffic: no pod of another network or CNI on the
        // node, and nothing the node's other links route here, opens a connection to its
        // pods. The node itself (kubelet probes, host-network pods) sends from its own
        // stack, not through forwarding.
        format!("oifname \"{i}\" ct state new ct status & dnat == 0 drop"),
    ];
    let mut postrouting = Vec::new();
    for (family, v4) in [("ip", true), ("ip6", false)] {
        let nets = subnets(v4);
        if nets.is_empty() {
            continue;
        }
        let set = nets.join(", ");
        // Translated toward the network (a Service): from its own pods (their backend would
        // answer them directly, switched), or toward a pod on another node (its answer
        // would leave there untranslated), the connection leaves from the node's address.
        // An outside client reaching a pod of this node keeps its address
        // (externalTrafficPolicy: Local): the pod answers through its node's gateway.
        postrouting
            .push(format!("oifname \"{i}\" ct status dnat {family} saddr {{ {set} }} masquerade"));
        postrouting.push(format!(
            "oifname \"{i}\" ct status dnat {family} daddr != @{} masquerade",
            local_set(v4)
        ));
        // A pod on a port without port security must not send the network's way out
        // another network's addresses.
        forward.push(format!("iifname \"{i}\" {family} saddr != {{ {set} }} drop"));
        if masquerade {
            postrouting.push(format!(
                "iifname \"{i}\" oifname != \"{i}\" {family} saddr {{ {set} }} masquerade"
            ));
        }
    }
    let chain = |name: &str, hook: &str, rules: &[String]| {
        format!(
            "  chain {name} {{\n    type {hook}; policy accept;\n{}  }}\n",
            rules.iter().map(|r| format!("    {r}\n")).collect::<String>()
        )
    };
    format!(
        "add table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n  set {} {{ type ipv4_addr; }}\n  set {} {{ type ipv6_addr; }}\n{}{}}}\n",
        local_set(true),
        local_set(false),
        chain("forward", "filter hook forward priority filter", &forward),
        chain("postrouting", "nat hook postrouting priority srcnat", &postrouting)
    )
}

/// The set of the addresses of the network's pods on this node, per family.
fn local_set(v4: bool) -> &'static str {
    if v4 { "local4" } else { "local6" }
}

/// Makes `addresses` the network's pods on this node in host port `ifname`'s table (those
/// a translated connection reaches without leaving the node: it keeps its client's address).
pub fn set_local(ifname: &str, addresses: &[IpAddr]) -> io::Result<()> {
    let t = table(ifname);
    let mut script = String::new();
    for v4 in [true, false] {
        let set = local_set(v4);
        script.push_str(&format!("flush set inet {t} {set}\n"));
        let members: Vec<String> =
            addresses.iter().filter(|a| a.is_ipv4() == v4).map(IpAddr::to_string).collect();
        if !members.is_empty() {
            script.push_str(&format!("add element inet {t} {set} {{ {} }}\n", members.join(", ")));
        }
    }
    nft(&script)
        .map_err(|e| io::Error::new(e.kind(), format!("host port {ifname} local pods: {e}")))
}

/// [`set_local`] on a thread of its own (the node calls it with its state locked, on every
/// pod's attach and detach: no `nft` run there). The latest set of each host port wins; one
/// that fails is tried again each second, three times.
pub fn set_local_later(ifname: &str, addresses: Vec<IpAddr>) {
    static WORKER: OnceLock<Mutex<mpsc::Sender<LocalPods>>> = OnceLock::new();
    let tx = WORKER.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("knitter-nft".into()).spawn(move || local_pods_worker(&rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for host ports' local pods: Services to them hide their clients' addresses");
        }
        Mutex::new(tx)
    });
    let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send((ifname.into(), addresses));
}

/// A host port's interface and its network's pods on the node.
type LocalPods = (String, Vec<IpAddr>);

fn local_pods_worker(rx: &mpsc::Receiver<LocalPods>) {
    let mut pending: BTreeMap<String, (Vec<IpAddr>, u32)> = BTreeMap::new();
    loop {
        let next = if pending.is_empty() {
            rx.recv().map(Some).map_err(|_| ())
        } else {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(m) => Ok(Some(m)),
                Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
            }
        };
        let Ok(next) = next else { return };
        for (ifname, addresses) in next.into_iter().chain(rx.try_iter()) {
            pending.insert(ifname, (addresses, 0));
        }
        pending.retain(|ifname, (addresses, tries)| match set_local(ifname, addresses) {
            Ok(()) => false,
            Err(e) => {
                *tries += 1;
                if *tries >= 3 {
                    tracing::warn!(host_port = %ifname, error = %e, "local pods not updated: Services to them hide their clients' addresses until the next change");
                }
                *tries < 3
            }
        });
    }
}

fn nat(p: &Plan, masquerade: bool) -> io::Result<()> {
    nft(&nat_rules(p, masquerade))
        .map_err(|e| io::Error::new(e.kind(), format!("host port {} NAT rules: {e}", p.ifname)))
}

/// Runs an nftables script (`nft -f -`).
fn nft(script: &str) -> io::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(e.kind(), format!("nft (the nftables package) did not start: {e}"))
        })?;
    // A failed write (nft gone at once) still waits for it: the answer says why.
    let wrote = child.stdin.take().map(|mut stdin| stdin.write_all(script.as_bytes()));
    let out = child.wait_with_output()?;
    wrote.transpose()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Removes host port `ifname` and its NAT table (gone already: nothing to do).
pub fn remove(ifname: &str) -> io::Result<()> {
    link::delete(&switch_end(ifname))?;
    let t = table(ifname);
    nft(&format!("add table inet {t}\ndelete table inet {t}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_reach_nftables_unquoted_are_refused() {
        for bad in ["", "knitter0-long-name", "a\"b", "a b", "0abc", "a;b", "a}b"] {
            assert!(plan(bad, &["10.1.0.254/24".into()]).is_err(), "{bad:?}");
        }
        assert!(plan("knitter0", &[]).is_err(), "an address is needed");
        for bad in ["10.1.0.254", "10.1.0.254/33", "x/24", "0.0.0.0/0", "224.0.0.1/4"] {
            assert!(plan("knitter0", &[bad.into()]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_nat_table_names_the_subnets_and_is_replaced_whole() {
        let p = plan("knitter0", &["10.1.0.254/24".into(), "fd00:1::fe/64".into()]).unwrap();
        assert_eq!(p.mac, [0x0a, 0x58, 10, 1, 0, 254]);
        let r = nat_rules(&p, true);
        assert!(
            r.starts_with("add table inet knitter-knitter0\ndelete table inet knitter-knitter0\n"),
            "{r}"
        );
        assert!(
            r.contains("oifname \"knitter0\" ct status dnat ip saddr { 10.1.0.0/24 } masquerade"),
            "a Service's hairpin: {r}"
        );
        assert!(
            r.contains("oifname \"knitter0\" ct status dnat ip6 daddr != @local6 masquerade"),
            "a backend on another node: {r}"
        );
        assert!(r.contains("set local4 { type ipv4_addr; }"), "{r}");
        assert!(
            r.contains("iifname \"knitter0\" oifgroup 27502 oifname != \"knitter0\" drop"),
            "no routing into another network: {r}"
        );
        assert!(r.contains("ip saddr != { 10.1.0.0/24 } drop"), "no other network's sources: {r}");
        assert!(
            r.contains("oifname \"knitter0\" ct state new ct status & dnat == 0 drop"),
            "only translated connections into the network: {r}"
        );
        assert!(r.contains("ip saddr { 10.1.0.0/24 } masquerade"), "{r}");
        assert!(r.contains("ip6 saddr { fd00:1::/64 } masquerade"), "{r}");
        assert!(
            !nat_rules(&p, false).lines().any(|l| l.contains("saddr {")
                && !l.contains("ct status dnat")
                && l.ends_with("masquerade")),
            "no masquerade asked for"
        );
        assert_eq!(subnet("10.1.2.3".parse().unwrap(), 0), "0.0.0.0/0");
    }

    #[test]
    fn overlapping_subnets_are_found_either_way() {
        let a = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(overlap(&a(&["10.1.0.254/24"]), &a(&["10.1.0.253/24"])).is_some());
        assert!(
            overlap(&a(&["10.1.0.254/16"]), &a(&["10.1.7.1/24"])).is_some(),
            "one inside the other"
        );
        assert!(overlap(&a(&["10.1.7.1/24"]), &a(&["10.1.0.254/16"])).is_some());
        assert!(overlap(&a(&["10.1.0.254/24"]), &a(&["10.2.0.254/24", "fd00::1/64"])).is_none());
        assert!(overlap(&a(&["fd00:1::fe/64"]), &a(&["fd00:1::fd/64"])).is_some());
    }
}

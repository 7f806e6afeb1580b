//! knitterctl: the operator's CLI. Talks to a node's knitter-vswitchd over its unix socket
//! (`node show`, `bridge`, `port`, `vtep`, `fdb`, `stats`, `apply`, `events`, `trace`) and to the
//! manager over gRPC (`manager tenant|network|ipgroup|port|node`). Human tables by
//! default, `-o json` for scripts; a refused request prints the reason and exits non-zero.

#![forbid(unsafe_code)]

/// Every line knitterctl prints goes through [`out::line`]: output into a pipe that closed
/// (`knitterctl fdb show | head -1`) ends the process quietly with status 141, as a
/// SIGPIPE would end other Unix tools. (Rust ignores SIGPIPE, so std's `println!` panics
/// there; restoring the signal would also kill it on a TLS peer that hangs up.)
macro_rules! println {
    () => { $crate::out::line(format_args!("")) };
    ($($arg:tt)*) => { $crate::out::line(format_args!($($arg)*)) };
}

mod out;

mod manager;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::error::Error as _;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(version, about = "Knitter's operator CLI", after_help = EXAMPLES)]
struct Cli {
    /// The node daemon's API socket.
    #[arg(long, global = true, env = "KNITTER_NODE_SOCKET", default_value = knitter_api::DEFAULT_NODE_SOCKET, help_heading = NODE_HEADING)]
    socket: PathBuf,
    /// Reach the daemon over TCP with TLS instead (host:port).
    #[arg(long, global = true, requires = "ca", help_heading = NODE_HEADING)]
    tcp: Option<String>,
    /// CA (PEM) the daemon's certificate must chain to (with --tcp).
    #[arg(long, global = true, help_heading = NODE_HEADING)]
    ca: Option<PathBuf>,
    /// The name in the daemon's certificate (with --tcp; default: the host of --tcp).
    #[arg(long, global = true, help_heading = NODE_HEADING)]
    server_name: Option<String>,
    /// A client certificate and key (PEM), for daemons that ask for one.
    #[arg(long, global = true, requires = "key", help_heading = NODE_HEADING)]
    cert: Option<PathBuf>,
    #[arg(long, global = true, help_heading = NODE_HEADING)]
    key: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(flatten)]
    target: manager::Target,
    #[command(subcommand)]
    cmd: Cmd,
}

const NODE_HEADING: &str = "Node daemon (node, bridge, port, vtep, fdb, apply, events, stats)";

/// Every option that reaches the node daemon (`knitterctl manager ...` hides them).
const NODE_OPTIONS: [&str; 6] = ["socket", "tcp", "ca", "server_name", "cert", "key"];

const EXAMPLES: &str = "Examples:
  knitterctl node show                                  the node on this host (its unix socket)
  knitterctl --socket /run/knitter/n2.sock fdb show     another daemon on this host
  knitterctl --tcp node2:9470 --ca ca.pem stats --queues
  knitterctl manager network list                       the manager on 127.0.0.1:9481
  knitterctl --manager 10.0.0.5:9481 --token-file token --manager-ca ca.pem manager port list --node n1
  knitterctl -o json manager node list";

const TRACE_EXAMPLES: &str = "Examples:
  knitterctl trace --port pod-a --count 5
  knitterctl trace --port pod-a --synthetic 'eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) ipv4(src=10.1.0.2,dst=10.1.0.3) udp(dst=53)'
  knitterctl trace --port uplink --synthetic 'eth(src=02:00:00:00:00:0a,dst=02:00:00:00:00:0b) ipv4(src=192.0.2.2,dst=192.0.2.1) udp(dst=4789) vxlan(vni=100) eth(src=02:00:00:00:00:03,dst=02:00:00:00:00:01) ipv4(src=10.1.0.9,dst=10.1.0.2) icmp()'";

const MANAGER_EXAMPLES: &str = "Examples:
  knitterctl manager network create red --ipv4 10.1.0.0/24 --gateway4 10.1.0.1
  knitterctl manager network create media --kind vlan --segment 100 --plane media --ipv4 10.9.0.0/24
  knitterctl manager ipgroup create red sbc --size 4 --grace 300
  knitterctl manager port list --node node1
  knitterctl manager node list
  knitterctl --manager mgr.example:9481 --manager-ca ca.pem --token-file token manager tenant list";

/// The command line, with each subcommand's help showing only the options that apply to it
/// (they stay global: they may come before or after the subcommand). A subcommand that
/// already has an argument keeps it when clap propagates the globals, so each subcommand
/// gets hidden copies of the options that do not apply to it.
fn command() -> clap::Command {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let hidden = |ids: &[&str]| -> Vec<clap::Arg> { cmd.get_arguments().filter(|a| ids.contains(&a.get_id().as_str())).map(|a| a.clone().hide(true)).collect() };
    let (node, manager) = (hidden(&NODE_OPTIONS), hidden(&manager::TARGET_OPTIONS));
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    subs.into_iter().fold(cmd, |cmd, name| {
        let copies = if name == "manager" { node.clone() } else { manager.clone() };
        cmd.mut_subcommand(name, |sc| sc.args(copies))
    })
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The manager's objects: tenants, networks, IP groups, ports, nodes (over gRPC).
    #[command(alias = "m", after_help = MANAGER_EXAMPLES)]
    Manager {
        #[command(subcommand)]
        cmd: manager::ManagerCmd,
    },
    /// The node: bridge domains, ports, VTEP, PMD threads (like `ovs-vsctl show`).
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Bridge domains.
    Bridge {
        #[command(subcommand)]
        cmd: BridgeCmd,
    },
    /// Ports.
    Port {
        #[command(subcommand)]
        cmd: PortCmd,
    },
    /// The VXLAN tunnel endpoint.
    Vtep {
        #[command(subcommand)]
        cmd: VtepCmd,
    },
    /// The forwarding table.
    Fdb {
        #[command(subcommand)]
        cmd: FdbCmd,
    },
    /// Converge the node's local objects to a topology file (the config file's bridges,
    /// ports and vtep; YAML, TOML or JSON by extension): add, change, remove.
    Apply {
        #[arg(long, short)]
        file: PathBuf,
        /// Show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Follow the node's events (ports added and removed, links up and down, vhost-user
    /// frontends connecting, configuration generations) until Ctrl-C.
    Events {
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Packet trace: what the switch does with the next frames received on a port, node by
    /// node and why (like VPP's `trace add` and OVS's `ofproto/trace`). Traced frames are
    /// forwarded as usual. With --synthetic, a made-up frame runs through the current
    /// configuration instead, and nothing is learned or sent.
    #[command(after_help = TRACE_EXAMPLES)]
    Trace {
        /// The ingress port.
        #[arg(long)]
        port: String,
        /// Frames to trace (1-256).
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Seconds to wait for them (at most 300).
        #[arg(long, default_value_t = 10)]
        timeout: u32,
        /// A frame spec, outermost layer first: eth(src=,dst=) vlan(vid=,pcp=)
        /// ipv4(src=,dst=,tos=) ipv6(src=,dst=) arp(op=,spa=,tpa=) udp(src=,dst=) tcp(...)
        /// icmp() icmpv6() vxlan(vni=) payload(len=).
        #[arg(long)]
        synthetic: Option<String>,
    },
    /// The SR-IOV PFs the node gives pods VFs from (`[sriov] pfs`), each VF with its driver,
    /// netdev and the pod interface holding it.
    Vf {
        #[command(subcommand)]
        cmd: VfCmd,
    },
    /// Counters; with --interval, repeated with rates (like `vppctl show int`).
    Stats {
        /// Seconds between reports.
        #[arg(long)]
        interval: Option<f64>,
        /// Reports to print with --interval.
        #[arg(long, default_value_t = 5)]
        count: u32,
        /// Also each port's queues.
        #[arg(long)]
        queues: bool,
    },
}

#[derive(Debug, Subcommand)]
enum VfCmd {
    /// Each PF's VFs.
    List,
}

fn print_vfs(pfs: &[pb::PhysicalFunction]) {
    if pfs.is_empty() {
        println!("no SR-IOV PFs configured ([sriov] pfs); VFs named by a device plugin are still given to pods");
    }
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    for pf in pfs {
        if !pf.problem.is_empty() {
            println!("{} ({}): {}", pf.name, dash(&pf.pci), pf.problem);
            continue;
        }
        let held = pf.vfs.iter().filter(|v| !v.attached_to.is_empty()).count();
        println!("{} ({}): {} VFs of {} possible, {held} attached", pf.name, pf.pci, pf.vfs.len(), pf.total_vfs);
        table(
            &["vf", "pci", "driver", "netdev", "attached to"],
            pf.vfs.iter().map(|v| vec![v.index.to_string(), v.pci.clone(), dash(&v.driver), dash(&v.netdev), dash(&v.attached_to)]).collect(),
        );
    }
}

fn print_traces(r: &pb::TraceReply) {
    if r.frames.is_empty() {
        println!("no frame was traced (none arrived on the port before the timeout)");
    }
    for f in &r.frames {
        let what = if f.synthetic { "synthetic frame".to_string() } else { format!("trace {} (pmd {})", f.seq, f.thread) };
        println!("{what} in port {}: {}", f.port, f.frame);
        let width = f.steps.iter().map(|s| s.node.len()).max().unwrap_or(0);
        for s in &f.steps {
            println!("  {:width$}  {}", s.node, s.detail);
        }
    }
    if r.lost > 0 {
        println!("{} traces lost (the daemon's trace queue was full)", r.lost);
    }
}

#[derive(Debug, Subcommand)]
enum NodeCmd {
    Show,
}

#[derive(Debug, Subcommand)]
enum BridgeCmd {
    /// Add a bridge domain (one per network on the node).
    Add {
        name: String,
        /// Its tag on trunk ports.
        #[arg(long)]
        vlan: Option<u32>,
        /// Its VXLAN segment.
        #[arg(long)]
        vni: Option<u32>,
        /// Remote VTEPs that get its broadcast/unknown traffic (comma-separated).
        #[arg(long, value_delimiter = ',')]
        flood: Vec<String>,
        /// Answer ARP/ND for known addresses.
        #[arg(long)]
        arp_suppression: bool,
        /// The DSCP (0-63) of its VXLAN frames' outer header (the inner ECN field copied too).
        #[arg(long)]
        dscp: Option<u32>,
        /// Its 802.1p priority (0-7) on a tagged underlay.
        #[arg(long)]
        pcp: Option<u32>,
        /// Its frames leave shared egresses (the underlay, trunks) first and wait for room
        /// rather than drop.
        #[arg(long)]
        priority: bool,
        /// Police each of its access ports without a policer of its own at this many frames
        /// a second (a network's per-pod rate).
        #[arg(long)]
        pod_pps: Option<u64>,
        /// The same in bits a second (frames as received, without L1 overhead).
        #[arg(long)]
        pod_bps: Option<u64>,
        /// Police what all its access ports send together at this many frames a second (one
        /// policer for the network on this node).
        #[arg(long)]
        police_pps: Option<u64>,
        /// The same in bits a second.
        #[arg(long)]
        police_bps: Option<u64>,
        /// A known address for ARP/ND suppression: IP=MAC (repeatable).
        #[arg(long, value_name = "IP=MAC")]
        neighbor: Vec<String>,
        /// A static MAC: MAC=PORT, or MAC=@REMOTE-VTEP-IP (repeatable).
        #[arg(long, value_name = "MAC=PORT|MAC=@IP")]
        static_mac: Vec<String>,
        /// Replace a bridge domain of this name.
        #[arg(long)]
        replace: bool,
    },
    Del {
        name: String,
    },
    List,
}

#[derive(Debug, Subcommand)]
enum PortCmd {
    /// Add a port: one device, one mode.
    Add(Box<PortAdd>),
    Del {
        name: String,
    },
    List,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("device").required(true).args(["af_xdp", "af_packet", "vhost_user", "dpdk"])))]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["access", "trunk", "underlay"])))]
struct PortAdd {
    name: String,
    /// A kernel interface, through AF_XDP.
    #[arg(long, value_name = "IFNAME")]
    af_xdp: Option<String>,
    /// A kernel interface, through AF_PACKET.
    #[arg(long, value_name = "IFNAME")]
    af_packet: Option<String>,
    /// A vhost-user socket (the switch listens; with --client it connects).
    #[arg(long, value_name = "SOCKET")]
    vhost_user: Option<String>,
    #[arg(long, requires = "vhost_user")]
    client: bool,
    /// A DPDK device: a PCI address (a NIC or VF bound to vfio-pci) or a vdev with its
    /// arguments ("net_tap0,iface=dtap0").
    #[arg(long, value_name = "DEVARGS")]
    dpdk: Option<String>,
    /// rx/tx queue pairs of a DPDK device (RSS over them).
    #[arg(long, requires = "dpdk")]
    queues: Option<u32>,
    /// The mode bits (octal, e.g. 0660) of a socket the switch listens on.
    #[arg(long, requires = "vhost_user", value_parser = octal)]
    socket_mode: Option<u32>,
    /// The owner and group (numeric) of a socket the switch listens on.
    #[arg(long, requires = "vhost_user")]
    socket_owner: Option<u32>,
    #[arg(long, requires = "vhost_user")]
    socket_group: Option<u32>,
    /// The kernel interface's network namespace (as in /run/netns).
    #[arg(long)]
    netns: Option<String>,
    /// Untagged member of this bridge domain.
    #[arg(long, value_name = "BRIDGE")]
    access: Option<String>,
    /// Tagged member of the bridge domains with these VLANs (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "VLANS")]
    trunk: Option<Vec<u32>>,
    /// The untagged VLAN of a trunk.
    #[arg(long, requires = "trunk")]
    native: Option<u32>,
    /// Carries the VTEP's VXLAN traffic.
    #[arg(long)]
    underlay: bool,
    #[arg(long)]
    mtu: Option<u32>,
    /// Port security: the pod's MAC (with --ip, its addresses).
    #[arg(long)]
    mac: Option<String>,
    #[arg(long, requires = "mac")]
    ip: Vec<String>,
    /// Ingress policing: at most this many packets a second (frames over it are dropped and
    /// counted as `policed`).
    #[arg(long, value_name = "PPS")]
    police_pps: Option<u64>,
    /// Ingress policing: at most this many bits a second (frames as received, without L1
    /// overhead).
    #[arg(long, value_name = "BPS")]
    police_bps: Option<u64>,
    /// The policer's burst in packets (default 10 ms of the rate, at least 64).
    #[arg(long, value_name = "PACKETS")]
    police_burst_packets: Option<u64>,
    /// The policer's burst in bytes (default 10 ms of the rate, at least two largest frames).
    #[arg(long, value_name = "BYTES")]
    police_burst_bytes: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum VtepCmd {
    /// Set the VTEP.
    Set {
        /// Its underlay address.
        #[arg(long)]
        local: String,
        /// The underlay port.
        #[arg(long)]
        underlay: String,
        /// Remote VTEPs (resolved with ARP/ND; comma-separated).
        #[arg(long, value_delimiter = ',')]
        peer: Vec<String>,
        /// The underlay's 802.1Q VLAN.
        #[arg(long)]
        vlan: Option<u32>,
        /// The address is the node's own (its kernel answers ARP/ND).
        #[arg(long)]
        shared: bool,
    },
    Clear,
    Show,
}

#[derive(Debug, Subcommand)]
enum FdbCmd {
    Show {
        #[arg(long)]
        bridge: Option<String>,
    },
    /// Remove learned entries of a bridge domain or a port.
    Flush {
        #[arg(long, conflicts_with = "port", required_unless_present = "port")]
        bridge: Option<String>,
        #[arg(long)]
        port: Option<String>,
    },
}

/// Prints rows as aligned columns.
pub(crate) fn table(head: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<0$}", w[i])).collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(head.iter().map(|h| h.to_uppercase()).collect());
    rows.into_iter().for_each(line);
}

pub(crate) fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn owner(o: i32) -> &'static str {
    match pb::Owner::try_from(o) {
        Ok(pb::Owner::Manager) => "manager",
        Ok(pb::Owner::Attach) => "attach",
        _ => "local",
    }
}

fn device(d: &Option<pb::Device>) -> String {
    use pb::device::Kind;
    let ns = |n: &str| if n.is_empty() { String::new() } else { format!(" (netns {n})") };
    match d.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::AfXdp(k)) => format!("af_xdp {}{}", k.ifname, ns(&k.netns)),
        Some(Kind::AfPacket(k)) => format!("af_packet {}{}", k.ifname, ns(&k.netns)),
        Some(Kind::VhostUser(v)) => format!("vhost-user {}{}", v.socket, if v.client { " (client)" } else { "" }),
        Some(Kind::Dpdk(d)) if d.queues > 1 => format!("dpdk {} ({} queues)", d.devargs, d.queues),
        Some(Kind::Dpdk(d)) => format!("dpdk {}", d.devargs),
        None => "-".into(),
    }
}

fn mode(p: &pb::Port) -> String {
    use pb::port::Mode;
    match &p.mode {
        Some(Mode::Access(a)) => format!("access {}", a.bridge),
        Some(Mode::Trunk(t)) => {
            let v: Vec<String> = t.allowed.iter().map(|v| v.to_string()).collect();
            format!("trunk {}{}", v.join(","), t.native.map(|n| format!(" native {n}")).unwrap_or_default())
        }
        Some(Mode::Underlay(_)) => "underlay".into(),
        None => "-".into(),
    }
}

fn print_bridges(b: &[pb::Bridge]) {
    table(
        &["name", "vlan", "vni", "flood", "arp-suppression", "marking", "owner", "policer", "pod policer"],
        b.iter()
            .map(|b| {
                vec![
                    b.name.clone(),
                    opt(b.vlan),
                    opt(b.vni),
                    if b.flood.is_empty() { "-".into() } else { b.flood.join(",") },
                    if b.arp_suppression { "on" } else { "off" }.into(),
                    match (b.dscp, b.pcp, b.priority) {
                        (None, None, false) => "-".into(),
                        (d, p, first) => format!("dscp {} pcp {}{}", d.unwrap_or(0), p.unwrap_or(0), if first { " priority" } else { "" }),
                    },
                    owner(b.owner).into(),
                    policer(b.policer.as_ref()),
                    policer(b.pod_policer.as_ref()),
                ]
            })
            .collect(),
    );
}

fn print_ports(p: &[pb::Port], status: &[pb::PortStatus]) {
    table(
        &["name", "device", "mode", "mtu", "link", "owner", "policer"],
        p.iter()
            .map(|p| {
                let s = status.iter().find(|s| s.name == p.name);
                let link = match s {
                    Some(s) if !s.error.is_empty() => format!("not running: {}", s.error),
                    Some(s) if !s.ring_error.is_empty() => format!("error: {}", s.ring_error),
                    Some(s) if s.vhost_connected == Some(false) => "waiting for the frontend".into(),
                    Some(s) if s.link_up => "up".into(),
                    Some(_) => "down".into(),
                    None => "?".into(),
                };
                let link = match s {
                    Some(s) if !s.fallback.is_empty() => format!("{link}, on AF_PACKET: {}", s.fallback),
                    _ => link,
                };
                vec![p.name.clone(), device(&p.device), mode(p), opt(p.mtu), link, owner(p.owner).into(), policer(p.policer.as_ref())]
            })
            .collect(),
    );
}

/// A policer's rates, as `knitterctl port add` takes them ("-": none).
fn policer(p: Option<&pb::Policer>) -> String {
    let Some(p) = p else { return "-".into() };
    let mut parts = Vec::new();
    if p.pps > 0 {
        parts.push(format!("{} pps", p.pps));
    }
    if p.bps > 0 {
        parts.push(format!("{} bps", p.bps));
    }
    parts.join(", ")
}

fn print_vtep(v: &pb::Vtep) {
    let peers: Vec<&str> = v.peers.iter().map(|p| p.ip.as_str()).collect();
    println!(
        "vtep {} on {}{}, udp {}, peers {}{} ({})",
        v.local_ip,
        v.underlay_port,
        v.underlay_vlan.map(|t| format!(" vlan {t}")).unwrap_or_default(),
        opt(v.udp_port),
        if peers.is_empty() { "-".into() } else { peers.join(",") },
        if v.shared_address { ", the node's own address" } else { "" },
        owner(v.owner),
    );
}

/// Each peer's next hop: resolved (and how fresh), or not (and how many requests went
/// unanswered: its frames are being dropped as `neighbor_unresolved`).
fn print_peers(peers: &[pb::PeerStatus]) {
    for p in peers {
        let state = match (&p.next_hop_mac, p.confirmed_secs_ago) {
            (Some(m), Some(s)) => format!("next hop {m}, confirmed {s}s ago"),
            (Some(m), None) => format!("next hop {m}"),
            (None, _) => format!("unresolved ({} requests unanswered)", p.unanswered),
        };
        println!("  peer {}: {state}", p.ip);
    }
}

pub(crate) fn json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|_| format!("{s:?} is not an octal mode such as 0660"))
}

fn port_request(a: PortAdd) -> pb::Port {
    use pb::device::Kind;
    use pb::port::Mode;
    let netns = a.netns.unwrap_or_default();
    let kind = match (a.af_xdp, a.af_packet, a.vhost_user) {
        _ if a.dpdk.is_some() => Kind::Dpdk(pb::DpdkDevice { devargs: a.dpdk.unwrap_or_default(), queues: a.queues.unwrap_or(0) }),
        (Some(i), _, _) => Kind::AfXdp(pb::KernelPort { ifname: i, netns }),
        (_, Some(i), _) => Kind::AfPacket(pb::KernelPort { ifname: i, netns }),
        (_, _, s) => Kind::VhostUser(pb::VhostUser { socket: s.unwrap_or_default(), client: a.client, mode: a.socket_mode, owner: a.socket_owner, group: a.socket_group }),
    };
    let mode = match (a.access, a.trunk) {
        (Some(b), _) => Mode::Access(pb::Access { bridge: b }),
        (_, Some(allowed)) => Mode::Trunk(pb::Trunk { allowed, native: a.native }),
        _ => Mode::Underlay(pb::Underlay {}),
    };
    pb::Port {
        name: a.name,
        device: Some(pb::Device { kind: Some(kind) }),
        mode: Some(mode),
        mtu: a.mtu,
        security: a.mac.map(|m| pb::PortSecurity { macs: vec![m], ips: a.ip, ..Default::default() }),
        policer: (a.police_pps.is_some() || a.police_bps.is_some() || a.police_burst_packets.is_some() || a.police_burst_bytes.is_some()).then(|| {
            pb::Policer {
                pps: a.police_pps.unwrap_or(0),
                bps: a.police_bps.unwrap_or(0),
                burst_packets: a.police_burst_packets.unwrap_or(0),
                burst_bytes: a.police_burst_bytes.unwrap_or(0),
            }
        }),
        ..Default::default()
    }
}

async fn stats(c: &mut NodeClient<Channel>, out: Output, interval: Option<f64>, count: u32, queues: bool) -> Result<()> {
    let mut prev: Option<pb::StatsReply> = None;
    let reports = if interval.is_some() { count.max(1) } else { 1 };
    for i in 0..reports {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs_f64(interval.unwrap_or(1.0))).await;
        }
        let s = c.stats(pb::StatsRequest {}).await?.into_inner();
        if out == Output::Json {
            json(&s)?;
            prev = Some(s);
            continue;
        }
        let rate = |now: u64, name: &str, f: fn(&pb::PortStatus) -> u64| -> String {
            let Some(p) = &prev else { return "-".into() };
            let secs = (s.at_unix_nanos.saturating_sub(p.at_unix_nanos)) as f64 / 1e9;
            let before = p.ports.iter().find(|x| x.name == name).map(f).unwrap_or(0);
            if secs > 0.0 { format!("{:.0}", now.saturating_sub(before) as f64 / secs) } else { "-".into() }
        };
        table(
            &["port", "rx packets", "rx bytes", "tx packets", "tx bytes", "drops", "policed", "rx pps", "tx pps"],
            s.ports
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.rx_packets.to_string(),
                        p.rx_bytes.to_string(),
                        p.tx_packets.to_string(),
                        p.tx_bytes.to_string(),
                        p.drops.to_string(),
                        p.policed.to_string(),
                        rate(p.rx_packets, &p.name, |x| x.rx_packets),
                        rate(p.tx_packets, &p.name, |x| x.tx_packets),
                    ]
                })
                .collect(),
        );
        if s.ports.iter().any(|p| p.tx_priority + p.priority_held + p.priority_dropped > 0) {
            println!();
            table(
                &["port", "tx priority", "tx ordinary", "priority held", "priority dropped"],
                s.ports
                    .iter()
                    .filter(|p| p.tx_priority + p.priority_held + p.priority_dropped > 0)
                    .map(|p| {
                        vec![
                            p.name.clone(),
                            p.tx_priority.to_string(),
                            p.tx_packets.saturating_sub(p.tx_priority).to_string(),
                            p.priority_held.to_string(),
                            p.priority_dropped.to_string(),
                        ]
                    })
                    .collect(),
            );
        }
        if queues {
            println!();
            table(
                &["port", "queue", "rx packets", "rx dropped", "rx starved", "rx lent", "tx packets", "tx full", "tx dropped", "rx gso", "rx csum"],
                s.ports
                    .iter()
                    .flat_map(|p| {
                        p.queues.iter().map(|q| {
                            vec![
                                p.name.clone(),
                                q.queue.to_string(),
                                q.rx_packets.to_string(),
                                q.rx_dropped.to_string(),
                                q.rx_starved.to_string(),
                                q.rx_lent.to_string(),
                                q.tx_packets.to_string(),
                                q.tx_full.to_string(),
                                q.tx_dropped.to_string(),
                                q.rx_gso.to_string(),
                                q.rx_csum.to_string(),
                            ]
                        })
                    })
                    .collect(),
            );
        }
        println!();
        table(
            &["bridge", "packets", "flooded", "learned", "fdb entries", "policed"],
            s.bridges
                .iter()
                .map(|b| vec![b.name.clone(), b.packets.to_string(), b.flooded.to_string(), b.learned.to_string(), b.fdb_entries.to_string(), b.policed.to_string()])
                .collect(),
        );
        println!();
        table(
            &["pmd", "packets", "busy cycles", "idle cycles", "cycles/packet"],
            s.pmds
                .iter()
                .map(|p| {
                    vec![
                        p.thread.to_string(),
                        p.packets.to_string(),
                        p.busy_cycles.to_string(),
                        p.idle_cycles.to_string(),
                        format!("{:.0}", p.cycles_per_packet),
                    ]
                })
                .collect(),
        );
        if !s.drops.is_empty() {
            println!();
            table(&["node", "drop reason", "count"], s.drops.iter().map(|d| vec![d.node.clone(), d.name.clone(), d.value.to_string()]).collect());
        }
        if !s.events.is_empty() {
            println!();
            table(&["node", "event", "count"], s.events.iter().map(|d| vec![d.node.clone(), d.name.clone(), d.value.to_string()]).collect());
        }
        if i + 1 < reports {
            println!("--");
        }
        prev = Some(s);
    }
    Ok(())
}

/// The client for where the daemon is: its unix socket, or TCP with TLS.
fn client(cli: &Cli) -> Result<NodeClient<Channel>> {
    let Some(addr) = &cli.tcp else { return Ok(knitter_api::node_client(&cli.socket)) };
    let identity = cli.cert.as_deref().zip(cli.key.as_deref());
    let tls = knitter_api::ClientTls::read(addr, cli.ca.as_deref().context("--tcp needs --ca")?, cli.server_name.as_deref(), identity)?;
    Ok(NodeClient::new(knitter_api::tls_channel(addr, tls)?))
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn run(cli: Cli) -> Result<()> {
    let mut c = client(&cli)?;
    let out = cli.output;
    let applied = |a: pb::Applied| -> Result<()> {
        if out == Output::Json {
            return json(&a);
        }
        println!("ok (configuration generation {})", a.generation);
        Ok(())
    };
    match cli.cmd {
        Cmd::Node { cmd: NodeCmd::Show } => {
            let v = c.show(pb::ShowRequest {}).await?.into_inner();
            if out == Output::Json {
                return json(&v);
            }
            println!(
                "knitter-vswitchd {}: configuration generation {}, {} PMD thread(s), idle {}, buffers {}/{} free{} ({} lent to receive rings{}), FDB {}/{} entries, cache {} entries per thread",
                v.version,
                v.generation,
                v.pmd_threads,
                v.idle_policy,
                v.buffers_free,
                v.buffers,
                if v.hugepages { " (hugepages)" } else { "" },
                v.buffers_lent,
                match v.pool_sized_for_pods {
                    0 => String::new(),
                    n => format!("; sized for {n} pod ports"),
                },
                v.fdb_entries,
                v.fdb_capacity,
                v.emc_entries
            );
            // Ports whose receive buffers ran out with the pool empty (frames were lost).
            let starved: Vec<String> = v
                .status
                .iter()
                .filter_map(|p| {
                    let n: u64 = p.queues.iter().map(|q| q.rx_starved).sum();
                    (n > 0).then(|| format!("{} ({n}×)", p.name))
                })
                .collect();
            if !starved.is_empty() {
                println!("buffers ran out on: {} (raise --buffers or --pods; knitterctl stats --queues)", starved.join(", "));
            }
            // Ports lending receive buffers (AF_XDP) beyond what the pool was sized for: the
            // later ones got smaller rings, and traffic may starve them.
            let lending = v.status.iter().filter(|p| p.queues.iter().any(|q| q.rx_lent > 0)).count();
            if v.pool_sized_for_pods > 0 && lending > v.pool_sized_for_pods as usize + 1 {
                println!(
                    "the buffer pool was sized for {} pod ports and {lending} ports lend from it (raise --pods or [pool] pods)",
                    v.pool_sized_for_pods
                );
            }
            match &v.vtep {
                Some(t) => print_vtep(t),
                None => println!("vtep: none"),
            }
            println!();
            print_bridges(&v.bridges);
            println!();
            print_ports(&v.ports, &v.status);
        }
        Cmd::Bridge { cmd } => match cmd {
            BridgeCmd::Add { name, vlan, vni, flood, arp_suppression, dscp, pcp, priority, pod_pps, pod_bps, police_pps, police_bps, neighbor, static_mac, replace } => {
                let pair = |s: &str, what: &str| -> Result<(String, String)> {
                    let (a, b) = s.split_once('=').with_context(|| format!("{what} {s:?}: expected A=B"))?;
                    Ok((a.to_string(), b.to_string()))
                };
                let neighbors = neighbor
                    .iter()
                    .map(|n| pair(n, "--neighbor").map(|(ip, mac)| pb::Neighbor { ip, mac }))
                    .collect::<Result<_>>()?;
                let static_macs = static_mac
                    .iter()
                    .map(|m| {
                        let (mac, to) = pair(m, "--static-mac")?;
                        Ok(match to.strip_prefix('@') {
                            Some(ip) => pb::StaticMac { mac, port: None, remote: Some(ip.into()) },
                            None => pb::StaticMac { mac, port: Some(to), remote: None },
                        })
                    })
                    .collect::<Result<_>>()?;
                let rates = |pps: Option<u64>, bps: Option<u64>| {
                    (pps.is_some() || bps.is_some()).then(|| pb::Policer { pps: pps.unwrap_or(0), bps: bps.unwrap_or(0), ..Default::default() })
                };
                let (pod_policer, policer) = (rates(pod_pps, pod_bps), rates(police_pps, police_bps));
                let bridge =
                    pb::Bridge { name, vlan, vni, flood, arp_suppression, neighbors, static_macs, dscp, pcp, priority, pod_policer, policer, ..Default::default() };
                applied(c.add_bridge(pb::AddBridgeRequest { bridge: Some(bridge), replace }).await?.into_inner())?
            }
            BridgeCmd::Del { name } => applied(c.delete_bridge(pb::DeleteRequest { name, owner: 0 }).await?.into_inner())?,
            BridgeCmd::List => {
                let l = c.list_bridges(pb::ListRequest {}).await?.into_inner();
                if out == Output::Json { json(&l)? } else { print_bridges(&l.bridges) }
            }
        },
        Cmd::Port { cmd } => match cmd {
            PortCmd::Add(a) => applied(c.add_port(pb::AddPortRequest { port: Some(port_request(*a)) }).await?.into_inner())?,
            PortCmd::Del { name } => applied(c.delete_port(pb::DeleteRequest { name, owner: 0 }).await?.into_inner())?,
            PortCmd::List => {
                let l = c.list_ports(pb::ListRequest {}).await?.into_inner();
                if out == Output::Json {
                    json(&l)?
                } else {
                    let status = c.show(pb::ShowRequest {}).await?.into_inner().status;
                    print_ports(&l.ports, &status)
                }
            }
        },
        Cmd::Vtep { cmd } => match cmd {
            VtepCmd::Set { local, underlay, peer, vlan, shared } => {
                let vtep = pb::Vtep {
                    local_ip: local,
                    underlay_port: underlay,
                    underlay_vlan: vlan,
                    peers: peer.into_iter().map(|ip| pb::Peer { ip, ..Default::default() }).collect(),
                    shared_address: shared,
                    ..Default::default()
                };
                applied(c.set_vtep(pb::SetVtepRequest { vtep: Some(vtep) }).await?.into_inner())?
            }
            VtepCmd::Clear => applied(c.clear_vtep(pb::ClearVtepRequest { owner: 0 }).await?.into_inner())?,
            VtepCmd::Show => {
                let view = c.show(pb::ShowRequest {}).await?.into_inner();
                match (out, &view.vtep) {
                    (Output::Json, v) => json(&serde_json::json!({ "vtep": v, "peers": view.peers }))?,
                    (_, Some(v)) => {
                        print_vtep(v);
                        print_peers(&view.peers);
                    }
                    (_, None) => println!("vtep: none"),
                }
            }
        },
        Cmd::Fdb { cmd: FdbCmd::Show { bridge } } => {
            let f = c.fdb_dump(pb::FdbRequest { bridge: bridge.unwrap_or_default() }).await?.into_inner();
            if out == Output::Json {
                return json(&f);
            }
            table(
                &["bridge", "mac", "dest", "type", "age"],
                f.entries
                    .iter()
                    .map(|e| {
                        let age = if e.is_static { "-".into() } else { format!("{}s", e.age_secs) };
                        vec![e.bridge.clone(), e.mac.clone(), e.dest.clone(), if e.is_static { "static" } else { "learned" }.into(), age]
                    })
                    .collect(),
            );
        }
        Cmd::Fdb { cmd: FdbCmd::Flush { bridge, port } } => {
            let r = c.fdb_flush(pb::FdbFlushRequest { bridge: bridge.unwrap_or_default(), port: port.unwrap_or_default() }).await?;
            let r = r.into_inner();
            if out == Output::Json { json(&r)? } else { println!("{} entries removed", r.removed) }
        }
        Cmd::Apply { file, dry_run } => {
            let document = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let format = file.extension().and_then(|e| e.to_str()).unwrap_or("yaml").to_string();
            let r = c.apply(pb::ApplyRequest { document, format, dry_run }).await?.into_inner();
            if out == Output::Json {
                return json(&r);
            }
            let verb = if dry_run { "would be " } else { "" };
            for (what, list) in [("added", &r.added), ("changed", &r.changed), ("removed", &r.removed)] {
                for o in list {
                    println!("{o}: {verb}{what}");
                }
            }
            if r.added.is_empty() && r.changed.is_empty() && r.removed.is_empty() {
                println!("nothing to change (configuration generation {})", r.generation);
            } else if !dry_run {
                println!("ok (configuration generation {})", r.generation);
            }
        }
        Cmd::Vf { cmd: VfCmd::List } => {
            anyhow::ensure!(cli.tcp.is_none(), "the node's VFs are shown over its unix socket (--socket), where its attach API is");
            let mut a = knitter_api::node::attach_client::AttachClient::new(knitter_api::unix_channel(&cli.socket));
            let r = a.query_node_networks(pb::QueryNodeNetworksRequest {}).await?.into_inner();
            if out == Output::Json { json(&r.pfs)? } else { print_vfs(&r.pfs) }
        }
        Cmd::Stats { interval, count, queues } => stats(&mut c, out, interval, count, queues).await?,
        Cmd::Trace { port, count, timeout, synthetic } => {
            let req = pb::TraceRequest { port, count, timeout_ms: timeout.saturating_mul(1000), synthetic: synthetic.unwrap_or_default() };
            let r = c.trace(req).await?.into_inner();
            if out == Output::Json {
                return json(&r);
            }
            print_traces(&r);
        }
        Cmd::Manager { .. } => unreachable!("manager commands run in main"),
        Cmd::Events { count } => {
            let mut stream = c.events(pb::EventsRequest {}).await?.into_inner();
            let mut seen = 0;
            while count.is_none_or(|n| seen < n) {
                let Some(e) = stream.message().await? else { break };
                seen += 1;
                if out == Output::Json {
                    println!("{}", serde_json::to_string(&e)?);
                } else {
                    let secs = e.at_unix_nanos / 1_000_000_000;
                    let (h, m, s, ms) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60, (e.at_unix_nanos / 1_000_000) % 1000);
                    let port = if e.port.is_empty() { "-" } else { e.port.as_str() };
                    println!("{h:02}:{m:02}:{s:02}.{ms:03} UTC  {:<15} {port:<12} {}", e.kind, e.detail);
                }
            }
        }
    }
    Ok(())
}

fn main() {
    use clap::FromArgMatches;
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    let socket = match &cli.tcp {
        Some(addr) => PathBuf::from(addr),
        None => cli.socket.clone(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("knitterctl: {e}");
            std::process::exit(1);
        }
    };
    let (what, target, result) = match cli.cmd {
        Cmd::Manager { cmd } => {
            let t = cli.target.manager.clone();
            ("knitter-manager", t.clone(), rt.block_on(manager::run(&cli.target, cli.output, cmd)).with_context(|| format!("manager API at {t}")))
        }
        _ => ("knitter-vswitchd", socket.display().to_string(), rt.block_on(run(cli)).with_context(|| format!("node API at {}", socket.display()))),
    };
    if let Err(e) = result {
        match e.chain().find_map(|c| c.downcast_ref::<tonic::Status>()) {
            Some(s) if s.code() == tonic::Code::Unavailable && s.source().is_some() => {
                let mut cause: &dyn std::error::Error = s;
                while let Some(next) = cause.source() {
                    cause = next;
                }
                eprintln!("knitterctl: cannot reach {what} at {target}: {cause}; is it running?")
            }
            Some(s) => eprintln!("knitterctl: refused ({:?}): {}", s.code(), s.message()),
            None => eprintln!("knitterctl: {e:#}"),
        }
        std::process::exit(1);
    }
}

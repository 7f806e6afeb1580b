//! `knitterctl port`: the node's ports (one device, one mode each).

use crate::Output;
use crate::objects::{applied, document, named, owner, policer};
use crate::out::{opt, table};
use anyhow::Result;
use clap::Subcommand;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub(crate) enum PortCmd {
    /// Add a port: one device, one mode.
    Add(Box<PortAdd>),
    Del {
        name: String,
    },
    /// Every port (-o yaml|json: a document `apply -f` takes back).
    List,
    /// One port (-o yaml|json: a document `apply -f` takes back, changing that port only).
    Show {
        name: String,
    },
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("device").required(true).args(["af_xdp", "af_packet", "vhost_user", "dpdk", "host"])))]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["access", "trunk", "underlay"])))]
pub(crate) struct PortAdd {
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
    /// The node's own interface into the bridge domain (a host port: a veth the daemon makes
    /// here, at most 12 characters; the switch serves `<IFNAME>-sw`).
    #[arg(long, value_name = "IFNAME", requires = "address")]
    host: Option<String>,
    /// A host port's address, the node's own in the network (CIDR; repeatable, one per
    /// family). The first gives its MAC, so it must be this node's alone.
    #[arg(long, value_name = "CIDR", requires = "host")]
    address: Vec<String>,
    /// A host port without the masquerade of pods' traffic it routes out.
    #[arg(long, requires = "host")]
    no_masquerade: bool,
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
    /// The PMD thread (its index) that polls this port's queues; a thread with a pinned
    /// port polls only pinned ports (`knitterctl pmd show`).
    #[arg(long, value_name = "THREAD")]
    pmd: Option<u32>,
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

pub(crate) async fn run(c: &mut NodeClient<Channel>, out: Output, cmd: PortCmd) -> Result<()> {
    match cmd {
        PortCmd::Add(a) => applied(
            out,
            c.add_port(pb::AddPortRequest { port: Some(port_request(*a)) }).await?.into_inner(),
        )?,
        PortCmd::Del { name } => {
            applied(out, c.delete_port(pb::DeleteRequest { name, owner: 0 }).await?.into_inner())?
        }
        PortCmd::List => list(c, out, None).await?,
        PortCmd::Show { name } => list(c, out, Some(name)).await?,
    }
    Ok(())
}

/// The ports (the one named), as a table or a document.
async fn list(c: &mut NodeClient<Channel>, out: Output, name: Option<String>) -> Result<()> {
    if out != Output::Table {
        return document(c, out, "ports", name).await;
    }
    let ports =
        named(c.list_ports(pb::ListRequest {}).await?.into_inner().ports, name, "port", |p| {
            &p.name
        })?;
    let status = c.show(pb::ShowRequest {}).await?.into_inner().status;
    print_ports(&ports, &status);
    Ok(())
}

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode such as 0660"))
}

fn port_request(a: PortAdd) -> pb::Port {
    use pb::device::Kind;
    use pb::port::Mode;
    let netns = a.netns.unwrap_or_default();
    let kind = match (a.af_xdp, a.af_packet, a.vhost_user) {
        _ if a.host.is_some() => Kind::Host(pb::HostPort {
            ifname: a.host.unwrap_or_default(),
            addresses: a.address,
            masquerade: Some(!a.no_masquerade),
        }),
        _ if a.dpdk.is_some() => Kind::Dpdk(pb::DpdkDevice {
            devargs: a.dpdk.unwrap_or_default(),
            queues: a.queues.unwrap_or(0),
        }),
        (Some(i), _, _) => Kind::AfXdp(pb::KernelPort { ifname: i, netns }),
        (_, Some(i), _) => Kind::AfPacket(pb::KernelPort { ifname: i, netns }),
        (_, _, s) => Kind::VhostUser(pb::VhostUser {
            socket: s.unwrap_or_default(),
            client: a.client,
            mode: a.socket_mode,
            owner: a.socket_owner,
            group: a.socket_group,
        }),
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
        pmd: a.pmd,
        security: a.mac.map(|m| pb::PortSecurity {
            macs: vec![m],
            ips: a.ip,
            ..Default::default()
        }),
        policer: (a.police_pps.is_some()
            || a.police_bps.is_some()
            || a.police_burst_packets.is_some()
            || a.police_burst_bytes.is_some())
        .then(|| pb::Policer {
            pps: a.police_pps.unwrap_or(0),
            bps: a.police_bps.unwrap_or(0),
            burst_packets: a.police_burst_packets.unwrap_or(0),
            burst_bytes: a.police_burst_bytes.unwrap_or(0),
        }),
        ..Default::default()
    }
}

pub(crate) fn print_ports(p: &[pb::Port], status: &[pb::PortStatus]) {
    table(
        &["name", "device", "mode", "mtu", "link", "owner", "policer"],
        p.iter()
            .map(|p| {
                let s = status.iter().find(|s| s.name == p.name);
                let link = match s {
                    Some(s) if !s.error.is_empty() => format!("not running: {}", s.error),
                    Some(s) if !s.ring_error.is_empty() => format!("error: {}", s.ring_error),
                    Some(s) if s.vhost_connected == Some(false) => {
                        "waiting for the frontend".into()
                    }
                    Some(s) if s.link_up => "up".into(),
                    Some(_) => "down".into(),
                    None => "?".into(),
                };
                let link = match s {
                    Some(s) if !s.fallback.is_empty() => {
                        format!("{link}, on AF_PACKET: {}", s.fallback)
                    }
                    Some(s) if !s.copy_reason.is_empty() => {
                        format!("{link}, frames copied: {}", s.copy_reason)
                    }
                    Some(s) if s.zero_copy == Some(true) => format!("{link}, zero copy"),
                    Some(pb::PortStatus { vhost_rings: Some(r), .. }) => {
                        format!("{link}, {}", rings(r))
                    }
                    _ => link,
                };
                vec![
                    p.name.clone(),
                    device(&p.device),
                    mode(p),
                    opt(p.mtu),
                    link,
                    owner(p.owner).into(),
                    policer(p.policer.as_ref()),
                ]
            })
            .collect(),
    );
}

/// A vhost-user frontend's rings as the link column says them: "packed rings of 1024
/// entries, 1 pair, in order".
fn rings(r: &pb::VhostRings) -> String {
    let layout = if r.packed { "packed" } else { "split" };
    let sizes = if r.rx_size == r.tx_size {
        format!("{} entries", r.rx_size)
    } else {
        format!("{} (guest rx) and {} (guest tx) entries", r.rx_size, r.tx_size)
    };
    let pairs = if r.queue_pairs == 1 { "pair" } else { "pairs" };
    let mut s = format!("{layout} rings of {sizes}, {} {pairs}", r.queue_pairs);
    if r.in_order {
        s.push_str(", in order");
    }
    if r.mergeable_buffers {
        s.push_str(", mergeable buffers");
    }
    s
}

fn device(d: &Option<pb::Device>) -> String {
    use pb::device::Kind;
    let ns = |n: &str| if n.is_empty() { String::new() } else { format!(" (netns {n})") };
    match d.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::AfXdp(k)) => format!("af_xdp {}{}", k.ifname, ns(&k.netns)),
        Some(Kind::AfPacket(k)) => format!("af_packet {}{}", k.ifname, ns(&k.netns)),
        Some(Kind::VhostUser(v)) => {
            format!("vhost-user {}{}", v.socket, if v.client { " (client)" } else { "" })
        }
        Some(Kind::Dpdk(d)) if d.queues > 1 => format!("dpdk {} ({} queues)", d.devargs, d.queues),
        Some(Kind::Dpdk(d)) => format!("dpdk {}", d.devargs),
        Some(Kind::Host(h)) => format!("host {} ({})", h.ifname, h.addresses.join(", ")),
        None => "-".into(),
    }
}

fn mode(p: &pb::Port) -> String {
    use pb::port::Mode;
    match &p.mode {
        Some(Mode::Access(a)) => format!("access {}", a.bridge),
        Some(Mode::Trunk(t)) => {
            let v: Vec<String> = t.allowed.iter().map(|v| v.to_string()).collect();
            format!(
                "trunk {}{}",
                v.join(","),
                t.native.map(|n| format!(" native {n}")).unwrap_or_default()
            )
        }
        Some(Mode::Underlay(_)) => "underlay".into(),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frontends_rings_read_as_a_user_compares_them() {
        let r = pb::VhostRings {
            packed: true,
            rx_size: 1024,
            tx_size: 1024,
            queue_pairs: 1,
            in_order: true,
            mergeable_buffers: false,
        };
        assert_eq!(rings(&r), "packed rings of 1024 entries, 1 pair, in order");
        let r = pb::VhostRings {
            packed: false,
            rx_size: 1024,
            tx_size: 256,
            queue_pairs: 2,
            in_order: false,
            mergeable_buffers: true,
        };
        assert_eq!(
            rings(&r),
            "split rings of 1024 (guest rx) and 256 (guest tx) entries, 2 pairs, mergeable buffers"
        );
    }
}

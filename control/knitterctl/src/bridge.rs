//! `knitterctl bridge`: the node's bridge domains (one per network on the node).

use crate::Output;
use crate::objects::{applied, document, named, owner, policer};
use crate::out::{opt, table};
use anyhow::{Context, Result};
use clap::Subcommand;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum BridgeCmd {
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
        /// The pods' gateway, answered by the switch on every node alike (repeatable: an
        /// address per family); frames to it leave by --gateway-port.
        #[arg(long, value_name = "IP", requires = "gateway_port")]
        gateway: Vec<String>,
        /// The gateway's MAC (default: 0a:58 and its IPv4 address).
        #[arg(long, requires = "gateway")]
        gateway_mac: Option<String>,
        /// The port frames to the gateway leave by: the node's host port in this bridge.
        #[arg(long, value_name = "PORT", requires = "gateway")]
        gateway_port: Option<String>,
        /// Replace a bridge domain of this name.
        #[arg(long)]
        replace: bool,
    },
    Del {
        name: String,
    },
    /// Every bridge domain (-o yaml|json: a document `apply -f` takes back).
    List,
    /// One bridge domain (-o yaml|json: a document `apply -f` takes back, changing that one
    /// only).
    Show {
        name: String,
    },
}

pub(crate) async fn run(c: &mut NodeClient<Channel>, out: Output, cmd: BridgeCmd) -> Result<()> {
    match cmd {
        BridgeCmd::Add {
            name,
            vlan,
            vni,
            flood,
            arp_suppression,
            dscp,
            pcp,
            priority,
            pod_pps,
            pod_bps,
            police_pps,
            police_bps,
            neighbor,
            static_mac,
            gateway,
            gateway_mac,
            gateway_port,
            replace,
        } => {
            let pair = |s: &str, what: &str| -> Result<(String, String)> {
                let (a, b) =
                    s.split_once('=').with_context(|| format!("{what} {s:?}: expected A=B"))?;
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
                (pps.is_some() || bps.is_some()).then(|| pb::Policer {
                    pps: pps.unwrap_or(0),
                    bps: bps.unwrap_or(0),
                    ..Default::default()
                })
            };
            let (pod_policer, policer) = (rates(pod_pps, pod_bps), rates(police_pps, police_bps));
            let gateway =
                gateway_port.map(|port| pb::Gateway { ips: gateway, mac: gateway_mac, port });
            let bridge = pb::Bridge {
                name,
                vlan,
                vni,
                flood,
                arp_suppression,
                neighbors,
                static_macs,
                dscp,
                pcp,
                priority,
                pod_policer,
                policer,
                gateway,
                ..Default::default()
            };
            applied(
                out,
                c.add_bridge(pb::AddBridgeRequest { bridge: Some(bridge), replace })
                    .await?
                    .into_inner(),
            )?
        }
        BridgeCmd::Del { name } => {
            applied(out, c.delete_bridge(pb::DeleteRequest { name, owner: 0 }).await?.into_inner())?
        }
        BridgeCmd::List => list(c, out, None).await?,
        BridgeCmd::Show { name } => list(c, out, Some(name)).await?,
    }
    Ok(())
}

/// The bridge domains (the one named), as a table or a document.
async fn list(c: &mut NodeClient<Channel>, out: Output, name: Option<String>) -> Result<()> {
    if out != Output::Table {
        return document(c, out, "bridges", name).await;
    }
    let bridges = named(
        c.list_bridges(pb::ListRequest {}).await?.into_inner().bridges,
        name,
        "bridge",
        |b| &b.name,
    )?;
    print_bridges(&bridges);
    Ok(())
}

pub(crate) fn print_bridges(b: &[pb::Bridge]) {
    table(
        &[
            "name",
            "vlan",
            "vni",
            "flood",
            "arp-suppression",
            "gateway",
            "marking",
            "owner",
            "policer",
            "pod policer",
        ],
        b.iter()
            .map(|b| {
                vec![
                    b.name.clone(),
                    opt(b.vlan),
                    opt(b.vni),
                    if b.flood.is_empty() { "-".into() } else { b.flood.join(",") },
                    if b.arp_suppression { "on" } else { "off" }.into(),
                    b.gateway
                        .as_ref()
                        .map_or("-".into(), |g| format!("{} via {}", g.ips.join(","), g.port)),
                    match (b.dscp, b.pcp, b.priority) {
                        (None, None, false) => "-".into(),
                        (d, p, first) => format!(
                            "dscp {} pcp {}{}",
                            d.unwrap_or(0),
                            p.unwrap_or(0),
                            if first { " priority" } else { "" }
                        ),
                    },
                    owner(b.owner).into(),
                    policer(b.policer.as_ref()),
                    policer(b.pod_policer.as_ref()),
                ]
            })
            .collect(),
    );
}

//! `knitterctl vtep`: the node's VXLAN tunnel endpoint and its peers' next hops.

use crate::Output;
use crate::objects::owner;
use crate::objects::{applied, document};
use crate::out::opt;
use anyhow::Result;
use clap::Subcommand;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub(crate) enum VtepCmd {
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
    /// The VTEP and its peers' next hops (-o yaml|json: the VTEP as a document `apply -f`
    /// takes back; `node show -o json` has the peers' state).
    Show,
}

pub(crate) async fn run(c: &mut NodeClient<Channel>, out: Output, cmd: VtepCmd) -> Result<()> {
    match cmd {
        VtepCmd::Set { local, underlay, peer, vlan, shared } => {
            let vtep = pb::Vtep {
                local_ip: local,
                underlay_port: underlay,
                underlay_vlan: vlan,
                peers: peer.into_iter().map(|ip| pb::Peer { ip, ..Default::default() }).collect(),
                shared_address: shared,
                ..Default::default()
            };
            applied(out, c.set_vtep(pb::SetVtepRequest { vtep: Some(vtep) }).await?.into_inner())?
        }
        VtepCmd::Clear => {
            applied(out, c.clear_vtep(pb::ClearVtepRequest { owner: 0 }).await?.into_inner())?
        }
        VtepCmd::Show if out != Output::Table => document(c, out, "vtep", None).await?,
        VtepCmd::Show => {
            let view = c.show(pb::ShowRequest {}).await?.into_inner();
            match &view.vtep {
                Some(v) => {
                    print_vtep(v);
                    print_peers(&view.peers);
                }
                None => println!("vtep: none"),
            }
        }
    }
    Ok(())
}

pub(crate) fn print_vtep(v: &pb::Vtep) {
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
pub(crate) fn print_peers(peers: &[pb::PeerStatus]) {
    for p in peers {
        let state = match (&p.next_hop_mac, p.confirmed_secs_ago) {
            (Some(m), Some(s)) => format!("next hop {m}, confirmed {s}s ago"),
            (Some(m), None) => format!("next hop {m}"),
            (None, _) => format!("unresolved ({} requests unanswered)", p.unanswered),
        };
        println!("  peer {}: {state}", p.ip);
    }
}

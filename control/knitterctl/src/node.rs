//! The node daemon as a whole: `node show` (like `ovs-vsctl show`), `apply` (the node's
//! objects converged to a topology file), `events`, `trace` and `vf list`.

use crate::Output;
use crate::bridge::print_bridges;
use crate::objects::print_export;
use crate::out::{record, structured, table};
use crate::port::print_ports;
use crate::vtep::print_vtep;
use anyhow::{Context, Result};
use clap::Subcommand;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::path::{Path, PathBuf};
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCmd {
    Show,
    /// The node's local objects (bridges, ports, the VTEP) as a topology document that
    /// `knitterctl apply -f` takes back unchanged: `node export | apply -f - --dry-run`
    /// says nothing would change.
    Export {
        /// yaml or json.
        #[arg(long, default_value = "yaml")]
        format: String,
        /// Every owner's objects (the manager's, pods' attachments), each with its `owner`:
        /// apply leaves them as they are.
        #[arg(long)]
        all_owners: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum VfCmd {
    /// Each PF's VFs.
    List,
}

pub(crate) async fn show(c: &mut NodeClient<Channel>, out: Output) -> Result<()> {
    let v = c.show(pb::ShowRequest {}).await?.into_inner();
    if out != Output::Table {
        return structured(out, &v);
    }
    println!(
        "knitter-vswitchd {}: configuration generation {}, {} PMD thread(s), idle {}, buffers {}/{} free{} ({} lent to receive rings{}), FDB {}/{} entries, cache {} entries per thread (second level {} a half)",
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
        v.emc_entries,
        v.megaflow_entries
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
        println!(
            "buffers ran out on: {} (raise --buffers or --pods; knitterctl stats --queues)",
            starved.join(", ")
        );
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
    Ok(())
}

/// Prints the node's local objects (with `all_owners`, everyone's) as a topology document
/// `apply -f` takes back.
pub(crate) async fn export(
    c: &mut NodeClient<Channel>,
    format: &str,
    all_owners: bool,
) -> Result<()> {
    print_export(c, pb::ExportRequest { format: format.into(), all_owners, ..Default::default() })
        .await
}

/// A document to apply: a file (its format by extension) or standard input.
#[derive(Debug, clap::Args)]
pub(crate) struct Source {
    /// The file, or `-` for standard input.
    #[arg(long, short)]
    file: PathBuf,
    /// yaml or json (toml too, for the node's apply; default: the file's extension, YAML
    /// for standard input).
    #[arg(long)]
    format: Option<String>,
}

impl Source {
    /// The document's text and format.
    pub(crate) fn read(&self) -> Result<(String, String)> {
        let text = if self.file.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("reading standard input")?
        } else {
            std::fs::read_to_string(&self.file)
                .with_context(|| format!("reading {}", self.file.display()))?
        };
        let format = self.format.clone().unwrap_or_else(|| {
            self.file.extension().and_then(|e| e.to_str()).unwrap_or("yaml").to_string()
        });
        Ok((text, format))
    }
}

/// Applies the document of `source` to the node's local objects.
pub(crate) async fn apply(
    c: &mut NodeClient<Channel>,
    out: Output,
    source: &Source,
    dry_run: bool,
    prune: bool,
) -> Result<()> {
    let (document, format) = source.read()?;
    let r = c.apply(pb::ApplyRequest { document, format, dry_run, prune }).await?.into_inner();
    if out != Output::Table {
        return structured(out, &r);
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
    if !r.kept.is_empty() {
        println!("kept, not in the document: {} (--prune removes them)", r.kept.join(", "));
    }
    for s in &r.skipped {
        println!("skipped: {s}");
    }
    Ok(())
}

/// The node's VFs, over its unix socket (where its attach API is).
pub(crate) async fn vfs(socket: &Path, tcp: bool, out: Output) -> Result<()> {
    anyhow::ensure!(
        !tcp,
        "the node's VFs are shown over its unix socket (--socket), where its attach API is"
    );
    let mut a =
        knitter_api::node::attach_client::AttachClient::new(knitter_api::unix_channel(socket));
    let r = a.query_node_networks(pb::QueryNodeNetworksRequest {}).await?.into_inner();
    if out != Output::Table {
        structured(out, &r.pfs)?
    } else {
        print_vfs(&r.pfs)
    }
    Ok(())
}

pub(crate) async fn trace(
    c: &mut NodeClient<Channel>,
    out: Output,
    req: pb::TraceRequest,
) -> Result<()> {
    let r = c.trace(req).await?.into_inner();
    if out != Output::Table {
        return structured(out, &r);
    }
    print_traces(&r);
    Ok(())
}

/// Follows the node's events (`count` of them, or until Ctrl-C).
pub(crate) async fn events(
    c: &mut NodeClient<Channel>,
    out: Output,
    count: Option<u64>,
) -> Result<()> {
    let mut stream = c.events(pb::EventsRequest {}).await?.into_inner();
    let mut seen = 0;
    while count.is_none_or(|n| seen < n) {
        let Some(e) = stream.message().await? else { break };
        seen += 1;
        if out != Output::Table {
            record(out, &e)?;
        } else {
            let secs = e.at_unix_nanos / 1_000_000_000;
            let (h, m, s, ms) = (
                (secs / 3600) % 24,
                (secs / 60) % 60,
                secs % 60,
                (e.at_unix_nanos / 1_000_000) % 1000,
            );
            let port = if e.port.is_empty() { "-" } else { e.port.as_str() };
            println!("{h:02}:{m:02}:{s:02}.{ms:03} UTC  {:<15} {port:<12} {}", e.kind, e.detail);
        }
    }
    Ok(())
}

fn print_vfs(pfs: &[pb::PhysicalFunction]) {
    if pfs.is_empty() {
        println!(
            "no SR-IOV PFs configured ([sriov] pfs); VFs named by a device plugin are still given to pods"
        );
    }
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    for pf in pfs {
        if !pf.problem.is_empty() {
            println!("{} ({}): {}", pf.name, dash(&pf.pci), pf.problem);
            continue;
        }
        let held = pf.vfs.iter().filter(|v| !v.attached_to.is_empty()).count();
        println!(
            "{} ({}): {} VFs of {} possible, {held} attached",
            pf.name,
            pf.pci,
            pf.vfs.len(),
            pf.total_vfs
        );
        table(
            &["vf", "pci", "driver", "netdev", "attached to"],
            pf.vfs
                .iter()
                .map(|v| {
                    vec![
                        v.index.to_string(),
                        v.pci.clone(),
                        dash(&v.driver),
                        dash(&v.netdev),
                        dash(&v.attached_to),
                    ]
                })
                .collect(),
        );
    }
}

fn print_traces(r: &pb::TraceReply) {
    if r.frames.is_empty() {
        println!("no frame was traced (none arrived on the port before the timeout)");
    }
    for f in &r.frames {
        let what = if f.synthetic {
            "synthetic frame".to_string()
        } else {
            format!("trace {} (pmd {})", f.seq, f.thread)
        };
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

//! knitterctl: the operator's CLI. Talks to a node's knitter-vswitchd over its unix socket
//! (`node show`, `bridge`, `port`, `vtep`, `fdb`, `stats`, `apply`, `events`, `trace`) and to the
//! manager over gRPC (`manager tenant|network|ipgroup|port|node`). Human tables by
//! default, `-o json` for scripts; a refused request prints the reason and exits with
//! [`EXIT_REFUSED`], a daemon it cannot reach with [`EXIT_UNREACHABLE`]. `completion` and
//! `man` write shell completions and man pages.

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

mod bridge;
mod capture;
mod fdb;
mod manager;
mod manifest;
mod node;
mod objects;
mod pcapng;
mod pmd;
mod port;
mod stats;
mod target;
mod vtep;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::error::Error as _;
use std::path::PathBuf;
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
    target: target::Target,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Exit status when the daemon or the manager refused the request (it got there and said no).
const EXIT_REFUSED: i32 = 3;
/// Exit status when the daemon or the manager could not be reached.
const EXIT_UNREACHABLE: i32 = 4;

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

const CAPTURE_EXAMPLES: &str = "Examples:
  knitterctl capture pod-a                                 a line per frame until Ctrl-C
  knitterctl capture pod-a -c 100 -w pod-a.pcapng udp port 53
  knitterctl capture uplink --direction rx -w - 'udp[12:4] >> 8 = 5001' | tcpdump -n -r -
  knitterctl capture pod-a --duration 10 -w /tmp/a.pcapng && tcpdump -n -r /tmp/a.pcapng";

const TRACE_EXAMPLES: &str = "Examples:
  knitterctl trace --port pod-a --count 5
  knitterctl trace --port pod-a --synthetic 'eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) ipv4(src=10.1.0.2,dst=10.1.0.3) udp(dst=53)'
  knitterctl trace --port uplink --synthetic 'eth(src=02:00:00:00:00:0a,dst=02:00:00:00:00:0b) ipv4(src=192.0.2.2,dst=192.0.2.1) udp(dst=4789) vxlan(vni=100) eth(src=02:00:00:00:00:03,dst=02:00:00:00:00:01) ipv4(src=10.1.0.9,dst=10.1.0.2) icmp()'";

const APPLY_EXAMPLES: &str = "Examples:
  knitterctl apply -f topology.yaml --dry-run
  knitterctl port show vnf0 -o yaml > vnf0.yaml    # edit it, then
  knitterctl apply -f vnf0.yaml                     # changes vnf0, leaves the other ports (not with --prune)
  knitterctl node export > node.yaml && knitterctl apply -f node.yaml --prune   # nothing to change";

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
    let hidden = |ids: &[&str]| -> Vec<clap::Arg> {
        cmd.get_arguments()
            .filter(|a| ids.contains(&a.get_id().as_str()))
            .map(|a| a.clone().hide(true))
            .collect()
    };
    let (node, manager) = (hidden(&NODE_OPTIONS), hidden(&target::TARGET_OPTIONS));
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    subs.into_iter().fold(cmd, |cmd, name| {
        let copies = if name == "manager" { node.clone() } else { manager.clone() };
        cmd.mut_subcommand(name, |sc| sc.args(copies))
    })
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
pub(crate) enum Output {
    Table,
    /// The object commands (bridge, port, vtep list and show) print a topology document
    /// `apply -f` takes back; the others the API's messages.
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
enum LogCmd {
    /// The filter now, in RUST_LOG's syntax.
    Show,
    /// A new filter: a level for everything (`debug`), RUST_LOG's directives
    /// (`knitter_vhost=debug,info`), or with --module one module's level, the rest kept.
    Set {
        filter: String,
        /// Only this module (a crate or a module path: `knitter_vhost`,
        /// `knitter_vswitchd::node`).
        #[arg(long)]
        module: Option<String>,
    },
}

/// The filter `current` with `module` at `level`: that module's earlier directives replaced.
fn with_module_level(current: &str, module: &str, level: &str) -> String {
    let kept = current
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && d.split('=').next() != Some(module));
    kept.chain(std::iter::once(format!("{module}={level}").as_str())).collect::<Vec<_>>().join(",")
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
        cmd: node::NodeCmd,
    },
    /// Bridge domains.
    Bridge {
        #[command(subcommand)]
        cmd: bridge::BridgeCmd,
    },
    /// Ports.
    Port {
        #[command(subcommand)]
        cmd: port::PortCmd,
    },
    /// The VXLAN tunnel endpoint.
    Vtep {
        #[command(subcommand)]
        cmd: vtep::VtepCmd,
    },
    /// The forwarding table.
    Fdb {
        #[command(subcommand)]
        cmd: fdb::FdbCmd,
    },
    /// Apply a topology document (the config file's bridges, ports and vtep; YAML, TOML or
    /// JSON by extension) to the node's local objects: add what is new, change what differs;
    /// with --prune also remove the local objects of the kinds it names that it lacks. What
    /// `-o yaml|json` of `bridge`, `port` and `vtep` and `node export` print, it takes back
    /// unchanged.
    #[command(after_help = APPLY_EXAMPLES)]
    Apply {
        #[command(flatten)]
        source: node::Source,
        /// Show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also remove the local objects of the kinds the document names (its top-level keys
        /// `bridges`, `ports`, `vtep`, even empty or null) that it lacks.
        #[arg(long)]
        prune: bool,
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
    /// Packet capture (like ovs-tcpdump, VPP's `pcap trace`, dpdk-dumpcap): the frames a port
    /// receives and sends, vhost-user and AF_XDP ports included, as pcapng (`-w FILE`, or
    /// `-w -` into `tcpdump -r -`) or a line each; a frame the switch dropped says why. One
    /// capture at a time on a node.
    #[command(after_help = CAPTURE_EXAMPLES)]
    Capture(capture::Args),
    /// Where each rx queue is polled (like `ovs-appctl dpif-netdev/pmd-rxq-show`): each PMD
    /// thread, its core, how busy it is, and each queue's share of its work.
    Pmd {
        #[command(subcommand)]
        cmd: pmd::PmdCmd,
    },
    /// The SR-IOV PFs the node gives pods VFs from (`[sriov] pfs`), each VF with its driver,
    /// netdev and the pod interface holding it.
    Vf {
        #[command(subcommand)]
        cmd: node::VfCmd,
    },
    /// The node daemon's log filter: show it, or set it while the daemon runs (as
    /// `ovs-appctl vlog/set`; not kept across restarts, where RUST_LOG applies).
    Log {
        #[command(subcommand)]
        cmd: LogCmd,
    },
    /// Shell completions on standard output (`source <(knitterctl completion bash)`, or save
    /// them as /usr/share/bash-completion/completions/knitterctl).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Man pages (knitterctl.1 and one for each subcommand, knitterctl-port-add.1 …) into a
    /// directory (`man -l DIR/knitterctl.1`, or install them under /usr/share/man/man1).
    Man { dir: PathBuf },
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

/// The client for where the daemon is: its unix socket, or TCP with TLS.
fn client(cli: &Cli) -> Result<NodeClient<Channel>> {
    let Some(addr) = &cli.tcp else { return Ok(knitter_api::node_client(&cli.socket)) };
    let identity = cli.cert.as_deref().zip(cli.key.as_deref());
    let tls = knitter_api::ClientTls::read(
        addr,
        cli.ca.as_deref().context("--tcp needs --ca")?,
        cli.server_name.as_deref(),
        identity,
    )?;
    Ok(NodeClient::new(knitter_api::tls_channel(addr, tls)?))
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn run(cli: Cli) -> Result<()> {
    let mut c = client(&cli)?;
    let out = cli.output;
    match cli.cmd {
        Cmd::Node { cmd: node::NodeCmd::Show } => node::show(&mut c, out).await,
        Cmd::Bridge { cmd } => bridge::run(&mut c, out, cmd).await,
        Cmd::Port { cmd } => port::run(&mut c, out, cmd).await,
        Cmd::Vtep { cmd } => vtep::run(&mut c, out, cmd).await,
        Cmd::Fdb { cmd } => fdb::run(&mut c, out, cmd).await,
        Cmd::Apply { source, dry_run, prune } => {
            node::apply(&mut c, out, &source, dry_run, prune).await
        }
        Cmd::Node { cmd: node::NodeCmd::Export { format, all_owners } } => {
            node::export(&mut c, &format, all_owners).await
        }
        Cmd::Vf { cmd: node::VfCmd::List } => node::vfs(&cli.socket, cli.tcp.is_some(), out).await,
        Cmd::Stats { interval, count, queues } => {
            stats::stats(&mut c, out, interval, count, queues).await
        }
        Cmd::Trace { port, count, timeout, synthetic } => {
            node::trace(
                &mut c,
                out,
                pb::TraceRequest {
                    port,
                    count,
                    timeout_ms: timeout.saturating_mul(1000),
                    synthetic: synthetic.unwrap_or_default(),
                },
            )
            .await
        }
        Cmd::Pmd { cmd } => pmd::run(&mut c, out, cmd).await,
        Cmd::Capture(a) => capture::capture(&mut c, out, a).await,
        Cmd::Events { count } => node::events(&mut c, out, count).await,
        Cmd::Log { cmd } => {
            let filter = match cmd {
                LogCmd::Show => String::new(),
                LogCmd::Set { filter, module: None } => filter,
                LogCmd::Set { filter, module: Some(m) } => {
                    anyhow::ensure!(
                        !m.is_empty()
                            && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                        "--module {m:?}: a module path (letters, digits, _ and ::)"
                    );
                    anyhow::ensure!(
                        knitter_api::logging::is_level(&filter),
                        "{filter:?} is not a level (error, warn, info, debug, trace, off)"
                    );
                    let now =
                        c.log_filter(pb::LogFilterRequest::default()).await?.into_inner().filter;
                    with_module_level(&now, &m, &filter)
                }
            };
            let reply = c.log_filter(pb::LogFilterRequest { filter }).await?.into_inner();
            match out {
                Output::Table => println!("{}", reply.filter),
                out => out::structured(out, &serde_json::json!({ "filter": reply.filter }))?,
            }
            Ok(())
        }
        Cmd::Manager { .. } | Cmd::Completion { .. } | Cmd::Man { .. } => {
            unreachable!("run in main")
        }
    }
}

/// Writes the man pages of `cmd` and of each of its subcommands, named after their path
/// (`knitterctl-manager-network-create.1`), into `dir`.
fn write_man_pages(cmd: &clap::Command, dir: &std::path::Path) -> Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = 0;
    let mut todo = vec![(cmd.clone(), cmd.get_name().to_string())];
    while let Some((c, name)) = todo.pop() {
        let c = c.display_name(name.clone()).bin_name(name.replace('-', " "));
        let mut page = Vec::new();
        clap_mangen::Man::new(c.clone())
            .title(name.clone())
            .render(&mut page)
            .with_context(|| format!("rendering {name}.1"))?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
        written += 1;
        todo.extend(
            c.get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .map(|s| (s.clone(), format!("{name}-{}", s.get_name()))),
        );
    }
    Ok(written)
}

fn main() {
    use clap::FromArgMatches;
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    match &cli.cmd {
        Cmd::Completion { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut command(), "knitterctl", &mut out);
            println!("{}", String::from_utf8_lossy(&out).trim_end());
            return;
        }
        Cmd::Man { dir } => match write_man_pages(
            &{
                let mut c = command();
                c.build(); // the global options propagated into every subcommand's page
                c
            },
            dir,
        ) {
            Ok(n) => return println!("{n} man pages written to {}", dir.display()),
            Err(e) => {
                eprintln!("knitterctl: {e:#}");
                std::process::exit(1);
            }
        },
        _ => {}
    }
    // A TLS peer that wants a client certificate hangs up on a client without one: the
    // options that would give it one, when none was given.
    let cert_options = match &cli.cmd {
        Cmd::Manager { .. } => (cli.target.manager_ca.is_some()
            && cli.target.manager_cert.is_none())
        .then_some("--manager-cert, --manager-key"),
        _ => (cli.tcp.is_some() && cli.cert.is_none()).then_some("--cert, --key"),
    };
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
            (
                "knitter-manager",
                t.clone(),
                rt.block_on(manager::run(&cli.target, cli.output, cmd))
                    .with_context(|| format!("manager API at {t}")),
            )
        }
        _ => (
            "knitter-vswitchd",
            socket.display().to_string(),
            rt.block_on(run(cli)).with_context(|| format!("node API at {}", socket.display())),
        ),
    };
    if let Err(e) = result {
        match e.chain().find_map(|c| c.downcast_ref::<tonic::Status>()) {
            // A status with a cause was made on this side: the call never got an answer.
            Some(s) if s.source().is_some() => {
                let mut cause: &dyn std::error::Error = s;
                while let Some(next) = cause.source() {
                    cause = next;
                }
                if let Some(options) = cert_options.filter(|_| s.code() != tonic::Code::Unavailable)
                {
                    eprintln!(
                        "knitterctl: cannot reach {what} at {target}: {cause}; it may want a client certificate ({options})"
                    );
                } else {
                    eprintln!(
                        "knitterctl: cannot reach {what} at {target}: {cause}; is it running?"
                    );
                }
                std::process::exit(EXIT_UNREACHABLE);
            }
            Some(s) => {
                eprintln!("knitterctl: refused ({:?}): {}", s.code(), s.message());
                std::process::exit(EXIT_REFUSED);
            }
            None => eprintln!("knitterctl: {e:#}"),
        }
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_modules_level_replaces_its_earlier_directives_only() {
        assert_eq!(
            super::with_module_level("info", "knitter_vhost", "debug"),
            "info,knitter_vhost=debug"
        );
        assert_eq!(
            super::with_module_level("knitter_vhost=trace, info", "knitter_vhost", "warn"),
            "info,knitter_vhost=warn"
        );
    }
}

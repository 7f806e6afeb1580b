//! The daemon's config file (TOML) and command line. Every key has a default, so the daemon
//! runs with no file at all; the command line overrides the file. Bridge domains, ports and
//! the VTEP in the file are `local` objects, converged into the persisted state at start.

use crate::state::{NodeState, Owned, Owner, PortSpec};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use vswitch::config::{BridgeConfig, VtepConfig};
use vswitch::{IdlePolicy, PmdConfig};

pub const DEFAULT_CONFIG: &str = "/etc/knitter/vswitchd.toml";
pub const DEFAULT_STATE: &str = "/var/lib/knitter/vswitchd.json";
pub const DEFAULT_METRICS: &str = "127.0.0.1:9477";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// The node API's unix socket.
    pub socket: PathBuf,
    /// Its mode (owner and group read/write by default).
    pub socket_mode: u32,
    /// Also serve the API on this TCP address, with TLS (never in the clear).
    pub tcp: Option<std::net::SocketAddr>,
    /// The server's certificate chain and key (PEM), required with `tcp`.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to; absent: clients are not asked for one.
    pub tls_client_ca: Option<PathBuf>,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            socket: knitter_api::DEFAULT_NODE_SOCKET.into(),
            socket_mode: 0o660,
            tcp: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
        }
    }
}

/// The TLS files of the TCP listener, read.
pub struct Tls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
}

impl ApiSection {
    /// The TCP listener's address and TLS material, when one is configured.
    pub fn tcp_tls(&self) -> Result<Option<(std::net::SocketAddr, Tls)>> {
        let Some(addr) = self.tcp else { return Ok(None) };
        let read = |p: &Option<PathBuf>, what: &str| -> Result<Vec<u8>> {
            let p = p.as_ref().with_context(|| {
                format!("api.tcp needs api.{what} (the API is never served in the clear over TCP)")
            })?;
            std::fs::read(p).with_context(|| format!("reading api.{what} {}", p.display()))
        };
        let tls = Tls {
            cert: read(&self.tls_cert, "tls_cert")?,
            key: read(&self.tls_key, "tls_key")?,
            client_ca: self
                .tls_client_ca
                .as_ref()
                .map(|_| read(&self.tls_client_ca, "tls_client_ca"))
                .transpose()?,
        };
        Ok(Some((addr, tls)))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PmdSection {
    pub threads: usize,
    /// CPU of each thread; missing entries are not pinned.
    pub cores: Vec<usize>,
    pub idle: IdlePolicy,
}

impl Default for PmdSection {
    fn default() -> Self {
        PmdSection { threads: 1, cores: Vec::new(), idle: IdlePolicy::default() }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// Packet buffers of 2 KiB; unset: sized for `pods`.
    pub buffers: Option<u32>,
    /// The pod ports the pool is sized for when `buffers` is unset (see
    /// [`kernel_ports::afxdp::pool_for_pods`]).
    pub pods: u32,
    /// Back them with explicit hugepages when the system has them.
    pub hugepages: bool,
}

impl Default for PoolSection {
    fn default() -> Self {
        PoolSection { buffers: None, pods: PoolSection::DEFAULT_PODS, hugepages: true }
    }
}

impl PoolSection {
    /// Kubernetes' default pods a node (kubelet `maxPods`).
    pub const DEFAULT_PODS: u32 = 110;
    /// More pod ports than a node's AF_XDP sockets are worth sizing for (2 GiB of buffers).
    pub const MAX_PODS: u32 = 4096;

    /// The buffers the pool gets: as given, or sized for `pods`.
    pub fn buffers(&self) -> u32 {
        self.buffers.unwrap_or_else(|| kernel_ports::afxdp::pool_for_pods(self.pods))
    }

    /// The pod ports the pool was sized for; `None` when its buffers were given.
    pub fn sized_for_pods(&self) -> Option<u32> {
        self.buffers.is_none().then_some(self.pods)
    }
}

/// vhost-user ports.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VhostSection {
    /// Frames of 512 bytes or more from a guest cross to another guest with one copy (their
    /// headers copied into the switch first); `false`: two copies, through the pool.
    pub single_copy: bool,
    /// The most guest memory one frontend may share with the switch (the sum of its memory
    /// table's regions), in MiB; a larger table is refused with the port in error. Pages of
    /// a guest's memory the switch touches before the guest did are charged to the switch
    /// (docs/architecture/vhost-user.md "What a frontend controls").
    pub max_guest_memory_mib: u64,
    /// Where the kubelet keeps its pods' volumes: a pod's vhost-user sockets are handed over
    /// in its own emptyDir volume, found here by the pod's UID.
    pub kubelet_pods_dir: PathBuf,
}

impl Default for VhostSection {
    fn default() -> Self {
        VhostSection {
            single_copy: true,
            max_guest_memory_mib: knitter_vhost::backend::DEFAULT_MAX_GUEST_MEMORY >> 20,
            kubelet_pods_dir: crate::handoff::DEFAULT_KUBELET_PODS.into(),
        }
    }
}

/// DPDK, for `dpdk` ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpdkSection {
    /// The EAL's arguments, program name first; empty: `knitter -l 0 --no-telemetry
    /// --file-prefix knitter-vswitchd-PID` and `--in-memory` with free huge pages (else
    /// `--no-huge -m 512 --no-shconf`), `--no-pci` unless the first device is a PCI address.
    pub eal_args: Vec<String>,
    /// The only directories `dpdk` ports' devargs may name sockets and files in; empty:
    /// anywhere but the directories pods can write, which are refused either way
    /// (docs/operations.md "DPDK ports").
    pub dirs: Vec<PathBuf>,
}

/// SR-IOV VFs for pods (`nic_type: direct`; docs/operations.md "SR-IOV VFs in pods").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SriovSection {
    /// Where sysfs is (`/sys`; another root for a test's fake tree).
    pub sysfs: PathBuf,
    /// The PFs whose VFs the node hands out when a request names no VF (no device plugin)
    /// and its network names no pool.
    pub pfs: Vec<String>,
    /// Named pools of PFs, for networks that name one (the manager's `sriov_pool`).
    pub pools: std::collections::BTreeMap<String, Vec<String>>,
    /// Set each VF's MAC and VLAN through its PF (rtnetlink `IFLA_VF_*`), and reset them at
    /// DEL; `false` where the node does not own the PF (VFs a hypervisor gives a VM, which
    /// sets them itself).
    pub pf_settings: bool,
    /// The PF checks the source MAC of what the VF sends (`spoofchk`): port security's
    /// counterpart for VFs.
    pub spoof_check: bool,
}

impl Default for SriovSection {
    fn default() -> Self {
        SriovSection {
            sysfs: "/sys".into(),
            pfs: Vec::new(),
            pools: Default::default(),
            pf_settings: true,
            spoof_check: true,
        }
    }
}

/// The forwarding tables' sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TablesSection {
    /// MAC entries the FDB holds at most (all bridge domains together): ~64 bytes each,
    /// allocated up front (the table has a power of two of 64-byte buckets of 3, at most 2/3
    /// full: 262 144 entries take 16 MiB, 1 048 576 take 64 MiB).
    pub fdb_entries: u32,
    /// Entries of each PMD thread's exact-match cache, 32 bytes each (0: none): the
    /// default, 262 144 (8 MiB per thread), keeps ~97 % of 100 000 flows cached.
    pub emc_entries: u32,
    /// Entries of each half of each PMD thread's second-level cache, 32 bytes each (0:
    /// none): the sources and the destinations of flows the exact-match cache cannot hold
    /// (a mesh of pods). The default, 65 536 (4 MiB per thread), holds 65 536 MACs a side.
    pub megaflow_entries: u32,
}

impl TablesSection {
    /// The largest FDB: 16 Mi entries (1 GiB of table).
    pub const MAX_FDB: u32 = 1 << 24;
    /// The largest cache per thread: 16 Mi entries (512 MiB).
    pub const MAX_EMC: u32 = 1 << 24;
}

impl Default for TablesSection {
    fn default() -> Self {
        let d = vswitch::SwitchOptions::default();
        TablesSection {
            fdb_entries: d.fdb_entries,
            emc_entries: d.emc_entries as u32,
            megaflow_entries: d.megaflow_entries as u32,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Where Prometheus scrapes `/metrics`; `""` turns the endpoint off.
    pub listen: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection { listen: DEFAULT_METRICS.into() }
    }
}

/// The manager this node syncs with.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ManagerSection {
    /// host:port of knitter-manager's gRPC API; `""`: no manager (the default).
    pub address: String,
    /// This node's name to the manager (default: the host name).
    pub node_name: String,
    /// The Kubernetes cluster this node is in, as the manager names it (`knitterctl
    /// manager cluster add`); `""`: the manager's own cluster (the default).
    pub cluster: String,
    /// File holding this node's token to the manager (a node token; the admin's on a
    /// trusted node).
    pub token_file: Option<PathBuf>,
    /// File holding the bootstrap token: the node joins with it (once: it gets a token of
    /// its own, kept in `credential_file`) instead of being given one.
    pub bootstrap_token_file: Option<PathBuf>,
    /// Where the token the node got by joining is kept (default: beside the state file, or
    /// /var/lib/knitter/manager-token).
    pub credential_file: Option<PathBuf>,
    /// Reach the manager over TLS: the CA (PEM) its certificate must chain to.
    pub ca: Option<PathBuf>,
    /// The name in the manager's certificate (default: the host of `address`).
    pub server_name: String,
    /// A client certificate and its key (PEM), for a manager that asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Where the manager is and who this node is to it.
#[derive(Debug, Clone)]
pub struct ManagerLink {
    /// host:port of the manager's gRPC API.
    pub address: String,
    pub node_name: String,
    /// The cluster the node registers in (`""`: the manager's own).
    pub cluster: String,
    /// The node's token, given or got by joining.
    pub token: crate::credential::Credential,
    /// How the node joins when it has no token: the bootstrap token and the credential file.
    pub join: Option<crate::credential::Join>,
    /// TLS to the manager (`--manager-ca`); plain HTTP/2 without.
    pub tls: Option<knitter_api::ClientTls>,
}

/// The config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub api: ApiSection,
    #[serde(default)]
    pub pmd: PmdSection,
    #[serde(default)]
    pub pool: PoolSection,
    #[serde(default)]
    pub tables: TablesSection,
    #[serde(default)]
    pub vhost: VhostSection,
    #[serde(default)]
    pub dpdk: DpdkSection,
    #[serde(default)]
    pub sriov: SriovSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub manager: ManagerSection,
    /// Where runtime state is persisted; `""` keeps none.
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    #[serde(default)]
    pub bridges: Vec<Owned<BridgeConfig>>,
    #[serde(default)]
    pub ports: Vec<Owned<PortSpec>>,
    #[serde(default)]
    pub vtep: Option<Owned<VtepConfig>>,
}

/// The idle policy on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Idle {
    /// Spin on the ports without rest (dedicated cores, benchmarks).
    Busy,
    /// Spin a while, then sleep on the ports' wake descriptors (shared cores).
    Adaptive,
}

/// knitter-vswitchd: the Knitter node daemon (switch, ports, node API).
#[derive(Debug, clap::Parser)]
#[command(version)]
pub struct Args {
    /// Log lines as `text` (coloured only on a terminal; `NO_COLOR` honoured) or `json`.
    #[arg(long, env = "KNITTER_LOG_FORMAT", default_value_t = knitter_api::logging::LogFormat::Text)]
    pub log_format: knitter_api::logging::LogFormat,
    /// Config file (TOML). Default: /etc/knitter/vswitchd.toml when it exists, else defaults.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// The node API's unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Also serve the API on this TCP address with TLS (needs --tls-cert and --tls-key).
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub api_tcp: Option<std::net::SocketAddr>,
    /// The TLS server certificate chain (PEM).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The TLS server key (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates from this CA (PEM).
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// Where runtime state is persisted (default /var/lib/knitter/vswitchd.json).
    #[arg(long, conflicts_with = "no_state")]
    pub state_file: Option<PathBuf>,
    /// Persist nothing: every start begins from the config file alone.
    #[arg(long)]
    pub no_state: bool,
    /// PMD threads.
    #[arg(long)]
    pub pmd_threads: Option<usize>,
    /// CPUs to pin PMD threads to, in order (e.g. 2,3).
    #[arg(long, value_delimiter = ',')]
    pub pmd_cores: Option<Vec<usize>>,
    /// What PMD threads do when idle.
    #[arg(long, value_enum)]
    pub idle: Option<Idle>,
    /// Packet buffers (2 KiB each); default: sized for --pods.
    #[arg(long)]
    pub buffers: Option<u32>,
    /// Pod ports to size the buffer pool for, when --buffers is not given (default 110:
    /// 32 768 buffers, 64 MiB).
    #[arg(long)]
    pub pods: Option<u32>,
    /// Do not use explicit hugepages for packet buffers.
    #[arg(long)]
    pub no_hugepages: bool,
    /// MAC entries the FDB holds at most (~64 bytes each, allocated at start).
    #[arg(long)]
    pub fdb_entries: Option<u32>,
    /// Entries of each PMD thread's exact-match cache (32 bytes each; 0: none).
    #[arg(long)]
    pub emc_entries: Option<u32>,
    /// Entries of each half of each PMD thread's second-level cache (32 bytes each; 0: none).
    #[arg(long)]
    pub megaflow_entries: Option<u32>,
    /// Address of the Prometheus endpoint (default 127.0.0.1:9477; in a DaemonSet,
    /// `$(POD_IP):9477` makes it reachable: deploy/kubernetes/patches/node-metrics.yaml).
    #[arg(long, env = "KNITTER_METRICS_LISTEN", conflicts_with = "no_metrics", value_parser = listen_address)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// No Prometheus endpoint.
    #[arg(long)]
    pub no_metrics: bool,
    /// Sync with knitter-manager at this gRPC address (host:port).
    #[arg(long)]
    pub manager: Option<String>,
    /// This node's name to the manager (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The Kubernetes cluster this node is in, as the manager names it (`knitterctl manager
    /// cluster add`; default: the manager's own cluster).
    #[arg(long)]
    pub cluster: Option<String>,
    /// File holding this node's token to the manager.
    #[arg(long)]
    pub manager_token_file: Option<PathBuf>,
    /// File holding the bootstrap token: join the manager with it (once) when this node has
    /// no token of its own yet.
    #[arg(long)]
    pub manager_bootstrap_token_file: Option<PathBuf>,
    /// Where the token got by joining is kept (default: beside the state file, or
    /// /var/lib/knitter/manager-token).
    #[arg(long)]
    pub manager_credential_file: Option<PathBuf>,
    /// Reach the manager over TLS: the CA (PEM) its certificate must chain to.
    #[arg(long)]
    pub manager_ca: Option<PathBuf>,
    /// The name in the manager's certificate (default: the host of --manager).
    #[arg(long)]
    pub manager_server_name: Option<String>,
    /// A client certificate (PEM), for a manager that asks for one (with --manager-key).
    #[arg(long, requires = "manager_key")]
    pub manager_cert: Option<PathBuf>,
    /// The key of --manager-cert (PEM).
    #[arg(long, requires = "manager_cert")]
    pub manager_key: Option<PathBuf>,
}

/// Everything the daemon runs with, file and command line merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api: ApiSection,
    pub pmd: PmdConfig,
    pub pool: PoolSection,
    pub tables: TablesSection,
    pub vhost: VhostSection,
    pub dpdk: DpdkSection,
    pub sriov: SriovSection,
    pub state_file: Option<PathBuf>,
    pub metrics: Option<std::net::SocketAddr>,
    pub manager: Option<ManagerLink>,
    /// The file's objects (all `local`).
    pub objects: NodeState,
}

fn read_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

impl Settings {
    pub fn from_args(args: &Args) -> Result<Settings> {
        let file = match &args.config {
            Some(p) => read_file(p)?,
            None if Path::new(DEFAULT_CONFIG).exists() => read_file(Path::new(DEFAULT_CONFIG))?,
            None => FileConfig::default(),
        };
        let objects = NodeState {
            bridges: file.bridges,
            ports: file.ports,
            vtep: file.vtep,
            ..NodeState::default()
        };
        if let Some(what) = objects.first_not_local() {
            bail!("the config file declares local objects only; {what} says otherwise");
        }
        let mut api = file.api;
        if let Some(s) = &args.socket {
            api.socket = s.clone();
        }
        api.tcp = args.api_tcp.or(api.tcp);
        api.tls_cert = args.tls_cert.clone().or(api.tls_cert);
        api.tls_key = args.tls_key.clone().or(api.tls_key);
        api.tls_client_ca = args.tls_client_ca.clone().or(api.tls_client_ca);
        let mut pmd = file.pmd;
        pmd.threads = args.pmd_threads.unwrap_or(pmd.threads);
        pmd.cores = args.pmd_cores.clone().unwrap_or(pmd.cores);
        pmd.idle = match args.idle {
            Some(Idle::Busy) => IdlePolicy::Busy,
            Some(Idle::Adaptive) if pmd.idle == IdlePolicy::Busy => IdlePolicy::default(),
            _ => pmd.idle,
        };
        if pmd.threads == 0 {
            bail!("pmd.threads must be at least 1");
        }
        let mut pool = file.pool;
        pool.buffers = args.buffers.or(pool.buffers);
        pool.pods = args.pods.unwrap_or(pool.pods);
        if !(1..=PoolSection::MAX_PODS).contains(&pool.pods) {
            bail!(
                "pool.pods {} is outside 1..{} (pod ports to size the buffer pool for)",
                pool.pods,
                PoolSection::MAX_PODS
            );
        }
        pool.hugepages &= !args.no_hugepages;
        let mut tables = file.tables;
        tables.fdb_entries = args.fdb_entries.unwrap_or(tables.fdb_entries);
        tables.emc_entries = args.emc_entries.unwrap_or(tables.emc_entries);
        tables.megaflow_entries = args.megaflow_entries.unwrap_or(tables.megaflow_entries);
        if !(16..=TablesSection::MAX_FDB).contains(&tables.fdb_entries) {
            bail!(
                "tables.fdb_entries {} is outside 16..{} (entries of the MAC table)",
                tables.fdb_entries,
                TablesSection::MAX_FDB
            );
        }
        if tables.emc_entries > TablesSection::MAX_EMC {
            bail!(
                "tables.emc_entries {} is above {} (entries of each PMD thread's cache; 0 turns it off)",
                tables.emc_entries,
                TablesSection::MAX_EMC
            );
        }
        if tables.megaflow_entries > TablesSection::MAX_EMC {
            bail!(
                "tables.megaflow_entries {} is above {} (entries of each half of each PMD thread's second-level cache; 0 turns it off)",
                tables.megaflow_entries,
                TablesSection::MAX_EMC
            );
        }
        let state_file = match (&args.state_file, args.no_state, file.state_file) {
            (_, true, _) => None,
            (Some(p), _, _) => Some(p.clone()),
            (None, _, Some(p)) if p.as_os_str().is_empty() => None,
            (None, _, Some(p)) => Some(p),
            (None, _, None) => Some(DEFAULT_STATE.into()),
        };
        let metrics = match (args.no_metrics, args.metrics_listen, file.metrics.listen.as_str()) {
            (true, _, _) | (false, None, "") => None,
            (false, Some(a), _) => Some(a),
            (false, None, a) => {
                Some(listen_address(a).map_err(|e| anyhow::anyhow!("metrics.listen: {e}"))?)
            }
        };
        let address = args.manager.clone().unwrap_or(file.manager.address);
        let manager = if address.is_empty() {
            None
        } else {
            let node_name = match args.node_name.clone().unwrap_or(file.manager.node_name) {
                n if n.is_empty() => host_name()?,
                n => n,
            };
            let token = match args.manager_token_file.clone().or(file.manager.token_file) {
                Some(p) => Some(
                    std::fs::read_to_string(&p)
                        .with_context(|| format!("reading the manager token {}", p.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            let join = match (
                &token,
                args.manager_bootstrap_token_file.clone().or(file.manager.bootstrap_token_file),
            ) {
                (None, Some(p)) => {
                    let bootstrap = std::fs::read_to_string(&p)
                        .with_context(|| format!("reading the bootstrap token {}", p.display()))?
                        .trim()
                        .to_string();
                    let default = match &state_file {
                        Some(s) => s.with_file_name("manager-token"),
                        None => PathBuf::from("/var/lib/knitter/manager-token"),
                    };
                    Some(crate::credential::Join {
                        bootstrap,
                        file: args
                            .manager_credential_file
                            .clone()
                            .or(file.manager.credential_file.clone())
                            .unwrap_or(default),
                    })
                }
                _ => None,
            };
            // A node that joined before starts with the token it got (no join, no wait).
            let token = match (token, &join) {
                (None, Some(j)) => crate::credential::stored(&j.file)?,
                (t, _) => t,
            };
            let ca = args.manager_ca.clone().or(file.manager.ca);
            let identity = match (
                args.manager_cert.clone().or(file.manager.cert),
                args.manager_key.clone().or(file.manager.key),
            ) {
                (Some(c), Some(k)) => Some((c, k)),
                (None, None) => None,
                _ => bail!("manager.cert and manager.key go together"),
            };
            if ca.is_none() && identity.is_some() {
                bail!(
                    "a client certificate for the manager needs its CA too (--manager-ca / manager.ca)"
                );
            }
            let server_name = args.manager_server_name.clone().unwrap_or(file.manager.server_name);
            let tls = match ca {
                None => None,
                Some(ca) => {
                    let name = Some(server_name.as_str()).filter(|n| !n.is_empty());
                    let identity = identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
                    Some(
                        knitter_api::ClientTls::read(&address, &ca, name, identity)
                            .context("the manager's TLS files")?,
                    )
                }
            };
            Some(ManagerLink {
                address,
                node_name,
                cluster: args.cluster.clone().unwrap_or(file.manager.cluster),
                token: crate::credential::Credential::given(token),
                join,
                tls,
            })
        };
        Ok(Settings {
            manager,
            metrics,
            api,
            pmd: PmdConfig { threads: pmd.threads, cores: pmd.cores, idle: pmd.idle },
            pool,
            tables,
            vhost: file.vhost,
            dpdk: {
                if let Some(d) = file.dpdk.dirs.iter().find(|d| {
                    !d.is_absolute() || d.components().any(|c| c == std::path::Component::ParentDir)
                }) {
                    bail!("dpdk.dirs: {} must be an absolute path without '..'", d.display());
                }
                file.dpdk
            },
            sriov: file.sriov,
            state_file,
            objects,
        })
    }
}

fn host_name() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (give --node-name)")?;
    Ok(name.trim().to_string())
}

/// The state to start from: the persisted one with the config file's objects laid over it
/// (added, or replacing a `local` object of the same name; an object the manager owns is
/// kept and the file's is skipped with a warning). Nothing is removed.
pub fn converge(mut state: NodeState, file: &NodeState) -> NodeState {
    for b in &file.bridges {
        match state.bridges.iter_mut().find(|x| x.item.name == b.item.name) {
            Some(x) if x.owner == Owner::Local => *x = b.clone(),
            Some(_) => {
                tracing::warn!(bridge = %b.item.name, "config file's bridge skipped: the manager owns it")
            }
            None => state.bridges.push(b.clone()),
        }
    }
    for p in &file.ports {
        match state.ports.iter_mut().find(|x| x.item.config.name == p.item.config.name) {
            Some(x) if x.owner == Owner::Local => *x = p.clone(),
            Some(_) => {
                tracing::warn!(port = %p.item.config.name, "config file's port skipped: the manager owns it")
            }
            None => state.ports.push(p.clone()),
        }
    }
    if let Some(v) = &file.vtep {
        match &state.vtep {
            Some(x) if x.owner == Owner::Manager => {
                tracing::warn!("config file's vtep skipped: the manager owns it")
            }
            _ => state.vtep = Some(v.clone()),
        }
    }
    state
}

/// An address to listen on: `IP:PORT`, `[IPv6]:PORT`, or an IPv6 address and `:PORT` without
/// brackets (what `$(POD_IP):9477` gives on an IPv6 pod).
fn listen_address(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad = || format!("{s:?} is not IP:PORT");
    let (ip, port) = s.rsplit_once(':').ok_or_else(bad)?;
    Ok(std::net::SocketAddr::new(ip.parse().map_err(|_| bad())?, port.parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_may_be_an_ipv6_pod_address_and_a_port() {
        let ok = |s: &str| listen_address(s).unwrap().to_string();
        assert_eq!(ok("10.0.0.5:9477"), "10.0.0.5:9477");
        assert_eq!(ok("[fd00::5]:9477"), "[fd00::5]:9477");
        assert_eq!(ok("fd00::5:9477"), "[fd00::5]:9477", "$(POD_IP):9477 on an IPv6 pod");
        for bad in ["10.0.0.5", "fd00::5", "x:9477", "10.0.0.5:port", ""] {
            assert!(listen_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_file_and_no_flags_run_on_defaults() {
        let args =
            <Args as clap::Parser>::parse_from(["knitter-vswitchd", "--config", "/dev/null"]);
        let s = Settings::from_args(&args).unwrap();
        assert_eq!(s.api.socket, Path::new(knitter_api::DEFAULT_NODE_SOCKET));
        assert_eq!((s.pmd.threads, s.pmd.idle), (1, IdlePolicy::default()));
        assert_eq!(s.state_file.as_deref(), Some(Path::new(DEFAULT_STATE)));
        assert_eq!(s.metrics, Some(DEFAULT_METRICS.parse().unwrap()));
    }

    /// Every documented key is optional, inside the idle policy too.
    #[test]
    fn the_minimal_adaptive_idle_policy_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vswitchd.toml");
        std::fs::write(&path, "[pmd]\nidle = { policy = \"adaptive\" }\n").unwrap();
        let args =
            <Args as clap::Parser>::parse_from(["x", "-c", path.to_str().unwrap(), "--no-state"]);
        assert_eq!(Settings::from_args(&args).unwrap().pmd.idle, IdlePolicy::default());
        std::fs::write(&path, "[pmd]\nidle = { policy = \"adaptive\", spin_us = 50 }\n").unwrap();
        let s = Settings::from_args(&args).unwrap();
        assert_eq!(s.pmd.idle, IdlePolicy::Adaptive { spin_us: 50, max_sleep_us: 10_000 });
    }

    #[test]
    fn the_command_line_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(
            &path,
            "[pmd]\nthreads = 2\nidle = { policy = \"busy\" }\n[pool]\nbuffers = 4096\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let args = <Args as clap::Parser>::parse_from([
            "x",
            "-c",
            p,
            "--pmd-threads",
            "1",
            "--idle",
            "adaptive",
            "--no-state",
        ]);
        let s = Settings::from_args(&args).unwrap();
        assert_eq!(
            (s.pmd.threads, s.pmd.idle, s.pool.buffers(), s.state_file),
            (1, IdlePolicy::default(), 4096, None)
        );
        assert_eq!(s.pool.sized_for_pods(), None, "buffers given");
    }

    /// Without `buffers`, the pool is sized for the pod ports the node expects: Kubernetes'
    /// 110 by default, `pods` in the file or `--pods`; out of range is refused with the range.
    #[test]
    fn the_pool_is_sized_for_the_pods_unless_buffers_are_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(&path, "").unwrap();
        let p = path.to_str().unwrap();
        let from = |extra: &[&str]| {
            let args = <Args as clap::Parser>::parse_from(
                ["x", "-c", p, "--no-state"].iter().chain(extra),
            );
            Settings::from_args(&args).map(|s| (s.pool.buffers(), s.pool.sized_for_pods()))
        };
        assert_eq!(from(&[]).unwrap(), (32768, Some(110)));
        assert_eq!(from(&["--pods", "200"]).unwrap(), (65536, Some(200)));
        assert_eq!(from(&["--pods", "300"]).unwrap(), (131072, Some(300)));
        assert_eq!(from(&["--pods", "56"]).unwrap(), (16384, Some(56)));
        assert_eq!(from(&["--pods", "300", "--buffers", "8192"]).unwrap(), (8192, None));
        std::fs::write(&path, "[pool]\npods = 20\n").unwrap();
        assert_eq!(from(&[]).unwrap(), (8192, Some(20)));
        let e = from(&["--pods", "0"]).unwrap_err();
        assert!(e.to_string().contains("pool.pods 0 is outside 1..4096"), "{e}");
    }

    /// The manager reached over TLS from the config file: the CA, the client certificate and
    /// its key read at start, the name to check defaulting to the address's host; a
    /// certificate without its key, or without a CA, refused with the reason.
    /// With a bootstrap token the node joins unless it joined before: then it starts with the
    /// token it kept (beside the state file by default, or where it is told).
    #[test]
    fn a_node_that_joined_starts_with_its_own_token() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bootstrap"), "boot\n").unwrap();
        let (boot, state) = (dir.path().join("bootstrap"), dir.path().join("vswitchd.json"));
        let args = <Args as clap::Parser>::parse_from([
            "x",
            "--config",
            "/dev/null",
            "--state-file",
            state.to_str().unwrap(),
            "--manager",
            "m:9481",
            "--node-name",
            "n1",
            "--manager-bootstrap-token-file",
            boot.to_str().unwrap(),
        ]);
        let link = Settings::from_args(&args).unwrap().manager.unwrap();
        let join = link.join.clone().unwrap();
        assert_eq!(
            (link.token.get(), join.bootstrap.as_str(), join.file.clone()),
            (None, "boot", dir.path().join("manager-token"))
        );
        std::fs::write(&join.file, "node.6e31.secret\n").unwrap();
        let link = Settings::from_args(&args).unwrap().manager.unwrap();
        assert_eq!(link.token.get().as_deref(), Some("node.6e31.secret"));
    }

    #[test]
    fn the_managers_tls_comes_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["ca.pem", "node.pem", "node.key", "token"] {
            std::fs::write(dir.path().join(f), "pem").unwrap();
        }
        let d = dir.path().display();
        let cfg = |tls: &str| {
            let path = dir.path().join("v.toml");
            std::fs::write(&path, format!("[manager]\naddress = \"mgr.example:9481\"\nnode_name = \"n1\"\ntoken_file = \"{d}/token\"\n{tls}")).unwrap();
            Settings::from_args(&<Args as clap::Parser>::parse_from([
                "x",
                "-c",
                path.to_str().unwrap(),
                "--no-state",
            ]))
        };
        let s =
            cfg(&format!("ca = \"{d}/ca.pem\"\ncert = \"{d}/node.pem\"\nkey = \"{d}/node.key\"\n"))
                .unwrap();
        let tls = s.manager.and_then(|m| m.tls).expect("TLS to the manager");
        assert_eq!(
            format!("{tls:?}"),
            r#"ClientTls { server_name: "mgr.example", client_certificate: true }"#
        );
        let e = format!(
            "{:#}",
            cfg(&format!("ca = \"{d}/ca.pem\"\ncert = \"{d}/node.pem\"\n")).unwrap_err()
        );
        assert!(e.contains("manager.cert and manager.key go together"), "{e}");
        let e = format!(
            "{:#}",
            cfg(&format!("cert = \"{d}/node.pem\"\nkey = \"{d}/node.key\"\n")).unwrap_err()
        );
        assert!(e.contains("needs its CA too"), "{e}");
        assert!(cfg("").unwrap().manager.is_some_and(|m| m.tls.is_none()), "plain without a CA");
    }

    /// A million-MAC node: the FDB and cache sizes from the file, the command line above it,
    /// sizes out of range refused with the range.
    #[test]
    fn the_tables_are_sized_by_the_file_and_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(
            &path,
            "[tables]\nfdb_entries = 1048576\nemc_entries = 524288\nmegaflow_entries = 1024\n[vhost]\nsingle_copy = false\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let s =
            Settings::from_args(&<Args as clap::Parser>::parse_from(["x", "-c", p, "--no-state"]))
                .unwrap();
        assert_eq!(
            s.tables,
            TablesSection { fdb_entries: 1 << 20, emc_entries: 1 << 19, megaflow_entries: 1024 }
        );
        assert!(!s.vhost.single_copy, "two copies, as the file says");
        let s = Settings::from_args(&<Args as clap::Parser>::parse_from([
            "x",
            "-c",
            p,
            "--no-state",
            "--emc-entries",
            "0",
            "--megaflow-entries",
            "0",
        ]))
        .unwrap();
        assert_eq!(s.tables.emc_entries, 0, "the cache off");
        assert_eq!(s.tables.megaflow_entries, 0, "the second level off");
        let d = Settings::from_args(&<Args as clap::Parser>::parse_from([
            "x",
            "-c",
            "/dev/null",
            "--no-state",
        ]))
        .unwrap();
        assert_eq!(
            d.tables,
            TablesSection { fdb_entries: 1 << 18, emc_entries: 1 << 18, megaflow_entries: 1 << 16 },
            "the defaults"
        );
        assert!(d.vhost.single_copy, "one copy by default");
        let e = format!(
            "{:#}",
            Settings::from_args(&<Args as clap::Parser>::parse_from([
                "x",
                "-c",
                p,
                "--fdb-entries",
                "33554432"
            ]))
            .unwrap_err()
        );
        assert!(e.contains("fdb_entries 33554432 is outside 16..16777216"), "{e}");
    }

    #[test]
    fn a_typo_in_the_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(&path, "[pmd]\nthread = 2\n").unwrap();
        let args = <Args as clap::Parser>::parse_from(["x", "-c", path.to_str().unwrap()]);
        let e = format!("{:#}", Settings::from_args(&args).unwrap_err());
        assert!(e.contains("thread") && e.contains("v.toml"), "{e}");
    }

    #[test]
    fn dpdk_dirs_are_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        for bad in ["\"dpdk\"", "\"\"", "\"/run/knitter/../kubelet\""] {
            std::fs::write(&path, format!("[dpdk]\ndirs = [{bad}]\n")).unwrap();
            let args = <Args as clap::Parser>::parse_from(["x", "-c", path.to_str().unwrap()]);
            let e = format!("{:#}", Settings::from_args(&args).unwrap_err());
            assert!(e.contains("dpdk.dirs") && e.contains("absolute"), "{bad}: {e}");
        }
        std::fs::write(&path, "[dpdk]\ndirs = [\"/run/knitter/dpdk\"]\n").unwrap();
        let args = <Args as clap::Parser>::parse_from(["x", "-c", path.to_str().unwrap()]);
        let s = Settings::from_args(&args).unwrap();
        assert_eq!(s.dpdk.dirs, vec![std::path::PathBuf::from("/run/knitter/dpdk")]);
    }

    #[test]
    fn the_file_converges_only_local_objects() {
        let mut managed = Owned::local(BridgeConfig::new("blue").vlan(200));
        managed.owner = Owner::Manager;
        let state = NodeState {
            bridges: vec![Owned::local(BridgeConfig::new("red")), managed.clone()],
            ..Default::default()
        };
        let file = NodeState {
            bridges: vec![
                Owned::local(BridgeConfig::new("red").vni(5001)),
                Owned::local(BridgeConfig::new("blue").vlan(300)),
            ],
            ..Default::default()
        };
        let s = converge(state, &file);
        assert_eq!(s.bridges, vec![Owned::local(BridgeConfig::new("red").vni(5001)), managed]);
    }
}

#[cfg(test)]
mod docs {
    /// The config file and the topology document shown in docs/operations.md parse.
    #[test]
    fn the_documented_examples_parse() {
        let doc = include_str!("../../docs/operations.md");
        let block = |fence: &str| {
            let start = doc.find(fence).unwrap_or_else(|| panic!("no {fence} block")) + fence.len();
            &doc[start..start + doc[start..].find("```").unwrap()]
        };
        let file: super::FileConfig =
            toml::from_str(&format!("state_file{}", block("```toml\nstate_file"))).unwrap();
        assert_eq!((file.bridges.len(), file.ports.len(), file.pmd.cores.clone()), (2, 4, vec![1]));
        assert!(
            file.ports.iter().any(|p| matches!(p.item.device, crate::state::Device::Dpdk { .. })),
            "the dpdk port example"
        );
        let dpdk: super::FileConfig =
            toml::from_str(&format!("[dpdk]{}", block("```toml\n[dpdk]"))).unwrap();
        assert_eq!(dpdk.dpdk.dirs, vec![std::path::PathBuf::from("/run/knitter/dpdk")]);
        let topo = crate::state::NodeState::parse(block("```yaml\n"), "yaml").unwrap().objects;
        assert_eq!((topo.bridges.len(), topo.ports.len()), (1, 2));
    }
}

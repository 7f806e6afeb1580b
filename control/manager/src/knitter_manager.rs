//! knitter-manager: the central manager. Serves the REST API over its store (embedded by
//! default, etcd with `--etcd`), and stops cleanly on SIGTERM or SIGINT.

#![forbid(unsafe_code)]

use anyhow::{Context, Result, bail};
use clap::Parser;
use knitter_manager::manager::cluster::{self, lease::LeaseOptions};
use knitter_manager::manager::limits::{Gate, GatedListener, Limits as ServerLimits};
use knitter_manager::manager::objects::Quota;
use knitter_manager::manager::sync::Liveness;
use knitter_manager::manager::tls::{ServerTls, TlsListener};
use knitter_manager::manager::{Config, Manager, grpc, rest};
use knitter_manager::network::Limits;
use knitter_manager::store::Store;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "knitter-manager",
    version,
    about = "Knitter's manager: tenants, networks, IP addresses, nodes"
)]
struct Args {
    /// Log lines as `text` (coloured only on a terminal; `NO_COLOR` honoured) or `json`.
    #[arg(long, env = "KNITTER_LOG_FORMAT", default_value_t = knitter_api::logging::LogFormat::Text)]
    log_format: knitter_api::logging::LogFormat,
    /// Address of the REST API.
    #[arg(long, env = "KNITTER_MANAGER_LISTEN", default_value = "127.0.0.1:9480")]
    listen: String,
    /// Where the embedded store and the generated token live.
    #[arg(long, env = "KNITTER_MANAGER_DATA", default_value = "/var/lib/knitter/manager")]
    data_dir: PathBuf,
    /// etcd endpoints (comma-separated, e.g. http://10.0.0.1:2379); the embedded store otherwise.
    #[arg(long, env = "KNITTER_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/knitter")]
    etcd_prefix: String,
    /// The CA (PEM) etcd's certificate must chain to (`https://` endpoints).
    #[arg(long, env = "KNITTER_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// A client certificate (PEM) for an etcd that requires one (`--client-cert-auth`).
    #[arg(long, env = "KNITTER_ETCD_CERT", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// The key of --etcd-cert (PEM).
    #[arg(long, env = "KNITTER_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// The etcd user (etcd's `auth enable`); its password in --etcd-password-file.
    #[arg(long, env = "KNITTER_ETCD_USER", requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long, env = "KNITTER_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
    /// File holding the bearer token; created with a random token (mode 0600) if missing.
    /// Default: <data-dir>/token.
    #[arg(long, env = "KNITTER_MANAGER_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// File holding the bootstrap token: it lets a node join (get a token of its own, for a
    /// name that has none) and nothing else; nodes carry it instead of the admin's token.
    #[arg(long, env = "KNITTER_MANAGER_BOOTSTRAP_TOKEN_FILE")]
    bootstrap_token_file: Option<PathBuf>,
    /// File holding a token that reads `/metrics` and nothing else (Prometheus's: the
    /// ServiceMonitor in deploy/kubernetes/monitoring). A file that does not exist (an
    /// optional Secret not made) leaves `/metrics` to the admin's token, with a warning.
    #[arg(long, env = "KNITTER_MANAGER_METRICS_TOKEN_FILE")]
    metrics_token_file: Option<PathBuf>,
    /// Let reads from this host (loopback) through without a token.
    #[arg(long)]
    loopback_reads: bool,
    /// Connections each API serves at once.
    #[arg(long, default_value_t = ServerLimits::default().connections)]
    max_connections: usize,
    /// Connections each API serves at once from one client address (more are closed as
    /// they come).
    #[arg(long, default_value_t = ServerLimits::default().per_client)]
    max_client_connections: usize,
    /// Seconds a REST client has to send a request's headers (and to start the next one on
    /// a kept-alive connection).
    #[arg(long, default_value_t = ServerLimits::default().header.as_secs())]
    header_timeout: u64,
    /// Seconds within which a REST request or a unary gRPC call is answered.
    #[arg(long, default_value_t = ServerLimits::default().request.as_secs())]
    request_timeout: u64,
    /// Seconds a connection may pass without a byte either way.
    #[arg(long, default_value_t = ServerLimits::default().idle.as_secs())]
    idle_timeout: u64,
    /// VNIs given to VXLAN networks that do not name one.
    #[arg(long, default_value = "5000-15000", value_parser = range)]
    vni_range: RangeInclusive<u32>,
    /// VLAN IDs given to VLAN networks that do not name one.
    #[arg(long, default_value = "2-4094", value_parser = range)]
    vlan_range: RangeInclusive<u32>,
    /// Underlay MTU assumed until a node registers its own.
    #[arg(long, default_value_t = 1500)]
    underlay_mtu: u32,
    /// Networks a new tenant may own unless its request says otherwise.
    #[arg(long, default_value_t = 10)]
    network_quota: u32,
    /// Address of the gRPC API (and the nodes' sync streams).
    #[arg(long, env = "KNITTER_MANAGER_GRPC", default_value = knitter_api::DEFAULT_MANAGER_GRPC)]
    grpc_listen: String,
    /// Seconds a node counts as alive after its last heartbeat.
    #[arg(long, default_value_t = 15)]
    node_lease: u64,
    /// Seconds a node whose lease ran out stays in the other nodes' flood lists.
    #[arg(long, default_value_t = 60)]
    node_grace: u64,
    /// Serve both APIs over TLS with this certificate chain (PEM); clients then need the CA
    /// that signed it (`knitterctl --manager-ca`, knitter-vswitchd `--manager-ca`, `curl --cacert`).
    #[arg(long, env = "KNITTER_MANAGER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "KNITTER_MANAGER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Also require client certificates signed by this CA (PEM) on both APIs.
    #[arg(long, env = "KNITTER_MANAGER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Watch the Kubernetes cluster: release the ports of deleted pods and the ports and
    /// flood-list place of deleted nodes (docs/kubernetes.md). In-cluster credentials, or
    /// --kubeconfig / $KUBECONFIG.
    #[arg(long, env = "KNITTER_KUBERNETES")]
    kubernetes: bool,
    /// The kubeconfig to use with --kubernetes (default: in-cluster, then $KUBECONFIG, then
    /// ~/.kube/config).
    #[arg(long, requires = "kubernetes")]
    kubeconfig: Option<PathBuf>,
    /// The Lease managers elect their leader over: namespace/name.
    #[arg(long, env = "KNITTER_LEASE", default_value = "kube-system/knitter-manager")]
    lease: String,
    /// This manager's identity in the Lease (default: the host name).
    #[arg(long, env = "KNITTER_IDENTITY")]
    identity: Option<String>,
    /// Seconds a leader that stopped renewing keeps the Lease (it stops acting after 2/3 of
    /// them without a renewal; candidates look every 2/15).
    #[arg(long, default_value_t = 15)]
    lease_secs: u64,
    /// Leave the manager's nodes alone when the cluster deletes them (by default their
    /// ports are released and they leave the flood lists).
    #[arg(long)]
    keep_deleted_nodes: bool,
    /// Keep each pod's k8s.v1.cni.cncf.io/network-status annotation current (standalone
    /// mode; where Multus runs it writes that annotation itself: leave this off).
    #[arg(long, requires = "kubernetes")]
    network_status: bool,
    /// Make the cluster's Network, IPGroup and Cluster resources (networks.knitter.io,
    /// ipgroups.knitter.io, clusters.knitter.io; the CRDs in deploy/kubernetes/base/crds/)
    /// on the manager, with a NetworkAttachmentDefinition per network in its tenant's
    /// namespaces.
    #[arg(long, env = "KNITTER_NETWORK_RESOURCES", requires = "kubernetes")]
    network_resources: bool,
    /// Where a Cluster resource's kubeconfigKey names a file: the directory the
    /// knitter-clusters Secret is mounted on.
    #[arg(long, env = "KNITTER_CLUSTER_KUBECONFIGS", default_value = cluster::KUBECONFIGS)]
    cluster_kubeconfigs: PathBuf,
    /// How planes are marked on the underlay, changes to the defaults (control=40/5,
    /// media=34/4, oam=16/2; std and eio unmarked): `plane=DSCP/PCP` or `plane=none`,
    /// comma-separated.
    #[arg(long, env = "KNITTER_PLANE_MARKING", default_value = "", value_parser = knitter_manager::network::PlaneMarkings::parse)]
    plane_marking: knitter_manager::network::PlaneMarkings,
}

/// The etcd TLS files and credentials of the flags, read.
fn etcd_access(a: &Args) -> Result<knitter_manager::store::etcd::EtcdAccess> {
    let read = |p: &PathBuf, what: &str| {
        std::fs::read(p).with_context(|| format!("reading the etcd {what} {}", p.display()))
    };
    let identity = match (&a.etcd_cert, &a.etcd_key) {
        (Some(c), Some(k)) => Some((read(c, "client certificate")?, read(k, "client key")?)),
        _ => None,
    };
    let user = match (&a.etcd_user, &a.etcd_password_file) {
        (Some(u), Some(p)) => Some((
            u.clone(),
            String::from_utf8(read(p, "password")?)
                .context("the etcd password is not UTF-8")?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        )),
        _ => None,
    };
    Ok(knitter_manager::store::etcd::EtcdAccess {
        ca: a.etcd_ca.as_ref().map(|p| read(p, "CA")).transpose()?,
        identity,
        user,
    })
}

/// How often the gRPC server pings a connection (a live sync stream is never idle), and how
/// long it waits for the answer.
const GRPC_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);
/// Streams one gRPC connection may have open at once.
const GRPC_STREAMS: u32 = 64;
/// The largest header block of a gRPC request (bytes).
const GRPC_HEADERS: u32 = 16 << 10;

fn range(s: &str) -> Result<RangeInclusive<u32>, String> {
    let (a, b) =
        s.split_once('-').ok_or_else(|| format!("{s:?} is not a range like 5000-15000"))?;
    let (a, b): (u32, u32) = (
        a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?,
        b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?,
    );
    if a > b {
        return Err(format!("range {s:?} is empty"));
    }
    Ok(a..=b)
}

/// The token in `path`, or a new random one written there (mode 0600).
fn token(path: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(t) = std::fs::read_to_string(path) {
        let t = t.trim().to_string();
        if t.is_empty() {
            bail!("token file {} is empty", path.display());
        }
        return Ok(t);
    }
    let mut raw = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .context("reading /dev/urandom")?;
    let t: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut f, format!("{t}\n").as_bytes())?;
    tracing::info!(file = %path.display(), "generated a bearer token");
    Ok(t)
}

/// The Kubernetes controller of `--kubernetes`.
async fn controller(a: &Args, manager: Arc<Manager>) -> Result<cluster::Controller> {
    let opts = controller_options(a)?;
    let config = match &a.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("the kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes credentials (in-cluster, $KUBECONFIG or ~/.kube/config)")?,
    };
    let client = kube::Client::try_from(config).context("a Kubernetes client")?;
    Ok(cluster::Controller::new(manager, client, opts))
}

/// How every cluster's controller runs (the own cluster's, and those `knitterctl manager
/// cluster add` adds).
fn controller_options(a: &Args) -> Result<cluster::Options> {
    let (namespace, name) = a
        .lease
        .split_once('/')
        .with_context(|| format!("--lease {:?} is not namespace/name", a.lease))?;
    let identity = match &a.identity {
        Some(i) => i.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .context("the host name (set --identity)")?,
    };
    let lease = LeaseOptions::timed(
        namespace,
        name,
        &identity,
        std::time::Duration::from_secs(a.lease_secs.max(3)),
    );
    Ok(cluster::Options {
        cluster: knitter_manager::manager::objects::LOCAL_CLUSTER.into(),
        cluster_id: String::new(),
        lease,
        release_nodes: !a.keep_deleted_nodes,
        network_status: a.network_status,
        network_resources: a.network_resources,
        kubeconfigs: a.cluster_kubeconfigs.clone(),
    })
}

/// Removes the records of port creates that a crash or a kill cut off (never served; their
/// addresses given back), and mends the nodes' host ports.
fn sweep(manager: &Manager) {
    match manager.sweep_placeholders(knitter_manager::manager::PLACEHOLDER_AGE_SECS) {
        Ok(0) => {}
        Ok(n) => tracing::info!(ports = n, "removed ports whose create was cut off"),
        Err(e) => tracing::warn!(error = %e, "sweeping ports whose create was cut off"),
    }
    match manager.sweep_host_ports() {
        Ok((0, 0)) => {}
        Ok((made, removed)) => tracing::info!(made, removed, "host ports mended"),
        Err(e) => tracing::warn!(error = %e, "sweeping host ports"),
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    knitter_api::logging::init(a.log_format);
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let token = token(&a.token_file.clone().unwrap_or_else(|| a.data_dir.join("token")))?;
    let store: Arc<dyn Store> = if a.etcd.is_empty() {
        let path = a.data_dir.join("store.redb");
        tracing::info!(store = %path.display(), "embedded store");
        Arc::new(knitter_manager::store::embedded::Embedded::open(&path)?)
    } else {
        tracing::info!(endpoints = ?a.etcd, prefix = %a.etcd_prefix, tls = a.etcd_ca.is_some(), user = ?a.etcd_user, "etcd store");
        Arc::new(knitter_manager::store::etcd::Etcd::connect_with(
            &a.etcd,
            &a.etcd_prefix,
            &etcd_access(&a)?,
        )?)
    };
    let config = Config {
        limits: Limits {
            vni_range: a.vni_range.clone(),
            vlan_range: a.vlan_range.clone(),
            underlay_mtu: a.underlay_mtu,
            ..Limits::default()
        },
        default_quota: Quota { networks: a.network_quota },
        liveness: Liveness { lease_secs: a.node_lease.max(1), grace_secs: a.node_grace },
        plane_markings: a.plane_marking,
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::read(cert, key, a.tls_client_ca.as_deref())?),
        _ => None,
    };
    let manager = Arc::new(Manager::new(store, config).context("preparing the store")?);
    sweep(&manager);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bootstrap = match &a.bootstrap_token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("reading the bootstrap token {}", p.display()))?
                .trim()
                .to_string();
            if t.is_empty() || t == token {
                bail!("the bootstrap token in {} is empty or the admin's", p.display());
            }
            Some(t)
        }
        None => None,
    };
    let mut auth = knitter_manager::manager::auth::Auth::new(
        token.clone(),
        bootstrap.clone(),
        a.loopback_reads,
    );
    match a.metrics_token_file.as_deref().map(|p| (p, std::fs::read_to_string(p))) {
        None => {}
        Some((p, Err(e))) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(file = %p.display(), "no metrics token: /metrics reads need the admin's token");
        }
        Some((p, read)) => {
            let t = read
                .with_context(|| format!("reading the metrics token {}", p.display()))?
                .trim()
                .to_string();
            if t.is_empty() || t == token || bootstrap.as_deref() == Some(t.as_str()) {
                bail!(
                    "the metrics token in {} is empty, the admin's or the bootstrap token",
                    p.display()
                );
            }
            auth = auth.with_metrics_token(t);
        }
    }
    let secs = std::time::Duration::from_secs;
    let limits = ServerLimits {
        connections: a.max_connections.max(1),
        per_client: a.max_client_connections.max(1),
        header: secs(a.header_timeout.max(1)),
        request: secs(a.request_timeout.max(1)),
        idle: secs(a.idle_timeout.max(1)),
        ..ServerLimits::default()
    };
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
        let grpc_listener = tokio::net::TcpListener::bind(&a.grpc_listen)
            .await
            .with_context(|| format!("binding {}", a.grpc_listen))?;
        tracing::info!(
            rest = %listener.local_addr()?,
            grpc = %grpc_listener.local_addr()?,
            tls = tls.is_some(),
            client_certificates = tls.as_ref().is_some_and(ServerTls::requires_client_certificates),
            "serving (REST: /v1, /v1/openapi.json; gRPC: knitter.manager.v1)"
        );
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            knitter_api::process::stop_signal().await;
            knitter_api::systemd::stopping();
            let _ = stop_tx.send(true);
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let sweeper = manager.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
            every.tick().await;
            loop {
                every.tick().await;
                let m = sweeper.clone();
                let _ = tokio::task::spawn_blocking(move || sweep(&m)).await;
            }
        });
        let own = match a.kubernetes {
            true => Some(controller(&a, manager.clone()).await?),
            false => None,
        };
        let cluster = own.as_ref().map(|c| c.status());
        let fleet =
            cluster::fleet::Fleet::new(manager.clone(), controller_options(&a)?, cluster.clone());
        let elected = own.map(|c| tokio::spawn(c.with_fleet(fleet.clone()).run(stop_rx.clone())));
        let fleet_task = tokio::spawn(fleet.clone().run(stop_rx.clone()));
        let metrics = Arc::new(knitter_manager::manager::metrics::Metrics::default());
        let mut service = grpc::Grpc::with_auth(manager.clone(), auth.clone())
            .with_metrics(metrics.clone())
            .with_fleet(fleet.clone());
        if let Some(s) = &cluster {
            service = service.with_cluster(s.clone());
        }
        let service = service
            .server()
            .max_decoding_message_size(limits.message)
            .max_encoding_message_size(limits.message);
        let service = knitter_manager::manager::metrics::CountedGrpc::new(service, metrics.clone());
        let mut builder = tonic::transport::Server::builder()
            .timeout(limits.request)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE))
            .max_concurrent_streams(Some(GRPC_STREAMS))
            .concurrency_limit_per_connection(GRPC_STREAMS as usize)
            .http2_max_header_list_size(Some(GRPC_HEADERS));
        if let Some(tls) = &tls {
            builder = builder.tls_config(tls.tonic()).context("gRPC TLS")?;
        }
        let grpc = builder.add_service(service).serve_with_incoming_shutdown(
            knitter_manager::manager::limits::incoming(grpc_listener, Gate::new(limits)),
            stopped(stop_rx.clone()),
        );
        let api = rest::Api { manager, auth: Arc::new(auth), cluster, fleet: Some(fleet), metrics };
        let rest_tls = tls.as_ref().map(ServerTls::rustls).transpose()?;
        let rest_stop = stopped(stop_rx.clone());
        let rest = async move {
            let gate = Gate::new(limits);
            match rest_tls {
                Some(cfg) => {
                    rest::serve(TlsListener::new(listener, gate, cfg)?, api, limits, rest_stop)
                        .await
                }
                None => {
                    rest::serve(GatedListener { tcp: listener, gate }, api, limits, rest_stop).await
                }
            }
        };
        knitter_api::systemd::ready();
        // Sync streams stay open until their nodes go: give them 2 s after a stop.
        let deadline = async {
            stopped(stop_rx).await;
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        };
        tokio::select! {
            (g, r) = async { tokio::join!(grpc, rest) } => {
                g.context("gRPC server")?;
                r.context("REST server")?;
            }
            _ = deadline => tracing::info!("streams still open after 2 s; stopping anyway"),
        }
        // The controller stops acting, then gives the Lease up (one bounded call), so a
        // rolling update hands over at the standby's next look.
        let bound = cluster::CALL_TIMEOUT + std::time::Duration::from_secs(2);
        if tokio::time::timeout(bound, fleet_task).await.is_err() {
            tracing::warn!(
                "the added clusters' controllers did not stop within {} s",
                bound.as_secs()
            );
        }
        if let Some(task) = elected {
            let bound = cluster::CALL_TIMEOUT + std::time::Duration::from_secs(1);
            if tokio::time::timeout(bound, task).await.is_err() {
                tracing::warn!(
                    "the Kubernetes controller did not stop within {} s",
                    bound.as_secs()
                );
            }
        }
        tracing::info!("stopped");
        Ok(())
    })
}

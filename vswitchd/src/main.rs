//! knitter-vswitchd: one per node. Runs the switch (PMD threads) over the ports it is told
//! about, serves the node API on a unix socket, ages the forwarding table, persists what it
//! runs, and stops cleanly on SIGTERM or SIGINT.

#![forbid(unsafe_code)]

mod api;
mod attach;
mod capture;
mod convert;
mod credential;
mod devices;
mod events;
mod from_manager;
mod grpc;
mod handoff;
mod host;
mod join;
mod links;
mod manager;
mod metrics;
mod node;
mod plumb;
mod pod_dirs;
mod records;
mod settings;
mod state;
mod sync;
mod trace;
mod underlay;
mod vf;
mod views;

use anyhow::{Context, Result};
use clap::Parser;
use std::path::Path;
use std::sync::Arc;
use tokio::net::UnixListener;

fn main() -> Result<()> {
    let args = settings::Args::parse();
    // Logs on stderr, as docs/operations.md says (stdout stays free for whoever runs us).
    knitter_api::logging::init(args.log_format);
    let s = settings::Settings::from_args(&args)?;
    // Before anything is opened, loaded or bound: a second daemon for this socket stops here.
    let _lock = lock_socket(&s.api.socket)?;
    let persisted = match &s.state_file {
        Some(p) => state::NodeState::load(p)?,
        None => state::NodeState::default(),
    };
    let start = settings::converge(persisted, &s.objects);
    knitter_vhost::port::set_single_copy_default(s.vhost.single_copy);
    knitter_vhost::backend::set_max_guest_memory(
        s.vhost.max_guest_memory_mib.saturating_mul(1 << 20),
    );
    devices::set_eal_args(s.dpdk.eal_args.clone());
    let opts = node::NodeOptions {
        pmd: s.pmd.clone(),
        buffers: s.pool.buffers(),
        sized_for_pods: s.pool.sized_for_pods(),
        hugepages: s.pool.hugepages,
        tables: vswitch::SwitchOptions {
            fdb_entries: s.tables.fdb_entries,
            emc_entries: s.tables.emc_entries as usize,
            megaflow_entries: s.tables.megaflow_entries as usize,
            ..Default::default()
        },
        state_file: s.state_file.clone(),
        dpdk_dirs: pod_dirs::Dirs {
            pods: vec![s.vhost.kubelet_pods_dir.clone(), handoff::DEFAULT_DIR.into()],
            allowed: s.dpdk.dirs.clone(),
        },
    };
    let vfs = vf::set_node_vfs(vf::Vfs::new(&s.sriov));
    let node = Arc::new(node::Node::start(opts, start).context("starting the switch")?);
    if let Some(p) = &s.state_file {
        node.state().save(p)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = rt.block_on(serve(node.clone(), vfs, &s));
    node.stop();
    tracing::info!("stopped");
    served
}

/// The lock file beside the node API's socket (`<socket>.lock`), held locked (`flock`) for
/// the daemon's life and holding its pid: a second daemon for the same socket is refused
/// before it touches ports, state or the socket, and is told which process runs. The kernel
/// drops the lock when the process ends however it ends, so a stale file locks nothing.
fn lock_socket(socket: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut path = socket.as_os_str().to_owned();
    path.push(".lock");
    let path = std::path::PathBuf::from(path);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let who = match pid.trim() {
                "" => "another knitter-vswitchd".to_string(),
                p => format!("another knitter-vswitchd (pid {p})"),
            };
            anyhow::bail!(
                "{who} already runs the node API on {} (it holds {}); stop it first",
                socket.display(),
                path.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

/// The node API's socket file, removed when dropped: only by the daemon that made it.
struct SocketFile(std::path::PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A listener on `path`: its directory made, a stale socket replaced (the lock says no
/// daemon serves it), the mode set; the file goes when the returned guard does.
fn bind(path: &Path, mode: u32) -> Result<(UnixListener, SocketFile)> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        // A daemon from before the lock file, or one that was given another lock's path.
        anyhow::bail!("another daemon already serves {}", path.display());
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    let file = SocketFile(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok((l, file))
}

async fn serve(node: Arc<node::Node>, vfs: Arc<vf::Vfs>, s: &settings::Settings) -> Result<()> {
    let api = &s.api;
    let (listener, _socket_file) = bind(&api.socket, api.socket_mode)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        knitter_api::process::stop_signal().await;
        knitter_api::systemd::stopping();
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let aging = {
        let node = node.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                node.switch.age(vswitch::util::coarse_secs());
            }
        })
    };
    let links = tokio::spawn(links::watch_links(node.clone(), LINK_POLL));
    let neighbors = tokio::spawn(underlay::follow_kernel_neighbors(node.clone()));
    let manager = s.manager.clone().map(manager::Manager::new).transpose()?;
    if let Some(m) = &manager
        && let Some(join) = &m.link().join
    {
        tokio::spawn(join::run(node.clone(), m.clone(), join.clone()));
    }
    let attacher =
        attach::Attacher::new(node.clone(), manager.clone(), vfs, s.vhost.kubelet_pods_dir.clone());
    let releases = tokio::spawn(attacher.clone().retry_releases());
    let manager = manager.map(|m| {
        tracing::info!(manager = %m.link().address, node = %m.link().node_name, "syncing with the manager");
        tokio::spawn(sync::run(node.clone(), m))
    });
    if let Some(addr) = s.metrics {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics endpoint {addr}"))?;
        tracing::info!(addr = %l.local_addr()?, "metrics on /metrics");
        let (node, stop) = (node.clone(), stopped(stop_rx.clone()));
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(node, l, stop).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    tracing::info!(socket = %api.socket.display(), "node API ready");
    let service = knitter_api::node::node_server::NodeServer::new(api::Api { node });
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<knitter_api::node::node_server::NodeServer<api::Api>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(knitter_api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("gRPC reflection")?;
    if let Some((addr, tls)) = api.tcp_tls()? {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert, &tls.key));
        if let Some(ca) = &tls.client_ca {
            cfg = cfg.client_ca_root(Certificate::from_pem(ca));
        }
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("node API on {addr}"))?;
        tracing::info!(addr = %tcp.local_addr()?, client_certs = tls.client_ca.is_some(), "node API on TCP with TLS");
        let server = tonic::transport::Server::builder()
            .tls_config(cfg)
            .context("TLS configuration")?
            .add_service(health_service.clone())
            .add_service(reflection.clone())
            .add_service(service.clone())
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(tcp).with_nodelay(Some(true)),
                stopped(stop_rx.clone()),
            );
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "node API on TCP failed");
            }
        });
    }
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service)
        .add_service(knitter_api::node::attach_server::AttachServer::new(attacher))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            stopped(stop_rx.clone()),
        );
    // The socket is bound and the state restored: systemd (Type=notify) may start what
    // waits for the node.
    knitter_api::systemd::ready();
    // Open connections get a moment to finish their calls; a client that never lets go
    // does not hold the stop.
    let r = tokio::select! {
        r = server => r.context("node API server"),
        _ = async { stopped(stop_rx).await; tokio::time::sleep(GRACE).await } => {
            tracing::warn!("clients still connected after {GRACE:?}: stopping anyway");
            Ok(())
        }
    };
    aging.abort();
    links.abort();
    neighbors.abort();
    releases.abort();
    if let Some(m) = manager {
        m.abort();
    }
    r
}

/// How often port links are asked for (events, `link_up` for kernel ports).
const LINK_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a stop waits for API calls in flight.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

//! The Kubernetes API server stand-in of the controller's tests, as a program `kubectl` can
//! talk to (no kube-apiserver runs on the build machines): it writes a kubeconfig for the
//! cluster admin and one for the manager's service account (held to the shipped RBAC), makes
//! the namespaces a new cluster has and the nodes asked for, and serves until stopped. What it models and what it does not is
//! listed in `tests/common/apiserver.rs` and `tests/common/apiserver/kubectl.rs`.
//!
//!   cargo run -p knitter-manager --example apiserver -- --kubeconfig-dir /tmp/stand-in &
//!   KUBECONFIG=/tmp/stand-in/admin.kubeconfig kubectl get nodes

#[allow(dead_code)]
#[path = "../tests/common/apiserver.rs"]
mod apiserver;

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "A Kubernetes API server stand-in for kubectl and the manager's controller")]
struct Args {
    /// The address to serve plain HTTP on, as the manager's service account sees it (the
    /// shipped RBAC enforced).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The cluster admin's address (nothing refused).
    #[arg(long, default_value = "127.0.0.1:0")]
    admin_listen: String,
    /// Where to write admin.kubeconfig and manager.kubeconfig.
    #[arg(long)]
    kubeconfig_dir: PathBuf,
    /// How many nodes the cluster has (node-1, node-2, ...), unless named with --node.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// A node of the cluster, by name (repeat for more; instead of --nodes).
    #[arg(long = "node")]
    node_names: Vec<String>,
    /// A pod running on a node: NAMESPACE/NAME@NODE (its UID `uid-NAMESPACE-NAME`; repeat
    /// for more).
    #[arg(long = "pod")]
    pods: Vec<String>,
    /// Enforce the standalone overlay's RBAC (the pod patch of --network-status) too.
    #[arg(long, conflicts_with = "member")]
    standalone: bool,
    /// Enforce the member overlay's RBAC (overlays/member: the manager's controller in a
    /// cluster it serves besides its own) instead of the base's.
    #[arg(long)]
    member: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let listener = tokio::net::TcpListener::bind(&a.listen).await.context("--listen")?;
    let rbac = match (a.standalone, a.member) {
        (true, _) => apiserver::Rbac::Standalone,
        (_, true) => apiserver::Rbac::Member,
        _ => apiserver::Rbac::Base,
    };
    let admin = tokio::net::TcpListener::bind(&a.admin_listen).await.context("--admin-listen")?;
    let api = apiserver::ApiServer::serve(listener, admin, rbac);
    // As a new cluster has them.
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        api.add_namespace(ns, &[("kubernetes.io/metadata.name", ns)]);
    }
    let nodes = match a.node_names.is_empty() {
        true => (1..=a.nodes).map(|i| format!("node-{i}")).collect(),
        false => a.node_names.clone(),
    };
    for node in &nodes {
        api.add_node(node);
    }
    for pod in &a.pods {
        let parsed = pod.split_once('@').and_then(|(p, node)| Some((p.split_once('/')?, node)));
        let Some(((namespace, name), node)) = parsed else {
            anyhow::bail!("--pod {pod:?} is not NAMESPACE/NAME@NODE");
        };
        api.add_pod(namespace, name, &format!("uid-{namespace}-{name}"), node);
    }
    std::fs::create_dir_all(&a.kubeconfig_dir).context("--kubeconfig-dir")?;
    for (file, admin) in [("admin.kubeconfig", true), ("manager.kubeconfig", false)] {
        let path = a.kubeconfig_dir.join(file);
        std::fs::write(&path, api.kubeconfig(admin)).with_context(|| path.display().to_string())?;
    }
    println!(
        "serving the manager on {}, the admin on {}; kubeconfigs in {}",
        api.url,
        api.admin_url,
        a.kubeconfig_dir.display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = terminate.recv() => {}
    }
    for denied in api.take_denied() {
        println!("refused by the shipped RBAC: {denied}");
    }
    Ok(())
}

//! Node sync, the node's side: registers with knitter-manager over its gRPC `Sync` stream
//! and converges the `manager` objects to each desired state it sends (a bridge domain per
//! network with pods here: VNI or VLAN, flood list, the pods' MACs behind their VTEPs,
//! ARP/ND suppression; the other nodes' VTEPs as peers). When the manager is unreachable
//! the node keeps forwarding on the last state it applied (persisted with the rest) and
//! reconnects with back-off; every stream starts with a whole state, so nothing is
//! replayed.

use crate::from_manager::{Desired, desired};
use crate::manager::Manager;
use crate::node::Node;
use crate::settings::ManagerLink;
use anyhow::{Context, Result, bail};
use knitter_api::manager as pb;
use std::sync::Arc;
use std::time::Duration;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Keeps a sync stream open for as long as the daemon runs.
pub async fn run(node: Arc<Node>, manager: Manager) {
    let link = manager.link().clone();
    let mut backoff = Duration::from_secs(1);
    let mut revision = 0;
    let mut waiting_for_vtep = false;
    loop {
        // Nothing to register before the VTEP is set: check each second, quietly.
        if let Err(e) = registration(&node, &link) {
            if !waiting_for_vtep {
                tracing::info!(reason = %e, "not syncing with the manager yet");
                waiting_for_vtep = true;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        waiting_for_vtep = false;
        let before = revision;
        match session(&node, &manager, &mut revision).await {
            Ok(()) => {
                tracing::warn!(manager = %link.address, "manager closed the sync stream; forwarding on the last desired state")
            }
            Err(e) => {
                tracing::warn!(manager = %link.address, error = %format!("{e:#}"), "no sync stream; forwarding on the last desired state");
                if let Some(why) = crate::join::refusal(&e, false) {
                    node.set_manager_refusal(Some(format!("syncing: {why}")));
                }
            }
        }
        if revision != before {
            backoff = Duration::from_secs(1);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One stream: register, then apply each desired state until the stream ends.
async fn session(node: &Arc<Node>, manager: &Manager, revision: &mut u64) -> Result<()> {
    let link = manager.link();
    let me = registration(node, link)?;
    let mut stream = manager
        .sync(pb::SyncRequest { node: Some(me), revision: *revision })
        .await
        .context("opening the sync stream")?;
    tracing::info!(manager = %link.address, node = %link.node_name, "sync stream open");
    node.set_manager_refusal(None);
    // A desired state some of whose ports did not open (a host port whose interface is
    // taken, say) is applied again every few seconds until they do.
    let mut pending: Option<(u64, Desired)> = None;
    let mut retry_in = PORT_RETRY;
    loop {
        let retry = async {
            match &pending {
                Some(_) => tokio::time::sleep(retry_in).await,
                None => std::future::pending().await,
            }
        };
        let (rev, want) = tokio::select! {
            m = stream.message() => {
                let Some(d) = m.context("sync stream")? else { break };
                match desired(&d, &link.node_name) {
                    Ok(want) => (d.revision, want),
                    Err(e) => {
                        tracing::error!(revision = d.revision, error = %format!("{e:#}"), "desired state not applied");
                        continue;
                    }
                }
            }
            () = retry => match pending.take() {
                Some(p) => {
                    retry_in = (retry_in * 2).min(MAX_PORT_RETRY);
                    p
                }
                None => continue,
            },
        };
        let n = node.clone();
        let (bridges, peers, ports) = want.clone();
        pending = None;
        match tokio::task::spawn_blocking(move || n.converge_manager(bridges, peers, ports)).await?
        {
            Ok(r) if r.retry => {
                pending = Some((rev, want));
                tracing::info!(revision = rev, generation = r.generation, added = ?r.added, changed = ?r.changed, removed = ?r.removed, skipped = ?r.skipped, retry_in = ?retry_in, "converged to the manager's state, some of it not yet")
            }
            Ok(r)
                if r.added.is_empty()
                    && r.changed.is_empty()
                    && r.removed.is_empty()
                    && r.skipped.is_empty() =>
            {
                retry_in = PORT_RETRY
            }
            Ok(r) => {
                retry_in = PORT_RETRY;
                tracing::info!(revision = rev, generation = r.generation, added = ?r.added, changed = ?r.changed, removed = ?r.removed, skipped = ?r.skipped, "converged to the manager's state")
            }
            Err(e) => {
                tracing::error!(revision = rev, error = %e, "the manager's state was refused; keeping the last one")
            }
        }
        *revision = rev;
    }
    Ok(())
}

/// How soon a desired state whose ports did not all open is applied again (doubling up to
/// [`MAX_PORT_RETRY`] while they still do not).
const PORT_RETRY: Duration = Duration::from_secs(5);
const MAX_PORT_RETRY: Duration = Duration::from_secs(80);

/// This node as it registers: its VTEP, its underlay's MTU, its cluster.
fn registration(node: &Node, link: &ManagerLink) -> Result<pb::Node> {
    let state = node.state();
    let Some(vtep) = &state.vtep else {
        bail!(
            "no VTEP configured: the manager knows nodes by their VTEP address (set [vtep] or `knitterctl vtep set`)"
        )
    };
    let mtu = state.port(&vtep.item.underlay_port).map_or(1500, |p| p.item.config.mtu);
    Ok(pb::Node {
        name: link.node_name.clone(),
        cluster: link.cluster.clone(),
        vtep: vtep.item.local_ip.to_string(),
        underlay_mtu: Some(u32::from(mtu)),
        capabilities: vec!["vhost-user".into(), "af-xdp".into(), "af-packet".into()],
        ..Default::default()
    })
}

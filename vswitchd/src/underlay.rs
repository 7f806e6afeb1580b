//! The shared-address VTEP's next hops, followed from the kernel: when the VTEP's address
//! is the node's own (`shared_address`), the kernel answers ARP/ND for it and resolves the
//! peers, and the switch copies the MACs of their next hops from the kernel's neighbor
//! and route tables (`kernel_ports::kernel_neigh`: rtnetlink notifications, a full read on
//! route changes and every [`RESYNC`]), in the underlay device's network namespace. Without
//! this the daemon never resolved a peer in that mode and sent nothing.

use crate::node::Node;
use kernel_ports::kernel_neigh::KernelNeighbors;
use std::sync::Arc;
use std::time::Duration;

/// Full reads of the kernel's tables between notifications (a safety net).
const RESYNC: Duration = Duration::from_secs(30);
/// How often the daemon looks whether the VTEP went to or left the shared-address mode, or
/// its underlay moved to another namespace.
const CHECK: Duration = Duration::from_secs(1);

/// Follows the kernel's tables for as long as the daemon runs, in the namespace of the
/// shared-address VTEP's underlay; does nothing while the VTEP is not in that mode.
pub async fn follow_kernel_neighbors(node: Arc<Node>) {
    let mut following: Option<(Option<String>, KernelNeighbors)> = None;
    let mut tick = tokio::time::interval(CHECK);
    let mut warned = false;
    loop {
        tick.tick().await;
        let want = node.shared_vtep_netns();
        if following.as_ref().map(|f| &f.0) == want.as_ref() {
            continue;
        }
        // Stopping joins the old follower's thread (up to 100 ms): off the async workers.
        let old = following.take();
        let switch = node.switch.clone();
        let netns = want.clone();
        let started = tokio::task::spawn_blocking(move || {
            drop(old);
            netns.map(|ns| {
                crate::devices::kernel(&ns, move || KernelNeighbors::start(switch, RESYNC))
            })
        })
        .await;
        match started {
            Ok(None) => {}
            Ok(Some(Ok(k))) => {
                following = want.map(|ns| (ns, k));
                warned = false;
            }
            Ok(Some(Err(e))) if !warned => {
                tracing::warn!(error = %e, "cannot follow the kernel's neighbor table for the shared-address VTEP");
                warned = true;
            }
            Ok(Some(Err(_))) => {}
            Err(e) => tracing::error!(error = %e, "the kernel-neighbor follower failed"),
        }
    }
}

//! The shared-address VTEP's next hops, followed from the kernel: when the VTEP's address
//! is the node's own (`shared_address`), the kernel answers ARP/ND for it and resolves the
//! peers, and the switch copies the MACs of their next hops from the kernel's neighbour
//! and route tables (`kernel_ports::kernel_neigh`), read in the underlay device's network
//! namespace. Without this the daemon never resolved a peer in that mode and sent nothing.

use crate::node::Node;
use std::sync::Arc;
use std::time::Duration;

/// How often the kernel's tables are read (a peer not known yet is asked for at most once a
/// second; frames for it wait in the neighbour queue meanwhile).
const PERIOD: Duration = Duration::from_millis(200);

/// Follows the kernel's tables for as long as the daemon runs; does nothing while the VTEP
/// is not in the shared-address mode.
pub async fn follow_kernel_neighbours(node: Arc<Node>) {
    let mut tick = tokio::time::interval(PERIOD);
    let mut warned = false;
    loop {
        tick.tick().await;
        let Some(netns) = node.shared_vtep_netns() else { continue };
        let switch = node.switch.clone();
        let synced = tokio::task::spawn_blocking(move || {
            crate::devices::kernel(&netns, move || kernel_ports::kernel_neigh::sync_once(&switch, vswitch::util::coarse_secs()))
        })
        .await;
        match synced {
            Ok(Ok(_)) => warned = false,
            Ok(Err(e)) if !warned => {
                tracing::warn!(error = %e, "cannot read the kernel's neighbour table for the shared-address VTEP");
                warned = true;
            }
            Ok(Err(_)) => {}
            Err(e) => tracing::error!(error = %e, "the kernel-neighbour follower failed"),
        }
    }
}

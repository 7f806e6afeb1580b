//! Joining the manager with the bootstrap token (`--manager-bootstrap-token-file`): the node
//! asks for a token of its own until it gets one (the manager may start after it), keeps it
//! in the credential file ([`crate::credential`]) and says on the node why the manager
//! refused, when it does.

use crate::credential::{self, Join};
use crate::manager::Manager;
use crate::node::Node;
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;

/// Gets the node a token with the bootstrap token, once.
async fn join_once(manager: &Manager, join: &Join) -> Result<String> {
    let link = manager.link();
    match manager.join(&join.bootstrap).await {
        Ok(token) => Ok(token),
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            let hint = format!(
                "put the token it issues into {} (knitterctl manager node token {} > {})",
                join.file.display(),
                link.node_name,
                join.file.display()
            );
            Err(s).context(hint)
        }
        Err(s) => Err(s).context("joining"),
    }
}

/// The manager's refusal of a credential in `e` (unauthenticated, permission denied; when
/// `joining`, also a name that joined before), as opposed to a manager that could not be
/// reached or a refusal of something else.
pub fn refusal(e: &anyhow::Error, joining: bool) -> Option<String> {
    use tonic::Code::{AlreadyExists, PermissionDenied, Unauthenticated};
    let s = e.chain().find_map(|c| c.downcast_ref::<tonic::Status>())?;
    let refused = matches!(s.code(), Unauthenticated | PermissionDenied)
        || (joining && s.code() == AlreadyExists);
    refused.then(|| format!("{:?}: {}", s.code(), s.message()))
}

/// Fills in the node's credential by joining (retried with back-off until it works: the
/// manager may start after the node). A node that joined before has its token from the
/// credential file already (read with the settings).
pub async fn run(node: Arc<Node>, manager: Manager, join: Join) {
    let link = manager.link();
    if link.token.get().is_some() {
        return;
    }
    let mut wait = Duration::from_secs(1);
    loop {
        match join_once(&manager, &join).await {
            Ok(t) => {
                if let Err(e) = credential::store(&join.file, &t) {
                    tracing::error!(error = %format!("{e:#}"), "the node's token is not kept: it joins again after a restart, which the manager refuses");
                }
                tracing::info!(node = %link.node_name, file = %join.file.display(), "joined the manager with the bootstrap token");
                node.set_manager_refusal(None);
                link.token.set(t);
                return;
            }
            Err(e) => {
                tracing::warn!(manager = %link.address, node = %link.node_name, error = %format!("{e:#}"), "not joined yet");
                if let Some(why) = refusal(&e, true) {
                    node.set_manager_refusal(Some(format!("joining: {why}")));
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

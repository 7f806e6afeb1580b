//! The node's own credential on the manager: the token the operator gave it
//! (`--manager-token-file`: a node token from `knitterctl manager node token NAME`, or, on a
//! trusted node, the admin's), or one it got by joining with the bootstrap token
//! (`--manager-bootstrap-token-file`), kept in the credential file (mode 0600) for restarts.
//! The manager issues a bootstrap join once a node name: a node whose credential file is lost
//! gets a new token from the admin.

use crate::manager::Manager;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The bearer token the node presents, once it has one (shared by the attach API and the
/// sync stream; filled in by [`join`] when the node joins after it started).
#[derive(Debug, Clone)]
pub struct Credential(Arc<tokio::sync::watch::Sender<Option<String>>>);

impl Credential {
    pub fn given(token: Option<String>) -> Credential {
        Credential(Arc::new(tokio::sync::watch::Sender::new(token)))
    }

    /// The token, if the node has one yet.
    pub fn get(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// The token, waiting up to `within` for the node to join.
    pub async fn ready(&self, within: Duration) -> Option<String> {
        let mut rx = self.0.subscribe();
        let _ = tokio::time::timeout(within, rx.wait_for(Option::is_some)).await;
        self.get()
    }

    fn set(&self, token: String) {
        self.0.send_replace(Some(token));
    }
}

/// How the node joins: the bootstrap token and where it keeps what it gets.
#[derive(Debug, Clone)]
pub struct Join {
    pub bootstrap: String,
    pub file: PathBuf,
}

/// The credential file's token, if there is one.
pub fn stored(file: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(file) {
        Ok(t) if !t.trim().is_empty() => Ok(Some(t.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("reading the node's credential {}", file.display()))
        }
    }
}

fn store(file: &Path, token: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = file.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, file).with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}

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
pub async fn join(node: std::sync::Arc<crate::node::Node>, manager: Manager, join: Join) {
    let link = manager.link();
    if link.token.get().is_some() {
        return;
    }
    let mut wait = Duration::from_secs(1);
    loop {
        match join_once(&manager, &join).await {
            Ok(t) => {
                if let Err(e) = store(&join.file, &t) {
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

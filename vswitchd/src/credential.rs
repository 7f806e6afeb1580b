//! The node's own credential on the manager: the token the operator gave it
//! (`--manager-token-file`: a node token from `knitterctl manager node token NAME`, or, on a
//! trusted node, the admin's), or one it got by joining with the bootstrap token
//! (`--manager-bootstrap-token-file`), kept in the credential file (mode 0600) for restarts.
//! The manager issues a bootstrap join once a node name: a node whose credential file is lost
//! gets a new token from the admin.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The bearer token the node presents, once it has one (shared by the attach API and the
/// sync stream; filled in by [`crate::join`] when the node joins after it started).
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

    /// The token the node joined with ([`crate::join`]).
    pub fn set(&self, token: String) {
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

/// Keeps `token` in the credential file (mode 0600, written whole or not at all).
pub fn store(file: &Path, token: &str) -> Result<()> {
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

//! How knitterctl reaches the manager: its address, TLS and the token (`Target`, the
//! `--manager`, `--token…` and `--manager-…` options), and the bearer token on each request.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use tonic::transport::Channel;

/// Where the manager is and how to prove who we are (shown under `knitterctl manager`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Manager (knitterctl manager ...)")]
pub struct Target {
    /// The manager's gRPC address.
    #[arg(long, global = true, env = "KNITTER_MANAGER", default_value = knitter_api::DEFAULT_MANAGER_GRPC)]
    pub manager: String,
    /// The bearer token (default: read from --token-file).
    #[arg(long, global = true, env = "KNITTER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token.
    #[arg(
        long,
        global = true,
        env = "KNITTER_TOKEN_FILE",
        default_value = "/var/lib/knitter/manager/token"
    )]
    token_file: PathBuf,
    /// Reach the manager over TLS: the CA (PEM) its certificate must chain to.
    #[arg(long, global = true, env = "KNITTER_MANAGER_CA")]
    pub manager_ca: Option<PathBuf>,
    /// The name in the manager's certificate (default: the host of --manager).
    #[arg(long, global = true, requires = "manager_ca")]
    manager_server_name: Option<String>,
    /// A client certificate (PEM), for a manager that asks for one (with --manager-key).
    #[arg(long, global = true, requires_all = ["manager_key", "manager_ca"])]
    pub manager_cert: Option<PathBuf>,
    /// The key of --manager-cert (PEM).
    #[arg(long, global = true, requires = "manager_cert")]
    manager_key: Option<PathBuf>,
}

/// Every option of [`Target`] (`knitterctl node ...` and the other node commands hide them).
pub const TARGET_OPTIONS: [&str; 7] = [
    "manager",
    "token",
    "token_file",
    "manager_ca",
    "manager_server_name",
    "manager_cert",
    "manager_key",
];

impl Target {
    pub(crate) fn channel(&self) -> Result<Channel> {
        let tls = match &self.manager_ca {
            None => None,
            Some(ca) => Some(knitter_api::ClientTls::read(
                &self.manager,
                ca,
                self.manager_server_name.as_deref(),
                self.manager_cert.as_deref().zip(self.manager_key.as_deref()),
            )?),
        };
        Ok(knitter_api::endpoint(&self.manager, tls)?.connect_lazy())
    }
}

/// A request with the bearer token, when there is one.
pub(crate) fn authed<T>(t: &Target, msg: T) -> Result<tonic::Request<T>> {
    let mut r = tonic::Request::new(msg);
    let token = match &t.token {
        Some(tok) => Some(tok.clone()),
        None => std::fs::read_to_string(&t.token_file).ok().map(|s| s.trim().to_string()),
    };
    if let Some(tok) = token {
        knitter_api::process::bearer(&mut r, &tok)?;
    }
    Ok(r)
}

//! What Knitter's programs share: the gRPC API (the protos under `proto/` compiled by tonic)
//! with its clients (a daemon's unix socket; TCP with TLS and a bearer token), and the
//! pieces every program needs alike: interface and host-port names ([`names`]), MACs
//! ([`mac`]), NPWG device-info ([`device_info`]), logging, metrics, signals and systemd
//! ([`logging`], [`metrics`], [`process`], [`systemd`]), capture filters ([`bpf`]) and YAML
//! ([`yaml`]). A leaf crate: the data plane, the CNI plugin and the control plane all depend
//! on it, and it on none of them.

#![forbid(unsafe_code)]

pub mod bpf;
pub mod device_info;
pub mod logging;
pub mod mac;
pub mod metrics;
pub mod names;
pub mod process;
pub mod systemd;
pub mod yaml;

use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// The node API of `knitter-vswitchd` (`knitter.node.v1`).
pub mod node {
    tonic::include_proto!("knitter.node.v1");
}

/// The API of `knitter-manager` (`knitter.manager.v1`).
pub mod manager {
    tonic::include_proto!("knitter.manager.v1");
}

/// An object's owner in JSON by name, as knitterctl's tables say it ("local", "manager",
/// "attach"), not as the enum's number.
pub fn owner_name<S: serde::Serializer>(owner: &i32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match node::Owner::try_from(*owner) {
        Ok(node::Owner::Manager) => "manager",
        Ok(node::Owner::Attach) => "attach",
        Ok(node::Owner::Local) => "local",
        Err(_) => "unknown",
    })
}

/// Where `knitter-manager` serves gRPC unless told otherwise (REST is on 9480).
pub const DEFAULT_MANAGER_GRPC: &str = "127.0.0.1:9481";

/// The encoded descriptors of every Knitter proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("knitter_descriptor");

/// Where `knitter-vswitchd` listens unless told otherwise.
pub const DEFAULT_NODE_SOCKET: &str = "/run/knitter/vswitchd.sock";

/// A channel to a gRPC server on a unix socket. Connects lazily: the first call fails
/// (UNAVAILABLE) while nobody listens.
pub fn unix_channel(path: &Path) -> Channel {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by the builder and ignored by the connector.
    Endpoint::from_static("http://[::1]:50051").connect_with_connector_lazy(tower::service_fn(
        move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        },
    ))
}

/// A node API client over the daemon's unix socket.
pub fn node_client(path: &Path) -> node::node_client::NodeClient<Channel> {
    node::node_client::NodeClient::new(unix_channel(path))
}

/// TLS settings of a client reaching a daemon or the manager over TCP.
#[derive(Clone)]
pub struct ClientTls {
    /// CA (PEM) the server's certificate must chain to.
    pub ca: Vec<u8>,
    /// The name the server's certificate must carry.
    pub server_name: String,
    /// A client certificate and key (PEM), for servers that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Names the server and says whether a client certificate is shown; never prints the key.
impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// Reads the files for a server at `addr` (`host:port`); the name to check defaults to
    /// the host.
    pub fn read(
        addr: &str,
        ca: &Path,
        server_name: Option<&str>,
        identity: Option<(&Path, &Path)>,
    ) -> std::io::Result<ClientTls> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("reading {}: {e}", p.display())))
        };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']']);
        Ok(ClientTls {
            ca: read(ca)?,
            server_name: server_name.unwrap_or(host).to_string(),
            identity: identity
                .map(|(c, k)| Ok::<_, std::io::Error>((read(c)?, read(k)?)))
                .transpose()?,
        })
    }
}

/// An endpoint for a gRPC server on TCP (`host:port`): plain HTTP/2, or TLS when given.
pub fn endpoint(addr: &str, tls: Option<ClientTls>) -> Result<Endpoint, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let Some(tls) = tls else { return Endpoint::from_shared(format!("http://{addr}")) };
    let mut cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(tls.ca))
        .domain_name(tls.server_name);
    if let Some((cert, key)) = tls.identity {
        cfg = cfg.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))?.tls_config(cfg)
}

/// A channel to a gRPC server on TCP with TLS (`host:port`). Connects lazily.
pub fn tls_channel(addr: &str, tls: ClientTls) -> Result<Channel, tonic::transport::Error> {
    Ok(endpoint(addr, Some(tls))?.connect_lazy())
}

#[cfg(test)]
mod test {
    #[test]
    fn owners_are_named_in_json() {
        let b = super::node::Bridge {
            name: "red".into(),
            owner: super::node::Owner::Attach as i32,
            ..Default::default()
        };
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(v["owner"], "attach");
        let p =
            super::node::Port { owner: super::node::Owner::Manager as i32, ..Default::default() };
        assert_eq!(serde_json::to_value(&p).unwrap()["owner"], "manager");
        // A vhost-user socket's owner is a user id, not an object's owner: still a number.
        let vu = super::node::VhostUser { owner: Some(1000), ..Default::default() };
        assert_eq!(serde_json::to_value(&vu).unwrap()["owner"], 1000);
    }
}

//! Knitter's gRPC API: the protos under `proto/` compiled by tonic, and a client that
//! reaches a daemon over its unix socket. A leaf crate: the data plane, the CNI plugin and
//! the control plane all depend on it, and it on none of them.

use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

/// The node API of `knitter-vswitchd` (`knitter.node.v1`).
pub mod node {
    tonic::include_proto!("knitter.node.v1");
}

/// The encoded descriptors of every Knitter proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("knitter_descriptor");

/// Where `knitter-vswitchd` listens unless told otherwise.
pub const DEFAULT_NODE_SOCKET: &str = "/run/knitter/vswitchd.sock";

/// A channel to a gRPC server on a unix socket. Connects lazily: the first call fails
/// (UNAVAILABLE) while nobody listens.
pub fn unix_channel(path: &Path) -> Channel {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by the builder and ignored by the connector.
    Endpoint::from_static("http://[::1]:50051").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
    }))
}

/// A node API client over the daemon's unix socket.
pub fn node_client(path: &Path) -> node::node_client::NodeClient<Channel> {
    node::node_client::NodeClient::new(unix_channel(path))
}

//! What the gRPC services (node API, attach API) share: the one table of how each node
//! refusal reaches a client, and running blocking node operations off the async workers.

use crate::node::NodeError;
use tonic::Status;

/// How each refusal reaches a client.
pub fn status(e: NodeError) -> Status {
    let msg = e.to_string();
    match e {
        NodeError::Exists { .. } => Status::already_exists(msg),
        NodeError::NotFound { .. } => Status::not_found(msg),
        NodeError::NotOwner { .. } => Status::failed_precondition(msg),
        NodeError::Invalid(_) => Status::invalid_argument(msg),
        NodeError::DeviceKept { .. } => Status::failed_precondition(msg),
        NodeError::Device(_) => Status::unavailable(msg),
        NodeError::State(_) => Status::internal(msg),
        NodeError::VfHeld { .. } => Status::already_exists(msg),
        NodeError::HostPort { .. } => Status::failed_precondition(msg),
        NodeError::PodPath { .. } => Status::invalid_argument(msg),
    }
}

/// How a refusal of the switch itself (trace requests) reaches a client.
pub fn switch_status(e: vswitch::switch::SwitchError) -> Status {
    use vswitch::switch::SwitchError as E;
    let msg = e.to_string();
    match e {
        E::NoSuchPort(_) => Status::not_found(msg),
        E::PortExists(_) => Status::already_exists(msg),
        E::PortInUse(_) => Status::failed_precondition(msg),
        E::FrameSize(_) | E::ForeignPool(_) | E::Config(_) => Status::invalid_argument(msg),
        E::NoBuffer => Status::resource_exhausted(msg),
    }
}

/// Runs a blocking node operation (device opens, PMD hand-over) off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("operation panicked: {e}")))
}

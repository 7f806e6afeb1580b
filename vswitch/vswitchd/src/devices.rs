//! Opens a port's device: a kernel interface (AF_XDP or AF_PACKET, in the interface's
//! network namespace) or a vhost-user socket (with the thread that serves it). What is
//! opened is closed when the [`OpenPort`] is dropped.

use crate::state::Device;
use knitter_vhost::backend::{self, Server};
use knitter_vhost::port::VhostPort;
use std::sync::Arc;
use vswitch::Pool;
use vswitch::port::Port;
use vswitch::port::afpacket::AfPacketPort;
use vswitch::port::afxdp::{AfXdpPort, UnderlayFilter};

/// A port whose device is open; the vhost-user server thread (if any) stops on drop.
pub struct OpenPort {
    pub port: Arc<dyn Port>,
    /// The vhost-user port, for its connection state.
    pub vhost: Option<Arc<VhostPort>>,
    afxdp: Option<Arc<AfXdpPort>>,
    _server: Option<Server>,
}

impl OpenPort {
    /// Makes an AF_XDP port take only its VTEP's traffic (or, with `None`, every frame);
    /// other devices need no filter.
    pub fn set_underlay_filter(&self, filter: Option<UnderlayFilter>) -> std::io::Result<()> {
        self.afxdp.as_ref().map_or(Ok(()), |p| p.set_underlay_filter(filter))
    }
}

/// Why a device did not open.
#[derive(Debug, thiserror::Error)]
#[error("port {port}: {what}: {source}")]
pub struct DeviceError {
    port: String,
    what: String,
    source: std::io::Error,
}

/// Runs `f` on a fresh thread inside the network namespace `netns` (as in /run/netns).
fn in_netns<R: Send + 'static>(netns: &str, f: impl FnOnce() -> std::io::Result<R> + Send + 'static) -> std::io::Result<R> {
    vswitch::port::link::in_netns(&format!("/run/netns/{netns}"), f)
}

fn kernel<R: Send + 'static>(netns: &Option<String>, f: impl FnOnce() -> std::io::Result<R> + Send + 'static) -> std::io::Result<R> {
    match netns {
        Some(ns) => in_netns(ns, f),
        None => f(),
    }
}

/// Opens `device` for the port `name`. `underlay`: the VTEP's filter when the port is the
/// underlay (AF_XDP then takes only the VTEP's traffic and leaves the rest to the node).
pub fn open(name: &str, device: &Device, pool: &Arc<Pool>, underlay: Option<UnderlayFilter>) -> Result<OpenPort, DeviceError> {
    let fail = |what: String| move |source| DeviceError { port: name.into(), what, source };
    let (n, pool) = (name.to_string(), pool.clone());
    match device {
        Device::AfXdp { ifname, netns } => {
            let i = ifname.clone();
            let port = kernel(netns, move || match underlay {
                Some(f) => AfXdpPort::open_underlay(&n, &i, pool, f),
                None => AfXdpPort::open(&n, &i, pool),
            })
            .map_err(fail(format!("AF_XDP on {ifname}")))?;
            let port = Arc::new(port);
            Ok(OpenPort { port: port.clone(), vhost: None, afxdp: Some(port), _server: None })
        }
        Device::AfPacket { ifname, netns } => {
            let i = ifname.clone();
            let port = kernel(netns, move || AfPacketPort::open(&n, &i)).map_err(fail(format!("AF_PACKET on {ifname}")))?;
            Ok(OpenPort { port: Arc::new(port), vhost: None, afxdp: None, _server: None })
        }
        Device::VhostUser { socket, client, mode, owner, group } => {
            let port = Arc::new(VhostPort::new(name, pool));
            if let Some(dir) = socket.parent() {
                std::fs::create_dir_all(dir).map_err(fail(format!("socket directory {}", dir.display())))?;
            }
            let server = if *client { backend::connect(socket, port.clone()) } else { backend::serve_with(socket, port.clone(), backend::SocketPerms { mode: *mode, owner: *owner, group: *group }) }
                .map_err(fail(format!("vhost-user socket {}", socket.display())))?;
            Ok(OpenPort { port: port.clone(), vhost: Some(port), afxdp: None, _server: Some(server) })
        }
    }
}

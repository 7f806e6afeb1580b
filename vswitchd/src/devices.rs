//! Opens a port's device: a kernel interface (AF_XDP or AF_PACKET, in the interface's
//! network namespace), a vhost-user socket (with the thread that serves it) or a DPDK
//! ethdev (the EAL initialised at the first, with `[dpdk] eal_args` or the defaults). What
//! is opened is closed when the [`OpenPort`] is dropped.

use crate::state::Device;
use kernel_ports::afpacket::AfPacketPort;
use kernel_ports::afxdp::{AfXdpPort, UnderlayFilter};
use knitter_vhost::backend::{self, Server};
use knitter_vhost::port::VhostPort;
use std::sync::{Arc, OnceLock};
use vswitch::Pool;
use vswitch::port::Port;

/// A port whose device is open; the vhost-user server thread (if any) stops on drop.
pub struct OpenPort {
    pub port: Arc<dyn Port>,
    /// The vhost-user port, for its connection state.
    pub vhost: Option<Arc<VhostPort>>,
    /// The dpdk port, for whether frames cross its edge without a copy.
    pub dpdk: Option<Arc<dpdk::DpdkPort>>,
    afxdp: Option<Arc<AfXdpPort>>,
    /// Why an `af_xdp` device runs on AF_PACKET, when it does.
    pub fallback: Option<String>,
    /// The fallback was for the port being a trunk (AF_XDP opened, but hides tags).
    trunk_fallback: bool,
    /// The underlay filter the AF_XDP port's program runs, if any.
    filter: Option<UnderlayFilter>,
    /// A host port's interface ([`crate::host`]), removed when the port is deleted.
    pub host: Option<String>,
    _server: Option<Server>,
}

impl OpenPort {
    fn plain(port: Arc<dyn Port>) -> OpenPort {
        OpenPort {
            port,
            vhost: None,
            dpdk: None,
            afxdp: None,
            fallback: None,
            trunk_fallback: false,
            filter: None,
            host: None,
            _server: None,
        }
    }

    /// Makes an AF_XDP port take only its VTEP's traffic (or, with `None`, every frame),
    /// unless it does already; other devices need no filter.
    pub fn set_underlay_filter(&mut self, filter: Option<UnderlayFilter>) -> std::io::Result<()> {
        let Some(p) = &self.afxdp else { return Ok(()) };
        if self.filter != filter {
            p.set_underlay_filter(filter)?;
            self.filter = filter;
        }
        Ok(())
    }

    /// Why frames whose 802.1Q tag the kernel holds out of band would reach the switch
    /// looking untagged on this device (an AF_XDP port without the rx VLAN hint), if so.
    pub fn hides_vlan_tags(&self) -> Option<String> {
        self.afxdp.as_ref().and_then(|p| p.restores_vlan_tags().err())
    }

    /// Whether this open device serves the port as [`open`] would open it for `trunk` now:
    /// not an AF_XDP socket that hides tags for a trunk (AF_PACKET would serve it), nor
    /// AF_PACKET taken only because the port was a trunk (AF_XDP would serve it again).
    pub fn serves(&self, trunk: bool) -> bool {
        if trunk { self.hides_vlan_tags().is_none() } else { !self.trunk_fallback }
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
fn in_netns<R: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> std::io::Result<R> {
    plumbing::link::in_netns(&format!("/run/netns/{netns}"), f)
}

/// Runs `f` in the network namespace `netns` (as in /run/netns), or here for `None`.
pub fn kernel<R: Send + 'static>(
    netns: &Option<String>,
    f: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> std::io::Result<R> {
    match netns {
        Some(ns) => in_netns(ns, f),
        None => f(),
    }
}

/// Opens `device` for the port `name`. `underlay`: the VTEP's filter when the port is the
/// underlay (AF_XDP then takes only the VTEP's traffic and leaves the rest to the node);
/// `trunk`: the port carries tagged frames.
///
/// An AF_XDP device falls back to AF_PACKET, saying why in the log, when AF_XDP does not
/// open on it (no XDP, no AF_XDP in the kernel, no room for a socket), and for a trunk when
/// its XDP program cannot put back tags the driver holds out of band (such frames would look
/// untagged; AF_PACKET gets them as metadata). Not for an underlay sharing the node's
/// address: AF_PACKET copies frames, so the node's kernel would see VXLAN too.
///
/// A `host` device is made first ([`crate::host`], with the port's `mtu`), then served as
/// an `af_xdp` device on its switch end.
pub fn open(
    name: &str,
    device: &Device,
    pool: &Arc<Pool>,
    underlay: Option<UnderlayFilter>,
    trunk: bool,
    mtu: u16,
) -> Result<OpenPort, DeviceError> {
    let fail = |what: String| move |source| DeviceError { port: name.into(), what, source };
    let (n, pool) = (name.to_string(), pool.clone());
    match device {
        Device::AfXdp { ifname, netns } => {
            let i = ifname.clone();
            let opened = kernel(netns, move || match underlay {
                Some(f) => AfXdpPort::open_underlay(&n, &i, pool, f),
                None => AfXdpPort::open(&n, &i, pool),
            });
            let (why_not, trunk_fallback) = match opened {
                Ok(port) => match port.restores_vlan_tags() {
                    Err(why) if trunk => (hidden_tags(&why), true),
                    _ => {
                        let port = Arc::new(port);
                        return Ok(OpenPort {
                            afxdp: Some(port.clone()),
                            filter: underlay,
                            ..OpenPort::plain(port)
                        });
                    }
                },
                Err(e) if underlay.is_some_and(|f| f.shared) => {
                    return Err(fail(format!(
                        "AF_XDP on {ifname} (an underlay on the node's own address needs it)"
                    ))(e));
                }
                Err(e) => (format!("AF_XDP did not open: {e}"), false),
            };
            fall_back(name, ifname, netns, why_not, trunk_fallback)
        }
        Device::AfPacket { ifname, netns } => {
            open_af_packet(name, ifname, netns, format!("AF_PACKET on {ifname}"))
        }
        Device::Dpdk { devargs, queues } => {
            if let Some(dev) = pci_device(device) {
                crate::vf::prepare_switch_port(dev).map_err(|e| DeviceError {
                    port: name.into(),
                    what: format!("DPDK device {devargs} (an SR-IOV VF)"),
                    source: std::io::Error::other(e),
                })?;
            }
            let fail = |e: dpdk::DpdkError| DeviceError {
                port: name.into(),
                what: format!("DPDK device {devargs}"),
                source: std::io::Error::other(e),
            };
            dpdk_eal(devargs).map_err(fail)?;
            let queues = queues.unwrap_or(1);
            let opts = dpdk::PortOptions::for_device(devargs, queues, pool.clone());
            let port = dpdk::DpdkPort::open(name, devargs, &opts).map_err(fail)?;
            Ok(OpenPort { dpdk: Some(port.clone()), ..OpenPort::plain(port) })
        }
        Device::VhostUser { socket, client, mode, owner, group } => {
            let port = Arc::new(VhostPort::new(name, pool));
            if let Some(dir) = socket.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(fail(format!("socket directory {}", dir.display())))?;
            }
            let server = if *client {
                backend::connect(socket, port.clone())
            } else {
                backend::serve_with(
                    socket,
                    port.clone(),
                    backend::SocketPerms { mode: *mode, owner: *owner, group: *group },
                )
            }
            .map_err(fail(format!("vhost-user socket {}", socket.display())))?;
            Ok(OpenPort {
                vhost: Some(port.clone()),
                _server: Some(server),
                ..OpenPort::plain(port)
            })
        }
        Device::Host { ifname, addresses, masquerade } => {
            let fresh = crate::host::make(ifname, addresses, mtu.into(), *masquerade)
                .map_err(fail(format!("host port {ifname}")))?;
            let served = Device::AfXdp { ifname: crate::host::switch_end(ifname), netns: None };
            let open = open(name, &served, &pool, None, trunk, mtu);
            // Only what this call made goes again: a running port may be on it.
            if open.is_err() && fresh {
                let _ = crate::host::remove(ifname);
            }
            Ok(OpenPort { host: Some(ifname.clone()), ..open? })
        }
    }
}

/// The EAL's arguments from the config file (`[dpdk] eal_args`; empty: the defaults).
static EAL_ARGS: OnceLock<Vec<String>> = OnceLock::new();

/// Sets the EAL's arguments, before the first `dpdk` device opens.
pub fn set_eal_args(args: Vec<String>) {
    let _ = EAL_ARGS.set(args);
}

/// Initialises DPDK's EAL for the first `dpdk` device (`devargs`): the configured arguments,
/// or the defaults with a file prefix of this daemon's and the PCI bus only for that device
/// when it is a PCI address (a later NIC needs `eal_args` naming every one with `-a`).
fn dpdk_eal(devargs: &str) -> Result<(), dpdk::DpdkError> {
    if dpdk::eal::initialised() {
        return Ok(());
    }
    let args = match EAL_ARGS.get().filter(|a| !a.is_empty()) {
        Some(a) => a.clone(),
        None => {
            let dev = devargs.split(',').next().unwrap_or_default();
            let pci: Vec<&str> = if is_pci_address(dev) { vec![dev] } else { Vec::new() };
            dpdk::eal::default_args(&format!("knitter-vswitchd-{}", std::process::id()), &pci)
        }
    };
    dpdk::eal::init(&args)
}

/// `0000:3b:00.0` or `3b:00.0`.
/// The PCI device a `dpdk` port takes, when its devargs name one (a NIC or a VF).
pub fn pci_device(d: &Device) -> Option<&str> {
    match d {
        Device::Dpdk { devargs, .. } => devargs.split(',').next().filter(|dev| is_pci_address(dev)),
        _ => None,
    }
}

use plumbing::sriov::is_pci_address;

/// Opens an `af_xdp` device with AF_PACKET for a trunk where its running AF_XDP port hides
/// tags (`why`), as [`open`] would: without trying AF_XDP first, whose queue the running
/// socket still holds.
pub fn open_trunk_on_af_packet(
    name: &str,
    device: &Device,
    why: &str,
) -> Result<OpenPort, DeviceError> {
    match device {
        Device::AfXdp { ifname, netns } => fall_back(name, ifname, netns, hidden_tags(why), true),
        _ => Err(DeviceError {
            port: name.into(),
            what: "AF_PACKET for a trunk".into(),
            source: std::io::Error::other("not an af_xdp device"),
        }),
    }
}

fn hidden_tags(why: &str) -> String {
    format!("a trunk, and this device's XDP cannot see tags held out of band ({why})")
}

/// Serves an `af_xdp` device with AF_PACKET, saying why (`why_not`) in the log and the port.
fn fall_back(
    name: &str,
    ifname: &str,
    netns: &Option<String>,
    why_not: String,
    trunk_fallback: bool,
) -> Result<OpenPort, DeviceError> {
    let open = open_af_packet(
        name,
        ifname,
        netns,
        format!("AF_XDP on {ifname} ({why_not}), then AF_PACKET"),
    )?;
    tracing::warn!(port = name, ifname = %ifname, reason = %why_not, "serving the interface with AF_PACKET instead of AF_XDP");
    Ok(OpenPort { trunk_fallback, fallback: Some(why_not), ..open })
}

/// Opens `ifname` with AF_PACKET; `what` names the attempt in an error.
fn open_af_packet(
    name: &str,
    ifname: &str,
    netns: &Option<String>,
    what: String,
) -> Result<OpenPort, DeviceError> {
    let (n, i) = (name.to_string(), ifname.to_string());
    let port = kernel(netns, move || AfPacketPort::open(&n, &i)).map_err(|source| DeviceError {
        port: name.into(),
        what,
        source,
    })?;
    Ok(OpenPort::plain(Arc::new(port)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vswitch::testkit::netns::{self, Netns};

    /// A device AF_XDP cannot serve (its queue already has a socket: AF_XDP allows one)
    /// opens with AF_PACKET; an underlay on the node's own address refuses instead; once the
    /// queue is free, AF_XDP serves it again. (Serial: it binds AF_XDP sockets.)
    #[test]
    fn serial_an_af_xdp_device_that_af_xdp_cannot_serve_opens_with_af_packet() {
        let Some(_g) = netns::exclusive() else { return };
        let (a, b) = (Netns::new("fa").unwrap(), Netns::new("fb").unwrap());
        netns::veth(&a, "eth0", &b, "eth0").unwrap();
        let pool = Pool::new(4096, false).unwrap();
        let holder = a.enter(|| AfXdpPort::open("holder", "eth0", pool.clone())).unwrap().unwrap();
        let device = Device::AfXdp { ifname: "eth0".into(), netns: Some(a.name.clone()) };
        let fallback = open("p", &device, &pool, None, false, 1500).expect("AF_PACKET serves it");
        assert!(fallback.afxdp.is_none(), "not AF_XDP");
        let why = fallback.fallback.as_deref().unwrap_or_default();
        assert!(why.contains("AF_XDP did not open"), "the port says why: {why}");
        let shared = UnderlayFilter {
            vtep: "192.0.2.1".parse().unwrap(),
            udp_port: 4789,
            vlan: None,
            shared: true,
        };
        let refused = open("u", &device, &pool, Some(shared), false, 1500)
            .err()
            .expect("a shared underlay does not fall back");
        assert!(refused.to_string().contains("node's own address"), "{refused}");
        let missing = Device::AfXdp { ifname: "nosuch0".into(), netns: Some(a.name.clone()) };
        let gone = open("m", &missing, &pool, None, false, 1500)
            .err()
            .expect("no device, no port")
            .to_string();
        assert!(gone.contains("AF_XDP on nosuch0") && gone.contains("then AF_PACKET"), "{gone}");
        drop(holder);
        let again = open("p2", &device, &pool, None, false, 1500).expect("AF_XDP serves it");
        assert!(again.afxdp.is_some() && again.fallback.is_none(), "AF_XDP again");
    }

    /// A trunk on a device whose driver gives XDP no rx VLAN hint (a tap: its tags held out
    /// of band would look untagged) opens with AF_PACKET, saying why; an access port there
    /// keeps AF_XDP.
    #[test]
    fn serial_a_trunk_on_a_driver_without_the_vlan_hint_opens_with_af_packet() {
        let Some(_g) = netns::exclusive() else { return };
        let ns = Netns::new("tp").unwrap();
        ns.run(&["ip", "tuntap", "add", "dev", "tap0", "mode", "tap"]).unwrap();
        ns.run(&["ip", "link", "set", "tap0", "up"]).unwrap();
        let pool = Pool::new(4096, false).unwrap();
        let device = Device::AfXdp { ifname: "tap0".into(), netns: Some(ns.name.clone()) };
        let trunk =
            open("t", &device, &pool, None, true, 1500).expect("AF_PACKET serves the trunk");
        let why = trunk.fallback.clone().unwrap_or_default();
        assert!(trunk.afxdp.is_none() && why.contains("no rx VLAN hint"), "{why}");
        drop(trunk);
        let access =
            open("a", &device, &pool, None, false, 1500).expect("AF_XDP serves an access port");
        assert!(access.afxdp.is_some() && access.fallback.is_none());
    }
}

//! Between the node API's messages (`knitter_api::node`) and the switch's configuration
//! types: addresses and MACs as text, defaults where a field is absent, a precise error
//! naming the field that does not parse.

use crate::state::{Device, Owner, PortSpec};
use knitter_api::node as pb;
use std::net::IpAddr;
use vswitch::config::{
    AddressPair, BridgeConfig, GatewayConfig, Neighbor, PeerConfig, PortConfig, PortMode,
    PortSecurity, StaticMac, VtepConfig,
};
use vswitch::policer::PolicerConfig;
use vswitch::wire::MacAddr;

/// A field that did not parse, with why.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {why}")]
pub struct FieldError {
    field: String,
    why: String,
}

fn bad(field: &str, why: impl std::fmt::Display) -> FieldError {
    FieldError { field: field.into(), why: why.to_string() }
}

fn ip(field: &str, s: &str) -> Result<IpAddr, FieldError> {
    s.parse().map_err(|_| bad(field, format!("{s:?} is not an IPv4 or IPv6 address")))
}

fn mac(field: &str, s: &str) -> Result<MacAddr, FieldError> {
    s.parse().map_err(|_| bad(field, format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")))
}

fn u8_of(field: &str, v: u32) -> Result<u8, FieldError> {
    u8::try_from(v).map_err(|_| bad(field, format!("{v} is out of range")))
}

fn u16_of(field: &str, v: u32) -> Result<u16, FieldError> {
    u16::try_from(v).map_err(|_| bad(field, format!("{v} is out of range")))
}

pub fn owner_from(o: i32) -> Result<Owner, FieldError> {
    match pb::Owner::try_from(o) {
        Ok(pb::Owner::Local) => Ok(Owner::Local),
        Ok(pb::Owner::Manager) => Ok(Owner::Manager),
        Ok(pb::Owner::Attach) => Ok(Owner::Attach),
        Err(_) => Err(bad("owner", format!("{o} is not an owner"))),
    }
}

pub fn owner_to(o: Owner) -> i32 {
    match o {
        Owner::Local => pb::Owner::Local as i32,
        Owner::Manager => pb::Owner::Manager as i32,
        Owner::Attach => pb::Owner::Attach as i32,
    }
}

pub fn bridge_from(b: &pb::Bridge) -> Result<BridgeConfig, FieldError> {
    let mut c = BridgeConfig::new(&b.name);
    c.vlan = b.vlan.map(|v| u16_of("vlan", v)).transpose()?;
    c.vni = b.vni;
    c.flood = b.flood.iter().map(|s| ip("flood", s)).collect::<Result<_, _>>()?;
    c.mac_learning = b.mac_learning.unwrap_or(c.mac_learning);
    c.remote_learning = b.remote_learning.unwrap_or(c.remote_learning);
    c.mac_age_secs = b.mac_age_secs.unwrap_or(c.mac_age_secs);
    c.mac_limit = b.mac_limit.unwrap_or(c.mac_limit);
    c.arp_suppression = b.arp_suppression;
    c.dscp = b.dscp.map(|v| u8_of("dscp", v)).transpose()?;
    c.pcp = b.pcp.map(|v| u8_of("pcp", v)).transpose()?;
    c.priority = b.priority;
    c.pod_policer = b.pod_policer.as_ref().map(policer_from);
    c.policer = b.policer.as_ref().map(policer_from);
    c.neighbors = b
        .neighbors
        .iter()
        .map(|n| {
            Ok(Neighbor { ip: ip("neighbors.ip", &n.ip)?, mac: mac("neighbors.mac", &n.mac)? })
        })
        .collect::<Result<_, FieldError>>()?;
    c.static_macs = b
        .static_macs
        .iter()
        .map(|m| {
            Ok(StaticMac {
                mac: mac("static_macs.mac", &m.mac)?,
                port: m.port.clone(),
                remote: m.remote.as_deref().map(|r| ip("static_macs.remote", r)).transpose()?,
            })
        })
        .collect::<Result<_, FieldError>>()?;
    c.gateway = b
        .gateway
        .as_ref()
        .map(|g| -> Result<GatewayConfig, FieldError> {
            Ok(GatewayConfig {
                ips: g.ips.iter().map(|i| ip("gateway.ips", i)).collect::<Result<_, _>>()?,
                mac: g.mac.as_deref().map(|m| mac("gateway.mac", m)).transpose()?,
                port: g.port.clone(),
            })
        })
        .transpose()?;
    Ok(c)
}

pub fn bridge_to(c: &BridgeConfig, owner: Owner) -> pb::Bridge {
    pb::Bridge {
        name: c.name.clone(),
        vlan: c.vlan.map(u32::from),
        vni: c.vni,
        flood: c.flood.iter().map(|i| i.to_string()).collect(),
        mac_learning: Some(c.mac_learning),
        remote_learning: Some(c.remote_learning),
        mac_age_secs: Some(c.mac_age_secs),
        mac_limit: Some(c.mac_limit),
        arp_suppression: c.arp_suppression,
        neighbors: c
            .neighbors
            .iter()
            .map(|n| pb::Neighbor { ip: n.ip.to_string(), mac: n.mac.to_string() })
            .collect(),
        static_macs: c
            .static_macs
            .iter()
            .map(|m| pb::StaticMac {
                mac: m.mac.to_string(),
                port: m.port.clone(),
                remote: m.remote.map(|r| r.to_string()),
            })
            .collect(),
        owner: owner_to(owner),
        dscp: c.dscp.map(u32::from),
        pcp: c.pcp.map(u32::from),
        priority: c.priority,
        pod_policer: c.pod_policer.as_ref().map(policer_to),
        policer: c.policer.as_ref().map(policer_to),
        gateway: c.gateway.as_ref().map(|g| pb::Gateway {
            ips: g.ips.iter().map(|i| i.to_string()).collect(),
            mac: g.mac.map(|m| m.to_string()),
            port: g.port.clone(),
        }),
    }
}

pub fn policer_from(x: &pb::Policer) -> PolicerConfig {
    PolicerConfig {
        pps: x.pps,
        bps: x.bps,
        burst_packets: x.burst_packets,
        burst_bytes: x.burst_bytes,
    }
}

pub fn policer_to(x: &PolicerConfig) -> pb::Policer {
    pb::Policer {
        pps: x.pps,
        bps: x.bps,
        burst_packets: x.burst_packets,
        burst_bytes: x.burst_bytes,
    }
}

fn netns(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

pub fn device_from(d: Option<&pb::Device>) -> Result<Device, FieldError> {
    use pb::device::Kind;
    match d.and_then(|d| d.kind.as_ref()) {
        Some(Kind::AfXdp(k)) => {
            Ok(Device::AfXdp { ifname: k.ifname.clone(), netns: netns(&k.netns) })
        }
        Some(Kind::AfPacket(k)) => {
            Ok(Device::AfPacket { ifname: k.ifname.clone(), netns: netns(&k.netns) })
        }
        Some(Kind::VhostUser(v)) => Ok(Device::VhostUser {
            socket: v.socket.clone().into(),
            client: v.client,
            mode: v.mode,
            owner: v.owner,
            group: v.group,
        }),
        Some(Kind::Dpdk(d)) if d.devargs.trim().is_empty() => {
            Err(bad("device.dpdk.devargs", "missing: a PCI address or a vdev"))
        }
        Some(Kind::Dpdk(d)) => {
            let queues = match d.queues {
                0 => None,
                q @ 1..=64 => Some(q as u16),
                q => return Err(bad("device.dpdk.queues", format!("{q} is outside 1..64"))),
            };
            Ok(Device::Dpdk { devargs: d.devargs.clone(), queues })
        }
        Some(Kind::Host(h)) => Ok(Device::Host {
            ifname: h.ifname.clone(),
            addresses: h.addresses.clone(),
            masquerade: h.masquerade.unwrap_or(true),
        }),
        None => Err(bad("device", "missing: one of af_xdp, af_packet, vhost_user, dpdk, host")),
    }
}

pub fn device_to(d: &Device) -> pb::Device {
    use pb::device::Kind;
    let kernel = |ifname: &String, ns: &Option<String>| pb::KernelPort {
        ifname: ifname.clone(),
        netns: ns.clone().unwrap_or_default(),
    };
    pb::Device {
        kind: Some(match d {
            Device::AfXdp { ifname, netns } => Kind::AfXdp(kernel(ifname, netns)),
            Device::AfPacket { ifname, netns } => Kind::AfPacket(kernel(ifname, netns)),
            Device::VhostUser { socket, client, mode, owner, group } => {
                Kind::VhostUser(pb::VhostUser {
                    socket: socket.display().to_string(),
                    client: *client,
                    mode: *mode,
                    owner: *owner,
                    group: *group,
                })
            }
            Device::Dpdk { devargs, queues } => Kind::Dpdk(pb::DpdkDevice {
                devargs: devargs.clone(),
                queues: queues.unwrap_or(0) as u32,
            }),
            Device::Host { ifname, addresses, masquerade } => Kind::Host(pb::HostPort {
                ifname: ifname.clone(),
                addresses: addresses.clone(),
                masquerade: Some(*masquerade),
            }),
        }),
    }
}

pub fn port_from(p: &pb::Port) -> Result<PortSpec, FieldError> {
    use pb::port::Mode;
    let mode = match &p.mode {
        Some(Mode::Access(a)) => PortMode::Access { bridge: a.bridge.clone() },
        Some(Mode::Trunk(t)) => PortMode::Trunk {
            allowed: t
                .allowed
                .iter()
                .map(|v| u16_of("trunk.allowed", *v))
                .collect::<Result<_, _>>()?,
            native: t.native.map(|v| u16_of("trunk.native", v)).transpose()?,
        },
        Some(Mode::Underlay(_)) => PortMode::Underlay,
        None => return Err(bad("mode", "missing: one of access, trunk, underlay")),
    };
    let mut c = PortConfig::access(&p.name, "");
    c.mode = mode;
    c.mtu = p.mtu.map(|v| u16_of("mtu", v)).transpose()?.unwrap_or(c.mtu);
    c.tpid = p.tpid.map(|v| u16_of("tpid", v)).transpose()?.unwrap_or(c.tpid);
    c.mac_limit = p.mac_limit.unwrap_or(c.mac_limit);
    c.security = p
        .security
        .as_ref()
        .map(|s| -> Result<PortSecurity, FieldError> {
            Ok(PortSecurity {
                enabled: true,
                macs: s.macs.iter().map(|m| mac("security.macs", m)).collect::<Result<_, _>>()?,
                ips: s.ips.iter().map(|i| ip("security.ips", i)).collect::<Result<_, _>>()?,
                allowed_address_pairs: s
                    .allowed_address_pairs
                    .iter()
                    .map(|a| {
                        Ok(AddressPair {
                            mac: mac("security.allowed_address_pairs.mac", &a.mac)?,
                            ip: a
                                .ip
                                .as_deref()
                                .map(|i| ip("security.allowed_address_pairs.ip", i))
                                .transpose()?,
                        })
                    })
                    .collect::<Result<_, FieldError>>()?,
                allow_router: s.allow_router,
                allow_dhcp_server: s.allow_dhcp_server,
            })
        })
        .transpose()?;
    c.policer = p.policer.as_ref().map(policer_from);
    c.pmd = p.pmd.map(|v| u16_of("pmd", v)).transpose()?;
    Ok(PortSpec { device: device_from(p.device.as_ref())?, config: c })
}

pub fn port_to(p: &PortSpec, owner: Owner) -> pb::Port {
    use pb::port::Mode;
    let c = &p.config;
    pb::Port {
        name: c.name.clone(),
        device: Some(device_to(&p.device)),
        mode: Some(match &c.mode {
            PortMode::Access { bridge } => Mode::Access(pb::Access { bridge: bridge.clone() }),
            PortMode::Trunk { allowed, native } => Mode::Trunk(pb::Trunk {
                allowed: allowed.iter().map(|v| u32::from(*v)).collect(),
                native: native.map(u32::from),
            }),
            PortMode::Underlay => Mode::Underlay(pb::Underlay {}),
        }),
        mtu: Some(c.mtu.into()),
        tpid: Some(c.tpid.into()),
        mac_limit: Some(c.mac_limit),
        security: c.security.as_ref().filter(|s| s.enabled).map(|s| pb::PortSecurity {
            macs: s.macs.iter().map(|m| m.to_string()).collect(),
            ips: s.ips.iter().map(|i| i.to_string()).collect(),
            allowed_address_pairs: s
                .allowed_address_pairs
                .iter()
                .map(|a| pb::AddressPair {
                    mac: a.mac.to_string(),
                    ip: a.ip.map(|i| i.to_string()),
                })
                .collect(),
            allow_router: s.allow_router,
            allow_dhcp_server: s.allow_dhcp_server,
        }),
        policer: c.policer.as_ref().map(policer_to),
        pmd: c.pmd.map(u32::from),
        owner: owner_to(owner),
    }
}

pub fn vtep_from(v: &pb::Vtep) -> Result<VtepConfig, FieldError> {
    let mut c = VtepConfig::new(ip("local_ip", &v.local_ip)?, &v.underlay_port);
    c.mac = v.mac.as_deref().map(|m| mac("mac", m)).transpose()?;
    c.underlay_vlan = v.underlay_vlan.map(|x| u16_of("underlay_vlan", x)).transpose()?;
    c.udp_port = v.udp_port.map(|x| u16_of("udp_port", x)).transpose()?.unwrap_or(c.udp_port);
    c.shared_address = v.shared_address;
    c.peers = v
        .peers
        .iter()
        .map(|p| {
            Ok(PeerConfig {
                ip: ip("peers.ip", &p.ip)?,
                next_hop_mac: p
                    .next_hop_mac
                    .as_deref()
                    .map(|m| mac("peers.next_hop_mac", m))
                    .transpose()?,
                next_hop: p.next_hop.as_deref().map(|i| ip("peers.next_hop", i)).transpose()?,
            })
        })
        .collect::<Result<_, FieldError>>()?;
    Ok(c)
}

pub fn vtep_to(c: &VtepConfig, owner: Owner) -> pb::Vtep {
    pb::Vtep {
        local_ip: c.local_ip.to_string(),
        underlay_port: c.underlay_port.clone(),
        mac: c.mac.map(|m| m.to_string()),
        underlay_vlan: c.underlay_vlan.map(u32::from),
        udp_port: Some(c.udp_port.into()),
        peers: c
            .peers
            .iter()
            .map(|p| pb::Peer {
                ip: p.ip.to_string(),
                next_hop_mac: p.next_hop_mac.map(|m| m.to_string()),
                next_hop: p.next_hop.map(|i| i.to_string()),
            })
            .collect(),
        shared_address: c.shared_address,
        owner: owner_to(owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_through_messages() {
        let mut b = BridgeConfig::new("red").vni(5001).flood(&["198.51.100.2".parse().unwrap()]);
        b.neighbors.push(Neighbor {
            ip: "192.0.2.1".parse().unwrap(),
            mac: "02:00:00:00:00:01".parse().unwrap(),
        });
        assert_eq!(bridge_from(&bridge_to(&b, Owner::Local)).unwrap(), b);
        let p = PortSpec {
            device: Device::VhostUser {
                socket: "/run/knitter/vnf0.sock".into(),
                client: true,
                mode: Some(0o660),
                owner: None,
                group: Some(1000),
            },
            config: PortConfig::pod(
                "vnf0",
                "red",
                "02:00:00:00:00:02".parse().unwrap(),
                &["192.0.2.2".parse().unwrap()],
            ),
        };
        assert_eq!(port_from(&port_to(&p, Owner::Manager)).unwrap(), p);
        let v = VtepConfig::new("198.51.100.1".parse().unwrap(), "ul0")
            .peer_resolved("198.51.100.2".parse().unwrap(), None);
        assert_eq!(vtep_from(&vtep_to(&v, Owner::Local)).unwrap(), v);
    }

    #[test]
    fn a_bad_field_is_named() {
        let mut b = bridge_to(&BridgeConfig::new("red"), Owner::Local);
        b.flood.push("198.51.100.300".into());
        assert_eq!(
            bridge_from(&b).unwrap_err().to_string(),
            "flood: \"198.51.100.300\" is not an IPv4 or IPv6 address"
        );
        let p = pb::Port { name: "p".into(), ..Default::default() };
        assert!(port_from(&p).unwrap_err().to_string().starts_with("mode: missing"));
    }
}

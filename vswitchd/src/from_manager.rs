//! What the manager's messages become on this node, in one place: a network's bridge domain
//! and pod policer, a port's MAC and addresses (attach), and a desired state's bridge
//! domains, VTEP peers and host ports (sync). Every field is parsed here, once; a malformed
//! one is an error naming it.

use crate::records::Address;
use crate::state::{Device, PortSpec};
use anyhow::{Result, bail};
use knitter_api::manager as pb;
use std::net::IpAddr;
use std::str::FromStr;
use vswitch::config::{BridgeConfig, GatewayConfig, Neighbor, PeerConfig, PortConfig, StaticMac};
use vswitch::policer::PolicerConfig;
use vswitch::wire::MacAddr;

/// What a desired state asks of the node: bridge domains, VTEP peers, host ports.
pub type Desired = (Vec<BridgeConfig>, Vec<PeerConfig>, Vec<PortSpec>);

/// A network's bridge domain on this node, as the manager names the network: its kind
/// ("vxlan": a VNI; "vlan": a VLAN, 1-4094 checked by the switch) and segment.
pub fn bridge(network: &str, kind: &str, segment: u32) -> Result<BridgeConfig, String> {
    let mut b = BridgeConfig::new(network);
    match kind {
        "vxlan" => b.vni = Some(segment),
        "vlan" => {
            b.vlan = Some(
                u16::try_from(segment)
                    .map_err(|_| format!("network {network}: VLAN {segment} is out of range"))?,
            )
        }
        k => return Err(format!("network {network}: kind {k:?} is unknown")),
    }
    Ok(b)
}

/// A policer as the manager sends it (a network's per-pod rate, on the network or the port).
pub fn policer(p: &pb::Policer) -> PolicerConfig {
    PolicerConfig {
        pps: p.pps,
        bps: p.bps,
        burst_packets: p.burst_packets,
        burst_bytes: p.burst_bytes,
    }
}

/// A pod port's MAC (`requested`, when the pod asked for one, or the manager's) and
/// addresses with their gateways, as the manager recorded the port.
pub fn port_addressing(
    port: &pb::Port,
    requested: Option<MacAddr>,
) -> Result<(MacAddr, Vec<Address>)> {
    let mac = match requested {
        Some(m) => m,
        None => parse("MAC", &port.mac)?,
    };
    let mut addresses = Vec::with_capacity(port.addresses.len());
    for a in &port.addresses {
        let ip: IpAddr = parse("address", &a.address)?;
        let gateway = a.gateway.as_deref().map(|g| parse("gateway", g)).transpose()?;
        let prefix = u8::try_from(a.prefix)
            .ok()
            .filter(|p| *p <= if ip.is_ipv6() { 128 } else { 32 })
            .ok_or_else(|| anyhow::anyhow!("prefix {} of {ip} is out of range", a.prefix))?;
        addresses.push(Address { ip, prefix, gateway });
    }
    Ok((mac, addresses))
}

fn parse<T: FromStr>(what: &str, s: &str) -> Result<T> {
    s.parse().map_err(|_| anyhow::anyhow!("{what} {s:?} is malformed"))
}

/// The bridge domains, VTEP peers and host ports a desired state asks of node `me`.
pub fn desired(d: &pb::DesiredState, me: &str) -> Result<Desired> {
    let mut bridges = Vec::with_capacity(d.networks.len());
    let mut ports = Vec::new();
    for n in &d.networks {
        let mut b = bridge(&n.name, &n.kind, n.segment).map_err(anyhow::Error::msg)?;
        let vxlan = b.vni.is_some();
        // The manager knows every pod's MAC: flood lists and static MACs replace learning
        // behind remote VTEPs.
        b.arp_suppression = true;
        b.remote_learning = !vxlan;
        for e in &n.endpoints {
            let mac: MacAddr = parse("MAC", &e.mac)?;
            for ip in &e.ips {
                b.neighbors.push(Neighbor { ip: parse("address", ip)?, mac });
            }
            if vxlan && e.node != me {
                b.static_macs.push(StaticMac {
                    mac,
                    port: None,
                    remote: Some(parse("VTEP", &e.vtep)?),
                });
            }
        }
        if vxlan {
            b.flood = n.flood.iter().map(|f| parse::<IpAddr>("VTEP", f)).collect::<Result<_>>()?;
        }
        // The plane's marking; the switch refuses values out of range with the reason.
        b.dscp = n.dscp.map(|d| d.min(u8::MAX as u32) as u8);
        b.pcp = n.pcp.map(|p| p.min(u8::MAX as u32) as u8);
        b.priority = n.priority;
        b.pod_policer = n.pod_policer.as_ref().map(policer);
        if let Some(h) = &n.host {
            ports.push(host_port(n, h, me)?);
            if !n.gateways.is_empty() {
                let ips = n.gateways.iter().map(|g| parse("gateway", g)).collect::<Result<_>>()?;
                b.gateway = Some(GatewayConfig { ips, mac: None, port: h.ifname.clone() });
            }
        }
        bridges.push(b);
    }
    let peers = d
        .peers
        .iter()
        .map(|p| Ok(PeerConfig { ip: parse("VTEP", p)?, next_hop_mac: None, next_hop: None }))
        .collect::<Result<_>>()?;
    Ok((bridges, peers, ports))
}

/// The host port of network `n` on node `me`: only ever the interface named for that network
/// (the manager names no other host interface for the node to make or remove).
fn host_port(n: &pb::NetworkOnNode, h: &pb::HostPortOnNode, me: &str) -> Result<PortSpec> {
    let (_, ifname) = knitter_api::names::host_port(&n.name, me);
    if h.ifname != ifname {
        bail!(
            "network {}: host port {:?} is not the one this node makes for it ({ifname})",
            n.name,
            h.ifname
        );
    }
    let mtu = u16::try_from(n.mtu)
        .map_err(|_| anyhow::anyhow!("network {}: MTU {} is out of range", n.name, n.mtu))?;
    Ok(PortSpec {
        device: Device::Host {
            ifname: ifname.clone(),
            addresses: h.addresses.clone(),
            masquerade: h.masquerade,
        },
        config: PortConfig { mtu, ..PortConfig::access(&ifname, &n.name) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port's addresses as the manager recorded them; a prefix longer than its family's
    /// or a malformed field is refused, naming it.
    #[test]
    fn a_ports_addressing_is_parsed_and_checked() {
        let ip = |address: &str, prefix: u32, gateway: Option<&str>| pb::PortIp {
            address: address.into(),
            prefix,
            gateway: gateway.map(String::from),
        };
        let mut port = pb::Port {
            mac: "0a:58:0a:01:00:02".into(),
            addresses: vec![ip("10.1.0.2", 24, Some("10.1.0.1")), ip("fd00:1::2", 64, None)],
            ..Default::default()
        };
        let (mac, addresses) = port_addressing(&port, None).unwrap();
        assert_eq!(mac.to_string(), "0a:58:0a:01:00:02");
        assert_eq!(
            addresses.iter().map(|a| (a.ip.to_string(), a.prefix, a.gateway)).collect::<Vec<_>>(),
            vec![
                ("10.1.0.2".into(), 24, Some("10.1.0.1".parse().unwrap())),
                ("fd00:1::2".into(), 64, None)
            ]
        );
        let asked = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(port_addressing(&port, Some(asked)).unwrap().0, asked, "the pod's own MAC");
        for (bad, says) in [
            (ip("10.1.0.2", 33, None), "prefix 33 of 10.1.0.2 is out of range"),
            (ip("fd00:1::2", 129, None), "prefix 129 of fd00:1::2 is out of range"),
            (ip("10.1.0.2", 300, None), "prefix 300 of 10.1.0.2 is out of range"),
            (ip("10.1.0.x", 24, None), "address \"10.1.0.x\" is malformed"),
            (ip("10.1.0.2", 24, Some("gw")), "gateway \"gw\" is malformed"),
        ] {
            port.addresses = vec![bad];
            let e = port_addressing(&port, None).unwrap_err().to_string();
            assert_eq!(e, says);
        }
        port.mac = "not-a-mac".into();
        assert!(port_addressing(&port, None).unwrap_err().to_string().contains("MAC"));
    }

    fn endpoint(mac: &str, ip: &str, node: &str, vtep: &str) -> pb::Endpoint {
        pb::Endpoint { mac: mac.into(), ips: vec![ip.into()], node: node.into(), vtep: vtep.into() }
    }

    #[test]
    fn a_desired_state_becomes_bridges_and_peers() {
        let d = pb::DesiredState {
            revision: 9,
            networks: vec![
                pb::NetworkOnNode {
                    name: "red".into(),
                    kind: "vxlan".into(),
                    segment: 5001,
                    mtu: 1450,
                    flood: vec!["192.0.2.2".into()],
                    endpoints: vec![
                        endpoint("0a:58:0a:00:00:01", "10.0.0.1", "n1", "192.0.2.1"),
                        endpoint("0a:58:0a:00:00:02", "10.0.0.2", "n2", "192.0.2.2"),
                    ],
                    dscp: Some(40),
                    pcp: Some(5),
                    priority: true,
                    pod_policer: Some(pb::Policer {
                        pps: 5000,
                        bps: 0,
                        burst_packets: 0,
                        burst_bytes: 0,
                    }),
                    gateways: vec![],
                    host: None,
                },
                pb::NetworkOnNode {
                    name: "blue".into(),
                    kind: "vlan".into(),
                    segment: 200,
                    mtu: 1500,
                    flood: vec![],
                    endpoints: vec![endpoint("0a:58:0a:01:00:05", "10.1.0.5", "n2", "192.0.2.2")],
                    dscp: None,
                    pcp: None,
                    priority: false,
                    pod_policer: None,
                    gateways: vec!["10.1.0.1".into()],
                    host: Some(pb::HostPortOnNode {
                        ifname: knitter_api::names::host_port("blue", "n1").1,
                        addresses: vec!["10.1.0.9/24".into()],
                        masquerade: true,
                    }),
                },
            ],
            peers: vec!["192.0.2.2".into()],
        };
        let (bridges, peers, ports) = desired(&d, "n1").unwrap();
        let red = &bridges[0];
        assert_eq!(
            (red.vni, red.vlan, red.flood.clone()),
            (Some(5001), None, vec!["192.0.2.2".parse().unwrap()])
        );
        assert!(
            red.arp_suppression && !red.remote_learning,
            "the manager's MACs replace learning behind VTEPs"
        );
        assert_eq!(red.neighbors.len(), 2, "both pods' addresses are answered locally");
        assert_eq!(red.static_macs.len(), 1, "only the other node's pod is pinned to a VTEP");
        assert_eq!(red.static_macs[0].remote, Some("192.0.2.2".parse().unwrap()));
        assert_eq!(
            (red.dscp, red.pcp, red.priority),
            (Some(40), Some(5), true),
            "the plane's marking and priority"
        );
        assert_eq!(
            red.pod_policer.map(|p| (p.pps, p.bps)),
            Some((5000, 0)),
            "the network's per-pod rate"
        );
        let blue = &bridges[1];
        assert_eq!((blue.dscp, blue.pcp), (None, None), "unmarked");
        assert_eq!(
            (blue.vlan, blue.vni, blue.static_macs.len(), blue.remote_learning),
            (Some(200), None, 0, true)
        );
        assert_eq!(
            peers,
            vec![PeerConfig {
                ip: "192.0.2.2".parse().unwrap(),
                next_hop_mac: None,
                next_hop: None
            }]
        );
        // The node gateway: blue's host port, and its gateway answered on the bridge.
        let kh = knitter_api::names::host_port("blue", "n1").1;
        assert_eq!(ports.len(), 1);
        assert_eq!(
            ports[0].device,
            Device::Host {
                ifname: kh.clone(),
                addresses: vec!["10.1.0.9/24".into()],
                masquerade: true
            }
        );
        assert_eq!(
            (ports[0].config.name.as_str(), ports[0].config.mtu, &ports[0].config.mode),
            (kh.as_str(), 1500, &vswitch::config::PortMode::Access { bridge: "blue".into() })
        );
        assert_eq!(
            blue.gateway,
            Some(GatewayConfig {
                ips: vec!["10.1.0.1".parse().unwrap()],
                mac: None,
                port: kh.clone()
            })
        );
        assert!(red.gateway.is_none());

        let bad = |f: &dyn Fn(&mut pb::DesiredState)| {
            let mut d = d.clone();
            f(&mut d);
            format!("{:#}", desired(&d, "n1").unwrap_err())
        };
        assert!(
            bad(&|d| d.networks[0].kind = "geneve".into()).contains("kind \"geneve\" is unknown")
        );
        assert!(bad(&|d| d.networks[1].segment = 70000).contains("VLAN 70000 is out of range"));
        assert!(
            bad(&|d| d.networks[0].endpoints[0].mac = "zz".into())
                .contains("MAC \"zz\" is malformed")
        );
        assert!(
            bad(&|d| d.peers[0] = "not-an-ip".into()).contains("VTEP \"not-an-ip\" is malformed")
        );
        // The manager names the node's own interface for the network, never another.
        assert!(
            bad(&|d| d.networks[1].host.as_mut().unwrap().ifname = "eth0".into())
                .contains("host port \"eth0\" is not the one this node makes")
        );
        assert!(
            bad(&|d| d.networks[1].gateways[0] = "x".into()).contains("gateway \"x\" is malformed")
        );
    }
}

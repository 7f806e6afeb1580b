//! The MAC an address gives the port that holds it: the manager's convention for pods'
//! ports, and the node's for its host ports (docs/pod-network.md).

use std::net::IpAddr;

/// The MAC of the port that holds `ip`: locally administered, derived from the address
/// (IPv4: `0a:58` and its 4 bytes, as OVN-Kubernetes does; IPv6: `0a:59` and its last 4
/// bytes). An address is unique in its network, so its MAC is unique in the network's bridge
/// domain, and a pod that gets its address back (IP groups, restarts) gets its MAC back:
/// neighbors' ARP/ND caches stay right. For IPv6 this needs every address of the network
/// to differ only in its last 32 bits (the manager refuses pools that span more).
pub fn mac_for(ip: IpAddr) -> [u8; 6] {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0x0a, 0x58, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            [0x0a, 0x59, o[12], o[13], o[14], o[15]]
        }
    }
}

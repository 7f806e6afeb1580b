//! The `netdev` generic-netlink family (Linux ≥ 6.3), read for what a device's driver offers
//! XDP programs: which rx metadata hints it gives (`xdp-rx-metadata-features`). A program
//! calling a hint the driver lacks still loads; the call just answers "no data", so this is
//! how the port knows whether a hint can be trusted to be there.

use crate::netlink::{self, Msg, NETLINK_GENERIC, NLM_F_ACK, Socket};
use std::io;

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_RX_METADATA_FEATURES: u16 = 5;

/// `NETDEV_XDP_RX_METADATA_VLAN_TAG`: the driver reports an outer tag it took out of the frame.
pub const RX_METADATA_VLAN_TAG: u64 = 1 << 2;

/// The rx metadata hints (`RX_METADATA_*` bits) the driver of device `ifindex`, in the
/// calling thread's network namespace, gives XDP programs.
pub fn xdp_rx_metadata(ifindex: u32) -> io::Result<u64> {
    let mut sock = Socket::open(NETLINK_GENERIC)?;
    let family = sock.family("netdev")?;
    let mut m = Msg::genl(family, NETDEV_CMD_DEV_GET, 1, NLM_F_ACK);
    m.u32(NETDEV_A_DEV_IFINDEX, ifindex);
    let replies = sock.request(&mut m)?;
    let features = replies
        .iter()
        .find_map(|r| netlink::find(netlink::genl_attrs(r), NETDEV_A_DEV_XDP_RX_METADATA_FEATURES));
    Ok(features.map_or(0, unsigned))
}

/// A netlink unsigned attribute of 4 or 8 bytes.
fn unsigned(p: &[u8]) -> u64 {
    match p.len() {
        8 => u64::from_ne_bytes([p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]]),
        4 => u32::from_ne_bytes([p[0], p[1], p[2], p[3]]) as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_of_either_width_are_read() {
        assert_eq!(unsigned(&4u32.to_ne_bytes()), 4);
        assert_eq!(unsigned(&(1u64 << 40 | 4).to_ne_bytes()), 1 << 40 | 4);
        assert_eq!(unsigned(&[1, 2]), 0, "neither width: no features");
    }
}

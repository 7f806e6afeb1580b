//! Device offload features over ethtool netlink (what `ethtool -k/-K` does), for the switch
//! side of its kernel ports and for the CNI on the pod side.
//!
//! Why the switch cares: a veth hands frames to AF_XDP and AF_PACKET as the sender left them.
//! With tx checksum offload on, a pod's TCP/UDP checksums arrive unfinished and AF_XDP has no
//! metadata to tell; with TSO/GSO on, frames arrive larger than the MTU; with tx VLAN
//! insertion on, a tag travels out of band. [`pod_offloads_off`] turns those off.

use crate::netlink::{self, Msg, NETLINK_GENERIC, NLM_F_ACK, Socket};
use std::io;

const ETHTOOL_MSG_FEATURES_GET: u8 = 11;
const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
const HEADER: u16 = 1; // ETHTOOL_A_FEATURES_HEADER
const HW: u16 = 2;
const WANTED: u16 = 3;
const ACTIVE: u16 = 4;
const HEADER_DEV_NAME: u16 = 2;
const BITSET_NOMASK: u16 = 1;
const BITSET_BITS: u16 = 3;
const BITS_BIT: u16 = 1;
const BIT_NAME: u16 = 2;
const BIT_VALUE: u16 = 3;

/// Features a pod-side veth (and the switch's side) must not use with a userspace switch:
/// transmit checksum offload, segmentation offloads, transmit VLAN insertion.
pub const POD_OFFLOADS: &[&str] = &[
    "tx-checksum-ip-generic",
    "tx-checksum-ipv4",
    "tx-checksum-ipv6",
    "tx-checksum-sctp",
    "tx-tcp-segmentation",
    "tx-tcp-ecn-segmentation",
    "tx-tcp-mangleid-segmentation",
    "tx-tcp6-segmentation",
    "tx-tcp-accecn-segmentation",
    "tx-generic-segmentation",
    "tx-udp-segmentation",
    "tx-gso-list",
    "tx-vlan-hw-insert",
    "tx-vlan-stag-hw-insert",
];

/// A device's features by kernel name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// Features that are on.
    pub active: Vec<String>,
    /// Features the driver lets change.
    pub changeable: Vec<String>,
}

impl Features {
    pub fn is_on(&self, name: &str) -> bool {
        self.active.iter().any(|a| a == name)
    }
}

/// The ethtool netlink family, in the calling thread's network namespace.
pub struct Ethtool {
    sock: Socket,
    family: u16,
}

impl Ethtool {
    pub fn open() -> io::Result<Ethtool> {
        let mut sock = Socket::open(NETLINK_GENERIC)?;
        let family = sock.family("ethtool")?;
        Ok(Ethtool { sock, family })
    }

    /// The features of device `dev`.
    pub fn features(&mut self, dev: &str) -> io::Result<Features> {
        let mut m = Msg::genl(self.family, ETHTOOL_MSG_FEATURES_GET, 1, NLM_F_ACK);
        m.nest(HEADER).str(HEADER_DEV_NAME, dev).end();
        let replies = self.sock.request(&mut m)?;
        let mut f = Features::default();
        for r in &replies {
            let attrs = netlink::genl_attrs(r);
            if let Some(b) = netlink::find(attrs, ACTIVE) {
                f.active = bits_on(b);
            }
            if let Some(b) = netlink::find(attrs, HW) {
                f.changeable = bits_on(b);
            }
        }
        Ok(f)
    }

    /// Turns each named feature on or off where the driver allows it; returns the features
    /// still not as asked afterwards (fixed by the driver, or unknown to this device).
    pub fn set(&mut self, dev: &str, want: &[(&str, bool)]) -> io::Result<Vec<String>> {
        let before = self.features(dev)?;
        let change: Vec<&(&str, bool)> = want
            .iter()
            .filter(|(n, on)| before.changeable.iter().any(|c| c == n) && before.is_on(n) != *on)
            .collect();
        if !change.is_empty() {
            let mut m = Msg::genl(self.family, ETHTOOL_MSG_FEATURES_SET, 1, NLM_F_ACK);
            m.nest(HEADER).str(HEADER_DEV_NAME, dev).end();
            m.nest(WANTED).nest(BITSET_BITS);
            for (name, on) in &change {
                m.nest(BITS_BIT).str(BIT_NAME, name);
                if *on {
                    m.flag(BIT_VALUE);
                }
                m.end();
            }
            m.end().end();
            self.sock.request(&mut m)?;
        }
        let after = self.features(dev)?;
        Ok(want
            .iter()
            .filter(|(n, on)| after.is_on(n) != *on)
            .map(|(n, _)| n.to_string())
            .collect())
    }
}

/// Names of the bits that are on in a verbose bitset: every listed bit when it has no mask,
/// else the listed bits carrying the value flag.
fn bits_on(bitset: &[u8]) -> Vec<String> {
    let nomask = netlink::find(bitset, BITSET_NOMASK).is_some();
    let Some(bits) = netlink::find(bitset, BITSET_BITS) else { return Vec::new() };
    netlink::Attrs::new(bits)
        .filter(|(t, _)| *t == BITS_BIT)
        .filter_map(|(_, bit)| {
            let name = netlink::text(netlink::find(bit, BIT_NAME)?);
            (nomask || netlink::find(bit, BIT_VALUE).is_some()).then(|| name.to_string())
        })
        .collect()
}

/// Turns [`POD_OFFLOADS`] off on `dev` (in the calling thread's namespace); returns (and
/// logs) those the driver keeps on, for the caller to judge.
pub fn pod_offloads_off(dev: &str) -> io::Result<Vec<String>> {
    let want: Vec<(&str, bool)> = POD_OFFLOADS.iter().map(|n| (*n, false)).collect();
    let kept = Ethtool::open()?.set(dev, &want)?;
    if !kept.is_empty() {
        tracing::warn!(dev, ?kept, "offloads the driver keeps on");
    }
    Ok(kept)
}

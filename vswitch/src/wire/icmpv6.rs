//! ICMPv6 neighbor discovery (RFC 4861): solicitations and advertisements, what ND
//! suppression answers and the ND guard checks.

use super::{Result, WireError, checksum, ethernet::MacAddr, ipv6};
use std::net::Ipv6Addr;

pub const TYPE_NS: u8 = 135;
pub const TYPE_NA: u8 = 136;
/// Type + code + checksum + reserved/flags + target address.
pub const NDP_LEN: usize = 24;
const OPT_SOURCE_LL: u8 = 1;
const OPT_TARGET_LL: u8 = 2;
/// Router, solicited and override flags of an advertisement.
pub const NA_FLAG_ROUTER: u8 = 0x80;
pub const NA_FLAG_SOLICITED: u8 = 0x40;
pub const NA_FLAG_OVERRIDE: u8 = 0x20;

/// A view of an NS or NA message (the ICMPv6 body after the IPv6 header).
pub struct Ndp<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Ndp<T> {
    /// Checks the length and that this is NS or NA with code 0.
    pub fn new_checked(b: T) -> Result<Ndp<T>> {
        let n = Ndp { b };
        let s = n.b.as_ref();
        if s.len() < NDP_LEN {
            return Err(WireError::Truncated);
        }
        if !(s[0] == TYPE_NS || s[0] == TYPE_NA) || s[1] != 0 {
            return Err(WireError::BadFlags);
        }
        Ok(n)
    }
    pub fn msg_type(&self) -> u8 {
        self.b.as_ref()[0]
    }
    pub fn target(&self) -> Ipv6Addr {
        ipv6::addr(self.b.as_ref(), 8)
    }
    /// The source (NS) or target (NA) link-layer address option, if present and well formed.
    pub fn link_layer_option(&self) -> Option<MacAddr> {
        let want = if self.msg_type() == TYPE_NS { OPT_SOURCE_LL } else { OPT_TARGET_LL };
        let mut o = &self.b.as_ref()[NDP_LEN..];
        while o.len() >= 8 {
            let len = o[1] as usize * 8;
            if len == 0 || len > o.len() {
                return None;
            }
            if o[0] == want && len == 8 {
                return Some(MacAddr::from_bytes(&o[2..8]));
            }
            o = &o[len..];
        }
        None
    }
}

/// Length of the neighbor advertisement `emit_na` writes (with a target link-layer option).
pub const NA_LEN: usize = NDP_LEN + 8;

/// Writes a solicited neighbor advertisement for `target` at `mac`, checksum included;
/// `router`: the Router flag set, as a router's advertisements have it (RFC 4861 §4.4: a host
/// that learns its default router's address so keeps it as a router).
pub fn emit_na(
    b: &mut [u8],
    src: &Ipv6Addr,
    dst: &Ipv6Addr,
    target: &Ipv6Addr,
    mac: MacAddr,
    router: bool,
) {
    let flags = NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE | if router { NA_FLAG_ROUTER } else { 0 };
    emit(b, src, dst, TYPE_NA, flags, target, OPT_TARGET_LL, mac);
}

/// Writes a neighbor solicitation for `target` with a source link-layer option (tests, VTEP).
pub fn emit_ns(b: &mut [u8], src: &Ipv6Addr, dst: &Ipv6Addr, target: &Ipv6Addr, mac: MacAddr) {
    emit(b, src, dst, TYPE_NS, 0, target, OPT_SOURCE_LL, mac);
}

/// An NS or NA with one link-layer address option (`NA_LEN` bytes), checksum included.
#[allow(clippy::too_many_arguments)]
fn emit(
    b: &mut [u8],
    src: &Ipv6Addr,
    dst: &Ipv6Addr,
    ty: u8,
    flags: u8,
    target: &Ipv6Addr,
    opt: u8,
    mac: MacAddr,
) {
    b[..NA_LEN].fill(0);
    b[0] = ty;
    b[4] = flags;
    b[8..24].copy_from_slice(&target.octets());
    b[24] = opt;
    b[25] = 1;
    b[26..32].copy_from_slice(&mac.0);
    let sum = ipv6::pseudo_header_sum(src, dst, ipv6::NEXT_ICMPV6, NA_LEN as u32);
    let c = !checksum::fold(checksum::accumulate(sum, &b[..NA_LEN], &mut false));
    b[2..4].copy_from_slice(&c.to_be_bytes());
}

/// Whether an ICMPv6 message verifies against its pseudo-header.
pub fn checksum_ok(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> bool {
    let sum = ipv6::pseudo_header_sum(src, dst, ipv6::NEXT_ICMPV6, msg.len() as u32);
    checksum::fold(checksum::accumulate(sum, msg, &mut false)) == 0xffff
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn na_round_trip() {
        let (s, d, t): (Ipv6Addr, Ipv6Addr, Ipv6Addr) =
            ("fd00::2".parse().unwrap(), "fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let mut b = [0u8; NA_LEN];
        emit_na(&mut b, &s, &d, &t, MacAddr([2, 0, 0, 0, 0, 2]), false);
        assert!(checksum_ok(&s, &d, &b));
        let n = Ndp::new_checked(&b[..]).unwrap();
        assert_eq!(n.msg_type(), TYPE_NA);
        assert_eq!(n.target(), t);
        assert_eq!(n.link_layer_option(), Some(MacAddr([2, 0, 0, 0, 0, 2])));
    }

    #[test]
    fn hostile_options_end_cleanly() {
        let mut b = [0u8; 40];
        b[0] = TYPE_NS;
        b[24] = OPT_SOURCE_LL;
        b[25] = 0; // zero-length option
        assert_eq!(Ndp::new_checked(&b[..]).unwrap().link_layer_option(), None);
        b[25] = 9; // longer than the message
        assert_eq!(Ndp::new_checked(&b[..]).unwrap().link_layer_option(), None);
        b[0] = 1;
        assert!(Ndp::new_checked(&b[..]).is_err());
    }
}

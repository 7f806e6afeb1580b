//! Frames from a one-line text spec, for synthetic traces (`knitterctl trace --synthetic`):
//! layers outermost first, each `name(key=value,...)`, separated by spaces, as OVS's
//! `ofproto/trace` flows and scapy's `/` chains read:
//!
//! ```text
//! eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) vlan(vid=10,pcp=5) ipv4(src=10.0.0.1,dst=10.0.0.2) udp(src=1000,dst=2000)
//! eth(src=..,dst=..) ipv4(src=192.0.2.2,dst=192.0.2.1) udp(dst=4789) vxlan(vni=100) eth(src=..,dst=..) arp(op=request,spa=10.0.0.1,tpa=10.0.0.2)
//! ```
//!
//! Layers: `eth(src,dst[,type])`, `vlan(vid[,pcp][,tpid])`, `arp(op,sha,spa,tha,tpa)`,
//! `ipv4(src,dst[,proto][,tos][,ttl])`, `ipv6(src,dst[,nh][,tc][,hlim])`, `udp([src][,dst])`,
//! `tcp([src][,dst][,flags])`, `icmp([type][,code])`, `icmpv6([type][,code])`, `vxlan(vni)`,
//! `payload(len)`. Lengths, next-protocol fields and checksums are filled in; the frame is
//! padded to 60 bytes.

use super::MacAddr;
use super::checksum;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a spec makes no frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("expected `name(key=value,...)` at {0:?}")]
    Syntax(String),
    #[error(
        "unknown layer {0:?} (eth, vlan, arp, ipv4, ipv6, udp, tcp, icmp, icmpv6, vxlan, payload)"
    )]
    Layer(String),
    #[error("{layer}: unknown field {field:?}")]
    Field { layer: &'static str, field: String },
    #[error("{layer}: {field}={value:?} is not {want}")]
    Value { layer: &'static str, field: String, value: String, want: &'static str },
    #[error("{layer}: {field} is required")]
    Missing { layer: &'static str, field: &'static str },
    #[error("{0}")]
    Order(String),
}

#[derive(Debug, Clone)]
enum Layer {
    Eth { src: MacAddr, dst: MacAddr, ethertype: Option<u16> },
    Vlan { tci: u16, tpid: u16 },
    Arp { op: u16, sha: Option<MacAddr>, spa: Ipv4Addr, tha: MacAddr, tpa: Ipv4Addr },
    Ipv4 { src: Ipv4Addr, dst: Ipv4Addr, proto: Option<u8>, tos: u8, ttl: u8 },
    Ipv6 { src: Ipv6Addr, dst: Ipv6Addr, nh: Option<u8>, tc: u8, hlim: u8 },
    Udp { src: u16, dst: u16 },
    Tcp { src: u16, dst: u16, flags: u8 },
    Icmp { v6: bool, ty: u8, code: u8 },
    Vxlan { vni: u32 },
    Payload { len: usize },
}

struct Fields {
    layer: &'static str,
    kv: BTreeMap<String, String>,
}

impl Fields {
    fn take<T: std::str::FromStr>(
        &mut self,
        field: &'static str,
        want: &'static str,
    ) -> Result<Option<T>, SpecError> {
        let Some(v) = self.kv.remove(field) else { return Ok(None) };
        let parsed = match v.strip_prefix("0x") {
            // Numbers may be hex.
            Some(hex) if want.contains("number") => {
                u64::from_str_radix(hex, 16).ok().and_then(|n| n.to_string().parse().ok())
            }
            _ => v.parse().ok(),
        };
        parsed.map(Some).ok_or(SpecError::Value {
            layer: self.layer,
            field: field.into(),
            value: v,
            want,
        })
    }

    fn need<T: std::str::FromStr>(
        &mut self,
        field: &'static str,
        want: &'static str,
    ) -> Result<T, SpecError> {
        self.take(field, want)?.ok_or(SpecError::Missing { layer: self.layer, field })
    }

    fn done(self) -> Result<(), SpecError> {
        match self.kv.into_keys().next() {
            Some(field) => Err(SpecError::Field { layer: self.layer, field }),
            None => Ok(()),
        }
    }
}

const MAC: &str = "a MAC address";
const V4: &str = "an IPv4 address";
const V6: &str = "an IPv6 address";
const U8: &str = "a number 0-255";
const U16: &str = "a number 0-65535";

fn parse_layer(name: &str, body: &str) -> Result<Layer, SpecError> {
    let layer: &'static str = match name {
        "eth" => "eth",
        "vlan" => "vlan",
        "arp" => "arp",
        "ipv4" => "ipv4",
        "ipv6" => "ipv6",
        "udp" => "udp",
        "tcp" => "tcp",
        "icmp" => "icmp",
        "icmpv6" => "icmpv6",
        "vxlan" => "vxlan",
        "payload" => "payload",
        other => return Err(SpecError::Layer(other.into())),
    };
    let mut kv = BTreeMap::new();
    for item in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').ok_or_else(|| SpecError::Syntax(item.into()))?;
        kv.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let mut f = Fields { layer, kv };
    let l = match layer {
        "eth" => Layer::Eth {
            src: f.need("src", MAC)?,
            dst: f.need("dst", MAC)?,
            ethertype: f.take("type", U16)?,
        },
        "vlan" => {
            let vid: u16 = f.need("vid", "a VLAN ID 0-4095")?;
            let pcp: u16 = f.take("pcp", "a priority 0-7")?.unwrap_or(0);
            if vid > 4095 || pcp > 7 {
                return Err(SpecError::Value {
                    layer,
                    field: "vid/pcp".into(),
                    value: format!("{vid}/{pcp}"),
                    want: "vid 0-4095, pcp 0-7",
                });
            }
            Layer::Vlan { tci: pcp << 13 | vid, tpid: f.take("tpid", U16)?.unwrap_or(0x8100) }
        }
        "arp" => {
            let op = match f.kv.remove("op").as_deref() {
                None | Some("request") | Some("1") => 1,
                Some("reply") | Some("2") => 2,
                Some(v) => {
                    return Err(SpecError::Value {
                        layer,
                        field: "op".into(),
                        value: v.into(),
                        want: "request or reply",
                    });
                }
            };
            Layer::Arp {
                op,
                sha: f.take("sha", MAC)?,
                spa: f.need("spa", V4)?,
                tha: f.take("tha", MAC)?.unwrap_or_default(),
                tpa: f.need("tpa", V4)?,
            }
        }
        "ipv4" => Layer::Ipv4 {
            src: f.need("src", V4)?,
            dst: f.need("dst", V4)?,
            proto: f.take("proto", U8)?,
            tos: f.take("tos", U8)?.unwrap_or(0),
            ttl: f.take("ttl", U8)?.unwrap_or(64),
        },
        "ipv6" => Layer::Ipv6 {
            src: f.need("src", V6)?,
            dst: f.need("dst", V6)?,
            nh: f.take("nh", U8)?,
            tc: f.take("tc", U8)?.unwrap_or(0),
            hlim: f.take("hlim", U8)?.unwrap_or(64),
        },
        "udp" => Layer::Udp {
            src: f.take("src", U16)?.unwrap_or(49152),
            dst: f.take("dst", U16)?.unwrap_or(9),
        },
        "tcp" => Layer::Tcp {
            src: f.take("src", U16)?.unwrap_or(49152),
            dst: f.take("dst", U16)?.unwrap_or(80),
            flags: f.take("flags", U8)?.unwrap_or(0x02),
        },
        "icmp" | "icmpv6" => {
            let v6 = layer == "icmpv6";
            Layer::Icmp {
                v6,
                ty: f.take("type", U8)?.unwrap_or(if v6 { 128 } else { 8 }),
                code: f.take("code", U8)?.unwrap_or(0),
            }
        }
        "vxlan" => {
            let vni: u32 = f.need("vni", "a VNI 0-16777215")?;
            if vni >= 1 << 24 {
                return Err(SpecError::Value {
                    layer,
                    field: "vni".into(),
                    value: vni.to_string(),
                    want: "a VNI 0-16777215",
                });
            }
            Layer::Vxlan { vni }
        }
        _ => {
            let len: usize = f.need("len", "a length 0-1500")?;
            if len > 1500 {
                return Err(SpecError::Value {
                    layer,
                    field: "len".into(),
                    value: len.to_string(),
                    want: "a length 0-1500",
                });
            }
            Layer::Payload { len }
        }
    };
    f.done()?;
    Ok(l)
}

fn parse(spec: &str) -> Result<Vec<Layer>, SpecError> {
    let mut layers = Vec::new();
    let mut rest = spec.trim();
    while !rest.is_empty() {
        let open = rest.find('(').ok_or_else(|| SpecError::Syntax(rest.into()))?;
        let close = rest[open..]
            .find(')')
            .map(|c| open + c)
            .ok_or_else(|| SpecError::Syntax(rest.into()))?;
        layers.push(parse_layer(rest[..open].trim(), &rest[open + 1..close])?);
        rest = rest[close + 1..].trim_start();
    }
    match layers.first() {
        Some(Layer::Eth { .. }) => Ok(layers),
        _ => Err(SpecError::Order("a frame starts with eth(...)".into())),
    }
}

/// The frame `spec` describes.
pub fn build(spec: &str) -> Result<Vec<u8>, SpecError> {
    let layers = parse(spec)?;
    let mut frame = emit(&layers, None)?;
    if frame.len() < 60 {
        frame.resize(60, 0);
    }
    Ok(frame)
}

/// The bytes of `layers` (the first wraps the rest); `ip`: the enclosing IP addresses, for
/// L4 checksums.
fn emit(layers: &[Layer], ip: Option<(IpAddr, IpAddr)>) -> Result<Vec<u8>, SpecError> {
    let Some((first, rest)) = layers.split_first() else { return Ok(Vec::new()) };
    let next = rest.first();
    let order = |what: &str| SpecError::Order(format!("{what} cannot follow {first:?}"));
    let mut out = Vec::new();
    match *first {
        Layer::Eth { src, dst, ethertype } => {
            out.extend(dst.0);
            out.extend(src.0);
            if let Some(
                Layer::Eth { .. }
                | Layer::Udp { .. }
                | Layer::Tcp { .. }
                | Layer::Icmp { .. }
                | Layer::Vxlan { .. },
            ) = next
            {
                return Err(order("this layer"));
            }
            let inner = emit(rest, None)?;
            // A tag's TPID sits where the ethertype would be.
            if !matches!(next, Some(Layer::Vlan { .. })) {
                out.extend(ethertype.unwrap_or_else(|| ethertype_of(next)).to_be_bytes());
            }
            out.extend(inner);
        }
        Layer::Vlan { tci, tpid } => {
            out.extend(tpid.to_be_bytes());
            out.extend(tci.to_be_bytes());
            if !matches!(next, Some(Layer::Vlan { .. })) {
                out.extend(ethertype_of(next).to_be_bytes());
            }
            out.extend(emit(rest, None)?);
        }
        Layer::Arp { op, sha, spa, tha, tpa } => {
            out.extend([0, 1, 8, 0, 6, 4]);
            out.extend(op.to_be_bytes());
            out.extend(sha.unwrap_or(MacAddr([2, 0, 0, 0, 0, 1])).0);
            out.extend(spa.octets());
            out.extend(tha.0);
            out.extend(tpa.octets());
            out.extend(emit(rest, None)?);
        }
        Layer::Ipv4 { src, dst, proto, tos, ttl } => {
            let inner = emit(rest, Some((src.into(), dst.into())))?;
            let total = 20 + inner.len();
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[1] = tos;
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = ttl;
            h[9] = proto.unwrap_or_else(|| proto_of(next, false));
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            let c = checksum::of(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend(h);
            out.extend(inner);
        }
        Layer::Ipv6 { src, dst, nh, tc, hlim } => {
            let inner = emit(rest, Some((src.into(), dst.into())))?;
            out.extend((6u32 << 28 | (tc as u32) << 20).to_be_bytes());
            out.extend((inner.len() as u16).to_be_bytes());
            out.push(nh.unwrap_or_else(|| proto_of(next, true)));
            out.push(hlim);
            out.extend(src.octets());
            out.extend(dst.octets());
            out.extend(inner);
        }
        Layer::Udp { src, dst } => {
            let inner = emit(rest, None)?;
            let mut h = l4_header::<8>(src, dst);
            h[4..6].copy_from_slice(&((8 + inner.len()) as u16).to_be_bytes());
            out.extend(h);
            out.extend(inner);
            fill_l4_checksum(&mut out, 6, 17, ip, true);
        }
        Layer::Tcp { src, dst, flags } => {
            let mut h = l4_header::<20>(src, dst);
            h[12] = 5 << 4;
            h[13] = flags;
            h[14..16].copy_from_slice(&65535u16.to_be_bytes());
            out.extend(h);
            out.extend(emit(rest, None)?);
            fill_l4_checksum(&mut out, 16, 6, ip, false);
        }
        Layer::Icmp { v6, ty, code } => {
            out.extend([ty, code, 0, 0, 0, 0, 0, 0]);
            out.extend(emit(rest, None)?);
            if v6 {
                fill_l4_checksum(&mut out, 2, 58, ip, false);
            } else {
                let c = checksum::of(&out);
                out[2..4].copy_from_slice(&c.to_be_bytes());
            }
        }
        Layer::Vxlan { vni } => {
            if !matches!(next, Some(Layer::Eth { .. })) {
                return Err(SpecError::Order(
                    "vxlan(...) is followed by the inner eth(...)".into(),
                ));
            }
            out.extend([0x08, 0, 0, 0]);
            out.extend((vni << 8).to_be_bytes());
            out.extend(emit(rest, None)?);
        }
        Layer::Payload { len } => {
            out.extend((0..len).map(|i| i as u8));
            out.extend(emit(rest, None)?);
        }
    }
    Ok(out)
}

fn l4_header<const N: usize>(src: u16, dst: u16) -> [u8; N] {
    let mut h = [0u8; N];
    h[0..2].copy_from_slice(&src.to_be_bytes());
    h[2..4].copy_from_slice(&dst.to_be_bytes());
    h
}

/// Writes the checksum at `at` of the L4 segment `seg` over the pseudo-header of `ip`
/// (none: left zero). UDP over IPv4 may leave it zero, but a real sender fills it.
fn fill_l4_checksum(seg: &mut [u8], at: usize, proto: u8, ip: Option<(IpAddr, IpAddr)>, udp: bool) {
    let Some((src, dst)) = ip else { return };
    let mut sum = 0u64;
    let mut odd = false;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            sum = checksum::accumulate(sum, &s.octets(), &mut odd);
            sum = checksum::accumulate(sum, &d.octets(), &mut odd);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            sum = checksum::accumulate(sum, &s.octets(), &mut odd);
            sum = checksum::accumulate(sum, &d.octets(), &mut odd);
        }
        _ => return,
    }
    sum += proto as u64 + seg.len() as u64;
    sum = checksum::accumulate(sum, seg, &mut odd);
    let mut c = !checksum::fold(sum);
    if udp && c == 0 {
        c = 0xffff;
    }
    if let Some(slot) = seg.get_mut(at..at + 2) {
        slot.copy_from_slice(&c.to_be_bytes());
    }
}

fn ethertype_of(next: Option<&Layer>) -> u16 {
    match next {
        Some(Layer::Arp { .. }) => 0x0806,
        Some(Layer::Ipv6 { .. }) => 0x86dd,
        Some(Layer::Vlan { tpid, .. }) => *tpid,
        Some(Layer::Payload { .. }) | None => 0x88b5, // local experimental
        _ => 0x0800,
    }
}

fn proto_of(next: Option<&Layer>, v6: bool) -> u8 {
    match next {
        Some(Layer::Udp { .. }) => 17,
        Some(Layer::Tcp { .. }) => 6,
        Some(Layer::Icmp { v6: true, .. }) => 58,
        Some(Layer::Icmp { .. }) => 1,
        _ if v6 => 59, // no next header
        _ => 253,      // experimental
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ipv4, udp};

    #[test]
    fn a_udp_frame_has_valid_lengths_and_checksums() {
        let f = build("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) ipv4(src=10.0.0.1,dst=10.0.0.2,tos=0xb8) udp(src=1000,dst=2000) payload(len=10)").unwrap();
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
        assert!(ip.checksum_ok());
        assert_eq!(ip.total_len(), 20 + 8 + 10);
        assert_eq!(f[15], 0xb8);
        let u = udp::Packet::new_checked(ip.payload()).unwrap();
        assert_eq!((u.src_port(), u.dst_port(), u.len()), (1000, 2000, 18));
        // The UDP checksum over the pseudo-header sums to zero.
        let mut s = checksum::accumulate(0, &f[26..34], &mut false) + 17 + 18;
        s = checksum::accumulate(s, ip.payload(), &mut false);
        assert_eq!(checksum::fold(s), 0xffff);
        assert_eq!(f.len(), 60);
    }

    #[test]
    fn tags_and_vxlan_nest() {
        let f = build("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) vlan(vid=10,pcp=5) ipv4(src=192.0.2.2,dst=192.0.2.1) udp(dst=4789) vxlan(vni=100) eth(src=02:00:00:00:00:03,dst=ff:ff:ff:ff:ff:ff) arp(spa=10.0.0.1,tpa=10.0.0.2)").unwrap();
        assert_eq!(&f[12..18], &[0x81, 0x00, 0xa0, 10, 0x08, 0x00]);
        let inner = &f[18 + 20 + 8 + 8..];
        assert_eq!(&inner[12..14], &[0x08, 0x06]);
        assert_eq!(&f[18 + 20 + 8 + 4..18 + 20 + 8 + 7], &[0, 0, 100]);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let cases = [
            ("ipv4(src=1.2.3.4,dst=1.2.3.5)", "starts with eth"),
            ("eth(src=02:00:00:00:00:01)", "dst is required"),
            ("eth(src=x,dst=02:00:00:00:00:02)", "not a MAC"),
            ("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) foo(a=1)", "unknown layer"),
            ("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) vlan(vid=5000)", "vid 0-4095"),
            ("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02) udp(dst=1)", "cannot follow"),
            ("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02,colour=red)", "unknown field"),
            ("eth(src=02:00:00:00:00:01,dst=02:00:00:00:00:02", "expected"),
        ];
        for (spec, want) in cases {
            let e = build(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }
}

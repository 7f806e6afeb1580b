//! Node `classify` (stage 1, local ports): (port, VLAN) → bridge domain, L2 sanity (runts,
//! oversize, tags, group source MACs), node `port-security` ([`crate::security`]) for pod
//! ports, and the FDB keys of source and destination with their buckets prefetched for
//! `forward`.

use super::{Ctx, NO_PEER};
use crate::batch::{BATCH, Batch};
use crate::buf::{BufId, Pool};
use crate::counters::DropReason;
use crate::descriptor::{Descriptor, Next};
use crate::fdb::{self, Fdb};
use crate::security;
use crate::snapshot::{NO_BD, PortEntry, PortKind, Security, Snapshot};
use crate::trace::Node;
use crate::vlan;
use crate::wire::ethernet::{self, MacAddr, ethertype};

/// Node `classify`, as [`crate::graph`] collects it.
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Classify,
    name: "classify",
    nexts: &[Next::Node(Node::PortSecurity), Next::Node(Node::Learn), Next::Drop],
    drops: &[
        DropReason::Runt,
        DropReason::Oversize,
        DropReason::TaggedOnAccess,
        DropReason::WrongTpid,
        DropReason::VlanNotAllowed,
        DropReason::UntaggedNotAllowed,
        DropReason::NoBridgeDomain,
        DropReason::SrcMacGroup,
    ],
    counts: &[],
};

/// Node `port-security` ([`crate::security`]), run by `classify` for pod ports.
pub(crate) const PORT_SECURITY: Descriptor = Descriptor {
    node: Node::PortSecurity,
    name: "port-security",
    nexts: &[Next::Node(Node::Learn), Next::Drop],
    drops: &[
        DropReason::SecurityMac,
        DropReason::SecurityIp,
        DropReason::SecurityArp,
        DropReason::SecurityNd,
        DropReason::SecurityRa,
        DropReason::SecurityDhcp,
    ],
    counts: &[],
};

/// Stage 1 for a burst from a local port: (port, VLAN) → bridge domain, L2 sanity, FDB keys.
#[inline(always)]
pub(super) fn classify_port_burst(
    pool: &Pool,
    fdb: &Fdb,
    port: &PortEntry,
    snap: &Snapshot,
    batch: &mut Batch,
    ctxs: &mut [Ctx; BATCH],
) -> u64 {
    let mut bytes = 0u64;
    for (b, ctx) in batch.as_mut_slice().iter_mut().zip(ctxs.iter_mut()) {
        if let Err(r) = classify_port(pool, fdb, port, snap, b, &mut bytes, ctx) {
            ctx.drop = Some(r);
        }
    }
    bytes
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn classify_port(
    pool: &Pool,
    fdb: &Fdb,
    port: &PortEntry,
    snap: &Snapshot,
    b: &mut BufId,
    bytes: &mut u64,
    ctx: &mut Ctx,
) -> Result<(), DropReason> {
    let (h, len) = pool.head_and_len(b);
    *bytes += len as u64;
    if h.len() < ethernet::HEADER_LEN + ethernet::TAG_LEN {
        return fill_untagged_or_runt(fdb, port, h, len, ctx);
    }
    let et = u16::from_be_bytes([h[12], h[13]]);
    // Below 0x8100 (IPv4, ARP, ...) nothing is a tag: the common case costs one compare.
    if et < ethertype::VLAN || !ethernet::is_tpid(et) {
        if port.untagged_bd == NO_BD {
            return Err(DropReason::UntaggedNotAllowed);
        }
        // Port MTUs are validated to at most MAX_FRAME - 18, so this also bounds `len`.
        if len - ethernet::HEADER_LEN > port.mtu as usize {
            return Err(DropReason::Oversize);
        }
        return fill_l2(
            fdb,
            ctx,
            h,
            port.untagged_bd,
            NO_PEER,
            port.security.as_ref(),
            false,
            0,
            len,
        );
    }
    let tci = u16::from_be_bytes([h[ethernet::field::TCI], h[ethernet::field::TCI + 1]]);
    let vid = tci & 0x0fff;
    if vid == 0 {
        // A priority tag: the frame is untagged for VLAN purposes.
        if port.untagged_bd == NO_BD {
            return Err(DropReason::UntaggedNotAllowed);
        }
        vlan::pop(pool.view(), b);
        let (h, len) = pool.head_and_len(b);
        if len - ethernet::HEADER_LEN > port.mtu as usize {
            return Err(DropReason::Oversize);
        }
        return fill_l2(
            fdb,
            ctx,
            h,
            port.untagged_bd,
            NO_PEER,
            port.security.as_ref(),
            false,
            tci & 0xf000,
            len,
        );
    }
    if port.kind != PortKind::Trunk {
        return Err(DropReason::TaggedOnAccess);
    }
    if et != port.tpid {
        return Err(DropReason::WrongTpid);
    }
    if !port.allowed.contains(vid) {
        return Err(DropReason::VlanNotAllowed);
    }
    let bd = snap.vlan_bd[vid as usize];
    if bd == NO_BD {
        return Err(DropReason::NoBridgeDomain);
    }
    if len - ethernet::HEADER_LEN - ethernet::TAG_LEN > port.mtu as usize {
        return Err(DropReason::Oversize);
    }
    fill_l2(fdb, ctx, h, bd, NO_PEER, port.security.as_ref(), true, tci & 0xf000, len)
}

/// A head too short to hold a tag: untagged if it holds an Ethernet header at all.
#[cold]
pub(super) fn fill_untagged_or_runt(
    fdb: &Fdb,
    port: &PortEntry,
    h: &[u8],
    len: usize,
    ctx: &mut Ctx,
) -> Result<(), DropReason> {
    if h.len() < ethernet::HEADER_LEN {
        return Err(DropReason::Runt);
    }
    if ethernet::is_tpid(u16::from_be_bytes([h[12], h[13]])) {
        return Err(DropReason::Runt);
    }
    if port.untagged_bd == NO_BD {
        return Err(DropReason::UntaggedNotAllowed);
    }
    fill_l2(fdb, ctx, h, port.untagged_bd, NO_PEER, port.security.as_ref(), false, 0, len)
}

/// The part of stage 1 every frame shares: source sanity, port security (`sec`, a local
/// port's), FDB keys and where they live (prefetched for stage 2).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_l2(
    fdb: &Fdb,
    ctx: &mut Ctx,
    h: &[u8],
    bd: u16,
    from_peer: u16,
    sec: Option<&Security>,
    tagged: bool,
    pcp: u16,
    len: usize,
) -> Result<(), DropReason> {
    // Later stages index the L2 header in the head segment without further checks: a port
    // that hands over a chain whose head is shorter than the header is refused here.
    let l2 = if tagged { ethernet::HEADER_LEN + ethernet::TAG_LEN } else { ethernet::HEADER_LEN };
    if h.len() < l2 {
        return Err(DropReason::Runt);
    }
    // Two 8-byte loads hold both addresses: bytes 0..8 start with the destination, bytes
    // 4..12 end with the source.
    let (Some(a), Some(b)) = (h.first_chunk::<8>(), h.get(4..).and_then(|t| t.first_chunk::<8>()))
    else {
        return Err(DropReason::Runt);
    };
    let (w0, w1) = (u64::from_be_bytes(*a), u64::from_be_bytes(*b));
    let (dst, src) = (w0 >> 16, w1 & 0xffff_ffff_ffff);
    if src & MacAddr::GROUP_BIT_U64 != 0 {
        return Err(DropReason::SrcMacGroup);
    }
    if let Some(sec) = sec {
        security::check(sec, h, l2, src)?;
    }
    let (src_key, dst_key) = (fdb::key(bd, src), fdb::key(bd, dst));
    let (src_loc, dst_loc) = (fdb.locate(src_key), fdb.locate(dst_key));
    fdb.prefetch(dst_loc);
    fdb.prefetch(src_loc);
    *ctx = Ctx {
        len: len as u32,
        reply: false,
        taken: false,
        bd,
        drop: None,
        from_peer,
        tagged,
        pcp,
        src_key,
        dst_key,
        src_loc,
        dst_loc,
    };
    Ok(())
}

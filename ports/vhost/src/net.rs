//! The virtio-net side of a vhost-user port: frames from a guest's transmit chains into pool
//! packets, and pool packets into a guest's receive chains, each behind the 12-byte
//! `virtio_net_hdr_v1` (VERSION_1 or MRG_RXBUF).
//!
//! Guest bytes are copied once, at once (see `memory.rs`): the guest may rewrite a buffer
//! at any time, and whatever it wrote is what the frame carries. A transmit header asking
//! for checksum or segmentation work that was not negotiated is refused (the frame would
//! leave with a wrong checksum or as a super-frame), as is a frame shorter than an Ethernet
//! header or longer than the switch's largest.

use crate::memory::{GuestMemory, GuestSlice, MemError};
use crate::queue::Burst;
use crate::vring::{Chain, MAX_SEGS};
use vswitch::buf::MAX_FRAME;
use vswitch::{BufId, Pool, PoolCache};

/// Bytes of `virtio_net_hdr_v1`.
pub const HDR_LEN: usize = 12;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
const ETH_HLEN: usize = 14;

/// Why a frame could not cross between guest and switch (counted by the port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("frame shorter than the virtio-net and Ethernet headers")]
    Runt,
    #[error("frame longer than {MAX_FRAME} bytes")]
    TooLong,
    #[error("the guest asked for checksum offload, which was not negotiated")]
    CsumNotNegotiated,
    #[error("the guest asked for segmentation offload, which was not negotiated")]
    GsoNotNegotiated,
    #[error("the buffer pool is empty")]
    NoBuffer,
    #[error("the guest's receive buffers are too small for the frame")]
    GuestBufferTooSmall,
    #[error("a receive chain was malformed")]
    BadChain,
    #[error(transparent)]
    Memory(#[from] MemError),
}

/// Offloads negotiated with the guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    /// `VIRTIO_NET_F_CSUM`: the guest may send frames with a partial checksum.
    pub csum: bool,
    /// Any `VIRTIO_NET_F_HOST_*` segmentation feature.
    pub gso: bool,
}

/// Copies the frame of a transmit chain (header and frame, device-readable, the header
/// possibly in its own buffer) into a new packet.
pub fn from_guest(
    mem: &GuestMemory,
    chain: &Chain,
    cache: &mut PoolCache,
    offloads: Offloads,
) -> Result<BufId, NetError> {
    // The common case (DPDK's virtio-user, Linux with VERSION_1): header and frame in one
    // buffer.
    if let [s] = chain.segments()
        && !s.writable
    {
        return from_buffer(mem.slice(s.addr, s.len as usize)?, cache, offloads);
    }
    from_guest_gathered(mem, chain, cache, offloads)
}

/// Copies the frame of a transmit chain of one buffer (header and frame) into a new packet.
#[inline]
pub fn from_buffer(
    b: GuestSlice<'_>,
    cache: &mut PoolCache,
    offloads: Offloads,
) -> Result<BufId, NetError> {
    if b.len() < HDR_LEN + ETH_HLEN {
        return Err(NetError::Runt);
    }
    check_header(b.read_array().unwrap_or_default(), offloads)?;
    let frame = b.from(HDR_LEN);
    if frame.len() > MAX_FRAME {
        return Err(NetError::TooLong);
    }
    let mut at = 0;
    cache.alloc_filled(frame.len(), |dst| at += frame.from(at).read(dst)).ok_or(NetError::NoBuffer)
}

/// Frames at least this long (after the virtio-net header) are lent, not copied, when the
/// switch may lend (`VhostPort::set_single_copy`): below it, one more copy costs less than
/// keeping the guest's buffer for the burst.
pub const LEND_MIN: usize = 512;
/// Bytes of a lent frame copied into switch memory before the pipeline decides on it: every
/// header it reads (VXLAN outer and inner, VLAN, IP, ARP and ND for port security), so a
/// guest rewriting its buffer after the check changes only payload.
pub const LENT_HEAD: usize = 128;

/// A transmit chain of one buffer (header and frame) as a lent packet: its first
/// [`LENT_HEAD`] bytes copied, the rest left in the guest's buffer, which the caller keeps
/// (does not return to the guest) until the port's `rx_done`; and whether it was lent.
/// Frames that ask for offload work are copied whole (`from_buffer`: not lent), as the
/// offload code reads the whole frame.
///
/// # Safety
/// `b` must stay mapped and its descriptor unreturned until the port's `rx_done` for this
/// burst (see `vswitch::LentTail`).
#[inline]
pub unsafe fn lend_from_buffer(
    b: GuestSlice<'_>,
    cache: &mut PoolCache,
    offloads: Offloads,
) -> Result<(BufId, bool), NetError> {
    if b.read_array::<2>() != Some([0, VIRTIO_NET_HDR_GSO_NONE]) || b.len() < HDR_LEN + LENT_HEAD {
        return from_buffer(b, cache, offloads).map(|b| (b, false));
    }
    let frame = b.from(HDR_LEN);
    if frame.len() > MAX_FRAME {
        return Err(NetError::TooLong);
    }
    let tail = frame.from(LENT_HEAD);
    let tail = vswitch::LentTail { ptr: tail.as_ptr(), len: tail.len() as u32 };
    // SAFETY: the tail is inside `b`, which the caller keeps as the function requires.
    unsafe { cache.alloc_lent(LENT_HEAD, |dst| _ = frame.read(dst), tail) }
        .map(|b| (b, true))
        .ok_or(NetError::NoBuffer)
}

/// What a transmit header asks for, against what was negotiated.
#[inline]
fn check_header(flags_gso: [u8; 2], offloads: Offloads) -> Result<(), NetError> {
    if flags_gso[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 && !offloads.csum {
        return Err(NetError::CsumNotNegotiated);
    }
    if flags_gso[1] != VIRTIO_NET_HDR_GSO_NONE && !offloads.gso {
        return Err(NetError::GsoNotNegotiated);
    }
    Ok(())
}

/// `from_guest` for a chain of several buffers.
#[cold]
fn from_guest_gathered(
    mem: &GuestMemory,
    chain: &Chain,
    cache: &mut PoolCache,
    offloads: Offloads,
) -> Result<BufId, NetError> {
    let mut parts = [GuestSlice::EMPTY; MAX_SEGS];
    let (mut n, mut hdr, mut got) = (0, [0u8; HDR_LEN], 0);
    for s in chain.segments().iter().filter(|s| !s.writable) {
        let mut b = mem.slice(s.addr, s.len as usize)?;
        if got < HDR_LEN {
            let take = b.read(&mut hdr[got..]);
            got += take;
            b = b.from(take);
        }
        if !b.is_empty() {
            parts[n] = b;
            n += 1;
        }
    }
    let len: usize = parts[..n].iter().map(|p| p.len()).sum();
    if got < HDR_LEN || len < ETH_HLEN {
        return Err(NetError::Runt);
    }
    if len > MAX_FRAME {
        return Err(NetError::TooLong);
    }
    check_header([hdr[0], hdr[1]], offloads)?;
    let (mut parts, mut cur) = (parts[..n].iter(), GuestSlice::EMPTY);
    cache
        .alloc_filled(len, |mut dst| {
            while !dst.is_empty() {
                while cur.is_empty() {
                    let Some(next) = parts.next() else { return };
                    cur = *next;
                }
                let k = cur.read(dst);
                (dst, cur) = (&mut dst[k..], cur.from(k));
            }
        })
        .ok_or(NetError::NoBuffer)
}

/// Copies a packet into a receive chain (device-writable buffers), behind a header that
/// says one buffer and no offload; returns the bytes written, header included.
pub fn to_guest(mem: &GuestMemory, chain: &Chain, pool: &Pool, b: &BufId) -> Result<u32, NetError> {
    let total = HDR_LEN + pool.pkt_len(b);
    if chain.writable < total as u64 {
        return Err(NetError::GuestBufferTooSmall);
    }
    // The common case: one receive buffer, an unchained packet.
    if let [s] = chain.segments()
        && !pool.is_chained(b)
    {
        return to_buffer(mem.slice(s.addr, total)?, pool, b);
    }
    let mut src = Source::new(&ONE_BUFFER, pool, b);
    fill(mem, chain, &mut src)?;
    Ok(total as u32)
}

/// The receive header of a frame in one buffer without offloads: only num_buffers (1) set.
const ONE_BUFFER: [u8; HDR_LEN] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// Copies an unchained packet into one receive buffer behind [`ONE_BUFFER`]; returns the
/// bytes written, header included.
#[inline]
pub fn to_buffer(dst: GuestSlice<'_>, pool: &Pool, b: &BufId) -> Result<u32, NetError> {
    let (frame, len) = pool.head_and_len(b);
    let total = HDR_LEN + len;
    if dst.len() < total {
        return Err(NetError::GuestBufferTooSmall);
    }
    // A lent packet (the single-copy path): its tail goes straight from the source guest's
    // buffer into this one.
    if frame.len() < len
        && let Some(t) = pool.lent_tail(b)
    {
        // SAFETY: the lending invariant (`vswitch::LentTail`): the tail is readable until the
        // lending port's `rx_done`, which comes after this burst.
        unsafe { dst.from(HDR_LEN + frame.len()).copy_from_raw(t.ptr, t.len as usize) };
    }
    // The header usually holds these bytes already (the buffer's previous frame had them)
    // and, with DPDK's virtio-user, sits in a cache line of its own in front of the frame:
    // writing it anyway moves that line to this core and the guest's driver stalls reading
    // num_buffers from it (as DPDK's own vhost library, write only what differs).
    if dst.read_array() != Some(ONE_BUFFER) {
        dst.write_array(&ONE_BUFFER);
    }
    dst.from(HDR_LEN).write(frame);
    Ok(total as u32)
}

/// The bytes a receive chain gets: the header, then the packet's segments.
struct Source<'a, I: Iterator<Item = &'a [u8]>> {
    rest: I,
    cur: &'a [u8],
}

impl<'a> Source<'a, std::iter::Chain<std::iter::Once<&'a [u8]>, vswitch::buf::Segments<'a>>> {
    fn new(hdr: &'a [u8], pool: &'a Pool, b: &'a BufId) -> Self {
        let mut rest = std::iter::once(hdr).chain(pool.segments(b));
        let cur = rest.next().unwrap_or_default();
        Source { rest, cur }
    }
}

impl<'a, I: Iterator<Item = &'a [u8]>> Source<'a, I> {
    fn is_empty(&self) -> bool {
        self.cur.is_empty()
    }

    /// Copies as much as fits into `dst`; returns how much.
    fn copy_into(&mut self, mut dst: GuestSlice<'_>) -> usize {
        let mut n = 0;
        while !dst.is_empty() && !self.cur.is_empty() {
            let k = dst.write(self.cur);
            (dst, self.cur, n) = (dst.from(k), &self.cur[k..], n + k);
            while self.cur.is_empty() {
                match self.rest.next() {
                    Some(next) => self.cur = next,
                    None => break,
                }
            }
        }
        n
    }
}

/// Fills a chain's writable buffers from `src`; returns the bytes written.
fn fill<'a, I: Iterator<Item = &'a [u8]>>(
    mem: &GuestMemory,
    chain: &Chain,
    src: &mut Source<'a, I>,
) -> Result<u32, NetError> {
    let mut written = 0;
    for s in chain.segments().iter().filter(|s| s.writable) {
        if src.is_empty() {
            break;
        }
        written += src.copy_into(mem.slice(s.addr, s.len as usize)?) as u32;
    }
    Ok(written)
}

/// Copies a packet into as many receive chains as it needs (`MRG_RXBUF`), the first header
/// saying how many. With too few chains available, none is used (they are put back for a
/// later frame) and the packet is refused. A malformed chain on the way ends the frame: it
/// and the chains already filled go back to the guest empty (its driver drops them).
/// `chain` is scratch space the caller keeps across packets (it is large: setting up a new
/// one per packet cost ~30 instructions).
pub fn to_guest_merged<'m>(
    ring: &mut impl Burst<'m>,
    pool: &Pool,
    b: &BufId,
    chain: &mut Chain,
) -> Result<(), NetError> {
    // The common case: the first chain holds the whole frame (`to_guest`, with its fast path).
    match ring.pop(chain) {
        None => return Err(NetError::GuestBufferTooSmall),
        Some(Err(_)) => {
            ring.push_used(chain.head, 0);
            return Err(NetError::BadChain);
        }
        Some(Ok(())) if chain.writable >= (HDR_LEN + pool.pkt_len(b)) as u64 => {
            let r = to_guest(ring.memory(), chain, pool, b);
            ring.push_used(chain.head, *r.as_ref().unwrap_or(&0));
            return r.map(drop);
        }
        Some(Ok(())) => ring.unpop(),
    }
    let mut hdr = [0u8; HDR_LEN];
    let mut src = Source::new(&hdr, pool, b);
    let mut used: [(u16, u32); MAX_MERGED] = [(0, 0); MAX_MERGED];
    let (mut n, mut first) = (0, None);
    while !src.is_empty() {
        let filled = match ring.pop(chain) {
            None => Err(NetError::GuestBufferTooSmall),
            Some(Ok(())) if n == MAX_MERGED => {
                ring.unpop();
                Err(NetError::GuestBufferTooSmall)
            }
            Some(Ok(())) => {
                if first.is_none() {
                    first = Some(chain.clone());
                }
                fill(ring.memory(), chain, &mut src)
            }
            Some(Err(_)) => Err(NetError::BadChain),
        };
        match filled {
            Ok(w) => {
                used[n] = (chain.head, w);
                n += 1;
            }
            Err(NetError::GuestBufferTooSmall) => {
                for _ in 0..n {
                    ring.unpop();
                }
                return Err(NetError::GuestBufferTooSmall);
            }
            Err(e) => {
                // In ring order (IN_ORDER): the chains filled before the bad one, then it.
                for &(head, _) in &used[..n] {
                    ring.push_used(head, 0);
                }
                ring.push_used(chain.head, 0);
                return Err(e);
            }
        }
    }
    // The header went into the first chain before its count was known: patch num_buffers
    // (header bytes 10 and 11, wherever the chain's buffers put them).
    hdr[10..12].copy_from_slice(&(n as u16).to_le_bytes());
    if let Some(c) = &first {
        write_at(ring.memory(), c, 10, &hdr[10..12])?;
    }
    for &(head, len) in &used[..n] {
        ring.push_used(head, len);
    }
    Ok(())
}

/// Writes `bytes` at logical offset `at` of a chain's writable buffers.
fn write_at(
    mem: &GuestMemory,
    chain: &Chain,
    mut at: usize,
    mut bytes: &[u8],
) -> Result<(), NetError> {
    for s in chain.segments().iter().filter(|s| s.writable) {
        let len = s.len as usize;
        if at >= len {
            at -= len;
            continue;
        }
        let k = (len - at).min(bytes.len());
        mem.slice(crate::memory::GuestAddr(s.addr.0 + at as u64), k)?.write(&bytes[..k]);
        (bytes, at) = (&bytes[k..], 0);
        if bytes.is_empty() {
            break;
        }
    }
    Ok(())
}

/// Receive chains one frame may take with `MRG_RXBUF` (a 9216-byte frame in 1 KiB buffers).
const MAX_MERGED: usize = 16;

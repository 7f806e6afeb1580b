//! An AF_PACKET port on a kernel network device: the fallback where AF_XDP is not available.
//!
//! Receive and transmit use TPACKET_V2 rings (a status word per frame): receive on a socket
//! bound to every protocol, transmit on a second socket bound with protocol 0 (so it receives
//! nothing) with one `sendto` kick per burst. TPACKET_V3's block rings were tried first: the
//! kernel hands a block over only when it is full or its timer (≥ 1 ms) expires, which adds a
//! millisecond of latency to a lightly loaded port and cut TCP throughput by an order of
//! magnitude. Frames are copied between the rings and
//! pool buffers: this port trades a copy for portability.
//!
//! Frames from a sender on this host (a pod's veth, Linux's own VXLAN device on a veth
//! underlay) may carry the sender's offloads: a checksum left partial, or a GSO super-frame of
//! up to 64 KiB. The receive socket asks for the virtio-net header (`PACKET_VNET_HDR`, set
//! before its ring) that says exactly which checksum to finish (the inner one of a VXLAN
//! frame) and how to cut a super-frame ([`crate::offload`]). A super-frame larger than a ring
//! slot is queued whole on the socket (`PACKET_COPY_THRESH`, `TP_STATUS_COPY` in its slot) and
//! read with one `recv` into the port's scratch buffer: one system call per ~45 segments.
//! Segments that do not fit this burst wait in the port for the next.
//!
//! The rings are sized from the interface's MTU when the port opens ([`Rings::for_mtu`]): a
//! pod's veth (MTU 1500) gets 2 KiB slots, 256 to receive and 128 to send — 768 KiB of ring
//! (16 KiB slots, 12 MiB, made 200 pod ports cost 2.5 GiB). A frame longer than a receive
//! slot still arrives whole (the copy path above); one longer than a send slot (the MTU
//! raised after the port opened) is dropped and counted (`tx_dropped`), never cut short.
//!
//! The kernel strips the outer 802.1Q tag on receive when the device offloads it and reports
//! it in the frame header (`TP_STATUS_VLAN_VALID`, with the TPID when
//! `TP_STATUS_VLAN_TPID_VALID`); the port puts the tag back into the frame, so **a tagged frame
//! is never seen as untagged**. Frames this socket sends are not received again
//! (`PACKET_IGNORE_OUTGOING`).
//!
//! Unsafe code is confined here: the two ring mappings, with these invariants:
//! - each mapping is `len` bytes long and lives as long as the `Rings` value;
//! - the kernel owns a block/frame until its status word says the user owns it; the port
//!   reads a frame only after an acquire load of that status, and hands it back with a
//!   release store, after which it never touches it again;
//! - every offset read from a header is checked against the block/frame bounds before use.

use crate::offload::{MAX_HEADERS, Segmenter, VNET_HDR_LEN, VnetHdr, finish_checksum};
use plumbing::sys::{check, if_mac, if_mtu, if_running, ifindex, setopt};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering::*};
use vswitch::batch::Batch;
use vswitch::buf::{BufId, PoolCache};
use vswitch::port::{Port, QueueCounters, QueueStats};
use vswitch::wire::MacAddr;

const TPACKET_V2: libc::c_int = 1;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_COPY_THRESH: libc::c_int = 7;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_COPY: u32 = 1 << 1;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 1 << 2;

/// The slot and ring sizes of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    /// Bytes per slot (a power of two, ≥ 2 KiB): the frame header, the virtio-net header, an
    /// MTU-sized frame with its Ethernet header and two tags.
    pub frame: usize,
    pub rx_frames: usize,
    pub tx_frames: usize,
}

impl Rings {
    /// Slots per ring: at the ~1 Mpps an AF_PACKET port moves, 256 received frames are
    /// ~250 µs of traffic, far more than the PMD's gap between two polls.
    pub const RX_FRAMES: usize = 256;
    pub const TX_FRAMES: usize = 128;

    /// Rings for an interface of `mtu` bytes.
    pub fn for_mtu(mtu: u32) -> Rings {
        // TPACKET2_HDRLEN (52) aligned to 16, the virtio-net header, Ethernet with two tags.
        let overhead = 64 + VNET_HDR_LEN + 14 + 8;
        let frame = (overhead + mtu as usize).next_power_of_two().max(2048);
        Rings { frame, rx_frames: Self::RX_FRAMES, tx_frames: Self::TX_FRAMES }
    }

    /// Bytes both rings map.
    pub fn bytes(&self) -> usize {
        self.frame * (self.rx_frames + self.tx_frames)
    }
}
/// The largest frame the kernel hands over: a 64 KiB IP packet behind Ethernet, two tags and
/// the virtio-net header.
const SCRATCH: usize = 65_535 + 14 + 8 + VNET_HDR_LEN;
/// Receive buffer for super-frames queued whole (`TP_STATUS_COPY`): room for a few dozen.
const RCVBUF: i32 = 4 << 20;
/// Offset of frame data in a TPACKET_V2 tx frame: TPACKET2_HDRLEN - sizeof(sockaddr_ll).
const TX_DATA: usize = 32;
/// Offsets in `struct tpacket2_hdr`.
mod v2 {
    pub const STATUS: usize = 0;
    pub const LEN: usize = 4;
    pub const SNAPLEN: usize = 8;
    pub const MAC: usize = 12;
    pub const VLAN_TCI: usize = 24;
    pub const VLAN_TPID: usize = 26;
}

#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

/// One mmap'ed ring.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a shared mapping of a packet socket's ring; the kernel validated the ring
        // size when the ring was set up, and we map exactly that size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// The status word at `off` (a u32 the kernel and we hand over ownership with).
    fn status(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.len && off.is_multiple_of(4));
        // SAFETY: in bounds and aligned (checked); the word lives as long as the mapping and
        // is only accessed atomically by us.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }

    fn u32_at(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len);
        // SAFETY: in bounds (checked); unaligned read of kernel-written memory we own now.
        unsafe { self.ptr.add(off).cast::<u32>().read_unaligned() }
    }

    fn u16_at(&self, off: usize) -> u16 {
        assert!(off + 2 <= self.len);
        // SAFETY: as above.
        unsafe { self.ptr.add(off).cast::<u16>().read_unaligned() }
    }

    /// Bytes `[off, off + len)`, which must be in bounds and owned by us (status says so).
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked); the region is ours until we hand the block back.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// Bytes `[off, off + len)` to write, which must be in bounds (checked).
    ///
    /// # Safety
    /// The bytes are the caller's alone for the slice's life: a tx frame while its status is
    /// AVAILABLE and the caller is the single tx user (under the port's tx lock); an rx frame
    /// while its status says USER and the caller is the single poller (under the rx lock). No
    /// other slice of the same bytes may be alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (checked); the bytes are the caller's alone (the contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

struct RxState {
    frame: usize,
    /// A super-frame being cut (at `staged` in `scratch`), its segments not all delivered.
    pending: Option<Segmenter>,
    scratch: Box<[u8]>,
    staged: std::ops::Range<usize>,
    headers: [u8; MAX_HEADERS],
}

/// What became of one ring slot.
enum Taken {
    Frame(BufId),
    /// A super-frame now staged for cutting.
    Staged,
    Dropped,
}

struct TxState {
    frame: usize,
}

/// An AF_PACKET port bound to one kernel interface.
pub struct AfPacketPort {
    name: String,
    ifname: String,
    rx_fd: OwnedFd,
    tx_fd: OwnedFd,
    rx: Mapping,
    tx: Mapping,
    rings: Rings,
    rx_state: std::sync::Mutex<RxState>,
    tx_state: std::sync::Mutex<TxState>,
    mac: Option<MacAddr>,
    counters: QueueCounters,
    /// The interface's link (up and running), as last asked by `refresh_link`.
    link: std::sync::atomic::AtomicBool,
}

// SAFETY: the mappings are only touched through the rx/tx paths, each serialised by its own
// mutex (taken with try_lock: one poller, senders one at a time); see the module invariants.
unsafe impl Send for AfPacketPort {}
// SAFETY: as above.
unsafe impl Sync for AfPacketPort {}

fn packet_socket(protocol: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol.to_be() as i32,
        )
    })?;
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets the socket to TPACKET_V2 and maps a `frames`-frame ring of the kind `which`
/// (PACKET_RX_RING or PACKET_TX_RING), blocks of at least a page and four frames.
fn map_ring(fd: &OwnedFd, which: libc::c_int, frame: usize, frames: usize) -> io::Result<Mapping> {
    setopt(fd.as_raw_fd(), libc::SOL_PACKET, PACKET_VERSION, &TPACKET_V2)?;
    let per_block = (4096 / frame).max(4);
    let req = TpacketReq {
        block_size: (frame * per_block) as u32,
        block_nr: (frames / per_block) as u32,
        frame_size: frame as u32,
        frame_nr: frames as u32,
    };
    setopt(fd.as_raw_fd(), libc::SOL_PACKET, which, &req)?;
    Mapping::new(fd.as_raw_fd(), frame * frames)
}

fn bind(fd: RawFd, ifindex: i32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex;
    // SAFETY: binds to a sockaddr_ll we own, with its size.
    check(unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    })
    .map(drop)
}

impl AfPacketPort {
    /// Opens the port on interface `ifname` (in the calling thread's network namespace).
    pub fn open(name: &str, ifname: &str) -> io::Result<AfPacketPort> {
        let ifindex = ifindex(ifname)? as i32;
        const ETH_P_ALL: u16 = 0x0003;
        let rx_fd = packet_socket(ETH_P_ALL)?;
        setopt(rx_fd.as_raw_fd(), libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32)?;
        // Before the ring exists (the kernel refuses it after): each slot then starts with the
        // virtio-net header.
        setopt(rx_fd.as_raw_fd(), libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)?;
        setopt(rx_fd.as_raw_fd(), libc::SOL_PACKET, PACKET_COPY_THRESH, &1i32)?;
        // Beyond rmem_max needs CAP_NET_ADMIN, which the daemon has; otherwise the default.
        let _ = setopt(rx_fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF);
        let rings = Rings::for_mtu(if_mtu(rx_fd.as_raw_fd(), ifname).unwrap_or(9216));
        let rx = map_ring(&rx_fd, PACKET_RX_RING, rings.frame, rings.rx_frames)?;
        bind(rx_fd.as_raw_fd(), ifindex, ETH_P_ALL)?;

        let tx_fd = packet_socket(0)?;
        // Best effort: skip the qdisc layer (as DPDK's af_packet PMD does).
        let _ = setopt(tx_fd.as_raw_fd(), libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1i32);
        let tx = map_ring(&tx_fd, PACKET_TX_RING, rings.frame, rings.tx_frames)?;
        bind(tx_fd.as_raw_fd(), ifindex, 0)?;
        let mac = if_mac(rx_fd.as_raw_fd(), ifname);
        let link = std::sync::atomic::AtomicBool::new(
            if_running(rx_fd.as_raw_fd(), ifname).unwrap_or(false),
        );
        tracing::info!(
            port = name,
            ifname,
            slot = rings.frame,
            ring_kib = rings.bytes() >> 10,
            "AF_PACKET port open (TPACKET_V2 rings)"
        );
        Ok(AfPacketPort {
            name: name.into(),
            ifname: ifname.into(),
            rx_fd,
            tx_fd,
            rx,
            tx,
            rings,
            rx_state: std::sync::Mutex::new(RxState {
                frame: 0,
                pending: None,
                scratch: vec![0u8; SCRATCH].into_boxed_slice(),
                staged: 0..0,
                headers: [0; MAX_HEADERS],
            }),
            tx_state: std::sync::Mutex::new(TxState { frame: 0 }),
            mac,
            counters: QueueCounters::default(),
            link,
        })
    }

    /// Takes the frame in the slot at `hdr`: copied into a pool buffer with its checksum
    /// finished and a tag the kernel stripped put back, or, for a super-frame, staged in the
    /// scratch buffer for cutting.
    fn take(&self, st: &mut RxState, cache: &mut PoolCache, hdr: usize, status: u32) -> Taken {
        let mac = self.rx.u16_at(hdr + v2::MAC) as usize;
        let snap = self.rx.u32_at(hdr + v2::SNAPLEN) as usize;
        let len = self.rx.u32_at(hdr + v2::LEN) as usize;
        if mac < VNET_HDR_LEN || mac + snap > self.rings.frame || len < 14 {
            return Taken::Dropped;
        }
        let mut vnet = [0u8; VNET_HDR_LEN];
        vnet.copy_from_slice(self.rx.bytes(hdr + mac - VNET_HDR_LEN, VNET_HDR_LEN));
        let vnet = VnetHdr::parse(&vnet);
        let tag = (status & TP_STATUS_VLAN_VALID != 0).then(|| {
            let tci = self.rx.u16_at(hdr + v2::VLAN_TCI);
            let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                self.rx.u16_at(hdr + v2::VLAN_TPID)
            } else {
                0x8100
            };
            let mut tag = [0u8; 4];
            tag[..2].copy_from_slice(&tpid.to_be_bytes());
            tag[2..].copy_from_slice(&tci.to_be_bytes());
            tag
        });
        let shift = if tag.is_some() { 4 } else { 0 };
        if status & TP_STATUS_COPY != 0 {
            // Too large for its slot: queued whole on the socket, read into the scratch buffer
            // with the tag put back there.
            let Some(range) = self.recv_whole(st, len, tag) else { return Taken::Dropped };
            if vnet.is_gso() {
                return stage(st, &self.counters, range, &vnet.shifted(shift));
            }
            let frame = &mut st.scratch[range];
            if vnet.needs_csum && !self.finish_checksum(frame, vnet.shifted(shift)) {
                return Taken::Dropped;
            }
            return cache.alloc_frame(frame).map_or(Taken::Dropped, Taken::Frame);
        }
        if snap != len {
            return Taken::Dropped; // truncated and no copy queued (the receive buffer was full)
        }
        // SAFETY: the frame's status says USER and this is the port's single poller (the rx
        // lock is held); the slice ends before the block goes back.
        let frame = unsafe { self.rx.bytes_mut(hdr + mac, snap) };
        if vnet.is_gso() {
            let n = frame.len() + shift as usize;
            let out = &mut st.scratch[..n];
            match tag {
                None => out.copy_from_slice(frame),
                Some(tag) => {
                    out[..12].copy_from_slice(&frame[..12]);
                    out[12..16].copy_from_slice(&tag);
                    out[16..].copy_from_slice(&frame[12..]);
                }
            }
            return stage(st, &self.counters, 0..n, &vnet.shifted(shift));
        }
        // The slot is ours until handed back: the checksum is finished in place.
        if vnet.needs_csum && !self.finish_checksum(frame, vnet) {
            return Taken::Dropped;
        }
        let got = match tag {
            None => cache.alloc_frame(frame),
            Some(tag) => cache.alloc_gather(&[&frame[..12], &tag, &frame[12..]]),
        };
        got.map_or(Taken::Dropped, Taken::Frame)
    }

    /// Finishes the checksum `vnet` says the sender left partial; counted.
    fn finish_checksum(&self, frame: &mut [u8], vnet: VnetHdr) -> bool {
        self.counters.rx_csum.add(1);
        finish_checksum(frame, vnet.csum_start.into(), vnet.csum_offset.into())
    }

    /// Reads the `len`-byte frame the kernel queued whole into the scratch buffer (after its
    /// virtio-net header, which the slot already gave), putting `tag` back in front of its
    /// EtherType; the frame's range there.
    fn recv_whole(
        &self,
        st: &mut RxState,
        len: usize,
        tag: Option<[u8; 4]>,
    ) -> Option<std::ops::Range<usize>> {
        // SAFETY: receives into the scratch buffer we own, at most its length.
        let n = unsafe {
            libc::recv(
                self.rx_fd.as_raw_fd(),
                st.scratch.as_mut_ptr().cast(),
                st.scratch.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n < 0 || n as usize != len + VNET_HDR_LEN || n as usize > st.scratch.len() {
            return None;
        }
        let end = VNET_HDR_LEN + len;
        Some(match tag {
            None => VNET_HDR_LEN..end,
            Some(tag) => {
                // The header is no longer needed: the MACs move into its last four bytes.
                st.scratch.copy_within(VNET_HDR_LEN..VNET_HDR_LEN + 12, VNET_HDR_LEN - 4);
                st.scratch[VNET_HDR_LEN + 8..VNET_HDR_LEN + 12].copy_from_slice(&tag);
                VNET_HDR_LEN - 4..end
            }
        })
    }

    /// Delivers segments of the staged super-frame while the batch has room.
    fn deliver_segments(
        &self,
        st: &mut RxState,
        cache: &mut PoolCache,
        batch: &mut Batch,
    ) -> usize {
        let RxState { pending, scratch, staged, headers, .. } = st;
        let Some(seg) = pending.as_mut() else { return 0 };
        let frame = &scratch[staged.clone()];
        let mut got = 0;
        while batch.room() > 0 {
            let Some((h, payload)) = seg.next(frame, headers) else {
                *pending = None;
                break;
            };
            match cache.alloc_gather(&[&headers[..h], &frame[payload]]).map(|b| batch.push(b)) {
                Some(Ok(())) => got += 1,
                Some(Err(b)) => {
                    cache.free(b);
                    self.counters.rx_dropped.add(1);
                }
                None => self.counters.rx_dropped.add(1),
            }
        }
        if pending.as_ref().is_some_and(|s| s.is_done(frame)) {
            *pending = None;
        }
        got
    }
}

/// Stages the super-frame at `range` of the scratch buffer for cutting; refused (dropped) when
/// its headers do not say how.
fn stage(
    st: &mut RxState,
    counters: &QueueCounters,
    range: std::ops::Range<usize>,
    vnet: &VnetHdr,
) -> Taken {
    match Segmenter::new(&st.scratch[range.clone()], vnet) {
        Ok(seg) => {
            counters.rx_gso.add(1);
            st.pending = Some(seg);
            st.staged = range;
            Taken::Staged
        }
        Err(e) => {
            tracing::debug!(error = %e, "GSO super-frame dropped");
            Taken::Dropped
        }
    }
}

impl AfPacketPort {
    /// The kernel interface this port is bound to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

impl Port for AfPacketPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        // One poller at a time; a second one finds the lock taken and returns empty-handed.
        let Ok(mut st) = self.rx_state.try_lock() else { return 0 };
        let st = &mut *st;
        let mut got = self.deliver_segments(st, cache, batch);
        // A super-frame still being cut keeps the slots behind it waiting, in order.
        while batch.room() > 0 && st.pending.is_none() {
            let hdr = st.frame * self.rings.frame;
            let status = self.rx.status(hdr + v2::STATUS);
            let s = status.load(Acquire);
            if s & TP_STATUS_USER == 0 {
                break;
            }
            // A frame the kernel reports out of bounds, or no buffer for it: counted.
            match self.take(st, cache, hdr, s) {
                Taken::Frame(b) => match batch.push(b) {
                    Ok(()) => got += 1,
                    Err(b) => {
                        cache.free(b);
                        self.counters.rx_dropped.add(1);
                    }
                },
                Taken::Staged => got += self.deliver_segments(st, cache, batch),
                Taken::Dropped => self.counters.rx_dropped.add(1),
            }
            status.store(TP_STATUS_KERNEL, Release);
            st.frame = (st.frame + 1) % self.rings.rx_frames;
        }
        self.counters.rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        // Senders are serialised; one that finds the ring busy treats it as full this burst.
        let Ok(mut st) = self.tx_state.try_lock() else {
            self.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let pool = cache.pool();
        let (slot, room) = (self.rings.frame, self.rings.frame - TX_DATA);
        let (mut sent, mut oversize) = (0, 0);
        for b in batch.as_slice() {
            let base = st.frame * slot;
            let status = self.tx.status(base + v2::STATUS);
            let s = status.load(Acquire);
            if s != TP_STATUS_AVAILABLE && s & TP_STATUS_WRONG_FORMAT == 0 {
                break; // ring full: the rest stays in the batch
            }
            let len = pool.pkt_len(b);
            // Longer than a slot (the MTU raised since the port opened): dropped below,
            // counted, never sent cut short.
            if len <= room {
                // SAFETY: the slot's status is AVAILABLE and this is the single tx user (the
                // tx lock is held); the kernel reads it only after SEND_REQUEST below.
                let out = unsafe { self.tx.bytes_mut(base + TX_DATA, len) };
                let mut at = 0;
                for seg in pool.segments(b) {
                    let n = seg.len().min(out.len() - at);
                    out[at..at + n].copy_from_slice(&seg[..n]);
                    at += n;
                }
                // SAFETY: as above: the same slot's header, `out` no longer used.
                let header = unsafe { self.tx.bytes_mut(base + v2::LEN, 4) };
                header.copy_from_slice(&(at as u32).to_ne_bytes());
                status.store(TP_STATUS_SEND_REQUEST, Release);
                st.frame = (st.frame + 1) % self.rings.tx_frames;
            } else {
                oversize += 1;
            }
            sent += 1;
        }
        if sent > oversize {
            // One kick per burst. EAGAIN/ENOBUFS leave frames queued for the next kick.
            // SAFETY: sendto with no buffer on our own packet socket flushes its tx ring.
            unsafe {
                libc::sendto(
                    self.tx_fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
        }
        for i in 0..sent {
            let b = batch.take(i);
            cache.free(b);
        }
        batch.consume_front(sent);
        self.counters.tx_packets.add((sent - oversize) as u64);
        if oversize > 0 {
            self.counters.tx_dropped.add(oversize as u64);
        }
        self.counters.tx_full.add(batch.len() as u64);
        sent
    }

    fn wake_fd(&self, _q: u16) -> Option<RawFd> {
        Some(self.rx_fd.as_raw_fd())
    }

    fn arm_wake(&self, _q: u16, armed: bool) -> bool {
        if !armed {
            return false;
        }
        let Ok(st) = self.rx_state.try_lock() else { return true };
        st.pending.is_some()
            || self.rx.status(st.frame * self.rings.frame + v2::STATUS).load(Acquire)
                & TP_STATUS_USER
                != 0
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        vec![self.counters.read()]
    }

    fn mac(&self) -> Option<MacAddr> {
        self.mac
    }

    fn link_up(&self) -> bool {
        self.link.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refresh_link(&self) {
        let up = if_running(self.rx_fd.as_raw_fd(), &self.ifname).unwrap_or(false);
        self.link.store(up, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Rings;

    #[test]
    fn rings_are_sized_from_the_mtu() {
        let pod = Rings::for_mtu(1500);
        assert_eq!(pod.frame, 2048);
        assert!(pod.bytes() <= 1 << 20, "a pod port's rings within 1 MiB: {pod:?}");
        assert_eq!(Rings::for_mtu(1952).frame, 2048, "the largest MTU a 2 KiB slot holds");
        assert_eq!(Rings::for_mtu(1953).frame, 4096);
        assert_eq!(Rings::for_mtu(9000).frame, 16384, "jumbo frames");
        assert_eq!(Rings::for_mtu(68).frame, 2048, "never below 2 KiB");
        for mtu in [68, 1500, 4000, 9000, 65535] {
            let r = Rings::for_mtu(mtu);
            assert!(
                r.frame.is_power_of_two() && r.frame >= 64 + 10 + 22 + mtu as usize,
                "{mtu}: {r:?}"
            );
        }
    }
}

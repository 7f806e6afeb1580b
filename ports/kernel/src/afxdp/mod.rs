//! An AF_XDP port on a kernel network device, with the switch's own buffer pool registered as
//! the socket's UMEM: received frames land directly in pool buffers and transmitted ones leave
//! from them, so the port adds no copy of its own (in XDP copy mode the kernel copies once, as
//! on veth; zero-copy drivers copy nothing).
//!
//! The port opens one socket per receive queue of the device (a NIC's RSS queues; pod veths
//! have one), each bound to its queue and transmitting on the same-numbered queue, so PMD
//! threads can share the queues out. Knitter's XDP program ([`crate::bpf`]) redirects each
//! queue to its socket. Rings per socket: fill
//! (buffers handed to the kernel for receive), rx, tx, completion (sent buffers coming back).
//! Every pool buffer given to the kernel is marked in `lent`; a descriptor the kernel returns
//! is accepted only if it names a lent buffer, and dropping the port returns every buffer
//! still lent once the socket is closed. Where the kernel has multi-buffer AF_XDP
//! (`XDP_USE_SG`, Linux ≥ 6.6; the XDP program loaded frags-aware), a frame larger than one
//! buffer arrives in several descriptors (`XDP_PKT_CONTD` on all but the last), chained into
//! one packet, and a chained packet leaves the same way: jumbo frames up to 9 216 bytes.
//! Elsewhere a frame must fit one pool buffer after the kernel's 256-byte XDP headroom (MTU
//! up to 1774, larger refused).
//!
//! The socket binds without forcing a mode: zero-copy where the driver has it (the NIC DMAs
//! straight into pool buffers), copy mode otherwise (veth). It asks for `need_wakeup`: the
//! port kicks the kernel (`sendto` for transmit, `recvfrom` for the fill ring) only when the
//! ring's flag says the driver sleeps. In copy mode the kernel keeps the transmit flag set
//! (it transmits only inside `sendto`, 32 descriptors a call), so that is a kick per burst,
//! repeated while the kernel stops at its budget with descriptors left (jumbo frames); a
//! zero-copy driver busy with the queue clears it and the port makes no system call at all.
//!
//! Unsafe code is confined to the ring mappings ([`ring`], with its invariants) and the
//! socket calls around them; [`lent`] keeps which pool buffers the kernel holds.

mod fill;
mod lent;
mod ring;
mod socket;

pub use crate::bpf::UnderlayFilter;
use crate::bpf::{XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XdpRedirect};
pub use fill::pool_for_pods;
use fill::{FILL_POD, pod_fill, underlay_fill};
use lent::Lent;
use plumbing::sys::{
    control_socket, if_running, ifindex, interface_mac, is_software_device, rx_queues,
};
use ring::{Ring, XDP_PACKET_HEADROOM, XDP_PKT_CONTD};
use socket::{Bound, MAX_QUEUES, kick_tx};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use vswitch::batch::Batch;
use vswitch::buf::{BUF_SIZE, BufId, Chain, Pool, PoolCache};
use vswitch::port::{Port, QueueCounters, QueueStats};
use vswitch::wire::MacAddr;

/// Descriptors one frame may take at most (a 9 216-byte frame in 2 KiB buffers takes 5).
const MAX_FRAGS: usize = 8;
const RING: u32 = 1024;

/// The receive side: rx and fill rings and the buffers lent through the fill ring.
struct RxSide {
    rx: Ring,
    fill: Ring,
    lent: Lent,
    /// Entries the fill ring is topped up to (at most `RING`).
    fill_target: u32,
    /// Whether `fill_target` may grow with the port's traffic (pod ports).
    elastic: bool,
    /// The pool could not keep the fill ring above its starving mark (`fill.rs`) at the last
    /// refill.
    starved: bool,
    /// Zero-copy with `need_wakeup`: the driver may sleep, and is kicked when the fill
    /// ring's flag asks (copy mode receives in the kernel's own softirq: never kicked).
    wakeup: bool,
}

/// The transmit side: tx and completion rings and the buffers lent through the tx ring.
struct TxSide {
    tx: Ring,
    comp: Ring,
    lent: Lent,
    /// Bound with `need_wakeup`: kick only when the tx ring's flag asks.
    wakeup: bool,
}

/// How the kernel bound the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The driver moves frames in and out of pool buffers itself (no kernel copy).
    pub zero_copy: bool,
    /// The kernel tells through the rings' flags when it needs a kick.
    pub need_wakeup: bool,
    /// Frames may take several buffers (multi-buffer AF_XDP): jumbo frames pass.
    pub multi_buffer: bool,
}

/// One receive queue's socket (it also transmits on the same-numbered queue): its rings
/// and the buffers lent through them. The pool's region is registered as each socket's
/// UMEM (the kernel pins the same pages once per socket).
struct Xsk {
    /// `None` only while dropping.
    rx: Mutex<Option<RxSide>>,
    tx: Mutex<Option<TxSide>>,
    fd: RawFd,
    /// `None` only while dropping.
    sock: Option<OwnedFd>,
    counters: QueueCounters,
}

/// An AF_XDP port on a kernel interface: one socket per receive queue of the device.
pub struct AfXdpPort {
    name: String,
    pool: Arc<Pool>,
    queues: Box<[Xsk]>,
    mac: Option<MacAddr>,
    ifname: String,
    /// For interface ioctls in the port's namespace (link state).
    control: OwnedFd,
    /// The interface's link (up and running), as last asked by `refresh_link`.
    link: std::sync::atomic::AtomicBool,
    /// The attached program; `None` only while dropping.
    xdp: Mutex<Option<XdpRedirect>>,
    binding: Binding,
    partial: PartialChecksums,
}

/// Where the port looks for checksums a sender on this host left partial (AF_XDP carries no
/// checksum metadata: see [`crate::offload::finish_if_partial`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartialChecksums {
    /// A device with hardware behind it: frames come off a wire, their checksums whole.
    NotLooked,
    /// A software device (veth): in each frame's own TCP/UDP packet.
    Frames,
    /// A software underlay: inside VXLAN frames to this UDP port, and in other frames.
    InVxlan(u16),
}

// SAFETY: the rings are only touched under their side's mutex (taken with try_lock).
unsafe impl Send for AfXdpPort {}
// SAFETY: as above.
unsafe impl Sync for AfXdpPort {}

impl AfXdpPort {
    /// Opens every receive queue of `ifname` (in the calling thread's network namespace)
    /// over `pool`'s region, a socket each; every frame of the device comes to the port (a
    /// pod's veth). XDP runs natively where the driver has it (veth does), generically
    /// otherwise.
    pub fn open(name: &str, ifname: &str, pool: Arc<Pool>) -> io::Result<AfXdpPort> {
        Self::open_with(name, ifname, pool, None)
    }

    /// Opens an underlay port for a VTEP: only what `filter` takes (VXLAN to the VTEP, ARP /
    /// neighbor solicitations asking for it, in its VLAN when it has one) comes to the port;
    /// the node keeps every other frame of the interface (its own address, SSH, the API
    /// server...).
    pub fn open_underlay(
        name: &str,
        ifname: &str,
        pool: Arc<Pool>,
        filter: UnderlayFilter,
    ) -> io::Result<AfXdpPort> {
        Self::open_with(name, ifname, pool, Some(filter))
    }

    /// Buffers queue `q` keeps in its fill ring now (it grows with traffic).
    pub fn fill_target(&self, q: u16) -> u32 {
        self.queues
            .get(q as usize)
            .and_then(|x| {
                x.rx.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|s| s.fill_target)
            })
            .unwrap_or(0)
    }

    /// The mode the kernel bound the sockets in.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// Whether frames whose outer 802.1Q tag the driver holds out of band (a veth peer
    /// sending with tx VLAN offload on) arrive tagged; why not, when they would look
    /// untagged (a trunk must then not be served by this port).
    pub fn restores_vlan_tags(&self) -> Result<(), String> {
        match self.xdp.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(x) => x.restores_vlan_tags().map_err(str::to_owned),
            None => Err("no XDP program".into()),
        }
    }

    /// The device's receive queues, when its driver says (the port has a socket on each,
    /// up to 64).
    pub fn device_rx_queues(&self) -> Option<u32> {
        rx_queues(self.control.as_raw_fd(), &self.ifname)
    }

    /// Swaps the port's XDP program while it runs: the underlay filter for `filter`, or
    /// (with `None`) every frame of the device to the port. The sockets stay bound.
    pub fn set_underlay_filter(&self, filter: Option<UnderlayFilter>) -> io::Result<()> {
        let n = self.queues.len() as u32;
        for x in self.queues.iter() {
            if let Some(side) = x.rx.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                side.fill_target = if filter.is_some() {
                    side.fill_target.max(underlay_fill(n))
                } else {
                    side.fill_target.min(FILL_POD)
                };
            }
        }
        match self.xdp.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(x) => x.set_filter(filter.as_ref()),
            None => Ok(()),
        }
    }

    fn open_with(
        name: &str,
        ifname: &str,
        pool: Arc<Pool>,
        underlay: Option<UnderlayFilter>,
    ) -> io::Result<AfXdpPort> {
        let ifindex = ifindex(ifname)?;
        let control = control_socket()?;
        let n = rx_queues(control.as_raw_fd(), ifname).unwrap_or(1).clamp(1, MAX_QUEUES);
        let bound =
            (0..n).map(|q| Bound::new(ifindex, q, &pool)).collect::<io::Result<Vec<_>>>()?;
        // Native XDP where the driver has it (veth does), generic otherwise.
        let attach = |flags| match underlay {
            None => XdpRedirect::attach(ifindex, flags, n),
            Some(f) => XdpRedirect::attach_underlay(ifindex, flags, n, &f),
        };
        let (xdp, mode) = match attach(XDP_FLAGS_DRV_MODE) {
            Ok(x) => (x, "native"),
            Err(e) => {
                tracing::info!(port = name, ifname, error = %e, "no native XDP on this device: generic XDP");
                (attach(XDP_FLAGS_SKB_MODE)?, "generic")
            }
        };
        let mac = interface_mac(ifname);
        let binding = bound[0].binding;
        let partial = match (is_software_device(control.as_raw_fd(), ifname), underlay) {
            (Some(true), Some(f)) => PartialChecksums::InVxlan(f.udp_port),
            (Some(true), None) => PartialChecksums::Frames,
            _ => PartialChecksums::NotLooked,
        };
        let copy = if binding.zero_copy { "zero-copy" } else { "copy" };
        let vlan_tags = match xdp.restores_vlan_tags() {
            Ok(()) => "restored from the rx VLAN hint",
            Err(why) => why,
        };
        tracing::info!(port = name, ifname, mode, copy, need_wakeup = binding.need_wakeup, multi_buffer = binding.multi_buffer, queues = n, vlan_tags, partial_checksums = ?partial, "AF_XDP port open (UMEM = buffer pool, a socket per queue)");
        // Fill rings are filled before frames are redirected here: a socket without fill
        // buffers drops what arrives until a PMD thread first polls it, and a pod attached a
        // moment ago loses its first ARP request (a one-second stall).
        let fill_target = if underlay.is_some() { underlay_fill(n) } else { pod_fill(&pool, n) };
        let capacity = pool.capacity() as usize;
        let mut cache = PoolCache::new(pool.clone());
        let mut queues = Vec::with_capacity(n as usize);
        for b in bound {
            let wakeup = b.binding.need_wakeup;
            let mut rx = RxSide {
                rx: b.rx,
                fill: b.fill,
                lent: Lent::new(capacity),
                fill_target,
                elastic: false,
                starved: false,
                wakeup: wakeup && b.binding.zero_copy,
            };
            let counters = QueueCounters::default();
            Self::refill(&mut rx, &mut cache, &counters, name);
            rx.elastic = true;
            queues.push(Xsk {
                rx: Mutex::new(Some(rx)),
                tx: Mutex::new(Some(TxSide {
                    tx: b.tx,
                    comp: b.comp,
                    lent: Lent::new(capacity),
                    wakeup,
                })),
                fd: b.sock.as_raw_fd(),
                sock: Some(b.sock),
                counters,
            });
        }
        let port = AfXdpPort {
            name: name.into(),
            pool,
            queues: queues.into(),
            mac,
            ifname: ifname.into(),
            link: std::sync::atomic::AtomicBool::new(
                if_running(control.as_raw_fd(), ifname).unwrap_or(false),
            ),
            control,
            xdp: Mutex::new(Some(xdp)),
            binding,
            partial,
        };
        cache.flush();
        // Registered last: only then does the program redirect (dropping the port on an
        // error closes the sockets first and returns every lent buffer).
        if let Some(x) = port.xdp.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            for (q, xsk) in port.queues.iter().enumerate() {
                x.register(q as u32, xsk.fd)?;
            }
        }
        Ok(port)
    }

    /// Finishes a checksum a sender on this host left partial, where this device can carry one.
    #[inline]
    fn finish_partial(&self, b: &mut BufId, counters: &QueueCounters) {
        let vxlan = match self.partial {
            PartialChecksums::NotLooked => return,
            PartialChecksums::Frames => None,
            PartialChecksums::InVxlan(port) => Some(port),
        };
        if !self.pool.is_chained(b)
            && crate::offload::finish_if_partial(self.pool.head_mut(b), vxlan)
        {
            counters.rx_csum.add(1);
        }
    }

    /// A copy of a chained packet in buffers of its own (no segment shared); `None` when
    /// the pool is dry.
    fn private_copy(&self, b: &BufId, cache: &mut PoolCache) -> Option<BufId> {
        let (parts, k) = self.pieces(b);
        cache.alloc_chain(&parts[..k])
    }

    /// A packet's segments (the first `MAX_FRAGS`) and how many.
    fn pieces<'a>(&'a self, b: &'a BufId) -> ([&'a [u8]; MAX_FRAGS], usize) {
        let mut parts: [&[u8]; MAX_FRAGS] = [&[]; MAX_FRAGS];
        let mut k = 0;
        for seg in self.pool.segments(b).take(MAX_FRAGS) {
            parts[k] = seg;
            k += 1;
        }
        (parts, k)
    }

    fn rx_pending(side: &RxSide) -> bool {
        side.rx.prod().load(Acquire) != side.rx.cons().load(Relaxed)
    }

    /// Descriptors from `cons` that hold whole frames, at most `room` of them: a frame whose
    /// last piece is not published yet waits for the next burst. A ring full of pieces with
    /// no end (never from a sane kernel) is taken whole, to be dropped.
    #[inline]
    fn whole_frames(rx: &Ring, cons: u32, avail: u32, room: usize) -> u32 {
        let (mut end, mut frames) = (0, 0);
        for i in 0..avail {
            if frames == room {
                break;
            }
            if rx.read_desc(cons.wrapping_add(i)).2 & XDP_PKT_CONTD == 0 {
                (end, frames) = (i + 1, frames + 1);
            }
        }
        if frames == 0 && avail >= RING { avail } else { end }
    }
}

impl Port for AfXdpPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_queues(&self) -> u16 {
        self.queues.len() as u16
    }

    fn tx_queues(&self) -> u16 {
        self.queues.len() as u16
    }

    fn rx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Some(xsk) = self.queues.get(q as usize) else { return 0 };
        let Ok(mut guard) = xsk.rx.try_lock() else { return 0 };
        let Some(side) = guard.as_mut() else { return 0 };
        let cons = side.rx.cons().load(Relaxed);
        let avail = side.rx.prod().load(Acquire).wrapping_sub(cons);
        let n = Self::whole_frames(&side.rx, cons, avail, batch.room());
        let (mut got, mut chain, mut bad) = (0, None::<Chain>, false);
        for i in 0..n {
            let (addr, len, options) = side.rx.read_desc(cons.wrapping_add(i));
            let idx = (addr / BUF_SIZE as u64) as u32;
            let off = (addr % BUF_SIZE as u64) as usize;
            let b = if side.lent.take(idx) {
                // SAFETY: lent through this socket's fill ring (its bitmap says so) and
                // returned once, here.
                match unsafe { self.pool.claim_filled(idx, off, len as usize) } {
                    Ok(b) => Some(b),
                    Err(empty) => {
                        cache.free(empty); // a range outside its chunk: the chunk comes back
                        None
                    }
                }
            } else {
                None
            };
            let last = options & XDP_PKT_CONTD == 0;
            let frame = match (b, chain.take()) {
                (Some(b), None) if last => Some(b),
                (Some(b), None) => {
                    chain = Some(Chain::new(b));
                    None
                }
                (Some(b), Some(mut c)) => {
                    c.push(&self.pool, b);
                    if last {
                        Some(c.finish())
                    } else {
                        chain = Some(c);
                        None
                    }
                }
                (None, c) => {
                    // A descriptor naming no lent buffer: the frame it belongs to is lost.
                    bad = true;
                    if last {
                        if let Some(c) = c {
                            cache.free(c.finish());
                        }
                    } else {
                        chain = c;
                    }
                    None
                }
            };
            if !last {
                continue;
            }
            if std::mem::take(&mut bad) {
                // Some piece of this frame was unusable: the rest goes back to the pool.
                if let Some(b) = frame {
                    cache.free(b);
                }
                xsk.counters.rx_dropped.add(1);
                continue;
            }
            match frame.map(|mut b| {
                self.finish_partial(&mut b, &xsk.counters);
                batch.push(b)
            }) {
                Some(Ok(())) => got += 1,
                Some(Err(b)) => {
                    cache.free(b);
                    xsk.counters.rx_dropped.add(1);
                }
                None => xsk.counters.rx_dropped.add(1),
            }
        }
        if let Some(c) = chain {
            // Only when a frame's pieces filled the ring without an end (a kernel bug).
            cache.free(c.finish());
            xsk.counters.rx_dropped.add(1);
        }
        if n > 0 {
            side.rx.cons().store(cons.wrapping_add(n), Release);
        }
        Self::refill(side, cache, &xsk.counters, &self.name);
        if n == 0 && side.wakeup && side.fill.needs_wakeup() {
            // A zero-copy driver went to sleep with our fill ring empty: wake it.
            // SAFETY: recvfrom with no buffer on our own socket.
            unsafe {
                libc::recvfrom(
                    xsk.fd,
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        xsk.counters.rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let xsk = &self.queues[q as usize % self.queues.len()];
        let Ok(mut guard) = xsk.tx.try_lock() else {
            xsk.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let Some(side) = guard.as_mut() else { return 0 };
        // Buffers the kernel finished sending come back to the pool.
        let ccons = side.comp.cons().load(Relaxed);
        let done = side.comp.prod().load(Acquire).wrapping_sub(ccons);
        for i in 0..done {
            let idx = (side.comp.read_addr(ccons.wrapping_add(i)) / BUF_SIZE as u64) as u32;
            if side.lent.take(idx) {
                // SAFETY: lent through this socket's tx ring and returned once by its
                // completion ring.
                cache.free(unsafe { BufId::from_index(idx) });
            }
        }
        if done > 0 {
            side.comp.cons().store(ccons.wrapping_add(done), Release);
        }
        let prod = side.tx.prod().load(Relaxed);
        let room = RING - prod.wrapping_sub(side.tx.cons().load(Acquire));
        let (mut descs, mut sent) = (0u32, 0usize);
        while sent < batch.len() && descs < room {
            let b = &batch.as_slice()[sent];
            if !self.pool.is_chained(b) {
                let (addr, len) = self.pool.head_addr(b);
                side.tx.write_desc(prod.wrapping_add(descs), addr, len as u32, 0);
                side.lent.set(batch.take(sent).into_index());
                (descs, sent) = (descs + 1, sent + 1);
                continue;
            }
            // A chained packet: in pieces where the kernel takes them, else in one buffer.
            let pieces = self.pool.segments(b).count();
            if self.binding.multi_buffer && pieces <= MAX_FRAGS {
                if descs + pieces as u32 > room {
                    break;
                }
                let mut segs: [BufId; MAX_FRAGS] = [const { BufId::EMPTY }; MAX_FRAGS];
                let k = match self.pool.split(batch.take(sent), &mut segs) {
                    Ok(k) => k,
                    Err(b) => {
                        // Shared with another packet (a flood copy's payload): a private
                        // copy goes instead, or the packet waits (the pool is dry).
                        match self.private_copy(&b, cache) {
                            Some(c) => {
                                cache.free(b);
                                batch.as_mut_slice()[sent] = c;
                                continue;
                            }
                            None => {
                                batch.as_mut_slice()[sent] = b;
                                break;
                            }
                        }
                    }
                };
                for (j, seg) in segs.iter_mut().take(k).enumerate() {
                    let (addr, len) = self.pool.head_addr(seg);
                    let more = if j + 1 < k { XDP_PKT_CONTD } else { 0 };
                    side.tx.write_desc(prod.wrapping_add(descs), addr, len as u32, more);
                    side.lent.set(std::mem::replace(seg, BufId::EMPTY).into_index());
                    descs += 1;
                }
                sent += 1;
                continue;
            }
            // Rare without multi-buffer: flood copies with a shared payload, flattened.
            let (parts, k) = self.pieces(b);
            match cache.alloc_gather(&parts[..k]) {
                Some(f) if !self.pool.is_chained(&f) => {
                    let old = std::mem::replace(&mut batch.as_mut_slice()[sent], f);
                    cache.free(old);
                }
                Some(chained) => {
                    cache.free(chained); // does not fit one buffer: the packet waits
                    break;
                }
                None => break,
            }
        }
        if descs > 0 {
            side.tx.prod().store(prod.wrapping_add(descs), Release);
            batch.consume_front(sent);
            // Copy mode transmits only when kicked (the flag stays set): a kick per burst.
            if !side.wakeup || side.tx.needs_wakeup() {
                kick_tx(xsk.fd, &side.tx);
            }
        } else if sent > 0 {
            batch.consume_front(sent);
        }
        xsk.counters.tx_packets.add(sent as u64);
        xsk.counters.tx_full.add(batch.len() as u64);
        sent
    }

    fn wake_fd(&self, q: u16) -> Option<RawFd> {
        self.queues.get(q as usize).map(|x| x.fd)
    }

    fn arm_wake(&self, q: u16, armed: bool) -> bool {
        armed
            && self.queues.get(q as usize).is_some_and(|x| {
                x.rx.try_lock().map_or(true, |s| s.as_ref().is_some_and(Self::rx_pending))
            })
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        let mut stats: Vec<QueueStats> = self.queues.iter().map(|x| x.counters.read()).collect();
        // What the XDP program dropped never reached a queue: counted on the first.
        if let (Some(first), Some(x)) =
            (stats.first_mut(), self.xdp.lock().unwrap_or_else(|e| e.into_inner()).as_ref())
        {
            first.rx_dropped += x.dropped();
        }
        stats
    }

    fn pool(&self) -> Option<&Arc<Pool>> {
        Some(&self.pool)
    }

    fn mac(&self) -> Option<MacAddr> {
        self.mac
    }

    fn link_up(&self) -> bool {
        self.link.load(Relaxed)
    }

    fn refresh_link(&self) {
        self.link
            .store(if_running(self.control.as_raw_fd(), &self.ifname).unwrap_or(false), Relaxed);
    }

    /// Jumbo frames with multi-buffer AF_XDP; else one UMEM chunk after the kernel's XDP
    /// headroom.
    fn max_frame(&self) -> usize {
        if self.binding.multi_buffer {
            vswitch::buf::MAX_FRAME
        } else {
            BUF_SIZE - XDP_PACKET_HEADROOM
        }
    }
}

/// How long buffers a zero-copy driver had in its fill ring stay out of the pool after the
/// socket closed: the kernel stops the driver's zero-copy queue in work it defers past
/// `close()` (the pool's deferred release turns `XDP_SETUP_XSK_POOL` off), and until then the
/// NIC may still write into them.
const ZERO_COPY_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for AfXdpPort {
    fn drop(&mut self) {
        // The sockets leave the XSKMAP first (nothing more is redirected to them), then the
        // rings are unmapped, the program detached and the sockets closed: after that the
        // kernel holds no buffer, and every lent one goes back to the pool.
        if let Some(x) = self.xdp.get_mut().unwrap_or_else(|e| e.into_inner()).as_ref() {
            for q in 0..self.queues.len() as u32 {
                let _ = x.unregister(q);
            }
        }
        let mut lent: Vec<Lent> = Vec::new();
        for x in self.queues.iter_mut() {
            if let Some(RxSide { rx, fill, lent: l, .. }) =
                x.rx.get_mut().unwrap_or_else(|e| e.into_inner()).take()
            {
                drop((rx, fill));
                lent.push(l);
            }
            if let Some(TxSide { tx, comp, lent: l, .. }) =
                x.tx.get_mut().unwrap_or_else(|e| e.into_inner()).take()
            {
                drop((tx, comp));
                lent.push(l);
            }
        }
        drop(self.xdp.get_mut().unwrap_or_else(|e| e.into_inner()).take());
        for x in self.queues.iter_mut() {
            drop(x.sock.take());
        }
        let grace =
            if self.binding.zero_copy { ZERO_COPY_GRACE } else { std::time::Duration::ZERO };
        return_lent(self.pool.clone(), lent, grace);
    }
}

/// Gives the buffers `lent` names back to `pool`: at once, or after `grace` from a thread of
/// their own (so dropping a zero-copy port does not stall its caller).
fn return_lent(pool: Arc<Pool>, mut lent: Vec<Lent>, grace: std::time::Duration) {
    let give_back = move || {
        let mut cache = PoolCache::new(pool);
        for l in &mut lent {
            for idx in l.drain() {
                // SAFETY: lent to the kernel, which released it when the socket closed (and,
                // for a zero-copy driver, when the grace period ran out).
                cache.free(unsafe { BufId::from_index(idx) });
            }
        }
    };
    if grace.is_zero() {
        give_back();
        return;
    }
    let spawned = std::thread::Builder::new().name("xsk-grace".into()).spawn(move || {
        std::thread::sleep(grace);
        give_back();
    });
    if let Err(e) = spawned {
        // No thread: the buffers stay out of the pool rather than go back too early.
        tracing::warn!(error = %e, "zero-copy buffers not returned to the pool");
    }
}

#[cfg(test)]
mod test {
    use super::{Lent, return_lent};
    use std::time::Duration;
    use vswitch::buf::Pool;

    #[test]
    fn zero_copy_buffers_come_back_only_after_the_grace_period() {
        let pool = Pool::new(64, false).unwrap();
        let mut cache = vswitch::buf::PoolCache::new(pool.clone());
        let mut lent = Lent::new(pool.capacity() as usize);
        for _ in 0..8 {
            lent.set(cache.alloc().unwrap().into_index());
        }
        cache.flush();
        let before = pool.free_count();
        return_lent(pool.clone(), vec![lent], Duration::from_millis(300));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.free_count(), before, "still the driver's during the grace period");
        assert!(vswitch::testkit::eventually(Duration::from_secs(3), || pool.free_count()
            == before + 8));
    }

    #[test]
    fn lent_buffers_are_taken_back_once() {
        let mut l = Lent::new(200);
        for i in [0u32, 63, 64, 199] {
            l.set(i);
        }
        assert!(l.take(63));
        assert!(!l.take(63), "a descriptor naming a buffer twice is refused the second time");
        assert!(!l.take(5), "never lent");
        assert!(!l.take(10_000), "out of range");
        let mut rest: Vec<u32> = l.drain().collect();
        rest.sort();
        assert_eq!(rest, vec![0, 64, 199]);
        assert_eq!(l.drain().count(), 0);
    }
}

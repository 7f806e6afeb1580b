//! An AF_XDP port on a kernel network device, with the switch's own buffer pool registered as
//! the socket's UMEM: received frames land directly in pool buffers and transmitted ones leave
//! from them, so the port adds no copy of its own (in XDP copy mode the kernel copies once, as
//! on veth; zero-copy drivers copy nothing).
//!
//! Knitter's XDP program ([`super::bpf`]) redirects the queue to the socket. Rings: fill
//! (buffers handed to the kernel for receive), rx, tx, completion (sent buffers coming back).
//! Every pool buffer given to the kernel is marked in `lent`; a descriptor the kernel returns
//! is accepted only if it names a lent buffer, and dropping the port returns every buffer
//! still lent once the socket is closed. Frames must fit one pool buffer after the kernel's
//! 256-byte XDP headroom (MTU up to 1774, larger refused); jumbo frames need multi-buffer
//! AF_XDP (not yet).
//!
//! The socket binds without forcing a mode: zero-copy where the driver has it (the NIC DMAs
//! straight into pool buffers), copy mode otherwise (veth). It asks for `need_wakeup`: the
//! port kicks the kernel (`sendto` for transmit, `recvfrom` for the fill ring) only when the
//! ring's flag says the driver sleeps. In copy mode the kernel keeps the transmit flag set
//! (it transmits only inside `sendto`), so that is one kick per burst as before; a
//! zero-copy driver busy with the queue clears it and the port makes no system call at all.
//!
//! Unsafe code is confined to the ring mappings, with these invariants:
//! - each ring mapping lives as long as the port; producer/consumer words are accessed
//!   atomically (acquire for the other side's index, release to publish ours);
//! - descriptor slots between our consumer and the kernel's producer (or our producer and the
//!   kernel's consumer) belong to us; indices are masked by the ring size.

pub use super::bpf::UnderlayFilter;
use super::bpf::{XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XdpRedirect};
use super::sys::{check, control_socket, if_running, ifindex, interface_mac, rx_queues, setopt};
use super::{Port, QueueCounters, QueueStats};
use crate::batch::Batch;
use crate::buf::{BUF_SIZE, BufId, Pool, PoolCache};
use crate::wire::MacAddr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::{Arc, Mutex};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_OPTIONS: libc::c_int = 8;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;
const PGOFF_RX: i64 = 0;
const PGOFF_TX: i64 = 0x8000_0000;
const PGOFF_FILL: i64 = 0x1_0000_0000;
const PGOFF_COMPLETION: i64 = 0x1_8000_0000;
const RING: u32 = 1024;
/// Buffers a pod-facing port keeps in its fill ring at first. Every port lends them from the
/// shared pool while idle, so this bounds what idle pods hold (16 384 buffers serve 128
/// pods); a polled port refills every burst, so a few bursts' worth is enough while its PMD
/// runs. A port whose fill ring runs dry drops what arrives (the kernel counts it on the
/// interface): when its traffic empties the ring by half between two refills, the ring
/// grows (see [`RxSide::grow`]).
const FILL_POD: u32 = 128;
/// An underlay carries every pod's traffic: its fill ring is kept full.
const FILL_UNDERLAY: u32 = RING;
/// Bytes the kernel keeps in front of a received frame in its UMEM chunk.
const XDP_PACKET_HEADROOM: usize = 256;

#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffsets {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffsets,
    tx: RingOffsets,
    fr: RingOffsets,
    cr: RingOffsets,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// One mapped ring: `entry` bytes per descriptor (16 for rx/tx, 8 for fill/completion).
struct Ring {
    base: *mut u8,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    /// The ring's flags word (`XDP_RING_NEED_WAKEUP`), when the kernel reports one.
    flags: Option<*const AtomicU32>,
    desc: *mut u8,
    entry: usize,
}

impl Ring {
    /// `with_flags`: the kernel's offsets include the flags word (Linux ≥ 5.4).
    fn map(fd: RawFd, off: &RingOffsets, pgoff: i64, entry: usize, with_flags: bool) -> io::Result<Ring> {
        let len = off.desc as usize + RING as usize * entry;
        // SAFETY: maps the ring the kernel created for this socket at its page offset; the
        // length covers the descriptor array the kernel reported.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base: *mut u8 = p.cast();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS for this ring and lie inside `len`.
        unsafe {
            Ok(Ring {
                base,
                len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: with_flags.then(|| base.add(off.flags as usize).cast_const().cast()),
                desc: base.add(off.desc as usize),
                entry,
            })
        }
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: a u32 index word inside the live mapping, shared with the kernel atomically.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asks to be woken up to use this ring.
    fn needs_wakeup(&self) -> bool {
        // SAFETY: the flags word inside the live mapping, written by the kernel.
        self.flags.is_none_or(|f| unsafe { &*f }.load(Relaxed) & XDP_RING_NEED_WAKEUP != 0)
    }

    fn slot(&self, i: u32) -> *mut u8 {
        // SAFETY: the index is masked to the ring size, so the slot is inside the mapping.
        unsafe { self.desc.add((i & (RING - 1)) as usize * self.entry) }
    }

    fn write_addr(&self, i: u32, addr: u64) {
        // SAFETY: a slot we own (between our producer and the kernel's consumer).
        unsafe { self.slot(i).cast::<u64>().write_unaligned(addr) }
    }

    fn read_addr(&self, i: u32) -> u64 {
        // SAFETY: a slot the kernel published (between our consumer and its producer).
        unsafe { self.slot(i).cast::<u64>().read_unaligned() }
    }

    fn write_desc(&self, i: u32, addr: u64, len: u32) {
        let s = self.slot(i);
        // SAFETY: a 16-byte xdp_desc slot we own.
        unsafe {
            s.cast::<u64>().write_unaligned(addr);
            s.add(8).cast::<u32>().write_unaligned(len);
            s.add(12).cast::<u32>().write_unaligned(0);
        }
    }

    fn read_desc(&self, i: u32) -> (u64, u32) {
        let s = self.slot(i);
        // SAFETY: a 16-byte xdp_desc slot the kernel published.
        unsafe { (s.cast::<u64>().read_unaligned(), s.add(8).cast::<u32>().read_unaligned()) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Pool buffers the kernel holds, one bit each.
struct Lent(Vec<u64>);

impl Lent {
    fn new(buffers: usize) -> Lent {
        Lent(vec![0; buffers.div_ceil(64)])
    }

    fn set(&mut self, idx: u32) {
        if let Some(w) = self.0.get_mut(idx as usize / 64) {
            *w |= 1 << (idx % 64);
        }
    }

    /// Whether `idx` was lent; marks it returned.
    fn take(&mut self, idx: u32) -> bool {
        match self.0.get_mut(idx as usize / 64) {
            Some(w) if *w & (1 << (idx % 64)) != 0 => {
                *w &= !(1 << (idx % 64));
                true
            }
            _ => false,
        }
    }

    fn drain(&mut self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter_mut().enumerate().flat_map(|(w, word)| {
            let mut bits = std::mem::take(word);
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    (w * 64) as u32 + b
                })
            })
        })
    }
}

/// The receive side: rx and fill rings and the buffers lent through the fill ring.
struct RxSide {
    rx: Ring,
    fill: Ring,
    lent: Lent,
    /// Entries the fill ring is topped up to (at most `RING`).
    fill_target: u32,
    /// Whether `fill_target` may grow with the port's traffic (pod ports).
    elastic: bool,
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
}

/// An AF_XDP port bound to one queue of a kernel interface.
pub struct AfXdpPort {
    name: String,
    pool: Arc<Pool>,
    /// `None` only while dropping.
    rx: Mutex<Option<RxSide>>,
    tx: Mutex<Option<TxSide>>,
    mac: Option<MacAddr>,
    counters: QueueCounters,
    fd: RawFd,
    ifname: String,
    /// For interface ioctls in the port's namespace (link state).
    control: OwnedFd,
    /// The interface's link (up and running), as last asked by `refresh_link`.
    link: std::sync::atomic::AtomicBool,
    /// The attached program; `None` only while dropping.
    xdp: Mutex<Option<XdpRedirect>>,
    sock: Option<OwnedFd>,
    binding: Binding,
}

// SAFETY: the rings are only touched under their side's mutex (taken with try_lock).
unsafe impl Send for AfXdpPort {}
// SAFETY: as above.
unsafe impl Sync for AfXdpPort {}

impl AfXdpPort {
    /// Opens queue 0 of `ifname` (in the calling thread's network namespace) over `pool`'s
    /// region, in generic (SKB) XDP mode and copy mode, which every device supports; every
    /// frame of the queue comes to the port (a pod's veth).
    pub fn open(name: &str, ifname: &str, pool: Arc<Pool>) -> io::Result<AfXdpPort> {
        Self::open_with(name, ifname, pool, None)
    }

    /// Opens an underlay port for a VTEP: only what `filter` takes (VXLAN to the VTEP, ARP /
    /// neighbour solicitations asking for it, in its VLAN when it has one) comes to the port;
    /// the node keeps every other frame of the interface (its own address, SSH, the API
    /// server...).
    pub fn open_underlay(name: &str, ifname: &str, pool: Arc<Pool>, filter: UnderlayFilter) -> io::Result<AfXdpPort> {
        Self::open_with(name, ifname, pool, Some(filter))
    }

    /// Buffers the port keeps in its fill ring now (it grows with traffic on pod ports).
    pub fn fill_target(&self) -> u32 {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, |s| s.fill_target)
    }

    /// The mode the kernel bound the socket in.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// The device's receive queues (this port reads queue 0 only), when its driver says.
    pub fn device_rx_queues(&self) -> Option<u32> {
        rx_queues(self.control.as_raw_fd(), &self.ifname)
    }

    /// Swaps the port's XDP program while it runs: the underlay filter for `filter`, or
    /// (with `None`) every frame of the queue to the port. The socket stays bound.
    pub fn set_underlay_filter(&self, filter: Option<UnderlayFilter>) -> io::Result<()> {
        if let Some(side) = self.rx.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            side.fill_target = if filter.is_some() { FILL_UNDERLAY } else { side.fill_target.min(FILL_POD) };
            side.elastic = filter.is_none();
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
        // SAFETY: plain socket creation, checked.
        let sock = unsafe { OwnedFd::from_raw_fd(check(libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0))?) };
        let fd = sock.as_raw_fd();
        let (addr, len) = pool.region();
        setopt(fd, SOL_XDP, XDP_UMEM_REG, &UmemReg { addr: addr as u64, len: len as u64, chunk_size: BUF_SIZE as u32, headroom: 0 })?;
        for opt in [XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING, XDP_TX_RING] {
            setopt(fd, SOL_XDP, opt, &RING)?;
        }
        let mut off = MmapOffsets::default();
        let mut olen = std::mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `olen` bytes into `off`.
        check(unsafe { libc::getsockopt(fd, SOL_XDP, XDP_MMAP_OFFSETS, (&mut off as *mut MmapOffsets).cast(), &mut olen) })?;
        // Older kernels report offsets without the flags words.
        let with_flags = olen as usize == std::mem::size_of::<MmapOffsets>();
        let rx = Ring::map(fd, &off.rx, PGOFF_RX, 16, with_flags)?;
        let tx = Ring::map(fd, &off.tx, PGOFF_TX, 16, with_flags)?;
        let fill = Ring::map(fd, &off.fr, PGOFF_FILL, 8, with_flags)?;
        let comp = Ring::map(fd, &off.cr, PGOFF_COMPLETION, 8, with_flags)?;
        // No mode forced: zero-copy where the driver has it, copy otherwise.
        let mut sa = SockaddrXdp { family: AF_XDP as u16, flags: XDP_USE_NEED_WAKEUP, ifindex, queue_id: 0, shared_umem_fd: 0 };
        // A previous socket on this queue may still be tearing down: retry EBUSY briefly.
        let mut tries = 0;
        loop {
            // SAFETY: binds to a sockaddr_xdp we own, with its size.
            let r = unsafe {
                libc::bind(fd, (&sa as *const SockaddrXdp).cast(), std::mem::size_of::<SockaddrXdp>() as u32)
            };
            match check(r) {
                Ok(_) => break,
                // A kernel without need_wakeup refuses the flag: kick every burst there.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && sa.flags & XDP_USE_NEED_WAKEUP != 0 => {
                    sa.flags &= !XDP_USE_NEED_WAKEUP;
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10 << tries.min(4)));
                }
                Err(e) => return Err(e),
            }
        }
        // Native XDP where the driver has it (veth does), generic otherwise.
        let attach = |flags| match underlay {
            None => XdpRedirect::attach(ifindex, flags, 1),
            Some(f) => XdpRedirect::attach_underlay(ifindex, flags, 1, &f),
        };
        let (xdp, mode) = match attach(XDP_FLAGS_DRV_MODE) {
            Ok(x) => (x, "native"),
            Err(e) => {
                tracing::info!(port = name, ifname, error = %e, "no native XDP on this device: generic XDP");
                (attach(XDP_FLAGS_SKB_MODE)?, "generic")
            }
        };
        let mac = interface_mac(ifname);
        let control = control_socket()?;
        let zc = zero_copy(fd);
        let copy = if zc { "zero-copy" } else { "copy" };
        let wakeup = sa.flags & XDP_USE_NEED_WAKEUP != 0;
        tracing::info!(port = name, ifname, mode, copy, need_wakeup = wakeup, "AF_XDP port open (UMEM = buffer pool)");
        // One socket, bound to queue 0: what the device steers to its other queues is dropped
        // by the program's redirect (the kernel counts it on the interface).
        if let Some(n) = rx_queues(control.as_raw_fd(), ifname).filter(|n| *n > 1) {
            tracing::warn!(port = name, ifname, queues = n, "the device has {n} receive queues and this port reads queue 0 only: frames on the others are lost; `ethtool -L {ifname} combined 1` (or rx 1), or use an AF_PACKET port");
        }
        let n = pool.capacity() as usize;
        // The fill ring is filled before frames are redirected here: a socket without fill
        // buffers drops what arrives until a PMD thread first polls it, and a pod attached a
        // moment ago loses its first ARP request (a one-second stall).
        let fill_target = if underlay.is_some() { FILL_UNDERLAY } else { FILL_POD };
        let mut rx_side = RxSide { rx, fill, lent: Lent::new(n), fill_target, elastic: false, wakeup: wakeup && zc };
        let mut cache = PoolCache::new(pool.clone());
        Self::refill(&mut rx_side, &mut cache);
        rx_side.elastic = underlay.is_none();
        if let Err(e) = xdp.register(0, fd) {
            // The socket goes first: then the kernel holds none of the lent buffers.
            drop((xdp, rx_side.rx, rx_side.fill, tx, comp, sock));
            for idx in rx_side.lent.drain() {
                // SAFETY: lent through the fill ring of a socket now closed.
                cache.free(unsafe { BufId::from_index(idx) });
            }
            return Err(e);
        }
        cache.flush();
        Ok(AfXdpPort {
            name: name.into(),
            pool,
            rx: Mutex::new(Some(rx_side)),
            tx: Mutex::new(Some(TxSide { tx, comp, lent: Lent::new(n), wakeup })),
            mac,
            counters: QueueCounters::default(),
            fd,
            ifname: ifname.into(),
            link: std::sync::atomic::AtomicBool::new(if_running(control.as_raw_fd(), ifname).unwrap_or(false)),
            control,
            xdp: Mutex::new(Some(xdp)),
            sock: Some(sock),
            binding: Binding { zero_copy: zc, need_wakeup: wakeup },
        })
    }

    /// Tops the fill ring up with fresh pool buffers.
    fn refill(side: &mut RxSide, cache: &mut PoolCache) {
        let prod = side.fill.prod().load(Relaxed);
        let held = prod.wrapping_sub(side.fill.cons().load(Acquire));
        if side.elastic && side.fill_target < RING && held < side.fill_target / 2 {
            side.grow(cache);
        }
        let free = side.fill_target.saturating_sub(held);
        let mut n = 0;
        while n < free {
            let Some(b) = cache.alloc() else { break };
            let idx = b.into_index();
            side.lent.set(idx);
            side.fill.write_addr(prod.wrapping_add(n), (idx as u64) * BUF_SIZE as u64);
            n += 1;
        }
        if n > 0 {
            side.fill.prod().store(prod.wrapping_add(n), Release);
        }
    }

    fn rx_pending(side: &RxSide) -> bool {
        side.rx.prod().load(Acquire) != side.rx.cons().load(Relaxed)
    }
}

impl RxSide {
    /// The kernel took more than half the fill ring since the last refill: a PMD that
    /// misses a few turns (preempted, or a VM's vCPU stopped for milliseconds) would see it
    /// run dry and the kernel drop frames. The ring doubles, up to `RING`, while the pool
    /// has more than half its buffers free: buffers in a fill ring stay lent until frames
    /// arrive in them, so growth is bounded by what the pool can spare, and idle pods,
    /// which never grow, keep `FILL_POD` each.
    #[cold]
    fn grow(&mut self, cache: &PoolCache) {
        let pool = cache.pool();
        if pool.free_count() > pool.capacity() as usize / 2 {
            self.fill_target = (self.fill_target * 2).min(RING);
        }
    }
}

impl Port for AfXdpPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Ok(mut guard) = self.rx.try_lock() else { return 0 };
        let Some(side) = guard.as_mut() else { return 0 };
        let cons = side.rx.cons().load(Relaxed);
        let avail = side.rx.prod().load(Acquire).wrapping_sub(cons);
        let n = avail.min(batch.room() as u32);
        let mut got = 0;
        for i in 0..n {
            let (addr, len) = side.rx.read_desc(cons.wrapping_add(i));
            let idx = (addr / BUF_SIZE as u64) as u32;
            let off = (addr % BUF_SIZE as u64) as usize;
            // SAFETY: `idx` was lent to the kernel through the fill ring (checked in the
            // bitmap) and comes back once, here.
            let b = if side.lent.take(idx) { unsafe { self.pool.claim_filled(idx, off, len as usize) } } else { None };
            match b.map(|b| batch.push(b)) {
                Some(Ok(())) => got += 1,
                Some(Err(b)) => {
                    cache.free(b);
                    self.counters.rx_dropped.add(1);
                }
                None => self.counters.rx_dropped.add(1),
            }
        }
        if n > 0 {
            side.rx.cons().store(cons.wrapping_add(n), Release);
        }
        Self::refill(side, cache);
        if n == 0 && side.wakeup && side.fill.needs_wakeup() {
            // A zero-copy driver went to sleep with our fill ring empty: wake it.
            // SAFETY: recvfrom with no buffer on our own socket.
            unsafe { libc::recvfrom(self.fd, std::ptr::null_mut(), 0, libc::MSG_DONTWAIT, std::ptr::null_mut(), std::ptr::null_mut()) };
        }
        self.counters.rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Ok(mut guard) = self.tx.try_lock() else {
            self.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let Some(side) = guard.as_mut() else { return 0 };
        // Buffers the kernel finished sending come back to the pool.
        let ccons = side.comp.cons().load(Relaxed);
        let done = side.comp.prod().load(Acquire).wrapping_sub(ccons);
        for i in 0..done {
            let idx = (side.comp.read_addr(ccons.wrapping_add(i)) / BUF_SIZE as u64) as u32;
            if side.lent.take(idx) {
                // SAFETY: lent through the tx ring and returned once by the completion ring.
                cache.free(unsafe { BufId::from_index(idx) });
            }
        }
        if done > 0 {
            side.comp.cons().store(ccons.wrapping_add(done), Release);
        }
        let prod = side.tx.prod().load(Relaxed);
        let room = RING - prod.wrapping_sub(side.tx.cons().load(Acquire));
        let mut sent = 0u32;
        while (sent as usize) < batch.len() && sent < room {
            let i = sent as usize;
            // Chained or shared packets are flattened into one buffer first (rare: jumbo
            // frames or flood copies with a shared payload).
            if self.pool.is_chained(&batch.as_slice()[i]) {
                let mut parts: [&[u8]; 8] = [&[]; 8];
                let mut k = 0;
                for seg in self.pool.segments(&batch.as_slice()[i]).take(8) {
                    parts[k] = seg;
                    k += 1;
                }
                let flat = cache.alloc_gather(&parts[..k]);
                match flat.filter(|f| !self.pool.is_chained(f)) {
                    Some(f) => {
                        let old = std::mem::replace(&mut batch.as_mut_slice()[i], f);
                        cache.free(old);
                    }
                    None => break,
                }
            }
            let (addr, len) = self.pool.head_addr(&batch.as_slice()[i]);
            side.tx.write_desc(prod.wrapping_add(sent), addr, len as u32);
            sent += 1;
        }
        if sent > 0 {
            side.tx.prod().store(prod.wrapping_add(sent), Release);
            for i in 0..sent as usize {
                side.lent.set(batch.take(i).into_index());
            }
            batch.consume_front(sent as usize);
            // Copy mode transmits only when kicked (the flag stays set): one kick per burst.
            if !side.wakeup || side.tx.needs_wakeup() {
                // SAFETY: sendto with no data on our own socket.
                unsafe { libc::sendto(self.fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
            }
        }
        self.counters.tx_packets.add(sent as u64);
        self.counters.tx_full.add(batch.len() as u64);
        sent as usize
    }

    fn wake_fd(&self, _q: u16) -> Option<RawFd> {
        Some(self.fd)
    }

    fn arm_wake(&self, _q: u16, armed: bool) -> bool {
        armed && self.rx.try_lock().map_or(true, |s| s.as_ref().is_some_and(Self::rx_pending))
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        vec![self.counters.read()]
    }

    fn mac(&self) -> Option<MacAddr> {
        self.mac
    }

    fn link_up(&self) -> bool {
        self.link.load(Relaxed)
    }

    fn refresh_link(&self) {
        self.link.store(if_running(self.control.as_raw_fd(), &self.ifname).unwrap_or(false), Relaxed);
    }

    /// One UMEM chunk per frame after the kernel's XDP headroom (no multi-buffer yet).
    fn max_frame(&self) -> usize {
        BUF_SIZE - XDP_PACKET_HEADROOM
    }
}

/// Whether the bound socket runs in zero-copy mode (`XDP_OPTIONS`, Linux ≥ 5.3).
fn zero_copy(fd: RawFd) -> bool {
    let mut opts = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `opts`.
    let r = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_OPTIONS, (&mut opts as *mut u32).cast(), &mut len) };
    r == 0 && opts & XDP_OPTIONS_ZEROCOPY != 0
}

impl Drop for AfXdpPort {
    fn drop(&mut self) {
        // Unmap the rings, detach the program and close the socket first: after that the
        // kernel holds no buffer, and every lent one goes back to the pool.
        let rx = self.rx.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let tx = self.tx.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let mut lent: Vec<Lent> = Vec::new();
        if let Some(RxSide { rx, fill, lent: l, .. }) = rx {
            drop((rx, fill));
            lent.push(l);
        }
        if let Some(TxSide { tx, comp, lent: l, .. }) = tx {
            drop((tx, comp));
            lent.push(l);
        }
        drop(self.xdp.get_mut().unwrap_or_else(|e| e.into_inner()).take());
        drop(self.sock.take());
        let mut cache = PoolCache::new(self.pool.clone());
        for l in &mut lent {
            for idx in l.drain() {
                // SAFETY: lent to the kernel, which released it when the socket closed.
                cache.free(unsafe { BufId::from_index(idx) });
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::Lent;

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

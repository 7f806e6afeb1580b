//! The `dpdk` port kind: one ethdev (a vdev, a NIC or a VF), configured with `queues` rx/tx
//! queue pairs (RSS over them when more than one), a mempool of its own, started
//! promiscuous. Frames cross the edge without a copy when the mempool carries the switch's
//! buffers (`zerocopy.rs`), else they are copied between mbufs and the switch's buffers.
//!
//! # Safety
//! The port owns its ethdev (`port_id`, probed by [`DpdkPort::open`], stopped and closed on
//! drop) and its mempool (`mp`, freed after the device closes; with zero copy, its mbufs'
//! buffers are returned to the switch's pool first). mbuf pointers come only from
//! the device's rx burst or from `mp`, and each is freed or handed to tx exactly once within
//! the burst that got it. An rx queue is polled by one PMD thread at a time: each is behind
//! a try-lock (a queue moves between threads when the configuration changes, and the two may
//! overlap for a moment); each tx queue is behind a try-lock because PMD threads may
//! outnumber tx queues. mbuf data is read through `shim_mbuf_data` for
//! `shim_mbuf_data_len` bytes, which DPDK guarantees inside the mbuf's data room.

use crate::eal::{self, errno_text, ret_text};
use crate::zerocopy::ZeroCopy;
use crate::{DpdkError, PortOptions};
use std::ffi::CString;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex};
use vswitch::batch::{BATCH, Batch};
use vswitch::buf::PoolCache;
use vswitch::port::{Port, QueueCounters, QueueStats};
use vswitch::wire::MacAddr;

/// Segments a received frame may have (9 KiB jumbo frames in 2 KiB mbufs take 5).
const MAX_SEGS: usize = 8;
// DPDK's `RTE_BIT64`/`RTE_BIT32` macros, which bindgen does not expand.
const RX_OFFLOAD_SCATTER: u64 = 1 << 13;
const TX_OFFLOAD_MULTI_SEGS: u64 = 1 << 15;
const DEV_INTR_LSC: u32 = 1 << 1;
/// Ethernet header, one VLAN tag and the FCS around an MTU.
const FRAME_OVERHEAD: u32 = 22;

pub struct DpdkPort {
    name: String,
    /// The ethdev's name as DPDK knows it (devargs up to the first comma).
    dev: String,
    port_id: u16,
    mp: *mut dpdk_sys::rte_mempool,
    /// The mempool's mbufs carry the switch's buffers (`None`: frames are copied).
    zc: Option<ZeroCopy>,
    /// Why frames are copied though the switch's buffers were offered to a device that
    /// could use them (the fallback a user should see); `None` otherwise.
    copying: Option<String>,
    queues: u16,
    tx_locks: Box<[QueueLock]>,
    /// Per rx queue, taken while a thread polls it: a queue moves between PMD threads when
    /// the configuration changes (or a port is pinned), and for a moment both may try.
    rx_locks: Box<[QueueLock]>,
    counters: Box<[QueueCounters]>,
    /// Link state, written by the EAL's interrupt thread on link events (devices that have
    /// them) and by [`Port::refresh_link`]; boxed so its address, given to the callback,
    /// stays put.
    up: Box<AtomicBool>,
    lsc: bool,
    mac: Option<MacAddr>,
    max_frame: usize,
}

/// A queue's try-lock, alone on its cache line (threads polling other queues take theirs
/// without sharing a line).
#[derive(Default)]
#[repr(align(64))]
struct QueueLock(Mutex<()>);

// SAFETY: the raw mempool pointer is shared by design (DPDK mempools are multi-thread safe);
// every other field is Sync. Queue access discipline: see the module's Safety section.
unsafe impl Send for DpdkPort {}
// SAFETY: as above.
unsafe impl Sync for DpdkPort {}

fn dev_err(what: &'static str, name: &str, reason: String) -> DpdkError {
    DpdkError::Device { what, name: name.into(), reason }
}

impl DpdkPort {
    /// Probes `devargs` (a PCI address or a vdev: `net_tap0,iface=dtap0`) and opens it as
    /// port `name`. The EAL must be initialised ([`eal::init`]).
    pub fn open(name: &str, devargs: &str, opts: &PortOptions) -> Result<Arc<DpdkPort>, DpdkError> {
        Self::open_copying(name, devargs, opts, None)
    }

    /// [`DpdkPort::open`]; `refused` says why the switch's buffers were refused in an earlier
    /// attempt (then `opts` offers none).
    fn open_copying(
        name: &str,
        devargs: &str,
        opts: &PortOptions,
        refused: Option<String>,
    ) -> Result<Arc<DpdkPort>, DpdkError> {
        if !eal::initialised() {
            return Err(dev_err("device", devargs, "the DPDK EAL is not initialised".into()));
        }
        let dev = devargs.split(',').next().unwrap_or_default().trim().to_string();
        if dev.is_empty() {
            return Err(DpdkError::Devargs(devargs.into()));
        }
        let c_devargs = CString::new(devargs).map_err(|_| DpdkError::Devargs(devargs.into()))?;
        // SAFETY: a NUL-terminated string alive for the call.
        let r = unsafe { dpdk_sys::rte_dev_probe(c_devargs.as_ptr()) };
        if r < 0 {
            return Err(dev_err("probing", devargs, ret_text(r)));
        }
        let c_dev = CString::new(dev.as_str()).map_err(|_| DpdkError::Devargs(devargs.into()))?;
        let mut port_id = 0u16;
        // SAFETY: valid string and out pointer.
        if unsafe { dpdk_sys::rte_eth_dev_get_port_by_name(c_dev.as_ptr(), &mut port_id) } != 0 {
            remove_device(&dev);
            return Err(dev_err("device", &dev, "probed, but it is not an ethdev".into()));
        }
        let share = opts.zero_copy.as_ref().filter(|_| crate::device_copies(devargs));
        let mut shared = false;
        match Self::configure(name, &dev, port_id, opts, share, &mut shared, refused) {
            Ok(p) => Ok(Arc::new(p)),
            Err(e) => {
                // SAFETY: our port id; stopping/closing a device that is not started is
                // harmless.
                unsafe {
                    dpdk_sys::rte_eth_dev_stop(port_id);
                    dpdk_sys::rte_eth_dev_close(port_id);
                }
                remove_device(&dev);
                // A driver may want more room in an mbuf than a switch buffer has
                // (net_af_packet: its whole frame size): then it gets a mempool of its own.
                if shared {
                    tracing::warn!(
                        port = name,
                        dev,
                        error = %e,
                        "the device refused the switch's buffers: opened again, frames copied"
                    );
                    return Self::open_copying(
                        name,
                        devargs,
                        &PortOptions { zero_copy: None, ..opts.clone() },
                        Some(format!("the device failed with the switch's 2 KiB buffers ({e})")),
                    );
                }
                Err(e)
            }
        }
    }

    /// Configures and starts the probed device; `shared` says whether its mempool carried the
    /// switch's buffers (`share`) when it failed; `copying` why an earlier attempt copies.
    fn configure(
        name: &str,
        dev: &str,
        port_id: u16,
        opts: &PortOptions,
        share: Option<&Arc<vswitch::Pool>>,
        shared: &mut bool,
        mut copying: Option<String>,
    ) -> Result<DpdkPort, DpdkError> {
        let fail = |what: &'static str, r: libc::c_int| dev_err(what, dev, ret_text(r));
        let mut info = dpdk_sys::rte_eth_dev_info::default();
        // SAFETY: out pointer to a default-initialised struct.
        let r = unsafe { dpdk_sys::rte_eth_dev_info_get(port_id, &mut info) };
        if r != 0 {
            return Err(fail("device info of", r));
        }
        let queues = opts.queues.clamp(1, info.max_rx_queues.min(info.max_tx_queues).max(1));
        let mut conf = dpdk_sys::rte_eth_conf::default();
        if queues > 1 && info.flow_type_rss_offloads != 0 {
            conf.rxmode.mq_mode = dpdk_sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = info.flow_type_rss_offloads;
        }
        // Jumbo frames: as large an MTU as the device and the switch take, received into
        // chained mbufs and sent from them where the device can.
        let max_mtu = (vswitch::buf::MAX_FRAME as u32 - FRAME_OVERHEAD)
            .min(info.max_mtu as u32)
            .min(info.max_rx_pktlen.saturating_sub(FRAME_OVERHEAD));
        if max_mtu > 1500 {
            conf.rxmode.mtu = max_mtu;
        }
        conf.rxmode.offloads |= info.rx_offload_capa & RX_OFFLOAD_SCATTER;
        conf.txmode.offloads |= info.tx_offload_capa & TX_OFFLOAD_MULTI_SEGS;
        // SAFETY: `dev_flags` points at the device's flags word while the device exists.
        let lsc = !info.dev_flags.is_null() && unsafe { *info.dev_flags } & DEV_INTR_LSC != 0;
        if lsc {
            conf.intr_conf.set_lsc(1);
        }
        // SAFETY: a valid configuration struct for our port.
        let r = unsafe { dpdk_sys::rte_eth_dev_configure(port_id, queues, queues, &conf) };
        if r != 0 {
            return Err(fail("configuring", r));
        }
        // SAFETY: plain query.
        let socket = unsafe { dpdk_sys::rte_eth_dev_socket_id(port_id) };
        let pool_name = CString::new(format!("knitter_p{port_id}"))
            .map_err(|_| DpdkError::Devargs(dev.into()))?;
        let zero_copy =
            match share.map(|pool| ZeroCopy::create(&pool_name, pool, opts.mbufs, socket)) {
                Some(Err(why)) => {
                    tracing::warn!(port = name, dev, why, "zero copy refused: frames are copied");
                    copying = Some(why);
                    None
                }
                Some(Ok(zc)) => Some(zc),
                None => None,
            };
        *shared = zero_copy.is_some();
        let (mp, zc) = match zero_copy {
            Some((mp, zc)) => (mp, Some(zc)),
            // SAFETY: valid name; sizes within range (the data room fits a u16).
            None => (
                unsafe {
                    dpdk_sys::rte_pktmbuf_pool_create(
                        pool_name.as_ptr(),
                        opts.mbufs,
                        256,
                        0,
                        dpdk_sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
                        socket,
                    )
                },
                None,
            ),
        };
        if mp.is_null() {
            return Err(dev_err("mempool for", dev, errno_text()));
        }
        let mut port = DpdkPort {
            name: name.into(),
            dev: dev.into(),
            port_id,
            mp,
            zc,
            copying,
            queues,
            tx_locks: (0..queues).map(|_| QueueLock::default()).collect(),
            rx_locks: (0..queues).map(|_| QueueLock::default()).collect(),
            counters: (0..queues).map(|_| QueueCounters::default()).collect(),
            up: Box::new(AtomicBool::new(false)),
            lsc,
            mac: None,
            max_frame: ((conf.rxmode.mtu.max(1500) + FRAME_OVERHEAD) as usize)
                .min(info.max_rx_pktlen as usize)
                .clamp(64, vswitch::buf::MAX_FRAME),
        };
        if lsc {
            // SAFETY: the callback gets the address of `up`, boxed in the port and alive
            // until the callback is unregistered in `drop`, before the box goes.
            let r = unsafe {
                dpdk_sys::rte_eth_dev_callback_register(
                    port_id,
                    dpdk_sys::RTE_ETH_EVENT_INTR_LSC,
                    Some(link_changed),
                    port.up_ptr(),
                )
            };
            if r != 0 {
                port.lsc = false;
            }
        }
        let socket = socket.max(0) as u32;
        for q in 0..queues {
            // SAFETY: our port, a queue below the configured count, our mempool; null confs
            // take the driver's defaults.
            let r = unsafe {
                dpdk_sys::rte_eth_rx_queue_setup(
                    port_id,
                    q,
                    opts.descriptors,
                    socket,
                    std::ptr::null(),
                    mp,
                )
            };
            if r != 0 {
                return Err(fail("rx queue setup of", r));
            }
            // SAFETY: as above.
            let r = unsafe {
                dpdk_sys::rte_eth_tx_queue_setup(
                    port_id,
                    q,
                    opts.descriptors,
                    socket,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(fail("tx queue setup of", r));
            }
        }
        // Not every vdev has promiscuous mode (net_ring, net_pcap): not an error.
        // SAFETY: plain calls on our port.
        unsafe { dpdk_sys::rte_eth_promiscuous_enable(port_id) };
        // SAFETY: as above.
        let r = unsafe { dpdk_sys::rte_eth_dev_start(port_id) };
        if r != 0 {
            return Err(fail("starting", r));
        }
        let mut addr = dpdk_sys::rte_ether_addr::default();
        // SAFETY: out pointer.
        if unsafe { dpdk_sys::rte_eth_macaddr_get(port_id, &mut addr) } == 0 {
            port.mac = Some(MacAddr(addr.addr_bytes));
        }
        port.refresh_link();
        let zero_copy = port.zc.is_some();
        tracing::info!(port = name, dev, port_id, queues, zero_copy, "dpdk port started");
        Ok(port)
    }

    fn up_ptr(&self) -> *mut libc::c_void {
        std::ptr::from_ref::<AtomicBool>(&self.up).cast_mut().cast()
    }

    /// Whether the device tells link changes as they happen (else the control plane's
    /// refresh reads them).
    pub fn has_link_events(&self) -> bool {
        self.lsc
    }

    /// Whether frames cross the edge without a copy (the mempool carries the switch's
    /// buffers).
    pub fn zero_copy(&self) -> bool {
        self.zc.is_some()
    }

    /// Why frames are copied at the edge though the port was offered the switch's buffers
    /// for a device that copies with the CPU (the pool could not spare them, the device
    /// refused their size); `None` with zero copy, and for devices that DMA.
    pub fn copy_reason(&self) -> Option<&str> {
        self.copying.as_deref()
    }

    /// The ethdev's port id.
    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    /// The device's own counters (rx/tx packets and bytes, misses, errors, mbuf shortages).
    pub fn device_stats(&self) -> Option<crate::DeviceStats> {
        let mut s = dpdk_sys::rte_eth_stats::default();
        // SAFETY: out pointer.
        (unsafe { dpdk_sys::rte_eth_stats_get(self.port_id, &mut s) } == 0).then_some(
            crate::DeviceStats {
                ipackets: s.ipackets,
                opackets: s.opackets,
                ibytes: s.ibytes,
                obytes: s.obytes,
                imissed: s.imissed,
                ierrors: s.ierrors,
                oerrors: s.oerrors,
                rx_nombuf: s.rx_nombuf,
            },
        )
    }

    /// Frees a received burst's mbufs (their frames taken or copied).
    fn free_burst(&self, mbufs: &mut [*mut dpdk_sys::rte_mbuf]) {
        if !mbufs.is_empty() {
            // SAFETY: the burst's chains, ours, each freed once.
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(mbufs.as_mut_ptr(), mbufs.len() as u32) };
        }
    }

    /// Copies a received mbuf chain into a switch buffer (the caller frees the chain).
    fn receive(&self, m: *mut dpdk_sys::rte_mbuf, cache: &mut PoolCache) -> Option<vswitch::BufId> {
        let mut parts: [&[u8]; MAX_SEGS] = [&[]; MAX_SEGS];
        let (mut k, mut seg, mut total) = (0, m, 0usize);
        while !seg.is_null() && k < MAX_SEGS {
            // SAFETY: `seg` is a segment of a chain the rx burst gave us; its data is
            // `data_len` bytes inside its data room, valid until the chain is freed below.
            parts[k] = unsafe {
                std::slice::from_raw_parts(
                    dpdk_sys::shim_mbuf_data(seg),
                    dpdk_sys::shim_mbuf_data_len(seg) as usize,
                )
            };
            total += parts[k].len();
            k += 1;
            // SAFETY: as above.
            seg = unsafe { dpdk_sys::shim_mbuf_next(seg) };
        }
        if seg.is_null() && total <= self.max_frame.max(vswitch::buf::MAX_FRAME) {
            cache.alloc_gather(&parts[..k])
        } else {
            None
        }
    }

    /// Copies a switch packet into `head` (a fresh mbuf of the port's mempool), chaining more
    /// mbufs as it needs; false when the mempool runs dry (`head` is then the caller's to
    /// free, with whatever was chained to it).
    fn transmit_copy(
        &self,
        pool: &vswitch::Pool,
        b: &vswitch::BufId,
        head: *mut dpdk_sys::rte_mbuf,
    ) -> bool {
        let mut last = head;
        for mut piece in pool.segments(b) {
            while !piece.is_empty() {
                // SAFETY: `last` is the chain's last mbuf, ours until sent or freed.
                let room = unsafe { dpdk_sys::shim_mbuf_tailroom(last) } as usize;
                if room == 0 {
                    // SAFETY: allocation from our mempool.
                    let next = unsafe { dpdk_sys::shim_pktmbuf_alloc(self.mp) };
                    if next.is_null() {
                        return false;
                    }
                    // SAFETY: chaining our own mbufs; on failure `next` is freed once.
                    if unsafe { dpdk_sys::shim_pktmbuf_chain(head, next) } != 0 {
                        // SAFETY: as above.
                        unsafe { dpdk_sys::shim_pktmbuf_free(next) };
                        return false;
                    }
                    last = next;
                    continue;
                }
                let n = room.min(piece.len()).min(u16::MAX as usize);
                // SAFETY: append grows the packet by `n` bytes at the end of `last` (`n` is
                // at most its tailroom) and returns where they go.
                let dst = unsafe { dpdk_sys::shim_pktmbuf_append(head, n as u16) };
                if dst.is_null() {
                    return false;
                }
                // SAFETY: `dst` has room for `n` bytes; `piece` holds at least `n`.
                unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), dst, n) };
                piece = &piece[n..];
            }
        }
        true
    }
    /// Fresh mbufs for a burst: one allocation for all of them, else as many as the mempool
    /// has, one by one. Returns how many of `mbufs` were filled.
    fn alloc_mbufs(&self, mbufs: &mut [*mut dpdk_sys::rte_mbuf]) -> usize {
        let want = mbufs.len();
        if want == 0 {
            return 0;
        }
        // SAFETY: room for `want` pointers; the mbufs are ours until sent or freed.
        let bulk =
            unsafe { dpdk_sys::shim_pktmbuf_alloc_bulk(self.mp, mbufs.as_mut_ptr(), want as u32) };
        if bulk == 0 {
            return want;
        }
        let mut have = 0;
        while have < want {
            // SAFETY: allocation from our mempool.
            let m = unsafe { dpdk_sys::shim_pktmbuf_alloc(self.mp) };
            if m.is_null() {
                break;
            }
            mbufs[have] = m;
            have += 1;
        }
        have
    }

    /// Copies `frames` into the fresh `mbufs`, in order, until one does not fit; returns how
    /// many were filled. Unchained frames (all but jumbo ones) are copied in one call for the
    /// burst; the rest, and any that did not fit, segment by segment.
    fn fill_copies(
        &self,
        pool: &vswitch::Pool,
        frames: &[vswitch::BufId],
        mbufs: &[*mut dpdk_sys::rte_mbuf],
    ) -> usize {
        let have = frames.len().min(mbufs.len()).min(BATCH);
        let mut k = 0;
        if frames.iter().all(|b| !pool.is_chained(b)) {
            let (mut data, mut lens) = ([std::ptr::null::<u8>(); BATCH], [0u16; BATCH]);
            for (i, b) in frames[..have].iter().enumerate() {
                let head = pool.head(b);
                data[i] = head.as_ptr();
                lens[i] = head.len().min(u16::MAX as usize) as u16;
            }
            // SAFETY: `have` fresh mbufs of ours and as many frames, each `lens[i]` bytes at
            // `data[i]` in the pool (borrowed for this call).
            k = unsafe {
                dpdk_sys::shim_tx_fill(mbufs.as_ptr(), have as u16, data.as_ptr(), lens.as_ptr())
            } as usize;
        }
        k + frames[k..have]
            .iter()
            .zip(&mbufs[k..have])
            .take_while(|(b, m)| self.transmit_copy(pool, b, **m))
            .count()
    }

    /// Hands `mbufs` to the device's tx queue `q` (held by the caller); returns how many it
    /// took. Those it did not take are still the caller's.
    fn send(&self, q: u16, mbufs: &mut [*mut dpdk_sys::rte_mbuf]) -> usize {
        // SAFETY: our port and queue (the caller holds its lock), valid mbuf chains.
        let sent = unsafe {
            dpdk_sys::shim_tx_burst(self.port_id, q, mbufs.as_mut_ptr(), mbufs.len() as u16)
        };
        sent as usize
    }
}

/// The link-state callback (the EAL's interrupt thread): reads the link and stores it.
unsafe extern "C" fn link_changed(
    port_id: u16,
    _event: dpdk_sys::rte_eth_event_type,
    arg: *mut libc::c_void,
    _ret: *mut libc::c_void,
) -> libc::c_int {
    let mut link = dpdk_sys::rte_eth_link::default();
    // SAFETY: out pointer; the nowait variant does not block.
    let ok = unsafe { dpdk_sys::rte_eth_link_get_nowait(port_id, &mut link) } == 0;
    // SAFETY: `arg` is the port's boxed `up` (registered in `configure`, unregistered before
    // it is freed).
    let up = unsafe { &*arg.cast::<AtomicBool>() };
    up.store(ok && link.link_status() == dpdk_sys::RTE_ETH_LINK_UP as u16, Relaxed);
    0
}

/// Removes a probed device from its bus (vdevs, so the name can be probed again).
fn remove_device(dev: &str) {
    let (Ok(bus), Ok(name)) =
        (CString::new(if dev.contains(':') { "pci" } else { "vdev" }), CString::new(dev))
    else {
        return;
    };
    // SAFETY: valid strings.
    unsafe { dpdk_sys::rte_eal_hotplug_remove(bus.as_ptr(), name.as_ptr()) };
}

impl Drop for DpdkPort {
    fn drop(&mut self) {
        if self.lsc {
            // SAFETY: unregisters the callback registered with this argument. The EAL
            // refuses (-EAGAIN) while it runs: retried until it is out, so `up` outlives it.
            while unsafe {
                dpdk_sys::rte_eth_dev_callback_unregister(
                    self.port_id,
                    dpdk_sys::RTE_ETH_EVENT_INTR_LSC,
                    Some(link_changed),
                    self.up_ptr(),
                )
            } == -libc::EAGAIN
            {
                std::thread::yield_now();
            }
        }
        // SAFETY: our device, stopped and closed once; the mempool is freed after the
        // device that held its mbufs is gone.
        unsafe {
            dpdk_sys::rte_eth_dev_stop(self.port_id);
            dpdk_sys::rte_eth_dev_close(self.port_id);
        }
        remove_device(&self.dev);
        match &self.zc {
            // SAFETY: the mempool `create` made; the device closed and bursts returned their
            // mbufs, so every mbuf is back in it.
            Some(zc) => unsafe { zc.release(self.mp) },
            // SAFETY: our mempool, no mbuf of it left (the device closed, bursts returned theirs).
            None => unsafe { dpdk_sys::rte_mempool_free(self.mp) },
        }
    }
}

impl Port for DpdkPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_queues(&self) -> u16 {
        self.queues
    }

    fn tx_queues(&self) -> u16 {
        self.queues
    }

    fn rx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        if q >= self.queues {
            return 0;
        }
        // One poller at a time; a second one finds the lock taken and returns empty-handed.
        let Ok(_polling) = self.rx_locks[q as usize].0.try_lock() else { return 0 };
        eal::register_thread();
        let mut mbufs = [null_mut::<dpdk_sys::rte_mbuf>(); BATCH];
        let room = batch.room().min(BATCH) as u16;
        // SAFETY: our port and queue (polled by this thread alone: `rx_locks`), room for
        // `room` pointers.
        let n =
            unsafe { dpdk_sys::shim_rx_burst(self.port_id, q, mbufs.as_mut_ptr(), room) } as usize;
        let c = &self.counters[q as usize];
        if let Some(zc) = self.zc.as_ref().filter(|zc| zc.serves(cache)) {
            let got = zc.receive(
                self.mp,
                &mut mbufs[..n],
                cache,
                batch,
                |m, cache| self.receive(m, cache),
                || c.rx_dropped.add(1),
            );
            // An astray mbuf that could not be mended is kept (null): not freed.
            let mut kept = 0;
            for i in 0..n {
                if !mbufs[i].is_null() {
                    mbufs[kept] = mbufs[i];
                    kept += 1;
                }
            }
            self.free_burst(&mut mbufs[..kept]);
            c.rx_packets.add(got as u64);
            return got;
        }
        let (mut data, mut lens, mut segs) =
            ([std::ptr::null::<u8>(); BATCH], [0u16; BATCH], [0u16; BATCH]);
        if n > 0 {
            // SAFETY: the burst's `n` mbufs; the out arrays hold BATCH >= n entries.
            unsafe {
                dpdk_sys::shim_rx_views(
                    mbufs.as_ptr(),
                    n as u16,
                    data.as_mut_ptr(),
                    lens.as_mut_ptr(),
                    segs.as_mut_ptr(),
                )
            };
        }
        let mut got = 0;
        for (i, &m) in mbufs[..n].iter().enumerate() {
            let b = if segs[i] == 1
                && lens[i] as usize <= self.max_frame.max(vswitch::buf::MAX_FRAME)
            {
                // SAFETY: the only segment's data, `lens[i]` bytes inside its data room, valid
                // until the burst's mbufs are freed below.
                cache.alloc_frame(unsafe { std::slice::from_raw_parts(data[i], lens[i] as usize) })
            } else {
                self.receive(m, cache)
            };
            match b {
                Some(b) => {
                    if let Err(b) = batch.push(b) {
                        cache.free(b); // the burst asked for no more than the room: unreachable
                    } else {
                        got += 1;
                    }
                }
                None => c.rx_dropped.add(1),
            }
        }
        self.free_burst(&mut mbufs[..n]);
        c.rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let q = q % self.queues;
        let c = &self.counters[q as usize];
        let Ok(_g) = self.tx_locks[q as usize].0.try_lock() else {
            c.tx_full.add(batch.len() as u64);
            return 0;
        };
        eal::register_thread();
        let mut mbufs = [null_mut::<dpdk_sys::rte_mbuf>(); BATCH];
        let have = self.alloc_mbufs(&mut mbufs[..batch.len().min(BATCH)]);
        let sent = match self.zc.as_ref().filter(|zc| zc.serves(cache)) {
            Some(zc) => {
                let mut old = [u32::MAX; BATCH];
                let pool = zc.pool();
                let frames = &batch.as_slice()[..have];
                let k = zc
                    .lend(frames, &mut mbufs[..have], &mut old, cache, |b, m| {
                        self.transmit_copy(pool, b, m)
                    })
                    .unwrap_or_else(|| self.fill_copies(pool, frames, &mbufs[..have]));
                let sent = self.send(q, &mut mbufs[..k]);
                zc.settle(&mbufs[..k], &old, k, sent, cache, batch);
                sent
            }
            None => {
                let k = self.fill_copies(cache.pool(), &batch.as_slice()[..have], &mbufs[..have]);
                let sent = self.send(q, &mut mbufs[..k]);
                for i in 0..sent {
                    cache.free(batch.take(i));
                }
                sent
            }
        };
        for &m in mbufs[sent..have].iter().filter(|m| !m.is_null()) {
            // SAFETY: allocated above and not sent (with their own buffers, after zero copy's
            // `settle`; an astray one zero copy kept is null): freed once, with anything
            // chained.
            unsafe { dpdk_sys::shim_pktmbuf_free(m) };
        }
        batch.handed_on(sent);
        c.tx_packets.add(sent as u64);
        c.tx_full.add(batch.len() as u64);
        sent
    }

    fn link_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    fn refresh_link(&self) {
        let mut link = dpdk_sys::rte_eth_link::default();
        // SAFETY: out pointer; the nowait variant does not block.
        let ok = unsafe { dpdk_sys::rte_eth_link_get_nowait(self.port_id, &mut link) } == 0;
        self.up.store(ok && link.link_status() == dpdk_sys::RTE_ETH_LINK_UP as u16, Relaxed);
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        self.counters.iter().map(QueueCounters::read).collect()
    }

    fn mac(&self) -> Option<MacAddr> {
        self.mac
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }
}

//! The vhost-user protocol side of a port: rust-vmm's `vhost` crate parses the frontend's
//! messages; this handler turns them into the [`VhostPort`]'s device state (memory table,
//! rings, enabled queues, interrupt descriptors). The PMD threads never see a message: they
//! poll the rings the last message set up.
//!
//! What is offered: `VERSION_1`, `RING_PACKED` (split or packed virtqueues, as the frontend
//! asks), `MRG_RXBUF`, `EVENT_IDX`, `INDIRECT_DESC`, `IN_ORDER`, `CTRL_VQ` and
//! `MQ` ([`MAX_PAIRS`] queue pairs; the frontend owns the control queue and enables rings
//! with SET_VRING_ENABLE), `MTU` and `GUEST_ANNOUNCE` (both the frontend's: it keeps the
//! config space and asks the guest to announce itself) and `VHOST_USER_F_PROTOCOL_FEATURES`
//! (rings then start disabled until SET_VRING_ENABLE), with the protocol features `MQ`,
//! `REPLY_ACK`, `NET_MTU` (NET_SET_MTU: recorded, refused above the port's longest frame)
//! and `RARP` (SEND_RARP: a RARP frame from the guest's MAC goes into its bridge domain).
//! rust-vmm's handler does not know the last two messages; [`serve_connection`] reads them
//! itself. Not offered (not built yet): offloads, inflight descriptors, dirty logging.
//!
//! [`serve`] runs the server side of a unix socket (the frontend connects, as QEMU with
//! `server=off` or DPDK's virtio-user do), one connection at a time, and takes the next when
//! one ends (a frontend that restarts reconnects; its rings restart from its avail index).
//! [`connect`] is client mode (the frontend listens, as QEMU with `server=on`): it connects,
//! and connects again after the connection ends, so the switch may restart too.

use crate::eventfd::EventFd;
use crate::memory::{GuestMemory, Mapping};
use crate::packed::PackedQueue;
use crate::port::{MAX_PAIRS, RXQ, TXQ, VhostPort};
use crate::queue::{self, Virtqueue};
use crate::vring::SplitQueue;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vhost::VhostUserMemoryRegionBase;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    BackendReqHandler, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut,
};

pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
const VIRTIO_NET_F_MTU: u64 = 1 << 3;
const VIRTIO_NET_F_CTRL_VQ: u64 = 1 << 17;
const VIRTIO_NET_F_GUEST_ANNOUNCE: u64 = 1 << 21;
const VIRTIO_NET_F_MQ: u64 = 1 << 22;
/// Buffers are used in the order they were made available. The port always does so (one
/// thread per ring at a time, chains taken and returned in ring order, a refused chain
/// returned in its place with length 0); offering it lets DPDK's virtio-user take its
/// in-order paths, which read descriptors and used entries by position.
const VIRTIO_F_IN_ORDER: u64 = 1 << 35;
/// Packed virtqueues (virtio 1.1): what DPDK's virtio-user asks for with `packed_vq=1`.
pub const VIRTIO_F_RING_PACKED: u64 = 1 << 34;
/// Virtqueues of the data path (two per pair; the control queue stays with the frontend).
const VQS: usize = 2 * MAX_PAIRS;
/// The features this device offers.
pub const FEATURES: u64 = VIRTIO_F_VERSION_1
    | VIRTIO_NET_F_MRG_RXBUF
    | VIRTIO_NET_F_MTU
    | VIRTIO_NET_F_CTRL_VQ
    | VIRTIO_NET_F_GUEST_ANNOUNCE
    | VIRTIO_NET_F_MQ
    | VIRTIO_RING_F_INDIRECT_DESC
    | VIRTIO_RING_F_EVENT_IDX
    | VIRTIO_F_IN_ORDER
    | VIRTIO_F_RING_PACKED
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// Largest queue accepted: what the virtio spec allows a split ring (DPDK's vhost library
/// and OVS accept as much; VNFs set 1,024 to 4,096 and more to absorb bursts).
pub const MAX_QUEUE: u32 = crate::vring::MAX_QUEUE_SIZE as u32;
/// Regions a memory table may have: the vhost-user specification's
/// `VHOST_MEMORY_BASELINE_NREGIONS`, what QEMU and DPDK send at most.
pub const MAX_REGIONS: usize = 8;
/// The guest memory one frontend may map when the node sets no limit (see
/// [`set_max_guest_memory`]).
pub const DEFAULT_MAX_GUEST_MEMORY: u64 = 4 << 30;
static MAX_GUEST_MEMORY: AtomicU64 = AtomicU64::new(DEFAULT_MAX_GUEST_MEMORY);

/// Sets the most guest memory (the sum of a memory table's regions) one frontend may map:
/// the node's `[vhost] max_guest_memory_mib`. Pages of it that the switch touches before the
/// guest did are charged to the switch (docs/architecture/vhost-user.md "What a frontend
/// controls").
pub fn set_max_guest_memory(bytes: u64) {
    MAX_GUEST_MEMORY.store(bytes, Ordering::Relaxed);
}

/// How long a frontend may take to send the rest of a message it began.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(1);
/// How long stopping a server waits for its thread (which a stop wakes at once: this
/// bounds only what no frontend should be able to cause).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A ring as the frontend described it so far.
#[derive(Debug, Default, Clone, Copy)]
struct VringConfig {
    num: u32,
    /// Frontend virtual addresses of the descriptor table, used and available rings.
    addrs: Option<(u64, u64, u64)>,
    base: u16,
    /// SET_VRING_BASE was sent since the ring last ran: start from `base`.
    fresh_base: bool,
    kicked: bool,
    enabled: bool,
}

/// One connection's protocol state.
pub struct NetBackend {
    port: Arc<VhostPort>,
    owned: bool,
    acked: u64,
    protocol: u64,
    memory: Option<Arc<GuestMemory>>,
    vrings: [VringConfig; VQS],
}

impl NetBackend {
    pub fn new(port: Arc<VhostPort>) -> NetBackend {
        NetBackend {
            port,
            owned: false,
            acked: 0,
            protocol: 0,
            memory: None,
            vrings: [VringConfig::default(); VQS],
        }
    }

    fn vring(&mut self, index: u32) -> Result<&mut VringConfig> {
        self.vrings.get_mut(index as usize).ok_or(Error::InvalidParam)
    }

    /// Rebuilds ring `i` in the port from its configuration: running only when complete,
    /// kicked (started) and enabled; otherwise stopped. A ring rebuilt while it ran (a new
    /// memory table, say) continues where the device got to; a ring stopped remembers that
    /// place for GET_VRING_BASE; only SET_VRING_BASE moves it.
    fn apply(&mut self, i: usize) -> Result<()> {
        let c = self.vrings[i];
        tracing::debug!(port = %port_name(&self.port), ring = i, num = c.num, addrs = c.addrs.is_some(), kicked = c.kicked, enabled = c.enabled, memory = self.memory.is_some(), "ring state");
        let features = (
            self.acked & VIRTIO_RING_F_EVENT_IDX != 0,
            self.acked & VIRTIO_RING_F_INDIRECT_DESC != 0,
        );
        let packed = self.acked & VIRTIO_F_RING_PACKED != 0;
        let in_order = self.acked & VIRTIO_F_IN_ORDER != 0;
        let mem = self.memory.clone();
        let run = c.kicked && c.enabled;
        let (place, started, result) = self.port.configure(|d| {
            d.set_memory(mem.clone());
            let Some(pair) = d.pair_of(i) else { return (c.base, false, Err(Error::InvalidParam)) };
            let old = pair.queues[i % 2].take().or_else(|| pair.parked[i % 2].take());
            let progress = old.as_ref().map(|q| q.next_avail());
            let base = if c.fresh_base { c.base } else { progress.unwrap_or(c.base) };
            // A ring set up afresh whose driver ran it before: a base other than 0 (QEMU
            // gives back what GET_VRING_BASE said), or used entries the base does not know.
            let mut resumed = c.fresh_base && base != queue::fresh_base(packed);
            let queue = match (&mem, c.addrs) {
                (Some(mem), Some((desc, used, avail))) if run => (|| {
                    let g = |a| mem.guest_of_user(a).ok_or(Error::InvalidParam);
                    // A packed ring's "available" and "used" addresses are the driver's and the
                    // device's event-suppression areas.
                    let refused = |e| {
                        // Said where the user looks (a size SET_VRING_NUM took before the
                        // features said the rings are split, say).
                        self.port.fault(format!("ring {i}: {e}"));
                        Error::InvalidParam
                    };
                    let mut q: Virtqueue = if packed {
                        PackedQueue::new(c.num as u16, g(desc)?, g(avail)?, g(used)?, base).map_err(refused)?.into()
                    } else {
                        SplitQueue::new(c.num as u16, g(desc)?, g(avail)?, g(used)?, base).map_err(refused)?.into()
                    };
                    q.set_features(features.0, features.1);
                    q.set_in_order(in_order);
                    // What the running rings do, for `VhostPort::rings` (features acked
                    // later reach them only when they are set up again).
                    self.port.set_in_order(in_order);
                    // The same ring rebuilt while it ran: what the device took and has not
                    // returned yet (a burst's lent descriptors) goes back in its place.
                    if let (false, Some(old)) = (c.fresh_base, &old) {
                        q.continue_from(old);
                    }
                    if c.fresh_base && let Some(at) = q.resume_from_used(mem).map_err(|_| Error::InvalidParam)? {
                        tracing::warn!(port = %port_name(&self.port), ring = i, base, resumed = at, "ring base and used index disagree: resuming from the used index");
                        resumed = true;
                    }
                    Ok(Some(q))
                })(),
                _ => Ok(None),
            };
            let started = matches!(queue, Ok(Some(_)));
            // Disabled while it ran: parked, to go on from its place when enabled again
            // (stopped, or set up afresh, it is dropped).
            if c.kicked && !c.enabled && !c.fresh_base && matches!(queue, Ok(None)) {
                pair.parked[i % 2] = old;
            }
            pair.kicks_on |= i % 2 == TXQ && started;
            let result = match queue {
                Ok(q) => {
                    pair.queues[i % 2] = q;
                    Ok(())
                }
                Err(e) => Err(e),
            };
            // Readiness is decided when a receive ring starts afresh; a ring rebuilt
            // while it ran (a new memory table) or enabled again keeps it.
            if started && c.fresh_base && i % 2 == RXQ {
                d.rx_started(i / 2, resumed);
            }
            (base, started, result)
        });
        self.vrings[i].base = place;
        // A base set before the ring starts waits for the start (it is checked then).
        self.vrings[i].fresh_base &= !started;
        result
    }

    fn stop_all(&mut self) {
        for i in 0..VQS {
            self.vrings[i].kicked = false;
            let _ = self.apply(i);
        }
    }

    /// A kick or call descriptor of ring `index` if it is an eventfd (made non-blocking);
    /// anything else puts the port in error and is refused.
    fn frontend_eventfd(
        &self,
        fd: Option<File>,
        role: &str,
        index: u8,
    ) -> Result<Option<Arc<EventFd>>> {
        let Some(fd) = fd else { return Ok(None) };
        match EventFd::from_frontend(OwnedFd::from(fd)) {
            Ok(e) => Ok(Some(Arc::new(e))),
            Err(e) => {
                let why = format!("virtqueue {index}: the {role} descriptor is refused: {e}");
                self.port.fault(why.clone());
                Err(Error::ReqHandlerError(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    why,
                )))
            }
        }
    }

    /// The frontend is gone: rings stop and the port lets go of its memory and eventfds
    /// (nothing of a dead frontend stays mapped or open until the next one comes).
    fn disconnected(&mut self) {
        self.stop_all();
        self.memory = None;
        self.port.set_in_order(false);
        self.port.configure(|d| {
            d.set_memory(None);
            d.forget_frontend();
            for p in &mut d.pairs {
                (p.call, p.kick) = Default::default();
            }
        });
    }
}

impl VhostUserBackendReqHandlerMut for NetBackend {
    fn set_owner(&mut self) -> Result<()> {
        if self.owned {
            return Err(Error::InvalidOperation("already owned"));
        }
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.owned = false;
        self.stop_all();
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        self.stop_all();
        self.vrings = [VringConfig::default(); VQS];
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(FEATURES)
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        tracing::debug!(port = %port_name(&self.port), features = format!("{features:#x}"), "SET_FEATURES");
        if features & !FEATURES != 0 {
            return Err(Error::InvalidParam);
        }
        // The ring layout cannot change under running rings (their places would be read in
        // the other layout's encoding).
        if (features ^ self.acked) & VIRTIO_F_RING_PACKED != 0
            && self.vrings.iter().any(|v| v.kicked)
        {
            return Err(Error::InvalidParam);
        }
        self.acked = features;
        self.port.configure(|d| d.set_mrg_rxbuf(features & VIRTIO_NET_F_MRG_RXBUF != 0));
        // Without protocol features a ring is enabled as soon as it is started; with them,
        // SET_VRING_ENABLE decides (and may have come before this message).
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
            for v in &mut self.vrings {
                v.enabled = true;
            }
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        if ctx.len() != files.len() {
            return Err(Error::InvalidParam);
        }
        let refuse = |port: &VhostPort, why: String| {
            port.fault(format!("memory table refused: {why}"));
            Error::ReqHandlerError(std::io::Error::new(std::io::ErrorKind::InvalidInput, why))
        };
        if ctx.len() > MAX_REGIONS {
            return Err(refuse(
                &self.port,
                format!("{} regions; at most {MAX_REGIONS}", ctx.len()),
            ));
        }
        let total =
            ctx.iter().try_fold(0u64, |t, r| t.checked_add(r.memory_size)).unwrap_or(u64::MAX);
        let limit = MAX_GUEST_MEMORY.load(Ordering::Relaxed);
        if total > limit {
            return Err(refuse(
                &self.port,
                format!(
                    "{total} bytes of guest memory; this node maps at most {limit} a frontend ([vhost] max_guest_memory_mib)"
                ),
            ));
        }
        let mut regions = Vec::new();
        for (r, f) in ctx.iter().zip(&files) {
            let len = usize::try_from(r.memory_size).map_err(|_| Error::InvalidParam)?;
            let map = Mapping::shared(f.as_fd(), r.mmap_offset, len)
                .map_err(|e| refuse(&self.port, e.to_string()))?;
            regions.push((r.guest_phys_addr, r.user_addr, map));
        }
        let table = GuestMemory::new(regions).map_err(|e| refuse(&self.port, e.to_string()))?;
        self.memory = Some(Arc::new(table));
        for i in 0..VQS {
            self.apply(i)?;
        }
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        // Packed rings may have any size (features come before the rings' sizes).
        let packed = self.acked & VIRTIO_F_RING_PACKED != 0;
        if num == 0 || num > MAX_QUEUE || !(num.is_power_of_two() || packed) {
            // Said where the user looks (the port's status), not only in the daemon's log:
            // the frontend's driver may carry on with its link up and nothing moving.
            let sizes = if packed { "up to" } else { "a power of two up to" };
            self.port.fault(format!("ring {index}: {num} entries refused ({sizes} {MAX_QUEUE})"));
            return Err(Error::InvalidParam);
        }
        self.vring(index)?.num = num;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        self.vring(index)?.addrs = Some((descriptor, used, available));
        self.apply(index as usize)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        let v = self.vring(index)?;
        (v.base, v.fresh_base) = (base as u16, true);
        self.apply(index as usize)
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        // The frontend stops the ring this way.
        self.vring(index)?.kicked = false;
        self.apply(index as usize)?;
        Ok(VhostUserVringState::new(index, self.vrings[index as usize].base as u32))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        // Polled: kicks only wake a sleeping PMD thread; this message starts the ring.
        self.vring(index as u32)?;
        let fd = self.frontend_eventfd(fd, "kick", index)?;
        self.vring(index as u32)?.kicked = true;
        self.port.configure(|d| d.pair_of(index as usize).map(|p| p.kick[index as usize % 2] = fd));
        self.apply(index as usize)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.vring(index as u32)?;
        let fd = self.frontend_eventfd(fd, "interrupt (call)", index)?;
        self.port.configure(|d| d.pair_of(index as usize).map(|p| p.call[index as usize % 2] = fd));
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> Result<()> {
        self.vring(index as u32).map(drop)
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::MTU
            | VhostUserProtocolFeatures::RARP)
    }

    fn set_protocol_features(&mut self, features: u64) -> Result<()> {
        self.protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(MAX_PAIRS as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        self.vring(index)?.enabled = enable;
        self.apply(index as usize)
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>> {
        Err(Error::InvalidOperation("no config space"))
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> Result<()> {
        Err(Error::InvalidOperation("no config space"))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        Err(Error::InvalidOperation("not a GPU"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        Err(Error::InvalidOperation("no shared objects"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File)> {
        Err(Error::InvalidOperation("no inflight descriptors"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> Result<()> {
        Err(Error::InvalidOperation("no inflight descriptors"))
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        Err(Error::InvalidOperation("no memory slots"))
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        Err(Error::InvalidOperation("no memory slots"))
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        Err(Error::InvalidOperation("no memory slots"))
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        Err(Error::InvalidOperation("no device state transfer"))
    }

    fn check_device_state(&mut self) -> Result<()> {
        Err(Error::InvalidOperation("no device state transfer"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        Err(Error::InvalidOperation("no shared memory"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> Result<()> {
        Err(Error::InvalidOperation("no dirty logging"))
    }
}

/// The server thread of one port's socket; stops (and closes the connection) on drop,
/// without waiting on the frontend: the connection is shut down first, which ends any read
/// or write on it at once.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The socket this server listens on, removed when it stops (server mode only).
    listening: Option<std::path::PathBuf>,
    /// The connection being served, if any (see [`Connection`]).
    connection: Arc<Connection>,
}

/// The descriptor of the connection a server thread serves, for a stop to shut it down. The
/// thread clears it under the lock before it closes the connection, so a stop never shuts
/// down a descriptor number that was closed and reused.
#[derive(Default)]
struct Connection {
    fd: Mutex<Option<libc::c_int>>,
    /// The thread has ended.
    ended: AtomicBool,
}

impl Connection {
    fn set(&self, fd: Option<libc::c_int>) {
        *self.fd.lock().unwrap_or_else(|e| e.into_inner()) = fd;
    }

    fn shut_down(&self) {
        if let Some(fd) = *self.fd.lock().unwrap_or_else(|e| e.into_inner()) {
            // SAFETY: shutdown of the connection's descriptor, open while it is recorded.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }
}

pub use crate::socket::SocketPerms;

/// The longest path a unix socket address holds (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Refuses a socket path the kernel cannot hold, saying so (the kernel's own error is a
/// bare "invalid argument"): for a path a frontend connects to as it is (the switch itself
/// reaches its sockets through their directory's descriptor, whatever the path's length).
pub fn check_socket_path(path: &Path) -> std::io::Result<()> {
    let n = path.as_os_str().len();
    if n > MAX_SOCKET_PATH {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "vhost-user socket path {} is {n} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Listens on `path` (replacing a stale socket) and serves one frontend at a time for `port`
/// (server mode: QEMU's `server=off`, DPDK's virtio-user).
pub fn serve(path: &Path, port: Arc<VhostPort>) -> std::io::Result<Server> {
    serve_with(path, port, SocketPerms::default())
}

/// [`serve`] with the socket's mode and owner set (on the socket itself: a symlink the pod
/// put in its place is replaced, never followed; see `socket.rs`).
pub fn serve_with(
    path: &Path,
    port: Arc<VhostPort>,
    perms: SocketPerms,
) -> std::io::Result<Server> {
    let listener = crate::socket::listen(path, perms)?;
    listener.set_nonblocking(true)?;
    let mut server = spawn(port, ACCEPT_POLL, move |name| match listener.accept() {
        Ok((s, _)) => Some(s),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::WouldBlock {
                tracing::warn!(port = %name, error = %e, "vhost-user accept failed");
            }
            None
        }
    })?;
    server.listening = Some(path.to_path_buf());
    Ok(server)
}

/// Connects to a frontend listening on `path` (client mode: QEMU's `server=on`, OVS's
/// `dpdkvhostuserclient`), and connects again whenever the connection ends, so either side
/// may restart. Tries again after 20 ms, doubling up to a second while nobody listens. A
/// symlink at `path` is not connected through (see `socket.rs`).
pub fn connect(path: &Path, port: Arc<VhostPort>) -> std::io::Result<Server> {
    let path = path.to_path_buf();
    spawn(port, CONNECT_BACKOFF, move |name| match crate::socket::connect(&path) {
        Ok(s) => Some(s),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound
                && e.kind() != std::io::ErrorKind::ConnectionRefused
                && let Some(suppressed) = CONNECT_LOG.allow()
            {
                tracing::warn!(port = %name, path = %path.display(), error = %e, suppressed, "vhost-user connect failed");
            }
            None
        }
    })
}

/// Connect failures worth a line (a symlink, a timeout), across ports.
static CONNECT_LOG: crate::ratelimit::LogLimit = crate::ratelimit::LogLimit::new();

/// How long a server thread waits between accepts that found nobody.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// The longest a client waits between attempts (from 20 ms, doubling).
const CONNECT_BACKOFF: Duration = Duration::from_secs(1);
/// How long a frontend put in error waits before the next connection is served.
const FAULT_BACKOFF: Duration = Duration::from_secs(1);

/// The connection thread: `next` yields a connection to serve (or none yet, tried again
/// shortly); each is served until it ends, then the port's rings stop.
/// Waits between fruitless tries start at 20 ms and double up to `max_wait`.
fn spawn(
    port: Arc<VhostPort>,
    max_wait: Duration,
    mut next: impl FnMut(&str) -> Option<UnixStream> + Send + 'static,
) -> std::io::Result<Server> {
    let stop = Arc::new(AtomicBool::new(false));
    let connection = Arc::new(Connection::default());
    let (flag, conn) = (stop.clone(), connection.clone());
    let name = port_name(&port);
    let thread = std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || {
        let mut wait = ACCEPT_POLL;
        while !flag.load(Ordering::Acquire) {
            let Some(stream) = next(&name) else {
                // In steps of at most 20 ms, so a stop is seen promptly.
                let until = std::time::Instant::now() + wait;
                while std::time::Instant::now() < until && !flag.load(Ordering::Acquire) {
                    std::thread::sleep(
                        ACCEPT_POLL.min(until.saturating_duration_since(std::time::Instant::now())),
                    );
                }
                wait = (wait * 2).min(max_wait);
                continue;
            };
            wait = ACCEPT_POLL;
            serve_connection(stream, &port, &flag, &name, &conn);
            // A frontend put in error waits before it is served again: one that reconnects
            // to repeat what got it cut off does so at most once a second.
            if port.faulted() {
                let until = std::time::Instant::now() + FAULT_BACKOFF;
                while std::time::Instant::now() < until && !flag.load(Ordering::Acquire) {
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
        }
        conn.ended.store(true, Ordering::Release);
    })?;
    Ok(Server { stop, thread: Some(thread), listening: None, connection })
}

/// Handles one frontend's messages until it goes away or the server stops. The socket is
/// polled (100 ms) between messages so a stop is seen; a message is handed to the handler
/// only once all of it is there (its first bytes, then the rest within
/// [`MESSAGE_DEADLINE`]), so no read of the handler's can wait on the frontend. A frontend
/// that sends part of a message and stops is put in error and disconnected.
fn serve_connection(
    stream: UnixStream,
    port: &Arc<VhostPort>,
    stop: &AtomicBool,
    name: &str,
    conn: &Connection,
) {
    let _ = stream.set_nonblocking(false);
    // Replies to a frontend that does not read them: the write gives up after a while (a
    // stop ends it at once).
    let _ = stream.set_write_timeout(Some(MESSAGE_DEADLINE));
    let fd = stream.as_raw_fd();
    conn.set(Some(fd));
    port.clear_fault();
    if let Some(suppressed) = port.conn_log.allow() {
        tracing::info!(port = %name, suppressed, "vhost-user frontend connected");
    }
    let backend = Arc::new(Mutex::new(NetBackend::new(port.clone())));
    let mut handler = BackendReqHandler::from_stream(stream, backend.clone());
    while !stop.load(Ordering::Acquire) {
        if !wait_for_message(fd, port) {
            continue;
        }
        match whole_message(fd, stop) {
            Ok(true) => {}
            Ok(false) => break, // stopping
            Err(why) => {
                port.fault(why);
                break;
            }
        }
        match net_request(fd, &backend, port) {
            Some(Ok(())) => continue,
            Some(Err(e)) => {
                if let Some(suppressed) = port.conn_log.allow() {
                    tracing::info!(port = %name, error = %e, suppressed, "vhost-user frontend gone");
                }
                break;
            }
            None => {}
        }
        match handler.handle_request() {
            Ok(()) => {}
            Err(Error::SocketRetry(_)) => {}
            Err(e) if refused_request(&e) => {
                // The message was read whole (and answered, if the frontend asked): the
                // connection goes on. DPDK's virtio-user, reconnecting, stops its old rings
                // before it negotiates anything, for one.
                tracing::debug!(port = %name, error = %e, "vhost-user request refused");
            }
            Err(e) => {
                if let Some(suppressed) = port.conn_log.allow() {
                    tracing::info!(port = %name, error = %e, suppressed, "vhost-user frontend gone");
                }
                break;
            }
        }
    }
    backend.lock().unwrap_or_else(|e| e.into_inner()).disconnected();
    // Forgotten before it closes (see `Connection`).
    let mut recorded = conn.fd.lock().unwrap_or_else(|e| e.into_inner());
    *recorded = None;
    drop(handler);
    drop(recorded);
}

/// Serves one connected frontend on the calling thread until it goes (fuzzing and tests:
/// the frontend's messages are written first and its socket shut down, and this reads them
/// all).
#[cfg(any(test, feature = "testkit"))]
pub fn serve_stream(stream: UnixStream, port: &Arc<VhostPort>) {
    serve_connection(stream, port, &AtomicBool::new(false), "fuzz", &Connection::default());
}

/// The header every vhost-user message starts with: request, flags, body size.
const HEADER: usize = 12;

/// Waits until the message whose first bytes are on `fd` is there whole (header and body:
/// the bytes queued on the socket, `FIONREAD`), for at most [`MESSAGE_DEADLINE`]. `Ok(false)`
/// when the server stops meanwhile; an error (why, in words) when the frontend sent part of
/// a message and no more.
fn whole_message(fd: libc::c_int, stop: &AtomicBool) -> std::result::Result<bool, String> {
    let deadline = std::time::Instant::now() + MESSAGE_DEADLINE;
    let mut hdr = [0u8; HEADER];
    loop {
        // SAFETY: a peek into our 12-byte buffer from the connection's descriptor.
        let n = unsafe {
            libc::recv(fd, hdr.as_mut_ptr().cast(), HEADER, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes the bytes queued on the socket into our c_int.
        let q = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) };
        if n == 0 || q < 0 {
            return Ok(true); // gone: the handler reads the end and says so
        }
        if n == HEADER as isize {
            let size = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
            // An oversized body is the handler's to refuse, from the header alone.
            if size > vhost::vhost_user::message::MAX_MSG_SIZE || queued as usize >= HEADER + size {
                return Ok(true);
            }
        }
        if stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut p = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: poll of one pollfd, without waiting.
        let closed = unsafe { libc::poll(&mut p, 1, 0) } > 0
            && p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0;
        if closed {
            return Err(format!(
                "the frontend closed its socket {} bytes into a message",
                queued.max(0)
            ));
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the frontend sent {} bytes of a message and nothing more for {MESSAGE_DEADLINE:?}",
                queued.max(0)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits up to 100 ms for the frontend's next message, and meanwhile for the first kick of
/// every receive ring that is not ready yet (see `Pair::rx_ready`), which it reports to the
/// port; true when a message is there. Only this thread changes kick descriptors (on
/// SET_VRING_KICK and when the frontend goes), so those it polls stay open meanwhile.
fn wait_for_message(fd: libc::c_int, port: &VhostPort) -> bool {
    let unready = port.unready_rx();
    let mut fds = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }; 1 + MAX_PAIRS];
    let mut pairs = [0usize; 1 + MAX_PAIRS];
    let mut n = 1;
    for (pair, kick) in &unready {
        if let Some(k) = kick
            && n < fds.len()
        {
            (fds[n].fd, pairs[n]) = (*k, *pair);
            n += 1;
        }
    }
    // SAFETY: `n` pollfds of our array, on the connection's descriptor (which the caller's
    // handler keeps open) and on kick eventfds the port keeps open (see above).
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, 100) };
    for (p, pair) in fds[1..n].iter().zip(&pairs[1..n]) {
        if p.revents & libc::POLLIN != 0 {
            // A port whose frontend once stalled the switch on an eventfd has its kicks seen
            // (poll never waits longer than asked) but not read.
            if !port.distrusted()
                && crate::eventfd::drain_raw(p.fd) == crate::eventfd::Outcome::Stalled
            {
                port.stalled("a kick descriptor");
            }
            port.rx_kicked(*pair);
        }
    }
    if !unready.is_empty() {
        port.rx_ready_after_grace(std::time::Instant::now());
    }
    ready > 0 && fds[0].revents != 0
}

const SET_VRING_ENABLE: u32 = 18;
const SEND_RARP: u32 = 19;
const NET_SET_MTU: u32 = 20;
/// Header flags: protocol version 1, a reply, and "reply wanted" (REPLY_ACK).
const VERSION_1: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;

/// Handles the next message on `fd` if it is one rust-vmm's handler does not know
/// (SEND_RARP, NET_SET_MTU) or handles too strictly (SET_VRING_ENABLE, which it refuses
/// before SET_FEATURES while QEMU sends it right after the protocol features are agreed,
/// as the specification allows) — each a 12-byte header and 8 bytes; `None` leaves the
/// message to the handler. SEND_RARP and NET_SET_MTU are refused unless their protocol
/// feature was acknowledged; every one is answered when the frontend asks.
fn net_request(
    fd: libc::c_int,
    backend: &Mutex<NetBackend>,
    port: &VhostPort,
) -> Option<std::io::Result<()>> {
    let mut hdr = [0u8; 12];
    // SAFETY: a peek into our 12-byte buffer from the connection's descriptor.
    let n = unsafe {
        libc::recv(fd, hdr.as_mut_ptr().cast(), hdr.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if n != hdr.len() as isize {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let (request, flags, size) = (word(0), word(4), word(8));
    tracing::trace!(port = %port_name(port), request, flags, size, "vhost-user message");
    let feature = match request {
        SEND_RARP => VhostUserProtocolFeatures::RARP,
        NET_SET_MTU => VhostUserProtocolFeatures::MTU,
        SET_VRING_ENABLE => VhostUserProtocolFeatures::empty(),
        _ => return None,
    };
    if size != 8 {
        return Some(Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("request {request} with a {size}-byte body"),
        )));
    }
    let mut msg = [0u8; 20];
    if let Err(e) = read_whole(fd, &mut msg) {
        return Some(Err(e));
    }
    let value = u64::from_le_bytes(msg[12..20].try_into().unwrap_or([0; 8]));
    let mut backend = backend.lock().unwrap_or_else(|e| e.into_inner());
    let acked = backend.protocol & feature.bits() == feature.bits();
    let ok = acked
        && match request {
            SEND_RARP => {
                let b = value.to_le_bytes();
                port.announce(vswitch::wire::MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]]));
                true
            }
            NET_SET_MTU => port.set_guest_mtu(value).is_ok(),
            // A vring state: index, then 0 (disable) or 1 (enable).
            _ => {
                let (index, state) = (value as u32, (value >> 32) as u32);
                state <= 1 && backend.set_vring_enable(index, state == 1).is_ok()
            }
        };
    drop(backend);
    if !ok && let Some(suppressed) = port.conn_log.allow() {
        tracing::warn!(port = %port_name(port), request, value, acked, suppressed, "vhost-user request refused");
    }
    if flags & NEED_REPLY != 0 {
        let mut reply = [0u8; 20];
        reply[..4].copy_from_slice(&request.to_le_bytes());
        reply[4..8].copy_from_slice(&(VERSION_1 | REPLY).to_le_bytes());
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        reply[12..].copy_from_slice(&u64::from(!ok).to_le_bytes());
        // SAFETY: a send of our 20-byte buffer on the connection's descriptor.
        let sent =
            unsafe { libc::send(fd, reply.as_ptr().cast(), reply.len(), libc::MSG_NOSIGNAL) };
        if sent != reply.len() as isize {
            return Some(Err(std::io::Error::last_os_error()));
        }
    }
    Some(Ok(()))
}

/// Reads exactly `buf.len()` bytes (the socket is blocking).
fn read_whole(fd: libc::c_int, buf: &mut [u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: a read into the unread part of `buf`.
        let n = unsafe { libc::recv(fd, buf[at..].as_mut_ptr().cast(), buf.len() - at, 0) };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => at += n as usize,
        }
    }
    Ok(())
}

/// Errors about one request (its content, or the state it came in), after which the stream
/// is still in step; the others (socket, framing) end the connection.
fn refused_request(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidParam
            | Error::InvalidOperation(_)
            | Error::InactiveFeature(_)
            | Error::InactiveOperation(_)
            | Error::FeatureMismatch
            | Error::ReqHandlerError(_)
            | Error::IncorrectFds
    )
}

fn port_name(p: &VhostPort) -> String {
    use vswitch::port::Port;
    p.name().to_string()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Ends a read or write on the connection at once, whatever the frontend does.
        self.connection.shut_down();
        if let Some(p) = self.listening.take() {
            crate::socket::remove(&p);
        }
        let Some(t) = self.thread.take() else { return };
        let until = std::time::Instant::now() + STOP_WAIT;
        while !self.connection.ended.load(Ordering::Acquire) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.connection.ended.load(Ordering::Acquire) {
            let _ = t.join();
        } else {
            // Never seen: a thread the shutdown did not wake is left to end on its own.
            tracing::warn!(port = %t.thread().name().unwrap_or("?"), "vhost-user thread did not stop in {STOP_WAIT:?}; left behind");
        }
    }
}

//! An AF_XDP socket bound to one queue of a device, its rings mapped (the socket calls
//! around [`super::ring`]'s mappings), the transmit kick, and which mode the driver chose.

use super::ring::{
    AF_XDP, MmapOffsets, PGOFF_COMPLETION, PGOFF_FILL, PGOFF_RX, PGOFF_TX, Ring, SOL_XDP,
    SockaddrXdp, UmemReg, XDP_MMAP_OFFSETS, XDP_OPTIONS, XDP_OPTIONS_ZEROCOPY, XDP_RX_RING,
    XDP_TX_RING, XDP_UMEM_COMPLETION_RING, XDP_UMEM_FILL_RING, XDP_UMEM_REG, XDP_USE_NEED_WAKEUP,
    XDP_USE_SG,
};
use super::{Binding, RING};
use plumbing::sys::{check, setopt};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::*;
use vswitch::buf::{BUF_SIZE, Pool};

/// Sockets per port at most (a NIC with more queues gets its first 64 read).
pub(super) const MAX_QUEUES: u32 = 64;

/// A socket bound to one queue, its rings mapped, before any buffer is lent.
pub(super) struct Bound {
    pub(super) sock: OwnedFd,
    pub(super) rx: Ring,
    pub(super) tx: Ring,
    pub(super) fill: Ring,
    pub(super) comp: Ring,
    pub(super) binding: Binding,
}

impl Bound {
    /// Creates an AF_XDP socket over `pool`'s region and binds it to queue `queue` of
    /// `ifindex`: zero-copy where the driver has it, with `need_wakeup` where the kernel has it.
    pub(super) fn new(ifindex: u32, queue: u32, pool: &Pool) -> io::Result<Bound> {
        // SAFETY: plain socket creation, checked.
        let sock = unsafe {
            OwnedFd::from_raw_fd(check(libc::socket(
                AF_XDP,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                0,
            ))?)
        };
        let fd = sock.as_raw_fd();
        let (addr, len) = pool.region();
        setopt(
            fd,
            SOL_XDP,
            XDP_UMEM_REG,
            &UmemReg {
                addr: addr as u64,
                len: len as u64,
                chunk_size: BUF_SIZE as u32,
                headroom: 0,
            },
        )?;
        for opt in [XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING, XDP_TX_RING] {
            setopt(fd, SOL_XDP, opt, &RING)?;
        }
        let mut off = MmapOffsets::default();
        let mut olen = std::mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `olen` bytes into `off`.
        check(unsafe {
            libc::getsockopt(
                fd,
                SOL_XDP,
                XDP_MMAP_OFFSETS,
                (&mut off as *mut MmapOffsets).cast(),
                &mut olen,
            )
        })?;
        // Older kernels report offsets without the flags words.
        let with_flags = olen as usize == std::mem::size_of::<MmapOffsets>();
        let rx = Ring::map(fd, &off.rx, PGOFF_RX, 16, with_flags)?;
        let tx = Ring::map(fd, &off.tx, PGOFF_TX, 16, with_flags)?;
        let fill = Ring::map(fd, &off.fr, PGOFF_FILL, 8, with_flags)?;
        let comp = Ring::map(fd, &off.cr, PGOFF_COMPLETION, 8, with_flags)?;
        // No mode forced: zero-copy where the driver has it, copy otherwise.
        let mut sa = SockaddrXdp {
            family: AF_XDP as u16,
            flags: XDP_USE_NEED_WAKEUP | XDP_USE_SG,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // A previous socket on this queue may still be tearing down: retry EBUSY briefly.
        let mut tries = 0;
        loop {
            // SAFETY: binds to a sockaddr_xdp we own, with its size.
            let r = unsafe {
                libc::bind(
                    fd,
                    (&sa as *const SockaddrXdp).cast(),
                    std::mem::size_of::<SockaddrXdp>() as u32,
                )
            };
            match check(r) {
                Ok(_) => break,
                // A kernel (or zero-copy driver) without multi-buffer refuses it: one buffer
                // per frame there. A kernel without need_wakeup: kick every burst there.
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
                        && sa.flags & XDP_USE_SG != 0 =>
                {
                    sa.flags &= !XDP_USE_SG;
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        && sa.flags & XDP_USE_NEED_WAKEUP != 0 =>
                {
                    sa.flags &= !XDP_USE_NEED_WAKEUP;
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10 << tries.min(4)));
                }
                Err(e) => return Err(e),
            }
        }
        let binding = Binding {
            zero_copy: zero_copy(fd),
            need_wakeup: sa.flags & XDP_USE_NEED_WAKEUP != 0,
            multi_buffer: sa.flags & XDP_USE_SG != 0,
        };
        Ok(Bound { sock, rx, tx, fill, comp, binding })
    }
}

/// At most this many `sendto` kicks per burst: enough for a burst of jumbo frames in pieces
/// (32 × 8 descriptors at 32 a kick), few enough that a device answering "busy" is not
/// spun on.
const MAX_KICKS: u32 = 8;

/// Makes the kernel transmit what the tx ring holds. In copy mode it sends only inside
/// `sendto`, at most 32 descriptors a call (`TX_BATCH_SIZE`), answering `EAGAIN` when it
/// stops with descriptors left; kicked again then, while the ring still holds some.
pub(super) fn kick_tx(fd: RawFd, tx: &Ring) {
    for _ in 0..MAX_KICKS {
        // SAFETY: sendto with no data on our own socket.
        let r = unsafe {
            libc::sendto(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0)
        };
        let stopped_at_budget =
            r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
        if !stopped_at_budget || tx.cons().load(Acquire) == tx.prod().load(Relaxed) {
            break;
        }
    }
}

/// Whether the bound socket runs in zero-copy mode (`XDP_OPTIONS`, Linux ≥ 5.3).
fn zero_copy(fd: RawFd) -> bool {
    let mut opts = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `opts`.
    let r = unsafe {
        libc::getsockopt(fd, SOL_XDP, XDP_OPTIONS, (&mut opts as *mut u32).cast(), &mut len)
    };
    r == 0 && opts & XDP_OPTIONS_ZEROCOPY != 0
}

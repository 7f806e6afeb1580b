//! The AF_XDP socket's kernel interface: the `if_xdp.h` constants and structures, and one
//! mapped ring ([`Ring`]: fill, rx, tx or completion).
//!
//! Unsafe code, with these invariants:
//! - a ring's mapping lives as long as its [`Ring`] (unmapped in `Drop`), which lives as long
//!   as the port; producer/consumer words are accessed atomically (acquire for the other
//!   side's index, release to publish ours);
//! - descriptor slots between our consumer and the kernel's producer (or our producer and the
//!   kernel's consumer) belong to us; indices are masked by the ring size.

use super::RING;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering::*};

pub(super) const AF_XDP: libc::c_int = 44;
pub(super) const SOL_XDP: libc::c_int = 283;
pub(super) const XDP_MMAP_OFFSETS: libc::c_int = 1;
pub(super) const XDP_RX_RING: libc::c_int = 2;
pub(super) const XDP_TX_RING: libc::c_int = 3;
pub(super) const XDP_UMEM_REG: libc::c_int = 4;
pub(super) const XDP_UMEM_FILL_RING: libc::c_int = 5;
pub(super) const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
pub(super) const XDP_OPTIONS: libc::c_int = 8;
pub(super) const XDP_OPTIONS_ZEROCOPY: u32 = 1;
pub(super) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
pub(super) const XDP_USE_SG: u16 = 1 << 4;
/// In a descriptor's options: the frame continues in the next descriptor.
pub(super) const XDP_PKT_CONTD: u32 = 1;
pub(super) const XDP_RING_NEED_WAKEUP: u32 = 1;
pub(super) const PGOFF_RX: i64 = 0;
pub(super) const PGOFF_TX: i64 = 0x8000_0000;
pub(super) const PGOFF_FILL: i64 = 0x1_0000_0000;
pub(super) const PGOFF_COMPLETION: i64 = 0x1_8000_0000;
/// Bytes the kernel keeps in front of a received frame in its UMEM chunk.
pub(super) const XDP_PACKET_HEADROOM: usize = 256;

#[repr(C)]
pub(super) struct UmemReg {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) chunk_size: u32,
    pub(super) headroom: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct RingOffsets {
    pub(super) producer: u64,
    pub(super) consumer: u64,
    pub(super) desc: u64,
    pub(super) flags: u64,
}

#[repr(C)]
#[derive(Default)]
pub(super) struct MmapOffsets {
    pub(super) rx: RingOffsets,
    pub(super) tx: RingOffsets,
    pub(super) fr: RingOffsets,
    pub(super) cr: RingOffsets,
}

#[repr(C)]
pub(super) struct SockaddrXdp {
    pub(super) family: u16,
    pub(super) flags: u16,
    pub(super) ifindex: u32,
    pub(super) queue_id: u32,
    pub(super) shared_umem_fd: u32,
}

/// One mapped ring: `entry` bytes per descriptor (16 for rx/tx, 8 for fill/completion).
pub(super) struct Ring {
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
    pub(super) fn map(
        fd: RawFd,
        off: &RingOffsets,
        pgoff: i64,
        entry: usize,
        with_flags: bool,
    ) -> io::Result<Ring> {
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

    pub(super) fn prod(&self) -> &AtomicU32 {
        // SAFETY: a u32 index word inside the live mapping, shared with the kernel atomically.
        unsafe { &*self.producer }
    }

    pub(super) fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asks to be woken up to use this ring.
    pub(super) fn needs_wakeup(&self) -> bool {
        // SAFETY: the flags word inside the live mapping, written by the kernel.
        self.flags.is_none_or(|f| unsafe { &*f }.load(Relaxed) & XDP_RING_NEED_WAKEUP != 0)
    }

    pub(super) fn slot(&self, i: u32) -> *mut u8 {
        // SAFETY: the index is masked to the ring size, so the slot is inside the mapping.
        unsafe { self.desc.add((i & (RING - 1)) as usize * self.entry) }
    }

    pub(super) fn write_addr(&self, i: u32, addr: u64) {
        // SAFETY: a slot we own (between our producer and the kernel's consumer).
        unsafe { self.slot(i).cast::<u64>().write_unaligned(addr) }
    }

    pub(super) fn read_addr(&self, i: u32) -> u64 {
        // SAFETY: a slot the kernel published (between our consumer and its producer).
        unsafe { self.slot(i).cast::<u64>().read_unaligned() }
    }

    pub(super) fn write_desc(&self, i: u32, addr: u64, len: u32, options: u32) {
        let s = self.slot(i);
        // SAFETY: a 16-byte xdp_desc slot we own.
        unsafe {
            s.cast::<u64>().write_unaligned(addr);
            s.add(8).cast::<u32>().write_unaligned(len);
            s.add(12).cast::<u32>().write_unaligned(options);
        }
    }

    /// Address, length and options of a descriptor.
    pub(super) fn read_desc(&self, i: u32) -> (u64, u32, u32) {
        let s = self.slot(i);
        // SAFETY: a 16-byte xdp_desc slot the kernel published.
        unsafe {
            (
                s.cast::<u64>().read_unaligned(),
                s.add(8).cast::<u32>().read_unaligned(),
                s.add(12).cast::<u32>().read_unaligned(),
            )
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

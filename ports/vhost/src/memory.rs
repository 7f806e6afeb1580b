//! Guest memory as the backend sees it: the regions of the frontend's memory table, each a
//! host mapping, and the translation of guest physical ranges into host slices.
//!
//! Everything a guest names (descriptor addresses and lengths, ring addresses) goes through
//! [`GuestMemory::slice`], which checks the whole range against one region, with overflow
//! checks, before any byte is touched. A range that crosses regions is refused (frontends
//! allocate each buffer inside one region; the caller counts the refusal).
//!
//! # Safety of the mappings
//! A [`Region`] holds a raw host pointer to memory the guest shares with us. Invariants:
//! - the mapping stays valid for `len` bytes while the `GuestMemory` lives: it is owned by a
//!   [`Mapping`] the memory table keeps (an `mmap` of the frontend's file descriptor, or an
//!   anonymous one in tests);
//! - the guest may write any byte at any time. The backend therefore never forms Rust
//!   references whose contents it relies on being stable across a read it trusts: ring
//!   fields are read once into locals with volatile loads, and frame bytes are only copied,
//!   through the one accessor [`GuestSlice`]: a checked range that is never turned into a
//!   Rust reference (a `&[u8]` over bytes another party writes is undefined behaviour, and a
//!   `&mut [u8]` would promise exclusivity the guest does not grant). It copies in and out
//!   with `copy_nonoverlapping` between raw guest pointers and the switch's own buffers, as
//!   vm-memory's `VolatileSlice` does for bulk copies; measured against the slices it
//!   replaced: the same instructions per packet (docs/perf/vhost-user.md).

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A guest physical address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GuestAddr(pub u64);

/// Why a guest range cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("guest range {addr:#x}+{len} is not inside one memory region")]
    OutOfRange { addr: u64, len: u64 },
    #[error("guest address {addr:#x} is not aligned to {align}")]
    Misaligned { addr: u64, align: u64 },
}

/// One host mapping of guest memory; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    /// What was mapped (for munmap) ...
    base: *mut u8,
    mapped: usize,
    /// ... and the part that is guest memory.
    ptr: *mut u8,
    len: usize,
    /// A frontend's file can shrink under the mapping: its SIGBUS guard (`None` for
    /// anonymous memory, or when the guard table is full).
    guard: Option<crate::sigbus::Guard>,
}

// SAFETY: the mapping is plain shared memory; who may touch which bytes when is the
// virtqueue protocol's business, enforced by the ring code, not by the mapping.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// The size of the file behind `fd`.
fn file_size(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    // SAFETY: fstat fills the zeroed stat buffer for a descriptor we borrow.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is to our local.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.st_size.max(0) as u64)
}

/// The filesystem of the file behind `fd`: its type and block size (the huge page size on
/// hugetlbfs).
fn file_system(fd: BorrowedFd<'_>) -> std::io::Result<(i64, u64)> {
    // SAFETY: fstatfs fills the zeroed buffer for a descriptor we borrow.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointer is to our local.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_type as i64, st.f_bsize.max(1) as u64))
}

/// Filesystems guest memory may live on: memfds and `/dev/shm` (tmpfs) and hugetlbfs. Pages
/// of any other file would be read from (and written back to) a disk — by the PMD thread
/// that touches them.
const SHARED_MEMORY: [(i64, &str); 2] =
    [(libc::TMPFS_MAGIC, "tmpfs"), (libc::HUGETLBFS_MAGIC, "hugetlbfs")];

impl Mapping {
    /// Maps the `len` bytes at `offset` of a frontend's memory file (vhost-user
    /// SET_MEM_TABLE): whole pages of its file system (huge pages on hugetlbfs, where a
    /// mapping can only be replaced or unmapped whole) from the one the offset falls in.
    ///
    /// The file must be shared memory (a memfd, tmpfs, hugetlbfs) and hold the whole region:
    /// a page of a mapping past the end of its file raises SIGBUS when touched, so a
    /// frontend's short (or truncated) file is refused here. A frontend that shrinks its file
    /// afterwards is caught by the mapping's SIGBUS guard (`sigbus.rs`): the fault is
    /// recovered from, the mapping reads as zeroes and [`Mapping::faulted`] says so. A
    /// mapping the guard table has no room for is refused.
    pub fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> std::io::Result<Mapping> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let off = usize::try_from(offset)
            .map_err(|_| invalid(format!("region offset {offset} is too large")))?;
        let end = len
            .checked_add(off)
            .ok_or_else(|| invalid(format!("region of {len} bytes at offset {off} overflows")))?;
        let (fs, page) = file_system(fd)?;
        let page = page.max(4096);
        let Some((_, kind)) = SHARED_MEMORY.iter().find(|(t, _)| *t == fs) else {
            return Err(invalid(format!(
                "guest memory must be shared memory (a memfd, tmpfs or hugetlbfs), not a file on a file system of type {fs:#x}"
            )));
        };
        let size = file_size(fd)?;
        if (size as u128) < end as u128 {
            return Err(invalid(format!(
                "memory region of {len} bytes at offset {off} extends past its file ({size} bytes)"
            )));
        }
        // Only the pages the region is in: from the page its offset falls in (a frontend's
        // offset of terabytes into a sparse file maps nothing more than its region).
        let delta = off % page as usize;
        let mapped = ((delta + len) as u64)
            .div_ceil(page)
            .checked_mul(page)
            .and_then(|m| usize::try_from(m).ok());
        let mapped = mapped
            .ok_or_else(|| invalid(format!("region of {len} bytes at offset {off} overflows")))?;
        let at = libc::off_t::try_from(off - delta)
            .map_err(|_| invalid(format!("region offset {off} is too large")))?;
        let mut m = Self::map(mapped, libc::MAP_SHARED, fd.as_raw_fd(), at).map_err(|e| {
            std::io::Error::new(e.kind(), format!("mapping {mapped} bytes of a {kind} file: {e}"))
        })?;
        // SAFETY: `delta + len <= mapped`: the region lies inside the mapping just made.
        m.ptr = unsafe { m.base.add(delta) };
        m.len = len;
        m.guard = Some(crate::sigbus::Guard::register(m.base, m.mapped).ok_or_else(|| {
            std::io::Error::other(format!(
                "the switch guards at most {} frontend memory regions at once, all taken",
                crate::sigbus::SLOTS
            ))
        })?);
        Ok(m)
    }

    /// Anonymous zeroed memory (tests and simulated guests).
    pub fn anonymous(len: usize) -> std::io::Result<Mapping> {
        Self::map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    }

    fn map(len: usize, flags: i32, fd: i32, off: libc::off_t) -> std::io::Result<Mapping> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty memory region",
            ));
        }
        // SAFETY: a fresh mapping chosen by the kernel; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: p.cast(), mapped: len, ptr: p.cast(), len, guard: None })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The guest memory's address in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Whether the frontend's file shrank under the mapping and a fault was recovered from:
    /// the memory reads as zeroes now, not as the guest's (see `sigbus.rs`).
    pub fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.faulted())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unguarded first: the range is no longer ours once unmapped.
        drop(self.guard.take());
        // SAFETY: unmaps exactly what `map` mapped; no slice into it outlives the memory
        // table that owns this mapping.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

/// One region of the memory table: guest range → host mapping (and the frontend's own
/// virtual address of it, which ring addresses use).
#[derive(Debug)]
pub struct Region {
    pub guest: u64,
    pub len: u64,
    /// The frontend's virtual address of the region (vhost-user ring addresses are in it).
    pub user: u64,
    map: Mapping,
}

/// The guest's memory table.
#[derive(Debug, Default)]
pub struct GuestMemory {
    regions: Vec<Region>,
}

impl GuestMemory {
    /// A table of `(guest address, frontend address, mapping)` regions, which must not
    /// overlap in guest space.
    pub fn new(regions: Vec<(u64, u64, Mapping)>) -> Result<GuestMemory, MemError> {
        let mut rs: Vec<Region> = regions
            .into_iter()
            .map(|(guest, user, map)| Region { guest, len: map.len as u64, user, map })
            .collect();
        rs.sort_by_key(|r| r.guest);
        for w in rs.windows(2) {
            if w[0].guest.checked_add(w[0].len).is_none_or(|end| end > w[1].guest) {
                return Err(MemError::OutOfRange { addr: w[1].guest, len: w[1].len });
            }
        }
        Ok(GuestMemory { regions: rs })
    }

    /// Whether a region's file shrank under its mapping (see [`Mapping::faulted`]): the
    /// rings in this table must stop.
    pub fn faulted(&self) -> bool {
        self.regions.iter().any(|r| r.map.faulted())
    }

    fn region(&self, addr: u64) -> Option<&Region> {
        // Few regions (frontends use one to eight): a linear scan beats a search.
        self.regions.iter().find(|r| addr >= r.guest && addr - r.guest < r.len)
    }

    /// The host pointer of `len` bytes at guest `addr`, all inside one region.
    #[inline]
    pub fn host(&self, addr: GuestAddr, len: u64) -> Result<*mut u8, MemError> {
        let err = MemError::OutOfRange { addr: addr.0, len };
        let r = self.region(addr.0).ok_or(err)?;
        let off = addr.0 - r.guest;
        if len > r.len - off {
            return Err(err);
        }
        // SAFETY: `off + len <= r.len`, the mapping's length: the result stays inside it.
        Ok(unsafe { r.map.ptr.add(off as usize) })
    }

    /// `len` bytes at guest `addr`, all inside one region, to copy in or out of.
    #[inline]
    pub fn slice(&self, addr: GuestAddr, len: usize) -> Result<GuestSlice<'_>, MemError> {
        let p = self.host(addr, len as u64)?;
        // SAFETY: `len` bytes at `p` lie inside a mapping of this table (checked by `host`),
        // which lives as long as the borrow of `self`.
        Ok(unsafe { GuestSlice::new(p, len) })
    }

    /// The guest address of a frontend virtual address (vhost-user SET_VRING_ADDR).
    pub fn guest_of_user(&self, user: u64) -> Option<GuestAddr> {
        self.regions
            .iter()
            .find(|r| user >= r.user && user - r.user < r.len)
            .map(|r| GuestAddr(r.guest + (user - r.user)))
    }

    /// A guest field of `size` bytes aligned to `align`, as a host pointer.
    pub fn field(&self, addr: GuestAddr, size: u64, align: u64) -> Result<*mut u8, MemError> {
        if !addr.0.is_multiple_of(align) {
            return Err(MemError::Misaligned { addr: addr.0, align });
        }
        self.host(addr, size)
    }
}

/// A range of guest memory inside one mapping of a memory table (`'m`), reached only by
/// copying: it hands out no Rust reference to the bytes, which the guest may change at any
/// time. Copies of it may alias freely (no exclusivity is promised or needed); which side may
/// write a buffer when is the virtqueue protocol's business, kept by the ring code.
#[derive(Debug, Clone, Copy)]
pub struct GuestSlice<'m> {
    ptr: *mut u8,
    len: usize,
    _mem: PhantomData<&'m GuestMemory>,
}

impl<'m> GuestSlice<'m> {
    /// An empty range (a placeholder).
    pub const EMPTY: GuestSlice<'static> =
        GuestSlice { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0, _mem: PhantomData };

    /// # Safety
    /// `len` bytes at `ptr` must stay mapped for `'m` (inside a mapping of the memory table
    /// borrowed for `'m`).
    #[inline(always)]
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> GuestSlice<'m> {
        GuestSlice { ptr, len, _mem: PhantomData }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host address of the first byte (for prefetching and identity checks only).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The bytes from `at` on (empty past the end).
    #[inline(always)]
    pub fn from(self, at: usize) -> GuestSlice<'m> {
        let at = at.min(self.len);
        // SAFETY: `at <= len`: the result is a suffix of this range.
        unsafe { GuestSlice::new(self.ptr.add(at), self.len - at) }
    }

    /// The first `len` bytes (all of them when shorter).
    #[inline(always)]
    pub fn prefix(self, len: usize) -> GuestSlice<'m> {
        GuestSlice { len: len.min(self.len), ..self }
    }

    /// Copies the range's first bytes into `dst`, as many as both hold; returns how many.
    #[inline(always)]
    pub fn read(&self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len);
        // SAFETY: `n` bytes are inside this range (mapped for 'm) and inside `dst`; `dst` is
        // the switch's own memory, so the two never overlap. No reference to guest bytes is
        // formed.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.cast_const(), dst.as_mut_ptr(), n) };
        n
    }

    /// Copies `src` to the range's start, as much as fits; returns how much.
    #[inline(always)]
    pub fn write(&self, src: &[u8]) -> usize {
        let n = src.len().min(self.len);
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, n) };
        n
    }

    /// Copies `n` bytes from `src` to the range's start, as many as fit; returns how many.
    ///
    /// # Safety
    /// `src` must be readable for `n` bytes: another guest's buffer lent to the switch
    /// (`vswitch::LentTail`), a region of a mapping that outlives the call.
    #[inline(always)]
    pub unsafe fn copy_from_raw(&self, src: *const u8, n: usize) -> usize {
        let n = n.min(self.len);
        // SAFETY: `n` bytes inside this range and readable at `src` (the caller's promise);
        // two guests' buffers may be in one mapping only when they are one guest's, whose
        // transmit and receive buffers are distinct descriptors — an overlap would be the
        // guest's own doing and costs only its own bytes.
        unsafe { std::ptr::copy(src, self.ptr, n) };
        n
    }

    /// The first `N` bytes, `None` when the range is shorter (a fixed-size copy the compiler
    /// makes a few moves, where `read` would call `memcpy`).
    #[inline(always)]
    pub fn read_array<const N: usize>(&self) -> Option<[u8; N]> {
        // SAFETY: `N` bytes inside this range (checked), read without forming a reference.
        (self.len >= N).then(|| unsafe { self.ptr.cast::<[u8; N]>().read_unaligned() })
    }

    /// Writes `bytes` at the range's start; `false` (nothing written) when it is shorter.
    #[inline(always)]
    pub fn write_array<const N: usize>(&self, bytes: &[u8; N]) -> bool {
        if self.len < N {
            return false;
        }
        // SAFETY: as in `read_array`, the other way.
        unsafe { self.ptr.cast::<[u8; N]>().write_unaligned(*bytes) };
        true
    }

    /// A copy of the bytes (tests, diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read(&mut v);
        v
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn mem() -> GuestMemory {
        GuestMemory::new(vec![
            (0x1000, 0x7f00_0000_1000, Mapping::anonymous(0x2000).unwrap()),
            (0x10000, 0x7f00_0001_0000, Mapping::anonymous(0x1000).unwrap()),
        ])
        .unwrap()
    }

    #[test]
    fn ranges_inside_one_region_only() {
        let m = mem();
        assert!(m.slice(GuestAddr(0x1000), 0x2000).is_ok());
        assert!(m.slice(GuestAddr(0x2fff), 1).is_ok());
        assert!(m.slice(GuestAddr(0x2fff), 2).is_err(), "past the region's end");
        assert!(m.slice(GuestAddr(0x3000), 1).is_err(), "between regions");
        assert!(m.slice(GuestAddr(0xfff), 2).is_err(), "before the first region");
        assert!(m.slice(GuestAddr(u64::MAX), 2).is_err(), "overflow");
        assert!(m.slice(GuestAddr(0x10000), usize::MAX).is_err(), "huge length");
        assert_eq!(m.slice(GuestAddr(0x10010), 4).unwrap().write(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(m.slice(GuestAddr(0x10012), 2).unwrap().to_vec(), [3, 4]);
    }

    #[test]
    fn frontend_addresses_and_alignment() {
        let m = mem();
        assert_eq!(m.guest_of_user(0x7f00_0001_0010), Some(GuestAddr(0x10010)));
        assert_eq!(m.guest_of_user(0x7f00_0000_0fff), None);
        assert_eq!(
            m.field(GuestAddr(0x1002), 4, 4),
            Err(MemError::Misaligned { addr: 0x1002, align: 4 })
        );
        assert!(m.field(GuestAddr(0x1004), 4, 4).is_ok());
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let r = GuestMemory::new(vec![
            (0x1000, 0, Mapping::anonymous(0x2000).unwrap()),
            (0x2000, 0, Mapping::anonymous(0x1000).unwrap()),
        ]);
        assert!(r.is_err());
    }
}

//! One contiguous, page-aligned memory region that holds every packet buffer.
//!
//! The region is mapped once at start. It is hugepage-backed with `MAP_HUGETLB` when the
//! kernel has free hugepages, and otherwise a normal anonymous mapping with
//! `MADV_HUGEPAGE` (transparent hugepages where enabled). Because it is one region of
//! equal 2 KiB chunks it can later be registered as an AF_XDP UMEM as it is.
//!
//! "Free hugepages" means hugepages this process may fault in, not only ones the kernel has:
//! a container that did not request any (a Kubernetes pod without a `hugepages-2Mi`
//! resource) sits in a hugetlb cgroup whose fault limit is 0, where `mmap` still succeeds
//! and `MAP_POPULATE` fails silently — the first touch of the region would be a SIGBUS.
//! So a hugetlb mapping is kept only when every one of its pages was faulted in.
//!
//! Invariants (relied on by `buf.rs`):
//! - `ptr` is valid for reads and writes of `len` bytes for the whole life of `Region`;
//! - the mapping is private to this process and never remapped or shrunk until `Drop`.

use std::ptr::NonNull;

/// How the region's pages are backed; logged at start so operators know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Explicit hugepages (`MAP_HUGETLB`, 2 MiB pages).
    HugeTlb,
    /// Normal pages with `MADV_HUGEPAGE` advice (transparent hugepages if enabled).
    Transparent,
}

impl std::fmt::Display for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backing::HugeTlb => "hugetlb (2 MiB pages)",
            Backing::Transparent => "anonymous with MADV_HUGEPAGE",
        })
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// An anonymous mapping owned by this value and unmapped on drop.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the region is plain memory; synchronisation of its contents is the business of
// the buffer pool, which hands out exclusive ownership of each chunk.
unsafe impl Send for Region {}
// SAFETY: as above; `Region` itself has no interior state besides the mapping.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to 2 MiB). Tries hugetlb first when `try_huge`.
    pub fn new(len: usize, try_huge: bool) -> std::io::Result<Region> {
        let len = len.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
        if try_huge && let Some(ptr) = map(len, libc::MAP_HUGETLB) {
            if resident(ptr, len) {
                return Ok(Region { ptr, len, backing: Backing::HugeTlb });
            }
            // SAFETY: ptr/len are the mapping just made, not yet handed out.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
        let ptr = map(len, 0).ok_or_else(std::io::Error::last_os_error)?;
        // SAFETY: ptr/len describe the mapping just created; the advice is only a hint.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Region { ptr, len, backing: Backing::Transparent })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn backing(&self) -> Backing {
        self.backing
    }
}

fn map(len: usize, extra: libc::c_int) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED { None } else { NonNull::new(p.cast()) }
}

/// Whether every page of the mapping is in memory (`mincore`, one byte per base page, for
/// hugetlb mappings too).
fn resident(ptr: NonNull<u8>, len: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: ptr/len are a live mapping of ours, page-aligned; vec has a byte per page.
    let r = unsafe { libc::mincore(ptr.as_ptr().cast(), len, vec.as_mut_ptr()) };
    r == 0 && vec.iter().all(|b| b & 1 == 1)
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping created in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn maps_rounded_and_writable() {
        let r = Region::new(10, true).unwrap();
        assert_eq!(r.len(), HUGE_PAGE);
        // SAFETY: within the mapping.
        unsafe {
            *r.as_ptr() = 7;
            *r.as_ptr().add(r.len() - 1) = 9;
            assert_eq!(*r.as_ptr(), 7);
        }
        assert_eq!(r.as_ptr() as usize % 4096, 0);
    }
}

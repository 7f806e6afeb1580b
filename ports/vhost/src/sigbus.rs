//! Surviving a frontend that shrinks its memory file under the switch.
//!
//! A page of a shared mapping that lies past the end of its file raises SIGBUS when touched.
//! `Mapping::shared` refuses a region its file does not hold at SET_MEM_TABLE, but a frontend
//! may truncate the file afterwards (a bug, or a hostile VNF): the next ring read would kill
//! the whole switch, and every pod on the node would lose its network. Seals cannot be
//! required (QEMU's and DPDK's hugetlbfs files are not sealed memfds).
//!
//! So every frontend mapping is registered here ([`Guard`]), and a SIGBUS handler looks the
//! faulting address up: inside a registered mapping, it maps anonymous zeroed memory over the
//! *whole* mapping (`MAP_FIXED`: a hugetlbfs mapping can only be replaced whole, in huge-page
//! units), marks the mapping faulted and returns; the faulting access runs again on the
//! zeroes, and the port, which checks [`Guard::faulted`] after each burst, stops the rings of
//! that memory table until its frontend reconnects with a new one. A fault anywhere else is
//! passed to the handler that was there before (Rust's own, which reports stack overflows)
//! or, if none, kills the process as SIGBUS always did.
//!
//! The handler is async-signal-safe: it reads a fixed table of atomics, and makes the `mmap`
//! and `sigaction` system calls (glibc's wrappers take no locks). Registration claims a slot
//! with a compare-and-swap; a table that is full (more than [`SLOTS`] mappings) refuses the
//! mapping, whose memory table is then refused.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings guarded at once: 8 regions (the most a memory table may have) for each of 512
/// frontends. A mapping beyond them is refused (`Mapping::shared`).
pub const SLOTS: usize = 4096;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot { start: AtomicUsize::new(0), end: AtomicUsize::new(0), faulted: AtomicBool::new(false) }
}; SLOTS];

/// The SIGBUS disposition before ours (set once, when the handler is installed).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered mapping: while it lives, a SIGBUS inside `[start, end)` is recovered from.
#[derive(Debug)]
pub struct Guard {
    slot: usize,
}

impl Guard {
    /// Guards the mapping at `[start, start + len)`; `None` when the table is full or the
    /// handler could not be installed (the caller refuses the mapping).
    pub fn register(start: *mut u8, len: usize) -> Option<Guard> {
        if !install() {
            return None;
        }
        let (start, end) = (start as usize, (start as usize).checked_add(len)?);
        for (i, s) in TABLE.iter().enumerate() {
            // A slot is free while its start is 0; claiming it publishes the end first so the
            // handler never sees a start without its end.
            if s.start.load(Ordering::Relaxed) == 0
                && s.end.compare_exchange(0, end, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                s.faulted.store(false, Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                return Some(Guard { slot: i });
            }
        }
        tracing::warn!(
            slots = SLOTS,
            "SIGBUS guard table full: a frontend memory region is refused"
        );
        None
    }

    /// Whether a fault in the mapping was recovered from: its memory is now zeroes, not the
    /// guest's.
    pub fn faulted(&self) -> bool {
        TABLE[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &TABLE[self.slot];
        s.start.store(0, Ordering::Release);
        s.end.store(0, Ordering::Release);
    }
}

/// Installs the handler once; whether it is in place.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction is plain data; zeroed is a valid empty value.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: an empty set to block nothing extra while the handler runs.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installs our handler for SIGBUS and reads the previous disposition into
        // `old`; both point at valid sigaction values.
        if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "no SIGBUS handler: a truncated memory file would bring the switch down");
            return false;
        }
        let _ = PREVIOUS.set(old);
        true
    })
}

/// Replaces the guarded mapping holding `addr` with anonymous zeroes; whether there was one.
fn recover(addr: usize) -> bool {
    for s in &TABLE {
        let start = s.start.load(Ordering::Acquire);
        let end = s.end.load(Ordering::Acquire);
        if start != 0 && start <= addr && addr < end {
            // SAFETY: [start, end) is a mapping this process made and still holds (it is
            // unregistered before it is unmapped); replacing it with private anonymous
            // memory of the same size leaves every pointer into it valid.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    end - start,
                    libc::PROT_READ | libc::PROT_WRITE,
                    // No reservation: zeroes that are never written take no memory, however
                    // large the mapping (the fault must not fail for want of commit charge).
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return false;
            }
            s.faulted.store(true, Ordering::Release);
            return true;
        }
    }
    false
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; for SIGBUS it
    // holds the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    if recover(addr) {
        return;
    }
    // Not a guest mapping: what was there before decides.
    let Some(prev) = PREVIOUS.get() else { return die() };
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => die(),
        f if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
            // signature; we pass it what the kernel passed us.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(f) };
            f(sig, info, ctx)
        }
        f => {
            // SAFETY: a plain handler (no SA_SIGINFO) takes the signal number only.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            f(sig)
        }
    }
}

/// Restores the default disposition: returning re-runs the faulting access, and SIGBUS
/// ends the process as it would have without us.
fn die() {
    // SAFETY: plain data, then a valid sigaction for SIG_DFL.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: resets SIGBUS to its default; no old value is read.
    unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_truncated_file_under_a_guarded_mapping_reads_as_zeroes() {
        // SAFETY: memfd_create with a static name; checked and owned below.
        let fd = unsafe { libc::memfd_create(c"sigbus-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        let len = 2 * 4096;
        // SAFETY: our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, len as i64) }, 0);
        // SAFETY: a fresh shared mapping of the file, checked below.
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
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        // SAFETY: inside the mapping, backed by the file.
        unsafe { p.add(4096).write_volatile(7) };
        let guard = Guard::register(p, len).expect("guarded");
        assert!(!guard.faulted());
        // SAFETY: our own descriptor; the file now ends before the mapping's second page.
        assert_eq!(unsafe { libc::ftruncate(fd, 4096) }, 0);
        // SAFETY: inside the mapping; past the file's end, so it faults and is recovered.
        let v = unsafe { p.add(4096).read_volatile() };
        assert_eq!(v, 0, "the guest's bytes are gone, replaced by zeroes");
        assert!(guard.faulted());
        drop(guard);
        // SAFETY: the mapping made above (now anonymous), unmapped once.
        unsafe {
            libc::munmap(p.cast(), len);
            libc::close(fd);
        }
    }
}

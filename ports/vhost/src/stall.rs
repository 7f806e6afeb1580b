//! A deadline for the system calls a PMD thread makes on descriptors a frontend shares.
//!
//! The call and kick eventfds of a vhost-user port are the frontend's as much as the
//! switch's: it holds the same open file. The switch makes them non-blocking, but the
//! frontend can clear `O_NONBLOCK` again (the flag belongs to the shared open file) and then
//! fill the eventfd's counter, so that the switch's next `write` (or, on an empty counter,
//! `read`) waits for ever — and with it a PMD thread and every port it polls. Eventfds cannot
//! be opened a second time (`/proc/self/fd/N` of an anonymous inode is `ENXIO`), and there
//! is no per-call "don't wait" flag for them, so instead every such call runs under
//! [`guarded`]: the thread notes in a table that it is inside one, and a watchdog thread
//! interrupts any thread that stays inside for [`LIMIT`] with a signal whose handler does
//! nothing and is installed without `SA_RESTART`: the call returns `EINTR`, and the caller
//! gives up that frontend's descriptors for good (see `port.rs`).
//!
//! The fast path pays a clock read and two stores to a thread-local slot around the call
//! (which is itself a system call); the watchdog, started with the first guarded call,
//! wakes every [`TICK`].

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How long a guarded call may take before it is interrupted.
pub const LIMIT: Duration = Duration::from_millis(50);
/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(20);
/// Threads that can make guarded calls at once (PMD threads and vhost-user connection
/// threads); a thread beyond them makes its calls unguarded (and it is logged once).
const SLOTS: usize = 1024;

struct Slot {
    /// The thread's kernel id (`gettid`), 0 while the slot is free. Signalled with `tgkill`
    /// in this process: a thread that ended meanwhile is signalled not at all, or (its id
    /// reused by a new thread here) with a spurious `EINTR`; never undefined behaviour, as
    /// `pthread_kill` of an ended thread's `pthread_t` would be.
    thread: AtomicU64,
    /// When the thread entered its guarded call (milliseconds of the monotonic clock, plus
    /// one), 0 while it is not in one.
    since: AtomicU64,
}

static TABLE: [Slot; SLOTS] =
    [const { Slot { thread: AtomicU64::new(0), since: AtomicU64::new(0) } }; SLOTS];
/// Slots handed out so far (the watchdog looks at these only).
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's slot, released when the thread ends.
struct Mine(Cell<Option<usize>>);

impl Drop for Mine {
    fn drop(&mut self) {
        if let Some(i) = self.0.get() {
            TABLE[i].since.store(0, Ordering::Release);
            TABLE[i].thread.store(0, Ordering::Release);
        }
    }
}

thread_local! {
    static MINE: Mine = const { Mine(Cell::new(None)) };
}

/// Milliseconds of the coarse monotonic clock (a vDSO read, no system call), plus one so
/// that 0 means "not in a call".
fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000 + 1
}

/// The signal the watchdog interrupts a stuck thread with.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn on_interrupt(_: libc::c_int) {}

/// Installs the do-nothing handler (without `SA_RESTART`, so the interrupted call returns
/// `EINTR`) and starts the watchdog, once; whether both are in place.
fn start() -> bool {
    static STARTED: OnceLock<bool> = OnceLock::new();
    *STARTED.get_or_init(|| {
        // SAFETY: sigaction is plain data; zeroed is a valid empty value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_interrupt as *const () as usize;
        act.sa_flags = 0;
        // SAFETY: an empty mask, then our handler for a real-time signal nothing else uses.
        let installed = unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(interrupt_signal(), &act, std::ptr::null_mut()) == 0
        };
        if !installed {
            tracing::warn!(error = %std::io::Error::last_os_error(), "no watchdog for frontend descriptors: a frontend could block a PMD thread");
            return false;
        }
        std::thread::Builder::new().name("vhost-watchdog".into()).spawn(watch).is_ok()
    })
}

fn watch() {
    let limit = LIMIT.as_millis() as u64;
    loop {
        std::thread::sleep(TICK);
        let now = now_ms();
        for s in &TABLE[..HIGH.load(Ordering::Acquire).min(SLOTS)] {
            let since = s.since.load(Ordering::Acquire);
            let thread = s.thread.load(Ordering::Acquire);
            if since != 0 && thread != 0 && now.saturating_sub(since) >= limit {
                // Sent again every tick until the call returns: a signal that arrived just
                // before the thread entered the call interrupted nothing.
                // SAFETY: tgkill of a thread id of this process (see `Slot::thread`); the
                // handler does nothing.
                unsafe {
                    libc::syscall(
                        libc::SYS_tgkill,
                        libc::getpid(),
                        thread as libc::pid_t,
                        interrupt_signal(),
                    )
                };
            }
        }
    }
}

/// The calling thread's slot, claimed on first use; `None` when the table is full.
fn slot() -> Option<usize> {
    MINE.try_with(|m| {
        if let Some(i) = m.0.get() {
            return Some(i);
        }
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u64;
        for (i, s) in TABLE.iter().enumerate() {
            if s.thread.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                HIGH.fetch_max(i + 1, Ordering::AcqRel);
                m.0.set(Some(i));
                return Some(i);
            }
        }
        static FULL: std::sync::Once = std::sync::Once::new();
        FULL.call_once(|| {
            tracing::warn!(
                slots = SLOTS,
                "watchdog table full: this thread's calls on frontend descriptors are not bounded"
            )
        });
        None
    })
    .ok()
    .flatten()
}

/// Runs `call` (one system call on a descriptor a frontend controls), interrupted with
/// `EINTR` if it takes longer than [`LIMIT`].
#[inline]
pub fn guarded<R>(call: impl FnOnce() -> R) -> R {
    let Some(i) = start().then(slot).flatten() else { return call() };
    TABLE[i].since.store(now_ms(), Ordering::Release);
    let r = call();
    TABLE[i].since.store(0, Ordering::Release);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    #[test]
    fn a_blocked_read_is_interrupted() {
        // SAFETY: a blocking eventfd of our own, owned below.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        let t = std::time::Instant::now();
        let mut v = 0u64;
        // SAFETY: an 8-byte read into a u64 from our eventfd; its counter is 0, so it blocks.
        let n = guarded(|| unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) });
        let e = std::io::Error::last_os_error();
        assert_eq!((n, e.kind()), (-1, std::io::ErrorKind::Interrupted));
        assert!(t.elapsed() < Duration::from_secs(2), "interrupted after {:?}", t.elapsed());
    }
}

//! The frontend's notification descriptors (SET_VRING_KICK, SET_VRING_CALL): taken only
//! when they are eventfds, made non-blocking, and every read or write of them bounded by the
//! watchdog ([`crate::stall`]), so that nothing a frontend does with them — the write end of
//! a pipe instead of an eventfd, a counter it filled, `O_NONBLOCK` cleared behind the
//! switch's back — can hold a switch thread.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Why a frontend's descriptor was refused.
#[derive(Debug, thiserror::Error)]
pub enum EventFdError {
    #[error("it is {0}, not an eventfd")]
    NotEventfd(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What a signal or a drain came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The counter was full (a signal: the guest has not read the earlier ones, which it
    /// will) or empty (a drain).
    WouldBlock,
    /// The call waited past the watchdog's limit: the frontend keeps the descriptor
    /// blocking and its counter full (or empty). Its caller stops using the frontend's
    /// descriptors.
    Stalled,
    /// Any other error (the descriptor is not what it was).
    Failed,
}

/// An eventfd a frontend gave, non-blocking.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

/// What `fd` is, as `/proc/self/fd` names it (`anon_inode:[eventfd]` for an eventfd).
fn kind_of(fd: RawFd) -> io::Result<String> {
    Ok(std::fs::read_link(format!("/proc/self/fd/{fd}"))?.to_string_lossy().into_owned())
}

impl EventFd {
    /// Takes a frontend's descriptor if it is an eventfd, and makes it non-blocking. Where
    /// `/proc` cannot say what it is, any anonymous inode is taken: the other kinds
    /// (epoll, timerfd, signalfd) refuse writes and never block a non-blocking read.
    pub fn from_frontend(fd: OwnedFd) -> Result<EventFd, EventFdError> {
        let raw = fd.as_raw_fd();
        match kind_of(raw) {
            Ok(k) if k == "anon_inode:[eventfd]" => {}
            Ok(k) => return Err(EventFdError::NotEventfd(describe(&k))),
            Err(_) => {
                // SAFETY: fstat fills the zeroed stat buffer for a descriptor we own.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above; the pointer is to our local.
                if unsafe { libc::fstat(raw, &mut st) } != 0 {
                    return Err(io::Error::last_os_error().into());
                }
                if st.st_mode & libc::S_IFMT != 0 {
                    return Err(EventFdError::NotEventfd(format!(
                        "a file of mode {:o}",
                        st.st_mode
                    )));
                }
            }
        }
        // SAFETY: fcntl on a descriptor we own.
        let ok = unsafe {
            let flags = libc::fcntl(raw, libc::F_GETFL);
            flags >= 0 && libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error().into());
        }
        Ok(EventFd(fd))
    }

    /// Adds one to the counter (interrupts the guest, or wakes whoever polls it).
    #[inline]
    pub fn signal(&self) -> Outcome {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from our u64 to a descriptor we own.
        let n = crate::stall::guarded(|| unsafe {
            libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8)
        });
        outcome(n)
    }

    /// Empties the counter (a kick was seen).
    #[inline]
    pub fn drain(&self) -> Outcome {
        drain_raw(self.0.as_raw_fd())
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// [`EventFd::drain`] of a descriptor borrowed by number (its owner keeps it open).
#[inline]
pub fn drain_raw(fd: RawFd) -> Outcome {
    let mut v = 0u64;
    // SAFETY: an 8-byte read into our u64 from a descriptor the caller keeps open.
    let n = crate::stall::guarded(|| unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) });
    outcome(n)
}

fn outcome(n: isize) -> Outcome {
    if n == 8 {
        return Outcome::Done;
    }
    match io::Error::last_os_error().kind() {
        io::ErrorKind::WouldBlock => Outcome::WouldBlock,
        io::ErrorKind::Interrupted => Outcome::Stalled,
        _ => Outcome::Failed,
    }
}

/// A descriptor's kind in words (`pipe:[123]` → "a pipe").
fn describe(kind: &str) -> String {
    match kind.split(':').next().unwrap_or("") {
        "pipe" => "a pipe".into(),
        "socket" => "a socket".into(),
        "anon_inode" => format!("an anonymous inode ({})", kind.trim_start_matches("anon_inode:")),
        _ if kind.starts_with('/') => format!("the file {kind}"),
        _ => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn owned(fd: RawFd) -> OwnedFd {
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn only_eventfds_are_taken() {
        // SAFETY: eventfd has no memory preconditions.
        let e = EventFd::from_frontend(owned(unsafe { libc::eventfd(0, 0) })).unwrap();
        assert_eq!(e.drain(), Outcome::WouldBlock, "non-blocking");
        assert_eq!(e.signal(), Outcome::Done);
        assert_eq!(e.drain(), Outcome::Done);
        let mut p = [0; 2];
        // SAFETY: pipe fills our two-element array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        let (_r, w) = (owned(p[0]), owned(p[1]));
        let err = EventFd::from_frontend(w).unwrap_err().to_string();
        assert_eq!(err, "it is a pipe, not an eventfd");
        // SAFETY: timerfd_create has no memory preconditions.
        let t = owned(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, 0) });
        assert!(EventFd::from_frontend(t).unwrap_err().to_string().contains("timerfd"));
    }

    #[test]
    fn a_full_counter_on_a_descriptor_made_blocking_again_cannot_hold_the_caller() {
        // SAFETY: eventfd has no memory preconditions.
        let raw = unsafe { libc::eventfd(0, 0) };
        let e = EventFd::from_frontend(owned(raw)).unwrap();
        // The frontend's moves: the counter to its maximum, O_NONBLOCK cleared.
        let max = (u64::MAX - 1).to_ne_bytes();
        // SAFETY: an 8-byte write to the eventfd; fcntl on it.
        unsafe {
            assert_eq!(libc::write(raw, max.as_ptr().cast(), 8), 8);
            let flags = libc::fcntl(raw, libc::F_GETFL);
            libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        let t = std::time::Instant::now();
        assert_eq!(e.signal(), Outcome::Stalled);
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "{:?}", t.elapsed());
    }
}

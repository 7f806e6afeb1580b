//! The port's unix socket, in a directory its pod can write: listened on, given its mode and
//! owner, connected to and removed without following anything the pod may have put there.
//!
//! A pod's app may create, rename and delete files in its vhost-user directory (it makes the
//! socket in client mode), and it may be root. Path-based calls in that directory would
//! follow a symlink it planted: `chmod` of `net1.sock` → `/etc/shadow`, or a `connect`
//! through `net1.sock` → another pod's socket (the switch would then serve another tenant's
//! app as this port). So the directory is opened once with `O_NOFOLLOW` (its parents belong
//! to root and the kubelet), and every operation on the name in it is relative to that
//! descriptor: `unlinkat` (which never follows), `bind` and `connect` through
//! `/proc/self/fd/N/…` and `/proc/self/fd/M` of an `O_PATH|O_NOFOLLOW` descriptor that was
//! checked to be a socket, and the mode and owner set on that same inode.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// Who may connect to a socket the switch listens on: its mode and owner (QEMU or a pod's
/// DPDK app often runs as another user than the switch). `None` keeps what the process's
/// umask and identity give.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketPerms {
    pub mode: Option<u32>,
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

/// How long a connect to a frontend's socket may take (a listener whose backlog is full
/// would otherwise hold the connecting thread).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The directory of `path`, opened without following a symlink in its last component, and
/// the socket's name in it.
fn dir_of(path: &Path) -> io::Result<(OwnedFd, CString)> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a file in a directory", path.display())));
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let d = cstr(&dir.to_string_lossy())?;
    // SAFETY: open of a NUL-terminated path; the result is checked and owned below.
    let fd = check(unsafe { libc::open(d.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) })
        .map_err(|e| io::Error::new(e.kind(), format!("opening {} (a symlink is not followed): {e}", dir.display())))?;
    // SAFETY: a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((fd, cstr(&name.to_string_lossy())?))
}

/// The inode at `name` in `dir`, not followed, checked to be a socket.
fn socket_inode(dir: &OwnedFd, name: &CString) -> io::Result<OwnedFd> {
    // SAFETY: openat relative to our directory descriptor; the result is checked and owned.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) })?;
    // SAFETY: as above.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat into our zeroed buffer, of a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        let what = if st.st_mode & libc::S_IFMT == libc::S_IFLNK { "a symlink" } else { "not a socket" };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is {what}", name.to_string_lossy())));
    }
    Ok(fd)
}

/// Removes `name` in `dir` if it is not a directory (a stale socket, or whatever a pod put
/// there); a missing one is fine.
fn unlink_in(dir: &OwnedFd, name: &CString) -> io::Result<()> {
    // SAFETY: unlinkat relative to our directory descriptor (it never follows symlinks).
    match check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Listens on `path` (replacing what is there), with `perms` set on the socket file itself.
pub fn listen(path: &Path, perms: SocketPerms) -> io::Result<UnixListener> {
    let (dir, name) = dir_of(path)?;
    unlink_in(&dir, &name)?;
    let via = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), name.to_string_lossy());
    let listener = UnixListener::bind(&via).map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
    if perms.mode.is_some() || perms.owner.is_some() || perms.group.is_some() {
        // The socket as bound, unless the pod replaced it meanwhile (then its own file).
        let inode = socket_inode(&dir, &name)?;
        if let Some(mode) = perms.mode {
            let p = cstr(&format!("/proc/self/fd/{}", inode.as_raw_fd()))?;
            // SAFETY: chmod of the NUL-terminated magic link to the inode checked above.
            check(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })?;
        }
        let (uid, gid) = (perms.owner.unwrap_or(u32::MAX), perms.group.unwrap_or(u32::MAX));
        if perms.owner.is_some() || perms.group.is_some() {
            // SAFETY: fchownat of the O_PATH descriptor itself (AT_EMPTY_PATH); -1 keeps an id.
            check(unsafe { libc::fchownat(inode.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) })?;
        }
    }
    Ok(listener)
}

/// Connects to the socket at `path` without following a symlink there, waiting at most
/// [`CONNECT_TIMEOUT`]; the stream is blocking.
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    let (dir, name) = dir_of(path)?;
    let inode = socket_inode(&dir, &name)?;
    let via = cstr(&format!("/proc/self/fd/{}", inode.as_raw_fd()))?;
    // SAFETY: a fresh non-blocking unix stream socket, owned below.
    let s = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: as above.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: sockaddr_un is plain data; zeroed is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = via.as_bytes_with_nul();
    if bytes.len() > addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *b as libc::c_char;
    }
    // SAFETY: connect with our sockaddr_un and its size.
    let r = unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) && e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
        let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: poll of one pollfd we own.
        let n = check(unsafe { libc::poll(&mut p, 1, CONNECT_TIMEOUT.as_millis() as libc::c_int) })?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the frontend did not accept the connection"));
        }
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into our c_int and its length.
        check(unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ERROR, (&mut err as *mut libc::c_int).cast(), &mut len) })?;
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
    }
    let stream = UnixStream::from(s);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Removes the socket at `path` if a socket is there (not following a symlink).
pub fn remove(path: &Path) {
    let Ok((dir, name)) = dir_of(path) else { return };
    if socket_inode(&dir, &name).is_ok() {
        let _ = unlink_in(&dir, &name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn planted_symlinks_are_neither_followed_nor_taken() {
        let t = std::env::temp_dir().join(format!("knitter-socket-{}", std::process::id()));
        std::fs::create_dir_all(&t).unwrap();
        let target = t.join("precious");
        std::fs::write(&target, b"x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        // A symlink where the socket goes: replaced, never followed.
        let sock = t.join("net1.sock");
        std::os::unix::fs::symlink(&target, &sock).unwrap();
        let l = listen(&sock, SocketPerms { mode: Some(0o666), owner: None, group: None }).unwrap();
        assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket_like());
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o600, "the target kept its mode");
        assert_eq!(std::fs::metadata(&sock).unwrap().mode() & 0o777, 0o666);
        let _c = connect(&sock).unwrap();
        drop(l);
        // A symlink to a listening socket is not connected through.
        let real = t.join("real.sock");
        let _other = listen(&real, SocketPerms::default()).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::os::unix::fs::symlink(&real, &sock).unwrap();
        let e = connect(&sock).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        remove(&sock);
        assert!(std::fs::symlink_metadata(&sock).is_ok(), "a symlink is not a socket to remove");
        // A directory that is itself a symlink is not entered.
        let link_dir = t.join("dirlink");
        std::os::unix::fs::symlink(&t, &link_dir).unwrap();
        assert!(listen(&link_dir.join("x.sock"), SocketPerms::default()).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    trait SocketLike {
        fn is_socket_like(&self) -> bool;
    }
    impl SocketLike for std::fs::FileType {
        fn is_socket_like(&self) -> bool {
            use std::os::unix::fs::FileTypeExt;
            self.is_socket()
        }
    }
}

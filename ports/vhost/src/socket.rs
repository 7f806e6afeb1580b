//! The port's unix socket, in a directory its pod can write: listened on, given its mode and
//! owner, connected to and removed without following anything the pod may have put there;
//! and [`Dir`], the directory operations the vhost-user hand-off makes there.
//!
//! A pod's app may create, rename and delete files in its vhost-user directory (it makes the
//! socket in client mode), and it may be root. Path-based calls in that directory would
//! follow a symlink it planted: `chmod` of `net1.sock` → `/etc/shadow`, or a `connect`
//! through `net1.sock` → another pod's socket (the switch would then serve another tenant's
//! app as this port). So the directory is opened once with `O_NOFOLLOW` (its parents belong
//! to root and the kubelet), and every operation on a name in it is relative to that
//! descriptor and never follows the name: `unlinkat`, `openat(O_NOFOLLOW)`, `renameat`,
//! `bind` and `connect` through `/proc/self/fd/N/…` and `/proc/self/fd/M` of an
//! `O_PATH|O_NOFOLLOW` descriptor checked to be a socket, whose inode then gets the mode and
//! owner. The switch never uses the socket's full path, so its length does not matter.

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
    CString::new(s)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a fresh descriptor (checked) owned by nobody else.
    check(fd).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A name in a directory: one path component, never `.`, `..` or empty.
fn name(n: &str) -> io::Result<CString> {
    if n.is_empty() || n == "." || n == ".." || n.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{n:?} is not a file name"),
        ));
    }
    cstr(n)
}

/// What is at a name in a [`Dir`], not following a symlink there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    Socket,
    File,
    Dir,
    Symlink,
    Other,
}

/// An open directory (not entered through a symlink in its last component) and the
/// operations on names in it, none of which follows a symlink at the name.
#[derive(Debug)]
pub struct Dir(OwnedFd);

impl Dir {
    /// Opens `path`, refusing a symlink as its last component.
    pub fn open(path: &Path) -> io::Result<Dir> {
        Self::open_with(path, libc::O_NOFOLLOW, " (a symlink is not followed)")
    }

    /// Opens `path`, a directory no pod can change (the node's own, the kubelet's), following
    /// symlinks the node's administrator made.
    pub fn open_trusted(path: &Path) -> io::Result<Dir> {
        Self::open_with(path, 0, "")
    }

    fn open_with(path: &Path, flags: libc::c_int, says: &str) -> io::Result<Dir> {
        let p = cstr(&path.to_string_lossy())?;
        // SAFETY: open of a NUL-terminated path.
        owned(unsafe {
            libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | flags | libc::O_CLOEXEC)
        })
        .map(Dir)
        .map_err(|e| {
            io::Error::new(e.kind(), format!("opening the directory {}{says}: {e}", path.display()))
        })
    }

    /// The directory `n` in this one (not a symlink).
    pub fn open_dir(&self, n: &str) -> io::Result<Dir> {
        let c = name(n)?;
        // SAFETY: openat relative to our directory.
        owned(unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })
        .map(Dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("opening the directory {n} (a symlink is not followed): {e}"),
            )
        })
    }

    /// Makes the directory `n` (mode `mode`, less the umask); one already there is fine.
    pub fn make_dir(&self, n: &str, mode: u32) -> io::Result<()> {
        let c = name(n)?;
        // SAFETY: mkdirat relative to our directory.
        match check(unsafe { libc::mkdirat(self.fd(), c.as_ptr(), mode as libc::mode_t) }) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// What is at `n`, not following a symlink.
    pub fn kind(&self, n: &str) -> io::Result<Kind> {
        let c = name(n)?;
        // SAFETY: stat is plain data; fstatat fills it, not following a symlink at `n`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        match check(unsafe {
            libc::fstatat(self.fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
        }) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
            Err(e) => Err(e),
            Ok(_) => Ok(match st.st_mode & libc::S_IFMT {
                libc::S_IFSOCK => Kind::Socket,
                libc::S_IFREG => Kind::File,
                libc::S_IFDIR => Kind::Dir,
                libc::S_IFLNK => Kind::Symlink,
                _ => Kind::Other,
            }),
        }
    }

    /// Removes `n` if it is not a directory (a symlink itself, never its target); a missing
    /// one is fine.
    pub fn unlink(&self, n: &str) -> io::Result<()> {
        let c = name(n)?;
        // SAFETY: unlinkat relative to our directory (it never follows symlinks).
        match check(unsafe { libc::unlinkat(self.fd(), c.as_ptr(), 0) }) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes the empty directory `n`; a missing or non-empty one is left.
    pub fn remove_dir(&self, n: &str) {
        if let Ok(c) = name(n) {
            // SAFETY: unlinkat relative to our directory.
            unsafe { libc::unlinkat(self.fd(), c.as_ptr(), libc::AT_REMOVEDIR) };
        }
    }

    /// Sets this directory's mode and owner.
    pub fn set_access(&self, perms: SocketPerms) -> io::Result<()> {
        if let Some(mode) = perms.mode {
            // SAFETY: fchmod of our own descriptor.
            check(unsafe { libc::fchmod(self.fd(), mode as libc::mode_t) })?;
        }
        if perms.owner.is_some() || perms.group.is_some() {
            // SAFETY: fchown of our own descriptor; -1 keeps an id.
            check(unsafe {
                libc::fchown(
                    self.fd(),
                    perms.owner.unwrap_or(u32::MAX),
                    perms.group.unwrap_or(u32::MAX),
                )
            })?;
        }
        Ok(())
    }

    /// Writes `bytes` as `n`, atomically (a reader sees the old file or the new one): a new
    /// file beside it (created, never opened through a name already there), given its mode
    /// and owner, renamed over `n` (which replaces whatever `n` was, a symlink included).
    pub fn write_atomically(&self, n: &str, bytes: &[u8], perms: SocketPerms) -> io::Result<()> {
        use std::io::Write;
        let tmp = format!("{n}.tmp");
        let c = name(&tmp)?;
        let create = || {
            // SAFETY: openat relative to our directory; O_EXCL with O_CREAT fails on any name
            // already there, a symlink included.
            owned(unsafe {
                libc::openat(
                    self.fd(),
                    c.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            })
        };
        let fd = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.unlink(&tmp)?;
                create()?
            }
            r => r?,
        };
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)?;
        let file = SocketPerms { mode: Some(perms.mode.unwrap_or(0o644)), ..perms };
        // SAFETY: fchmod/fchown of the file we just created.
        unsafe {
            check(libc::fchmod(f.as_raw_fd(), file.mode.unwrap_or(0o644) as libc::mode_t))?;
            if file.owner.is_some() || file.group.is_some() {
                check(libc::fchown(
                    f.as_raw_fd(),
                    file.owner.unwrap_or(u32::MAX),
                    file.group.unwrap_or(u32::MAX),
                ))?;
            }
        }
        let to = name(n)?;
        // SAFETY: renameat within our directory; neither name is followed.
        check(unsafe { libc::renameat(self.fd(), c.as_ptr(), self.fd(), to.as_ptr()) })?;
        Ok(())
    }

    /// The inode at `n`, not followed, checked to be a socket.
    fn socket_inode(&self, n: &str) -> io::Result<OwnedFd> {
        let c = name(n)?;
        // SAFETY: openat relative to our directory descriptor.
        let fd = owned(unsafe {
            libc::openat(self.fd(), c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        })?;
        // SAFETY: fstat into our zeroed buffer, of a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            let what = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                "a symlink"
            } else {
                "not a socket"
            };
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{n} is {what}")));
        }
        Ok(fd)
    }

    fn fd(&self) -> libc::c_int {
        self.0.as_raw_fd()
    }
}

/// The directory of `path`, opened without following a symlink in its last component, and
/// the socket's name in it.
fn dir_of(path: &Path) -> io::Result<(Dir, String)> {
    let (Some(dir), Some(n)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file in a directory", path.display()),
        ));
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    Ok((Dir::open(dir)?, n.to_string_lossy().into_owned()))
}

/// Listens on `path` (replacing what is there), with `perms` set on the socket file itself.
pub fn listen(path: &Path, perms: SocketPerms) -> io::Result<UnixListener> {
    let (dir, n) = dir_of(path)?;
    dir.unlink(&n)?;
    let via = format!("/proc/self/fd/{}/{n}", dir.fd());
    let listener = UnixListener::bind(&via)
        .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
    if perms.mode.is_some() || perms.owner.is_some() || perms.group.is_some() {
        // The socket as bound, unless the pod replaced it meanwhile (then its own file).
        let inode = dir.socket_inode(&n)?;
        if let Some(mode) = perms.mode {
            let p = cstr(&format!("/proc/self/fd/{}", inode.as_raw_fd()))?;
            // SAFETY: chmod of the NUL-terminated magic link to the inode checked above.
            check(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })?;
        }
        if perms.owner.is_some() || perms.group.is_some() {
            let (uid, gid) = (perms.owner.unwrap_or(u32::MAX), perms.group.unwrap_or(u32::MAX));
            // SAFETY: fchownat of the O_PATH descriptor itself (AT_EMPTY_PATH); -1 keeps an id.
            check(unsafe {
                libc::fchownat(inode.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH)
            })?;
        }
    }
    Ok(listener)
}

/// Connects to the socket at `path` without following a symlink there, waiting at most
/// [`CONNECT_TIMEOUT`]; the stream is blocking.
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    let (dir, n) = dir_of(path)?;
    let inode = dir.socket_inode(&n)?;
    let via = cstr(&format!("/proc/self/fd/{}", inode.as_raw_fd()))?;
    // SAFETY: a fresh non-blocking unix stream socket.
    let s = owned(unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    })?;
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
    let r = unsafe {
        libc::connect(
            s.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) && e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
        let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: poll of one pollfd we own.
        let n =
            check(unsafe { libc::poll(&mut p, 1, CONNECT_TIMEOUT.as_millis() as libc::c_int) })?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the frontend did not accept the connection",
            ));
        }
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into our c_int and its length.
        check(unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
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
    let Ok((dir, n)) = dir_of(path) else { return };
    if dir.kind(&n).ok() == Some(Kind::Socket) {
        let _ = dir.unlink(&n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

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
        assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
        assert_eq!(
            std::fs::metadata(&target).unwrap().mode() & 0o777,
            0o600,
            "the target kept its mode"
        );
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
        // A path longer than a socket address holds: the switch binds and connects through
        // its directory's descriptor.
        let deep = t.join("d".repeat(100));
        std::fs::create_dir_all(&deep).unwrap();
        let long = deep.join("net1.sock");
        let _l = listen(&long, SocketPerms::default()).unwrap();
        connect(&long).unwrap();
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn files_are_written_without_following_what_is_there() {
        let t = std::env::temp_dir().join(format!("knitter-dir-{}", std::process::id()));
        std::fs::create_dir_all(&t).unwrap();
        let target = t.join("precious");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, t.join("net1.json")).unwrap();
        std::os::unix::fs::symlink(&target, t.join("net1.json.tmp")).unwrap();
        let d = Dir::open(&t).unwrap();
        d.write_atomically("net1.json", b"{}", SocketPerms::default()).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(t.join("net1.json")).unwrap(), b"{}");
        assert_eq!(d.kind("net1.json").unwrap(), Kind::File);
        assert_eq!(d.kind("net1.json.tmp").unwrap(), Kind::Missing);
        assert!(d.open_dir("..").is_err() && d.open_dir("a/b").is_err(), "one component only");
        std::os::unix::fs::symlink(&t, t.join("up")).unwrap();
        assert!(d.open_dir("up").is_err(), "a symlinked directory is not entered");
        let _ = std::fs::remove_dir_all(&t);
    }
}

//! A minimal netlink client for the control side (not the packet path): one request, its
//! replies and acknowledgement; attributes built and parsed with bounds checked once per
//! attribute. Generic netlink families are resolved by name.

use crate::sys::check;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const NETLINK_GENERIC: i32 = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
/// A dump: every object of the kind, ended by `NLMSG_DONE`.
pub const NLM_F_DUMP: u16 = 0x300;
pub const NETLINK_ROUTE: i32 = 0;
/// Set on nested attributes.
pub const NLA_F_NESTED: u16 = 1 << 15;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const HDR: usize = 16;
const GENL_HDR: usize = 4;

/// A netlink message under construction: header, generic header, attributes.
pub struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    /// A request of message type `ty` whose payload starts with the fixed header `fixed`.
    pub fn new(ty: u16, flags: u16, fixed: &[u8]) -> Msg {
        let mut buf = vec![0u8; HDR];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf.extend_from_slice(fixed);
        let mut m = Msg { buf, nests: Vec::new() };
        m.pad();
        m
    }

    /// A generic netlink request of `family` with command `cmd`.
    pub fn genl(family: u16, cmd: u8, version: u8, flags: u16) -> Msg {
        Msg::new(family, flags, &[cmd, version, 0, 0])
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    /// Bytes as they are (a fixed header inside a nested attribute).
    pub fn raw(&mut self, b: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(b);
        self.pad();
        self
    }

    pub fn str(&mut self, ty: u16, s: &str) -> &mut Msg {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v)
    }

    pub fn u32(&mut self, ty: u16, v: u32) -> &mut Msg {
        self.attr(ty, &v.to_ne_bytes())
    }

    pub fn flag(&mut self, ty: u16) -> &mut Msg {
        self.attr(ty, &[])
    }

    /// Opens a nested attribute; close it with [`Msg::end`].
    pub fn nest(&mut self, ty: u16) -> &mut Msg {
        self.nests.push(self.buf.len());
        self.attr(ty | NLA_F_NESTED, &[])
    }

    pub fn end(&mut self) -> &mut Msg {
        if let Some(at) = self.nests.pop() {
            let len = (self.buf.len() - at) as u16;
            self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The message as it would be sent with sequence number 0 (for checking requests).
    pub fn encoded(&mut self) -> Vec<u8> {
        self.finish(0).to_vec()
    }

    fn finish(&mut self, seq: u32) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.buf
    }
}

/// Attributes of a message or of a nested attribute, in order.
pub struct Attrs<'a>(&'a [u8]);

impl<'a> Attrs<'a> {
    pub fn new(b: &'a [u8]) -> Attrs<'a> {
        Attrs(b)
    }
}

impl<'a> Iterator for Attrs<'a> {
    /// (type without flags, payload)
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let h = self.0.get(..4)?;
        let len = u16::from_ne_bytes([h[0], h[1]]) as usize;
        let ty = u16::from_ne_bytes([h[2], h[3]]) & 0x3fff;
        let payload = self.0.get(4..len.max(4))?;
        let next = len.next_multiple_of(4).min(self.0.len());
        self.0 = &self.0[next.max(4)..];
        Some((ty, payload))
    }
}

/// The first attribute of type `ty`.
pub fn find(b: &[u8], ty: u16) -> Option<&[u8]> {
    Attrs::new(b).find(|(t, _)| *t == ty).map(|(_, p)| p)
}

/// A NUL-terminated string attribute's text.
pub fn text(p: &[u8]) -> &str {
    let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
    std::str::from_utf8(&p[..end]).unwrap_or("")
}

/// A netlink socket of one protocol, in the calling thread's network namespace.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    pub fn open(protocol: i32) -> io::Result<Socket> {
        Self::bound(protocol, 0)
    }

    /// A socket that also receives the multicast `groups` (`RTMGRP_*` bits) of `protocol`:
    /// the kernel's notifications, read with [`Socket::wait`].
    pub fn subscribe(protocol: i32, groups: u32) -> io::Result<Socket> {
        Self::bound(protocol, groups)
    }

    /// Waits up to `timeout` for notifications and reads every one there is; true when any
    /// came. A receive buffer that overflowed (`ENOBUFS`: notifications were lost) counts as
    /// one, since the caller looks again at the state they were about.
    pub fn wait(&mut self, timeout: std::time::Duration) -> io::Result<bool> {
        self.read(timeout, |_, _| {}).map(|n| n.is_some())
    }

    /// [`Socket::wait`], handing each notification to `f` (its message type and payload, after
    /// the netlink header). `Some(lost)` when any came, `lost` true if the receive buffer
    /// overflowed (some were lost: the caller reads the state again).
    pub fn read(
        &mut self,
        timeout: std::time::Duration,
        mut f: impl FnMut(u16, &[u8]),
    ) -> io::Result<Option<bool>> {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one pollfd on our own descriptor.
        match check(unsafe { libc::poll(&mut p, 1, ms) }) {
            Ok(0) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let mut buf = vec![0u8; 65536];
        let mut lost = false;
        loop {
            // SAFETY: `buf` is writable for its length; non-blocking, so it returns when drained.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                let mut rest = &buf[..n as usize];
                while rest.len() >= HDR {
                    let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                    if len < HDR || len > rest.len() {
                        break; // truncated: the rest of this datagram is not readable
                    }
                    f(u16::from_ne_bytes([rest[4], rest[5]]), &rest[HDR..len]);
                    rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                }
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(Some(lost)),
                Some(libc::ENOBUFS) => lost = true,
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
        }
    }

    fn bound(protocol: i32, groups: u32) -> io::Result<Socket> {
        // SAFETY: plain socket(2); the descriptor is owned below.
        let fd = check(unsafe {
            libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol)
        })?;
        // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data; zero means "kernel assigns the port id".
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        // SAFETY: `sa` is a valid sockaddr_nl of `len` bytes.
        check(unsafe {
            libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_nl).cast(), len)
        })?;
        Ok(Socket { fd, seq: 1 })
    }

    /// Sends `msg` and collects the payloads of its replies (after the netlink header) until
    /// the acknowledgement; a negative acknowledgement is the error it carries.
    pub fn request(&mut self, msg: &mut Msg) -> io::Result<Vec<Vec<u8>>> {
        self.seq += 1;
        let seq = self.seq;
        let b = msg.finish(seq);
        // SAFETY: `b` is a valid buffer of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), b.as_ptr().cast(), b.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= HDR {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let ty = u16::from_ne_bytes([rest[4], rest[5]]);
                let rseq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
                if len < HDR || len > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let body = &rest[HDR..len];
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                if rseq != seq {
                    continue;
                }
                match ty {
                    NLMSG_ERROR => {
                        let code = body
                            .get(..4)
                            .map_or(0, |e| i32::from_ne_bytes([e[0], e[1], e[2], e[3]]));
                        return if code == 0 {
                            Ok(replies)
                        } else {
                            Err(io::Error::from_raw_os_error(-code))
                        };
                    }
                    NLMSG_DONE => return Ok(replies),
                    _ => replies.push(body.to_vec()),
                }
            }
        }
    }

    /// The id of generic netlink family `name`.
    pub fn family(&mut self, name: &str) -> io::Result<u16> {
        let mut m = Msg::genl(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, NLM_F_ACK);
        m.str(CTRL_ATTR_FAMILY_NAME, name);
        let replies = self.request(&mut m)?;
        replies
            .iter()
            .filter_map(|r| find(r.get(GENL_HDR..)?, CTRL_ATTR_FAMILY_ID))
            .find_map(|p| Some(u16::from_ne_bytes([*p.first()?, *p.get(1)?])))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no generic netlink family {name:?}"),
                )
            })
    }
}

/// The attributes of a generic netlink reply (after its generic header).
pub fn genl_attrs(reply: &[u8]) -> &[u8] {
    reply.get(GENL_HDR..).unwrap_or_default()
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn nested_attributes_round_trip() {
        let mut m = Msg::genl(20, 1, 1, 0);
        m.nest(1).str(2, "eth0").u32(3, 7).end().flag(4);
        let b = m.finish(9).to_vec();
        let attrs: Vec<(u16, Vec<u8>)> =
            Attrs::new(&b[HDR + GENL_HDR..]).map(|(t, p)| (t, p.to_vec())).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[1], (4, vec![]));
        let inner: Vec<(u16, Vec<u8>)> =
            Attrs::new(&attrs[0].1).map(|(t, p)| (t, p.to_vec())).collect();
        assert_eq!(text(&inner[0].1), "eth0");
        assert_eq!(inner[1], (3, 7u32.to_ne_bytes().to_vec()));
    }

    #[test]
    fn hostile_attributes_end_cleanly() {
        for b in [&[0u8; 3][..], &[2, 0, 1, 0], &[200, 0, 1, 0, 1, 2], &[0, 0, 0, 0, 0, 0, 0, 0]] {
            assert!(Attrs::new(b).count() <= 2);
        }
    }
}

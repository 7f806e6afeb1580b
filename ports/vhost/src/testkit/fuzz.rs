//! Fuzzing what a frontend sends, with the switch's own code on the other end: shared by
//! the cargo-fuzz targets (`ports/vhost/fuzz`) and the property tests that run them in CI
//! (`tests/fuzz.rs`).
//!
//! - [`messages`]: any sequence of vhost-user messages, any payload, any descriptors
//!   attached (memfds of any size, eventfds, pipes, sockets, `/dev/null`), written to a
//!   socket the backend serves; optionally after a well-formed negotiation and memory table,
//!   so the fuzzer reaches the ring messages. The backend must neither panic nor hang.
//! - [`virtqueue`]: any rings (size, addresses, features) over a small guest memory of any
//!   bytes, run as a port's queue pair by the PMD-side code (bursts in and out, lending,
//!   completions), with the guest changing its memory between bursts. No panic, no buffer
//!   leaked.

use crate::memory::{GuestAddr, GuestMemory, Mapping};
use crate::packed::PackedQueue;
use crate::port::VhostPort;
use crate::queue::Virtqueue;
use crate::vring::SplitQueue;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use vswitch::port::Port;
use vswitch::{Batch, Pool, PoolCache};

/// Bytes of guest memory the fuzzed rings live in.
pub const FUZZ_MEM: usize = 0x1_0000;

/// Takes `n` bytes from the front of `data` (fewer when it runs out).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = data.split_at(n.min(data.len()));
    *data = b;
    a
}

fn byte(data: &mut &[u8]) -> u8 {
    take(data, 1).first().copied().unwrap_or(0)
}

fn u16_of(data: &mut &[u8]) -> u16 {
    let b = take(data, 2);
    u16::from_le_bytes([b.first().copied().unwrap_or(0), b.get(1).copied().unwrap_or(0)])
}

fn memfd(len: usize, fill: &[u8]) -> OwnedFd {
    // SAFETY: memfd_create with a static name; checked and owned below.
    let fd = unsafe { libc::memfd_create(c"knitter-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and pwrite on our own descriptor, from our slice.
    unsafe {
        libc::ftruncate(fd.as_raw_fd(), len as i64);
        libc::pwrite(fd.as_raw_fd(), fill.as_ptr().cast(), fill.len().min(len), 0);
    }
    fd
}

/// A descriptor of the kind the fuzzer picked.
fn descriptor(data: &mut &[u8]) -> OwnedFd {
    let own = |fd: RawFd| {
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    match byte(data) % 6 {
        0 => {
            let pages = byte(data) as usize % 17;
            memfd(pages * 4096, &[])
        }
        // SAFETY: eventfd has no memory preconditions.
        1 => own(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }),
        2 => {
            let mut p = [0; 2];
            // SAFETY: pipe fills our array.
            unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) };
            drop(own(p[0]));
            own(p[1])
        }
        // SAFETY: open of a static NUL-terminated path.
        3 => own(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }),
        4 => {
            let (a, _b) = UnixStream::pair().expect("socketpair");
            OwnedFd::from(a)
        }
        _ => memfd(FUZZ_MEM, &[0xa5; 64]),
    }
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS), as one message.
fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[OwnedFd]) {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut iov =
        libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let space = if raw.is_empty() {
        0
    } else {
        // SAFETY: CMSG_SPACE only computes a size.
        (unsafe { libc::CMSG_SPACE((raw.len() * 4) as u32) }) as usize
    };
    let mut cbuf = vec![0u8; space];
    // SAFETY: msghdr is plain data; every pointer below is to our locals, which outlive the
    // call; the control buffer has CMSG_SPACE for the descriptors.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !raw.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((raw.len() * 4) as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                raw.len(),
            );
        }
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
    }
}

/// A vhost-user message: header (request, flags: version 1 and maybe NEED_REPLY, size) and
/// body.
fn message(request: u32, need_reply: bool, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + body.len());
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&(1u32 | if need_reply { 8 } else { 0 }).to_le_bytes());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// The start of a connection as QEMU or DPDK would make it: owner, features, protocol
/// features, a memory table of one memfd region (its bytes from `fill`).
fn negotiation(sock: &UnixStream, fill: &[u8]) {
    send_with_fds(sock, &message(3, false, &[]), &[]); // SET_OWNER
    send_with_fds(sock, &message(2, false, &crate::backend::FEATURES.to_le_bytes()), &[]); // SET_FEATURES
    send_with_fds(sock, &message(16, false, &0x3fu64.to_le_bytes()), &[]); // SET_PROTOCOL_FEATURES
    let mut table = Vec::new();
    table.extend_from_slice(&1u32.to_le_bytes());
    table.extend_from_slice(&0u32.to_le_bytes());
    for v in [0u64, FUZZ_MEM as u64, 0x7000_0000_0000, 0] {
        table.extend_from_slice(&v.to_le_bytes());
    }
    send_with_fds(sock, &message(5, false, &table), &[memfd(FUZZ_MEM, fill)]); // SET_MEM_TABLE
}

/// Serves one connection whose frontend sends what `data` says, then closes. Input: a first
/// byte (bit 0: start with a well-formed negotiation), then records — a flags byte (bits
/// 0..2: descriptors to attach, each of a kind the next bytes pick; bit 3: raw bytes rather
/// than a well-formed header; bit 4: ask for a reply), a request number, a length (two
/// bytes, at most 512) and that many bytes of body (or raw message).
pub fn messages(mut data: &[u8]) {
    let port = Arc::new(VhostPort::new("fuzz", Pool::new(256, false).expect("pool")));
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    // Replies the fuzzed frontend never reads must not fill its buffer mid-input.
    let _ = theirs.set_nonblocking(true);
    let d = &mut data;
    if byte(d) & 1 != 0 {
        let fill = take(d, 256).to_vec();
        negotiation(&theirs, &fill);
    }
    let mut sent = 0;
    while !d.is_empty() && sent < 64 * 1024 {
        let flags = byte(d);
        let fds: Vec<OwnedFd> = (0..flags & 3).map(|_| descriptor(d)).collect();
        let request = byte(d) as u32;
        let len = (u16_of(d) % 513) as usize;
        let body = take(d, len);
        let bytes =
            if flags & 8 != 0 { body.to_vec() } else { message(request, flags & 16 != 0, body) };
        sent += bytes.len();
        send_with_fds(&theirs, &bytes, &fds);
    }
    // SAFETY: shutdown of our own socket's sending side: the backend reads to its end.
    unsafe { libc::shutdown(theirs.as_raw_fd(), libc::SHUT_WR) };
    crate::backend::serve_stream(ours, &port);
    drop(theirs);
}

/// Runs a port's queue pair on rings the fuzzer laid out in a guest memory of its bytes.
/// Input: queue size (a power of two up to 256), ring addresses (three per ring, two bytes
/// each, in 16-byte units), features (bit 0: EVENT_IDX, 1: indirect, 2: mergeable receive
/// buffers, 3: single copy, 4: packed rings, of any size up to 256 and any base, 5: in
/// order), the
/// memory's first bytes, then what the guest writes into its
/// memory before each of four rounds (a burst from the guest, one to it, completions).
pub fn virtqueue(mut data: &[u8]) {
    let d = &mut data;
    let size = 1u16 << (byte(d) % 9);
    let mut addr = || GuestAddr((u16_of(d) as u64 * 16) % FUZZ_MEM as u64);
    let (rx_desc, rx_avail, rx_used, tx_desc, tx_avail, tx_used) =
        (addr(), addr(), addr(), addr(), addr(), addr());
    let features = byte(d);
    let map = Mapping::anonymous(FUZZ_MEM).expect("guest memory");
    let mem = Arc::new(GuestMemory::new(vec![(0, 0x7000_0000_0000, map)]).expect("one region"));
    let write = |d: &mut &[u8]| {
        let at = u16_of(d) as u64 % FUZZ_MEM as u64;
        let n = (u16_of(d) % 1024) as usize;
        let bytes = take(d, n);
        if let Ok(s) = mem.slice(GuestAddr(at), bytes.len().min(FUZZ_MEM - at as usize)) {
            s.write(bytes);
        }
    };
    write(d);
    let pool = Pool::new(512, false).expect("pool");
    let before = pool.free_count();
    let port = Arc::new(VhostPort::new("fuzz", pool.clone()));
    port.set_single_copy(features & 8 != 0);
    let base = u16_of(d);
    let queue = |desc, avail, used| {
        let mut q: Virtqueue = if features & 16 != 0 {
            let size = (base >> 8).max(1);
            PackedQueue::new(size, desc, avail, used, (base & 0x8000) | (base % size)).ok()?.into()
        } else {
            SplitQueue::new(size, desc, avail, used, 0).ok()?.into()
        };
        q.set_features(features & 1 != 0, features & 2 != 0);
        q.set_in_order(features & 32 != 0);
        Some(q)
    };
    let (Some(rx), Some(tx)) =
        (queue(rx_desc, rx_avail, rx_used), queue(tx_desc, tx_avail, tx_used))
    else {
        return;
    };
    port.configure(|dev| {
        dev.set_memory(Some(mem.clone()));
        dev.set_mrg_rxbuf(features & 4 != 0);
        dev.run_pair(0, rx, tx);
    });
    let mut cache = PoolCache::new(pool.clone());
    let mut batch = Batch::new();
    for _ in 0..4 {
        write(d);
        port.rx_burst(0, &mut cache, &mut batch);
        for b in batch.drain() {
            cache.free(b);
        }
        if cache.lending() {
            cache.end_lending();
            port.rx_done(0);
        }
        // A small frame, a full-size one, and one of two segments (a jumbo's shape).
        let (small, full, part) = ([0x5au8; 60], [0x5bu8; 1514], [0x5cu8; 1500]);
        for pieces in [&[&small[..]][..], &[&full[..]], &[&part[..], &part[..]]] {
            if let Some(b) = cache.alloc_chain(pieces) {
                let _ = batch.push(b).map_err(|b| cache.free(b));
            }
        }
        port.tx_burst(0, &mut cache, &mut batch);
        for b in batch.drain() {
            cache.free(b);
        }
    }
    drop(cache);
    assert_eq!(pool.free_count(), before, "buffers leaked");
}

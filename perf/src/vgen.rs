//! Knitter's own traffic generator on vhost-user: a frontend on each of the switch's two
//! sockets (A offers, B receives), as a DPDK VNF's virtio-user would be, driven by the
//! trial loop of [`crate::trial`] on one thread pinned to the generator CPU. It maps its own memory (a memfd, on hugepages when
//! asked), offers prepared frames at a set rate or as fast as it can, and counts what comes
//! out of B. In latency trials every frame carries the TSC at the moment it was offered
//! and B records its age in an HDR histogram.
//!
//! Cheaper per frame than testpmd replaying a pcap (no mbufs, no copies: the frames sit in
//! their buffers and only their descriptors go round), so a fast switch is the bottleneck
//! more often; its own ceiling is what the yardstick (testpmd's `io` forwarding) measures
//! through it.
//!
//! Features offered to every switch alike: `VERSION_1` and `MRG_RXBUF` (what virtio-user
//! asks for), protocol features `REPLY_ACK` when the switch has them; one queue pair of
//! [`QUEUE`] descriptors per port; interrupts off, kicks sent only when the switch asks.

use crate::driver::{Queue, Shared, VIRTQ_DESC_F_WRITE};
use crate::scenario::Traffic;
use crate::trial::{Ages, Wire, tsc};
use anyhow::Context;
use knitter_vhost::backend::{VIRTIO_F_VERSION_1, VIRTIO_NET_F_MRG_RXBUF};
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::path::Path;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

/// Descriptors per queue: the most virtio-user and the switches take (FD.io CSIT's vhost
/// tests use 1024 too). A switch's PMD or the generator that misses a turn (this VM's vCPUs
/// do, for up to milliseconds) overflows a small ring at once: loss the NDR would count.
pub const QUEUE: u16 = crate::trial::RING as u16;
const BUF: u64 = 2048;
const HDR_LEN: usize = knitter_vhost::net::HDR_LEN;
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// Virtqueues: A's rx and tx, B's rx and tx (ring areas 0..4 in the shared memory).
const A_RX: usize = 0;
const A_TX: usize = 1;
const B_RX: usize = 2;
const B_TX: usize = 3;

/// One socket's frontend and its two queues.
struct Port {
    /// Kept open: closing the socket is a disconnect.
    _fe: Frontend,
    /// The guest's receive (virtqueue 0) and transmit (1) queues.
    rx: Queue,
    tx: Queue,
    kicks: [EventFd; 2],
    _calls: [EventFd; 2],
}

impl Port {
    fn kick(&self, q: usize) {
        let _ = self.kicks[q].write(1);
    }
}

/// The generator's wire: frontends on a switch's two sockets.
pub struct Vgen {
    mem: Shared,
    a: Port,
    b: Port,
    /// A's transmit descriptors not in the switch's hands, oldest first: every descriptor
    /// (so every flow's frame) takes its turn; a stack would offer the same few again.
    free: VecDeque<u16>,
    /// B's, for the learning frames.
    b_free: Vec<u16>,
    /// Where the latency stamp goes in an offered frame and is read in a received one
    /// (the inner UDP payload: the frames carry no UDP checksum, so it keeps them valid).
    stamps: [usize; 2],
}

impl Vgen {
    /// Connects to `a_sock` and `b_sock` (vhost-user servers), offering the traffic's frames
    /// (in turn) on A; its `back` frame is what B sends now and then so a learning switch
    /// knows where B is.
    pub fn connect(
        a_sock: &Path,
        b_sock: &Path,
        traffic: &Traffic,
        huge: bool,
    ) -> anyhow::Result<Vgen> {
        let (frames, back) = (&traffic.offered, &traffic.back);
        anyhow::ensure!(!frames.is_empty(), "no frames to offer");
        let stamps = [traffic.stamp_offered, traffic.stamp_received];
        anyhow::ensure!(
            frames.iter().all(|f| f.len() >= stamps[0] + 8),
            "frames too short for the latency stamp"
        );
        let len = Shared::buffers_from(4) + 4 * QUEUE as u64 * BUF;
        // No quiet fallback to plain pages: every copy a switch makes from or to this memory
        // would miss the TLB more, and the run would measure something else than it says.
        let mem = Shared::new(len as usize, huge).with_context(|| {
            format!(
                "the generator's memory ({} MiB{})",
                len >> 20,
                if huge { " of hugepages" } else { "" }
            )
        })?;
        let a = port(&mem, a_sock, A_RX, A_TX)
            .with_context(|| format!("connecting to {}", a_sock.display()))?;
        let b = port(&mem, b_sock, B_RX, B_TX)
            .with_context(|| format!("connecting to {}", b_sock.display()))?;
        let mut g = Vgen {
            mem,
            a,
            b,
            free: VecDeque::with_capacity(QUEUE as usize),
            b_free: Vec::new(),
            stamps,
        };
        for i in 0..QUEUE {
            let f = &frames[i as usize % frames.len()];
            let (a, b) = (g.fill(A_TX, i, f)?, g.fill(B_TX, i, back)?);
            g.free.push_back(a);
            g.b_free.push(b);
            for (k, q) in [(A_RX, &mut g.a.rx), (B_RX, &mut g.b.rx)] {
                q.set_desc(i, buf_addr(k, i), BUF as u32, VIRTQ_DESC_F_WRITE);
                q.post(i);
            }
        }
        for (p, q) in [(&mut g.a, 0), (&mut g.b, 0)] {
            if p.rx.publish() {
                p.kick(q);
            }
        }
        Ok(g)
    }

    /// Writes `frame` behind a zero header into transmit buffer `i` of queue area `k` and
    /// points descriptor `i` at it; returns `i`.
    fn fill(&mut self, k: usize, i: u16, frame: &[u8]) -> anyhow::Result<u16> {
        anyhow::ensure!(
            frame.len() + HDR_LEN <= BUF as usize,
            "a {}-byte frame does not fit a buffer",
            frame.len()
        );
        let addr = buf_addr(k, i);
        // SAFETY: buffer `i` is not posted (it is being filled before `set_desc`), so the
        // switch does not touch it; `b` ends before it is posted.
        let b = unsafe { self.mem.buffer(addr, HDR_LEN + frame.len()) }
            .context("buffer outside the generator's memory")?;
        b[..HDR_LEN].fill(0);
        b[HDR_LEN..].copy_from_slice(frame);
        let q = if k == A_TX { &mut self.a.tx } else { &mut self.b.tx };
        q.set_desc(i, addr, (HDR_LEN + frame.len()) as u32, 0);
        Ok(i)
    }

    #[inline]
    fn stamp(&self, h: u16, t: u64) {
        let at = buf_addr(A_TX, h) + (HDR_LEN + self.stamps[0]) as u64;
        // SAFETY: `h` is about to be posted, not yet: the switch does not read it until then.
        let stamp = unsafe { self.mem.buffer(at, 8) };
        if let Some(b) = stamp {
            b.copy_from_slice(&t.to_le_bytes());
        }
    }
}

impl Wire for Vgen {
    /// One frame from B, so a learning switch knows where B is (and keeps knowing).
    fn learn(&mut self) {
        let n = self.b.tx.completed();
        for _ in 0..n {
            if let Some((h, _)) = self.b.tx.take_used() {
                self.b_free.push(h);
            }
        }
        if let Some(h) = self.b_free.pop() {
            self.b.tx.post(h);
            if self.b.tx.publish() {
                self.b.kick(1);
            }
        }
    }

    /// A's transmit descriptors the switch is done with come back first.
    #[inline]
    fn room(&mut self) -> usize {
        let n = self.a.tx.completed();
        for _ in 0..n {
            if let Some((h, _)) = self.a.tx.take_used() {
                self.free.push_back(h);
            }
        }
        self.free.len()
    }

    #[inline]
    fn offer(&mut self, k: usize, stamp: bool) -> usize {
        let mut sent = 0;
        for _ in 0..k {
            let Some(h) = self.free.pop_front() else { break };
            if stamp {
                self.stamp(h, tsc());
            }
            self.a.tx.post(h);
            sent += 1;
        }
        if sent > 0 && self.a.tx.publish() {
            self.a.kick(1);
        }
        sent
    }

    /// Frames out of B: counted (and aged), their buffers posted again.
    #[inline]
    fn receive(&mut self, mut ages: Option<&mut Ages>) -> (u64, u64) {
        let n = self.b.rx.completed();
        if n == 0 {
            return (0, 0);
        }
        let (now, mut bytes) = (tsc(), 0);
        for _ in 0..n {
            let Some((h, len)) = self.b.rx.take_used() else { continue };
            bytes += (len as usize).saturating_sub(HDR_LEN) as u64;
            if let Some(ages) = ages.as_deref_mut()
                && len as usize >= HDR_LEN + self.stamps[1] + 8
                // SAFETY: `h` came back in the used ring and is posted again only below.
                && let Some(b) = unsafe {
                    self.mem.buffer(buf_addr(B_RX, h) + (HDR_LEN + self.stamps[1]) as u64, 8)
                }
            {
                ages.record(b, now);
            }
            self.b.rx.post(h);
        }
        if self.b.rx.publish() {
            self.b.kick(0);
        }
        (n as u64, bytes)
    }

    /// Frames out of A (floods before the switch learned B): counted, buffers reposted.
    #[inline]
    fn drain_stray(&mut self) -> u64 {
        let n = self.a.rx.completed();
        for _ in 0..n {
            if let Some((h, _)) = self.a.rx.take_used() {
                self.a.rx.post(h);
            }
        }
        if n > 0 && self.a.rx.publish() {
            self.a.kick(0);
        }
        n as u64
    }

    fn bad_completions(&self) -> u64 {
        [&self.a.rx, &self.a.tx, &self.b.rx, &self.b.tx].iter().map(|q| q.bad_completions).sum()
    }
}

/// Buffer `i` of queue area `k`.
fn buf_addr(k: usize, i: u16) -> u64 {
    Shared::buffers_from(4) + (k as u64 * QUEUE as u64 + i as u64) * BUF
}

/// Connects a frontend to `sock` and sets up its queue pair in ring areas `rx_area`,
/// `tx_area`, as QEMU or virtio-user would: features, memory table, rings, enable.
fn port(mem: &Shared, sock: &Path, rx_area: usize, tx_area: usize) -> anyhow::Result<Port> {
    let mut fe = Frontend::connect(sock, 2)?;
    fe.set_owner()?;
    let offered = fe.get_features()?;
    anyhow::ensure!(
        offered & VIRTIO_F_VERSION_1 != 0,
        "the switch does not offer VIRTIO_F_VERSION_1"
    );
    let features =
        offered & (VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF | VHOST_USER_F_PROTOCOL_FEATURES);
    fe.set_features(features & !knitter_vhost::backend::VIRTIO_F_RING_PACKED)?; // it drives split rings
    if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        let pf = fe.get_protocol_features()?;
        fe.set_protocol_features(pf & VhostUserProtocolFeatures::REPLY_ACK)?;
    }
    let user = mem.user_base();
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: mem.len() as u64,
        userspace_addr: user,
        mmap_offset: 0,
        mmap_handle: mem.fd().as_raw_fd(),
    };
    fe.set_mem_table(std::slice::from_ref(&region))?;
    let rx = mem.queue(rx_area, QUEUE).context("ring area")?;
    let tx = mem.queue(tx_area, QUEUE).context("ring area")?;
    let kicks = [EventFd::new(libc::EFD_NONBLOCK)?, EventFd::new(libc::EFD_NONBLOCK)?];
    let calls = [EventFd::new(libc::EFD_NONBLOCK)?, EventFd::new(libc::EFD_NONBLOCK)?];
    for (i, q) in [&rx, &tx].into_iter().enumerate() {
        fe.set_vring_num(i, q.size)?;
        let [d, a, u] = q.offsets;
        let cfg = VringConfigData {
            queue_max_size: q.size,
            queue_size: q.size,
            flags: 0,
            desc_table_addr: user + d,
            used_ring_addr: user + u,
            avail_ring_addr: user + a,
            log_addr: None,
        };
        fe.set_vring_addr(i, &cfg)?;
        fe.set_vring_base(i, 0)?;
        fe.set_vring_call(i, &calls[i])?;
        fe.set_vring_kick(i, &kicks[i])?;
        if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            fe.set_vring_enable(i, true)?;
        }
    }
    Ok(Port { _fe: fe, rx, tx, kicks, _calls: calls })
}

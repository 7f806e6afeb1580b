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
//! through it. With more frames than descriptors (`--macs`: thousands of hosts a side) each
//! frame has a buffer of its own and every post points its descriptor at the next one
//! ([`Frames`]), so every host's frame takes its turn and the switch reads them all.
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
use std::time::{Duration, Instant};
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
    /// The frames A offers and B sends so the switch learns where its hosts are.
    offered: Frames,
    back: Frames,
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
        // A's and B's receive buffers, then a buffer for each frame A offers and B sends.
        let (n_offered, n_back) = (buffers_for(frames.len()), buffers_for(back.len()));
        let offered_from = Shared::buffers_from(4) + 2 * QUEUE as u64 * BUF;
        let back_from = offered_from + n_offered as u64 * BUF;
        let len = back_from + n_back as u64 * BUF;
        // No quiet fallback to plain pages: every copy a switch makes from or to this memory
        // would miss the TLB more, and the run would measure something else than it says.
        let mem = Shared::new(len as usize, huge).with_context(|| {
            format!(
                "the generator's memory ({} MiB{})",
                len >> 20,
                if huge { " of hugepages" } else { "" }
            )
        })?;
        let mut a = port(&mem, a_sock, A_RX, A_TX)
            .with_context(|| format!("connecting to {}", a_sock.display()))?;
        let mut b = port(&mem, b_sock, B_RX, B_TX)
            .with_context(|| format!("connecting to {}", b_sock.display()))?;
        let offered = Frames::write(&mem, &mut a.tx, offered_from, frames)?;
        let back = Frames::write(&mem, &mut b.tx, back_from, back)?;
        let mut g = Vgen {
            mem,
            a,
            b,
            free: (0..QUEUE).collect(),
            b_free: (0..QUEUE).collect(),
            offered,
            back,
            stamps,
        };
        for i in 0..QUEUE {
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

    /// B's transmit descriptors the switch is done with.
    fn reclaim_back(&mut self) {
        let n = self.b.tx.completed();
        for _ in 0..n {
            if let Some((h, _)) = self.b.tx.take_used() {
                self.back.returned(h);
                self.b_free.push(h);
            }
        }
    }
}

impl Wire for Vgen {
    /// B's frames, each once (one, or one a host behind B), so a learning switch knows
    /// where B's hosts are (and keeps knowing); given up after [`learning_time`].
    fn learn(&mut self) {
        let deadline = Instant::now() + learning_time(self.back.len());
        let mut left = self.back.len();
        while left > 0 {
            self.reclaim_back();
            let mut posted = false;
            while left > 0 {
                let Some(h) = self.b_free.pop() else { break };
                self.back.point(&mut self.b.tx, h);
                self.b.tx.post(h);
                (left, posted) = (left - 1, true);
            }
            if posted && self.b.tx.publish() {
                self.b.kick(1);
            }
            // What B's frames flood towards A, so A's ring has room for the rest.
            self.drain_stray();
            if left > 0 && Instant::now() > deadline {
                tracing::warn!(left, "the switch did not take every learning frame in time");
                break;
            }
        }
    }

    /// A's transmit descriptors the switch is done with come back first.
    #[inline]
    fn room(&mut self) -> usize {
        let n = self.a.tx.completed();
        for _ in 0..n {
            if let Some((h, _)) = self.a.tx.take_used() {
                self.offered.returned(h);
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
            let j = self.offered.point(&mut self.a.tx, h);
            if stamp && self.offered.only_post(j) {
                let at = self.offered.addr(j) + (HDR_LEN + self.stamps[0]) as u64;
                // SAFETY: buffer `j` is in no descriptor the switch holds (`only_post`: the
                // one pointed at it is posted below, after the write).
                if let Some(b) = unsafe { self.mem.buffer(at, 8) } {
                    b.copy_from_slice(&tsc().to_le_bytes());
                }
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

/// Receive buffer `i` of queue area `k` (A's, then B's).
fn buf_addr(k: usize, i: u16) -> u64 {
    let side = if k == A_RX { 0 } else { 1 };
    Shared::buffers_from(4) + (side * QUEUE as u64 + i as u64) * BUF
}

/// Buffers a transmit queue's `frames` take: one a descriptor (the frames in turn), or one a
/// frame when there are more frames than descriptors.
fn buffers_for(frames: usize) -> usize {
    frames.max(QUEUE as usize)
}

/// Hugepage memory the generator's frames take beyond [`QUEUE`] a side, MiB, with at most
/// `frames` distinct frames a side ([`crate::frames::distinct`]; counted both ways).
pub fn frames_mib(frames: usize) -> u64 {
    let extra = buffers_for(frames) - QUEUE as usize;
    (2 * extra as u64 * BUF).div_ceil(1 << 20)
}

/// How long the switch gets to take `frames` learning frames (OVS learns each new MAC in
/// its slow path).
fn learning_time(frames: usize) -> Duration {
    Duration::from_micros(100 + 20 * frames as u64)
}

/// A transmit queue's frames, each behind a zero virtio-net header in a buffer of its own
/// from guest address `base`, and which one the next post carries. With no more frames than
/// descriptors, descriptor `i` keeps buffer `i` (frame `i % frames`) for good; with more,
/// each post points its descriptor at the next frame's buffer, so all of them take turns.
struct Frames {
    base: u64,
    /// Each buffer's bytes (header and frame).
    lens: Vec<u32>,
    /// The buffer the next post carries (rotating).
    next: usize,
    /// The buffer each descriptor carries while the switch holds it (rotating).
    carried: Vec<u32>,
    /// Descriptors carrying each buffer (rotating): a buffer posted again while the switch
    /// still holds it (a switch may return descriptors out of order) is not written to.
    posts: Vec<u16>,
}

impl Frames {
    /// Writes `frames` into their buffers and, not rotating, points the descriptors of `q`
    /// at them.
    fn write(mem: &Shared, q: &mut Queue, base: u64, frames: &[Vec<u8>]) -> anyhow::Result<Frames> {
        anyhow::ensure!(!frames.is_empty(), "no frames to send");
        let n = buffers_for(frames.len());
        let mut lens = Vec::with_capacity(n);
        for j in 0..n {
            let frame = &frames[j % frames.len()];
            let len = HDR_LEN + frame.len();
            anyhow::ensure!(
                len <= BUF as usize,
                "a {}-byte frame does not fit a buffer",
                frame.len()
            );
            let addr = base + j as u64 * BUF;
            // SAFETY: no descriptor is posted yet: the switch does not touch the buffer, and
            // `b` ends here.
            let b = unsafe { mem.buffer(addr, len) }
                .context("buffer outside the generator's memory")?;
            b[..HDR_LEN].fill(0);
            b[HDR_LEN..].copy_from_slice(frame);
            lens.push(len as u32);
        }
        let rotating = n > QUEUE as usize;
        if !rotating {
            for i in 0..QUEUE {
                q.set_desc(i, base + i as u64 * BUF, lens[i as usize], 0);
            }
        }
        let (carried, posts) =
            if rotating { (vec![0; QUEUE as usize], vec![0; n]) } else { (Vec::new(), Vec::new()) };
        Ok(Frames { base, lens, next: 0, carried, posts })
    }

    /// Frames (buffers) in turn.
    fn len(&self) -> usize {
        self.lens.len()
    }

    fn rotating(&self) -> bool {
        !self.posts.is_empty()
    }

    fn addr(&self, j: usize) -> u64 {
        self.base + j as u64 * BUF
    }

    /// The buffer descriptor `h` of `q` carries in its next post (pointing it there when
    /// rotating): the next in turn that no descriptor the switch holds carries (one returned
    /// out of order can leave one held; skipping it keeps every posted buffer's latency stamp
    /// this post's). One is free among any [`QUEUE`] + 1 in turn: at most [`QUEUE`] are held.
    #[inline]
    fn point(&mut self, q: &mut Queue, h: u16) -> usize {
        if !self.rotating() {
            return h as usize;
        }
        let mut j = self.next;
        for _ in 0..self.len() {
            if self.posts[j] == 0 {
                break;
            }
            j = if j + 1 == self.len() { 0 } else { j + 1 };
        }
        self.next = if j + 1 == self.len() { 0 } else { j + 1 };
        q.set_desc(h, self.addr(j), self.lens[j], 0);
        self.carried[h as usize] = j as u32;
        self.posts[j] += 1;
        j
    }

    /// Descriptor `h` came back from the switch.
    #[inline]
    fn returned(&mut self, h: u16) {
        if let Some(&j) = self.carried.get(h as usize) {
            self.posts[j as usize] = self.posts[j as usize].saturating_sub(1);
        }
    }

    /// Whether buffer `j`, just pointed at, is in no other descriptor the switch holds.
    #[inline]
    fn only_post(&self, j: usize) -> bool {
        self.posts.get(j).is_none_or(|&n| n <= 1)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Descriptor `h`'s buffer address and length, as the switch reads them.
    fn desc(mem: &Shared, q: &Queue, h: u16) -> (u64, u32) {
        // SAFETY: the table is this test's alone (no switch).
        let d = unsafe { mem.buffer(q.offsets[0] + 16 * h as u64, 16) }.unwrap();
        (
            u64::from_le_bytes(d[..8].try_into().unwrap()),
            u32::from_le_bytes(d[8..12].try_into().unwrap()),
        )
    }

    #[test]
    fn more_frames_than_descriptors_each_take_their_turn() {
        let hosts = 3 * QUEUE as usize / 2;
        let frames: Vec<Vec<u8>> = (0..hosts).map(|j| vec![j as u8; 60 + j % 3]).collect();
        let base = Shared::buffers_from(1);
        let mem = Shared::new((base + hosts as u64 * BUF) as usize, false).unwrap();
        let mut q = mem.queue(0, QUEUE).unwrap();
        let mut f = Frames::write(&mem, &mut q, base, &frames).unwrap();
        assert!(f.rotating() && f.len() == hosts);
        // Two laps of posts, every descriptor returned after its post but the first one: buffer
        // 0 stays held, so the second lap skips it (no buffer in two descriptors).
        for post in 0..2 * hosts {
            let h = (post % QUEUE as usize) as u16;
            let j = f.point(&mut q, h);
            let want = if post < hosts { post } else { 1 + (post - hosts) % (hosts - 1) };
            assert_eq!(j, want, "frames in turn, the held one skipped");
            let (addr, len) = desc(&mem, &q, h);
            assert_eq!((addr, len as usize), (f.addr(j), HDR_LEN + frames[j].len()));
            // SAFETY: as above.
            let b = unsafe { mem.buffer(addr, len as usize) }.unwrap();
            assert_eq!(&b[HDR_LEN..], &frames[j][..], "the frame behind its header");
            assert!(f.only_post(j), "post {post}: buffer {j} is in no other descriptor");
            if post != 0 {
                f.returned(h);
            }
        }
        assert_eq!(
            frames_mib(hosts),
            (2 * (hosts - QUEUE as usize) as u64 * BUF).div_ceil(1 << 20)
        );
    }

    #[test]
    fn no_more_frames_than_descriptors_stay_in_their_descriptors() {
        let frames = vec![vec![1u8; 60], vec![2u8; 1514]];
        let base = Shared::buffers_from(1);
        let mem = Shared::new((base + QUEUE as u64 * BUF) as usize, false).unwrap();
        let mut q = mem.queue(0, QUEUE).unwrap();
        let mut f = Frames::write(&mem, &mut q, base, &frames).unwrap();
        assert!(!f.rotating());
        for h in [0, 1, 7, QUEUE - 1] {
            assert_eq!(f.point(&mut q, h), h as usize);
            let (addr, len) = desc(&mem, &q, h);
            assert_eq!(
                (addr, len as usize),
                (f.addr(h as usize), HDR_LEN + frames[h as usize % 2].len())
            );
            assert!(f.only_post(h as usize));
            f.returned(h);
        }
        assert_eq!(frames_mib(1), 0);
        let big = vec![vec![0u8; BUF as usize]];
        assert!(Frames::write(&mem, &mut q, base, &big).is_err(), "a frame larger than a buffer");
    }
}

//! A simulated guest driver for tests: guest memory with a split virtqueue laid out in it
//! (as a virtio driver lays it out: [`crate::driver::layout`]) or a packed one
//! ([`Guest::packed`]: its descriptor ring, then the driver's and the device's event
//! areas), chains posted and
//! completions read back as a guest would, and raw access for writing hostile rings. It goes
//! through the device's own guest-memory checks ([`GuestMemory`]), where the perf lab's
//! [`crate::driver::Queue`] writes a shared mapping directly, at speed.

pub mod fuzz;

use crate::driver;
use crate::memory::{GuestAddr, GuestMemory, Mapping};
use crate::net::HDR_LEN;
use crate::packed::{F_AVAIL, F_USED, FRESH_BASE, PackedQueue};
use crate::port::VhostPort;
use crate::queue::Virtqueue;
use crate::vring::{SplitQueue, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use std::collections::VecDeque;
use std::sync::Arc;

/// Guest memory layout of the simulated guest: rings at the bottom, buffers above.
pub const DESC_AT: u64 = 0x1_0000;
pub const BUFS_AT: u64 = 0x10_0000;
pub const MEM_LEN: usize = 0x40_0000;

/// A guest with one queue of `size` descriptors in `MEM_LEN` bytes at guest address 0 (or
/// a further queue in the same memory, see [`Guest::another_queue`]).
pub struct Guest {
    pub mem: Arc<GuestMemory>,
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    next_free: u16,
    avail_idx: u16,
    used_seen: u16,
    buf_top: u64,
    /// This queue's buffer area (reused from the start when full: tests keep fewer buffers
    /// in flight than it holds).
    bufs: (u64, u64),
    /// A packed ring's driver state; `None`: the queue is split.
    packed: Option<PackedDriver>,
}

/// What a packed ring's driver keeps: its wrap counters (the available one for the slots it
/// writes, the used one for the descriptors it reads back; `next_free` and `used_seen` are
/// the slots) and the buffers in flight, oldest first: (head slot, buffer id, descriptors).
/// It negotiates `IN_ORDER` (as [`Vm::with_layout`] sets the port up): a used descriptor may
/// return every buffer up to the one it names.
#[derive(Default)]
struct PackedDriver {
    avail_wrap: bool,
    used_wrap: bool,
    in_flight: VecDeque<(u16, u16, u16)>,
}

/// The buffer id a packed-ring guest gives the chain at `slot`: not the slot itself (a
/// device that returned slots instead of ids would go unseen), one id per slot.
fn buffer_id(slot: u16) -> u16 {
    slot ^ 0x5a5a
}

/// One buffer a guest posts: bytes for the device to read, or room for it to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buf {
    Read(Vec<u8>),
    Write(u32),
}

impl Guest {
    pub fn new(size: u16) -> Guest {
        let mem = GuestMemory::new(vec![(
            0,
            0x7f00_0000_0000,
            Mapping::anonymous(MEM_LEN).expect("guest memory"),
        )])
        .expect("one region");
        Self::queue_in(Arc::new(mem), size, 0)
    }

    /// Queue number `k` (0..4) of a guest whose memory is `mem` (at guest address 0, at
    /// least `MEM_LEN` bytes): its rings and buffers apart from the other queues'.
    pub fn queue_in(mem: Arc<GuestMemory>, size: u16, k: u64) -> Guest {
        let [desc, avail, used] = driver::layout(DESC_AT + k * 0x4_0000, size);
        let area = (MEM_LEN as u64 - BUFS_AT) / 4;
        let bufs = (BUFS_AT + k * area, BUFS_AT + (k + 1) * area);
        Guest {
            mem,
            size,
            desc,
            avail,
            used,
            next_free: 0,
            avail_idx: 0,
            used_seen: 0,
            buf_top: bufs.0,
            bufs,
            packed: None,
        }
    }

    /// Queue `k` of `mem` as [`Guest::queue_in`], with a packed ring: its descriptors at the
    /// split layout's place, the driver's event area after them, the device's after that.
    pub fn packed(mem: Arc<GuestMemory>, size: u16, k: u64) -> Guest {
        let mut g = Self::queue_in(mem, size, k);
        g.avail = g.desc + 16 * size as u64;
        g.used = g.avail + 4;
        g.packed = Some(PackedDriver { avail_wrap: true, used_wrap: true, ..Default::default() });
        g
    }

    /// Queue `k` (1..4) of the same guest, in the same memory.
    pub fn another_queue(&self, k: u64) -> Guest {
        Self::queue_in(self.mem.clone(), self.size, k)
    }

    /// The device's view of this queue.
    pub fn queue(&self) -> SplitQueue {
        assert!(self.packed.is_none(), "a packed ring: Guest::virtqueue");
        SplitQueue::new(
            self.size,
            GuestAddr(self.desc),
            GuestAddr(self.avail),
            GuestAddr(self.used),
            0,
        )
        .expect("valid queue")
    }

    /// The device's view of this queue, in its layout (`in_order`: `VIRTIO_F_IN_ORDER`
    /// negotiated).
    pub fn virtqueue(&self, in_order: bool) -> Virtqueue {
        if self.packed.is_none() {
            return self.queue().into();
        }
        let (desc, driver, device) =
            (GuestAddr(self.desc), GuestAddr(self.avail), GuestAddr(self.used));
        let mut q: Virtqueue = PackedQueue::new(self.size, desc, driver, device, FRESH_BASE)
            .expect("valid queue")
            .into();
        q.set_in_order(in_order);
        q
    }

    pub fn write(&self, at: u64, bytes: &[u8]) {
        self.mem.slice(GuestAddr(at), bytes.len()).expect("inside guest memory").write(bytes);
    }

    pub fn read(&self, at: u64, len: usize) -> Vec<u8> {
        self.mem.slice(GuestAddr(at), len).expect("inside guest memory").to_vec()
    }

    fn u16_at(&self, at: u64) -> u16 {
        let b = self.read(at, 2);
        u16::from_le_bytes([b[0], b[1]])
    }

    /// Writes descriptor `i` of the table.
    pub fn put_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.write(self.desc + 16 * i as u64, &driver::desc_bytes(addr, len, flags, next));
    }

    /// Makes `head` available and publishes the new index.
    pub fn make_available(&mut self, head: u16) {
        let slot = self.avail_idx % self.size;
        self.write(self.avail + 4 + 2 * slot as u64, &head.to_le_bytes());
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.write(self.avail + 2, &self.avail_idx.to_le_bytes());
    }

    /// Posts a chain of buffers (placed in fresh guest memory); returns its head and the
    /// guest address of each buffer.
    pub fn post(&mut self, bufs: &[Buf]) -> (u16, Vec<u64>) {
        if self.packed.is_some() {
            return self.post_packed(bufs);
        }
        let head = self.next_free;
        let mut addrs = Vec::new();
        for (k, b) in bufs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let (at, len, flags) = self.place(b, k + 1 < bufs.len());
            self.put_desc(i, at, len, flags, (i + 1) % self.size);
            addrs.push(at);
        }
        self.next_free = (head + bufs.len() as u16) % self.size;
        self.make_available(head);
        (head, addrs)
    }

    /// Places buffer `b` of a chain in fresh guest memory (its bytes written if it is one
    /// to read): its address, length and descriptor flags (`more`: not the chain's last).
    fn place(&mut self, b: &Buf, more: bool) -> (u64, u32, u16) {
        let len = match b {
            Buf::Read(v) => v.len() as u32,
            Buf::Write(n) => *n,
        };
        if self.buf_top + len as u64 > self.bufs.1 {
            self.buf_top = self.bufs.0;
        }
        let at = self.buf_top;
        self.buf_top = (self.buf_top + len as u64 + 64).next_multiple_of(64);
        if let Buf::Read(v) = b {
            self.write(at, v);
        }
        let mut flags = if matches!(b, Buf::Write(_)) { VIRTQ_DESC_F_WRITE } else { 0 };
        if more {
            flags |= VIRTQ_DESC_F_NEXT;
        }
        (at, len, flags)
    }

    /// [`Guest::post`] on a packed ring: the chain's descriptors at the next slots, its
    /// head's flags written last (what makes it available), its id [`buffer_id`] of the
    /// head's slot in every descriptor (the device reads the last one's).
    fn post_packed(&mut self, bufs: &[Buf]) -> (u16, Vec<u64>) {
        let head = self.next_free;
        let wrap = self.packed.as_ref().is_none_or(|p| p.avail_wrap);
        let (mut slot, mut lap) = (head, wrap);
        let mut addrs = Vec::new();
        let mut head_flags = 0;
        for (k, b) in bufs.iter().enumerate() {
            let (at, len, mut flags) = self.place(b, k + 1 < bufs.len());
            flags |= if lap { F_AVAIL } else { F_USED };
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&at.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&buffer_id(head).to_le_bytes());
            let at_desc = self.desc + 16 * slot as u64;
            if k == 0 {
                head_flags = flags;
                self.write(at_desc, &d[..14]);
            } else {
                d[14..].copy_from_slice(&flags.to_le_bytes());
                self.write(at_desc, &d);
            }
            addrs.push(at);
            slot += 1;
            if slot == self.size {
                (slot, lap) = (0, !lap);
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.write(self.desc + 16 * head as u64 + 14, &head_flags.to_le_bytes());
        self.next_free = slot;
        if let Some(p) = self.packed.as_mut() {
            p.avail_wrap = lap;
            p.in_flight.push_back((head, buffer_id(head), bufs.len() as u16));
        }
        (head, addrs)
    }

    /// [`Guest::completions`] on a packed ring: used descriptors at the used position; one
    /// naming a later buffer than the oldest in flight returns every buffer up to it (the
    /// device's `IN_ORDER` batch; the earlier ones with length 0).
    fn packed_completions(&mut self) -> Vec<(u16, u32)> {
        let mut out = Vec::new();
        let Some(mut p) = self.packed.take() else { return out };
        loop {
            let d = self.read(self.desc + 16 * self.used_seen as u64, 16);
            let flags = u16::from_le_bytes([d[14], d[15]]);
            if (flags & F_AVAIL != 0) != p.used_wrap || (flags & F_USED != 0) != p.used_wrap {
                break;
            }
            let id = u16::from_le_bytes([d[12], d[13]]);
            let len = u32::from_le_bytes([d[8], d[9], d[10], d[11]]);
            assert!(p.in_flight.iter().any(|&(_, b, _)| b == id), "used id {id} not in flight");
            while let Some((h, b, n)) = p.in_flight.pop_front() {
                out.push((h, if b == id { len } else { 0 }));
                self.used_seen += n;
                if self.used_seen >= self.size {
                    self.used_seen -= self.size;
                    p.used_wrap = !p.used_wrap;
                }
                if b == id {
                    break;
                }
            }
        }
        self.packed = Some(p);
        out
    }

    /// Completions published since the last call: (head, length written).
    pub fn completions(&mut self) -> Vec<(u16, u32)> {
        if self.packed.is_some() {
            return self.packed_completions();
        }
        let idx = self.u16_at(self.used + 2);
        let mut out = Vec::new();
        while self.used_seen != idx {
            let slot = self.used_seen % self.size;
            let e = self.read(self.used + 4 + 8 * slot as u64, 8);
            let (id, len) = driver::used_entry(e.try_into().expect("8 bytes read"));
            out.push((id as u16, len));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }

    /// The guest's `used_event` (what it asks for with `EVENT_IDX`).
    pub fn set_used_event(&self, v: u16) {
        self.write(self.avail + 4 + 2 * self.size as u64, &v.to_le_bytes());
    }

    /// Sets the available ring's flags (`VIRTQ_AVAIL_F_NO_INTERRUPT` = 1).
    pub fn set_avail_flags(&self, f: u16) {
        self.write(self.avail, &f.to_le_bytes());
    }

    /// The used ring's flags and `avail_event`, as the device left them.
    pub fn used_flags(&self) -> u16 {
        self.u16_at(self.used)
    }

    pub fn avail_event(&self) -> u16 {
        self.u16_at(self.used + 4 + 8 * self.size as u64)
    }
}

/// A simulated virtio-net guest on a [`VhostPort`]: its receive (virtqueue 0) and transmit
/// (virtqueue 1) queues in one memory, the port set up as the vhost-user protocol would.
pub struct Vm {
    pub rx: Guest,
    pub tx: Guest,
    pub port: Arc<VhostPort>,
}

impl Vm {
    pub fn new(name: &str, pool: &Arc<vswitch::Pool>, queue_size: u16) -> Vm {
        Self::with_layout(name, pool, queue_size, false)
    }

    /// [`Vm::new`] with packed rings (`VIRTIO_F_RING_PACKED` and `VIRTIO_F_IN_ORDER`, as DPDK's
    /// virtio-user with `packed_vq=1` negotiates) when `packed`.
    pub fn with_layout(name: &str, pool: &Arc<vswitch::Pool>, queue_size: u16, packed: bool) -> Vm {
        let rx = Guest::new(queue_size);
        let (rx, tx) = if packed {
            (
                Guest::packed(rx.mem.clone(), queue_size, 0),
                Guest::packed(rx.mem.clone(), queue_size, 1),
            )
        } else {
            let tx = rx.another_queue(1);
            (rx, tx)
        };
        let port = Arc::new(VhostPort::new(name, pool.clone()));
        port.configure(|d| {
            d.set_memory(Some(rx.mem.clone()));
            d.run_pair(0, rx.virtqueue(packed), tx.virtqueue(packed));
        });
        port.set_in_order(packed);
        Vm { rx, tx, port }
    }

    /// Transmits a frame (behind an empty header, in one buffer).
    pub fn send(&mut self, frame: &[u8]) {
        let mut b = vec![0u8; HDR_LEN];
        b.extend_from_slice(frame);
        self.tx.post(&[Buf::Read(b)]);
    }

    /// Posts `n` receive buffers of 2 KiB; returns their guest addresses.
    pub fn give_rx_buffers(&mut self, n: usize) -> Vec<u64> {
        (0..n).map(|_| self.rx.post(&[Buf::Write(2048)]).1[0]).collect()
    }

    /// Frames the device wrote into receive buffers, oldest first: each completion takes the
    /// next address of `addrs`; the header is checked (no offload, one buffer) and removed.
    pub fn received(&mut self, addrs: &mut std::collections::VecDeque<u64>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (_head, len) in self.rx.completions() {
            let at = addrs.pop_front().expect("a buffer for each completion");
            let bytes = self.rx.read(at, len as usize);
            assert_eq!(
                &bytes[..HDR_LEN],
                &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
                "header: no offload, one buffer"
            );
            out.push(bytes[HDR_LEN..].to_vec());
        }
        out
    }
}

//! Knitter's generator on kernel interfaces: AF_XDP sockets (Knitter's own port,
//! `kernel_ports::afxdp`, over its own buffer pool) on the generator's ends of the veth
//! pairs (`veth.rs`), offering on A and counting on B, driven by the trial loop of
//! [`crate::trial`]. Each frame is copied into a pool buffer when offered (the kernel
//! copies it again into an skb: veth has no zero-copy), stamped in latency trials.
//!
//! On veth the kernel does the forwarding work of a transmit inside the sender's `sendto`:
//! the veth peer's XDP program, and the copy into the receiving socket's memory, run on
//! the sending CPU. So the generator's CPU pays for the switch's receive and the switch's
//! CPU for the generator's; a Linux bridge runs entirely on the generator's CPU.

use crate::scenario::Traffic;
use crate::trial::{Ages, BURST, Wire, tsc};
use crate::veth::{GEN_A, GEN_B, Veths};
use kernel_ports::afxdp::AfXdpPort;
use std::sync::Arc;
use vswitch::port::Port;
use vswitch::{Batch, Pool, PoolCache};

/// Buffers: both fill rings, a full transmit ring in flight, bursts in hand.
const BUFFERS: u32 = 4096;

pub struct Xgen {
    pool: Arc<Pool>,
    a: AfXdpPort,
    b: AfXdpPort,
    cache: PoolCache,
    batch: Batch,
    frames: Vec<Vec<u8>>,
    /// What B sends first (one frame: `--macs` is not for veths).
    back: Vec<Vec<u8>>,
    /// The next frame to offer.
    next: usize,
    stamps: [usize; 2],
}

impl Xgen {
    /// Opens AF_XDP sockets on the generator's ends of `veths`.
    pub fn open(veths: &Veths, traffic: &Traffic) -> anyhow::Result<Xgen> {
        anyhow::ensure!(!traffic.offered.is_empty(), "no frames to offer");
        let stamps = [traffic.stamp_offered, traffic.stamp_received];
        anyhow::ensure!(
            traffic.offered.iter().all(|f| f.len() >= stamps[0] + 8),
            "frames too short for the latency stamp"
        );
        let pool = Pool::new(BUFFERS, true)?;
        let open = |ifname: &str| -> anyhow::Result<AfXdpPort> {
            let p = pool.clone();
            Ok(veths.generator.enter(|| AfXdpPort::open(ifname, ifname, p))??)
        };
        let (a, b) = (open(GEN_A)?, open(GEN_B)?);
        let cache = PoolCache::new(pool.clone());
        Ok(Xgen {
            pool,
            a,
            b,
            cache,
            batch: Batch::new(),
            frames: traffic.offered.clone(),
            back: traffic.back.clone(),
            next: 0,
            stamps,
        })
    }

    /// Frees what is left in the batch (frames the ring had no room for).
    fn free_rest(&mut self) {
        for b in self.batch.drain() {
            self.cache.free(b);
        }
    }
}

impl Wire for Xgen {
    fn learn(&mut self) {
        for i in 0..self.back.len() {
            if let Some(b) = self.cache.alloc_frame(&self.back[i]) {
                let _ = self.batch.push(b);
                self.b.tx_burst(0, &mut self.cache, &mut self.batch);
                self.free_rest();
            }
        }
    }

    /// Transmit buffers come back inside `tx_burst`; a full ring refuses what it cannot take.
    fn room(&mut self) -> usize {
        BURST
    }

    #[inline]
    fn offer(&mut self, k: usize, stamp: bool) -> usize {
        let n = self.frames.len();
        for i in 0..k {
            let Some(mut b) = self.cache.alloc_frame(&self.frames[(self.next + i) % n]) else {
                break;
            };
            if stamp
                && let Some(s) =
                    self.pool.head_mut(&mut b).get_mut(self.stamps[0]..self.stamps[0] + 8)
            {
                s.copy_from_slice(&tsc().to_le_bytes());
            }
            if let Err(b) = self.batch.push(b) {
                self.cache.free(b);
                break;
            }
        }
        let sent = self.a.tx_burst(0, &mut self.cache, &mut self.batch);
        self.free_rest();
        self.next = (self.next + sent) % n;
        sent
    }

    #[inline]
    fn receive(&mut self, mut ages: Option<&mut Ages>) -> (u64, u64) {
        let (mut frames, mut bytes) = (0, 0);
        // A few bursts per turn: the switch may have queued up to a ring's worth.
        for _ in 0..8 {
            let n = self.b.rx_burst(0, &mut self.cache, &mut self.batch);
            if n == 0 {
                break;
            }
            let now = tsc();
            for buf in self.batch.drain() {
                let head = self.pool.head(&buf);
                bytes += self.pool.pkt_len(&buf) as u64;
                if let Some(a) = ages.as_deref_mut()
                    && let Some(s) = head.get(self.stamps[1]..self.stamps[1] + 8)
                {
                    a.record(s, now);
                }
                self.cache.free(buf);
            }
            frames += n as u64;
        }
        (frames, bytes)
    }

    fn drain_stray(&mut self) -> u64 {
        let n = self.a.rx_burst(0, &mut self.cache, &mut self.batch);
        self.free_rest();
        n as u64
    }
}

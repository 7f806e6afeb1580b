//! The in-memory ring port: packets pass as buffer indices through SPSC rings, for tests,
//! benchmarks and the demo. Both ends must share one [`crate::buf::Pool`].
//!
//! A [`RingPort`] is the switch's side; its [`RingPeer`] is the "wire" end a test or generator
//! drives. [`RingPort::patch`] instead joins two switch-side ports back to back (a cable
//! between two switches). On the switch side every queue end has a try-lock, so the SPSC
//! promise holds even when several PMD threads share a tx queue: a thread that finds the lock
//! taken treats the queue as full for that burst (counted as `tx_full`).

use super::{Port, QueueCounters, QueueStats};
use crate::batch::Batch;
use crate::buf::{BufId, PoolCache};
use crate::spsc::{self, Consumer, Producer, Spsc};
use crate::wire::MacAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex};

struct Queue {
    /// Toward the switch (peer produces, switch consumes).
    rx: Mutex<Consumer>,
    /// The same ring, for its wake protocol (atomics and an eventfd: no lock needed).
    rx_ring: Arc<Spsc>,
    /// From the switch (switch produces, peer consumes).
    tx: Mutex<Producer>,
    counters: QueueCounters,
}

/// The switch side of an in-memory port.
pub struct RingPort {
    name: String,
    queues: Box<[Queue]>,
    up: AtomicBool,
    mac: Option<MacAddr>,
}

/// The wire side of a [`RingPort`]: what a test or generator sends and receives.
pub struct RingPeer {
    rx: Vec<Consumer>,
    tx: Vec<Producer>,
}

impl RingPort {
    /// A port with `queues` queue pairs of `size` slots, and its peer.
    pub fn new(name: &str, queues: u16, size: usize) -> std::io::Result<(Arc<RingPort>, RingPeer)> {
        let mut qs = Vec::new();
        let mut peer = RingPeer { rx: Vec::new(), tx: Vec::new() };
        for _ in 0..queues.max(1) {
            let ((to_switch, switch_rx), (switch_tx, from_switch)) =
                (spsc::channel(size)?, spsc::channel(size)?);
            peer.tx.push(to_switch);
            peer.rx.push(from_switch);
            qs.push(Queue::new(switch_rx, switch_tx));
        }
        Ok((Arc::new(RingPort::from_queues(name, qs)), peer))
    }

    /// Two switch-side ports joined back to back: what one sends the other receives.
    pub fn patch(a: &str, b: &str, size: usize) -> std::io::Result<(Arc<RingPort>, Arc<RingPort>)> {
        let ((a_tx, b_rx), (b_tx, a_rx)) = (spsc::channel(size)?, spsc::channel(size)?);
        let pa = RingPort::from_queues(a, vec![Queue::new(a_rx, a_tx)]);
        let pb = RingPort::from_queues(b, vec![Queue::new(b_rx, b_tx)]);
        Ok((Arc::new(pa), Arc::new(pb)))
    }

    fn from_queues(name: &str, qs: Vec<Queue>) -> RingPort {
        RingPort { name: name.to_owned(), queues: qs.into(), up: AtomicBool::new(true), mac: None }
    }

    /// Sets the MAC the port reports (used when the port is a VTEP underlay). Call it
    /// before the port is shared (registered with a switch).
    pub fn with_mac(mut self: Arc<Self>, mac: MacAddr) -> Arc<Self> {
        match Arc::get_mut(&mut self) {
            Some(p) => p.mac = Some(mac),
            None => tracing::warn!(port = %self.name, "with_mac on a shared ring port is ignored"),
        }
        self
    }

    pub fn set_link(&self, up: bool) {
        self.up.store(up, Release);
    }
}

impl Queue {
    fn new(rx: Consumer, tx: Producer) -> Queue {
        Queue {
            rx_ring: rx.ring().clone(),
            rx: Mutex::new(rx),
            tx: Mutex::new(tx),
            counters: QueueCounters::default(),
        }
    }
}

impl Port for RingPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_queues(&self) -> u16 {
        self.queues.len() as u16
    }

    fn tx_queues(&self) -> u16 {
        self.queues.len() as u16
    }

    #[inline]
    fn rx_burst(&self, q: u16, _cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Some(queue) = self.queues.get(q as usize) else { return 0 };
        let Ok(mut rx) = queue.rx.try_lock() else { return 0 };
        // SAFETY: indices in a ring were produced by `into_index` of the same pool (both ends
        // of a ring port share one pool) and are consumed exactly once here.
        let n = unsafe { batch.fill_raw(|raw| rx.pop(raw)) };
        queue.counters.rx_packets.add(n as u64);
        n
    }

    #[inline]
    fn tx_burst(&self, q: u16, _cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let queue = &self.queues[q as usize % self.queues.len()];
        let Ok(mut tx) = queue.tx.try_lock() else {
            queue.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let n = tx.push(batch.as_raw());
        // The ring now owns these buffers, as indices.
        batch.handed_on(n);
        queue.counters.tx_packets.add(n as u64);
        queue.counters.tx_full.add(batch.len() as u64);
        n
    }

    fn link_up(&self) -> bool {
        self.up.load(Acquire)
    }

    fn wake_fd(&self, q: u16) -> Option<RawFd> {
        self.queues.get(q as usize).map(|x| x.rx_ring.wake_fd())
    }

    fn arm_wake(&self, q: u16, armed: bool) -> bool {
        self.queues.get(q as usize).is_some_and(|x| x.rx_ring.arm(armed))
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        self.queues.iter().map(|q| q.counters.read()).collect()
    }

    fn mac(&self) -> Option<MacAddr> {
        self.mac
    }
}

impl RingPeer {
    /// Offers packets to the switch on queue `q`; those not taken stay in `batch`.
    pub fn send(&mut self, q: u16, batch: &mut Batch) -> usize {
        let k = q as usize % self.tx.len();
        let n = self.tx[k].push(batch.as_raw());
        batch.handed_on(n);
        n
    }

    /// Sends one packet; gives it back if the ring is full.
    pub fn send_one(&mut self, q: u16, b: BufId) -> Result<(), BufId> {
        let k = q as usize % self.tx.len();
        if self.tx[k].push(&[b.index()]) == 1 {
            let _ = b.into_index();
            Ok(())
        } else {
            Err(b)
        }
    }

    /// Takes what the switch sent on queue `q`.
    pub fn recv(&mut self, q: u16, batch: &mut Batch) -> usize {
        let k = q as usize % self.rx.len();
        let ring = &mut self.rx[k];
        // SAFETY: produced by `into_index` on the switch side of the same pool.
        unsafe { batch.fill_raw(|raw| ring.pop(raw)) }
    }

    /// Frees everything waiting in both directions (teardown).
    pub fn drain(&mut self, cache: &mut PoolCache) {
        let mut b = Batch::new();
        for q in 0..self.rx.len() as u16 {
            while self.recv(q, &mut b) > 0 {
                for x in b.drain() {
                    cache.free(x);
                }
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::buf::Pool;

    #[test]
    fn peer_to_port_and_back() {
        let pool = Pool::new(64, false).unwrap();
        let mut c = PoolCache::new(pool.clone());
        let (port, mut peer) = RingPort::new("r0", 1, 8).unwrap();
        let mut b = Batch::new();
        for i in 0..3u8 {
            b.push(c.alloc_frame(&[i; 60]).unwrap()).unwrap();
        }
        assert_eq!(peer.send(0, &mut b), 3);
        let mut got = Batch::new();
        assert_eq!(port.rx_burst(0, &mut c, &mut got), 3);
        assert_eq!(pool.head(&got.as_slice()[2])[0], 2);
        assert_eq!(port.tx_burst(0, &mut c, &mut got), 3);
        assert!(got.is_empty());
        let mut back = Batch::new();
        assert_eq!(peer.recv(0, &mut back), 3);
        for x in back.drain() {
            c.free(x);
        }
        assert_eq!(
            port.queue_stats()[0],
            QueueStats { rx_packets: 3, tx_packets: 3, ..Default::default() }
        );
    }

    /// Two threads transmitting on one queue: the loser of the try-lock counts its burst
    /// as `tx_full` while the winner counts its own; no count is lost (every packet offered
    /// is either sent or counted full). A load-and-store counter lost some here.
    #[test]
    fn queue_counters_are_exact_under_contention() {
        let pool = Pool::new(4096, false).unwrap();
        let (port, mut peer) = RingPort::new("r0", 1, 1024).unwrap();
        let offered = std::sync::atomic::AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let drainer = s.spawn(|| {
                let mut c = PoolCache::new(pool.clone());
                let mut b = Batch::new();
                while !stop.load(Relaxed) {
                    peer.recv(0, &mut b);
                    for x in b.drain() {
                        c.free(x);
                    }
                }
                c.flush();
            });
            let senders: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = PoolCache::new(pool.clone());
                        // Until the two have met at the lock (on two vCPUs they may run
                        // one after the other for a while), a bounded number of bursts.
                        for i in 0..2_000_000 {
                            if i >= 20_000 && port.queue_stats()[0].tx_full > 0 {
                                break;
                            }
                            let mut b = Batch::new();
                            for _ in 0..4 {
                                if let Some(x) = c.alloc_frame(&[0; 60]) {
                                    let _ = b.push(x).map_err(|x| c.free(x));
                                }
                            }
                            offered.fetch_add(b.len() as u64, Relaxed);
                            port.tx_burst(0, &mut c, &mut b);
                            for x in b.drain() {
                                c.free(x);
                            }
                        }
                        c.flush();
                    })
                })
                .collect();
            for t in senders {
                t.join().unwrap();
            }
            stop.store(true, Relaxed);
            drainer.join().unwrap();
        });
        let q = port.queue_stats()[0];
        assert!(q.tx_full > 0, "the senders never met: {q:?}");
        assert_eq!(q.tx_packets + q.tx_full, offered.load(Relaxed), "{q:?}");
    }

    #[test]
    fn full_ring_leaves_packets_in_batch() {
        let pool = Pool::new(64, false).unwrap();
        let mut c = PoolCache::new(pool.clone());
        let (port, mut peer) = RingPort::new("r0", 1, 4).unwrap();
        let mut b = Batch::new();
        for _ in 0..6 {
            b.push(c.alloc().unwrap()).unwrap();
        }
        assert_eq!(port.tx_burst(0, &mut c, &mut b), 4);
        assert_eq!(b.len(), 2);
        for x in b.drain() {
            c.free(x);
        }
        peer.drain(&mut c);
        c.flush();
        assert_eq!(pool.free_count(), pool.capacity() as usize);
    }
}

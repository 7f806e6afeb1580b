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
use crate::spsc::Spsc;
use crate::wire::MacAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};

struct Queue {
    /// Toward the switch (peer produces, switch consumes).
    rx: Arc<Spsc>,
    /// From the switch (switch produces, peer consumes).
    tx: Arc<Spsc>,
    rx_lock: AtomicBool,
    tx_lock: AtomicBool,
    counters: QueueCounters,
}

struct TryLock<'a>(&'a AtomicBool);

impl<'a> TryLock<'a> {
    #[inline(always)]
    fn take(flag: &'a AtomicBool) -> Option<TryLock<'a>> {
        flag.compare_exchange(false, true, Acquire, Relaxed).is_ok().then_some(TryLock(flag))
    }
}

impl Drop for TryLock<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
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
    rx: Vec<Arc<Spsc>>,
    tx: Vec<Arc<Spsc>>,
}

impl RingPort {
    /// A port with `queues` queue pairs of `size` slots, and its peer.
    pub fn new(name: &str, queues: u16, size: usize) -> std::io::Result<(Arc<RingPort>, RingPeer)> {
        let mut qs = Vec::new();
        let mut peer = RingPeer { rx: Vec::new(), tx: Vec::new() };
        for _ in 0..queues.max(1) {
            let (to_switch, from_switch) = (Arc::new(Spsc::new(size)?), Arc::new(Spsc::new(size)?));
            peer.tx.push(to_switch.clone());
            peer.rx.push(from_switch.clone());
            qs.push(Queue::new(to_switch, from_switch));
        }
        Ok((Arc::new(RingPort::from_queues(name, qs)), peer))
    }

    /// Two switch-side ports joined back to back: what one sends the other receives.
    pub fn patch(a: &str, b: &str, size: usize) -> std::io::Result<(Arc<RingPort>, Arc<RingPort>)> {
        let (ab, ba) = (Arc::new(Spsc::new(size)?), Arc::new(Spsc::new(size)?));
        let pa = RingPort::from_queues(a, vec![Queue::new(ba.clone(), ab.clone())]);
        let pb = RingPort::from_queues(b, vec![Queue::new(ab, ba)]);
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
    fn new(rx: Arc<Spsc>, tx: Arc<Spsc>) -> Queue {
        Queue {
            rx,
            tx,
            rx_lock: AtomicBool::new(false),
            tx_lock: AtomicBool::new(false),
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
        let Some(_g) = TryLock::take(&queue.rx_lock) else { return 0 };
        // SAFETY: indices in a ring were produced by `into_index` of the same pool (both ends
        // of a ring port share one pool) and are consumed exactly once here.
        let n = unsafe { batch.fill_raw(|raw| queue.rx.pop(raw)) };
        queue.counters.rx_packets.add(n as u64);
        n
    }

    #[inline]
    fn tx_burst(&self, q: u16, _cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let queue = &self.queues[q as usize % self.queues.len()];
        let Some(_g) = TryLock::take(&queue.tx_lock) else {
            queue.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let n = queue.tx.push(batch.as_raw());
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
        self.queues.get(q as usize).map(|x| x.rx.wake_fd())
    }

    fn arm_wake(&self, q: u16, armed: bool) -> bool {
        self.queues.get(q as usize).is_some_and(|x| x.rx.arm(armed))
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
        let ring = &self.tx[q as usize % self.tx.len()];
        let n = ring.push(batch.as_raw());
        batch.handed_on(n);
        n
    }

    /// Sends one packet; gives it back if the ring is full.
    pub fn send_one(&mut self, q: u16, b: BufId) -> Result<(), BufId> {
        let ring = &self.tx[q as usize % self.tx.len()];
        if ring.push(&[b.index()]) == 1 {
            let _ = b.into_index();
            Ok(())
        } else {
            Err(b)
        }
    }

    /// Takes what the switch sent on queue `q`.
    pub fn recv(&mut self, q: u16, batch: &mut Batch) -> usize {
        let ring = &self.rx[q as usize % self.rx.len()];
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
        assert_eq!(port.queue_stats()[0], QueueStats { rx_packets: 3, rx_dropped: 0, tx_packets: 3, tx_full: 0 });
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
        assert_eq!(pool.free_count(), 64);
    }
}

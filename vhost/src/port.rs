//! A virtio-net device as a switch port: the PMD thread that polls the port pops the guest's
//! transmit queue into packets and fills its receive queue from the switch, in bursts.
//!
//! Queue pair 0 only for now: virtqueue 0 is the guest's receive queue (the port transmits
//! into it), virtqueue 1 its transmit queue (the port receives from it). The device state
//! (guest memory, ring addresses, enabled queues, the call descriptor) is set by the control
//! side, in the vhost-user protocol's terms (SET_MEM_TABLE, SET_VRING_*), through
//! [`VhostPort::configure`]; the PMD side takes the state's lock with `try_lock` once per
//! burst and skips the burst if the control side holds it (never waits).
//!
//! Every frame is copied twice today, guest → pool packet → guest (the single-copy path for
//! vhost → vhost is the next step of the vhost-user issue).

use crate::memory::GuestMemory;
use crate::net::{self, NetError, Offloads};
use crate::vring::{Chain, SplitQueue};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use vswitch::port::{Port, QueueCounters, QueueStats};
use vswitch::{Batch, Pool, PoolCache};

/// Virtqueue numbers of queue pair 0.
pub const RXQ: usize = 0;
pub const TXQ: usize = 1;

/// The device state the control side sets up.
#[derive(Default)]
pub struct Device {
    pub memory: Option<Arc<GuestMemory>>,
    /// Virtqueues 0 (guest receive) and 1 (guest transmit), when set up and enabled.
    pub queues: [Option<SplitQueue>; 2],
    pub offloads: Offloads,
    /// Where to signal the guest that its receive queue (0) or transmit queue (1) has
    /// completions, when it asks for interrupts (an eventfd from SET_VRING_CALL).
    pub call: [Option<OwnedFd>; 2],
    /// Where the guest kicks after making buffers available (SET_VRING_KICK), non-blocking:
    /// the transmit queue's is the port's wake descriptor while its PMD thread sleeps.
    pub kick: [Option<OwnedFd>; 2],
    /// A (re)started transmit queue whose guest still kicks: the next burst tells it not to.
    pub kicks_on: bool,
    /// `VIRTIO_NET_F_MRG_RXBUF`: a frame may take several receive chains.
    pub mrg_rxbuf: bool,
}

/// Frames the port refused, by reason (beyond the queue counters).
#[derive(Default)]
pub struct NetCounters {
    pub bad_chains: vswitch::counters::Counter,
    pub refused_frames: vswitch::counters::Counter,
    pub guest_buffer_too_small: vswitch::counters::Counter,
}

pub struct VhostPort {
    name: String,
    pool: Arc<Pool>,
    dev: Mutex<Device>,
    /// Memory and both rings are set up (kept by `configure`, read without the lock).
    up: AtomicBool,
    counters: QueueCounters,
    pub net: NetCounters,
}

impl VhostPort {
    pub fn new(name: &str, pool: Arc<Pool>) -> VhostPort {
        VhostPort {
            name: name.into(),
            pool,
            dev: Mutex::new(Device::default()),
            up: AtomicBool::new(false),
            counters: QueueCounters::default(),
            net: NetCounters::default(),
        }
    }

    /// Changes the device state (control side; may wait for a PMD thread's burst to end).
    pub fn configure<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        let mut d = self.dev.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut d);
        self.up.store(d.memory.is_some() && d.queues.iter().all(Option::is_some), Ordering::Release);
        r
    }
}

/// What became of one packet on its way into the guest.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Sent,
    /// Dropped (counted): the guest will not take it.
    Refused,
    /// No receive buffers now: it and the packets after it stay for a later burst.
    NoRoom,
    BadChain,
}

/// Signals an eventfd (the guest's interrupt).
fn signal(fd: &Option<OwnedFd>) {
    if let Some(fd) = fd {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to an eventfd we own; a full counter only means the guest
        // has not read earlier signals, which it will.
        unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

impl Port for VhostPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn link_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    fn rx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Ok(mut guard) = self.dev.try_lock() else { return 0 };
        let dev = &mut *guard;
        let (Some(mem), Some(q)) = (dev.memory.as_ref(), dev.queues[TXQ].as_mut()) else { return 0 };
        let Ok(mut ring) = q.ring(mem) else { return 0 };
        if dev.kicks_on {
            ring.set_kicks(false); // polled: kicks would only cost the guest system calls
            dev.kicks_on = false;
        }
        let (mut chain, mut got, mut used) = (Chain::default(), 0, 0);
        while batch.room() > 0 {
            let Some(r) = ring.pop(&mut chain) else { break };
            used += 1;
            match r.map_err(|_| None).and_then(|()| net::from_guest(mem, &chain, cache, dev.offloads).map_err(Some)) {
                Ok(b) => {
                    let _ = batch.push(b).map_err(|b| cache.free(b)); // room was checked
                    got += 1;
                }
                Err(None) => self.net.bad_chains.add(1),
                Err(Some(e)) => {
                    self.net.refused_frames.add(1);
                    self.counters.rx_dropped.add(1);
                    tracing::trace!(port = %self.name, error = %e, "frame from the guest refused");
                }
            }
            ring.push_used(chain.head, 0);
        }
        if used > 0 && ring.needs_interrupt() {
            signal(&dev.call[TXQ]);
        }
        self.counters.rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, _q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Ok(mut guard) = self.dev.try_lock() else {
            self.counters.tx_full.add(batch.len() as u64);
            return 0;
        };
        let dev = &mut *guard;
        let (Some(mem), Some(q)) = (dev.memory.as_ref(), dev.queues[RXQ].as_mut()) else { return 0 };
        let Ok(mut ring) = q.ring(mem) else { return 0 };
        let mut chain = Chain::default();
        let (mut done, mut sent) = (0, 0); // packets taken from the front (sent or refused); sent
        'packets: for b in batch.as_slice() {
            // A malformed chain is returned empty and the same frame tries the next one.
            let outcome = loop {
                let o = if dev.mrg_rxbuf {
                    match net::to_guest_merged(&mut ring, &self.pool, b) {
                        Ok(()) => Outcome::Sent,
                        Err(NetError::GuestBufferTooSmall) => Outcome::NoRoom,
                        Err(NetError::BadChain) => Outcome::BadChain,
                        Err(_) => Outcome::Refused,
                    }
                } else {
                    match ring.pop(&mut chain) {
                        None => Outcome::NoRoom,
                        Some(Err(_)) => {
                            ring.push_used(chain.head, 0);
                            Outcome::BadChain
                        }
                        Some(Ok(())) => match net::to_guest(mem, &chain, &self.pool, b) {
                            Ok(n) => {
                                ring.push_used(chain.head, n);
                                Outcome::Sent
                            }
                            Err(NetError::GuestBufferTooSmall) => {
                                ring.unpop(); // the chain may fit a smaller frame
                                self.net.guest_buffer_too_small.add(1);
                                Outcome::Refused
                            }
                            Err(_) => {
                                ring.push_used(chain.head, 0);
                                Outcome::Refused
                            }
                        },
                    }
                };
                if o != Outcome::BadChain {
                    break o;
                }
                self.net.bad_chains.add(1);
            };
            match outcome {
                Outcome::Sent => sent += 1,
                Outcome::Refused => self.net.refused_frames.add(1),
                Outcome::NoRoom | Outcome::BadChain => break 'packets,
            }
            done += 1;
        }
        if sent > 0 && ring.needs_interrupt() {
            signal(&dev.call[RXQ]);
        }
        drop(ring);
        drop(guard);
        // Every packet taken was copied into the guest (or refused, counted): free them.
        for i in 0..done {
            cache.free(batch.take(i));
        }
        batch.consume_front(done);
        self.counters.tx_packets.add(sent as u64);
        self.counters.tx_full.add(batch.len() as u64);
        done
    }

    fn wake_fd(&self, _q: u16) -> Option<RawFd> {
        let d = self.dev.try_lock().ok()?;
        d.kick[TXQ].as_ref().map(|f| f.as_raw_fd())
    }

    /// Before the PMD thread sleeps, the guest is asked to kick when it transmits (and the
    /// queue checked once more); after, kicks are suppressed again and the kick counter
    /// cleared.
    fn arm_wake(&self, _q: u16, armed: bool) -> bool {
        let Ok(mut guard) = self.dev.try_lock() else { return armed };
        let dev = &mut *guard;
        let (Some(mem), Some(q)) = (dev.memory.as_ref(), dev.queues[TXQ].as_mut()) else { return false };
        let Ok(mut ring) = q.ring(mem) else { return false };
        ring.set_kicks(armed);
        if !armed {
            if let Some(fd) = &dev.kick[TXQ] {
                let mut v = 0u64;
                // SAFETY: an 8-byte read from our non-blocking eventfd into a u64.
                unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            return false;
        }
        ring.pending() > 0
    }

    fn queue_stats(&self) -> Vec<QueueStats> {
        vec![self.counters.read()]
    }
}

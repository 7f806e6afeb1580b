//! A virtio-net device as a switch port: the PMD threads that poll the port pop the guest's
//! transmit queues into packets and fill its receive queues from the switch, in bursts.
//!
//! Up to [`MAX_PAIRS`] queue pairs (virtio-net's multiqueue): virtqueue `2p` is pair `p`'s
//! guest receive queue (the port transmits into it), `2p + 1` its transmit queue (the port
//! receives from it). The port has one switch rx queue and one tx queue per pair; the
//! switch spreads rx queues over its PMD threads. The guest decides how many pairs run
//! (the frontend turns its control-queue command into SET_VRING_ENABLE per ring); a queue
//! that does not run is skipped without a lock.
//!
//! Each pair's state (rings, interrupt and kick descriptors, and the guest memory they use)
//! sits behind its own lock. The control side sets it, in the vhost-user protocol's terms
//! (SET_MEM_TABLE, SET_VRING_*), through [`VhostPort::configure`], which takes every pair's
//! lock. A PMD thread receiving on a pair takes that pair's lock with `try_lock` once per
//! burst and skips the burst if it is held. Transmission is arbitrated like OVS's dynamic
//! XPS: switch tx queue `q` goes to pair `q` when the guest runs that pair's receive queue,
//! else to one of the pairs it runs (never to a queue the guest has not enabled); several
//! PMD threads landing on one pair take its lock in turn (a wait of at most one burst).
//!
//! A burst works in passes: every one-buffer chain popped first (its buffer prefetched),
//! then the copies, then the completions, so the cross-core misses of a burst's packets
//! overlap instead of queueing one packet behind the other; other chains take the general
//! path after them, in ring order.
//!
//! Frames of [`net::LEND_MIN`] bytes or more take the single-copy path: their first
//! [`net::LENT_HEAD`] bytes are copied into a pool packet (what the pipeline decides on,
//! safe from a guest rewriting it), the rest is *lent* (`vswitch::LentTail`): the burst's
//! descriptors are kept (`Pair::lent`, with the memory table) until the pipeline has sent the
//! burst, and a vhost-user port it goes to copies the tail straight from the source guest's
//! buffer into its own guest's (`net::to_buffer`); other ports get it copied into the pool
//! first. Then `rx_done` returns every descriptor of the burst in ring order.

use crate::eventfd::{self, EventFd};
use crate::memory::GuestMemory;
use crate::net::{self, NetError, Offloads};
use crate::queue::{Burst, Ring, Virtqueue};
use crate::vring::{Chain, Flat};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vswitch::port::{Port, QueueCounters, QueueStats};
use vswitch::{Batch, Pool, PoolCache};

/// Direction within a queue pair: the guest's receive queue (even virtqueue numbers) and
/// transmit queue (odd).
pub const RXQ: usize = 0;
pub const TXQ: usize = 1;

/// Queue pairs a port offers (`VIRTIO_NET_F_MQ`; the frontend may use fewer).
pub const MAX_PAIRS: usize = 4;

/// One queue pair's state.
#[derive(Default)]
pub struct Pair {
    /// The guest memory the rings live in (every pair holds the current table).
    pub memory: Option<Arc<GuestMemory>>,
    /// The receive (RXQ) and transmit (TXQ) rings, when set up and enabled.
    pub queues: [Option<Virtqueue>; 2],
    /// A ring the frontend disabled while it ran (SET_VRING_ENABLE 0, as QEMU does when the
    /// guest changes its number of queue pairs): enabled again, it goes on from here.
    pub parked: [Option<Virtqueue>; 2],
    /// Where to signal the guest that a ring has completions, when it asks for interrupts
    /// (an eventfd from SET_VRING_CALL). Shared so that a PMD thread signals after it let
    /// go of the pair's lock: no lock is held across a system call on a frontend's
    /// descriptor.
    pub call: [Option<Arc<EventFd>>; 2],
    /// Where the guest kicks after making buffers available (SET_VRING_KICK): the transmit
    /// ring's is the wake descriptor of the pair's rx queue while its PMD thread sleeps.
    pub kick: [Option<Arc<EventFd>>; 2],
    /// A (re)started transmit ring whose guest still kicks: the next burst tells it not to.
    pub kicks_on: bool,
    pub offloads: Offloads,
    /// `VIRTIO_NET_F_MRG_RXBUF`: a frame may take several receive chains.
    pub mrg_rxbuf: bool,
    /// The guest's driver runs its receive ring: frames sent into it are read, not thrown
    /// away. A ring that starts afresh (SET_VRING_BASE 0, nothing used yet) is not ready
    /// until the driver shows it started: it kicks the ring (DPDK's virtio-user does so at
    /// the end of `rte_eth_dev_start`, after it filled the ring and *flushed whatever was
    /// written into it before*; Linux after its first fill), or it transmits on the pair, or
    /// the ring has held buffers for [`RX_READY_GRACE`] without either. A ring resumed where
    /// a driver had run it (a frontend that outlived the switch) is ready at once. Until
    /// then the port does not send on the pair, and its link is down.
    pub rx_ready: bool,
    /// Since when an unready receive ring has held buffers (for [`RX_READY_GRACE`]).
    pub rx_posted_since: Option<Instant>,
    /// Transmit descriptors whose frames were lent this burst, to give back at `rx_done`.
    lent: Lent,
}

/// The transmit descriptors of one burst that lent frames (the single-copy path): none of
/// the burst's descriptors is returned until the burst is processed, so that they go back in
/// ring order (`IN_ORDER`), and the memory table they are in stays mapped until then.
#[derive(Default)]
struct Lent {
    heads: [u16; vswitch::batch::BATCH],
    n: usize,
    /// The queue they came from ([`Virtqueue::id`]) and its memory.
    queue: u64,
    memory: Option<Arc<GuestMemory>>,
    /// `rx_done` found the ring disabled: the next burst on the ring, enabled again as
    /// itself, returns them.
    orphaned: bool,
}

/// Why the rings of a memory table stop when its file shrank under it.
const MEMORY_FAULT: &str = "the frontend's memory file shrank under its memory table";

/// How long a receive ring that starts afresh may hold buffers, with no kick and nothing
/// transmitted, before the port trusts it: a driver that never kicks a polled ring still
/// gets its frames, a second late. DPDK's virtio-user kicks within microseconds of filling.
pub const RX_READY_GRACE: Duration = Duration::from_secs(1);

impl Pair {
    /// The receive ring is ready (see [`Pair::rx_ready`]): from now on the guest is not
    /// asked to kick it (the port polls it; a kick per refill would cost the guest a system
    /// call a burst).
    fn make_rx_ready(&mut self) {
        self.rx_ready = true;
        self.rx_posted_since = None;
        self.set_rx_kicks(false);
    }

    /// Asks the guest to kick its receive ring when it refills it, or not.
    fn set_rx_kicks(&mut self, on: bool) {
        if let (Some(mem), Some(q)) = (self.memory.as_ref(), self.queues[RXQ].as_mut())
            && let Ok(mut ring) = q.ring(mem)
        {
            ring.set_kicks(on);
        }
    }

    /// A receive ring that runs (memory and ring set up, enabled).
    fn rx_runs(&self) -> bool {
        self.memory.is_some() && self.queues[RXQ].is_some()
    }
}

/// Every pair's state, locked by [`VhostPort::configure`]; virtqueue `vq` is
/// `pairs[vq / 2].queues[vq % 2]`.
pub struct Device<'a> {
    pub pairs: Vec<MutexGuard<'a, Pair>>,
}

impl Device<'_> {
    /// The pair virtqueue `vq` belongs to; `None` past the last pair.
    pub fn pair_of(&mut self, vq: usize) -> Option<&mut Pair> {
        self.pairs.get_mut(vq / 2).map(|g| &mut **g)
    }

    pub fn set_memory(&mut self, memory: Option<Arc<GuestMemory>>) {
        for p in &mut self.pairs {
            p.memory = memory.clone();
        }
    }

    pub fn set_mrg_rxbuf(&mut self, on: bool) {
        for p in &mut self.pairs {
            p.mrg_rxbuf = on;
        }
    }

    /// Runs pair `p` on these rings with a driver already running them (a simulated guest,
    /// or a ring resumed after a reconnect): its receive ring is ready at once.
    pub fn run_pair(&mut self, p: usize, rx: impl Into<Virtqueue>, tx: impl Into<Virtqueue>) {
        let pair = &mut *self.pairs[p];
        pair.queues = [Some(rx.into()), Some(tx.into())];
        pair.make_rx_ready();
    }

    /// Pair `p`'s receive ring started: ready at once when `resumed` (a driver ran it
    /// before), else once the driver shows it runs it (see [`Pair::rx_ready`]); the guest
    /// is asked to kick it meanwhile, so that it can show it.
    pub fn rx_started(&mut self, p: usize, resumed: bool) {
        let Some(pair) = self.pairs.get_mut(p).map(|g| &mut **g) else { return };
        if resumed {
            pair.make_rx_ready();
            return;
        }
        (pair.rx_ready, pair.rx_posted_since) = (false, None);
        pair.set_rx_kicks(true);
    }

    /// The frontend is gone: no receive ring is ready, and descriptors lent while a ring
    /// was disabled (see `Lent::orphaned`) are forgotten with the memory table they keep
    /// mapped (their burst is done; a burst still in flight keeps its table until `rx_done`).
    pub fn forget_frontend(&mut self) {
        for p in &mut self.pairs {
            (p.rx_ready, p.rx_posted_since) = (false, None);
            if p.lent.orphaned {
                (p.lent.n, p.lent.orphaned, p.lent.memory) = (0, false, None);
            }
        }
    }
}

/// Frames the port refused, by reason (beyond the queue counters); added to by every PMD
/// thread that serves the port.
#[derive(Default)]
pub struct NetCounters {
    pub bad_chains: vswitch::counters::SharedCounter,
    /// Rings stopped because the driver made more than a queue's worth available (the
    /// port's error state; a new connection starts the rings afresh).
    pub broken_rings: vswitch::counters::SharedCounter,
    pub refused_frames: vswitch::counters::SharedCounter,
    pub guest_buffer_too_small: vswitch::counters::SharedCounter,
    /// Rings stopped because the frontend's memory file shrank under its memory table (a
    /// SIGBUS the switch recovered from; counted in `broken_rings` too).
    pub memory_faults: vswitch::counters::SharedCounter,
    /// Frames that took the single-copy path (lent, not copied into the pool).
    pub lent_frames: vswitch::counters::SharedCounter,
    /// Interrupts not sent because the guest's eventfd counter was full (it has not read
    /// the earlier ones, which it will).
    pub interrupts_full: vswitch::counters::SharedCounter,
}

pub struct VhostPort {
    name: String,
    pool: Arc<Pool>,
    pairs: [Mutex<Pair>; MAX_PAIRS],
    /// Memory and a receive and a transmit ring run (kept by `configure`, read without a
    /// lock).
    up: AtomicBool,
    /// Pairs whose receive ring runs (bit p): where the port may transmit.
    rx_running: AtomicU32,
    /// Pairs whose transmit ring runs: where the port receives.
    tx_running: AtomicU32,
    /// Pairs whose receive ring runs but is not ready yet (see [`Pair::rx_ready`]).
    rx_waiting: AtomicU32,
    counters: [QueueCounters; MAX_PAIRS],
    pub net: NetCounters,
    /// Connection log lines (a frontend reconnecting in a loop must not flood the log).
    pub(crate) conn_log: crate::ratelimit::LogLimit,
    /// A MAC to announce (SEND_RARP, after a migration): bit 48 set when one waits; the
    /// next burst from the guest carries a RARP frame from it.
    announce: AtomicU64,
    /// The MTU the frontend gave (NET_SET_MTU), 0 when none.
    guest_mtu: AtomicU32,
    /// Frames of [`net::LEND_MIN`] bytes or more are lent (one copy guest → guest), not
    /// copied into the pool (see [`VhostPort::set_single_copy`]).
    single_copy: AtomicBool,
    /// Why the connected frontend is in error (see [`VhostPort::fault`]), until it
    /// connects again.
    fault: Mutex<Option<String>>,
    faulted: AtomicBool,
    /// The switch gave up on the port ([`Port::fail`]): the error stays whatever the
    /// frontend does, until the port is added again.
    failed: AtomicBool,
    /// A frontend of this port made a call on its eventfds wait (see [`VhostPort::stalled`]):
    /// from then on, until the port is added again, the switch neither signals nor reads any
    /// frontend's eventfds on it (a VNF that reconnects to stall the switch again gets
    /// nothing from it; a well-behaved one works polled).
    distrusted: AtomicBool,
    /// See [`VhostPort::set_in_order`].
    in_order: AtomicBool,
}

/// How a frontend set up a vhost-user port's rings (see [`VhostPort::rings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    /// `VIRTIO_F_RING_PACKED`; split rings otherwise.
    pub packed: bool,
    /// Entries of the first running pair's receive ring (the guest's: the port sends into it)
    /// and transmit ring.
    pub rx_size: u16,
    pub tx_size: u16,
    /// Queue pairs whose both rings run.
    pub pairs: u32,
    /// `VIRTIO_F_IN_ORDER`.
    pub in_order: bool,
    /// `VIRTIO_NET_F_MRG_RXBUF`.
    pub mrg_rxbuf: bool,
}

/// Whether ports made from now on take the single-copy path (see
/// [`VhostPort::set_single_copy`]): the node's setting (`[vhost] single_copy`).
static SINGLE_COPY: AtomicBool = AtomicBool::new(true);

/// Sets whether ports made from now on take the single-copy path.
pub fn set_single_copy_default(on: bool) {
    SINGLE_COPY.store(on, Ordering::Relaxed);
}

/// The largest MTU a frontend may set: a frame with one tag within the port's longest.
pub const MAX_MTU: u32 = (vswitch::buf::MAX_FRAME - 18) as u32;

impl VhostPort {
    pub fn new(name: &str, pool: Arc<Pool>) -> VhostPort {
        VhostPort {
            name: name.into(),
            pool,
            pairs: Default::default(),
            up: AtomicBool::new(false),
            rx_running: AtomicU32::new(0),
            tx_running: AtomicU32::new(0),
            rx_waiting: AtomicU32::new(0),
            counters: Default::default(),
            net: NetCounters::default(),
            conn_log: Default::default(),
            announce: AtomicU64::new(0),
            guest_mtu: AtomicU32::new(0),
            single_copy: AtomicBool::new(SINGLE_COPY.load(Ordering::Relaxed)),
            fault: Mutex::new(None),
            faulted: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            distrusted: AtomicBool::new(false),
            in_order: AtomicBool::new(false),
        }
    }

    /// A call on one of the frontend's eventfds made the switch wait (`what` says which):
    /// the frontend is put in error and this port's eventfds are not used again.
    pub fn stalled(&self, what: &str) {
        self.distrusted.store(true, Ordering::Release);
        self.fault(format!("{what} made the switch wait: the frontend cleared O_NONBLOCK and filled or emptied it; the port signals and reads no eventfd of its frontends until it is added again"));
    }

    /// Whether the port's eventfds are no longer used (see [`VhostPort::stalled`]).
    pub fn distrusted(&self) -> bool {
        self.distrusted.load(Ordering::Acquire)
    }

    /// Whether the connected frontend is in error (see [`VhostPort::fault`]).
    pub fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    /// Puts the connected frontend in error for `why` (the first reason stays): its rings
    /// stop at once and stay stopped, and the port shows why (`ring_error`), until the
    /// frontend connects again. For what only a misbehaving frontend does: a descriptor of
    /// the wrong kind, a call it made wait, a burst the switch panicked on.
    pub fn fault(&self, why: impl Into<String>) {
        let why = why.into();
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        // SeqCst with the loads in `configure` and `rx_ready_by_transmission`: one of the
        // two always sees the other's store, so no running bit outlives the fault.
        self.faulted.store(true, Ordering::SeqCst);
        self.stop_running();
        if f.is_none() {
            tracing::warn!(port = %self.name, "vhost-user frontend in error: {why}; its rings stop until it connects again");
            *f = Some(why);
        }
    }

    /// A new frontend connected: an earlier one's error goes (not the switch's, see
    /// [`Port::fail`]).
    pub fn clear_fault(&self) {
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if !self.failed.load(Ordering::Acquire) {
            *f = None;
            self.faulted.store(false, Ordering::Release);
        }
    }

    /// Nothing runs: the running bitmaps cleared, the link down.
    fn stop_running(&self) {
        for m in [&self.rx_running, &self.tx_running, &self.rx_waiting] {
            m.store(0, Ordering::SeqCst);
        }
        self.up.store(false, Ordering::SeqCst);
    }

    /// Signals the guest on `call` (taken from its pair under the lock, signalled after):
    /// a full counter is counted, a call the frontend made wait puts it in error.
    #[inline]
    fn interrupt(&self, call: Option<Arc<EventFd>>) {
        let Some(call) = call else { return };
        if self.distrusted() {
            return;
        }
        match call.signal() {
            eventfd::Outcome::Done => {}
            eventfd::Outcome::WouldBlock => self.net.interrupts_full.add(1),
            eventfd::Outcome::Stalled | eventfd::Outcome::Failed => {
                self.stalled("an interrupt (call) descriptor")
            }
        }
    }

    /// Whether frames of [`net::LEND_MIN`] bytes or more cross to another vhost-user port
    /// with one copy (the default): their headers are copied into the switch, the rest
    /// stays in the guest's transmit buffer until the burst is processed and is copied
    /// straight into the receiving guest's buffer (into a pool buffer for other ports).
    /// Off: every frame is copied into the pool first (two copies), as before.
    pub fn set_single_copy(&self, on: bool) {
        self.single_copy.store(on, Ordering::Relaxed);
    }

    /// Sends a RARP frame from `mac` into the switch with the next burst from the guest,
    /// as QEMU does for a migrated guest (switches along the way learn where it is now).
    pub fn announce(&self, mac: vswitch::wire::MacAddr) {
        self.announce.store(mac.to_u64() | 1 << 48, Ordering::Release);
    }

    /// The MTU the frontend set (NET_SET_MTU); `None` before it did.
    pub fn guest_mtu(&self) -> Option<u32> {
        Some(self.guest_mtu.load(Ordering::Acquire)).filter(|m| *m > 0)
    }

    /// Records the MTU the frontend set; refused outside 68..=[`MAX_MTU`].
    pub fn set_guest_mtu(&self, mtu: u64) -> Result<(), u64> {
        match u32::try_from(mtu) {
            Ok(m) if (68..=MAX_MTU).contains(&m) => {
                self.guest_mtu.store(m, Ordering::Release);
                Ok(())
            }
            _ => Err(mtu),
        }
    }

    /// The announcement waiting, if any, as a frame in a new packet.
    #[cold]
    fn take_announcement(&self, cache: &mut PoolCache) -> Option<vswitch::BufId> {
        let v = self.announce.swap(0, Ordering::AcqRel);
        if v == 0 {
            return None;
        }
        let frame = rarp_frame(vswitch::wire::MacAddr::from_u64(v & 0xffff_ffff_ffff));
        let mut b = cache.alloc()?;
        if !self.pool.append(&mut b, &frame) {
            cache.free(b);
            return None;
        }
        Some(b)
    }

    /// Changes the device state (control side; may wait for PMD threads' bursts to end).
    pub fn configure<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        let mut d = Device {
            pairs: self.pairs.iter().map(|p| p.lock().unwrap_or_else(|e| e.into_inner())).collect(),
        };
        let r = f(&mut d);
        let pairs_where = |f: &dyn Fn(&Pair) -> bool| {
            d.pairs.iter().enumerate().filter(|(_, p)| f(p)).fold(0, |m, (i, _)| m | 1 << i)
        };
        let rx = pairs_where(&|p| p.rx_runs() && p.rx_ready);
        let tx = pairs_where(&|p| p.memory.is_some() && p.queues[TXQ].is_some());
        let waiting = pairs_where(&|p| p.rx_runs() && !p.rx_ready);
        // A frontend in error runs nothing until it connects again.
        let (rx, tx, waiting) =
            if self.faulted.load(Ordering::SeqCst) { (0, 0, 0) } else { (rx, tx, waiting) };
        self.rx_waiting.store(waiting, Ordering::SeqCst);
        self.rx_running.store(rx, Ordering::SeqCst);
        self.tx_running.store(tx, Ordering::SeqCst);
        self.up.store(rx != 0 && tx != 0, Ordering::SeqCst);
        // A fault that came in between (from a PMD thread, which takes no pair lock for it).
        if self.faulted.load(Ordering::SeqCst) {
            self.stop_running();
        }
        r
    }

    /// Receive rings that run but whose driver has not shown yet that it started them
    /// (see [`Pair::rx_ready`]), with their kick descriptors when they have one: the
    /// connection thread waits on those descriptors and calls [`VhostPort::rx_kicked`].
    /// Empty (and cheap) once every running ring is ready.
    pub fn unready_rx(&self) -> Vec<(usize, Option<RawFd>)> {
        let waiting = self.rx_waiting.load(Ordering::Acquire);
        if waiting == 0 {
            return Vec::new();
        }
        self.configure(|d| {
            d.pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.rx_runs() && !p.rx_ready)
                .map(|(i, p)| (i, p.kick[RXQ].as_ref().map(|f| f.as_raw_fd())))
                .collect()
        })
    }

    /// The guest kicked pair `p`'s receive ring while it was not ready: its driver runs it.
    pub fn rx_kicked(&self, p: usize) {
        self.configure(|d| {
            if let Some(pair) = d.pair_of(2 * p)
                && pair.rx_runs()
                && !pair.rx_ready
            {
                tracing::debug!(port = %self.name, pair = p, "receive ring ready: the guest kicked it");
                pair.make_rx_ready();
            }
        })
    }

    /// Receive rings that have held buffers for [`RX_READY_GRACE`] with no kick become ready
    /// (called by the connection thread while [`VhostPort::unready_rx`] lists some).
    pub fn rx_ready_after_grace(&self, now: Instant) {
        self.configure(|d| {
            for (i, pair) in d.pairs.iter_mut().map(|g| &mut **g).enumerate() {
                if !pair.rx_runs() || pair.rx_ready {
                    continue;
                }
                let posted = match (pair.memory.as_ref(), pair.queues[RXQ].as_mut()) {
                    (Some(mem), Some(q)) => q.ring(mem).map(|mut r| r.pending() > 0).unwrap_or(false),
                    _ => false,
                };
                if !posted {
                    pair.rx_posted_since = None;
                    continue;
                }
                if now.duration_since(*pair.rx_posted_since.get_or_insert(now)) >= RX_READY_GRACE {
                    tracing::debug!(port = %self.name, pair = i, "receive ring ready: buffers posted, no kick");
                    pair.make_rx_ready();
                }
            }
        })
    }

    /// The guest transmitted on pair `p` (whose lock the caller holds), so its driver runs:
    /// the receive ring is ready if it was not.
    #[cold]
    fn rx_ready_by_transmission(&self, pair: &mut Pair, p: usize) {
        if !pair.rx_runs() || self.faulted.load(Ordering::SeqCst) {
            return;
        }
        pair.make_rx_ready();
        self.rx_waiting.fetch_and(!(1 << p), Ordering::SeqCst);
        self.rx_running.fetch_or(1 << p, Ordering::SeqCst);
        self.up.store(self.tx_running.load(Ordering::SeqCst) != 0, Ordering::SeqCst);
        if self.faulted.load(Ordering::SeqCst) {
            self.stop_running();
        }
    }

    /// The frontend's rings were set up with `VIRTIO_F_IN_ORDER` acked; false once it is gone.
    pub fn set_in_order(&self, on: bool) {
        self.in_order.store(on, Ordering::Relaxed);
    }

    /// How the frontend set up its rings while a pair runs (control path: takes the first
    /// running pair's lock): what a user compares the port's figures by.
    pub fn rings(&self) -> Option<Rings> {
        let running =
            self.rx_running.load(Ordering::Acquire) & self.tx_running.load(Ordering::Acquire);
        let first = self.pairs.get(running.trailing_zeros() as usize)?;
        let pair = first.lock().unwrap_or_else(|e| e.into_inner());
        let [Some(rx), Some(tx)] = &pair.queues else { return None };
        Some(Rings {
            packed: rx.is_packed(),
            rx_size: rx.size(),
            tx_size: tx.size(),
            pairs: running.count_ones(),
            in_order: self.in_order.load(Ordering::Relaxed),
            mrg_rxbuf: pair.mrg_rxbuf,
        })
    }

    /// Queue pairs whose both rings run.
    pub fn running_pairs(&self) -> usize {
        (self.rx_running.load(Ordering::Acquire) & self.tx_running.load(Ordering::Acquire))
            .count_ones() as usize
    }

    /// Counts and logs (once) a ring its driver broke, and stops one whose memory the
    /// frontend took away (its file shrank: the memory reads as zeroes since).
    fn check_broken(&self, queue: &mut Virtqueue, mem: &GuestMemory, pair: usize, dir: usize) {
        // Checked first: zeroes where the rings were may also look like a broken driver.
        if mem.faulted() {
            if queue.stop(MEMORY_FAULT) {
                self.net.broken_rings.add(1);
                self.net.memory_faults.add(1);
                tracing::warn!(port = %self.name, virtqueue = 2 * pair + dir, "{MEMORY_FAULT}: ring stopped until it reconnects");
            }
            return;
        }
        if queue.newly_broken() {
            self.net.broken_rings.add(1);
            tracing::warn!(port = %self.name, virtqueue = 2 * pair + dir, "{}: ring stopped until it reconnects", queue.broken_reason().unwrap_or(crate::vring::OVERRUN));
        }
    }

    /// Why a ring of the connected frontend is stopped ("virtqueue N: why"), while one is: the
    /// port's error state, until the frontend reconnects (control path: takes the pairs'
    /// locks).
    pub fn ring_error(&self) -> Option<String> {
        if let Some(why) = self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Some(why);
        }
        self.pairs.iter().enumerate().find_map(|(p, pair)| {
            let pair = pair.lock().unwrap_or_else(|e| e.into_inner());
            pair.queues.iter().enumerate().find_map(|(dir, q)| {
                let why = q.as_ref()?.broken_reason()?;
                Some(format!("virtqueue {}: {why}", 2 * p + dir))
            })
        })
    }

    /// Counts a frame from the guest that the switch does not take.
    fn refuse_from_guest(&self, pair: usize, e: NetError) {
        self.net.refused_frames.add(1);
        self.counters[pair].rx_dropped.add(1);
        tracing::trace!(port = %self.name, error = %e, "frame from the guest refused");
    }

    /// The pair switch tx queue `q` sends on: pair `q` if its receive ring runs, else one of
    /// the running ones; `None` when none runs.
    fn tx_pair(&self, q: u16) -> Option<usize> {
        let running = self.rx_running.load(Ordering::Acquire);
        if running == 0 {
            return None;
        }
        let q = q as usize % MAX_PAIRS;
        if running & 1 << q != 0 {
            return Some(q);
        }
        // The (q mod n)-th running pair.
        let mut k = q % running.count_ones() as usize;
        let mut m = running;
        while k > 0 {
            m &= m - 1;
            k -= 1;
        }
        Some(m.trailing_zeros() as usize)
    }
}

/// A pair's lock if it is free. A lock poisoned by a thread that panicked holding it is
/// taken all the same: the pair is as a burst leaves it, and the panic was dealt with where
/// it was caught (the port put in error), so a poisoned lock must not stop the port for ever.
#[inline]
fn try_pair(lock: &Mutex<Pair>) -> Option<MutexGuard<'_, Pair>> {
    match lock.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
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

/// What a receive burst uses of its pair beside the ring (borrowed apart from its queue).
struct RxSide<'a> {
    p: usize,
    /// The ring's [`Virtqueue::id`].
    queue_id: u64,
    mem: &'a Arc<GuestMemory>,
    lent: &'a mut Lent,
    kicks_on: &'a mut bool,
    offloads: Offloads,
}

impl VhostPort {
    /// The receive burst on the guest's transmit ring, compiled for each ring layout (see
    /// [`Burst`]): frames received, chains taken, and whether the guest wants an interrupt.
    #[inline(never)]
    fn receive<'m, R: Burst<'m>>(
        &self,
        mut ring: R,
        side: RxSide<'_>,
        cache: &mut PoolCache,
        batch: &mut Batch,
    ) -> (usize, usize, bool) {
        let mut got = 0;
        if side.lent.n > 0 {
            // Lent while the ring was disabled: back in their places if it is the same ring.
            let l = &mut *side.lent;
            if l.queue == side.queue_id {
                for &h in &l.heads[..l.n] {
                    ring.push_read(h);
                }
            }
            (l.n, l.orphaned, l.memory) = (0, false, None);
        }
        if *side.kicks_on {
            ring.set_kicks(false); // polled: kicks would only cost the guest system calls
            *side.kicks_on = false;
        }
        // Chains of one buffer (every frame from DPDK's virtio-user and most from Linux): all
        // popped first, their buffers prefetched, then copied, then returned.
        let mut flats = [Flat::EMPTY; vswitch::batch::BATCH];
        let mut n = 0;
        while n < batch.room().min(flats.len())
            && let Some(f) = ring.pop_flat(false)
        {
            flats[n] = f;
            n += 1;
        }
        let lend = self.single_copy.load(Ordering::Relaxed);
        let mut lent_frames = 0;
        for f in &flats[..n] {
            let lends = lend && f.len() >= net::HDR_LEN + net::LEND_MIN;
            let r = if lends {
                // SAFETY: the burst's descriptors are kept (`side.lent`, with the memory
                // table) until `rx_done`, which the pipeline calls once it processed them.
                unsafe { net::lend_from_buffer(f.buffer(), cache, side.offloads) }
            } else {
                net::from_buffer(f.buffer(), cache, side.offloads).map(|b| (b, false))
            };
            match r {
                Ok((b, lent)) => {
                    // Frames asking for offload work were copied whole: not counted.
                    lent_frames += lent as u64;
                    let _ = batch.push(b).map_err(|b| cache.free(b)); // room was checked
                    got += 1;
                }
                Err(e) => self.refuse_from_guest(side.p, e),
            }
        }
        let (mut chain, mut used) = (Chain::default(), n);
        // The pipeline calls `rx_done` when the cache lent (it starts every poll not lending).
        let lent = cache.lending();
        if lent {
            // Given back at `rx_done`, all of them in ring order; longer chains wait for
            // the next burst (they would be returned ahead of these).
            let l = &mut *side.lent;
            for (h, f) in l.heads.iter_mut().zip(&flats[..n]) {
                *h = f.head;
            }
            (l.n, l.queue, l.memory) = (n, side.queue_id, Some(side.mem.clone()));
            self.net.lent_frames.add(lent_frames);
        } else {
            for f in &flats[..n] {
                ring.push_read(f.head);
            }
        }
        // Refused chains take no room in the batch: at most a batch of them a burst, so a
        // driver that keeps posting bad ones cannot hold the PMD thread.
        while !lent && batch.room() > 0 && used < n + vswitch::batch::BATCH {
            let Some(r) = ring.pop(&mut chain) else { break };
            used += 1;
            match r.map_err(|_| None).and_then(|()| {
                net::from_guest(side.mem, &chain, cache, side.offloads).map_err(Some)
            }) {
                Ok(b) => {
                    let _ = batch.push(b).map_err(|b| cache.free(b)); // room was checked
                    got += 1;
                }
                Err(None) => self.net.bad_chains.add(1),
                Err(Some(e)) => self.refuse_from_guest(side.p, e),
            }
            ring.push_read(chain.head);
        }
        (got, used, used > 0 && !lent && ring.needs_interrupt())
    }

    /// The transmit burst into the guest's receive ring, compiled for each ring layout (see
    /// [`Burst`]): packets taken from the front of `batch` (sent or refused), packets sent,
    /// and whether the guest wants an interrupt.
    #[inline(never)]
    fn transmit<'m, R: Burst<'m>>(
        &self,
        mut ring: R,
        mrg_rxbuf: bool,
        cache: &mut PoolCache,
        batch: &mut Batch,
    ) -> (usize, usize, bool) {
        // Unchained packets into receive chains of one buffer that holds them: every chain
        // popped first (their buffers prefetched), then the copies, then the completions.
        let mut flats = [Flat::EMPTY; vswitch::batch::BATCH];
        let mut n = 0;
        for b in batch.as_slice().iter().take(flats.len()) {
            let Some(f) = ring.pop_flat(true) else { break };
            if (self.pool.is_chained(b) && self.pool.lent_tail(b).is_none())
                || f.len() < net::HDR_LEN + self.pool.pkt_len(b)
            {
                ring.unpop();
                break;
            }
            flats[n] = f;
            n += 1;
        }
        for (f, b) in flats[..n].iter_mut().zip(batch.as_slice()) {
            let len = net::to_buffer(f.buffer(), &self.pool, b).unwrap_or(0); // the size was checked
            ring.push_used(f.head, len);
        }
        let mut chain = Chain::default();
        // Malformed chains met this burst: at most a batch of them (see `rx_burst`).
        let mut bad = 0;
        let (mut done, mut sent) = (n, n); // packets taken from the front (sent or refused); sent
        // The general path reads a packet by its pool segments: a lent one is copied into the
        // pool first; from one that finds no buffer on, the rest stay (unsent, dropped).
        let mut end = batch.len();
        if cache.lending()
            && let Some(i) =
                batch.as_mut_slice()[n..].iter_mut().position(|b| !self.pool.linearize(b, cache))
        {
            end = n + i;
        }
        'packets: for b in &batch.as_slice()[n..end] {
            // A malformed chain is returned empty and the same frame tries the next one.
            let outcome = loop {
                let o = if mrg_rxbuf {
                    match net::to_guest_merged(&mut ring, &self.pool, b, &mut chain) {
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
                        Some(Ok(())) => match net::to_guest(ring.memory(), &chain, &self.pool, b) {
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
                bad += 1;
                if bad == vswitch::batch::BATCH {
                    break o;
                }
            };
            match outcome {
                Outcome::Sent => sent += 1,
                Outcome::Refused => self.net.refused_frames.add(1),
                Outcome::NoRoom | Outcome::BadChain => break 'packets,
            }
            done += 1;
        }
        (done, sent, sent > 0 && ring.needs_interrupt())
    }
}

impl Port for VhostPort {
    fn pool(&self) -> Option<&Arc<Pool>> {
        Some(&self.pool)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn link_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    fn rx_queues(&self) -> u16 {
        MAX_PAIRS as u16
    }

    /// The guest enables pairs as it likes; a pair's receive side is serialised by its
    /// try-lock, so two threads polling it during a rebalance is harmless.
    fn rx_queues_dynamic(&self) -> bool {
        true
    }

    fn rx_queue_active(&self, q: u16) -> bool {
        self.tx_running.load(Ordering::Acquire) & 1 << (q as usize % MAX_PAIRS) != 0
    }

    fn tx_queues(&self) -> u16 {
        MAX_PAIRS as u16
    }

    fn rx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let p = q as usize % MAX_PAIRS;
        let mut got = 0;
        if self.announce.load(Ordering::Relaxed) != 0
            && let Some(b) = self.take_announcement(cache)
        {
            let _ = batch.push(b).map_err(|b| cache.free(b));
            got += 1;
        }
        if self.tx_running.load(Ordering::Acquire) & 1 << p == 0 {
            return got;
        }
        let Some(mut guard) = try_pair(&self.pairs[p]) else { return got };
        let pair = &mut *guard;
        let (Some(mem), Some(queue)) = (pair.memory.as_ref(), pair.queues[TXQ].as_mut()) else {
            return got;
        };
        // Another PMD thread's lent burst from this ring (both poll it for a moment while
        // they rebalance) is not back yet: descriptors go back in ring order, so wait.
        if pair.lent.n > 0 && !pair.lent.orphaned {
            return got;
        }
        let side = RxSide {
            p,
            queue_id: queue.id(),
            mem,
            lent: &mut pair.lent,
            kicks_on: &mut pair.kicks_on,
            offloads: pair.offloads,
        };
        let (received, used, interrupt) = match queue.ring(mem) {
            Ok(Ring::Split(r)) => self.receive(r, side, cache, batch),
            Ok(Ring::Packed(r)) => self.receive(r, side, cache, batch),
            Err(_) => return got,
        };
        got += received;
        let call = if interrupt { pair.call[TXQ].clone() } else { None };
        self.check_broken(queue, mem, p, TXQ);
        if used > 0 && !pair.rx_ready {
            self.rx_ready_by_transmission(pair, p);
        }
        drop(guard);
        self.interrupt(call);
        self.counters[p].rx_packets.add(got as u64);
        got
    }

    fn tx_burst(&self, q: u16, cache: &mut PoolCache, batch: &mut Batch) -> usize {
        let Some(p) = self.tx_pair(q) else { return 0 };
        // Another PMD thread sending on this pair holds the lock for one burst: wait for it.
        let mut guard = self.pairs[p].lock().unwrap_or_else(|e| e.into_inner());
        let pair = &mut *guard;
        let (Some(mem), Some(queue)) = (pair.memory.as_ref(), pair.queues[RXQ].as_mut()) else {
            return 0;
        };
        let (done, sent, interrupt) = match queue.ring(mem) {
            Ok(Ring::Split(r)) => self.transmit(r, pair.mrg_rxbuf, cache, batch),
            Ok(Ring::Packed(r)) => self.transmit(r, pair.mrg_rxbuf, cache, batch),
            Err(_) => return 0,
        };
        let call = if interrupt { pair.call[RXQ].clone() } else { None };
        self.check_broken(queue, mem, p, RXQ);
        drop(guard);
        self.interrupt(call);
        // Every packet taken was copied into the guest (or refused, counted): free them.
        for i in 0..done {
            cache.free(batch.take(i));
        }
        batch.consume_front(done);
        self.counters[p].tx_packets.add(sent as u64);
        self.counters[p].tx_full.add(batch.len() as u64);
        done
    }

    fn rx_done(&self, q: u16) {
        let p = q as usize % MAX_PAIRS;
        // Not `try_lock`: the descriptors must go back (a configuring control thread or a PMD
        // thread transmitting on the pair holds the lock for a moment).
        let mut guard = self.pairs[p].lock().unwrap_or_else(|e| e.into_inner());
        let pair = &mut *guard;
        // The ring disabled meanwhile: kept for the burst that finds it enabled again.
        if pair.queues[TXQ].is_none() && pair.parked[TXQ].is_some() {
            pair.lent.orphaned = pair.lent.n > 0;
            return;
        }
        // The memory table the tails were read from; the burst is sent, so it may go now
        // (a new table since — SET_MEM_TABLE while the rings run — maps the same rings).
        let _lent_from = std::mem::take(&mut pair.lent.memory);
        let n = std::mem::take(&mut pair.lent.n);
        let (Some(mem), Some(queue)) = (pair.memory.as_ref(), pair.queues[TXQ].as_mut()) else {
            return;
        };
        // A ring set up again meanwhile (the frontend restarted it) has other descriptors.
        if n == 0 || queue.id() != pair.lent.queue {
            return;
        }
        let Ok(mut ring) = queue.ring(mem) else { return };
        for &h in &pair.lent.heads[..n] {
            ring.push_read(h);
        }
        let call = if ring.needs_interrupt() { pair.call[TXQ].clone() } else { None };
        drop(ring);
        drop(guard);
        self.interrupt(call);
    }

    fn takes_lent(&self) -> bool {
        true
    }

    fn fail(&self, why: &str) {
        self.failed.store(true, Ordering::Release);
        self.fault(why);
    }

    /// The kick eventfd's number, for `poll` only: it may close while the PMD thread sleeps
    /// on it (the frontend went), which `poll` reports and nothing else minds.
    fn wake_fd(&self, q: u16) -> Option<RawFd> {
        if self.distrusted() {
            return None; // its thread sleeps at most 1 ms at a time instead
        }
        let pair = try_pair(self.pairs.get(q as usize)?)?;
        pair.kick[TXQ].as_ref().map(|f| f.as_raw_fd())
    }

    /// Before the PMD thread sleeps, the guest is asked to kick when it transmits (and the
    /// queue checked once more); after, kicks are suppressed again and the kick counter
    /// cleared.
    fn arm_wake(&self, q: u16, armed: bool) -> bool {
        let Some(lock) = self.pairs.get(q as usize) else { return false };
        let Some(mut guard) = try_pair(lock) else { return armed };
        let pair = &mut *guard;
        let (Some(mem), Some(queue)) = (pair.memory.as_ref(), pair.queues[TXQ].as_mut()) else {
            return false;
        };
        let Ok(mut ring) = queue.ring(mem) else { return false };
        ring.set_kicks(armed);
        if !armed {
            let kick = pair.kick[TXQ].clone();
            drop(ring);
            drop(guard);
            if let Some(k) = kick
                && !self.distrusted()
                && matches!(k.drain(), eventfd::Outcome::Stalled | eventfd::Outcome::Failed)
            {
                self.stalled("a kick descriptor");
            }
            return false;
        }
        ring.pending() > 0
    }

    /// One entry per queue pair.
    fn queue_stats(&self) -> Vec<QueueStats> {
        self.counters.iter().map(QueueCounters::read).collect()
    }
}

/// The frame QEMU (and DPDK's vhost library) sends for a migrated guest: a broadcast RARP
/// "reverse request" from its MAC, padded to 60 bytes.
pub fn rarp_frame(mac: vswitch::wire::MacAddr) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[..6].fill(0xff);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&0x8035u16.to_be_bytes());
    // Ethernet, IPv4, 6- and 4-byte addresses, operation 3; sender and target hardware
    // addresses the guest's, protocol addresses zero.
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]);
    f[22..28].copy_from_slice(&mac.0);
    f[32..38].copy_from_slice(&mac.0);
    f
}

//! Poll-mode driver threads: each polls its share of the (port, rx queue) pairs and runs
//! the pipeline, adopting new configuration snapshots between bursts. What a thread does
//! when its queues are empty is its [`IdlePolicy`].
//!
//! Busy and idle TSC cycles are counted so cycles/packet can be reported the way
//! `ovs-appctl dpif-netdev/pmd-stats-show` does. Stopping is prompt: a flag plus a write to
//! each thread's eventfd; `PmdSet` stops and joins its threads on drop.

use crate::batch::Batch;
use crate::counters::Event;
use crate::snapshot::Snapshot;
pub use crate::switch::Moves;
use crate::switch::Switch;
use crate::util::{coarse_secs, cycles};
use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a PMD thread does when its queues are empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum IdlePolicy {
    /// Spin forever (benchmarks, dedicated cores).
    Busy,
    /// The default: spin for `spin_us` after the last packet, then arm every polled queue's
    /// wake descriptor, look at the queues again (a packet that arrived meanwhile cancels the
    /// sleep, so no wake-up is lost), and sleep in `poll(2)` until a queue or the thread's own
    /// eventfd (stop) is signalled, or `max_sleep_us` passes, like OVS's `pmd-maxsleep`. A
    /// polled queue without a wake descriptor cuts each sleep to 1 ms.
    ///
    /// Either field may be left out (`{ policy = "adaptive" }`): the defaults apply.
    Adaptive {
        #[serde(default = "default_spin_us")]
        spin_us: u32,
        #[serde(default = "default_max_sleep_us")]
        max_sleep_us: u32,
    },
}

fn default_spin_us() -> u32 {
    200
}

fn default_max_sleep_us() -> u32 {
    10_000
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy::Adaptive { spin_us: default_spin_us(), max_sleep_us: default_max_sleep_us() }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmdConfig {
    /// Number of PMD threads (at least 1).
    pub threads: usize,
    /// CPU to pin each thread to (by index); missing entries are not pinned.
    #[serde(default)]
    pub cores: Vec<usize>,
    #[serde(default)]
    pub idle: IdlePolicy,
}

/// A queue a PMD thread polls and what polling it cost: the cycles from the end of the
/// previous poll that moved packets (or the loop's start) to the end of this one, for polls
/// that moved packets, as `dpif-netdev/pmd-rxq-show` reports.
pub struct PolledQueue {
    pub port: u16,
    pub queue: u16,
    busy: AtomicU64,
    packets: AtomicU64,
}

impl PolledQueue {
    pub fn busy_cycles(&self) -> u64 {
        self.busy.load(Relaxed)
    }

    pub fn packets(&self) -> u64 {
        self.packets.load(Relaxed)
    }

    /// The polling thread's own count (it is the only writer).
    #[inline(always)]
    fn add(&self, cycles: u64, packets: usize) {
        self.busy.store(self.busy.load(Relaxed).wrapping_add(cycles), Relaxed);
        self.packets.store(self.packets.load(Relaxed).wrapping_add(packets as u64), Relaxed);
    }
}

/// What a PMD thread polls, published whenever its share of the queues changes (the
/// queues' counts start again then).
pub struct Placement {
    pub queues: Vec<PolledQueue>,
    /// The thread's counters (its busy and idle cycles).
    pub stats: Arc<crate::counters::ThreadStats>,
}

/// Each polled queue's thread and busy cycles at one moment ([`PmdSet::sample`]).
pub struct LoadSample(std::collections::BTreeMap<(u16, u16), (usize, u64)>);

/// A queue a rebalance measured: its load over the window and its thread before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub port: u16,
    pub queue: u16,
    pub busy_cycles: u64,
    pub from: Option<usize>,
    pub to: Option<usize>,
}

/// One PMD thread as [`PmdSet::threads`] reports it.
pub struct PmdView {
    pub index: usize,
    pub core: Option<usize>,
    pub alive: bool,
    pub placement: Option<Arc<Placement>>,
}

/// Running PMD threads of one switch.
pub struct PmdSet {
    stop: Arc<AtomicBool>,
    kicks: Vec<Arc<OwnedFd>>,
    adopted: Arc<[AtomicU64]>,
    /// Per thread, the snapshot it last replaced, for [`PmdSet::reclaim`] to free.
    retired: Arc<[Retired]>,
    /// Per thread, whether it runs (false once it ended, stopped or not).
    alive: Arc<[AtomicBool]>,
    /// Per thread, what it polls.
    placements: Arc<[ArcSwapOption<Placement>]>,
    cores: Vec<Option<usize>>,
    threads: Vec<JoinHandle<()>>,
}

/// Marks its thread ended when dropped: as the thread returns, and as a panic unwinds it.
struct Alive<'a>(&'a AtomicBool);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

/// Where a PMD thread leaves the snapshot it stopped using. The last reference to a
/// configuration may be the PMD thread's (`Switch::apply` dropped its own), and freeing a
/// large one there (4 096 bridge domains: ~16 000 frees, a millisecond) would stall the
/// thread's polling; the control thread frees it instead, in [`PmdSet::reclaim`]. A snapshot
/// nobody collected is freed by the thread when it retires the next one.
type Retired = ArcSwapOption<Snapshot>;

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn kick(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Pins the calling thread to `core` (a warning, not an error, when it cannot).
pub fn pin_current_thread(core: usize) {
    pin(core)
}

fn pin(core: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET indexes within it; sched_setaffinity(0) acts on
    // the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(core, "could not pin PMD thread: {}", std::io::Error::last_os_error());
        }
    }
}

impl PmdSet {
    /// Starts the threads.
    pub fn start(switch: Arc<Switch>, cfg: &PmdConfig) -> std::io::Result<PmdSet> {
        let n = cfg.threads.max(1);
        switch.set_pmd_threads(n);
        let stop = Arc::new(AtomicBool::new(false));
        let adopted: Arc<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let retired: Arc<[Retired]> = (0..n).map(|_| Retired::empty()).collect();
        let alive: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(true)).collect();
        let placements: Arc<[ArcSwapOption<Placement>]> =
            (0..n).map(|_| ArcSwapOption::empty()).collect();
        let mut kicks = Vec::new();
        let mut threads = Vec::new();
        for idx in 0..n {
            let kick = Arc::new(eventfd()?);
            kicks.push(kick.clone());
            let (switch, stop, adopted, retired, alive, placements) = (
                switch.clone(),
                stop.clone(),
                adopted.clone(),
                retired.clone(),
                alive.clone(),
                placements.clone(),
            );
            let core = cfg.cores.get(idx).copied();
            let idle = cfg.idle;
            let t = std::thread::Builder::new().name(format!("pmd{idx}")).spawn(move || {
                let _alive = Alive(&alive[idx]);
                if let Some(c) = core {
                    pin(c);
                }
                run(
                    idx,
                    n,
                    &switch,
                    &stop,
                    (&adopted[idx], &retired[idx], &placements[idx]),
                    kick.as_raw_fd(),
                    idle,
                );
            })?;
            threads.push(t);
        }
        tracing::info!(threads = n, ?cfg.idle, "PMD threads started");
        let cores = (0..n).map(|i| cfg.cores.get(i).copied()).collect();
        Ok(PmdSet { stop, kicks, adopted, retired, alive, placements, cores, threads })
    }

    /// Waits until every thread runs configuration `generation` or newer, then frees the
    /// snapshots they replaced ([`PmdSet::reclaim`]): the ports only older configurations
    /// named are closed once their last holder drops them.
    pub fn wait_adopted(&self, generation: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.adopted.iter().all(|a| a.load(Acquire) >= generation) {
                self.reclaim();
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            for k in &self.kicks {
                kick(k.as_raw_fd());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Threads that ended without being stopped (a panic outside a port's burst): the node is
    /// not healthy while there is one, and its health check says so.
    pub fn dead_threads(&self) -> Vec<usize> {
        if self.stop.load(Acquire) {
            return Vec::new();
        }
        self.alive.iter().enumerate().filter(|(_, a)| !a.load(Acquire)).map(|(i, _)| i).collect()
    }

    /// Each thread: its core, whether it runs, the queues it polls and what they cost.
    pub fn threads(&self) -> Vec<PmdView> {
        (0..self.placements.len())
            .map(|i| PmdView {
                index: i,
                core: self.cores.get(i).copied().flatten(),
                alive: self.alive[i].load(Acquire),
                placement: self.placements[i].load_full(),
            })
            .collect()
    }

    /// Each polled queue's thread and busy cycles so far (what [`PmdSet::rebalance`]
    /// measures a window from).
    pub fn sample(&self) -> LoadSample {
        LoadSample(
            self.threads()
                .iter()
                .filter_map(|t| Some((t.index, t.placement.clone()?)))
                .flat_map(|(i, p)| {
                    p.queues
                        .iter()
                        .map(|q| ((q.port, q.queue), (i, q.busy_cycles())))
                        .collect::<Vec<_>>()
                })
                .collect(),
        )
    }

    /// Places the queues of ports without a pin by the load each took since `before` (busy
    /// cycles), the busiest first on the least loaded thread without a pin, as OVS's
    /// `pmd-rxq-rebalance`; the threads follow at once. Returns each queue measured with its
    /// load and its thread before and after.
    pub fn rebalance(&self, switch: &Switch, before: &LoadSample) -> Vec<Moved> {
        let after = self.sample().0;
        let snap = switch.snapshot();
        let n = self.placements.len();
        let pinned: Vec<usize> = (0..n)
            .filter(|&t| {
                snap.ports.iter().flatten().any(|pe| pe.pmd.map(|p| p as usize % n) == Some(t))
            })
            .collect();
        let mut threads: Vec<usize> = (0..n).filter(|t| !pinned.contains(t)).collect();
        if threads.is_empty() {
            threads = (0..n).collect();
        }
        // Not onto a thread that ended (its queues are dealt to the others only by a restart).
        threads.retain(|&t| self.alive[t].load(Acquire));
        let movable: Vec<((u16, u16), u64)> = after
            .iter()
            .filter(|(q, _)| snap.port(q.0).is_some_and(|pe| pe.pmd.is_none()))
            .map(|(q, &(_, busy))| {
                (*q, before.0.get(q).filter(|b| b.1 <= busy).map_or(busy, |b| busy - b.1))
            })
            .collect();
        let placed = place_by_load(movable.clone(), &threads);
        let generation = switch.moves().generation + 1;
        switch.set_moves(Moves { generation, placed: placed.clone() });
        for k in &self.kicks {
            kick(k.as_raw_fd());
        }
        movable
            .into_iter()
            .map(|(q, load)| Moved {
                port: q.0,
                queue: q.1,
                busy_cycles: load,
                from: after.get(&q).map(|a| a.0),
                to: placed.get(&q).copied(),
            })
            .collect()
    }

    /// Frees, on the calling thread, the snapshots PMD threads have stopped using.
    pub fn reclaim(&self) {
        for r in self.retired.iter() {
            drop(r.swap(None));
        }
    }

    /// Stops and joins every thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Release);
        for k in &self.kicks {
            kick(k.as_raw_fd());
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for PmdSet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Thread `idx`'s share (of `n`) of the rx queues. A port pinned to a thread
/// ([`crate::config::PortConfig::pmd`]) is polled there, and a thread with a pinned port
/// polls only pinned ports (OVS's `pmd-rxq-isolate`); the other queues are dealt in turn, every
/// k-th to each of the k threads without a pin (all n when every thread has one), so they
/// spread evenly. Queues of ports whose queues come and go
/// ([`crate::port::Port::rx_queues_dynamic`]) are dealt after the others, only while active,
/// so a guest's running queue pairs land on different threads whichever pairs it enables
/// (the others move only when the configuration changes, and every port's rx is a try-lock:
/// two threads polling one queue for a moment take turns).
pub fn assignment(snap: &Snapshot, idx: usize, n: usize) -> Vec<(u16, u16)> {
    assignment_with(snap, idx, n, &Moves::default())
}

/// [`assignment`] after a rebalance's `moves`.
pub fn assignment_with(snap: &Snapshot, idx: usize, n: usize, moves: &Moves) -> Vec<(u16, u16)> {
    let dynamic = |&(p, _): &(u16, u16)| snap.port(p).is_some_and(|pe| pe.port.rx_queues_dynamic());
    let polled = |q: &&(u16, u16)| {
        !dynamic(q) || snap.port(q.0).is_some_and(|pe| pe.port.rx_queue_active(q.1))
    };
    let pin = |&(p, _): &(u16, u16)| snap.port(p).and_then(|pe| pe.pmd).map(|t| t as usize % n);
    let pinned: Vec<bool> = (0..n).map(|t| snap.rxqs.iter().any(|q| pin(q) == Some(t))).collect();
    let mut dealt: Vec<usize> = (0..n).filter(|&t| !pinned[t]).collect();
    if dealt.is_empty() {
        dealt = (0..n).collect();
    }
    let placed = |q: &(u16, u16)| moves.placed.get(q).copied().filter(|t| dealt.contains(t));
    let mine =
        snap.rxqs.iter().filter(|q| pin(q).or_else(|| placed(q)) == Some(idx)).filter(polled);
    let Some(k) = dealt.iter().position(|&t| t == idx) else { return mine.copied().collect() };
    let unplaced = |q: &&(u16, u16)| pin(q).is_none() && placed(q).is_none();
    let fixed = snap.rxqs.iter().filter(unplaced).filter(|q| !dynamic(q));
    let active = snap.rxqs.iter().filter(unplaced).filter(|q| dynamic(q)).filter(polled);
    let others =
        fixed.chain(active).enumerate().filter(|(i, _)| i % dealt.len() == k).map(|(_, q)| q);
    mine.chain(others).copied().collect()
}

/// Places `loads` (queue, busy cycles) on `threads`, the busiest first, each on the thread
/// with the least load so far (OVS's `cycles` assignment), idle queues spread by count;
/// returns the placement.
pub fn place_by_load(
    mut loads: Vec<((u16, u16), u64)>,
    threads: &[usize],
) -> std::collections::BTreeMap<(u16, u16), usize> {
    loads.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    // Ties (idle queues) go to the thread with the fewest queues.
    let (mut sum, mut count) = (vec![0u64; threads.len()], vec![0usize; threads.len()]);
    let mut placed = std::collections::BTreeMap::new();
    for (q, load) in loads {
        let Some(i) = (0..threads.len()).min_by_key(|&i| (sum[i], count[i], i)) else { break };
        (sum[i], count[i]) = (sum[i] + load, count[i] + 1);
        placed.insert(q, threads[i]);
    }
    placed
}

/// [`assignment`] without the queues of ports in error (see [`crate::faults`]). They are
/// left out after the queues are dealt, so a fault seen by one thread before another never
/// moves a queue to a second thread.
fn assigned(switch: &Switch, snap: &Snapshot, idx: usize, n: usize) -> Vec<(u16, u16)> {
    let mut q = assignment_with(snap, idx, n, &switch.moves());
    if switch.faults().generation() != 0 {
        q.retain(|&(p, _)| snap.port(p).is_none_or(|pe| switch.faults().get(&pe.name).is_none()));
    }
    q
}

/// Runs `f` (work on a port's behalf, `blame`: the port and what the work is); a panic in it
/// puts in error the port whose code ran — the port being sent to if the panic was in its
/// transmit burst, else `blame`'s — and the thread goes on: `None` after a panic. Work with
/// no port to blame (`blame` `None`, and no transmit burst) lets the panic end the thread.
///
/// The pipeline a panic interrupted is left behind (not dropped: what it holds is as the
/// panic left it, so its packets are left out of the pool) and `pipe` starts afresh; so are
/// the packets of `batch`. A failed port keeps lent descriptors and their memory (`Port::fail`).
#[inline]
fn guarded<R>(
    pipe: &mut crate::pipeline::Pipeline,
    switch: &Switch,
    idx: usize,
    snap: &Snapshot,
    blame: Option<(u16, &str)>,
    batch: &mut Batch,
    f: impl FnOnce(&mut crate::pipeline::Pipeline, &mut Batch) -> R,
) -> Option<R> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(pipe, batch))) {
        Ok(r) => Some(r),
        Err(payload) => {
            let (egress, message) =
                (crate::faults::take_egress(), crate::faults::panic_message(&*payload));
            let Some(blamed) = egress.or(blame.map(|b| b.0)) else {
                std::panic::resume_unwind(payload)
            };
            let lost = pipe.recover_from_panic(batch);
            std::mem::forget(std::mem::replace(pipe, switch.pipeline(idx)));
            let role = if egress.is_some() { "sending to it" } else { blame.map_or("", |b| b.1) };
            let why = format!(
                "the switch panicked {role}: {message} ({lost} packets of the burst and those queued on the thread lost)"
            );
            switch.fail_port(snap, blamed, why);
            None
        }
    }
}

/// How often a PMD thread looks again at which of its dynamic queues are active (its own
/// placement; not [`PmdSet::rebalance`], which moves queues between threads).
const REBALANCE: Duration = Duration::from_millis(100);

/// Publishes `queues` as the thread's placement (with `stats`, the thread's counters) if
/// they are not what it polls already; returns what it polls. A queue it kept keeps its
/// counts.
fn place(
    slot: &ArcSwapOption<Placement>,
    current: Arc<Placement>,
    queues: Vec<(u16, u16)>,
    stats: &Arc<crate::counters::ThreadStats>,
) -> Arc<Placement> {
    let same = current.queues.len() == queues.len()
        && current.queues.iter().zip(&queues).all(|(a, &(p, q))| (a.port, a.queue) == (p, q));
    if same && Arc::ptr_eq(&current.stats, stats) {
        return current;
    }
    let kept = |port: u16, queue: u16, f: fn(&PolledQueue) -> u64| {
        current.queues.iter().find(|c| (c.port, c.queue) == (port, queue)).map_or(0, f)
    };
    let queues = queues
        .into_iter()
        .map(|(port, queue)| PolledQueue {
            port,
            queue,
            busy: AtomicU64::new(kept(port, queue, PolledQueue::busy_cycles)),
            packets: AtomicU64::new(kept(port, queue, PolledQueue::packets)),
        })
        .collect();
    let placed = Arc::new(Placement { queues, stats: stats.clone() });
    slot.store(Some(placed.clone()));
    placed
}

fn run(
    idx: usize,
    n: usize,
    switch: &Switch,
    stop: &AtomicBool,
    (adopted, retired, placement): (&AtomicU64, &Retired, &ArcSwapOption<Placement>),
    kick_fd: RawFd,
    idle: IdlePolicy,
) {
    let mut pipe = switch.pipeline(idx);
    let mut snap = switch.snapshot();
    let mut stats = pipe.stats().clone();
    let mut polled = place(
        placement,
        Arc::new(Placement { queues: Vec::new(), stats: stats.clone() }),
        assigned(switch, &snap, idx, n),
        &stats,
    );
    placement.store(Some(polled.clone()));
    let mut faults = switch.faults().generation();
    let mut moved = switch.moves_generation();
    adopted.store(snap.generation, Release);
    let mut batch = Batch::new();
    let mut idle_since: Option<Instant> = None;
    let mut last = cycles();
    let (mut loops, mut next_rebalance) = (0u32, Instant::now() + REBALANCE);
    while !stop.load(Acquire) {
        if switch.generation() != snap.generation {
            let old = std::mem::replace(&mut snap, switch.snapshot());
            // Left before `adopted` moves, so that whoever sees the adoption finds it.
            drop(retired.swap(Some(old)));
            polled = place(placement, polled, assigned(switch, &snap, idx, n), &stats);
            adopted.store(snap.generation, Release);
            pipe.stats().event(Event::ConfigAdopted, 1);
        }
        // Busy threads look every 1024 polls, idle ones every time (a clock read).
        loops = loops.wrapping_add(1);
        if faults != switch.faults().generation()
            || moved != switch.moves_generation()
            || (loops % 1024 == 0 || idle_since.is_some()) && Instant::now() >= next_rebalance
        {
            faults = switch.faults().generation();
            moved = switch.moves_generation();
            polled = place(placement, polled, assigned(switch, &snap, idx, n), &stats);
            next_rebalance = Instant::now() + REBALANCE;
        }
        pipe.set_now(coarse_secs());
        let mut got = 0;
        let mut since = last;
        for pq in &polled.queues {
            let (p, q) = (pq.port, pq.queue);
            match guarded(
                &mut pipe,
                switch,
                idx,
                &snap,
                Some((p, "processing a burst it sent")),
                &mut batch,
                |pipe, batch| pipe.poll(&snap, p, q, batch),
            ) {
                Some(0) => {}
                Some(n) => {
                    got += n;
                    let now = cycles();
                    pq.add(now.wrapping_sub(since), n);
                    since = now;
                }
                None => break, // the port's queues leave the list next round
            }
        }
        if !Arc::ptr_eq(&stats, pipe.stats()) {
            // A panic replaced the pipeline (and its counters): the placement shows the new ones.
            stats = pipe.stats().clone();
            let queues = polled.queues.iter().map(|q| (q.port, q.queue)).collect();
            polled = place(placement, polled, queues, &stats);
        }
        let now = cycles();
        let spent = now.wrapping_sub(last);
        last = now;
        if got > 0 {
            pipe.stats().busy_cycles.add(spent);
            idle_since = None;
            continue;
        }
        pipe.stats().idle_cycles.add(spent);
        // Frames waiting for a next hop are retried (or given up) even without traffic.
        guarded(&mut pipe, switch, idx, &snap, None, &mut batch, |pipe, _| {
            pipe.housekeeping(&snap)
        });
        if let IdlePolicy::Adaptive { spin_us, max_sleep_us } = idle {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_micros(spin_us as u64) {
                if let Err((p, payload)) = sleep(&snap, &polled.queues, kick_fd, max_sleep_us) {
                    let why = format!(
                        "the switch panicked arming its wake-up: {}",
                        crate::faults::panic_message(&*payload)
                    );
                    switch.fail_port(&snap, p, why);
                }
                pipe.stats().sleeps.add(1);
                idle_since = None;
                last = cycles();
            }
        } else {
            std::hint::spin_loop();
        }
    }
    pipe.flush(&snap);
}

/// A port's `arm_wake`; a panic in it is returned with the port (its queues' wake-ups are
/// the port's code).
fn arm(
    snap: &Snapshot,
    p: u16,
    q: u16,
    armed: bool,
) -> Result<bool, (u16, Box<dyn std::any::Any + Send>)> {
    let Some(pe) = snap.port(p) else { return Ok(false) };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pe.port.arm_wake(q, armed)))
        .map_err(|e| (p, e))
}

/// Arms the queues' wake descriptors and sleeps until one fires, the thread is kicked, or the
/// timeout passes. Returns at once if a queue already has packets; the port whose wake-up
/// panicked, if one did.
fn sleep(
    snap: &Snapshot,
    queues: &[PolledQueue],
    kick_fd: RawFd,
    max_sleep_us: u32,
) -> Result<(), (u16, Box<dyn std::any::Any + Send>)> {
    let mut fds = Vec::with_capacity(queues.len() + 1);
    fds.push(libc::pollfd { fd: kick_fd, events: libc::POLLIN, revents: 0 });
    let mut pending = false;
    let mut capped = false;
    let mut panicked = None;
    for &PolledQueue { port: p, queue: q, .. } in queues {
        let Some(pe) = snap.port(p) else { continue };
        match arm(snap, p, q, true) {
            Ok(has) => pending |= has,
            Err(e) => {
                panicked.get_or_insert(e);
                continue;
            }
        }
        match pe.port.wake_fd(q) {
            Some(fd) => fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
            None => capped = true,
        }
    }
    if !pending && panicked.is_none() {
        let ms = (max_sleep_us / 1000).max(1) as i32;
        let timeout = if capped { 1 } else { ms };
        // SAFETY: fds is a valid array of pollfd of the given length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if fds[0].revents != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a u64 from our own non-blocking eventfd.
            unsafe { libc::read(kick_fd, (&mut v as *mut u64).cast(), 8) };
        }
    }
    for &PolledQueue { port: p, queue: q, .. } in queues {
        if panicked.as_ref().is_some_and(|(bad, _)| *bad == p) {
            continue;
        }
        if let Err(e) = arm(snap, p, q, false) {
            panicked.get_or_insert(e);
        }
    }
    panicked.map_or(Ok(()), Err)
}

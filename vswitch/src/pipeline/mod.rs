//! The per-thread packet pipeline: one rx burst in, per-port tx batches out, as a graph of
//! nodes, one file each (VPP's graph nodes; each names itself in the packet trace and counts
//! its drops by reason):
//!
//! ```text
//!  rx burst ─ police ─┬─ cache ──hit──────────────────────────────┬─ vlan-rewrite ─┐
//!                     │    └miss─┐                                 └─ vxlan-encap ──┤
//!                     ├─ classify ─ port-security ─┐                                ├─ tx
//!                     └─ vxlan-decap ─ (vtep) ─────┴─ learn ─ l2-forward ─┬─ vlan-rewrite ─┤
//!                                                     (arp-nd-suppress)   ├─ vxlan-encap ─ neighbor-hold
//!                                                                         └─ flood ─ (each member)
//! ```
//!
//! - [`cache`] (stage 0): a frame whose flow the exact-match cache knows goes straight to
//!   egress; the rest go on, in order, to stages 1 and 2, which fill the cache when they
//!   forward a frame as known unicast (see [`crate::emc`]). From a port with port security
//!   only untagged IPv4 frames are filled, keyed on every byte the check reads;
//! - [`classify`] / [`decap`] (stage 1): (port, VLAN) → bridge domain, or VXLAN decap on the
//!   underlay; L2 sanity; port security; the FDB keys of source and destination, their
//!   buckets prefetched for stage 2;
//! - [`learn`], [`forward`] (stage 2): MAC learning, ARP/ND suppression, FDB lookup, then
//!   egress to one port ([`rewrite`]), one peer ([`encap`], [`neighbor`] while its next hop
//!   resolves) or a [`flood`];
//! - [`tx`]: the per-port tx batches, flushed once per burst.
//!
//! The graph's nodes and next nodes are data in [`crate::graph`]. By default the nodes are
//! fused, as measured against the per-node dispatcher ([`nodes`], [`Dispatch::PerNode`]:
//! docs/perf/pipeline.md "Fused or per-node"): stage 1 runs over the whole burst, stage 2 frame by
//! frame in order (a frame may change the FDB the next one is forwarded with), the cache's
//! hits skip stages 1 and 2, and egress is a direct call except where a batch per next node
//! pays (tx per port, the cache's hits to peers). The fused dispatcher is
//! [`Pipeline::process`] ([`dispatch`]); the packet trace ([`trace`], [`crate::trace`])
//! reports every logical node a frame passed.
//!
//! Each node file declares its node ([`crate::graph::Descriptor`]: name, next nodes, drop
//! reasons, events; [`crate::graph::NODES`] collects them), owns its state (one struct of it
//! in [`Pipeline`]) and names what it uses in its imports. A frame moves on by one verb,
//! `hand_*`: `hand_to_<next>` (`rewrite`, `encap`, `hold` for neighbor-hold, `tx`, `tx_first`
//! ahead of a shared egress's batch, `port` for either), `hand_on` (what `l2-forward`
//! decided), `hand_copy_to` (a flood's copies), `hand_hit_to_rewrite` (a cache hit that needs
//! a new tag), and `hand_to_frame` onto the next node's frame (per node). The per-node
//! dispatcher runs only with the `per-node` feature (the test kit's): without it its code
//! is compiled but never reached (its branches test a `cfg!` constant, which the compiler
//! folds away).
//!
//! Every drop has a named reason ([`DropReason`]); counters are per thread. Nothing here
//! allocates, locks or makes a syscall per packet (ports may make one per burst).

pub(crate) mod cache;
mod capture;
pub(crate) mod classify;
pub(crate) mod decap;
mod dispatch;
pub(crate) mod encap;
pub(crate) mod flood;
pub(crate) mod forward;
pub(crate) mod learn;
pub(crate) mod neighbor;
mod nodes;
mod police;
pub(crate) mod rewrite;
mod trace;
pub(crate) mod tx;

pub use self::nodes::Dispatch;
use crate::batch::Batch;
use crate::buf::{BufId, Pool, PoolCache};
use crate::counters::{DropReason, ThreadStats};
use crate::fdb::{Fdb, Loc};
use crate::neigh::Neighbors;
use crate::snapshot::{PortEntry, Snapshot};
use crate::trace::{Step, Tracing};
use crate::vtep::DecapCache;
use std::sync::Arc;

const NO_PEER: u16 = u16::MAX;

/// What stage 1 found out about one packet.
#[derive(Clone, Copy, Default)]
struct Ctx {
    /// Frame length as received (after a priority tag was removed).
    len: u32,
    /// The frame was turned into an answer (ARP/ND for the VTEP address) to send back out of
    /// the ingress port.
    reply: bool,
    /// The frame was an answer to the VTEP's neighbor requests, learned and done with.
    taken: bool,
    bd: u16,
    drop: Option<DropReason>,
    from_peer: u16,
    tagged: bool,
    pcp: u16,
    src_key: u64,
    dst_key: u64,
    src_loc: Loc,
    dst_loc: Loc,
}

/// Packets and bytes of consecutive frames of one bridge domain: consecutive frames usually
/// share one, so its counters are written once per run.
#[derive(Clone, Copy)]
struct BdRun {
    bd: u16,
    packets: u64,
    bytes: u64,
}

impl BdRun {
    fn new(bd: u16) -> BdRun {
        BdRun { bd, packets: 0, bytes: 0 }
    }

    /// Adds a frame; when it starts a new run, returns the finished one (to count).
    #[inline(always)]
    fn add(&mut self, bd: u16, len: usize) -> Option<BdRun> {
        let done = self.switch_to(bd);
        self.count(len);
        done
    }

    /// Starts a run of `bd` unless this is one; returns the finished run.
    #[inline(always)]
    fn switch_to(&mut self, bd: u16) -> Option<BdRun> {
        (bd != self.bd).then(|| std::mem::replace(self, BdRun::new(bd)))
    }

    #[inline(always)]
    fn count(&mut self, len: usize) {
        self.packets += 1;
        self.bytes += len as u64;
    }
}

/// The state one PMD thread forwards with.
pub struct Pipeline {
    thread: usize,
    pool: Arc<Pool>,
    cache: PoolCache,
    fdb: Arc<Fdb>,
    stats: Arc<ThreadStats>,
    /// Node `tx`'s batches.
    tx: tx::TxQueues,
    /// Known-unicast packets of this burst (counted once per burst).
    known: u64,
    decap_cache: DecapCache,
    now: u32,
    /// Node `neighbor-hold`'s state.
    hold: neighbor::Hold,
    /// Node `cache`'s state.
    flows: cache::Flows,
    clock: fn() -> u64,
    /// The packet trace's state.
    trace: trace::Traces,
    /// The per-node dispatcher's state.
    nodes: nodes::PerNode,
    /// The packet capture's taps.
    taps: capture::Taps,
}

impl Pipeline {
    /// `emc_entries` sizes the exact-match cache, `megaflow_entries` each half of the second
    /// level (0: none).
    pub fn new(
        thread: usize,
        pool: Arc<Pool>,
        fdb: Arc<Fdb>,
        stats: Arc<ThreadStats>,
        emc_entries: usize,
        megaflow_entries: usize,
    ) -> Pipeline {
        Pipeline {
            thread,
            cache: PoolCache::new(pool.clone()),
            pool,
            fdb,
            stats,
            tx: tx::TxQueues::new(),
            known: 0,
            decap_cache: DecapCache::default(),
            now: 0,
            hold: neighbor::Hold::new(),
            flows: cache::Flows::new(emc_entries, megaflow_entries),
            clock: crate::util::monotonic_ns,
            trace: trace::Traces::new(),
            nodes: nodes::PerNode::new(),
            taps: capture::Taps::new(),
        }
    }

    /// Takes trace requests from `t` (the switch's).
    pub fn set_tracing(&mut self, t: Arc<Tracing>) {
        self.trace.requests = t;
    }

    /// Serves captures of `c` (the switch's).
    pub fn set_capture(&mut self, c: Arc<crate::capture::Capture>) {
        self.taps.requests = c;
    }

    pub fn stats(&self) -> &Arc<ThreadStats> {
        &self.stats
    }

    pub fn cache(&mut self) -> &mut PoolCache {
        &mut self.cache
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Uses the switch's next-hop resolution state (a pipeline made alone resolves nothing).
    pub fn set_neighbors(&mut self, n: Arc<Neighbors>) {
        self.hold.shared = n;
    }

    /// Sets the clock (nanoseconds) ingress policers read (tests; the monotonic clock by
    /// default).
    pub fn set_clock(&mut self, clock: fn() -> u64) {
        self.clock = clock;
    }

    /// Sets the clock (seconds) used for learning timestamps.
    pub fn set_now(&mut self, now: u32) {
        self.now = now;
    }

    /// Receives one burst from (port, queue) and forwards it; returns packets received.
    #[inline]
    pub fn poll(&mut self, snap: &Snapshot, port: u16, queue: u16, batch: &mut Batch) -> usize {
        let Some(pe) = snap.port(port) else { return 0 };
        let n = pe.port.rx_burst(queue, &mut self.cache, batch);
        if n > 0 && self.taps.requests.rx_armed(port) {
            self.forward_captured(snap, pe, queue, batch);
        } else {
            self.forward_burst::<false>(snap, pe, queue, batch);
        }
        n
    }

    /// [`Pipeline::forward_burst`] for a burst of a captured port: its frames are copied as
    /// they arrived and handed over, dropped ones marked, when it is done
    /// ([`capture`](self::capture)). Out of line, so the uncaptured path keeps its code.
    #[cold]
    #[inline(never)]
    fn forward_captured(&mut self, snap: &Snapshot, pe: &PortEntry, queue: u16, batch: &mut Batch) {
        self.capture_rx(pe.id, batch);
        self.forward_burst::<true>(snap, pe, queue, batch);
        self.capture_commit();
    }

    /// A received burst through the policers and the graph; the port gets back what its guest
    /// lent.
    #[inline(always)]
    fn forward_burst<const CAPTURE: bool>(
        &mut self,
        snap: &Snapshot,
        pe: &PortEntry,
        queue: u16,
        batch: &mut Batch,
    ) {
        let n = batch.len();
        if let Some(bucket) = &pe.policer
            && n > 0
        {
            self.police(pe, bucket, batch);
        }
        if let Some((bucket, bd)) = &pe.net_policer
            && !batch.is_empty()
        {
            self.police_network(pe, bucket, *bd, batch);
        }
        if CAPTURE && batch.len() < n {
            self.capture_policed(batch);
        }
        if !batch.is_empty() {
            self.process(snap, pe.id, batch);
        }
        if self.cache.lending() {
            // Every lent packet was sent, freed or linearized by `process`: the guest gets
            // its buffers back.
            self.cache.end_lending();
            pe.port.rx_done(queue);
        }
    }

    /// After a panic in [`Pipeline::poll`]: the burst's packets still in `batch` are given
    /// up (left out of the pool rather than freed: what the panic left them as is unknown;
    /// returns how many), and lending ends without `rx_done`, so a failed port keeps its lent
    /// descriptors and their memory for packets of the burst still queued elsewhere.
    pub fn recover_from_panic(&mut self, batch: &mut Batch) -> usize {
        self.cache.end_lending();
        self.taps.reset();
        batch.drain().map(std::mem::forget).count()
    }

    #[inline(always)]
    fn count_bd(&self, bd: u16, packets: u64, bytes: u64) {
        if packets > 0 {
            let c = self.stats.bd(bd);
            c.packets.add(packets);
            c.bytes.add(bytes);
        }
    }

    #[inline(always)]
    fn count_run(&self, run: BdRun) {
        self.count_bd(run.bd, run.packets, run.bytes);
    }

    #[inline(always)]
    fn discard(&mut self, b: BufId, r: DropReason, port: u16) {
        if self.trace.on {
            self.record(Step::Drop { reason: r, port });
        }
        // Only the nodes' drops are checked: the cache's own (runts) go uncaptioned, and its
        // burst loop keeps its code as it was.
        if self.taps.on {
            self.capture_dropped(&b, r, port);
        }
        self.drop_counted(b, r, port);
    }

    #[inline(always)]
    fn drop_counted(&mut self, b: BufId, r: DropReason, port: u16) {
        self.stats.count_drop(r, port);
        self.cache.free(b);
    }
}

impl Drop for Pipeline {
    /// Priority frames still held for a full ring go back to the pool (a thread stopped,
    /// a switch torn down); every other batch is empty between bursts.
    fn drop(&mut self) {
        let cache = &mut self.cache;
        self.tx.first.release(|b| cache.free(b));
    }
}

/// A boxed array built on the heap (4096 batches would not fit a thread's stack).
pub(super) fn boxed_array<T, const N: usize>(f: impl Fn() -> T) -> Box<[T; N]> {
    let v: Box<[T]> = (0..N).map(|_| f()).collect();
    v.try_into().unwrap_or_else(|_| unreachable!("length is N"))
}

//! The per-thread packet pipeline: one rx batch in, per-port tx batches out.
//!
//! Stages, VPP-style, over the whole batch:
//! 0. **exact-match cache**: a frame whose flow the cache knows goes straight to egress;
//!    the rest go on, in order, to stages 1 and 2, which fill the cache when they forward a
//!    frame as known unicast (see [`crate::emc`]). From a port with port security only
//!    untagged IPv4 frames are filled, keyed on every byte the check reads (source address
//!    included), so other frames find no entry;
//! 1. **classify** each frame: VXLAN decap on the underlay, or (port, VLAN) → bridge domain
//!    elsewhere; L2 sanity (runts, oversize, tags, group source MACs); port security; compute
//!    the FDB keys of source and destination and prefetch their buckets for stage 2;
//! 2. **forward** each frame: MAC learning, ARP/ND suppression, FDB lookup,
//!    then egress to one port (VLAN rewrite), one peer (VXLAN encap) or a flood (copies for
//!    small frames, a private header segment sharing the payload for large ones);
//! 3. **flush** the per-port tx batches.
//!
//! Every drop has a named reason ([`Drop`]); counters are per thread. Nothing here allocates,
//! locks or makes a syscall per packet (ports may make one per burst).

use crate::batch::{BATCH, Batch};
use crate::buf::{BufId, Pool, PoolCache, PoolView};
use crate::counters::{DropReason, Event, ThreadStats};
use crate::emc::{self, Action, Emc, EmcView, Hit, Key};
use crate::neigh::{self, Neighbors, Next, Parked, Waiting};
use crate::wire::MacAddr;
use std::net::IpAddr;
use crate::fdb::{self, Dest, Fdb, Learn, Limits, Loc};
use crate::policer;
use crate::security;
use crate::snapshot::{BdEntry, NO_BD, PortEntry, PortKind, Security, Snapshot};
use crate::suppress::{self, Answer};
use crate::trace::{FrameTrace, Learned, Retag, Step, Tracing};
use crate::vlan;
use crate::vtep::Marking;
use crate::vtep::{self, DecapCache, Layout, PeerEntry, VtepEntry};
use crate::wire::ethernet::{self, ethertype};
use std::sync::Arc;

const NO_PEER: u16 = u16::MAX;
/// Flooded frames up to this size are copied per egress; larger ones share their payload.
const COPY_MAX: usize = 256;

/// What stage 1 found out about one packet.
#[derive(Clone, Copy, Default)]
struct Ctx {
    /// Frame length as received (after a priority tag was removed).
    len: u32,
    /// The frame was turned into an answer (ARP/ND for the VTEP address) to send back out of
    /// the ingress port.
    reply: bool,
    /// The frame was an answer to the VTEP's neighbour requests, learned and done with.
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

/// A flood egress: a local port with the tag frames carry there, or a remote VTEP.
#[derive(Clone, Copy)]
enum Target {
    Port(u16, Option<u16>),
    Peer(u16),
}

/// The state one PMD thread forwards with.
pub struct Pipeline {
    thread: usize,
    pool: Arc<Pool>,
    cache: PoolCache,
    fdb: Arc<Fdb>,
    stats: Arc<ThreadStats>,
    /// Pending tx batch per port id, and the ids with a non-empty batch (each once).
    tx: Box<[Batch; fdb::MAX_PORTS]>,
    /// Encapsulated frames of priority bridge domains for the underlay port `tx_first.0`,
    /// sent before its `tx` batch and held (not dropped) while its ring is full.
    tx_first: (u16, Batch),
    dirty: Box<[u16; fdb::MAX_PORTS]>,
    n_dirty: usize,
    /// Known-unicast packets of this burst (counted once per burst).
    known: u64,
    decap_cache: DecapCache,
    now: u32,
    emc: Emc,
    /// Next-hop resolution shared with the other threads, and this thread's waiting frames.
    neigh: Arc<Neighbors>,
    parked: Parked,
    /// Cache hits of this burst for remote VTEPs, encapsulated together.
    to_peer: Batch,
    to_peer_hits: [Hit; BATCH],
    /// This burst went through the exact-match cache; `miss_keys[i]` is then the key of the
    /// `i`th frame the cache missed (the slow path's `i`th).
    cached: bool,
    miss_keys: [Option<Key>; BATCH],
    /// Per ingress port, the bursts in a row whose lookups all missed (saturating): past
    /// [`THRASHING_AFTER`], the port's bursts mostly skip the cache (see
    /// [`Pipeline::worth_looking_up`]).
    missed_bursts: Box<[u8; fdb::MAX_PORTS]>,
    /// Counts the bursts of thrashing ports, to sample one in [`SAMPLE_EVERY`].
    sampled: u32,
    /// Ingress policers' token buckets of the queues this thread polls, and their clock.
    policers: policer::Buckets,
    clock: fn() -> u64,
    /// The switch's trace request (checked once per burst) and, while a burst is traced
    /// (`traced`), its frames' traces.
    tracing: Arc<Tracing>,
    traced: bool,
    trace: Box<BurstTrace>,
}

/// The traces of one traced burst: the first `k` frames, `cur` the one being forwarded;
/// `dry`: a synthetic frame, which learns nothing and is not sent.
struct BurstTrace {
    frames: [FrameTrace; BATCH],
    k: usize,
    cur: usize,
    dry: bool,
}

/// Bursts in a row that found nothing in the cache and filled it only by pushing out live
/// entries (or not at all) after which a port is taken to churn through more flows than the
/// cache holds (or to send what is never cached: floods).
const THRASHING_AFTER: u8 = 8;
/// One burst in this many of a thrashing port still goes through the cache, to notice flows
/// that repeat again.
const SAMPLE_EVERY: u32 = 16;

impl Pipeline {
    /// `emc_entries` sizes the exact-match cache (0: none).
    pub fn new(thread: usize, pool: Arc<Pool>, fdb: Arc<Fdb>, stats: Arc<ThreadStats>, emc_entries: usize) -> Pipeline {
        Pipeline {
            thread,
            cache: PoolCache::new(pool.clone()),
            pool,
            fdb,
            stats,
            tx: boxed_array(Batch::new),
            tx_first: (0, Batch::new()),
            dirty: Box::new([0; fdb::MAX_PORTS]),
            n_dirty: 0,
            known: 0,
            decap_cache: DecapCache::default(),
            now: 0,
            emc: Emc::new(emc_entries),
            neigh: Arc::new(Neighbors::new(0)),
            parked: Parked::new(),
            to_peer: Batch::new(),
            to_peer_hits: [Hit::default(); BATCH],
            cached: false,
            miss_keys: [None; BATCH],
            missed_bursts: Box::new([0; fdb::MAX_PORTS]),
            sampled: 0,
            policers: policer::Buckets::default(),
            clock: crate::util::monotonic_ns,
            tracing: Arc::new(Tracing::default()),
            traced: false,
            trace: Box::new(BurstTrace { frames: std::array::from_fn(|_| FrameTrace::default()), k: 0, cur: 0, dry: false }),
        }
    }

    /// Takes trace requests from `t` (the switch's).
    pub fn set_tracing(&mut self, t: Arc<Tracing>) {
        self.tracing = t;
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
        self.neigh = n;
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
        if let Some(limits) = &pe.policer
            && n > 0
        {
            self.police(pe, limits, queue, batch);
        }
        if !batch.is_empty() {
            self.process(snap, port, batch);
        }
        if self.cache.lending() {
            // Every lent packet was sent, freed or linearized by `process`: the guest gets
            // its buffers back.
            self.cache.end_lending();
            pe.port.rx_done(queue);
        }
        n
    }

    /// Drops the frames of a burst from (`pe`, `queue`) that its policer does not admit; they
    /// count as received and as dropped (`policed`).
    #[inline(never)]
    fn police(&mut self, pe: &PortEntry, limits: &policer::Limits, queue: u16, batch: &mut Batch) {
        let bucket = self.policers.get(pe.id, limits, queue, pe.port.rx_queues(), (self.clock)());
        let pool = self.pool.view();
        let burst_bytes: u64 = batch.as_slice().iter().map(|b| pool.head_and_len(b).1 as u64).sum();
        if bucket.admit_all(batch.len() as u64, burst_bytes) {
            return;
        }
        let (mut dropped, mut bytes) = (0u64, 0u64);
        let (cache, stats) = (&mut self.cache, &self.stats);
        batch.retain(
            |b| bucket.admit(pool.head_and_len(b).1 as u32),
            |b| {
                dropped += 1;
                bytes += pool.head_and_len(&b).1 as u64;
                stats.count_drop(DropReason::Policed, pe.id);
                cache.free(b);
            },
        );
        if dropped > 0 {
            let pc = self.stats.port(pe.id);
            pc.rx_packets.add(dropped);
            pc.rx_bytes.add(bytes);
            pc.policed.add(dropped);
            self.stats.packets.add(dropped);
        }
    }

    /// Forwards a batch received on `in_port` and flushes the resulting tx batches.
    pub fn process(&mut self, snap: &Snapshot, in_port: u16, batch: &mut Batch) {
        let Some(port) = snap.port(in_port) else {
            for b in batch.drain() {
                self.stats.count_drop(DropReason::NoEgress, in_port);
                self.cache.free(b);
            }
            return;
        };
        if self.tracing.armed_for(in_port) && self.process_traced(snap, port, batch) {
            return;
        }
        self.process_port::<false>(snap, port, batch);
    }

    /// A burst from a port a trace request is armed on: its first frames (as many as the
    /// request still wants) traced through the slow path. False if the request wants no
    /// more (another thread took the last).
    #[cold]
    #[inline(never)]
    fn process_traced(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch) -> bool {
        self.begin_trace(port, batch, false);
        if !self.traced {
            return false;
        }
        self.process_port::<true>(snap, port, batch);
        self.end_trace();
        true
    }

    /// [`Pipeline::process`] for an existing port; `TRACE`: the burst is traced (it takes
    /// the slow path, compiled to record what each node decides).
    #[inline(always)]
    fn process_port<const TRACE: bool>(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch) {
        let (in_port, n) = (port.id, batch.len());
        self.emc.sync(snap.generation, self.fdb.generation(), self.now);
        // The cache serves every port (a port with port security only for the frames whose
        // key covers what the check reads: `Key::from_secured_port`) and an underlay with a
        // VTEP. When set, every path below fills `miss_keys` for the frames it hands to
        // stage 2.
        let cache_on = !TRACE && self.emc.capacity() > 0 && self.worth_looking_up(in_port);
        let bytes = if port.kind != PortKind::Underlay {
            self.cached = cache_on;
            if cache_on { self.forward_port_cached(snap, port, batch) } else { self.forward_slow::<TRACE>(snap, port, batch) }
        } else {
            match snap.vtep.as_ref().filter(|_| cache_on) {
                Some(vtep) => {
                    self.cached = true;
                    let before = self.emc.fills();
                    let (bytes, hits) = self.forward_underlay_cached(snap, vtep, port, batch);
                    self.note_burst(port.id, hits, n, before);
                    bytes
                }
                None => {
                    self.cached = false;
                    self.forward_slow::<TRACE>(snap, port, batch)
                }
            }
        };
        let pc = self.stats.port(in_port);
        pc.rx_packets.add(n as u64);
        pc.rx_bytes.add(bytes);
        self.stats.packets.add(n as u64);
        if self.known > 0 {
            self.stats.event(Event::KnownUnicast, std::mem::take(&mut self.known));
        }
        if !self.parked.is_empty() && self.parked.due(self.neigh.generation(), self.now) {
            self.retry_parked(snap);
        }
        self.flush(snap);
    }

    /// Stage 0 for a burst from a local port: a read-only lookup of every frame, then the
    /// hits and misses in order (or stages 1-2 for the whole burst when nothing hit).
    /// Returns the bytes received.
    #[inline(always)]
    fn forward_port_cached(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch) -> u64 {
        let mut found = [(Hit::default(), 0u32); BATCH];
        let secured = port.security.is_some();
        let (pool, emc) = (self.pool.view(), self.emc.view());
        let (bytes, hits) = match (emc.spread, secured) {
            (true, true) => probe_spread_burst::<true>(pool, emc, port.id, batch.as_slice(), &mut found),
            (true, false) => probe_spread_burst::<false>(pool, emc, port.id, batch.as_slice(), &mut found),
            (false, true) => probe_secured_burst(pool, emc, port.id, batch.as_slice(), &mut found),
            (false, false) => probe_trusted_burst(pool, emc, port.id, batch.as_slice(), &mut found),
        };
        if hits == 0 {
            for (k, b) in self.miss_keys.iter_mut().zip(batch.as_slice()) {
                *k = port_key(port.id, secured, self.pool.head(b));
            }
            let before = self.emc.fills();
            self.forward_slow::<false>(snap, port, batch);
            self.note_missed_burst(port.id, before);
            return bytes;
        }
        if hits * 8 >= batch.len() as u64 {
            self.note_hit_burst(port.id);
        }
        // Every frame hit (so each fits its hit's length): if all go to remote VTEPs, they
        // need no in-order pass. A burst to local ports stops at its first frame.
        if hits == batch.len() as u64 && all_to_peers(&found[..batch.len()]) {
            self.encap_burst(snap, port, batch, &found, bytes);
            return bytes;
        }
        let demoted = if port.kind == PortKind::Access {
            // An access port's frames all belong to its one bridge domain.
            self.forward_cached::<true>(snap, port, batch, &mut found)
        } else {
            self.forward_cached::<false>(snap, port, batch, &mut found)
        };
        self.count_hits(hits - demoted);
        bytes
    }

    /// Whether this burst from `port` goes through the cache: always, unless the port's last
    /// [`THRASHING_AFTER`] bursts were wasted on it — no hit (a few, under an eighth of a
    /// burst, do not end it), and fills that only pushed out live entries, or none: a churn of flows the cache cannot hold, or floods, where every
    /// lookup and fill is work for nothing (a miss cost ~200 instructions on top of the slow
    /// path) — and then one burst in [`SAMPLE_EVERY`], to notice when flows repeat again (a
    /// burst with a hit ends it). New flows that fit (a cold start) fill free entries and
    /// never count as waste. OVS's EMC answers the same churn by filling only one miss in a
    /// hundred, which also slows a cold start a hundredfold.
    #[inline(never)]
    fn worth_looking_up(&mut self, port: u16) -> bool {
        if self.missed_bursts[port as usize & (fdb::MAX_PORTS - 1)] < THRASHING_AFTER {
            return true;
        }
        self.sampled = self.sampled.wrapping_add(1);
        self.sampled.is_multiple_of(SAMPLE_EVERY)
    }

    /// After a burst from `port` went through the cache and hit nothing: whether it was
    /// wasted on the cache (see [`Pipeline::worth_looking_up`]); `before` is the cache's
    /// [`Emc::fills`] at the burst's start.
    #[inline(never)]
    fn note_missed_burst(&mut self, port: u16, before: (u32, u32)) {
        let (fills, evictions) = self.emc.fills();
        let (fills, evictions) = (fills.wrapping_sub(before.0), evictions.wrapping_sub(before.1));
        let m = &mut self.missed_bursts[port as usize & (fdb::MAX_PORTS - 1)];
        *m = if 2 * evictions >= fills { m.saturating_add(1) } else { 0 };
    }

    /// After a burst of `n` frames from `port` whose lookups hit `hits` times; `before` is
    /// the cache's [`Emc::fills`] at its start.
    #[inline(always)]
    fn note_burst(&mut self, port: u16, hits: u64, n: usize, before: (u32, u32)) {
        if hits * 8 < n as u64 {
            self.note_missed_burst(port, before);
        } else {
            self.note_hit_burst(port);
        }
    }

    /// After a burst from `port` hit the cache.
    #[inline(always)]
    fn note_hit_burst(&mut self, port: u16) {
        self.missed_bursts[port as usize & (fdb::MAX_PORTS - 1)] = 0;
    }

    #[inline(always)]
    fn count_hits(&mut self, hits: u64) {
        self.known += hits;
        self.stats.event(Event::CacheHits, hits);
    }

    /// After a frame of the burst took the slow path: whether it changed the FDB, so the
    /// burst's remaining lookups can no longer be trusted.
    #[inline(always)]
    fn lookups_outdated(&self) -> bool {
        self.emc.outdated_by(self.fdb.generation())
    }

    /// Stage 0: frames whose flow the exact-match cache knows go to the shared egress code
    /// (tagging, tx batch); a frame it misses takes stages 1 and 2 in its place in the burst,
    /// so no frame passes another of its flow (whose key may differ, e.g. by an ECN mark).
    /// Once a missed frame changed the FDB (a MAC moved), the hits after it take stages 1
    /// and 2 too. Returns how many hits did.
    #[inline(always)]
    fn forward_cached<const ACCESS: bool>(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch, found: &mut [(Hit, u32); BATCH]) -> u64 {
        let mut run = BdRun::new(if ACCESS { port.untagged_bd } else { NO_BD });
        let n = batch.len();
        let mut demoted = 0;
        for i in 0..n {
            let b = batch.take(i);
            let (hit, len) = found[i & (BATCH - 1)];
            // A frame too long for the cached path takes stage 1, which counts its drop.
            if !hit.admits(len) {
                demoted += self.forward_missed(snap, port, b, i, &mut found[..n]);
                continue;
            }
            let len = len as usize;
            // An access port's frames all belong to its one bridge domain.
            let bd = if ACCESS { run.bd } else { hit.bd() };
            self.forward_hit(snap, b, hit, &mut run, bd, len);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
        demoted
    }

    /// Egress of a frame the cache knows, counted in `run` (bridge domain `bd`, `len` bytes).
    #[inline(always)]
    fn forward_hit(&mut self, snap: &Snapshot, b: BufId, hit: Hit, run: &mut BdRun, bd: u16, len: usize) {
        if let Some(done) = run.add(bd, len) {
            self.count_run(done);
        }
        if let Some(p) = hit.plain_port() {
            return self.enqueue(snap, p, b);
        }
        let tagged = hit.tagged_in();
        match hit.action() {
            Action::Port { port: p, want } => {
                let mut b = b;
                let pcp = if tagged { tci_of(self.pool.head(&b)) & 0xf000 } else { 0 };
                if self.retag(&mut b, tagged, pcp, want) {
                    self.enqueue(snap, p, b);
                } else {
                    self.drop_counted(b, DropReason::Runt, p);
                }
            }
            Action::Peer { .. } => {
                self.to_peer_hits[self.to_peer.len() & (BATCH - 1)] = hit;
                if let Err(b) = self.to_peer.push(b) {
                    self.drop_counted(b, DropReason::NoEgress, 0); // holds a burst: unreachable
                }
            }
        }
    }

    /// After the last hit of a burst: what waits for encapsulation goes, the last run counts.
    #[inline(always)]
    fn end_hits(&mut self, snap: &Snapshot, run: BdRun) {
        self.flush_pending(snap);
        self.count_run(run);
    }

    /// Sends what the cache queued for encapsulation (before a frame that took the slow path,
    /// so frames leave in the order they came).
    #[inline(always)]
    fn flush_pending(&mut self, snap: &Snapshot) {
        if !self.to_peer.is_empty() {
            self.encap_pending(snap);
        }
    }

    /// Stages 1 and 2 for the `i`th frame of a burst, which the cache missed. When they
    /// changed the FDB, the hits of the frames after it in `found` become misses; returns how
    /// many did.
    #[inline(never)]
    fn forward_missed(&mut self, snap: &Snapshot, port: &PortEntry, mut b: BufId, i: usize, found: &mut [(Hit, u32)]) -> u64 {
        self.flush_pending(snap);
        self.miss_keys[i & (BATCH - 1)] = port_key(port.id, port.security.is_some(), self.pool.head(&b));
        let (mut ctx, mut bytes) = (Ctx::default(), 0);
        if let Err(r) = classify_port(&self.pool, &self.fdb, port, snap, &mut b, &mut bytes, &mut ctx) {
            ctx.drop = Some(r);
        }
        self.forward_ctx(snap, port, b, &ctx, i);
        self.forget_outdated(found, i)
    }

    /// After stage 2 of the `i`th frame of a burst: when it changed the FDB, the lookups made
    /// for the frames after it are outdated, and their hits become misses. Returns how many.
    #[inline(always)]
    fn forget_outdated<F: Found>(&self, found: &mut [F], i: usize) -> u64 {
        match found.get_mut(i + 1..) {
            Some(rest) if self.lookups_outdated() => forget_hits(rest),
            _ => 0,
        }
    }

    /// Stages 1 and 2 for a whole burst; returns its bytes. `TRACE`: record what each node
    /// decides (a traced burst; untraced ones compile without a check).
    #[inline(never)]
    fn forward_slow<const TRACE: bool>(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch) -> u64 {
        let in_port = port.id;
        let n = batch.len();
        let mut ctxs = [Ctx::default(); BATCH];
        let bytes = if port.kind == PortKind::Underlay {
            self.classify_underlay_burst(snap, batch, &mut ctxs)
        } else {
            classify_port_burst(&self.pool, &self.fdb, port, snap, batch, &mut ctxs)
        };
        if TRACE {
            self.trace_classified(snap, port, &ctxs);
        }

        // Consecutive packets usually share a bridge domain: look it up once per run, and
        // count its packets and bytes once per run.
        let (mut run, mut run_entry) = (BdRun::new(NO_BD), None);
        for (i, c) in ctxs.iter().enumerate().take(n) {
            let b = batch.take(i);
            if TRACE {
                self.trace.cur = i;
            }
            if let Some(r) = c.drop {
                self.discard(b, r, in_port);
                continue;
            }
            if c.reply {
                self.stats.event(Event::VtepAnswered, 1);
                if TRACE {
                    self.record(Step::VtepAnswer);
                }
                self.deliver(snap, in_port, b, false);
                continue;
            }
            if c.taken {
                if TRACE {
                    self.record(Step::VtepLearned);
                }
                self.cache.free(b);
                continue;
            }
            if let Some(done) = run.switch_to(c.bd) {
                self.count_run(done);
                run_entry = snap.bd(c.bd);
            }
            let Some(bd) = run_entry else {
                self.discard(b, DropReason::NoBridgeDomain, in_port);
                continue;
            };
            run.count(c.len as usize);
            self.forward::<TRACE>(snap, port, bd, b, c, i);
        }
        self.count_run(run);
        batch.clear_taken();
        bytes
    }

    /// Remembers the slow path's decision for its `i`th frame in the exact-match cache.
    #[inline(always)]
    fn remember(&mut self, i: usize, hit: impl FnOnce() -> Option<Hit>) {
        if self.cached
            && let Some(k) = self.miss_keys[i & (BATCH - 1)]
            // A priority-tagged frame was classified after its tag was removed.
            && !(ethernet::is_tpid(k.ethertype()) && k.tci() & 0xfff == 0)
            && let Some(h) = hit()
        {
            self.emc.insert(&k, h);
        }
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

    /// Stage 1 for a burst from the underlay: VXLAN decap, then the inner frames' keys.
    fn classify_underlay_burst(&mut self, snap: &Snapshot, batch: &mut Batch, ctxs: &mut [Ctx; BATCH]) -> u64 {
        self.decap_cache.sync(snap.generation);
        let (mut bytes, mut decapsulated) = (0u64, 0u64);
        for (b, ctx) in batch.as_mut_slice().iter_mut().zip(ctxs.iter_mut()) {
            bytes += self.pool.pkt_len(b) as u64;
            let r = self.decap(snap, b);
            decapsulated += r.is_ok() as u64;
            self.underlay_ctx(snap, b, r, ctx);
        }
        if decapsulated > 0 {
            self.stats.event(Event::Decapsulated, decapsulated);
        }
        bytes
    }

    /// Validates and strips the outer headers of an underlay frame: (bridge domain, peer).
    #[inline(always)]
    fn decap(&mut self, snap: &Snapshot, b: &mut BufId) -> Result<(u16, u16), DropReason> {
        match snap.vtep.as_ref() {
            None => Err(DropReason::UnderlayNotVxlan),
            Some(vtep) => vtep.decap(snap, &self.pool, b, &mut self.decap_cache),
        }
    }

    /// Stage 1 for an underlay frame after [`Pipeline::decap`]: the inner frame's keys, or an
    /// answer for a neighbour asking for the VTEP's address, or a drop.
    #[inline(always)]
    fn underlay_ctx(&self, snap: &Snapshot, b: &mut BufId, r: Result<(u16, u16), DropReason>, ctx: &mut Ctx) {
        let pool = &*self.pool;
        let r = r.and_then(|(bd, peer)| {
            let (h, len) = pool.head_and_len(b);
            fill_l2(&self.fdb, ctx, h, bd, peer, None, false, 0, len)
        });
        match (r, snap.vtep.as_ref()) {
            (Ok(()), _) => {}
            // Not VXLAN: maybe a next hop's answer, or a neighbour asking for the VTEP's own
            // address (a next hop's request teaches its MAC too).
            (Err(DropReason::UnderlayNotVxlan), Some(v)) if !v.shared => {
                let learned = self.learn_next_hop(snap, pool, b, v.local);
                if suppress::answer_for(pool, b, v.local, v.mac, v.underlay_vlan).is_some() {
                    *ctx = Ctx { reply: true, ..Ctx::default() };
                } else if learned {
                    *ctx = Ctx { taken: true, ..Ctx::default() };
                } else {
                    ctx.drop = Some(DropReason::UnderlayNotVxlan);
                }
            }
            (Err(r), _) => ctx.drop = Some(r),
        }
    }

    /// Learns a next hop's MAC from an ARP packet or neighbour advertisement in `b`.
    #[cold]
    fn learn_next_hop(&self, snap: &Snapshot, pool: &Pool, b: &BufId, local: IpAddr) -> bool {
        if self.dry() {
            return false;
        }
        let Some((ip, mac)) = neigh::answer_in(pool, b, local) else { return false };
        let Some(peers) = snap.next_hops.get(&ip) else { return false };
        for p in peers {
            self.neigh.learn(*p, mac, self.now);
        }
        self.stats.event(Event::NeighborLearned, 1);
        true
    }

    /// Stage 0 for a burst from the underlay: the outer headers of every frame are checked
    /// and the inner frame looked up in place; then, in order, inner frames whose flow the
    /// cache knows lose their outer headers and go straight to egress, and the others take
    /// the whole decapsulation again and stages 1 and 2. Returns the bytes received and the
    /// lookups that hit.
    #[inline(never)]
    fn forward_underlay_cached(&mut self, snap: &Snapshot, vtep: &VtepEntry, port: &PortEntry, batch: &mut Batch) -> (u64, u64) {
        self.decap_cache.sync(snap.generation);
        let n = batch.len();
        // Per frame: the cached decision, the inner length, and whether the frame hit and
        // lost its outer headers (a hit the burst cannot trust then admits no frame: see
        // `forget_hits`).
        let mut found = [(Hit::default(), 0u32, false); BATCH];
        let (mut bytes, mut decapsulated, mut hits) = (0u64, 0u64, 0u64);
        // By value: the stores below (to buffer metadata) cannot be proved not to touch
        // `self`, so its fields would be read again for every frame.
        let (view, emc, decap_cache) = (self.pool.view(), self.emc.view(), self.decap_cache);
        for (b, f) in batch.as_mut_slice().iter_mut().zip(found.iter_mut()) {
            let (h, total) = view.head_and_len(b);
            bytes += total as u64;
            // One bounds check for the outer headers and the inner frame's key.
            let Some((outer, inner)) = h.first_chunk::<{ vtep::PLAIN_OUTER + emc::KEY_BYTES }>().map(|h| h.split_at(vtep::PLAIN_OUTER)) else {
                continue;
            };
            // The first frame of a (source, VNI) takes the slow path, which fills the cache.
            let Some(d) = outer.first_chunk().and_then(|o| vtep.classify_plain(o, total, &decap_cache)) else { continue };
            if let Some(hit) = Key::from_peer(d.peer, d.bd, inner).and_then(|k| emc.lookup(&k))
                && hit.admits(d.inner_len)
                && d.strip(view, b).is_ok()
            {
                hits += 1;
                *f = (hit, d.inner_len, true);
            }
        }
        if hits == n as u64 {
            self.forward_hits(snap, batch, &found);
            self.count_hits(hits);
            self.stats.event(Event::Decapsulated, hits);
            return (bytes, hits);
        }
        decapsulated += hits;
        let mut run = BdRun::new(NO_BD);
        // Every frame the first pass stripped came from the one (source, VNI) in its copy of
        // the decapsulation cache.
        let stripped_from = decap_cache.admitted();
        let mut demoted = 0;
        for i in 0..n {
            let b = batch.take(i);
            let (hit, len, stripped) = found[i & (BATCH - 1)];
            if hit.admits(len) {
                self.forward_hit(snap, b, hit, &mut run, hit.bd(), len as usize);
                continue;
            }
            decapsulated += self.forward_underlay_missed(snap, port, b, stripped.then_some(stripped_from), i);
            demoted += self.forget_outdated(&mut found[..n], i);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
        self.count_hits(hits - demoted);
        self.stats.event(Event::Decapsulated, decapsulated);
        (bytes, hits)
    }

    /// Stages 1 and 2 for the `i`th frame of an underlay burst, in its place in the burst:
    /// decapsulation first unless the frame already lost its outer headers (`stripped`: its
    /// bridge domain and peer, counted as decapsulated already). Returns whether this call
    /// decapsulated it.
    #[inline(never)]
    fn forward_underlay_missed(&mut self, snap: &Snapshot, port: &PortEntry, mut b: BufId, stripped: Option<(u16, u16)>, i: usize) -> u64 {
        self.flush_pending(snap);
        let r = stripped.ok_or(()).or_else(|()| self.decap(snap, &mut b));
        let decapsulated = (stripped.is_none() && r.is_ok()) as u64;
        self.miss_keys[i & (BATCH - 1)] = r.ok().and_then(|(bd, peer)| Key::from_peer(peer, bd, self.pool.head(&b)));
        let mut ctx = Ctx::default();
        self.underlay_ctx(snap, &mut b, r, &mut ctx);
        self.forward_ctx(snap, port, b, &ctx, i);
        decapsulated
    }

    /// The second pass of [`Pipeline::forward_underlay_cached`] when every frame hit (and
    /// lost its outer headers in the first): each goes to egress.
    #[inline(never)]
    fn forward_hits(&mut self, snap: &Snapshot, batch: &mut Batch, found: &[(Hit, u32, bool); BATCH]) {
        let mut run = BdRun::new(NO_BD);
        for i in 0..batch.len() {
            let b = batch.take(i);
            let (hit, len, _) = found[i & (BATCH - 1)];
            self.forward_hit(snap, b, hit, &mut run, hit.bd(), len as usize);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
    }

    /// After stage 1 of one frame: its drop, its answer, or stage 2 in its bridge domain.
    #[inline(always)]
    fn forward_ctx(&mut self, snap: &Snapshot, port: &PortEntry, b: BufId, c: &Ctx, i: usize) {
        if let Some(r) = c.drop {
            return self.discard(b, r, port.id);
        }
        if c.reply {
            self.stats.event(Event::VtepAnswered, 1);
            return self.enqueue(snap, port.id, b);
        }
        if c.taken {
            return self.cache.free(b);
        }
        let Some(bd) = snap.bd(c.bd) else {
            return self.discard(b, DropReason::NoBridgeDomain, port.id);
        };
        self.count_bd(c.bd, 1, c.len as u64);
        self.forward::<false>(snap, port, bd, b, c, i);
    }

    #[inline(always)]
    fn discard(&mut self, b: BufId, r: DropReason, port: u16) {
        if self.traced {
            self.record(Step::Drop { reason: r, port });
        }
        self.drop_counted(b, r, port);
    }

    #[inline(always)]
    fn drop_counted(&mut self, b: BufId, r: DropReason, port: u16) {
        self.stats.count_drop(r, port);
        self.cache.free(b);
    }

    /// Stage 2: security, learning, suppression, lookup and egress of the `i`th packet.
    #[inline(always)]
    fn forward<const TRACE: bool>(&mut self, snap: &Snapshot, port: &PortEntry, bd: &BdEntry, mut b: BufId, c: &Ctx, i: usize) {
        let from_peer = c.from_peer != NO_PEER;
        let l2 = if c.tagged { 18 } else { 14 };

        let src = if from_peer { Dest::Peer(c.from_peer) } else { Dest::Port(port.id) };
        // Whether the FDB now holds the source as learning wants it (else, not cacheable).
        let mut learnt = true;
        let learning = if from_peer { bd.remote_learning } else { bd.learning };
        if learning && !self.fdb.is_fresh(c.src_key, c.src_loc, src, self.now) {
            learnt = self.learn(port, bd, c, src);
        } else if TRACE {
            self.record(Step::Learn { bd: bd.id, mac: key_mac(c.src_key), outcome: if learning { Learned::Fresh } else { Learned::Off } });
        }

        if bd.arp_suppression && c.dst_key & (1 << 40) != 0 {
            let h = self.pool.head(&b);
            let et = u16::from_be_bytes([h[l2 - 2], h[l2 - 1]]);
            if (et == ethertype::ARP || et == ethertype::IPV6)
                && let Some(a) = suppress::answer(&self.pool, bd, &mut b, l2, et) {
                    self.stats.event(if a == Answer::Arp { Event::ArpSuppressed } else { Event::NdSuppressed }, 1);
                    if TRACE {
                        self.record(Step::Suppress { arp: a == Answer::Arp });
                    }
                    return self.emit::<TRACE>(snap, bd, b, c, src);
                }
        }

        if c.dst_key & (1 << 40) == 0
            && let Some(v) = self.fdb.lookup(c.dst_key, c.dst_loc) {
                if TRACE {
                    self.record(Step::Forward { mac: key_mac(c.dst_key), found: Some(v.dest()) });
                }
                match v.dest() {
                    Dest::Port(p) if p == port.id && !from_peer => return self.discard(b, DropReason::Reflect, port.id),
                    Dest::Peer(_) if from_peer => return self.discard(b, DropReason::Reflect, port.id),
                    Dest::Port(p) => {
                        if let Some(pe) = snap.port(p)
                            && let Some(want) = pe.egress_tag(bd.id, bd.vlan) {
                                self.known += 1;
                                if learnt {
                                    // Decapsulated frames have no ingress MTU (the underlay's bounds the outer frame).
                                    let max = l2 + if from_peer { pe.mtu } else { port.mtu.min(pe.mtu) } as usize;
                                    let want = want.map(|v| (pe.tpid, v));
                                    self.remember(i, || Hit::to_port(bd.id, p, c.tagged, want, max));
                                }
                                return self.emit_port::<TRACE>(snap, pe, b, c.tagged, c.pcp, want, c.len as usize);
                            }
                    }
                    Dest::Peer(p) => {
                        if bd.peers.contains(&p) {
                            self.known += 1;
                            if learnt && let Some(vni) = bd.vni {
                                let max = l2 + port.mtu as usize;
                                self.remember(i, || Hit::to_peer(bd.id, p, c.tagged, vni, max));
                            }
                            return self.emit_peer::<TRACE>(snap, bd, b, c.tagged, p);
                        }
                    }
                }
                // The entry points somewhere no longer in this bridge domain: flood.
                self.stats.event(Event::StaleFdb, 1);
                if TRACE {
                    self.record(Step::Stale { mac: key_mac(c.dst_key) });
                }
            } else if TRACE {
                self.record(Step::Forward { mac: key_mac(c.dst_key), found: None });
            }
        self.flood::<TRACE>(snap, bd, port.id, b, c);
    }

    /// Learning beyond the common case (a MAC that is new, moved, static, or last refreshed
    /// in an earlier second).
    /// Returns whether the FDB now holds the source behind `src` (false when a static entry,
    /// a limit or a busy bucket stopped it).
    #[inline(never)]
    fn learn(&mut self, port: &PortEntry, bd: &BdEntry, c: &Ctx, src: Dest) -> bool {
        let from_peer = c.from_peer != NO_PEER;
        let limits = Limits { bd_max: bd.mac_limit, port_max: if from_peer { u32::MAX } else { port.mac_limit } };
        if self.dry() {
            self.record(Step::Learn { bd: bd.id, mac: key_mac(c.src_key), outcome: Learned::WouldLearn });
            return true;
        }
        let learned = self.fdb.learn(c.src_key, c.src_loc, src, self.now, limits);
        if self.traced {
            let outcome = match learned {
                Learn::Unchanged => Learned::Fresh,
                Learn::Refreshed => Learned::Refreshed,
                Learn::Learned => Learned::New,
                Learn::Moved => Learned::Moved,
                Learn::StaticRefused => Learned::StaticRefused,
                Learn::Limit => Learned::Limit,
                Learn::Busy => Learned::Busy,
            };
            self.record(Step::Learn { bd: bd.id, mac: key_mac(c.src_key), outcome });
        }
        let (event, done) = match learned {
            Learn::Unchanged | Learn::Refreshed => return true,
            Learn::Learned => {
                self.stats.bd(bd.id).learned.add(1);
                (Event::Learned, true)
            }
            Learn::Moved => (Event::MacMoved, true),
            Learn::StaticRefused => (Event::StaticMoveRefused, false),
            Learn::Limit => (Event::LearnLimit, false),
            Learn::Busy => (Event::LearnBusy, false),
        };
        self.stats.event(event, 1);
        done
    }

    #[inline(always)]
    fn emit<const TRACE: bool>(&mut self, snap: &Snapshot, bd: &BdEntry, b: BufId, c: &Ctx, d: Dest) {
        match d {
            Dest::Port(p) => match snap.port(p).map(|pe| (pe, pe.egress_tag(bd.id, bd.vlan))) {
                Some((pe, Some(want))) => {
                    let len = self.pool.pkt_len(&b);
                    self.emit_port::<TRACE>(snap, pe, b, c.tagged, c.pcp, want, len)
                }
                _ => self.discard(b, DropReason::NoEgress, p),
            },
            Dest::Peer(p) => self.emit_peer::<TRACE>(snap, bd, b, c.tagged, p),
        }
    }

    /// Egress to a local port: VLAN rewrite for the port's mode, MTU check, enqueue.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn emit_port<const TRACE: bool>(
        &mut self,
        snap: &Snapshot,
        pe: &PortEntry,
        mut b: BufId,
        tagged: bool,
        pcp: u16,
        want: Option<u16>,
        len: usize,
    ) {
        if TRACE {
            let op = match (tagged, want) {
                (false, None) => Retag::Keep,
                (false, Some(vid)) => Retag::Push { tpid: pe.tpid, vid },
                (true, None) => Retag::Pop,
                (true, Some(_)) => Retag::Tpid(pe.tpid),
            };
            self.record(Step::VlanRewrite { port: pe.id, op });
        }
        if !self.retag(&mut b, tagged, pcp, want.map(|v| (pe.tpid, v))) {
            return self.discard(b, DropReason::Runt, pe.id);
        }
        // The L3 length is the same whatever the tagging: `len` less the ingress L2 header.
        let l3 = len - if tagged { 18 } else { 14 };
        if l3 > pe.mtu as usize {
            return self.discard(b, DropReason::EgressMtu, pe.id);
        }
        if TRACE {
            return self.deliver_traced(snap, pe.id, b, false);
        }
        self.enqueue(snap, pe.id, b);
    }

    /// Gives a frame the tagging of its egress: `want` is the (TPID, VLAN ID) it leaves with,
    /// or none; `pcp` is the priority of a pushed tag. False if the frame is too short.
    #[inline(always)]
    fn retag(&self, b: &mut BufId, tagged: bool, pcp: u16, want: Option<(u16, u16)>) -> bool {
        match (tagged, want) {
            (false, None) => true,
            (false, Some((tpid, v))) => vlan::push(&self.pool, b, tpid, pcp | v),
            (true, None) => vlan::pop(&self.pool, b),
            (true, Some((tpid, _))) => {
                vlan::set_tpid(&self.pool, b, tpid);
                true
            }
        }
    }

    /// Egress to a remote VTEP: untag, encapsulate, enqueue on the underlay port.
    #[inline(always)]
    fn emit_peer<const TRACE: bool>(&mut self, snap: &Snapshot, bd: &BdEntry, mut b: BufId, tagged: bool, peer: u16) {
        let (Some(vtep), Some(pe), Some(vni)) = (snap.vtep.as_ref(), snap.peer(peer), bd.vni) else {
            return self.discard(b, DropReason::VxlanNoRoute, 0);
        };
        if let Err(r) = self.untag(&mut b, tagged) {
            return self.discard(b, r, vtep.underlay_port);
        }
        let Ok(mac) = self.next_hop(snap, vtep, pe) else {
            return self.park(vtep, b, peer, vni);
        };
        let mark = snap.marking(bd.id);
        if TRACE {
            self.record(Step::Encap { peer, vni, dscp: mark.dscp, priority: mark.priority });
        }
        let r = vtep.encap(&self.pool, &mut b, pe, vni, mark);
        if self.sent_encapsulated(snap, vtep, b, r, (mac, mark.priority)) {
            self.stats.event(Event::Encapsulated, 1);
        }
    }

    /// The next hop of a frame to `pe`: `Ok(None)` the template's (configured), `Ok(mac)`
    /// the resolved one, `Err` not known yet (the caller parks the frame). Sends this
    /// second's request when this thread is elected.
    #[inline(always)]
    fn next_hop(&mut self, snap: &Snapshot, vtep: &VtepEntry, pe: &PeerEntry) -> Result<Option<MacAddr>, ()> {
        let Some(target) = pe.resolve else {
            return Ok(None);
        };
        // The common case, a MAC confirmed recently, without any write.
        if let Some(m) = self.neigh.fresh_mac(pe.id, self.now) {
            return Ok(Some(m));
        }
        self.resolve(snap, vtep, pe.id, target).map(Some).ok_or(())
    }

    /// Leaves an (untagged, not yet encapsulated) frame waiting for its peer's next hop, or
    /// drops it when too many wait.
    #[cold]
    fn park(&mut self, vtep: &VtepEntry, mut b: BufId, peer: u16, vni: u32) {
        self.note(Step::NeighborHold { peer });
        if self.dry() {
            return self.cache.free(b);
        }
        // It waits beyond this burst: nothing of it may stay in a guest's buffer.
        if !self.pool.linearize(&mut b, &mut self.cache) {
            return self.discard(b, DropReason::NoBuffer, vtep.underlay_port);
        }
        if let Err(w) = self.parked.park(Waiting { b, peer, vni, since: self.now }) {
            self.discard(w.b, DropReason::NeighborQueueFull, vtep.underlay_port);
        }
    }

    /// Asks for `target` (at most once a second across threads) and returns the MAC to use
    /// now, if any.
    #[cold]
    #[inline(never)]
    fn resolve(&mut self, snap: &Snapshot, vtep: &VtepEntry, peer: u16, target: IpAddr) -> Option<MacAddr> {
        if self.dry() {
            return None; // a synthetic frame asks nobody
        }
        let (next, ask) = self.neigh.next(peer, self.now, !vtep.shared);
        if ask {
            match neigh::request(&mut self.cache, vtep.local, vtep.mac, vtep.underlay_vlan, target) {
                Some(req) => {
                    self.stats.event(Event::NeighborRequests, 1);
                    self.enqueue(snap, vtep.underlay_port, req);
                }
                None => self.stats.count_drop(DropReason::NoBuffer, vtep.underlay_port),
            }
        }
        match next {
            Next::Send(m) => Some(m),
            Next::Wait => None,
        }
    }

    /// Sends or drops the frames waiting for resolution, now that an answer came or a second
    /// passed; the others keep waiting, in order.
    #[cold]
    #[inline(never)]
    fn retry_parked(&mut self, snap: &Snapshot) {
        let mut parked = std::mem::take(&mut self.parked);
        let mut sent = 0;
        parked.retry(|w| {
            let (Some(vtep), Some(pe)) = (snap.vtep.as_ref(), snap.peer(w.peer)) else {
                self.discard(w.b, DropReason::VxlanNoRoute, 0);
                return None;
            };
            let Some(target) = pe.resolve else {
                // Configured with a MAC since the frame was parked.
                let (mut b, mark) = (w.b, snap.marking_of_vni(w.vni));
                let r = vtep.encap(&self.pool, &mut b, pe, w.vni, mark);
                sent += self.sent_encapsulated(snap, vtep, b, r, (None, mark.priority)) as u64;
                return None;
            };
            match self.resolve(snap, vtep, pe.id, target) {
                Some(m) => {
                    let (mut b, mark) = (w.b, snap.marking_of_vni(w.vni));
                    let r = vtep.encap(&self.pool, &mut b, pe, w.vni, mark);
                    sent += self.sent_encapsulated(snap, vtep, b, r, (Some(m), mark.priority)) as u64;
                    None
                }
                None if self.neigh.given_up(w.peer, w.since, self.now) => {
                    self.discard(w.b, DropReason::NeighborUnresolved, vtep.underlay_port);
                    None
                }
                None => Some(w),
            }
        });
        self.parked = parked;
        self.stats.event(Event::Encapsulated, sent);
    }

    /// Removes the tag of a frame that arrived tagged (VXLAN carries inner frames untagged).
    #[inline(always)]
    fn untag(&self, b: &mut BufId, tagged: bool) -> Result<(), DropReason> {
        if tagged && !vlan::pop(&self.pool, b) { Err(DropReason::Runt) } else { Ok(()) }
    }

    /// Queues an encapsulated frame on the underlay port (to the resolved next hop `mac`,
    /// when given), or drops it for the reason the encapsulation gave; true if queued.
    #[inline(always)]
    fn sent_encapsulated(&mut self, snap: &Snapshot, vtep: &VtepEntry, mut b: BufId, r: Result<(), DropReason>, (mac, first): (Option<MacAddr>, bool)) -> bool {
        match r {
            Ok(()) => {
                if let Some(m) = mac {
                    self.set_next_hop(&mut b, m);
                }
                self.deliver(snap, vtep.underlay_port, b, first);
                true
            }
            Err(r) => {
                self.discard(b, r, vtep.underlay_port);
                false
            }
        }
    }

    /// Encapsulates the frames the cache sent to remote VTEPs (VPP's encap node): the outer
    /// layout chosen once, the peer looked up once per run of frames to it.
    #[inline(never)]
    fn encap_pending(&mut self, snap: &Snapshot) {
        let Some(vtep) = snap.vtep.as_ref() else {
            for b in self.to_peer.drain() {
                self.stats.count_drop(DropReason::VxlanNoRoute, 0);
                self.cache.free(b);
            }
            return;
        };
        // Marking (a bridge domain's DSCP, ECN copied) costs only where some domain has it.
        match (vtep.layout(), snap.marked) {
            (Layout::V4, false) => self.encap_pending_as::<true, 14, 50, false>(snap, vtep),
            (Layout::V4Tagged, false) => self.encap_pending_as::<true, 18, 54, false>(snap, vtep),
            (Layout::V6, false) => self.encap_pending_as::<false, 14, 70, false>(snap, vtep),
            (Layout::V6Tagged, false) => self.encap_pending_as::<false, 18, 74, false>(snap, vtep),
            (Layout::V4, true) => self.encap_pending_as::<true, 14, 50, true>(snap, vtep),
            (Layout::V4Tagged, true) => self.encap_pending_as::<true, 18, 54, true>(snap, vtep),
            (Layout::V6, true) => self.encap_pending_as::<false, 14, 70, true>(snap, vtep),
            (Layout::V6Tagged, true) => self.encap_pending_as::<false, 18, 74, true>(snap, vtep),
        }
    }

    #[inline(always)]
    fn encap_pending_as<const V4: bool, const L2: usize, const OUTER: usize, const MARK: bool>(&mut self, snap: &Snapshot, vtep: &VtepEntry) {
        let (mut last, mut out) = (LastPeer::default(), [Batch::new(), Batch::new()]);
        for i in 0..self.to_peer.len() {
            let b = self.to_peer.take(i);
            let hit = self.to_peer_hits[i & (BATCH - 1)];
            self.encap_hit::<V4, L2, OUTER, MARK>(snap, vtep, &mut last, b, hit, &mut out);
        }
        self.to_peer.clear_taken();
        self.send_encapsulated::<MARK>(snap, vtep, &mut out);
    }

    /// A burst from a local port whose every frame the cache sends to a remote VTEP (the
    /// common case of a pod talking across nodes): straight from the probe to encapsulation,
    /// without the in-order pass and the encapsulation queue. `bytes`: the burst's.
    #[inline(never)]
    fn encap_burst(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch, found: &[(Hit, u32); BATCH], bytes: u64) {
        // Bridge domain counters first, apart from the loop: an access port's frames all
        // belong to its one domain.
        let burst = &found[..batch.len()];
        self.known += burst.len() as u64;
        self.stats.event(Event::CacheHits, burst.len() as u64);
        if port.kind == PortKind::Access {
            self.count_bd(port.untagged_bd, burst.len() as u64, bytes);
        } else {
            let mut run = BdRun::new(NO_BD);
            for (hit, len) in burst {
                if let Some(done) = run.add(hit.bd(), *len as usize) {
                    self.count_run(done);
                }
            }
            self.count_run(run);
        }
        match snap.vtep.as_ref().map(|v| (v, v.layout(), snap.marked)) {
            Some((vtep, Layout::V4, false)) => self.encap_burst_as::<true, 14, 50, false>(snap, vtep, batch, found),
            Some((vtep, Layout::V4Tagged, false)) => self.encap_burst_as::<true, 18, 54, false>(snap, vtep, batch, found),
            Some((vtep, Layout::V6, false)) => self.encap_burst_as::<false, 14, 70, false>(snap, vtep, batch, found),
            Some((vtep, Layout::V6Tagged, false)) => self.encap_burst_as::<false, 18, 74, false>(snap, vtep, batch, found),
            Some((vtep, Layout::V4, true)) => self.encap_burst_as::<true, 14, 50, true>(snap, vtep, batch, found),
            Some((vtep, Layout::V4Tagged, true)) => self.encap_burst_as::<true, 18, 54, true>(snap, vtep, batch, found),
            Some((vtep, Layout::V6, true)) => self.encap_burst_as::<false, 14, 70, true>(snap, vtep, batch, found),
            Some((vtep, Layout::V6Tagged, true)) => self.encap_burst_as::<false, 18, 74, true>(snap, vtep, batch, found),
            None => {
                for b in batch.drain() {
                    self.discard(b, DropReason::VxlanNoRoute, 0);
                }
            }
        }
    }

    #[inline(always)]
    fn encap_burst_as<const V4: bool, const L2: usize, const OUTER: usize, const MARK: bool>(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        batch: &mut Batch,
        found: &[(Hit, u32); BATCH],
    ) {
        let (mut last, mut out) = (LastPeer::default(), [Batch::new(), Batch::new()]);
        for i in 0..batch.len() {
            let b = batch.take(i);
            self.encap_hit::<V4, L2, OUTER, MARK>(snap, vtep, &mut last, b, found[i & (BATCH - 1)].0, &mut out);
        }
        batch.clear_taken();
        self.send_encapsulated::<MARK>(snap, vtep, &mut out);
    }

    /// Encapsulates one frame the cache sends to a peer (`last`: the previous frame's peer,
    /// looked up again only when it changes) and adds it to `out`, for the underlay; true if
    /// added.
    #[inline(always)]
    fn encap_hit<'s, const V4: bool, const L2: usize, const OUTER: usize, const MARK: bool>(
        &mut self,
        snap: &'s Snapshot,
        vtep: &VtepEntry,
        last: &mut LastPeer<'s>,
        mut b: BufId,
        hit: Hit,
        out: &mut [Batch; 2],
    ) -> bool {
        let Action::Peer { peer, vni } = hit.action() else {
            self.discard(b, DropReason::NoEgress, 0); // only peer hits come here
            return false;
        };
        let pe = match last.peer {
            Some(pe) if pe.id == peer => pe,
            _ => match snap.peer(peer) {
                Some(pe) => *last.peer.insert(pe),
                None => {
                    self.discard(b, DropReason::VxlanNoRoute, 0);
                    return false;
                }
            },
        };
        if let Err(r) = self.untag(&mut b, hit.tagged_in()) {
            self.discard(b, r, vtep.underlay_port);
            return false;
        }
        // A peer whose next hop is resolved: the MAC first (or the frame waits).
        let mac = if pe.resolve.is_some() {
            match self.next_hop(snap, vtep, pe) {
                Ok(mac) => mac,
                Err(()) => {
                    self.park(vtep, b, peer, vni);
                    return false;
                }
            }
        } else {
            None
        };
        let mark = if MARK { last.marking(snap, hit.bd()) } else { Marking::UNMARKED };
        if let Err(r) = vtep.encap_as::<V4, L2, OUTER, MARK>(&self.pool, &mut b, pe, vni, mark) {
            self.discard(b, r, vtep.underlay_port);
            return false;
        }
        if let Some(m) = mac {
            self.set_next_hop(&mut b, m);
        }
        match out[mark.priority as usize].push(b) {
            Ok(()) => true,
            Err(b) => {
                self.discard(b, DropReason::NoEgress, 0); // `out` holds a burst: unreachable
                false
            }
        }
    }

    /// Writes the next hop's MAC as an encapsulated frame's destination.
    #[inline(always)]
    fn set_next_hop(&self, b: &mut BufId, mac: MacAddr) {
        if let Some(dst) = self.pool.head_mut(b).first_chunk_mut::<6>() {
            *dst = mac.0;
        }
    }

    /// Floods to every member but the ingress, and to remote VTEPs unless the frame came from
    /// one (split horizon). Every egress but the last gets a copy (small frames) or a private
    /// header segment over the shared payload (large ones); the last gets the original.
    #[inline(never)]
    fn flood<const TRACE: bool>(&mut self, snap: &Snapshot, bd: &BdEntry, in_port: u16, mut b: BufId, c: &Ctx) {
        // Copies share the payload: it must be in the pool.
        if !self.pool.linearize(&mut b, &mut self.cache) {
            return self.discard(b, DropReason::NoBuffer, in_port);
        }
        let from_peer = c.from_peer != NO_PEER;
        let ingress_member = !from_peer && bd.ports.iter().any(|(p, _)| *p == in_port);
        let peers: &[u16] = if from_peer { &[] } else { &bd.peers };
        let k = bd.ports.len() - ingress_member as usize + peers.len();
        if k == 0 {
            return self.discard(b, DropReason::NoEgress, in_port);
        }
        self.stats.event(Event::Flooded, 1);
        if TRACE {
            self.record(Step::Flood { bd: bd.id, copies: k as u16 });
        }
        self.stats.bd(bd.id).flooded.add(1);
        self.stats.event(Event::FloodCopies, (k - 1) as u64);
        let len = self.pool.pkt_len(&b);
        let targets = bd
            .ports
            .iter()
            .filter(|(p, _)| from_peer || *p != in_port)
            .map(|&(p, want)| Target::Port(p, want))
            .chain(peers.iter().map(|&p| Target::Peer(p)));
        if k == 1 || (len <= COPY_MAX && !self.pool.is_chained(&b)) {
            let mut original = Some(b);
            for (i, t) in targets.enumerate() {
                let frame = if i + 1 == k {
                    original.take()
                } else {
                    let copy = self.cache.alloc().map(|mut copy| {
                        if let Some(o) = &original {
                            self.pool.append(&mut copy, self.pool.head(o));
                        }
                        copy
                    });
                    if copy.is_none() {
                        self.flood_copy_failed(in_port);
                    }
                    copy
                };
                if let Some(f) = frame {
                    self.emit_target::<TRACE>(snap, bd, f, c, t, len);
                }
            }
            if let Some(o) = original {
                self.discard(o, DropReason::NoEgress, in_port); // only if `k` miscounted
            }
            return;
        }
        // Large frame: each egress gets a private header segment; the payload is shared.
        let l2 = if c.tagged { 18 } else { 14 };
        let mut hdr = [0u8; 18];
        hdr[..l2].copy_from_slice(&self.pool.head(&b)[..l2]);
        let mut payload = b;
        self.pool.strip(&mut payload, l2);
        let shared = self.pool.into_shared(payload);
        for t in targets {
            match self.cache.alloc() {
                Some(mut h) => {
                    self.pool.append(&mut h, &hdr[..l2]);
                    self.pool.link_shared(&mut h, &shared);
                    self.emit_target::<TRACE>(snap, bd, h, c, t, len);
                }
                None => self.flood_copy_failed(in_port),
            }
        }
        self.cache.release_shared(shared);
    }

    #[cold]
    fn flood_copy_failed(&mut self, port: u16) {
        self.stats.event(Event::FloodCopyFailed, 1);
        self.stats.count_drop(DropReason::NoBuffer, port);
    }

    #[inline(always)]
    fn emit_target<const TRACE: bool>(&mut self, snap: &Snapshot, bd: &BdEntry, b: BufId, c: &Ctx, t: Target, len: usize) {
        match t {
            Target::Port(p, want) => match snap.port(p) {
                Some(pe) => self.emit_port::<TRACE>(snap, pe, b, c.tagged, c.pcp, want, len),
                None => self.discard(b, DropReason::NoEgress, p),
            },
            Target::Peer(p) => self.emit_peer::<TRACE>(snap, bd, b, c.tagged, p),
        }
    }

    /// Adds a packet to a port's tx batch, sending the batch first if it is full (head-end
    /// replication can put several copies of one packet on the underlay port).
    #[inline(always)]
    fn enqueue(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        let tx = &mut self.tx[port as usize & (fdb::MAX_PORTS - 1)];
        if tx.is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        }
        if let Err(b) = tx.push(b) {
            self.enqueue_full(snap, port, b);
        }
    }

    /// A full tx batch: send it (the port stays on the dirty list), then queue the packet.
    #[cold]
    #[inline(never)]
    fn enqueue_full(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        self.flush_port(snap, port);
        if let Err(b) = self.tx[port as usize & (fdb::MAX_PORTS - 1)].push(b) {
            self.discard(b, DropReason::TxFull, port); // flush_port empties the batch: unreachable
        }
    }

    /// Queues a burst's encapsulated frames on the underlay port at once: `out[0]` in its tx
    /// batch, `out[1]` (priority domains') ahead of it.
    #[inline(always)]
    fn send_encapsulated<const MARK: bool>(&mut self, snap: &Snapshot, vtep: &VtepEntry, out: &mut [Batch; 2]) {
        self.stats.event(Event::Encapsulated, out[0].len() as u64);
        self.enqueue_batch(snap, vtep.underlay_port, &mut out[0]);
        if MARK && !out[1].is_empty() {
            self.stats.event(Event::Encapsulated, out[1].len() as u64);
            for b in out[1].drain() {
                self.enqueue_first(snap, vtep.underlay_port, b);
            }
        }
    }

    /// Queues a priority domain's encapsulated frame ahead of the underlay port's tx batch
    /// (see [`Pipeline::flush_port`]).
    #[cold]
    #[inline(never)]
    fn enqueue_first(&mut self, snap: &Snapshot, port: u16, b: BufId) {
        if self.tx_first.0 != port && !self.tx_first.1.is_empty() {
            // The underlay moved: what waits for the old one goes (or drops) now.
            let old = self.tx_first.0;
            self.flush_port(snap, old);
            let mut left = std::mem::take(&mut self.tx_first.1);
            for b in left.drain() {
                self.discard(b, DropReason::TxFull, old);
            }
        }
        if self.tx[port as usize & (fdb::MAX_PORTS - 1)].is_empty() && self.tx_first.1.is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        }
        self.tx_first.0 = port;
        if let Err(b) = self.tx_first.1.push(b) {
            self.flush_port(snap, port);
            if let Err(b) = self.tx_first.1.push(b) {
                // A batch of priority frames still waits for room: this one is dropped.
                self.discard(b, DropReason::TxFull, port);
            }
        }
    }

    /// [`Pipeline::enqueue`] for a batch of frames to one port: one move of the indices.
    #[inline(always)]
    fn enqueue_batch(&mut self, snap: &Snapshot, port: u16, frames: &mut Batch) {
        if frames.is_empty() {
            return;
        }
        let i = port as usize & (fdb::MAX_PORTS - 1);
        if self.tx[i].is_empty() {
            self.dirty[self.n_dirty & (fdb::MAX_PORTS - 1)] = port;
            self.n_dirty += 1;
        } else if self.tx[i].room() < frames.len() {
            self.flush_port(snap, port);
        }
        self.tx[i].append(frames);
        // The tx batch was empty or had room for all: nothing is left (defensive).
        for b in frames.drain() {
            self.discard(b, DropReason::TxFull, port);
        }
    }

    /// Work that does not wait for a burst: frames waiting for next-hop resolution are sent
    /// or given up (checked at most once per answer learned or second; cheap when idle).
    #[inline]
    pub fn housekeeping(&mut self, snap: &Snapshot) {
        if self.parked.due(self.neigh.generation(), self.now) {
            self.retry_parked(snap);
            self.flush(snap);
        }
    }

    /// Sends every pending tx batch; what a port does not take is dropped and counted.
    pub fn flush(&mut self, snap: &Snapshot) {
        for i in 0..self.n_dirty {
            let p = self.dirty[i & (fdb::MAX_PORTS - 1)];
            self.flush_port(snap, p);
        }
        self.n_dirty = 0;
        if !self.tx_first.1.is_empty() {
            // Priority frames held for room: the port stays dirty, they go first next time.
            self.dirty[0] = self.tx_first.0;
            self.n_dirty = 1;
        }
    }

    /// Sends one port's tx batch (it stays on the dirty list; an empty batch costs nothing):
    /// the priority frames waiting for it first, then the batch, whose frames the ring did
    /// not take are dropped.
    fn flush_port(&mut self, snap: &Snapshot, p: u16) {
        if p == self.tx_first.0 && !self.tx_first.1.is_empty() {
            self.flush_first(snap, p);
        }
        let batch = &mut self.tx[p as usize & (fdb::MAX_PORTS - 1)];
        if batch.is_empty() {
            return;
        }
        let (reason, left) = match send_batch(&self.pool, &mut self.cache, &self.stats, self.thread, snap, p, batch) {
            Some(_) => (DropReason::TxFull, batch.len()),
            None => (DropReason::PortDown, batch.len()),
        };
        if left > 0 {
            for b in batch.drain() {
                self.stats.count_drop(reason, p);
                self.cache.free(b);
            }
        }
    }
}

impl Pipeline {
    /// Sends the priority frames waiting for underlay port `p`; those its ring has no room
    /// for stay, first in line for the next flush (a down or removed port drops them).
    #[cold]
    #[inline(never)]
    fn flush_first(&mut self, snap: &Snapshot, p: u16) {
        let batch = &mut self.tx_first.1;
        let n = batch.len();
        match send_batch(&self.pool, &mut self.cache, &self.stats, self.thread, snap, p, batch) {
            Some(sent) => {
                self.stats.event(Event::PriorityFirst, sent as u64);
                self.stats.event(Event::PriorityHeld, (n - sent) as u64);
                // Held past this burst: no frame may keep a tail lent by a guest (a port
                // that takes lent tails, vhost-user, copies only those it sends).
                if sent < n && self.cache.lending() {
                    Self::linearize_all(&self.pool, &mut self.cache, &self.stats, p, batch);
                }
            }
            None => {
                for b in batch.drain() {
                    self.stats.count_drop(DropReason::PortDown, p);
                    self.cache.free(b);
                }
            }
        }
    }

    /// Copies the lent tails of a tx batch for a port that may keep its buffers beyond the
    /// burst (kernel ports, rings); a packet that finds no buffer is dropped.
    #[cold]
    #[inline(never)]
    fn linearize_all(pool: &Pool, cache: &mut PoolCache, stats: &ThreadStats, port: u16, batch: &mut Batch) {
        let mut kept = Batch::new();
        for mut b in batch.drain() {
            if pool.linearize(&mut b, cache) {
                let _ = kept.push(b).map_err(|b| cache.free(b)); // never fuller than `batch` was
            } else {
                stats.count_drop(DropReason::NoBuffer, port);
                cache.free(b);
            }
        }
        std::mem::swap(batch, &mut kept);
    }
}

/// Packet trace ([`crate::trace`]): a traced burst takes the slow path compiled with
/// `TRACE` (`forward_slow::<true>`), whose nodes record what they decided through
/// [`Pipeline::record`]; untraced bursts pay one check per burst (`Tracing::armed_for`), and
/// a test of `traced` only where a frame is dropped, waits for a next hop or learns
/// something new (paths shared with the cache's).
impl Pipeline {
    /// Records `s` for the frame being forwarded when this burst is traced.
    #[inline(always)]
    fn note(&mut self, s: Step) {
        if self.traced {
            self.record(s);
        }
    }

    #[cold]
    #[inline(never)]
    fn record(&mut self, s: Step) {
        let t = &mut *self.trace;
        if t.cur < t.k
            && let Some(f) = t.frames.get_mut(t.cur)
        {
            f.push(s);
        }
    }

    /// A synthetic frame is being traced: nothing may be learned, asked or sent.
    #[inline(always)]
    fn dry(&self) -> bool {
        self.traced && self.trace.dry
    }

    /// Queues a frame the slow path forwards on `port` (`first`: ahead of its tx batch); a
    /// synthetic frame is recorded and freed instead.
    #[inline(always)]
    fn deliver(&mut self, snap: &Snapshot, port: u16, b: BufId, first: bool) {
        if self.traced {
            return self.deliver_traced(snap, port, b, first);
        }
        if first { self.enqueue_first(snap, port, b) } else { self.enqueue(snap, port, b) }
    }

    #[cold]
    #[inline(never)]
    fn deliver_traced(&mut self, snap: &Snapshot, port: u16, b: BufId, first: bool) {
        let dry = self.trace.dry;
        self.record(Step::Tx { port, first, sent: !dry });
        match (dry, first) {
            (true, _) => self.cache.free(b),
            (false, true) => self.enqueue_first(snap, port, b),
            (false, false) => self.enqueue(snap, port, b),
        }
    }

    /// Starts tracing the frames of a burst from `port` (the first the request still wants,
    /// or every one of a synthetic `batch`): their heads, and what the cache would decide.
    #[cold]
    #[inline(never)]
    fn begin_trace(&mut self, port: &PortEntry, batch: &Batch, dry: bool) {
        let k = if dry { batch.len() } else { self.tracing.claim(batch.len()) };
        if k == 0 {
            return;
        }
        self.traced = true;
        self.cached = false;
        let t = &mut *self.trace;
        (t.k, t.cur, t.dry) = (k, 0, dry);
        let emc = (self.emc.capacity() > 0 && port.kind != PortKind::Underlay).then(|| self.emc.view());
        for (f, b) in t.frames.iter_mut().zip(batch.as_slice()).take(k) {
            let (h, len) = self.pool.head_and_len(b);
            f.start(port.id, len, h);
            (f.thread, f.dry, f.seq) = (self.thread, dry, self.tracing.next_seq());
            if let Some(emc) = &emc {
                let key = if port.security.is_some() { Key::lookup_from_secured_port(port.id, h) } else { Key::from_port(port.id, h) };
                let hit = key.and_then(|k| emc.lookup(&k)).filter(|hit| hit.admits(len as u32)).map(|hit| {
                    let to = match hit.action() {
                        Action::Port { port, .. } => Dest::Port(port),
                        Action::Peer { peer, .. } => Dest::Peer(peer),
                    };
                    (hit.bd(), to)
                });
                f.push(Step::Cache { hit });
            }
        }
    }

    /// Hands the burst's traces to the control side.
    #[cold]
    #[inline(never)]
    fn end_trace(&mut self) {
        self.traced = false;
        for f in &self.trace.frames[..self.trace.k] {
            self.tracing.hand_over(f.clone());
        }
    }

    /// Stage 1's decisions for the traced frames (drops, answers and what the VTEP takes
    /// are recorded where stage 2 acts on them).
    #[cold]
    #[inline(never)]
    fn trace_classified(&mut self, snap: &Snapshot, port: &PortEntry, ctxs: &[Ctx; BATCH]) {
        let t = &mut *self.trace;
        for (c, f) in ctxs.iter().zip(t.frames.iter_mut()).take(t.k) {
            match c.drop {
                // Port security runs after classification, which passed.
                Some(r) if crate::trace::Node::dropping(r) == crate::trace::Node::PortSecurity => {
                    f.push(Step::Classify { bd: port.untagged_bd, vid: 0, pcp: 0 });
                }
                Some(_) => {}
                None if c.reply || c.taken => {}
                None if c.from_peer != NO_PEER => f.push(Step::Decap { peer: c.from_peer, bd: c.bd }),
                None => {
                    let vid = if c.tagged { snap.bd(c.bd).map_or(0, |b| b.vlan) } else { 0 };
                    f.push(Step::Classify { bd: c.bd, vid, pcp: (c.pcp >> 13) as u8 });
                    if port.security.is_some() {
                        f.push(Step::PortSecurity);
                    }
                }
            }
        }
    }

    /// Runs `frame`, as if received on port id `in_port`, through `snap` (VPP's `trace` of a
    /// made-up packet, OVS's `ofproto/trace`): stage 1 and 2 as for any frame, but nothing is
    /// learned, no next hop asked for and nothing sent; the cache and the ingress policer
    /// are not consulted. `None`: no such port, or no buffer holds the frame.
    pub fn trace_dry(&mut self, snap: &Snapshot, in_port: u16, frame: &[u8]) -> Option<FrameTrace> {
        let port = snap.port(in_port)?;
        let mut b = self.cache.alloc()?;
        if !self.pool.append(&mut b, frame) {
            self.cache.free(b);
            return None;
        }
        let mut batch = Batch::new();
        if let Err(b) = batch.push(b) {
            self.cache.free(b); // an empty batch takes a frame: unreachable
            return None;
        }
        self.begin_trace(port, &batch, true);
        self.forward_slow::<true>(snap, port, &mut batch);
        self.traced = false;
        Some(std::mem::take(&mut self.trace.frames[0]))
    }
}

/// The MAC address in an FDB key.
fn key_mac(key: u64) -> MacAddr {
    let b = key.to_be_bytes();
    MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Sends `batch` on port `p` as far as its ring takes it (lent tails linearized first for a
/// port that may keep buffers beyond the burst) and counts what went; what the ring did not
/// take stays in `batch`. `None`: the port is down or gone (nothing sent).
#[inline(always)]
fn send_batch(pool: &Pool, cache: &mut PoolCache, stats: &ThreadStats, thread: usize, snap: &Snapshot, p: u16, batch: &mut Batch) -> Option<usize> {
    let pe = snap.port(p).filter(|pe| pe.port.link_up())?;
    if cache.lending() && !pe.port.takes_lent() {
        Pipeline::linearize_all(pool, cache, stats, p, batch);
    }
    let bytes: usize = batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum();
    let n = batch.len();
    let q = (thread % pe.port.tx_queues().max(1) as usize) as u16;
    let sent = pe.port.tx_burst(q, cache, batch);
    let unsent: usize = if sent < n { batch.as_slice().iter().map(|b| pool.pkt_len(b)).sum() } else { 0 };
    let pc = stats.port(p);
    pc.tx_packets.add(sent as u64);
    pc.tx_bytes.add((bytes - unsent) as u64);
    Some(sent)
}

/// Stage 0, first pass: the cached decision (or none) and the length of every frame; returns
/// their bytes and how many were found. It only reads, so the pool's and the cache's fields
/// stay in registers.
/// [`probe_burst`] for a port without port security, out of line: its loop is the hit
/// path's hottest code, compiled the same whatever its callers grow (inlined, its lookups
/// cost ~6 instructions more a frame after an unrelated change to the burst's bookkeeping).
#[inline(never)]
fn probe_trusted_burst(pool: PoolView, emc: EmcView, port: u16, bufs: &[BufId], found: &mut [(Hit, u32); BATCH]) -> (u64, u64) {
    probe_burst::<false>(pool, emc, port, bufs, found)
}

/// [`probe_burst`] for a pod port (port security), out of line for the same reason (inline,
/// it cost 6 instructions a frame more once the burst's entry grew a trace check).
#[inline(never)]
fn probe_secured_burst(pool: PoolView, emc: EmcView, port: u16, bufs: &[BufId], found: &mut [(Hit, u32); BATCH]) -> (u64, u64) {
    probe_burst::<true>(pool, emc, port, bufs, found)
}

#[inline(always)]
fn probe_burst<const SECURED: bool>(pool: PoolView, emc: EmcView, port: u16, bufs: &[BufId], found: &mut [(Hit, u32); BATCH]) -> (u64, u64) {
    let (mut bytes, mut hits) = (0u64, 0u64);
    for (b, f) in bufs.iter().zip(found.iter_mut()) {
        let (h, len) = pool.head_and_len(b);
        bytes += len as u64;
        let key = if SECURED { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        let hit = key.and_then(|k| emc.lookup(&k)).unwrap_or_default();
        hits += hit.admits(len as u32) as u64;
        *f = (hit, len as u32);
    }
    (bytes, hits)
}

/// [`probe_burst`] for flows spread over more cache than a core holds ([`EmcView::spread`]):
/// a first pass makes every frame's key and requests its set, a second looks them up, so the
/// burst's waits on memory overlap instead of coming one after another.
#[inline(never)]
fn probe_spread_burst<const SECURED: bool>(pool: PoolView, emc: EmcView, port: u16, bufs: &[BufId], found: &mut [(Hit, u32); BATCH]) -> (u64, u64) {
    let mut keys = [(0usize, None::<Key>); BATCH];
    let mut bytes = 0u64;
    for ((b, f), (set, key)) in bufs.iter().zip(found.iter_mut()).zip(keys.iter_mut()) {
        let (h, len) = pool.head_and_len(b);
        bytes += len as u64;
        f.1 = len as u32;
        *key = if SECURED { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        if let Some(k) = key {
            *set = emc.set_of(k);
            emc.prefetch_set(*set);
        }
    }
    let mut hits = 0u64;
    for (f, (set, key)) in found.iter_mut().zip(&keys).take(bufs.len()) {
        let hit = key.as_ref().and_then(|k| emc.lookup_in(*set, k)).unwrap_or_default();
        hits += hit.admits(f.1) as u64;
        f.0 = hit;
    }
    (bytes, hits)
}

/// The key a frame from local port `port` (`secured`: it has port security) fills the
/// cache under (lookups of secured ports' frames use [`Key::lookup_from_secured_port`]).
#[inline(always)]
fn port_key(port: u16, secured: bool, h: &[u8]) -> Option<Key> {
    if secured { Key::from_secured_port(port, h) } else { Key::from_port(port, h) }
}

/// Turns the remaining hits of a burst into misses (their lookups are outdated); returns how
/// many there were.
#[cold]
#[inline(never)]
fn forget_hits<F: Found>(found: &mut [F]) -> u64 {
    let mut hits = 0;
    for f in found {
        let (hit, len) = f.hit_and_len();
        hits += hit.admits(len) as u64;
        *hit = Hit::default();
    }
    hits
}

/// A burst's per-frame lookup result: the hit and the frame's length first.
trait Found {
    fn hit_and_len(&mut self) -> (&mut Hit, u32);
}

impl Found for (Hit, u32) {
    fn hit_and_len(&mut self) -> (&mut Hit, u32) {
        (&mut self.0, self.1)
    }
}

impl Found for (Hit, u32, bool) {
    fn hit_and_len(&mut self) -> (&mut Hit, u32) {
        (&mut self.0, self.1)
    }
}

/// What consecutive frames of an encapsulated burst share, looked up again only when it
/// changes: the peer, and the marking of the bridge domain.
struct LastPeer<'s> {
    peer: Option<&'s PeerEntry>,
    bd: u16,
    mark: Marking,
}

impl Default for LastPeer<'_> {
    fn default() -> Self {
        LastPeer { peer: None, bd: NO_BD, mark: Marking::UNMARKED }
    }
}

impl LastPeer<'_> {
    #[inline(always)]
    fn marking(&mut self, snap: &Snapshot, bd: u16) -> Marking {
        if bd != self.bd {
            (self.bd, self.mark) = (bd, snap.marking(bd));
        }
        self.mark
    }
}

/// Whether every hit of a burst goes to a remote VTEP (the first to a local port stops it).
#[inline(never)]
fn all_to_peers(found: &[(Hit, u32)]) -> bool {
    found.iter().all(|(h, _)| h.is_peer())
}

/// The TCI of a tagged frame whose head holds its tag.
#[inline(always)]
fn tci_of(h: &[u8]) -> u16 {
    h.get(14..16).map_or(0, |t| u16::from_be_bytes([t[0], t[1]]))
}

/// Stage 1 for a burst from a local port: (port, VLAN) → bridge domain, L2 sanity, FDB keys.
#[inline(always)]
fn classify_port_burst(
    pool: &Pool,
    fdb: &Fdb,
    port: &PortEntry,
    snap: &Snapshot,
    batch: &mut Batch,
    ctxs: &mut [Ctx; BATCH],
) -> u64 {
    let mut bytes = 0u64;
    for (b, ctx) in batch.as_mut_slice().iter_mut().zip(ctxs.iter_mut()) {
        if let Err(r) = classify_port(pool, fdb, port, snap, b, &mut bytes, ctx) {
            ctx.drop = Some(r);
        }
    }
    bytes
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn classify_port(
    pool: &Pool,
    fdb: &Fdb,
    port: &PortEntry,
    snap: &Snapshot,
    b: &mut BufId,
    bytes: &mut u64,
    ctx: &mut Ctx,
) -> Result<(), DropReason> {
    let (h, len) = pool.head_and_len(b);
    *bytes += len as u64;
    if h.len() < ethernet::HEADER_LEN + ethernet::TAG_LEN {
        return fill_untagged_or_runt(fdb, port, h, len, ctx);
    }
    let et = u16::from_be_bytes([h[12], h[13]]);
    // Below 0x8100 (IPv4, ARP, ...) nothing is a tag: the common case costs one compare.
    if et < ethertype::VLAN || !ethernet::is_tpid(et) {
        if port.untagged_bd == NO_BD {
            return Err(DropReason::UntaggedNotAllowed);
        }
        // Port MTUs are validated to at most MAX_FRAME - 18, so this also bounds `len`.
        if len - ethernet::HEADER_LEN > port.mtu as usize {
            return Err(DropReason::Oversize);
        }
        return fill_l2(fdb, ctx, h, port.untagged_bd, NO_PEER, port.security.as_ref(), false, 0, len);
    }
    let tci = u16::from_be_bytes([h[14], h[15]]);
    let vid = tci & 0x0fff;
    if vid == 0 {
        // A priority tag: the frame is untagged for VLAN purposes.
        if port.untagged_bd == NO_BD {
            return Err(DropReason::UntaggedNotAllowed);
        }
        vlan::pop(pool, b);
        let (h, len) = pool.head_and_len(b);
        if len - ethernet::HEADER_LEN > port.mtu as usize {
            return Err(DropReason::Oversize);
        }
        return fill_l2(fdb, ctx, h, port.untagged_bd, NO_PEER, port.security.as_ref(), false, tci & 0xf000, len);
    }
    if port.kind != PortKind::Trunk {
        return Err(DropReason::TaggedOnAccess);
    }
    if et != port.tpid {
        return Err(DropReason::WrongTpid);
    }
    if !port.allowed.contains(vid) {
        return Err(DropReason::VlanNotAllowed);
    }
    let bd = snap.vlan_bd[vid as usize];
    if bd == NO_BD {
        return Err(DropReason::NoBridgeDomain);
    }
    if len - ethernet::HEADER_LEN - ethernet::TAG_LEN > port.mtu as usize {
        return Err(DropReason::Oversize);
    }
    fill_l2(fdb, ctx, h, bd, NO_PEER, port.security.as_ref(), true, tci & 0xf000, len)
}

/// A head too short to hold a tag: untagged if it holds an Ethernet header at all.
#[cold]
fn fill_untagged_or_runt(fdb: &Fdb, port: &PortEntry, h: &[u8], len: usize, ctx: &mut Ctx) -> Result<(), DropReason> {
    if h.len() < ethernet::HEADER_LEN {
        return Err(DropReason::Runt);
    }
    if ethernet::is_tpid(u16::from_be_bytes([h[12], h[13]])) {
        return Err(DropReason::Runt);
    }
    if port.untagged_bd == NO_BD {
        return Err(DropReason::UntaggedNotAllowed);
    }
    fill_l2(fdb, ctx, h, port.untagged_bd, NO_PEER, port.security.as_ref(), false, 0, len)
}

/// The part of stage 1 every frame shares: source sanity, port security (`sec`, a local
/// port's), FDB keys and where they live (prefetched for stage 2).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fill_l2(
    fdb: &Fdb,
    ctx: &mut Ctx,
    h: &[u8],
    bd: u16,
    from_peer: u16,
    sec: Option<&Security>,
    tagged: bool,
    pcp: u16,
    len: usize,
) -> Result<(), DropReason> {
    // Later stages index the L2 header in the head segment without further checks: a port
    // that hands over a chain whose head is shorter than the header is refused here.
    let l2 = if tagged { ethernet::HEADER_LEN + ethernet::TAG_LEN } else { ethernet::HEADER_LEN };
    if h.len() < l2 {
        return Err(DropReason::Runt);
    }
    // Two 8-byte loads hold both addresses: bytes 0..8 start with the destination, bytes
    // 4..12 end with the source.
    let (Some(a), Some(b)) = (h.first_chunk::<8>(), h.get(4..).and_then(|t| t.first_chunk::<8>())) else {
        return Err(DropReason::Runt);
    };
    let (w0, w1) = (u64::from_be_bytes(*a), u64::from_be_bytes(*b));
    let (dst, src) = (w0 >> 16, w1 & 0xffff_ffff_ffff);
    if src & (1 << 40) != 0 {
        return Err(DropReason::SrcMacGroup);
    }
    if let Some(sec) = sec {
        security::check(sec, h, l2, src)?;
    }
    let (src_key, dst_key) = (fdb::key(bd, src), fdb::key(bd, dst));
    let (src_loc, dst_loc) = (fdb.locate(src_key), fdb.locate(dst_key));
    fdb.prefetch(dst_loc);
    fdb.prefetch(src_loc);
    *ctx = Ctx { len: len as u32, reply: false, taken: false, bd, drop: None, from_peer, tagged, pcp, src_key, dst_key, src_loc, dst_loc };
    Ok(())
}

/// A boxed array built on the heap (4096 batches would not fit a thread's stack).
fn boxed_array<T, const N: usize>(f: impl Fn() -> T) -> Box<[T; N]> {
    let v: Box<[T]> = (0..N).map(|_| f()).collect();
    v.try_into().unwrap_or_else(|_| unreachable!("length is N"))
}

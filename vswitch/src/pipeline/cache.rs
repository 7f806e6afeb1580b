//! Node `cache` (stage 0): the exact-match cache of [`crate::emc`]. A read-only probe of
//! the whole burst, then, in order, hits to egress (the shared tagging and tx code) and
//! misses through `classify`/`decap` and `forward` in their place; for an underlay, the outer
//! headers checked and the inner frame looked up in place. It fuses the logical nodes a hit
//! skips (classify, port security, learn, forward, encap for a burst all to peers): a hit
//! costs ~110 instructions where the full path costs ~320 (docs/perf/instructions.md), and the
//! trace reports the cache's decision and then the full path for traced frames.

use super::classify::classify_port;
use super::rewrite::tci_of;
use super::{BdRun, Ctx, Pipeline};
use crate::batch::{BATCH, Batch};
use crate::buf::{BufId, PoolView};
use crate::counters::{DropReason, Event};
use crate::descriptor::{Descriptor, Next};
use crate::emc::{self, Action, Emc, EmcView, Hit, Key};
use crate::fdb;
use crate::megaflow::{MegaflowView, Megaflows};
use crate::snapshot::{NO_BD, PortEntry, PortKind, Snapshot};
use crate::trace::Node;
use crate::vtep::{self, VtepEntry};

/// Node `cache`, as [`crate::graph`] collects it (a hit that leaves with its tag as it came
/// skips vlan-rewrite's work, not the node).
pub(crate) const NODE: Descriptor = Descriptor {
    node: Node::Cache,
    name: "cache",
    nexts: &[
        Next::Node(Node::Classify),
        Next::Node(Node::Decap),
        Next::Node(Node::Vtep),
        Next::Node(Node::VlanRewrite),
        Next::Node(Node::Encap),
    ],
    drops: &[],
    counts: &[Event::CacheHits, Event::MegaflowHits],
};

/// What a hit saves against what a miss costs, in misses: a hit skips ~210 instructions of
/// the slow path, a miss adds ~67 to it (its key, lookup and fill; docs/perf/vhost-user.md
/// "A mesh the cache cannot hold"), so the cache pays for itself from about a quarter of hits.
const HIT_WORTH: i32 = 3;
/// What an exact-match cache miss that the second level then found costs, in misses: against
/// the second level alone, an exact-match hit saves a few dozen instructions and such a miss
/// adds more (its lookup, the fill): measured when the destination half was keyed by
/// ingress, ~27 against ~73 (docs/perf/vhost-user.md "A mesh the cache cannot hold: the
/// second level"), three times a hit's worth, so the exact-match cache pays for itself in
/// front of the second level from about three quarters of hits. (Keyed by bridge domain,
/// the second level costs ~151 a frame, the hit saves ~39: the weight leans to the halves.)
const HALVED_MISS: i32 = 3 * HIT_WORTH;
/// Bounds of a port's account with the cache (see [`Pipeline::worth_looking_up`]), in misses'
/// worth: a port that was on the cache for long leaves it after a few bursts of churn, one
/// that left it comes back after a sampled burst with half its frames hit.
const CREDIT_CAP: i32 = 96;
/// A port whose credit is below this skips the cache: two bursts' worth of misses (a port
/// at 0 leaves on its third burst of nothing but misses), so a new port's first floods (ARP,
/// frames to MACs not learned yet) do not put it off the cache.
const OFF_BELOW: i16 = -64;

/// One burst in this many of a thrashing port still goes through the cache, to notice flows
/// that repeat again. After each sampled burst that did not bring the port back and at
/// least half of whose misses the second level found, twice as many, up to
/// [`SAMPLE_EVERY`] << [`MAX_FAILED`] (1,024 bursts: a couple of milliseconds at line rate):
/// a port whose churn the second level serves loses little between samples, and stops
/// paying for samples that all miss (each a burst's lookups, its misses' halves and fills:
/// in l2-fullmesh-1k, a sample in 64 cost ~1 instruction a frame). The price: a sample's
/// misses fill the cache from the second level, so the first sample after the port's flows
/// start to repeat misses and only the next one, twice as late (at most 1,024 bursts, so
/// ~2,048 in all after a long churn), brings it back. A port whose misses take the slow
/// path (floods, a cold FDB) keeps sampling one burst in 64, as does a port whose last
/// sample earned credit (its hits outweighed its misses); each time a port leaves, it
/// starts there.
pub(super) const SAMPLE_EVERY: u16 = 64;
/// How many times the interval between samples doubles (see [`SAMPLE_EVERY`]).
const MAX_FAILED: u8 = 4;

/// [`probe_burst`] for a port without port security, out of line: its loop is the hit
/// path's hottest code, compiled the same whatever its callers grow (inlined, its lookups
/// cost ~6 instructions more a frame after an unrelated change to the burst's bookkeeping).
#[inline(never)]
pub(super) fn probe_trusted_burst(
    pool: PoolView,
    emc: EmcView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    probe_burst::<false>(pool, emc, port, bufs, found)
}

/// [`probe_burst`] for a pod port (port security), out of line for the same reason (inline,
/// it cost 6 instructions a frame more once the burst's entry grew a trace check).
#[inline(never)]
pub(super) fn probe_secured_burst(
    pool: PoolView,
    emc: EmcView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    probe_burst::<true>(pool, emc, port, bufs, found)
}

/// [`probe_burst`] in the second-level cache, for a port without port security.
#[inline(never)]
pub(super) fn probe_trusted_halves(
    pool: PoolView,
    mega: MegaflowView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    probe_uncounted::<false>(pool, mega, port, bufs, found);
    count_found(&found[..bufs.len()])
}

/// [`probe_burst`] in the second-level cache, for a pod port (port security).
#[inline(never)]
pub(super) fn probe_secured_halves(
    pool: PoolView,
    mega: MegaflowView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    probe_uncounted::<true>(pool, mega, port, bufs, found);
    count_found(&found[..bufs.len()])
}

/// [`probe_burst`] in the second level, without counting (two registers fewer in a loop
/// that holds both tables): [`count_found`] after.
#[inline(always)]
fn probe_uncounted<const SECURED: bool>(
    pool: PoolView,
    mega: MegaflowView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) {
    for (b, f) in bufs.iter().zip(found.iter_mut()) {
        let (h, len) = pool.head_and_len(b);
        let key =
            if SECURED { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        let hit = key.and_then(|k| mega.lookup_for::<SECURED>(&k, len as u32)).unwrap_or_default();
        *f = (hit, len as u32);
    }
}

/// A probed burst's bytes and hits.
#[inline(always)]
fn count_found(found: &[(Hit, u32)]) -> (u64, u64) {
    found.iter().fold((0, 0), |(bytes, hits), (hit, len)| {
        (bytes + *len as u64, hits + hit.admits(*len) as u64)
    })
}

/// The second level for the frames of a burst the exact-match cache missed (their `found`
/// admits none): a hit there is taken, and written into the exact-match cache, where the
/// flow's next frames find it (as OVS's dpcls hits fill its EMC). Returns how many hit.
#[inline(never)]
fn halve_misses(
    pool: PoolView,
    mega: MegaflowView,
    emc: &mut Emc,
    port: u16,
    secured: bool,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> u64 {
    look_up_again(pool, port, secured, bufs, found, |k, len| {
        let hit = mega.lookup(k).filter(|hit| hit.admits(len))?;
        // A key the second level knows is one the slow path filled (a secured port's:
        // `Key::from_secured_port`'s), so the exact-match cache may hold it too.
        emc.insert(k, hit);
        Some(hit)
    })
}

/// For each frame of a burst that no cache found yet (its `found` admits none), `lookup`
/// with its key and length: a hit that admits the frame's length is taken. Returns how many
/// were.
#[inline(always)]
fn look_up_again(
    pool: PoolView,
    port: u16,
    secured: bool,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
    mut lookup: impl FnMut(&Key, u32) -> Option<Hit>,
) -> u64 {
    let mut hits = 0;
    for (b, f) in bufs.iter().zip(found.iter_mut()) {
        if f.0.admits(f.1) {
            continue;
        }
        let (h, _) = pool.head_and_len(b);
        let key =
            if secured { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        if let Some(hit) = key.and_then(|k| lookup(&k, f.1))
            && hit.admits(f.1)
        {
            f.0 = hit;
            hits += 1;
        }
    }
    hits
}

/// The exact-match cache's misses in their own sets looked up in the other set of their
/// pair, where a key whose own set was full sits ([`Emc::insert`]). Returns how many hit.
#[inline(never)]
fn partner_misses(
    pool: PoolView,
    emc: EmcView,
    port: u16,
    secured: bool,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> u64 {
    look_up_again(pool, port, secured, bufs, found, |k, _| emc.lookup_partner(k))
}

/// Stage 0, first pass: the cached decision (or none) and the length of every frame; returns
/// their bytes and how many were found. It only reads, so the pool's and the cache's fields
/// stay in registers.
#[inline(always)]
pub(super) fn probe_burst<const SECURED: bool>(
    pool: PoolView,
    emc: EmcView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    let (mut bytes, mut hits) = (0u64, 0u64);
    for (b, f) in bufs.iter().zip(found.iter_mut()) {
        let (h, len) = pool.head_and_len(b);
        bytes += len as u64;
        let key =
            if SECURED { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        let hit = key.and_then(|k| emc.lookup(&k)).unwrap_or_default();
        hits += hit.admits(len as u32) as u64;
        *f = (hit, len as u32);
    }
    (bytes, hits)
}

/// [`probe_burst`] for flows spread over more cache than a core holds ([`EmcView::spread`]):
/// a first pass makes every frame's key and requests its set, a second looks them up, so the
/// burst's waits on memory overlap instead of coming one after another. A miss in the own
/// set looks in the other set of its pair at once (the adjacent line: a table this full
/// puts keys there, [`Emc::insert`]); l2-100k-both-random 170.1 → 161.6 instructions a frame
/// against a second pass over the misses.
#[inline(never)]
pub(super) fn probe_spread_burst<const SECURED: bool>(
    pool: PoolView,
    emc: EmcView,
    port: u16,
    bufs: &[BufId],
    found: &mut [(Hit, u32); BATCH],
) -> (u64, u64) {
    let mut keys = [(0usize, None::<Key>); BATCH];
    let mut bytes = 0u64;
    for ((b, f), (set, key)) in bufs.iter().zip(found.iter_mut()).zip(keys.iter_mut()) {
        let (h, len) = pool.head_and_len(b);
        bytes += len as u64;
        f.1 = len as u32;
        *key =
            if SECURED { Key::lookup_from_secured_port(port, h) } else { Key::from_port(port, h) };
        if let Some(k) = key {
            *set = emc.set_of(k);
            emc.prefetch_set(*set);
        }
    }
    let mut hits = 0u64;
    for (f, (set, key)) in found.iter_mut().zip(&keys).take(bufs.len()) {
        let hit = key.as_ref().and_then(|k| emc.lookup_pair_in(*set, k)).unwrap_or_default();
        hits += hit.admits(f.1) as u64;
        f.0 = hit;
    }
    (bytes, hits)
}

/// The key a frame from local port `port` (`secured`: it has port security) fills the
/// cache under (lookups of secured ports' frames use [`Key::lookup_from_secured_port`]).
#[inline(always)]
pub(super) fn port_key(port: u16, secured: bool, h: &[u8]) -> Option<Key> {
    if secured { Key::from_secured_port(port, h) } else { Key::from_port(port, h) }
}

/// Turns the remaining hits of a burst into misses (their lookups are outdated); returns how
/// many there were.
#[cold]
#[inline(never)]
pub(super) fn forget_hits<F: Found>(found: &mut [F]) -> u64 {
    let mut hits = 0;
    for f in found {
        let (hit, len) = f.hit_and_len();
        hits += hit.admits(len) as u64;
        *hit = Hit::default();
    }
    hits
}

/// A burst's per-frame lookup result: the hit and the frame's length first.
pub(super) trait Found {
    fn hit_and_len(&mut self) -> (&mut Hit, u32);
}

impl Found for (Hit, u32) {
    fn hit_and_len(&mut self) -> (&mut Hit, u32) {
        (&mut self.0, self.1)
    }
}

/// What the first pass over an underlay burst found for a frame ([`strip_hits`]): the
/// cached decision, the inner frame's length, and whether the frame lost its outer headers
/// (a hit the burst cannot trust then admits no frame: see [`forget_hits`]). Whole words,
/// no padding: a burst's entries are cleared with two stores each, not three.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stripped {
    hit: Hit,
    len: u32,
    stripped: u32,
}

impl Found for Stripped {
    fn hit_and_len(&mut self) -> (&mut Hit, u32) {
        (&mut self.hit, self.len)
    }
}

/// Whether every hit of a burst goes to a remote VTEP. The first frame decides for a burst to
/// local ports; after a first to a peer, the rest are tested without a branch a frame (`&`,
/// not `all`: a burst to peers is mostly all to peers, and the early exit cost ~4
/// instructions a frame in vxlan-encap).
#[inline(never)]
pub(super) fn all_to_peers(found: &[(Hit, u32)]) -> bool {
    match found.split_first() {
        Some(((first, _), rest)) if first.is_peer() => {
            rest.iter().fold(true, |all, (h, _)| all & h.is_peer())
        }
        _ => false,
    }
}

/// Which lookups a burst's first pass made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probed {
    /// The second level's alone.
    Halves,
    /// The exact-match cache's, in the keys' own sets.
    Exact,
    /// The exact-match cache's, in the keys' own sets and their partners
    /// ([`probe_spread_burst`]).
    Paired,
}

/// What a burst's lookups found when the exact-match cache did not find it all
/// ([`Pipeline::look_up_misses`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Tally {
    /// Hits in the exact-match cache, and in the second level.
    exact: u64,
    halves: u64,
    /// Frames looked up in the second level.
    halved: usize,
    /// The caches' free fills before the burst ([`Emc::free_fills`],
    /// [`Megaflows::free_fills`]).
    before: u32,
    halves_before: u32,
    /// The burst was looked up in the second level alone.
    only_halves: bool,
}

impl Tally {
    /// A burst the exact-match cache found all of.
    #[inline(always)]
    fn exact(hits: u64) -> Tally {
        Tally { exact: hits, halves: 0, halved: 0, before: 0, halves_before: 0, only_halves: false }
    }

    #[inline(always)]
    fn hits(&self) -> u64 {
        self.exact + self.halves
    }
}

/// Node `cache`'s state beyond the cache itself.
pub(super) struct Flows {
    pub(super) emc: Emc,
    /// Cache hits of this burst for remote VTEPs, encapsulated together.
    pub(super) to_peer: Batch,
    pub(super) to_peer_hits: [Hit; BATCH],
    /// The second-level cache (see [`crate::megaflow`]).
    pub(super) mega: Megaflows,
    /// This burst went through a cache; `miss_keys[i]` is then the key of the `i`th frame the
    /// cache missed (the slow path's `i`th).
    pub(super) cached: bool,
    /// The slow path's decisions fill the exact-match cache (`exact`), the second level
    /// (`halves`), or both: the caches the burst looked its frames up in.
    pub(super) exact: bool,
    pub(super) halves: bool,
    pub(super) miss_keys: [Option<Key>; BATCH],
    /// Per ingress port, what the exact-match cache saved it against what it cost.
    pub(super) account: Account,
    /// The same for the second level.
    pub(super) halves_account: Account,
}

/// Per ingress port, what a cache saved it less what it cost, in misses' worth (see
/// [`Account::worth`]).
pub(super) struct Account {
    credit: Box<[i16; fdb::MAX_PORTS]>,
    /// Per ingress port off the cache, how it is sampled (per port: a shared count could
    /// keep landing on the same ports).
    sampled: Box<[Sampling; fdb::MAX_PORTS]>,
}

/// How a port off a cache is sampled ([`SAMPLE_EVERY`]).
#[derive(Clone, Copy, Default)]
struct Sampling {
    /// Bursts that skipped the cache since the last sampled one.
    skipped: u16,
    /// Sampled bursts in a row that left the port off while the second level served it.
    failed: u8,
    /// The port's credit at its previous burst off the cache: only sampled bursts change
    /// it, so a rise is a sample that earned (its frames hit).
    credit: i16,
}

impl Account {
    fn new() -> Account {
        Account {
            credit: Box::new([0; fdb::MAX_PORTS]),
            sampled: Box::new([Sampling::default(); fdb::MAX_PORTS]),
        }
    }

    /// Whether this burst from `port` goes through the cache: while the cache has saved the
    /// port about what it cost it (its credit is not below [`OFF_BELOW`]), and otherwise
    /// one burst in [`SAMPLE_EVERY`] (fewer while samples fail), to notice when flows repeat
    /// again. A burst earns
    /// [`HIT_WORTH`] for each hit and loses one for each miss, so a port whose frames hit
    /// less than a quarter of the time — a churn of flows the cache cannot hold (a thousand
    /// pods talking to all the others, for the exact-match cache), floods, which are never
    /// cached — stops paying for lookups and fills that save nothing. A miss that filled a
    /// free entry (a cold start, new flows that fit) costs nothing: a port on the cache
    /// stays on while it fills it, one off it fills it through its sampled bursts and comes
    /// back once they hit. OVS's EMC answers the same churn by filling only one miss in a
    /// hundred, which also slows a cold start a hundredfold.
    #[inline(always)]
    pub(super) fn worth(&mut self, port: u16) -> bool {
        self.serves(port) || self.sample(port)
    }

    /// One burst in [`SAMPLE_EVERY`] of a port off the cache, fewer while the second level
    /// serves it ([`Account::sampled_off`]). A sample that earned credit without bringing
    /// the port back (hits of bursts too short to make up for its debt) is not a failure:
    /// the interval starts again. (Seen here, not where the hits are counted: that is the
    /// all-hit burst's path, which stays as short as it was.)
    #[inline(never)]
    fn sample(&mut self, port: u16) -> bool {
        let i = port as usize & (fdb::MAX_PORTS - 1);
        let (credit, s) = (self.credit[i], &mut self.sampled[i]);
        if credit > s.credit {
            s.failed = 0;
        }
        s.credit = credit;
        s.skipped += 1;
        if s.skipped < SAMPLE_EVERY << s.failed {
            return false;
        }
        s.skipped = 0;
        true
    }

    /// A port left the cache (only a burst with misses takes it off, here): its samples
    /// start at the first interval.
    #[cold]
    #[inline(never)]
    fn left(&mut self, port: u16) {
        let i = port as usize & (fdb::MAX_PORTS - 1);
        self.sampled[i] = Sampling { credit: self.credit[i], ..Sampling::default() };
    }

    /// A sampled burst left the port off the cache: one more failed sample when the second
    /// level found at least half of its misses (`served`), none when they took the slow
    /// path.
    #[cold]
    #[inline(never)]
    fn sampled_off(&mut self, port: u16, served: bool) {
        let failed = &mut self.sampled[port as usize & (fdb::MAX_PORTS - 1)].failed;
        *failed = if served { (*failed + 1).min(MAX_FAILED) } else { 0 };
    }

    /// After `n` lookups for frames from `port` that hit `hits` times, not all of them: their
    /// worth to the port's credit; `free` of the misses filled a free entry, `halved` found
    /// their decision in the second level (a miss that cost [`HALVED_MISS`] times more).
    #[inline(never)]
    pub(super) fn note(&mut self, port: u16, hits: u64, n: usize, free: u32, halved: u64) {
        let c = &mut self.credit[port as usize & (fdb::MAX_PORTS - 1)];
        let was_on = *c >= OFF_BELOW;
        let (hits, misses) = (hits as i32, n as i32 - hits as i32);
        // A miss that filled a free entry is an investment (the flow may come again), not
        // waste: a cold start costs nothing. (Rewrites of a key the cache holds are not.)
        let invested = (free.min(BATCH as u32) as i32).min(misses);
        // Nearly every miss did: the cache has room for the port's flows (a cold start, a
        // new epoch), so it goes on the cache to fill it at once.
        if 2 * invested >= misses {
            *c = (*c).max(0);
        } else {
            let wasted = misses - invested;
            let dear = (halved as i32).min(wasted) * (HALVED_MISS - 1);
            *c = (*c as i32 + HIT_WORTH * hits - wasted - dear).clamp(-CREDIT_CAP, CREDIT_CAP)
                as i16;
        }
        match (was_on, *c >= OFF_BELOW) {
            (true, false) => self.left(port),
            (false, false) => self.sampled_off(port, 2 * halved as i32 >= misses),
            _ => {}
        }
    }

    /// Whether the cache has found `port`'s frames for a while: its credit is at least half
    /// [`CREDIT_CAP`] (a miss that filled a free entry only brings it to 0, so a port the
    /// cache missed a burst ago is not proven again by the next fill).
    #[inline(always)]
    fn proven(&self, port: u16) -> bool {
        self.credit[port as usize & (fdb::MAX_PORTS - 1)] as i32 >= CREDIT_CAP / 2
    }

    /// Whether `port` is on the cache: its credit is not below [`OFF_BELOW`].
    #[inline(always)]
    fn serves(&self, port: u16) -> bool {
        self.credit[port as usize & (fdb::MAX_PORTS - 1)] >= OFF_BELOW
    }

    /// Takes `port` off the cache for another that serves it better (it is not sampled
    /// meanwhile: see [`Pipeline::sample_exact`]; once it may be again, its samples start
    /// at the first interval).
    fn stand_aside(&mut self, port: u16) {
        self.credit[port as usize & (fdb::MAX_PORTS - 1)] = -CREDIT_CAP as i16;
        self.left(port);
    }

    /// Puts `port` back on the cache, at no credit.
    fn recall(&mut self, port: u16) {
        let i = port as usize & (fdb::MAX_PORTS - 1);
        self.credit[i] = self.credit[i].max(0);
    }

    /// After `n` lookups for frames from `port`, every one of which hit.
    #[inline(always)]
    pub(super) fn note_hits(&mut self, port: u16, n: usize) {
        let c = &mut self.credit[port as usize & (fdb::MAX_PORTS - 1)];
        *c = (*c as i32 + HIT_WORTH * n as i32).min(CREDIT_CAP) as i16;
    }
}

impl Flows {
    /// Before a burst's first lookup in (or fill of) the second level, from a port with
    /// port security or not: it starts a new epoch when the exact-match cache's would.
    /// (Bursts that all hit the exact-match cache never look there, and skip this.)
    #[inline(never)]
    fn sync_halves(&mut self, snapshot: u64, fdb: u32, now: u32) {
        self.mega.sync(snapshot, fdb, now);
    }

    pub(super) fn new(emc_entries: usize, megaflow_entries: usize) -> Flows {
        Flows {
            emc: Emc::new(emc_entries),
            mega: Megaflows::new(megaflow_entries),
            exact: false,
            halves: false,
            to_peer: Batch::new(),
            to_peer_hits: [Hit::default(); BATCH],
            cached: false,
            miss_keys: [None; BATCH],
            account: Account::new(),
            halves_account: Account::new(),
        }
    }
}

impl Pipeline {
    /// Stage 0 for a burst from a local port: a read-only lookup of every frame in the
    /// exact-match cache (or, `halves`, in the second level alone), the exact-match cache's
    /// misses in the second level, then the hits and misses in order (or stages 1-2 for the
    /// whole burst when nothing hit). Returns the bytes received. One in-order pass for both
    /// levels (a second copy of it inline, and of the egress code it inlines, cost the
    /// all-hit burst's path 2-10 instructions a frame in what the compiler then left out of
    /// line); a burst that all hit takes [`Pipeline::forward_all_hits`], out of line.
    #[inline(always)]
    pub(super) fn forward_port_cached(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
        halves: bool,
    ) -> u64 {
        let mut found = [(Hit::default(), 0u32); BATCH];
        let secured = port.security.is_some();
        let (pool, emc) = (self.pool.view(), self.flows.emc.view());
        // A spread burst's probe looks in the partner sets too.
        let probed = match (halves, emc.spread) {
            (true, _) => Probed::Halves,
            (false, true) => Probed::Paired,
            (false, false) => Probed::Exact,
        };
        let (bytes, hits) = match (halves, emc.spread, secured) {
            (true, _, _) => self.probe_halves(snap, port, batch, &mut found),
            (false, true, true) => {
                probe_spread_burst::<true>(pool, emc, port.id, batch.as_slice(), &mut found)
            }
            (false, true, false) => {
                probe_spread_burst::<false>(pool, emc, port.id, batch.as_slice(), &mut found)
            }
            (false, false, true) => {
                probe_secured_burst(pool, emc, port.id, batch.as_slice(), &mut found)
            }
            (false, false, false) => {
                probe_trusted_burst(pool, emc, port.id, batch.as_slice(), &mut found)
            }
        };
        let n = batch.len();
        let partial = halves || hits < n as u64;
        let tally = if partial {
            let t = self.look_up_misses(snap, port, batch, &mut found, hits, probed);
            if t.hits() == 0 {
                self.forward_none(snap, port, batch, &t);
                return bytes;
            }
            t
        } else {
            self.note_hit_burst(port.id, n);
            Tally::exact(hits)
        };
        // Every frame hit (so each fits its hit's length): if all go to remote VTEPs, they
        // need no in-order pass. A burst to local ports stops at its first frame.
        let demoted = if tally.hits() == n as u64 && all_to_peers(&found[..n]) {
            self.encap_burst(snap, port, batch, &found, bytes);
            0
        } else {
            // An access port's frames all belong to its one bridge domain; a burst that all
            // hit needs no in-order pass that can take a frame to the slow path.
            let all = tally.hits() == n as u64;
            match (port.kind == PortKind::Access, self.nodes.on()) {
                (true, false) if all => {
                    self.forward_all_hits::<true>(snap, port, batch, &found, bytes);
                    0
                }
                (false, false) if all => {
                    self.forward_all_hits::<false>(snap, port, batch, &found, bytes);
                    0
                }
                (true, false) => self.forward_cached::<true, false>(snap, port, batch, &mut found),
                (false, false) => {
                    self.forward_cached::<false, false>(snap, port, batch, &mut found)
                }
                (true, true) => self.forward_cached::<true, true>(snap, port, batch, &mut found),
                (false, true) => self.forward_cached::<false, true>(snap, port, batch, &mut found),
            }
        };
        if partial {
            self.settle(port.id, n, &tally, demoted);
        } else {
            self.count_hits(hits - demoted, Event::CacheHits);
        }
        bytes
    }

    /// The first pass of a burst from a local port off the exact-match cache, in the second
    /// level alone (see [`Pipeline::forward_port_cached`]); returns the burst's bytes and hits.
    #[inline(never)]
    fn probe_halves(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &Batch,
        found: &mut [(Hit, u32); BATCH],
    ) -> (u64, u64) {
        let secured = port.security.is_some();
        self.flows.sync_halves(snap.generation, self.fdb.generation(), self.now);
        let (pool, mega, bufs) = (self.pool.view(), self.flows.mega.view(), batch.as_slice());
        if secured {
            probe_secured_halves(pool, mega, port.id, bufs, found)
        } else {
            probe_trusted_halves(pool, mega, port.id, bufs, found)
        }
    }

    /// For a burst not all of whose frames the exact-match cache found (`hits` did), or
    /// (`halves`) whose frames were looked up in the second level alone: which caches the
    /// slow path's decisions fill, and the exact-match cache's misses looked up in the second
    /// level (whose hits are written into the exact-match cache, as OVS's dpcls hits fill
    /// its EMC). Out of line: the all-hit burst's path keeps its registers.
    #[inline(never)]
    fn look_up_misses(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &Batch,
        found: &mut [(Hit, u32); BATCH],
        hits: u64,
        probed: Probed,
    ) -> Tally {
        let (n, secured) = (batch.len(), port.security.is_some());
        let (halves, paired) = (probed == Probed::Halves, probed == Probed::Paired);
        self.flows.exact = !halves;
        if !halves {
            self.flows.halves = self.worth_halving(port.id);
            if self.flows.halves {
                self.flows.sync_halves(snap.generation, self.fdb.generation(), self.now);
            }
        }
        // What either cache had filled before this burst: the exact-match cache's fills from
        // the second level's hits are investments too (a cold start whose halves are known).
        let (before, halves_before) = (self.flows.emc.free_fills(), self.flows.mega.free_fills());
        // Keys whose own sets were full sit in the other set of the pair: looked up there
        // only for a burst's misses, so the hits' lookups stay one set's (but for a burst the
        // probe looked there already, `paired`: `probe_spread_burst`).
        let hits = if !halves && !paired && self.flows.emc.partnered() {
            let (pool, emc) = (self.pool.view(), self.flows.emc.view());
            hits + partner_misses(pool, emc, port.id, secured, batch.as_slice(), found)
        } else {
            hits
        };
        let (exact, found_halves, halved) = if halves {
            (0, hits, n)
        } else if self.flows.halves {
            let (pool, mega) = (self.pool.view(), self.flows.mega.view());
            let emc = &mut self.flows.emc;
            let m = halve_misses(pool, mega, emc, port.id, secured, batch.as_slice(), found);
            (hits, m, n - hits as usize)
        } else {
            (hits, 0, 0)
        };
        Tally { exact, halves: found_halves, halved, before, halves_before, only_halves: halves }
    }

    /// A burst nothing of which any cache found: stages 1-2 for all of it, each frame's key
    /// kept for the fills.
    #[inline(never)]
    fn forward_none(&mut self, snap: &Snapshot, port: &PortEntry, batch: &mut Batch, t: &Tally) {
        let (n, secured) = (batch.len(), port.security.is_some());
        for (k, b) in self.flows.miss_keys.iter_mut().zip(batch.as_slice()) {
            *k = port_key(port.id, secured, self.pool.head(b));
        }
        self.forward_slow::<false>(snap, port, batch);
        self.settle(port.id, n, t, 0);
    }

    /// After a burst of `n` frames that [`Pipeline::look_up_misses`] tallied: the hits
    /// counted (`demoted`: those a mid-burst MAC move turned into misses, counted against the
    /// exact-match cache's first, since a frame's cache is not kept), and the burst's worth
    /// to the port's accounts with both caches.
    #[inline(never)]
    fn settle(&mut self, port: u16, n: usize, t: &Tally, demoted: u64) {
        // Outside a burst that looked there, nothing fills the second level.
        self.flows.halves = false;
        let exact_demoted = demoted.min(t.exact);
        self.count_hits(t.exact - exact_demoted, Event::CacheHits);
        if t.halves > 0 {
            self.count_hits(t.halves - (demoted - exact_demoted), Event::MegaflowHits);
        }
        if !t.only_halves {
            self.note_burst(port, t.exact, n, t.before, t.halves);
        }
        // Chosen over the exact-match cache, the halves' misses cost what its hits would have
        // saved (judged before this burst's worth moves the account).
        let first = self.halves_first(port);
        self.note_halves(port, t.halves, t.halved, t.halves_before, t.only_halves && first);
        // Only a change calls out: a port the halves serve first looks up nothing else.
        if first != self.halves_first(port) || (first && !t.only_halves) {
            self.choose_first(port, first);
        }
    }

    /// After `n` lookups of a burst from `port` in the second level, `hits` of which hit:
    /// their worth to the port's account with it; `before` is its
    /// [`Megaflows::free_fills`] at the burst's start. `dear`: the halves came first for the
    /// port ([`Pipeline::halves_first`]), so in a burst whose misses filled no free entry each
    /// miss weighs [`HALVED_MISS`], what an exact-match hit would have saved: a port stays
    /// there while the halves find about three frames in four. A burst whose misses filled
    /// some is the halves learning, not failing the port (several of its frames can miss a
    /// half the first of them then filled), and weighs as in front of the slow path.
    #[inline(always)]
    fn note_halves(&mut self, port: u16, hits: u64, n: usize, before: u32, dear: bool) {
        if n > 0 && hits == n as u64 {
            self.flows.halves_account.note_hits(port, n);
        } else if n > 0 {
            let free = self.flows.mega.free_fills().wrapping_sub(before);
            // Misses that filled free entries (halves the port had not needed yet) are the
            // halves learning, not failing it.
            let weighed = if dear && free == 0 { n as u64 } else { 0 };
            self.flows.halves_account.note(port, hits, n, free, weighed);
        }
    }

    /// Whether this burst from `port` goes through the exact-match cache: as
    /// [`Account::worth`], but a port the halves serve first ([`Pipeline::halves_first`]) is
    /// not sampled there.
    #[inline(always)]
    pub(super) fn worth_looking_up(&mut self, port: u16) -> bool {
        self.flows.account.serves(port) || self.sample_exact(port)
    }

    /// A burst of `port`, off the exact-match cache, that may sample it ([`Account::sample`]).
    #[inline(never)]
    fn sample_exact(&mut self, port: u16) -> bool {
        !self.halves_first(port) && self.flows.account.sample(port)
    }

    /// After a burst of local `port` that changed whether the halves come first for it
    /// ([`Pipeline::halves_first`]; `first_before`: whether they did before it): a port the
    /// halves have now proven themselves to, while the exact-match cache has outgrown the
    /// core, leaves that cache for them, and one they failed goes straight back to it (not at
    /// its next sample).
    #[cold]
    #[inline(never)]
    fn choose_first(&mut self, port: u16, first_before: bool) {
        match (first_before, self.halves_first(port)) {
            (_, true) if self.flows.account.serves(port) => self.flows.account.stand_aside(port),
            (true, false) => self.flows.account.recall(port),
            _ => {}
        }
    }

    /// Whether local `port` skips the exact-match cache for the second level because the
    /// first has outgrown the core's caches ([`Emc::outgrown`]) while the second has found
    /// the port's frames for a while ([`Account::proven`]; a port that never looked there has
    /// not): the exact-match cache's hits, though it found every frame, would cost more than
    /// the halves' (`emc::OUTGROWN_FILLS`). Such a port stands aside from the exact-match
    /// cache and is not sampled there ([`Pipeline::choose_first`], [`Pipeline::sample_exact`]:
    /// both off the all-hit burst's path); the halves' misses then weigh as much as the
    /// exact-match cache's hits would have saved ([`Pipeline::settle`]), so a port the halves
    /// fail goes back at once, and leaves again only once they have found its frames for a
    /// while (a miss that filled a free entry restores a port's account to 0, not to proven).
    /// A new epoch (the table emptied, the fills counted afresh) lets every port choose again.
    #[inline(always)]
    fn halves_first(&self, port: u16) -> bool {
        self.flows.emc.outgrown() && self.flows.halves_account.proven(port)
    }

    /// Whether this burst from `port` may look frames up in the second level.
    #[inline(always)]
    pub(super) fn worth_halving(&mut self, port: u16) -> bool {
        self.flows.mega.capacity() > 0 && self.flows.halves_account.worth(port)
    }

    /// After a burst of `n` frames from `port` whose lookups in the exact-match cache hit
    /// `hits` times, not all of them: its worth to the port's credit; `before` is the cache's
    /// [`Emc::free_fills`] at the burst's start, `halved` of its misses the second level
    /// found.
    #[inline(always)]
    pub(super) fn note_burst(&mut self, port: u16, hits: u64, n: usize, before: u32, halved: u64) {
        let free = self.flows.emc.free_fills().wrapping_sub(before);
        self.flows.account.note(port, hits, n, free, halved);
    }

    /// After a burst of `n` frames from `port`, every one of which hit the exact-match cache.
    #[inline(always)]
    pub(super) fn note_hit_burst(&mut self, port: u16, n: usize) {
        self.flows.account.note_hits(port, n);
    }

    /// Counts `hits` known-unicast frames that a cache forwarded (`event`: which cache).
    #[inline(always)]
    pub(super) fn count_hits(&mut self, hits: u64, event: Event) {
        self.known += hits;
        self.stats.event(event, hits);
    }

    /// After a frame of the burst took the slow path: whether it changed the FDB, so the
    /// burst's remaining lookups can no longer be trusted. (The exact-match cache is synced
    /// at every burst's start, even when it is off, so this holds for the second level's
    /// lookups too.)
    #[inline(always)]
    pub(super) fn lookups_outdated(&self) -> bool {
        self.flows.emc.outdated_by(self.fdb.generation())
    }

    /// Stage 0: frames whose flow the exact-match cache knows go to the shared egress code
    /// (tagging, tx batch); a frame it misses takes stages 1 and 2 in its place in the burst,
    /// so no frame passes another of its flow (whose key may differ, e.g. by an ECN mark).
    /// Once a missed frame changed the FDB (a MAC moved), the hits after it take stages 1
    /// and 2 too. Returns how many hits did.
    #[inline(always)]
    pub(super) fn forward_cached<const ACCESS: bool, const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
        found: &mut [(Hit, u32); BATCH],
    ) -> u64 {
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
            self.forward_hit::<PER_NODE>(snap, b, hit, &mut run, bd, len);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
        demoted
    }

    /// [`Pipeline::forward_cached`] for a burst all of whose frames hit (so each fits its
    /// hit's length, none takes the slow path and no hit is outdated): no length is checked.
    /// From an access port (`ACCESS`) the burst is one run of the port's bridge domain,
    /// `bytes` long, counted after the loop. Out of line, so its registers are its own.
    #[inline(never)]
    pub(super) fn forward_all_hits<const ACCESS: bool>(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        batch: &mut Batch,
        found: &[(Hit, u32); BATCH],
        bytes: u64,
    ) {
        let n = batch.len();
        let mut run = BdRun::new(NO_BD);
        for i in 0..n {
            let b = batch.take(i);
            let (hit, len) = found[i & (BATCH - 1)];
            if ACCESS {
                self.egress_hit::<false>(snap, b, hit);
            } else {
                self.forward_hit::<false>(snap, b, hit, &mut run, hit.bd(), len as usize);
            }
        }
        batch.clear_taken();
        if ACCESS {
            run = BdRun { bd: port.untagged_bd, packets: n as u64, bytes };
        }
        self.end_hits(snap, run);
    }

    /// Egress of a frame the cache knows, counted in `run` (bridge domain `bd`, `len` bytes).
    #[inline(always)]
    pub(super) fn forward_hit<const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        b: BufId,
        hit: Hit,
        run: &mut BdRun,
        bd: u16,
        len: usize,
    ) {
        if let Some(done) = run.add(bd, len) {
            self.count_run(done);
        }
        self.egress_hit::<PER_NODE>(snap, b, hit);
    }

    /// Where a frame the cache knows goes: its egress's tx batch (retagged as the hit says),
    /// or the queue for encapsulation.
    #[inline(always)]
    fn egress_hit<const PER_NODE: bool>(&mut self, snap: &Snapshot, b: BufId, hit: Hit) {
        if let Some(p) = hit.plain_port() {
            return self.hand_to_tx(snap, p, b);
        }
        let tagged = hit.tagged_in();
        match hit.action() {
            Action::Port { port: p, want } if PER_NODE => {
                self.hand_hit_to_rewrite(snap, b, p, tagged, want)
            }
            Action::Port { port: p, want } => {
                let mut b = b;
                let pcp = if tagged { tci_of(self.pool.head(&b)) & 0xf000 } else { 0 };
                if self.retag(&mut b, tagged, pcp, want) {
                    self.hand_to_tx(snap, p, b);
                } else {
                    self.drop_counted(b, DropReason::Runt, p);
                }
            }
            Action::Peer { .. } => {
                self.flows.to_peer_hits[self.flows.to_peer.len() & (BATCH - 1)] = hit;
                if let Err(b) = self.flows.to_peer.push(b) {
                    self.drop_counted(b, DropReason::NoEgress, 0); // holds a burst: unreachable
                }
            }
        }
    }

    /// After the last hit of a burst: what waits for encapsulation goes, the last run counts.
    #[inline(always)]
    pub(super) fn end_hits(&mut self, snap: &Snapshot, run: BdRun) {
        self.flush_pending(snap);
        self.count_run(run);
    }

    /// Sends what the cache queued for encapsulation (before a frame that took the slow path,
    /// so frames leave in the order they came).
    #[inline(always)]
    pub(super) fn flush_pending(&mut self, snap: &Snapshot) {
        self.run_nodes(snap);
        if !self.flows.to_peer.is_empty() {
            self.encap_pending(snap);
        }
    }

    /// Stages 1 and 2 for the `i`th frame of a burst, which the cache missed. When they
    /// changed the FDB, the hits of the frames after it in `found` become misses; returns how
    /// many did.
    #[inline(never)]
    pub(super) fn forward_missed(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        mut b: BufId,
        i: usize,
        found: &mut [(Hit, u32)],
    ) -> u64 {
        self.flush_pending(snap);
        self.flows.miss_keys[i & (BATCH - 1)] =
            port_key(port.id, port.security.is_some(), self.pool.head(&b));
        let (mut ctx, mut bytes) = (Ctx::default(), 0);
        if let Err(r) =
            classify_port(&self.pool, &self.fdb, port, snap, &mut b, &mut bytes, &mut ctx)
        {
            ctx.drop = Some(r);
        }
        self.forward_ctx(snap, port, b, &ctx, i);
        self.forget_outdated(found, i)
    }

    /// After stage 2 of the `i`th frame of a burst: when it changed the FDB, the lookups made
    /// for the frames after it are outdated, and their hits become misses. Returns how many.
    #[inline(always)]
    pub(super) fn forget_outdated<F: Found>(&self, found: &mut [F], i: usize) -> u64 {
        match found.get_mut(i + 1..) {
            Some(rest) if self.lookups_outdated() => forget_hits(rest),
            _ => 0,
        }
    }

    /// Stage 0 for a burst from the underlay: the outer headers of every frame are checked
    /// and the inner frame looked up in place; then, in order, inner frames whose flow the
    /// cache knows lose their outer headers and go straight to egress, and the others take
    /// the whole decapsulation again and stages 1 and 2. Returns the bytes received and the
    /// lookups that hit.
    #[inline(never)]
    pub(super) fn forward_underlay_cached<const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        vtep: &VtepEntry,
        port: &PortEntry,
        batch: &mut Batch,
    ) -> (u64, u64) {
        self.decap_cache.sync(snap.generation);
        let n = batch.len();
        let mut found = [Stripped::default(); BATCH];
        let (pool, emc) = (self.pool.view(), self.flows.emc.view());
        let (bytes, hits) = if emc.spread {
            strip_hits::<true>(pool, emc, &self.decap_cache, vtep, batch, &mut found)
        } else {
            strip_hits::<false>(pool, emc, &self.decap_cache, vtep, batch, &mut found)
        };
        let mut decapsulated = 0;
        if hits == n as u64 {
            self.forward_hits::<PER_NODE>(snap, batch, &found);
            self.count_hits(hits, Event::CacheHits);
            self.stats.event(Event::Decapsulated, hits);
            return (bytes, hits);
        }
        decapsulated += hits;
        let mut run = BdRun::new(NO_BD);
        // Every frame the first pass stripped came from the one (source, VNI) the
        // decapsulation cache held then (the slow path below may replace it).
        let stripped_from = self.decap_cache.admitted();
        let mut demoted = 0;
        for i in 0..n {
            let b = batch.take(i);
            let Stripped { hit, len, stripped } = found[i & (BATCH - 1)];
            if hit.admits(len) {
                self.forward_hit::<PER_NODE>(snap, b, hit, &mut run, hit.bd(), len as usize);
                continue;
            }
            decapsulated += self.forward_underlay_missed(
                snap,
                port,
                b,
                (stripped != 0).then_some(stripped_from),
                i,
            );
            demoted += self.forget_outdated(&mut found[..n], i);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
        self.count_hits(hits - demoted, Event::CacheHits);
        self.stats.event(Event::Decapsulated, decapsulated);
        (bytes, hits)
    }

    /// Stages 1 and 2 for the `i`th frame of an underlay burst, in its place in the burst:
    /// decapsulation first unless the frame already lost its outer headers (`stripped`: its
    /// bridge domain and peer, counted as decapsulated already). Returns whether this call
    /// decapsulated it.
    #[inline(never)]
    pub(super) fn forward_underlay_missed(
        &mut self,
        snap: &Snapshot,
        port: &PortEntry,
        mut b: BufId,
        stripped: Option<(u16, u16)>,
        i: usize,
    ) -> u64 {
        self.flush_pending(snap);
        let r = stripped.ok_or(()).or_else(|()| self.decap(snap, &mut b));
        let decapsulated = (stripped.is_none() && r.is_ok()) as u64;
        self.flows.miss_keys[i & (BATCH - 1)] =
            r.ok().and_then(|(bd, peer)| Key::from_peer(peer, bd, self.pool.head(&b)));
        let mut ctx = Ctx::default();
        self.underlay_ctx(snap, &mut b, r, &mut ctx);
        self.forward_ctx(snap, port, b, &ctx, i);
        decapsulated
    }

    /// The second pass of [`Pipeline::forward_underlay_cached`] when every frame hit (and
    /// lost its outer headers in the first): each goes to egress.
    #[inline(never)]
    pub(super) fn forward_hits<const PER_NODE: bool>(
        &mut self,
        snap: &Snapshot,
        batch: &mut Batch,
        found: &[Stripped; BATCH],
    ) {
        let mut run = BdRun::new(NO_BD);
        for i in 0..batch.len() {
            let b = batch.take(i);
            let Stripped { hit, len, .. } = found[i & (BATCH - 1)];
            self.forward_hit::<PER_NODE>(snap, b, hit, &mut run, hit.bd(), len as usize);
        }
        batch.clear_taken();
        self.end_hits(snap, run);
    }
}

/// The first pass of [`Pipeline::forward_underlay_cached`]: each frame of `batch` the
/// decapsulation cache and the EMC both know loses its outer headers and gets its decision
/// in `found`. Returns the burst's bytes and how many frames hit. Its own function, with
/// its inputs as views: the stores to buffer metadata cannot be proved not to touch the
/// pipeline, whose fields would otherwise be read again for every frame, and the loop's
/// registers are then allocated for it alone, not shifted by what the rest of the burst's
/// path (or the pipeline's layout) does. `PAIRED`: a table with many flows
/// ([`EmcView::spread`]), whose decapsulated frames' keys may sit in the other set of their
/// pair ([`Emc::insert`]), looked up there after a miss in their own.
#[inline(never)]
fn strip_hits<const PAIRED: bool>(
    view: PoolView<'_>,
    emc: EmcView<'_>,
    decap_cache: &vtep::DecapCache,
    vtep: &VtepEntry,
    batch: &mut Batch,
    found: &mut [Stripped; BATCH],
) -> (u64, u64) {
    let (mut bytes, mut hits) = (0u64, 0u64);
    for (b, f) in batch.as_mut_slice().iter_mut().zip(found.iter_mut()) {
        let (h, total) = view.head_and_len(b);
        bytes += total as u64;
        // One bounds check for the outer headers and the inner frame's key.
        let Some((outer, inner)) = h
            .first_chunk::<{ vtep::PLAIN_OUTER + emc::KEY_BYTES }>()
            .map(|h| h.split_at(vtep::PLAIN_OUTER))
        else {
            continue;
        };
        // The first frame of a (source, VNI) takes the slow path, which fills the cache.
        let Some(d) = outer.first_chunk().and_then(|o| vtep.classify_plain(o, total, decap_cache))
        else {
            continue;
        };
        let lookup = |k: Key| match PAIRED {
            true => emc.lookup_pair_in(emc.set_of(&k), &k),
            false => emc.lookup(&k),
        };
        if let Some(hit) = Key::from_peer(d.peer, d.bd, inner).and_then(lookup)
            && hit.admits(d.inner_len)
            && d.strip(view, b).is_ok()
        {
            hits += 1;
            *f = Stripped { hit, len: d.inner_len, stripped: 1 };
        }
    }
    (bytes, hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bursts of `port` until the account samples one (it is off the cache).
    fn until_sampled(a: &mut Account, port: u16) -> u32 {
        (1..=4096).find(|_| a.worth(port)).expect("a sampled burst")
    }

    /// Takes `port` off: a burst of nothing but misses, none of them filled or halved.
    fn take_off(a: &mut Account, port: u16) {
        for _ in 0..3 {
            a.note(port, 0, BATCH, 0, 0);
        }
        assert!(a.credit[port as usize] < OFF_BELOW);
    }

    /// `k` samples of `port`, each missing everything while the second level found every
    /// miss.
    fn fail_samples(a: &mut Account, port: u16, k: usize) {
        for _ in 0..k {
            let _ = until_sampled(a, port);
            a.note(port, 0, BATCH, 0, BATCH as u64);
        }
    }

    #[test]
    fn samples_thin_out_while_the_second_level_serves_the_port() {
        let mut a = Account::new();
        take_off(&mut a, 3);
        let mut gaps = vec![];
        for _ in 0..6 {
            gaps.push(until_sampled(&mut a, 3));
            // The sample missed everything, and the halves found every miss.
            a.note(3, 0, BATCH, 0, BATCH as u64);
        }
        assert_eq!(gaps, [64, 128, 256, 512, 1024, 1024]);
    }

    #[test]
    fn a_port_whose_misses_take_the_slow_path_keeps_sampling_often() {
        let mut a = Account::new();
        take_off(&mut a, 3);
        fail_samples(&mut a, 3, 2);
        assert_eq!(until_sampled(&mut a, 3), 256);
        // A sample whose misses the second level did not find: back to the first interval.
        a.note(3, 0, BATCH, 0, 0);
        assert_eq!(until_sampled(&mut a, 3), 64);
        assert_eq!(until_sampled(&mut a, 3), 64);
    }

    #[test]
    fn a_sample_that_earned_without_bringing_the_port_back_restarts_the_interval() {
        let mut a = Account::new();
        take_off(&mut a, 4);
        fail_samples(&mut a, 4, 3);
        assert_eq!(until_sampled(&mut a, 4), 512);
        // A short burst, all hits: +12, not enough to come back from the floor.
        a.note_hits(4, 4);
        assert!(a.credit[4] < OFF_BELOW);
        assert_eq!(until_sampled(&mut a, 4), 64);
    }

    #[test]
    fn a_port_that_came_back_and_left_again_samples_at_the_first_interval() {
        let mut a = Account::new();
        take_off(&mut a, 5);
        fail_samples(&mut a, 5, 3);
        let _ = until_sampled(&mut a, 5);
        a.note_hits(5, BATCH);
        assert!(a.worth(5), "an all-hit sample brings it back");
        take_off(&mut a, 5);
        assert_eq!(until_sampled(&mut a, 5), 64);
        // Other ports keep their own intervals.
        take_off(&mut a, 6);
        assert_eq!(until_sampled(&mut a, 6), 64);
    }
}

//! The control side of one switch: registered ports, stable ids, the published configuration
//! snapshot, the FDB and the counters of every PMD thread.
//!
//! `apply` validates a whole [`SwitchConfig`], builds a new [`Snapshot`] and publishes it
//! RCU-style (an `ArcSwap` plus a generation number PMD threads compare between batches).
//! Learned state is kept for every bridge domain and port the change did not touch; entries
//! of removed or re-numbered bridge domains, removed ports and removed peers are flushed.

use crate::buf::Pool;
use crate::config::SwitchConfig;
use crate::counters::{BdTotals, PortTotals, ThreadStats, Totals};
use crate::fdb::{Dest, Fdb};
use crate::neigh::{NeighborState, Neighbors};
use crate::pipeline::Pipeline;
use crate::port::Port;
use crate::snapshot::MAX_PEERS;
use crate::snapshot::{ConfigError, Ids, Snapshot};
use crate::trace::{FrameTrace, Tracing};
use crate::wire::MacAddr;
use arc_swap::ArcSwap;
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

/// Errors of the switch's control operations.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("a port named {0:?} is already registered")]
    PortExists(String),
    #[error("no port named {0:?} is registered")]
    NoSuchPort(String),
    #[error("port {0:?} is still in the configuration; remove it from the configuration first")]
    PortInUse(String),
    #[error("port {0:?} was opened over another buffer pool than the switch's")]
    ForeignPool(String),
    #[error("a synthetic frame of {0} bytes: between 14 and {max} bytes are traced", max = crate::buf::BUF_SIZE - crate::buf::HEADROOM)]
    FrameSize(usize),
    #[error("no free buffer to hold the frame")]
    NoBuffer,
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Sizing of a switch.
#[derive(Debug, Clone, Copy)]
pub struct SwitchOptions {
    /// Global FDB limit.
    pub fdb_entries: u32,
    /// Entries of each PMD thread's exact-match cache (32 bytes each; 0 turns it off). The
    /// default, 256 Ki entries (8 MiB per thread), keeps 98 % of 100 000 flows (100 000 random
    /// MACs talking both ways) cached in its 2-way sets and their pairs; half of it kept 75 %
    /// of counted MACs before sets had pairs (docs/perf/instructions.md).
    pub emc_entries: usize,
    /// Entries of each half of each PMD thread's second-level cache (32 bytes each; 0 turns
    /// it off): the sources and the destinations of the flows the exact-match cache cannot
    /// hold (`megaflow`). The default, 64 Ki (4 MiB a thread), holds 65,536 MACs a side.
    pub megaflow_entries: usize,
    /// How PMD threads run the pipeline's nodes (fused by default; per node to measure what
    /// fusing saves).
    pub dispatch: crate::pipeline::Dispatch,
}

impl Default for SwitchOptions {
    fn default() -> Self {
        SwitchOptions {
            fdb_entries: 1 << 18,
            emc_entries: 1 << 18,
            megaflow_entries: 1 << 16,
            dispatch: crate::pipeline::Dispatch::Fused,
        }
    }
}

#[derive(Default)]
struct Control {
    ports: BTreeMap<String, Arc<dyn Port>>,
    ids: Ids,
    /// The static FDB entries installed (so an apply touches only those that change).
    statics: HashSet<Static>,
}

/// A static FDB entry: bridge domain, MAC, destination.
type Static = (u16, MacAddr, Dest);

/// Counters of port and bridge-domain ids when their last holder went: ids are reused, and
/// a new port or bridge domain counts from zero.
#[derive(Default)]
struct Baselines {
    ports: BTreeMap<u16, PortTotals>,
    bds: BTreeMap<u16, BdTotals>,
}

pub struct Switch {
    pool: Arc<Pool>,
    fdb: Arc<Fdb>,
    neighbors: Arc<Neighbors>,
    opts: SwitchOptions,
    current: ArcSwap<Snapshot>,
    generation: AtomicU64,
    control: Mutex<Control>,
    threads: Mutex<Vec<Arc<ThreadStats>>>,
    baselines: Mutex<Baselines>,
    tracing: Arc<Tracing>,
    capture: Arc<crate::capture::Capture>,
    /// PMD threads running ([`crate::PmdSet::start`] sets it): ports pinned to another are
    /// refused. 0: none started (a test driving pipelines itself), nothing checked.
    pmd_threads: std::sync::atomic::AtomicUsize,
    /// Queues a rebalance placed ([`crate::pmd::PmdSet::rebalance`]) and its generation.
    moves: ArcSwap<Moves>,
    faults: crate::faults::Faults,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Switch({:?}, {:?})", self.current.load(), self.fdb)
    }
}

impl Switch {
    pub fn new(pool: Arc<Pool>, opts: SwitchOptions) -> Arc<Switch> {
        Arc::new(Switch {
            pool,
            fdb: Arc::new(Fdb::new(opts.fdb_entries)),
            neighbors: Arc::new(Neighbors::new(MAX_PEERS)),
            opts,
            current: ArcSwap::from_pointee(Snapshot::empty()),
            generation: AtomicU64::new(0),
            control: Mutex::new(Control::default()),
            threads: Mutex::new(Vec::new()),
            baselines: Mutex::new(Baselines::default()),
            tracing: Arc::new(Tracing::default()),
            capture: Arc::default(),
            pmd_threads: Default::default(),
            moves: ArcSwap::from_pointee(Moves::default()),
            faults: Default::default(),
        })
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn fdb(&self) -> &Arc<Fdb> {
        &self.fdb
    }

    /// The next-hop table the PMD threads read (written by them, or by a
    /// `kernel_ports::kernel_neigh::KernelNeighbors` (knitter-kernel-ports) in the shared-address mode).
    pub fn neighbor_table(&self) -> &Arc<Neighbors> {
        &self.neighbors
    }

    /// The resolution state of every peer whose next hop the switch resolves: (peer address,
    /// next-hop address, state).
    pub fn neighbors(&self) -> Vec<(IpAddr, IpAddr, NeighborState)> {
        let snap = self.snapshot();
        snap.peers
            .iter()
            .flatten()
            .filter_map(|p| Some((p.ip, p.resolve?, self.neighbors.state(p.id)?)))
            .collect()
    }

    /// Makes a port known by name so a configuration can use it.
    pub fn register_port(&self, name: &str, port: Arc<dyn Port>) -> Result<(), SwitchError> {
        self.check_pool(name, &*port)?;
        let mut c = self.control();
        if c.ports.contains_key(name) {
            return Err(SwitchError::PortExists(name.into()));
        }
        c.ports.insert(name.into(), port);
        self.faults.clear(name);
        Ok(())
    }

    /// Puts `port` in the place of the one registered as `name` (its device opened again),
    /// for the next configuration applied to take; returns the one it replaces, which the
    /// running configuration keeps using until then.
    pub fn replace_port(
        &self,
        name: &str,
        port: Arc<dyn Port>,
    ) -> Result<Arc<dyn Port>, SwitchError> {
        self.check_pool(name, &*port)?;
        let mut c = self.control();
        let slot = c.ports.get_mut(name).ok_or_else(|| SwitchError::NoSuchPort(name.into()))?;
        let old = std::mem::replace(slot, port);
        self.faults.clear(name);
        Ok(old)
    }

    /// Buffer handles are indices into one pool: a port holding another pool would hand the
    /// pipeline indices of chunks it does not own.
    fn check_pool(&self, name: &str, port: &dyn Port) -> Result<(), SwitchError> {
        match port.pool() {
            Some(p) if !Arc::ptr_eq(p, &self.pool) => Err(SwitchError::ForeignPool(name.into())),
            _ => Ok(()),
        }
    }

    /// Forgets a port that no configuration uses any more.
    pub fn unregister_port(&self, name: &str) -> Result<Arc<dyn Port>, SwitchError> {
        let mut c = self.control();
        if self.current.load().config.ports.iter().any(|p| p.name == name) {
            return Err(SwitchError::PortInUse(name.into()));
        }
        let port = c.ports.remove(name).ok_or_else(|| SwitchError::NoSuchPort(name.into()))?;
        self.faults.clear(name);
        Ok(port)
    }

    /// Ports in error after a panic in one of their bursts (see [`crate::faults`]).
    pub fn faults(&self) -> &crate::faults::Faults {
        &self.faults
    }

    /// Puts port `port` of `snap` in error for `why`: no PMD thread polls it again, and its
    /// device stops (until the port is registered again).
    pub fn fail_port(&self, snap: &Snapshot, port: u16, why: String) {
        let Some(pe) = snap.port(port) else { return };
        tracing::error!(port = %pe.name, "{why}; the port is in error until it is added again");
        pe.port.fail(&why);
        self.faults.set(&pe.name, why);
    }

    /// Validates and publishes a configuration; returns its generation. On error nothing
    /// changes.
    pub fn apply(&self, cfg: SwitchConfig) -> Result<u64, ConfigError> {
        // A new pin to a thread that does not run is refused; one the configuration had
        // already (restored after a restart with fewer threads) stays, polled by thread
        // `pmd % threads` (see `pmd::assignment`).
        let threads = self.pmd_threads.load(Acquire);
        let before = self.current.load();
        let kept = |p: &crate::config::PortConfig| {
            before.config.ports.iter().any(|o| o.name == p.name && o.pmd == p.pmd)
        };
        if let Some(p) = cfg
            .ports
            .iter()
            .find(|p| threads > 0 && p.pmd.is_some_and(|t| t as usize >= threads) && !kept(p))
        {
            return Err(ConfigError::NoSuchPmd {
                port: p.name.clone(),
                pmd: p.pmd.unwrap_or_default(),
                threads,
            });
        }
        let mut c = self.control();
        let mut ids = c.ids.clone();
        ids.assign(&cfg)?;
        let generation = self.generation.load(Acquire) + 1;
        let ports = &c.ports;
        let old = self.current.load_full();
        let snap = Snapshot::build(cfg, &ids, &|n| ports.get(n).cloned(), generation, &old)?;
        // Peers taken whole from the old snapshot: the same addresses, ids and next hops.
        let peers_kept = Arc::ptr_eq(&old.peers, &snap.peers);
        let flush = Flush::between(&old, &c.ids, &snap, &ids, peers_kept);
        self.retire_ids(&c.ids, &ids);
        // A peer id whose next hop changed starts its resolution again.
        for id in 0..if peers_kept { 0 } else { old.peers.len().max(snap.peers.len()) as u16 } {
            let resolve = |s: &Snapshot| s.peer(id).and_then(|p| p.resolve);
            if resolve(&old) != resolve(&snap) {
                self.neighbors.reset(id);
            }
        }
        if let Some(id) = self.capture.running()
            && old.port(id).map(|p| &p.name) != snap.port(id).map(|p| &p.name)
        {
            self.capture.port_removed(id);
        }
        // A rebalance's placement is by port id: a port gone (its id may be given to another)
        // loses its.
        let moves = self.moves.load_full();
        let same_port = |id: u16| old.port(id).map(|p| &p.name) == snap.port(id).map(|p| &p.name);
        if moves.placed.keys().any(|&(p, _)| !same_port(p)) {
            let placed = moves
                .placed
                .iter()
                .filter(|((p, _), _)| same_port(*p))
                .map(|(k, v)| (*k, *v))
                .collect();
            self.moves.store(Arc::new(Moves { generation: moves.generation + 1, placed }));
        }
        self.current.store(Arc::new(snap));
        self.generation.store(generation, Release);
        c.ids = ids;
        flush.run(&self.fdb);
        let snap = self.current.load();
        self.sync_static_macs(&mut c, &snap, &flush);
        tracing::info!(generation, "configuration applied");
        Ok(generation)
    }

    /// Makes the FDB's static entries exactly those of the snapshot, touching only those
    /// that changed (or that `flush` just removed with their bridge domain): an apply that
    /// leaves them alone neither walks the FDB nor moves its generation, which would empty
    /// every PMD thread's exact-match cache.
    fn sync_static_macs(&self, c: &mut Control, snap: &Snapshot, flush: &Flush) {
        let mut want = HashSet::new();
        for b in
            snap.config.bridges.iter().filter(|b| !b.static_macs.is_empty() || b.gateway.is_some())
        {
            let Some(&bd) = c.ids.bds.get(&b.name) else { continue };
            for m in &b.pinned() {
                let dest = match (&m.port, &m.remote) {
                    (Some(p), _) => c.ids.ports.get(p).map(|id| Dest::Port(*id)),
                    (_, Some(ip)) => snap.peer_by_ip.get(ip).map(|id| Dest::Peer(*id)),
                    _ => None,
                };
                if let Some(d) = dest {
                    want.insert((bd, m.mac, d));
                }
            }
        }
        c.statics.retain(|(bd, _, _)| !flush.bds.contains(bd));
        let stale: HashSet<Static> = c.statics.difference(&want).copied().collect();
        if !stale.is_empty() {
            self.fdb.remove_where(|e| e.is_static && stale.contains(&(e.bd, e.mac, e.dest)));
            c.statics.retain(|s| !stale.contains(s));
        }
        for (bd, mac, d) in want {
            if c.statics.contains(&(bd, mac, d)) {
                continue;
            }
            if self.fdb.insert_static(bd, mac, d).is_err() {
                tracing::warn!(%mac, bd, "forwarding table full: static MAC not installed");
            } else {
                c.statics.insert((bd, mac, d));
            }
        }
    }

    /// The configuration PMD threads currently read.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    #[inline(always)]
    pub fn generation(&self) -> u64 {
        self.generation.load(Acquire)
    }

    /// A pipeline for one PMD thread (its counters join the switch's totals).
    pub fn pipeline(&self, thread: usize) -> Pipeline {
        let stats = Arc::new(ThreadStats::new());
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).push(stats.clone());
        let mut p = Pipeline::new(
            thread,
            self.pool.clone(),
            self.fdb.clone(),
            stats,
            self.opts.emc_entries,
            self.opts.megaflow_entries,
        );
        p.set_neighbors(self.neighbors.clone());
        p.set_tracing(self.tracing.clone());
        p.set_capture(self.capture.clone());
        p.set_dispatch(self.opts.dispatch);
        p
    }

    /// Traces the next `count` frames received on port `name` (at most
    /// [`crate::trace::MAX_TRACES`]; replaces an earlier request): take them with
    /// [`Switch::traces`].
    pub fn trace(&self, name: &str, count: u32) -> Result<(), SwitchError> {
        let id = self
            .snapshot()
            .port_id(name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_owned()))?;
        self.tracing.arm(id, count);
        Ok(())
    }

    /// Where a rebalance placed queues (PMD threads follow when its generation changes).
    pub fn moves(&self) -> Arc<Moves> {
        self.moves.load_full()
    }

    /// The generation of [`Switch::moves`] (a PMD thread's check each loop: no reference
    /// count written).
    pub fn moves_generation(&self) -> u64 {
        self.moves.load().generation
    }

    pub(crate) fn set_moves(&self, m: Moves) {
        self.moves.store(Arc::new(m));
    }

    /// Tells the switch how many PMD threads poll it (ports may be pinned to one of them).
    pub fn set_pmd_threads(&self, n: usize) {
        self.pmd_threads.store(n, Release);
    }

    /// The packet capture PMD threads serve ([`crate::capture`]).
    pub fn capture(&self) -> &crate::capture::Capture {
        &self.capture
    }

    /// The trace request PMD threads serve (what remains of it, traces lost).
    pub fn tracing(&self) -> &Tracing {
        &self.tracing
    }

    /// The traces finished since the last call, in the order frames were traced.
    pub fn traces(&self) -> Vec<FrameTrace> {
        self.tracing.take()
    }

    /// Runs `frame`, as if received on port `name`, through the current configuration and
    /// FDB without learning or sending anything: what would happen to it.
    pub fn trace_synthetic(&self, name: &str, frame: &[u8]) -> Result<FrameTrace, SwitchError> {
        let snap = self.snapshot();
        let id = snap.port_id(name).ok_or_else(|| SwitchError::NoSuchPort(name.to_owned()))?;
        if frame.len() < crate::wire::ethernet::HEADER_LEN
            || frame.len() > crate::buf::BUF_SIZE - crate::buf::HEADROOM
        {
            return Err(SwitchError::FrameSize(frame.len()));
        }
        // A private pipeline: its counters join no total, it has no cache, and it resolves
        // next hops only from what the PMD threads learned.
        let mut p = Pipeline::new(
            0,
            self.pool.clone(),
            self.fdb.clone(),
            Arc::new(ThreadStats::new()),
            0,
            0,
        );
        p.set_neighbors(self.neighbors.clone());
        p.set_now(crate::util::coarse_secs());
        p.trace_dry(&snap, id, frame).ok_or(SwitchError::NoBuffer)
    }

    /// Records the counters of ids whose name goes (a port or bridge domain removed), so
    /// the next holder of the id counts from zero. Frames the old holder still counts in the
    /// moment before PMD threads adopt the change go to the new one (a burst at most).
    fn retire_ids(&self, old: &Ids, new: &Ids) {
        if Arc::ptr_eq(&old.ports, &new.ports) && Arc::ptr_eq(&old.bds, &new.bds) {
            return;
        }
        let gone_ports: Vec<u16> = old
            .ports
            .iter()
            .filter(|(n, _)| !new.ports.contains_key(*n))
            .map(|(_, id)| *id)
            .collect();
        let gone_bds: Vec<u16> =
            old.bds.iter().filter(|(n, _)| !new.bds.contains_key(*n)).map(|(_, id)| *id).collect();
        if gone_ports.is_empty() && gone_bds.is_empty() {
            return;
        }
        let raw = self.raw_stats();
        let mut b = self.baselines.lock().unwrap_or_else(|e| e.into_inner());
        for id in gone_ports {
            b.ports.insert(id, raw.ports.get(id as usize).cloned().unwrap_or_default());
        }
        for id in gone_bds {
            b.bds.insert(id, raw.bds.get(id as usize).cloned().unwrap_or_default());
        }
    }

    fn raw_stats(&self) -> Totals {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        Totals::sum(threads.iter().map(|t| &**t))
    }

    /// Counters summed over every thread that ever forwarded for this switch; a port or
    /// bridge domain's counters start when it was added (ids are reused).
    pub fn stats(&self) -> Totals {
        let mut t = self.raw_stats();
        let b = self.baselines.lock().unwrap_or_else(|e| e.into_inner());
        for (id, base) in &b.ports {
            if let Some(p) = t.ports.get_mut(*id as usize) {
                *p = p.since(base);
            }
        }
        for (id, base) in &b.bds {
            if let Some(d) = t.bds.get_mut(*id as usize) {
                *d = d.since(base);
            }
        }
        t
    }

    /// Counters of each thread separately, in the order the pipelines were made (PMD thread
    /// `i` is entry `i` when a `PmdSet` made them): busy/idle cycles and packets per PMD,
    /// like `ovs-appctl dpif-netdev/pmd-stats-show`.
    pub fn thread_stats(&self) -> Vec<Totals> {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.iter().map(|t| Totals::sum([&**t])).collect()
    }

    /// Ages out learned MACs older than their bridge domain's age; returns how many.
    pub fn age(&self, now: u32) -> usize {
        let snap = self.snapshot();
        self.fdb.age(now, |bd| snap.bd(bd).map(|b| b.age_secs))
    }

    /// Removes learned entries of one bridge domain (by name); returns how many.
    pub fn flush_bridge(&self, name: &str) -> Option<usize> {
        let bd = self.snapshot().bd_id(name)?;
        Some(self.fdb.remove_where(|e| !e.is_static && e.bd == bd))
    }

    /// Removes learned entries pointing at one port (by name); returns how many.
    pub fn flush_port(&self, name: &str) -> Option<usize> {
        let p = self.snapshot().port_id(name)?;
        Some(self.fdb.remove_where(|e| !e.is_static && e.dest == Dest::Port(p)))
    }
}

/// What a configuration change must remove from the FDB.
struct Flush {
    bds: HashSet<u16>,
    dests: HashSet<Dest>,
}

impl Flush {
    fn between(
        old: &Snapshot,
        old_ids: &Ids,
        new: &Snapshot,
        new_ids: &Ids,
        peers_kept: bool,
    ) -> Flush {
        let mut bds = HashSet::new();
        for (name, id) in old_ids.bds.iter() {
            let before = old.bd(*id);
            let after = new_ids.bds.get(name).and_then(|n| new.bd(*n));
            let same = match (before, after) {
                (Some(a), Some(b)) => a.id == b.id && a.vlan == b.vlan && a.vni == b.vni,
                _ => false,
            };
            if !same {
                bds.insert(*id);
            }
        }
        // Ids handed out now that were not in use before may have stale entries.
        bds.extend(
            new_ids.bds.iter().filter(|(n, _)| !old_ids.bds.contains_key(*n)).map(|(_, id)| *id),
        );
        let mut dests = HashSet::new();
        for (name, id) in old_ids.ports.iter() {
            if new_ids.ports.get(name) != Some(id) {
                dests.insert(Dest::Port(*id));
            }
        }
        dests.extend(
            new_ids
                .ports
                .iter()
                .filter(|(n, _)| !old_ids.ports.contains_key(*n))
                .map(|(_, id)| Dest::Port(*id)),
        );
        if !peers_kept {
            for (ip, id) in old_ids.peers.iter() {
                if new_ids.peers.get(ip) != Some(id) {
                    dests.insert(Dest::Peer(*id));
                }
            }
            dests.extend(
                new_ids
                    .peers
                    .iter()
                    .filter(|(ip, _)| !old_ids.peers.contains_key(*ip))
                    .map(|(_, id)| Dest::Peer(*id)),
            );
        }
        Flush { bds, dests }
    }

    fn run(&self, fdb: &Fdb) {
        // The FDB counts entries per bridge domain and per port: a walk of the whole table
        // (a new port's id is flushed of a former holder's entries) only when one has any.
        let held = |d: &Dest| match d {
            Dest::Port(p) => fdb.port_len(*p) > 0,
            Dest::Peer(_) => true,
        };
        if !self.bds.iter().any(|bd| fdb.bd_len(*bd) > 0) && !self.dests.iter().any(held) {
            return;
        }
        let n = fdb.remove_where(|e| {
            self.bds.contains(&e.bd) || (!e.is_static && self.dests.contains(&e.dest))
        });
        tracing::debug!(removed = n, "FDB entries flushed by configuration change");
    }
}

/// Queues a rebalance placed on a thread ([`crate::pmd::PmdSet::rebalance`]): they stay there (a pinned
/// port's queues excepted) until the next rebalance; queues it did not place are dealt as
/// [`crate::pmd::assignment`] deals them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moves {
    pub generation: u64,
    pub placed: std::collections::BTreeMap<(u16, u16), usize>,
}

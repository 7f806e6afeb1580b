//! NDR, PDR and latency with Knitter's own generator ([`crate::vgen`]), as FD.io CSIT
//! defines them, in one scenario (`scenario.rs`: L2, VXLAN encapsulation or
//! decapsulation): per frame size and switch, the maximum receive rate (offering as fast as
//! the switch takes frames), then the highest offered rate with no loss (NDR) and with at
//! most 0.5 % (PDR), each by binary search over `trial`-second trials, the NDR confirmed
//! once by a `confirm`-second trial. Then latency, at the same absolute load for every
//! switch (half the lowest NDR of the size), plus at 10/50/90 % of each switch's own NDR
//! for its latency-vs-load curve.
//!
//! A switch with its own counters (Knitter, OVS) tells whether it was the bottleneck in the
//! MRR trial (its forwarding thread ≥ 95 % busy); the generator's own ceiling is the
//! yardstick's MRR.
//!
//! Where the host put the generator's and the switch's CPUs (`cpu::round_trip`, as in
//! `mrr`): probed around every alternated round's trial, which is repeated when the CPUs ran
//! farther apart than the run's nearest placement (more than [`crate::mrr::NEAR`] × its
//! fastest round trip), and around each switch's search, which the report marks when it ran
//! apart (a search takes too many trials to repeat whole).

use crate::cpu::{self, Supply};
use crate::frames::FrameSize;
use crate::progress::Progress;
use crate::scenario::Scenario;
use crate::stats::{self, PDR_LOSS};
use crate::sut::{Own, SwitchUnderTest};
use crate::switches::{Kind, Running, Setup};
use crate::testpmd::{Layout, Memory};
use crate::trial::{Generator, Outcome, Wire};
use crate::veth::{Underlay, Veths};
use crate::vgen::Vgen;
use crate::xgen::Xgen;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Config {
    #[serde(default = "l2")]
    pub scenario: Scenario,
    pub switches: Vec<Kind>,
    pub sizes: Vec<FrameSize>,
    pub flows: u16,
    /// Hosts on each side (`--macs`; 0 or 1: the two endpoints A and B), as in `mrr`.
    #[serde(default)]
    pub macs: u32,
    /// Traffic offered after a switch starts, before any trial (`--warmup`): time for a
    /// switch whose caches or flow limits grow to hold many hosts (OVS's datapath starts at
    /// 10,000 flows).
    #[serde(default)]
    pub warmup: Duration,
    /// One search trial.
    pub trial: Duration,
    /// The NDR's confirmation trial (zero: none).
    pub confirm: Duration,
    /// The searches stop when the bounds are this close (relative).
    pub precision: f64,
    /// Rounds of alternated MRR trials before the searches (1: none beyond the searches').
    #[serde(default = "one")]
    pub rounds: usize,
    pub layout: Layout,
    pub memory: Memory,
    #[serde(default)]
    pub baseline: Option<PathBuf>,
    /// What the baseline's config file starts with (`--baseline-toml`).
    #[serde(default)]
    pub baseline_toml: Option<String>,
    /// Knitter's pod ports with port security (MAC and IP), as the CNI makes them.
    #[serde(default)]
    pub port_security: bool,
    /// OVS's extra `other_config` settings (`KNITTER_PERF_OVS_CONFIG`), named in the report.
    #[serde(default)]
    pub ovs_config: Vec<String>,
    #[serde(skip)]
    pub work: PathBuf,
}

fn l2() -> Scenario {
    Scenario::L2
}

fn one() -> usize {
    1
}

/// One trial at an asked rate.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Point {
    /// What the trial asked for and what the generator really offered, frames per second.
    pub asked: f64,
    pub offered: f64,
    pub received: f64,
    pub loss: f64,
    pub seconds: f64,
    /// The generator's longest stall, µs, and the earlier tries of this trial thrown away
    /// because the generator stalled longer than B's ring lasts and frames were lost.
    #[serde(default)]
    pub longest_gap_us: f64,
    /// Bytes per frame received (no FCS).
    #[serde(default)]
    pub frame_bytes: Option<f64>,
    #[serde(default)]
    pub repeated: usize,
}

impl Point {
    fn of(asked: f64, o: &Outcome) -> Point {
        Point {
            asked,
            offered: o.offered_pps(),
            received: o.received_pps(),
            loss: o.loss(),
            seconds: o.seconds,
            longest_gap_us: o.longest_gap_us,
            frame_bytes: o.frame_bytes(),
            repeated: 0,
        }
    }
}

/// Tries a lossy trial again (up to twice) when the generator stalled: a loss caused by
/// the VM taking the generator's CPU away says nothing about the switch.
pub const RETRIES: usize = 2;

/// Frame ages at one offered load, microseconds.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Latency {
    pub load: f64,
    pub loss: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub samples: u64,
    /// The switch's own cycles per packet over the trial (Knitter, OVS): what a switch
    /// costs at the same offered load as the others.
    #[serde(default)]
    pub switch_cycles_per_packet: Option<f64>,
}

impl Latency {
    fn of(load: f64, o: &Outcome) -> Option<Latency> {
        let h = o.latency.as_ref().filter(|h| !h.is_empty())?;
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        Some(Latency {
            load,
            loss: o.loss(),
            p50: us(0.5),
            p90: us(0.9),
            p99: us(0.99),
            p999: us(0.999),
            max: h.max() as f64 / 1e3,
            samples: h.len(),
            switch_cycles_per_packet: None,
        })
    }
}

/// Everything measured for one switch at one size.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Measured {
    pub switch: Kind,
    pub size: FrameSize,
    pub mrr: Point,
    pub switch_cycles_per_packet: Option<f64>,
    pub switch_busy: Option<f64>,
    pub switch_was_bottleneck: Option<bool>,
    pub ndr: Option<f64>,
    pub pdr: Option<f64>,
    pub ndr_confirmed: Option<Point>,
    /// Every search trial, in order.
    pub trials: Vec<Point>,
    /// At the common load (half the size's lowest NDR).
    pub latency: Option<Latency>,
    /// At 10, 50 and 90 % of this switch's own NDR.
    pub latency_curve: Vec<Latency>,
    /// MRR (frames per second received) of each alternated round, in order (`--rounds`);
    /// none for a round whose trial was starved of CPU every time it was tried.
    #[serde(default)]
    pub mrr_rounds: Vec<Option<f64>>,
    /// Round trials repeated because a CPU got less than [`MIN_SUPPLY`] of its time, and
    /// rounds dropped because every try was starved.
    #[serde(default)]
    pub rounds_repeated: usize,
    #[serde(default)]
    pub rounds_dropped: usize,
    /// Every try of every round, in order: what tells a swing's cause (the switch busy or
    /// not, its cycles per packet, the CPU supply).
    #[serde(default)]
    pub round_trials: Vec<RoundTrial>,
    /// A cache line's round trip between the generator's CPU and the switch's, ns, right
    /// before the MRR trial and search and right after them.
    #[serde(default)]
    pub search_round_trip_ns: Option<(f64, f64)>,
}

/// A round's trial is repeated (up to [`RETRIES`] times, then dropped) when the spin probe
/// after it found a CPU given less than this share of its time.
pub const MIN_SUPPLY: f64 = 0.85;
/// The spin probe of each CPU after a round's trial.
const PROBE: Duration = Duration::from_millis(200);
/// About what starting a switch and its generator and warming up takes (the plan's ETA).
const START: Duration = Duration::from_secs(3);

/// About how long a run takes (for the progress bar: its pace corrects it).
pub fn planned(cfg: &Config) -> Duration {
    let t = cfg.trial;
    let n = cfg.switches.len() as u32;
    let start = START + cfg.warmup;
    let rounds = if cfg.rounds > 1 {
        (start + t + 2 * PROBE) * (cfg.rounds as u32 * n)
    } else {
        Duration::ZERO
    };
    let throughput = (start + t + t * search_trials(cfg.precision) + cfg.confirm) * n;
    let latency = (start + t * 4) * n;
    (rounds + throughput + latency) * cfg.sizes.len() as u32
}

/// The trials of the NDR and PDR searches together, at most (both ends, then halvings).
fn search_trials(precision: f64) -> u32 {
    2 * (2 + (0.5 / precision.max(1e-6)).log2().ceil().max(0.0) as u32)
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Results {
    pub config: Config,
    pub measured: Vec<Measured>,
}

/// A switch started and the generator connected to it, warmed up (learning done). Dropped
/// in this order: generator, switch, then the veths (kernel scenario) they were on.
struct Bench {
    generator: Generator,
    running: Running,
    _veths: Option<Veths>,
    _underlay: Option<Underlay>,
}

impl Bench {
    fn start(cfg: &Config, switch: Kind, size: FrameSize) -> anyhow::Result<Bench> {
        let setup = Setup {
            work: &cfg.work,
            memory: cfg.memory,
            layout: cfg.layout,
            baseline: cfg.baseline.as_deref(),
            baseline_toml: cfg.baseline_toml.as_deref(),
            scenario: cfg.scenario,
            port_security: cfg.port_security,
            macs: cfg.macs,
            police: None,
            ovs_config: &cfg.ovs_config,
        };
        let t = cfg.scenario.traffic(switch != Kind::Yardstick, size, cfg.flows, cfg.macs);
        let (mut veths, mut underlay) = (None, None);
        let (wire, running): (Box<dyn Wire>, Running) = if cfg.scenario.is_kernel() {
            let v = veths.insert(Veths::new()?);
            let running = Running::start_veth(switch, &setup, v)?;
            (Box::new(Xgen::open(v, &t)?), running)
        } else {
            let (running, sockets) = if cfg.scenario == Scenario::VxlanTwoVteps {
                Running::start_two_vteps(switch, &setup, underlay.insert(Underlay::new()?))?
            } else {
                Running::start(switch, &setup)?
            };
            let (offer, count) =
                if t.reversed { (&sockets.b, &sockets.a) } else { (&sockets.a, &sockets.b) };
            (Box::new(Vgen::connect(offer, count, &t, cfg.memory == Memory::Hugepages)?), running)
        };
        let mut generator = Generator::new(wire, cfg.layout.generator_cpu);
        // Warm up until frames come through: learning, and in the two-VTEP scenario ARP
        // between the VTEPs (a request lost while the other switch was still opening its
        // underlay is asked again a second later).
        for _ in 0..10 {
            if generator.trial(None, Duration::from_millis(500), false)?.received > 0 {
                break;
            }
        }
        if !cfg.warmup.is_zero() {
            generator.trial(None, cfg.warmup, false)?;
        }
        Ok(Bench { generator, running, _veths: veths, _underlay: underlay })
    }
}

/// Runs every size and switch; `progress` hears about each trial.
pub fn run(cfg: &Config, progress: &Progress) -> anyhow::Result<Results> {
    std::fs::create_dir_all(&cfg.work)?;
    let mut measured = Vec::new();
    let mut placement = Placement::new(cfg);
    for &size in &cfg.sizes {
        let rounds = alternated_mrr(cfg, size, progress, &mut placement)?;
        for (i, &switch) in cfg.switches.iter().enumerate() {
            let before = placement.probe()?;
            let mut m = throughput(cfg, switch, size, progress)?;
            let trips = (before, placement.probe()?);
            m.search_round_trip_ns = Some(trips);
            if placement.apart(trips) {
                progress.line(&format!(
                    "{}@{size}: the search ran with the CPUs {:.0} / {:.0} ns apart (the run's nearest {:.0}): the host moved them; its rates are not comparable",
                    switch.name(),
                    trips.0,
                    trips.1,
                    placement.fastest
                ));
            }
            m.mrr_rounds = rounds.iter().map(|r| r[i].mpps).collect();
            m.rounds_repeated = rounds.iter().map(|r| r[i].tries.len() - 1).sum();
            m.rounds_dropped = rounds.iter().filter(|r| r[i].mpps.is_none()).count();
            m.round_trials = rounds.iter().flat_map(|r| r[i].tries.clone()).collect();
            measured.push(m);
        }
        // The common load: half the lowest NDR among the switches (PDR when one has no NDR).
        let lowest = measured
            .iter()
            .filter(|m| m.size == size)
            .filter_map(|m| m.ndr.or(m.pdr))
            .fold(f64::INFINITY, f64::min);
        for m in measured.iter_mut().filter(|m| m.size == size) {
            let mut b = Bench::start(cfg, m.switch, size)?;
            progress.advance(START);
            let mut at = |load: f64| -> anyhow::Result<Option<Latency>> {
                let before = b.running.own();
                let o = b.generator.trial(Some(load), cfg.trial, true)?;
                progress.advance(cfg.trial);
                let cycles =
                    before.zip(b.running.own()).and_then(|(b, a)| Own::cycles_per_packet(b, a));
                let l = Latency::of(load, &o)
                    .map(|l| Latency { switch_cycles_per_packet: cycles, ..l });
                if let Some(l) = &l {
                    progress.line(&format!("{}@{size}: latency at {:.2} Mpps: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs", m.switch.name(), load / 1e6, l.p50, l.p99, l.max));
                }
                Ok(l)
            };
            if lowest.is_finite() {
                m.latency = at(lowest / 2.0)?;
            }
            if let Some(ndr) = m.ndr.or(m.pdr) {
                for share in [0.1, 0.5, 0.9] {
                    m.latency_curve.extend(at(ndr * share)?);
                }
            }
        }
    }
    Ok(Results { config: cfg.clone(), measured })
}

/// One try of one switch in one round.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RoundTrial {
    pub round: usize,
    /// Frames per second received.
    pub received: f64,
    pub switch_busy: Option<f64>,
    pub switch_cycles_per_packet: Option<f64>,
    /// The generator's longest stall in the trial, µs.
    pub longest_gap_us: f64,
    /// Bytes per frame received (no FCS) and completions naming no descriptor: a rate
    /// that swings with frames of the wrong size, or with bogus completions, is not a rate.
    #[serde(default)]
    pub frame_bytes: Option<f64>,
    #[serde(default)]
    pub bad_completions: u64,
    /// The CPU given the least of its time in the probe right after.
    pub supply: Supply,
    /// The CPUs' round trip, ns, right before the trial and right after it.
    #[serde(default)]
    pub round_trip_ns: Option<(f64, f64)>,
    /// Kept for the headline (false: repeated or, after the last try, dropped).
    pub kept: bool,
    /// The CPUs ran farther apart than the run's nearest placement: repeated, or kept (and
    /// so marked) when every try was.
    #[serde(default)]
    pub apart: bool,
}

/// The run's nearest placement of the generator's and the switch's CPUs so far: the
/// fastest round trip probed.
struct Placement {
    pair: (usize, usize),
    fastest: f64,
}

impl Placement {
    fn new(cfg: &Config) -> Placement {
        Placement {
            pair: (cfg.layout.generator_cpu, cfg.layout.switch_cpu),
            fastest: f64::INFINITY,
        }
    }

    /// Probes the round trip now (50 ms), keeping the fastest.
    fn probe(&mut self) -> anyhow::Result<f64> {
        let ns = cpu::round_trip(self.pair.0, self.pair.1, Duration::from_millis(50))?;
        self.fastest = self.fastest.min(ns);
        Ok(ns)
    }

    /// Whether a trial probed `before` and `after` ran apart.
    fn apart(&self, (before, after): (f64, f64)) -> bool {
        before.max(after) > crate::mrr::NEAR * self.fastest
    }
}

/// One switch in one round: the rate kept (none when every try was starved) and its tries.
struct Round {
    mpps: Option<f64>,
    tries: Vec<RoundTrial>,
}

/// The headline comparison: `cfg.rounds` rounds of one MRR trial per switch, the switches
/// alternated within each round (this VM's CPU supply swings over minutes), each switch
/// started afresh, each trial checked for the CPU it got (the spin probe of `cpu.rs` on
/// both CPUs right after it) and repeated or dropped when starved. Per round, every
/// switch's trial (none when `rounds` is 1).
fn alternated_mrr(
    cfg: &Config,
    size: FrameSize,
    progress: &Progress,
    placement: &mut Placement,
) -> anyhow::Result<Vec<Vec<Round>>> {
    if cfg.rounds <= 1 {
        return Ok(Vec::new());
    }
    let mut rounds = Vec::with_capacity(cfg.rounds);
    for round in 0..cfg.rounds {
        let mut r = Vec::with_capacity(cfg.switches.len());
        for &switch in &cfg.switches {
            let mut tries = Vec::new();
            let mpps = loop {
                let near_before = placement.probe()?;
                let mut b = Bench::start(cfg, switch, size)?;
                let before = b.running.own();
                let o = b.generator.trial(None, cfg.trial, false)?;
                let own = before.zip(b.running.own());
                drop(b);
                let supply = lowest_supply(cfg)?;
                let trips = (near_before, placement.probe()?);
                progress.advance(START + cfg.trial + 2 * PROBE);
                let starved = supply.fraction < MIN_SUPPLY;
                let apart = !starved && placement.apart(trips);
                let t = RoundTrial {
                    round,
                    received: o.received_pps(),
                    switch_busy: own.and_then(|(b, a)| Own::busy_fraction(b, a)),
                    switch_cycles_per_packet: own.and_then(|(b, a)| Own::cycles_per_packet(b, a)),
                    longest_gap_us: o.longest_gap_us,
                    frame_bytes: o.frame_bytes(),
                    bad_completions: o.bad_completions,
                    supply,
                    round_trip_ns: Some(trips),
                    kept: !starved && !apart,
                    apart,
                };
                progress.line(&format!(
                    "round {round} {}@{size}: MRR {:.2} Mpps{}{}",
                    switch.name(),
                    t.received / 1e6,
                    t.switch_cycles_per_packet
                        .zip(t.switch_busy)
                        .map(|(c, b)| format!(", {c:.0} cycles/packet, {:.0} % busy", b * 100.0))
                        .unwrap_or_default(),
                    if starved {
                        format!(
                            " — CPU {} got {:.0} % of its time",
                            supply.cpu,
                            supply.fraction * 100.0
                        )
                    } else if apart {
                        format!(
                            " — the CPUs {:.0} / {:.0} ns apart (the run's nearest {:.0}): repeating",
                            trips.0, trips.1, placement.fastest
                        )
                    } else {
                        String::new()
                    }
                ));
                tries.push(t);
                if !starved && !apart {
                    break Some(o.received_pps());
                }
                if tries.len() > RETRIES {
                    // Apart every time (the host keeps them apart for minutes): the last
                    // try is kept, marked; a round starved every time is dropped.
                    if let Some(t) = tries.last_mut().filter(|t| t.apart) {
                        t.kept = true;
                        break Some(t.received);
                    }
                    progress.line(&format!(
                        "round {round} {}@{size}: dropped, starved {} times",
                        switch.name(),
                        RETRIES + 1
                    ));
                    break None;
                }
            };
            r.push(Round { mpps, tries });
        }
        rounds.push(r);
    }
    Ok(rounds)
}

/// The CPU of the layout given the least of its time, probed now.
fn lowest_supply(cfg: &Config) -> anyhow::Result<Supply> {
    let mut lowest: Option<Supply> = None;
    for c in [cfg.layout.generator_cpu, cfg.layout.switch_cpu] {
        let s = cpu::probe(c, PROBE)?;
        if lowest.is_none_or(|l| s.fraction < l.fraction) {
            lowest = Some(s);
        }
    }
    lowest.ok_or_else(|| anyhow::anyhow!("no CPU to probe"))
}

/// MRR, NDR, PDR and the NDR's confirmation for one switch at one size.
fn throughput(
    cfg: &Config,
    switch: Kind,
    size: FrameSize,
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let mut b = Bench::start(cfg, switch, size)?;
    let before = b.running.own();
    let o = b.generator.trial(None, cfg.trial, false)?;
    let after = b.running.own();
    progress.advance(START + cfg.trial);
    anyhow::ensure!(o.received > 0, "{} forwarded nothing at {size} bytes", switch.name());
    let mrr = Point::of(0.0, &o); // asked 0: as fast as the switch takes them
    let own = before.zip(after);
    let busy = own.and_then(|(b, a)| Own::busy_fraction(b, a));
    progress.line(&format!(
        "{}@{size}: MRR {:.2} Mpps{}",
        switch.name(),
        mrr.received / 1e6,
        busy.map(|b| format!(" (switch {:.0} % busy)", b * 100.0)).unwrap_or_default()
    ));
    let mut trials = Vec::new();
    let name = switch.name();
    let mut trial = |rate: f64| -> anyhow::Result<stats::Trial> {
        let mut repeated = 0;
        let o = loop {
            let o = b.generator.trial(Some(rate), cfg.trial, false)?;
            progress.advance(cfg.trial);
            if o.sent == o.received || !o.starved() || repeated == RETRIES {
                break o;
            }
            progress.line(&format!(
                "{name}@{size}: generator stalled {:.0} µs with loss — repeating",
                o.longest_gap_us
            ));
            repeated += 1;
        };
        let p = Point { repeated, ..Point::of(rate, &o) };
        progress.line(&format!(
            "{name}@{size}: {:.3} Mpps asked, {:.3} offered, loss {:.4} % (generator's longest stall {:.0} µs)",
            rate / 1e6,
            p.offered / 1e6,
            p.loss * 100.0,
            p.longest_gap_us
        ));
        trials.push(p);
        Ok(stats::Trial { offered: p.offered, received: p.received })
    };
    let top = mrr.received;
    let find = |lo: f64,
                loss: f64,
                trial: &mut dyn FnMut(f64) -> anyhow::Result<stats::Trial>|
     -> anyhow::Result<Option<f64>> {
        match stats::search(lo, top, cfg.precision, loss, &mut *trial)? {
            Some(r) => Ok(Some(r)),
            None if lo > top * 0.02 => stats::search(top * 0.01, lo, cfg.precision, loss, trial),
            None => Ok(None),
        }
    };
    let ndr = find(top * 0.5, 0.0, &mut trial)?;
    let pdr = find(ndr.unwrap_or(top * 0.5), PDR_LOSS, &mut trial)?;
    let ndr_confirmed = match ndr {
        Some(r) if !cfg.confirm.is_zero() => {
            let o = b.generator.trial(Some(r), cfg.confirm, false)?;
            progress.advance(cfg.confirm);
            let p = Point::of(r, &o);
            progress.line(&format!(
                "{name}@{size}: NDR {:.3} Mpps confirmed over {:.0} s: loss {:.4} %",
                r / 1e6,
                p.seconds,
                p.loss * 100.0
            ));
            Some(p)
        }
        _ => None,
    };
    Ok(Measured {
        switch,
        size,
        mrr,
        switch_cycles_per_packet: own.and_then(|(b, a)| Own::cycles_per_packet(b, a)),
        switch_busy: busy,
        switch_was_bottleneck: busy.map(|b| b >= 0.95),
        ndr,
        pdr,
        ndr_confirmed,
        trials,
        latency: None,
        latency_curve: Vec::new(),
        mrr_rounds: Vec::new(),
        rounds_repeated: 0,
        rounds_dropped: 0,
        round_trials: Vec::new(),
        search_round_trip_ns: None,
    })
}

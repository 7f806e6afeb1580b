//! The headline comparison: the maximum receive rate (MRR) of each switch, offered more
//! than it can forward, the switches alternated A/B/A/B in one time window, each trial
//! checked for the CPU it really got (repeated when starved) and, where the switch reports
//! its own counters, for whether the switch was the bottleneck (its PMD ≥ 95 % busy).

use crate::cpu::{self, Supply};
use crate::frames::{self, A, B, FrameSize};
use crate::progress::Progress;
use crate::scenario::Scenario;
use crate::stats::{self, Summary};
use crate::sut::{Own, SwitchUnderTest};
use crate::switches::{Kind, Running, Setup};
use crate::testpmd::{Generator, Layout, Memory, Rates, Vnf, Wiring};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Config {
    pub switches: Vec<Kind>,
    /// Frame sizes on the wire (FCS counted).
    pub sizes: Vec<FrameSize>,
    pub flows: u16,
    /// Hosts on each side (`--macs`; 0 or 1: the two endpoints A and B): host `j` behind A
    /// sends to host `j` behind B, each with a MAC of its own.
    #[serde(default)]
    pub macs: u32,
    /// Rounds of every switch at every size.
    pub pairs: usize,
    pub warmup: Duration,
    pub window: Duration,
    pub layout: Layout,
    pub memory: Memory,
    /// A trial whose CPUs got less than this share of their time is repeated.
    pub min_supply: f64,
    pub retries: usize,
    /// The knitter-vswitchd binary the `baseline` switch runs.
    #[serde(default)]
    pub baseline: Option<PathBuf>,
    /// What the baseline's config file starts with (`--baseline-toml`).
    #[serde(default)]
    pub baseline_toml: Option<String>,
    /// Knitter's pod ports with port security (MAC and IP), as the CNI makes them.
    #[serde(default)]
    pub port_security: bool,
    /// What is measured: L2, VLAN or VXLAN between the switch's two vhost-user sockets.
    #[serde(default = "l2")]
    pub scenario: Scenario,
    /// How the VNF sets up its virtqueues (queue pairs, ring size).
    #[serde(default)]
    pub vnf: Vnf,
    /// A policer on Knitter's offering pod port (`--police`).
    #[serde(default)]
    pub police: Option<String>,
    /// OVS's extra `other_config` settings (`KNITTER_PERF_OVS_CONFIG`), named in the report.
    #[serde(default)]
    pub ovs_config: Vec<String>,
    #[serde(skip)]
    pub work: PathBuf,
}

fn l2() -> Scenario {
    Scenario::L2
}

/// One trial.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Sample {
    pub switch: Kind,
    pub size: FrameSize,
    pub round: usize,
    pub offered_mpps: f64,
    pub received_mpps: f64,
    /// Bytes per frame received (no FCS), when the generator tells.
    #[serde(default)]
    pub received_frame_bytes: Option<f64>,
    /// The switch's own view of the window, when it has an API.
    pub switch_cycles_per_packet: Option<f64>,
    pub switch_busy: Option<f64>,
    pub switch_drops: Option<u64>,
    /// Frames the switch flooded in the window (Knitter): a steady trial floods none.
    #[serde(default)]
    pub switch_flooded: Option<u64>,
    /// `None` when unknown (the switch has no counters to tell).
    pub switch_was_bottleneck: Option<bool>,
    /// What the switch cost the VNF (the generator: DPDK's net_virtio_user) over the window.
    #[serde(default)]
    pub vnf: crate::testpmd::VnfCost,
    /// The CPU supply measured right after the trial, per CPU of the layout.
    pub supply: Vec<Supply>,
    /// A cache line's round trip between the generator's CPU and the switch's, ns, right
    /// before the trial and right after it: where the host had put the two vCPUs
    /// (`cpu::round_trip`).
    #[serde(default)]
    pub round_trip_ns: Option<(f64, f64)>,
    /// The rate received in each half of the window, Mpps: a placement that changed during
    /// the window and back shows as halves apart.
    #[serde(default)]
    pub halves_mpps: Option<(f64, f64)>,
    /// How fast the generator's CPU and the switch's ran a fixed piece of work right before
    /// the trial's processes started ([`cpu::speed`]): a core slowed by its host (its other
    /// hyperthread, its clock, the memory's other tenants) shows there.
    #[serde(default)]
    pub speed: Vec<cpu::Speed>,
    /// Earlier attempts of this trial thrown away: the machine starved it, or it was not
    /// settled ([`settled`]).
    pub repeated: usize,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SwitchSummary {
    pub switch: Kind,
    pub mpps: Summary,
    /// Per-round ratio to the yardstick (rounds share the machine's state of the moment).
    pub vs_yardstick: Option<Summary>,
    /// Per-round ratio to Open vSwitch with DPDK, when it ran.
    pub vs_ovs: Option<Summary>,
    pub cycles_per_packet: Option<Summary>,
    /// What the switch cost the VNF: its cycles per packet and write system calls a second.
    #[serde(default)]
    pub vnf_cycles_per_packet: Option<Summary>,
    #[serde(default)]
    pub vnf_writes_per_s: Option<Summary>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SizeSummary {
    pub size: FrameSize,
    pub switches: Vec<SwitchSummary>,
    /// Trials left out of the summary as not settled ([`settled`]: the CPUs farther apart
    /// than in the run's nearest placement, or moved during the window), while every switch
    /// had a settled trial at this size.
    #[serde(default)]
    pub far_trials: usize,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Results {
    pub config: Config,
    pub samples: Vec<Sample>,
    pub summary: Vec<SizeSummary>,
    /// The fastest round trip between the two CPUs the run saw (thrown-away attempts and,
    /// in a sweep, every ring size's trials included): what "near" is measured against.
    #[serde(default)]
    pub fastest_round_trip_ns: Option<f64>,
}

impl Results {
    /// One switch's summary at one frame size.
    pub fn switch_at(&self, size: FrameSize, k: Kind) -> Option<&SwitchSummary> {
        self.summary.iter().find(|s| s.size == size)?.switches.iter().find(|w| w.switch == k)
    }

    /// The run's fastest round trip: as recorded, or (older results) its samples' fastest.
    pub fn fastest(&self) -> f64 {
        self.fastest_round_trip_ns.unwrap_or_else(|| fastest_of(&self.samples))
    }
}

/// The fastest round trip of `samples`' probes (infinite when none was probed).
pub fn fastest_of(samples: &[Sample]) -> f64 {
    samples
        .iter()
        .filter_map(|s| s.round_trip_ns)
        .map(|(b, a)| b.min(a))
        .fold(f64::INFINITY, f64::min)
}

/// About what one trial takes beyond its warm-up and window: starting the switch and
/// testpmd, the supply probe.
const SETUP: Duration = Duration::from_secs(3);

/// About how long a run takes, retries aside (for the progress bar: its pace corrects it).
pub fn planned(cfg: &Config) -> Duration {
    trial_time(cfg) * (cfg.pairs * cfg.sizes.len() * cfg.switches.len()) as u32
}

fn trial_time(cfg: &Config) -> Duration {
    SETUP + cfg.warmup + cfg.window
}

/// A trial is in the run's nearest placement when both its round trips are within this
/// factor of the fastest seen in the run (here ~50 ns near, ~330 ns far).
pub const NEAR: f64 = 1.6;

/// Runs every round; `progress` hears about each trial.
pub fn run(cfg: &Config, progress: &Progress) -> anyhow::Result<Results> {
    prepare(cfg)?;
    let mut samples = Vec::new();
    let mut fastest = f64::INFINITY;
    for round in 0..cfg.pairs {
        run_round(cfg, round, progress, &mut fastest, &mut samples)?;
    }
    let summary = summarize(cfg, &samples, fastest);
    let fastest_round_trip_ns = fastest.is_finite().then_some(fastest);
    Ok(Results { config: cfg.clone(), samples, summary, fastest_round_trip_ns })
}

/// Runs every round over several VNF set-ups (`vnfs`, ring sizes say), each round going
/// through all of them in turn, so that the machine's drift over the run falls on every
/// set-up alike: one [`Results`] a set-up, in their order.
pub fn run_each(cfg: &Config, vnfs: &[Vnf], progress: &Progress) -> anyhow::Result<Vec<Results>> {
    prepare(cfg)?;
    let cfgs: Vec<Config> = vnfs.iter().map(|v| Config { vnf: v.clone(), ..cfg.clone() }).collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cfgs.len()];
    let mut fastest = f64::INFINITY;
    for round in 0..cfg.pairs {
        for (c, mine) in cfgs.iter().zip(&mut samples) {
            progress.line(&format!("round {round}: the VNF with {}", c.vnf.describe()));
            run_round(c, round, progress, &mut fastest, mine)?;
        }
    }
    Ok(cfgs
        .into_iter()
        .zip(samples)
        .map(|(config, samples)| {
            let summary = summarize(&config, &samples, fastest);
            let fastest_round_trip_ns = fastest.is_finite().then_some(fastest);
            Results { config, samples, summary, fastest_round_trip_ns }
        })
        .collect())
}

/// The run's pcap files.
fn prepare(cfg: &Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cfg.work)?;
    anyhow::ensure!(
        cfg.scenario.on_two_vhost_user_sockets(),
        "mrr measures vhost-user scenarios (l2, vlan-*, vxlan-*), not {}: run ndr",
        cfg.scenario.name()
    );
    for &size in &cfg.sizes {
        for switching in [true, false] {
            let t = cfg.scenario.traffic(switching, size, cfg.flows, cfg.macs);
            let (offer, back) = pcaps(cfg, size, switching);
            frames::write_pcap(&offer, &t.offered)?;
            frames::write_pcap(&back, &t.back)?;
        }
    }
    Ok(())
}

/// What a report says of the frames' flows and hosts.
pub fn flows_text(flows: u16, macs: u32) -> String {
    match macs {
        0 | 1 => format!("{flows} flow(s)"),
        n => format!(
            "{flows} flow(s) over {n} hosts a side (a random MAC each, host j to host j in turn; \
             every destination speaks first)"
        ),
    }
}

/// Round `round`: every switch at every size, appended to `samples`. `fastest` is the run's
/// fastest round trip between the two CPUs so far: a trial the host ran farther apart is
/// repeated, as a starved one is.
fn run_round(
    cfg: &Config,
    round: usize,
    progress: &Progress,
    fastest: &mut f64,
    samples: &mut Vec<Sample>,
) -> anyhow::Result<()> {
    for &size in &cfg.sizes {
        for &switch in &cfg.switches {
            let mut repeated = 0;
            // Every unfit attempt: when retries run out, the fittest is kept (settled counts
            // before its CPU supply).
            let mut tries: Vec<(u8, Sample)> = Vec::new();
            let sample = loop {
                let s = trial(cfg, switch, size, round, repeated)?;
                progress.advance(trial_time(cfg));
                let starved = s.supply.iter().any(|c| c.fraction < cfg.min_supply);
                if let Some((b, a)) = s.round_trip_ns {
                    *fastest = fastest.min(b).min(a);
                }
                let far = !settled(&s, *fastest);
                if !(starved || far) {
                    break s;
                }
                let fitness = 2 * u8::from(!far) + u8::from(!starved);
                tries.push((fitness, s.clone()));
                if repeated >= cfg.retries {
                    // The fittest, the latest of equals.
                    let best = (0..tries.len()).max_by_key(|&i| (tries[i].0, i)).unwrap_or(0);
                    let mut kept = tries.swap_remove(best).1;
                    kept.repeated = repeated;
                    break kept;
                }
                progress.line(&if starved {
                    format!(
                        "round {round} {}@{size}: CPU supply {:.0} % — repeating",
                        switch.name(),
                        min_supply(&s) * 100.0
                    )
                } else {
                    let (b, a) = s.round_trip_ns.unwrap_or_default();
                    let (x, y) = s.halves_mpps.unwrap_or_default();
                    format!(
                        "round {round} {}@{size}: the CPUs {b:.0} / {a:.0} ns apart (the run's \
                         nearest {fastest:.0}), {x:.2} / {y:.2} Mpps in the window's halves: \
                         the host moved them — repeating",
                        switch.name(),
                    )
                });
                repeated += 1;
            };
            progress.line(&format!(
                "round {round} {}@{size}: {:.2} Mpps received of {:.2} offered{}",
                switch.name(),
                sample.received_mpps,
                sample.offered_mpps,
                sample
                    .switch_cycles_per_packet
                    .map(|c| format!(", {c:.0} cycles/packet"))
                    .unwrap_or_default()
            ));
            samples.push(sample);
        }
    }
    Ok(())
}

/// The frames offered (replayed forever) and the learning frame the counting side sends
/// once, for a switch (`switching`) or for the yardstick.
fn pcaps(cfg: &Config, size: FrameSize, switching: bool) -> (PathBuf, PathBuf) {
    let kind = if switching { "switch" } else { "plain" };
    (
        cfg.work.join(format!("offer-{size}-{kind}.pcap")),
        cfg.work.join(format!("back-{size}-{kind}.pcap")),
    )
}

/// Which of `samples` at `size` a summary counts: each of the two checks of [`settled`]
/// leaves trials out only while every switch has a trial that passes it (a switch never
/// steady within [`STEADY`] keeps the round-trip check working for the others).
pub fn counted_at<'a>(
    cfg: &'a Config,
    samples: &'a [Sample],
    size: FrameSize,
    fastest: f64,
) -> impl Fn(&Sample) -> bool + 'a {
    let every = |check: &dyn Fn(&Sample) -> bool| {
        cfg.switches
            .iter()
            .all(|&k| samples.iter().any(|s| s.size == size && s.switch == k && check(s)))
    };
    let by_round_trip = every(&|s| near(s, fastest));
    let by_halves = every(&steady);
    move |s: &Sample| (!by_round_trip || near(s, fastest)) && (!by_halves || steady(s))
}

/// The halves of a trial's window whose rates are further apart than this ran in
/// different placements (or the machine changed otherwise): the trial is repeated.
pub const STEADY: f64 = 1.2;

/// Whether `s` ran with the two CPUs as near as the run's `fastest` round trip (within
/// [`NEAR`]) before and after it, and at one rate throughout (its window's halves within
/// [`STEADY`] of each other): a change of placement during the window and back is seen only
/// there. A trial without the probes counts as settled.
pub fn settled(s: &Sample, fastest: f64) -> bool {
    near(s, fastest) && steady(s)
}

/// Whether both round trips of `s` were within [`NEAR`] of the run's `fastest`.
fn near(s: &Sample, fastest: f64) -> bool {
    s.round_trip_ns.is_none_or(|(b, a)| b.max(a) <= NEAR * fastest)
}

/// Whether the two halves of the window of `s` ran within [`STEADY`] of each other.
fn steady(s: &Sample) -> bool {
    s.halves_mpps.is_none_or(|(x, y)| x.max(y) <= STEADY * x.min(y))
}

fn min_supply(s: &Sample) -> f64 {
    s.supply.iter().map(|c| c.fraction).fold(1.0, f64::min)
}

fn trial(
    cfg: &Config,
    switch: Kind,
    size: FrameSize,
    round: usize,
    repeated: usize,
) -> anyhow::Result<Sample> {
    let setup = Setup {
        work: &cfg.work,
        memory: cfg.memory,
        layout: cfg.layout,
        baseline: cfg.baseline.as_deref(),
        baseline_toml: cfg.baseline_toml.as_deref(),
        scenario: cfg.scenario,
        port_security: cfg.port_security,
        police: cfg.police.as_deref(),
        macs: cfg.macs,
        ovs_config: &cfg.ovs_config,
    };
    let pair = (cfg.layout.generator_cpu, cfg.layout.switch_cpu);
    let apart = || cpu::round_trip(pair.0, pair.1, Duration::from_millis(50));
    let before = apart()?;
    let speed = [pair.0, pair.1]
        .iter()
        .map(|&c| cpu::speed(c, Duration::from_millis(30)))
        .collect::<Result<Vec<_>, _>>()?;
    let (running, sockets) = Running::start(switch, &setup)?;
    let tag = format!("{}-{size}-q{}-{round}-{repeated}", switch.name(), cfg.vnf.ring);
    let switching = switch != Kind::Yardstick;
    let (offer_pcap, back_pcap) = pcaps(cfg, size, switching);
    // As many as `prepare` wrote into the two pcaps. Decapsulation and tag popping are
    // offered on the second socket (the underlay, the trunk) and counted on the pod's.
    let (frames_offered, frames_back, reversed) = {
        let t = cfg.scenario.traffic(switching, size, cfg.flows, cfg.macs);
        (t.offered.len(), t.back.len(), t.reversed)
    };
    let (offer_sock, count_sock) =
        if reversed { (&sockets.b, &sockets.a) } else { (&sockets.a, &sockets.b) };
    let wiring = Wiring {
        offer_sock,
        count_sock,
        offer_pcap: &offer_pcap,
        back_pcap: &back_pcap,
        offer_mac: &A.mac_text(),
        count_mac: &B.mac_text(),
        offered_frames: frames_offered,
        back_frames: frames_back,
    };
    let mut generator =
        Generator::start(&cfg.work, &tag, &wiring, cfg.memory, cfg.layout, cfg.vnf.clone())?;
    std::thread::sleep(cfg.warmup);
    let own_before = running.own();
    generator.clear();
    // testpmd's rates are since its previous report: one for each half of the window.
    std::thread::sleep(cfg.window / 2);
    let first = generator.read()?;
    std::thread::sleep(cfg.window - cfg.window / 2);
    let after = running.own();
    let second = generator.read()?;
    let rates = Rates {
        offered: (first.offered + second.offered) / 2.0,
        received: (first.received + second.received) / 2.0,
        received_frame_bytes: second.received_frame_bytes.or(first.received_frame_bytes),
    };
    let vnf = generator.cost();
    drop(generator);
    drop(running);
    let supply = [cfg.layout.generator_cpu, cfg.layout.switch_cpu]
        .iter()
        .map(|&c| cpu::probe(c, Duration::from_millis(200)))
        .collect::<Result<Vec<_>, _>>()?;
    let round_trip_ns = Some((before, apart()?));
    let own = own_before.zip(after);
    let busy = own.and_then(|(b, a)| Own::busy_fraction(b, a));
    Ok(Sample {
        switch,
        size,
        round,
        offered_mpps: rates.offered / 1e6,
        received_mpps: rates.received / 1e6,
        received_frame_bytes: rates.received_frame_bytes,
        vnf,
        switch_cycles_per_packet: own.and_then(|(b, a)| Own::cycles_per_packet(b, a)),
        switch_busy: busy,
        switch_drops: own.map(|(b, a)| a.drops.saturating_sub(b.drops)),
        switch_flooded: own.and_then(|(b, a)| Some(a.flooded?.saturating_sub(b.flooded?))),
        switch_was_bottleneck: busy.map(|b| b >= 0.95),
        supply,
        round_trip_ns,
        halves_mpps: Some((first.received / 1e6, second.received / 1e6)),
        speed,
        repeated,
    })
}

/// The per-size summaries of `samples` (`fastest`: the run's fastest round trip between the
/// two CPUs): of the trials in the run's nearest placement of the two CPUs when every switch has one at that size (a rate measured with the CPUs apart is
/// another machine's: ratios across placements mislead), of all of them otherwise.
pub fn summarize(cfg: &Config, samples: &[Sample], fastest: f64) -> Vec<SizeSummary> {
    cfg.sizes
        .iter()
        .map(|&size| {
            let counted = counted_at(cfg, samples, size, fastest);
            let far_trials =
                samples.iter().filter(|s| s.size == size).filter(|s| !counted(s)).count();
            let of = |k: Kind| -> Vec<&Sample> {
                samples.iter().filter(|s| s.size == size && s.switch == k).collect()
            };
            // Far trials keep their place (NaN): ratios pair trials of one round.
            let rates = |k: Kind| -> Vec<f64> {
                of(k).iter().map(|s| if counted(s) { s.received_mpps } else { f64::NAN }).collect()
            };
            let (yard, ovs) = (rates(Kind::Yardstick), rates(Kind::Ovs));
            let switches = cfg
                .switches
                .iter()
                .filter_map(|&k| {
                    let mpps = rates(k);
                    let mine: Vec<&Sample> = of(k).into_iter().filter(|s| counted(s)).collect();
                    let cycles: Vec<f64> =
                        mine.iter().filter_map(|s| s.switch_cycles_per_packet).collect();
                    Some(SwitchSummary {
                        switch: k,
                        mpps: stats::summarize(&mpps)?,
                        vs_yardstick: if k == Kind::Yardstick || yard.is_empty() {
                            None
                        } else {
                            stats::pair_ratios(&mpps, &yard)
                        },
                        vs_ovs: if k == Kind::Ovs || ovs.is_empty() {
                            None
                        } else {
                            stats::pair_ratios(&mpps, &ovs)
                        },
                        cycles_per_packet: stats::summarize(&cycles),
                        vnf_cycles_per_packet: stats::summarize(
                            &mine
                                .iter()
                                .filter_map(|s| s.vnf.cycles_per_packet)
                                .collect::<Vec<_>>(),
                        ),
                        vnf_writes_per_s: stats::summarize(
                            &mine.iter().filter_map(|s| s.vnf.writes_per_s).collect::<Vec<_>>(),
                        ),
                    })
                })
                .collect();
            SizeSummary { size, switches, far_trials }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            switches: vec![Kind::Knitter, Kind::Ovs],
            sizes: vec![FrameSize::Bytes(64)],
            flows: 1,
            macs: 0,
            pairs: 2,
            warmup: Duration::ZERO,
            window: Duration::ZERO,
            layout: Layout { generator_cpu: 0, switch_cpu: 1, second_switch_cpu: None },
            memory: Memory::Plain,
            min_supply: 0.85,
            retries: 2,
            baseline: None,
            baseline_toml: None,
            port_security: true,
            scenario: Scenario::L2,
            vnf: Vnf::default(),
            police: None,
            ovs_config: Vec::new(),
            work: PathBuf::new(),
        }
    }

    fn sample(switch: Kind, round: usize, mpps: f64, apart_ns: f64) -> Sample {
        Sample {
            switch,
            size: FrameSize::Bytes(64),
            round,
            offered_mpps: mpps,
            received_mpps: mpps,
            received_frame_bytes: None,
            switch_cycles_per_packet: None,
            switch_busy: None,
            switch_drops: None,
            switch_flooded: None,
            switch_was_bottleneck: None,
            vnf: Default::default(),
            supply: vec![],
            round_trip_ns: Some((apart_ns, apart_ns)),
            halves_mpps: Some((mpps, mpps)),
            speed: vec![],
            repeated: 0,
        }
    }

    #[test]
    fn trials_with_the_cpus_apart_are_left_out_while_each_switch_has_a_near_one() {
        // Round 1 ran with the CPUs apart for Knitter only: its ratio pairs nothing.
        let samples = [
            sample(Kind::Knitter, 0, 16.0, 50.0),
            sample(Kind::Ovs, 0, 10.0, 55.0),
            sample(Kind::Knitter, 1, 8.0, 330.0),
            sample(Kind::Ovs, 1, 9.0, 60.0),
        ];
        let s = &summarize(&cfg(), &samples, fastest_of(&samples))[0];
        assert_eq!(s.far_trials, 1);
        let knitter = &s.switches[0];
        assert_eq!((knitter.mpps.n, knitter.mpps.median), (1, 16.0));
        let r = knitter.vs_ovs.unwrap();
        assert_eq!((r.n, r.median), (1, 1.6));
        assert_eq!(s.switches[1].mpps.n, 2, "OVS's two near trials both count");
    }

    #[test]
    fn a_switch_never_steady_leaves_the_round_trip_check_working() {
        let unsteady = |s: Sample| Sample { halves_mpps: Some((5.0, 8.0)), ..s };
        let samples = [
            sample(Kind::Knitter, 0, 16.0, 50.0),
            unsteady(sample(Kind::Ovs, 0, 6.5, 55.0)),
            sample(Kind::Knitter, 1, 8.0, 330.0),
            unsteady(sample(Kind::Ovs, 1, 6.4, 60.0)),
        ];
        let s = &summarize(&cfg(), &samples, fastest_of(&samples))[0];
        assert_eq!(s.far_trials, 1, "Knitter's far trial only");
        assert_eq!((s.switches[0].mpps.n, s.switches[1].mpps.n), (1, 2));
    }

    #[test]
    fn a_switch_never_near_keeps_every_trial() {
        let samples = [
            sample(Kind::Knitter, 0, 16.0, 50.0),
            sample(Kind::Ovs, 0, 5.0, 330.0),
            sample(Kind::Knitter, 1, 8.0, 330.0),
            sample(Kind::Ovs, 1, 4.0, 340.0),
        ];
        let s = &summarize(&cfg(), &samples, fastest_of(&samples))[0];
        assert_eq!(s.far_trials, 0);
        assert_eq!(s.switches[0].mpps.n, 2);
        assert!(settled(&samples[0], 50.0) && !settled(&samples[2], 50.0));
        let moved = Sample { halves_mpps: Some((6.0, 13.0)), ..samples[0].clone() };
        assert!(!settled(&moved, 50.0), "near before and after, but not during");
    }
}

//! knitter-perf: sets up a scenario, drives a generator, measures, tears down, reports.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use knitter_perf::frames::FrameSize;
use knitter_perf::progress::Progress;
use knitter_perf::scenario::Scenario;
use knitter_perf::switches::Kind;
use knitter_perf::testpmd::{Layout, Memory, Vnf};
use knitter_perf::{doctor, machine, mrr, ndr, report, sweep};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "knitter-perf",
    version,
    about = "Knitter's perf lab: interleaved comparisons against traffic generators"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What every run takes: the switches, the frames, the CPU layout, where results go.
#[derive(Args)]
struct Common {
    #[arg(long, value_delimiter = ',', default_value = "knitter,yardstick")]
    switches: Vec<Kind>,
    /// Frame sizes on the wire (FCS counted), or imix (64/570/1518 B, 7:4:1).
    #[arg(long, value_delimiter = ',', default_value = "64,512")]
    sizes: Vec<FrameSize>,
    #[arg(long, default_value_t = 1)]
    flows: u16,
    #[arg(long, default_value_t = 0)]
    generator_cpu: usize,
    #[arg(long, default_value_t = 1)]
    switch_cpu: usize,
    /// The second switch's PMD in `--scenario vxlan-2vteps` (default: the switch CPU, shared).
    #[arg(long)]
    second_switch_cpu: Option<usize>,
    /// auto: hugepages, reserved for the run when too few are free (as root) and given back
    /// after it, plain pages when they cannot be had (not with ovs); hugepages: the same,
    /// but stop when they cannot be had; plain: no hugepages (slower numbers).
    #[arg(long, default_value = "auto")]
    memory: String,
    /// A knitter-vswitchd binary from another build, run as the switch `baseline`.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// TOML the `baseline` switch's config file starts with (dotted keys, such as
    /// `vhost.single_copy = false`): a setting measured against the default in one window.
    /// Without --baseline, the baseline runs this build's knitter-vswitchd.
    #[arg(long)]
    baseline_toml: Option<String>,
    /// Knitter's pod ports without port security (by default they have it, allowing the
    /// pod's MAC and IP address only, as the CNI makes them).
    #[arg(long)]
    no_port_security: bool,
    /// Hosts on each side (L2, with --no-port-security: a pod port allows one MAC):
    /// host j behind the offering port sends to host j behind the other, each with a
    /// random MAC of its own, one frame a pair in turn; every destination speaks first so
    /// the switch learns it. The switches' MAC limits are raised to hold them all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_MACS))]
    macs: u32,
    /// Where results.json and report.md go.
    #[arg(long, default_value = "perf-results")]
    out: PathBuf,
}

/// What a run holds while it runs: its work directory (logs of every switch and
/// generator; kept when the run fails) and the hugepages it reserved (given back when it
/// ends).
struct Lab {
    work: tempfile::TempDir,
    memory: Memory,
    _hugepages: Option<machine::Reservation>,
}

impl Lab {
    /// The run's result; when it failed, or `KNITTER_PERF_KEEP` is set, the work directory
    /// is kept and named.
    fn finish<T>(self, r: anyhow::Result<T>) -> anyhow::Result<T> {
        if std::env::var("KNITTER_PERF_KEEP").is_ok_and(|v| !v.is_empty() && v != "0") && r.is_ok()
        {
            eprintln!("the run's logs are kept in {}", self.work.keep().display());
            return r;
        }
        r.map_err(|e| {
            let kept = self.work.keep();
            e.context(format!("the run's logs are kept in {}", kept.display()))
        })
    }
}

impl Common {
    fn layout(&self) -> Layout {
        Layout {
            generator_cpu: self.generator_cpu,
            switch_cpu: self.switch_cpu,
            second_switch_cpu: self.second_switch_cpu,
        }
    }

    /// `--memory` as the doctor reads it: hugepages required, never, or when possible.
    fn wants_hugepages(&self) -> anyhow::Result<Option<bool>> {
        match self.memory.as_str() {
            "auto" => Ok(None),
            "hugepages" => Ok(Some(true)),
            "plain" => Ok(Some(false)),
            m => anyhow::bail!("--memory {m}: auto, hugepages or plain"),
        }
    }

    /// `--macs`: hosts behind a port need plain L2 ports that allow any MAC.
    fn check_hosts(&self, scenario: Scenario) -> anyhow::Result<()> {
        let macs = self.macs;
        anyhow::ensure!(
            macs == 1 || (scenario == Scenario::L2 && self.no_port_security),
            "--macs {macs}: hosts on each side need --scenario l2 and --no-port-security \
             (a pod port allows its pod's MAC only)"
        );
        Ok(())
    }

    /// With `--baseline-toml` and no `--baseline`, the baseline is this build's daemon.
    fn resolved(mut self) -> Common {
        if self.baseline.is_none() && self.baseline_toml.is_some() {
            self.baseline = Some(knitter_perf::switches::sibling("knitter-vswitchd"));
        }
        self
    }

    fn plan(
        &self,
        scenario: Scenario,
        testpmd_generator: bool,
    ) -> anyhow::Result<doctor::Plan<'_>> {
        Ok(doctor::Plan {
            switches: &self.switches,
            scenario,
            testpmd_generator,
            cpus: [self.generator_cpu, self.switch_cpu],
            baseline: self.baseline.as_deref(),
            hugepages: self.wants_hugepages()?,
            frames: self.frames_a_side(),
        })
    }

    /// The most distinct frames a side Knitter's generator offers in this run (a buffer each).
    fn frames_a_side(&self) -> usize {
        self.sizes
            .iter()
            .map(|s| knitter_perf::frames::distinct(s.pattern().len(), self.flows, self.macs))
            .max()
            .unwrap_or(1)
    }

    /// Checks the machine (stopping with what is missing), makes the work directory,
    /// prepares the memory.
    fn lab(&self, scenario: Scenario, testpmd_generator: bool) -> anyhow::Result<Lab> {
        let plan = self.plan(scenario, testpmd_generator)?;
        doctor::require(&plan)?;
        let work = tempfile::Builder::new()
            .prefix("knitter-perf.")
            .tempdir()
            .context("a work directory")?;
        // Before any thread starts: an interrupted run still removes what it made and gives
        // back the hugepages it reserved.
        knitter_perf::interrupt::install(work.path().to_path_buf()).context("signal handling")?;
        let need =
            machine::mib_needed(&self.switches, scenario, testpmd_generator, self.frames_a_side());
        let (memory, hugepages) = match plan.hugepages {
            Some(false) => (Memory::Plain, None),
            wanted => match machine::reserve(need) {
                Ok(r) => {
                    for line in &r.did {
                        eprintln!("knitter-perf: {line} (given back at the end)");
                    }
                    (Memory::Hugepages, Some(r))
                }
                Err(e) if wanted.is_none() && !machine::hugepages_required(&self.switches) => {
                    eprintln!("knitter-perf: warning: plain pages, numbers will be lower: {e}");
                    (Memory::Plain, None)
                }
                Err(e) => return Err(e.into()),
            },
        };
        Ok(Lab { work, memory, _hugepages: hugepages })
    }
}

/// The longest trial, window or warm-up an option takes, seconds (an hour).
const MAX_SECONDS: f64 = 3600.0;

/// A warm-up or confirmation: seconds from 0 to [`MAX_SECONDS`] (a negative, NaN or endless
/// one fits no `Duration`).
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if (0.0..=MAX_SECONDS).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s}: seconds from 0 to {MAX_SECONDS}"))
    }
}

/// A trial or window: more than 0 seconds, at most [`MAX_SECONDS`].
fn some_seconds(s: &str) -> Result<f64, String> {
    let v = seconds(s)?;
    if v > 0.0 { Ok(v) } else { Err(format!("{s}: more than 0 seconds")) }
}

/// The most hosts a side `--macs` takes: the switch's FDB (262,144 entries) holds both
/// sides', the VNF's 1 GiB (`mrr`) an mbuf for each frame it replays; Knitter's generator
/// (`ndr`) takes a 2 KiB buffer for each.
const MAX_MACS: i64 = 100_000;

#[derive(Subcommand)]
enum Cmd {
    /// The maximum receive rate of each switch, alternated, with DPDK's testpmd and its
    /// `net_virtio_user` driver as the generator (the VNF users run): L2, VLAN or VXLAN
    /// between two vhost-user sockets.
    Mrr {
        #[command(flatten)]
        common: Common,
        /// l2, vlan-push (access → trunk), vlan-pop, vxlan-encap or vxlan-decap (the VTEP's
        /// underlay on the second vhost-user port; sizes are the inner frame's).
        #[arg(long, value_enum, default_value = "l2")]
        scenario: Scenario,
        /// Rounds (each switch once per size per round).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds of traffic before the window.
        #[arg(long, default_value_t = 3.0, value_parser = seconds)]
        warmup: f64,
        /// Seconds measured.
        #[arg(long, default_value_t = 10.0, value_parser = some_seconds)]
        window: f64,
        /// Queue pairs the VNF's virtio-user ports are created with (others than Knitter
        /// offer one).
        #[arg(long, default_value_t = 1)]
        vnf_queues: u16,
        /// Queue pairs the VNF configures and sends on, evenly (default: all of them).
        #[arg(long)]
        vnf_queues_used: Option<u16>,
        /// Entries of the VNF's virtqueues and its descriptors a queue (`queue_size`,
        /// `--rxd/--txd`): 256 is DPDK's default, NFV set-ups use 1024 and more. Several
        /// (`256,1024,4096`): a sweep, each round through every size in turn, with one table
        /// and a plot across them (`sweep.md`, `sweep-<size>.svg`) and each size's report in
        /// `ring-<entries>/`.
        #[arg(long, value_delimiter = ',', default_value = "256")]
        vnf_ring: Vec<u16>,
        /// More `net_virtio_user` options for the VNF's ports (`in_order=0`, `packed_vq=1`).
        #[arg(long, default_value = "")]
        vnf_devargs: String,
        /// The VNF's transmit free threshold (testpmd's `--txfreet`, a DPDK application's
        /// `tx_free_thresh`): the ring's size less 32 makes DPDK's virtio driver free sent
        /// buffers at once rather than when the ring is nearly all used (0: its default;
        /// `ring-32`: that at every ring size).
        #[arg(long, default_value = "0")]
        vnf_tx_free: sweep::TxFree,
        /// A policer on Knitter's offering pod port, as a TOML inline table's body
        /// (`pps = 1000000` or `bps = 1000000000, burst_bytes = 100000`).
        #[arg(long)]
        police: Option<String>,
        /// Repeat a trial when a CPU got less than this share of its time.
        #[arg(long, default_value_t = 0.85)]
        min_supply: f64,
        #[arg(long, default_value_t = 2)]
        retries: usize,
    },
    /// L2 vhost-user ↔ vhost-user with Knitter's own generator: MRR, NDR and PDR by binary
    /// search, the NDR confirmed, latency percentiles at a common load.
    Ndr {
        #[command(flatten)]
        common: Common,
        /// l2, vlan-push (access → trunk), vlan-pop, vxlan-encap or vxlan-decap (the VTEP's
        /// underlay on the second vhost-user port; sizes are the inner frame's), veth (kernel
        /// interfaces), vxlan-2vteps (two Knitter switches).
        #[arg(long, value_enum, default_value = "l2")]
        scenario: Scenario,
        /// Rounds of MRR trials, the switches alternated within each (the headline
        /// comparison: median and spread), before the searches; 1: the searches' own MRR.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Seconds per search trial (FD.io CSIT: 10).
        #[arg(long, default_value_t = 10.0, value_parser = some_seconds)]
        trial: f64,
        /// Seconds of traffic after each start of a switch, before its first trial (OVS
        /// needs a minute to grow its flow limit past tens of thousands of hosts).
        #[arg(long, default_value_t = 0.0, value_parser = seconds)]
        warmup: f64,
        /// Seconds of the NDR's confirmation trial (0: none).
        #[arg(long, default_value_t = 60.0, value_parser = seconds)]
        confirm: f64,
        /// The searches stop when their bounds are this close (relative).
        #[arg(long, default_value_t = 0.005)]
        precision: f64,
    },
    /// Lists what the machine has and lacks for a run (of `ndr`, or of `mrr` with
    /// `--mrr`): root, CPUs, binaries, Open vSwitch, hugepages; exits 1 when a run would
    /// stop.
    Doctor {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_enum, default_value = "l2")]
        scenario: Scenario,
        /// For `mrr` (testpmd generating) rather than `ndr`.
        #[arg(long)]
        mrr: bool,
    },
    /// Writes report.md again from a run's results.json (after the report's format changed),
    /// or a sweep's tables, plots and reports from its sweep.json.
    Report {
        results: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().cmd) {
        Ok(code) => code,
        Err(e) => {
            // One line, the step that failed and its causes; no backtrace.
            eprintln!("knitter-perf: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Doctor { common, scenario, mrr } => {
            let common = common.resolved();
            let checks = doctor::checks(&common.plan(scenario, mrr)?);
            print!("{}", doctor::render(&checks));
            Ok(if checks.iter().all(|c| c.ok || c.optional) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Report { results, out } => {
            let text = std::fs::read(&results)
                .with_context(|| format!("reading {}", results.display()))?;
            if let Ok(r) = serde_json::from_slice::<ndr::Results>(&text) {
                report::write_ndr(&out, &r)?;
                return Ok(ExitCode::SUCCESS);
            }
            if let Ok(mut runs) = serde_json::from_slice::<Vec<mrr::Results>>(&text) {
                // One nearest placement for the whole sweep.
                let fastest = runs.iter().map(|r| r.fastest()).fold(f64::INFINITY, f64::min);
                for r in &mut runs {
                    r.summary = mrr::summarize(&r.config, &r.samples, fastest);
                    r.fastest_round_trip_ns = fastest.is_finite().then_some(fastest);
                }
                sweep::write(&out, &runs)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut r: mrr::Results = serde_json::from_slice(&text).with_context(|| {
                format!("{} is not a knitter-perf results file", results.display())
            })?;
            r.summary = mrr::summarize(&r.config, &r.samples, r.fastest());
            report::write(&out, &r)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mrr {
            common,
            scenario,
            rounds,
            warmup,
            window,
            min_supply,
            retries,
            vnf_queues,
            vnf_queues_used,
            vnf_ring,
            vnf_devargs,
            vnf_tx_free,
            police,
        } => {
            let common = common.resolved();
            anyhow::ensure!(
                scenario.on_two_vhost_user_sockets(),
                "mrr measures l2, vlan-push, vlan-pop, vxlan-encap and vxlan-decap; --scenario {} runs with ndr",
                scenario.name()
            );
            common.check_hosts(scenario)?;
            let mut vnf_ring = vnf_ring;
            vnf_ring.dedup();
            anyhow::ensure!(!vnf_ring.is_empty(), "--vnf-ring: at least one ring size");
            if let Some(bad) = vnf_ring.iter().find(|r| !r.is_power_of_two() || **r < 64) {
                anyhow::bail!(
                    "--vnf-ring {bad}: a split virtqueue's size is a power of two (64 or more)"
                );
            }
            let mut seen = vnf_ring.clone();
            seen.sort_unstable();
            seen.dedup();
            anyhow::ensure!(seen.len() == vnf_ring.len(), "--vnf-ring: each ring size once");
            let lab = common.lab(scenario, true)?;
            let vnfs: Vec<Vnf> = vnf_ring
                .iter()
                .map(|&ring| Vnf {
                    queues: vnf_queues,
                    queues_used: vnf_queues_used.unwrap_or(vnf_queues),
                    ring,
                    devargs: vnf_devargs.clone(),
                    tx_free: vnf_tx_free.at(ring),
                })
                .collect();
            let cfg = mrr::Config {
                scenario,
                layout: common.layout(),
                memory: lab.memory,
                switches: common.switches.clone(),
                sizes: common.sizes.clone(),
                flows: common.flows,
                macs: common.macs,
                pairs: rounds,
                port_security: !common.no_port_security,
                warmup: Duration::from_secs_f64(warmup),
                window: Duration::from_secs_f64(window),
                min_supply,
                retries,
                baseline: common.baseline.clone(),
                baseline_toml: common.baseline_toml.clone(),
                vnf: vnfs[0].clone(),
                police,
                ovs_config: knitter_perf::ovs::tuning(),
                work: lab.work.path().to_path_buf(),
            };
            let progress = Progress::new(mrr::planned(&cfg) * vnfs.len() as u32);
            if vnfs.len() > 1 {
                let r = mrr::run_each(&cfg, &vnfs, &progress);
                progress.finish();
                let runs = lab.finish(r)?;
                std::fs::create_dir_all(&common.out)?;
                sweep::write(&common.out, &runs)?;
                print!("{}", sweep::markdown(&runs));
                eprintln!(
                    "results: {0}/sweep.json, {0}/sweep.md, {0}/sweep-<size>.svg, {0}/ring-<entries>/",
                    common.out.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let r = mrr::run(&cfg, &progress);
            progress.finish();
            let results = lab.finish(r)?;
            report::write(&common.out, &results)?;
            print!("{}", report::markdown(&results).split("## Every trial").next().unwrap_or(""));
            eprintln!(
                "results: {}/results.json, {}/report.md",
                common.out.display(),
                common.out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ndr { common, scenario, rounds, trial, warmup, confirm, precision } => {
            let common = common.resolved();
            common.check_hosts(scenario)?;
            let lab = common.lab(scenario, false)?;
            let cfg = ndr::Config {
                scenario,
                layout: common.layout(),
                memory: lab.memory,
                switches: common.switches.clone(),
                sizes: common.sizes.clone(),
                flows: common.flows,
                macs: common.macs,
                warmup: Duration::from_secs_f64(warmup),
                trial: Duration::from_secs_f64(trial),
                confirm: Duration::from_secs_f64(confirm),
                precision,
                rounds,
                port_security: !common.no_port_security,
                baseline: common.baseline.clone(),
                baseline_toml: common.baseline_toml.clone(),
                ovs_config: knitter_perf::ovs::tuning(),
                work: lab.work.path().to_path_buf(),
            };
            let progress = Progress::new(ndr::planned(&cfg));
            let r = ndr::run(&cfg, &progress);
            progress.finish();
            let results = lab.finish(r)?;
            report::write_ndr(&common.out, &results)?;
            print!(
                "{}",
                report::ndr_markdown(&results).split("## Every trial").next().unwrap_or("")
            );
            eprintln!(
                "results: {}/results.json, {}/report.md",
                common.out.display(),
                common.out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_checked_before_they_become_one() {
        assert_eq!(seconds("0"), Ok(0.0));
        assert_eq!(some_seconds("2.5"), Ok(2.5));
        for bad in ["-1", "NaN", "inf", "1e19", "soon"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert!(some_seconds("0").is_err());
        // `--warmup=-5`: the value reaches the parser (`--warmup -5` is refused as an unknown
        // flag before it).
        let kind = |args: &[&str]| Cli::try_parse_from(args).err().map(|e| e.kind());
        assert_eq!(
            kind(&["knitter-perf", "ndr", "--warmup=-5"]),
            Some(clap::error::ErrorKind::ValueValidation),
            "a negative warm-up is refused by the parser, not a panic"
        );
        assert_eq!(
            kind(&["knitter-perf", "ndr", "--trial=NaN"]),
            Some(clap::error::ErrorKind::ValueValidation)
        );
        assert_eq!(kind(&["knitter-perf", "ndr", "--warmup=60", "--confirm=0"]), None);
    }
}

//! knitter-perf: sets up a scenario, drives a generator, measures, tears down, reports.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use knitter_perf::frames::FrameSize;
use knitter_perf::scenario::Scenario;
use knitter_perf::switches::Kind;
use knitter_perf::testpmd::{self, Layout, Memory};
use knitter_perf::{mrr, ndr, report};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "knitter-perf", version, about = "Knitter's perf lab: interleaved comparisons against traffic generators")]
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
    /// auto: hugepages when 1 100 are free.
    #[arg(long, default_value = "auto")]
    memory: String,
    /// A knitter-vswitchd binary from another build, run as the switch `baseline`.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Where results.json and report.md go.
    #[arg(long, default_value = "perf-results")]
    out: PathBuf,
}

impl Common {
    fn layout(&self) -> anyhow::Result<Layout> {
        anyhow::ensure!(self.generator_cpu != self.switch_cpu, "the generator and the switch need a CPU each");
        Ok(Layout { generator_cpu: self.generator_cpu, switch_cpu: self.switch_cpu, second_switch_cpu: self.second_switch_cpu })
    }

    fn memory(&self) -> anyhow::Result<Memory> {
        Ok(match self.memory.as_str() {
            "auto" => Memory::detect(),
            "hugepages" => Memory::Hugepages,
            "plain" => Memory::Plain,
            m => anyhow::bail!("--memory {m}: auto, hugepages or plain"),
        })
    }

    fn work(&self) -> anyhow::Result<tempfile::TempDir> {
        let needs_testpmd = self.switches.contains(&Kind::Yardstick);
        anyhow::ensure!(!needs_testpmd || testpmd::available(), "dpdk-testpmd is not installed (apt-get install dpdk)");
        let dir = tempfile::Builder::new().prefix("knitter-perf.").tempdir().context("a work directory")?;
        // Before any thread starts: an interrupted run still removes what it made.
        knitter_perf::interrupt::install(dir.path().to_path_buf()).context("signal handling")?;
        Ok(dir)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// L2 vhost-user ↔ vhost-user: the maximum receive rate of each switch, alternated
    /// (dpdk-testpmd as the generator).
    Mrr {
        #[command(flatten)]
        common: Common,
        /// Rounds (each switch once per size per round).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds of traffic before the window.
        #[arg(long, default_value_t = 3.0)]
        warmup: f64,
        /// Seconds measured.
        #[arg(long, default_value_t = 10.0)]
        window: f64,
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
        #[arg(long, default_value_t = 10.0)]
        trial: f64,
        /// Seconds of the NDR's confirmation trial (0: none).
        #[arg(long, default_value_t = 60.0)]
        confirm: f64,
        /// The searches stop when their bounds are this close (relative).
        #[arg(long, default_value_t = 0.005)]
        precision: f64,
    },
    /// Writes report.md again from a run's results.json (after the report's format changed).
    Report {
        results: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    match Cli::parse().cmd {
        Cmd::Report { results, out } => {
            let text = std::fs::read(&results).with_context(|| format!("reading {}", results.display()))?;
            if let Ok(r) = serde_json::from_slice::<ndr::Results>(&text) {
                return report::write_ndr(&out, &r);
            }
            let mut r: mrr::Results = serde_json::from_slice(&text).with_context(|| format!("{} is not a knitter-perf results file", results.display()))?;
            r.summary = mrr::summarize(&r.config, &r.samples);
            report::write(&out, &r)
        }
        Cmd::Mrr { common, rounds, warmup, window, min_supply, retries } => {
            anyhow::ensure!(testpmd::available(), "dpdk-testpmd is not installed (apt-get install dpdk)");
            let work = common.work()?;
            let cfg = mrr::Config {
                layout: common.layout()?,
                memory: common.memory()?,
                switches: common.switches,
                sizes: common.sizes,
                flows: common.flows,
                pairs: rounds,
                warmup: Duration::from_secs_f64(warmup),
                window: Duration::from_secs_f64(window),
                min_supply,
                retries,
                baseline: common.baseline,
                work: work.path().to_path_buf(),
            };
            let results = mrr::run(&cfg, |line| eprintln!("{line}"))?;
            report::write(&common.out, &results)?;
            print!("{}", report::markdown(&results).split("## Every trial").next().unwrap_or(""));
            eprintln!("results: {}/results.json, {}/report.md", common.out.display(), common.out.display());
            Ok(())
        }
        Cmd::Ndr { common, scenario, rounds, trial, confirm, precision } => {
            let work = common.work()?;
            let cfg = ndr::Config {
                scenario,
                layout: common.layout()?,
                memory: common.memory()?,
                switches: common.switches,
                sizes: common.sizes,
                flows: common.flows,
                trial: Duration::from_secs_f64(trial),
                confirm: Duration::from_secs_f64(confirm),
                precision,
                rounds,
                baseline: common.baseline,
                work: work.path().to_path_buf(),
            };
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(200));
            let results = ndr::run(&cfg, |line| {
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(line);
                    bar.set_message(line.to_string());
                }
            })?;
            bar.finish_and_clear();
            report::write_ndr(&common.out, &results)?;
            print!("{}", report::ndr_markdown(&results).split("## Every trial").next().unwrap_or(""));
            eprintln!("results: {}/results.json, {}/report.md", common.out.display(), common.out.display());
            Ok(())
        }
    }
}

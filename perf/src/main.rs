//! knitter-perf: sets up a scenario, drives a generator, measures, tears down, reports.

use anyhow::Context;
use clap::{Parser, Subcommand};
use knitter_perf::mrr::{self, Config};
use knitter_perf::switches::Kind;
use knitter_perf::testpmd::{self, Layout, Memory};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "knitter-perf", version, about = "Knitter's perf lab: interleaved comparisons against traffic generators")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// L2 vhost-user ↔ vhost-user: the maximum receive rate of each switch, alternated.
    Mrr {
        #[arg(long, value_delimiter = ',', default_value = "knitter,yardstick")]
        switches: Vec<Kind>,
        /// Frame sizes on the wire (FCS counted).
        #[arg(long, value_delimiter = ',', default_value = "64,512")]
        sizes: Vec<usize>,
        #[arg(long, default_value_t = 1)]
        flows: u16,
        /// Rounds (each switch once per size per round).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds of traffic before the window.
        #[arg(long, default_value_t = 3.0)]
        warmup: f64,
        /// Seconds measured.
        #[arg(long, default_value_t = 10.0)]
        window: f64,
        #[arg(long, default_value_t = 0)]
        generator_cpu: usize,
        #[arg(long, default_value_t = 1)]
        switch_cpu: usize,
        /// auto: hugepages when 1 100 are free.
        #[arg(long, default_value = "auto")]
        memory: String,
        /// Repeat a trial when a CPU got less than this share of its time.
        #[arg(long, default_value_t = 0.85)]
        min_supply: f64,
        #[arg(long, default_value_t = 2)]
        retries: usize,
        /// A knitter-vswitchd binary from another build, run as the switch `baseline`.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Where results.json and report.md go.
        #[arg(long, default_value = "perf-results")]
        out: PathBuf,
    },
    /// Writes report.md again from a run's results.json (after the report's format changed).
    Report {
        results: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Report { results, out } => {
            let text = std::fs::read(&results).with_context(|| format!("reading {}", results.display()))?;
            let mut r: mrr::Results = serde_json::from_slice(&text).with_context(|| format!("{} is not a knitter-perf results file", results.display()))?;
            r.summary = mrr::summarize(&r.config, &r.samples);
            knitter_perf::report::write(&out, &r)
        }
        Cmd::Mrr { switches, sizes, flows, rounds, warmup, window, generator_cpu, switch_cpu, memory, min_supply, retries, baseline, out } => {
            anyhow::ensure!(testpmd::available(), "dpdk-testpmd is not installed (apt-get install dpdk)");
            anyhow::ensure!(generator_cpu != switch_cpu, "the generator and the switch need a CPU each");
            let memory = match memory.as_str() {
                "auto" => Memory::detect(),
                "hugepages" => Memory::Hugepages,
                "plain" => Memory::Plain,
                m => anyhow::bail!("--memory {m}: auto, hugepages or plain"),
            };
            let work = tempfile::Builder::new().prefix("knitter-perf.").tempdir().context("a work directory")?;
            let cfg = Config {
                switches,
                sizes,
                flows,
                pairs: rounds,
                warmup: Duration::from_secs_f64(warmup),
                window: Duration::from_secs_f64(window),
                layout: Layout { generator_cpu, switch_cpu },
                memory,
                min_supply,
                retries,
                baseline,
                work: work.path().to_path_buf(),
            };
            let results = mrr::run(&cfg, |line| eprintln!("{line}"))?;
            knitter_perf::report::write(&out, &results)?;
            print!("{}", knitter_perf::report::markdown(&results).split("## Every trial").next().unwrap_or(""));
            eprintln!("results: {}/results.json, {}/report.md", out.display(), out.display());
            Ok(())
        }
    }
}

//! A run across the VNF's ring sizes (`mrr --vnf-ring 256,1024,4096`): one table of every
//! ring size, frame size and switch — its rate, its ratio to OVS and to the yardstick, what it
//! cost the VNF — as `sweep.md`, a plot of the rate against the ring size per frame size
//! (`sweep-<size>.svg`), and every ring's own report under `ring-<entries>/`.

use crate::mrr::Results;
use crate::stats::Summary;
use std::fmt::Write as _;
use std::path::Path;

/// The transmit free threshold the VNF runs with at every ring size (`--vnf-tx-free`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxFree {
    /// This many descriptors (0: the driver's own default).
    Fixed(u16),
    /// The ring's size less 32 (`ring-32`): the driver frees what it sent at once.
    RingLess32,
}

impl std::str::FromStr for TxFree {
    type Err = String;
    fn from_str(s: &str) -> Result<TxFree, String> {
        match s.trim() {
            "ring-32" => Ok(TxFree::RingLess32),
            n => n.parse().map(TxFree::Fixed).map_err(|_| {
                format!("{s:?}: a number of descriptors (0: the driver's default) or ring-32")
            }),
        }
    }
}

impl TxFree {
    /// The threshold at `ring` entries.
    pub fn at(self, ring: u16) -> u16 {
        match self {
            TxFree::Fixed(n) => n,
            TxFree::RingLess32 => ring.saturating_sub(32),
        }
    }
}

/// Writes each ring's report in `ring-<entries>/`, then `sweep.json`, `sweep.md` and the
/// plots in `dir`.
pub fn write(dir: &Path, runs: &[Results]) -> anyhow::Result<()> {
    for r in runs {
        crate::report::write(&dir.join(format!("ring-{}", r.config.vnf.ring)), r)?;
    }
    std::fs::write(dir.join("sweep.json"), serde_json::to_vec_pretty(runs)?)?;
    std::fs::write(dir.join("sweep.md"), markdown(runs))?;
    let sizes = runs.first().map(|r| r.config.sizes.clone()).unwrap_or_default();
    for size in sizes {
        crate::plots::across_rings(runs, size, &dir.join(format!("sweep-{size}.svg")))?;
    }
    Ok(())
}

/// A summary's median, or a dash.
fn median(s: Option<Summary>, digits: usize) -> String {
    s.map(|v| format!("{:.digits$}", v.median)).unwrap_or_else(|| "—".into())
}

/// A per-round ratio, short: its median and the rounds' range.
fn ratio(s: Option<Summary>) -> String {
    match s {
        Some(v) if v.n > 1 => format!("{:.2}× ({:.2} – {:.2})", v.median, v.min, v.max),
        Some(v) => format!("{:.2}×", v.median),
        None => "—".into(),
    }
}

pub fn markdown(runs: &[Results]) -> String {
    let mut o = String::new();
    let Some(first) = runs.first() else { return o };
    let c = &first.config;
    let rings: Vec<String> = runs.iter().map(|r| r.config.vnf.ring.to_string()).collect();
    let _ = writeln!(
        o,
        "# knitter-perf: {}, maximum receive rate across the VNF's ring sizes\n",
        c.scenario.describe()
    );
    let _ = writeln!(
        o,
        "Ring sizes {} (each round goes through them all in turn); {} round(s), {} s warm-up, {} s \
         window; {}; Knitter's pod ports {}; memory {:?}. The VNF at the first ring size: \
         {}. Each ring size's own report, with every trial: `ring-<entries>/report.md`.\n",
        rings.join(", "),
        c.pairs,
        c.warmup.as_secs_f64(),
        c.window.as_secs_f64(),
        crate::mrr::flows_text(c.flows, c.macs),
        if c.port_security { "with port security" } else { "without port security" },
        c.memory,
        c.vnf.describe()
    );
    let _ = writeln!(
        o,
        "Medians over the rounds; ratios per round (both switches in the same minute), their \
         median and the rounds' range. The VNF's cycles a packet received (its pcap replay \
         included) and write system calls a second are what each switch cost it. Trials the \
         host ran with the generator's and the switch's CPUs farther apart than in the run's \
         nearest placement, or moved during the window (its halves' rates apart), are \
         repeated, and left out when every switch has a settled one.\n"
    );
    let _ = writeln!(
        o,
        "| VNF ring | tx free | frame | switch | Mpps | × OVS | × testpmd | switch cycles/packet | VNF cycles/packet | VNF writes/s |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let free = match r.config.vnf.tx_free {
            0 => "default".to_string(),
            n => n.to_string(),
        };
        for &size in &r.config.sizes {
            for &k in &r.config.switches {
                let Some(w) = r.switch_at(size, k) else { continue };
                let _ = writeln!(
                    o,
                    "| {} | {free} | {size} | {} | {:.2} | {} | {} | {} | {} | {} |",
                    r.config.vnf.ring,
                    k.name(),
                    w.mpps.median,
                    ratio(w.vs_ovs),
                    ratio(w.vs_yardstick),
                    median(w.cycles_per_packet, 0),
                    median(w.vnf_cycles_per_packet, 0),
                    median(w.vnf_writes_per_s, 0),
                );
            }
        }
    }
    for r in runs {
        for f in r.summary.iter().filter(|f| f.far_trials > 0) {
            let _ = writeln!(
                o,
                "\nRing {}, {} B: {} trial(s) left out, the host had the two CPUs farther apart \
                 than in the run's nearest placement or moved them during the window \
                 (`ring-{}/report.md`).",
                r.config.vnf.ring, f.size, f.far_trials, r.config.vnf.ring
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_follows_the_ring() {
        let t: TxFree = "ring-32".parse().unwrap();
        assert_eq!((t.at(256), t.at(4096)), (224, 4064));
        let f: TxFree = "0".parse().unwrap();
        assert_eq!(f.at(1024), 0);
        assert!("half".parse::<TxFree>().unwrap_err().contains("ring-32"));
    }
}

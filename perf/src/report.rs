//! The report of a run: `results.json` (every trial and the summaries) and `report.md` (the
//! method, the machine and layout, one table per frame size with medians, spreads and ratios
//! to the yardstick, and every trial, flagged where the switch was not the bottleneck or the
//! machine starved it).

use crate::mrr::Results;
use std::fmt::Write as _;
use std::path::Path;

pub fn write(dir: &Path, r: &Results) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(r)?)?;
    std::fs::write(dir.join("report.md"), markdown(r))?;
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|s| s.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into())
}

fn ratio(r: Option<crate::stats::Summary>) -> String {
    r.map(|v| format!("{:.2} ({:.2} – {:.2})", v.median, v.min, v.max)).unwrap_or_else(|| "—".into())
}

pub fn markdown(r: &Results) -> String {
    let c = &r.config;
    let mut o = String::new();
    let _ = writeln!(o, "# knitter-perf: L2 vhost-user ↔ vhost-user, maximum receive rate\n");
    let _ = writeln!(
        o,
        "Machine: {} vCPUs, {}. Memory: {:?}. Switch forwarding thread on CPU {}, generator on CPU {}. \
         {} round(s), switches alternated in each; {} s warm-up, {} s window; {} flow(s); \
         frame sizes count the FCS.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu_model(),
        c.memory,
        c.layout.switch_cpu,
        c.layout.generator_cpu,
        c.pairs,
        c.warmup.as_secs_f64(),
        c.window.as_secs_f64(),
        c.flows
    );
    let _ = writeln!(
        o,
        "Method: the generator (dpdk-testpmd, a pcap port replaying the frames into virtio-user \
         port A, counting what virtio-user port B receives and dropping it in a null port) offers \
         more than the switch forwards; \
         the received rate on B is the MRR. Ratios are per round (both switches measured back to \
         back), then the median. A trial is repeated when a CPU got < {:.0} % of its time \
         (a TSC spin probe after it). The yardstick is testpmd's own `net_vhost` io forwarding: \
         no switching, two copies per frame.\n",
        c.min_supply * 100.0
    );
    for s in &r.summary {
        let _ = writeln!(o, "## {} bytes\n", s.size);
        let _ = writeln!(o, "| switch | Mpps median | min – max | spread | × yardstick (median of rounds) | × OVS (median of rounds) | switch cycles/packet |");
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        for w in &s.switches {
            let _ = writeln!(
                o,
                "| {} | {:.2} | {:.2} – {:.2} | {:.0} % | {} | {} | {} |",
                w.switch.name(),
                w.mpps.median,
                w.mpps.min,
                w.mpps.max,
                w.mpps.spread * 100.0,
                ratio(w.vs_yardstick),
                ratio(w.vs_ovs),
                w.cycles_per_packet.map(|v| format!("{:.0}", v.median)).unwrap_or_else(|| "—".into()),
            );
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "## Every trial\n");
    let _ = writeln!(o, "| round | size | switch | offered Mpps | received Mpps | cycles/packet | PMD busy | bottleneck | CPU supply | repeated |");
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
    for t in &r.samples {
        let supply: Vec<String> = t.supply.iter().map(|s| format!("cpu{} {:.0} %", s.cpu, s.fraction * 100.0)).collect();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
            t.round,
            t.size,
            t.switch.name(),
            t.offered_mpps,
            t.received_mpps,
            t.switch_cycles_per_packet.map(|c| format!("{c:.0}")).unwrap_or_else(|| "—".into()),
            t.switch_busy.map(|b| format!("{:.0} %", b * 100.0)).unwrap_or_else(|| "—".into()),
            match t.switch_was_bottleneck {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "unknown",
            },
            supply.join(", "),
            t.repeated
        );
    }
    o
}

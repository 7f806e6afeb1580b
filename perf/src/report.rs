//! The report of a run: `results.json` (every trial and the summaries) and `report.md` (the
//! method, the machine and layout, one table per frame size with medians, spreads and ratios
//! to the yardstick, and every trial, flagged where the switch was not the bottleneck or the
//! machine starved it).

use crate::mrr::Results;
use crate::stats::Summary;
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
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// A per-round ratio: its median, the rounds' range and the median's 95 % interval, and
/// whether it can be told from 1.
fn ratio(r: Option<Summary>) -> String {
    let Some(v) = r else { return "—".into() };
    let interval = match v.interval {
        Some((lo, hi)) => format!("; 95 % CI {lo:.2} – {hi:.2}"),
        None => format!("; < {} rounds: no interval", crate::stats::MIN_FOR_INTERVAL),
    };
    let verdict =
        if v.excludes(1.0) == Some(false) { " — **not distinguishable from 1**" } else { "" };
    format!("{:.2}× (rounds {:.2} – {:.2}{interval}){verdict}", v.median, v.min, v.max)
}

fn security(on: bool) -> &'static str {
    if on {
        "port security on (the pod's MAC and IP only, as the CNI makes them)"
    } else {
        "no port security"
    }
}

/// A median of Mpps with its 95 % interval.
fn median_mpps(s: &Summary, scale: f64) -> String {
    match s.interval {
        Some((lo, hi)) => {
            format!("{:.2} ({:.2} – {:.2})", s.median / scale, lo / scale, hi / scale)
        }
        None => format!("{:.2}", s.median / scale),
    }
}

/// The alternated MRR rounds of one size: every switch's median with its interval, spread,
/// and its per-round ratio to OVS and to the yardstick where they ran.
fn rounds_table(here: &[&crate::ndr::Measured], rounds: usize) -> String {
    use crate::switches::Kind;
    let mut o = String::new();
    let values = |m: &crate::ndr::Measured| -> Vec<f64> {
        m.mrr_rounds.iter().map(|v| v.unwrap_or(f64::NAN)).collect()
    };
    let refs: Vec<(Kind, Vec<f64>)> = [Kind::Ovs, Kind::Yardstick]
        .into_iter()
        .filter_map(|k| here.iter().find(|m| m.switch == k).map(|m| (k, values(m))))
        .collect();
    let _ = writeln!(
        o,
        "MRR over {rounds} rounds, the switches alternated within each, each trial checked for the CPU it got \
         (repeated when a CPU had < {:.0} % of its time, dropped after {} tries) — the headline comparison. \
         Medians with their 95 % confidence interval (percentile bootstrap over the rounds); ratios per round \
         (both switches in the same minute), then their median:\n",
        crate::ndr::MIN_SUPPLY * 100.0,
        crate::ndr::RETRIES + 1
    );
    let heads: String = refs.iter().map(|(k, _)| format!(" × {} |", k.name())).collect();
    let _ = writeln!(
        o,
        "| switch | MRR Mpps median (95 % CI) | min – max | spread |{heads} repeated / dropped |"
    );
    let _ = writeln!(o, "|---|---|---|---|{}---|", "---|".repeat(refs.len()));
    for m in here {
        let v = values(m);
        let Some(sum) = crate::stats::summarize(&v) else { continue };
        let ratios: String = refs
            .iter()
            .map(|(k, r)| {
                format!(
                    " {} |",
                    if *k == m.switch {
                        "—".into()
                    } else {
                        ratio(crate::stats::pair_ratios(&v, r))
                    }
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "| {} | {} | {:.2} – {:.2} | {:.0} % |{ratios} {} / {} |",
            m.switch.name(),
            median_mpps(&sum, 1e6),
            sum.min / 1e6,
            sum.max / 1e6,
            sum.spread * 100.0,
            m.rounds_repeated,
            m.rounds_dropped
        );
    }
    o
}

/// What the `baseline` switch ran, when it ran: another build, or this one with settings.
fn baseline_line(
    switches: &[crate::switches::Kind],
    binary: Option<&std::path::Path>,
    toml: Option<&str>,
) -> String {
    if !switches.contains(&crate::switches::Kind::Baseline) {
        return String::new();
    }
    let bin = binary.map(|b| b.display().to_string()).unwrap_or_else(|| "—".into());
    match toml {
        Some(t) => {
            format!("The `baseline` switch: {bin} with `{t}` merged into its config file.\n\n")
        }
        None => format!("The `baseline` switch: {bin}.\n\n"),
    }
}

/// The settings OVS was given beyond the lab's own, when it ran with any.
fn ovs_line(switches: &[crate::switches::Kind], config: &[String]) -> String {
    if !switches.contains(&crate::switches::Kind::Ovs) || config.is_empty() {
        return String::new();
    }
    format!("OVS also given `{}`.\n\n", config.join(" "))
}

pub fn markdown(r: &Results) -> String {
    let c = &r.config;
    let mut o = String::new();
    let _ = writeln!(o, "# knitter-perf: {}, maximum receive rate\n", c.scenario.describe());
    o += &baseline_line(&c.switches, c.baseline.as_deref(), c.baseline_toml.as_deref());
    let _ = writeln!(
        o,
        "Machine: {} vCPUs, {}. Memory: {:?}. Knitter's pod ports: {}. Switch forwarding thread on CPU {}, generator on CPU {}. \
         {} round(s), switches alternated in each; {} s warm-up, {} s window; {}; \
         frame sizes count the FCS.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu_model(),
        c.memory,
        security(c.port_security),
        c.layout.switch_cpu,
        c.layout.generator_cpu,
        c.pairs,
        c.warmup.as_secs_f64(),
        c.window.as_secs_f64(),
        crate::mrr::flows_text(c.flows, c.macs)
    );
    let _ = writeln!(
        o,
        "The VNF: {}.{}\n",
        c.vnf.describe(),
        c.police
            .as_deref()
            .map(|p| format!(" Knitter's offering pod port is policed: `policer = {{ {p} }}`."))
            .unwrap_or_default()
    );
    o += &ovs_line(&c.switches, &c.ovs_config);
    let _ = writeln!(
        o,
        "Method: the generator (dpdk-testpmd, a pcap port replaying the frames into one virtio-user \
         port, counting what the other virtio-user port receives and dropping it; that port first \
         sends the scenario's one learning frame, from a second pcap port) offers \
         more than the switch forwards; \
         the rate received on the counting port is the MRR. Ratios are per round (both switches measured back to \
         back), then the median. A trial is repeated when a CPU got < {:.0} % of its time \
         (a TSC spin probe after it), and when the host had the generator's and the switch's \
         CPUs farther apart than in the run's nearest placement (a cache line passed between \
         them before and after the trial takes more than {:.1}× the run's fastest round trip: \
         here ~50 ns near, ~330 ns apart, and every vhost-user switch and the VNF pay ~2× a \
         packet apart), or when the rates of its window's two halves differ by more than {:.1}× \
         (the placement changed during the window); such trials are left out of the summary \
         while every switch has one that passes that check. The yardstick is testpmd's own `net_vhost` io forwarding: \
         no switching, two copies per frame. The generator is the VNF (DPDK's own \
         `net_virtio_user` driver): what each switch costs it is read over the same window — \
         its forwarding cycles per frame received (testpmd `--record-core-cycles`; its pcap \
         replay included, the same for every switch) and its write system calls a second \
         (kicks to the switch are eventfd writes; /proc/PID/io). On two vCPUs a DPDK generator \
         cannot outrun a switch, so these trials compare what each switch forwards plus what it \
         costs the VNF; the switches' ceilings come from `ndr` (Knitter's own generator).\n",
        c.min_supply * 100.0,
        crate::mrr::NEAR,
        crate::mrr::STEADY
    );
    for s in &r.summary {
        let _ = writeln!(o, "## {}\n", heading(s.size));
        let _ = writeln!(
            o,
            "| switch | Mpps median (95 % CI) | min – max | spread | × yardstick (per round) | × OVS (per round) | switch cycles/packet | VNF cycles/packet | VNF writes/s |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
        for w in &s.switches {
            let _ = writeln!(
                o,
                "| {} | {} | {:.2} – {:.2} | {:.0} % | {} | {} | {} | {} | {} |",
                w.switch.name(),
                median_mpps(&w.mpps, 1.0),
                w.mpps.min,
                w.mpps.max,
                w.mpps.spread * 100.0,
                ratio(w.vs_yardstick),
                ratio(w.vs_ovs),
                w.cycles_per_packet
                    .map(|v| format!("{:.0}", v.median))
                    .unwrap_or_else(|| "—".into()),
                w.vnf_cycles_per_packet
                    .map(|v| format!("{:.0}", v.median))
                    .unwrap_or_else(|| "—".into()),
                w.vnf_writes_per_s
                    .map(|v| format!("{:.0}", v.median))
                    .unwrap_or_else(|| "—".into()),
            );
        }
        if s.far_trials > 0 {
            let _ = writeln!(
                o,
                "\n{} trial(s) left out: the host had the generator's and the switch's CPUs farther \
                 apart than in the run's nearest placement (a cache line's round trip more than \
                 {:.1}× the fastest), or moved them during the window (its halves' rates more than \
                 {:.1}× apart); see every trial.",
                s.far_trials,
                crate::mrr::NEAR,
                crate::mrr::STEADY
            );
        }
        let _ = writeln!(o);
    }
    for t in r.samples.iter().filter(|t| {
        t.switch_flooded.is_some_and(|f| {
            f as f64 > 0.01 * t.received_mpps * 1e6 * r.config.window.as_secs_f64()
        })
    }) {
        let _ = writeln!(
            o,
            "**Warning**: {} flooded {} frames in round {} ({} B): it never learned where the receiving side is (its learning frame dropped?), \
             so that trial measured flooding, not forwarding to a known destination.\n",
            t.switch.name(),
            t.switch_flooded.unwrap_or(0),
            t.round,
            t.size
        );
    }
    let _ = writeln!(o, "## Every trial\n");
    let _ = writeln!(
        o,
        "| round | size | switch | offered Mpps | received Mpps | bytes/frame out | cycles/packet | PMD busy | bottleneck | VNF cycles/packet | VNF writes/s | CPU supply | CPUs apart, ns before / after; Mpps in the window's halves | CPU speed before: ns a multiply / a load from memory | repeated |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let fastest = r.fastest();
    for t in &r.samples {
        let supply: Vec<String> =
            t.supply.iter().map(|s| format!("cpu{} {:.0} %", s.cpu, s.fraction * 100.0)).collect();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.round,
            t.size,
            t.switch.name(),
            t.offered_mpps,
            t.received_mpps,
            t.received_frame_bytes.map(|b| format!("{b:.0}")).unwrap_or_else(|| "—".into()),
            t.switch_cycles_per_packet.map(|c| format!("{c:.0}")).unwrap_or_else(|| "—".into()),
            t.switch_busy.map(|b| format!("{:.0} %", b * 100.0)).unwrap_or_else(|| "—".into()),
            match t.switch_was_bottleneck {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "unknown",
            },
            t.vnf.cycles_per_packet.map(|c| format!("{c:.0}")).unwrap_or_else(|| "—".into()),
            t.vnf.writes_per_s.map(|w| format!("{w:.0}")).unwrap_or_else(|| "—".into()),
            supply.join(", "),
            {
                let apart = match (t.round_trip_ns, t.halves_mpps) {
                    (Some((b, a)), Some((x, y))) => format!("{b:.0} / {a:.0}; {x:.2} / {y:.2}"),
                    (Some((b, a)), None) => format!("{b:.0} / {a:.0}"),
                    _ => "—".into(),
                };
                if crate::mrr::counted_at(&r.config, &r.samples, t.size, fastest)(t) {
                    apart
                } else {
                    format!("**{apart}** (left out)")
                }
            },
            speeds(&t.speed),
            t.repeated
        );
    }
    o
}

/// Round trips before and after, ns, or a dash.
fn trips(t: Option<(f64, f64)>) -> String {
    t.map(|(b, a)| format!("{b:.0} / {a:.0}")).unwrap_or_else(|| "—".into())
}

/// A trial's [`crate::cpu::Speed`]s as the every-trial table shows them: per CPU, ns a
/// multiply and ns a load from memory.
fn speeds(speed: &[crate::cpu::Speed]) -> String {
    if speed.is_empty() {
        return "—".into();
    }
    let each: Vec<String> = speed
        .iter()
        .map(|s| format!("cpu{} {:.2} / {:.0}", s.cpu, s.alu_ns, s.memory_ns))
        .collect();
    each.join(", ")
}

/// Writes an NDR run's `results.json` and `report.md`.
pub fn write_ndr(dir: &Path, r: &crate::ndr::Results) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(r)?)?;
    std::fs::write(dir.join("report.md"), ndr_markdown(r))?;
    crate::plots::throughput(r, &dir.join("throughput.svg"))?;
    for &size in &r.config.sizes {
        crate::plots::latency(r, size, &dir.join(format!("latency-{size}.svg")))?;
    }
    Ok(())
}

/// A section's title for a frame size.
fn heading(size: crate::frames::FrameSize) -> String {
    match size {
        crate::frames::FrameSize::Bytes(n) => format!("{n} bytes"),
        crate::frames::FrameSize::Imix => {
            "IMIX (64, 570 and 1518 bytes, 7 : 4 : 1; 353.83 bytes on average)".into()
        }
    }
}

fn mpps(v: Option<f64>) -> String {
    v.map(|v| format!("{:.2}", v / 1e6)).unwrap_or_else(|| "—".into())
}

/// `a / b` of two optional rates, as "1.23×".
fn times(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

pub fn ndr_markdown(r: &crate::ndr::Results) -> String {
    use crate::switches::Kind;
    let c = &r.config;
    let mut o = String::new();
    let what = c.scenario.describe();
    let _ = writeln!(o, "# knitter-perf: {what}, NDR, PDR and latency\n");
    o += &baseline_line(&c.switches, c.baseline.as_deref(), c.baseline_toml.as_deref());
    o += &ovs_line(&c.switches, &c.ovs_config);
    let _ = writeln!(
        o,
        "Machine: {} vCPUs, {}. Memory: {:?}. Knitter's pod ports: {}. Switch forwarding thread on CPU {}, generator on CPU {}. \
         {}; frame sizes count the FCS.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu_model(),
        c.memory,
        security(c.port_security),
        c.layout.switch_cpu,
        c.layout.generator_cpu,
        crate::mrr::flows_text(c.flows, c.macs)
    );
    let generator = if c.scenario.is_kernel() {
        format!(
            "AF_XDP sockets, copy mode, on the generator's ends of two veth pairs whose other ends \
             the switch serves (Knitter: AF_XDP or AF_PACKET ports; the Linux bridge; the yardstick: \
             testpmd `io` forwarding between DPDK's `net_af_xdp` ports), rings of {} descriptors. On \
             veth the kernel runs the receiving side's XDP program and copy inside the sender's \
             `sendto`, so each CPU pays for the other side's receive, and the bridge runs entirely \
             on the generator's CPU",
            crate::trial::RING
        )
    } else {
        format!(
            "a vhost-user frontend on each socket, one queue pair of {} descriptors, VERSION_1 + MRG_RXBUF",
            crate::vgen::QUEUE
        )
    };
    let reference = if c.scenario.is_kernel() { Kind::Bridge } else { Kind::Ovs };
    let warmup = if c.warmup.is_zero() {
        String::new()
    } else {
        format!(
            " Each switch, once started, is offered {} s of traffic before its first trial.",
            c.warmup.as_secs_f64()
        )
    };
    let _ = writeln!(
        o,
        "Method: Knitter's own generator ({generator}; one pinned thread) offers frames on A and counts \
         them on B.{warmup} MRR: offering as fast as the switch takes frames, {} s. NDR (no loss) and PDR \
         (≤ 0.5 % loss) by binary search over {} s trials to {:.1} %, the NDR confirmed by one {} s \
         trial (NDR and PDR are the rates asked; the confirmation says what the generator offered: \
         a stall leaves it a little behind). Latency: every frame stamped with the TSC when offered, its age recorded on arrival \
         (HDR histogram), at half the size's lowest NDR for every switch alike. The generator's own \
         ceiling is the yardstick's MRR (testpmd `io` forwarding: no switching).\n",
        c.trial.as_secs_f64(),
        c.trial.as_secs_f64(),
        c.precision * 100.0,
        c.confirm.as_secs_f64()
    );
    let _ = writeln!(o, "![NDR and MRR against frame size](throughput.svg)\n");
    for &size in &c.sizes {
        let here: Vec<&crate::ndr::Measured> =
            r.measured.iter().filter(|m| m.size == size).collect();
        let of = |k: Kind| here.iter().find(|m| m.switch == k);
        let ref_ndr = of(reference).and_then(|m| m.ndr);
        let ref_mrr = of(reference).map(|m| m.mrr.received);
        let _ = writeln!(o, "## {}\n", heading(size));
        let r = reference.name();
        if let Some(rounds) = here.first().map(|m| m.mrr_rounds.len()).filter(|n| *n > 1) {
            let _ = writeln!(o, "{}", rounds_table(&here, rounds));
            let _ = writeln!(o, "\nEach switch's searches:\n");
        }
        let _ = writeln!(
            o,
            "| switch | MRR Mpps | switch busy | MRR × {r} | NDR Mpps | PDR Mpps | NDR confirmed (loss) | NDR × {r} | cycles/packet |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
        for m in &here {
            let _ = writeln!(
                o,
                "| {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                m.switch.name(),
                m.mrr.received / 1e6,
                m.switch_busy.map(|b| format!("{:.0} %", b * 100.0)).unwrap_or_else(|| "—".into()),
                if m.switch == reference {
                    "—".into()
                } else {
                    times(Some(m.mrr.received), ref_mrr)
                },
                mpps(m.ndr),
                mpps(m.pdr),
                m.ndr_confirmed
                    .map(|p| match ((p.offered - p.received) * p.seconds).round() {
                        lost if lost >= 1.0 => format!(
                            "{:.0} s, {:.2} offered: {lost:.0} frames lost ({:.5} %) — not confirmed",
                            p.seconds,
                            p.offered / 1e6,
                            p.loss * 100.0
                        ),
                        _ => format!("{:.0} s, {:.2} offered: no loss", p.seconds, p.offered / 1e6),
                    })
                    .unwrap_or_else(|| "—".into()),
                if m.switch == reference { "—".into() } else { times(m.ndr, ref_ndr) },
                m.switch_cycles_per_packet.map(|v| format!("{v:.0}")).unwrap_or_else(|| "—".into()),
            );
        }
        let _ = writeln!(o);
        if let Some(load) = here.iter().find_map(|m| m.latency.map(|l| l.load)) {
            let _ = writeln!(o, "Latency at {:.2} Mpps (µs):\n", load / 1e6);
            let _ = writeln!(
                o,
                "| switch | p50 | p90 | p99 | p99.9 | max | loss | samples | switch cycles/packet |"
            );
            let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
            for m in &here {
                if let Some(l) = m.latency {
                    let _ = writeln!(
                        o,
                        "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.4} % | {} | {} |",
                        m.switch.name(),
                        l.p50,
                        l.p90,
                        l.p99,
                        l.p999,
                        l.max,
                        l.loss * 100.0,
                        l.samples,
                        l.switch_cycles_per_packet
                            .map(|c| format!("{c:.0}"))
                            .unwrap_or_else(|| "—".into())
                    );
                }
            }
            let _ = writeln!(o, "\n![latency against load, {size} B](latency-{size}.svg)\n");
        }
    }
    if r.measured.iter().any(|m| !m.round_trials.is_empty()) {
        let _ = writeln!(o, "## Every round\n");
        let _ = writeln!(
            o,
            "| size | round | switch | MRR Mpps | bytes/frame out | switch busy | switch cycles/packet | generator's longest stall µs | lowest CPU supply after | CPUs apart, ns before / after | kept |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
        for m in &r.measured {
            for t in &m.round_trials {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {:.2} | {}{} | {} | {} | {:.0} | {:.0} % (CPU {}) | {} | {} |",
                    m.size,
                    t.round,
                    m.switch.name(),
                    t.received / 1e6,
                    t.frame_bytes.map(|b| format!("{b:.0}")).unwrap_or_else(|| "—".into()),
                    if t.bad_completions > 0 {
                        format!(", {} bad completions", t.bad_completions)
                    } else {
                        String::new()
                    },
                    t.switch_busy
                        .map(|b| format!("{:.0} %", b * 100.0))
                        .unwrap_or_else(|| "—".into()),
                    t.switch_cycles_per_packet
                        .map(|c| format!("{c:.0}"))
                        .unwrap_or_else(|| "—".into()),
                    t.longest_gap_us,
                    t.supply.fraction * 100.0,
                    t.supply.cpu,
                    trips(t.round_trip_ns),
                    match (t.kept, t.apart) {
                        (true, false) => "yes",
                        (true, true) => "yes, **apart** (every try was)",
                        (false, true) => "no: apart",
                        (false, false) => "no: starved",
                    }
                );
            }
        }
        let _ = writeln!(o);
    }
    if r.measured.iter().any(|m| m.search_round_trip_ns.is_some()) {
        // The run's nearest placement: the fastest round trip of any probe it kept.
        let fastest = r
            .measured
            .iter()
            .flat_map(|m| {
                m.round_trials.iter().filter_map(|t| t.round_trip_ns).chain(m.search_round_trip_ns)
            })
            .flat_map(|(b, a)| [b, a])
            .fold(f64::INFINITY, f64::min);
        let _ = writeln!(o, "## Where the CPUs were during each search\n");
        let _ = writeln!(
            o,
            "A cache line's round trip between the generator's CPU and the switch's before the MRR trial and search and after them; **bold**: farther apart than {:.1}× the run's nearest ({fastest:.0} ns), so its rates are not comparable with searches run near.\n",
            crate::mrr::NEAR
        );
        let _ = writeln!(o, "| size | switch | CPUs apart, ns before / after |");
        let _ = writeln!(o, "|---|---|---|");
        for m in &r.measured {
            let t = trips(m.search_round_trip_ns);
            let far =
                m.search_round_trip_ns.is_some_and(|(b, a)| b.max(a) > crate::mrr::NEAR * fastest);
            let t = if far { format!("**{t}**") } else { t };
            let _ = writeln!(o, "| {} | {} | {t} |", m.size, m.switch.name());
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "## Every trial\n");
    let _ = writeln!(
        o,
        "| size | switch | asked Mpps | offered Mpps | received Mpps | bytes/frame out | loss | seconds | generator's longest stall µs | repeated |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
    for m in &r.measured {
        for p in std::iter::once(&m.mrr).chain(&m.trials).chain(&m.ndr_confirmed) {
            let asked = if p.asked > 0.0 { format!("{:.3}", p.asked / 1e6) } else { "MRR".into() };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.3} | {:.3} | {} | {:.4} % | {:.1} | {:.0} | {} |",
                m.size,
                m.switch.name(),
                asked,
                p.offered / 1e6,
                p.received / 1e6,
                p.frame_bytes.map(|b| format!("{b:.0}")).unwrap_or_else(|| "—".into()),
                p.loss * 100.0,
                p.seconds,
                p.longest_gap_us,
                p.repeated
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switches::Kind;

    #[test]
    fn the_report_names_what_ovs_was_given_only_when_ovs_ran() {
        let given = ["other_config:smc-enable=true".to_string()];
        assert_eq!(
            ovs_line(&[Kind::Knitter, Kind::Ovs], &given),
            "OVS also given `other_config:smc-enable=true`.\n\n"
        );
        assert_eq!(ovs_line(&[Kind::Knitter], &given), "");
        assert_eq!(ovs_line(&[Kind::Ovs], &[]), "");
    }
}

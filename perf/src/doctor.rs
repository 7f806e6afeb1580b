//! What a run needs, checked one thing at a time: `knitter-perf doctor` prints the list,
//! and `mrr`/`ndr` stop before anything starts when something they need is missing,
//! naming it and the fix.

use crate::machine::{self, Pool};
use crate::scenario::Scenario;
use crate::switches::{self, Kind};
use std::path::Path;
use std::process::{Command, Stdio};

/// One thing a run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub what: &'static str,
    pub ok: bool,
    /// What was found, or (not ok) what to do.
    pub detail: String,
    /// Only a warning: the run goes on without it (slower or with less to report).
    pub optional: bool,
}

/// What the run will be.
pub struct Plan<'a> {
    pub switches: &'a [Kind],
    pub scenario: Scenario,
    /// `mrr`: testpmd generates; `ndr`: Knitter's own generator.
    pub testpmd_generator: bool,
    pub cpus: [usize; 2],
    pub baseline: Option<&'a Path>,
    /// `--memory`: hugepages required (`Some(true)`), never (`Some(false)`), or when they can
    /// be had (`None`, auto).
    pub hugepages: Option<bool>,
    /// The most distinct frames a side (`--macs`, or `--flows` and the sizes): Knitter's
    /// generator keeps a buffer for each.
    pub frames: usize,
}

fn check(what: &'static str, ok: bool, detail: impl Into<String>) -> Check {
    Check { what, ok, detail: detail.into(), optional: false }
}

fn runs(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Every check the plan needs, in the order a user fixes them.
pub fn checks(plan: &Plan) -> Vec<Check> {
    let mut out = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    out.push(check(
        "root",
        root,
        if root {
            "yes"
        } else {
            "run as root: vhost-user sockets, network namespaces and hugepages need it"
        },
    ));
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let [g, s] = plan.cpus;
    out.push(check(
        "CPUs",
        g != s && g < online && s < online,
        format!(
            "generator on CPU {g}, switch on CPU {s}, {online} online{}",
            if g == s || g.max(s) >= online {
                ": --generator-cpu and --switch-cpu must be two different online CPUs"
            } else {
                ""
            }
        ),
    ));
    let kinds = |f: fn(&Kind) -> bool| plan.switches.iter().any(f);
    if kinds(|k| matches!(k, Kind::Knitter | Kind::KnitterAfpacket)) {
        let p = switches::sibling("knitter-vswitchd");
        out.push(check(
            "knitter-vswitchd",
            p.exists(),
            if p.exists() {
                p.display().to_string()
            } else {
                "not beside knitter-perf: cargo build --release -p knitter-vswitchd".into()
            },
        ));
    }
    if plan.switches.contains(&Kind::Baseline) {
        let ok = plan.baseline.is_some_and(Path::exists);
        out.push(check(
            "baseline binary",
            ok,
            plan.baseline
                .map_or("--baseline PATH is needed with the switch baseline".into(), |p| {
                    format!("{}{}", p.display(), if ok { "" } else { ": no such file" })
                }),
        ));
    }
    if plan.testpmd_generator || kinds(|k| *k == Kind::Yardstick) {
        let ok = crate::testpmd::available();
        out.push(check(
            "dpdk-testpmd",
            ok,
            if ok { "installed" } else { "apt-get install dpdk (the generator and the yardstick)" },
        ));
    }
    if kinds(|k| *k == Kind::Ovs) {
        let ok = crate::ovs::available()
            && runs("ovs-vsctl", "--version")
            && runs("ovsdb-tool", "--version");
        out.push(check(
            "Open vSwitch with DPDK",
            ok,
            if ok { "installed" } else { "apt-get install openvswitch-switch-dpdk" },
        ));
    }
    let netns = kinds(|k| *k == Kind::Ovs)
        || plan.scenario.is_kernel()
        || plan.scenario == Scenario::VxlanTwoVteps;
    if netns {
        let ok = runs("ip", "-V");
        out.push(check(
            "iproute2",
            ok,
            if ok { "installed" } else { "apt-get install iproute2 (namespaces and veths)" },
        ));
    }
    if plan.scenario.is_kernel() || plan.scenario == Scenario::VxlanTwoVteps {
        // SAFETY: socket(2) with constant arguments; the descriptor is closed right away.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW, 0) };
        if fd >= 0 {
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
        }
        out.push(check(
            "AF_XDP",
            fd >= 0,
            if fd >= 0 {
                "the kernel has XDP sockets".to_string()
            } else {
                format!(
                    "no XDP sockets: {} (a kernel with CONFIG_XDP_SOCKETS)",
                    std::io::Error::last_os_error()
                )
            },
        ));
    }
    out.push(hugepages(plan, root));
    out.push(placement(plan.cpus));
    out
}

/// Where the host has the generator's and the switch's CPUs now: a cache line's round trip
/// between them, a few probes over half a second. A warning, never a stop: `mrr` probes it
/// around every trial and repeats the ones run farther apart.
fn placement([a, b]: [usize; 2]) -> Check {
    let what = "CPU placement";
    let mut seen = Vec::new();
    for _ in 0..5 {
        match crate::cpu::round_trip(a, b, std::time::Duration::from_millis(20)) {
            Ok(ns) => seen.push(ns),
            Err(e) => {
                return Check {
                    what,
                    ok: false,
                    detail: format!("CPUs {a} and {b}: {e}"),
                    optional: true,
                };
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(80));
    }
    let lo = seen.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = seen.iter().copied().fold(0.0, f64::max);
    let steady = hi <= crate::mrr::NEAR * lo;
    Check {
        what,
        ok: steady,
        detail: if steady {
            format!(
                "CPUs {a} and {b} {lo:.0}–{hi:.0} ns apart (a cache line's round trip); a host \
                 that moves vCPUs changes it for minutes at a time (here ~50 ↔ ~330 ns, every \
                 vhost-user switch ~2× slower apart): mrr probes it around every trial"
            )
        } else {
            format!(
                "CPUs {a} and {b} {lo:.0}–{hi:.0} ns apart within half a second: the host is \
                 moving them; mrr repeats the trials run apart, but pinned, dedicated vCPUs \
                 give steadier numbers"
            )
        },
        optional: true,
    }
}

/// Whether the run can have the hugepages it wants.
fn hugepages(plan: &Plan, root: bool) -> Check {
    let required = plan.hugepages.unwrap_or(false) || machine::hugepages_required(plan.switches);
    let what = "hugepages";
    if plan.hugepages == Some(false) {
        let ovs = machine::hugepages_required(plan.switches);
        return check(
            what,
            !ovs,
            if ovs {
                "ovs needs hugepages: drop --memory plain"
            } else {
                "not used (--memory plain)"
            },
        );
    }
    let Ok(pool) = Pool::read() else { return check(what, !required, "/proc/meminfo unreadable") };
    let need = pool.pages_for(machine::mib_needed(
        plan.switches,
        plan.scenario,
        plan.testpmd_generator,
        plan.frames,
    ));
    let state =
        format!("{} of {} KiB free (of {}), {need} needed", pool.free, pool.page_kib, pool.total);
    if pool.free >= need {
        check(what, true, state)
    } else if root {
        check(
            what,
            true,
            format!("{state}: the run reserves {} and gives them back", need - pool.free),
        )
    } else {
        let c = check(
            what,
            false,
            format!(
                "{state}: run as root, or reserve them first (echo {} > /proc/sys/vm/nr_hugepages){}",
                machine::total_to_ask(pool, need).unwrap_or(pool.persistent()),
                if required { "" } else { ", or --memory plain" }
            ),
        );
        Check { optional: !required, ..c }
    }
}

/// The checks that stop a run, as one message (none: `Ok`).
pub fn require(plan: &Plan) -> anyhow::Result<()> {
    let failed: Vec<String> = checks(plan)
        .into_iter()
        .filter(|c| !c.ok && !c.optional)
        .map(|c| format!("{}: {}", c.what, c.detail))
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "this machine cannot run it yet (knitter-perf doctor lists everything) — {}",
        failed.join("; ")
    );
    Ok(())
}

/// The list as `doctor` prints it.
pub fn render(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|c| {
            format!(
                "{:<7} {:<24} {}\n",
                if c.ok {
                    "ok"
                } else if c.optional {
                    "warning"
                } else {
                    "MISSING"
                },
                c.what,
                c.detail
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_checks_what_its_switches_need() {
        let plan = Plan {
            switches: &[Kind::Knitter, Kind::Ovs],
            scenario: Scenario::L2,
            testpmd_generator: false,
            cpus: [0, 0],
            baseline: None,
            hugepages: Some(false),
            frames: 1,
        };
        let c = checks(&plan);
        let by = |w: &str| c.iter().find(|c| c.what == w).cloned();
        assert!(!by("CPUs").unwrap().ok, "one CPU for both: {c:?}");
        assert!(by("Open vSwitch with DPDK").is_some() && by("dpdk-testpmd").is_none(), "{c:?}");
        let h = by("hugepages").unwrap();
        assert!(!h.ok && !h.optional && h.detail.contains("ovs needs hugepages"), "{h:?}");
        assert!(
            require(&plan)
                .unwrap_err()
                .to_string()
                .contains("CPUs: generator on CPU 0, switch on CPU 0")
        );
        let text = render(&c);
        assert!(text.lines().any(|l| l.starts_with("MISSING CPUs")), "{text}");
        let yard = Plan {
            switches: &[Kind::Yardstick, Kind::Baseline],
            scenario: Scenario::L2,
            testpmd_generator: true,
            cpus: [0, 1],
            baseline: Some(Path::new("/nonexistent/knitter-vswitchd")),
            hugepages: None,
            frames: 1,
        };
        let c = checks(&yard);
        assert!(
            c.iter().any(|c| c.what == "dpdk-testpmd")
                && c.iter().any(|c| c.what == "baseline binary" && !c.ok),
            "{c:?}"
        );
    }
}

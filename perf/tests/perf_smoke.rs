//! A short smoke run of knitter-perf's L2 scenario as a user runs it: one round, 64-byte
//! frames, one second of warm-up and one of measurement, Knitter against the yardstick.
//! Checks the plumbing (both switches forward, the report is written, Knitter's own
//! counters were read), never a number. Needs root and dpdk-testpmd (fails under CI
//! without them, skips elsewhere); in the `serial` nextest group (PMD threads).

use std::process::Command;

#[test]
fn a_short_l2_run_forwards_through_both_switches_and_reports() {
    let has_testpmd = Command::new("dpdk-testpmd").arg("--version").output().is_ok();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !(has_testpmd && root) {
        assert!(std::env::var_os("CI").is_none(), "CI must run this: root and dpdk-testpmd (ci/setup.sh) are needed");
        eprintln!("skipped: needs root and dpdk-testpmd");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(["mrr", "--rounds", "1", "--sizes", "64", "--warmup", "1", "--window", "1", "--retries", "0", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let samples = r["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{r}");
    for s in samples {
        assert!(s["received_mpps"].as_f64().unwrap() > 0.0, "nothing came through: {s}");
    }
    assert!(samples[0]["switch_cycles_per_packet"].as_f64().is_some(), "Knitter's counters were read: {}", samples[0]);
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("| knitter |") && md.contains("| yardstick |") && md.contains("× yardstick"), "{md}");
}

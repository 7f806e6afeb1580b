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

/// The NDR/PDR run with Knitter's own generator, in short trials: MRR, both searches, the
/// confirmation and the latency trials all happen, and the report says so.
#[test]
fn a_short_ndr_run_finds_rates_and_latency_with_knitters_generator() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: needs root");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(["ndr", "--switches", "knitter", "--sizes", "64", "--trial", "0.3", "--confirm", "0.5", "--precision", "0.25", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let m = &r["measured"][0];
    assert!(m["mrr"]["received"].as_f64().unwrap() > 0.0, "nothing came through: {m}");
    assert!(!m["trials"].as_array().unwrap().is_empty(), "no search trials: {m}");
    assert!(m["pdr"].as_f64().is_some_and(|p| p > 0.0), "a PDR exists below the MRR: {m}");
    assert!(m["switch_cycles_per_packet"].as_f64().is_some(), "Knitter's counters were read: {m}");
    let lat = &m["latency"];
    assert!(lat["samples"].as_u64().unwrap() > 0 && lat["p50"].as_f64().unwrap() > 0.0, "latency measured: {m}");
    assert!(lat["p50"].as_f64() <= lat["p99"].as_f64() && lat["p99"].as_f64() <= lat["max"].as_f64(), "{lat}");
    assert_eq!(m["latency_curve"].as_array().unwrap().len(), 3, "{m}");
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("| knitter |") && md.contains("Latency at"), "{md}");
}

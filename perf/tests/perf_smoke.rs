//! Short smoke runs of knitter-perf as a user runs it, seconds each: the MRR comparison
//! (testpmd as the generator; L2 with Knitter against the yardstick, VLAN and VXLAN), and `ndr` with Knitter's own
//! generator in the L2 (with IMIX), VLAN, both VXLAN and the veth scenarios. They check the
//! plumbing (frames come out, searches and latency trials happen, Knitter's counters are
//! read, the report is written), never a number. Need root (and dpdk-testpmd for the MRR run): they fail under
//! CI without them and skip elsewhere; in the `serial` nextest group (PMD threads).

use std::process::Command;

/// Whether the machine can run these; under CI it must.
fn can_run(testpmd: bool) -> bool {
    let has_testpmd = !testpmd || Command::new("dpdk-testpmd").arg("--version").output().is_ok();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !(has_testpmd && root) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this: root and dpdk-testpmd (ci/setup.sh) are needed"
        );
        eprintln!("skipped: needs root and dpdk-testpmd");
    }
    has_testpmd && root
}

/// Runs `knitter-perf ARGS --out TMP`; its results.json and report.md.
fn knitter_perf(args: &[&str]) -> (serde_json::Value, String) {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(args)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "knitter-perf {args:?}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let r =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    (r, std::fs::read_to_string(out.path().join("report.md")).unwrap())
}

#[test]
fn a_short_l2_run_forwards_through_both_switches_and_reports() {
    if !can_run(true) {
        return;
    }
    // 1518-byte frames take Knitter's single-copy path (DPDK's net_virtio_user on both sides).
    let (r, md) = knitter_perf(&[
        "mrr",
        "--rounds",
        "1",
        "--sizes",
        "64,1518",
        "--warmup",
        "1",
        "--window",
        "1",
        "--retries",
        "0",
    ]);
    let samples = r["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 4, "{r}");
    for s in samples.iter() {
        assert!(s["received_mpps"].as_f64().unwrap() > 0.0, "nothing came through: {s}");
        let size = s["size"].as_f64().unwrap();
        assert_eq!(
            s["received_frame_bytes"].as_f64().map(f64::round),
            Some(size - 4.0),
            "frames arrive whole: {s}"
        );
    }
    let samples: Vec<&serde_json::Value> = samples
        .iter()
        .filter(|s| s["received_frame_bytes"].as_f64().is_some_and(|b| b < 100.0))
        .collect();
    assert!(
        samples[0]["switch_cycles_per_packet"].as_f64().is_some(),
        "Knitter's counters were read: {}",
        samples[0]
    );
    for s in &samples {
        // What the switch cost the VNF: testpmd's forwarding cycles and its system calls.
        assert!(
            s["vnf"]["cycles_per_packet"].as_f64().is_some_and(|c| c > 0.0),
            "the VNF's cycles were read: {s}"
        );
        assert!(
            s["vnf"]["writes_per_s"].as_f64().is_some(),
            "the VNF's system calls were read: {s}"
        );
    }
    assert!(md.contains("VNF cycles/packet"), "{md}");
    // Where the host had the two CPUs: a cache line's round trip before and after each trial.
    for s in &samples {
        let apart = s["round_trip_ns"].as_array().expect("the CPUs' round trip was probed");
        assert!(apart.iter().all(|ns| ns.as_f64().is_some_and(|ns| ns > 0.0)), "{s}");
        let halves = s["halves_mpps"].as_array().expect("the window's halves were read");
        assert!(halves.iter().all(|m| m.as_f64().is_some_and(|m| m > 0.0)), "{s}");
    }
    assert!(md.contains("CPUs apart, ns"), "{md}");
    // Knitter learned B from the generator's learning frame (B's own MAC and IP, through B's
    // port security): nothing is flooded in the window.
    assert_eq!(samples[0]["switch_flooded"].as_u64(), Some(0), "{}", samples[0]);
    assert!(
        md.contains("| knitter |") && md.contains("| yardstick |") && md.contains("× yardstick"),
        "{md}"
    );
}

/// A sweep over the VNF's ring sizes, as a perf lab compares switches across what VNFs
/// configure: each size forwards, the threshold follows the ring (`ring-32`), and one table,
/// a plot and each size's own report are written.
#[test]
fn a_sweep_over_ring_sizes_reports_every_size_in_one_table() {
    if !can_run(true) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(["mrr", "--switches", "knitter", "--sizes", "64", "--rounds", "1"])
        .args(["--warmup", "0.5", "--window", "0.5", "--retries", "0"])
        .args(["--vnf-ring", "256,4096", "--vnf-tx-free", "ring-32", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let runs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("sweep.json")).unwrap()).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "one result a ring size");
    for (r, (ring, free)) in runs.iter().zip([(256, 224), (4096, 4064)]) {
        assert_eq!(r["config"]["vnf"]["ring"].as_u64(), Some(ring), "{}", r["config"]);
        assert_eq!(r["config"]["vnf"]["tx_free"].as_u64(), Some(free), "{}", r["config"]);
        let s = &r["samples"][0];
        assert!(s["received_mpps"].as_f64().unwrap() > 0.0, "nothing came through: {s}");
        assert!(out.path().join(format!("ring-{ring}/report.md")).exists());
    }
    let md = std::fs::read_to_string(out.path().join("sweep.md")).unwrap();
    assert!(md.contains("| 256 | 224 | 64 | knitter |"), "{md}");
    assert!(md.contains("| 4096 | 4064 | 64 | knitter |"), "{md}");
    let svg = std::fs::read_to_string(out.path().join("sweep-64.svg")).unwrap();
    assert!(svg.contains("4096") && svg.contains("knitter"), "the plot labels sizes and switches");
}

/// The MRR comparison in the VLAN and VXLAN scenarios, testpmd's `net_virtio_user` as the
/// generator: the learning frame (tagged on the trunk, from the remote VTEP on the underlay)
/// teaches the switch where the counting side is, so frames come out of the scenario's size
/// and nothing is flooded; a scenario testpmd cannot drive is refused in one line.
#[test]
fn short_vlan_and_vxlan_mrr_runs_learn_and_forward() {
    if !can_run(true) {
        return;
    }
    for (scenario, out) in
        [("vlan-push", 64.0), ("vlan-pop", 60.0), ("vxlan-encap", 110.0), ("vxlan-decap", 60.0)]
    {
        let (r, md) = knitter_perf(&[
            "mrr",
            "--scenario",
            scenario,
            "--switches",
            "knitter",
            "--rounds",
            "1",
            "--sizes",
            "64",
            "--warmup",
            "1",
            "--window",
            "1",
            "--retries",
            "0",
        ]);
        let s = &r["samples"][0];
        assert!(
            s["received_mpps"].as_f64().unwrap() > 0.0,
            "{scenario}: nothing came through: {s}"
        );
        assert_eq!(
            s["received_frame_bytes"].as_f64().map(f64::round),
            Some(out),
            "{scenario}: {s}"
        );
        assert_eq!(
            s["switch_flooded"].as_u64(),
            Some(0),
            "{scenario}: the learning frame was heard: {s}"
        );
        assert_eq!(r["config"]["scenario"], scenario);
        assert!(md.contains("VXLAN") || md.contains("VLAN"), "{md}");
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(["mrr", "--scenario", "veth", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && err.contains("runs with ndr") && err.lines().count() == 1,
        "{err}"
    );
}

/// The NDR/PDR run with Knitter's own generator, in short trials: alternated MRR rounds,
/// MRR, both searches, the confirmation and the latency trials all happen, and the report
/// says so; IMIX frames come out in their mix.
#[test]
fn a_short_ndr_run_finds_rates_and_latency_with_knitters_generator() {
    if !can_run(false) {
        return;
    }
    let (r, md) = knitter_perf(&[
        "ndr",
        "--switches",
        "knitter",
        "--sizes",
        "64,imix",
        "--rounds",
        "2",
        "--trial",
        "0.3",
        "--confirm",
        "0.5",
        "--precision",
        "0.25",
    ]);
    let imix = &r["measured"][1];
    assert_eq!(imix["size"], "imix");
    // 7 × 60, 4 × 566, 1 × 1514 bytes without FCS: ~350 on average (the 1 024 descriptors
    // hold 85 periods and a third of one).
    let bytes = imix["mrr"]["frame_bytes"].as_f64().unwrap();
    assert!((340.0..360.0).contains(&bytes), "IMIX came out at {bytes} bytes per frame: {imix}");
    assert!(md.contains("## IMIX"), "{md}");
    assert_eq!(
        imix["mrr_rounds"].as_array().map(Vec::len),
        Some(2),
        "two alternated MRR rounds: {imix}"
    );
    assert!(md.contains("MRR over 2 rounds"), "{md}");
    let m = &r["measured"][0];
    assert!(m["mrr"]["received"].as_f64().unwrap() > 0.0, "nothing came through: {m}");
    assert!(!m["trials"].as_array().unwrap().is_empty(), "no search trials: {m}");
    assert!(m["pdr"].as_f64().is_some_and(|p| p > 0.0), "a PDR exists below the MRR: {m}");
    assert!(m["switch_cycles_per_packet"].as_f64().is_some(), "Knitter's counters were read: {m}");
    let lat = &m["latency"];
    assert!(
        lat["samples"].as_u64().unwrap() > 0 && lat["p50"].as_f64().unwrap() > 0.0,
        "latency measured: {m}"
    );
    assert!(
        lat["p50"].as_f64() <= lat["p99"].as_f64() && lat["p99"].as_f64() <= lat["max"].as_f64(),
        "{lat}"
    );
    assert_eq!(m["latency_curve"].as_array().unwrap().len(), 3, "{m}");
    assert!(md.contains("| knitter |") && md.contains("Latency at"), "{md}");
    // Where the host had the two CPUs: around every round's trial and every search.
    for m in r["measured"].as_array().unwrap() {
        let trips = m["search_round_trip_ns"].as_array().expect("the search's round trips");
        assert!(trips.iter().all(|t| t.as_f64().is_some_and(|ns| ns > 0.0)), "{m}");
        for t in m["round_trials"].as_array().unwrap() {
            assert!(t["round_trip_ns"].as_array().is_some_and(|a| a.len() == 2), "{t}");
        }
    }
    assert!(md.contains("## Where the CPUs were during each search"), "{md}");
}

/// VLAN access → trunk and back, VXLAN encapsulation and decapsulation through Knitter (its
/// underlay on the second vhost-user port, the generator playing the remote VTEP), and two
/// Knitter VTEPs: frames come out, of the size the scenario makes them.
#[test]
fn short_vlan_and_vxlan_runs_tag_encapsulate_and_decapsulate() {
    if !can_run(false) {
        return;
    }
    // What comes out of 64-byte frames: tagged (68 on the wire), untagged, in VXLAN (114),
    // or inner.
    // Two Knitter switches as VTEPs over an AF_XDP veth underlay: pod to pod, 60 bytes.
    for (scenario, out) in [
        ("vlan-push", 64.0),
        ("vlan-pop", 60.0),
        ("vxlan-encap", 110.0),
        ("vxlan-decap", 60.0),
        ("vxlan-2vteps", 60.0),
    ] {
        let (r, md) = knitter_perf(&[
            "ndr",
            "--scenario",
            scenario,
            "--switches",
            "knitter",
            "--sizes",
            "64",
            "--trial",
            "0.3",
            "--confirm",
            "0",
            "--precision",
            "0.5",
        ]);
        let m = &r["measured"][0];
        assert!(
            m["mrr"]["received"].as_f64().unwrap() > 0.0,
            "{scenario}: nothing came through: {m}"
        );
        assert_eq!(m["mrr"]["frame_bytes"].as_f64().map(f64::round), Some(out), "{scenario}: {m}");
        // The latency stamp is found where the scenario moved it (a stamp read from the
        // wrong place gives ages of zero or of hours).
        let lat = &m["latency"];
        let (p50, max) = (lat["p50"].as_f64().unwrap(), lat["max"].as_f64().unwrap());
        assert!(p50 > 0.0 && max < 1e6, "{scenario}: latency {lat}");
        assert_eq!(r["config"]["scenario"], scenario);
        assert!(md.contains("VXLAN") || md.contains("VLAN"), "{md}");
    }
}

/// The kernel-interface scenario: the generator on AF_XDP sockets at one end of two veth
/// pairs, and at the other Knitter (AF_XDP ports, then AF_PACKET ports), the Linux bridge
/// and the yardstick on DPDK's AF_XDP ports: frames come out whole through each, and
/// Knitter's cycles are read at the common load too.
#[test]
fn a_short_veth_run_forwards_through_kernel_ports_and_the_bridge() {
    if !can_run(true) {
        return;
    }
    let (r, md) = knitter_perf(&[
        "ndr",
        "--scenario",
        "veth",
        "--switches",
        "knitter,knitter-afpacket,bridge,yardstick",
        "--sizes",
        "64",
        "--trial",
        "0.3",
        "--confirm",
        "0",
        "--precision",
        "0.5",
    ]);
    let measured = r["measured"].as_array().unwrap();
    assert_eq!(measured.len(), 4, "{r}");
    for m in measured {
        assert!(m["mrr"]["received"].as_f64().unwrap() > 0.0, "nothing came through: {m}");
        assert_eq!(m["mrr"]["frame_bytes"].as_f64().map(f64::round), Some(60.0), "{m}");
        assert!(m["latency"]["p50"].as_f64().unwrap() > 0.0, "{m}");
    }
    for m in &measured[..2] {
        assert!(
            m["latency"]["switch_cycles_per_packet"].as_f64().is_some(),
            "Knitter's cycles at the common load: {m}"
        );
    }
    assert!(md.contains("| bridge |") && md.contains("× bridge"), "{md}");
}

/// The hugepage pool's own size (`nr_hugepages`), not counting surplus pages a DPDK process
/// of an earlier run still holds while it exits.
fn hugepages_total() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap().trim().parse().unwrap()
}

/// A run on a machine with too few hugepages reserved prepares them (as root) and gives
/// them back when it ends; its headline carries a confidence interval and every round's
/// details. As another user it stops at once, in one line, with what to do — no backtrace.
#[test]
fn the_lab_prepares_hugepages_and_gives_them_back() {
    if !can_run(false) {
        return;
    }
    let before = hugepages_total();
    let out = tempfile::tempdir().unwrap();
    let args = [
        "ndr",
        "--switches",
        "knitter",
        "--memory",
        "hugepages",
        "--sizes",
        "64",
        "--rounds",
        "3",
        "--trial",
        "0.3",
        "--confirm",
        "0",
        "--precision",
        "0.5",
    ];
    let run = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(args)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(
        hugepages_total(),
        before,
        "the hugepages the run reserved were given back: {stderr}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(r["config"]["memory"], "Hugepages", "{r}");
    let m = &r["measured"][0];
    assert_eq!(
        m["round_trials"].as_array().map(Vec::len).unwrap_or(0) as u64,
        3 + m["rounds_repeated"].as_u64().unwrap(),
        "{m}"
    );
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(md.contains("MRR Mpps median (95 % CI)") && md.contains("## Every round"), "{md}");

    // The same as an unprivileged user: refused before anything starts.
    let bin = tempfile::Builder::new().prefix("kp-bin.").tempdir().unwrap();
    let exe = bin.path().join("knitter-perf");
    std::fs::copy(env!("CARGO_BIN_EXE_knitter-perf"), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(args)
        .arg("--out")
        .arg(bin.path().join("out"))
        .env("RUST_BACKTRACE", "1")
        .current_dir(bin.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line, no backtrace: {stderr}");
    assert!(
        stderr.starts_with("knitter-perf: this machine cannot run it yet")
            && stderr.contains("root: run as root"),
        "{stderr}"
    );
    assert_eq!(hugepages_total(), before);

    // The doctor names what is missing and fails.
    let doc = Command::new(env!("CARGO_BIN_EXE_knitter-perf"))
        .args(["doctor", "--switch-cpu", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doc.stdout);
    assert_eq!(doc.status.code(), Some(1), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("MISSING CPUs"))
            && text.lines().any(|l| l.starts_with("ok      knitter-vswitchd")),
        "{text}"
    );
}

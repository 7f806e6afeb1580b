//! Pods attached per second and ADD latency (p50, p99, max) through knitter-cni as a
//! runtime runs it (a process per call, the configuration on stdin) against a release
//! knitter-vswitchd and knitter-manager in a node namespace: each ADD gets a port from the
//! manager, plumbs a veth into a pod namespace and attaches an AF_XDP port. Then the same
//! for DEL. Not a test: run by hand (root), numbers go to docs/perf/control-plane.md.
//!
//!     cargo build --release --workspace && cargo bench -p knitter-cni --bench attach [-- PODS]

#[path = "../tests/lab/mod.rs"]
mod lab;

use std::time::{Duration, Instant};

fn report(what: &str, mut lat: Vec<Duration>, wall: Duration) {
    lat.sort();
    let q = |f: f64| lat[((lat.len() as f64 * f) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "{what:<4} {:>4} calls  {:>6.1}/s  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms",
        lat.len(),
        lat.len() as f64 / wall.as_secs_f64(),
        q(0.5),
        q(0.99),
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
}

fn main() {
    if !vswitch::testkit::netns::available() {
        println!("needs root and iproute2 (network namespaces)");
        return;
    }
    let pods: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(100);
    let lab = lab::Lab::start();
    assert!(lab.mctl(&["network", "create", "bench", "--ipv4", "10.63.0.0/20"]).status.success());
    let conf = lab.conf("1.1.0", "bench");
    let ns: Vec<_> = (0..pods).map(|i| lab::pod(&format!("b{i}"))).collect();
    let mut lat = Vec::with_capacity(pods);
    let start = Instant::now();
    for (i, (_, path)) in ns.iter().enumerate() {
        let t = Instant::now();
        let (ok, r) = lab.cni("ADD", &format!("bench-{i}"), path, "eth0", &conf);
        assert!(ok, "{r}");
        lat.push(t.elapsed());
    }
    report("ADD", lat, start.elapsed());
    let mut lat = Vec::with_capacity(pods);
    let start = Instant::now();
    for (i, (_, path)) in ns.iter().enumerate() {
        let t = Instant::now();
        assert!(lab.cni("DEL", &format!("bench-{i}"), path, "eth0", &conf).0);
        lat.push(t.elapsed());
    }
    report("DEL", lat, start.elapsed());
}

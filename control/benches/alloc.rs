//! Port allocations per second and their latency (p50, p99, max) through the manager
//! (`Manager::create_port`: the port record, the address claim, the final record), on the
//! embedded store and on a real etcd (started here when `etcd` is installed), with 1 and
//! 16 concurrent clients. Not a test: run by hand, numbers go to docs/perf.md.
//!
//!     cargo bench -p knitter-control --bench alloc [-- PORTS]

use knitter_control::manager::objects::PortSpec;
use knitter_control::manager::{Config, Manager};
use knitter_control::network::{Kind, NetworkSpec, Plane, SubnetSpec};
use knitter_control::store::Store;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn network() -> NetworkSpec {
    NetworkSpec {
        name: "bench".into(),
        tenant: "admin".into(),
        kind: Kind::Vxlan,
        plane: Plane::Std,
        segment: None,
        ipv4: Some(SubnetSpec { cidr: "10.128.0.0/14".into(), gateway: None, pools: vec![] }),
        ipv6: None,
        mtu: None,
        shared: false,
    }
}

/// `ports` creates spread over `clients` threads; prints the rate and latencies.
fn run(label: &'static str, store: Arc<dyn Store>, clients: usize, ports: usize) {
    let m = Arc::new(Manager::new(store, Config::default()).expect("manager"));
    m.create_network(network()).expect("network");
    let per = ports / clients;
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let spec = PortSpec { network: "bench".into(), container: format!("{label}-{t}-{i}"), interface: "eth0".into(), pod: String::new(), node: String::new(), ips: vec![], ip_group: None, requested_mac: None };
                        let t0 = Instant::now();
                        m.create_port(spec).expect("create");
                        t0.elapsed()
                    })
                    .collect::<Vec<Duration>>()
            })
        })
        .collect();
    let mut lat: Vec<Duration> = threads.into_iter().flat_map(|t| t.join().expect("client")).collect();
    let wall = start.elapsed();
    lat.sort();
    let q = |f: f64| lat[((lat.len() as f64 * f) as usize).min(lat.len() - 1)];
    println!(
        "{label:<9} {clients:>2} clients  {:>6} ports  {:>7.0} allocs/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
        lat.len(),
        lat.len() as f64 / wall.as_secs_f64(),
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
}

struct EtcdProc(Child);

impl Drop for EtcdProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let ports: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2000);
    let dir = tempfile::tempdir().expect("tempdir");
    for clients in [1, 16] {
        let path = dir.path().join(format!("embedded-{clients}.redb"));
        let store = knitter_control::store::embedded::Embedded::open(&path).expect("embedded store");
        run("embedded", Arc::new(store), clients, ports);
    }
    if Command::new("etcd").arg("--version").output().is_err() {
        println!("etcd: not installed, skipped");
        return;
    }
    let port = |p: u16| p + (std::process::id() % 1000) as u16;
    let (c, p) = (format!("http://127.0.0.1:{}", port(42379)), format!("http://127.0.0.1:{}", port(42380)));
    let _etcd = EtcdProc(
        Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c, "--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("bench={p}"), "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd"),
    );
    for clients in [1, 16] {
        let prefix = format!("/bench-{clients}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let store = loop {
            match knitter_control::store::etcd::Etcd::connect(std::slice::from_ref(&c), &prefix).and_then(|s| s.revision().map(|_| s)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("etcd: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        run("etcd", Arc::new(store), clients, ports);
    }
}

//! Port allocations per second and their latency (p50, p99, max) through the manager
//! (`Manager::create_port`), as users run it: the embedded store (1 and 16 clients), and a
//! real etcd started here on a disk-backed data directory with default fsync (skipped when
//! `etcd` is not installed): one manager with one client, **two manager replicas with 50
//! clients** between them, and a replica started on a network with 10 000 addresses taken
//! (its first allocation's latency). Beside the manager's numbers, etcd's own rate for the
//! same work without the IPAM (50 clients each creating two keys in one transaction) and the
//! etcd requests each allocation cost (from etcd's metrics). Not a test: run by hand, the
//! numbers go to docs/perf/control-plane.md.
//!
//!     cargo bench -p knitter-manager --bench alloc [-- PORTS]

use knitter_manager::manager::objects::PortSpec;
use knitter_manager::manager::{Config, Manager};
use knitter_manager::network::{Kind, NetworkSpec, Plane, SubnetSpec};
use knitter_manager::store::Store;
use knitter_manager::store::etcd::Etcd;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/common/etcd_requests.rs"]
mod etcd_requests;
use etcd_requests::{Requests, requests};

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
        pod_policer: None,
        sriov_pool: None,
        pod_chooses_vf: false,
        node_gateway: false,
        masquerade: false,

        clusters: vec![],
    }
}

fn port(name: String) -> PortSpec {
    PortSpec {
        network: "bench".into(),
        container: name,
        interface: "eth0".into(),
        pod: String::new(),
        node: String::new(),
        ips: vec![],
        ip_group: None,
        requested_mac: None,
        pod_uid: String::new(),
        device_info: None,
    }
}

/// Latencies of one run, sorted, and its wall time.
struct Run {
    lat: Vec<Duration>,
    wall: Duration,
}

impl Run {
    fn q(&self, f: f64) -> f64 {
        self.lat[((self.lat.len() as f64 * f) as usize).min(self.lat.len() - 1)].as_secs_f64() * 1e3
    }

    fn print(&self, label: &str, extra: &str) {
        println!(
            "{label:<28} {:>6} ports  {:>7.0} allocs/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms{extra}",
            self.lat.len(),
            self.lat.len() as f64 / self.wall.as_secs_f64(),
            self.q(0.5),
            self.q(0.99),
            self.lat[self.lat.len() - 1].as_secs_f64() * 1e3
        );
    }
}

/// `ports` creates spread over `clients` threads, client `t` on replica `t % managers`.
fn run(tag: &str, managers: &[Arc<Manager>], clients: usize, ports: usize) -> Run {
    let per = ports / clients;
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let m = managers[t % managers.len()].clone();
            let tag = tag.to_string();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let t0 = Instant::now();
                        m.create_port(port(format!("{tag}-{t}-{i}"))).expect("create");
                        t0.elapsed()
                    })
                    .collect::<Vec<Duration>>()
            })
        })
        .collect();
    let mut lat: Vec<Duration> =
        threads.into_iter().flat_map(|t| t.join().expect("client")).collect();
    let wall = start.elapsed();
    lat.sort();
    Run { lat, wall }
}

fn manager(store: Arc<dyn Store>) -> Arc<Manager> {
    Arc::new(Manager::new(store, Config::default()).expect("manager"))
}

struct EtcdProc(Child);

impl Drop for EtcdProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd without the IPAM: `clients` tasks each creating `per` key pairs, one transaction
/// (two create-revision compares, two puts) a pair, as a claim does.
fn raw_txns(url: &str, clients: usize, per: usize) -> Run {
    use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Client::connect([url], None).await.expect("etcd client");
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|t| {
                let mut c = client.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(per);
                    for i in 0..per {
                        let (a, b) = (format!("/raw/a/{t}/{i}"), format!("/raw/o/{t}/{i}"));
                        let txn = Txn::new()
                            .when(vec![
                                Compare::create_revision(a.as_str(), CompareOp::Equal, 0),
                                Compare::create_revision(b.as_str(), CompareOp::Equal, 0),
                            ])
                            .and_then(vec![
                                TxnOp::put(a.as_str(), "x", None),
                                TxnOp::put(b.as_str(), "y", None),
                            ]);
                        let t0 = Instant::now();
                        c.txn(txn).await.expect("txn");
                        lat.push(t0.elapsed());
                    }
                    lat
                })
            })
            .collect();
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.expect("task"));
        }
        let wall = start.elapsed();
        lat.sort();
        Run { lat, wall }
    })
}

fn connect(url: &str, prefix: &str) -> Arc<dyn Store> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Etcd::connect(&[url.to_string()], prefix).and_then(|s| s.revision().map(|_| s)) {
            Ok(s) => return Arc::new(s),
            Err(e) if Instant::now() > deadline => panic!("etcd: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Prints `r` with the etcd requests it cost per allocation (counters `before` → now).
fn print_with_requests(r: &Run, label: &str, url: &str, before: Requests) {
    let d = requests(url) - before;
    let n = r.lat.len() as f64;
    r.print(
        label,
        &format!(
            "  per alloc: {:.2} txn {:.2} range {:.2} writes",
            d.txn / n,
            d.range / n,
            d.proposals / n
        ),
    );
}

fn main() {
    let ports: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2000);
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on disk");
    for clients in [1, 16] {
        let path = dir.path().join(format!("embedded-{clients}.redb"));
        let store =
            knitter_manager::store::embedded::Embedded::open(&path).expect("embedded store");
        let m = manager(Arc::new(store));
        m.create_network(network()).expect("network");
        run("e", &[m], clients, ports).print(&format!("embedded, {clients} clients"), "");
    }
    if Command::new("etcd").arg("--version").output().is_err() {
        println!("etcd: not installed, skipped");
        return;
    }
    let offset = |p: u16| p + (std::process::id() % 1000) as u16;
    let (url, peer) = (
        format!("http://127.0.0.1:{}", offset(42379)),
        format!("http://127.0.0.1:{}", offset(42380)),
    );
    let _etcd = EtcdProc(
        Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &format!("bench={peer}"),
                "--log-level",
                "error",
                "--quota-backend-bytes",
                "8589934592",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd"),
    );
    let _ = connect(&url, "/warmup");

    let before = requests(&url);
    let raw = raw_txns(&url, 50, ports / 50);
    print_with_requests(&raw, "etcd alone, 50 clients", &url, before);

    let one = manager(connect(&url, "/one"));
    one.create_network(network()).expect("network");
    let before = requests(&url);
    let r = run("o", &[one], 1, ports);
    print_with_requests(&r, "etcd, 1 replica, 1 client", &url, before);

    let (a, b) = (manager(connect(&url, "/two")), manager(connect(&url, "/two")));
    a.create_network(network()).expect("network");
    let before = requests(&url);
    let r = run("t", &[a, b], 50, ports.max(50));
    print_with_requests(&r, "etcd, 2 replicas, 50 clients", &url, before);

    // A replica that starts on a network whose addresses are mostly taken already.
    let filler = manager(connect(&url, "/restart"));
    filler.create_network(network()).expect("network");
    let taken = 10_000;
    // One replica fills from the pools' start: the run a new replica walks into first.
    run("f", &[filler], 50, taken).print("filling 10 000 (1 replica)", "");
    let fresh = manager(connect(&url, "/restart"));
    let before = requests(&url);
    let t0 = Instant::now();
    let (got, _) = fresh.create_port(port("fresh-0".into())).expect("first create");
    let first = t0.elapsed();
    let d = requests(&url) - before;
    println!(
        "a new replica, 10 000 taken:  first allocation {:.2} ms ({}; {} txn, {} range)",
        first.as_secs_f64() * 1e3,
        got.addresses[0].address,
        d.txn,
        d.range
    );
    let next = run("n", &[fresh], 1, 100);
    next.print("  its next 100 (1 client)", "");
}

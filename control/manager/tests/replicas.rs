//! knitter-manager processes under load, killed with SIGKILL mid-way and restarted: two
//! replicas on one real etcd (Debian's etcd-server, started by the test) serving 50
//! concurrent gRPC clients 2 000 ports, and one manager on its embedded store. Clients
//! retry a failed request (on the other replica, when there is one), as the CNI does. After
//! the run: every port has its own address, the store holds exactly the ports' addresses
//! (nothing lost, nothing leaked), and a retried request returns the port it first made.

mod common;

use common::{EtcdServer, ManagerProc, TOKEN, free_port};
use knitter_api::manager as pb;
use knitter_manager::store::Store;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

type Client = pb::manager_client::ManagerClient<Channel>;

fn client(addr: &str) -> Client {
    Client::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect_lazy(),
    )
}

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

fn spec(container: &str) -> pb::PortSpec {
    pb::PortSpec {
        network: "red".into(),
        container: container.into(),
        interface: "eth0".into(),
        pod: format!("ns/{container}"),
        node: "n1".into(),
        ..Default::default()
    }
}

/// Creates the port through `replicas[first]`, moving to the next replica after each
/// failure, until it succeeds (within 90 s).
async fn create(replicas: &[Client], first: usize, container: &str) -> pb::Port {
    let deadline = Instant::now() + Duration::from_secs(90);
    for attempt in 0.. {
        let mut c = replicas[(first + attempt) % replicas.len()].clone();
        match c.create_port(authed(spec(container))).await {
            Ok(r) => return r.into_inner().port.expect("a port"),
            Err(e) => {
                assert!(Instant::now() < deadline, "{container}: still failing: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    unreachable!()
}

/// 50 clients × `per` ports over `replicas`; `at_half` runs once half are made.
async fn load(
    replicas: Vec<Client>,
    per: usize,
    at_half: impl FnOnce() + Send + 'static,
) -> Vec<pb::Port> {
    let done = Arc::new(AtomicUsize::new(0));
    let total = 50 * per;
    let replicas = Arc::new(replicas);
    let tasks: Vec<_> = (0..50)
        .map(|t| {
            let (replicas, done) = (replicas.clone(), done.clone());
            tokio::spawn(async move {
                let mut made = Vec::with_capacity(per);
                for i in 0..per {
                    made.push(create(&replicas, t, &format!("c{t}-{i}")).await);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                made
            })
        })
        .collect();
    let watcher = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            while done.load(Ordering::Relaxed) < total / 2 {
                std::thread::sleep(Duration::from_millis(5));
            }
            at_half();
        })
    };
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    watcher.await.unwrap();
    all
}

/// Every port has an address of its own, and the store holds exactly those.
fn check_invariants(ports: &[pb::Port], store: &dyn Store, expected: usize) {
    assert_eq!(ports.len(), expected);
    let addrs: Vec<IpAddr> = ports
        .iter()
        .map(|p| p.addresses.first().expect("an address").address.parse().unwrap())
        .collect();
    let distinct: HashSet<IpAddr> = addrs.iter().copied().collect();
    assert_eq!(distinct.len(), expected, "no address twice");
    let held: HashSet<IpAddr> =
        store.allocations("red.v4").unwrap().into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(held, distinct, "the store holds exactly the ports' addresses");
}

async fn define_red(c: &Client) {
    let red = pb::Network {
        name: "red".into(),
        tenant: "admin".into(),
        kind: "vxlan".into(),
        ipv4: Some(pb::SubnetSpec {
            cidr: "10.50.0.0/20".into(),
            gateway: Some("10.50.0.1".into()),
            pools: vec![],
        }),
        ..Default::default()
    };
    c.clone().create_network(authed(red)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_etcd_serve_fifty_clients_through_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    // The etcd store client runs its own runtime: build and drop it outside this one's tasks.
    let Some(etcd) = tokio::task::block_in_place(|| {
        EtcdServer::start(&dir.path().join("etcd"), free_port(), free_port())
    }) else {
        return;
    };
    let args = ["--etcd", etcd.client_url.as_str(), "--etcd-prefix", "/kt"];
    let a = ManagerProc::start(&dir.path().join("a"), &args);
    let b = ManagerProc::start(&dir.path().join("b"), &args);
    let (a_rest, a_grpc) = (a.rest.clone(), a.grpc.clone());
    let replicas = vec![client(&a.grpc), client(&b.grpc)];
    define_red(&replicas[0]).await;

    let a = Arc::new(std::sync::Mutex::new(a));
    let killed = a.clone();
    let a_dir = dir.path().join("a");
    let url = etcd.client_url.clone();
    let ports = load(replicas.clone(), 40, move || {
        let mut a = killed.lock().unwrap();
        a.kill();
        std::thread::sleep(Duration::from_secs(1));
        *a = ManagerProc::start_on(
            &a_dir,
            &["--etcd", &url, "--etcd-prefix", "/kt"],
            &a_rest,
            &a_grpc,
        );
    })
    .await;
    tokio::task::block_in_place(|| check_invariants(&ports, &etcd.store_at("/kt"), 2000));

    // A request whose answer was lost, retried through the other replica: the same port.
    for (i, p) in ports.iter().enumerate().take(50) {
        let again = replicas[(i + 1) % 2]
            .clone()
            .create_port(authed(spec(&p.container)))
            .await
            .unwrap()
            .into_inner();
        assert!(!again.created);
        assert_eq!(again.port.unwrap().addresses, p.addresses);
    }
    // Both replicas list the same ports.
    let listed = |c: &Client| {
        let mut c = c.clone();
        async move {
            c.list_ports(authed(pb::ListRequest { network: "red".into(), ..Default::default() }))
                .await
                .unwrap()
                .into_inner()
                .items
                .len()
        }
    };
    assert_eq!((listed(&replicas[0]).await, listed(&replicas[1]).await), (2000, 2000));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_manager_keeps_its_invariants_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let m = ManagerProc::start(&data, &[]);
    let (rest, grpc) = (m.rest.clone(), m.grpc.clone());
    let replicas = vec![client(&m.grpc)];
    define_red(&replicas[0]).await;
    let m = Arc::new(std::sync::Mutex::new(m));
    let killed = m.clone();
    let d = data.clone();
    let ports = load(replicas.clone(), 10, move || {
        let mut m = killed.lock().unwrap();
        m.kill();
        *m = ManagerProc::start_on(&d, &[], &rest, &grpc);
    })
    .await;
    // Deletes release: half the ports go, through the restarted manager.
    let mut c = replicas[0].clone();
    for p in ports.iter().step_by(2) {
        c.delete_port(authed(pb::PortName {
            container: p.container.clone(),
            interface: "eth0".into(),
        }))
        .await
        .unwrap();
    }
    let left = c.list_ports(authed(pb::ListRequest::default())).await.unwrap().into_inner().items;
    m.lock().unwrap().kill();
    let store = knitter_manager::store::embedded::Embedded::open(&data.join("store.redb")).unwrap();
    check_invariants(&left, &store, 250);
}

/// A manager whose etcd went away: not ready (`/v1/health` fails or hangs, so the
/// kubelet's readiness probe takes it out of the Service) but alive (`/v1/live` answers at
/// once, so its liveness probe does not restart it in a loop while etcd is out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_without_its_etcd_is_alive_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = tokio::task::block_in_place(|| {
        EtcdServer::start(&dir.path().join("etcd"), free_port(), free_port())
    }) else {
        return;
    };
    let args = ["--etcd", etcd.client_url.as_str(), "--etcd-prefix", "/kt"];
    let m = ManagerProc::start(&dir.path().join("m"), &args);
    let get = |path: &'static str| {
        let rest = m.rest.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(&rest).ok()?;
            c.set_read_timeout(Some(std::time::Duration::from_secs(3))).ok()?;
            write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
            let mut reply = String::new();
            let _ = c.read_to_string(&mut reply);
            reply.split(' ').nth(1).and_then(|code| code.parse::<u16>().ok())
        })
    };
    assert_eq!(get("/v1/health").await.unwrap(), Some(200), "ready with its etcd");
    assert_eq!(get("/v1/live").await.unwrap(), Some(200));
    tokio::task::block_in_place(|| drop(etcd));
    assert_ne!(get("/v1/health").await.unwrap(), Some(200), "not ready without its etcd");
    let at = std::time::Instant::now();
    assert_eq!(get("/v1/live").await.unwrap(), Some(200), "alive all the same");
    assert!(at.elapsed() < std::time::Duration::from_secs(1), "at once: {:?}", at.elapsed());
}

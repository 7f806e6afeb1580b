//! The IPAM over the etcd store, against a real etcd (Debian's etcd-server) that the test
//! starts on loopback ports with a temporary data directory and kills at the end: two
//! manager replicas (two store clients) racing 50 threads for 2 000 addresses, retries, IP
//! groups, and an etcd killed with SIGKILL and restarted on the same data.

mod common;

use common::{EtcdServer, etcd_requests::requests, free_port, scenarios};
use knitter_manager::ipam::{self, Addressing, IpGroup};
use knitter_manager::store::{OwnerKey, Store};
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn two_replicas_and_fifty_clients_never_share_or_lose_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = EtcdServer::start(&dir.path().join("data"), free_port(), free_port()) else {
        return;
    };
    let replicas = [Arc::new(etcd.store()), Arc::new(etcd.store())];
    let a = Arc::new(
        Addressing::new("10.20.0.0/20".parse().unwrap(), Some(ip("10.20.0.1")), &[], &[]).unwrap(),
    );
    let clients: Vec<_> = (0..50)
        .map(|t| {
            let (s, a) = (replicas[t % 2].clone(), a.clone());
            std::thread::spawn(move || {
                // Each client keeps a cursor (its last address), as a manager does per network.
                let mut hint = 0;
                (0..40)
                    .map(|i| {
                        let o = OwnerKey::new(&format!("c{t}-{i}"), "eth0");
                        let got = ipam::allocate(&*s, "red", &a, &o, hint).unwrap();
                        hint = ipam::hint_of(got);
                        (o, got)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<(OwnerKey, IpAddr)> =
        clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let distinct: HashSet<IpAddr> = all.iter().map(|(_, ip)| *ip).collect();
    assert_eq!((all.len(), distinct.len()), (2000, 2000), "no address twice");
    assert_eq!(replicas[0].allocations("red").unwrap().len(), 2000, "none lost");
    // A request retried through the other replica (its first answer lost) gets the same address.
    for (o, got) in all.iter().take(50) {
        assert_eq!(ipam::allocate(&*replicas[1], "red", &a, o, 0).unwrap(), *got);
    }
    // Release through one replica, seen by the other; releasing twice changes nothing.
    let (o, got) = &all[0];
    assert_eq!(replicas[0].release("red", o).unwrap(), Some(*got));
    assert_eq!(replicas[1].release("red", o).unwrap(), None);
    assert_eq!(replicas[1].owned("red", o).unwrap(), None);
}

#[test]
fn state_survives_an_etcd_kill_and_ip_groups_stick() {
    let dir = tempfile::tempdir().unwrap();
    let (data, client, peer) = (dir.path().join("data"), free_port(), free_port());
    let Some(etcd) = EtcdServer::start(&data, client, peer) else { return };
    let a =
        Addressing::new("10.30.0.0/24".parse().unwrap(), Some(ip("10.30.0.1")), &[], &[]).unwrap();
    let g = IpGroup::new("sip", &a, &[ip("10.30.0.10"), ip("10.30.0.11"), ip("10.30.0.12")], 300)
        .unwrap();
    let pods = ["ims/sip-0", "ims/sip-1", "ims/sip-2"];
    let owner = |p: &str, generation: u32| OwnerKey::new(&format!("{p}-{generation}"), "net1");
    let first: Vec<IpAddr> = {
        let s = etcd.store();
        let first = pods
            .iter()
            .map(|p| g.allocate(&s, "media", &owner(p, 0), p, 1000).unwrap())
            .collect::<Vec<_>>();
        for p in pods {
            g.release(&s, "media", &owner(p, 0), p, 1001).unwrap();
        }
        ipam::allocate(&s, "media", &a, &OwnerKey::new("other", "eth0"), 0).unwrap();
        first
    };
    drop(etcd); // SIGKILL
    let etcd = EtcdServer::start(&data, client, peer).unwrap();
    let s = etcd.store();
    assert_eq!(s.allocations("media").unwrap().len(), 1, "the one held address is still held");
    for (i, p) in pods.iter().enumerate().rev() {
        assert_eq!(
            g.allocate(&s, "media", &owner(p, 1), p, 1010).unwrap(),
            first[i],
            "{p} got its own address back"
        );
    }
}

/// A replica new to a network whose first 600 addresses are held does not walk them one
/// transaction each (3 003 transactions for its first allocation with 3 000 held, before):
/// one range read finds a hole near its start; past a run of held addresses longer than
/// the window it moves to a random free place. Counted by etcd itself.
#[test]
fn a_new_replica_claims_with_one_transaction_past_six_hundred_held() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = EtcdServer::start(&dir.path().join("data"), free_port(), free_port()) else {
        return;
    };
    let s = etcd.store();
    let a =
        Addressing::new("10.30.0.0/22".parse().unwrap(), Some(ip("10.30.0.1")), &[], &[]).unwrap();
    let mut hint = a.start_point();
    let held: Vec<(OwnerKey, IpAddr)> = (0..600)
        .map(|i| {
            let o = OwnerKey::new(&format!("old{i}"), "eth0");
            let got = ipam::allocate(&s, "red", &a, &o, hint).unwrap();
            hint = ipam::hint_of(got);
            (o, got)
        })
        .collect();
    assert_eq!(held[99].1, ip("10.30.0.101"), "one allocator hands addresses out in order");
    s.release("red", &held[99].0).unwrap();

    let fresh = etcd.store();
    let before = requests(&etcd.client_url);
    let got =
        ipam::allocate(&fresh, "red", &a, &OwnerKey::new("new0", "eth0"), a.start_point()).unwrap();
    let cost = requests(&etcd.client_url) - before;
    assert_eq!(got, ip("10.30.0.101"), "the hole near the start");
    assert_eq!((cost.txn, cost.range), (1.0, 1.0), "one window read, one claim");

    let before = requests(&etcd.client_url);
    let got =
        ipam::allocate(&fresh, "red", &a, &OwnerKey::new("new1", "eth0"), a.start_point()).unwrap();
    let cost = requests(&etcd.client_url) - before;
    assert!(
        held.iter().all(|(_, h)| *h != got) && a.check(got).is_ok(),
        "{got} is free and allocatable"
    );
    assert_eq!(cost.txn, 1.0, "past the held run: a random place, one claim");
    // A random place inside the held run (one in three) is left for another: a window each,
    // at most 9 places, the last walking at most 3 windows to the run's end.
    assert!(cost.range <= 13.0, "the window at the start, then one per random place: {cost:?}");
    assert_eq!(fresh.allocations("red").unwrap().len(), 601);
}

#[test]
fn the_manager_scenarios_pass_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = EtcdServer::start(&dir.path().join("data"), free_port(), free_port()) else {
        return;
    };
    let manager = |prefix: &str| {
        let config = knitter_manager::manager::Config::default();
        knitter_manager::manager::Manager::new(Arc::new(etcd.store_at(prefix)), config).unwrap()
    };
    scenarios::objects(&manager("/objects"));
    scenarios::refusals(&manager("/refusals"));
    scenarios::ip_group(&manager("/groups"));
    scenarios::requested_mac(&manager("/macs"));
    scenarios::pod_policer(&manager("/policers"));
    scenarios::tenancy(&manager("/tenancy"));
    scenarios::cut_off_creates(Arc::new(etcd.store_at("/cut")));
}

/// The manager on an etcd that serves TLS only, requires client certificates and has
/// authentication on (a root user with a password): with `--etcd-ca`, `--etcd-cert`/
/// `--etcd-key` and `--etcd-user`/`--etcd-password-file` it serves; without the password or
/// without the client certificate it does not start, and says why.
#[test]
fn the_manager_reaches_an_etcd_with_tls_a_client_certificate_and_a_password() {
    let dir = tempfile::tempdir().unwrap();
    common::certificates(dir.path());
    let Some(etcd) = EtcdServer::start_tls(&dir.path().join("data"), dir.path()) else { return };
    // As `etcdctl user add root && etcdctl user grant-role root root && etcdctl auth enable`.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
        let (cert, key) = etcd.access.identity.clone().unwrap();
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(etcd.access.ca.clone().unwrap()))
            .identity(Identity::from_pem(cert, key));
        let mut c = etcd_client::Client::connect(
            [etcd.client_url.clone()],
            Some(ConnectOptions::new().with_tls(tls)),
        )
        .await
        .unwrap();
        c.user_add("root", "s3cret", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let f = |n: &str| dir.path().join(n).display().to_string();
    std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
    let tls = [
        "--etcd",
        &etcd.client_url,
        "--etcd-ca",
        &f("ca.pem"),
        "--etcd-cert",
        &f("client.pem"),
        "--etcd-key",
        &f("client.key"),
    ];
    let user = ["--etcd-user", "root", "--etcd-password-file", &f("password")];
    let m = common::ManagerProc::start(&dir.path().join("m"), &[&tls[..], &user[..]].concat());
    let o = std::process::Command::new(common::knitterctl())
        .args([
            "--manager",
            &m.grpc,
            "--token-file",
            &f("m/token"),
            "manager",
            "tenant",
            "create",
            "red",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(m);

    // Refused at start: no password (etcd takes the certificate's name, a user it has not), no
    // client certificate.
    let refused = |args: &[&str]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_knitter-manager"))
            .arg("--data-dir")
            .arg(dir.path().join("m2"))
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("knitter-manager {args:?} started on an etcd that should refuse it");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(!status.success(), "{args:?}: {err}");
        err
    };
    let e = refused(&tls);
    assert!(e.contains("etcd"), "without the password: {e}");
    let e = refused(&[&tls[..2], &tls[2..4], &user[..]].concat());
    assert!(e.contains("etcd"), "without the client certificate: {e}");
}

//! The manager's Kubernetes controller against an API server stand-in that speaks the real
//! wire protocol (`common/apiserver.rs`; what it does not model is listed there), driven by
//! the real `kube` client: deleted pods and nodes give back their ports, a controller killed
//! and restarted (or a watch that expired, 410) reconciles by listing again and never
//! releases a live pod's port, a standby manager takes the Lease when the leader dies, a
//! leader cut off from the apiserver stops acting before another starts, and one that stops
//! hands the Lease over at once;
//! `Network` and `IPGroup` resources become the manager's networks and groups, with a
//! NetworkAttachmentDefinition in each namespace of the network's tenant, statuses that say
//! why when the manager refuses, and what a deleted resource made deleted with it.

#[allow(dead_code)] // kubectl's parts (the install test's)
#[path = "common/apiserver.rs"]
mod apiserver;
mod common;

use apiserver::{ApiServer, Rbac};
use common::controllers::{Running, eventually, register_in, start_through, validate};
use common::scenarios::{net, port};
use knitter_manager::manager::cluster::Options;
use knitter_manager::manager::cluster::lease::LeaseOptions;
use knitter_manager::manager::{Config, Filter, Manager};
use knitter_manager::store::embedded::Embedded;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn manager(dir: &tempfile::TempDir) -> Arc<Manager> {
    let store = Embedded::open(&dir.path().join("store.redb")).unwrap();
    let m = Manager::new(Arc::new(store), Config::default()).unwrap();
    m.create_network(net("red", "admin", "10.1.0.0/16")).unwrap();
    Arc::new(m)
}

fn options(identity: &str) -> Options {
    // Renew deadline 2 s, a look every 400 ms.
    // In the manager's namespace, where the shipped Role lets it hold a Lease.
    let lease = LeaseOptions::timed("knitter", "knitter-manager", identity, Duration::from_secs(3));
    Options {
        cluster: "local".into(),
        cluster_id: String::new(),
        lease,
        release_nodes: true,
        network_status: true,
        network_resources: false,
        kubeconfigs: "/etc/knitter/clusters".into(),
    }
}

/// A controller running on its own task; `stop` ends it gracefully, aborting the task kills it.
fn start(m: &Arc<Manager>, api: &ApiServer, identity: &str) -> Running {
    start_with(m, api, options(identity))
}

fn start_with(m: &Arc<Manager>, api: &ApiServer, opts: Options) -> Running {
    start_through(m, api.client(), opts)
}

/// A pod in the cluster with a port in the manager, as the CNI would have made it.
fn pod_with_port(m: &Manager, api: &ApiServer, name: &str, node: &str) {
    api.add_pod("apps", name, &format!("uid-{name}"), node);
    let mut spec = port("red", &format!("ctr-{name}"), &format!("apps/{name}"));
    spec.pod_uid = format!("uid-{name}");
    spec.node = node.into();
    m.create_port(spec).unwrap();
}

/// A node registered with the manager, as its agent registers.
fn register(m: &Manager, name: &str, vtep: &str) {
    register_in(m, name, vtep, "");
}

fn port_pods(m: &Manager) -> BTreeSet<String> {
    m.list_ports(&Filter::default())
        .unwrap()
        .into_iter()
        .map(|p| p.spec.pod.trim_start_matches("apps/").to_string())
        .collect()
}

fn names(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("p{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_gone_while_no_controller_watched_are_released_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..200 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    // An operator's port (no pod) and a port whose pod is unknown to the cluster.
    m.create_port(port("red", "operator", "")).unwrap();
    let c = start(&m, &api, "m1");
    eventually("the controller leads and has listed", || {
        api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0
    })
    .await;
    assert_eq!(port_pods(&m).len(), 201, "nothing released: every pod lives");

    // 50 pods deleted while it watches.
    for i in 0..50 {
        api.delete_pod("apps", &format!("p{i}"));
    }
    let want: BTreeSet<String> = names(50..200).into_iter().chain([String::new()]).collect();
    eventually("the deleted pods' ports released", || port_pods(&m) == want).await;

    // Killed mid-way through more deletions; pods come and go while none watches.
    for i in 50..60 {
        api.delete_pod("apps", &format!("p{i}"));
    }
    c.task.abort();
    for i in 60..100 {
        api.delete_pod("apps", &format!("p{i}"));
    }
    for i in 200..220 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    // A pod re-created under a deleted one's name (a StatefulSet's): the old port goes, the new stays.
    api.add_pod("apps", "p70", "uid-p70-again", "n1");
    let mut again = port("red", "ctr-p70-again", "apps/p70");
    again.pod_uid = "uid-p70-again".into();
    m.create_port(again).unwrap();

    // The relist collects only ports made before it started (to the second): these were.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let c = start(&m, &api, "m1");
    let want: BTreeSet<String> =
        names(100..220).into_iter().chain([String::new(), "p70".to_string()]).collect();
    eventually("a restarted controller releases what went while it was away", || {
        port_pods(&m) == want
    })
    .await;
    let p70: Vec<_> =
        m.list_ports(&Filter { pod: "apps/p70".into(), ..Default::default() }).unwrap();
    assert_eq!(p70.len(), 1);
    assert_eq!(p70[0].spec.pod_uid, "uid-p70-again", "the new pod's port stayed");
    c.stop().await;
}

/// A big cluster's apiserver: the pod list comes in pages (`limit`, `continue`: 1,200 pods
/// in pages of 500, as kube's watcher asks), and a busy one answers 429 Too Many Requests
/// with `Retry-After`. The controller waits, tries again, reads every page, and releases
/// exactly the ports of the pods that are gone: none of a pod on a later page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_and_throttled_pod_list_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..1200 {
        pod_with_port(&m, &api, &format!("p{i:04}"), "n1");
    }
    for i in (0..1200).step_by(100) {
        api.delete_pod("apps", &format!("p{i:04}"));
    }
    // The relist collects only ports made before it started (to the second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.throttle_lists(3);
    let c = start(&m, &api, "m1");
    let want: BTreeSet<String> =
        (0..1200).filter(|i| i % 100 != 0).map(|i| format!("p{i:04}")).collect();
    eventually("the gone pods' ports released, every other kept", || port_pods(&m) == want).await;
    assert_eq!(api.throttled(), 3, "three lists answered 429");
    assert!(
        api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("continue=")) >= 2,
        "the pod list was read in pages"
    );
    c.stop().await;
}

/// A pod deleted with a grace period keeps its port (and its addresses, which no other pod
/// may take while its containers may still use them) until the pod object is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_pod_keeps_its_port_until_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..3 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    let c = start(&m, &api, "m1");
    eventually("the controller watches", || {
        api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0
    })
    .await;
    api.terminate_pod("apps", "p1");
    api.delete_pod("apps", "p2");
    eventually("the deleted pod's port released", || port_pods(&m) == names(0..2)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(port_pods(&m), names(0..2), "the terminating pod keeps its port");
    api.delete_pod("apps", "p1");
    eventually("released once the pod is gone", || port_pods(&m) == names(0..1)).await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_expired_is_closed_by_a_new_list() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..20 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    let c = start(&m, &api, "m1");
    let lists =
        || api.requests(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true"));
    eventually("listed and watching", || {
        api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0
    })
    .await;
    assert_eq!(lists(), 1);
    let gone: Vec<(String, String)> =
        (0..5).map(|i| ("apps".to_string(), format!("p{i}"))).collect();
    tokio::time::sleep(Duration::from_millis(1100)).await; // the ports predate the coming list
    api.delete_pods_unseen(&gone);
    eventually("the gap's deletions found by a new list", || port_pods(&m) == names(5..20)).await;
    assert!(lists() >= 2, "listed again after 410 Gone");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_manager_takes_the_lease_when_the_leader_dies() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..4 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    let (a, b) = (start(&m, &api, "a"), start(&m, &api, "b"));
    eventually("one leads", || api.lease_holder("knitter", "knitter-manager").is_some()).await;
    let first = api.lease_holder("knitter", "knitter-manager").unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        api.lease_holder("knitter", "knitter-manager").as_deref(),
        Some(first.as_str()),
        "the leader keeps the Lease by renewing it"
    );
    let watches = api.requests(|r| r.contains("watch=true"));
    assert!(watches <= 2, "only the leader watches: {watches} watches");
    let (dead, standby) = if first == "a" { (a, b) } else { (b, a) };
    dead.task.abort();
    let other = if first == "a" { "b" } else { "a" };
    eventually("the standby takes the Lease", || {
        api.lease_holder("knitter", "knitter-manager").as_deref() == Some(other)
    })
    .await;
    api.delete_pod("apps", "p0");
    eventually("the new leader releases a deleted pod's port", || port_pods(&m) == names(1..4))
        .await;
    // And says so on the pod, in its namespace.
    eventually("an Event on the pod", || {
        api.events().iter().any(|e| {
            e["regarding"]["kind"] == "Pod"
                && e["regarding"]["name"] == "p0"
                && e["regarding"]["uid"] == "uid-p0"
                && e["reason"] == "PortReleased"
                && e["metadata"]["namespace"] == "apps"
        })
    })
    .await;
    standby.stop().await;
}

/// Samples whether each controller acts (leads) every 2 ms until `done`; the first moment
/// both did, if any.
fn watch_for_two_leaders(
    a: Arc<knitter_manager::manager::cluster::Status>,
    b: Arc<knitter_manager::manager::cluster::Status>,
    done: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Option<std::time::Instant>> {
    use std::sync::atomic::Ordering::SeqCst;
    tokio::spawn(async move {
        while !*done.borrow() {
            if a.leader.load(SeqCst) && b.leader.load(SeqCst) {
                return Some(std::time::Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        None
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_apiserver_stops_acting_before_another_takes_over() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..4 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    let doors = [api.door().await, api.door().await];
    let a = start_through(&m, doors[0].client(), options("a"));
    let b = start_through(&m, doors[1].client(), options("b"));
    let (done, watching) = watch::channel(false);
    let overlap = watch_for_two_leaders(a.status.clone(), b.status.clone(), watching);
    eventually("one leads", || a.status.leader.load(SeqCst) || b.status.leader.load(SeqCst)).await;
    let (cut, other, door) =
        if a.status.leader.load(SeqCst) { (&a, &b, &doors[0]) } else { (&b, &a, &doors[1]) };
    // Its connections hang: the Lease's renewals and every other call wait for ever.
    door.stall(true);
    let stalled = std::time::Instant::now();
    eventually("the leader cut off stops acting", || !cut.status.leader.load(SeqCst)).await;
    let stepped_down = stalled.elapsed();
    assert!(
        stepped_down < Duration::from_millis(2500),
        "it stops within its 2 s renew deadline: {stepped_down:?}"
    );
    eventually("the other takes over", || other.status.leader.load(SeqCst)).await;
    let took_over = stalled.elapsed();
    assert!(took_over >= Duration::from_secs(3), "not before the lease ran out: {took_over:?}");
    api.delete_pod("apps", "p0");
    eventually("the new leader acts", || port_pods(&m) == names(1..4)).await;
    // Let go, the old leader finds the Lease taken and stays a follower.
    door.stall(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!cut.status.leader.load(SeqCst) && other.status.leader.load(SeqCst));
    done.send_replace(true);
    assert_eq!(overlap.await.unwrap(), None, "two controllers acted at once");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_hands_the_lease_over_at_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    let (a, b) = (start(&m, &api, "a"), start(&m, &api, "b"));
    eventually("one leads", || a.status.leader.load(SeqCst) || b.status.leader.load(SeqCst)).await;
    let ((leader, leader_name), standby) =
        if a.status.leader.load(SeqCst) { ((a, "a"), b) } else { ((b, "b"), a) };
    let (done, watching) = watch::channel(false);
    let overlap = watch_for_two_leaders(leader.status.clone(), standby.status.clone(), watching);
    let stopping = std::time::Instant::now();
    leader.stop().await;
    // Released on the way out: empty, or already the standby's if it looked in between.
    let holder = api.lease_holder("knitter", "knitter-manager");
    assert_ne!(holder.as_deref(), Some(leader_name), "released on the way out");
    assert!(holder.is_some(), "the Lease is still there");
    eventually("the standby takes over", || standby.status.leader.load(SeqCst)).await;
    let handed_over = stopping.elapsed();
    // A look every 400 ms; waiting for the 3 s lease to run out would take more.
    assert!(handed_over < Duration::from_secs(2), "handed over in {handed_over:?}");
    done.send_replace(true);
    assert_eq!(overlap.await.unwrap(), None, "two controllers acted at once");
    standby.stop().await;
}

/// A controller pointed at a cluster whose list shows no pod on the ports' node (a wrong
/// kubeconfig, an empty or filtered list) releases nothing there and says so; a list that
/// shows the node's pods again releases what is really gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_without_the_nodes_pods_releases_nothing() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    for i in 0..3 {
        pod_with_port(&m, &api, &format!("p{i}"), "n1");
    }
    for i in 0..3 {
        api.delete_pod("apps", &format!("p{i}"));
    }
    // Ports made in the second a list starts are left to the next one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let c = start(&m, &api, "m1");
    eventually("the pods listed", || {
        c.status.relists.load(SeqCst) >= 1 && c.status.held_ports.load(SeqCst) == 3
    })
    .await;
    assert_eq!(port_pods(&m), names(0..3), "nothing released on an empty list");
    assert_eq!(c.status.released_ports.load(SeqCst), 0);
    // The node's pods seen again (its DaemonSet pod, by the watch): at the next look at the
    // held ports (every 10 s), the gone pods' ports go.
    api.add_pod("kube-system", "knitter-node-x", "uid-ds", "n1");
    eventually("released once the node's pods are seen", || port_pods(&m).is_empty()).await;
    assert_eq!(c.status.held_ports.load(SeqCst), 0);
    c.stop().await;
}

/// A node list that has none of the manager's nodes (another cluster's) forgets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_list_of_another_cluster_forgets_no_node() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    for (n, vtep) in [("n1", "192.168.0.1"), ("n2", "192.168.0.2")] {
        register(&m, n, vtep);
    }
    api.add_node("elsewhere");
    let c = start(&m, &api, "m1");
    eventually("pods and nodes listed", || c.status.relists.load(SeqCst) >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(m.list_nodes().unwrap().len(), 2, "no node forgotten");
    assert_eq!(c.status.released_nodes.load(SeqCst), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_gives_back_its_ports_and_leaves_the_flood_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    for (n, vtep) in [("n1", "192.168.0.1"), ("n2", "192.168.0.2")] {
        api.add_node(n);
        register(&m, n, vtep);
    }
    for i in 0..6 {
        pod_with_port(&m, &api, &format!("p{i}"), if i % 2 == 0 { "n1" } else { "n2" });
    }
    let c = start_with(&m, &api, Options { network_status: false, ..options("m1") });
    eventually("watching nodes", || {
        api.requests(|r| r.starts_with("GET /api/v1/nodes?") && r.contains("watch=true")) > 0
    })
    .await;
    api.delete_node("n1");
    eventually("n1's ports released", || {
        port_pods(&m) == ["p1", "p3", "p5"].map(String::from).into()
    })
    .await;
    eventually("n1 forgotten", || {
        m.list_nodes().unwrap().iter().map(|n| n.name.clone()).collect::<Vec<_>>() == ["n2"]
    })
    .await;
    c.stop().await;
    assert_eq!(
        api.requests(|r| r.starts_with("PATCH")),
        0,
        "network-status off (Multus writes it): no pod patched"
    );
}

/// Standalone mode: each pod's `network-status` lists its interfaces as the manager holds
/// them (network, interface, addresses, MAC, MTU, a vhost-user socket's device-info), kept
/// current as ports come and go, with a merge patch of that one key; pods without ports
/// are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_pods_get_a_current_network_status() {
    use knitter_manager::manager::cluster::reconcile::NETWORK_STATUS;
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    api.add_node("n1");
    api.add_pod("apps", "plain", "uid-plain", "n1");
    pod_with_port(&m, &api, "vnf", "n1");
    let mut dp = port("red", "ctr-vnf", "apps/vnf");
    (dp.interface, dp.pod_uid, dp.node) = ("net1".into(), "uid-vnf".into(), "n1".into());
    dp.device_info = Some(
        knitter_api::device_info::vhost_user("/run/knitter/vhost/ctr-vnf/net1.sock", false)
            .to_string(),
    );
    m.create_port(dp).unwrap();
    let c = start(&m, &api, "m1");
    let status = || {
        api.pod_annotation("apps", "vnf", NETWORK_STATUS)
            .map(|s| serde_json::from_str::<serde_json::Value>(&s).unwrap())
    };
    eventually("the pod's network-status written", || {
        status().is_some_and(|s| s.as_array().is_some_and(|a| a.len() == 2))
    })
    .await;
    let s = status().unwrap();
    let ports = m.list_ports(&Filter { pod: "apps/vnf".into(), ..Default::default() }).unwrap();
    let eth1 = ports.iter().find(|p| p.spec.interface == "eth1").unwrap();
    assert_eq!(s[0]["interface"], "eth1");
    assert_eq!(s[0]["name"], "red");
    assert_eq!(s[0]["ips"], serde_json::json!([eth1.addresses[0].address.to_string()]));
    assert_eq!(s[0]["mac"], eth1.mac.as_str());
    assert_eq!(s[0]["mtu"], eth1.mtu);
    assert!(s[0].get("device-info").is_none());
    assert_eq!(s[1]["interface"], "net1");
    assert_eq!(
        s[1]["device-info"],
        serde_json::json!({"type": "vhost-user", "version": "1.1.0", "vhost-user": {"mode": "server", "path": "/run/knitter/vhost/ctr-vnf/net1.sock"}})
    );
    m.delete_port("ctr-vnf", "net1").unwrap();
    eventually("kept current: one interface left", || {
        status().is_some_and(|s| s.as_array().is_some_and(|a| a.len() == 1))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let patches = api.requests(|r| r.starts_with("PATCH"));
    assert_eq!(patches, 2, "one patch per change, none while nothing changes");
    assert_eq!(
        api.requests(|r| r == "PATCH pod apps/plain"),
        0,
        "a pod without ports is left alone"
    );
    c.stop().await;
}

/// knitter-manager --kubernetes as an operator runs it (a kubeconfig naming the API server):
/// it takes the Lease, releases a deleted pod's port, and says so through `knitterctl manager
/// status`, `GET /v1/kubernetes` and its metrics; stopped with SIGTERM, it releases the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_process_runs_the_controller_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await;
    api.add_node("n1");
    api.add_pod("apps", "p0", "uid-p0", "n1");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            api.url
        ),
    )
    .unwrap();
    let mdir = dir.path().join("m");
    let kc = kubeconfig.to_str().unwrap().to_string();
    let m = tokio::task::spawn_blocking(move || {
        common::ManagerProc::start_kubernetes(&mdir, &kc, &["--network-resources"])
    })
    .await
    .unwrap();
    eventually("the manager takes the Lease", || {
        api.lease_holder("knitter", "leader").as_deref() == Some("m1")
    })
    .await;
    let ctl = {
        let (grpc, token) = (m.grpc.clone(), dir.path().join("m/token"));
        move |args: &[&str]| {
            let out = std::process::Command::new(common::knitterctl())
                .args(["--manager", &grpc, "--token-file"])
                .arg(&token)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "knitterctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).to_string()
        }
    };
    ctl(&["manager", "network", "create", "red", "--ipv4", "10.1.0.0/16"]);
    ctl(&[
        "manager",
        "port",
        "create",
        "--network",
        "red",
        "--container",
        "c0",
        "--pod",
        "apps/p0",
        "--node",
        "n1",
    ]);
    eventually("watching pods", || {
        api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0
    })
    .await;
    api.delete_pod("apps", "p0");
    let status = || {
        serde_json::from_str::<serde_json::Value>(&ctl(&["-o", "json", "manager", "status"]))
            .unwrap()
    };
    eventually("the port released, as the status says", || status()["released_ports"] == 1).await;
    let s = status();
    assert_eq!((s["identity"].as_str(), s["leader"].as_bool()), (Some("m1"), Some(true)), "{s}");
    api.add_namespace("apps", &[("knitter.io/tenant", "admin")]);
    api.apply_resource(
        apiserver::Kind::Networks,
        "oam",
        "uid-oam",
        serde_json::json!({"kind": "vlan", "ipv4": {"cidr": "10.2.0.0/16"}}),
    );
    eventually("the Network resource made, its NAD written", || {
        status()["attachment_definitions"] == 1
    })
    .await;
    let text = ctl(&["manager", "status"]);
    assert!(
        text.contains("Network resources 1 (1 ready); NetworkAttachmentDefinitions 1 (writes 1)"),
        "{text}"
    );
    assert!(ctl(&["manager", "network", "list"]).contains("oam"));
    assert!(
        ctl(&["manager", "port", "list"]).lines().count() <= 1,
        "the port list is empty but for its header"
    );
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&m.rest).unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        body
    };
    let metrics = get("/metrics");
    assert!(
        metrics.contains("knitter_manager_kubernetes_leader 1")
            && metrics.contains("knitter_manager_kubernetes_released_ports_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("knitter_manager_kubernetes_network_resources_ready 1"), "{metrics}");
    assert!(get("/v1/kubernetes").contains("\"leader\":true"));
    // Stopped as a rolling update stops it, it gives the Lease up on the way out.
    let mut m = m;
    assert!(
        tokio::task::block_in_place(|| m.terminate(Duration::from_secs(15))),
        "the manager stops on SIGTERM"
    );
    assert_eq!(api.lease_holder("knitter", "leader").as_deref(), Some(""), "the Lease released");
}

// ---- Network and IPGroup resources ----

use apiserver::Kind;
use serde_json::{Value, json};

fn with_resources(identity: &str) -> Options {
    Options { network_status: false, network_resources: true, ..options(identity) }
}

/// A resource's `Ready` condition: (status, reason, message).
fn ready(api: &ApiServer, kind: Kind, name: &str) -> Option<(String, String, String)> {
    let o = api.object(kind, name)?;
    let c = o["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn is_ready(api: &ApiServer, kind: Kind, name: &str) -> bool {
    ready(api, kind, name).is_some_and(|r| r.0 == "True")
}

fn nads(api: &ApiServer) -> BTreeSet<String> {
    api.objects(Kind::Nads).into_keys().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A NAD's `spec.config` read as a runtime reads a conflist: each plugin, with the list's
/// `cniVersion` and `name`, parsed by the Knitter plugin's own parser.
fn nad_network(nad: &Value) -> String {
    let list: Value =
        serde_json::from_str(nad["spec"]["config"].as_str().expect("spec.config is a string"))
            .expect("spec.config is JSON");
    let plugins = list["plugins"].as_array().expect("a conflist has plugins");
    assert_eq!(plugins.len(), 1);
    let mut conf = plugins[0].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    let parsed = knitter_cni::spec::NetConf::parse(conf.to_string().as_bytes())
        .expect("the plugin's configuration parses");
    assert_eq!(parsed.kind, "knitter-cni");
    parsed.network().to_string()
}

/// A cluster as an NFV team sets it up: tenant `red` on namespaces `red` (its own name) and
/// `red-dev` (labelled), `blue` on its own; `media` is red's, `oam` shared, and an IP group on
/// `media`. Each becomes the manager's, a NAD lands in each namespace that may use it (owned
/// by its Network, its configuration one the plugin parses, every object valid for its
/// CRD), statuses say Ready with what the manager decided; namespaces relabelled or added
/// move the NADs; the API cannot delete what a resource made; deleting the resources deletes
/// what they made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_resources_become_networks_with_attachments_in_their_tenants_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    api.add_namespace("red", &[]);
    api.add_namespace("red-dev", &[("knitter.io/tenant", "red")]);
    api.add_namespace("blue", &[]);
    api.apply_resource(Kind::Networks, "media", "uid-media", json!({"tenant": "red", "kind": "vxlan", "plane": "media", "segment": 7100, "ipv4": {"cidr": "10.71.0.0/24", "gateway": "10.71.0.1", "pools": [{"start": "10.71.0.10", "end": "10.71.0.200"}]}}));
    api.apply_resource(Kind::Networks, "oam", "uid-oam", json!({"kind": "vlan", "plane": "oam", "segment": 300, "shared": true, "ipv4": {"cidr": "10.72.0.0/24"}}));
    api.apply_resource(
        Kind::IpGroups,
        "media-sts",
        "uid-sts",
        json!({"network": "media", "size": 3, "graceSeconds": 60}),
    );
    let c = start_with(&m, &api, with_resources("m1"));

    eventually("both networks and the group ready", || {
        is_ready(&api, Kind::Networks, "media")
            && is_ready(&api, Kind::Networks, "oam")
            && is_ready(&api, Kind::IpGroups, "media-sts")
    })
    .await;
    let media = m.get_network("media").unwrap();
    assert_eq!(
        (media.tenant.as_str(), media.segment),
        ("red", Some(7100)),
        "the tenant is made on the manager too"
    );
    let st = api.object(Kind::Networks, "media").unwrap()["status"].clone();
    assert_eq!(
        (st["segment"].clone(), st["mtu"].clone(), st["observedGeneration"].clone()),
        (json!(7100), json!(media.mtu), json!(1))
    );
    let group = m.get_group("media", "media-sts").unwrap();
    assert_eq!(
        api.object(Kind::IpGroups, "media-sts").unwrap()["status"]["members"],
        json!(group.members)
    );
    // A namespace merely named "red" is not red's (no label, not listed on the tenant): admin's.
    eventually("a NAD in each namespace that may use each network", || {
        nads(&api) == set(&["blue/oam", "red-dev/media", "red-dev/oam", "red/oam"])
    })
    .await;
    eventually("the status lists them", || {
        api.object(Kind::Networks, "media").unwrap()["status"]["networkAttachmentDefinitions"]
            == json!(["red-dev/media"])
    })
    .await;
    assert_eq!(
        (m.tenant_of_namespace("red-dev").unwrap(), m.tenant_of_namespace("red").unwrap()),
        ("red".into(), "admin".into()),
        "the labels are recorded for pods' attachments"
    );
    for (key, nad) in api.objects(Kind::Nads) {
        let net = key.split_once('/').unwrap().1;
        assert_eq!(nad_network(&nad), net, "{key}");
        let owner = &nad["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["uid"].as_str(), owner["controller"].as_bool()),
            (Some("Network"), Some(format!("uid-{net}").as_str()), Some(true)),
            "{key}"
        );
        assert_eq!(nad["metadata"]["labels"]["app.kubernetes.io/managed-by"], "knitter-manager");
    }
    for (kind, name) in
        [(Kind::Networks, "media"), (Kind::Networks, "oam"), (Kind::IpGroups, "media-sts")]
    {
        eventually("the finalizer on each resource", || {
            api.object(kind, name)
                .is_some_and(|o| o["metadata"]["finalizers"] == json!(["knitter.io/cleanup"]))
        })
        .await;
    }
    validate(
        "control/manager/tests/fixtures/multus-nad-crd.yaml",
        api.objects(Kind::Nads).into_values().collect(),
    );
    validate(
        "deploy/kubernetes/base/crds/networks.knitter.io.yaml",
        api.objects(Kind::Networks).into_values().collect(),
    );
    validate(
        "deploy/kubernetes/base/crds/ipgroups.knitter.io.yaml",
        api.objects(Kind::IpGroups).into_values().collect(),
    );

    let e = m.delete_network("oam").unwrap_err().to_string();
    assert!(e.contains("kubectl delete networks.knitter.io oam"), "{e}");
    assert!(m.delete_group("media", "media-sts").is_err(), "the group is the resource's too");

    api.add_namespace("red-dev", &[]); // unlabelled: admin's
    api.add_namespace("red-prod", &[("knitter.io/tenant", "red")]);
    eventually("NADs follow the namespaces", || {
        nads(&api) == set(&["blue/oam", "red-dev/oam", "red-prod/media", "red-prod/oam", "red/oam"])
    })
    .await;
    assert_eq!(
        m.tenant_of_namespace("red-dev").unwrap(),
        "admin",
        "unlabelled, it is admin's again"
    );
    api.delete(Kind::Nads, "red-prod/media");
    eventually("a NAD deleted by hand comes back", || nads(&api).contains("red-prod/media")).await;

    api.delete_gracefully(Kind::IpGroups, "media-sts");
    eventually("the group deleted with its resource", || {
        m.get_group("media", "media-sts").is_err()
            && api.object(Kind::IpGroups, "media-sts").is_none()
    })
    .await;
    api.delete_gracefully(Kind::Networks, "media");
    eventually("the network deleted with its resource", || {
        m.get_network("media").is_err() && api.object(Kind::Networks, "media").is_none()
    })
    .await;
    eventually("its NADs deleted", || {
        nads(&api) == set(&["blue/oam", "red-dev/oam", "red-prod/oam", "red/oam"])
    })
    .await;
    assert!(m.get_network("red").is_ok(), "a network made over the API is not the cluster's");
    // A namespace being deleted gets no new NAD (the apiserver refuses one there, every
    // pass) and keeps its own until it goes.
    let posts_to_red_prod = || {
        api.requests(|r| {
            r.starts_with(
                "POST /apis/k8s.cni.cncf.io/v1/namespaces/red-prod/network-attachment-definitions",
            )
        })
    };
    let before = posts_to_red_prod();
    api.terminate_namespace("red-prod");
    api.apply_resource(Kind::Networks, "ops", "uid-ops", json!({"kind": "vlan", "plane": "oam", "segment": 301, "shared": true, "ipv4": {"cidr": "10.73.0.0/24"}}));
    eventually("the shared network ready, its NADs in the other namespaces", || {
        is_ready(&api, Kind::Networks, "ops")
            && nads(&api).is_superset(&set(&["blue/ops", "red-dev/ops", "red/ops"]))
    })
    .await;
    assert!(
        !nads(&api).contains("red-prod/ops") && nads(&api).contains("red-prod/oam"),
        "{:?}",
        nads(&api)
    );
    assert_eq!(posts_to_red_prod(), before, "not asked for");
    c.stop().await;
}

/// A resource the manager refuses says why in its `Ready` condition and gets no NAD: a VNI
/// another network holds, a name a network made over the API holds, a spec the CRD does not
/// allow. Fixed (a new generation), it becomes Ready.
/// Clusters that check owner references (the OwnerReferencesPermissionEnforcement
/// admission plugin, as OpenShift's) refuse a NAD that names its Network with
/// `blockOwnerDeletion` unless the manager may update `networks/finalizers`: the stand-in
/// checks it, so the shipped RBAC passes the other tests and one without that rule fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nad_owned_with_block_owner_deletion_needs_the_finalizers_permission() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::WithoutFinalizers).await);
    api.add_namespace("blue", &[]);
    api.apply_resource(
        Kind::Networks,
        "oam",
        "uid-oam",
        json!({"kind": "vlan", "plane": "oam", "segment": 300, "shared": true, "ipv4": {"cidr": "10.72.0.0/24"}}),
    );
    let c = start_with(&m, &api, with_resources("m1"));
    let mut denied = Vec::new();
    eventually("the NAD refused for want of the finalizers permission", || {
        denied.extend(api.take_denied());
        denied.iter().any(|d| d.contains("update networks/finalizers"))
    })
    .await;
    c.stop().await;
    api.take_denied();
    assert!(nads(&api).is_empty(), "no NAD was written");
}

/// A NAD of Knitter's edited by hand is brought back by server-side apply under the
/// controller's field manager: its configuration put back, a label another client added kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nad_edited_by_hand_is_applied_back_keeping_what_others_added() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    api.add_namespace("red-dev", &[("knitter.io/tenant", "red")]);
    api.apply_resource(
        Kind::Networks,
        "media",
        "uid-media",
        json!({"tenant": "red", "kind": "vxlan", "ipv4": {"cidr": "10.71.0.0/24"}}),
    );
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("the NAD", || nads(&api).contains("red-dev/media")).await;
    let config = api.object(Kind::Nads, "red-dev/media").unwrap()["spec"]["config"].clone();
    api.edit(Kind::Nads, "red-dev/media", |n| {
        n["spec"]["config"] = json!("{}");
        n["metadata"]["labels"]["team"] = json!("media");
    });
    eventually("its configuration put back", || {
        api.object(Kind::Nads, "red-dev/media").unwrap()["spec"]["config"] == config
    })
    .await;
    let nad = api.object(Kind::Nads, "red-dev/media").unwrap();
    assert_eq!(nad["metadata"]["labels"]["team"], "media", "another client's label kept");
    assert_eq!(nad["metadata"]["managedFields"][0]["manager"], "knitter-manager");
    assert_eq!(
        api.requests(|r| r.starts_with("PUT /apis/k8s.cni.cncf.io")),
        0,
        "applied, not replaced"
    );
    // Kept as it is now: the label another client added does not make it differ.
    let writes = api.requests(|r| r.starts_with("PATCH /apis/k8s.cni.cncf.io"));
    api.add_namespace("blue", &[]);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(api.requests(|r| r.starts_with("PATCH /apis/k8s.cni.cncf.io")), writes);
    c.stop().await;
}

/// A cluster without Multus (no NAD CRD): the networks are made and ready, no NAD is, and
/// nothing waits to be retried (the list's 404 is an answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_nad_crd_gets_networks_and_nothing_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    api.without_nad_crd();
    api.add_namespace("red-dev", &[("knitter.io/tenant", "red")]);
    let spec = json!({"tenant": "red", "kind": "vxlan", "ipv4": {"cidr": "10.71.0.0/24"}});
    api.apply_resource(Kind::Networks, "media", "uid-media", spec);
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("the network ready", || is_ready(&api, Kind::Networks, "media")).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(nads(&api).is_empty());
    assert_eq!(c.status.writes_backing_off.load(std::sync::atomic::Ordering::SeqCst), 0);
    c.stop().await;
}

/// A write that failed and then stopped being needed (someone else put the NAD right) leaves
/// nothing backing off, and no pass runs for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_no_longer_needed_leaves_nothing_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    api.add_namespace("red-dev", &[("knitter.io/tenant", "red")]);
    let spec = json!({"tenant": "red", "kind": "vxlan", "ipv4": {"cidr": "10.71.0.0/24"}});
    api.apply_resource(Kind::Networks, "media", "uid-media", spec);
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("the NAD", || nads(&api).contains("red-dev/media")).await;
    let path = "/namespaces/red-dev/network-attachment-definitions/media";
    let config = api.object(Kind::Nads, "red-dev/media").unwrap()["spec"]["config"].clone();
    api.refuse_writes(path);
    api.edit(Kind::Nads, "red-dev/media", |n| n["spec"]["config"] = json!("{}"));
    let backing_off = || c.status.writes_backing_off.load(std::sync::atomic::Ordering::SeqCst);
    eventually("the write refused, backing off", || api.refusals(path) >= 1 && backing_off() == 1)
        .await;
    api.edit(Kind::Nads, "red-dev/media", |n| n["spec"]["config"] = config.clone());
    api.allow_writes(path);
    eventually("nothing backing off", || backing_off() == 0).await;
    let lists = || {
        api.requests(|r| {
            r.starts_with("GET /apis/k8s.cni.cncf.io/v1/network-attachment-definitions?")
                && !r.contains("watch=true")
        })
    };
    let before = lists();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(lists() <= before + 1, "passes ran back to back: {} lists in 3 s", lists() - before);
    c.stop().await;
}

/// One object whose writes the apiserver keeps refusing (a failing admission webhook) backs
/// off on its own: the others' changes do not make the controller write it again each time,
/// and they are not kept waiting; `knitter_manager_kubernetes_writes_backing_off` counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_apiserver_keeps_refusing_backs_off_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    let spec = |cidr: &str| json!({"kind": "vxlan", "ipv4": {"cidr": cidr}});
    api.refuse_writes("/networks/stuck/status");
    api.apply_resource(Kind::Networks, "stuck", "uid-stuck", spec("10.80.0.0/24"));
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("the refused write tried", || api.refusals("/networks/stuck/status") >= 1).await;
    eventually("counted as backing off", || {
        c.status.writes_backing_off.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    // Other networks come, one every 300 ms for 6 s: each change runs a pass at once.
    let started = std::time::Instant::now();
    for i in 0..20 {
        let name = format!("n{i}");
        api.apply_resource(
            Kind::Networks,
            &name,
            &format!("uid-{name}"),
            spec(&format!("10.81.{i}.0/24")),
        );
        eventually("a new network ready within its own pass", || {
            is_ready(&api, Kind::Networks, &name)
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let (tries, took) = (api.refusals("/networks/stuck/status"), started.elapsed().as_secs());
    let passes = api.requests(|r| {
        r.starts_with("GET /apis/k8s.cni.cncf.io/v1/network-attachment-definitions?")
            && !r.contains("watch=true")
    });
    eprintln!("{tries} tries of the refused write in {took} s, over {passes} passes");
    // 2 s, then 4, 8, 16: at most one try every two seconds, however many passes ran.
    assert!(tries <= 1 + took.div_ceil(2) as u32 && tries <= 5, "{tries} tries in {took} s");
    assert!(!is_ready(&api, Kind::Networks, "stuck"), "its status never written");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_network_resource_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    let taken = m.get_network("red").unwrap().segment.unwrap();
    api.add_namespace("admin", &[]);
    api.apply_resource(
        Kind::Networks,
        "clash",
        "uid-clash",
        json!({"kind": "vxlan", "segment": taken, "ipv4": {"cidr": "10.80.0.0/24"}}),
    );
    api.apply_resource(
        Kind::Networks,
        "red",
        "uid-red",
        json!({"kind": "vxlan", "ipv4": {"cidr": "10.1.0.0/16"}}),
    );
    api.apply_resource(Kind::Networks, "odd", "uid-odd", json!({"kind": "gre"}));
    api.apply_resource(
        Kind::IpGroups,
        "orphans",
        "uid-orphans",
        json!({"network": "nowhere", "size": 2}),
    );
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("all four refused", || {
        ["clash", "red", "odd"].iter().all(|n| ready(&api, Kind::Networks, n).is_some())
            && ready(&api, Kind::IpGroups, "orphans").is_some()
    })
    .await;
    let (status, reason, message) = ready(&api, Kind::Networks, "clash").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Conflict"));
    assert!(message.contains(&taken.to_string()), "{message}");
    let (_, reason, message) = ready(&api, Kind::Networks, "red").unwrap();
    assert_eq!(reason, "Conflict");
    assert!(message.contains("the manager's API"), "{message}");
    let (_, reason, message) = ready(&api, Kind::Networks, "odd").unwrap();
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("gre"), "{message}");
    assert_eq!(ready(&api, Kind::IpGroups, "orphans").unwrap().1, "NotFound");
    validate(
        "deploy/kubernetes/base/crds/networks.knitter.io.yaml",
        ["clash", "red"].iter().map(|n| api.object(Kind::Networks, n).unwrap()).collect(),
    );
    assert!(nads(&api).is_empty(), "no NAD for a refused network: {:?}", nads(&api));
    assert_eq!(
        m.get_network("red").unwrap().ipv4.unwrap().cidr,
        "10.1.0.0/16",
        "the API's network untouched"
    );

    api.apply_resource(
        Kind::Networks,
        "clash",
        "uid-clash",
        json!({"kind": "vxlan", "segment": taken + 1, "ipv4": {"cidr": "10.80.0.0/24"}}),
    );
    eventually("fixed, it is made", || is_ready(&api, Kind::Networks, "clash")).await;
    assert_eq!(
        api.object(Kind::Networks, "clash").unwrap()["status"]["conditions"][0]["observedGeneration"],
        2
    );
    eventually("and gets its NAD", || nads(&api) == set(&["admin/clash"])).await;
    // Each refusal is an Event on its resource (cluster-scoped: in `default`), and so is
    // being made once fixed, as `kubectl describe network clash` shows them.
    let about = |name: &str, reason: &str| {
        api.events().into_iter().any(|e| {
            e["regarding"]["kind"] == "Network"
                && e["regarding"]["name"] == name
                && e["reason"] == reason
                && e["metadata"]["namespace"] == "default"
        })
    };
    eventually("events for the refusals and the fix", || {
        about("clash", "Conflict") && about("odd", "InvalidSpec") && about("clash", "Ready")
    })
    .await;
    let e = api
        .events()
        .into_iter()
        .find(|e| e["regarding"]["name"] == "clash" && e["reason"] == "Conflict")
        .unwrap();
    assert_eq!(
        (e["type"].as_str(), e["reportingController"].as_str()),
        (Some("Warning"), Some("knitter-manager")),
        "{e}"
    );
    assert!(e["note"].as_str().unwrap_or_default().contains(&taken.to_string()), "{e}");
    c.stop().await;
}

/// What a resource made goes when the resource does, and not while pods use it: the
/// finalizer keeps a deleted Network, `Ready=False` with the reason (`InUse`), until its
/// last port goes. Deletions made while no controller ran are carried out at its start,
/// and so is the cleanup of a resource whose finalizer an operator forced off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_resource_waits_for_its_pods_and_goes_even_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start_with(Rbac::Base).await);
    api.add_namespace("admin", &[]);
    for (name, cidr) in
        [("media", "10.71.0.0/24"), ("oam", "10.72.0.0/24"), ("stale", "10.73.0.0/24")]
    {
        api.apply_resource(
            Kind::Networks,
            name,
            &format!("uid-{name}"),
            json!({"kind": "vxlan", "ipv4": {"cidr": cidr}}),
        );
    }
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("all made, finalizers on", || {
        ["media", "oam", "stale"].iter().all(|n| {
            is_ready(&api, Kind::Networks, n)
                && api
                    .object(Kind::Networks, n)
                    .is_some_and(|o| !o["metadata"]["finalizers"].is_null())
        })
    })
    .await;
    c.stop().await;

    api.delete_gracefully(Kind::Networks, "oam");
    api.delete(Kind::Networks, "stale"); // its finalizer forced off
    let (held, _) = m.create_port(port("media", "ctr-a", "")).unwrap();
    api.delete_gracefully(Kind::Networks, "media");
    assert!(
        api.object(Kind::Networks, "oam").is_some(),
        "the finalizer keeps it while no controller runs"
    );
    let c = start_with(&m, &api, with_resources("m1"));
    eventually("oam, unused, deleted at the start", || {
        m.get_network("oam").is_err() && api.object(Kind::Networks, "oam").is_none()
    })
    .await;
    eventually("stale's network found and deleted", || m.get_network("stale").is_err()).await;
    eventually("media kept, saying why", || {
        ready(&api, Kind::Networks, "media").is_some_and(|r| r.1 == "InUse")
    })
    .await;
    eventually("an InUse Event on it", || {
        api.events().iter().any(|e| {
            e["regarding"]["name"] == "media" && e["reason"] == "InUse" && e["type"] == "Warning"
        })
    })
    .await;
    let (_, _, message) = ready(&api, Kind::Networks, "media").unwrap();
    assert!(message.contains("ctr-a"), "{message}");
    assert!(m.get_network("media").is_ok());
    assert!(nads(&api).is_empty(), "no NAD for a network being deleted: {:?}", nads(&api));
    m.delete_port("ctr-a", &held.spec.interface).unwrap();
    eventually("media deleted once its port went, its resource with it", || {
        m.get_network("media").is_err() && api.object(Kind::Networks, "media").is_none()
    })
    .await;
    assert!(m.managed().unwrap().is_empty());
    c.stop().await;
}

/// The stand-in's answers read back through k8s-openapi's own types, and serialise again to
/// the same JSON (the round trip the issue asks for: its bodies are what an API server's
/// clients parse, not only what this project's tests expect): lists, single objects, watch
/// events (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, and the `ERROR` event with the 410
/// `Expired` Status), a Lease, and the `Status` of a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_ins_answers_round_trip_through_k8s_openapi() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Namespace, Node as KubeNode, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    fn round_trip<T: DeserializeOwned + Serialize>(text: &str) -> T {
        let raw: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let typed: T =
            serde_json::from_value(raw.clone()).unwrap_or_else(|e| panic!("{e}: {text}"));
        // A bookmark is read, not written back alike: k8s-openapi writes one without the
        // `kind` and `apiVersion` the API server sends (and the stand-in does).
        if raw["type"] != "BOOKMARK" {
            assert_eq!(
                serde_json::to_value(&typed).unwrap(),
                raw,
                "k8s-openapi writes back what the stand-in sent"
            );
        }
        typed
    }
    let api = ApiServer::start().await;
    api.add_node("n1");
    api.add_namespace("apps", &[("knitter.io/tenant", "red")]);
    api.add_pod("apps", "p0", "uid-p0", "n1");
    api.add_pod("apps", "p1", "uid-p1", "n1");
    api.delete_pod("apps", "p1");
    let client = api.client();
    let get = |path: String| {
        let client = client.clone();
        async move { client.request_text(axum::http::Request::get(path).body(vec![]).unwrap()).await }
    };

    let pods: k8s_openapi::List<Pod> = round_trip(&get("/api/v1/pods".into()).await.unwrap());
    assert_eq!(pods.items.len(), 1);
    let nodes: k8s_openapi::List<KubeNode> =
        round_trip(&get("/api/v1/nodes".into()).await.unwrap());
    assert_eq!(nodes.items[0].metadata.name.as_deref(), Some("n1"));
    let ns: k8s_openapi::List<Namespace> = round_trip(
        &get("/api/v1/namespaces?labelSelector=knitter.io/tenant%3Dred".into()).await.unwrap(),
    );
    assert_eq!(ns.items.len(), 1);
    let pod: Pod = round_trip(&get("/api/v1/namespaces/apps/pods/p0".into()).await.unwrap());
    assert_eq!(pod.metadata.uid.as_deref(), Some("uid-p0"));

    // Every event since the start, then a bookmark after a quiet second, then the timeout.
    let text =
        get("/api/v1/pods?watch=true&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=4"
            .into())
        .await
        .unwrap();
    let events: Vec<WatchEvent<Pod>> = text.lines().map(round_trip).collect();
    assert!(
        matches!(
            events[..],
            [
                WatchEvent::Added(_),
                WatchEvent::Added(_),
                WatchEvent::Deleted(_),
                WatchEvent::Bookmark { .. },
                ..
            ]
        ),
        "{text}"
    );

    let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l", "namespace": "knitter"}, "spec": {"holderIdentity": "m1", "leaseDurationSeconds": 15}});
    let post = axum::http::Request::post("/apis/coordination.k8s.io/v1/namespaces/knitter/leases")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&lease).unwrap())
        .unwrap();
    let created: Lease = round_trip(&client.request_text(post).await.unwrap());
    assert_eq!(created.spec.and_then(|s| s.holder_identity).as_deref(), Some("m1"));
    let _: Lease = round_trip(
        &get("/apis/coordination.k8s.io/v1/namespaces/knitter/leases/l".into()).await.unwrap(),
    );
    match get("/apis/coordination.k8s.io/v1/namespaces/knitter/leases/none".into()).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (404, "NotFound")),
        other => panic!("a missing Lease is a 404 Status: {other:?}"),
    }
    // What the shipped RBAC does not grant the manager is refused, as the apiserver would:
    // deleting a pod; a Lease outside the manager's namespace.
    let delete =
        axum::http::Request::delete("/api/v1/namespaces/apps/pods/p0").body(vec![]).unwrap();
    match client.request_text(delete).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden")),
        other => panic!("a pod delete is refused: {other:?}"),
    }
    assert!(
        get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l".into()).await.is_err()
    );
    assert_eq!(
        api.take_denied(),
        vec![
            "delete pods in group \"\" in namespace apps".to_string(),
            "get leases in group \"coordination.k8s.io\" in namespace kube-system".to_string()
        ]
    );

    // The history compacted: a watch from before it gets the ERROR event with the 410 Status.
    api.delete_pods_unseen(&[("apps".into(), "p0".into())]);
    let text =
        get("/api/v1/pods?watch=true&resourceVersion=1&timeoutSeconds=2".into()).await.unwrap();
    let events: Vec<WatchEvent<Pod>> = text.lines().map(round_trip).collect();
    match &events[..] {
        [WatchEvent::ErrorStatus(s)] => assert_eq!(
            (s.code, s.reason.as_deref(), s.status.as_deref()),
            (Some(410), Some("Expired"), Some("Failure"))
        ),
        other => panic!("{other:?}"),
    }
}

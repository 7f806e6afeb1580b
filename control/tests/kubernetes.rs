//! The manager's Kubernetes controller against an API server stand-in that speaks the real
//! wire protocol (`common/apiserver.rs`; what it does not model is listed there), driven by
//! the real `kube` client: deleted pods and nodes give back their ports, a controller killed
//! and restarted (or a watch that expired, 410) reconciles by listing again and never
//! releases a live pod's port, and a standby manager takes the Lease when the leader dies.

mod common;
#[path = "common/apiserver.rs"]
mod apiserver;

use apiserver::ApiServer;
use common::scenarios::{ip, net, port};
use knitter_control::manager::cluster::lease::LeaseOptions;
use knitter_control::manager::cluster::{Controller, Options};
use knitter_control::manager::objects::Node;
use knitter_control::manager::{Config, Filter, Manager};
use knitter_control::store::embedded::Embedded;
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
    let lease = LeaseOptions {
        namespace: "kube-system".into(),
        name: "knitter-manager".into(),
        identity: identity.into(),
        duration: Duration::from_secs(3),
        retry: Duration::from_millis(300),
    };
    Options { lease, release_nodes: true }
}

/// A controller running on its own task; `stop` ends it gracefully, aborting the task kills it.
struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(m: &Arc<Manager>, api: &ApiServer, identity: &str) -> Running {
    let (stop, rx) = watch::channel(false);
    let c = Controller::new(m.clone(), api.client(), options(identity));
    Running { stop, task: tokio::spawn(c.run(rx)) }
}

impl Running {
    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("the controller stops").expect("no panic");
    }
}

/// A pod in the cluster with a port in the manager, as the CNI would have made it.
fn pod_with_port(m: &Manager, api: &ApiServer, name: &str, node: &str) {
    api.add_pod("apps", name, &format!("uid-{name}"), node);
    let mut spec = port("red", &format!("ctr-{name}"), &format!("apps/{name}"));
    spec.pod_uid = format!("uid-{name}");
    spec.node = node.into();
    m.create_port(spec).unwrap();
}

fn port_pods(m: &Manager) -> BTreeSet<String> {
    m.list_ports(&Filter::default()).unwrap().into_iter().map(|p| p.spec.pod.trim_start_matches("apps/").to_string()).collect()
}

async fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within 20 s: {what}");
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
    eventually("the controller leads and has listed", || api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0).await;
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
    let want: BTreeSet<String> = names(100..220).into_iter().chain([String::new(), "p70".to_string()]).collect();
    eventually("a restarted controller releases what went while it was away", || port_pods(&m) == want).await;
    let p70: Vec<_> = m.list_ports(&Filter { pod: "apps/p70".into(), ..Default::default() }).unwrap();
    assert_eq!(p70.len(), 1);
    assert_eq!(p70[0].spec.pod_uid, "uid-p70-again", "the new pod's port stayed");
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
    let lists = || api.requests(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true"));
    eventually("listed and watching", || api.requests(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true")) > 0).await;
    assert_eq!(lists(), 1);
    let gone: Vec<(String, String)> = (0..5).map(|i| ("apps".to_string(), format!("p{i}"))).collect();
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
    eventually("one leads", || api.lease_holder("kube-system", "knitter-manager").is_some()).await;
    let first = api.lease_holder("kube-system", "knitter-manager").unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.lease_holder("kube-system", "knitter-manager").as_deref(), Some(first.as_str()), "the leader keeps the Lease by renewing it");
    let watches = api.requests(|r| r.contains("watch=true"));
    assert!(watches <= 2, "only the leader watches: {watches} watches");
    let (dead, standby) = if first == "a" { (a, b) } else { (b, a) };
    dead.task.abort();
    let other = if first == "a" { "b" } else { "a" };
    eventually("the standby takes the Lease", || api.lease_holder("kube-system", "knitter-manager").as_deref() == Some(other)).await;
    api.delete_pod("apps", "p0");
    eventually("the new leader releases a deleted pod's port", || port_pods(&m) == names(1..4)).await;
    standby.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_gives_back_its_ports_and_leaves_the_flood_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (m, api) = (manager(&dir), ApiServer::start().await);
    for (n, vtep) in [("n1", "192.168.0.1"), ("n2", "192.168.0.2")] {
        api.add_node(n);
        m.register_node(Node { name: n.into(), vtep: ip(vtep), underlay_mtu: 1600, capabilities: vec![], registered: 0, last_seen: 0, state: String::new() }).unwrap();
    }
    for i in 0..6 {
        pod_with_port(&m, &api, &format!("p{i}"), if i % 2 == 0 { "n1" } else { "n2" });
    }
    let c = start(&m, &api, "m1");
    eventually("watching nodes", || api.requests(|r| r.starts_with("GET /api/v1/nodes?") && r.contains("watch=true")) > 0).await;
    api.delete_node("n1");
    eventually("n1's ports released", || port_pods(&m) == ["p1", "p3", "p5"].map(String::from).into()).await;
    eventually("n1 forgotten", || m.list_nodes().unwrap().iter().map(|n| n.name.clone()).collect::<Vec<_>>() == ["n2"]).await;
    c.stop().await;
}

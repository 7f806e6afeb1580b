//! One manager, several Kubernetes clusters (issue 52): clusters as objects with their rules
//! (names, the nodes that join them, networks limited to some, deletion that releases only
//! when told), a pod as (cluster, namespace/name, UID) — the same name in two clusters is
//! two pods, for the controllers' releases and an IP group's stickiness — a controller per
//! cluster that acts on its own cluster's nodes and ports only, a cluster cut off that
//! releases nothing while the others go on, and the operator's path through `knitterctl`
//! with the manager process. Two API server stand-ins (`common/apiserver.rs`) are the two
//! clusters.

#[allow(dead_code)] // kubectl's parts (the install test's)
#[path = "common/apiserver.rs"]
mod apiserver;
mod common;

use apiserver::{ApiServer, Kind, Rbac};
use common::controllers::{
    Running, eventually, eventually_within, node_record, register_in, start_through, validate,
};
use common::scenarios::{ip, net, port};
use knitter_manager::manager::cluster::Options;
use knitter_manager::manager::cluster::lease::LeaseOptions;
use knitter_manager::manager::objects::{ClusterSpec, IpGroupSpec, PortSpec, shown_cluster};
use knitter_manager::manager::{Config, Filter, Manager, ManagerError};
use knitter_manager::store::embedded::Embedded;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

const EAST: &str = "east";

/// A manager with network `red` and cluster `east` added.
fn manager(dir: &tempfile::TempDir) -> Arc<Manager> {
    let store = Embedded::open(&dir.path().join("store.redb")).unwrap();
    let m = Manager::new(Arc::new(store), Config::default()).unwrap();
    m.create_network(net("red", "admin", "10.1.0.0/16")).unwrap();
    m.create_cluster(ClusterSpec { name: EAST.into(), kubeconfig: "/dev/null".into() }).unwrap();
    Arc::new(m)
}

/// A pod's port on `node`, as the CNI makes it.
fn pod_port(pod: &str, uid: &str, node: &str) -> PortSpec {
    let container = format!("ctr-{uid}");
    let mut spec = port("red", &container, &format!("apps/{pod}"));
    spec.pod_uid = uid.into();
    spec.node = node.into();
    spec
}

/// The ports' pods, each as `cluster:namespace/name` (`local` for the manager's own).
fn pods(m: &Manager) -> BTreeSet<String> {
    m.list_ports(&Filter::default())
        .unwrap()
        .into_iter()
        .map(|p| format!("{}:{}", shown_cluster(&p.cluster), p.spec.pod))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A controller for `cluster` as the fleet runs it (each cluster's Lease is its own).
fn controller(m: &Arc<Manager>, client: kube::Client, cluster: &str) -> Running {
    let lease = LeaseOptions::timed("knitter", "knitter-manager", "m1", Duration::from_secs(3));
    let opts = Options {
        cluster: cluster.into(),
        cluster_id: m.cluster_id(cluster).unwrap().unwrap_or_default(),
        lease,
        release_nodes: true,
        network_status: false,
        network_resources: false,
        kubeconfigs: "/etc/knitter/clusters".into(),
    };
    start_through(m, client, opts)
}

/// Two clusters, each with a node and the pods `web` and `keeper` (DaemonSets' pods are on
/// every node: a list that shows a node's pods vouches for it), and the manager with a port
/// for each `web`.
async fn two_clusters(m: &Manager) -> (ApiServer, ApiServer) {
    let (local, east) = (ApiServer::start().await, ApiServer::start_with(Rbac::Member).await);
    register_in(m, "a1", "192.0.2.1", "");
    register_in(m, "b1", "192.0.2.2", EAST);
    for (api, node, c) in [(&local, "a1", "a"), (&east, "b1", "b")] {
        api.add_node(node);
        api.add_pod("apps", "web", &format!("uid-web-{c}"), node);
        api.add_pod("apps", "keeper", &format!("uid-keeper-{c}"), node);
        m.create_port(pod_port("web", &format!("uid-web-{c}"), node)).unwrap();
    }
    (local, east)
}

/// Why `r` was refused ("" if it was not).
fn refused<T>(r: Result<T, ManagerError>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn clusters_are_objects_that_nodes_join_networks_limit_and_deletion_releases() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let spec = |kubeconfig: &str| ClusterSpec { name: EAST.into(), kubeconfig: kubeconfig.into() };
    let (again, created) = m.create_cluster(spec("/dev/null")).unwrap();
    assert!(!created && again.id.len() == 36, "the same request again: {again:?}");
    assert!(refused(m.create_cluster(spec("/other"))).contains("delete it to change it"));
    let local = ClusterSpec { name: "local".into(), kubeconfig: "/x".into() };
    assert!(refused(m.create_cluster(local)).contains("the manager's own"));
    assert!(refused(m.create_cluster(spec(""))).contains("give the kubeconfig"));

    // A node joins a cluster that exists, and stays in it.
    register_in(&m, "a1", "192.0.2.1", "");
    register_in(&m, "b1", "192.0.2.2", EAST);
    let mut node = m.get_node("b1").unwrap();
    node.cluster = "west".into();
    assert!(matches!(m.register_node(node.clone()), Err(ManagerError::NotFound { .. })));
    node.cluster = String::new();
    assert!(refused(m.register_node(node)).contains("registered in cluster \"east\""));

    // Once the manager serves another cluster, a node says its cluster before its pods
    // attach: an unknown node may be another cluster's.
    let why = refused(m.create_port(pod_port("web", "uid-x", "unknown-node")));
    assert!(why.contains("node \"unknown-node\" is not registered"), "{why}");

    // A network limited to the manager's own cluster: east's nodes cannot attach to it.
    let mut limited = net("own-only", "admin", "10.2.0.0/16");
    limited.clusters = vec!["local".into()];
    m.create_network(limited).unwrap();
    let mut on_b1 = pod_port("web", "uid-b", "b1");
    on_b1.network = "own-only".into();
    let why = refused(m.create_port(on_b1));
    assert!(
        why.contains("spans clusters [\"local\"]; node \"b1\" is in cluster \"east\""),
        "{why}"
    );
    let mut on_a1 = pod_port("web", "uid-a", "a1");
    on_a1.network = "own-only".into();
    assert_eq!(m.create_port(on_a1).unwrap().0.cluster, "");

    // An IP group's member sticks to its pod, and the same name in another cluster is
    // another pod.
    m.create_group(IpGroupSpec {
        name: "g".into(),
        network: "red".into(),
        members: vec![ip("10.1.9.1"), ip("10.1.9.2")],
        size: None,
        grace_secs: Some(300),
    })
    .unwrap();
    let in_group = |uid: &str, node: &str| {
        let mut s = pod_port("db", uid, node);
        s.ip_group = Some("g".into());
        s
    };
    let (east_db, _) = m.create_port(in_group("uid-db-b", "b1")).unwrap();
    assert_eq!(east_db.cluster, EAST);
    let member = east_db.addresses[0].address;
    m.delete_port(&east_db.spec.container, &east_db.spec.interface).unwrap();
    let (local_db, _) = m.create_port(in_group("uid-db-a", "a1")).unwrap();
    assert_ne!(local_db.addresses[0].address, member, "east's apps/db keeps its member");
    let (east_db, _) = m.create_port(in_group("uid-db-b2", "b1")).unwrap();
    assert_eq!(east_db.addresses[0].address, member, "east's apps/db gets its member back");

    // Listed with what each holds; the manager's own first.
    let listed: Vec<(String, u64, u64)> =
        m.list_clusters().unwrap().into_iter().map(|c| (c.spec.name, c.nodes, c.ports)).collect();
    assert_eq!(listed, [("local".to_string(), 1, 2), (EAST.to_string(), 1, 1)]);

    // Deleted only when told to release what it holds.
    let why = refused(m.delete_cluster(EAST, false));
    assert!(why.contains("has 1 nodes holding 1 ports") && why.contains("--release"), "{why}");
    assert!(m.delete_cluster("local", true).is_err(), "the own cluster stays");
    let gone = m.delete_cluster(EAST, true).unwrap().unwrap();
    assert_eq!((gone.nodes, gone.ports), (1, 1));
    assert!(matches!(m.get_cluster(EAST), Err(ManagerError::NotFound { .. })));
    assert!(matches!(m.get_node("b1"), Err(ManagerError::NotFound { .. })));
    assert_eq!(pods(&m), set(&["local:apps/db", "local:apps/web"]));
    assert_eq!(m.delete_cluster(EAST, true).unwrap(), None, "deleting again finds none");
}

/// Each cluster's controller acts on its own nodes and ports: a node list without the other
/// cluster's nodes forgets none of them, a pod deleted in one cluster releases its own port
/// and not that of the pod with its name in the other, a node deleted in one goes with its
/// ports alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_releases_only_what_its_own_pods_and_nodes_held() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let (local, east) = two_clusters(&m).await;
    let a = controller(&m, local.client(), "local");
    let b = controller(&m, east.client(), EAST);
    eventually("both listed pods and nodes", || {
        a.status.relists.load(SeqCst) >= 2 && b.status.relists.load(SeqCst) >= 2
    })
    .await;
    let both = set(&["east:apps/web", "local:apps/web"]);
    assert_eq!(pods(&m), both, "every pod is alive");
    assert!(m.get_node("a1").is_ok() && m.get_node("b1").is_ok(), "no node forgotten");

    local.delete_pod("apps", "web");
    eventually("the own cluster's web released", || pods(&m) == set(&["east:apps/web"])).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(pods(&m), set(&["east:apps/web"]), "east's web is another pod");

    east.delete_node("b1");
    eventually("b1 forgotten with its port", || m.get_node("b1").is_err() && pods(&m).is_empty())
        .await;
    assert!(m.get_node("a1").is_ok());
    assert_eq!(
        (a.status.released_ports.load(SeqCst), b.status.released_ports.load(SeqCst)),
        (1, 1)
    );
    a.stop().await;
    b.stop().await;
}

/// How long the test keeps a cluster's apiserver cut off.
const CUT_OFF: Duration = Duration::from_secs(60);

/// A cluster whose apiserver hangs keeps its pods' ports (its state is unknown, nothing is
/// released) while the other cluster's controller goes on; when it answers again, a relist
/// reconciles what happened meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_cut_off_releases_nothing_and_holds_no_other_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let (local, east) = two_clusters(&m).await;
    let door = east.door().await;
    let a = controller(&m, local.client(), "local");
    let b = controller(&m, door.client(), EAST);
    eventually("both lead and listed", || {
        b.status.leader.load(SeqCst)
            && a.status.relists.load(SeqCst) >= 2
            && b.status.relists.load(SeqCst) >= 2
    })
    .await;
    door.stall(true);
    let cut = std::time::Instant::now();
    east.delete_pod("apps", "web");
    local.delete_pod("apps", "web");
    eventually("the own cluster goes on", || pods(&m) == set(&["east:apps/web"])).await;
    eventually("east's controller stops acting", || !b.status.leader.load(SeqCst)).await;
    tokio::time::sleep(CUT_OFF.saturating_sub(cut.elapsed())).await;
    assert_eq!(pods(&m), set(&["east:apps/web"]), "nothing released while east is unknown");
    assert!(m.get_node("b1").is_ok());

    door.stall(false);
    eventually_within("east back: its relist releases web's port", Duration::from_secs(60), || {
        pods(&m).is_empty()
    })
    .await;
    assert!(m.get_node("b1").is_ok(), "east's node stays");
    a.stop().await;
    b.stop().await;
}

/// The operator's path: knitter-manager runs its own cluster's controller; `knitterctl
/// manager cluster add` adds another with its kubeconfig, whose controller starts at once
/// (its own Lease in that cluster), is listed and counted in the metrics; its node
/// registers into it; a pod deleted there releases its port; the cluster is deleted only
/// with `--release`; SIGTERM gives both Leases up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_adds_a_cluster_and_deletes_it_with_knitterctl() {
    let dir = tempfile::tempdir().unwrap();
    let (local, east) = (ApiServer::start().await, ApiServer::start_with(Rbac::Member).await);
    east.add_node("b1");
    east.add_pod("apps", "web", "uid-web", "b1");
    east.add_pod("apps", "keeper", "uid-keeper", "b1");
    let kubeconfig = |name: &str, api: &ApiServer| {
        let path = dir.path().join(name);
        std::fs::write(&path, api.kubeconfig(false)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (own, other) =
        (kubeconfig("local.kubeconfig", &local), kubeconfig("east.kubeconfig", &east));
    let mdir = dir.path().join("m");
    let m = tokio::task::spawn_blocking(move || {
        common::ManagerProc::start_kubernetes(&mdir, &own, &[])
    })
    .await
    .unwrap();
    let ctl = {
        let (grpc, token) = (m.grpc.clone(), dir.path().join("m/token"));
        move |args: &[&str]| {
            let out = std::process::Command::new(common::knitterctl())
                .args(["--manager", &grpc, "--token-file"])
                .arg(&token)
                .args(args)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            (out.status.success(), text, String::from_utf8_lossy(&out.stderr).to_string())
        }
    };
    let ok = |args: &[&str]| {
        let (ok, out, err) = ctl(args);
        assert!(ok, "knitterctl {args:?}: {err}");
        out
    };
    ok(&["manager", "cluster", "add", EAST, "--kubeconfig", &other]);
    ok(&["manager", "node", "register", "b1", "--vtep", "192.0.2.2", "--cluster", EAST]);
    ok(&["manager", "network", "create", "red", "--ipv4", "10.1.0.0/16"]);
    for pod in ["web", "keeper"] {
        ok(&[
            "manager",
            "port",
            "create",
            "--network",
            "red",
            "--container",
            pod,
            "--pod",
            &format!("apps/{pod}"),
            "--node",
            "b1",
        ]);
    }
    let east_status = || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&["-o", "json", "manager", "cluster", "show", EAST])).unwrap();
        v
    };
    eventually("east's controller leads and lists its pods", || {
        let s = east_status();
        s["controller"]["leader"] == true && s["controller"]["pods"] == 2
    })
    .await;
    assert_eq!(east.lease_holder("knitter", "leader").as_deref(), Some("m1"), "east's own Lease");
    let s = east_status();
    assert_eq!((s["nodes"].as_u64(), s["ports"].as_u64()), (Some(1), Some(2)), "{s}");
    let table = ok(&["manager", "cluster", "list"]);
    assert!(
        table.contains("local") && table.contains("(own)") && table.contains("leading"),
        "{table}"
    );

    east.delete_pod("apps", "web");
    eventually("web's port released by east's controller", || {
        !ok(&["manager", "port", "list"]).contains("apps/web")
    })
    .await;
    let metrics = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&m.rest).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        body
    };
    assert!(
        metrics.contains("knitter_manager_cluster_leader{cluster=\"east\"} 1")
            && metrics.contains("knitter_manager_cluster_released_ports_total{cluster=\"east\"} 1"),
        "{metrics}"
    );

    let (deleted, _, why) = ctl(&["manager", "cluster", "delete", EAST]);
    assert!(!deleted && why.contains("has 1 nodes holding 1 ports"), "{why}");
    let out = ok(&["manager", "cluster", "delete", EAST, "--release"]);
    assert!(out.contains("1 ports released, 1 nodes forgotten"), "{out}");
    assert!(!ok(&["manager", "node", "list"]).contains("b1"));
    eventually("east's controller stopped: its Lease given up", || {
        east.lease_holder("knitter", "leader").as_deref() == Some("")
    })
    .await;
    let mut m = m;
    assert!(
        tokio::task::block_in_place(|| m.terminate(Duration::from_secs(15))),
        "the manager stops on SIGTERM"
    );
    assert_eq!(local.lease_holder("knitter", "leader").as_deref(), Some(""), "the Lease released");
}

/// A tenant's namespace is its own cluster's: the same name in another cluster is another
/// namespace, which the tenant claims only by listing it as `cluster/namespace`.
#[test]
fn a_tenants_namespace_in_another_cluster_is_claimed_only_by_name_with_its_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    register_in(&m, "a1", "192.0.2.1", "");
    register_in(&m, "b1", "192.0.2.2", EAST);
    m.create_tenant("red", None).unwrap();
    m.set_tenant_namespaces("red", vec!["red".into()]).unwrap();
    m.create_network(net("red-net", "red", "10.3.0.0/16")).unwrap();
    let web = |node: &str, uid: &str| {
        let mut s = pod_port("web", uid, node);
        s.network = "red-net".into();
        s.pod = "red/web".into();
        s
    };
    m.create_port(web("a1", "uid-a")).unwrap();
    let why = refused(m.create_port(web("b1", "uid-b")));
    assert!(
        why.contains("namespace \"red\" of cluster \"east\" belongs to tenant \"admin\""),
        "{why}"
    );
    m.set_tenant_namespaces("red", vec!["red".into(), "east/red".into()]).unwrap();
    assert_eq!(m.create_port(web("b1", "uid-b")).unwrap().0.cluster, EAST);
}

/// A cluster deleted and added again under its name is another cluster: a controller
/// started for the first (as another replica's may still run for a moment) acts on
/// nothing of the second's; the second's own controller does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_of_a_cluster_added_again_acts_on_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let (_local, east) = two_clusters(&m).await;
    let old = controller(&m, east.client(), EAST);
    eventually("the first east listed", || old.status.relists.load(SeqCst) >= 2).await;
    m.delete_cluster(EAST, true).unwrap();
    m.create_cluster(ClusterSpec { name: EAST.into(), kubeconfig: "/dev/null".into() }).unwrap();
    register_in(&m, "b1", "192.0.2.2", EAST);
    m.create_port(pod_port("web", "uid-web-b", "b1")).unwrap();
    east.delete_pod("apps", "web");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pods(&m), set(&["east:apps/web", "local:apps/web"]), "the old one acted");
    let new = controller(&m, east.client(), EAST);
    eventually("the new east's controller releases web", || pods(&m) == set(&["local:apps/web"]))
        .await;
    old.stop().await;
    new.stop().await;
}

/// A network marked for a member cluster gets a NetworkAttachmentDefinition there in each
/// namespace its tenant claims in that cluster (a shared one's in every namespace), without
/// an owner (its Network resource, if any, is another cluster's); an unmarked network gets
/// none; a namespace the tenant no longer claims loses its NAD. Under the member overlay's
/// RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_marked_for_a_member_get_their_nads_there() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let east = ApiServer::start_with(Rbac::Member).await;
    for ns in ["red-ns", "blue-ns"] {
        east.add_namespace(ns, &[]);
    }
    m.create_tenant("red", None).unwrap();
    m.set_tenant_namespaces("red", vec!["east/red-ns".into()]).unwrap();
    let marked = |name: &str, cidr: &str, shared: bool, clusters: &[&str]| {
        let mut n = net(name, "red", cidr);
        n.shared = shared;
        n.clusters = clusters.iter().map(|c| c.to_string()).collect();
        m.create_network(n).unwrap();
    };
    marked("media", "10.4.0.0/16", false, &["local", EAST]);
    marked("everywhere", "10.5.0.0/16", false, &[]);
    marked("common", "10.6.0.0/16", true, &[EAST]);
    let nads = || east.objects(Kind::Nads).into_keys().collect::<BTreeSet<String>>();
    let c = controller(&m, east.client(), EAST);
    eventually("east's NADs", || {
        nads() == set(&["blue-ns/common", "red-ns/common", "red-ns/media"])
    })
    .await;
    let nad = east.object(Kind::Nads, "red-ns/media").unwrap();
    assert!(nad["metadata"]["ownerReferences"].is_null(), "{nad}");
    assert_eq!(nad["metadata"]["labels"]["knitter.io/cluster"], EAST, "{nad}");
    assert_eq!(nad["metadata"]["labels"]["app.kubernetes.io/managed-by"], "knitter-manager");
    assert!(nad["spec"]["config"].as_str().unwrap().contains("\"network\":\"media\""), "{nad}");
    m.set_tenant_namespaces("red", vec![]).unwrap();
    eventually("red-ns no longer red's: its media NAD gone", || {
        nads() == set(&["blue-ns/common", "red-ns/common"])
    })
    .await;
    c.stop().await;
}

/// A node that joined with a cluster's bootstrap token registers in that cluster only; one
/// that joined with the manager's own registers in the own cluster only; a cluster's token
/// issued again, or the cluster deleted, joins no node any more.
#[test]
fn a_node_joined_with_a_clusters_token_registers_in_that_cluster_only() {
    use knitter_manager::manager::auth::{Auth, Caller};
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let auth = Auth::new("admin-token", Some("own-bootstrap".into()), false);
    let token = m.issue_cluster_token(EAST).unwrap();
    let joining = auth.identify(&m, Some(&token)).unwrap();
    assert_eq!(joining, Caller::ClusterBootstrap(EAST.into()));
    let b1 = auth.identify(&m, Some(&m.issue_node_token("b1", &joining).unwrap())).unwrap();
    let why = refused(m.register_node_as(&b1, node_record("b1", "192.0.2.2", "")));
    assert!(why.contains("joined with cluster \"east\"'s bootstrap token"), "{why}");
    m.register_node_as(&b1, node_record("b1", "192.0.2.2", EAST)).unwrap();

    let own = auth.identify(&m, Some("own-bootstrap")).unwrap();
    let a1 = auth.identify(&m, Some(&m.issue_node_token("a1", &own).unwrap())).unwrap();
    let why = refused(m.register_node_as(&a1, node_record("a1", "192.0.2.1", EAST)));
    assert!(why.contains("joined with cluster \"local\"'s bootstrap token"), "{why}");
    m.register_node_as(&a1, node_record("a1", "192.0.2.1", "local")).unwrap();

    let again = m.issue_cluster_token(EAST).unwrap();
    assert!(auth.identify(&m, Some(&token)).is_err(), "the old token is revoked");
    m.delete_cluster(EAST, true).unwrap();
    assert!(auth.identify(&m, Some(&again)).is_err(), "a deleted cluster's token joins nothing");
    assert!(matches!(m.issue_cluster_token(EAST), Err(ManagerError::NotFound { .. })));
}

/// A member's kubeconfig that reaches the manager's own apiserver (a mistake) does not set
/// the two controllers on each other: each keeps only its own NADs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_and_a_members_controller_on_one_apiserver_keep_each_others_nads() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&dir);
    let api = ApiServer::start().await;
    api.add_namespace("red-ns", &[]);
    m.create_tenant("red", None).unwrap();
    m.set_tenant_namespaces("red", vec!["east/red-ns".into()]).unwrap();
    let mut media = net("media", "red", "10.4.0.0/16");
    media.clusters = vec![EAST.into()];
    m.create_network(media).unwrap();
    let member = controller(&m, api.client(), EAST);
    let nads = || api.objects(Kind::Nads).into_keys().collect::<BTreeSet<String>>();
    eventually("the member's NAD", || nads() == set(&["red-ns/media"])).await;
    let lease = LeaseOptions::timed("knitter", "own-lease", "m1", Duration::from_secs(3));
    let own = start_through(
        &m,
        api.client(),
        Options {
            cluster: "local".into(),
            cluster_id: String::new(),
            lease,
            release_nodes: true,
            network_status: false,
            network_resources: true,
            kubeconfigs: "/etc/knitter/clusters".into(),
        },
    );
    eventually("the own controller made a pass", || {
        own.status.relists.load(SeqCst) >= 2
            && api.requests(|r| r.contains("network-attachment-definitions?")) > 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(nads(), set(&["red-ns/media"]));
    let deletes = api.requests(|r| r.starts_with("DELETE") && r.contains("network-attachment"));
    assert_eq!(deletes, 0, "a controller deleted the other's NAD");
    own.stop().await;
    member.stop().await;
}

/// A `Cluster` resource (`clusters.knitter.io`) in the manager's own cluster adds the
/// cluster as `knitterctl manager cluster add` does, with its kubeconfig read from a key of
/// the `knitter-clusters` Secret (never a path the resource's writer picks); its status says
/// what the manager made of it; the APIs do not delete it; deleting it waits, with the
/// reason, until `releaseOnDelete` confirms what goes with it. One whose finalizer was taken
/// off by hand leaves its cluster to the APIs' delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_resource_adds_the_cluster_and_its_deletion_waits_for_the_confirmation() {
    use knitter_manager::manager::cluster::{Controller, fleet::Fleet};
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let m = Arc::new(
        Manager::new(
            Arc::new(Embedded::open(&dir.path().join("store.redb")).unwrap()),
            Config::default(),
        )
        .unwrap(),
    );
    m.create_network(net("red", "admin", "10.1.0.0/16")).unwrap();
    let (local, east) = (ApiServer::start().await, ApiServer::start_with(Rbac::Member).await);
    east.add_node("b1");
    east.add_pod("apps", "web", "uid-web", "b1");
    let secret = dir.path().join("clusters");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("east"), east.kubeconfig(false)).unwrap();
    let opts = Options {
        cluster: "local".into(),
        cluster_id: String::new(),
        lease: LeaseOptions::timed("knitter", "knitter-manager", "m1", Duration::from_secs(3)),
        release_nodes: true,
        network_status: false,
        network_resources: true,
        kubeconfigs: secret.clone(),
    };
    let own = Controller::new(m.clone(), local.client(), opts.clone());
    let fleet = Fleet::new(m.clone(), opts, Some(own.status()));
    let (stop, rx) = tokio::sync::watch::channel(false);
    let fleet_task = tokio::spawn(fleet.clone().run(rx.clone()));
    let own_task = tokio::spawn(own.with_fleet(fleet).run(rx));
    let status =
        |name: &str| local.object(Kind::KnitterClusters, name).map(|o| o["status"].clone());
    let ready = |name: &str| {
        status(name).map(|s| {
            let c = &s["conditions"][0];
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
    };

    local.apply_resource(Kind::KnitterClusters, EAST, "uid-east", json!({"kubeconfigKey": "east"}));
    eventually("east added from its resource", || m.get_cluster(EAST).is_ok()).await;
    eventually("east's controller leads there", || {
        east.lease_holder("knitter", "knitter-manager").as_deref() == Some("m1")
    })
    .await;
    let id = m.get_cluster(EAST).unwrap().id;
    assert_eq!(m.get_cluster(EAST).unwrap().spec.kubeconfig, secret.join("east").to_str().unwrap());
    local.add_namespace("poke", &[]); // a pass now, not at the next resync
    let running = |name: &str| {
        status(name).and_then(|s| {
            let c = s["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "ControllerRunning")?
                .clone();
            Some((c["status"].as_str()?.to_string(), c["reason"].as_str()?.to_string()))
        })
    };
    eventually("the status says what the manager made of it, its controller running", || {
        status(EAST).is_some_and(|s| s["id"] == id.as_str() && s.get("controllerError").is_none())
            && ready(EAST) == Some(("True".into(), "Created".into()))
            && running(EAST) == Some(("True".into(), "Running".into()))
    })
    .await;
    let e = refused(m.delete_cluster(EAST, true));
    assert!(e.contains("kubectl delete clusters.knitter.io east"), "{e}");

    // A key that is a path is refused, whatever the CRD's pattern let through.
    local.apply_resource(
        Kind::KnitterClusters,
        "west",
        "uid-west",
        json!({"kubeconfigKey": "../store.redb"}),
    );
    eventually("a path is not a key", || {
        ready("west") == Some(("False".into(), "InvalidSpec".into()))
    })
    .await;
    assert!(m.get_cluster("west").is_err());

    register_in(&m, "b1", "192.0.2.2", EAST);
    m.create_port(pod_port("web", "uid-web", "b1")).unwrap();
    local.delete_gracefully(Kind::KnitterClusters, EAST);
    eventually("held while its node holds a port, with the reason", || {
        ready(EAST) == Some(("False".into(), "InUse".into()))
            && status(EAST).is_some_and(|s| {
                s["conditions"][0]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("releaseOnDelete")
            })
    })
    .await;
    assert_eq!(pods(&m), set(&["east:apps/web"]), "nothing released without the confirmation");
    validate(
        "deploy/kubernetes/base/crds/clusters.knitter.io.yaml",
        vec![local.object(Kind::KnitterClusters, EAST).unwrap()], // west's spec is not the CRD's
    );
    local.apply_resource(
        Kind::KnitterClusters,
        EAST,
        "uid-east",
        json!({"kubeconfigKey": "east", "releaseOnDelete": true}),
    );
    eventually("confirmed: the cluster, its port and its node gone, the resource too", || {
        m.get_cluster(EAST).is_err()
            && pods(&m).is_empty()
            && m.list_nodes().unwrap().is_empty()
            && local.object(Kind::KnitterClusters, EAST).is_none()
    })
    .await;
    eventually("east's controller stopped: its Lease given up", || {
        east.lease_holder("knitter", "knitter-manager").as_deref() == Some("")
    })
    .await;

    // A kubeconfig that runs a command for its credentials: the cluster made, its
    // controller not run, and the status says why.
    let exec = east.kubeconfig(false).replace(
        "users:\n",
        "users:\n- name: runs\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: touch, args: [/tmp/knitter-pwned]}\n",
    );
    assert!(exec.contains("exec:"), "{exec}");
    std::fs::write(secret.join("north"), exec).unwrap();
    local.apply_resource(
        Kind::KnitterClusters,
        "north",
        "uid-north",
        json!({"kubeconfigKey": "north"}),
    );
    eventually("north added", || m.get_cluster("north").is_ok()).await;
    local.add_namespace("poke-2", &[]);
    eventually_within(
        "north's controller refused, with the reason",
        Duration::from_secs(40),
        || {
            local.add_namespace("poke-3", &[]);
            running("north").is_some_and(|(s, r)| s == "False" && r == "ControllerNotRunning")
                && status("north").is_some_and(|s| {
                    s["controllerError"].as_str().unwrap_or_default().contains("runs a command")
                })
        },
    )
    .await;

    // Its finalizer taken off by hand: the cluster stays (no one confirmed a release) and
    // is the APIs' to delete.
    register_in(&m, "n1", "192.0.2.3", "north");
    local.delete(Kind::KnitterClusters, "north");
    eventually("north left to the APIs", || {
        m.delete_cluster("north", false).is_err_and(|e| e.to_string().contains("--release"))
    })
    .await;
    assert_eq!(m.list_nodes().unwrap().len(), 1, "nothing released");
    m.delete_cluster("north", true).unwrap();

    stop.send_replace(true);
    for task in [own_task, fleet_task] {
        tokio::time::timeout(Duration::from_secs(15), task).await.unwrap().unwrap();
    }
}

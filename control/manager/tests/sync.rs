//! Node sync over the real gRPC service (loopback): each node's stream carries its
//! networks, flood lists, endpoints and peers; a node whose stream goes quiet leaves the
//! others' flood lists only after its lease and the grace; a restarted manager serves the
//! same state to a reconnecting node; a sync without the token is refused. On a real etcd:
//! two manager replicas serve streams that follow each other's changes, through a
//! compaction of etcd's history.

mod common;

use knitter_api::manager as pb;
use knitter_manager::manager::auth::Auth;
use knitter_manager::manager::objects::PortSpec;
use knitter_manager::manager::sync::Liveness;
use knitter_manager::manager::{Config, Manager, grpc};
use knitter_manager::network::{Kind, NetworkSpec, Plane, SubnetSpec};
use knitter_manager::store::Store;
use knitter_manager::store::embedded::Embedded;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Streaming;

const TOKEN: &str = "sync-test-token";

/// A manager serving gRPC on a loopback port until dropped.
struct Served {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start(store: &Path, live: Liveness) -> Served {
        // A stopped manager's tasks let go of the store within a second (a restarted
        // process would not wait at all).
        Served::on(Arc::new(open_when_free(store).await), live).await
    }

    async fn on(store: Arc<dyn Store>, live: Liveness) -> Served {
        Served::with_auth(store, live, Auth::admin(TOKEN)).await
    }

    async fn with_auth(store: Arc<dyn Store>, live: Liveness, auth: Auth) -> Served {
        let config = Config { liveness: live, ..Config::default() };
        let manager =
            Arc::new(tokio::task::block_in_place(|| Manager::new(store, config)).unwrap());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = grpc::Grpc::with_auth(manager, auth).server();
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        Served { addr, stop: Some(tx), task }
    }

    /// Stops serving and waits until the manager (and its store) is gone.
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    async fn client(&self) -> pb::manager_client::ManagerClient<tonic::transport::Channel> {
        pb::manager_client::ManagerClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    async fn sync(
        &self,
        node: &str,
        vtep: &str,
        token: Option<&str>,
    ) -> Result<Streaming<pb::DesiredState>, tonic::Status> {
        self.sync_in(node, vtep, "", token).await
    }

    /// [`Served::sync`] of a node registering in `cluster`.
    async fn sync_in(
        &self,
        node: &str,
        vtep: &str,
        cluster: &str,
        token: Option<&str>,
    ) -> Result<Streaming<pb::DesiredState>, tonic::Status> {
        let me = pb::Node {
            name: node.into(),
            vtep: vtep.into(),
            underlay_mtu: Some(1600),
            cluster: cluster.into(),
            ..Default::default()
        };
        let mut req = tonic::Request::new(pb::SyncRequest { node: Some(me), revision: 0 });
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(self.client().await.sync(req).await?.into_inner())
    }
}

/// The store at `path`, once a stopped manager has let go of it.
async fn open_when_free(path: &Path) -> Embedded {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Embedded::open(path) {
            Ok(s) => return s,
            Err(e) if Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The next state on `s` that satisfies `ok`, within 15 s.
async fn until(
    s: &mut Streaming<pb::DesiredState>,
    what: &str,
    ok: impl Fn(&pb::DesiredState) -> bool,
) -> pb::DesiredState {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.message()).await {
            Ok(Ok(Some(d))) if ok(&d) => return d,
            Ok(Ok(Some(_))) => {}
            other => panic!("waiting for {what}: {other:?}"),
        }
    }
}

fn network(name: &str, cidr: &str) -> NetworkSpec {
    NetworkSpec {
        name: name.into(),
        tenant: "admin".into(),
        kind: Kind::Vxlan,
        plane: Plane::Media,
        segment: Some(7001),
        ipv4: Some(SubnetSpec { cidr: cidr.into(), gateway: None, pools: vec![] }),
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

fn port(container: &str, node: &str) -> PortSpec {
    PortSpec {
        network: "red".into(),
        container: container.into(),
        interface: "eth0".into(),
        pod: format!("ns/{container}"),
        node: node.into(),
        ips: vec![],
        ip_group: None,
        requested_mac: None,
        pod_uid: String::new(),
        device_info: None,
    }
}

fn as_<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// On the gRPC API too a node's token speaks for its node alone: it syncs and registers as
/// itself, never as another, and changes no network; the bootstrap token joins a name once;
/// a node deleted by the admin joins again (its old token gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_token_syncs_only_as_its_own_node() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(Embedded::open(&dir.path().join("store.redb")).unwrap());
    let s = Served::with_auth(
        store,
        Liveness::default(),
        Auth::new(TOKEN, Some("sync-bootstrap".into()), false),
    )
    .await;
    let mut c = s.client().await;
    let t1 = c
        .join_node(as_(pb::Name { name: "n1".into() }, "sync-bootstrap"))
        .await
        .unwrap()
        .into_inner()
        .token;
    let again =
        c.join_node(as_(pb::Name { name: "n1".into() }, "sync-bootstrap")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
    let as_n2 = s.sync("n2", "192.0.2.2", Some(&t1)).await.unwrap_err();
    assert_eq!(as_n2.code(), tonic::Code::PermissionDenied, "{as_n2:?}");
    let mut own = s.sync("n1", "192.0.2.1", Some(&t1)).await.unwrap();
    until(&mut own, "n1's first state", |_| true).await;
    let e = c
        .register_node(as_(
            pb::Node { name: "n2".into(), vtep: "192.0.2.2".into(), ..Default::default() },
            &t1,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let net = pb::Network {
        name: "evil".into(),
        tenant: "admin".into(),
        kind: "vxlan".into(),
        ..Default::default()
    };
    assert_eq!(
        c.create_network(as_(net, &t1)).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        c.delete_node(as_(pb::Name { name: "n1".into() }, &t1)).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    drop(own);
    c.delete_node(as_(pb::Name { name: "n1".into() }, TOKEN)).await.unwrap();
    assert_eq!(
        c.list_nodes(as_(pb::ListRequest::default(), &t1)).await.unwrap_err().code(),
        tonic::Code::Unauthenticated,
        "the deleted node's token"
    );
    let t1b = c
        .join_node(as_(pb::Name { name: "n1".into() }, "sync-bootstrap"))
        .await
        .unwrap()
        .into_inner()
        .token;
    assert_ne!(t1, t1b);
    s.stop().await;
}

/// Through the sync stream, as knitter-vswitchd registers: a node that joined with a
/// cluster's bootstrap token syncs in that cluster only (not in the own one, not without
/// one), a node that joined with the manager's own token not in another cluster; and a
/// cluster's token may not join a name another cluster's node holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_syncs_only_in_the_cluster_its_bootstrap_token_bound_it_to() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(Embedded::open(&dir.path().join("store.redb")).unwrap());
    let s = Served::with_auth(
        store,
        Liveness::default(),
        Auth::new(TOKEN, Some("sync-bootstrap".into()), false),
    )
    .await;
    let mut c = s.client().await;
    let spec = pb::ClusterSpec { name: "east".into(), kubeconfig: "/dev/null".into() };
    c.create_cluster(as_(spec, TOKEN)).await.unwrap();
    let east = c
        .issue_cluster_token(as_(pb::Name { name: "east".into() }, TOKEN))
        .await
        .unwrap()
        .into_inner()
        .token;
    let join = |name: &str, with: &str| {
        let mut c = c.clone();
        let (name, with) = (name.to_string(), with.to_string());
        async move { c.join_node(as_(pb::Name { name }, &with)).await.map(|r| r.into_inner().token) }
    };
    let b1 = join("b1", &east).await.unwrap();
    let a1 = join("a1", "sync-bootstrap").await.unwrap();
    for cluster in ["", "local"] {
        let e = s.sync_in("b1", "192.0.2.2", cluster, Some(&b1)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("joined with cluster \"east\"'s bootstrap token"), "{e:?}");
    }
    let e = s.sync_in("a1", "192.0.2.1", "east", Some(&a1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let mut b = s.sync_in("b1", "192.0.2.2", "east", Some(&b1)).await.unwrap();
    until(&mut b, "b1's first state", |_| true).await;
    let mut a = s.sync_in("a1", "192.0.2.1", "", Some(&a1)).await.unwrap();
    until(&mut a, "a1's first state", |_| true).await;
    // The admin registers a3 in the own cluster; east's token may not take its name.
    s.client()
        .await
        .register_node(as_(
            pb::Node { name: "a3".into(), vtep: "192.0.2.3".into(), ..Default::default() },
            TOKEN,
        ))
        .await
        .unwrap();
    let e = join("a3", &east).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    drop((a, b));
    s.stop().await;
}

/// A network with a node gateway: each node with a port on it gets a host port (an address
/// from the network, held by no pod) and the gateway addresses in its state; the other node
/// sees that host port as an endpoint behind its VTEP. The host port is the manager's: the
/// API neither makes nor deletes one; it goes when the node's last port does (the sweep) or
/// with the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_gateway_networks_give_each_node_a_host_port() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let m = Manager::new(Arc::new(Embedded::open(&path).unwrap()), Config::default()).unwrap();
        let ipv4 = Some(SubnetSpec {
            cidr: "10.42.0.0/24".into(),
            gateway: Some("10.42.0.1".parse().unwrap()),
            pools: vec![],
        });
        m.create_network(NetworkSpec {
            node_gateway: true,
            masquerade: true,
            ipv4,
            ..network("red", "")
        })
        .unwrap();
        let (a, _) = m.create_port(port("a", "n1")).unwrap();
        assert_eq!(a.addresses[0].address.to_string(), "10.42.0.2", "the pod first");
        m.create_port(port("b", "n2")).unwrap();
        m.create_port(port("c", "n2")).unwrap();
        let hosts: Vec<_> = m
            .list_ports(&Default::default())
            .unwrap()
            .into_iter()
            .filter(|p| knitter_manager::manager::host_port_node(p).is_some())
            .collect();
        assert_eq!(hosts.len(), 2, "one per node, not per pod: {hosts:?}");
        let (container, interface) = knitter_api::names::host_port("red", "n1");
        let e = m
            .create_port(PortSpec {
                container: container.clone(),
                interface: interface.clone(),
                ..port("x", "n1")
            })
            .unwrap_err();
        assert!(e.to_string().contains("host ports"), "{e}");
        assert!(
            m.delete_port(&container, &interface).unwrap_err().to_string().contains("host port")
        );
        assert_eq!(m.sweep_host_ports().unwrap(), (0, 0), "nothing to mend");
    }
    let served = Served::start(&path, Liveness::default()).await;
    let mut n1 = served.sync("n1", "192.0.2.1", Some(TOKEN)).await.unwrap();
    let n2 = served.sync("n2", "192.0.2.2", Some(TOKEN)).await.unwrap();
    let d = until(&mut n1, "n1's state with n2's endpoints", |d| {
        d.networks.first().is_some_and(|n| n.endpoints.len() == 5)
    })
    .await;
    let red = &d.networks[0];
    assert_eq!(red.gateways, ["10.42.0.1"]);
    let host = red.host.as_ref().expect("n1's host port");
    assert_eq!(
        (host.ifname.as_str(), host.masquerade),
        (knitter_api::names::host_port("red", "n1").1.as_str(), true)
    );
    assert_eq!(host.addresses.len(), 1);
    assert!(
        host.addresses[0].starts_with("10.42.0.") && host.addresses[0].ends_with("/24"),
        "{host:?}"
    );
    let n2_host = red.endpoints.iter().filter(|e| e.node == "n2").count();
    assert_eq!(n2_host, 3, "n2's two pods and its host port, behind its VTEP");
    drop((n1, n2));
    served.stop().await;

    let m = Manager::new(Arc::new(open_when_free(&path).await), Config::default()).unwrap();
    m.delete_port("b", "eth0").unwrap();
    assert_eq!(m.sweep_host_ports().unwrap(), (0, 0), "n2 still has c");
    m.delete_port("c", "eth0").unwrap();
    assert_eq!(m.sweep_host_ports().unwrap(), (0, 1), "n2's last port gone: its host port goes");
    // A host port lost (a crash between a pod's port and its node's) is made again.
    let (container, interface) = knitter_api::names::host_port("red", "n1");
    let lost = m.get_port(&container, &interface).unwrap();
    m.create_port(port("d", "n1")).unwrap();
    assert_eq!(
        m.get_port(&container, &interface).unwrap(),
        lost,
        "the node keeps its host port and its address"
    );
    m.delete_port("a", "eth0").unwrap();
    m.delete_port("d", "eth0").unwrap();
    m.delete_network("red").unwrap().expect("the network goes, and n1's host port with it");
    assert!(m.list_ports(&Default::default()).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_their_planes_peers_leave_after_the_grace_and_a_restart_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let live = Liveness { lease_secs: 1, grace_secs: 1 };
    {
        let m = Manager::new(Arc::new(Embedded::open(&path).unwrap()), Config::default()).unwrap();
        let pod_policer =
            Some(knitter_manager::network::PodPolicer { pps: 2000, ..Default::default() });
        m.create_network(NetworkSpec { pod_policer, ..network("red", "10.40.0.0/24") }).unwrap();
        m.create_network(NetworkSpec { segment: Some(7002), ..network("idle", "10.41.0.0/24") })
            .unwrap();
        m.create_port(port("a", "n1")).unwrap();
        m.create_port(port("b", "n2")).unwrap();
    }
    let served = Served::start(&path, live).await;
    assert_eq!(
        served.sync("n1", "192.0.2.1", None).await.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );

    let mut n1 = served.sync("n1", "192.0.2.1", Some(TOKEN)).await.unwrap();
    let mut n2 = served.sync("n2", "192.0.2.2", Some(TOKEN)).await.unwrap();
    let d = until(&mut n1, "n2 in n1's flood list", |d| d.peers == ["192.0.2.2"]).await;
    assert_eq!(d.networks.len(), 1, "only networks with pods on the node: {d:?}");
    let red = &d.networks[0];
    assert_eq!(
        (red.name.as_str(), red.kind.as_str(), red.segment, red.mtu),
        ("red", "vxlan", 7001, 1450)
    );
    assert_eq!(red.flood, ["192.0.2.2"]);
    assert_eq!(
        (red.dscp, red.pcp, red.priority),
        (Some(34), Some(4), false),
        "a media network's default marking (AF41, priority 4), no egress priority"
    );
    assert_eq!(
        red.pod_policer.as_ref().map(|p| (p.pps, p.bps)),
        Some((2000, 0)),
        "the network's per-pod rate"
    );
    let mut eps: Vec<_> = red
        .endpoints
        .iter()
        .map(|e| (e.node.as_str(), e.vtep.as_str(), e.ips.clone(), e.mac.as_str()))
        .collect();
    eps.sort();
    assert_eq!(
        eps,
        [
            ("n1", "192.0.2.1", vec!["10.40.0.1".to_string()], "0a:58:0a:28:00:01"),
            ("n2", "192.0.2.2", vec!["10.40.0.2".to_string()], "0a:58:0a:28:00:02")
        ]
    );
    until(&mut n2, "n1 in n2's flood list", |d| d.peers == ["192.0.2.1"]).await;

    // n2 goes quiet: it stays in n1's flood list through its lease and the grace.
    drop(n2);
    let quiet = Instant::now();
    let d = until(&mut n1, "n2 out of n1's flood list", |d| d.peers.is_empty()).await;
    assert!(
        quiet.elapsed() >= Duration::from_secs(2) - Duration::from_millis(300),
        "left after {:?}",
        quiet.elapsed()
    );
    assert!(d.networks[0].flood.is_empty() && d.networks[0].endpoints.len() == 1, "{d:?}");
    let mut req = tonic::Request::new(pb::ListRequest::default());
    req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let nodes = served.client().await.list_nodes(req).await.unwrap().into_inner().items;
    let states: Vec<_> = nodes.iter().map(|n| (n.name.as_str(), n.state.as_str())).collect();
    assert_eq!(states, [("n1", "alive"), ("n2", "gone")]);

    // The manager restarts on the same store; n1 reconnects and gets its whole state again.
    drop(n1);
    served.stop().await;
    let served = Served::start(&path, live).await;
    let mut n1 = served.sync("n1", "192.0.2.1", Some(TOKEN)).await.unwrap();
    let d = until(&mut n1, "n1's state after the restart", |d| !d.networks.is_empty()).await;
    assert_eq!(d.networks[0].name, "red");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_two_replicas_on_etcd_stream_each_others_changes_through_a_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = tokio::task::block_in_place(|| {
        common::EtcdServer::start(
            &dir.path().join("etcd"),
            common::free_port(),
            common::free_port(),
        )
    }) else {
        return;
    };
    let store =
        |p: &str| -> Arc<dyn Store> { Arc::new(tokio::task::block_in_place(|| etcd.store_at(p))) };
    let live = Liveness { lease_secs: 5, grace_secs: 5 };
    let a = Served::on(store("/sync"), live).await;
    let b = Served::on(store("/sync"), live).await;
    let created = |c: &mut pb::manager_client::ManagerClient<tonic::transport::Channel>, msg| {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let mut c = c.clone();
        async move { c.create_port(r).await.unwrap() }
    };
    let mut ca = a.client().await;
    let mut req = tonic::Request::new(pb::Network {
        name: "red".into(),
        tenant: "admin".into(),
        kind: "vxlan".into(),
        segment: Some(7001),
        ipv4: Some(pb::SubnetSpec { cidr: "10.40.0.0/24".into(), ..Default::default() }),
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    ca.create_network(req).await.unwrap();
    let port = |c: &str, node: &str| pb::PortSpec {
        network: "red".into(),
        container: c.into(),
        interface: "eth0".into(),
        node: node.into(),
        ..Default::default()
    };
    created(&mut ca, port("a", "n1")).await;
    created(&mut ca, port("b", "n2")).await;

    // n1 on replica a, n2 on replica b: each sees the other.
    let mut n1 = a.sync("n1", "192.0.2.1", Some(TOKEN)).await.unwrap();
    let mut n2 = b.sync("n2", "192.0.2.2", Some(TOKEN)).await.unwrap();
    until(&mut n1, "n2 as n1's peer", |d| d.peers == ["192.0.2.2"]).await;
    until(&mut n2, "n1 as n2's peer", |d| d.peers == ["192.0.2.1"]).await;

    // etcd's history is compacted under both replicas' watches; a port made through a
    // reaches n2's stream on b.
    let compacted = tokio::task::block_in_place(|| etcd.store_at("/sync").compact()).unwrap();
    assert!(compacted > 0);
    created(&mut ca, port("c", "n1")).await;
    let d = until(&mut n2, "the new port on n2's stream (replica b)", |d| {
        d.networks.first().is_some_and(|n| n.endpoints.len() == 3)
    })
    .await;
    assert_eq!(d.networks[0].flood, ["192.0.2.1"]);

    // Replica a goes; n1 reconnects to b and gets its whole state.
    drop(n1);
    a.stop().await;
    let mut n1 = b.sync("n1", "192.0.2.1", Some(TOKEN)).await.unwrap();
    let d = until(&mut n1, "n1's state from replica b", |d| {
        d.networks.first().is_some_and(|n| n.endpoints.len() == 3)
    })
    .await;
    assert_eq!(d.peers, ["192.0.2.2"]);
    drop((n1, n2));
    b.stop().await;
}

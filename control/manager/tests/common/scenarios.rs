//! Manager scenarios every store must pass (run on the embedded store by tests/manager.rs,
//! on a real etcd by tests/etcd.rs): every object's create / get / list / delete,
//! idempotent creates, refusals with their reasons, quotas, IP groups giving re-created
//! pods their addresses back, creates cut off by a kill never served and swept.

use knitter_manager::manager::objects::{IpGroupSpec, Node, PortSpec, Quota, TenantSpec};
use knitter_manager::manager::{Filter, Manager, ManagerError};
use knitter_manager::network::{Kind, NetworkSpec, Plane, PodPolicer, SubnetSpec};
use knitter_manager::store::{Claim, First, Op, OwnerKey, Store, StoreError, Versioned, With};
use std::net::IpAddr;

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn net(name: &str, tenant: &str, cidr: &str) -> NetworkSpec {
    NetworkSpec {
        name: name.into(),
        tenant: tenant.into(),
        kind: Kind::Vxlan,
        plane: Plane::Media,
        segment: None,
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

pub fn port(network: &str, container: &str, pod: &str) -> PortSpec {
    PortSpec {
        network: network.into(),
        container: container.into(),
        interface: "eth1".into(),
        pod: pod.into(),
        node: "n1".into(),
        ips: vec![],
        ip_group: None,
        requested_mac: None,
        pod_uid: String::new(),
        device_info: None,
    }
}

pub fn reason<T: std::fmt::Debug>(r: Result<T, ManagerError>) -> String {
    r.unwrap_err().to_string()
}

pub fn objects(m: &Manager) {
    assert_eq!(m.tenants().unwrap().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["admin"]);
    // Its pods run in namespace "ns" (see `tenancy`).
    let (t, new) = m
        .create_tenant_with(TenantSpec {
            name: "acme".into(),
            quota: None,
            namespaces: vec!["ns".into()],
        })
        .unwrap();
    assert!(new && t.quota == Quota { networks: 10 } && t.namespaces == ["ns"]);
    assert!(!m.create_tenant("acme", None).unwrap().1, "a repeated create is a no-op");

    let dual = NetworkSpec {
        ipv4: Some(SubnetSpec {
            cidr: "10.1.0.0/24".into(),
            gateway: Some(ip("10.1.0.1")),
            pools: vec![],
        }),
        ipv6: Some(SubnetSpec {
            cidr: "fd00:1::/64".into(),
            gateway: Some(ip("fd00:1::1")),
            pools: vec![],
        }),
        ..net("media", "acme", "")
    };
    let (n, new) = m.create_network(dual.clone()).unwrap();
    assert!(new && n.segment == Some(5000) && n.mtu == Some(1450));
    assert_eq!(m.create_network(dual.clone()).unwrap(), (n.clone(), false), "idempotent");
    assert!(
        reason(m.create_network(NetworkSpec { mtu: Some(1400), ..dual }))
            .contains("exists with another definition")
    );

    let (p, new) = m.create_port(port("media", "c1", "ns/a")).unwrap();
    assert!(new);
    let got: Vec<_> = p.addresses.iter().map(|a| (a.address, a.prefix, a.gateway)).collect();
    assert_eq!(
        got,
        [(ip("10.1.0.2"), 24, Some(ip("10.1.0.1"))), (ip("fd00:1::2"), 64, Some(ip("fd00:1::1")))]
    );
    assert_eq!(p.mac, "0a:58:0a:01:00:02");
    assert_eq!((p.segment, p.mtu, p.tenant.as_str()), (5000, 1450, "acme"));
    assert_eq!(
        m.create_port(port("media", "c1", "ns/a")).unwrap(),
        (p.clone(), false),
        "a retried ADD gets the same port"
    );
    assert!(
        reason(m.create_port(port("other", "c1", "ns/a"))).contains("network \"other\" not found")
    );

    let mut fixed = port("media", "c2", "ns/b");
    fixed.ips = vec![ip("10.1.0.77")];
    let p2 = m.create_port(fixed.clone()).unwrap().0;
    assert_eq!(p2.addresses[0].address, ip("10.1.0.77"));
    fixed.container = "c3".into();
    assert_eq!(reason(m.create_port(fixed.clone())), "10.1.0.77 is already allocated to c2/eth1");
    fixed.ips = vec![ip("10.2.0.5")];
    assert_eq!(
        reason(m.create_port(fixed.clone())),
        "address 10.2.0.5 is outside subnet 10.1.0.0/24"
    );
    fixed.ips = vec![ip("10.1.0.1")];
    assert_eq!(
        reason(m.create_port(fixed.clone())),
        "10.1.0.1 cannot be allocated: it is the subnet's gateway"
    );
    assert!(m.get_port("c3", "eth1").is_err(), "a refused create leaves no port behind");

    assert_eq!(
        m.list_ports(&Filter { network: "media".into(), ..Filter::default() }).unwrap().len(),
        2
    );
    assert_eq!(m.list_ports(&Filter { pod: "ns/b".into(), ..Filter::default() }).unwrap().len(), 1);
    assert!(reason(m.delete_network("media")).contains("still has 2 ports"));
    assert!(reason(m.delete_tenant("acme")).contains("still owns networks media"));

    assert_eq!(m.delete_port("c1", "eth1").unwrap().unwrap().addresses, p.addresses);
    assert!(m.delete_port("c1", "eth1").unwrap().is_none(), "a repeated DEL is fine");
    m.delete_port("c2", "eth1").unwrap();
    assert!(m.delete_network("media").unwrap().is_some());
    assert!(m.delete_tenant("acme").unwrap().is_some());
    assert!(m.store().allocations("media.v4").unwrap().is_empty(), "every address went back");
}

pub fn refusals(m: &Manager) {
    m.create_network(NetworkSpec { segment: Some(6000), ..net("a", "admin", "10.0.0.0/24") })
        .unwrap();
    assert_eq!(
        reason(m.create_network(net("b", "admin", "10.0.0.0/25"))),
        "network \"b\": subnet 10.0.0.0/25 overlaps 10.0.0.0/24 of network \"a\""
    );
    assert_eq!(
        reason(m.create_network(NetworkSpec {
            segment: Some(6000),
            ..net("b", "admin", "10.9.0.0/24")
        })),
        "network \"b\": VNI 6000 is already used by network \"a\""
    );
    assert!(
        reason(
            m.create_network(NetworkSpec { mtu: Some(1500), ..net("b", "admin", "10.9.0.0/24") })
        )
        .contains("MTU 1500 is larger than the underlay allows (1450")
    );
    assert_eq!(
        reason(m.create_network(net("b", "nobody", "10.9.0.0/24"))),
        "tenant \"nobody\" not found"
    );
    assert!(matches!(m.create_network(net("b", "admin", "10.9.0.0/24")), Ok((_, true))));

    // Nodes: the smallest underlay MTU bounds new networks; a node that cannot carry an
    // existing network is refused.
    let node = |name: &str, vtep: &str, mtu| Node {
        name: name.into(),
        vtep: ip(vtep),
        underlay_mtu: mtu,
        capabilities: vec![],
        registered: 0,
        last_seen: 0,
        state: String::new(),
        cluster: String::new(),
    };
    assert!(
        reason(m.register_node(node("n1", "192.168.0.1", 1400)))
            .contains("underlay MTU 1400 cannot carry network \"a\" (MTU 1450 + 50 bytes")
    );
    m.register_node(node("n1", "192.168.0.1", 9000)).unwrap();
    m.register_node(node("n2", "192.168.0.2", 1600)).unwrap();
    assert_eq!(
        m.create_network(net("c", "admin", "10.3.0.0/24")).unwrap().0.mtu,
        Some(1550),
        "the smallest underlay (1600) minus VXLAN"
    );
    assert_eq!(
        reason(m.register_node(node("n3", "192.168.0.2", 9000))),
        "VTEP address 192.168.0.2 is node \"n2\"'s"
    );
    assert_eq!(m.list_nodes().unwrap().len(), 2);
    assert!(m.delete_node("n2").unwrap().is_some());

    // Quotas.
    m.create_tenant("small", Some(Quota { networks: 1 })).unwrap();
    m.create_network(net("s1", "small", "10.50.0.0/24")).unwrap();
    assert_eq!(
        reason(m.create_network(net("s2", "small", "10.51.0.0/24"))),
        "tenant \"small\" has 1 networks, its quota is 1"
    );
    m.set_quota("small", Quota { networks: 2 }).unwrap();
    m.create_network(net("s2", "small", "10.51.0.0/24")).unwrap();
    assert!(
        reason(m.create_tenant("small", Some(Quota { networks: 5 })))
            .contains("exists with another quota")
    );

    // Names and shapes.
    assert!(reason(m.create_tenant("a/b", None)).contains("without '/'"));
    let mut p = port("a", "c1", "ns/p");
    p.interface = "an-interface-name-too-long".into();
    assert!(reason(m.create_port(p)).contains("1-15 characters"));
    let mut p = port("a", "c1", "ns/p");
    p.ips = vec![ip("fd00::5")];
    assert_eq!(reason(m.create_port(p)), "network \"a\" has no IPv6 subnet");
    assert!(reason(m.delete_tenant("admin")).contains("cannot be deleted"));

    // Exhaustion is a clear error, and leaves nothing behind.
    m.create_network(NetworkSpec {
        ipv4: Some(SubnetSpec { cidr: "10.60.0.0/30".into(), gateway: None, pools: vec![] }),
        ..net("tiny", "admin", "")
    })
    .unwrap();
    m.create_port(port("tiny", "t1", "ns/t1")).unwrap();
    m.create_port(port("tiny", "t2", "ns/t2")).unwrap();
    assert_eq!(
        reason(m.create_port(port("tiny", "t3", "ns/t3"))),
        "subnet 10.60.0.0/30 has no free address left"
    );
    assert!(m.get_port("t3", "eth1").is_err());
}

/// A port asking for its own MAC (a VNF's fixed MAC): recorded as the port's MAC (what the
/// manager pushes to other nodes), one port's per network, held until the port goes; MACs
/// that cannot be a port's are refused with the reason.
pub fn requested_mac(m: &Manager) {
    m.create_network(net("vnf", "admin", "10.8.0.0/24")).unwrap();
    m.create_network(net("oam", "admin", "10.9.0.0/24")).unwrap();
    let with_mac = |net: &str, c: &str, mac: &str| PortSpec {
        requested_mac: Some(mac.into()),
        ..port(net, c, "ns/vnf")
    };
    let (p, created) = m.create_port(with_mac("vnf", "v1", "02:00:00:00:72:50")).unwrap();
    assert!(created);
    assert_eq!(p.mac, "02:00:00:00:72:50", "the MAC in force is the one asked for");
    assert_eq!(m.get_port("v1", "eth1").unwrap().mac, "02:00:00:00:72:50");
    assert_eq!(
        m.create_port(with_mac("vnf", "v1", "02:00:00:00:72:50")).unwrap(),
        (p.clone(), false),
        "a retry: the same port"
    );
    let e = reason(m.create_port(with_mac("vnf", "v2", "02:00:00:00:72:50")));
    assert!(
        e.contains("MAC 02:00:00:00:72:50 is already port v1/eth1's in network \"vnf\""),
        "{e}"
    );
    assert!(m.get_port("v2", "eth1").is_err(), "a refused port leaves nothing");
    assert_eq!(
        m.create_port(with_mac("oam", "v2", "02:00:00:00:72:50")).unwrap().0.mac,
        "02:00:00:00:72:50",
        "another network"
    );
    // Upper case is the same MAC.
    assert!(
        reason(m.create_port(with_mac("vnf", "v3", "02:00:00:00:72:50".to_uppercase().as_str())))
            .contains("already port v1/eth1's")
    );
    for (bad, why) in [
        ("03:00:00:00:00:01", "group"),
        ("00:00:00:00:00:00", "all zeros"),
        ("0a:58:0a:08:00:05", "derived"),
        ("02:00:00:00:72", "six hexadecimal bytes"),
        ("02:00:00:00:72:5g", "six hexadecimal bytes"),
    ] {
        let e = reason(m.create_port(with_mac("vnf", "v4", bad)));
        assert!(e.contains(why), "{bad}: {e}");
    }
    // Deleted, the MAC is free again.
    m.delete_port("v1", "eth1").unwrap();
    assert_eq!(
        m.create_port(with_mac("vnf", "v5", "02:00:00:00:72:50")).unwrap().0.mac,
        "02:00:00:00:72:50"
    );
    // Without a request: derived from the address.
    assert!(m.create_port(port("vnf", "v6", "ns/p")).unwrap().0.mac.starts_with("0a:58:0a:08:00:"));
}

/// A network's pod policer: recorded with the network, copied onto each port created in it
/// (what the node polices the port with), refused without a rate.
pub fn pod_policer(m: &Manager) {
    let rate = PodPolicer { pps: 50_000, bps: 200_000_000, ..Default::default() };
    let policed =
        NetworkSpec { pod_policer: Some(rate), ..net("signalling", "admin", "10.7.0.0/24") };
    let e = reason(m.create_network(NetworkSpec {
        pod_policer: Some(PodPolicer { burst_packets: 10, ..Default::default() }),
        ..policed.clone()
    }));
    assert_eq!(e, "network \"signalling\": a pod policer needs a rate: pps or bps");
    let (n, _) = m.create_network(policed).unwrap();
    assert_eq!(n.pod_policer, Some(rate));
    assert_eq!(m.create_port(port("signalling", "s1", "ns/s")).unwrap().0.policer, Some(rate));
    assert_eq!(m.get_port("s1", "eth1").unwrap().policer, Some(rate));
    m.create_network(net("plain", "admin", "10.6.0.0/24")).unwrap();
    assert_eq!(m.create_port(port("plain", "s2", "ns/s")).unwrap().0.policer, None);
}

pub fn ip_group(m: &Manager) {
    m.create_network(net("media", "admin", "10.7.0.0/24")).unwrap();
    let members = vec![ip("10.7.0.10"), ip("10.7.0.11"), ip("10.7.0.12")];
    let spec = IpGroupSpec {
        name: "sbc".into(),
        network: "media".into(),
        members: members.clone(),
        size: None,
        grace_secs: Some(600),
    };
    assert!(m.create_group(spec.clone()).unwrap().1);
    assert!(!m.create_group(spec.clone()).unwrap().1, "idempotent");

    // Plain allocations never take a member.
    for i in 0..20 {
        let a = m.create_port(port("media", &format!("plain{i}"), "ns/plain")).unwrap().0.addresses
            [0]
        .address;
        assert!(!members.contains(&a), "{a} is a group member");
    }
    let pods = ["ns/sbc-0", "ns/sbc-1", "ns/sbc-2"];
    let in_group =
        |c: &str, pod: &str| PortSpec { ip_group: Some("sbc".into()), ..port("media", c, pod) };
    let first: Vec<IpAddr> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| m.create_port(in_group(&format!("a{i}"), p)).unwrap().0.addresses[0].address)
        .collect();
    assert_eq!(first, members);
    assert!(
        reason(m.create_port(in_group("x", "ns/extra"))).contains("IP group \"sbc\""),
        "a full group says so"
    );
    assert!(reason(m.delete_group("media", "sbc")).contains("still has 3 members in use"));

    // All three pods go away, then come back in reverse order with new containers.
    for i in 0..3 {
        m.delete_port(&format!("a{i}"), "eth1").unwrap();
    }
    for (i, p) in pods.iter().enumerate().rev() {
        let again = m.create_port(in_group(&format!("b{i}"), p)).unwrap().0.addresses[0].address;
        assert_eq!(again, first[i], "{p} gets its own address back");
    }
    for i in 0..3 {
        m.delete_port(&format!("b{i}"), "eth1").unwrap();
    }
    assert!(m.delete_group("media", "sbc").unwrap().is_some());
    assert!(
        m.store().allocations("media.v4").unwrap().iter().all(|(a, _)| !members.contains(a)),
        "members went back to the network"
    );

    // Count mode, and members that are already taken.
    let (g, _) = m
        .create_group(IpGroupSpec {
            name: "n3".into(),
            network: "media".into(),
            members: vec![],
            size: Some(3),
            grace_secs: Some(60),
        })
        .unwrap();
    assert_eq!(g.members.len(), 3);
    let taken = m.get_port("plain0", "eth1").unwrap().addresses[0].address;
    let bad = IpGroupSpec {
        name: "bad".into(),
        network: "media".into(),
        members: vec![ip("10.7.0.200"), taken],
        size: None,
        grace_secs: Some(60),
    };
    assert_eq!(reason(m.create_group(bad)), format!("{taken} is already allocated to plain0/eth1"));
    assert!(
        m.store().allocations("media.v4").unwrap().iter().all(|(a, _)| *a != ip("10.7.0.200")),
        "a refused group gives back what it took"
    );
}

/// A store that dies after a given number of calls, as a manager killed mid-request leaves
/// it: what was written stays, nothing after it happens (not even the request's own
/// clean-up).
pub struct Dying {
    inner: std::sync::Arc<dyn Store>,
    calls_left: std::sync::atomic::AtomicI64,
}

impl Dying {
    pub fn new(inner: std::sync::Arc<dyn Store>) -> Dying {
        Dying { inner, calls_left: std::sync::atomic::AtomicI64::new(i64::MAX) }
    }

    /// From now on, `calls` more calls succeed.
    pub fn die_after(&self, calls: i64) {
        self.calls_left.store(calls, std::sync::atomic::Ordering::SeqCst);
    }

    fn call(&self) -> Result<(), StoreError> {
        if self.calls_left.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) <= 0 {
            return Err(StoreError("the manager was killed".into()));
        }
        Ok(())
    }
}

impl Store for Dying {
    fn claim(&self, network: &str, ip: IpAddr, owner: &OwnerKey) -> Result<Claim, StoreError> {
        self.call()?;
        self.inner.claim(network, ip, owner)
    }
    fn claim_first(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
    ) -> Result<Option<IpAddr>, StoreError> {
        self.call()?;
        self.inner.claim_first(network, candidates, owner)
    }
    fn claim_near(
        &self,
        network: &str,
        candidates: &mut dyn Iterator<Item = IpAddr>,
        owner: &OwnerKey,
        with: With,
    ) -> Result<First, StoreError> {
        self.call()?;
        self.inner.claim_near(network, candidates, owner, with)
    }
    fn owned(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        self.call()?;
        self.inner.owned(network, owner)
    }
    fn release(&self, network: &str, owner: &OwnerKey) -> Result<Option<IpAddr>, StoreError> {
        self.call()?;
        self.inner.release(network, owner)
    }
    fn remember(&self, network: &str, ip: IpAddr, pod: &str, until: u64) -> Result<(), StoreError> {
        self.call()?;
        self.inner.remember(network, ip, pod, until)
    }
    fn remembered(&self, network: &str, ip: IpAddr) -> Result<Option<(String, u64)>, StoreError> {
        self.call()?;
        self.inner.remembered(network, ip)
    }
    fn allocations(&self, network: &str) -> Result<Vec<(IpAddr, OwnerKey)>, StoreError> {
        self.call()?;
        self.inner.allocations(network)
    }
    fn revision(&self) -> Result<u64, StoreError> {
        self.call()?;
        self.inner.revision()
    }
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        self.call()?;
        self.inner.get(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        self.call()?;
        self.inner.list(prefix)
    }
    fn commit_at(&self, ops: &[Op]) -> Result<Option<u64>, StoreError> {
        self.call()?;
        self.inner.commit_at(ops)
    }
    fn put_expiring(&self, key: &str, value: &str, ttl_secs: u64) -> Result<(), StoreError> {
        self.call()?;
        self.inner.put_expiring(key, value, ttl_secs)
    }
}

/// Port creates cut off at every point (a manager killed after 1, 2, … store calls, its
/// store left as it was): a port with one dynamic address is written whole with its claim,
/// so a cut leaves nothing at all; a port made in three steps (here: a fixed address)
/// leaves a half-made record that is never served — not found, not listed — which a retry
/// finishes and a sweep removes with what it claimed. Every address held afterwards is a
/// whole port's. `store` is the real store; the managers that die run on it through [`Dying`].
pub fn cut_off_creates(store: std::sync::Arc<dyn Store>) {
    let m = Manager::new(store.clone(), Default::default()).unwrap();
    m.create_tenant_with(TenantSpec {
        name: "cutco".into(),
        quota: None,
        namespaces: vec!["ns".into()],
    })
    .unwrap();
    m.create_network(net("cut", "cutco", "10.77.0.0/24")).unwrap();
    // Cuts every create of `spec(n)` after 1, 2, … calls until one goes through: the cut ones.
    let cut_all = |tag: &str, spec: &dyn Fn(usize, &str) -> PortSpec| -> Vec<(String, usize)> {
        let mut cut = Vec::new();
        for calls in 1.. {
            let dying = std::sync::Arc::new(Dying::new(store.clone()));
            let killed = Manager::new(dying.clone(), Default::default()).unwrap();
            let container = format!("{tag}{calls}");
            dying.die_after(calls as i64);
            if killed.create_port(spec(calls, &container)).is_ok() {
                break;
            }
            assert!(calls < 100, "a create needs fewer than 100 store calls");
            assert!(
                matches!(m.get_port(&container, "eth1"), Err(ManagerError::NotFound { .. })),
                "cut off after {calls} calls: a half-made port is not found"
            );
            assert!(
                m.list_ports(&Filter::default())
                    .unwrap()
                    .iter()
                    .all(|p| p.spec.container != container && !p.addresses.is_empty()),
                "nor listed"
            );
            cut.push((container, calls));
        }
        cut
    };
    let whole_or_nothing = cut_all("cut", &|_, c| port("cut", c, "ns/cut"));
    assert!(
        whole_or_nothing.len() >= 2,
        "creates were cut off at several points: {whole_or_nothing:?}"
    );
    assert_eq!(
        m.sweep_placeholders(0).unwrap(),
        0,
        "a port with one dynamic address is never half-made"
    );
    let fixed = |n: usize, c: &str| PortSpec {
        ips: vec![format!("10.77.0.{}", 100 + n).parse().unwrap()],
        ..port("cut", c, "ns/cut")
    };
    let cut = cut_all("fixed", &fixed);
    assert!(cut.len() >= 2, "creates were cut off at several points: {cut:?}");
    // A retry finishes the first one; a sweep removes the others and what they claimed.
    let retried = m.create_port(fixed(cut[0].1, &cut[0].0)).unwrap().0;
    assert_eq!(retried.addresses.len(), 1);
    assert_eq!(m.sweep_placeholders(3600).unwrap(), 0, "none is old enough yet");
    let swept = m.sweep_placeholders(0).unwrap();
    assert!(swept >= 1 && swept < cut.len(), "{swept} swept of {}", cut.len());
    let ports = m.list_ports(&Filter { network: "cut".into(), ..Filter::default() }).unwrap();
    let held = store.allocations("cut.v4").unwrap();
    let owners: Vec<String> = held.iter().map(|(_, o)| format!("{o:?}")).collect();
    assert_eq!(
        held.len(),
        ports.len(),
        "every address held is a whole port's: {owners:?} vs {ports:?}"
    );
    for p in &ports {
        assert!(held.iter().any(|(ip, _)| *ip == p.addresses[0].address), "{p:?}");
    }
    // The network can go once its ports do: nothing half-made is left behind.
    for p in ports {
        m.delete_port(&p.spec.container, &p.spec.interface).unwrap();
    }
    m.delete_network("cut").unwrap();
}

/// Who may attach to which network: a pod's namespace belongs to the tenant its label names
/// (recorded by the Kubernetes controller), else to the tenant that lists it, else to admin
/// — never by its name; a port on another tenant's network is refused, naming the
/// namespace, the tenant and the network, unless the network is shared.
pub fn tenancy(m: &Manager) {
    m.create_tenant_with(TenantSpec {
        name: "red".into(),
        quota: None,
        namespaces: vec!["red-prod".into()],
    })
    .unwrap();
    m.create_tenant("blue", None).unwrap();
    m.create_network(net("red-net", "red", "10.81.0.0/24")).unwrap();
    m.create_network(NetworkSpec { shared: true, ..net("blue-shared", "blue", "10.82.0.0/24") })
        .unwrap();
    m.create_network(net("admin-net", "admin", "10.83.0.0/24")).unwrap();
    m.create_port(port("red-net", "c1", "red-prod/p1")).unwrap();
    let e = reason(m.create_port(port("red-net", "c2", "red/p2")));
    assert_eq!(
        e,
        "namespace \"red\" belongs to tenant \"admin\"; network \"red-net\" is tenant \"red\"'s and not shared",
        "a namespace merely named red"
    );
    assert!(m.get_port("c2", "eth1").is_err(), "nothing left behind");
    m.create_port(port("admin-net", "c2", "red/p2")).unwrap();
    m.create_port(port("blue-shared", "c3", "red-prod/p3")).unwrap();
    // On another tenant's shared network a pod takes what it is given: no fixed address, no
    // MAC of its choice (the owner's pods may).
    let fixed = PortSpec {
        ips: vec!["10.82.0.9".parse().unwrap()],
        ..port("blue-shared", "c7", "red-prod/p7")
    };
    assert!(
        reason(m.create_port(fixed.clone())).contains("may not choose its addresses"),
        "another tenant's fixed address"
    );
    let mac = PortSpec {
        requested_mac: Some("02:00:00:00:82:09".into()),
        ..port("blue-shared", "c7", "red-prod/p7")
    };
    assert!(reason(m.create_port(mac)).contains("may not choose its MAC"), "another tenant's MAC");
    assert!(m.get_port("c7", "eth1").is_err(), "nothing left behind");
    m.set_tenant_namespaces("blue", vec!["blue-prod".into()]).unwrap();
    m.create_port(PortSpec { pod: "blue-prod/p7".into(), ..fixed }).unwrap();
    m.set_tenant_namespaces("blue", vec![]).unwrap();
    m.create_port(port("red-net", "c4", "")).unwrap(); // an operator's port, no pod
    // A label wins over the listing; relabelled, the namespace follows.
    m.set_labelled_namespaces(&[("red-prod".to_string(), "blue".to_string())].into()).unwrap();
    assert_eq!(m.tenant_of_namespace("red-prod").unwrap(), "blue");
    assert!(
        reason(m.create_port(port("red-net", "c5", "red-prod/p5")))
            .contains("namespace \"red-prod\" belongs to tenant \"blue\"")
    );
    m.set_labelled_namespaces(&Default::default()).unwrap();
    m.create_port(port("red-net", "c5", "red-prod/p5")).unwrap();
    // A namespace belongs to one tenant.
    assert!(
        reason(m.set_tenant_namespaces("blue", vec!["red-prod".into()]))
            .contains("belongs to tenant \"red\" already")
    );
    assert_eq!(
        m.set_tenant_namespaces("blue", vec!["blue-prod".into()]).unwrap().namespaces,
        ["blue-prod"]
    );
    assert!(
        reason(m.create_port(port("red-net", "c6", "blue-prod/p6"))).contains("tenant \"blue\"")
    );
}

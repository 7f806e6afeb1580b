//! The manager's semantics over the embedded store, in process: the scenarios every store
//! must pass (`common/scenarios.rs`), and state surviving a reopen.

mod common;

use common::scenarios::{self, ip, net, port};
use knitter_manager::manager::{Config, Manager};
use knitter_manager::store::embedded::Embedded;
use std::sync::Arc;

fn manager(dir: &tempfile::TempDir) -> Manager {
    let store = Embedded::open(&dir.path().join("store.redb")).unwrap();
    Manager::new(Arc::new(store), Config::default()).unwrap()
}

#[test]
fn objects_are_created_listed_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::objects(&manager(&dir));
}

#[test]
fn bad_requests_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::refusals(&manager(&dir));
}

#[test]
fn a_pod_attaches_only_to_its_tenants_networks_and_shared_ones() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::tenancy(&manager(&dir));
}

#[test]
fn a_requested_mac_is_recorded_and_held_by_one_port() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::requested_mac(&manager(&dir));
}

#[test]
fn a_networks_pod_policer_goes_onto_its_ports() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::pod_policer(&manager(&dir));
}

#[test]
fn an_ip_group_gives_recreated_pods_their_own_addresses() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::ip_group(&manager(&dir));
}

#[test]
fn a_create_cut_off_by_a_kill_is_never_served_and_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    scenarios::cut_off_creates(Arc::new(Embedded::open(&dir.path().join("store.redb")).unwrap()));
}

#[test]
fn state_survives_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let p = {
        let m = manager(&dir);
        m.create_tenant_with(knitter_manager::manager::objects::TenantSpec {
            name: "acme".into(),
            quota: None,
            namespaces: vec!["ns".into()],
        })
        .unwrap();
        m.create_network(net("red", "acme", "10.8.0.0/24")).unwrap();
        m.create_port(port("red", "c1", "ns/a")).unwrap().0
    };
    let m = manager(&dir);
    assert_eq!(m.get_port("c1", "eth1").unwrap(), p);
    assert_eq!(m.get_network("red").unwrap().segment, Some(5000));
    assert_eq!(p.addresses[0].address, ip("10.8.0.1"), "no gateway given: .1 is a host address");
    assert_eq!(
        m.create_port(port("red", "c2", "ns/b")).unwrap().0.addresses[0].address,
        ip("10.8.0.2")
    );
}

/// A store written at format 1 (`tests/fixtures/store-format-1.redb`, made on 2026-11-29 by
/// that day's knitter-manager: tenant red with quota 4 and namespace red-a; network red-net,
/// VXLAN, 10.1.0.0/24 and fd00:1::/64 with gateways and a node gateway; network media, VLAN
/// 100, plane media, a pod policer of 1,000 pps; IP group sbc of two members; ports c1 and
/// c2 (a member of sbc) of pods on node n1, and n1's host port; node n1) is read as it was
/// written, and allocating goes on where it stopped: what a manager of a later version must
/// do with the store of the one before it.
#[test]
fn a_format_1_store_is_read_and_allocation_goes_on_from_it() {
    use knitter_manager::manager::Filter;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/store-format-1.redb"),
        &path,
    )
    .unwrap();
    let m = Manager::new(Arc::new(Embedded::open(&path).unwrap()), Config::default()).unwrap();
    let red = m.tenants().unwrap().into_iter().find(|t| t.name == "red").expect("tenant red");
    assert_eq!((red.quota.networks, red.namespaces.clone()), (4, vec!["red-a".to_string()]));
    let net = json(&m.get_network("red-net").unwrap());
    assert_eq!(
        (
            net["kind"].as_str(),
            net["segment"].as_u64(),
            net["mtu"].as_u64(),
            net["node_gateway"].as_bool()
        ),
        (Some("vxlan"), Some(5000), Some(1450), Some(true)),
        "{net}"
    );
    assert_eq!(
        (net["ipv4"]["gateway"].as_str(), net["ipv6"]["gateway"].as_str()),
        (Some("10.1.0.1"), Some("fd00:1::1"))
    );
    let media = json(&m.get_network("media").unwrap());
    assert_eq!(
        (
            media["kind"].as_str(),
            media["segment"].as_u64(),
            media["plane"].as_str(),
            media["pod_policer"]["pps"].as_u64()
        ),
        (Some("vlan"), Some(100), Some("media"), Some(1000)),
        "{media}"
    );
    let groups = m.list_groups("red-net").unwrap();
    assert_eq!(
        groups.iter().map(|g| (g.name.as_str(), g.members.len(), g.grace_secs)).collect::<Vec<_>>(),
        vec![("sbc", 2, 60)]
    );
    let c1 = m.get_port("c1", "eth0").unwrap();
    let addrs: Vec<String> = c1.addresses.iter().map(|a| a.address.to_string()).collect();
    assert_eq!(
        (addrs, c1.mac.as_str(), c1.segment),
        (vec!["10.1.0.4".to_string(), "fd00:1::2".to_string()], "0a:58:0a:01:00:04", 5000)
    );
    assert!(
        groups[0].members.contains(&m.get_port("c2", "eth0").unwrap().addresses[0].address),
        "c2 holds a member of sbc"
    );
    assert_eq!(
        m.list_ports(&Filter { node: "n1".into(), ..Filter::default() }).unwrap().len(),
        3,
        "c1, c2 and n1's host port"
    );
    assert_eq!(
        m.list_nodes()
            .unwrap()
            .iter()
            .map(|n| (n.name.as_str(), n.vtep.to_string()))
            .collect::<Vec<_>>(),
        vec![("n1", "192.0.2.1".to_string())]
    );
    // Allocation goes on: a new port gets addresses nobody holds.
    let (c3, created) = m.create_port(port("red-net", "c3", "red-a/p3")).unwrap();
    assert!(created);
    let held: Vec<_> = m
        .list_ports(&Filter::default())
        .unwrap()
        .into_iter()
        .filter(|p| p.spec.container != "c3")
        .flat_map(|p| p.addresses)
        .map(|a| a.address)
        .collect();
    assert!(
        c3.addresses
            .iter()
            .all(|a| !held.contains(&a.address) && !groups[0].members.contains(&a.address)),
        "{:?} against {held:?}",
        c3.addresses
    );
}

/// A store a newer manager marked with a newer format is refused at start, saying so.
#[test]
fn a_store_of_a_newer_format_is_refused() {
    use knitter_manager::store::{Op, Store};
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Embedded::open(&dir.path().join("store.redb")).unwrap());
    Manager::new(store.clone(), Config::default()).unwrap();
    assert_eq!(
        store.get("meta/format").unwrap().map(|v| v.value),
        Some(knitter_manager::manager::STORE_FORMAT.to_string()),
        "marked at start"
    );
    let v = store.get("meta/format").unwrap().unwrap().version;
    assert!(store.commit(&[Op::replace("meta/format", Some(v), "99")]).unwrap());
    let e = Manager::new(store, Config::default()).err().expect("refused").to_string();
    assert!(e.contains("the store is in format 99, newer than this knitter-manager's (1)"), "{e}");
}

/// A record as JSON, to read its fields by name.
fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

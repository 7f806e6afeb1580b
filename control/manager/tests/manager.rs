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
        m.create_tenant_with(knitter_manager::manager::objects::TenantSpec { name: "acme".into(), quota: None, namespaces: vec!["ns".into()] }).unwrap();
        m.create_network(net("red", "acme", "10.8.0.0/24")).unwrap();
        m.create_port(port("red", "c1", "ns/a")).unwrap().0
    };
    let m = manager(&dir);
    assert_eq!(m.get_port("c1", "eth1").unwrap(), p);
    assert_eq!(m.get_network("red").unwrap().segment, Some(5000));
    assert_eq!(p.addresses[0].address, ip("10.8.0.1"), "no gateway given: .1 is a host address");
    assert_eq!(m.create_port(port("red", "c2", "ns/b")).unwrap().0.addresses[0].address, ip("10.8.0.2"));
}

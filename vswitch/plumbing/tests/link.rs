//! `port::link` against the kernel, in network namespaces the test creates: a veth pair made,
//! one end moved into a "pod" namespace, renamed, given a MAC, an MTU, addresses and a
//! default route, read back; then both ends pinged and deleted.

use std::net::IpAddr;
use plumbing::link::{self, LinkChange};
use vswitch::testkit::netns::{self, Netns};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn a_pod_interface_is_plumbed_and_read_back() {
    let Some(_g) = netns::exclusive() else { return };
    let host = Netns::new("lh").unwrap();
    let pod = Netns::new("lp").unwrap();
    let pod_path = format!("/run/netns/{}", pod.name);
    let host_path = format!("/run/netns/{}", host.name);
    let p = pod_path.clone();
    link::in_netns(&host_path, move || {
        link::add_veth("kn-host0", "kn-tmp0")?;
        let ns = std::fs::File::open(&p)?;
        link::change("kn-tmp0", &LinkChange { netns: Some(&ns), ..Default::default() })?;
        link::change("kn-host0", &LinkChange { mtu: Some(1450), up: true, ..Default::default() })?;
        link::add_address("kn-host0", ip("10.77.0.1"), 24)?;
        assert!(link::link("kn-tmp0")?.is_none(), "the peer left this namespace");
        Ok(())
    })
    .unwrap();
    let mac = [0x0a, 0x58, 10, 77, 0, 2];
    let read = link::in_netns(&pod_path, move || {
        link::change("kn-tmp0", &LinkChange { rename: Some("net1"), mac: Some(mac), mtu: Some(1450), up: true, ..Default::default() })?;
        link::add_address("net1", ip("10.77.0.2"), 24)?;
        link::add_address("net1", ip("fd00:77::2"), 64)?;
        link::add_route("net1", ip("0.0.0.0"), 0, Some(ip("10.77.0.1")))?;
        link::add_route("net1", ip("10.99.0.0"), 16, None)?;
        Ok((link::link("net1")?, link::addresses("net1")?, link::links()?.len()))
    })
    .unwrap();
    let (info, addrs, n) = read;
    let info = info.expect("net1 exists in the pod");
    assert_eq!((info.mac, info.mtu, info.up), (mac, 1450, true));
    assert!(addrs.contains(&(ip("10.77.0.2"), 24)) && addrs.contains(&(ip("fd00:77::2"), 64)), "{addrs:?}");
    assert_eq!(n, 2, "lo and net1");
    let routes = pod.run(&["ip", "route"]).unwrap();
    assert!(routes.contains("default via 10.77.0.1 dev net1") && routes.contains("10.99.0.0/16 dev net1"), "{routes}");
    netns::ping(&pod, "10.77.0.1").unwrap();
    // Errors name what failed.
    let e = link::in_netns(&pod_path, || link::add_address("nope0", ip("10.1.1.1"), 24)).unwrap_err();
    assert!(e.to_string().contains("no link nope0"), "{e}");
    let e = link::in_netns(&pod_path, || link::add_veth("net1", "x0")).unwrap_err();
    assert!(e.to_string().contains("creating veth net1/x0") && e.kind() == std::io::ErrorKind::AlreadyExists, "{e}");
    // Deleting the host end removes the pair.
    assert!(link::in_netns(&host_path, || link::delete("kn-host0")).unwrap());
    assert!(!link::in_netns(&host_path, || link::delete("kn-host0")).unwrap(), "a second delete finds nothing");
    assert!(link::in_netns(&pod_path, || link::link("net1")).unwrap().is_none(), "the pod end went with it");
    // A pair made with its peer already in the pod, named, with its MAC and MTU.
    let p = pod_path.clone();
    link::in_netns(&host_path, move || {
        let ns = std::fs::File::open(&p)?;
        link::add_veth_to("kn-host1", Some(1400), &link::VethPeer { name: "net2", netns: Some(&ns), mac: Some(mac), mtu: Some(1400) })?;
        assert_eq!(link::link("kn-host1")?.map(|l| l.mtu), Some(1400));
        Ok(())
    })
    .unwrap();
    let peer = link::in_netns(&pod_path, || link::link("net2")).unwrap().expect("net2 was made in the pod");
    assert_eq!((peer.mac, peer.mtu), (mac, 1400));
    assert!(link::in_netns(&host_path, || link::delete("kn-host1")).unwrap());
}

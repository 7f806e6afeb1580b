//! `plumbing::link` and `plumbing::sriov` against the kernel, in network namespaces the test creates: a veth pair made,
//! one end moved into a "pod" namespace, renamed, given a MAC, an MTU, addresses and a
//! default route, read back; then both ends pinged and deleted.

use plumbing::link::{self, LinkChange};
use std::net::IpAddr;
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
        link::change(
            "kn-tmp0",
            &LinkChange {
                rename: Some("net1"),
                mac: Some(mac),
                mtu: Some(1450),
                up: true,
                ..Default::default()
            },
        )?;
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
    assert!(
        addrs.contains(&(ip("10.77.0.2"), 24)) && addrs.contains(&(ip("fd00:77::2"), 64)),
        "{addrs:?}"
    );
    assert_eq!(n, 2, "lo and net1");
    let routes = pod.run(&["ip", "route"]).unwrap();
    assert!(
        routes.contains("default via 10.77.0.1 dev net1")
            && routes.contains("10.99.0.0/16 dev net1"),
        "{routes}"
    );
    netns::ping(&pod, "10.77.0.1").unwrap();
    // Errors name what failed.
    let e =
        link::in_netns(&pod_path, || link::add_address("nope0", ip("10.1.1.1"), 24)).unwrap_err();
    assert!(e.to_string().contains("no link nope0"), "{e}");
    let e = link::in_netns(&pod_path, || link::add_veth("net1", "x0")).unwrap_err();
    assert!(
        e.to_string().contains("creating veth net1/x0")
            && e.kind() == std::io::ErrorKind::AlreadyExists,
        "{e}"
    );
    // Deleting the host end removes the pair.
    assert!(link::in_netns(&host_path, || link::delete("kn-host0")).unwrap());
    assert!(
        !link::in_netns(&host_path, || link::delete("kn-host0")).unwrap(),
        "a second delete finds nothing"
    );
    assert!(
        link::in_netns(&pod_path, || link::link("net1")).unwrap().is_none(),
        "the pod end went with it"
    );
    // A pair made with its peer already in the pod, named, with its MAC and MTU.
    let p = pod_path.clone();
    link::in_netns(&host_path, move || {
        let ns = std::fs::File::open(&p)?;
        link::add_veth_to(
            "kn-host1",
            Some(1400),
            &link::VethPeer { name: "net2", netns: Some(&ns), mac: Some(mac), mtu: Some(1400) },
        )?;
        assert_eq!(link::link("kn-host1")?.map(|l| l.mtu), Some(1400));
        Ok(())
    })
    .unwrap();
    let peer = link::in_netns(&pod_path, || link::link("net2"))
        .unwrap()
        .expect("net2 was made in the pod");
    assert_eq!((peer.mac, peer.mtu), (mac, 1400));
    assert!(link::in_netns(&host_path, || link::delete("kn-host1")).unwrap());
}

/// VF settings go to the kernel as sriov-cni sends them; a device without VFs (a veth, here:
/// this machine has no SR-IOV hardware) is refused with a reason that says so, and a VLAN
/// out of range never leaves.
#[test]
fn vf_settings_on_a_device_without_vfs_are_refused_clearly() {
    use plumbing::sriov::{VfLinkState, VfSettings};
    let Some(_g) = netns::exclusive() else { return };
    let ns = Netns::new("sv").unwrap();
    ns.run(&["ip", "link", "add", "pf0", "type", "veth", "peer", "name", "pf0p"]).unwrap();
    let settings = VfSettings {
        mac: Some(vswitch::wire::MacAddr([2, 0, 0, 0, 0, 9])),
        spoof_check: Some(true),
        link_state: Some(VfLinkState::Auto),
        ..Default::default()
    };
    let e = ns.enter(|| settings.apply("pf0", 0)).unwrap().unwrap_err();
    assert_eq!(e.raw_os_error(), None, "the error is named: {e}");
    let text = e.to_string();
    assert!(text.contains("VF 0 of pf0") && text.contains("no SR-IOV VF settings"), "{text}");
    let bad = VfSettings { vlan: Some((5000, 0)), ..Default::default() };
    assert!(
        ns.enter(|| bad.apply("pf0", 0)).unwrap().unwrap_err().to_string().contains("VLAN 0-4095")
    );
    let e = ns.enter(|| settings.apply("nope0", 0)).unwrap().unwrap_err().to_string();
    assert!(e.contains("nope0"), "{e}");
}

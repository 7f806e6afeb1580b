//! knitter-cni driven as runtimes drive it (environment + configuration on stdin) against a
//! real knitter-vswitchd and knitter-manager (the workspace's builds), both running in a
//! "node" network namespace the test creates, with pods as namespaces of their own: ADD
//! gives the manager's address, pods on one network ping, pods on another tenant's network
//! cannot; every version gets its own result format; CHECK passes, then names what the test
//! broke; DEL twice, DEL with the manager down; GC; malformed configurations; an unknown
//! network; STATUS with the switch down; ADD/DEL churn leaves nothing behind. In the
//! `serial` nextest group (the daemon runs a PMD thread).

mod lab;

use lab::{Lab, addr, cni_raw, pod};
use serde_json::json;
use std::time::{Duration, Instant};
use vswitch::testkit::netns;

#[test]
fn pods_are_attached_checked_and_detached_as_runtimes_ask() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(lab.mctl(&["network", "create", "red", "--ipv4", "10.60.0.0/24", "--gateway4", "10.60.0.1"]).status.success());
    assert!(lab.mctl(&["tenant", "create", "t2"]).status.success());
    assert!(lab.mctl(&["network", "create", "blue", "--tenant", "t2", "--kind", "vlan", "--ipv4", "10.61.0.0/24"]).status.success());

    // ADD: the manager's address, MAC and MTU, in the pod.
    let (a, a_path) = pod("pa");
    let (b, b_path) = pod("pb");
    let (ok, ra) = lab.cni("ADD", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{ra}");
    assert_eq!(ra["cniVersion"], "1.1.0");
    assert_eq!(ra["interfaces"][1]["name"], "eth0");
    assert_eq!(ra["interfaces"][1]["sandbox"], a_path.as_str());
    assert_eq!(ra["interfaces"][1]["mtu"], 1450);
    assert_eq!(ra["ips"][0], json!({"address": "10.60.0.2/24", "gateway": "10.60.0.1", "interface": 1}));
    assert_eq!(ra["routes"][0], json!({"dst": "0.0.0.0/0", "gw": "10.60.0.1"}));
    let shown = a.run(&["ip", "-o", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(shown.contains("10.60.0.2/24"), "{shown}");
    assert!(a.run(&["ip", "link", "show", "eth0"]).unwrap().contains("0a:58:0a:3c:00:02"));
    let (ok, rb) = lab.cni("ADD", "ctr-b", &b_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{rb}");
    netns::ping(&a, &addr(&rb)).expect("pods on one network ping");
    assert!(lab.ctl(&["port", "list"]).contains("attach"), "the switch ports are the attach API's");

    // The same ADD again (a runtime's retry) gives the same answer.
    assert_eq!(lab.cni("ADD", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).1, ra);

    // Another tenant's network: a pod there cannot reach pod a.
    let (c, c_path) = pod("pc");
    let (ok, rc) = lab.cni("ADD", "ctr-c", &c_path, "eth0", &lab.conf("1.1.0", "blue"));
    assert!(ok, "{rc}");
    assert!(netns::ping(&c, &addr(&ra)).is_err(), "blue reaches red");

    // Every version gets a result in its own format (pod b's second and third interfaces).
    for (v, ifname) in [("0.3.1", "net1"), ("0.4.0", "net2"), ("1.0.0", "net3")] {
        let (ok, r) = lab.cni("ADD", "ctr-b", &b_path, ifname, &lab.conf(v, "red"));
        assert!(ok, "{v}: {r}");
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["ips"][0].get("version").is_some(), v != "1.0.0", "{v}: {r}");
        assert!(r["interfaces"][1].get("mtu").is_none(), "{v}: mtu is 1.1.0's");
        assert!(r.get("routes").is_some_and(|r| r.as_array().unwrap().is_empty()), "only eth0 carries the default route");
    }

    // CHECK passes, then fails naming what the test broke.
    let (ok, r) = lab.cni("CHECK", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{r}");
    let (ok, r) = lab.cni("CHECK", "ctr-a", &a_path, "eth0", &lab.conf("0.3.1", "red"));
    assert!(!ok && r["code"] == 1, "CHECK needs 0.4.0: {r}");
    a.run(&["ip", "addr", "del", "10.60.0.2/24", "dev", "eth0"]).unwrap();
    let (ok, r) = lab.cni("CHECK", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["code"] == 100, "{r}");
    assert!(r["msg"].as_str().unwrap().contains("eth0 lacks its address 10.60.0.2/24"), "{r}");

    // Bad input.
    let (ok, r) = cni_raw("ADD", "ctr-x", &a_path, "eth9", "{not json");
    assert!(!ok && r["code"] == 6, "{r}");
    let (ok, r) = cni_raw("ADD", "ctr-x", &a_path, "eth9", r#"{"cniVersion":"1.1.0","type":"knitter-cni"}"#);
    assert!(!ok && r["code"] == 7, "{r}");
    let (ok, r) = lab.cni("ADD", "ctr-x", &a_path, "eth9", &lab.conf("1.1.0", "nope"));
    assert!(!ok && r["code"] == 7 && r["msg"].as_str().unwrap().contains("network \"nope\" not found"), "{r}");
    let (ok, r) = lab.cni("ADD", "ctr-x", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["msg"].as_str().unwrap().contains("already has an interface eth0"), "{r}");
    assert!(lab.mctl(&["port", "show", "ctr-x", "eth0"]).status.code() == Some(1), "a refused ADD releases its port");
    let (ok, r) = cni_raw("VERSION", "", "", "", r#"{"cniVersion":"0.4.0"}"#);
    assert!(ok && r["supportedVersions"].as_array().unwrap().len() == 5, "{r}");

    // GC: every attachment of this CNI network not valid goes; another network's stays.
    let mut other = lab.conf("1.1.0", "red");
    other["name"] = "other-cni".into();
    let (d, d_path) = pod("pd");
    assert!(lab.cni("ADD", "ctr-d", &d_path, "eth0", &other).0);
    let mut gc = lab.conf("1.1.0", "red");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-a", "ifname": "eth0"}]);
    let (ok, r) = lab.cni("GC", "", "", "", &gc);
    assert!(ok, "{r}");
    let listed = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(listed.contains("ctr-a") && listed.contains("ctr-d") && !listed.contains("ctr-b") && !listed.contains("ctr-c"), "{listed}");
    assert!(b.run(&["ip", "link", "show", "eth0"]).is_err(), "GC removed pod b's interface");
    drop(d);

    // DEL twice; DEL with the manager down (the release is queued).
    assert!(lab.cni("DEL", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).0);
    assert!(lab.cni("DEL", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).0);
    assert!(lab.cni("DEL", "ctr-a", "", "eth0", &lab.conf("1.1.0", "red")).0, "DEL without a netns");
    let mut lab = lab;
    lab.manager = None; // SIGKILL
    assert!(lab.cni("DEL", "ctr-d", &d_path, "eth0", &other).0, "DEL with the manager down");
    let (ok, r) = lab.cni("STATUS", "", "", "", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["code"] == 50, "manager down: {r}");
    lab.start_manager();
    let deadline = Instant::now() + Duration::from_secs(30);
    while String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).contains("ctr-d") {
        assert!(Instant::now() < deadline, "the queued release never reached the manager");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, r) = lab.cni("STATUS", "", "", "", &lab.conf("1.1.0", "red"));
    assert!(ok, "{r}");
    lab.switch = None; // SIGKILL
    let (ok, r) = lab.cni("STATUS", "", "", "", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["code"] == 51, "switch down: {r}");
    let (ok, r) = lab.cni("STATUS", "", "", "", &lab.conf("1.0.0", "red"));
    assert!(!ok && r["code"] == 1, "STATUS needs 1.1.0: {r}");
}

#[test]
fn adding_and_deleting_two_hundred_pods_leaves_nothing_behind() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(lab.mctl(&["network", "create", "churn", "--ipv4", "10.62.0.0/22"]).status.success());
    let conf = lab.conf("1.1.0", "churn");
    // 20 pods with 10 interfaces each: 200 attachments.
    let pods: Vec<_> = (0..20).map(|i| pod(&format!("ch{i}"))).collect();
    let mut addresses = std::collections::HashSet::new();
    for (i, (_, path)) in pods.iter().enumerate() {
        for n in 0..10 {
            let (ok, r) = lab.cni("ADD", &format!("churn-{i}"), path, &format!("net{n}"), &conf);
            assert!(ok, "{r}");
            assert!(addresses.insert(addr(&r)), "an address twice: {r}");
        }
    }
    assert_eq!(lab.ctl(&["port", "list"]).matches(" attach").count(), 200);
    for (i, (_, path)) in pods.iter().enumerate() {
        for n in 0..10 {
            assert!(lab.cni("DEL", &format!("churn-{i}"), path, &format!("net{n}"), &conf).0);
        }
    }
    let node_links = lab.node.run(&["ip", "-o", "link"]).unwrap();
    assert!(!node_links.contains(": kn"), "a veth is left on the node: {node_links}");
    assert!(!lab.ctl(&["port", "list"]).contains("attach"), "a switch port is left");
    let ports = String::from_utf8_lossy(&lab.mctl(&["-o", "json", "port", "list"]).stdout).into_owned();
    assert_eq!(ports.trim(), "[]", "a port is left on the manager");
    for (ns, _) in &pods {
        assert_eq!(ns.run(&["ip", "-o", "link"]).unwrap().lines().count(), 1, "only lo is left in {}", ns.name);
    }
}

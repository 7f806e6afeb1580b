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
use plumbing::sriov::testkit::{FakeVf, fake_pf};
use serde_json::json;
use std::time::{Duration, Instant};
use vswitch::testkit::netns;
use vswitch::testkit::vnf::ListeningVnf;

/// A node whose manager serves TLS with client certificates (`--manager-ca`,
/// `--manager-cert`): ADD gets the manager's address through the switch's TLS channel (the
/// sync stream's channel is made by the same `knitter_api::endpoint`); DEL gives it back.
#[test]
fn a_node_reaches_its_manager_over_tls() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start_tls();
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "red",
            "--ipv4",
            "10.62.0.0/24",
            "--gateway4",
            "10.62.0.1"
        ])
        .status
        .success()
    );
    let (_a, a_path) = pod("pt");
    let (ok, r) = lab.cni("ADD", "ctr-t", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{r}");
    assert_eq!(addr(&r), "10.62.0.2");
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(ports.contains("10.62.0.2"), "{ports}");
    let (ok, r) = lab.cni("DEL", "ctr-t", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{r}");
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(!ports.contains("10.62.0.2"), "{ports}");
}

#[test]
fn pods_are_attached_checked_and_detached_as_runtimes_ask() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "red",
            "--ipv4",
            "10.60.0.0/24",
            "--gateway4",
            "10.60.0.1"
        ])
        .status
        .success()
    );
    // Tenant t2's pods run in namespace test-t2 (the tenancy rule: docs/manager.md).
    assert!(lab.mctl(&["tenant", "create", "t2", "--namespaces", "test-t2"]).status.success());
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "blue",
            "--tenant",
            "t2",
            "--kind",
            "vlan",
            "--ipv4",
            "10.61.0.0/24"
        ])
        .status
        .success()
    );

    // ADD: the manager's address, MAC and MTU, in the pod.
    let (a, a_path) = pod("pa");
    let (b, b_path) = pod("pb");
    let (ok, ra) = lab.cni("ADD", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{ra}");
    assert_eq!(ra["cniVersion"], "1.1.0");
    assert_eq!(ra["interfaces"][1]["name"], "eth0");
    assert_eq!(ra["interfaces"][1]["sandbox"], a_path.as_str());
    assert_eq!(ra["interfaces"][1]["mtu"], 1450);
    assert_eq!(
        ra["ips"][0],
        json!({"address": "10.60.0.2/24", "gateway": "10.60.0.1", "interface": 1})
    );
    assert_eq!(ra["routes"][0], json!({"dst": "0.0.0.0/0", "gw": "10.60.0.1"}));
    let shown = a.run(&["ip", "-o", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(shown.contains("10.60.0.2/24"), "{shown}");
    assert!(a.run(&["ip", "link", "show", "eth0"]).unwrap().contains("0a:58:0a:3c:00:02"));
    let (ok, rb) = lab.cni("ADD", "ctr-b", &b_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{rb}");
    netns::ping(&a, &addr(&rb)).expect("pods on one network ping");
    assert!(lab.ctl(&["port", "list"]).contains("attach"), "the switch ports are the attach API's");
    // An operator's apply beside the pods: the ports as listed go back unchanged (the pods'
    // left alone), and a local change keeps the pods' attachments (DEL and GC below find them).
    let ports = lab.dir.path().join("ports.yaml");
    std::fs::write(&ports, lab.ctl(&["-o", "yaml", "port", "list"])).unwrap();
    let back = lab.ctl(&["apply", "-f", ports.to_str().unwrap(), "--prune"]);
    assert!(back.contains("nothing to change"), "{back}");
    let extra = lab.dir.path().join("extra.yaml");
    std::fs::write(&extra, "bridges:\n  - {name: extra, vlan: 3999}\n").unwrap();
    assert!(lab.ctl(&["apply", "-f", extra.to_str().unwrap()]).contains("bridge extra: added"));
    netns::ping(&a, &addr(&rb)).expect("the pods still ping");

    // The same ADD again (a runtime's retry) gives the same answer.
    assert_eq!(lab.cni("ADD", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).1, ra);

    // Another tenant's network: a pod there cannot reach pod a.
    let (c, c_path) = pod("pc");
    let t2 = "IgnoreUnknown=1;K8S_POD_NAMESPACE=test-t2;K8S_POD_NAME=ctr-c";
    let (ok, rc) =
        lab::cni_args("ADD", "ctr-c", &c_path, "eth0", &lab.conf("1.1.0", "blue").to_string(), t2);
    assert!(ok, "{rc}");
    assert!(netns::ping(&c, &addr(&ra)).is_err(), "blue reaches red");

    // Every version gets a result in its own format (pod b's second and third interfaces).
    for (v, ifname) in [("0.3.1", "net1"), ("0.4.0", "net2"), ("1.0.0", "net3")] {
        let (ok, r) = lab.cni("ADD", "ctr-b", &b_path, ifname, &lab.conf(v, "red"));
        assert!(ok, "{v}: {r}");
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["ips"][0].get("version").is_some(), v != "1.0.0", "{v}: {r}");
        assert!(r["interfaces"][1].get("mtu").is_none(), "{v}: mtu is 1.1.0's");
        assert!(
            r.get("routes").is_some_and(|r| r.as_array().unwrap().is_empty()),
            "only eth0 carries the default route"
        );
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
    let (ok, r) =
        cni_raw("ADD", "ctr-x", &a_path, "eth9", r#"{"cniVersion":"1.1.0","type":"knitter-cni"}"#);
    assert!(!ok && r["code"] == 7, "{r}");
    let (ok, r) = lab.cni("ADD", "ctr-x", &a_path, "eth9", &lab.conf("1.1.0", "nope"));
    assert!(
        !ok && r["code"] == 7 && r["msg"].as_str().unwrap().contains("network \"nope\" not found"),
        "{r}"
    );
    let (ok, r) = lab.cni("ADD", "ctr-x", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["msg"].as_str().unwrap().contains("already has an interface eth0"), "{r}");
    assert!(
        lab.mctl(&["port", "show", "ctr-x", "eth0"]).status.code() == Some(3),
        "a refused ADD releases its port (NotFound: exit status 3)"
    );
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
    assert!(
        listed.contains("ctr-a")
            && listed.contains("ctr-d")
            && !listed.contains("ctr-b")
            && !listed.contains("ctr-c"),
        "{listed}"
    );
    assert!(b.run(&["ip", "link", "show", "eth0"]).is_err(), "GC removed pod b's interface");
    drop(d);

    // DEL twice; DEL with the manager down (the release is queued).
    assert!(lab.cni("DEL", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).0);
    assert!(lab.cni("DEL", "ctr-a", &a_path, "eth0", &lab.conf("1.1.0", "red")).0);
    assert!(
        lab.cni("DEL", "ctr-a", "", "eth0", &lab.conf("1.1.0", "red")).0,
        "DEL without a netns"
    );
    let mut lab = lab;
    lab.manager = None; // SIGKILL
    assert!(lab.cni("DEL", "ctr-d", &d_path, "eth0", &other).0, "DEL with the manager down");
    let (_e, e_path) = pod("pe");
    let (ok, r) = lab.cni("ADD", "ctr-e", &e_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(!ok && r["code"] == 11, "ADD with the manager down: {r}");
    assert!(
        r["msg"]
            .as_str()
            .is_some_and(|m| m.contains(&lab.grpc) && m.contains("is knitter-manager running")),
        "names the manager: {r}"
    );
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

/// With no node daemon where the configuration says (no socket file), every verb answers
/// "try again later" naming the socket and what to check, as STATUS does — not a bare
/// "No such file or directory". DEL too: the runtime retries it, and nothing was attached
/// that the daemon could have removed.
#[test]
fn every_verb_names_the_socket_when_the_node_daemon_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("none.sock");
    let conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "knitter-cni", "socket": sock, "network": "red"}).to_string();
    for verb in ["ADD", "DEL", "CHECK", "GC"] {
        let (ok, r) = cni_raw(verb, "ctr", "/var/run/netns/none", "eth0", &conf);
        assert!(!ok && r["code"] == 11, "{verb}: {r}");
        let msg = r["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains(sock.to_str().unwrap()) && msg.contains("is it running?"),
            "{verb}: {r}"
        );
    }
}

/// A pod forwards from the moment ADD returns, with the other core busy: its first ping is
/// answered and the switch drops nothing as `port_down`. ADD used to return before the
/// switch saw the new veth's carrier (the kernel turns it on a moment after both ends are
/// up), so a pod's first ARP request was dropped until the link watcher's next poll.
#[test]
fn a_pod_forwards_the_moment_add_returns() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(lab.mctl(&["network", "create", "red", "--ipv4", "10.62.0.0/24"]).status.success());
    let (_a, a_path) = pod("fa");
    let (ok, ra) = lab.cni("ADD", "ctr-fa", &a_path, "eth0", &lab.conf("1.1.0", "red"));
    assert!(ok, "{ra}");
    let _busy = [vswitch::testkit::BusyCpu::start(0), vswitch::testkit::BusyCpu::start(1)];
    for round in 0..5 {
        let (b, b_path) = pod(&format!("fb{round}"));
        let container = format!("ctr-fb{round}");
        let (ok, rb) = lab.cni("ADD", &container, &b_path, "eth0", &lab.conf("1.1.0", "red"));
        assert!(ok, "{rb}");
        let one = b.run(&["ping", "-c", "1", "-W", "1", &addr(&ra)]);
        assert!(one.is_ok(), "round {round}: the first ping after ADD: {one:?}");
        assert!(lab.cni("DEL", &container, &b_path, "eth0", &lab.conf("1.1.0", "red")).0);
    }
    let stats = lab.ctl(&["stats"]);
    let port_down = drop_count(&stats, "port_down");
    assert_eq!(port_down, None, "frames dropped as port_down: {stats}");
}

/// A network's pod policer reaches each pod's port on the node (through the manager's port)
/// and polices it: a pod sending echoes back to back through a 100-a-second policer has
/// those over its burst dropped and counted as `policed`.
#[test]
fn a_networks_pod_policer_polices_each_pods_port() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(
        lab.mctl(&["network", "create", "sig", "--ipv4", "10.63.0.0/24", "--pod-pps", "100"])
            .status
            .success()
    );
    let (_a, a_path) = pod("pa");
    let (ok, ra) = lab.cni("ADD", "ctr-pa", &a_path, "eth0", &lab.conf("1.1.0", "sig"));
    assert!(ok, "{ra}");
    let (b, b_path) = pod("pb");
    let (ok, rb) = lab.cni("ADD", "ctr-pb", &b_path, "eth0", &lab.conf("1.1.0", "sig"));
    assert!(ok, "{rb}");
    let ports = lab.ctl(&["port", "list"]);
    assert_eq!(
        ports.lines().filter(|l| l.contains(" attach") && l.ends_with("100 pps")).count(),
        2,
        "{ports}"
    );
    // 300 echoes back to back (preloaded; a burst of them may not reach the switch: the
    // veth's and the socket's rings are smaller): the 64-frame burst passes, most of the
    // rest not.
    assert!(
        b.run(&["ping", "-c", "1", "-W", "1", &addr(&ra)]).is_ok(),
        "the pods reach each other (and their neighbors are resolved)"
    );
    let _ = b.run(&["ping", "-q", "-c", "300", "-l", "300", "-w", "2", &addr(&ra)]);
    let stats = lab.ctl(&["stats"]);
    let policed: u64 = drop_count(&stats, "policed").unwrap_or(0);
    assert!(policed >= 30, "{policed} policed: {stats}");
    // Counted per port as well (`knitterctl stats` "policed", `knitter_port_policed_total`).
    let json: serde_json::Value = serde_json::from_str(&lab.ctl(&["-o", "json", "stats"])).unwrap();
    let per_port: Vec<u64> = json["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policed"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(per_port.iter().sum::<u64>(), policed, "{per_port:?}");
    for (c, path) in [("ctr-pa", &a_path), ("ctr-pb", &b_path)] {
        assert!(lab.cni("DEL", c, path, "eth0", &lab.conf("1.1.0", "sig")).0);
    }
}

/// A network with a node gateway through the whole path (manager → sync stream → node →
/// CNI), dual-stack: the node makes its host port with the addresses the manager gave it,
/// the node (a kubelet's probe) reaches the pod, the pod reaches its node and, masqueraded,
/// an "outside" namespace with no route back to pods, over IPv4 and IPv6; the pod's DEL and the network's delete leave
/// nothing on the node.
#[test]
fn a_node_gateway_network_reaches_the_node_and_beyond() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    // A VTEP, so the node registers with the manager and syncs.
    lab.node.run(&["ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul0p"]).unwrap();
    for l in ["ul0", "ul0p"] {
        lab.node.run(&["ip", "link", "set", l, "up"]).unwrap();
    }
    lab.ctl(&["port", "add", "ul0", "--af-xdp", "ul0", "--underlay"]);
    lab.ctl(&["vtep", "set", "--local", "198.51.100.1", "--underlay", "ul0"]);
    assert!(
        lab.ctl(&["vtep", "show"]).contains("198.51.100.1"),
        "ports: {}",
        lab.ctl(&["port", "list"])
    );
    let o = lab.mctl(&[
        "network",
        "create",
        "pods",
        "--kind",
        "vlan",
        "--ipv4",
        "10.64.0.0/24",
        "--gateway4",
        "10.64.0.1",
        "--ipv6",
        "fd00:64::/64",
        "--gateway6",
        "fd00:64::1",
        "--node-gateway",
        "--masquerade",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The outside: a namespace the node reaches on 203.0.113.0/24, with no route to pods.
    let out = netns::Netns::new("out").unwrap();
    lab.node
        .run(&[
            "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up0p", "netns", &out.name,
        ])
        .unwrap();
    lab.node.run(&["ip", "addr", "add", "203.0.113.1/24", "dev", "up0"]).unwrap();
    lab.node.run(&["ip", "link", "set", "up0", "up"]).unwrap();
    out.run(&["ip", "addr", "add", "203.0.113.2/24", "dev", "up0p"]).unwrap();
    lab.node.run(&["ip", "addr", "add", "2001:db8:113::1/64", "dev", "up0", "nodad"]).unwrap();
    out.run(&["ip", "addr", "add", "2001:db8:113::2/64", "dev", "up0p", "nodad"]).unwrap();
    out.run(&["ip", "link", "set", "up0p", "up"]).unwrap();

    let (p, p_path) = pod("gw");
    let conf = lab.conf("1.1.0", "pods");
    let (ok, r) = lab.cni("ADD", "ctr-gw", &p_path, "eth0", &conf);
    assert!(ok, "{r}");
    let pod_ip = addr(&r);
    let kh = knitter_api::names::host_port("pods", "n1").1;
    let hosts = String::from_utf8_lossy(
        &lab.mctl(&["-o", "json", "port", "list", "--network", "pods"]).stdout,
    )
    .into_owned();
    let hosts: serde_json::Value = serde_json::from_str(&hosts).unwrap();
    let host = hosts
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["interface"] == kh.as_str())
        .unwrap_or_else(|| panic!("no host port on the manager: {hosts}"));
    let host_ip = host["addresses"][0]["address"].as_str().unwrap().to_string();
    let host_ip6 = host["addresses"][1]["address"].as_str().unwrap().to_string();
    let pod_ip6 = r["ips"][1]["address"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        pod_ip6.starts_with("fd00:64::") && host_ip6.starts_with("fd00:64::"),
        "dual-stack: {r} {host}"
    );
    // The node makes it from its next desired state.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab.node.run(&["ip", "-o", "addr", "show", "dev", &kh]).is_ok_and(|a| {
        a.contains(&format!("{host_ip}/24")) && a.contains(&format!("{host_ip6}/64"))
    }) {
        assert!(
            Instant::now() < deadline,
            "no {kh} with {host_ip} on the node: {}",
            lab.ctl(&["port", "list"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        lab.ctl(&["bridge", "list"]).contains("10.64.0.1"),
        "the gateway is answered: {}",
        lab.ctl(&["bridge", "list"])
    );
    // The kubelet probes the pod; the pod reaches its node and, masqueraded, the outside.
    let deadline = Instant::now() + Duration::from_secs(10);
    while netns::ping(&lab.node, &pod_ip).is_err() {
        assert!(Instant::now() < deadline, "the node does not reach its pod {pod_ip}");
    }
    netns::ping(&p, &host_ip).expect("the pod reaches its node's host port address");
    netns::ping(&p, "203.0.113.1")
        .expect("the pod reaches the node's other addresses through the gateway");
    netns::ping(&p, "203.0.113.2").expect("the pod reaches the outside, masqueraded");
    let seen = out.run(&["ip", "neigh"]).unwrap();
    assert!(!seen.contains("10.64.0."), "the outside saw only the node's address: {seen}");
    // A NodePort with externalTrafficPolicy: Local, as kube-proxy writes it: an outside
    // client reaching the pod through its node keeps its address; a pod reaching a Service
    // backed by a pod of its network (here itself) is masqueraded (the answer must come back
    // translated).
    lab.node.run(&["nft", "add", "table", "ip", "kp"]).unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "chain",
            "ip",
            "kp",
            "pre",
            "{ type nat hook prerouting priority dstnat; }",
        ])
        .unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "rule",
            "ip",
            "kp",
            "pre",
            "tcp",
            "dport",
            "30080",
            "dnat",
            "to",
            &format!("{pod_ip}:8080"),
        ])
        .unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "rule",
            "ip",
            "kp",
            "pre",
            "ip",
            "daddr",
            "10.96.0.10",
            "tcp",
            "dport",
            "80",
            "dnat",
            "to",
            &format!("{pod_ip}:8080"),
        ])
        .unwrap();
    // The address a connection from `client` to `to:port` arrives from at the pod's `bind`:8080.
    let peer_of = |client: &netns::Netns, to: &str, port: &str, bind: &str| {
        let server = format!(
            "import socket; s = socket.socket(socket.AF_INET6 if ':' in '{bind}' else socket.AF_INET); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('{bind}', 8080)); s.listen(1); s.settimeout(10); c, a = s.accept(); print(a[0])"
        );
        let srv = std::thread::scope(|sc| {
            let h = sc.spawn(|| p.run(&["python3", "-c", &server]));
            let connect = format!(
                "import socket, time\nfor _ in range(50):\n    try:\n        socket.create_connection(('{to}', {port}), timeout=2).close(); break\n    except OSError: time.sleep(0.1)"
            );
            client.run(&["python3", "-c", &connect]).unwrap();
            h.join().unwrap()
        });
        srv.unwrap().trim().to_string()
    };
    assert_eq!(
        peer_of(&out, "203.0.113.1", "30080", &pod_ip),
        "203.0.113.2",
        "externalTrafficPolicy: Local keeps the client's address"
    );
    assert_eq!(
        peer_of(&p, "10.96.0.10", "80", &pod_ip),
        host_ip,
        "a pod's own Service: from its node's address"
    );
    // DNS through a Service: UDP, translated the same way (here to the pod itself).
    lab.node
        .run(&[
            "nft",
            "add",
            "rule",
            "ip",
            "kp",
            "pre",
            "ip",
            "daddr",
            "10.96.0.53",
            "udp",
            "dport",
            "53",
            "dnat",
            "to",
            &format!("{pod_ip}:5353"),
        ])
        .unwrap();
    let dns = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('{pod_ip}', 5353))\nc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(3)\nc.sendto(b'query', ('10.96.0.53', 53))\nd, a = s.recvfrom(64); s.sendto(b'answer', a)\nprint(c.recvfrom(64)[0].decode())"
    );
    assert_eq!(
        p.run(&["python3", "-c", &dns]).unwrap().trim(),
        "answer",
        "a UDP Service (DNS) answers through the node"
    );

    // IPv6 the same way: the switch answers the gateway's neighbor solicitations.
    let deadline = Instant::now() + Duration::from_secs(10);
    while netns::ping(&lab.node, &pod_ip6).is_err() {
        assert!(Instant::now() < deadline, "the node does not reach its pod {pod_ip6}");
    }
    netns::ping(&p, &host_ip6).expect("the pod reaches its node over IPv6");
    netns::ping(&p, "2001:db8:113::2").expect("the pod reaches the outside over IPv6, masqueraded");
    let conns = lab.node.run(&["nft", "list", "table", "inet", &format!("knitter-{kh}")]).unwrap();
    assert!(conns.contains("ip6 saddr fd00:64::/64 masquerade"), "{conns}");
    // An IPv6 Service (a dual-stack cluster's second ClusterIP, kube-proxy's ip6 rules): an
    // outside client through a NodePort keeps its address; the pod reaching its own Service
    // comes from its node's address.
    lab.node.run(&["nft", "add", "table", "ip6", "kp6"]).unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "chain",
            "ip6",
            "kp6",
            "pre",
            "{ type nat hook prerouting priority dstnat; }",
        ])
        .unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "rule",
            "ip6",
            "kp6",
            "pre",
            "tcp",
            "dport",
            "30080",
            "dnat",
            "to",
            &format!("[{pod_ip6}]:8080"),
        ])
        .unwrap();
    lab.node
        .run(&[
            "nft",
            "add",
            "rule",
            "ip6",
            "kp6",
            "pre",
            "ip6",
            "daddr",
            "fd00:96::10",
            "tcp",
            "dport",
            "80",
            "dnat",
            "to",
            &format!("[{pod_ip6}]:8080"),
        ])
        .unwrap();
    assert_eq!(
        peer_of(&out, "2001:db8:113::1", "30080", &pod_ip6),
        "2001:db8:113::2",
        "externalTrafficPolicy: Local keeps the client's IPv6 address"
    );
    assert_eq!(
        peer_of(&p, "fd00:96::10", "80", &pod_ip6),
        host_ip6,
        "a pod's own IPv6 Service: from its node's address"
    );

    // DEL: the pod's port goes; the host port goes when the manager's sweep finds the node
    // without pods on the network (here: deleting the network, which sweeps it too).
    assert!(lab.cni("DEL", "ctr-gw", &p_path, "eth0", &conf).0);
    let o = lab.mctl(&["network", "delete", "pods"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    while lab.node.run(&["ip", "link", "show", &kh]).is_ok() {
        assert!(
            Instant::now() < deadline,
            "{kh} is left on the node: {}",
            lab.ctl(&["port", "list"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!lab.ctl(&["port", "list"]).contains(&kh));
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
    let ports =
        String::from_utf8_lossy(&lab.mctl(&["-o", "json", "port", "list"]).stdout).into_owned();
    assert_eq!(ports.trim(), "[]", "a port is left on the manager");
    for (ns, _) in &pods {
        assert_eq!(
            ns.run(&["ip", "-o", "link"]).unwrap().lines().count(),
            1,
            "only lo is left in {}",
            ns.name
        );
    }
}

/// dpdk-testpmd as a DPDK pod's app, in a mount namespace of its own where the host's
/// vhost-user directory is hidden and seen only through a bind mount at `mnt` (as a pod's
/// hostPath volume), listening on `socket` (a path under `mnt`) with `mac`, answering ARP
/// and ping (`icmpecho`).
fn dpdk_pod(
    host_dir: &std::path::Path,
    mnt: &std::path::Path,
    socket: &std::path::Path,
    mac: &str,
) -> Option<ListeningVnf> {
    let script = r#"mount --bind "$1" "$2" && mount -t tmpfs knitter-hidden "$1" && shift 2 && exec dpdk-testpmd "$@""#;
    let mut wrapper = std::process::Command::new("unshare");
    wrapper
        .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(host_dir)
        .arg(mnt);
    let mut app = ListeningVnf::start_with(wrapper, socket, Some(mac))?;
    app.say("set fwd icmpecho");
    app.say("start");
    Some(app)
}

/// A network whose vhost-user hand-off directory holds a file of one of the switch's `dpdk`
/// ports is refused at ADD, the port and the directory named: the pod could replace the
/// file (a memif or virtio-user socket, here a pcap) and stand in for the port's trusted
/// peer. (The other order, a dpdk port into a directory pods write, is the daemon's test.)
#[test]
fn a_pod_is_not_handed_a_directory_holding_a_dpdk_ports_file() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    let network =
        ["network", "create", "media", "--ipv4", "10.67.0.0/24", "--gateway4", "10.67.0.1"];
    assert!(lab.mctl(&network).status.success());
    let vhost_dir = lab.dir.path().join("vhost");
    std::fs::create_dir_all(&vhost_dir).unwrap();
    let rx = lab.dir.path().join("in.pcap");
    vswitch::testkit::pcap::write(&rx, &[]).unwrap();
    let ctl = |args: &[&str]| {
        std::process::Command::new(lab::bin("knitterctl"))
            .arg("--socket")
            .arg(lab.socket())
            .args(args)
            .output()
            .unwrap()
    };
    assert!(ctl(&["bridge", "add", "op"]).status.success());
    let devargs =
        format!("net_pcap_op0,rx_pcap={},tx_pcap={}/op.pcap", rx.display(), vhost_dir.display());
    let added = ctl(&["port", "add", "op0", "--dpdk", &devargs, "--access", "op"]);
    if !added.status.success() {
        let why = String::from_utf8_lossy(&added.stderr);
        assert!(std::env::var_os("CI").is_none(), "CI installs DPDK: {why}");
        eprintln!("skipped: the dpdk port did not open ({why})");
        return;
    }
    let mut conf = lab.conf("1.1.0", "media");
    conf["interfaceType"] = "vhost-user".into();
    conf["vhostUser"] = json!({ "dir": vhost_dir });
    let (_pod, pod_path) = pod("pg");
    let (ok, r) = lab.cni("ADD", "ctr-guard-0123456789abcdef", &pod_path, "net1", &conf);
    let msg = r["msg"].as_str().unwrap_or_default();
    assert!(!ok && msg.contains("op0") && msg.contains("a directory pods can write"), "{r}");
}

/// Tenancy through the whole path (CNI → node → manager): a pod of a namespace that is not
/// the network's tenant's is refused with a CNI error naming the namespace, its tenant and
/// the network — a namespace merely named as the tenant included; listed on the tenant, it
/// attaches; a shared network takes anyone.
#[test]
fn a_pod_attaches_only_to_its_tenants_networks() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(lab.mctl(&["tenant", "create", "red"]).status.success());
    assert!(
        lab.mctl(&["network", "create", "red-net", "--tenant", "red", "--ipv4", "10.68.0.0/24"])
            .status
            .success()
    );
    let conf = lab.conf("1.1.0", "red-net");
    let (p, path) = pod("tn");
    let args = |ns: &str| format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME=web");
    let (ok, e) = lab::cni_args("ADD", "ctr-tn", &path, "eth0", &conf.to_string(), &args("red"));
    assert!(!ok, "{e}");
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("namespace \"red\" belongs to tenant \"admin\"; network \"red-net\" is tenant \"red\"'s and not shared"), "{e}");
    assert!(lab.ctl(&["port", "list"]).lines().count() <= 1, "nothing attached");
    assert!(lab.mctl(&["tenant", "namespaces", "red", "red"]).status.success());
    let (ok, r) = lab::cni_args("ADD", "ctr-tn", &path, "eth0", &conf.to_string(), &args("red"));
    assert!(ok, "{r}");
    assert!(lab::cni_args("DEL", "ctr-tn", &path, "eth0", &conf.to_string(), &args("red")).0);
    drop(p);
}

/// A VF the device plugin allocated is the pod's, whatever its cni-args name; a VF the pod
/// names itself is refused unless the network lets pods choose (no SR-IOV here: the
/// allocated VF then fails on the node's sysfs, which shows which one was asked for).
#[test]
fn a_pod_cannot_choose_its_vf_over_the_device_plugin() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(
        lab.mctl(&["network", "create", "vf-net", "--kind", "vlan", "--ipv4", "10.69.0.0/24"])
            .status
            .success()
    );
    let (p, path) = pod("vfc");
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vnf";
    let mut conf = lab.conf("1.1.0", "vf-net");
    conf["interfaceType"] = "sriov".into();
    conf["args"] = serde_json::json!({"cni": {"deviceID": "0000:01:00.1"}});
    let (ok, e) = lab::cni_args("ADD", "ctr-vf", &path, "net1", &conf.to_string(), args);
    assert!(!ok, "{e}");
    assert!(e["msg"].as_str().unwrap_or("").contains("does not let pods choose their VF"), "{e}");
    assert!(lab.ctl(&["port", "list"]).lines().count() <= 1, "nothing attached");
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(!ports.contains("ctr-vf"), "the manager's port released: {ports}");
    // Multus's deviceID (the NAD's resourceName) wins over the pod's.
    conf["deviceID"] = "0000:07:00.3".into();
    let (ok, e) = lab::cni_args("ADD", "ctr-vf", &path, "net1", &conf.to_string(), args);
    let msg = e["msg"].as_str().unwrap_or("");
    assert!(
        !ok && msg.contains("0000:07:00.3")
            && !msg.contains("0000:01:00.1")
            && !msg.contains("choose"),
        "{e}"
    );
    drop(p);
}

/// In Kubernetes a DPDK pod's socket is handed over in its own emptyDir volume, which the
/// node finds under the kubelet's directory by the pod's UID; what the pod planted there
/// before ADD — symlinks where the JSON and its temporary file go, a socket of its own
/// where the interface's goes — is neither followed nor taken; the app, seeing only its
/// volume at /var/run/knitter, talks to a kernel pod; a pod without the volume is refused
/// with the volume to declare.
#[test]
fn a_dpdk_pods_socket_is_in_its_own_volume_and_nothing_planted_is_followed() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start_configured(|_, dir| {
        format!("[vhost]\nkubelet_pods_dir = \"{}\"\n", dir.join("kubelet-pods").display())
    });
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "media",
            "--ipv4",
            "10.67.0.0/24",
            "--gateway4",
            "10.67.0.1"
        ])
        .status
        .success()
    );
    let mut conf = lab.conf("1.1.0", "media");
    conf["interfaceType"] = "vhost-user".into();
    let (uid, container) = ("6b1f7c2e-0000-4000-8000-00000000beef", "ctr-vol-0123456789");
    let volume = lab
        .dir
        .path()
        .join(format!("kubelet-pods/{uid}/volumes/kubernetes.io~empty-dir/knitter-vhost"));
    let args = |uid: &str| {
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=red;K8S_POD_NAME=vnf;K8S_POD_UID={uid}")
    };
    let (dp, dp_path) = pod("vol");

    // No volume yet: refused, naming it.
    let (ok, e) = lab::cni_args("ADD", container, &dp_path, "net1", &conf.to_string(), &args(uid));
    assert!(
        !ok && e["msg"]
            .as_str()
            .unwrap_or("")
            .contains("no emptyDir volume named \"knitter-vhost\""),
        "{e}"
    );

    std::fs::create_dir_all(&volume).unwrap();
    let victim = lab.dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    for name in ["net1.json", "net1.json.tmp"] {
        std::os::unix::fs::symlink(&victim, volume.join(name)).unwrap();
    }
    // Bound through the directory's descriptor: the kubelet's path is longer than a socket
    // address holds.
    let dir = std::fs::File::open(&volume).unwrap();
    let planted = std::os::unix::net::UnixListener::bind(format!(
        "/proc/self/fd/{}/net1.sock",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    ))
    .unwrap();
    planted.set_nonblocking(true).unwrap();
    let (ok, r) = lab::cni_args("ADD", container, &dp_path, "net1", &conf.to_string(), &args(uid));
    assert!(ok, "{r}");
    assert_eq!(
        r["interfaces"][0]["socketPath"], "/var/run/knitter/net1.sock",
        "the path in the pod"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep", "the symlinks' target is untouched");
    assert!(std::fs::symlink_metadata(volume.join("net1.json")).unwrap().file_type().is_file());
    assert!(!volume.join("net1.sock").exists(), "the planted socket is not taken");
    assert!(planted.accept().is_err(), "nobody connected to it");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(volume.join("net1.json")).unwrap()).unwrap();
    assert_eq!(info["mac"], r["interfaces"][0]["mac"]);
    drop(planted);

    // The app sees its volume only (at its mount path) and listens; a kernel pod pings it.
    let mnt = lab.dir.path().join("pod-root-vol");
    std::fs::create_dir_all(&mnt).unwrap();
    let mac = info["mac"].as_str().unwrap().to_string();
    let Some(mut app) = dpdk_pod(&volume, &mnt, &mnt.join("net1.sock"), &mac) else { return };
    let (k, k_path) = pod("vk");
    let (ok, rk) = lab.cni("ADD", "ctr-vol-kernel", &k_path, "eth0", &lab.conf("1.1.0", "media"));
    assert!(ok, "{rk}");
    let target = addr(&r);
    let deadline = Instant::now() + Duration::from_secs(40);
    while let Err(e) = netns::ping(&k, &target) {
        assert!(
            Instant::now() < deadline,
            "the kernel pod never reached the DPDK pod at {target}: {e}"
        );
        app.poke();
        std::thread::sleep(Duration::from_millis(300));
    }
    let (ok, c) =
        lab::cni_args("CHECK", container, &dp_path, "net1", &conf.to_string(), &args(uid));
    assert!(ok, "{c}");
    drop(app);

    // DEL empties the volume of what the node put there; the kubelet removes the volume.
    assert!(lab::cni_args("DEL", container, &dp_path, "net1", &conf.to_string(), &args(uid)).0);
    assert!(volume.is_dir() && !volume.join("net1.json").exists());
    assert!(lab.cni("DEL", "ctr-vol-kernel", &k_path, "eth0", &lab.conf("1.1.0", "media")).0);
    // A UID or volume name that would climb out of the kubelet's directory is refused.
    let mut bad = conf.clone();
    bad["vhostUser"] = json!({ "volume": "../../etc" });
    let (ok, e) =
        lab::cni_args("ADD", "ctr-vol-bad", &dp_path, "net1", &bad.to_string(), &args(uid));
    assert!(
        !ok && e["msg"].as_str().unwrap_or("").contains("is not a Kubernetes volume name"),
        "{e}"
    );
    let (ok, e) =
        lab::cni_args("ADD", "ctr-vol-bad", &dp_path, "net1", &conf.to_string(), &args("../../x"));
    assert!(!ok && e["msg"].as_str().unwrap_or("").contains("is not a UID"), "{e}");
    drop((dp, k));
}

#[test]
fn a_dpdk_pod_gets_a_vhost_user_socket_and_talks_to_a_kernel_pod() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "media",
            "--ipv4",
            "10.66.0.0/24",
            "--gateway4",
            "10.66.0.1"
        ])
        .status
        .success()
    );
    let vhost_dir = lab.dir.path().join("vhost");
    let devinfo = lab.dir.path().join("devinfo/cni/knitter-ctr-dpdk-net1-deviceinfo.json");
    let mut conf = lab.conf("1.1.0", "media");
    conf["interfaceType"] = "vhost-user".into();
    conf["vhostUser"] = json!({ "dir": vhost_dir, "mode": "0750" });
    conf["runtimeConfig"] = json!({ "CNIDeviceInfoFile": devinfo });
    let (dp, dp_path) = pod("pv");
    let container = "ctr-dpdk-0123456789abcdef";

    // ADD: a socket path (the app makes the socket), the JSON beside it, the device-info file.
    let (ok, r) = lab.cni("ADD", container, &dp_path, "net1", &conf);
    assert!(ok, "{r}");
    let socket = vhost_dir.join("ctr-dpdk-012/net1.sock");
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["interfaces"][0]["socketPath"], socket.display().to_string());
    assert_eq!(
        (r["interfaces"][0]["name"].as_str(), r["ips"][0]["interface"].as_u64()),
        (Some("net1"), Some(0))
    );
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(vhost_dir.join("ctr-dpdk-012/net1.json")).unwrap())
            .unwrap();
    assert_eq!(
        (info["socket"].as_str(), info["mode"].as_str(), info["mtu"].as_u64()),
        (Some("net1.sock"), Some("server"), Some(1450))
    );
    assert_eq!(info["mac"], r["interfaces"][0]["mac"]);
    assert_eq!(info["ips"][0], r["ips"][0]["address"]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(vhost_dir.join("ctr-dpdk-012")).unwrap().permissions().mode() & 0o777,
        0o750
    );
    let di: serde_json::Value = serde_json::from_slice(&std::fs::read(&devinfo).unwrap()).unwrap();
    assert_eq!(
        di,
        json!({"type": "vhost-user", "version": "1.1.0", "vhost-user": {"mode": "server", "path": socket.display().to_string()}})
    );
    // The node recorded the same device-info on the manager's port (for the pod's network-status).
    let shown: serde_json::Value = serde_json::from_slice(
        &lab.mctl(&["-o", "json", "port", "show", container, "net1"]).stdout,
    )
    .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(shown["device_info"].as_str().unwrap_or("null"))
            .unwrap(),
        di,
        "{shown}"
    );
    let (ok, old) = lab.cni(
        "ADD",
        container,
        &dp_path,
        "net1",
        &lab.conf("1.0.0", "media")
            .as_object()
            .cloned()
            .map(|mut c| {
                c.insert("interfaceType".into(), "vhost-user".into());
                c.insert("vhostUser".into(), json!({ "dir": vhost_dir }));
                serde_json::Value::Object(c)
            })
            .unwrap(),
    );
    assert!(ok && old["interfaces"][0].get("socketPath").is_none(), "socketPath is 1.1.0's: {old}");
    // CHECK passes while the app has not started: the link is just down.
    let (ok, c) = lab.cni("CHECK", container, &dp_path, "net1", &conf);
    assert!(ok, "{c}");

    // The app starts in its own mount namespace and listens; the switch connects; a kernel
    // pod on the same network pings it.
    let mnt = lab.dir.path().join("pod-root-vhu");
    std::fs::create_dir_all(&mnt).unwrap();
    let mac = info["mac"].as_str().unwrap().to_string();
    let Some(mut app) = dpdk_pod(&vhost_dir, &mnt, &mnt.join("ctr-dpdk-012/net1.sock"), &mac)
    else {
        return;
    };
    let (k, k_path) = pod("pk");
    let (ok, rk) = lab.cni("ADD", "ctr-kernel", &k_path, "eth0", &lab.conf("1.1.0", "media"));
    assert!(ok, "{rk}");
    let target = addr(&r);
    let deadline = Instant::now() + Duration::from_secs(40);
    while let Err(e) = netns::ping(&k, &target) {
        assert!(
            Instant::now() < deadline,
            "the kernel pod never reached the DPDK pod at {target}: {e}"
        );
        app.poke();
        std::thread::sleep(Duration::from_millis(300));
    }
    let shown = lab.ctl(&["port", "list"]);
    assert!(shown.contains("vhost"), "{shown}");
    let (ok, c) = lab.cni("CHECK", container, &dp_path, "net1", &conf);
    assert!(ok, "{c}");

    // DEL: the hand-off files and the device-info file go; the kernel pod's port stays.
    assert!(lab.cni("DEL", container, &dp_path, "net1", &conf).0);
    assert!(!vhost_dir.join("ctr-dpdk-012").exists(), "the pod's vhost directory is removed");
    assert!(!devinfo.exists(), "the device-info file is removed");
    assert!(lab.cni("DEL", container, "", "net1", &conf).0, "DEL again");
    drop(app);
    assert!(lab.cni("DEL", "ctr-kernel", &k_path, "eth0", &lab.conf("1.1.0", "media")).0);
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(!ports.contains("ctr-"), "{ports}");
    drop((dp, k));
}

#[test]
fn one_standalone_add_attaches_every_plane_the_pod_asks_for() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    for (n, net) in [("alpha", "10.64.1.0/24"), ("beta", "10.64.2.0/24"), ("gamma", "10.64.3.0/24")]
    {
        assert!(lab.mctl(&["network", "create", n, "--ipv4", net]).status.success());
    }
    // Multus's JSON form, as the runtime passes the pod's annotations.
    let mut conf = lab.conf("1.1.0", "alpha");
    conf["standalone"] = true.into();
    let mut with_multus = conf.clone();
    with_multus["runtimeConfig"] = json!({ "io.kubernetes.cri.pod-annotations": {
        "k8s.v1.cni.cncf.io/networks": r#"[{"name":"beta","interface":"b0","ips":["10.64.2.9/24"],"mac":"02:00:00:00:72:50"},{"name":"ns1/gamma"}]"#
    }});
    let (p1, p1_path) = pod("s1");
    let (ok, r) = lab.cni("ADD", "ctr-s1", &p1_path, "eth0", &with_multus);
    assert!(ok, "{r}");
    let names: Vec<&str> = r["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i.get("sandbox").is_some())
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["eth0", "b0", "net2"], "{r}");
    for ip in r["ips"].as_array().unwrap() {
        let i = ip["interface"].as_u64().unwrap() as usize;
        let iface = r["interfaces"][i]["name"].as_str().unwrap();
        let shown = p1.run(&["ip", "-o", "addr", "show", "dev", iface]).unwrap();
        assert!(shown.contains(ip["address"].as_str().unwrap()), "{iface}: {shown}");
    }
    assert!(p1.run(&["ip", "-o", "addr", "show", "dev", "b0"]).unwrap().contains("10.64.2.9/24"));
    assert!(lab.cni("CHECK", "ctr-s1", &p1_path, "eth0", &with_multus).0);
    // The requested MAC is the pod's and the manager's (which pushes it to other nodes);
    // it was only the pod's: the manager kept the derived one.
    assert!(p1.run(&["ip", "link", "show", "b0"]).unwrap().contains("02:00:00:00:72:50"));
    let shown: serde_json::Value =
        serde_json::from_slice(&lab.mctl(&["-o", "json", "port", "show", "ctr-s1", "b0"]).stdout)
            .unwrap();
    assert_eq!(shown["mac"], "02:00:00:00:72:50", "{shown}");
    let mut same_mac = conf.clone();
    same_mac["runtimeConfig"] = json!({ "io.kubernetes.cri.pod-annotations": {
        "k8s.v1.cni.cncf.io/networks": r#"[{"name":"beta","interface":"b0","mac":"02:00:00:00:72:50"}]"#
    }});
    let (_p5, p5_path) = pod("s5");
    let (ok, e) = lab.cni("ADD", "ctr-s5", &p5_path, "eth0", &same_mac);
    assert!(
        !ok && e["msg"]
            .as_str()
            .unwrap()
            .contains("MAC 02:00:00:00:72:50 is already port ctr-s1/b0's"),
        "{e}"
    );

    // Knitter's form in args.cni.networks: it names eth0's network too.
    let mut with_knitter = conf.clone();
    with_knitter["args"] = json!({ "cni": { "networks": { "ports": [
        { "attach_to_network": "gamma", "attributes": { "nic_name": "eth0", "function": "std" } },
        { "attach_to_network": "beta", "attributes": { "nic_name": "ctl0", "function": "control" } }
    ]}}});
    let (p2, p2_path) = pod("s2");
    let (ok, r2) = lab.cni("ADD", "ctr-s2", &p2_path, "eth0", &with_knitter);
    assert!(ok, "{r2}");
    assert!(
        r2["ips"][0]["address"].as_str().unwrap().starts_with("10.64.3."),
        "eth0 is on gamma: {r2}"
    );
    netns::ping(&p2, "10.64.2.9").expect("the pods meet on beta");

    // CNI_ARGS NETWORKS= (the comma string) without Kubernetes.
    let (p3, p3_path) = pod("s3");
    let (ok, r3) = lab::cni_args(
        "ADD",
        "ctr-s3",
        &p3_path,
        "eth0",
        &conf.to_string(),
        "IgnoreUnknown=1;NETWORKS=beta@x1",
    );
    assert!(ok, "{r3}");
    assert!(p3.run(&["ip", "link", "show", "x1"]).is_ok());

    // A plane that cannot be made undoes the whole ADD; names used twice are refused.
    let (p4, p4_path) = pod("s4");
    let (ok, e) = lab::cni_args(
        "ADD",
        "ctr-s4",
        &p4_path,
        "eth0",
        &conf.to_string(),
        "IgnoreUnknown=1;NETWORKS=beta,nope",
    );
    assert!(!ok && e["msg"].as_str().unwrap().contains("net2 (network nope)"), "{e}");
    assert!(p4.run(&["ip", "link", "show", "eth0"]).is_err(), "eth0 was undone");
    let (ok, e) = lab::cni_args(
        "ADD",
        "ctr-s4",
        &p4_path,
        "eth0",
        &conf.to_string(),
        "IgnoreUnknown=1;NETWORKS=beta@eth1,gamma@eth1",
    );
    assert!(!ok && e["code"] == 7, "{e}");

    // DEL removes every interface the ADD made.
    for (c, path) in [("ctr-s1", &p1_path), ("ctr-s2", &p2_path), ("ctr-s3", &p3_path)] {
        assert!(lab.cni("DEL", c, path, "eth0", &conf).0);
    }
    assert_eq!(p1.run(&["ip", "-o", "link"]).unwrap().lines().count(), 1, "only lo is left");
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(!ports.contains("ctr-"), "{ports}");
    drop((p2, p3, p4));
}

/// Multus's `default-route` on a secondary plane moves the pod's default route there, and
/// only there, with and without `defaultRoute` in the configuration (it failed with "File
/// exists": eth0 had installed its own default first). Asked on two planes: refused.
#[test]
fn default_route_on_a_secondary_plane_moves_the_default_route() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    for (n, cidr, gw) in [
        ("dra", "10.65.1.0/24", "10.65.1.1"),
        ("drb", "10.65.2.0/24", "10.65.2.1"),
        ("drc", "10.65.3.0/24", "10.65.3.1"),
    ] {
        assert!(
            lab.mctl(&["network", "create", n, "--ipv4", cidr, "--gateway4", gw]).status.success()
        );
    }
    let conf_with = |default_route: Option<bool>, networks: &str| {
        let mut conf = lab.conf("1.1.0", "dra");
        conf["standalone"] = true.into();
        if let Some(d) = default_route {
            conf["defaultRoute"] = d.into();
        }
        conf["runtimeConfig"] = json!({ "io.kubernetes.cri.pod-annotations": { "k8s.v1.cni.cncf.io/networks": networks } });
        conf
    };
    let media = r#"[{"name":"drb","interface":"media0","default-route":["10.65.2.1"]}]"#;
    for (i, explicit) in [None, Some(true)].into_iter().enumerate() {
        let conf = conf_with(explicit, media);
        let (p, path) = pod(&format!("dr{i}"));
        let (ok, r) = lab.cni("ADD", &format!("ctr-dr{i}"), &path, "eth0", &conf);
        assert!(ok, "defaultRoute {explicit:?}: {r}");
        let routes = p.run(&["ip", "-4", "route", "show", "default"]).unwrap();
        assert_eq!(routes.trim(), "default via 10.65.2.1 dev media0", "defaultRoute {explicit:?}");
        assert!(lab.cni("DEL", &format!("ctr-dr{i}"), &path, "eth0", &conf).0);
    }
    let both = r#"[{"name":"drb","interface":"media0","default-route":["10.65.2.1"]},{"name":"drc","interface":"oam0","default-route":["10.65.3.1"]}]"#;
    let (_p, path) = pod("dr9");
    let (ok, e) = lab.cni("ADD", "ctr-dr9", &path, "eth0", &conf_with(None, both));
    assert!(!ok && e["code"] == 7 && e["msg"].as_str().unwrap().contains("media0 and oam0"), "{e}");
}

#[test]
fn an_ip_group_pod_keeps_its_address_across_delete_and_recreate() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start();
    assert!(lab.mctl(&["network", "create", "grp", "--ipv4", "10.65.0.0/24"]).status.success());
    assert!(lab.mctl(&["ipgroup", "create", "grp", "g1", "--size", "3"]).status.success());
    let mut conf = lab.conf("1.1.0", "grp");
    conf["ipGroup"] = "g1".into();
    let add = |container: &str, pod_name: &str| {
        let (ns, path) = pod("g");
        let (ok, r) = lab::cni_args(
            "ADD",
            container,
            &path,
            "eth0",
            &conf.to_string(),
            &format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME={pod_name};K8S_POD_UID=uid-{container}"
            ),
        );
        assert!(ok, "{r}");
        (ns, path, addr(&r))
    };
    let (n0, p0, ip0) = add("c-web0-a", "web-0");
    // The pod's UID reaches the manager's port (its Kubernetes controller releases by it).
    let shown = lab.mctl(&["-o", "json", "port", "show", "c-web0-a", "eth0"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("\"pod_uid\": \"uid-c-web0-a\"")
            || shown.contains("\"pod_uid\":\"uid-c-web0-a\""),
        "{shown}"
    );
    let (n1, p1, ip1) = add("c-web1-a", "web-1");
    assert_ne!(ip0, ip1);
    // Both pods restart at once: deleted, then created again in the other order with new
    // containers.
    assert!(lab.cni("DEL", "c-web0-a", &p0, "eth0", &conf).0);
    assert!(lab.cni("DEL", "c-web1-a", &p1, "eth0", &conf).0);
    drop((n0, n1));
    let (_m1, _, again1) = add("c-web1-b", "web-1");
    let (_m0, _, again0) = add("c-web0-b", "web-0");
    assert_eq!((again0, again1), (ip0, ip1), "each pod got its own address back");
}

/// The count of drop `reason` in `knitterctl stats`' drop table (node, reason, count).
fn drop_count(stats: &str, reason: &str) -> Option<u64> {
    stats
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|t| t.len() == 3 && t[1] == reason)
        .and_then(|t| t[2].parse().ok())
}

/// SR-IOV VFs as pods' interfaces, with veth ends standing in for two kernel VFs of a PF
/// `pf0` (their peers in a Linux bridge: the NIC's own switch) and a third VF bound to
/// vfio-pci, all presented as VFs by a fake sysfs tree (`[sriov] sysfs`; no hardware here
/// has SR-IOV, and the PF's rtnetlink settings are off — `pf_settings = false` — because the
/// stand-in PF has none; knitter-vswitchd's vf.rs tests check what is asked of a PF). A
/// VF picked by the node and one named by `deviceID` (as Multus passes the device plugin's
/// allocation) go into their pods with the manager's MAC and address and ping each other;
/// the vfio-pci one stays on the node and the result and device-info give its PCI address;
/// exhaustion, a VF held by another pod and a VXLAN network are refused with reasons; DEL
/// gives each VF back under its own name and MAC; 200 ADD/DEL leave nothing behind.
#[test]
fn sriov_vfs_go_into_pods_and_come_back() {
    let Some(_g) = netns::exclusive() else { return };
    let lab = Lab::start_configured(|node, dir| {
        let sys = dir.join("sys");
        let (kernel, vfio) = (
            |n| FakeVf { netdev: Some(n), driver: Some("iavf") },
            FakeVf { netdev: None, driver: Some("vfio-pci") },
        );
        fake_pf(&sys, "pf0", &[kernel("pf0v0"), kernel("pf0v1"), vfio]);
        node.run(&["ip", "link", "add", "nic0", "type", "bridge"]).unwrap();
        node.run(&["ip", "link", "set", "nic0", "up"]).unwrap();
        for (i, mac) in [(0, "02:00:00:00:0f:00"), (1, "02:00:00:00:0f:01")] {
            node.run(&[
                "ip",
                "link",
                "add",
                &format!("pf0v{i}"),
                "address",
                mac,
                "type",
                "veth",
                "peer",
                "name",
                &format!("wire{i}"),
            ])
            .unwrap();
            node.run(&["ip", "link", "set", &format!("wire{i}"), "master", "nic0", "up"]).unwrap();
        }
        format!(
            "[sriov]\nsysfs = \"{}\"\npfs = [\"pf0\"]\npf_settings = false\n[sriov.pools]\nfast = [\"pf0\"]\n",
            sys.display()
        )
    });
    assert!(
        lab.mctl(&["network", "create", "sr", "--kind", "vlan", "--ipv4", "10.63.0.0/24"])
            .status
            .success()
    );
    assert!(lab.mctl(&["network", "create", "vx", "--ipv4", "10.64.0.0/24"]).status.success());
    let sriov = |net: &str| {
        let mut c = lab.conf("1.1.0", net);
        c["interfaceType"] = "sriov".into();
        c
    };

    // A VF the node picks (the first free one of pf0), and the one the device plugin named.
    let (a, a_path) = pod("sa");
    let (ok, ra) = lab.cni("ADD", "ctr-sa", &a_path, "eth0", &sriov("sr"));
    assert!(ok, "{ra}");
    assert_eq!(
        ra["interfaces"].as_array().map(Vec::len),
        Some(1),
        "one interface, no node end: {ra}"
    );
    assert_eq!(
        (ra["interfaces"][0]["name"].as_str(), ra["interfaces"][0]["pciID"].as_str()),
        (Some("eth0"), Some("0000:01:00.1")),
        "{ra}"
    );
    assert_eq!(ra["interfaces"][0]["sandbox"], a_path.as_str());
    let shown = a.run(&["ip", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(
        shown.contains(&addr(&ra)) && shown.contains(ra["interfaces"][0]["mac"].as_str().unwrap()),
        "{shown}"
    );
    assert!(lab.node.run(&["ip", "link", "show", "pf0v0"]).is_err(), "the VF left the node");
    let mut named = lab.conf("1.1.0", "sr");
    named["deviceID"] = "0000:01:00.2".into();
    let (_b, b_path) = pod("sb");
    let (ok, rb) = lab.cni("ADD", "ctr-sb", &b_path, "net1", &named);
    assert!(ok, "{rb}");
    assert_eq!(rb["interfaces"][0]["pciID"], "0000:01:00.2");
    netns::ping(&a, &addr(&rb)).expect("pods on two VFs ping through the NIC's switch");
    assert!(!lab.ctl(&["port", "list"]).contains("attach"), "a VF has no switch port");
    let listed = lab.ctl(&["vf", "list"]);
    assert!(listed.contains("pf0 (0000:01:00.0): 3 VFs of 4 possible, 2 attached"), "{listed}");
    assert!(
        listed
            .lines()
            .any(|l| l.contains("0000:01:00.2") && l.contains("iavf") && l.contains("ctr-sb/net1")),
        "{listed}"
    );
    let (ok, r) = lab.cni("CHECK", "ctr-sa", &a_path, "eth0", &sriov("sr"));
    assert!(ok, "{r}");

    // The VF bound to vfio-pci, for a DPDK app: nothing moves; its PCI address is handed over.
    let (c, c_path) = pod("sc");
    let info = lab.dir.path().join("devinfo/sc.json");
    let mut dpdk = lab.conf("1.1.0", "sr");
    dpdk["runtimeConfig"] = json!({ "deviceID": "0000:01:00.3", "CNIDeviceInfoFile": info });
    let (ok, rc) = lab.cni("ADD", "ctr-sc", &c_path, "net1", &dpdk);
    assert!(ok, "{rc}");
    assert_eq!(rc["interfaces"][0]["pciID"], "0000:01:00.3");
    assert_eq!(
        c.run(&["ip", "-o", "link"]).unwrap().lines().count(),
        1,
        "nothing went into the DPDK pod's namespace"
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
    assert_eq!(
        written,
        json!({ "type": "pci", "version": "1.1.0", "pci": { "pci-address": "0000:01:00.3", "pf-pci-address": "0000:01:00.0" } })
    );

    // Refusals, each with its reason.
    let (_d, d_path) = pod("sd");
    let (ok, r) = lab.cni("ADD", "ctr-sd", &d_path, "eth0", &sriov("sr"));
    assert!(
        !ok && r["msg"]
            .as_str()
            .unwrap_or("")
            .contains("no free VF on pf0: 2 of 2 usable VFs are held"),
        "{r}"
    );
    let (ok, r) = lab.cni("ADD", "ctr-sd", &d_path, "eth0", &named);
    assert!(
        !ok && r["msg"]
            .as_str()
            .unwrap_or("")
            .contains("VF 0000:01:00.2 is attached to ctr-sb/net1"),
        "{r}"
    );
    let (ok, r) = lab.cni("ADD", "ctr-sd", &d_path, "eth0", &sriov("vx"));
    assert!(!ok && r["msg"].as_str().unwrap_or("").contains("reaches only VLAN networks"), "{r}");
    let ports = String::from_utf8_lossy(&lab.mctl(&["port", "list"]).stdout).into_owned();
    assert!(!ports.contains("ctr-sd"), "a refused ADD releases its port: {ports}");

    // DEL gives the VFs back under their own names and MACs, down.
    for (ctr, path, ifname, conf) in [
        ("ctr-sa", &a_path, "eth0", sriov("sr")),
        ("ctr-sb", &b_path, "net1", named.clone()),
        ("ctr-sc", &c_path, "net1", dpdk.clone()),
    ] {
        let (ok, r) = lab.cni("DEL", ctr, path, ifname, &conf);
        assert!(ok, "{ctr}: {r}");
        assert!(lab.cni("DEL", ctr, path, ifname, &conf).0, "{ctr}: DEL twice");
    }
    for (vf, mac) in [("pf0v0", "02:00:00:00:0f:00"), ("pf0v1", "02:00:00:00:0f:01")] {
        let shown = lab.node.run(&["ip", "link", "show", vf]).unwrap();
        assert!(
            shown.contains(mac) && shown.contains("state DOWN"),
            "{vf} back on the node: {shown}"
        );
    }
    assert_eq!(
        a.run(&["ip", "-o", "link"]).unwrap().lines().count(),
        1,
        "only lo is left in pod a"
    );
    assert!(!info.exists(), "DEL removed the device-info file");

    // A network backed by a named pool of the node's PFs; one naming a pool the node lacks;
    // a pool on a VXLAN network is refused by the manager.
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "srp",
            "--kind",
            "vlan",
            "--ipv4",
            "10.65.0.0/24",
            "--sriov-pool",
            "fast"
        ])
        .status
        .success()
    );
    assert!(
        lab.mctl(&[
            "network",
            "create",
            "srx",
            "--kind",
            "vlan",
            "--ipv4",
            "10.66.0.0/24",
            "--sriov-pool",
            "slow"
        ])
        .status
        .success()
    );
    let o =
        lab.mctl(&["network", "create", "srv", "--ipv4", "10.67.0.0/24", "--sriov-pool", "fast"]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("VLAN networks only"),
        "{o:?}"
    );
    let (ok, r) = lab.cni("ADD", "ctr-sd", &d_path, "eth0", &sriov("srp"));
    assert!(ok && r["interfaces"][0]["pciID"] == "0000:01:00.1", "{r}");
    assert!(lab.cni("DEL", "ctr-sd", &d_path, "eth0", &sriov("srp")).0);
    let (ok, r) = lab.cni("ADD", "ctr-sd", &d_path, "eth0", &sriov("srx"));
    assert!(
        !ok && r["msg"]
            .as_str()
            .unwrap_or("")
            .contains("SR-IOV pool \"slow\" is not on this node ([sriov.pools] has fast)"),
        "{r}"
    );

    // Knitter's own annotation (`nic_type: direct`), standalone, then 200 ADD/DEL.
    let mut standalone = lab.conf("1.1.0", "sr");
    standalone["standalone"] = true.into();
    standalone["args"] = json!({ "cni": { "networks": { "ports": [{ "attach_to_network": "sr", "attributes": { "nic_type": "direct", "nic_name": "eth0" } }] } } });
    for i in 0..200 {
        let (ok, r) = lab.cni("ADD", "ctr-churn", &d_path, "eth0", &standalone);
        assert!(ok, "ADD {i}: {r}");
        assert_eq!(r["interfaces"][0]["pciID"], "0000:01:00.1", "{r}");
        assert!(lab.cni("DEL", "ctr-churn", &d_path, "eth0", &standalone).0, "DEL {i}");
    }
    assert!(
        lab.node.run(&["ip", "link", "show", "pf0v0"]).unwrap().contains("02:00:00:00:0f:00"),
        "the VF is back after the churn"
    );
    let ports =
        String::from_utf8_lossy(&lab.mctl(&["-o", "json", "port", "list"]).stdout).into_owned();
    assert_eq!(ports.trim(), "[]", "a port is left on the manager");
}

/// What a probe on `addr` answers (status line's code and body), asked from inside `ns`.
fn probe_in(ns: &netns::Netns, addr: &str, path: &str) -> Option<(u16, String)> {
    let out = ns
        .run(&[
            "curl",
            "-s",
            "-m",
            "2",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            &format!("http://{addr}{path}"),
        ])
        .ok()?;
    let (body, code) = out.trim_end().rsplit_once('\n')?;
    Some((code.parse().ok()?, body.to_string()))
}

/// A node whose bootstrap token the manager refuses is healthy (the kubelet must not
/// restart it: it forwards on its state) but not ready, so a DaemonSet rollout with a bad
/// token stops at the first node instead of rolling over every one.
#[test]
fn serial_a_node_the_manager_refuses_is_alive_but_not_ready() {
    let lab = Lab::start();
    std::fs::write(lab.dir.path().join("wrong-bootstrap"), "not-the-bootstrap-token").unwrap();
    let metrics = format!("127.0.0.1:{}", lab::free_port());
    let child = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.node.name])
        .arg(lab::bin("knitter-vswitchd"))
        .arg("--socket")
        .arg(lab.dir.path().join("refused.sock"))
        .args([
            "--no-state",
            "--no-hugepages",
            "--buffers",
            "4096",
            "--idle",
            "adaptive",
            "--metrics-listen",
            &metrics,
        ])
        .args(["--manager", &lab.grpc, "--node-name", "refused", "--manager-bootstrap-token-file"])
        .arg(lab.dir.path().join("wrong-bootstrap"))
        .arg("--manager-credential-file")
        .arg(lab.dir.path().join("refused-token"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _refused = lab::Proc::from(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        match probe_in(&lab.node, &metrics, "/readyz") {
            Some((503, body)) => break body,
            other => assert!(Instant::now() < deadline, "not refused within 20 s: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        ready.contains("refuses this node's credential") && ready.contains("Unauthenticated"),
        "{ready}"
    );
    assert_eq!(
        probe_in(&lab.node, &metrics, "/healthz").map(|(c, _)| c),
        Some(200),
        "alive all the same"
    );
}

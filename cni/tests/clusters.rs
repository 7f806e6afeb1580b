//! Pods in two Kubernetes clusters on one manager's network (issue 52), end to end: two node
//! namespaces joined by an underlay link, knitter-manager on the first, knitter-vswitchd on
//! each — the second registered in cluster `east` (`--cluster east`), added with
//! `knitterctl manager cluster add`, joined with east's own bootstrap token (`knitterctl
//! manager cluster token`) — and pods attached through knitter-cni on each node.
//! A network of every cluster carries ping and a TCP transfer across the clusters; a
//! network limited to the manager's own cluster refuses east's pod with a CNI error and
//! stays unreachable from east. East's kubeconfig names an apiserver that does not answer:
//! its controller keeps retrying and releases nothing, and its node forwards all the same.
//! In the `serial` nextest group by name (two daemons run PMD threads).

mod lab;

use lab::{Proc, addr, bin, cni_args, free_port, pod};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use vswitch::testkit::netns::{self, Netns};

/// A node namespace with its end of the underlay (`ul0`, address 198.51.100.`i`).
fn node(i: u8) -> Netns {
    let ns = Netns::new(&format!("mc{i}")).unwrap();
    ns.run(&["ip", "link", "set", "lo", "up"]).unwrap();
    ns
}

/// knitter-vswitchd on `ns` as node `name`, joining with the bootstrap token in `bootstrap`
/// (in `dir`), in `cluster` (`None`: the manager's own).
fn switch(
    ns: &Netns,
    dir: &Path,
    name: &str,
    grpc: &str,
    bootstrap: &str,
    cluster: Option<&str>,
) -> Proc {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns.name])
        .arg(bin("knitter-vswitchd"))
        .arg("--socket")
        .arg(dir.join(format!("{name}.sock")))
        .args(["--no-state", "--no-metrics", "--no-hugepages", "--buffers", "4096"])
        .args(["--idle", "adaptive", "--manager", grpc, "--node-name", name])
        .arg("--manager-bootstrap-token-file")
        .arg(dir.join(bootstrap))
        .arg("--manager-credential-file")
        .arg(dir.join(format!("{name}-token")))
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    if let Some(cluster) = cluster {
        c.args(["--cluster", cluster]);
    }
    Proc::from(c.spawn().unwrap())
}

/// `knitterctl` with `args`, inside `ns`; (success, stdout, stderr).
fn knitterctl(ns: &Netns, args: &[&str]) -> (bool, String, String) {
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(bin("knitterctl"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.success(), text(&o.stdout), text(&o.stderr))
}

fn until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `bytes` bytes over TCP from `client` to `to`:9090 in `server`; what arrived.
fn tcp_transfer(server: &Netns, client: &Netns, to: &str, bytes: usize) -> usize {
    let listen = "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 9090)); s.listen(1); s.settimeout(20); c, _ = s.accept(); c.settimeout(20); n = 0\nwhile True:\n    b = c.recv(65536)\n    if not b: break\n    n += len(b)\nprint(n)";
    let send = format!(
        "import socket, time\nfor _ in range(100):\n    try:\n        c = socket.create_connection(('{to}', 9090), timeout=2); break\n    except OSError: time.sleep(0.1)\nc.settimeout(20); c.sendall(b'k' * {bytes}); c.close()"
    );
    let got = std::thread::scope(|sc| {
        let h = sc.spawn(|| server.run(&["python3", "-c", listen]));
        client.run(&["python3", "-c", &send]).unwrap();
        h.join().unwrap()
    });
    got.unwrap().trim().parse().unwrap_or(0)
}

#[test]
fn serial_pods_in_two_clusters_share_a_network_and_not_a_limited_one() {
    let Some(_g) = netns::exclusive() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2) = (node(1), node(2));
    let (ul1, ul2) = (format!("{}u", n1.name), format!("{}u", n2.name));
    netns::run(&["ip", "link", "add", &ul1, "type", "veth", "peer", "name", &ul2]).unwrap();
    for (ns, ul, i) in [(&n1, &ul1, 1), (&n2, &ul2, 2)] {
        netns::run(&["ip", "link", "set", ul, "netns", &ns.name]).unwrap();
        ns.run(&["ip", "link", "set", ul, "name", "ul0"]).unwrap();
        ns.run(&["ip", "link", "set", "ul0", "up"]).unwrap();
        ns.run(&["ip", "addr", "add", &format!("198.51.100.{i}/24"), "dev", "ul0"]).unwrap();
    }

    // The manager on node 1, reached by both nodes over the underlay.
    let data = dir.path().join("m");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("token"), "mc-admin-token").unwrap();
    std::fs::write(data.join("bootstrap"), "mc-bootstrap").unwrap();
    let grpc = format!("198.51.100.1:{}", free_port());
    let _manager = Proc::from(
        Command::new("ip")
            .args(["netns", "exec", &n1.name])
            .arg(bin("knitter-manager"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", &format!("198.51.100.1:{}", free_port()), "--grpc-listen", &grpc])
            .arg("--bootstrap-token-file")
            .arg(data.join("bootstrap"))
            .stderr(std::fs::File::create(data.join("stderr.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let token = data.join("token").display().to_string();
    let mctl = |args: &[&str]| {
        let all = [&["--manager", grpc.as_str(), "--token-file", token.as_str(), "manager"], args]
            .concat();
        knitterctl(&n1, &all)
    };
    until("the manager serves", Duration::from_secs(20), || mctl(&["tenant", "list"]).0);
    // East's apiserver does not answer: its controller retries, releasing nothing.
    let kubeconfig = dir.path().join("east.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster: {server: \"http://127.0.0.1:9\"}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: east\n  context: {cluster: east, user: u}\ncurrent-context: east\n",
    )
    .unwrap();
    let (ok, _, err) =
        mctl(&["cluster", "add", "east", "--kubeconfig", kubeconfig.to_str().unwrap()]);
    assert!(ok, "{err}");
    // East's nodes join with east's own bootstrap token, which binds them to east.
    let (ok, token, err) = mctl(&["cluster", "token", "east"]);
    assert!(ok, "{err}");
    std::fs::write(dir.path().join("east-bootstrap"), token.trim()).unwrap();

    let _switches = [
        switch(&n1, dir.path(), "n1", &grpc, "m/bootstrap", None),
        switch(&n2, dir.path(), "n2", &grpc, "east-bootstrap", Some("east")),
    ];
    for (ns, name, vtep) in [(&n1, "n1", "198.51.100.11"), (&n2, "n2", "198.51.100.12")] {
        let socket = dir.path().join(format!("{name}.sock")).display().to_string();
        let ctl = |args: &[&str]| {
            let (ok, out, err) = knitterctl(ns, &[&["--socket", socket.as_str()], args].concat());
            assert!(ok, "knitterctl {args:?} on {name}: {err}");
            out
        };
        until("the switch serves", Duration::from_secs(20), || {
            knitterctl(ns, &["--socket", &socket, "node", "show"]).0
        });
        ctl(&["port", "add", "ul0", "--af-packet", "ul0", "--underlay"]);
        ctl(&["vtep", "set", "--local", vtep, "--underlay", "ul0"]);
    }
    until("both nodes registered, n2 in east", Duration::from_secs(20), || {
        let (_, out, _) = mctl(&["-o", "json", "node", "list"]);
        let nodes: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let cluster = |n: &str| {
            nodes.as_array().and_then(|a| {
                a.iter().find(|x| x["name"] == n).map(|x| x["cluster"].as_str().unwrap_or(""))
            })
        };
        cluster("n1") == Some("") && cluster("n2") == Some("east")
    });

    let created = |args: &[&str]| {
        let (ok, _, err) = mctl(args);
        assert!(ok, "{args:?}: {err}");
    };
    created(&["network", "create", "wide", "--segment", "5101", "--ipv4", "10.71.0.0/24"]);
    let limited = ["network", "create", "own-only", "--segment", "5102", "--ipv4", "10.72.0.0/24"];
    created(&[&limited[..], &["--clusters", "local"]].concat());

    // Pods through the CNI on each node, the same pod name in both clusters.
    let attach = |node: &str, container: &str, netns: &str, network: &str| {
        let socket = dir.path().join(format!("{node}.sock"));
        let conf = json!({ "cniVersion": "1.1.0", "name": "knitter", "type": "knitter-cni", "network": network, "socket": socket });
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME=web";
        cni_args("ADD", container, netns, "eth0", &conf.to_string(), args)
    };
    let (a, a_path) = pod("mca");
    let (b, b_path) = pod("mcb");
    let (c, c_path) = pod("mcc");
    let (ok, ra) = attach("n1", "ctr-mca", &a_path, "wide");
    assert!(ok, "{ra}");
    let (ok, rb) = attach("n2", "ctr-mcb", &b_path, "wide");
    assert!(ok, "{rb}");
    let (ok, rc) = attach("n1", "ctr-mcc", &c_path, "own-only");
    assert!(ok, "{rc}");
    let (b2, b2_path) = pod("mcb2");
    let (ok, refused) = attach("n2", "ctr-mcb2", &b2_path, "own-only");
    let msg = refused["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && msg.contains(
            "network \"own-only\" spans clusters [\"local\"]; node \"n2\" is in cluster \"east\""
        ),
        "{refused}"
    );

    // Across the clusters on the shared network: ping both ways and a TCP transfer.
    let (ip_a, ip_b, ip_c) = (addr(&ra), addr(&rb), addr(&rc));
    let ping = |from: &Netns, to: &str| from.run(&["ping", "-c", "2", "-W", "2", to]).is_ok();
    until("a reaches b across the clusters", Duration::from_secs(20), || ping(&a, &ip_b));
    assert!(ping(&b, &ip_a), "b reaches a");
    let sent = 4 << 20;
    assert_eq!(tcp_transfer(&a, &b, &ip_a, sent), sent, "a TCP transfer from east to local");
    // East reaches nothing of the network limited to the manager's own cluster, even
    // sending for its addresses straight onto its own segment.
    b.run(&["ip", "route", "add", "10.72.0.0/24", "dev", "eth0"]).unwrap();
    assert!(!ping(&b, &ip_c), "east's pod reached the local-only network");
    assert!(ping(&a, &ip_a) && ping(&c, &ip_c));

    // The ports say their cluster; east's controller runs and has released nothing.
    let (_, out, _) = mctl(&["-o", "json", "port", "list"]);
    let ports: Value = serde_json::from_str(&out).unwrap();
    let clusters: Vec<(String, String)> = ports
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["container"].as_str().unwrap_or("").into(),
                p["cluster"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert!(clusters.contains(&("ctr-mcb".into(), "east".into())), "{clusters:?}");
    assert!(clusters.contains(&("ctr-mca".into(), String::new())), "{clusters:?}");
    let (_, out, _) = mctl(&["-o", "json", "cluster", "show", "east"]);
    let east: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((east["nodes"].as_u64(), east["ports"].as_u64()), (Some(1), Some(1)), "{east}");
    assert_eq!(east["controller"]["released_ports"].as_u64().unwrap_or(0), 0, "{east}");
    drop((a, b, b2, c));
}

//! Pods in two Kubernetes clusters on one manager's network (issue 52), end to end: four
//! node namespaces, two in each cluster, each cluster's on a segment of its own and the two
//! segments routed by a router namespace (the VTEPs on the nodes' own addresses, their next
//! hops the kernel's: the routed underlay between clusters); an API server stand-in for each
//! cluster (`examples/apiserver.rs`, the member's held to `overlays/member`'s RBAC) with the
//! nodes and their pods; knitter-manager with its controller on the own cluster's stand-in,
//! east added with `knitterctl manager cluster add`; knitter-vswitchd on each node, east's
//! registered in east (`--cluster east`) with east's own bootstrap token; pods attached
//! through knitter-cni.
//!
//! A network of every cluster carries ping and TCP transfers across the clusters; a network
//! limited to the manager's own cluster refuses east's pod with a CNI error and stays
//! unreachable from east; east's stand-in stopped for a while releases nothing and its nodes
//! forward all the same; a pod deleted in east releases its own port only, not the port of
//! the pod of the same name in the own cluster. In the `serial` nextest group by name (four
//! daemons run PMD threads).

mod lab;

use lab::{Proc, addr, bin, cni_args, free_port, pod};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use vswitch::testkit::netns::{self, Netns};

/// The own cluster's underlay segment and east's, each with the router at `.254`.
const SEGMENTS: [(&str, &str); 2] = [("local", "198.51.100"), ("east", "203.0.113")];

/// Node `i` of the segment `net` (`SEGMENTS`): a namespace whose `ul0` has address
/// `net.i`, on the router's bridge `bridge`, its default route through the router.
fn node(router: &Netns, i: u8, net: &str, bridge: &str) -> Netns {
    let ns = Netns::new(&format!("mc{i}")).unwrap();
    let (inner, outer) = (format!("{}u", ns.name), format!("{}r", ns.name));
    netns::run(&["ip", "link", "add", &inner, "type", "veth", "peer", "name", &outer]).unwrap();
    netns::run(&["ip", "link", "set", &inner, "netns", &ns.name]).unwrap();
    netns::run(&["ip", "link", "set", &outer, "netns", &router.name]).unwrap();
    router.run(&["ip", "link", "set", &outer, "master", bridge, "up"]).unwrap();
    ns.run(&["ip", "link", "set", &inner, "name", "ul0"]).unwrap();
    ns.run(&["ip", "link", "set", "ul0", "up"]).unwrap();
    ns.run(&["ip", "addr", "add", &format!("{net}.{i}/24"), "dev", "ul0"]).unwrap();
    ns.run(&["ip", "route", "add", "default", "via", &format!("{net}.254")]).unwrap();
    ns
}

/// The router between the two segments: a bridge for each, IPv4 forwarding on.
fn router() -> Netns {
    let r = Netns::new("mcr").unwrap();
    for (i, (_, net)) in SEGMENTS.iter().enumerate() {
        let bridge = format!("br{i}");
        r.run(&["ip", "link", "add", &bridge, "type", "bridge"]).unwrap();
        r.run(&["ip", "addr", "add", &format!("{net}.254/24"), "dev", &bridge]).unwrap();
        r.run(&["ip", "link", "set", &bridge, "up"]).unwrap();
    }
    r.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]).unwrap();
    r
}

/// An API server stand-in in `ns` (`examples/apiserver.rs`) for cluster `name`, with
/// `args` (its nodes and pods); its kubeconfigs in `dir/name/`. Returns the process and the
/// admin's address.
fn stand_in(ns: &Netns, dir: &Path, name: &str, args: &[&str]) -> (Proc, String) {
    let examples = bin("knitter-cni").with_file_name("examples");
    let program = examples.join("apiserver");
    assert!(
        program.exists(),
        "{} is not built (cargo build -p knitter-manager --examples)",
        program.display()
    );
    let out = dir.join(name);
    let p = Proc::from(
        Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(&program)
            .arg("--kubeconfig-dir")
            .arg(&out)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}-apiserver.log"))).unwrap())
            .spawn()
            .unwrap(),
    );
    let admin = out.join("admin.kubeconfig");
    until("the stand-in serves", Duration::from_secs(20), || admin.exists());
    let text = std::fs::read_to_string(&admin).unwrap();
    // `server: "http://127.0.0.1:PORT"`, in flow or block style.
    let server = text
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split(['"', '}', ' ', '\n']).next())
        .expect("a server in the admin's kubeconfig")
        .to_string();
    (p, server)
}

/// Deletes a pod through the stand-in's admin address (`ns` is where it listens), as
/// `kubectl delete pod` does.
fn delete_pod(ns: &Netns, admin: &str, namespace: &str, name: &str) {
    let url = format!("http://{admin}/api/v1/namespaces/{namespace}/pods/{name}");
    let script = format!(
        "import urllib.request; urllib.request.urlopen(urllib.request.Request('{url}', method='DELETE'), timeout=10).read()"
    );
    ns.run(&["python3", "-c", &script]).unwrap();
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
    let r = router();
    // n1, n2 in the own cluster's segment; n3, n4 in east's.
    let nodes: Vec<(Netns, &str, String)> = [(1, 0), (2, 0), (3, 1), (4, 1)]
        .into_iter()
        .map(|(i, seg)| {
            let net = SEGMENTS[seg].1;
            (node(&r, i, net, &format!("br{seg}")), SEGMENTS[seg].0, format!("{net}.{i}"))
        })
        .collect();
    let n1 = &nodes[0].0;

    // Each cluster's apiserver: its nodes, a node agent's pod on each (what vouches for a
    // node's pods, as DaemonSets' do), the pods the test attaches — `apps/web` in both.
    let (_local_api, _) = stand_in(
        n1,
        dir.path(),
        "local",
        &[
            "--node",
            "n1",
            "--node",
            "n2",
            "--pod",
            "knitter/agent-n1@n1",
            "--pod",
            "knitter/agent-n2@n2",
            "--pod",
            "apps/web@n1",
            "--pod",
            "apps/db@n2",
        ],
    );
    let (east_api, east_admin) = stand_in(
        n1,
        dir.path(),
        "east",
        &[
            "--member",
            "--node",
            "n3",
            "--node",
            "n4",
            "--pod",
            "knitter/agent-n3@n3",
            "--pod",
            "knitter/agent-n4@n4",
            "--pod",
            "apps/web@n3",
            "--pod",
            "apps/db@n4",
        ],
    );

    // The manager on node 1 with its controller on the own cluster, reached by every node
    // over the underlay (east's through the router).
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
            .arg("--kubernetes")
            .arg("--kubeconfig")
            .arg(dir.path().join("local/manager.kubeconfig"))
            .args(["--lease", "knitter/knitter-manager", "--identity", "m1", "--lease-secs", "3"])
            .stderr(std::fs::File::create(data.join("stderr.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let token = data.join("token").display().to_string();
    let mctl = |args: &[&str]| {
        let all = [&["--manager", grpc.as_str(), "--token-file", token.as_str(), "manager"], args]
            .concat();
        knitterctl(n1, &all)
    };
    until("the manager serves", Duration::from_secs(20), || mctl(&["tenant", "list"]).0);
    let kubeconfig = dir.path().join("east/manager.kubeconfig");
    let (ok, _, err) =
        mctl(&["cluster", "add", "east", "--kubeconfig", kubeconfig.to_str().unwrap()]);
    assert!(ok, "{err}");
    // East's nodes join with east's own bootstrap token, which binds them to east.
    let (ok, token, err) = mctl(&["cluster", "token", "east"]);
    assert!(ok, "{err}");
    std::fs::write(dir.path().join("east-bootstrap"), token.trim()).unwrap();

    let _switches: Vec<Proc> = nodes
        .iter()
        .enumerate()
        .map(|(i, (ns, cluster, _))| {
            let name = format!("n{}", i + 1);
            match *cluster {
                "east" => switch(ns, dir.path(), &name, &grpc, "east-bootstrap", Some("east")),
                _ => switch(ns, dir.path(), &name, &grpc, "m/bootstrap", None),
            }
        })
        .collect();
    for (i, (ns, _, vtep)) in nodes.iter().enumerate() {
        let name = format!("n{}", i + 1);
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
        // The node's own address: its kernel resolves the next hops, east's through the
        // router.
        ctl(&["vtep", "set", "--local", vtep, "--underlay", "ul0", "--shared"]);
    }
    until("the nodes registered, n3 and n4 in east", Duration::from_secs(20), || {
        let (_, out, _) = mctl(&["-o", "json", "node", "list"]);
        let nodes: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let cluster = |n: &str| {
            nodes.as_array().and_then(|a| {
                a.iter().find(|x| x["name"] == n).map(|x| x["cluster"].as_str().unwrap_or(""))
            })
        };
        [cluster("n1"), cluster("n2"), cluster("n3"), cluster("n4")]
            == [Some(""), Some(""), Some("east"), Some("east")]
    });

    let created = |args: &[&str]| {
        let (ok, _, err) = mctl(args);
        assert!(ok, "{args:?}: {err}");
    };
    created(&["network", "create", "wide", "--segment", "5101", "--ipv4", "10.71.0.0/24"]);
    let limited = ["network", "create", "own-only", "--segment", "5102", "--ipv4", "10.72.0.0/24"];
    created(&[&limited[..], &["--clusters", "local"]].concat());

    // Pods through the CNI on each node; `apps/web` in both clusters.
    let attach = |node: &str, container: &str, netns: &str, network: &str, pod: &str| {
        let socket = dir.path().join(format!("{node}.sock"));
        let conf = json!({ "cniVersion": "1.1.0", "name": "knitter", "type": "knitter-cni", "network": network, "socket": socket });
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME={pod}");
        cni_args("ADD", container, netns, "eth0", &conf.to_string(), &args)
    };
    let attached = |node: &str, tag: &str, network: &str, pod: &str| {
        let (ns, path) = lab::pod(tag);
        let (ok, result) = attach(node, &format!("ctr-{tag}"), &path, network, pod);
        assert!(ok, "{tag} on {node}: {result}");
        (ns, addr(&result))
    };
    let (a, ip_a) = attached("n1", "mca", "wide", "web");
    let (d, ip_d) = attached("n2", "mcd", "wide", "db");
    let (b, ip_b) = attached("n3", "mcb", "wide", "web");
    let (e, ip_e) = attached("n4", "mce", "wide", "db");
    let (c, ip_c) = attached("n1", "mcc", "own-only", "web");
    let (b2, b2_path) = pod("mcb2");
    let (ok, refused) = attach("n3", "ctr-mcb2", &b2_path, "own-only", "web");
    let msg = refused["msg"].as_str().unwrap_or_default();
    assert!(
        !ok && msg.contains(
            "network \"own-only\" spans clusters [\"local\"]; node \"n3\" is in cluster \"east\""
        ),
        "{refused}"
    );

    // Across the clusters on the shared network, every node with one in the other cluster.
    let ping = |from: &Netns, to: &str| from.run(&["ping", "-c", "2", "-W", "2", to]).is_ok();
    until("a reaches b across the clusters", Duration::from_secs(20), || ping(&a, &ip_b));
    until("d reaches e across the clusters", Duration::from_secs(20), || ping(&d, &ip_e));
    assert!(ping(&b, &ip_d) && ping(&e, &ip_a), "east reaches both local nodes");
    let sent = 4 << 20;
    assert_eq!(tcp_transfer(&a, &b, &ip_a, sent), sent, "a TCP transfer from n3 to n1");
    assert_eq!(tcp_transfer(&e, &d, &ip_e, sent), sent, "a TCP transfer from n2 to n4");
    // East reaches nothing of the network limited to the manager's own cluster, even
    // sending for its addresses straight onto its own segment.
    b.run(&["ip", "route", "add", "10.72.0.0/24", "dev", "eth0"]).unwrap();
    assert!(!ping(&b, &ip_c), "east's pod reached the local-only network");
    assert!(ping(&a, &ip_a) && ping(&c, &ip_c));

    // The ports say their cluster.
    let ports = || -> Vec<(String, String)> {
        let (_, out, _) = mctl(&["-o", "json", "port", "list"]);
        let ports: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let cell = |p: &Value, k: &str| p[k].as_str().unwrap_or("").to_string();
        let all = ports.as_array().cloned().unwrap_or_default();
        all.iter().map(|p| (cell(p, "container"), cell(p, "cluster"))).collect()
    };
    let mut want: Vec<(String, String)> = [
        ("ctr-mca", ""),
        ("ctr-mcb", "east"),
        ("ctr-mcc", ""),
        ("ctr-mcd", ""),
        ("ctr-mce", "east"),
    ]
    .iter()
    .map(|(c, k)| (c.to_string(), k.to_string()))
    .collect();
    let sorted = |mut v: Vec<(String, String)>| {
        v.sort();
        v
    };
    assert_eq!(sorted(ports()), want);

    // East's apiserver stopped (a hung or cut-off cluster): nothing released, its nodes
    // forward all the same.
    let east_pid = east_api.pid().to_string();
    netns::run(&["kill", "-STOP", &east_pid]).unwrap();
    std::thread::sleep(Duration::from_secs(8));
    assert!(ping(&e, &ip_a) && ping(&b, &ip_d), "east's nodes forward while its apiserver is away");
    assert_eq!(sorted(ports()), want, "nothing released while east's state is unknown");
    netns::run(&["kill", "-CONT", &east_pid]).unwrap();

    // A pod deleted in east releases its own port, not that of `apps/web` in the own cluster.
    delete_pod(n1, &east_admin, "apps", "web");
    want.retain(|(c, _)| c != "ctr-mcb");
    until("east's web released, local's kept", Duration::from_secs(30), || sorted(ports()) == want);
    let (_, out, _) = mctl(&["-o", "json", "cluster", "show", "east"]);
    let east: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((east["nodes"].as_u64(), east["ports"].as_u64()), (Some(2), Some(1)), "{east}");
    assert_eq!(east["controller"]["released_ports"].as_u64(), Some(1), "{east}");
    assert!(ping(&d, &ip_e), "the others still reach each other");
    drop((a, b, b2, c, d, e));
}

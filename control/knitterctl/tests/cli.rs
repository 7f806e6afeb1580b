//! knitterctl as an operator runs it, against a real knitter-vswitchd (the workspace's
//! build of it, next to knitterctl): tables, `-o json`, `apply -f`, refusals with the
//! daemon's reason and exit status 3, an unreachable daemon named plainly (status 4),
//! completions bash loads, man pages. In the
//! `serial` nextest group (the daemon starts a PMD thread).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn knitterctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_knitterctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "knitterctl failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn start(dir: &Path) -> (Daemon, PathBuf) {
    let daemon = Path::new(env!("CARGO_BIN_EXE_knitterctl")).with_file_name("knitter-vswitchd");
    assert!(daemon.exists(), "{} is not built (cargo build --workspace)", daemon.display());
    let socket = dir.join("api.sock");
    let child = Command::new(daemon)
        .arg("--socket")
        .arg(&socket)
        .args(["--no-state", "--no-metrics", "--no-hugepages", "--buffers", "4096"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !knitterctl(&socket, &["node", "show"]).status.success() {
        assert!(Instant::now() < deadline, "daemon not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    (d, socket)
}

#[test]
fn an_operator_session() {
    let dir = tempfile::tempdir().unwrap();
    let (_d, s) = start(dir.path());
    let vnf = dir.path().join("vnf0.sock");
    assert!(
        ok(knitterctl(&s, &["bridge", "add", "red", "--vni", "5001"]))
            .starts_with("ok (configuration generation")
    );
    ok(knitterctl(
        &s,
        &[
            "port",
            "add",
            "vnf0",
            "--vhost-user",
            vnf.to_str().unwrap(),
            "--access",
            "red",
            "--mtu",
            "9000",
        ],
    ));
    let replace = ["bridge", "add", "red", "--vni", "5001", "--replace", "--arp-suppression"];
    ok(knitterctl(
        &s,
        &[
            &replace[..],
            &["--neighbor", "10.0.0.1=02:00:00:00:00:01", "--static-mac", "02:00:00:00:00:01=vnf0"],
        ]
        .concat(),
    ));
    // The log filter, changed while the daemon runs; a bad one refused, the old one kept.
    assert_eq!(ok(knitterctl(&s, &["log", "set", "debug"])).trim(), "debug");
    assert_eq!(
        ok(knitterctl(&s, &["log", "set", "warn", "--module", "knitter_vhost"])).trim(),
        "debug,knitter_vhost=warn"
    );
    for bad in ["knitter_vhost=loud", "debgu"] {
        let o = knitterctl(&s, &["log", "set", bad]);
        assert_eq!(o.status.code(), Some(3), "{bad}: {}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(
        knitterctl(&s, &["log", "set", "debug,off", "--module", "x"]).status.code(),
        Some(1),
        "a level only"
    );
    assert_eq!(ok(knitterctl(&s, &["log", "show"])).trim(), "debug,knitter_vhost=warn");
    ok(knitterctl(&s, &["log", "set", "info"]));
    let fdb = ok(knitterctl(&s, &["fdb", "show"]));
    assert!(fdb.contains("02:00:00:00:00:01  port vnf0  static"), "{fdb}");
    let show = ok(knitterctl(&s, &["node", "show"]));
    assert!(show.contains("knitter-vswitchd") && show.contains("1 PMD thread"), "{show}");
    // Output into a closed pipe (`knitterctl node show | head -1`): a quiet end with 141, as
    // a shell reports SIGPIPE, not a panic (exit 101 and a panic message, before).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_knitterctl"))
        .arg("--socket")
        .arg(&s)
        .args(["node", "show"])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{:?}: {err}", o.status);
    assert!(err.is_empty(), "{err}");
    let ports = ok(knitterctl(&s, &["port", "list"]));
    let row = ports.lines().find(|l| l.starts_with("vnf0")).unwrap_or_else(|| panic!("{ports}"));
    assert!(
        row.contains("vhost-user")
            && row.contains("access red")
            && row.contains("9000")
            && row.contains("waiting for the frontend"),
        "{row}"
    );
    // Ingress policing, set when the port is added, shown in the list and refused with the
    // switch's reason when it could never pass a frame.
    let vnf1 = dir.path().join("vnf1.sock");
    let police = ["--police-pps", "100000", "--police-bps", "1000000000"];
    ok(knitterctl(
        &s,
        &[
            &["port", "add", "vnf1", "--vhost-user", vnf1.to_str().unwrap(), "--access", "red"][..],
            &police,
        ]
        .concat(),
    ));
    let ports = ok(knitterctl(&s, &["port", "list"]));
    let row = ports.lines().find(|l| l.starts_with("vnf1")).unwrap_or_else(|| panic!("{ports}"));
    assert!(row.ends_with("100000 pps, 1000000000 bps"), "{row}");
    let o = knitterctl(
        &s,
        &[
            "port",
            "add",
            "vnf2",
            "--vhost-user",
            "/nonexistent/x.sock",
            "--access",
            "red",
            "--police-bps",
            "1000000",
            "--police-burst-bytes",
            "100",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(3)
            && err.contains("burst_bytes 100 is less than the port's largest frame"),
        "{err}"
    );
    ok(knitterctl(&s, &["port", "del", "vnf1"]));
    // A bridge's per-pod rate: shown with the bridge, refused without a rate.
    ok(knitterctl(
        &s,
        &[
            "bridge",
            "add",
            "pods",
            "--vlan",
            "250",
            "--pod-pps",
            "5000",
            "--police-bps",
            "100000000",
            "--priority",
        ],
    ));
    let bridges = ok(knitterctl(&s, &["bridge", "list"]));
    let row =
        bridges.lines().find(|l| l.starts_with("pods")).unwrap_or_else(|| panic!("{bridges}"));
    assert!(row.ends_with("100000000 bps  5000 pps") && row.contains("priority"), "{row}");
    let o = knitterctl(
        &s,
        &["bridge", "add", "pods", "--vlan", "250", "--replace", "--police-pps", "0"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(3) && err.contains("bridge \"pods\": policer"), "{err}");
    ok(knitterctl(&s, &["bridge", "del", "pods"]));

    let json: serde_json::Value =
        serde_json::from_str(&ok(knitterctl(&s, &["-o", "json", "bridge", "list"]))).unwrap();
    assert_eq!(json["bridges"][0]["vni"], 5001);
    // What the object commands print with -o json|yaml, apply takes back: nothing changes,
    // with --prune neither (a list names every object of its kind).
    for format in ["json", "yaml"] {
        for (cmd, prune) in [
            (&["bridge", "list"][..], true),
            (&["port", "list"], true),
            (&["vtep", "show"], true),
            (&["port", "show", "vnf0"], false),
            (&["bridge", "show", "red"], false),
        ] {
            let doc = ok(knitterctl(&s, &[&["-o", format][..], cmd].concat()));
            let back = apply_stdin(
                &s,
                &doc,
                &[&["--format", format][..], if prune { &["--prune"][..] } else { &[] }].concat(),
            );
            assert!(
                back.contains("nothing to change") && !back.contains("kept"),
                "{cmd:?} -o {format}: {back}\n{doc}"
            );
        }
    }
    let yaml = ok(knitterctl(&s, &["-o", "yaml", "node", "show"]));
    assert!(yaml.contains("pmd_threads: 1"), "{yaml}");
    // One port's document, edited and applied: that port changes, the others stay.
    ok(knitterctl(
        &s,
        &["port", "add", "vnf1", "--vhost-user", vnf1.to_str().unwrap(), "--access", "red"],
    ));
    let one = ok(knitterctl(&s, &["-o", "yaml", "port", "show", "vnf0"]))
        .replace("mtu: 9000", "mtu: 1500");
    let back = apply_stdin(&s, &one, &[]);
    assert!(
        back.contains("port vnf0: changed")
            && back.contains("kept, not in the document: port vnf1 (--prune removes them)"),
        "{back}\n{one}"
    );
    let o = knitterctl(&s, &["port", "show", "nosuch"]);
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no port \"nosuch\""));
    ok(knitterctl(&s, &["port", "del", "vnf1"]));
    let stats = ok(knitterctl(&s, &["stats", "--interval", "0.2", "--count", "2", "--queues"]));
    assert!(
        stats.contains("RX PPS") && stats.contains("--") && stats.contains("TX FULL"),
        "{stats}"
    );

    // A refusal: the daemon's reason on stderr, exit status 3, nothing changed.
    let o = knitterctl(&s, &["bridge", "add", "blue", "--vni", "5001"]);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused") && err.contains("VNI 5001"), "{err}");
    // A usage error is clap's: exit status 2.
    assert_eq!(knitterctl(&s, &["port", "add", "x", "--access", "red"]).status.code(), Some(2));

    let topo = dir.path().join("topology.yaml");
    std::fs::write(&topo, "bridges:\n  - {name: red, vni: 5001}\n  - {name: blue, vlan: 100}\n")
        .unwrap();
    // The file names bridges only: without --prune nothing is removed; with it, the bridges
    // it lacks are (none here), and the ports stay.
    let dry = ok(knitterctl(&s, &["apply", "-f", topo.to_str().unwrap(), "--dry-run"]));
    assert!(dry.contains("bridge blue: would be added") && !dry.contains("removed"), "{dry}");
    std::fs::write(
        &topo,
        "bridges:\n  - {name: red, vni: 5001}\n  - {name: blue, vlan: 100}\nports: []\n",
    )
    .unwrap();
    let dry = ok(knitterctl(&s, &["apply", "-f", topo.to_str().unwrap(), "--dry-run"]));
    assert!(dry.contains("kept, not in the document: port vnf0 (--prune removes them)"), "{dry}");
    let done = ok(knitterctl(&s, &["apply", "-f", topo.to_str().unwrap(), "--prune"]));
    assert!(done.contains("bridge blue: added") && done.contains("port vnf0: removed"), "{done}");
    assert!(
        ok(knitterctl(&s, &["apply", "-f", topo.to_str().unwrap(), "--prune"]))
            .contains("nothing to change")
    );
    assert!(!vnf.exists(), "the removed port's socket is gone");
    // What `node export` prints, `apply -f -` takes back without a change, in every format.
    for format in ["yaml", "json"] {
        let doc = ok(knitterctl(&s, &["node", "export", "--format", format]));
        assert!(doc.contains("blue"), "{format}: {doc}");
        let back = apply_stdin(&s, &doc, &["--format", format, "--dry-run", "--prune"]);
        assert!(back.contains("nothing to change"), "{format}: {back}\n{doc}");
    }
    // Events: a follower started first sees the next change.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_knitterctl"))
        .arg("--socket")
        .arg(&s)
        .args(["events", "--count", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Changes until the follower (subscribed at some point) has seen one.
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        if follower.try_wait().unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "knitterctl events saw nothing");
        ok(knitterctl(
            &s,
            &["bridge", "add", &format!("green{i}"), "--vlan", &(300 + i).to_string()],
        ));
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = ok(follower.wait_with_output().unwrap());
    assert!(seen.contains("config_applied"), "{seen}");
    let fdb = ok(knitterctl(&s, &["fdb", "show"]));
    assert!(fdb.starts_with("BRIDGE"), "{fdb}");
    assert!(ok(knitterctl(&s, &["fdb", "flush", "--bridge", "red"])).contains("0 entries removed"));
}

/// `knitterctl apply -f - ARGS` with `doc` on its standard input.
fn apply_stdin(socket: &Path, doc: &str, args: &[&str]) -> String {
    let mut apply = Command::new(env!("CARGO_BIN_EXE_knitterctl"))
        .arg("--socket")
        .arg(socket)
        .args(["apply", "-f", "-"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut apply.stdin.take().unwrap(), doc.as_bytes()).unwrap();
    ok(apply.wait_with_output().unwrap())
}

#[test]
fn an_unreachable_daemon_is_named() {
    let o = knitterctl(Path::new("/nonexistent/knitter.sock"), &["node", "show"]);
    assert_eq!(o.status.code(), Some(4), "cannot reach: exit status 4");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot reach knitter-vswitchd at /nonexistent/knitter.sock")
            && err.contains("is it running?"),
        "{err}"
    );
}

#[test]
fn over_tcp_the_api_needs_tls_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let f = |n: &str| dir.path().join(n).display().to_string();
    let daemon = Path::new(env!("CARGO_BIN_EXE_knitterctl")).with_file_name("knitter-vswitchd");
    let addr =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let socket = dir.path().join("api.sock");
    let _d = Daemon(
        Command::new(&daemon)
            .arg("--socket")
            .arg(&socket)
            .args([
                "--no-state",
                "--no-metrics",
                "--no-hugepages",
                "--buffers",
                "4096",
                "--api-tcp",
                &addr,
            ])
            .args([
                "--tls-cert",
                &f("server.pem"),
                "--tls-key",
                &f("server.key"),
                "--tls-client-ca",
                &f("ca.pem"),
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let tcp = |ca: &str, cert: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_knitterctl"));
        cmd.args(["--tcp", &addr, "--ca", &f(ca), "--server-name", "localhost"]);
        if cert {
            cmd.args(["--cert", &f("client.pem"), "--key", &f("client.key")]);
        }
        cmd.args(["node", "show"]).output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !tcp("ca.pem", true).status.success() {
        assert!(
            Instant::now() < deadline,
            "no answer over TCP with TLS: {}",
            String::from_utf8_lossy(&tcp("ca.pem", true).stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok(tcp("ca.pem", true)).contains("knitter-vswitchd"));
    // No client certificate: the daemon hangs up, which knitterctl cannot tell from one that
    // died (exit status 4), and says what to pass; a server the client's CA did not sign
    // cannot be reached either.
    let o = tcp("ca.pem", false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(4) && err.contains("--cert"),
        "no client certificate: {:?} {err}",
        o.status
    );
    assert_eq!(
        tcp("other-ca.pem", true).status.code(),
        Some(4),
        "a server the client's CA did not sign"
    );

    // TCP without TLS files is refused at start, with the reason.
    let out = Command::new(&daemon)
        .args(["--no-state", "--no-metrics", "--api-tcp", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--tls-cert"), "{err}");
}

/// Test certificates for the daemon's TLS listener (ci/test-certs.sh; needs openssl).
fn certificates(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ci/test-certs.sh");
    let o = Command::new("bash").arg(script).arg(dir).output().expect("bash");
    assert!(
        o.status.success(),
        "ci/test-certs.sh (needs openssl: ci/setup.sh installs it): {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `knitterctl completion bash` is what bash loads: its completion function completes
/// subcommands and their subcommands; `knitterctl man DIR` writes a man page for every
/// command.
#[test]
fn completions_load_in_bash_and_man_pages_are_written() {
    let bin = env!("CARGO_BIN_EXE_knitterctl");
    let script = format!(
        "source <('{bin}' completion bash) && complete -p knitterctl >/dev/null && \
         COMP_WORDS=(knitterctl manager net); COMP_CWORD=2; COMP_LINE='knitterctl manager net'; COMP_POINT=${{#COMP_LINE}}; \
         _knitterctl knitterctl net manager && echo \"${{COMPREPLY[*]}}\""
    );
    let o = Command::new("bash").arg("-c").arg(&script).output().expect("bash");
    let got = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && got.split_whitespace().any(|w| w == "network"),
        "{got} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(bin).arg("man").arg(dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for page in ["knitterctl.1", "knitterctl-port-add.1", "knitterctl-manager-network-create.1"] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is not a man page: {text:.80}"
        );
    }
    let sub = std::fs::read_to_string(dir.path().join("knitterctl-port-add.1")).unwrap();
    assert!(sub.contains("knitterctl port add"), "the synopsis names the whole command");
}

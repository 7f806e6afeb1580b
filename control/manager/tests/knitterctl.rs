//! knitterctl against a real knitter-manager (the workspace's builds of both): what
//! `manager ... list|show -o yaml|json` prints, `manager apply -f -` takes back without a
//! change, on the same manager; on a new one it creates the same objects; a tenant's quota
//! changes in place; a network defined otherwise is refused with the manager's reason.

mod common;

use common::ManagerProc;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// knitterctl against the manager at `grpc` with `token`, `stdin` on its standard input.
fn ctl(grpc: &str, token: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(common::knitterctl())
        .args(["--manager", grpc, "--token-file"])
        .arg(token)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "knitterctl failed ({:?}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn what_manager_lists_print_apply_takes_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = ManagerProc::start(&dir.path().join("m"), &[]);
    let token = dir.path().join("m/token");
    let run = |args: &[&str]| ok(ctl(&m.grpc, &token, args, ""));
    let apply = |doc: &str, format: &str| {
        ctl(&m.grpc, &token, &["manager", "apply", "-f", "-", "--format", format], doc)
    };
    run(&["manager", "tenant", "create", "red", "--quota", "4", "--namespaces", "red-a,red-b"]);
    run(&[
        "manager",
        "network",
        "create",
        "red-net",
        "--tenant",
        "red",
        "--ipv4",
        "10.1.0.0/24",
        "--gateway4",
        "10.1.0.1",
        "--ipv6",
        "fd00:1::/64",
    ]);
    run(&[
        "manager",
        "network",
        "create",
        "media",
        "--tenant",
        "red",
        "--kind",
        "vlan",
        "--segment",
        "100",
        "--plane",
        "media",
        "--ipv4",
        "10.9.0.0/24",
    ]);
    run(&["manager", "ipgroup", "create", "red-net", "sbc", "--size", "2", "--grace", "60"]);

    let kinds: [&[&str]; 6] = [
        &["manager", "tenant", "list"],
        &["manager", "network", "list"],
        &["manager", "ipgroup", "list"],
        &["manager", "tenant", "show", "red"],
        &["manager", "network", "show", "media"],
        &["manager", "ipgroup", "show", "red-net", "sbc"],
    ];
    let mut everything = String::new();
    for format in ["yaml", "json"] {
        for cmd in kinds {
            let doc = run(&[&["-o", format][..], cmd].concat());
            let back = ok(apply(&doc, format));
            assert!(
                back.contains("nothing to change") && back.contains("unchanged"),
                "{cmd:?} -o {format}: {back}\n{doc}"
            );
            if format == "yaml" && cmd.contains(&"list") {
                everything.push_str(&doc);
            }
        }
    }

    // The lists, concatenated into one document, on a new manager: the same objects.
    let fresh = ManagerProc::start(&dir.path().join("m2"), &[]);
    let token2 = dir.path().join("m2/token");
    let made = ok(ctl(&fresh.grpc, &token2, &["manager", "apply", "-f", "-"], &everything));
    for what in [
        "tenant red: created",
        "network red-net: created",
        "network media: created",
        "ipgroup red-net/sbc: created",
        "tenant admin: unchanged",
    ] {
        assert!(made.contains(what), "{what}: {made}");
    }
    for cmd in kinds {
        let (a, b) = (
            run(&[&["-o", "yaml"][..], cmd].concat()),
            ok(ctl(&fresh.grpc, &token2, &[&["-o", "yaml"][..], cmd].concat(), "")),
        );
        // A tenant's creation time is the new manager's own.
        let strip = |s: &str| {
            s.lines()
                .map(|l| l.split("created: ").next().unwrap_or(l))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(&a), strip(&b), "{cmd:?}");
    }

    // A tenant's quota and namespaces change in place.
    let red = run(&["-o", "yaml", "manager", "tenant", "show", "red"])
        .replace("networks: 4", "networks: 8")
        .replace("- red-b", "- red-c");
    let changed = ok(apply(&red, "yaml"));
    assert!(changed.contains("tenant red: changed"), "{changed}");
    let now = run(&["-o", "json", "manager", "tenant", "show", "red"]);
    assert!(
        now.contains("\"networks\": 8") && now.contains("red-c") && !now.contains("red-b"),
        "{now}"
    );

    // A network defined otherwise is refused with the manager's reason (exit status 3).
    let other = run(&["-o", "yaml", "manager", "network", "show", "media"])
        .replace("segment: 100", "segment: 101");
    let o = apply(&other, "yaml");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("exists with another definition"), "{err}");
    // A field the API lacks is refused before anything is sent.
    let o = apply(
        "networks:\n  - {name: x, tenant: red, kind: vxlan, ipv4: {cidr: 10.7.0.0/24, gatway: 10.7.0.1}}\n",
        "yaml",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("unknown field \"ipv4.gatway\""), "{err}");
    assert!(!run(&["manager", "network", "list"]).contains("10.7.0.0"), "nothing was created");
}

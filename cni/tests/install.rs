//! The node image's CNI installer (deploy/images/knitter-node/knitter-install-cni) as the
//! DaemonSet's init container runs it, into temporary host directories: the binary (and,
//! when asked, the conflist) installed with the right modes, again on a restart, over a
//! knitter-cni that may be running (an upgrade), never leaving a partial file a runtime could
//! read; a conflist that names no knitter-cni plugin refused.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn install(host: &Path, conflist: Option<&Path>) -> Output {
    let script =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/images/knitter-node/knitter-install-cni");
    Command::new("sh")
        .arg(script)
        .env("CNI_BIN_DIR", host.join("opt/cni/bin"))
        .env("CNI_CONF_DIR", host.join("etc/cni/net.d"))
        .env("CNI_CONFLIST", conflist.map(|p| p.to_str().unwrap()).unwrap_or(""))
        .env("KNITTER_CNI_BIN", env!("CARGO_BIN_EXE_knitter-cni"))
        .output()
        .unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn the_installer_puts_the_plugin_and_its_conflist_in_place() {
    let host = tempfile::tempdir().unwrap();
    let out = install(host.path(), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bin = host.path().join("opt/cni/bin/knitter-cni");
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(
        std::fs::read(&bin).unwrap(),
        std::fs::read(env!("CARGO_BIN_EXE_knitter-cni")).unwrap()
    );
    assert!(
        !host.path().join("etc/cni/net.d").exists()
            || names(&host.path().join("etc/cni/net.d")).is_empty(),
        "no conflist unless asked (Multus)"
    );

    // Standalone: the conflist of deploy/kubernetes, installed again over a binary that may
    // still be running a call (an upgrade while the runtime calls the old one).
    let conflist = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/base/10-knitter.conflist"
    ));
    let mut running = Command::new(&bin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = install(host.path(), Some(conflist));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(running.stdin.take());
    assert!(running.wait().unwrap().success(), "the old binary finished its call");
    let conf = host.path().join("etc/cni/net.d/10-knitter.conflist");
    assert_eq!(
        (mode(&conf), std::fs::read(&conf).unwrap()),
        (0o644, std::fs::read(conflist).unwrap())
    );
    assert_eq!(names(&host.path().join("opt/cni/bin")), ["knitter-cni"], "no temporary file left");
    assert_eq!(names(&host.path().join("etc/cni/net.d")), ["10-knitter.conflist"]);

    // The installed conflist is one the plugin takes (as a runtime passes it: the list's
    // version and name with the plugin's keys).
    let list: serde_json::Value = serde_json::from_slice(&std::fs::read(&conf).unwrap()).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["name"] = list["name"].clone();
    assert!(knitter_cni::spec::NetConf::parse(plugin.to_string().as_bytes()).is_ok());

    let bad = host.path().join("99-other.conflist");
    std::fs::write(&bad, r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}"#)
        .unwrap();
    let out = install(host.path(), Some(&bad));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("names no knitter-cni plugin"));
    assert_eq!(
        names(&host.path().join("etc/cni/net.d")),
        ["10-knitter.conflist"],
        "nothing of it installed"
    );
}

/// Uninstalling (deploy/kubernetes/uninstall.sh's cleanup DaemonSet runs the installer with
/// `uninstall` on every node) takes away the plugin and Knitter's conflist, leaves other
/// plugins' files alone, and with KNITTER_PURGE=1 the node's state and sockets too.
#[test]
fn the_installer_uninstalls_what_it_installed_and_nothing_else() {
    let host = tempfile::tempdir().unwrap();
    let conflist = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/base/10-knitter.conflist"
    ));
    assert!(install(host.path(), Some(conflist)).status.success());
    let (bin, conf) = (host.path().join("opt/cni/bin"), host.path().join("etc/cni/net.d"));
    std::fs::write(bin.join("bridge"), "another plugin").unwrap();
    std::fs::write(
        conf.join("05-other.conflist"),
        r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let (state, run) = (host.path().join("var/lib/knitter"), host.path().join("run/knitter"));
    for d in [&state, &run] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("f"), "x").unwrap();
    }
    let uninstall = |purge: bool| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/images/knitter-node/knitter-install-cni"
        );
        Command::new("sh")
            .arg(script)
            .arg("uninstall")
            .env("CNI_BIN_DIR", &bin)
            .env("CNI_CONF_DIR", &conf)
            .env("KNITTER_STATE_DIR", &state)
            .env("KNITTER_RUN_DIR", &run)
            .env("KNITTER_PURGE", if purge { "1" } else { "0" })
            .output()
            .unwrap()
    };
    let out = uninstall(false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        (names(&bin), names(&conf)),
        (vec!["bridge".to_string()], vec!["05-other.conflist".to_string()]),
        "only Knitter's files go"
    );
    assert!(
        state.join("f").exists() && run.join("f").exists(),
        "the node's state stays unless purged"
    );
    // A file under Knitter's conflist name that is not Knitter's stays; a second run is fine.
    std::fs::write(conf.join("10-knitter.conflist"), r#"{"plugins":[{"type":"bridge"}]}"#).unwrap();
    assert!(uninstall(true).status.success());
    assert!(conf.join("10-knitter.conflist").exists(), "not Knitter's: kept");
    assert!(!state.exists() && !run.exists(), "purged");
}

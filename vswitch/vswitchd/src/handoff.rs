//! A DPDK pod's vhost-user hand-off: the pod's directory under the host directory pods
//! mount (`<dir>/<first 12 characters of the container id>/`), the socket path in it
//! (`<ifname>.sock`, checked against the unix socket limit), and the JSON beside it
//! (`<ifname>.json`) that tells the pod's app its MAC, addresses, routes and MTU. Blocking
//! (files). The socket itself is made by whoever listens: the pod's app by default, the
//! switch when it is asked to listen.

use serde::Serialize;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The host directory pods mount (hostPath, `mountPropagation: HostToContainer`).
pub const DEFAULT_DIR: &str = "/run/knitter/vhost";

/// The pod directory's mode when none is asked for: the switch (root) and the pod's app
/// (root in most DPDK images) may create sockets in it, nobody else may look.
const DEFAULT_MODE: u32 = 0o770;

/// Where one interface's files go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub info: PathBuf,
}

/// Who may use the pod's directory (and a socket the switch makes in it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    pub mode: Option<u32>,
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

/// What the pod's app is told, beside its socket.
#[derive(Debug, Clone, Serialize)]
pub struct Info {
    pub interface: String,
    /// The socket's file name, in the directory of this file.
    pub socket: String,
    /// The app's role on the socket (`server`: it listens and the switch connects).
    pub mode: &'static str,
    pub mac: String,
    pub mtu: u32,
    /// `address/prefix`
    pub ips: Vec<String>,
    pub gateways: Vec<String>,
    pub routes: Vec<InfoRoute>,
}

#[derive(Debug, Clone, Serialize)]
pub struct InfoRoute {
    pub dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// The files of interface `ifname` of container `container_id` under `base`; refuses a
/// relative base and a socket path the kernel cannot hold, saying how long it is.
pub fn layout(base: &Path, container_id: &str, ifname: &str) -> io::Result<Layout> {
    if !base.is_absolute() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("the vhost-user directory {} must be an absolute path", base.display())));
    }
    let short: String = container_id.chars().take(12).collect();
    if short.is_empty() || short.contains(['/', '\0']) || short.starts_with('.') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("container id {container_id:?} cannot name a directory")));
    }
    let dir = base.join(short);
    let socket = dir.join(format!("{ifname}.sock"));
    knitter_vhost::backend::check_socket_path(&socket).map_err(|e| io::Error::new(e.kind(), format!("{e}: use a shorter directory")))?;
    let info = dir.join(format!("{ifname}.json"));
    Ok(Layout { dir, socket, info })
}

/// Makes the pod's directory with its access and writes the JSON (atomically: a reader
/// never sees half of it). A socket left from an earlier attachment of the same name is
/// removed.
pub fn prepare(l: &Layout, access: Access, info: &Info) -> io::Result<()> {
    std::fs::create_dir_all(&l.dir).map_err(ctx("creating", &l.dir))?;
    std::fs::set_permissions(&l.dir, std::fs::Permissions::from_mode(access.mode.unwrap_or(DEFAULT_MODE))).map_err(ctx("setting the mode of", &l.dir))?;
    if access.owner.is_some() || access.group.is_some() {
        std::os::unix::fs::chown(&l.dir, access.owner, access.group).map_err(ctx("changing the owner of", &l.dir))?;
    }
    let _ = std::fs::remove_file(&l.socket);
    let text = serde_json::to_vec_pretty(info).map_err(io::Error::other)?;
    let tmp = l.info.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(ctx("writing", &tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(ctx("setting the mode of", &tmp))?;
    if access.owner.is_some() || access.group.is_some() {
        std::os::unix::fs::chown(&tmp, access.owner, access.group).map_err(ctx("changing the owner of", &tmp))?;
    }
    std::fs::rename(&tmp, &l.info).map_err(ctx("writing", &l.info))
}

/// Names the file an error is about.
fn ctx<'a>(what: &'a str, p: &'a Path) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

/// Removes the interface's socket and JSON, and the pod's directory once it is empty (other
/// interfaces of the pod keep it).
pub fn remove(l: &Layout) {
    let _ = std::fs::remove_file(&l.socket);
    let _ = std::fs::remove_file(&l.info);
    let _ = std::fs::remove_dir(&l.dir);
}

/// What is missing of the hand-off (empty: all there). A socket is not required: the pod's
/// app makes it when it starts, which may be after CHECK.
pub fn verify(l: &Layout) -> Vec<String> {
    let mut problems = Vec::new();
    if !l.dir.is_dir() {
        problems.push(format!("the pod's vhost-user directory {} is gone", l.dir.display()));
    } else if !l.info.is_file() {
        problems.push(format!("{} is gone", l.info.display()));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> Info {
        Info { interface: "net1".into(), socket: "net1.sock".into(), mode: "server", mac: "0a:58:0a:00:00:02".into(), mtu: 1450, ips: vec!["10.0.0.2/24".into()], gateways: vec![], routes: vec![] }
    }

    #[test]
    fn layout_is_short_and_checked() {
        let l = layout(Path::new("/run/knitter/vhost"), "0123456789abcdef0123", "net1").unwrap();
        assert_eq!(l.socket, Path::new("/run/knitter/vhost/0123456789ab/net1.sock"));
        assert_eq!(l.info, Path::new("/run/knitter/vhost/0123456789ab/net1.json"));
        let long = format!("/{}", "d".repeat(100));
        let e = layout(Path::new(&long), "0123456789ab", "net1").unwrap_err();
        assert!(e.to_string().contains("at most 107") && e.to_string().contains("bytes long"), "{e}");
        assert!(layout(Path::new("vhost"), "abc", "net1").is_err(), "a relative directory is refused");
        assert!(layout(Path::new("/x"), "../etc", "net1").is_err(), "a container id cannot climb out");
        assert!(layout(Path::new("/x"), "", "net1").is_err());
    }

    #[test]
    fn prepare_writes_the_info_and_remove_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let l = layout(t.path(), "c0ffee", "net1").unwrap();
        std::fs::create_dir_all(&l.dir).unwrap();
        std::fs::write(&l.socket, b"stale").unwrap();
        prepare(&l, Access { mode: Some(0o750), ..Default::default() }, &info()).unwrap();
        assert!(!l.socket.exists(), "a stale socket is removed");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&l.info).unwrap()).unwrap();
        assert_eq!(v["mac"], "0a:58:0a:00:00:02");
        assert_eq!(v["socket"], "net1.sock");
        assert_eq!(v["mode"], "server");
        assert_eq!(std::fs::metadata(&l.dir).unwrap().permissions().mode() & 0o777, 0o750);
        assert!(verify(&l).is_empty());
        let other = layout(t.path(), "c0ffee", "net2").unwrap();
        prepare(&other, Access::default(), &info()).unwrap();
        remove(&l);
        assert!(l.dir.exists(), "the pod's other interface keeps the directory");
        assert!(!verify(&l).is_empty());
        remove(&other);
        assert!(!l.dir.exists());
    }
}

//! A DPDK pod's vhost-user hand-off: the pod's directory, the socket path in it
//! (`<ifname>.sock`) and the JSON beside it (`<ifname>.json`) that tells the pod's app its
//! MAC, addresses, routes and MTU. Blocking (files). The socket itself is made by whoever
//! listens: the pod's app by default, the switch when it is asked to listen.
//!
//! Where the directory is ([`Place`]):
//! - **the pod's own volume** (Kubernetes, the default): an `emptyDir` the pod declares
//!   (`knitter-vhost` unless the network says otherwise), which the daemon finds under the
//!   kubelet's directory by the pod's UID, as Kube-OVN does. No other pod can see it.
//! - **a shared host directory** (`<dir>/<first 12 characters of the container id>/`, default
//!   `/run/knitter/vhost`): for nodes without Kubernetes, or where a network asks for it. Pods
//!   that mount the whole directory see each other's sockets: give each only its own part.
//!
//! A pod may write its directory (it makes its socket there) and may be root: nothing the
//! daemon does there follows a name the pod could have made a symlink. The directory is
//! opened component by component with `O_NOFOLLOW`, and every file in it is made, replaced,
//! checked and removed relative to that descriptor ([`knitter_vhost::socket::Dir`]).

use knitter_vhost::socket::{Dir, Kind, SocketPerms};
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};

/// The host directory pods mount in the shared layout (hostPath,
/// `mountPropagation: HostToContainer`).
pub const DEFAULT_DIR: &str = "/run/knitter/vhost";
/// Where the kubelet keeps its pods' volumes (`<dir>/<pod UID>/volumes/kubernetes.io~empty-dir/`).
pub const DEFAULT_KUBELET_PODS: &str = "/var/lib/kubelet/pods";
/// Where a pod mounts that volume unless its network says otherwise (what the device-info
/// a network-status shows tells the pod's app).
pub const DEFAULT_MOUNT_PATH: &str = "/var/run/knitter";

/// The pod directory's mode in the shared layout when none is asked for: the switch (root)
/// and the pod's app (root in most DPDK images) may create sockets in it, nobody else may
/// look.
const DEFAULT_MODE: u32 = 0o770;

/// Where a pod's hand-off directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// `<base>/<first 12 characters of the container id>/`.
    Shared { base: PathBuf, container_id: String },
    /// `<pods>/<uid>/volumes/kubernetes.io~empty-dir/<volume>/`: the pod's own emptyDir.
    Volume { pods: PathBuf, uid: String, volume: String },
}

/// Where one interface's files go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub place: Place,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub info: PathBuf,
    ifname: String,
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

/// Names the file an error is about.
fn ctx<'a>(what: &'a str, p: &'a Path) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// A Kubernetes volume name: a DNS-1123 label.
fn volume_name_ok(v: &str) -> bool {
    (1..=63).contains(&v.len())
        && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-')
}

/// A pod UID as the kubelet names its directory (a UUID): letters, digits and dashes only,
/// so it names one directory and nothing above it.
fn uid_ok(u: &str) -> bool {
    (1..=64).contains(&u.len()) && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

const EMPTY_DIR: [&str; 2] = ["volumes", "kubernetes.io~empty-dir"];

/// The files of interface `ifname` at `place`; refuses a relative directory, a container id,
/// pod UID or volume name that could name anything but its one directory, and (shared
/// layout, where the pod's app uses the same path) a socket path the kernel cannot hold.
pub fn layout(place: Place, ifname: &str) -> io::Result<Layout> {
    let dir = match &place {
        Place::Shared { base, container_id } => {
            if !base.is_absolute() {
                return Err(invalid(format!(
                    "the vhost-user directory {} must be an absolute path",
                    base.display()
                )));
            }
            let short: String = container_id.chars().take(12).collect();
            if short.is_empty() || short.contains(['/', '\0']) || short.starts_with('.') {
                return Err(invalid(format!(
                    "container id {container_id:?} cannot name a directory"
                )));
            }
            base.join(short)
        }
        Place::Volume { pods, uid, volume } => {
            if !pods.is_absolute() {
                return Err(invalid(format!(
                    "the kubelet's pods directory {} must be an absolute path",
                    pods.display()
                )));
            }
            if !uid_ok(uid) {
                return Err(invalid(format!("pod UID {uid:?} is not a UID")));
            }
            if !volume_name_ok(volume) {
                return Err(invalid(format!(
                    "volume name {volume:?} is not a Kubernetes volume name"
                )));
            }
            pods.join(uid).join(EMPTY_DIR[0]).join(EMPTY_DIR[1]).join(volume)
        }
    };
    let socket = dir.join(format!("{ifname}.sock"));
    if matches!(place, Place::Shared { .. }) {
        knitter_vhost::backend::check_socket_path(&socket)
            .map_err(|e| io::Error::new(e.kind(), format!("{e}: use a shorter directory")))?;
    }
    let info = dir.join(format!("{ifname}.json"));
    Ok(Layout { place, dir, socket, info, ifname: ifname.to_string() })
}

impl Layout {
    fn socket_name(&self) -> String {
        format!("{}.sock", self.ifname)
    }

    fn info_name(&self) -> String {
        format!("{}.json", self.ifname)
    }

    /// Opens the pod's directory, component by component below the trusted root (the shared
    /// base, or the kubelet's pods directory), none through a symlink; in the shared layout
    /// it is made first when `make` (mode `mode`).
    fn open(&self, make: Option<u32>) -> io::Result<Dir> {
        match &self.place {
            Place::Shared { base, .. } => {
                if make.is_some() {
                    std::fs::create_dir_all(base)?;
                }
                let b = Dir::open_trusted(base)?;
                let name = self
                    .dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if let Some(mode) = make {
                    b.make_dir(&name, mode)?;
                }
                b.open_dir(&name)
            }
            Place::Volume { pods, uid, volume } => {
                let mut d = Dir::open_trusted(pods)?.open_dir(uid)?;
                for part in EMPTY_DIR.iter().copied().chain([volume.as_str()]) {
                    d = d.open_dir(part)?;
                }
                Ok(d)
            }
        }
    }
}

/// Makes (shared layout) or finds (the pod's volume) the pod's directory, gives it its
/// access, removes a socket left from an earlier attachment of the same name and writes the
/// JSON (atomically: a reader never sees half of it).
pub fn prepare(l: &Layout, access: Access, info: &Info) -> io::Result<()> {
    let shared = matches!(l.place, Place::Shared { .. });
    let dir = l.open(shared.then_some(access.mode.unwrap_or(DEFAULT_MODE))).map_err(|e| match (&l.place, e.kind()) {
        (Place::Volume { volume, .. }, io::ErrorKind::NotFound) => io::Error::new(
            io::ErrorKind::NotFound,
            format!("the pod has no emptyDir volume named {volume:?} ({} is missing): declare one and mount it where the app looks for its socket", l.dir.display()),
        ),
        _ => ctx("opening", &l.dir)(e),
    })?;
    let perms = SocketPerms { mode: access.mode, owner: access.owner, group: access.group };
    if shared || access.mode.is_some() || access.owner.is_some() || access.group.is_some() {
        let perms = SocketPerms { mode: Some(access.mode.unwrap_or(DEFAULT_MODE)), ..perms };
        dir.set_access(perms).map_err(ctx("setting the mode and owner of", &l.dir))?;
    }
    // A stale socket goes; anything else of that name (a symlink the pod planted) too.
    dir.unlink(&l.socket_name()).map_err(ctx("removing", &l.socket))?;
    let text = serde_json::to_vec_pretty(info).map_err(io::Error::other)?;
    let file = SocketPerms { mode: Some(0o644), owner: access.owner, group: access.group };
    dir.write_atomically(&l.info_name(), &text, file).map_err(ctx("writing", &l.info))
}

/// Removes the interface's socket and JSON, and (shared layout) the pod's directory once it
/// is empty (other interfaces of the pod keep it; the kubelet removes a pod's volume).
pub fn remove(l: &Layout) {
    let Ok(dir) = l.open(None) else { return };
    let _ = dir.unlink(&l.socket_name());
    let _ = dir.unlink(&l.info_name());
    drop(dir);
    if let (Place::Shared { base, .. }, Some(name)) = (&l.place, l.dir.file_name())
        && let Ok(b) = Dir::open_trusted(base)
    {
        b.remove_dir(&name.to_string_lossy());
    }
}

/// What is missing of the hand-off (empty: all there). A socket is not required: the pod's
/// app makes it when it starts, which may be after CHECK.
pub fn verify(l: &Layout) -> Vec<String> {
    let Ok(dir) = l.open(None) else {
        return vec![format!("the pod's vhost-user directory {} is gone", l.dir.display())];
    };
    match dir.kind(&l.info_name()) {
        Ok(Kind::File) => Vec::new(),
        Ok(Kind::Missing) => vec![format!("{} is gone", l.info.display())],
        Ok(k) => vec![format!("{} is not a file but {k:?}", l.info.display())],
        Err(e) => vec![format!("{}: {e}", l.info.display())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn info() -> Info {
        Info {
            interface: "net1".into(),
            socket: "net1.sock".into(),
            mode: "server",
            mac: "0a:58:0a:00:00:02".into(),
            mtu: 1450,
            ips: vec!["10.0.0.2/24".into()],
            gateways: vec![],
            routes: vec![],
        }
    }

    fn shared(base: &Path, id: &str) -> Place {
        Place::Shared { base: base.into(), container_id: id.into() }
    }

    #[test]
    fn layout_is_short_and_checked() {
        let l = layout(shared(Path::new("/run/knitter/vhost"), "0123456789abcdef0123"), "net1")
            .unwrap();
        assert_eq!(l.socket, Path::new("/run/knitter/vhost/0123456789ab/net1.sock"));
        assert_eq!(l.info, Path::new("/run/knitter/vhost/0123456789ab/net1.json"));
        let long = format!("/{}", "d".repeat(100));
        let e = layout(shared(Path::new(&long), "0123456789ab"), "net1").unwrap_err();
        assert!(
            e.to_string().contains("at most 107") && e.to_string().contains("bytes long"),
            "{e}"
        );
        assert!(
            layout(shared(Path::new("vhost"), "abc"), "net1").is_err(),
            "a relative directory is refused"
        );
        assert!(
            layout(shared(Path::new("/x"), "../etc"), "net1").is_err(),
            "a container id cannot climb out"
        );
        assert!(layout(shared(Path::new("/x"), ""), "net1").is_err());
        let v = |uid: &str, vol: &str| {
            layout(
                Place::Volume {
                    pods: "/var/lib/kubelet/pods".into(),
                    uid: uid.into(),
                    volume: vol.into(),
                },
                "net1",
            )
        };
        let uid = "8f0c3f5e-1b2a-4c3d-9e8f-0123456789ab";
        assert_eq!(
            v(uid, "knitter-vhost").unwrap().socket,
            Path::new(&format!(
                "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/knitter-vhost/net1.sock"
            ))
        );
        for (u, vol) in
            [("../x", "v"), (uid, "../../etc"), (uid, "a/b"), (uid, "Vol"), ("", "v"), (uid, "")]
        {
            assert!(v(u, vol).is_err(), "{u} {vol}");
        }
    }

    #[test]
    fn prepare_writes_the_info_and_remove_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let l = layout(shared(t.path(), "c0ffee"), "net1").unwrap();
        std::fs::create_dir_all(&l.dir).unwrap();
        std::fs::write(&l.socket, b"stale").unwrap();
        prepare(&l, Access { mode: Some(0o750), ..Default::default() }, &info()).unwrap();
        assert!(!l.socket.exists(), "a stale socket is removed");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&l.info).unwrap()).unwrap();
        assert_eq!(v["mac"], "0a:58:0a:00:00:02");
        assert_eq!(v["socket"], "net1.sock");
        assert_eq!(v["mode"], "server");
        assert_eq!(std::fs::metadata(&l.dir).unwrap().permissions().mode() & 0o777, 0o750);
        assert!(verify(&l).is_empty());
        let other = layout(shared(t.path(), "c0ffee"), "net2").unwrap();
        prepare(&other, Access::default(), &info()).unwrap();
        remove(&l);
        assert!(l.dir.exists(), "the pod's other interface keeps the directory");
        assert!(!verify(&l).is_empty());
        remove(&other);
        assert!(!l.dir.exists());
    }

    /// What a pod can plant in its directory is neither followed nor taken: a symlink where
    /// the JSON, its temporary file or the socket go, a foreign socket of the interface's
    /// name, a symlink in place of its whole directory (shared layout, where a pod that
    /// mounts the base could make one).
    #[test]
    fn planted_symlinks_and_sockets_are_neither_followed_nor_taken() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let l = layout(shared(t.path(), "c0ffee"), "net1").unwrap();
        std::fs::create_dir_all(&l.dir).unwrap();
        for name in ["net1.json", "net1.json.tmp"] {
            std::os::unix::fs::symlink(&victim, l.dir.join(name)).unwrap();
        }
        let foreign = std::os::unix::net::UnixListener::bind(&l.socket).unwrap();
        prepare(&l, Access { mode: Some(0o770), owner: Some(4242), group: Some(4242) }, &info())
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let m = std::fs::metadata(&victim).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (m.mode() & 0o777, m.uid()),
            (0o600, 0),
            "the target's mode and owner are untouched"
        );
        assert!(!l.socket.exists(), "the foreign socket is not taken");
        assert_eq!(
            std::fs::symlink_metadata(&l.info).unwrap().uid(),
            4242,
            "the JSON is a new file"
        );
        drop(foreign);
        // The pod's directory replaced with a symlink to somewhere else.
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        remove(&l);
        std::os::unix::fs::symlink(&elsewhere, &l.dir).unwrap();
        assert!(prepare(&l, Access::default(), &info()).is_err(), "not entered through a symlink");
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none(), "nothing written there");
    }

    #[test]
    fn a_pods_own_volume_is_found_and_a_missing_one_named() {
        let t = tempfile::tempdir().unwrap();
        let uid = "8f0c3f5e-1b2a-4c3d-9e8f-0123456789ab";
        let place = Place::Volume {
            pods: t.path().into(),
            uid: uid.into(),
            volume: "knitter-vhost".into(),
        };
        let l = layout(place, "net1").unwrap();
        let e = prepare(&l, Access::default(), &info()).unwrap_err();
        assert!(e.to_string().contains("no emptyDir volume named \"knitter-vhost\""), "{e}");
        std::fs::create_dir_all(&l.dir).unwrap();
        prepare(&l, Access::default(), &info()).unwrap();
        assert!(l.info.is_file() && verify(&l).is_empty());
        remove(&l);
        assert!(l.dir.is_dir() && !l.info.exists(), "the kubelet's volume stays, emptied of ours");
        // A volume that is a symlink (to another pod's) is not entered.
        let other = t.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::remove_dir(&l.dir).unwrap();
        std::os::unix::fs::symlink(&other, &l.dir).unwrap();
        assert!(prepare(&l, Access::default(), &info()).is_err());
    }
}

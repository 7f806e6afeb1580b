//! What pods can write on the node, as far as a `dpdk` port's devargs are concerned: the
//! directories pods' files live in (the kubelet's pods directory, the shared vhost-user
//! hand-off directory and every attachment's own), and the devargs that name a file there.
//!
//! A `dpdk` port's peer is trusted: DPDK's memif driver copies from whatever region, offset
//! and length its peer's descriptors give, a virtio-user port shares the switch's buffers with
//! its vhost-user backend, and a pcap port reads and writes the files it is given. Devargs
//! naming a socket or file in a directory a pod can write would let that pod stand in for the
//! peer (replace the socket with its own) or point the root daemon's writes elsewhere (a
//! symlink), so such a port is refused with the directory named. Every value with a `/` is
//! taken for a path, whatever its key; a path is compared as the kernel resolves it (its
//! longest existing ancestor canonicalized, on both sides: `/var/run` is `/run` on most
//! hosts). What DPDK could read otherwise than the check does (a second `=` in an argument,
//! `exec(...)`, `..` beyond what exists) is refused.
//!
//! The directories pods can write are a list the switch knows of; a pod's root filesystem
//! (the runtime's snapshots) or a hostPath volume is not on it. A node that wants more sets
//! `[dpdk] dirs`: then every path must also lie in one of those ([`Dirs::allowed`]).

use std::path::{Component, Path, PathBuf};

/// Where a `dpdk` port's devargs may name files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirs {
    /// Directories pods can write: never there.
    pub pods: Vec<PathBuf>,
    /// The node's `[dpdk] dirs`: only there, when any are given (empty: anywhere else).
    pub allowed: Vec<PathBuf>,
}

impl Dirs {
    /// Never in `pods`; anywhere else.
    pub fn pods(pods: Vec<PathBuf>) -> Dirs {
        Dirs { pods, allowed: Vec::new() }
    }
}

/// Why a `dpdk` port's devargs are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `arg` names a file in `dir`, which pods can write.
    InPods { arg: String, dir: PathBuf },
    /// `arg` names a file outside every directory of `[dpdk] dirs` (`allowed`).
    Outside { arg: String, allowed: Vec<PathBuf> },
    /// `arg` is spelled so that DPDK may read a key the guard did not (a second `=`, an empty
    /// key), runs or nests something (`exec(...)`, `dev(...)` of `net_failsafe`), or names a
    /// path through `..` beyond what exists.
    Unclear { arg: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::InPods { arg, dir } => write!(
                f,
                "devargs {arg} lie in {}, a directory pods can write: a pod could stand in for the device's peer (give the switch's dpdk devices sockets and files of their own)",
                dir.display()
            ),
            Refusal::Outside { arg, allowed } => {
                let allowed: Vec<_> = allowed.iter().map(|d| d.display().to_string()).collect();
                write!(
                    f,
                    "devargs {arg} lie outside the node's [dpdk] dirs ({}): put the device's sockets and files there",
                    allowed.join(", ")
                )
            }
            Refusal::Unclear { arg } => write!(
                f,
                "devargs {arg:?} are refused: one key=value an argument, no (...), no '..' beyond what exists (the switch checks every path its dpdk devices name against the directories pods can write)"
            ),
        }
    }
}

/// memif's socket when `socket-abstract=no` names none (DPDK's `ETH_MEMIF_DEFAULT_SOCKET_FILENAME`).
const MEMIF_DEFAULT_SOCKET: &str = "socket=/run/memif.sock";

/// Checks `devargs` (a device name, then `key=value` arguments) against `dirs`: every value
/// with a `/` in it, whatever its key (a socket, a pcap file, a BPF object, a firmware
/// script), and every value DPDK opens as a file without one (relative to the working
/// directory: [`names_a_file`]; memif's default socket file), must lie outside the pods'
/// directories and, when some are given, in an allowed one.
pub fn check(devargs: &str, dirs: &Dirs) -> Result<(), Refusal> {
    let pods: Vec<PathBuf> = dirs.pods.iter().filter_map(|d| resolved(d)).collect();
    let allowed: Vec<PathBuf> = dirs.allowed.iter().filter_map(|d| resolved(d)).collect();
    let mut args = devargs.split(',');
    let dev = args.next().unwrap_or_default().trim();
    let args: Vec<&str> = args.collect();
    let memif = dev.starts_with("net_memif");
    let key_value =
        |a: &'static str| move |arg: &&str| arg.split_once('=').map(|(k, _)| k.trim()) == Some(a);
    // memif's parser takes any value holding "yes" for yes; its default is an abstract socket.
    let abstract_socket = !args.iter().any(|a| {
        a.split_once('=').is_some_and(|(k, v)| k.trim() == "socket-abstract" && !v.contains("yes"))
    });
    let default_socket = (memif && !abstract_socket && !args.iter().any(key_value("socket")))
        .then_some(MEMIF_DEFAULT_SOCKET);
    for arg in args.iter().copied().chain(default_socket) {
        let unclear = || Refusal::Unclear { arg: arg.to_string() };
        if arg.contains(['(', ')']) || arg.matches('=').count() > 1 || arg.starts_with('=') {
            return Err(unclear());
        }
        let (key, value) = arg.split_once('=').map_or((arg, arg), |(k, v)| (k.trim(), v));
        if !value.contains('/') && !names_a_file(dev, key, memif && abstract_socket) {
            continue;
        }
        let path = resolved(Path::new(value)).ok_or_else(unclear)?;
        if let Some(dir) = pods.iter().find(|d| path.starts_with(d)) {
            return Err(Refusal::InPods { arg: arg.to_string(), dir: dir.clone() });
        }
        if !dirs.allowed.is_empty() && !allowed.iter().any(|d| path.starts_with(d)) {
            return Err(Refusal::Outside { arg: arg.to_string(), allowed: dirs.allowed.clone() });
        }
    }
    Ok(())
}

/// Whether DPDK opens the value of `key` of device `dev` as a file even when it has no `/`
/// (relative to the daemon's working directory): memif's `socket` unless it is an abstract
/// socket's name (`abstract_memif`), virtio-user's `path`, pcap's files, AF_XDP's program,
/// `net_vhost`'s `iface` (elsewhere an interface's name).
fn names_a_file(dev: &str, key: &str, abstract_memif: bool) -> bool {
    match key {
        "socket" => !abstract_memif,
        "path" | "rx_pcap" | "tx_pcap" | "xdp_prog" => true,
        "iface" => dev.starts_with("net_vhost"),
        _ => false,
    }
}

/// Where `p` leads: its longest existing ancestor as the kernel resolves it (symlinks
/// followed before the `..` after them), then the rest, which may not exist yet (a socket a
/// peer will make) and so may hold no `.` or `..` (None). A relative path is taken from the
/// daemon's working directory, as DPDK takes it.
fn resolved(p: &Path) -> Option<PathBuf> {
    let absolute = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(p)
    };
    let mut rest = Vec::new();
    let mut existing = absolute.as_path();
    loop {
        if let Ok(mut real) = existing.canonicalize() {
            real.extend(rest.iter().rev());
            return Some(real);
        }
        let mut components = existing.components();
        match components.next_back() {
            Some(Component::Normal(name)) => {
                rest.push(name.to_os_string());
                existing = components.as_path();
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory with `pods/uid/` and `other/` in it, `link` pointing at `pods`
    /// and `other/deep` at `pods/uid`.
    fn layout() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let pods = tmp.path().join("pods");
        std::fs::create_dir_all(pods.join("uid")).unwrap();
        std::fs::create_dir_all(tmp.path().join("other")).unwrap();
        std::os::unix::fs::symlink(&pods, tmp.path().join("link")).unwrap();
        std::os::unix::fs::symlink(pods.join("uid"), tmp.path().join("other/deep")).unwrap();
        (tmp, pods)
    }

    #[test]
    fn paths_in_a_pods_directory_are_found_however_spelled() {
        let (tmp, pods) = layout();
        let t = tmp.path().display();
        for devargs in [
            format!("net_memif0,socket={t}/pods/uid/memif.sock,socket-abstract=no"),
            format!("net_virtio_user0,path={t}/pods/uid/vhost.sock,queues=2"),
            format!("net_pcap0,rx_pcap={t}/in.pcap,tx_pcap={t}/pods/out.pcap"),
            format!("net_vhost0,iface={t}/link/uid/x.sock"),
            format!("net_af_xdp0,iface=eth0,xdp_prog={t}/pods/uid/prog.o"),
            format!("net_memif0,socket={t}/other/../pods/new.sock"),
            // The kernel follows `deep` before the `..` after it: pods/uid/.. is pods (taken
            // the other way round, other/m.sock: as `/var/run/../var/lib/kubelet/...`).
            format!("net_memif0,socket={t}/other/deep/../m.sock"),
        ] {
            match check(&devargs, &Dirs::pods(vec![pods.clone()])) {
                Err(Refusal::InPods { dir, .. }) => {
                    assert_eq!(dir, pods.canonicalize().unwrap(), "{devargs}")
                }
                other => panic!("{devargs}: {other:?}"),
            }
        }
    }

    #[test]
    fn spellings_dpdk_could_read_otherwise_are_refused() {
        let (tmp, pods) = layout();
        let t = tmp.path().display();
        for devargs in [
            format!("net_memif0,=socket={t}/pods/uid/m.sock"),
            format!("net_virtio_user0,queues=path={t}/pods/uid/v.sock"),
            format!("net_failsafe0,exec({t}/pods/uid/x.sh)"),
            format!("net_failsafe0,dev(net_memif0,socket={t}/pods/m.sock)"),
            format!("net_memif0,socket={t}/pods/new/../../x.sock"),
        ] {
            assert!(
                matches!(
                    check(&devargs, &Dirs::pods(vec![pods.clone()])),
                    Err(Refusal::Unclear { .. })
                ),
                "{devargs}"
            );
        }
    }

    #[test]
    fn paths_elsewhere_and_other_arguments_pass() {
        let (tmp, pods) = layout();
        let t = tmp.path().display();
        for devargs in [
            format!("net_memif0,socket={t}/switch/memif.sock"),
            format!("net_memif0,socket={t}/podsx/memif.sock"),
            format!("net_memif0,socket={t}/other/deep/../../other/m.sock"),
            "net_memif0,socket=knitter-memif".to_string(),
            "net_pcap0,iface=eth0".to_string(),
            "0000:01:00.1,representor=[0-3]".to_string(),
            "net_tap0,iface=dtap0".to_string(),
        ] {
            assert_eq!(check(&devargs, &Dirs::pods(vec![pods.clone()])), Ok(()), "{devargs}");
        }
    }

    /// With `[dpdk] dirs` set, a path must lie in one of them (as the kernel resolves it), and
    /// never in a pods' directory, even one inside an allowed directory.
    #[test]
    fn allowed_directories_are_the_only_ones() {
        let (tmp, pods) = layout();
        let t = tmp.path().display();
        let dirs = Dirs { pods: vec![pods.clone()], allowed: vec![tmp.path().join("other")] };
        for devargs in [
            format!("net_memif0,socket={t}/other/m.sock"),
            format!("net_pcap0,rx_pcap={t}/other/in.pcap,tx_pcap={t}/other/new.pcap"),
            "net_memif0,socket=knitter-memif".to_string(),
            "net_tap0,iface=dtap0".to_string(),
            "net_pcap0,iface=eth0".to_string(),
        ] {
            assert_eq!(check(&devargs, &dirs), Ok(()), "{devargs}");
        }
        // Files without a `/` in their names are made in the working directory.
        for devargs in [
            "net_memif0,socket-abstract=no,socket=m.sock".to_string(),
            "net_memif0,socket-abstract=no".to_string(),
            "net_pcap0,tx_pcap=out.pcap".to_string(),
            "net_vhost0,iface=v.sock".to_string(),
            format!("net_memif0,socket={t}/switch/m.sock"),
            format!("net_memif0,socket={t}/other/../m.sock"),
            format!("net_pcap0,rx_pcap={t}/other/in.pcap,tx_pcap=/tmp/out.pcap"),
        ] {
            assert!(matches!(check(&devargs, &dirs), Err(Refusal::Outside { .. })), "{devargs}");
        }
        // `other/deep` leads into the pods' directory: refused as such, allowed or not.
        let deep = format!("net_memif0,socket={t}/other/deep/m.sock");
        assert!(matches!(check(&deep, &dirs), Err(Refusal::InPods { .. })), "{deep}");
        let inside = Dirs { pods: vec![pods.clone()], allowed: vec![tmp.path().to_path_buf()] };
        let pod = format!("net_memif0,socket={t}/pods/uid/m.sock");
        assert!(matches!(check(&pod, &inside), Err(Refusal::InPods { .. })), "{pod}");
    }
}

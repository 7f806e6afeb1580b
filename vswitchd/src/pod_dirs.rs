//! What pods can write on the node, as far as a `dpdk` port's devargs are concerned: the
//! directories pods' files live in (the kubelet's pods directory, the shared vhost-user
//! hand-off directory and every attachment's own), and the devargs that name a file there.
//!
//! A `dpdk` port's peer is trusted: DPDK's memif driver copies from whatever region, offset
//! and length its peer's descriptors give, a virtio-user port shares the switch's buffers with
//! its vhost-user backend, and a pcap port reads and writes the files it is given. Devargs
//! naming a socket or file in a directory a pod can write would let that pod stand in for the
//! peer (replace the socket with its own) or point the root daemon's writes elsewhere (a
//! symlink), so such a port is refused with the directory named. Paths are compared after
//! `.` and `..` are resolved and the longest existing ancestor's symlinks followed, on both
//! sides (`/var/run` is `/run` on most hosts).

use std::path::{Component, Path, PathBuf};

/// Devargs keys whose value names a file or socket, across the drivers users give the switch:
/// `net_memif`'s `socket` (a file unless `socket-abstract` is left on), `net_virtio_user`'s
/// `path`, `net_vhost`'s `iface`, `net_pcap`'s `rx_pcap` and `tx_pcap`. (`net_pcap`'s `iface`
/// names an interface: no `/` in it, so it is never taken for a path.)
const PATH_KEYS: [&str; 5] = ["socket", "path", "iface", "rx_pcap", "tx_pcap"];

/// The first of `devargs`' paths that lies in one of `dirs`, with that directory:
/// (`key=value`, directory).
pub fn devargs_in(devargs: &str, dirs: &[PathBuf]) -> Option<(String, PathBuf)> {
    let dirs: Vec<PathBuf> = dirs.iter().map(|d| resolved(d)).collect();
    devargs.split(',').skip(1).find_map(|arg| {
        let (key, value) = arg.split_once('=')?;
        let key = key.trim();
        if !PATH_KEYS.contains(&key) || !value.contains('/') {
            return None;
        }
        let path = resolved(Path::new(value.trim()));
        let dir = dirs.iter().find(|d| path.starts_with(d))?;
        Some((format!("{key}={}", value.trim()), dir.clone()))
    })
}

/// `p` with `.` and `..` resolved in order, then its longest existing ancestor's symlinks
/// followed (the rest may not exist yet: a socket a peer will make). A relative path is taken
/// from the daemon's working directory, as DPDK takes it.
fn resolved(p: &Path) -> PathBuf {
    let absolute = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(p)
    };
    let mut lexical = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            c => lexical.push(c),
        }
    }
    let mut rest = Vec::new();
    let mut existing = lexical.as_path();
    loop {
        if let Ok(mut real) = existing.canonicalize() {
            real.extend(rest.iter().rev());
            return real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return lexical,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_a_pods_directory_are_found_however_spelled() {
        let tmp = tempfile::tempdir().unwrap();
        let pods = tmp.path().join("pods");
        std::fs::create_dir_all(pods.join("uid")).unwrap();
        std::os::unix::fs::symlink(&pods, tmp.path().join("link")).unwrap();
        let dirs = [pods.clone()];
        let t = tmp.path().display();
        for devargs in [
            format!("net_memif0,socket={t}/pods/uid/memif.sock,socket-abstract=no"),
            format!("net_virtio_user0,path={t}/pods/uid/vhost.sock,queues=2"),
            format!("net_pcap0,rx_pcap={t}/in.pcap,tx_pcap={t}/pods/out.pcap"),
            format!("net_vhost0,iface={t}/link/uid/x.sock"),
            format!("net_memif0,socket={t}/other/../pods/new/not-yet.sock"),
            format!("net_memif0, socket = {t}/pods/a.sock"),
        ] {
            let (arg, dir) = devargs_in(&devargs, &dirs).unwrap_or_else(|| panic!("{devargs}"));
            assert_eq!(dir, pods.canonicalize().unwrap(), "{devargs}");
            assert!(arg.contains("pods") || arg.contains("link"), "{arg}");
        }
    }

    #[test]
    fn paths_elsewhere_and_other_arguments_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let pods = tmp.path().join("pods");
        std::fs::create_dir_all(&pods).unwrap();
        let dirs = [pods];
        let t = tmp.path().display();
        for devargs in [
            format!("net_memif0,socket={t}/switch/memif.sock"),
            format!("net_memif0,socket={t}/podsx/memif.sock"),
            "net_memif0,socket=knitter-memif".to_string(),
            "net_pcap0,iface=eth0".to_string(),
            "0000:01:00.1".to_string(),
            format!("net_ring0,nodeaction={t}/pods/x:0:CREATE"),
            format!("{t}/pods/first-is-the-device-name"),
        ] {
            assert_eq!(devargs_in(&devargs, &dirs), None, "{devargs}");
        }
    }
}

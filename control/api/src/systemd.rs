//! systemd's readiness protocol (`sd_notify`, for units of `Type=notify`): a datagram
//! `READY=1` (or `STOPPING=1`) to the socket `$NOTIFY_SOCKET` names. Without the variable
//! (not under systemd) nothing is sent. An abstract socket is written `@name`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Tells systemd the service is ready (its sockets are bound and it serves).
pub fn ready() {
    notify("READY=1");
}

/// Tells systemd the service is stopping.
pub fn stopping() {
    notify("STOPPING=1");
}

fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(e) = send(&path.to_string_lossy(), state) {
        tracing::warn!(socket = %path.to_string_lossy(), error = %e, "telling systemd {state}");
    }
}

fn send(path: &str, state: &str) -> std::io::Result<()> {
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(path)?,
    };
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod test {
    use std::os::linux::net::SocketAddrExt;

    #[test]
    fn the_state_reaches_the_socket_systemd_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        super::send(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let name = format!("knitter-notify-{}", std::process::id());
        let rx = std::os::unix::net::UnixDatagram::bind_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
        )
        .unwrap();
        super::send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}

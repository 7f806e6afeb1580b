//! Names the kernel takes: the one check of an interface name, shared by the CNI plugin and
//! the node daemon (which must not trust the plugin's).

/// Whether `n` is a name Linux gives a network interface (`dev_valid_name`): 1–15 bytes,
/// not `.` or `..`, no `/`, `:`, whitespace or NUL.
pub fn interface_name(n: &str) -> Result<(), String> {
    if n.is_empty()
        || n.len() > 15
        || n.contains(['/', ':', '\0'])
        || n.chars().any(char::is_whitespace)
        || n == "."
        || n == ".."
    {
        return Err(format!(
            "interface name {n:?} must be 1-15 characters without '/', ':' or spaces, and not . or .."
        ));
    }
    Ok(())
}

/// The longest name of a host port's host end: the switch's end adds `-sw` within the
/// kernel's 15 bytes.
pub const HOST_PORT_NAME_MAX: usize = 12;

/// Whether `n` may name a host port (an interface the node makes in the host's namespace,
/// from its settings or the manager's record): 1 to [`HOST_PORT_NAME_MAX`] letters, digits,
/// `-` or `_`, starting with a letter. Stricter than [`interface_name`]: its switch end is
/// `n` and `-sw`, and both are routed to by the host's tools.
pub fn host_port_name(n: &str) -> Result<(), String> {
    let ok = n.len() <= HOST_PORT_NAME_MAX
        && n.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
        && n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if !ok {
        return Err(format!(
            "host interface name {n:?}: 1 to {HOST_PORT_NAME_MAX} letters, digits, '-' or '_', starting with a letter"
        ));
    }
    interface_name(n)
}

/// A short stable interface name (≤ 15 bytes for a prefix of ≤ 5): `prefix` and 10 hex
/// digits of an FNV-1a hash of `parts` joined by NUL bytes. Names of running pods' ports are
/// made this way: the hash must never change.
pub fn short_name(prefix: &str, parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        let sep = if i == 0 { None } else { Some(0u8) };
        for b in sep.into_iter().chain(part.bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{prefix}{:010x}", h & 0xff_ffff_ffff)
}

/// The node's host port of a network with a node gateway: the interface the node agent makes
/// in the host's namespace (`kh` and a hash of the network: 12 bytes, room for the `-sw`
/// peer), and the manager's record of it, `(container, interface)` (the container names the
/// node, so each node has one per network; no pod holds it).
pub fn host_port(network: &str, node: &str) -> (String, String) {
    (format!("{HOST_PORT_PREFIX}{node}"), short_name("kh", &[network]))
}

/// The container name of every host port's record starts so (no pod's container ID does:
/// runtimes give hex IDs).
pub const HOST_PORT_PREFIX: &str = "knitter-host.";

#[cfg(test)]
mod test {
    #[test]
    fn short_names_do_not_change() {
        // Running pods' ports carry these names; a changed hash would orphan them.
        assert_eq!(super::short_name("kn", &["abc", "eth0"]), "kne81be81b20");
        assert_eq!(
            super::host_port("blue", "node1"),
            ("knitter-host.node1".to_string(), super::short_name("kh", &["blue"]))
        );
        assert_eq!(super::host_port("blue", "n").1.len(), 12);
        let made = super::host_port("blue", "n").1;
        assert_eq!(
            super::host_port_name(&made),
            Ok(()),
            "the manager's names pass the node's check"
        );
        for bad in ["", "1abc", "thirteen-byte", "a/b", "a b", "kh.x"] {
            assert!(super::host_port_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_kernels_rule() {
        for ok in ["eth0", "net1", "a", "fifteen-chars-x"] {
            assert!(super::interface_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "a\tb", "a\0", "sixteen-chars-xx"] {
            assert!(super::interface_name(bad).is_err(), "{bad:?}");
        }
    }
}

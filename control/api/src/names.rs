//! Names the kernel takes: the one check of an interface name, shared by the CNI plugin and
//! the node daemon (which must not trust the plugin's).

/// Whether `n` is a name Linux gives a network interface (`dev_valid_name`): 1–15 bytes,
/// not `.` or `..`, no `/`, `:`, whitespace or NUL.
pub fn interface_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 15 || n.contains(['/', ':', '\0']) || n.chars().any(char::is_whitespace) || n == "." || n == ".." {
        return Err(format!("interface name {n:?} must be 1-15 characters without '/', ':' or spaces, and not . or .."));
    }
    Ok(())
}

#[cfg(test)]
mod test {
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

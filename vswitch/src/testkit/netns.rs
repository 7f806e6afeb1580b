//! Network namespaces and veth pairs for tests that touch the kernel's network stack. Every
//! name is unique (process id and a counter), every object is removed on drop, even when the
//! test fails, and addresses are only ever configured inside these namespaces.

use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Whether this process may create namespaces (root with `ip` available); tests that need
/// them say so and return early otherwise.
pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// A short unique name (interface names are limited to 15 bytes).
pub fn unique(tag: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("k{}{}{}", tag, std::process::id() % 100_000, n)
}

/// Runs a command; an error carries its stderr.
pub fn run(cmd: &[&str]) -> io::Result<String> {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} failed: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> io::Result<Netns> {
        let name = unique(tag);
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns { name };
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace.
    pub fn run(&self, cmd: &[&str]) -> io::Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(cmd);
        run(&full)
    }

    /// Runs `f` on the calling thread inside the namespace (sockets it opens stay there),
    /// then returns the thread to its original namespace.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> io::Result<R> {
        let here = std::fs::File::open("/proc/thread-self/ns/net")?;
        let there = std::fs::File::open(format!("/var/run/netns/{}", self.name))?;
        // SAFETY: setns on descriptors we just opened; affects only the calling thread.
        if unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let r = f();
        // SAFETY: as above, back to where the thread was.
        if unsafe { libc::setns(here.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(&["ip", "netns", "del", &self.name]);
    }
}

/// A veth pair with one end in each namespace, both up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> io::Result<()> {
    let tmp_a = unique("va");
    let tmp_b = unique("vb");
    run(&["ip", "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b])?;
    let setup = || -> io::Result<()> {
        run(&["ip", "link", "set", &tmp_a, "netns", &a.name])?;
        run(&["ip", "link", "set", &tmp_b, "netns", &b.name])?;
        a.run(&["ip", "link", "set", "dev", &tmp_a, "name", a_if])?;
        b.run(&["ip", "link", "set", "dev", &tmp_b, "name", b_if])?;
        a.run(&["ip", "link", "set", "dev", a_if, "up"])?;
        b.run(&["ip", "link", "set", "dev", b_if, "up"])?;
        Ok(())
    };
    setup().inspect_err(|_| {
        let _ = run(&["ip", "link", "del", &tmp_a]);
    })
}

/// A switch running in its own namespace on kernel ports opened there, with one adaptive PMD
/// thread; stopped on drop.
pub struct SwitchNode {
    pub switch: std::sync::Arc<crate::switch::Switch>,
    pub pool: std::sync::Arc<crate::buf::Pool>,
    pmd: Option<crate::pmd::PmdSet>,
    pub ns: Netns,
}

impl SwitchNode {
    /// Opens `ports` inside `ns` with `open(name, pool)`, applies `cfg`, starts the PMD.
    pub fn start(
        ns: Netns,
        ports: &[&str],
        open: impl Fn(&str, &std::sync::Arc<crate::buf::Pool>) -> io::Result<std::sync::Arc<dyn crate::port::Port>>,
        cfg: crate::config::SwitchConfig,
    ) -> io::Result<SwitchNode> {
        let pool = crate::buf::Pool::new(8192, false).map_err(io::Error::other)?;
        let switch = crate::switch::Switch::new(pool.clone(), crate::switch::SwitchOptions::default());
        for p in ports {
            let port = ns.enter(|| open(p, &pool))??;
            switch.register_port(p, port).map_err(io::Error::other)?;
        }
        switch.apply(cfg).map_err(io::Error::other)?;
        let pmd = crate::pmd::PmdSet::start(
            switch.clone(),
            &crate::pmd::PmdConfig { threads: 1, cores: vec![], idle: crate::pmd::IdlePolicy::default() },
        )?;
        Ok(SwitchNode { switch, pool, pmd: Some(pmd), ns })
    }
}

impl Drop for SwitchNode {
    fn drop(&mut self) {
        if let Some(p) = self.pmd.take() {
            p.stop();
        }
    }
}

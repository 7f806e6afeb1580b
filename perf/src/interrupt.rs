//! An interrupted run (Ctrl-C, SIGTERM) cleans up before it exits: the network namespaces
//! it made, Open vSwitch's, DPDK's runtime directories, its work directory, and it gives
//! back the hugepages it reserved. Its
//! children (switches, testpmd, OVS) die with it (PR_SET_PDEATHSIG), but destructors do
//! not run on a signal, so without this a stopped run would leave veths and namespaces
//! behind.

use std::path::PathBuf;

/// Blocks SIGINT and SIGTERM in this thread (call it before any other thread starts, so
/// every thread inherits the mask) and waits for them on a thread of its own.
pub fn install(work: PathBuf) -> std::io::Result<()> {
    // SAFETY: a zeroed sigset_t is valid storage for sigemptyset, which initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-set calls on a set we own; pthread_sigmask on the calling thread.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    std::thread::Builder::new().name("interrupt".into()).spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on the set initialised above.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            eprintln!("knitter-perf: interrupted, cleaning up");
            vswitch::testkit::netns::remove_all();
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &crate::ovs::netns_name()])
                .output();
            for prefix in ["kp-yardstick", "kp-ovs"] {
                crate::testpmd::remove_runtime_dir(prefix);
            }
            let _ = std::fs::remove_dir_all(&work);
            crate::machine::restore();
            std::process::exit(128 + sig);
        }
    })?;
    Ok(())
}

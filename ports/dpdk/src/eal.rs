//! The EAL, initialised once per process: its arguments (defaults that let DPDK peers run
//! beside the switch: a file prefix of its own, `--in-memory` where huge pages are free, no
//! PCI scan unless devices are named, no telemetry), the calling thread's CPU affinity kept
//! (the EAL pins its main lcore), and PMD threads registered as non-EAL lcores.

use crate::DpdkError;
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

static EAL: OnceLock<Result<(), DpdkError>> = OnceLock::new();

/// EAL arguments for a process whose file prefix is `prefix`: `--in-memory` when huge pages
/// are free (nothing under /var/run/dpdk, so testpmd and others run beside it), else
/// `--no-huge -m 512 --no-shconf` (the two cannot be combined); the PCI bus only for the
/// devices in `pci` (`-a` each; none: `--no-pci`, so the EAL never touches a NIC the host
/// uses).
pub fn default_args(prefix: &str, pci: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "knitter",
        "-l",
        "0",
        "--no-telemetry",
        "--file-prefix",
        prefix,
        "--log-level",
        "lib.eal:warning",
    ]
    .map(String::from)
    .into();
    if pci.is_empty() {
        a.push("--no-pci".into());
    }
    for addr in pci {
        a.extend(["-a".to_string(), addr.to_string()]);
    }
    if crate::free_huge_pages() > 0 {
        a.push("--in-memory".into());
    } else {
        a.extend(["--no-huge", "-m", "512", "--no-shconf"].map(String::from));
    }
    a
}

/// Initialises the EAL with `args` (the first is the program name) unless it is already:
/// later calls return the first call's outcome, whatever their arguments.
pub fn init(args: &[String]) -> Result<(), DpdkError> {
    EAL.get_or_init(|| init_once(args)).clone()
}

/// Whether the EAL is up.
pub fn initialised() -> bool {
    matches!(EAL.get(), Some(Ok(())))
}

fn init_once(args: &[String]) -> Result<(), DpdkError> {
    let err = |reason: String| DpdkError::Eal { args: args.join(" "), reason };
    let c: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    let mut argv: Vec<*mut libc::c_char> = c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let cpus = affinity();
    // SAFETY: argv holds `c.len()` valid NUL-terminated strings and a NULL, alive for the
    // call (the EAL may permute the pointers, never write through them).
    let r = unsafe { dpdk_sys::rte_eal_init(c.len() as libc::c_int, argv.as_mut_ptr()) };
    if let Some(set) = cpus {
        set_affinity(&set);
    }
    if r < 0 {
        return Err(err(errno_text()));
    }
    tracing::info!(args = %args.join(" "), "DPDK EAL initialised");
    Ok(())
}

/// `rte_errno` as text.
pub(crate) fn errno_text() -> String {
    // SAFETY: reads the calling thread's rte_errno; rte_strerror returns a static or
    // thread-local NUL-terminated string.
    unsafe {
        let e = dpdk_sys::shim_errno();
        CStr::from_ptr(dpdk_sys::rte_strerror(e)).to_string_lossy().into_owned()
    }
}

/// The text of a negative DPDK return value (an errno).
pub(crate) fn ret_text(r: libc::c_int) -> String {
    std::io::Error::from_raw_os_error(-r).to_string()
}

fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

fn set_affinity(set: &libc::cpu_set_t) {
    // SAFETY: a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

thread_local! {
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Registers the calling thread as a non-EAL lcore (once), so mempool caches serve it. A
/// thread the EAL made is one already; a thread it cannot register (no free lcore) works
/// too, through the mempool's shared ring.
#[inline]
pub fn register_thread() {
    if REGISTERED.get() {
        return;
    }
    REGISTERED.set(true);
    // SAFETY: reads the calling thread's lcore id.
    if unsafe { dpdk_sys::shim_lcore_id() } != u32::MAX {
        return;
    }
    // SAFETY: the EAL is initialised (a port exists); registers the calling thread.
    if unsafe { dpdk_sys::rte_thread_register() } < 0 {
        tracing::debug!(reason = %errno_text(), "thread not registered with the EAL");
    }
}

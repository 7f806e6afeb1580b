//! The kernel's hugepage pool as /proc/meminfo reports it, and a wait for pages a process
//! just ended is still giving back: shared by the run's reservation (`machine.rs`) and every
//! DPDK process's start (`testpmd.rs`, `ovs.rs`).

use std::path::PathBuf;

/// What DPDK takes per process (`-m 1024` in `testpmd.rs`, `ovs.rs`), MiB.
pub const DPDK_MIB: u64 = 1024;

/// The hugepage pool of one page size, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub page_kib: u64,
    pub total: u64,
    pub free: u64,
    /// Pages above the persistent pool: in use after the pool was lowered beneath them (a
    /// DPDK process still exiting when a run gave its pages back), freed when released.
    pub surplus: u64,
}

impl Pool {
    /// The default size's pool, from /proc/meminfo.
    pub fn read() -> std::io::Result<Pool> {
        Ok(Pool::parse(&std::fs::read_to_string("/proc/meminfo")?))
    }

    pub(crate) fn parse(meminfo: &str) -> Pool {
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Pool {
            page_kib: field("Hugepagesize:").max(1),
            total: field("HugePages_Total:"),
            free: field("HugePages_Free:"),
            surplus: field("HugePages_Surp:"),
        }
    }

    /// The pool's own size, `nr_hugepages` (surplus pages go away by themselves).
    pub fn persistent(&self) -> u64 {
        self.total.saturating_sub(self.surplus)
    }

    /// Pages of this size holding `mib` MiB.
    pub fn pages_for(&self, mib: u64) -> u64 {
        (mib * 1024).div_ceil(self.page_kib)
    }

    pub(crate) fn sysfs(&self) -> PathBuf {
        PathBuf::from(format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages",
            self.page_kib
        ))
    }
}

/// Waits (at most `within`) until `mib` MiB of hugepages are free: a DPDK process of the
/// round before may still be giving its pages back as the next one starts, and DPDK then
/// fails with "Not enough memory available" inside a reservation that had room for both.
/// Returns the pool as last read; the caller starts its process either way (DPDK's own error
/// says what was short).
pub fn await_free(mib: u64, within: std::time::Duration) -> std::io::Result<Pool> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let pool = Pool::read()?;
        if pool.free >= pool.pages_for(mib) || std::time::Instant::now() >= deadline {
            return Ok(pool);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

//! What a run needs of the machine: the checks `knitter-perf doctor` lists (and every run
//! makes before it starts, stopping at once with the fix), and the hugepages a run
//! reserves for the DPDK processes and the switches — mounted where DPDK looks, given back
//! when the run ends, also when it is interrupted.

pub use crate::hugepages::{DPDK_MIB, Pool, await_free};
use crate::scenario::Scenario;
use crate::switches::Kind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// knitter-vswitchd's buffer pool (16 384 buffers of 2 KiB and their metadata) and Knitter's generator's
/// rings and buffers, rounded up, MiB.
const KNITTER_MIB: u64 = 48;
const VGEN_MIB: u64 = 16;
/// Beyond what the run's processes take: pages a process of the previous trial has not
/// given back yet, and what others on the machine map while they are free (a
/// knitter-vswitchd's pool takes `MAP_HUGETLB` pages when there are some). Without it a
/// testpmd generator beside the yardstick's testpmd, 1 GiB each, needed every page of the
/// reservation and once failed in CI with "Cannot init memory".
const HEADROOM_MIB: u64 = 128;

/// Hugepage memory a run holds at once, MiB: the generator and the hungriest switch run
/// together (one switch at a time), each DPDK process with its `-m`, Knitter's generator
/// with a buffer for every distinct frame (`frames` a side), and [`HEADROOM_MIB`].
pub fn mib_needed(
    switches: &[Kind],
    scenario: Scenario,
    testpmd_generator: bool,
    frames: usize,
) -> u64 {
    let generator =
        if testpmd_generator { DPDK_MIB } else { VGEN_MIB + crate::vgen::frames_mib(frames) };
    let switch = switches
        .iter()
        .map(|k| match k {
            Kind::Yardstick | Kind::Ovs => DPDK_MIB,
            Kind::Knitter | Kind::Baseline | Kind::KnitterAfpacket
                if scenario == Scenario::VxlanTwoVteps =>
            {
                2 * KNITTER_MIB
            }
            Kind::Knitter | Kind::Baseline | Kind::KnitterAfpacket => KNITTER_MIB,
            Kind::Bridge => 0,
        })
        .max()
        .unwrap_or(0);
    generator + switch + HEADROOM_MIB
}

/// Whether a switch of the run cannot run without hugepages (OVS's DPDK with `--no-huge`
/// never finished adding its bridge here: `ovs-vsctl add-br` timed out).
pub fn hugepages_required(switches: &[Kind]) -> bool {
    switches.contains(&Kind::Ovs)
}

/// What to do to have `pages` free: the new `nr_hugepages` to ask the kernel for, if any.
pub fn total_to_ask(pool: Pool, pages: u64) -> Option<u64> {
    (pool.free < pages).then(|| pool.persistent() + (pages - pool.free))
}

/// The first hugetlbfs mount of `page_kib` pages in /proc/mounts (DPDK looks there).
fn mount_of(mounts: &str, page_kib: u64) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (at, fs, opts) = (f.get(1)?, f.get(2)?, f.get(3).copied().unwrap_or(""));
        let size = opts
            .split(',')
            .find_map(|o| o.strip_prefix("pagesize="))
            .map(parse_size_kib)
            .unwrap_or(Some(page_kib))?;
        (*fs == "hugetlbfs" && size == page_kib).then(|| PathBuf::from(*at))
    })
}

/// "2M", "1G", "2048k" → KiB.
fn parse_size_kib(s: &str) -> Option<u64> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().ok()?;
    match unit.to_ascii_uppercase().as_str() {
        "K" | "KB" => Some(n),
        "M" | "MB" => Some(n * 1024),
        "G" | "GB" => Some(n * 1024 * 1024),
        "" => Some(n / 1024),
        _ => None,
    }
}

/// What a run changed, to give back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Undo {
    /// The pool's total before, and the sysfs file it was set through.
    total: Option<(u64, PathBuf)>,
    /// A hugetlbfs the run mounted.
    mounted: Option<PathBuf>,
}

/// The undo of the running reservation, where the interrupt handler finds it.
static UNDO: Mutex<Option<Undo>> = Mutex::new(None);

/// Hugepages held for a run; given back on drop (or by [`restore`] on an interrupt).
#[derive(Debug)]
pub struct Reservation {
    pub pool: Pool,
    /// What was done, for the report's log.
    pub did: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Unprepared {
    #[error(
        "{need} free {kib} KiB hugepages are needed and {free} are free; reserving them needs root: run knitter-perf as root, or `echo {ask} > /proc/sys/vm/nr_hugepages` first, or `--memory plain`{plain_note}"
    )]
    NotRoot { need: u64, free: u64, ask: u64, kib: u64, plain_note: &'static str },
    #[error(
        "the kernel gave {got} of the {need} free hugepages asked for (memory too fragmented): free memory (`sync; echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory`) and run again, or reserve them at boot (`hugepages={need}` on the kernel command line){plain_note}"
    )]
    Short { got: u64, need: u64, plain_note: &'static str },
    #[error("hugepages: {0}")]
    Io(#[from] std::io::Error),
}

const PLAIN_NOTE: &str = ", or `--memory plain` (slower numbers; not with ovs)";

/// Has `need` MiB of hugepages free and a hugetlbfs mounted, reserving and mounting what is
/// missing (as root). The pool goes back to what it was when the reservation drops.
pub fn reserve(need_mib: u64) -> Result<Reservation, Unprepared> {
    let pool = Pool::read()?;
    let need = pool.pages_for(need_mib);
    let mut undo = Undo { total: None, mounted: None };
    let mut did = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if let Some(ask) = total_to_ask(pool, need) {
        if !root {
            return Err(Unprepared::NotRoot {
                need,
                free: pool.free,
                ask,
                kib: pool.page_kib,
                plain_note: PLAIN_NOTE,
            });
        }
        std::fs::write(pool.sysfs(), ask.to_string())?;
        undo.total = Some((pool.persistent(), pool.sysfs()));
        // Pages a DPDK process of a run just ended still holds (it is exiting) count as
        // surplus, and a larger pool takes them over first: they come back free in a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let now = loop {
            let now = Pool::read()?;
            if now.free >= need || std::time::Instant::now() >= deadline {
                break now;
            }
            if let Some(more) = total_to_ask(now, need).filter(|m| *m > now.persistent()) {
                std::fs::write(pool.sysfs(), more.to_string())?;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        if now.free < need {
            put_back(&undo);
            return Err(Unprepared::Short { got: now.free, need, plain_note: PLAIN_NOTE });
        }
        did.push(format!(
            "reserved {} hugepages of {} KiB ({} → {})",
            now.persistent().saturating_sub(pool.persistent()),
            pool.page_kib,
            pool.persistent(),
            now.persistent()
        ));
    }
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    if mount_of(&mounts, pool.page_kib).is_none() && root {
        let at = Path::new("/dev/hugepages");
        std::fs::create_dir_all(at)?;
        mount_hugetlbfs(at, pool.page_kib)?;
        did.push(format!("mounted hugetlbfs on {}", at.display()));
        undo.mounted = Some(at.to_path_buf());
    }
    if undo.total.is_some() || undo.mounted.is_some() {
        *UNDO.lock().unwrap_or_else(|p| p.into_inner()) = Some(undo);
    }
    Ok(Reservation { pool: Pool::read()?, did })
}

fn mount_hugetlbfs(at: &Path, page_kib: u64) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |s: &[u8]| std::ffi::CString::new(s).map_err(std::io::Error::other);
    let (src, target, fs, data) = (
        c(b"nodev")?,
        c(at.as_os_str().as_bytes())?,
        c(b"hugetlbfs")?,
        c(format!("pagesize={page_kib}K").as_bytes())?,
    );
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    if unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fs.as_ptr(), 0, data.as_ptr().cast()) }
        != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn put_back(undo: &Undo) {
    if let Some(c) = undo
        .mounted
        .as_ref()
        .and_then(|at| std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).ok())
    {
        // SAFETY: a NUL-terminated path alive for the call. MNT_DETACH: a DPDK child still
        // exiting may hold it for a moment.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    if let Some((total, file)) = &undo.total
        && let Err(e) = std::fs::write(file, total.to_string())
    {
        eprintln!("knitter-perf: could not give back the hugepages ({}): {e}", file.display());
    }
}

/// Gives back what the running reservation took (at most once): on drop, or from the
/// interrupt handler.
pub fn restore() {
    if let Some(undo) = UNDO.lock().unwrap_or_else(|p| p.into_inner()).take() {
        put_back(&undo);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal: 24608000 kB\nHugePages_Total:     200\nHugePages_Free:      150\nHugePages_Rsvd:        0\nHugePages_Surp:       20\nHugepagesize:       2048 kB\n";

    #[test]
    fn the_pool_and_its_arithmetic() {
        let p = Pool::parse(MEMINFO);
        assert_eq!(p, Pool { page_kib: 2048, total: 200, free: 150, surplus: 20 });
        assert_eq!(p.persistent(), 180);
        assert_eq!(p.pages_for(1024), 512);
        assert_eq!(p.pages_for(1025), 513, "a part page is a page");
        assert_eq!(total_to_ask(p, 100), None, "enough free: nothing asked");
        assert_eq!(total_to_ask(p, 150), None);
        assert_eq!(
            total_to_ask(p, 600),
            Some(630),
            "the pool grows by the shortfall; surplus pages, going away, are not kept"
        );
        let gig = Pool { page_kib: 1024 * 1024, total: 0, free: 0, surplus: 0 };
        assert_eq!(gig.pages_for(1040), 2);
        assert_eq!(Pool::parse("").page_kib, 1, "no hugepage support: no division by zero");
    }

    #[test]
    fn what_a_run_needs() {
        use Kind::*;
        assert_eq!(
            mib_needed(&[Knitter, Yardstick], Scenario::L2, true, 1),
            2048 + HEADROOM_MIB,
            "testpmd generating, testpmd forwarding"
        );
        assert_eq!(
            mib_needed(&[Knitter, Ovs], Scenario::L2, false, 1),
            1040 + HEADROOM_MIB,
            "Knitter's generator beside OVS"
        );
        assert_eq!(mib_needed(&[Knitter], Scenario::L2, false, 1), 64 + HEADROOM_MIB);
        assert_eq!(
            mib_needed(&[Knitter], Scenario::VxlanTwoVteps, false, 1),
            112 + HEADROOM_MIB,
            "two switches at once"
        );
        assert_eq!(
            mib_needed(&[Knitter], Scenario::L2, false, 100_000),
            64 + 387 + HEADROOM_MIB,
            "a 2 KiB buffer a frame beyond the 1,024 a side the generator has anyway"
        );
        let imix_flows = crate::frames::distinct(12, 65535, 1);
        assert!(
            mib_needed(&[Knitter], Scenario::L2, false, imix_flows) > 64 + 1000 + HEADROOM_MIB,
            "IMIX over 65,535 flows: 262,140 frames a side"
        );
        assert!(hugepages_required(&[Knitter, Ovs]) && !hugepages_required(&[Knitter, Yardstick]));
    }

    #[test]
    fn where_dpdk_finds_hugetlbfs() {
        let mounts = "proc /proc proc rw 0 0\nnodev /mnt/huge1g hugetlbfs rw,relatime,pagesize=1024M 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n";
        assert_eq!(mount_of(mounts, 2048), Some(PathBuf::from("/dev/hugepages")));
        assert_eq!(mount_of(mounts, 1024 * 1024), Some(PathBuf::from("/mnt/huge1g")));
        assert_eq!(
            mount_of("nodev /h hugetlbfs rw 0 0\n", 2048),
            Some(PathBuf::from("/h")),
            "no pagesize option: the default size"
        );
        assert_eq!(mount_of("tmpfs /dev/shm tmpfs rw 0 0\n", 2048), None);
        assert_eq!(parse_size_kib("2048k"), Some(2048));
        assert_eq!(parse_size_kib("1G"), Some(1 << 20));
    }

    #[test]
    fn a_refusal_says_what_to_do() {
        let e =
            Unprepared::NotRoot { need: 520, free: 0, ask: 520, kib: 2048, plain_note: PLAIN_NOTE }
                .to_string();
        assert!(
            e.contains("echo 520 > /proc/sys/vm/nr_hugepages") && e.contains("--memory plain"),
            "{e}"
        );
    }
}

//! The packet region in a container that was granted no hugepages: a hugetlb cgroup whose
//! fault limit is 0 (what the kubelet gives a pod without a `hugepages-2Mi` resource) on a
//! host that has free hugepages. `mmap(MAP_HUGETLB | MAP_POPULATE)` succeeds there and the
//! first touch would be a SIGBUS; the region must notice and take ordinary pages instead.
//!
//! The test runs itself again as a child inside such a cgroup (cgroup v1's hugetlb
//! controller, mounted for the test and unmounted after). Skipped, saying so, where it
//! cannot: not root, no hugetlb controller, or cgroup v2 only.

use std::path::{Path, PathBuf};
use std::process::Command;
use vswitch::region::{Backing, Region};

const CHILD: &str = "KNITTER_TEST_HUGETLB_CGROUP";
/// The 2 MiB pool (`/proc/sys/vm/nr_hugepages` is the default size's, which may be 1 GiB).
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A hugetlb hierarchy mounted for the test, a cgroup in it that may fault in no 2 MiB
/// page, and the hugepages added to the pool for it; all undone on drop.
struct NoHugepages {
    mount: PathBuf,
    cgroup: PathBuf,
    /// The 2 MiB pool's size before the test grew it, written back after.
    pool_was: Option<u64>,
}

impl NoHugepages {
    fn make() -> Result<NoHugepages, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
        if !cgroups.lines().any(|l| l.starts_with("hugetlb\t")) {
            return Err("the kernel has no hugetlb cgroup controller".into());
        }
        let mount =
            std::env::temp_dir().join(format!("knitter-test-hugetlb-{}", std::process::id()));
        std::fs::create_dir_all(&mount).map_err(|e| e.to_string())?;
        let ok = Command::new("mount")
            .args(["-t", "cgroup", "-o", "hugetlb", "knitter-test-hugetlb"])
            .arg(&mount)
            .status()
            .map_err(|e| e.to_string())?;
        if !ok.success() {
            let _ = std::fs::remove_dir(&mount);
            return Err(
                "cannot mount cgroup v1's hugetlb controller (a cgroup v2 only host?)".into()
            );
        }
        let mut me = NoHugepages {
            cgroup: mount.join(format!("knitter-test-{}", std::process::id())),
            mount,
            pool_was: None,
        };
        std::fs::create_dir(&me.cgroup).map_err(|e| e.to_string())?;
        std::fs::write(me.cgroup.join("hugetlb.2MB.limit_in_bytes"), "0")
            .map_err(|e| format!("the fault limit: {e}"))?;
        let free = read(&format!("{POOL}/free_hugepages")).unwrap_or(0);
        if free < 4 {
            let total = read(&format!("{POOL}/nr_hugepages")).ok_or("no 2 MiB hugepage pool")?;
            me.pool_was = Some(total);
            std::fs::write(format!("{POOL}/nr_hugepages"), (total + 4 - free).to_string())
                .map_err(|e| e.to_string())?;
            if read(&format!("{POOL}/free_hugepages")).unwrap_or(0) < 4 {
                return Err("the kernel would not make 4 free hugepages".into());
            }
        }
        Ok(me)
    }
}

impl Drop for NoHugepages {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        if let Some(was) = self.pool_was {
            let _ = std::fs::write(format!("{POOL}/nr_hugepages"), was.to_string());
        }
    }
}

#[test]
fn a_process_granted_no_hugepages_gets_ordinary_pages_not_a_sigbus() {
    if let Ok(cgroup) = std::env::var(CHILD) {
        // The child: in the cgroup before the first hugetlb fault, then the region, every
        // byte of it touched.
        std::fs::write(Path::new(&cgroup).join("cgroup.procs"), std::process::id().to_string())
            .expect("join the cgroup");
        let r = Region::new(4 << 20, true).expect("a region");
        // SAFETY: within the mapping, which this test owns.
        unsafe { std::ptr::write_bytes(r.as_ptr(), 0x5a, r.len()) };
        assert_eq!(r.backing(), Backing::Transparent, "no hugepage may be faulted in here");
        return;
    }
    let cg = match NoHugepages::make() {
        Ok(cg) => cg,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_process_granted_no_hugepages_gets_ordinary_pages_not_a_sigbus",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &cg.cgroup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the child: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Outside the cgroup, the same host gives hugepages.
    let r = Region::new(4 << 20, true).unwrap();
    assert_eq!(r.backing(), Backing::HugeTlb, "the host has free hugepages");
    drop(cg);
}

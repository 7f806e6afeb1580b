//! SR-IOV virtual functions, as sriov-cni and the SR-IOV network device plugin handle them:
//! a PF's VFs counted, created and listed through sysfs (`sriov_totalvfs`, `sriov_numvfs`,
//! `virtfnN`), a VF's netdev and driver found, a VF bound to `vfio-pci` (for a DPDK pod or
//! a `dpdk` switch port) and back to its host driver (`driver_override`, `unbind`,
//! `drivers_probe`), and a VF's MAC, VLAN (with 802.1p), spoof checking, trust and link
//! state set through its PF over rtnetlink (`IFLA_VFINFO_LIST`).
//!
//! Every sysfs path is under a root ([`Sysfs::new`]; `/sys` on a host), so tests give it a
//! fake tree. No hardware here has SR-IOV: the rtnetlink requests are checked message by
//! message, and against the kernel only as far as it refuses them for a device without VFs.

use crate::link::{ifinfo, index_of, named};
use crate::netlink::{Msg, NETLINK_ROUTE, NLM_F_ACK, Socket};
use std::io;
use std::path::{Path, PathBuf};
use vswitch::wire::MacAddr;

const RTM_SETLINK: u16 = 19;
const IFLA_VFINFO_LIST: u16 = 22;
const IFLA_VF_INFO: u16 = 1;
const IFLA_VF_MAC: u16 = 1;
const IFLA_VF_VLAN: u16 = 2;
const IFLA_VF_SPOOFCHK: u16 = 4;
const IFLA_VF_LINK_STATE: u16 = 5;
const IFLA_VF_TRUST: u16 = 9;

/// A VF's link as its PF drives it (`IFLA_VF_LINK_STATE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VfLinkState {
    /// Follows the PF's link.
    Auto = 0,
    Enable = 1,
    Disable = 2,
}

/// What to set on VF `vf` of a PF; absent fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VfSettings {
    pub mac: Option<MacAddr>,
    /// VLAN ID (0: none) and 802.1p priority, tagged by the PF on the VF's behalf.
    pub vlan: Option<(u16, u8)>,
    pub spoof_check: Option<bool>,
    pub trust: Option<bool>,
    pub link_state: Option<VfLinkState>,
}

impl VfSettings {
    /// The `RTM_SETLINK` request for VF `vf` of the PF with interface index `pf_index`.
    pub fn request(&self, pf_index: i32, vf: u32) -> Msg {
        let mut m = Msg::new(RTM_SETLINK, NLM_F_ACK, &ifinfo(pf_index, 0, 0));
        m.nest(IFLA_VFINFO_LIST).nest(IFLA_VF_INFO);
        let pair = |a: u32, b: u32| [a.to_ne_bytes(), b.to_ne_bytes()].concat();
        if let Some(mac) = self.mac {
            // struct ifla_vf_mac { __u32 vf; __u8 mac[32]; }
            let mut v = vf.to_ne_bytes().to_vec();
            v.extend(mac.0);
            v.resize(4 + 32, 0);
            m.attr(IFLA_VF_MAC, &v);
        }
        if let Some((vlan, qos)) = self.vlan {
            // struct ifla_vf_vlan { __u32 vf; __u32 vlan; __u32 qos; }
            let mut v = pair(vf, vlan as u32);
            v.extend((qos as u32).to_ne_bytes());
            m.attr(IFLA_VF_VLAN, &v);
        }
        if let Some(on) = self.spoof_check {
            m.attr(IFLA_VF_SPOOFCHK, &pair(vf, on as u32));
        }
        if let Some(on) = self.trust {
            m.attr(IFLA_VF_TRUST, &pair(vf, on as u32));
        }
        if let Some(s) = self.link_state {
            m.attr(IFLA_VF_LINK_STATE, &pair(vf, s as u32));
        }
        m.end().end();
        m
    }

    /// Sets these on VF `vf` of PF `pf` (in the calling thread's namespace).
    pub fn apply(&self, pf: &str, vf: u32) -> io::Result<()> {
        if self.vlan.is_some_and(|(v, q)| v > 4095 || q > 7) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("VF {vf} of {pf}: VLAN 0-4095 and priority 0-7"),
            ));
        }
        let index = index_of(pf)?;
        let mut s = Socket::open(NETLINK_ROUTE)?;
        s.request(&mut self.request(index, vf)).map(drop).map_err(|e| match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => named(
                e,
                format!(
                    "setting VF {vf} of {pf} (its driver has no SR-IOV VF settings: is it a PF?)"
                ),
            ),
            Some(libc::EINVAL) => named(
                e,
                format!("setting VF {vf} of {pf} (no such VF, or a value its driver refuses)"),
            ),
            _ => named(e, format!("setting VF {vf} of {pf}")),
        })
    }
}

/// A VF of a PF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vf {
    pub index: u32,
    /// Its PCI address (`0000:3b:02.1`).
    pub pci: String,
    /// Its kernel netdev, when its driver is a network driver.
    pub netdev: Option<String>,
    /// The driver it is bound to (`iavf`, `mlx5_core`, `vfio-pci`), if any.
    pub driver: Option<String>,
}

/// sysfs, under a root (`/sys` on a host).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

fn not_sriov(pf: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{pf} is not an SR-IOV physical function (no sriov_totalvfs)"),
    )
}

fn read_trim(p: &Path) -> io::Result<String> {
    std::fs::read_to_string(p).map(|s| s.trim().to_string())
}

fn write(p: &Path, v: &str) -> io::Result<()> {
    std::fs::write(p, v).map_err(|e| named(e, format!("writing {v:?} to {}", p.display())))
}

fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p).ok()?.file_name().map(|n| n.to_string_lossy().into_owned())
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// The host's `/sys`.
    pub fn system() -> Sysfs {
        Sysfs::new("/sys")
    }

    fn pf_device(&self, pf: &str) -> PathBuf {
        self.root.join("class/net").join(pf).join("device")
    }

    fn pci(&self, addr: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(addr)
    }

    /// The PF's PCI address.
    pub fn pf_pci(&self, pf: &str) -> io::Result<String> {
        link_name(&self.pf_device(pf)).ok_or_else(|| not_sriov(pf))
    }

    /// How many VFs the PF can have.
    pub fn total_vfs(&self, pf: &str) -> io::Result<u32> {
        let p = self.pf_device(pf).join("sriov_totalvfs");
        read_trim(&p).map_err(|_| not_sriov(pf))?.parse().map_err(|_| not_sriov(pf))
    }

    /// How many VFs the PF has now.
    pub fn num_vfs(&self, pf: &str) -> io::Result<u32> {
        let p = self.pf_device(pf).join("sriov_numvfs");
        read_trim(&p).map_err(|_| not_sriov(pf))?.parse().map_err(|_| not_sriov(pf))
    }

    /// Makes the PF have `n` VFs (the kernel takes a new count only from zero: the VFs there
    /// are removed first). Refused above `sriov_totalvfs`.
    pub fn set_num_vfs(&self, pf: &str, n: u32) -> io::Result<()> {
        let total = self.total_vfs(pf)?;
        if n > total {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{pf} has at most {total} VFs, not {n}"),
            ));
        }
        let now = self.num_vfs(pf)?;
        if now == n {
            return Ok(());
        }
        let p = self.pf_device(pf).join("sriov_numvfs");
        if now != 0 {
            write(&p, "0")?;
        }
        write(&p, &n.to_string())
    }

    /// The PF's VFs, in index order.
    pub fn vfs(&self, pf: &str) -> io::Result<Vec<Vf>> {
        let dev = self.pf_device(pf);
        let n = self.num_vfs(pf)?;
        let mut out = Vec::with_capacity(n as usize);
        for index in 0..n {
            let Some(pci) = link_name(&dev.join(format!("virtfn{index}"))) else { continue };
            out.push(self.vf(index, pci));
        }
        Ok(out)
    }

    fn vf(&self, index: u32, pci: String) -> Vf {
        let dir = self.pci(&pci);
        let netdev = std::fs::read_dir(dir.join("net"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned());
        let driver = link_name(&dir.join("driver"));
        Vf { index, pci, netdev, driver }
    }

    /// The VF at PCI address `pci`: its PF's netdev and its index there (a DEL finds the VF
    /// a pod had by the PCI address the device plugin gave it).
    pub fn vf_by_pci(&self, pci: &str) -> io::Result<(String, Vf)> {
        if !is_pci_address(pci) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{pci:?} is not a PCI address (like 0000:3b:02.1)"),
            ));
        }
        let dir = self.pci(pci);
        let pf_pci = link_name(&dir.join("physfn")).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{pci} is not a VF (no physfn)"))
        })?;
        let pf_dir = self.pci(&pf_pci);
        let pf = std::fs::read_dir(pf_dir.join("net"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("the PF {pf_pci} of {pci} has no netdev"),
                )
            })?;
        let n = self.num_vfs(&pf)?;
        for index in 0..n {
            if link_name(&pf_dir.join(format!("virtfn{index}"))).as_deref() == Some(pci) {
                return Ok((pf, self.vf(index, pci.to_string())));
            }
        }
        Err(io::Error::new(io::ErrorKind::NotFound, format!("{pci} is not among {pf}'s VFs")))
    }

    /// Binds the device at `pci` to `driver` (`vfio-pci` for DPDK): `driver_override`, unbound
    /// from its driver, then probed again.
    pub fn bind(&self, pci: &str, driver: &str) -> io::Result<()> {
        let dir = self.pci(pci);
        if link_name(&dir.join("driver")).as_deref() == Some(driver) {
            return Ok(());
        }
        write(&dir.join("driver_override"), driver)?;
        if dir.join("driver").exists() {
            write(&dir.join("driver/unbind"), pci)?;
        }
        write(&self.root.join("bus/pci/drivers_probe"), pci)
    }

    /// Gives the device at `pci` back to the driver the kernel picks (its host driver):
    /// `driver_override` cleared, unbound, probed again.
    pub fn unbind_to_host(&self, pci: &str) -> io::Result<()> {
        let dir = self.pci(pci);
        write(&dir.join("driver_override"), "\n")?;
        if dir.join("driver").exists() {
            write(&dir.join("driver/unbind"), pci)?;
        }
        write(&self.root.join("bus/pci/drivers_probe"), pci)
    }

    /// The IOMMU group of the device at `pci` (`/dev/vfio/<group>` once bound to vfio-pci).
    pub fn iommu_group(&self, pci: &str) -> Option<String> {
        link_name(&self.pci(pci).join("iommu_group"))
    }
}

/// A fake sysfs for tests (no hardware here has SR-IOV).
#[cfg(any(test, feature = "testkit"))]
pub mod testkit {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    /// A VF of [`fake_pf`]: its netdev (a device of the test's, standing in for it) and the
    /// driver it is bound to (`iavf`, `vfio-pci`; none: unbound).
    #[derive(Debug, Clone, Copy, Default)]
    pub struct FakeVf<'a> {
        pub netdev: Option<&'a str>,
        pub driver: Option<&'a str>,
    }

    /// Under `root`: PF `pf` at PCI 0000:01:00.0 (4 VFs possible) with `vfs` at 0000:01:00.1,
    /// .2, ... in order, each with `physfn`, `driver_override`, IOMMU group 42 + its index,
    /// its netdev and driver link; the drivers' `unbind` and the bus's `drivers_probe` files.
    pub fn fake_pf(root: &Path, pf: &str, vfs: &[FakeVf]) {
        let dev = |a: &str| root.join("bus/pci/devices").join(a);
        let pf_pci = "0000:01:00.0";
        let must = |r: std::io::Result<()>| r.expect("making the fake sysfs");
        must(std::fs::create_dir_all(dev(pf_pci).join("net").join(pf)));
        must(std::fs::create_dir_all(root.join("class/net").join(pf)));
        must(symlink(dev(pf_pci), root.join("class/net").join(pf).join("device")));
        must(std::fs::write(dev(pf_pci).join("sriov_totalvfs"), "4\n"));
        must(std::fs::write(dev(pf_pci).join("sriov_numvfs"), format!("{}\n", vfs.len())));
        must(std::fs::write(root.join("bus/pci/drivers_probe"), ""));
        for (i, vf) in vfs.iter().enumerate() {
            let a = format!("0000:01:00.{}", i + 1);
            must(std::fs::create_dir_all(dev(&a)));
            must(std::fs::write(dev(&a).join("driver_override"), "(null)\n"));
            must(symlink(dev(&a), dev(pf_pci).join(format!("virtfn{i}"))));
            must(symlink(dev(pf_pci), dev(&a).join("physfn")));
            let group = root.join("kernel/iommu_groups").join((42 + i).to_string());
            must(std::fs::create_dir_all(&group));
            must(symlink(group, dev(&a).join("iommu_group")));
            if let Some(n) = vf.netdev {
                must(std::fs::create_dir_all(dev(&a).join("net").join(n)));
            }
            if let Some(d) = vf.driver {
                let driver = root.join("bus/pci/drivers").join(d);
                must(std::fs::create_dir_all(&driver));
                must(std::fs::write(driver.join("unbind"), ""));
                must(symlink(driver, dev(&a).join("driver")));
            }
        }
    }
}

/// Whether `s` has a PCI address's form (`0000:3b:02.1`, or without the domain): hex fields,
/// nothing that walks a path.
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str| !p.is_empty() && p.len() <= 4 && p.chars().all(|c| c.is_ascii_hexdigit());
    let parts: Vec<&str> = s.split([':', '.']).collect();
    matches!(parts.len(), 3 | 4) && parts.iter().all(|p| hex(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PF `pf0` (0000:01:00.0, 4 VFs possible) with two VFs: 01:00.1 on `iavf` as
    /// `pf0v0`, 01:00.2 on no driver; IOMMU group 42 for the first.
    fn fake() -> (tempfile::TempDir, Sysfs) {
        let t = tempfile::tempdir().unwrap();
        testkit::fake_pf(
            t.path(),
            "pf0",
            &[
                testkit::FakeVf { netdev: Some("pf0v0"), driver: Some("iavf") },
                testkit::FakeVf::default(),
            ],
        );
        let s = Sysfs::new(t.path());
        (t, s)
    }

    #[test]
    fn vfs_are_listed_with_their_netdev_and_driver() {
        let (_t, s) = fake();
        assert_eq!((s.total_vfs("pf0").unwrap(), s.num_vfs("pf0").unwrap()), (4, 2));
        let vfs = s.vfs("pf0").unwrap();
        assert_eq!(
            vfs,
            vec![
                Vf {
                    index: 0,
                    pci: "0000:01:00.1".into(),
                    netdev: Some("pf0v0".into()),
                    driver: Some("iavf".into())
                },
                Vf { index: 1, pci: "0000:01:00.2".into(), netdev: None, driver: None },
            ]
        );
        let (pf, vf) = s.vf_by_pci("0000:01:00.2").unwrap();
        assert_eq!((pf.as_str(), vf.index), ("pf0", 1));
        assert_eq!(s.iommu_group("0000:01:00.1").as_deref(), Some("42"));
        assert!(s.vf_by_pci("0000:01:00.0").unwrap_err().to_string().contains("not a VF"));
        assert!(
            s.total_vfs("eth9")
                .unwrap_err()
                .to_string()
                .contains("not an SR-IOV physical function")
        );
    }

    #[test]
    fn vf_counts_go_through_zero_and_stop_at_the_total() {
        let (t, s) = fake();
        let numvfs = t.path().join("bus/pci/devices/0000:01:00.0/sriov_numvfs");
        s.set_num_vfs("pf0", 2).unwrap();
        assert_eq!(std::fs::read_to_string(&numvfs).unwrap(), "2\n", "unchanged: nothing written");
        s.set_num_vfs("pf0", 3).unwrap();
        assert_eq!(std::fs::read_to_string(&numvfs).unwrap(), "3", "the last write (after a 0)");
        let e = s.set_num_vfs("pf0", 5).unwrap_err().to_string();
        assert!(e.contains("at most 4"), "{e}");
    }

    #[test]
    fn binding_writes_override_unbind_and_probe() {
        let (t, s) = fake();
        let r = t.path();
        s.bind("0000:01:00.1", "vfio-pci").unwrap();
        assert_eq!(
            std::fs::read_to_string(r.join("bus/pci/devices/0000:01:00.1/driver_override"))
                .unwrap(),
            "vfio-pci"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("bus/pci/drivers/iavf/unbind")).unwrap(),
            "0000:01:00.1"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("bus/pci/drivers_probe")).unwrap(),
            "0000:01:00.1"
        );
        // A VF on no driver is only probed.
        s.unbind_to_host("0000:01:00.2").unwrap();
        assert_eq!(
            std::fs::read_to_string(r.join("bus/pci/devices/0000:01:00.2/driver_override"))
                .unwrap(),
            "\n"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("bus/pci/drivers_probe")).unwrap(),
            "0000:01:00.2"
        );
    }

    /// The request byte for byte: header, ifinfomsg of the PF, IFLA_VFINFO_LIST > IFLA_VF_INFO >
    /// each setting as the kernel's structs lay it out.
    #[test]
    fn vf_settings_make_the_kernels_request() {
        let s = VfSettings {
            mac: Some(MacAddr([2, 0, 0, 0, 0, 7])),
            vlan: Some((100, 5)),
            spoof_check: Some(true),
            trust: Some(false),
            link_state: Some(VfLinkState::Enable),
        };
        let b = s.request(7, 3).encoded();
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        assert_eq!(u32_at(0) as usize, b.len());
        assert_eq!(u16_at(4), RTM_SETLINK);
        assert_eq!(u16_at(6), 1 | 4, "request, ack");
        assert_eq!(i32::from_ne_bytes(b[20..24].try_into().unwrap()), 7, "the PF's index");
        // Nests: list at 32, info at 36, attributes from 40.
        assert_eq!(u16_at(34) & 0x7fff, IFLA_VFINFO_LIST);
        assert_eq!(u16_at(32) as usize, b.len() - 32);
        assert_eq!(u16_at(38) & 0x7fff, IFLA_VF_INFO);
        let mut at = 40;
        let mut seen = Vec::new();
        while at < b.len() {
            let (len, ty) = (u16_at(at) as usize, u16_at(at + 2));
            let body = &b[at + 4..at + len];
            assert_eq!(
                u32::from_ne_bytes(body[..4].try_into().unwrap()),
                3,
                "every setting names VF 3"
            );
            seen.push((ty, body[4..].to_vec()));
            at += len.next_multiple_of(4);
        }
        let mut mac = vec![2, 0, 0, 0, 0, 7];
        mac.resize(32, 0);
        assert_eq!(
            seen,
            vec![
                (IFLA_VF_MAC, mac),
                (IFLA_VF_VLAN, [100u32.to_ne_bytes(), 5u32.to_ne_bytes()].concat()),
                (IFLA_VF_SPOOFCHK, 1u32.to_ne_bytes().to_vec()),
                (IFLA_VF_TRUST, 0u32.to_ne_bytes().to_vec()),
                (IFLA_VF_LINK_STATE, 1u32.to_ne_bytes().to_vec()),
            ]
        );
    }
}

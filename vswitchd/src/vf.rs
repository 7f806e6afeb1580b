//! SR-IOV VFs as pods' interfaces (Knitter's `nic_type: direct`, a NAD's `interfaceType:
//! sriov`), as sriov-cni does it beside the SR-IOV network device plugin: the VF is the one
//! the device plugin allocated (its PCI address, `deviceID`) or, without a device plugin, a
//! free VF of the node's PFs (`[sriov] pfs`); its MAC, VLAN and spoof checking are set
//! through its PF; a VF on a network driver goes into the pod's namespace renamed, with the
//! manager's MAC, MTU, addresses and routes, while one bound to vfio-pci stays where it is
//! for the pod's DPDK app (the device plugin mounts its `/dev/vfio/N`). DEL gives the netdev
//! back to the node under its own name and MAC, down, and resets the VLAN; a pod namespace
//! that went first (the kernel returns a physical netdev to the node by itself) is handled.
//! The switch is not involved: the VF's frames go through the NIC's own switch.

use crate::plumb::{self, Plan};
use crate::records::VfHeld;
use crate::settings::SriovSection;
use knitter_api::node as pb;
use plumbing::link::{self, LinkChange};
use plumbing::sriov::{Sysfs, Vf, VfSettings};
use std::io;
use std::sync::{Arc, Mutex, OnceLock};
use vswitch::wire::MacAddr;

/// Why a pod gets no VF.
#[derive(Debug, thiserror::Error)]
pub enum VfError {
    #[error(
        "the request names no VF (deviceID) and the node has no SR-IOV PFs to pick one from ([sriov] pfs): give the NAD the SR-IOV device plugin's resourceName, or configure the node's PFs"
    )]
    NoPool,
    #[error("the network's SR-IOV pool {0:?} is not on this node ([sriov.pools] has {1})")]
    UnknownPool(String, String),
    #[error("no free VF on {pfs}: {held} of {usable} usable VFs are held by pods{why}")]
    Exhausted { pfs: String, held: usize, usable: usize, why: String },
    #[error("VF {pci} is attached to {by}")]
    Held { pci: String, by: String },
    #[error("VF {pci} {why}")]
    Unusable { pci: String, why: String },
    #[error(
        "VF {pci} is not one of the network's pool ({pfs}): a pod names only a VF of its network's pool"
    )]
    NotInPool { pci: String, pfs: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Sets a VF's MAC and VLAN through its PF. The kernel over rtnetlink on a host; a test gives
/// its own to see what was asked (no hardware here has SR-IOV).
pub trait PfControl: Send + Sync {
    fn set_vf(&self, pf: &str, vf: u32, settings: &VfSettings) -> io::Result<()>;
}

struct Rtnetlink;

impl PfControl for Rtnetlink {
    fn set_vf(&self, pf: &str, vf: u32, settings: &VfSettings) -> io::Result<()> {
        settings.apply(pf, vf)
    }
}

/// The node's VFs for pods.
pub struct Vfs {
    sysfs: Sysfs,
    pfs: Vec<String>,
    pools: std::collections::BTreeMap<String, Vec<String>>,
    pf_settings: bool,
    spoof_check: bool,
    pf: Box<dyn PfControl>,
    /// Choosing and claiming a VF is one step: two ADDs never pick the same.
    choosing: Mutex<()>,
}

/// An attachment's VF and who holds it (`container/ifname`).
pub type Holder = (String, String);

impl Vfs {
    pub fn new(s: &SriovSection) -> Vfs {
        Vfs::with_control(s, Box::new(Rtnetlink))
    }

    pub fn with_control(s: &SriovSection, pf: Box<dyn PfControl>) -> Vfs {
        Vfs {
            sysfs: Sysfs::new(&s.sysfs),
            pfs: s.pfs.clone(),
            pools: s.pools.clone(),
            pf_settings: s.pf_settings,
            spoof_check: s.spoof_check,
            pf,
            choosing: Mutex::new(()),
        }
    }

    /// The NPWG device-info of the VF `device_id` names (`{"type":"pci",...}`, published in
    /// the pod's network-status), when it names one this node has; a VF the node picks is
    /// known only after the manager's port is made.
    pub fn device_info(&self, device_id: &str) -> Option<String> {
        if device_id.is_empty() {
            return None;
        }
        let (pf, vf) = self.sysfs.vf_by_pci(device_id).ok()?;
        Some(
            knitter_api::device_info::pci(&vf.pci, &self.sysfs.pf_pci(&pf).unwrap_or_default())
                .to_string(),
        )
    }

    /// Chooses a VF — `device_id`'s, or a free one of `pool`'s PFs (`None`: `[sriov] pfs`) —
    /// and claims it with `claim` (which records it, refusing a VF held meanwhile), under one
    /// lock. `held` lists the VFs attachments hold, read under that lock (so two ADDs at once
    /// pick two VFs). A VF the pod named itself (`pods_choice`) must be one of those PFs'; the
    /// device plugin's may be any (the kubelet gave it to the pod).
    pub fn choose_and_claim<T>(
        &self,
        device_id: &str,
        pods_choice: bool,
        pool: Option<&str>,
        held: impl FnOnce() -> Vec<Holder>,
        claim: impl FnOnce(VfHeld) -> Result<T, VfError>,
    ) -> Result<T, VfError> {
        let pfs = match pool {
            None => &self.pfs,
            Some(p) => self.pools.get(p).ok_or_else(|| {
                let have = if self.pools.is_empty() {
                    "none".to_string()
                } else {
                    self.pools.keys().cloned().collect::<Vec<_>>().join(", ")
                };
                VfError::UnknownPool(p.into(), have)
            })?,
        };
        let _one = self.choosing.lock().unwrap_or_else(|p| p.into_inner());
        let vf = self.choose(device_id, pfs, &held())?;
        if pods_choice && !pfs.contains(&vf.pf) {
            return Err(VfError::NotInPool {
                pci: vf.pci,
                pfs: if pfs.is_empty() { "none".into() } else { pfs.join(", ") },
            });
        }
        claim(vf)
    }

    /// The VF named by `device_id` (its PCI address), or the first free one of the node's PFs
    /// that has a netdev (a VF bound to vfio-pci is only given when named: its pod needs the
    /// device plugin for `/dev/vfio`).
    fn choose(&self, device_id: &str, pfs: &[String], held: &[Holder]) -> Result<VfHeld, VfError> {
        let is_held = |pci: &str| held.iter().find(|(p, _)| p == pci).map(|(_, by)| by.clone());
        if !device_id.is_empty() {
            let (pf, vf) = self.sysfs.vf_by_pci(device_id).map_err(|e| VfError::Unusable {
                pci: device_id.into(),
                why: format!("cannot be used: {e}"),
            })?;
            if let Some(by) = is_held(&vf.pci) {
                return Err(VfError::Held { pci: vf.pci, by });
            }
            return self.held(pf, vf);
        }
        if pfs.is_empty() {
            return Err(VfError::NoPool);
        }
        let (mut usable, mut taken, mut problems) = (0, 0, Vec::new());
        for pf in pfs {
            let vfs = match self.sysfs.vfs(pf) {
                Ok(v) => v,
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            for vf in vfs.into_iter().filter(|v| v.netdev.is_some() && !is_vfio(v)) {
                usable += 1;
                if is_held(&vf.pci).is_some() {
                    taken += 1;
                    continue;
                }
                return self.held(pf.clone(), vf);
            }
        }
        let why =
            if problems.is_empty() { String::new() } else { format!(" ({})", problems.join("; ")) };
        Err(VfError::Exhausted { pfs: pfs.join(", "), held: taken, usable, why })
    }

    fn held(&self, pf: String, vf: Vf) -> Result<VfHeld, VfError> {
        let pf_pci = self.sysfs.pf_pci(&pf).unwrap_or_default();
        let netdev = if is_vfio(&vf) {
            None
        } else {
            let name = vf.netdev.clone().ok_or_else(|| VfError::Unusable { pci: vf.pci.clone(), why: "has no netdev on the node and is not bound to vfio-pci (is its driver loaded? is it in another pod?)".into() })?;
            Some(name)
        };
        let netdev_mac = match &netdev {
            Some(n) => Some(
                link::link(n)?
                    .ok_or_else(|| VfError::Unusable {
                        pci: vf.pci.clone(),
                        why: format!("has no netdev {n} on the node (is it in another pod?)"),
                    })?
                    .mac,
            ),
            None => None,
        };
        Ok(VfHeld {
            pci: vf.pci,
            pf,
            pf_pci,
            index: vf.index,
            netdev,
            netdev_mac,
            pf_settings: self.pf_settings,
        })
    }

    /// Gives `vf` to the pod as `plan` says (its MAC, MTU, addresses, routes), on VLAN `vlan`
    /// (0: untagged). Undone on failure.
    pub fn give(&self, vf: &VfHeld, plan: &Plan, vlan: u16) -> io::Result<()> {
        if let Some(netdev) = &vf.netdev {
            plumb::name_free_in_pod(&plan.netns, &plan.ifname)?;
            if link::link(netdev)?.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("VF {}'s netdev {netdev} is not on the node", vf.pci),
                ));
            }
        }
        if vf.pf_settings {
            let s = VfSettings {
                mac: Some(MacAddr(plan.mac)),
                vlan: Some((vlan, 0)),
                spoof_check: Some(self.spoof_check),
                ..Default::default()
            };
            self.pf.set_vf(&vf.pf, vf.index, &s)?;
        }
        let Some(netdev) = &vf.netdev else { return Ok(()) };
        let moved = std::fs::File::open(&plan.netns).and_then(|ns| {
            link::change(
                netdev,
                &LinkChange {
                    netns: Some(&ns),
                    rename: Some(&plan.ifname),
                    mac: Some(plan.mac),
                    mtu: Some(plan.mtu),
                    ..Default::default()
                },
            )
        });
        let given = moved.and_then(|()| plumb::configure_in_pod(plan, false));
        if let Err(e) = given {
            let problems = self.take_back(vf, &plan.netns, &plan.ifname);
            if !problems.is_empty() {
                tracing::warn!(vf = %vf.pci, ?problems, "undoing a failed VF attach");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Gives the VF back to the node: its netdev from the pod (or wherever the kernel put
    /// it when the pod's namespace went) under its own name and MAC, down; its VLAN reset.
    /// Best effort: what could not be done comes back as problems (DEL goes on: a DEL that
    /// fails for good leaks the VF for ever, sriov-cni #126).
    pub fn take_back(&self, vf: &VfHeld, netns: &str, ifname: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(name) = &vf.netdev
            && let Err(e) = self.netdev_back(vf, name, netns, ifname)
        {
            problems.push(e.to_string());
        }
        if vf.pf_settings {
            let s = VfSettings {
                vlan: Some((0, 0)),
                mac: vf.netdev_mac.map(MacAddr),
                ..Default::default()
            };
            if let Err(e) = self.pf.set_vf(&vf.pf, vf.index, &s) {
                problems.push(e.to_string());
            }
        }
        problems
    }

    fn netdev_back(&self, vf: &VfHeld, name: &str, netns: &str, ifname: &str) -> io::Result<()> {
        // The calling thread's namespace: the node's (the daemon's threads all run there).
        let home = std::fs::File::open("/proc/thread-self/ns/net")?;
        // In its pod: moved home, renamed, its MAC restored and down, in one request.
        let (pod_if, own, mac) = (ifname.to_string(), name.to_string(), vf.netdev_mac);
        let from_pod = link::in_netns(netns, move || {
            if link::link(&pod_if)?.is_none() {
                return Ok(false);
            }
            link::change(
                &pod_if,
                &LinkChange {
                    netns: Some(&home),
                    rename: Some(&own),
                    mac,
                    down: true,
                    ..Default::default()
                },
            )
            .map(|()| true)
        });
        match from_pod {
            Ok(true) => return Ok(()),
            Err(e) if std::path::Path::new(netns).exists() => return Err(e),
            _ => {}
        }
        // The pod's namespace is gone (or the VF left it): the kernel brought the netdev back
        // to the node, perhaps under another name; sysfs says which.
        let now = self
            .sysfs
            .vf_by_pci(&vf.pci)
            .ok()
            .and_then(|(_, v)| v.netdev)
            .filter(|n| matches!(link::link(n), Ok(Some(_))));
        match now {
            Some(n) => link::change(
                &n,
                &LinkChange {
                    down: true,
                    rename: (n != name).then_some(name),
                    mac: vf.netdev_mac,
                    ..Default::default()
                },
            ),
            None if matches!(link::link(name), Ok(Some(_))) => link::change(
                name,
                &LinkChange { down: true, mac: vf.netdev_mac, ..Default::default() },
            ),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "VF {}'s netdev was found neither in the pod ({netns}, {ifname}) nor on the node",
                    vf.pci
                ),
            )),
        }
    }

    /// The node's PFs (the default ones and the pools') and their VFs, each with the
    /// attachment holding it.
    pub fn report(&self, held: &[Holder]) -> Vec<pb::PhysicalFunction> {
        let mut pfs: Vec<&String> = self.pfs.iter().chain(self.pools.values().flatten()).collect();
        pfs.sort();
        pfs.dedup();
        pfs.into_iter()
            .map(|pf| {
                let mut out = pb::PhysicalFunction {
                    name: pf.clone(),
                    pci: self.sysfs.pf_pci(pf).unwrap_or_default(),
                    ..Default::default()
                };
                match self.sysfs.total_vfs(pf).and_then(|t| Ok((t, self.sysfs.vfs(pf)?))) {
                    Err(e) => out.problem = e.to_string(),
                    Ok((total, vfs)) => {
                        out.total_vfs = total;
                        out.vfs = vfs
                            .into_iter()
                            .map(|v| pb::VirtualFunction {
                                attached_to: held
                                    .iter()
                                    .find(|(p, _)| *p == v.pci)
                                    .map(|(_, by)| by.clone())
                                    .unwrap_or_default(),
                                index: v.index,
                                pci: v.pci,
                                netdev: v.netdev.unwrap_or_default(),
                                driver: v.driver.unwrap_or_default(),
                            })
                            .collect();
                    }
                }
                out
            })
            .collect()
    }
}

/// The node's VFs: the attach service's, and for `dpdk` switch ports on a VF (set once at
/// start, before the state's ports open).
static NODE_VFS: OnceLock<Arc<Vfs>> = OnceLock::new();

/// Sets the node's VFs (the first call wins) and returns them.
pub fn set_node_vfs(vfs: Vfs) -> Arc<Vfs> {
    NODE_VFS.get_or_init(|| Arc::new(vfs)).clone()
}

/// Readies the device at `pci` when it is an SR-IOV VF the switch takes as a `dpdk` port
/// (a node given a VF instead of a whole NIC; experimental: not tried on hardware): bound
/// to vfio-pci, and through its PF trusted with spoof checking off (the switch sends for
/// every pod's MAC and needs promiscuous mode). Anything else at `pci` is left to DPDK.
pub fn prepare_switch_port(pci: &str) -> Result<(), VfError> {
    NODE_VFS.get().map_or(Ok(()), |v| v.prepare_for_switch(pci))
}

impl Vfs {
    fn prepare_for_switch(&self, pci: &str) -> Result<(), VfError> {
        let Ok((pf, vf)) = self.sysfs.vf_by_pci(pci) else { return Ok(()) };
        if !is_vfio(&vf) {
            self.sysfs.bind(pci, "vfio-pci").map_err(|e| VfError::Unusable { pci: pci.into(), why: format!("cannot be bound to vfio-pci for the switch: {e} (is the vfio-pci module loaded?)") })?;
            tracing::info!(vf = pci, pf = %pf, was = ?vf.driver, "VF bound to vfio-pci for a dpdk switch port");
        }
        if self.pf_settings {
            let s =
                VfSettings { trust: Some(true), spoof_check: Some(false), ..Default::default() };
            self.pf.set_vf(&pf, vf.index, &s)?;
        }
        Ok(())
    }
}

fn is_vfio(v: &Vf) -> bool {
    v.driver.as_deref() == Some("vfio-pci")
}

#[cfg(test)]
mod tests {
    use super::*;
    use plumbing::sriov::testkit::{FakeVf, fake_pf};
    use std::sync::Arc;
    use vswitch::testkit::netns::{self, Netns};

    /// What a PF was asked, in order; refuses the first `fail` requests.
    #[derive(Default)]
    struct Recorder {
        asked: Mutex<Vec<(String, u32, VfSettings)>>,
        fail: Mutex<u32>,
    }

    impl PfControl for Arc<Recorder> {
        fn set_vf(&self, pf: &str, vf: u32, settings: &VfSettings) -> io::Result<()> {
            let mut fail = self.fail.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            self.asked.lock().unwrap().push((pf.into(), vf, settings.clone()));
            Ok(())
        }
    }

    /// A VF the pod named itself must be one of the pool's PFs' (the device plugin's may be
    /// any: the kubelet gave it to the pod); a name that is no PCI address walks nowhere.
    #[test]
    fn a_pods_own_vf_must_be_in_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        fake_pf(dir.path(), "pf0", &[FakeVf { netdev: None, driver: Some("vfio-pci") }]);
        let pool = |pfs: &[&str]| {
            let section = SriovSection {
                sysfs: dir.path().into(),
                pfs: pfs.iter().map(|p| p.to_string()).collect(),
                ..Default::default()
            };
            Vfs::with_control(&section, Box::new(Arc::new(Recorder::default())))
        };
        let (inside, outside) = (pool(&["pf0"]), pool(&[]));
        assert_eq!(
            inside.choose_and_claim("0000:01:00.1", true, None, Vec::new, Ok).unwrap().pci,
            "0000:01:00.1"
        );
        assert!(matches!(
            outside.choose_and_claim("0000:01:00.1", true, None, Vec::new, Ok),
            Err(VfError::NotInPool { .. })
        ));
        assert_eq!(
            outside.choose_and_claim("0000:01:00.1", false, None, Vec::new, Ok).unwrap().pci,
            "0000:01:00.1",
            "the device plugin's"
        );
        for bad in ["../../../../etc", "0000:01:00.1/../..", "x"] {
            assert!(
                matches!(
                    inside.choose_and_claim(bad, true, None, Vec::new, Ok),
                    Err(VfError::Unusable { .. })
                ),
                "{bad}"
            );
        }
    }

    /// Through the PF: at ADD the manager's MAC, the network's VLAN and spoof checking; at
    /// DEL VLAN 0 and the VF's own MAC back. A PF that refuses leaves the VF on the node.
    #[test]
    fn the_pf_is_asked_for_mac_and_vlan_and_to_reset_them() {
        let Some(_g) = netns::exclusive() else { return };
        let (node, pod) = (Netns::new("vfn").unwrap(), Netns::new("vfp").unwrap());
        node.run(&[
            "ip",
            "link",
            "add",
            "vfx0",
            "address",
            "02:00:00:00:0e:01",
            "type",
            "veth",
            "peer",
            "name",
            "vfw0",
        ])
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        fake_pf(dir.path(), "pf0", &[FakeVf { netdev: Some("vfx0"), driver: Some("iavf") }]);
        let rec = Arc::new(Recorder::default());
        let section = SriovSection {
            sysfs: dir.path().into(),
            pfs: vec!["pf0".into()],
            pf_settings: true,
            spoof_check: true,
            ..Default::default()
        };
        let vfs = Vfs::with_control(&section, Box::new(rec.clone()));
        let plan = Plan {
            host: String::new(),
            netns: format!("/run/netns/{}", pod.name),
            ifname: "eth0".into(),
            mac: [0x0a, 0x58, 10, 0, 0, 2],
            mtu: 1400,
            addresses: vec![("10.0.0.2".parse().unwrap(), 24)],
            routes: Vec::new(),
        };
        node.enter(|| {
            let vf = vfs.choose_and_claim("", false, None, Vec::new, Ok).unwrap();
            let info: serde_json::Value = serde_json::from_str(&vfs.device_info("0000:01:00.1").unwrap()).unwrap();
            assert_eq!(info["pci"], serde_json::json!({ "pci-address": "0000:01:00.1", "pf-pci-address": "0000:01:00.0" }));
            assert_eq!((vfs.device_info(""), vfs.device_info("0000:09:00.1")), (None, None), "none named, or not this node's");
            assert!(matches!(vfs.choose_and_claim("", false, Some("fast"), Vec::new, Ok), Err(VfError::UnknownPool(..))));
            assert_eq!((vf.pci.as_str(), vf.pf.as_str(), vf.pf_pci.as_str(), vf.netdev_mac), ("0000:01:00.1", "pf0", "0000:01:00.0", Some([2, 0, 0, 0, 0x0e, 1])));
            *rec.fail.lock().unwrap() = 1;
            let e = vfs.give(&vf, &plan, 100).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
            assert!(link::link("vfx0").unwrap().is_some(), "a refused PF leaves the VF on the node");
            vfs.give(&vf, &plan, 100).unwrap();
            let asked = VfSettings { mac: Some(MacAddr(plan.mac)), vlan: Some((100, 0)), spoof_check: Some(true), ..Default::default() };
            assert_eq!(rec.asked.lock().unwrap().as_slice(), &[("pf0".to_string(), 0, asked)]);
            assert!(link::link("vfx0").unwrap().is_none());
            let held = [("0000:01:00.1".to_string(), "c/eth0".to_string())];
            assert!(matches!(vfs.choose_and_claim("", false, None, || held.to_vec(), Ok), Err(VfError::Exhausted { held: 1, usable: 1, .. })));
            assert_eq!(vfs.report(&held)[0].vfs[0].attached_to, "c/eth0");
            assert!(vfs.take_back(&vf, &plan.netns, "eth0").is_empty());
            let reset = VfSettings { mac: Some(MacAddr([2, 0, 0, 0, 0x0e, 1])), vlan: Some((0, 0)), ..Default::default() };
            assert_eq!(rec.asked.lock().unwrap()[1], ("pf0".to_string(), 0, reset));
            let back = link::link("vfx0").unwrap().expect("the VF is back on the node");
            assert_eq!((back.mac, back.up), ([2, 0, 0, 0, 0x0e, 1], false));
            // The same VF given to the switch as a dpdk port: bound to vfio-pci, trusted,
            // spoof checking off; a PCI address that is no VF is left alone.
            vfs.prepare_for_switch("0000:01:00.1").unwrap();
            let sys = dir.path().join("bus/pci/devices/0000:01:00.1/driver_override");
            assert_eq!(std::fs::read_to_string(sys).unwrap(), "vfio-pci");
            let switch = VfSettings { trust: Some(true), spoof_check: Some(false), ..Default::default() };
            assert_eq!(rec.asked.lock().unwrap()[2], ("pf0".to_string(), 0, switch));
            vfs.prepare_for_switch("0000:3b:00.0").unwrap();
            assert_eq!(rec.asked.lock().unwrap().len(), 3);
        })
        .unwrap();
        let in_pod = pod.run(&["ip", "-o", "link"]).unwrap();
        assert_eq!(in_pod.lines().count(), 1, "{in_pod}");
    }
}

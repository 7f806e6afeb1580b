//! The node: one switch, its PMD threads, the open port devices and the desired state.
//! Every change is made on a copy of the state, validated whole by the switch and published
//! atomically (PMD threads move to the new snapshot between bursts; ports the change does not
//! name are untouched), then persisted. A refused change leaves everything as it was.

use crate::devices::{self, DeviceError, OpenPort};
use crate::state::{Device, Document, NodeState, Owned, Owner, PortSpec, StateError};
use kernel_ports::afxdp::UnderlayFilter;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use vswitch::config::{BridgeConfig, PeerConfig, PortMode, VtepConfig};
use vswitch::snapshot::ConfigError;
use vswitch::{PmdConfig, PmdSet, Pool, Switch, SwitchOptions};

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{kind} {name:?} already exists (owner {owner})")]
    Exists { kind: &'static str, name: String, owner: Owner },
    #[error("no {kind} named {name:?}")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} is owned by {owner}; a {by} request may not change it")]
    NotOwner { kind: &'static str, name: String, owner: Owner, by: Owner },
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("port {port:?}: {what} cannot open beside it; delete the port first, then apply")]
    DeviceKept { port: String, what: &'static str },
    #[error("the change was applied but not persisted: {0}")]
    State(#[from] StateError),
    #[error("VF {pci} is attached to {by}")]
    VfHeld { pci: String, by: String },
    #[error("port {port:?}: {why}")]
    HostPort { port: String, why: String },
    #[error("port {port:?}: {why}")]
    PodPath { port: String, why: crate::pod_dirs::Refusal },
}

/// What an apply changed (or, dry, would change).
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub generation: u64,
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
    /// Local objects of the kinds a document names that it lacks, kept (no prune).
    pub kept: Vec<String>,
    /// What was not applied, with why (the manager's objects a local one shadows).
    pub skipped: Vec<String>,
    /// Some of what was skipped may go through when tried again (a device that did not open).
    pub retry: bool,
}

/// How the node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub pmd: PmdConfig,
    pub buffers: u32,
    /// The pod ports `buffers` was sized for (`None`: given as a number).
    pub sized_for_pods: Option<u32>,
    pub hugepages: bool,
    /// The FDB's and the exact-match caches' sizes.
    pub tables: SwitchOptions,
    /// Where the state is persisted; `None`: nowhere (tests, the demo).
    pub state_file: Option<PathBuf>,
    /// Directories pods can write beside every attachment's own (the kubelet's pods
    /// directory, the shared vhost-user hand-off directory): no `dpdk` port's devargs may name
    /// a file there; and `[dpdk] dirs`, the only ones they may when given
    /// ([`crate::pod_dirs`]).
    pub dpdk_dirs: crate::pod_dirs::Dirs,
}

struct Inner {
    state: NodeState,
    open: BTreeMap<String, OpenPort>,
    /// Ports in the state whose device did not open at start (left out of the switch).
    failed: BTreeMap<String, String>,
    /// The local pods' addresses each open host port's table has (`host::set_local`).
    local_pods: BTreeMap<String, Vec<std::net::IpAddr>>,
}

pub struct Node {
    pub switch: Arc<Switch>,
    pub events: crate::events::Events,
    pub pool: Arc<Pool>,
    pub opts: NodeOptions,
    pmd: Mutex<Option<PmdSet>>,
    inner: Mutex<Inner>,
    /// Why the manager refused this node's credential at the last attempt (join or sync),
    /// until it accepts one: the node is not ready (a bad token holds a rollout).
    manager_refusal: Mutex<Option<String>>,
}

/// Whether a document's object is the document's own to add or change (`true`), or another
/// owner's, never applied (`false`): as the node has it (what `-o yaml` of a list prints),
/// silently; otherwise (a saved document the pods or the manager moved on from) named in
/// `skipped`. A local object that is another owner's on the node refuses the document.
fn documents_local<T: PartialEq>(
    doc: &Owned<T>,
    node: Option<&Owned<T>>,
    kind: &'static str,
    name: &str,
    skipped: &mut Vec<String>,
) -> Result<bool, NodeError> {
    match (doc.owner, node) {
        (Owner::Local, Some(o)) if o.owner != Owner::Local => {
            Err(NodeError::NotOwner { kind, name: name.into(), owner: o.owner, by: Owner::Local })
        }
        (Owner::Local, _) => Ok(true),
        (theirs, Some(o)) if o.owner == theirs && o.item == doc.item => Ok(false),
        (theirs, _) => {
            skipped.push(format!(
                "{kind} {name} ({theirs}'s in the document, not as the node has it)"
            ));
            Ok(false)
        }
    }
}

/// What becomes of the node's objects of one kind under a document: another owner's stay,
/// and the local ones the document lacks (`lacked`) are removed when `remove`, else stay and,
/// when the document names the kind (`named`), are reported kept. Everything that stays goes
/// into `keep`; returns the names of the removed ones.
#[allow(clippy::too_many_arguments)]
fn carry_over<T: Clone>(
    have: &[Owned<T>],
    lacked: impl Fn(&T) -> bool,
    name: impl Fn(&T) -> &str,
    kind: &str,
    remove: bool,
    named: bool,
    report: &mut ApplyReport,
    keep: &mut Vec<Owned<T>>,
) -> Vec<String> {
    let mut removed = Vec::new();
    for o in have {
        let n = name(&o.item);
        match o.owner {
            Owner::Local if !lacked(&o.item) => continue,
            Owner::Local if remove => {
                report.removed.push(format!("{kind} {n}"));
                removed.push(n.to_string());
                continue;
            }
            Owner::Local if named => report.kept.push(format!("{kind} {n}")),
            _ => {}
        }
        keep.push(o.clone());
    }
    removed
}

fn owned_by<T>(o: &Owned<T>, kind: &'static str, name: &str, by: Owner) -> Result<(), NodeError> {
    if o.owner == by {
        Ok(())
    } else {
        Err(NodeError::NotOwner { kind, name: name.into(), owner: o.owner, by })
    }
}

/// The AF_XDP filter an underlay port needs for `vtep`.
fn underlay_filter(vtep: &VtepConfig) -> UnderlayFilter {
    UnderlayFilter {
        vtep: vtep.local_ip,
        udp_port: vtep.udp_port,
        vlan: vtep.underlay_vlan,
        shared: vtep.shared_address,
    }
}

impl Node {
    /// Starts the switch and its PMD threads, opens the devices of `state` and applies it.
    /// A port whose device does not open is left out (and reported by [`Node::failed_ports`]);
    /// a state the switch refuses as a whole is an error.
    pub fn start(opts: NodeOptions, state: NodeState) -> anyhow::Result<Node> {
        let pool = Pool::new(opts.buffers, opts.hugepages)?;
        tracing::info!(buffers = opts.buffers, backing = %pool.backing(), "buffer pool ready");
        let switch = Switch::new(pool.clone(), opts.tables);
        tracing::info!(
            fdb_entries = opts.tables.fdb_entries,
            emc_entries = opts.tables.emc_entries,
            megaflow_entries = opts.tables.megaflow_entries,
            "forwarding tables ready"
        );
        let mut inner = Inner {
            state: NodeState::default(),
            open: BTreeMap::new(),
            failed: BTreeMap::new(),
            local_pods: BTreeMap::new(),
        };
        for p in &state.ports {
            let name = &p.item.config.name;
            // A port kept from before the guard on pods' directories is left out too.
            let opened = Self::check_not_in_pods(&state, &p.item, &opts.dpdk_dirs)
                .and_then(|()| Self::open_device(&pool, &state, &p.item).map_err(NodeError::from));
            match opened {
                Ok(open) => {
                    switch.register_port(name, open.port.clone())?;
                    inner.open.insert(name.clone(), open);
                }
                Err(e) => {
                    tracing::error!(port = %name, error = %e, "port left out");
                    inner.failed.insert(name.clone(), e.to_string());
                }
            }
        }
        let cfg = state.switch_config(|n| inner.open.contains_key(n));
        switch.apply(cfg)?;
        inner.state = state;
        refresh_local_pods(&mut inner);
        let pmd = PmdSet::start(switch.clone(), &opts.pmd)?;
        // The TSC's rate (100 ms to measure) is known before `pmd show` or a scrape asks.
        std::thread::spawn(vswitch::util::tsc_hz);
        let events = crate::events::Events::default();
        Ok(Node {
            switch,
            events,
            pool,
            opts,
            pmd: Mutex::new(Some(pmd)),
            inner: Mutex::new(inner),
            manager_refusal: Mutex::new(None),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open_device(
        pool: &Arc<Pool>,
        state: &NodeState,
        spec: &PortSpec,
    ) -> Result<OpenPort, DeviceError> {
        devices::open(
            &spec.config.name,
            &spec.device,
            pool,
            wanted_filter(state, spec),
            is_trunk(spec),
            spec.config.mtu,
        )
    }

    /// Applies `candidate` (the ports in `open`), then makes it the state and persists it.
    fn commit(&self, inner: &mut Inner, candidate: NodeState) -> Result<u64, NodeError> {
        let cfg = candidate.switch_config(|n| inner.open.contains_key(n));
        let generation = self.switch.apply(cfg)?;
        // Also frees the configuration the PMD threads leave (never on their own time).
        self.wait_adopted(generation);
        self.events.emit("config_applied", "", format!("generation {generation}"), generation);
        inner.state = candidate;
        refresh_local_pods(inner);
        if let Some(path) = &self.opts.state_file {
            inner.state.save(path)?;
        }
        Ok(generation)
    }

    pub fn state(&self) -> NodeState {
        self.inner().state.clone()
    }

    /// Ports of the state that are not running, with why.
    pub fn failed_ports(&self) -> BTreeMap<String, String> {
        self.inner().failed.clone()
    }

    /// Adds a bridge domain, or with `replace` changes one the same owner has.
    pub fn add_bridge(
        &self,
        bridge: BridgeConfig,
        owner: Owner,
        replace: bool,
    ) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        match candidate.bridges.iter_mut().find(|b| b.item.name == bridge.name) {
            Some(b) if !replace => {
                return Err(NodeError::Exists {
                    kind: "bridge",
                    name: bridge.name,
                    owner: b.owner,
                });
            }
            Some(b) => {
                owned_by(b, "bridge", &bridge.name, owner)?;
                b.item = bridge;
            }
            None => candidate.bridges.push(Owned { owner, item: bridge }),
        }
        self.commit(&mut inner, candidate)
    }

    pub fn delete_bridge(&self, name: &str, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        let b = candidate
            .bridge(name)
            .ok_or_else(|| NodeError::NotFound { kind: "bridge", name: name.into() })?;
        owned_by(b, "bridge", name, owner)?;
        candidate.bridges.retain(|b| b.item.name != name);
        self.commit(&mut inner, candidate)
    }

    /// Opens the port's device and adds the port; on refusal the device is closed again.
    pub fn add_port(&self, spec: PortSpec, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let name = spec.config.name.clone();
        if let Some(p) = inner.state.port(&name) {
            return Err(NodeError::Exists { kind: "port", name, owner: p.owner });
        }
        let mut candidate = inner.state.clone();
        candidate.ports.push(Owned { owner, item: spec });
        self.open_ports(&mut inner, &candidate, std::slice::from_ref(&name))?;
        let r = self.commit(&mut inner, candidate);
        if refused(&r) {
            self.close_ports(&mut inner, &[name], None);
        }
        r
    }

    /// Attaches a pod's port (owner `attach`) and records its attachment, in one change; on
    /// refusal the device is closed again.
    pub fn attach_port(
        &self,
        spec: PortSpec,
        record: crate::records::Record,
    ) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let name = spec.config.name.clone();
        if let Some(p) = inner.state.port(&name) {
            return Err(NodeError::Exists { kind: "port", name, owner: p.owner });
        }
        let mut candidate = inner.state.clone();
        candidate.ports.push(Owned { owner: Owner::Attach, item: spec });
        Self::check_handoff_clear(&inner.state, &record)?;
        candidate.attachments.retain(|a| a.key() != record.key());
        candidate.attachments.push(record);
        self.open_ports(&mut inner, &candidate, std::slice::from_ref(&name))?;
        let r = self.commit(&mut inner, candidate);
        if refused(&r) {
            self.close_ports(&mut inner, &[name], None);
        }
        r
    }

    /// Removes an attachment's port and record in one change; the record, if there was one.
    pub fn detach_port(
        &self,
        key: &crate::records::Key,
    ) -> Result<Option<crate::records::Record>, NodeError> {
        let mut inner = self.inner();
        let Some(record) = inner.state.attachments.iter().find(|a| a.key() == *key).cloned() else {
            return Ok(None);
        };
        let mut candidate = inner.state.clone();
        candidate.attachments.retain(|a| a.key() != *key);
        let port = record.host_ifname.clone();
        let had_port = candidate.port(&port).is_some_and(|p| p.owner == Owner::Attach);
        if had_port {
            candidate.ports.retain(|p| p.item.config.name != port);
        }
        let generation = self.commit(&mut inner, candidate)?;
        if had_port {
            // Closing an AF_XDP socket waits for the kernel (about 20 ms); the pod's veth is
            // deleted next, so nothing reuses the device: close it on the side.
            drop_later(self.take_ports(&mut inner, &[port], Some(generation)));
        }
        Ok(Some(record))
    }

    /// The SR-IOV VFs pods' attachments hold, (PCI address, `container/ifname`), and the PCI
    /// devices the switch's `dpdk` ports take, (PCI address, `switch port NAME`).
    pub fn held_vfs(&self) -> Vec<(String, String)> {
        pci_holders(&self.inner().state).map(|(pci, h)| (pci.to_string(), h.to_string())).collect()
    }

    /// Refuses a `dpdk` port on a PCI device something else holds (a pod's VF).
    fn check_not_held(state: &NodeState, spec: &PortSpec) -> Result<(), NodeError> {
        let Some(pci) = devices::pci_device(&spec.device) else { return Ok(()) };
        match pci_holders(state)
            .find(|(p, h)| *p == pci && !matches!(h, PciHolder::Port(n) if *n == spec.config.name))
        {
            Some((_, h)) => Err(NodeError::VfHeld { pci: pci.to_string(), by: h.to_string() }),
            None => Ok(()),
        }
    }

    /// Refuses a `dpdk` port whose devargs name a socket or file in a directory pods can
    /// write (`dirs.pods` and every attachment's hand-off directory) or, when `dirs.allowed`
    /// lists any, outside those.
    fn check_not_in_pods(
        state: &NodeState,
        spec: &PortSpec,
        dirs: &crate::pod_dirs::Dirs,
    ) -> Result<(), NodeError> {
        let Device::Dpdk { devargs, .. } = &spec.device else { return Ok(()) };
        let handoffs = state.attachments.iter().filter_map(handoff_dir);
        let pods = dirs.pods.iter().cloned().chain(handoffs).collect();
        let dirs = crate::pod_dirs::Dirs { pods, allowed: dirs.allowed.clone() };
        crate::pod_dirs::check(devargs, &dirs)
            .map_err(|why| NodeError::PodPath { port: spec.config.name.clone(), why })
    }

    /// Refuses an attachment whose hand-off directory holds a `dpdk` port's socket or file
    /// (its pod could replace it): the port and the directory named.
    fn check_handoff_clear(
        state: &NodeState,
        record: &crate::records::Record,
    ) -> Result<(), NodeError> {
        let Some(dir) = handoff_dir(record) else { return Ok(()) };
        for p in &state.ports {
            let Device::Dpdk { devargs, .. } = &p.item.device else { continue };
            if let Err(why @ crate::pod_dirs::Refusal::InPods { .. }) =
                crate::pod_dirs::check(devargs, &crate::pod_dirs::Dirs::pods(vec![dir.clone()]))
            {
                return Err(NodeError::PodPath { port: p.item.config.name.clone(), why });
            }
        }
        Ok(())
    }

    /// Records an attachment that has no switch port (an SR-IOV VF), refusing a VF another
    /// attachment or a switch port holds; persisted.
    fn check_host(state: &NodeState, spec: &PortSpec) -> Result<(), NodeError> {
        match state.host_port_conflict(spec) {
            Some(why) => Err(NodeError::HostPort { port: spec.config.name.clone(), why }),
            None => Ok(()),
        }
    }

    pub fn add_vf_attachment(&self, record: crate::records::Record) -> Result<(), NodeError> {
        let mut inner = self.inner();
        if let Some(pci) = record.vf.as_ref().map(|v| &v.pci)
            && let Some((_, h)) = pci_holders(&inner.state).find(|(p, h)| {
                *p == pci && !matches!(h, PciHolder::Pod(a) if a.key() == record.key())
            })
        {
            return Err(NodeError::VfHeld { pci: pci.clone(), by: h.to_string() });
        }
        inner.state.attachments.retain(|a| a.key() != record.key());
        inner.state.attachments.push(record);
        if let Some(path) = &self.opts.state_file {
            inner.state.save(path)?;
        }
        Ok(())
    }

    /// Changes what the state holds beside the switch's configuration (pending releases)
    /// and persists it.
    pub fn edit_state(&self, f: impl FnOnce(&mut NodeState)) -> Result<(), NodeError> {
        let mut inner = self.inner();
        f(&mut inner.state);
        if let Some(path) = &self.opts.state_file {
            inner.state.save(path)?;
        }
        Ok(())
    }

    /// Adds the manager's bridge domain for a network a pod is being attached to, unless it
    /// runs already (the sync stream converges it with flood lists and MACs after).
    pub fn ensure_manager_bridge(&self, bridge: BridgeConfig) -> Result<(), NodeError> {
        if self.inner().state.bridge(&bridge.name).is_some() {
            return Ok(());
        }
        match self.add_bridge(bridge, Owner::Manager, false) {
            Ok(_) | Err(NodeError::Exists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes a port from the switch, then closes its device.
    pub fn delete_port(&self, name: &str, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        let p = candidate
            .port(name)
            .ok_or_else(|| NodeError::NotFound { kind: "port", name: name.into() })?;
        owned_by(p, "port", name, owner)?;
        candidate.ports.retain(|p| p.item.config.name != name);
        let generation = self.commit(&mut inner, candidate)?;
        self.close_ports(&mut inner, &[name.to_string()], Some(generation));
        Ok(generation)
    }

    /// Opens and registers the devices of `names` (ports of `candidate`), all or none.
    fn open_ports(
        &self,
        inner: &mut Inner,
        candidate: &NodeState,
        names: &[String],
    ) -> Result<(), NodeError> {
        for (i, name) in names.iter().enumerate() {
            let Some(p) = candidate.port(name) else { continue };
            forget_local_pods(inner, &p.item);
            let opened = Self::check_not_held(candidate, &p.item)
                .and_then(|()| Self::check_host(candidate, &p.item))
                .and_then(|()| Self::check_not_in_pods(candidate, &p.item, &self.opts.dpdk_dirs))
                .and_then(|()| {
                    Self::open_device(&self.pool, candidate, &p.item).map_err(NodeError::from)
                })
                .and_then(|open| {
                    self.switch.register_port(name, open.port.clone()).map_err(|e| {
                        NodeError::Invalid(ConfigError::Duplicate {
                            kind: "port",
                            name: format!("{name} ({e})"),
                        })
                    })?;
                    inner.open.insert(name.clone(), open);
                    inner.failed.remove(name);
                    Ok(())
                });
            match &opened {
                Ok(()) => self.events.emit(
                    "port_added",
                    name,
                    format!("{:?}", p.item.device),
                    self.switch.generation(),
                ),
                Err(e) => {
                    self.events.emit("port_error", name, e.to_string(), self.switch.generation())
                }
            }
            if let Err(e) = opened {
                self.close_ports(inner, &names[..i], None);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Opens the devices of `names` again as `candidate` describes them and registers each
    /// in the place of the running one (all or none), for the next configuration to take.
    /// Returns the devices replaced, which the running configuration still uses: for
    /// [`Node::retire`] once the change is published, or [`Node::restore`] if it is refused.
    /// The new device opens while the old one runs, so traffic on the port pauses only
    /// between the two snapshots (AF_XDP's socket and AF_PACKET's share a device; the one
    /// case where they would compete, a vhost-user socket path, is refused before).
    fn reopen_ports(
        &self,
        inner: &mut Inner,
        candidate: &NodeState,
        names: &[String],
    ) -> Result<Vec<(String, OpenPort)>, NodeError> {
        let mut replaced = Vec::new();
        for name in names {
            let Some(p) = candidate.port(name) else { continue };
            forget_local_pods(inner, &p.item);
            let Some(running) = inner.open.get(name) else { continue };
            let opened = match running.hides_vlan_tags() {
                // AF_XDP's queue is still the running socket's: straight to AF_PACKET.
                Some(why)
                    if is_trunk(&p.item)
                        && inner
                            .state
                            .port(name)
                            .is_some_and(|o| o.item.device == p.item.device) =>
                {
                    devices::open_trunk_on_af_packet(name, &p.item.device, &why)
                        .map_err(NodeError::from)
                }
                _ => Self::check_not_held(candidate, &p.item)
                    .and_then(|()| Self::check_host(candidate, &p.item))
                    .and_then(|()| {
                        Self::check_not_in_pods(candidate, &p.item, &self.opts.dpdk_dirs)
                    })
                    .and_then(|()| {
                        Self::open_device(&self.pool, candidate, &p.item).map_err(NodeError::from)
                    }),
            };
            match opened {
                Ok(open) => {
                    let _ = self.switch.replace_port(name, open.port.clone());
                    if let Some(old) = inner.open.insert(name.clone(), open) {
                        replaced.push((name.clone(), old));
                    }
                }
                Err(e) => {
                    self.events.emit("port_error", name, e.to_string(), self.switch.generation());
                    self.restore(inner, replaced);
                    return Err(e);
                }
            }
        }
        Ok(replaced)
    }

    /// Puts back devices [`Node::reopen_ports`] replaced (the change was refused); the new
    /// ones close.
    fn restore(&self, inner: &mut Inner, replaced: Vec<(String, OpenPort)>) {
        for (name, old) in replaced {
            let _ = self.switch.replace_port(&name, old.port.clone());
            inner.open.insert(name, old);
        }
        // A host device opened again and put back had its table remade.
        refresh_local_pods(inner);
    }

    /// Closes devices [`Node::reopen_ports`] replaced, once PMD threads run `generation`
    /// (the change that took the new ones), and says what each port runs on now.
    fn retire(&self, inner: &Inner, replaced: Vec<(String, OpenPort)>, generation: u64) {
        if replaced.is_empty() {
            return;
        }
        self.wait_adopted(generation);
        // A host port moved to another interface leaves the old one behind: remove it.
        for (name, old) in &replaced {
            if let Some(ifname) = &old.host {
                remove_host_unless_used(inner, name, ifname);
            }
        }
        for (name, _) in &replaced {
            let device =
                inner.state.port(name).map(|p| format!("{:?}", p.item.device)).unwrap_or_default();
            let detail = match inner.open.get(name).and_then(|o| o.fallback.as_ref()) {
                Some(why) => format!("{device}, on AF_PACKET: {why}"),
                None => device,
            };
            self.events.emit("port_reopened", name, detail, generation);
        }
        drop(replaced);
    }

    /// Waits (bounded) until PMD threads read configuration `generation`: until then they may
    /// still use a device it removed or replaced.
    fn wait_adopted(&self, generation: u64) {
        if let Some(pmd) = self.pmd.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            pmd.wait_adopted(generation, std::time::Duration::from_secs(2));
        }
    }

    /// Unregisters and closes the devices of `names`. After a change that removed them
    /// (`generation`), PMD threads may still hold the old snapshot for a burst: wait until
    /// they read the new one before the devices go.
    fn close_ports(&self, inner: &mut Inner, names: &[String], generation: Option<u64>) {
        drop(self.take_ports(inner, names, generation));
    }

    /// [`Node::close_ports`], handing the devices to the caller to close.
    fn take_ports(
        &self,
        inner: &mut Inner,
        names: &[String],
        generation: Option<u64>,
    ) -> Vec<(Option<Arc<dyn vswitch::port::Port>>, OpenPort)> {
        if let Some(g) = generation {
            self.wait_adopted(g);
        }
        let mut taken = Vec::new();
        for name in names {
            inner.failed.remove(name);
            let port = self.switch.unregister_port(name).ok();
            if let Some(open) = inner.open.remove(name) {
                if let Some(ifname) = &open.host {
                    remove_host_unless_used(inner, name, ifname);
                }
                taken.push((port, open));
                self.events.emit("port_removed", name, "", self.switch.generation());
            }
        }
        taken
    }

    /// Applies the topology document `doc` to the `local` objects: one atomic change. Its
    /// local objects are added or changed; with `prune`, the local objects of the kinds it
    /// names that it lacks are removed (without, they are kept and reported). Another
    /// owner's objects are never applied (those not as the node has them are reported as
    /// skipped), and a local one that is another owner's on the node refuses it. A port whose
    /// device changes, or whose new mode its device should be opened otherwise for (a trunk
    /// where AF_XDP hides tags), is opened again in place. An object another owner holds, or
    /// a vhost-user port moved to other settings on the same socket, refuses the whole
    /// document. With `dry_run`, only reports.
    pub fn apply(
        &self,
        doc: Document,
        dry_run: bool,
        prune: bool,
    ) -> Result<ApplyReport, NodeError> {
        let Document { objects: doc, kinds } = doc;
        let mut inner = self.inner();
        let state = &inner.state;
        let mut report = ApplyReport { generation: self.switch.generation(), ..Default::default() };
        // What a document does not describe stays: the manager's peers, pods' attachments
        // (the records that say which ports and VFs pods hold), releases not yet acknowledged.
        let mut candidate =
            NodeState { bridges: Vec::new(), ports: Vec::new(), vtep: None, ..state.clone() };
        // Bridges: other owners' stay; the document's local ones are added or changed.
        for b in &doc.bridges {
            let name = &b.item.name;
            match state.bridge(name) {
                o if !documents_local(b, o, "bridge", name, &mut report.skipped)? => {}
                Some(o) if o.item != b.item => report.changed.push(format!("bridge {name}")),
                Some(_) => {}
                None => report.added.push(format!("bridge {name}")),
            }
        }
        let lacked = |b: &BridgeConfig| doc.bridge(&b.name).is_none();
        carry_over(
            &state.bridges,
            lacked,
            |b| &b.name,
            "bridge",
            prune && kinds.bridges,
            kinds.bridges,
            &mut report,
            &mut candidate.bridges,
        );
        candidate.bridges.extend(doc.bridges.iter().filter(|b| b.owner == Owner::Local).cloned());
        // Ports, the same way; a device changed is opened again.
        let (mut new_ports, mut reopened) = (Vec::new(), Vec::new());
        for p in &doc.ports {
            let name = &p.item.config.name;
            match state.port(name) {
                o if !documents_local(p, o, "port", name, &mut report.skipped)? => {}
                Some(o) if o.item != p.item => {
                    match inner.open.get(name) {
                        Some(running) if reopens(running, &o.item, &p.item)? => {
                            reopened.push(name.clone())
                        }
                        // A port whose device did not open at start: its new device may.
                        None if o.item.device != p.item.device => new_ports.push(name.clone()),
                        _ => {}
                    }
                    report.changed.push(format!("port {name}"))
                }
                Some(_) => {}
                None => {
                    report.added.push(format!("port {name}"));
                    new_ports.push(name.clone());
                }
            }
        }
        let lacked = |p: &PortSpec| doc.port(&p.config.name).is_none();
        let gone_ports = carry_over(
            &state.ports,
            lacked,
            |p| &p.config.name,
            "port",
            prune && kinds.ports,
            kinds.ports,
            &mut report,
            &mut candidate.ports,
        );
        candidate.ports.extend(doc.ports.iter().filter(|p| p.owner == Owner::Local).cloned());
        // The VTEP.
        candidate.vtep = match (&state.vtep, &doc.vtep) {
            (old, Some(new))
                if !documents_local(new, old.as_ref(), "vtep", "vtep", &mut report.skipped)? =>
            {
                old.clone()
            }
            (Some(o), None) if o.owner != Owner::Local => Some(o.clone()),
            (Some(o), None) if !(prune && kinds.vtep) => {
                if kinds.vtep {
                    report.kept.push("vtep".into());
                }
                Some(o.clone())
            }
            (old, new) => {
                match (old, new) {
                    (None, Some(_)) => report.added.push("vtep".into()),
                    (Some(_), None) => report.removed.push("vtep".into()),
                    (Some(o), Some(n)) if o.item != n.item => report.changed.push("vtep".into()),
                    _ => {}
                }
                new.clone()
            }
        };
        // Refused the same whether tried or applied.
        for p in new_ports.iter().chain(&reopened).filter_map(|n| candidate.port(n)) {
            Self::check_not_in_pods(&candidate, &p.item, &self.opts.dpdk_dirs)?;
        }
        if dry_run
            || (report.added.is_empty() && report.changed.is_empty() && report.removed.is_empty())
        {
            return Ok(report);
        }
        self.open_ports(&mut inner, &candidate, &new_ports)?;
        let replaced = match self.reopen_ports(&mut inner, &candidate, &reopened) {
            Ok(replaced) => replaced,
            Err(e) => {
                self.close_ports(&mut inner, &new_ports, None);
                return Err(e);
            }
        };
        let r = self.commit_ports(&mut inner, candidate, &new_ports, replaced, &gone_ports);
        if !refused(&r) {
            report.generation = self.switch.generation();
            self.refresh_underlay_filters(&mut inner);
        }
        r.map(|_| report)
    }

    /// Converges the `manager` objects to the manager's desired state: its bridge domains
    /// (added, changed, or removed when no longer desired), its ports (the nodes' host ports
    /// of networks with a node gateway: opened, opened again when changed, closed when no
    /// longer desired) and the remote VTEPs it adds to the VTEP's peers. A local object of the
    /// same name wins and is reported as skipped; so is a port whose device does not open
    /// (with its bridge's gateway: the next state tries again). One atomic change; nothing
    /// happens when nothing differs.
    pub fn converge_manager(
        &self,
        bridges: Vec<BridgeConfig>,
        peers: Vec<PeerConfig>,
        ports: Vec<PortSpec>,
    ) -> Result<ApplyReport, NodeError> {
        let mut inner = self.inner();
        let state = inner.state.clone();
        let mut report = ApplyReport { generation: self.switch.generation(), ..Default::default() };
        let mut candidate = state.clone();
        candidate.bridges.retain(|b| b.owner != Owner::Manager);
        let mut shadowed = Vec::new();
        for b in bridges {
            match state.bridge(&b.name) {
                Some(o) if o.owner != Owner::Manager => {
                    report.skipped.push(format!(
                        "bridge {} (a {} bridge of that name exists)",
                        b.name, o.owner
                    ));
                    shadowed.push(b.name);
                    continue;
                }
                Some(o) if o.item != b => report.changed.push(format!("bridge {}", b.name)),
                Some(_) => {}
                None => report.added.push(format!("bridge {}", b.name)),
            }
            candidate.bridges.push(Owned { owner: Owner::Manager, item: b });
        }
        // Ports: opened one by one, so one that does not open leaves the rest to go on.
        candidate.ports.retain(|p| p.owner != Owner::Manager);
        let (mut new_ports, mut gone_ports, mut reopened) = (Vec::new(), Vec::new(), Vec::new());
        for p in ports {
            let name = p.config.name.clone();
            if matches!(&p.config.mode, PortMode::Access { bridge } if shadowed.contains(bridge)) {
                report.skipped.push(format!("port {name} (its bridge is a local one)"));
                continue;
            }
            match state.port(&name) {
                Some(o) if o.owner != Owner::Manager => {
                    report
                        .skipped
                        .push(format!("port {name} (a {} port of that name exists)", o.owner));
                    drop_gateway_of(&mut candidate, &name);
                    continue;
                }
                Some(o) if o.item != p => {
                    match inner.open.get(&name) {
                        Some(running) if reopens(running, &o.item, &p)? => {
                            reopened.push(name.clone())
                        }
                        Some(_) => {}
                        None => new_ports.push(name.clone()),
                    }
                    report.changed.push(format!("port {name}"));
                }
                Some(_) if !inner.open.contains_key(&name) => new_ports.push(name.clone()),
                Some(_) => {}
                None => {
                    report.added.push(format!("port {name}"));
                    new_ports.push(name.clone());
                }
            }
            candidate.ports.push(Owned { owner: Owner::Manager, item: p });
        }
        for p in state.ports.iter().filter(|p| p.owner == Owner::Manager) {
            if candidate.port(&p.item.config.name).is_none() {
                report.removed.push(format!("port {}", p.item.config.name));
                gone_ports.push(p.item.config.name.clone());
            }
        }
        for b in state.bridges.iter().filter(|b| b.owner == Owner::Manager) {
            if candidate.bridge(&b.item.name).is_some() {
                continue;
            }
            let users: Vec<&str> = candidate.ports.iter().filter(|p| matches!(&p.item.config.mode, PortMode::Access { bridge } if *bridge == b.item.name)).map(|p| p.item.config.name.as_str()).collect();
            if users.is_empty() {
                report.removed.push(format!("bridge {}", b.item.name));
            } else {
                // Ports still use it (a pod attached before the manager's next state): keep it.
                report.skipped.push(format!(
                    "removing bridge {} (ports {} use it)",
                    b.item.name,
                    users.join(", ")
                ));
                candidate.bridges.push(b.clone());
            }
        }
        if peers != state.manager_peers {
            report.changed.push("vtep peers".into());
            candidate.manager_peers = peers;
        }
        if report.added.is_empty()
            && report.changed.is_empty()
            && report.removed.is_empty()
            && new_ports.is_empty()
        {
            return Ok(report);
        }
        let mut opened = Vec::new();
        for name in new_ports {
            match self.open_ports(&mut inner, &candidate, std::slice::from_ref(&name)) {
                Ok(()) => opened.push(name),
                Err(e) => {
                    report.skipped.push(format!("port {name}: {e}"));
                    report.retry = true;
                    candidate.ports.retain(|p| p.item.config.name != name);
                    inner.failed.remove(&name);
                }
            }
        }
        // A gateway goes with its port (one left out above, or one kept bridge's port gone).
        let portless: Vec<String> = candidate
            .bridges
            .iter()
            .filter_map(|b| b.item.gateway.as_ref().map(|g| g.port.clone()))
            .filter(|g| candidate.port(g).is_none())
            .collect();
        for port in &portless {
            drop_gateway_of(&mut candidate, port);
        }
        let mut replaced = Vec::new();
        for name in reopened {
            match self.reopen_ports(&mut inner, &candidate, std::slice::from_ref(&name)) {
                Ok(r) => replaced.extend(r),
                Err(e) => {
                    // The running device stays, as it was.
                    report.skipped.push(format!("port {name}: {e}"));
                    report.retry = true;
                    if let (Some(c), Some(old)) = (
                        candidate.ports.iter_mut().find(|p| p.item.config.name == name),
                        state.port(&name),
                    ) {
                        *c = old.clone();
                    }
                }
            }
        }
        // What failed to open again leaves the state as it was: no new generation.
        if candidate == state && opened.is_empty() && replaced.is_empty() {
            report.added.clear();
            report.changed.clear();
            refresh_local_pods(&mut inner);
            return Ok(report);
        }
        let r = self.commit_ports(&mut inner, candidate, &opened, replaced, &gone_ports);
        if !refused(&r) {
            report.generation = self.switch.generation();
        }
        r.map(|_| report)
    }

    /// Commits `candidate`, whose new devices (`opened`) and devices opened again (`replaced`:
    /// the running ones they replace) are open. Refused: everything is put back as it ran.
    /// Published: the devices of `gone` and those replaced close once PMD threads moved on.
    fn commit_ports(
        &self,
        inner: &mut Inner,
        candidate: NodeState,
        opened: &[String],
        replaced: Vec<(String, OpenPort)>,
        gone: &[String],
    ) -> Result<u64, NodeError> {
        let r = self.commit(inner, candidate);
        if refused(&r) {
            self.restore(inner, replaced);
            self.close_ports(inner, opened, None);
            return r;
        }
        let generation = self.switch.generation();
        self.close_ports(inner, gone, Some(generation));
        self.retire(inner, replaced, generation);
        r
    }

    /// Gives every open port the underlay filter its place wants: the VTEP's underlay takes
    /// only the VTEP's traffic; any other port (one that stopped being the underlay, or every
    /// port once the VTEP is gone) takes every frame.
    fn refresh_underlay_filters(&self, inner: &mut Inner) {
        let Inner { state, open, .. } = inner;
        for (name, port) in open.iter_mut() {
            let want = state.port(name).and_then(|p| wanted_filter(state, &p.item));
            if let Err(e) = port.set_underlay_filter(want) {
                tracing::warn!(port = %name, error = %e, "underlay filter not updated");
            }
        }
    }

    pub fn set_vtep(&self, vtep: VtepConfig, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        if let Some(v) = &candidate.vtep {
            owned_by(v, "vtep", "vtep", owner)?;
        }
        candidate.vtep = Some(Owned { owner, item: vtep });
        let generation = self.commit(&mut inner, candidate)?;
        self.refresh_underlay_filters(&mut inner);
        Ok(generation)
    }

    pub fn clear_vtep(&self, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        let v = candidate
            .vtep
            .as_ref()
            .ok_or_else(|| NodeError::NotFound { kind: "vtep", name: "vtep".into() })?;
        owned_by(v, "vtep", "vtep", owner)?;
        candidate.vtep = None;
        let generation = self.commit(&mut inner, candidate)?;
        self.refresh_underlay_filters(&mut inner);
        Ok(generation)
    }

    /// Whether frames cross the edge of the dpdk port `name` without a copy, and why not
    /// when zero copy was offered and refused (`None`: not a dpdk port).
    pub fn dpdk_zero_copy(&self, name: &str) -> Option<(bool, Option<String>)> {
        let inner = self.inner();
        let port = inner.open.get(name)?.dpdk.as_ref()?;
        Some((port.zero_copy(), port.copy_reason().map(str::to_string)))
    }

    /// Why the `af_xdp` port `name` runs on AF_PACKET, when it does.
    pub fn fallback(&self, name: &str) -> Option<String> {
        self.inner().open.get(name)?.fallback.clone()
    }

    /// Why a ring of the vhost-user port `name` is stopped, while one is.
    pub fn vhost_ring_error(&self, name: &str) -> Option<String> {
        let vhost = self.inner().open.get(name)?.vhost.clone()?;
        vhost.ring_error()
    }

    /// What the frontend of the vhost-user port `name` got wrong, since the port opened.
    pub fn vhost_errors(&self, name: &str) -> Option<knitter_api::node::VhostErrors> {
        let inner = self.inner();
        let n = &inner.open.get(name)?.vhost.as_ref()?.net;
        Some(knitter_api::node::VhostErrors {
            broken_rings: n.broken_rings.get(),
            bad_chains: n.bad_chains.get(),
            refused_frames: n.refused_frames.get(),
            guest_buffer_too_small: n.guest_buffer_too_small.get(),
            memory_faults: n.memory_faults.get(),
            interrupts_full: n.interrupts_full.get(),
        })
    }

    /// How the frontend of the vhost-user port `name` set up its rings, while a pair runs.
    pub fn vhost_rings(&self, name: &str) -> Option<knitter_api::node::VhostRings> {
        let vhost = self.inner().open.get(name)?.vhost.clone()?;
        let r = vhost.rings()?;
        Some(knitter_api::node::VhostRings {
            packed: r.packed,
            rx_size: r.rx_size.into(),
            tx_size: r.tx_size.into(),
            queue_pairs: r.pairs,
            in_order: r.in_order,
            mergeable_buffers: r.mrg_rxbuf,
        })
    }

    /// Whether the vhost-user port `name` has a frontend whose rings run (`None`: not a
    /// vhost-user port).
    pub fn vhost_connected(&self, name: &str) -> Option<bool> {
        let inner = self.inner();
        let v = inner.open.get(name)?.vhost.as_ref()?;
        Some(v.running_pairs() > 0)
    }

    /// The network namespace of the shared-address VTEP's underlay device (`Some(None)`:
    /// the daemon's own); `None` when there is no VTEP, or it has an address of its own.
    pub fn shared_vtep_netns(&self) -> Option<Option<String>> {
        let inner = self.inner();
        let vtep = inner.state.vtep.as_ref().filter(|v| v.item.shared_address)?;
        match &inner.state.port(&vtep.item.underlay_port)?.item.device {
            Device::AfXdp { netns, .. } | Device::AfPacket { netns, .. } => Some(netns.clone()),
            _ => Some(None),
        }
    }

    /// Reads port `name`'s link state from its device now (between the link watcher's
    /// polls) and says whether it is up; `false` for a port the switch does not run.
    pub fn link_up_now(&self, name: &str) -> bool {
        let snap = self.switch.snapshot();
        let Some(p) = snap.port_id(name).and_then(|id| snap.port(id)) else { return false };
        p.port.refresh_link();
        p.port.link_up()
    }

    /// Records whether the manager refused this node's credential (`Some(why)`) or took it.
    pub fn set_manager_refusal(&self, why: Option<String>) {
        *self.manager_refusal.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Why the manager refuses this node's credential, while it does.
    pub fn manager_refusal(&self) -> Option<String> {
        self.manager_refusal.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// PMD threads that ended without being stopped (see `PmdSet::dead_threads`).
    pub fn dead_pmd_threads(&self) -> Vec<usize> {
        self.pmd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|p| p.dead_threads())
            .unwrap_or_default()
    }

    /// Each PMD thread and the queues it polls (see `PmdSet::threads`).
    pub fn pmd_threads(&self) -> Vec<vswitch::pmd::PmdView> {
        self.pmd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|p| p.threads())
            .unwrap_or_default()
    }

    /// Places the queues of ports without a pin by the load each took over `window` (see
    /// `PmdSet::rebalance`); `None` when the PMD threads are stopped. Blocks for `window`
    /// (without holding the PMD threads' lock).
    pub fn rebalance_pmds(&self, window: std::time::Duration) -> Option<Vec<vswitch::pmd::Moved>> {
        let before = self.pmd.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.sample();
        std::thread::sleep(window);
        Some(
            self.pmd
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()?
                .rebalance(&self.switch, &before),
        )
    }

    /// Whether the PMD threads run (until `stop`).
    pub fn running(&self) -> bool {
        self.pmd.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Stops the PMD threads and closes every device.
    pub fn stop(&self) {
        if let Some(p) = self.pmd.lock().unwrap_or_else(|e| e.into_inner()).take() {
            p.stop();
        }
        self.inner().open.clear();
    }
}

/// Gives each open host port's table the addresses of its network's pods on this node (the
/// port-security addresses of the other access ports of its bridge domain), where they
/// changed (on a thread of its own: `host::set_local_later`). Until they are there, Service
/// traffic to those pods is masqueraded, which always works (it only hides the client).
fn refresh_local_pods(inner: &mut Inner) {
    let Inner { state, open, local_pods, .. } = inner;
    local_pods.retain(|ifname, _| open.values().any(|o| o.host.as_deref() == Some(ifname)));
    for p in &state.ports {
        let (Device::Host { ifname, .. }, PortMode::Access { bridge }) =
            (&p.item.device, &p.item.config.mode)
        else {
            continue;
        };
        if !open.contains_key(&p.item.config.name) {
            continue;
        }
        let mut pods: Vec<std::net::IpAddr> = state
            .ports
            .iter()
            .filter(|o| {
                o.item.config.name != p.item.config.name
                    && matches!(&o.item.config.mode, PortMode::Access { bridge: b } if b == bridge)
            })
            .filter_map(|o| o.item.config.security.as_ref().filter(|s| s.enabled))
            .flat_map(|s| s.ips.iter().copied())
            .collect();
        pods.sort();
        pods.dedup();
        if local_pods.get(ifname) == Some(&pods) {
            continue;
        }
        crate::host::set_local_later(ifname, pods.clone());
        local_pods.insert(ifname.clone(), pods);
    }
}

/// Forgets what the table of `spec`'s host device held: opening it (even when that fails
/// later) makes the table anew, empty.
fn forget_local_pods(inner: &mut Inner, spec: &PortSpec) {
    if let Device::Host { ifname, .. } = &spec.device {
        inner.local_pods.remove(ifname);
    }
}

/// Takes the gateway off the bridge whose gateway port is `port` (a port left out).
fn drop_gateway_of(state: &mut NodeState, port: &str) {
    for b in &mut state.bridges {
        if b.item.gateway.as_ref().is_some_and(|g| g.port == port) {
            b.item.gateway = None;
        }
    }
}

/// Whether a change was refused (nothing changed), rather than applied, persisted or not.
fn refused(r: &Result<u64, NodeError>) -> bool {
    r.as_ref().is_err_and(|e| !matches!(e, NodeError::State(_)))
}

/// The underlay filter a port of `state` wants: the VTEP's, on the VTEP's underlay port.
fn wanted_filter(state: &NodeState, spec: &PortSpec) -> Option<UnderlayFilter> {
    match (&spec.config.mode, &state.vtep) {
        (PortMode::Underlay, Some(v)) if v.item.underlay_port == spec.config.name => {
            Some(underlay_filter(&v.item))
        }
        _ => None,
    }
}

fn is_trunk(spec: &PortSpec) -> bool {
    matches!(spec.config.mode, PortMode::Trunk { .. })
}

/// What holds a PCI device on this node.
enum PciHolder<'a> {
    /// A pod's attachment (an SR-IOV VF).
    Pod(&'a crate::records::Record),
    /// A `dpdk` switch port, by name.
    Port(&'a str),
}

impl std::fmt::Display for PciHolder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PciHolder::Pod(a) => write!(f, "{}/{}", a.container_id, a.ifname),
            PciHolder::Port(n) => write!(f, "switch port {n}"),
        }
    }
}

/// The directory attachment `a`'s pod writes its vhost-user hand-off in (for a pod's own
/// volume, the kubelet's pods directory), if it has one.
fn handoff_dir(a: &crate::records::Record) -> Option<PathBuf> {
    let v = a.vhost.as_ref()?;
    Some(match &v.volume {
        Some(volume) => volume.pods.clone(),
        None => v.dir.clone(),
    })
}

/// Every PCI device `state` gives to someone: pods' VFs, then `dpdk` ports' devices.
fn pci_holders(state: &NodeState) -> impl Iterator<Item = (&str, PciHolder<'_>)> {
    let pods = state
        .attachments
        .iter()
        .filter_map(|a| Some((a.vf.as_ref()?.pci.as_str(), PciHolder::Pod(a))));
    let ports = state.ports.iter().filter_map(|p| {
        Some((devices::pci_device(&p.item.device)?, PciHolder::Port(p.item.config.name.as_str())))
    });
    pods.chain(ports)
}

/// Whether a running port (device `running`) changed from `old` to `new` needs its device
/// opened again: another device, or a mode the open one does not serve. Refused for a
/// vhost-user socket path kept with other settings (a second server there would take the
/// running one's socket file, which the running one removes as it closes) and for DPDK
/// devargs kept with other settings (DPDK probes a device once: the second open is refused).
fn reopens(running: &OpenPort, old: &PortSpec, new: &PortSpec) -> Result<bool, NodeError> {
    match (&old.device, &new.device) {
        (a, b) if a == b => Ok(!running.serves(is_trunk(new))),
        (Device::VhostUser { socket: a, .. }, Device::VhostUser { socket: b, .. }) if a == b => {
            Err(NodeError::DeviceKept {
                port: new.config.name.clone(),
                what: "another vhost-user device on the running one's socket",
            })
        }
        (Device::Dpdk { devargs: a, .. }, Device::Dpdk { devargs: b, .. }) if a == b => {
            Err(NodeError::DeviceKept {
                port: new.config.name.clone(),
                what: "another DPDK device with the same devargs as the running one (DPDK probes a device once)",
            })
        }
        _ => Ok(true),
    }
}

/// Removes host interface `ifname`, which port `name` no longer runs on, unless an open port
/// does (a port renamed or reopened on the same interface).
fn remove_host_unless_used(inner: &Inner, name: &str, ifname: &str) {
    if inner.open.values().any(|o| o.host.as_deref() == Some(ifname)) {
        return;
    }
    if let Err(e) = crate::host::remove(ifname) {
        tracing::warn!(port = %name, error = %e, "host port not removed");
    }
}

/// Drops `v` on a short-lived thread (closing devices can block in the kernel); inline when
/// no thread can be made (a failed spawn drops the closure, and `v` with it).
fn drop_later<T: Send + 'static>(v: T) {
    let _ = std::thread::Builder::new().name("knitter-close".into()).spawn(move || drop(v));
}

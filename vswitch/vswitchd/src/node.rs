//! The node: one switch, its PMD threads, the open port devices and the desired state.
//! Every change is made on a copy of the state, validated whole by the switch and published
//! atomically (PMD threads move to the new snapshot between bursts; ports the change does not
//! name are untouched), then persisted. A refused change leaves everything as it was.

use crate::devices::{self, DeviceError, OpenPort};
use crate::state::{NodeState, Owned, Owner, PortSpec, StateError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use vswitch::config::{BridgeConfig, PortMode, VtepConfig};
use vswitch::port::afxdp::UnderlayFilter;
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
    #[error("the change was applied but not persisted: {0}")]
    State(#[from] StateError),
}

/// How the node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub pmd: PmdConfig,
    pub buffers: u32,
    pub hugepages: bool,
    /// Where the state is persisted; `None`: nowhere (tests, the demo).
    pub state_file: Option<PathBuf>,
}

struct Inner {
    state: NodeState,
    open: BTreeMap<String, OpenPort>,
    /// Ports in the state whose device did not open at start (left out of the switch).
    failed: BTreeMap<String, String>,
}

pub struct Node {
    pub switch: Arc<Switch>,
    pub pool: Arc<Pool>,
    pub opts: NodeOptions,
    pmd: Mutex<Option<PmdSet>>,
    inner: Mutex<Inner>,
}

fn owned_by<T>(o: &Owned<T>, kind: &'static str, name: &str, by: Owner) -> Result<(), NodeError> {
    if o.owner == by { Ok(()) } else { Err(NodeError::NotOwner { kind, name: name.into(), owner: o.owner, by }) }
}

/// The AF_XDP filter an underlay port needs for `vtep`.
fn underlay_filter(vtep: &VtepConfig) -> UnderlayFilter {
    UnderlayFilter { vtep: vtep.local_ip, udp_port: vtep.udp_port, vlan: vtep.underlay_vlan, shared: vtep.shared_address }
}

impl Node {
    /// Starts the switch and its PMD threads, opens the devices of `state` and applies it.
    /// A port whose device does not open is left out (and reported by [`Node::failed_ports`]);
    /// a state the switch refuses as a whole is an error.
    pub fn start(opts: NodeOptions, state: NodeState) -> anyhow::Result<Node> {
        let pool = Pool::new(opts.buffers, opts.hugepages)?;
        tracing::info!(buffers = opts.buffers, backing = %pool.backing(), "buffer pool ready");
        let switch = Switch::new(pool.clone(), SwitchOptions::default());
        let mut inner = Inner { state: NodeState::default(), open: BTreeMap::new(), failed: BTreeMap::new() };
        for p in &state.ports {
            let name = &p.item.config.name;
            match Self::open_device(&pool, &state, &p.item) {
                Ok(open) => {
                    switch.register_port(name, open.port.clone())?;
                    inner.open.insert(name.clone(), open);
                }
                Err(e) => {
                    tracing::error!(port = %name, error = %e, "port left out: its device did not open");
                    inner.failed.insert(name.clone(), e.to_string());
                }
            }
        }
        let cfg = state.switch_config(|n| inner.open.contains_key(n));
        switch.apply(cfg)?;
        inner.state = state;
        let pmd = PmdSet::start(switch.clone(), &opts.pmd)?;
        Ok(Node { switch, pool, opts, pmd: Mutex::new(Some(pmd)), inner: Mutex::new(inner) })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open_device(pool: &Arc<Pool>, state: &NodeState, spec: &PortSpec) -> Result<OpenPort, DeviceError> {
        let filter = match (&spec.config.mode, &state.vtep) {
            (PortMode::Underlay, Some(v)) if v.item.underlay_port == spec.config.name => Some(underlay_filter(&v.item)),
            _ => None,
        };
        devices::open(&spec.config.name, &spec.device, pool, filter)
    }

    /// Applies `candidate` (the ports in `open`), then makes it the state and persists it.
    fn commit(&self, inner: &mut Inner, candidate: NodeState) -> Result<u64, NodeError> {
        let cfg = candidate.switch_config(|n| inner.open.contains_key(n));
        let generation = self.switch.apply(cfg)?;
        inner.state = candidate;
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
    pub fn add_bridge(&self, bridge: BridgeConfig, owner: Owner, replace: bool) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        match candidate.bridges.iter_mut().find(|b| b.item.name == bridge.name) {
            Some(b) if !replace => return Err(NodeError::Exists { kind: "bridge", name: bridge.name, owner: b.owner }),
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
        let b = candidate.bridge(name).ok_or_else(|| NodeError::NotFound { kind: "bridge", name: name.into() })?;
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
        let open = Self::open_device(&self.pool, &inner.state, &spec)?;
        if let Err(e) = self.switch.register_port(&name, open.port.clone()) {
            return Err(NodeError::Invalid(ConfigError::Duplicate { kind: "port", name: format!("{name} ({e})") }));
        }
        inner.open.insert(name.clone(), open);
        let mut candidate = inner.state.clone();
        candidate.ports.push(Owned { owner, item: spec });
        let r = self.commit(&mut inner, candidate);
        if r.is_err() && inner.state.port(&name).is_none() {
            inner.open.remove(&name);
            let _ = self.switch.unregister_port(&name);
        }
        r
    }

    /// Removes a port from the switch, then closes its device.
    pub fn delete_port(&self, name: &str, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        let p = candidate.port(name).ok_or_else(|| NodeError::NotFound { kind: "port", name: name.into() })?;
        owned_by(p, "port", name, owner)?;
        candidate.ports.retain(|p| p.item.config.name != name);
        let generation = self.commit(&mut inner, candidate)?;
        inner.failed.remove(name);
        // PMD threads may still hold the old snapshot for a burst: wait until they read the
        // new one before the device goes.
        if let Some(pmd) = self.pmd.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            pmd.wait_adopted(generation, std::time::Duration::from_secs(2));
        }
        let _ = self.switch.unregister_port(name);
        inner.open.remove(name);
        Ok(generation)
    }

    pub fn set_vtep(&self, vtep: VtepConfig, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        if let Some(v) = &candidate.vtep {
            owned_by(v, "vtep", "vtep", owner)?;
        }
        let filter = underlay_filter(&vtep);
        let underlay = vtep.underlay_port.clone();
        candidate.vtep = Some(Owned { owner, item: vtep });
        let generation = self.commit(&mut inner, candidate)?;
        if let Some(open) = inner.open.get(&underlay)
            && let Err(e) = open.set_underlay_filter(Some(filter))
        {
            tracing::warn!(port = %underlay, error = %e, "underlay filter not updated");
        }
        Ok(generation)
    }

    pub fn clear_vtep(&self, owner: Owner) -> Result<u64, NodeError> {
        let mut inner = self.inner();
        let mut candidate = inner.state.clone();
        let v = candidate.vtep.as_ref().ok_or_else(|| NodeError::NotFound { kind: "vtep", name: "vtep".into() })?;
        owned_by(v, "vtep", "vtep", owner)?;
        let underlay = v.item.underlay_port.clone();
        candidate.vtep = None;
        let generation = self.commit(&mut inner, candidate)?;
        if let Some(open) = inner.open.get(&underlay) {
            let _ = open.set_underlay_filter(None);
        }
        Ok(generation)
    }

    /// Whether the vhost-user port `name` has a frontend whose rings run (`None`: not a
    /// vhost-user port).
    pub fn vhost_connected(&self, name: &str) -> Option<bool> {
        let inner = self.inner();
        let v = inner.open.get(name)?.vhost.as_ref()?;
        Some(v.running_pairs() > 0)
    }

    /// Stops the PMD threads and closes every device.
    pub fn stop(&self) {
        if let Some(p) = self.pmd.lock().unwrap_or_else(|e| e.into_inner()).take() {
            p.stop();
        }
        self.inner().open.clear();
    }
}

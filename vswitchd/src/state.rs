//! The node's desired state: bridge domains, ports (with the device each is opened on) and
//! the VTEP, each with its owner. It is what the config file declares, what the API changes
//! and what is persisted (JSON, written atomically) so a restarted daemon brings every port
//! back.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::Path;
use vswitch::config::{BridgeConfig, PeerConfig, PortConfig, SwitchConfig, VtepConfig};

/// Which source converges an object; each changes only what it owns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// The config file, the node API, `knitterctl apply`.
    #[default]
    Local,
    /// knitter-manager's stream.
    Manager,
    /// Pod attachments (the attach API, knitter-cni).
    Attach,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::Local => "local",
            Owner::Manager => "manager",
            Owner::Attach => "attach",
        })
    }
}

/// How the switch reaches a port's frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum Device {
    /// A kernel interface through AF_XDP.
    AfXdp {
        ifname: String,
        #[serde(default)]
        netns: Option<String>,
    },
    /// A kernel interface through AF_PACKET.
    AfPacket {
        ifname: String,
        #[serde(default)]
        netns: Option<String>,
    },
    /// A DPDK ethdev: a PCI address (a NIC or VF bound to vfio-pci) or a vdev
    /// (`net_tap0,iface=dtap0`, `net_memif0,...`), with `queues` rx/tx queue pairs (RSS).
    Dpdk {
        devargs: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queues: Option<u16>,
    },
    /// A vhost-user socket: the switch listens, or with `client` connects (and reconnects).
    /// A socket it listens on gets `mode`, `owner` and `group` when given.
    VhostUser {
        socket: std::path::PathBuf,
        #[serde(default)]
        client: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<u32>,
    },
    /// The node's own interface into the port's bridge domain ([`crate::host`]): a veth pair
    /// the daemon makes, `ifname` in its namespace with the node's `addresses` there (CIDR;
    /// the first gives both ends' MAC) and, with `masquerade`, the NAT rules for pods'
    /// traffic it routes out; `<ifname>-sw` served by the switch (AF_XDP).
    Host {
        ifname: String,
        addresses: Vec<String>,
        #[serde(default = "yes")]
        masquerade: bool,
    },
}

fn yes() -> bool {
    true
}

/// A port: its device and its place in the switch. In files, one table: the
/// [`PortConfig`] fields plus `device`.
#[derive(Debug, Clone, PartialEq)]
pub struct PortSpec {
    pub device: Device,
    pub config: PortConfig,
}

/// An object with its owner. In files, the object's fields plus `owner` (default `local`).
#[derive(Debug, Clone, PartialEq)]
pub struct Owned<T> {
    pub owner: Owner,
    pub item: T,
}

impl<T> Owned<T> {
    #[cfg(test)]
    pub fn local(item: T) -> Self {
        Owned { owner: Owner::Local, item }
    }
}

/// Serializes `inner` as a map with one more key.
fn with_key<S: Serializer, T: Serialize, K: Serialize>(
    s: S,
    inner: &T,
    key: &str,
    value: &K,
) -> Result<S::Ok, S::Error> {
    use serde::ser::Error;
    let mut map = match serde_json::to_value(inner).map_err(S::Error::custom)? {
        Value::Object(m) => m,
        _ => return Err(S::Error::custom("expected a map")),
    };
    map.insert(key.into(), serde_json::to_value(value).map_err(S::Error::custom)?);
    map.serialize(s)
}

/// A map's value for one key, and the rest of the map.
type Split = (Option<Value>, Map<String, Value>);

/// Takes `key` out of a map and returns it with the rest.
fn split_key<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Split, D::Error> {
    use serde::de::Error;
    let mut map = match Value::deserialize(d)? {
        Value::Object(m) => m,
        _ => return Err(D::Error::custom("expected a table")),
    };
    Ok((map.remove(key), map))
}

impl Serialize for PortSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        with_key(s, &self.config, "device", &self.device)
    }
}

impl<'de> Deserialize<'de> for PortSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let (device, rest) = split_key(d, "device")?;
        let device = device.ok_or_else(|| D::Error::missing_field("device"))?;
        Ok(PortSpec {
            device: serde_json::from_value(device)
                .map_err(|e| D::Error::custom(format!("device: {e}")))?,
            config: serde_json::from_value(Value::Object(rest)).map_err(D::Error::custom)?,
        })
    }
}

impl<T: Serialize> Serialize for Owned<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        with_key(s, &self.item, "owner", &self.owner)
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Owned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let (owner, rest) = split_key(d, "owner")?;
        let owner = match owner {
            None => Owner::Local,
            Some(o) => {
                serde_json::from_value(o).map_err(|e| D::Error::custom(format!("owner: {e}")))?
            }
        };
        Ok(Owned {
            owner,
            item: serde_json::from_value(Value::Object(rest)).map_err(D::Error::custom)?,
        })
    }
}

/// Everything the node is asked to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeState {
    #[serde(default)]
    pub bridges: Vec<Owned<BridgeConfig>>,
    #[serde(default)]
    pub ports: Vec<Owned<PortSpec>>,
    #[serde(default)]
    pub vtep: Option<Owned<VtepConfig>>,
    /// Remote VTEPs the manager's stream adds to the VTEP's peers (the VTEP itself stays
    /// whoever's it is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manager_peers: Vec<PeerConfig>,
    /// Pods' interfaces attached through the attach API (their ports are owned by `attach`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::records::Record>,
    /// Port releases the manager has not acknowledged yet (it was unreachable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_releases: Vec<crate::records::Key>,
}

/// Errors reading or writing the persisted state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not a valid state file: {source}")]
    Parse { path: String, source: serde_json::Error },
    #[error("writing {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error(
        "{path} is in state format {format}, newer than this daemon's ({ours}), and has no {backup} beside it: \
         run the newer knitter-vswitchd, or start this one with --no-state"
    )]
    Newer { path: String, format: u64, ours: u32, backup: String },
}

/// The state file's format: a `format` key beside the state's own. 1 is the files written
/// before formats were numbered (no key); 2 adds the key and nothing else. A daemon reads
/// every format up to its own, and writes its own plus, beside it, the one before
/// (`<file>.format-1` now), so that the previous daemon can be brought back with the state
/// as it is then: a daemon that knows formats finds that file by itself when the main
/// one is newer than it; one from before formats needs it moved over the main file.
pub const FORMAT: u32 = 2;

/// Why a topology document was refused.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("topology document (YAML): {0}")]
    Yaml(#[from] knitter_api::yaml::Error),
    #[error("topology document (YAML): {0}")]
    YamlOut(#[from] knitter_api::yaml::SerializeError),
    #[error("topology document (TOML): {0}")]
    Toml(#[from] toml::de::Error),
    #[error("topology document (JSON): {0}")]
    Json(#[from] serde_json::Error),
    #[error("export writes yaml or json (apply reads toml too)")]
    ExportFormat,
    #[error("unknown document format {0:?}: use yaml, toml or json")]
    Format(String),
    #[error("no {kind} {name:?}")]
    NotFound { kind: &'static str, name: String },
    #[error("unknown kind {0:?}: bridges, ports or vtep")]
    Kind(String),
    #[error("a name picks a bridge or a port: give the kind (bridges or ports) with it")]
    NameWithoutKind,
}

/// Which kinds a topology document names: its top-level keys (`vtep: null` and `ports: []`
/// name theirs). `apply --prune` removes only objects of these kinds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Kinds {
    #[serde(default, deserialize_with = "present")]
    pub bridges: bool,
    #[serde(default, deserialize_with = "present")]
    pub ports: bool,
    #[serde(default, deserialize_with = "present")]
    pub vtep: bool,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// What a topology document may hold: the three kinds, nothing of the node's own records.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Objects {
    #[serde(default)]
    bridges: Vec<Owned<BridgeConfig>>,
    #[serde(default)]
    ports: Vec<Owned<PortSpec>>,
    #[serde(default)]
    vtep: Option<Owned<VtepConfig>>,
}

/// A topology document (`knitterctl apply -f`): the objects it declares and the kinds it
/// names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Document {
    pub objects: NodeState,
    pub kinds: Kinds,
}

/// What a document holds ([`NodeState::document`]): every kind or one, every object of it
/// or one by name, the local objects or every owner's.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// `bridges`, `ports` or `vtep`; `None` for all three.
    pub kind: Option<String>,
    /// One bridge or port (with `kind` bridges or ports).
    pub name: Option<String>,
    pub all_owners: bool,
}

impl NodeState {
    /// Parses a topology document (`knitterctl apply -f`): the config file's `bridges`,
    /// `ports` and `vtep` (another owner's objects with their `owner`), and which of the
    /// three it names.
    pub fn parse(text: &str, format: &str) -> Result<Document, DocumentError> {
        let (objects, kinds): (Objects, Kinds) = match format {
            "" | "yaml" | "yml" => {
                (knitter_api::yaml::from_str(text)?, knitter_api::yaml::from_str(text)?)
            }
            "toml" => (toml::from_str(text)?, toml::from_str(text)?),
            "json" => (serde_json::from_str(text)?, serde_json::from_str(text)?),
            f => return Err(DocumentError::Format(f.into())),
        };
        let Objects { bridges, ports, vtep } = objects;
        Ok(Document { objects: NodeState { bridges, ports, vtep, ..NodeState::default() }, kinds })
    }

    /// The objects `select` picks as a topology document in `format` (yaml or json): what
    /// `knitterctl node export` and the object commands' `-o yaml|json` print, and
    /// [`NodeState::parse`] reads back unchanged.
    pub fn document(&self, format: &str, select: &Selection) -> Result<String, DocumentError> {
        let key = match select.kind.as_deref() {
            None | Some("") => None,
            Some(k @ ("bridges" | "ports" | "vtep")) => Some(k),
            Some(k) => return Err(DocumentError::Kind(k.into())),
        };
        let name = select.name.as_deref().filter(|n| !n.is_empty());
        if name.is_some() && !matches!(key, Some("bridges" | "ports")) {
            return Err(DocumentError::NameWithoutKind);
        }
        let keep = |owner: Owner, object: &str| {
            (select.all_owners || owner == Owner::Local) && name.is_none_or(|n| n == object)
        };
        let picked = NodeState {
            bridges: self.bridges.iter().filter(|b| keep(b.owner, &b.item.name)).cloned().collect(),
            ports: self
                .ports
                .iter()
                .filter(|p| keep(p.owner, &p.item.config.name))
                .cloned()
                .collect(),
            vtep: self.vtep.clone().filter(|v| select.all_owners || v.owner == Owner::Local),
            ..NodeState::default()
        };
        if let (Some(name), Some(kind)) = (name, key) {
            let missing = match kind {
                "bridges" => picked.bridges.is_empty().then_some("bridge"),
                "ports" => picked.ports.is_empty().then_some("port"),
                _ => None,
            };
            if let Some(kind) = missing {
                return Err(DocumentError::NotFound { kind, name: name.into() });
            }
        }
        let mut doc = serde_json::to_value(&picked)?;
        if let (Some(key), Value::Object(map)) = (key, &mut doc) {
            map.retain(|k, _| k == key);
        }
        Ok(match format {
            "" | "yaml" | "yml" => knitter_api::yaml::to_string(&doc)?,
            // Some objects hold unit variants, which TOML cannot write (it reads them).
            "toml" => return Err(DocumentError::ExportFormat),
            "json" => serde_json::to_string_pretty(&doc)? + "\n",
            f => return Err(DocumentError::Format(f.into())),
        })
    }

    /// The first object another source than `local` owns, named.
    pub fn first_not_local(&self) -> Option<String> {
        let bridge = self
            .bridges
            .iter()
            .find(|b| b.owner != Owner::Local)
            .map(|b| format!("bridge {:?}", b.item.name));
        let port = || {
            self.ports
                .iter()
                .find(|p| p.owner != Owner::Local)
                .map(|p| format!("port {:?}", p.item.config.name))
        };
        let vtep = || {
            self.vtep.as_ref().filter(|v| v.owner != Owner::Local).map(|_| "the vtep".to_string())
        };
        bridge.or_else(port).or_else(vtep)
    }

    /// The switch configuration of the ports in `open` (ports whose device did not open are
    /// left out).
    pub fn switch_config(&self, open: impl Fn(&str) -> bool) -> SwitchConfig {
        SwitchConfig {
            // A gateway whose port did not open (its failure is the port's, reported there)
            // waits for it: one port must not hold back the node's whole configuration.
            bridges: self
                .bridges
                .iter()
                .map(|b| {
                    let mut b = b.item.clone();
                    if b.gateway
                        .as_ref()
                        .is_some_and(|g| self.port(&g.port).is_some() && !open(&g.port))
                    {
                        b.gateway = None;
                    }
                    b
                })
                .collect(),
            ports: self
                .ports
                .iter()
                .filter(|p| open(&p.item.config.name))
                .map(|p| p.item.config.clone())
                .collect(),
            vtep: self.running_vtep(),
        }
    }

    /// The VTEP as the switch runs it: its own peers and the manager's.
    pub fn running_vtep(&self) -> Option<VtepConfig> {
        self.vtep.as_ref().map(|v| {
            let mut vtep = v.item.clone();
            for p in &self.manager_peers {
                if !vtep.peers.iter().any(|q| q.ip == p.ip) {
                    vtep.peers.push(p.clone());
                }
            }
            vtep
        })
    }

    /// Why `spec`, a `host` device, cannot join this state: it is not an access port, its
    /// interface is another host port's or another port's device, or its subnets overlap another host port's (the node
    /// would route one network's traffic into the other).
    pub fn host_port_conflict(&self, spec: &PortSpec) -> Option<String> {
        let Device::Host { ifname, addresses, .. } = &spec.device else { return None };
        if !matches!(spec.config.mode, vswitch::config::PortMode::Access { .. }) {
            return Some("a host port is an access port of one bridge domain (its network)".into());
        }
        let sw = crate::host::switch_end(ifname);
        for other in
            self.ports.iter().map(|p| &p.item).filter(|p| p.config.name != spec.config.name)
        {
            match &other.device {
                Device::Host { ifname: theirs, addresses: their_addresses, .. } => {
                    if theirs == ifname {
                        return Some(format!(
                            "host interface {ifname} is port {:?}'s",
                            other.config.name
                        ));
                    }
                    if let Some((a, b)) = crate::host::overlap(addresses, their_addresses) {
                        return Some(format!(
                            "{a} overlaps {b} of host port {:?}: the node would route between the two networks",
                            other.config.name
                        ));
                    }
                }
                Device::AfXdp { ifname: theirs, netns: None }
                | Device::AfPacket { ifname: theirs, netns: None }
                    if *theirs == *ifname || *theirs == sw =>
                {
                    return Some(format!(
                        "interface {theirs} is port {:?}'s device",
                        other.config.name
                    ));
                }
                _ => {}
            }
        }
        None
    }

    pub fn port(&self, name: &str) -> Option<&Owned<PortSpec>> {
        self.ports.iter().find(|p| p.item.config.name == name)
    }

    pub fn bridge(&self, name: &str) -> Option<&Owned<BridgeConfig>> {
        self.bridges.iter().find(|b| b.item.name == name)
    }

    /// Reads the state file, of any format up to [`FORMAT`] (an older one is migrated: it
    /// is written in this format at the next save); a missing file is an empty state. A
    /// file of a newer format is read from the copy in this daemon's format beside it
    /// (which the newer daemon keeps up to date), with a warning; without that copy, refused.
    pub fn load(path: &Path) -> Result<NodeState, StateError> {
        let Some((format, state)) = Self::read(path)? else { return Ok(NodeState::default()) };
        if format <= FORMAT as u64 {
            if format < FORMAT as u64 {
                tracing::info!(path = %path.display(), from = format, to = FORMAT, "state file of an older format: migrated");
            }
            return Ok(state);
        }
        let backup = backup_path(path, FORMAT);
        match Self::read(&backup)? {
            Some((f, state)) if f == FORMAT as u64 => {
                tracing::warn!(path = %path.display(), format, backup = %backup.display(), ours = FORMAT, "state file of a newer format: reading the copy in this daemon's format (a rollback)");
                Ok(state)
            }
            _ => Err(StateError::Newer {
                path: path.display().to_string(),
                format,
                ours: FORMAT,
                backup: backup.display().to_string(),
            }),
        }
    }

    /// A state file's format and state; `None` when there is no file.
    fn read(path: &Path) -> Result<Option<(u64, NodeState)>, StateError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Read { path: path.display().to_string(), source });
            }
        };
        let parse = |source| StateError::Parse { path: path.display().to_string(), source };
        let mut value: Value = serde_json::from_str(&text).map_err(parse)?;
        let format = match value.as_object_mut().and_then(|m| m.remove("format")) {
            None => 1,
            Some(f) => f.as_u64().filter(|f| *f >= 1).ok_or_else(|| {
                parse(serde::de::Error::custom(format!("format {f} is not a format number")))
            })?,
        };
        if format > FORMAT as u64 {
            return Ok(Some((format, NodeState::default())));
        }
        Ok(Some((format, serde_json::from_value(value).map_err(parse)?)))
    }

    /// Writes the state file in [`FORMAT`], and beside it in the format before (see
    /// [`FORMAT`]), each atomically: a temporary file in the same directory, synced, renamed
    /// over the old one, and the directory synced, so a crash leaves the old state or the
    /// new one, never a mix.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let err = |source| StateError::Write { path: path.display().to_string(), source };
        let mut value = serde_json::to_value(self).map_err(|e| err(std::io::Error::other(e)))?;
        // Format 1 is format 2 without its key.
        write_atomically(&backup_path(path, FORMAT - 1), &value).map_err(err)?;
        if let Some(m) = value.as_object_mut() {
            m.insert("format".into(), FORMAT.into());
        }
        write_atomically(path, &value).map_err(err)
    }
}

/// Where the copy of the state in format `format` is kept: `<file>.format-N`.
pub fn backup_path(path: &Path, format: u32) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".format-{format}"));
    p.into()
}

fn write_atomically(path: &Path, value: &Value) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let json = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&json).and_then(|_| f.sync_all())?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_one_table_with_its_device_and_owner() {
        let text = r#"
            [[ports]]
            name = "pod1"
            device = { kind = "af_xdp", ifname = "veth1", netns = "node1" }
            mode = { kind = "access", bridge = "red" }
            owner = "manager"
        "#;
        let s: NodeState = toml::from_str(text).unwrap();
        let p = &s.ports[0];
        assert_eq!(p.owner, Owner::Manager);
        assert_eq!(
            p.item.device,
            Device::AfXdp { ifname: "veth1".into(), netns: Some("node1".into()) }
        );
        assert_eq!(p.item.config, PortConfig::access("pod1", "red"));
        let back: NodeState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let e = toml::from_str::<NodeState>("[[ports]]\nname = \"p\"\ndevice = { kind = \"af_packet\", ifname = \"x\" }\nmode = { kind = \"underlay\" }\nmtuu = 1\n").unwrap_err();
        assert!(e.to_string().contains("mtuu"), "{e}");
        let e = toml::from_str::<NodeState>("[[bridges]]\nname = \"b\"\nowner = \"somebody\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("owner"), "{e}");
    }

    /// Today's files (format 1, no key) load; a save writes format 2 and, beside it, the
    /// state as a format-1 daemon reads it (with its strict parser: no unknown key).
    #[test]
    fn an_older_format_is_migrated_and_the_previous_one_kept_beside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let s = NodeState {
            bridges: vec![Owned::local(BridgeConfig::new("red").vni(5001))],
            ..Default::default()
        };
        std::fs::write(&path, serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(NodeState::load(&path).unwrap(), s);
        s.save(&path).unwrap();
        let main: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(main["format"], FORMAT);
        let old = std::fs::read_to_string(backup_path(&path, 1)).unwrap();
        assert_eq!(
            serde_json::from_str::<NodeState>(&old).unwrap(),
            s,
            "a format-1 daemon reads the copy"
        );
        assert_eq!(NodeState::load(&path).unwrap(), s);
    }

    /// A rollback: the main file is of a newer format; the copy in ours beside it is read.
    /// Without that copy the daemon refuses, naming both formats.
    #[test]
    fn a_newer_format_reads_the_copy_in_ours_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let s = NodeState {
            bridges: vec![Owned::local(BridgeConfig::new("blue").vlan(7))],
            ..Default::default()
        };
        std::fs::write(&path, r#"{"format": 3, "bridges": [], "something_new": true}"#).unwrap();
        let e = NodeState::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("format 3") && e.contains("(2)") && e.contains("state.json.format-2"),
            "{e}"
        );
        let mut ours = serde_json::to_value(&s).unwrap();
        ours["format"] = FORMAT.into();
        std::fs::write(backup_path(&path, FORMAT), ours.to_string()).unwrap();
        assert_eq!(NodeState::load(&path).unwrap(), s);
    }

    #[test]
    fn saved_state_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(NodeState::load(&path).unwrap(), NodeState::default());
        let s = NodeState {
            bridges: vec![Owned::local(BridgeConfig::new("red").vni(5001))],
            ..Default::default()
        };
        s.save(&path).unwrap();
        assert_eq!(NodeState::load(&path).unwrap(), s);
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(NodeState::load(&path), Err(StateError::Parse { .. })));
    }
}

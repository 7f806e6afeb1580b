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
fn with_key<S: Serializer, T: Serialize, K: Serialize>(s: S, inner: &T, key: &str, value: &K) -> Result<S::Ok, S::Error> {
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
            device: serde_json::from_value(device).map_err(|e| D::Error::custom(format!("device: {e}")))?,
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
            Some(o) => serde_json::from_value(o).map_err(|e| D::Error::custom(format!("owner: {e}")))?,
        };
        Ok(Owned { owner, item: serde_json::from_value(Value::Object(rest)).map_err(D::Error::custom)? })
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
    pub attachments: Vec<crate::attach::Record>,
    /// Port releases the manager has not acknowledged yet (it was unreachable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_releases: Vec<crate::attach::Key>,
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
}

/// Why a topology document was refused.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("topology document (YAML): {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("topology document (TOML): {0}")]
    Toml(#[from] toml::de::Error),
    #[error("topology document (JSON): {0}")]
    Json(#[from] serde_json::Error),
    #[error("unknown document format {0:?}: use yaml, toml or json")]
    Format(String),
    #[error("a topology document declares local objects only; {0} says otherwise")]
    NotLocal(String),
}

impl NodeState {
    /// Parses a topology document (`knitterctl apply -f`): the config file's `bridges`,
    /// `ports` and `vtep`, every object local.
    pub fn parse(text: &str, format: &str) -> Result<NodeState, DocumentError> {
        let doc: NodeState = match format {
            "" | "yaml" | "yml" => serde_yaml::from_str(text)?,
            "toml" => toml::from_str(text)?,
            "json" => serde_json::from_str(text)?,
            f => return Err(DocumentError::Format(f.into())),
        };
        match doc.first_not_local() {
            Some(what) => Err(DocumentError::NotLocal(what)),
            None => Ok(doc),
        }
    }

    /// The first object another source than `local` owns, named.
    pub fn first_not_local(&self) -> Option<String> {
        let bridge = self.bridges.iter().find(|b| b.owner != Owner::Local).map(|b| format!("bridge {:?}", b.item.name));
        let port = || self.ports.iter().find(|p| p.owner != Owner::Local).map(|p| format!("port {:?}", p.item.config.name));
        let vtep = || self.vtep.as_ref().filter(|v| v.owner != Owner::Local).map(|_| "the vtep".to_string());
        bridge.or_else(port).or_else(vtep)
    }

    /// The switch configuration of the ports in `open` (ports whose device did not open are
    /// left out).
    pub fn switch_config(&self, open: impl Fn(&str) -> bool) -> SwitchConfig {
        SwitchConfig {
            bridges: self.bridges.iter().map(|b| b.item.clone()).collect(),
            ports: self.ports.iter().filter(|p| open(&p.item.config.name)).map(|p| p.item.config.clone()).collect(),
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

    pub fn port(&self, name: &str) -> Option<&Owned<PortSpec>> {
        self.ports.iter().find(|p| p.item.config.name == name)
    }

    pub fn bridge(&self, name: &str) -> Option<&Owned<BridgeConfig>> {
        self.bridges.iter().find(|b| b.item.name == name)
    }

    /// Reads the state file; a missing file is an empty state.
    pub fn load(path: &Path) -> Result<NodeState, StateError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NodeState::default()),
            Err(source) => return Err(StateError::Read { path: path.display().to_string(), source }),
        };
        serde_json::from_str(&text).map_err(|source| StateError::Parse { path: path.display().to_string(), source })
    }

    /// Writes the state file atomically: a temporary file in the same directory, synced,
    /// renamed over the old one, and the directory synced, so a crash leaves the old state
    /// or the new one, never a mix.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let err = |source| StateError::Write { path: path.display().to_string(), source };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&json).and_then(|_| f.sync_all()).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(err)
    }
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
        assert_eq!(p.item.device, Device::AfXdp { ifname: "veth1".into(), netns: Some("node1".into()) });
        assert_eq!(p.item.config, PortConfig::access("pod1", "red"));
        let back: NodeState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let e = toml::from_str::<NodeState>("[[ports]]\nname = \"p\"\ndevice = { kind = \"af_packet\", ifname = \"x\" }\nmode = { kind = \"underlay\" }\nmtuu = 1\n").unwrap_err();
        assert!(e.to_string().contains("mtuu"), "{e}");
        let e = toml::from_str::<NodeState>("[[bridges]]\nname = \"b\"\nowner = \"somebody\"\n").unwrap_err();
        assert!(e.to_string().contains("owner"), "{e}");
    }

    #[test]
    fn saved_state_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(NodeState::load(&path).unwrap(), NodeState::default());
        let s = NodeState { bridges: vec![Owned::local(BridgeConfig::new("red").vni(5001))], ..Default::default() };
        s.save(&path).unwrap();
        assert_eq!(NodeState::load(&path).unwrap(), s);
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(NodeState::load(&path), Err(StateError::Parse { .. })));
    }
}

//! The CNI protocol as the runtime speaks it: the environment, the network configuration on
//! stdin, the supported versions, results in each version's format and error results with
//! the spec's codes (CNI spec 1.1.0; 0.3.x, 0.4.0 and 1.0.0 too).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};

/// Every version this plugin answers in, oldest first.
pub const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The spec's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnvironment = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    NotAvailable = 50,
    NotAvailableLimitedConnectivity = 51,
    /// Plugin-specific: CHECK found the attachment not as it should be.
    CheckFailed = 100,
    /// Plugin-specific: the manager or the node refused the request.
    Refused = 101,
}

/// A CNI error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>) -> CniError {
        CniError { code, msg: msg.into(), details: String::new() }
    }

    pub fn details(mut self, d: impl Into<String>) -> CniError {
        self.details = d.into();
        self
    }

    /// The error result, in `version`.
    pub fn to_json(&self, version: &str) -> Value {
        let mut v = json!({ "cniVersion": version, "code": self.code as u32, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = self.details.clone().into();
        }
        v
    }
}

/// `a < b` for dotted versions.
pub fn older(a: &str, b: &str) -> bool {
    let parse = |v: &str| v.split('.').map(|p| p.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>();
    parse(a) < parse(b)
}

/// The verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

/// What the runtime put in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS`: `K=V;K=V` (K8S_POD_NAMESPACE, K8S_POD_NAME, IP, MAC, IgnoreUnknown...).
    pub args: HashMap<String, String>,
}

impl Env {
    /// Reads the environment through `get`, requiring what `command` requires (VERSION
    /// needs nothing: runtimes call it with placeholder values).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let command = match get("CNI_COMMAND").as_deref() {
            Some("ADD") => Command::Add,
            Some("DEL") => Command::Del,
            Some("CHECK") => Command::Check,
            Some("GC") => Command::Gc,
            Some("STATUS") => Command::Status,
            Some("VERSION") => Command::Version,
            Some(other) => {
                return Err(CniError::new(
                    Code::InvalidEnvironment,
                    format!("CNI_COMMAND {other:?} is not ADD, DEL, CHECK, GC, STATUS or VERSION"),
                ));
            }
            None => return Err(CniError::new(Code::InvalidEnvironment, "CNI_COMMAND is not set")),
        };
        let needs: &[&str] = match command {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
            Command::Gc | Command::Status | Command::Version => &[],
        };
        let missing: Vec<&str> =
            needs.iter().copied().filter(|k| get(k).is_none_or(|v| v.is_empty())).collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                Code::InvalidEnvironment,
                format!("{} must be set for {command:?}", missing.join(", ")),
            ));
        }
        let mut args = HashMap::new();
        for kv in get("CNI_ARGS").unwrap_or_default().split(';').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                CniError::new(
                    Code::InvalidEnvironment,
                    format!("CNI_ARGS entry {kv:?} is not KEY=VALUE"),
                )
            })?;
            args.insert(k.to_string(), v.to_string());
        }
        Ok(Env {
            command,
            container_id: get("CNI_CONTAINERID").unwrap_or_default(),
            netns: get("CNI_NETNS").unwrap_or_default(),
            ifname: get("CNI_IFNAME").unwrap_or_default(),
            args,
        })
    }
}

/// `args.cni` and `runtimeConfig`: addresses and a MAC asked for (Multus passes the
/// network selection's `ips` and `mac` this way, and its `cni-args` as `args.cni`), the
/// interface type and IP group, further planes (`networks`), the pod's annotations,
/// where Multus wants the device-info file, and the device the SR-IOV device plugin
/// allocated (`deviceID`, the well-known capability).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Requested {
    pub ips: Vec<String>,
    pub mac: Option<String>,
    pub interface_type: Option<InterfaceType>,
    pub ip_group: Option<String>,
    pub networks: Option<Value>,
    #[serde(rename = "io.kubernetes.cri.pod-annotations")]
    pub pod_annotations: BTreeMap<String, String>,
    #[serde(rename = "CNIDeviceInfoFile")]
    pub device_info_file: Option<String>,
    #[serde(rename = "deviceID")]
    pub device_id: Option<String>,
}

/// What the pod's side of an attachment is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum InterfaceType {
    /// A kernel interface (a veth pair) in the pod's namespace.
    #[default]
    #[serde(rename = "veth")]
    Veth,
    /// A vhost-user socket for a DPDK app in the pod.
    #[serde(rename = "vhost-user")]
    VhostUser,
    /// An SR-IOV VF: into the pod's namespace, or (bound to vfio-pci) for its DPDK app.
    #[serde(rename = "sriov")]
    Sriov,
}

/// The emptyDir volume a pod's vhost-user socket is handed over in, unless its network names
/// another.
pub const DEFAULT_VHOST_VOLUME: &str = "knitter-vhost";

/// Where vhost-user sockets are handed to pods and who listens on them: in Kubernetes, the
/// pod's own emptyDir volume (`volume`, default `knitter-vhost`, mounted at `mountPath`,
/// default /var/run/knitter); with `dir` set, or outside Kubernetes, a shared host directory
/// (default /run/knitter/vhost) with a subdirectory per pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct VhostUserConf {
    /// The shared host directory pods mount.
    pub dir: Option<String>,
    /// The pod's emptyDir volume the socket is handed over in.
    pub volume: Option<String>,
    /// Where the pod mounts that volume (what its network-status tells its app).
    pub mount_path: Option<String>,
    /// The switch listens and the app connects (default: the app listens, the switch
    /// connects and reconnects).
    pub switch_listens: bool,
    /// The pod directory's mode, octal text such as "0770".
    pub mode: Option<String>,
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Args {
    pub cni: Requested,
}

/// The plugin's network configuration (one plugin of a conflist, with the list's
/// `cniVersion` and `name` filled in by the runtime).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The Knitter network to attach to (default: the configuration's name).
    #[serde(default)]
    pub network: Option<String>,
    /// knitter-vswitchd's socket.
    #[serde(default)]
    pub socket: Option<String>,
    /// Take the address from this IP group.
    #[serde(default)]
    pub ip_group: Option<String>,
    /// This interface carries the default routes (default: when it is eth0).
    #[serde(default)]
    pub default_route: Option<bool>,
    /// The interface's type (default veth; `args.cni.interfaceType` overrides it per call).
    #[serde(default)]
    pub interface_type: InterfaceType,
    #[serde(default)]
    pub vhost_user: VhostUserConf,
    /// The SR-IOV VF to use (its PCI address): Multus puts the device plugin's allocation
    /// here when the NAD names a `resourceName` (sriov-cni's `deviceID`).
    #[serde(default, rename = "deviceID")]
    pub device_id: Option<String>,
    /// One ADD attaches the pod to every network it asks for (Knitter alone on the node);
    /// otherwise one network per call (Multus delegates each).
    #[serde(default)]
    pub standalone: bool,
    #[serde(default)]
    pub args: Args,
    #[serde(default)]
    pub runtime_config: Requested,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Vec<ValidAttachment>,
    /// Whatever else the runtime passes (prevResult, capabilities, dns...).
    #[serde(flatten)]
    pub other: HashMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl NetConf {
    /// Parses stdin: a decode failure is code 6, a configuration that makes no sense 7, a
    /// version this plugin does not speak 1.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
            let code = if e.is_data() { Code::InvalidConfig } else { Code::Decode };
            CniError::new(code, format!("network configuration: {e}"))
        })?;
        if !SUPPORTED.contains(&conf.cni_version.as_str()) {
            return Err(CniError::new(
                Code::IncompatibleVersion,
                format!("cniVersion {:?} is not supported", conf.cni_version),
            )
            .details(format!("supported: {}", SUPPORTED.join(", "))));
        }
        if conf.name.is_empty() {
            return Err(CniError::new(
                Code::InvalidConfig,
                "network configuration: \"name\" is empty",
            ));
        }
        conf.vhost_mode()?;
        Ok(conf)
    }

    pub fn network(&self) -> &str {
        self.network.as_deref().unwrap_or(&self.name)
    }

    /// `vhostUser.mode` as a number.
    pub fn vhost_mode(&self) -> Result<Option<u32>, CniError> {
        self.vhost_user
            .mode
            .as_deref()
            .map(|m| {
                u32::from_str_radix(m.trim_start_matches("0o"), 8).ok().filter(|m| *m <= 0o7777)
            })
            .map(|m| {
                m.ok_or_else(|| {
                    CniError::new(
                        Code::InvalidConfig,
                        format!(
                            "vhostUser.mode {:?} is not an octal mode such as \"0770\"",
                            self.vhost_user.mode.as_deref().unwrap_or("")
                        ),
                    )
                })
            })
            .transpose()
    }
}

/// An interface of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    pub mtu: u32,
    /// The netns path; empty for the node's side.
    pub sandbox: String,
    pub socket_path: String,
    /// An SR-IOV VF's PCI address.
    pub pci_id: String,
}

/// An address of a result: `address/prefix`, its gateway, the interface index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpResult {
    pub address: String,
    pub gateway: Option<String>,
    pub interface: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteResult {
    pub dst: String,
    pub gw: Option<String>,
}

/// An ADD result before it is put in a version's format.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpResult>,
    pub routes: Vec<RouteResult>,
}

impl AddResult {
    /// In `version`'s format: 0.3.x and 0.4.0 carry `ips[].version`; `mtu`, `socketPath`
    /// and `pciID` exist from 1.1.0 on.
    pub fn to_json(&self, version: &str) -> Value {
        let v110 = !older(version, "1.1.0");
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                // The node's end of a veth has no MAC worth reporting: omitted, not "".
                let mut v = json!({ "name": i.name });
                if !i.mac.is_empty() {
                    v["mac"] = i.mac.clone().into();
                }
                if !i.sandbox.is_empty() {
                    v["sandbox"] = i.sandbox.clone().into();
                }
                if v110 {
                    if i.mtu > 0 {
                        v["mtu"] = i.mtu.into();
                    }
                    if !i.socket_path.is_empty() {
                        v["socketPath"] = i.socket_path.clone().into();
                    }
                    if !i.pci_id.is_empty() {
                        v["pciID"] = i.pci_id.clone().into();
                    }
                }
                v
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = json!({ "address": ip.address, "interface": ip.interface });
                if let Some(g) = &ip.gateway {
                    v["gateway"] = g.clone().into();
                }
                if older(version, "1.0.0") {
                    v["version"] = (if ip.address.contains(':') { "6" } else { "4" }).into();
                }
                v
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut v = json!({ "dst": r.dst });
                if let Some(g) = &r.gw {
                    v["gw"] = g.clone().into();
                }
                v
            })
            .collect();
        json!({ "cniVersion": version, "interfaces": interfaces, "ips": ips, "routes": routes, "dns": {} })
    }
}

/// The VERSION answer.
pub fn version_result(asked: Option<&str>) -> Value {
    json!({ "cniVersion": asked.filter(|v| SUPPORTED.contains(v)).unwrap_or("1.1.0"), "supportedVersions": SUPPORTED })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conflist docs/cni.md tells users to install works with runtimes whose libcni is
    /// older than 1.2 (which know result versions up to 1.0.0 and ignore `cniVersions`) and
    /// lets newer ones pick 1.1.0; an ADD result in the list's version is one those runtimes
    /// accept.
    #[test]
    fn the_documented_conflist_works_with_libcni_before_1_2() {
        let doc = include_str!("../../docs/cni.md");
        let start = doc.find("10-knitter.conflist\n").expect("the conflist example")
            + "10-knitter.conflist\n".len();
        let end = start + doc[start..].find("\nEOF").expect("its end");
        let conf: Value = serde_json::from_str(&doc[start..end]).expect("the example is JSON");
        let version = conf["cniVersion"].as_str().unwrap();
        assert_eq!(version, "1.0.0");
        assert_eq!(conf["cniVersions"], json!(["1.0.0", "1.1.0"]));
        const LIBCNI_1_1: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];
        let r = AddResult {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: "0a:58:0a:00:00:02".into(),
                mtu: 1450,
                sandbox: "/run/netns/p".into(),
                socket_path: "/run/knitter/vhost/abc/net1.sock".into(),
                pci_id: String::new(),
            }],
            ..Default::default()
        }
        .to_json(version);
        assert!(LIBCNI_1_1.contains(&r["cniVersion"].as_str().unwrap()), "{r}");
        assert!(
            r["interfaces"][0].get("socketPath").is_none(),
            "1.1.0's field: the JSON beside the socket says it"
        );
    }

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let m: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env::read(|k| m.get(k).cloned())
    }

    #[test]
    fn the_environment_is_read_and_what_is_missing_named() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/p"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;IgnoreUnknown=1"),
        ])
        .unwrap();
        assert_eq!((e.command, e.args["K8S_POD_NAME"].as_str()), (Command::Add, "p"));
        let err = env(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c1")]).unwrap_err();
        assert_eq!(
            (err.code, err.msg.as_str()),
            (Code::InvalidEnvironment, "CNI_NETNS, CNI_IFNAME must be set for Add")
        );
        assert!(
            env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0")])
                .is_ok(),
            "DEL works without a netns"
        );
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert_eq!(env(&[("CNI_COMMAND", "FROB")]).unwrap_err().code, Code::InvalidEnvironment);
        assert_eq!(
            env(&[("CNI_COMMAND", "GC"), ("CNI_ARGS", "junk")]).unwrap_err().code,
            Code::InvalidEnvironment
        );
    }

    #[test]
    fn configurations_are_decoded_or_refused_with_the_right_code() {
        let ok = NetConf::parse(br#"{"cniVersion":"0.4.0","name":"red","type":"knitter-cni","runtimeConfig":{"ips":["10.0.0.5/24"]},"prevResult":{}}"#).unwrap();
        assert_eq!((ok.network(), ok.runtime_config.ips.len()), ("red", 1));
        assert!(ok.other.contains_key("prevResult"));
        let v = NetConf::parse(br#"{"cniVersion":"1.1.0","name":"dp","type":"knitter-cni","interfaceType":"vhost-user","vhostUser":{"dir":"/v","mode":"0750"},
            "args":{"cni":{"interfaceType":"veth","networks":"red"}},"runtimeConfig":{"CNIDeviceInfoFile":"/d.json","io.kubernetes.cri.pod-annotations":{"networks":"{}"}}}"#)
        .unwrap();
        assert_eq!(
            (v.interface_type, v.vhost_mode().unwrap(), v.args.cni.interface_type),
            (InterfaceType::VhostUser, Some(0o750), Some(InterfaceType::Veth))
        );
        assert_eq!(
            (v.runtime_config.device_info_file.as_deref(), v.runtime_config.pod_annotations.len()),
            (Some("/d.json"), 1)
        );
        assert_eq!(
            NetConf::parse(
                br#"{"cniVersion":"1.1.0","name":"a","type":"x","interfaceType":"tap"}"#
            )
            .unwrap_err()
            .code,
            Code::InvalidConfig
        );
        assert_eq!(
            NetConf::parse(
                br#"{"cniVersion":"1.1.0","name":"a","type":"x","vhostUser":{"mode":"rw"}}"#
            )
            .unwrap_err()
            .code,
            Code::InvalidConfig
        );
        assert_eq!(NetConf::parse(b"{not json").unwrap_err().code, Code::Decode);
        assert_eq!(
            NetConf::parse(br#"{"cniVersion":"1.1.0","type":"knitter-cni"}"#).unwrap_err().code,
            Code::InvalidConfig
        );
        assert_eq!(
            NetConf::parse(br#"{"cniVersion":"1.1.0","name":"","type":"x"}"#).unwrap_err().code,
            Code::InvalidConfig
        );
        let e = NetConf::parse(br#"{"cniVersion":"0.2.0","name":"a","type":"x"}"#).unwrap_err();
        assert_eq!(
            (e.code, e.details.as_str()),
            (Code::IncompatibleVersion, "supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0")
        );
    }

    #[test]
    fn each_version_gets_its_own_result_format() {
        let r = AddResult {
            interfaces: vec![
                Interface {
                    name: "kn01".into(),
                    mac: "aa:bb:cc:dd:ee:ff".into(),
                    mtu: 1450,
                    sandbox: String::new(),
                    socket_path: String::new(),
                    pci_id: String::new(),
                },
                Interface {
                    name: "eth0".into(),
                    mac: "0a:58:0a:00:00:02".into(),
                    mtu: 1450,
                    sandbox: "/run/netns/p".into(),
                    socket_path: String::new(),
                    pci_id: String::new(),
                },
            ],
            ips: vec![IpResult {
                address: "10.0.0.2/24".into(),
                gateway: Some("10.0.0.1".into()),
                interface: 1,
            }],
            routes: vec![RouteResult { dst: "0.0.0.0/0".into(), gw: Some("10.0.0.1".into()) }],
        };
        let old = r.to_json("0.3.1");
        assert_eq!(old["ips"][0]["version"], "4");
        assert!(old["interfaces"][1].get("mtu").is_none());
        let v100 = r.to_json("1.0.0");
        assert!(
            v100["ips"][0].get("version").is_none() && v100["interfaces"][1].get("mtu").is_none()
        );
        let v110 = r.to_json("1.1.0");
        assert_eq!(
            (v110["cniVersion"].as_str(), v110["interfaces"][1]["mtu"].as_u64()),
            (Some("1.1.0"), Some(1450))
        );
        assert_eq!(v110["interfaces"][1]["sandbox"], "/run/netns/p");
        assert!(v110["interfaces"][0].get("sandbox").is_none());
        assert_eq!(version_result(Some("0.4.0"))["cniVersion"], "0.4.0");
        assert_eq!(
            CniError::new(Code::TryAgainLater, "x").to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 11, "msg": "x"})
        );
    }
}

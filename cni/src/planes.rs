//! The networks a pod asks for beside its first interface, read from the forms users
//! already write: Multus's `k8s.v1.cni.cncf.io/networks` annotation (the comma string
//! `net-a, ns/net-b, net-c@ifname` or the JSON list of network selection elements) and the
//! original Knitter's `networks` annotation (`{"ports":[{"attach_to_network": …,
//! "attributes": {…}}]}`). Either reaches the plugin through `runtimeConfig`'s
//! `io.kubernetes.cri.pod-annotations` (containerd and CRI-O pass pod annotations to
//! plugins that declare that capability), the configuration's `args.cni.networks`, or
//! `CNI_ARGS` `NETWORKS=` (the comma string).

use crate::spec::{CniError, Code};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};

pub const MULTUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
pub const KNITTER_ANNOTATION: &str = "networks";

/// One interface a pod asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plane {
    pub network: String,
    pub ifname: String,
    pub ips: Vec<String>,
    pub mac: Option<String>,
    pub ip_group: Option<String>,
    /// A vhost-user interface for a DPDK app instead of a veth.
    pub vhost: bool,
    /// An SR-IOV VF instead of a veth: the one at `device_id` (a PCI address), or one the
    /// node picks.
    pub sriov: bool,
    pub device_id: Option<String>,
    /// `device_id` is the device plugin's (Multus's `deviceID`, `runtimeConfig.deviceID`),
    /// not the pod's own choice (its cni-args or annotation).
    pub device_by_plugin: bool,
    pub default_route: bool,
}

fn invalid(msg: String) -> CniError {
    CniError::new(Code::InvalidConfig, msg)
}

/// The Multus form's planes, named `net1`, `net2`… by position unless they say; `from`
/// names where the text came from in errors ("the k8s.v1.cni.cncf.io/networks
/// annotation", "args.cni.networks", "CNI_ARGS NETWORKS").
pub fn multus(text: &str, from: &str) -> Result<Vec<Plane>, CniError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let planes: Vec<Plane> = if text.starts_with('[') {
        let list: Vec<Selection> = serde_json::from_str(text)
            .map_err(|e| invalid(format!("{from} is not a list of network selections: {e}")))?;
        list.into_iter().enumerate().map(|(i, s)| s.plane(i, from)).collect::<Result<_, _>>()?
    } else {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
            .map(|(i, s)| selection_text(s, i, from))
            .collect::<Result<_, _>>()?
    };
    Ok(planes)
}

/// `[namespace/]name[@ifname]`
fn selection_text(s: &str, index: usize, from: &str) -> Result<Plane, CniError> {
    let (name, ifname) = match s.split_once('@') {
        Some((n, i)) => (n, Some(i.to_string())),
        None => (s, None),
    };
    let network = name.rsplit('/').next().unwrap_or(name).trim();
    if network.is_empty() {
        return Err(invalid(format!("{s:?} in {from} names no network")));
    }
    Ok(Plane {
        network: network.into(),
        ifname: ifname.unwrap_or_else(|| format!("net{}", index + 1)),
        ..Default::default()
    })
}

/// A Multus network selection element (the fields Knitter uses).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Selection {
    name: String,
    #[serde(default)]
    ips: Vec<String>,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    interface: Option<String>,
    #[serde(default)]
    cni_args: BTreeMap<String, Value>,
    #[serde(default)]
    default_route: Vec<String>,
}

impl Selection {
    fn plane(self, index: usize, from: &str) -> Result<Plane, CniError> {
        let mut p = selection_text(&self.name, index, from)?;
        if let Some(i) = self.interface {
            p.ifname = i;
        }
        p.ips = self.ips.iter().map(|ip| ip.split('/').next().unwrap_or("").to_string()).collect();
        p.mac = self.mac;
        p.default_route = !self.default_route.is_empty();
        let kind = self.cni_args.get("interfaceType").and_then(Value::as_str);
        p.vhost = kind == Some("vhost-user");
        p.sriov = kind == Some("sriov");
        p.device_id = self.cni_args.get("deviceID").and_then(Value::as_str).map(str::to_string);
        p.ip_group = self.cni_args.get("ipGroup").and_then(Value::as_str).map(str::to_string);
        Ok(p)
    }
}

/// The original Knitter form's planes (`from` as for [`multus`]).
pub fn knitter(text: &str, from: &str) -> Result<Vec<Plane>, CniError> {
    #[derive(Deserialize)]
    struct Doc {
        ports: Vec<Port>,
    }
    #[derive(Deserialize)]
    struct Port {
        attach_to_network: String,
        #[serde(default)]
        attributes: BTreeMap<String, Value>,
    }
    let doc: Doc = serde_json::from_str(text).map_err(|e| {
        invalid(format!("{from} is not {{\"ports\":[{{\"attach_to_network\":…}}]}}: {e}"))
    })?;
    let text_of = |a: &BTreeMap<String, Value>, k: &str| -> Option<String> {
        match a.get(k) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            _ => None,
        }
    };
    doc.ports
        .into_iter()
        .map(|p| {
            let a = &p.attributes;
            let network = p.attach_to_network.trim().to_string();
            if network.is_empty() {
                return Err(invalid(format!("a port of {from} has no attach_to_network")));
            }
            let sriov = match text_of(a, "nic_type").as_deref() {
                None | Some("normal") => false,
                Some("direct") => true,
                Some("physical") => {
                    return Err(CniError::new(Code::Refused, format!("network {network}: nic_type physical (a whole NIC) is not attached by knitter-cni; use normal (veth, or vhost-user with accelerate) or direct (an SR-IOV VF)")))
                }
                Some(t) => return Err(invalid(format!("network {network}: unknown nic_type {t:?} (normal, direct, physical)"))),
            };
            let ifname = text_of(a, "nic_name").unwrap_or_else(|| format!("eth_{network}").chars().take(12).collect());
            if ifname.len() > 12 {
                return Err(invalid(format!("network {network}: nic_name {ifname:?} is longer than 12 characters")));
            }
            // As the original: the std plane is never accelerated.
            let function = text_of(a, "function").unwrap_or_else(|| "std".into());
            // A direct (VF) interface is accelerated by the VF itself: a DPDK app opens it
            // through vfio-pci when the device plugin gave it one bound so.
            let vhost = !sriov && function != "std" && text_of(a, "accelerate").as_deref() == Some("true");
            Ok(Plane {
                network,
                ifname,
                ips: text_of(a, "ip_addr").into_iter().collect(),
                ip_group: text_of(a, "ip_group_name"),
                vhost,
                sriov,
                device_id: text_of(a, "pci_address"),
                ..Default::default()
            })
        })
        .collect()
}

/// The planes the pod's annotations ask for (Knitter's form wins when both are there).
pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Vec<Plane>, CniError> {
    if let Some(k) = annotations.get(KNITTER_ANNOTATION) {
        return knitter(k, &format!("the {KNITTER_ANNOTATION} annotation"));
    }
    annotations
        .get(MULTUS_ANNOTATION)
        .map_or(Ok(Vec::new()), |m| multus(m, &format!("the {MULTUS_ANNOTATION} annotation")))
}

/// The planes asked for as `args.cni.networks`: a Multus string or list, or a Knitter
/// document.
pub fn from_value(v: &Value) -> Result<Vec<Plane>, CniError> {
    match v {
        Value::String(s) => multus(s, "args.cni.networks"),
        Value::Array(_) => multus(&v.to_string(), "args.cni.networks"),
        Value::Object(o) if o.contains_key("ports") => knitter(&v.to_string(), "args.cni.networks"),
        other => Err(invalid(format!(
            "args.cni.networks must be a Multus network list or a Knitter {{\"ports\":…}} document, not {other}"
        ))),
    }
}

/// Refuses interface names that are invalid or used twice (the first interface included).
pub fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), CniError> {
    let mut seen = HashSet::new();
    for n in names {
        knitter_api::names::interface_name(n).map_err(invalid)?;
        if !seen.insert(n) {
            return Err(invalid(format!("interface {n} is asked for twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multus_string_form() {
        let p = multus("red, ns1/blue@media0 ,green", "test").unwrap();
        assert_eq!(
            p.iter().map(|p| (p.network.as_str(), p.ifname.as_str())).collect::<Vec<_>>(),
            [("red", "net1"), ("blue", "media0"), ("green", "net3")]
        );
        assert!(multus("", "test").unwrap().is_empty());
        assert_eq!(multus("ns/@x", "test").unwrap_err().code, Code::InvalidConfig);
    }

    /// A malformed request says where it came from: the annotation, args.cni.networks or
    /// CNI_ARGS (it always said "the ... annotation").
    #[test]
    fn errors_name_the_source() {
        let e = from_value(&Value::String("[{oops".into())).unwrap_err();
        assert!(e.msg.contains("args.cni.networks is not a list"), "{}", e.msg);
        let mut a = BTreeMap::new();
        a.insert(MULTUS_ANNOTATION.to_string(), "[{oops".to_string());
        let e = from_annotations(&a).unwrap_err();
        assert!(
            e.msg.contains(&format!("the {MULTUS_ANNOTATION} annotation is not a list")),
            "{}",
            e.msg
        );
        assert!(
            multus("ns/@x", "CNI_ARGS NETWORKS")
                .unwrap_err()
                .msg
                .contains("in CNI_ARGS NETWORKS names no network")
        );
    }

    #[test]
    fn the_multus_json_form() {
        let p = multus(r#"[{"name":"red","interface":"r0","ips":["10.1.0.7/24"],"mac":"0a:00:00:00:00:07","default-route":["10.1.0.1"]},
                           {"name":"dp","namespace":"ns","cni-args":{"interfaceType":"vhost-user","ipGroup":"g1"}}]"#, "test")
            .unwrap();
        assert_eq!(
            p[0],
            Plane {
                network: "red".into(),
                ifname: "r0".into(),
                ips: vec!["10.1.0.7".into()],
                mac: Some("0a:00:00:00:00:07".into()),
                default_route: true,
                ..Default::default()
            }
        );
        assert_eq!(
            (p[1].ifname.as_str(), p[1].vhost, p[1].ip_group.as_deref()),
            ("net2", true, Some("g1"))
        );
        assert_eq!(multus("[{\"nam\":1}]", "test").unwrap_err().code, Code::InvalidConfig);
    }

    #[test]
    fn the_knitter_form() {
        let p = knitter(
            r#"{"ports":[{"attach_to_network":"control","attributes":{"nic_name":"eth1","function":"control","accelerate":"true","ip_group_name":"g"}},
                        {"attach_to_network":"oam_net","attributes":{"function":"std","accelerate":"true","ip_addr":"10.9.0.5"}}]}"#,
            "test",
        )
        .unwrap();
        assert_eq!(
            (p[0].ifname.as_str(), p[0].vhost, p[0].ip_group.as_deref()),
            ("eth1", true, Some("g"))
        );
        assert_eq!(
            (p[1].ifname.as_str(), p[1].vhost, p[1].ips.clone()),
            ("eth_oam_net", false, vec!["10.9.0.5".to_string()]),
            "std is never accelerated"
        );
        let p = knitter(r#"{"ports":[{"attach_to_network":"x","attributes":{"nic_type":"direct","function":"media","accelerate":"true","pci_address":"0000:01:00.2"}}]}"#, "test").unwrap();
        assert_eq!(
            (p[0].sriov, p[0].vhost, p[0].device_id.as_deref()),
            (true, false, Some("0000:01:00.2")),
            "direct is a VF, never vhost-user"
        );
        let p = multus(
            r#"[{"name":"sr","cni-args":{"interfaceType":"sriov","deviceID":"0000:01:00.3"}}]"#,
            "test",
        )
        .unwrap();
        assert_eq!((p[0].sriov, p[0].device_id.as_deref()), (true, Some("0000:01:00.3")));
        let e = knitter(
            r#"{"ports":[{"attach_to_network":"x","attributes":{"nic_type":"physical"}}]}"#,
            "test",
        )
        .unwrap_err();
        assert!(e.code == Code::Refused && e.msg.contains("whole NIC"), "{e:?}");
        assert_eq!(knitter(r#"{"ports":[{"attach_to_network":"x","attributes":{"nic_name":"much_too_long0"}}]}"#, "test").unwrap_err().code, Code::InvalidConfig);
        assert_eq!(knitter("[]", "test").unwrap_err().code, Code::InvalidConfig);
    }

    #[test]
    fn annotations_and_names() {
        let mut a = BTreeMap::new();
        a.insert(MULTUS_ANNOTATION.to_string(), "red".to_string());
        assert_eq!(from_annotations(&a).unwrap()[0].network, "red");
        a.insert(
            KNITTER_ANNOTATION.to_string(),
            r#"{"ports":[{"attach_to_network":"blue"}]}"#.to_string(),
        );
        assert_eq!(from_annotations(&a).unwrap()[0].network, "blue", "Knitter's form wins");
        assert!(check_names(["eth0", "net1"]).is_ok());
        assert!(check_names(["eth0", "eth0"]).unwrap_err().msg.contains("twice"));
        assert!(check_names(["a/b"]).is_err());
        assert_eq!(from_value(&serde_json::json!("red@r1")).unwrap()[0].ifname, "r1");
        assert!(from_value(&serde_json::json!(5)).is_err());
    }
}

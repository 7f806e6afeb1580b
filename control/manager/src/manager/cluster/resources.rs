//! The `Network`, `IPGroup` and `Cluster` custom resources (`networks.knitter.io`,
//! `ipgroups.knitter.io`, `clusters.knitter.io`, version `v1alpha1`; manifests in
//! deploy/kubernetes/base/crds/): what their specs ask of the manager and the status the
//! controller writes back.
//!
//! All are **cluster-scoped**: the manager names networks and IP groups cluster-wide (a
//! namespaced resource would let two namespaces ask for one name), and the
//! NetworkAttachmentDefinitions made from a network live in many namespaces, which may name
//! only a cluster-scoped owner (Kubernetes refuses owner references across namespaces).
//! Specs are kept as JSON and read here, so a malformed one gets a `Ready=False` condition
//! with the reason instead of breaking the watch of all the others.

use crate::manager::ManagerError;
use crate::manager::managed::ManagedBy;
use crate::manager::objects::{Cluster, ClusterSpec, IpGroupRecord, IpGroupSpec};
use crate::network::{Kind, NetworkSpec, Plane, PodPolicer, SubnetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::net::IpAddr;
use std::path::Path;

pub const GROUP: &str = "knitter.io";
pub const VERSION: &str = "v1alpha1";
/// The tenant of a `Network` that names none.
pub const DEFAULT_TENANT: &str = crate::manager::ADMIN;

macro_rules! cluster_resource {
    ($(#[$doc:meta])* $ty:ident, $kind:literal, $plural:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, Serialize, Deserialize)]
        pub struct $ty {
            #[serde(default)]
            pub metadata: ObjectMeta,
            #[serde(default)]
            pub spec: Value,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<Value>,
        }

        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = ClusterResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $ty {
            /// `networks.knitter.io`, `ipgroups.knitter.io` or `clusters.knitter.io`.
            pub const RESOURCE: &'static str = concat!($plural, ".knitter.io");

            pub fn name(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }

            /// This resource as the owner of what it made on the manager.
            pub fn managed_by(&self) -> ManagedBy {
                ManagedBy { resource: Self::RESOURCE.into(), name: self.name().into(), uid: self.metadata.uid.clone().unwrap_or_default() }
            }
        }

        impl Knitters for $ty {
            const RESOURCE: &'static str = concat!($plural, ".knitter.io");
            fn named(&self) -> &str {
                self.name()
            }
            fn status(&self) -> Option<&Value> {
                self.status.as_ref()
            }
        }
    };
}

/// What the controller's writes read of any of Knitter's resources.
pub trait Knitters:
    kube::Resource<DynamicType = (), Scope = ClusterResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    /// `networks.knitter.io`, `ipgroups.knitter.io` or `clusters.knitter.io`.
    const RESOURCE: &'static str;
    fn named(&self) -> &str;
    fn status(&self) -> Option<&Value>;
}

cluster_resource!(
    /// A `Network` (`networks.knitter.io`): one manager network of the same name.
    NetworkResource,
    "Network",
    "networks"
);
cluster_resource!(
    /// An `IPGroup` (`ipgroups.knitter.io`): one IP group of a network, of the same name.
    IpGroupResource,
    "IPGroup",
    "ipgroups"
);

cluster_resource!(
    /// A `Cluster` (`clusters.knitter.io`): one other Kubernetes cluster the manager serves,
    /// of the same name.
    ClusterResource,
    "Cluster",
    "clusters"
);

/// A `Network`'s spec as the CRD defines it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NetworkResourceSpec {
    #[serde(default)]
    tenant: Option<String>,
    kind: Kind,
    #[serde(default)]
    plane: Plane,
    #[serde(default)]
    segment: Option<u32>,
    #[serde(default)]
    ipv4: Option<SubnetSpec>,
    #[serde(default)]
    ipv6: Option<SubnetSpec>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    pod_policer: Option<PodPolicerSpec>,
    #[serde(default)]
    sriov_pool: Option<String>,
    #[serde(default, rename = "podChoosesVF")]
    pod_chooses_vf: bool,
    #[serde(default)]
    node_gateway: bool,
    #[serde(default)]
    masquerade: bool,
    #[serde(default)]
    clusters: Vec<String>,
}

/// A `Network`'s `podPolicer`, as the CRD defines it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodPolicerSpec {
    #[serde(default)]
    pps: u64,
    #[serde(default)]
    bps: u64,
    #[serde(default)]
    burst_packets: u64,
    #[serde(default)]
    burst_bytes: u64,
}

/// An `IPGroup`'s spec as the CRD defines it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IpGroupResourceSpec {
    network: String,
    #[serde(default)]
    members: Vec<IpAddr>,
    #[serde(default)]
    size: Option<u32>,
    #[serde(default)]
    grace_seconds: Option<u64>,
}

/// A `Cluster`'s spec as the CRD defines it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClusterResourceSpec {
    kubeconfig_key: String,
    #[serde(default)]
    release_on_delete: bool,
}

/// Why a resource is not ready: a condition's reason (CamelCase) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub message: String,
}

impl From<&ManagerError> for Refusal {
    fn from(e: &ManagerError) -> Self {
        let code = e.codes().0;
        let reason = code.split('_').map(|w| w[..1].to_uppercase() + &w[1..]).collect();
        Refusal { reason, message: e.to_string() }
    }
}

fn invalid_spec(e: serde_json::Error) -> Refusal {
    Refusal {
        reason: "InvalidSpec".into(),
        message: format!("the spec does not follow the CRD: {e}"),
    }
}

impl NetworkResource {
    /// The manager network this resource asks for.
    pub fn network_spec(&self) -> Result<NetworkSpec, Refusal> {
        let s: NetworkResourceSpec =
            serde_json::from_value(self.spec.clone()).map_err(invalid_spec)?;
        Ok(NetworkSpec {
            name: self.name().into(),
            tenant: s.tenant.unwrap_or_else(|| DEFAULT_TENANT.into()),
            kind: s.kind,
            plane: s.plane,
            segment: s.segment,
            ipv4: s.ipv4,
            ipv6: s.ipv6,
            mtu: s.mtu,
            shared: s.shared,
            pod_policer: s.pod_policer.map(|p| PodPolicer {
                pps: p.pps,
                bps: p.bps,
                burst_packets: p.burst_packets,
                burst_bytes: p.burst_bytes,
            }),
            sriov_pool: s.sriov_pool,
            pod_chooses_vf: s.pod_chooses_vf,
            node_gateway: s.node_gateway,
            masquerade: s.masquerade,
            clusters: s.clusters,
        })
    }
}

impl IpGroupResource {
    /// The manager IP group this resource asks for.
    pub fn group_spec(&self) -> Result<IpGroupSpec, Refusal> {
        let s: IpGroupResourceSpec =
            serde_json::from_value(self.spec.clone()).map_err(invalid_spec)?;
        Ok(IpGroupSpec {
            name: self.name().into(),
            network: s.network,
            members: s.members,
            size: s.size,
            grace_secs: s.grace_seconds,
        })
    }
}

impl ClusterResource {
    /// The manager cluster this resource asks for: its kubeconfig is the file named by
    /// `kubeconfigKey` in `kubeconfigs` (where the manager's pod mounts the
    /// `knitter-clusters` Secret). A key is a Secret's key (letters, digits, `-`, `_`, `.`),
    /// never a path: whoever may write Cluster resources names no other file the manager
    /// can read.
    pub fn cluster_spec(&self, kubeconfigs: &Path) -> Result<ClusterSpec, Refusal> {
        let s: ClusterResourceSpec =
            serde_json::from_value(self.spec.clone()).map_err(invalid_spec)?;
        let key = s.kubeconfig_key;
        let secret_key = !key.is_empty()
            && key.len() <= 253
            && key != "."
            && !key.starts_with("..")
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !secret_key {
            return Err(Refusal {
                reason: "InvalidSpec".into(),
                message: format!(
                    "kubeconfigKey {key:?} is not a Secret key (letters, digits, '-', '_', '.'): name the key of the knitter-clusters Secret that holds the cluster's kubeconfig"
                ),
            });
        }
        Ok(ClusterSpec {
            name: self.name().into(),
            kubeconfig: kubeconfigs.join(key).to_string_lossy().into_owned(),
        })
    }

    /// Whether deleting this resource may release what the cluster holds (its ports, its
    /// nodes' place): the confirmation `knitterctl manager cluster delete --release` asks for.
    pub fn release_on_delete(&self) -> bool {
        serde_json::from_value::<ClusterResourceSpec>(self.spec.clone())
            .is_ok_and(|s| s.release_on_delete)
    }
}

/// A `Ready` condition as Kubernetes wants it (`metav1.Condition`), keeping the transition
/// time of `current` while the status stays what it was.
fn ready(
    current: Option<&Value>,
    generation: Option<i64>,
    outcome: Result<(), &Refusal>,
) -> Condition {
    condition(current, "Ready", generation, outcome, "Created", "made on the manager")
}

/// A condition of type `kind`: True with `reason` and `message`, or False with the refusal's.
fn condition(
    current: Option<&Value>,
    kind: &str,
    generation: Option<i64>,
    outcome: Result<(), &Refusal>,
    reason: &str,
    message: &str,
) -> Condition {
    let (status, reason, message) = match outcome {
        Ok(()) => ("True", reason.to_string(), message.to_string()),
        Err(r) => ("False", r.reason.clone(), r.message.clone()),
    };
    let previous = current
        .and_then(|s| s["conditions"].as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind && c["status"] == status))
        .and_then(|c| serde_json::from_value::<Time>(c["lastTransitionTime"].clone()).ok());
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let at = previous.unwrap_or_else(|| {
        Time(k8s_openapi::jiff::Timestamp::from_second(now).unwrap_or_default())
    });
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason,
        message,
        observed_generation: generation,
        last_transition_time: at,
    }
}

/// The status a `Network` should carry: the segment and MTU the manager decided, the
/// NetworkAttachmentDefinitions made from it (`namespace/name`), and `Ready`.
pub fn network_status(
    r: &NetworkResource,
    outcome: &Result<NetworkSpec, Refusal>,
    attachments: &[String],
) -> Value {
    let generation = r.metadata.generation;
    let cond = ready(r.status.as_ref(), generation, outcome.as_ref().map(|_| ()));
    let mut s = json!({ "observedGeneration": generation, "conditions": [cond], "networkAttachmentDefinitions": attachments });
    if let Ok(n) = outcome {
        s["segment"] = json!(n.segment);
        s["mtu"] = json!(n.mtu);
    }
    s
}

/// The status an `IPGroup` should carry: the members the manager reserved and `Ready`.
pub fn group_status(r: &IpGroupResource, outcome: &Result<IpGroupRecord, Refusal>) -> Value {
    let generation = r.metadata.generation;
    let cond = ready(r.status.as_ref(), generation, outcome.as_ref().map(|_| ()));
    let mut s = json!({ "observedGeneration": generation, "conditions": [cond] });
    if let Ok(g) = outcome {
        s["members"] = json!(g.members);
    }
    s
}

/// The status a `Cluster` should carry: the id the manager gave it, its nodes and their
/// ports, `Ready` (made on the manager) and `ControllerRunning` (the manager's controller
/// for it runs on the replica writing this: its kubeconfig was read and used), why not in
/// `controllerError`. Fields that do not apply are `null`, so a merge patch removes them.
pub fn cluster_status(r: &ClusterResource, outcome: &Result<Cluster, Refusal>) -> Value {
    let generation = r.metadata.generation;
    let current = r.status.as_ref();
    let made = ready(current, generation, outcome.as_ref().map(|_| ()));
    let mut s = json!({ "observedGeneration": generation, "id": null, "nodes": null, "ports": null, "controllerError": null });
    let mut conditions = vec![made];
    if let Ok(c) = outcome {
        s["id"] = json!(c.id);
        s["nodes"] = json!(c.nodes);
        s["ports"] = json!(c.ports);
        s["controllerError"] = json!(c.error);
        let running = match (&c.controller, &c.error) {
            (Some(_), None) => Ok(()),
            (_, error) => Err(Refusal {
                reason: "ControllerNotRunning".into(),
                message: error.clone().unwrap_or_else(|| "its controller is not running".into()),
            }),
        };
        conditions.push(condition(
            current,
            "ControllerRunning",
            generation,
            running.as_ref().map(|_| ()),
            "Running",
            "its controller runs",
        ));
    }
    s["conditions"] = json!(conditions);
    s
}

/// The patch that brings `current` to `want`, if they differ. A `null` in `want` removes
/// the field (a merge patch), and the apiserver keeps no nulls: compared without them.
pub fn status_patch(current: Option<&Value>, want: Value) -> Option<Value> {
    let mut kept = want.clone();
    if let Some(fields) = kept.as_object_mut() {
        fields.retain(|_, v| !v.is_null());
    }
    (current != Some(&kept)).then(|| json!({ "status": want }))
}

#[cfg(test)]
mod test {
    use super::*;

    fn network(spec: Value) -> NetworkResource {
        NetworkResource {
            metadata: ObjectMeta {
                name: Some("media".into()),
                uid: Some("u1".into()),
                generation: Some(2),
                ..Default::default()
            },
            spec,
            status: None,
        }
    }

    #[test]
    fn a_network_resource_reads_as_the_managers_network_or_says_why_not() {
        let r = network(
            json!({"kind": "vxlan", "plane": "media", "segment": 7000, "ipv4": {"cidr": "10.7.0.0/24", "pools": [{"start": "10.7.0.10", "end": "10.7.0.99"}]}}),
        );
        let n = r.network_spec().unwrap();
        assert_eq!(
            (n.name.as_str(), n.tenant.as_str(), n.kind, n.plane, n.segment),
            ("media", "admin", Kind::Vxlan, Plane::Media, Some(7000))
        );
        let e = network(json!({"kind": "gre"})).network_spec().unwrap_err();
        assert_eq!(e.reason, "InvalidSpec");
        assert!(e.message.contains("gre"), "{}", e.message);
        assert_eq!(
            network(json!({"kind": "vlan", "vni": 5})).network_spec().unwrap_err().reason,
            "InvalidSpec",
            "unknown fields are refused"
        );
        let n =
            network(json!({"kind": "vxlan", "podPolicer": {"pps": 20000, "burstBytes": 30000}}))
                .network_spec()
                .unwrap();
        assert_eq!(
            n.pod_policer,
            Some(PodPolicer { pps: 20_000, bps: 0, burst_packets: 0, burst_bytes: 30_000 })
        );
        let n = network(json!({"kind": "vlan", "sriovPool": "fast"})).network_spec().unwrap();
        assert_eq!(n.sriov_pool.as_deref(), Some("fast"));
        let n = network(json!({"kind": "vlan", "nodeGateway": true, "masquerade": true}))
            .network_spec()
            .unwrap();
        assert!(n.node_gateway && n.masquerade);
        let n = network(json!({"kind": "vxlan", "clusters": ["local", "east"]}))
            .network_spec()
            .unwrap();
        assert_eq!(n.clusters, ["local", "east"]);
    }

    #[test]
    fn a_cluster_resource_names_a_key_of_the_secret_never_a_path() {
        let r = |spec: Value| ClusterResource {
            metadata: ObjectMeta { name: Some("east".into()), ..Default::default() },
            spec,
            status: None,
        };
        let dir = Path::new("/etc/knitter/clusters");
        let c = r(json!({"kubeconfigKey": "east.kubeconfig"})).cluster_spec(dir).unwrap();
        for key in ["..data", "..2026_11_29_12_00_00.123"] {
            let e = r(json!({"kubeconfigKey": key})).cluster_spec(dir).unwrap_err();
            assert_eq!(e.reason, "InvalidSpec", "{key}: the Secret volume's own entries");
        }
        assert_eq!(
            (c.name.as_str(), c.kubeconfig.as_str()),
            ("east", "/etc/knitter/clusters/east.kubeconfig")
        );
        for key in ["../../../etc/knitter/tls/key.pem", "/etc/shadow", "..", ".", "", "a/b"] {
            let e = r(json!({"kubeconfigKey": key})).cluster_spec(dir).unwrap_err();
            assert_eq!(e.reason, "InvalidSpec", "{key}");
        }
        assert_eq!(r(json!({})).cluster_spec(dir).unwrap_err().reason, "InvalidSpec");
        assert!(!r(json!({"kubeconfigKey": "east"})).release_on_delete());
        assert!(r(json!({"kubeconfigKey": "east", "releaseOnDelete": true})).release_on_delete());
    }

    #[test]
    fn ready_keeps_its_transition_time_while_it_stays() {
        let r = network(json!({"kind": "vxlan"}));
        let refused = Err(Refusal::from(&ManagerError::Conflict("VNI 7000 is taken".into())));
        let s = network_status(&r, &refused, &[]);
        assert_eq!(
            (s["conditions"][0]["reason"].as_str(), s["conditions"][0]["status"].as_str()),
            (Some("Conflict"), Some("False"))
        );
        let r = NetworkResource { status: Some(s.clone()), ..r };
        assert_eq!(
            status_patch(r.status.as_ref(), network_status(&r, &refused, &[])),
            None,
            "nothing changed: no write"
        );
    }
}

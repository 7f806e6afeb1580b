//! NetworkAttachmentDefinitions made from `Network` resources (Knap's idea): the Knitter CNI
//! configuration Multus needs, in every namespace whose tenant may use the network.
//!
//! Tenants and namespaces (`tenancy.rs`): a namespace belongs to the tenant its
//! `knitter.io/tenant` label names, else to the tenant that lists it, else to `admin` — never
//! to a tenant because of its own name. A network's NAD (named as the network) goes to its
//! tenant's namespaces; a shared network's to every namespace. Each
//! NAD is labelled as Knitter's and owned by its `Network` (a controller owner reference:
//! Kubernetes' garbage collector deletes it with the network); the controller also deletes
//! the ones no longer wanted (a namespace relabelled, a network refused). NADs without
//! Knitter's label are never touched, even under a network's name.

use super::resources::{GROUP, NetworkResource, VERSION};
use crate::network::NetworkSpec;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use serde_json::json;
use std::collections::BTreeMap;

/// The label naming a namespace's tenant.
pub const TENANT_LABEL: &str = "knitter.io/tenant";
/// The label every NAD the controller makes carries (and the selector it lists them by).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "knitter-manager");
/// The field manager of the controller's server-side applies (NADs brought back to what
/// they should be).
pub const FIELD_MANAGER: &str = "knitter-manager";
/// The label naming a NAD's network.
pub const NETWORK_LABEL: &str = "knitter.io/network";
/// The label naming the member cluster a NAD was made for (`member.rs`): each controller
/// keeps only its own, so two that reach one apiserver (a kubeconfig that names the own
/// cluster, or two members' that name one) never delete each other's.
pub const CLUSTER_LABEL: &str = "knitter.io/cluster";

/// NetworkAttachmentDefinitions (`k8s.cni.cncf.io/v1`).
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "k8s.cni.cncf.io".into(),
        version: "v1".into(),
        api_version: "k8s.cni.cncf.io/v1".into(),
        kind: "NetworkAttachmentDefinition".into(),
        plural: "network-attachment-definitions".into(),
    }
}

/// The tenant a namespace's label names, if it has the label.
pub fn labelled_tenant(ns: &Namespace) -> Option<&str> {
    ns.metadata.labels.as_ref().and_then(|l| l.get(TENANT_LABEL)).map(String::as_str)
}

/// The namespaces (of `namespaces`: name → tenant) that get `net`'s NAD.
pub fn namespaces_for<'a>(
    net: &NetworkSpec,
    namespaces: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = &'a str> {
    namespaces
        .iter()
        .filter(move |(_, tenant)| net.shared || **tenant == net.tenant)
        .map(|(ns, _)| ns.as_str())
}

/// The label selector of the NADs `maker` keeps (the own cluster's also lists members' —
/// an apiserver's equality selectors cannot exclude a label — and leaves them alone).
pub fn selector(maker: Maker<'_>) -> String {
    match maker {
        None => format!("{}={}", MANAGED_BY.0, MANAGED_BY.1),
        Some(c) => format!("{}={},{CLUSTER_LABEL}={c}", MANAGED_BY.0, MANAGED_BY.1),
    }
}

/// The CNI configuration a NAD carries: a conflist of the Knitter plugin on `network`, in
/// the versions docs/cni.md installs (1.0.0 for libcni before 1.2, 1.1.0 after), taking the
/// network selection's `ips` and `mac`, and asking Multus for a device-info file (a
/// vhost-user interface's socket then shows in the pod's network-status).
pub fn cni_config(network: &str) -> String {
    json!({
        "cniVersion": "1.0.0",
        "cniVersions": ["1.0.0", "1.1.0"],
        "name": network,
        "plugins": [{ "type": "knitter-cni", "network": network, "capabilities": { "ips": true, "mac": true, "CNIDeviceInfoFile": true } }],
    })
    .to_string()
}

/// Whose NADs a controller keeps: the own cluster's (`None`), or a member's.
pub type Maker<'a> = Option<&'a str>;

/// `net`'s NAD in `namespace`, owned by `owner` (its `Network` resource in this cluster;
/// `None` in a member cluster, where it has none), made by `maker`.
pub fn nad(
    net: &NetworkSpec,
    owner: Option<&NetworkResource>,
    maker: Maker<'_>,
    namespace: &str,
) -> DynamicObject {
    let mut labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (NETWORK_LABEL.to_string(), net.name.clone()),
    ]);
    if let Some(cluster) = maker {
        labels.insert(CLUSTER_LABEL.to_string(), cluster.to_string());
    }
    let owner_ref = owner.map(|owner| OwnerReference {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "Network".into(),
        name: owner.name().into(),
        uid: owner.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    let metadata = ObjectMeta {
        name: Some(net.name.clone()),
        namespace: Some(namespace.into()),
        labels: Some(labels),
        owner_references: owner_ref.map(|o| vec![o]),
        ..Default::default()
    };
    let mut d = DynamicObject::new(&net.name, &api_resource())
        .data(json!({ "spec": { "config": cni_config(&net.name) } }));
    d.metadata = metadata;
    d
}

/// Whether `have` already says what `want` does: its configuration, and Knitter's labels and
/// owner reference among its own (what other clients added beside them is theirs).
pub fn same(have: &DynamicObject, want: &DynamicObject) -> bool {
    let labels = have.metadata.labels.as_ref();
    let owners = have.metadata.owner_references.as_deref().unwrap_or_default();
    have.data["spec"] == want.data["spec"]
        && want
            .metadata
            .labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        && want.metadata.owner_references.iter().flatten().all(|o| owners.contains(o))
}

/// Whether `have` is owned (as controller) by another object than `want` says: its Network
/// was deleted and made again under the same name.
pub fn owner_replaced(have: &DynamicObject, want: &DynamicObject) -> bool {
    let controller = |d: &DynamicObject| {
        d.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone())
    };
    controller(have).is_some_and(|uid| Some(uid) != controller(want))
}

/// A merge patch making `have` what `want` says over the version in view: its controller
/// owner replaced by `want`'s (the other owner references, other clients', kept).
pub fn replacing_patch(have: &DynamicObject, want: &DynamicObject) -> serde_json::Value {
    let others =
        have.metadata.owner_references.iter().flatten().filter(|o| o.controller != Some(true));
    let owners: Vec<&OwnerReference> =
        want.metadata.owner_references.iter().flatten().chain(others).collect();
    json!({
        "metadata": {
            "resourceVersion": have.metadata.resource_version,
            "labels": want.metadata.labels,
            "ownerReferences": owners,
        },
        "spec": want.data["spec"],
    })
}

/// A digest of what `want` says (configuration, labels, owner): a NAD's write is keyed by it.
pub fn digest(want: &DynamicObject) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    want.data["spec"].to_string().hash(&mut h);
    format!("{:?}{:?}", want.metadata.labels, want.metadata.owner_references).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::network::Kind;

    fn ns(name: &str, tenant: Option<&str>) -> Namespace {
        let labels = tenant.map(|t| BTreeMap::from([(TENANT_LABEL.to_string(), t.to_string())]));
        Namespace {
            metadata: ObjectMeta { name: Some(name.into()), labels, ..Default::default() },
            ..Default::default()
        }
    }

    fn net(tenant: &str, shared: bool) -> NetworkSpec {
        NetworkSpec {
            name: "media".into(),
            tenant: tenant.into(),
            kind: Kind::Vxlan,
            plane: Default::default(),
            segment: None,
            ipv4: None,
            ipv6: None,
            mtu: None,
            shared,
            pod_policer: None,
            sriov_pool: None,
            pod_chooses_vf: false,
            node_gateway: false,
            masquerade: false,

            clusters: vec![],
        }
    }

    #[test]
    fn a_network_goes_to_its_tenants_namespaces_and_a_shared_one_everywhere() {
        let tenants = [crate::manager::objects::Tenant {
            name: "blue".into(),
            quota: Default::default(),
            created: 0,
            namespaces: vec!["blue-ops".into()],
        }];
        let all: BTreeMap<String, String> =
            [ns("red", None), ns("red-dev", Some("red")), ns("blue", None), ns("blue-ops", None)]
                .iter()
                .map(|n| {
                    let name = n.metadata.name.clone().unwrap();
                    let tenant =
                        crate::manager::tenancy::tenant_for(&name, labelled_tenant(n), &tenants)
                            .to_string();
                    (name, tenant)
                })
                .collect();
        assert_eq!(
            namespaces_for(&net("red", false), &all).collect::<Vec<_>>(),
            ["red-dev"],
            "a namespace merely named red gets nothing of red's"
        );
        assert_eq!(
            namespaces_for(&net("blue", false), &all).collect::<Vec<_>>(),
            ["blue-ops"],
            "listed on the tenant"
        );
        assert_eq!(
            namespaces_for(&net("admin", false), &all).collect::<Vec<_>>(),
            ["blue", "red"],
            "unclaimed namespaces are admin's"
        );
        assert_eq!(
            namespaces_for(&net("admin", true), &all).collect::<Vec<_>>(),
            ["blue", "blue-ops", "red", "red-dev"]
        );
        assert_eq!(namespaces_for(&net("green", false), &all).count(), 0);
    }

    #[test]
    fn the_nad_carries_the_conflist_its_owner_and_labels() {
        let owner = NetworkResource {
            metadata: ObjectMeta {
                name: Some("media".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let d = nad(&net("red", false), Some(&owner), None, "red");
        assert_eq!(
            (d.metadata.namespace.as_deref(), d.metadata.name.as_deref()),
            (Some("red"), Some("media"))
        );
        let conf: serde_json::Value =
            serde_json::from_str(d.data["spec"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(conf["plugins"][0]["network"], "media");
        let o = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((o.kind.as_str(), o.uid.as_str(), o.controller), ("Network", "u1", Some(true)));
        assert!(same(&d, &d.clone()));
        // What another client added beside Knitter's labels and owner is theirs (server-side
        // apply keeps it); a changed configuration or a label of Knitter's gone is not.
        let mut theirs = d.clone();
        theirs.metadata.labels.get_or_insert_default().insert("team".into(), "media".into());
        assert!(same(&theirs, &d));
        let mut edited = d.clone();
        edited.data["spec"]["config"] = "{}".into();
        assert!(!same(&edited, &d));
        let mut unlabelled = d.clone();
        unlabelled.metadata.labels.get_or_insert_default().remove(NETWORK_LABEL);
        assert!(!same(&unlabelled, &d));
        // The Network made again under its name: another owner, replaced by a merge patch.
        assert!(!owner_replaced(&theirs, &d));
        let made_again = NetworkResource {
            metadata: ObjectMeta { uid: Some("u2".into()), ..owner.metadata.clone() },
            ..Default::default()
        };
        let want = nad(&net("red", false), Some(&made_again), None, "red");
        assert!(owner_replaced(&d, &want) && !same(&d, &want));
        let patch = replacing_patch(&d, &want);
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "u2");
    }
}

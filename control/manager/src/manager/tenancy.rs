//! Who may attach to which network: a pod's namespace belongs to one tenant, and a port on a
//! network of another tenant is refused unless the network is `shared`.
//!
//! The rule (docs/manager.md "Tenants and namespaces"), in order:
//! 1. the tenant the namespace's `knitter.io/tenant` label names (Kubernetes: the manager's
//!    controller writes each labelled namespace's tenant into the store, so every replica
//!    decides alike);
//! 2. the tenant that lists the namespace (`Tenant.namespaces`; one at most: nodes without
//!    Kubernetes, or namespaces nobody labels);
//! 3. `admin`, for a namespace no tenant claims (and for ports without a pod).
//!
//! In a cluster other than the manager's own (`clusters.rs`) the same name is another
//! namespace: the own cluster's labels say nothing there, and a tenant claims it only by
//! listing it as `cluster/namespace` (`east/red`). Rule 2 then applies; rule 1 does not
//! (the controller reads the own cluster's labels only).
//!
//! A namespace's own name says nothing: a namespace merely called `red` is `admin`'s unless
//! labelled or listed for `red`. The check holds for every port with a pod, through every
//! path (the node's attach API for Multus NADs and Knitter's standalone annotations, the
//! manager's REST and gRPC): it is in [`Manager::create_port`].

use super::objects::{PortSpec, Tenant, labelled_namespace_key};
use super::{ADMIN, Manager, ManagerError, ROUNDS, Result, json};
use crate::network::NetworkSpec;
use crate::store::Op;
use std::collections::BTreeMap;

/// The namespace of a port's pod (`namespace/name`), empty when it has none.
pub fn pod_namespace(pod: &str) -> &str {
    pod.split_once('/').map_or("", |(ns, _)| ns)
}

/// The tenant of namespace `ns` given its label's tenant (`labelled`) and the tenants (rule
/// above).
pub fn tenant_for<'a>(ns: &str, labelled: Option<&'a str>, tenants: &'a [Tenant]) -> &'a str {
    labelled
        .or_else(|| {
            tenants.iter().find(|t| t.namespaces.iter().any(|n| n == ns)).map(|t| t.name.as_str())
        })
        .unwrap_or(ADMIN)
}

/// The tenant of namespace `ns` in cluster `cluster` (empty: the manager's own, where
/// [`tenant_for`] decides; in another only a `cluster/namespace` entry claims it).
pub fn tenant_in<'a>(
    cluster: &str,
    ns: &str,
    labelled: Option<&'a str>,
    tenants: &'a [Tenant],
) -> &'a str {
    if cluster.is_empty() {
        return tenant_for(ns, labelled, tenants);
    }
    let qualified = format!("{cluster}/{ns}");
    tenants.iter().find(|t| t.namespaces.contains(&qualified)).map_or(ADMIN, |t| t.name.as_str())
}

/// Checks a tenant's namespace entry: a namespace, or `cluster/namespace` for one of
/// another cluster.
pub(super) fn check_namespace_entry(entry: &str) -> Result<()> {
    match entry.split_once('/') {
        Some((super::objects::LOCAL_CLUSTER, _)) => Err(ManagerError::Invalid(format!(
            "namespace {entry:?}: the manager's own cluster's namespaces are listed by name alone"
        ))),
        Some((cluster, ns)) => {
            super::check_name("cluster", cluster)?;
            super::check_name("namespace", ns)
        }
        None => super::check_name("namespace", entry),
    }
}

/// What a port request chooses for itself, if anything (fixed addresses, an IP group, a MAC).
fn chosen(spec: &PortSpec) -> Option<&'static str> {
    if !spec.ips.is_empty() {
        Some("its addresses")
    } else if spec.ip_group.is_some() {
        Some("an IP group")
    } else if spec.requested_mac.is_some() {
        Some("its MAC")
    } else {
        None
    }
}

impl Manager {
    /// The tenant namespace `ns` of the manager's own cluster belongs to (rule above).
    pub fn tenant_of_namespace(&self, ns: &str) -> Result<String> {
        self.tenant_of_namespace_in("", ns)
    }

    /// The tenant namespace `ns` of cluster `cluster` (empty: the own) belongs to.
    pub fn tenant_of_namespace_in(&self, cluster: &str, ns: &str) -> Result<String> {
        let labelled = if cluster.is_empty() {
            self.store().get(&labelled_namespace_key(ns))?.map(|v| v.value)
        } else {
            None
        };
        let tenants = self.tenants()?;
        Ok(tenant_in(cluster, ns, labelled.as_deref(), &tenants).to_string())
    }

    /// Refuses a port for a pod of namespace `ns` on `net` when the namespace's tenant is not
    /// the network's and the network is not shared; the reason names all three. On another
    /// tenant's shared network a pod takes what the network gives: it may not choose
    /// (`spec`) a fixed address, an IP group or a MAC — those the owner plans.
    pub(super) fn check_attachment(
        &self,
        cluster: &str,
        ns: &str,
        net: &NetworkSpec,
        spec: &PortSpec,
    ) -> Result<()> {
        let tenant = self.tenant_of_namespace_in(cluster, ns)?;
        if tenant == net.tenant {
            return Ok(());
        }
        let who = if ns.is_empty() {
            "a port without a pod namespace belongs to tenant \"admin\"".to_string()
        } else if cluster.is_empty() {
            format!("namespace {ns:?} belongs to tenant {tenant:?}")
        } else {
            format!("namespace {ns:?} of cluster {cluster:?} belongs to tenant {tenant:?}")
        };
        if !net.shared {
            return Err(ManagerError::Forbidden(format!(
                "{who}; network {:?} is tenant {:?}'s and not shared",
                net.name, net.tenant
            )));
        }
        if let Some(what) = chosen(spec) {
            return Err(ManagerError::Forbidden(format!(
                "{who}; network {:?} is tenant {:?}'s, shared with others: their pods take the addresses and MAC it gives and may not choose {what}",
                net.name, net.tenant
            )));
        }
        Ok(())
    }

    /// Records the namespaces labelled `knitter.io/tenant` (name → tenant), as the Kubernetes
    /// controller sees them: labels added or changed are written, ones gone removed. Returns
    /// how many records changed.
    pub fn set_labelled_namespaces(&self, labelled: &BTreeMap<String, String>) -> Result<usize> {
        let have: Vec<(String, String, u64)> = self
            .store()
            .list("namespaces/")?
            .into_iter()
            .map(|(k, v)| (k["namespaces/".len()..].to_string(), v.value, v.version))
            .collect();
        let mut ops = Vec::new();
        for (ns, tenant, version) in &have {
            match labelled.get(ns) {
                Some(t) if t == tenant => {}
                Some(t) => {
                    ops.push(Op::replace(labelled_namespace_key(ns), Some(*version), t.clone()))
                }
                None => ops.push(Op::delete(labelled_namespace_key(ns), *version)),
            }
        }
        for (ns, tenant) in labelled {
            if !have.iter().any(|(n, _, _)| n == ns) {
                ops.push(Op::create(labelled_namespace_key(ns), tenant.clone()));
            }
        }
        let n = ops.len();
        if n > 0 && !self.store().commit(&ops)? {
            return Err(ManagerError::Busy("the labelled namespaces changed meanwhile".into()));
        }
        Ok(n)
    }

    /// Sets the namespaces that belong to tenant `name` without a label; refused when
    /// another tenant lists one of them.
    pub fn set_tenant_namespaces(&self, name: &str, namespaces: Vec<String>) -> Result<Tenant> {
        for ns in &namespaces {
            check_namespace_entry(ns)?;
        }
        let key = super::objects::tenant_key(name);
        for _ in 0..ROUNDS {
            let (mut t, v) = self
                .load::<Tenant>(&key)?
                .ok_or_else(|| ManagerError::NotFound { what: "tenant", name: name.into() })?;
            self.check_unlisted(name, &namespaces)?;
            t.namespaces = namespaces.clone();
            if self.store().commit(&[Op::replace(&key, Some(v), json(&t)?)])? {
                return Ok(t);
            }
        }
        Err(ManagerError::Busy(format!("tenant {name:?} kept changing")))
    }

    /// Refuses namespaces another tenant than `name` lists.
    pub(super) fn check_unlisted(&self, name: &str, namespaces: &[String]) -> Result<()> {
        for t in self.tenants()? {
            if let Some(ns) = t.namespaces.iter().find(|n| t.name != name && namespaces.contains(n))
            {
                return Err(ManagerError::Conflict(format!(
                    "namespace {ns:?} belongs to tenant {:?} already",
                    t.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, namespaces: &[&str]) -> Tenant {
        Tenant {
            name: name.into(),
            quota: Default::default(),
            created: 0,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_label_wins_a_listing_counts_and_a_name_says_nothing() {
        let tenants = [tenant("red", &["red-prod"]), tenant("blue", &[])];
        assert_eq!(tenant_for("red", None, &tenants), "admin", "a namespace merely called red");
        assert_eq!(tenant_for("red-prod", None, &tenants), "red", "listed");
        assert_eq!(tenant_for("red-prod", Some("blue"), &tenants), "blue", "the label wins");
        assert_eq!(tenant_for("", None, &tenants), "admin");
        assert_eq!(
            (pod_namespace("ns/pod"), pod_namespace("pod"), pod_namespace("")),
            ("ns", "", "")
        );
    }

    #[test]
    fn in_another_cluster_only_a_qualified_listing_claims_a_namespace() {
        let tenants = [tenant("red", &["red-prod"]), tenant("blue", &["east/blue-prod"])];
        let in_east = |ns, label| tenant_in("east", ns, label, &tenants);
        assert_eq!(in_east("red-prod", None), "admin", "the own cluster's listing");
        assert_eq!(in_east("red-prod", Some("red")), "admin", "the own cluster's label");
        assert_eq!(in_east("blue-prod", None), "blue", "listed as east/blue-prod");
        assert_eq!(tenant_in("west", "blue-prod", None, &tenants), "admin", "east's, not west's");
        assert_eq!(tenant_in("", "blue-prod", None, &tenants), "admin", "east's, not the own");
        assert_eq!(tenant_in("", "red-prod", None, &tenants), "red");
        assert!(check_namespace_entry("east/blue-prod").is_ok());
        for bad in ["east/", "/blue", "a/b/c", "east/ x", "local/red"] {
            assert!(check_namespace_entry(bad).is_err(), "{bad}");
        }
    }
}

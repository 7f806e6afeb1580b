//! Which manager objects a Kubernetes custom resource owns. A network, IP group or cluster
//! the controller makes from a `Network`, `IPGroup` or `Cluster` resource is written in one commit with a
//! record `managed/<object key>` naming that resource (its UID). The rule that keeps the two
//! views from fighting (docs/kubernetes.md): the resource is the object's only writer — the
//! APIs refuse to delete it, another resource cannot claim it, and the controller deletes it
//! when its resource goes. Objects made over the APIs have no record and never show as
//! resources.

use super::{Manager, ManagerError, Result, json};
use crate::store::Op;
use serde::{Deserialize, Serialize};

/// The resource that made a manager object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ManagedBy {
    /// `networks.knitter.io`, `ipgroups.knitter.io` or `clusters.knitter.io`.
    pub resource: String,
    /// The resource's name (cluster-scoped).
    pub name: String,
    /// The resource's UID: one deleted and re-made under the same name is another owner.
    pub uid: String,
}

/// Where the record of `object_key`'s owner is kept.
pub fn managed_key(object_key: &str) -> String {
    format!("managed/{object_key}")
}

impl ManagedBy {
    /// The op that records this owner for `object_key` (with the object's own create).
    pub fn record(&self, object_key: &str) -> Result<Op> {
        Ok(Op::create(managed_key(object_key), json(self)?))
    }

    fn describe(&self) -> String {
        format!("the Kubernetes resource {} {:?} (uid {})", self.resource, self.name, self.uid)
    }
}

fn describe(by: Option<&ManagedBy>) -> String {
    by.map_or_else(|| "the manager's API".to_string(), ManagedBy::describe)
}

impl Manager {
    /// Every object a resource made: (object key, its owner).
    pub fn managed(&self) -> Result<Vec<(String, ManagedBy)>> {
        let rows = self.store.list("managed/")?;
        rows.into_iter()
            .map(|(k, v)| {
                let by: ManagedBy = serde_json::from_str(&v.value)
                    .map_err(|e| crate::store::StoreError(format!("corrupt record {k}: {e}")))?;
                Ok((k.trim_start_matches("managed/").to_string(), by))
            })
            .collect()
    }

    /// Refuses a create for `by` of an object that exists but was made by someone else (an
    /// API create of a resource's object is answered as before: the same definition is a no-op).
    pub(super) fn check_made_by(
        &self,
        key: &str,
        what: &str,
        name: &str,
        by: Option<&ManagedBy>,
    ) -> Result<()> {
        let Some(by) = by else { return Ok(()) };
        let have = self.load::<ManagedBy>(&managed_key(key))?.map(|(m, _)| m);
        if have.as_ref().is_some_and(|h| h.uid == by.uid) {
            return Ok(());
        }
        Err(ManagerError::Conflict(format!(
            "{what} {name:?} exists, made by {}",
            describe(have.as_ref())
        )))
    }

    /// Forgets that `by` made the object `key`: the APIs may delete it from now on (an
    /// object its resource no longer asks for, left because deleting it needs a
    /// confirmation no one gave). `false` if `by` was not its owner.
    pub fn disown(&self, key: &str, by: &ManagedBy) -> Result<bool> {
        match self.load::<ManagedBy>(&managed_key(key))? {
            Some((h, v)) if h.uid == by.uid => {
                Ok(self.store.commit(&[Op::delete(managed_key(key), v)])?)
            }
            _ => Ok(false),
        }
    }

    /// Refuses a delete of a resource's object by anyone but that resource; the op that
    /// removes the owner record with the object, if it has one.
    pub(super) fn check_deleted_by(
        &self,
        key: &str,
        what: &str,
        name: &str,
        by: Option<&ManagedBy>,
    ) -> Result<Option<Op>> {
        let have = self.load::<ManagedBy>(&managed_key(key))?;
        match (have, by) {
            (None, None) => Ok(None),
            (Some((h, v)), Some(b)) if h.uid == b.uid => Ok(Some(Op::delete(managed_key(key), v))),
            (Some((h, _)), _) => Err(ManagerError::Conflict(format!(
                "{what} {name:?} belongs to {}: delete that resource (kubectl delete {} {})",
                h.describe(),
                h.resource,
                h.name
            ))),
            (None, Some(b)) => Err(ManagerError::Conflict(format!(
                "{what} {name:?} was made by {}, not by {}",
                describe(None),
                b.describe()
            ))),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::manager::{ADMIN, Config, ManagerError};
    use crate::network::{Kind, NetworkSpec, SubnetSpec};

    fn manager() -> (tempfile::TempDir, Manager) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::embedded::Embedded::open(&dir.path().join("s.redb")).unwrap();
        (dir, Manager::new(std::sync::Arc::new(store), Config::default()).unwrap())
    }

    fn net(name: &str, segment: u32) -> NetworkSpec {
        NetworkSpec {
            name: name.into(),
            tenant: ADMIN.into(),
            kind: Kind::Vxlan,
            plane: Default::default(),
            segment: Some(segment),
            ipv4: Some(SubnetSpec { cidr: "10.9.0.0/24".into(), gateway: None, pools: vec![] }),
            ipv6: None,
            mtu: None,
            shared: false,
            pod_policer: None,
            sriov_pool: None,
            pod_chooses_vf: false,
            node_gateway: false,
            masquerade: false,
            clusters: vec![],
        }
    }

    fn by(uid: &str) -> ManagedBy {
        ManagedBy { resource: "networks.knitter.io".into(), name: "media".into(), uid: uid.into() }
    }

    #[test]
    fn a_resources_network_is_written_and_deleted_only_by_that_resource() {
        let (_dir, m) = manager();
        assert!(m.create_network_by(net("media", 7000), Some(&by("u1"))).unwrap().1);
        assert!(
            !m.create_network_by(net("media", 7000), Some(&by("u1"))).unwrap().1,
            "again: a no-op"
        );
        assert_eq!(m.managed().unwrap(), [("networks/media".to_string(), by("u1"))]);
        let e = m.create_network_by(net("media", 7000), Some(&by("u2"))).unwrap_err();
        assert!(matches!(e, ManagerError::Conflict(ref s) if s.contains("uid u1")), "{e}");
        let e = m.delete_network("media").unwrap_err();
        assert!(
            matches!(e, ManagerError::Conflict(ref s) if s.contains("kubectl delete networks.knitter.io media")),
            "{e}"
        );
        assert!(
            m.delete_network_by("media", Some(&by("u2"))).is_err(),
            "a namesake resource cannot delete it"
        );
        assert!(m.delete_network_by("media", Some(&by("u1"))).unwrap().is_some());
        assert!(m.managed().unwrap().is_empty(), "the owner record goes with the network");
        assert!(m.create_network(net("media", 7000)).unwrap().1);
        let e = m.create_network_by(net("media", 7000), Some(&by("u1"))).unwrap_err();
        assert!(
            matches!(e, ManagerError::Conflict(ref s) if s.contains("the manager's API")),
            "{e}"
        );
        assert!(
            m.delete_network_by("media", Some(&by("u1"))).is_err(),
            "a resource cannot delete an API network"
        );
        assert!(m.delete_network("media").unwrap().is_some());
    }
}

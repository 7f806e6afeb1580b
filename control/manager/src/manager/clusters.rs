//! The Kubernetes clusters the manager serves besides its own: added (a name, a random id,
//! the kubeconfig that reaches its apiserver), listed with what each holds, deleted (refused
//! while its nodes hold ports, unless they are released with it). Which cluster a node
//! joins, and a port's pod as (cluster, namespace/name, UID): `objects.rs`. The controller
//! that runs once per cluster: `cluster/fleet.rs`. A cluster a `Cluster` resource made
//! (`clusters.knitter.io`, `cluster/networks.rs`) is that resource's: the APIs do not
//! delete it (`managed.rs`).

use super::managed::ManagedBy;
use super::objects::{
    Cluster, ClusterSpec, LOCAL_CLUSTER, Node, Port, cluster_key, node_key, shown_cluster,
    stored_cluster,
};
use super::{Filter, Manager, ManagerError, Result, check_name, json, now};
use crate::network::Network;
use crate::store::{Cond, Op};

impl Manager {
    /// Adds a cluster; the same request again returns it (`false`).
    pub fn create_cluster(&self, spec: ClusterSpec) -> Result<(Cluster, bool)> {
        self.create_cluster_by(spec, None)
    }

    /// Adds a cluster for `by` (the `Cluster` resource that asks for it) or over the API
    /// (`None`); the same request again returns it (`false`), for a resource only if that
    /// resource made it.
    pub fn create_cluster_by(
        &self,
        spec: ClusterSpec,
        by: Option<&ManagedBy>,
    ) -> Result<(Cluster, bool)> {
        check_name("cluster", &spec.name)?;
        if spec.name == LOCAL_CLUSTER {
            return Err(ManagerError::Invalid(format!(
                "cluster {LOCAL_CLUSTER:?} is the manager's own (knitter-manager --kubernetes): give the other cluster another name"
            )));
        }
        if spec.kubeconfig.trim().is_empty() {
            return Err(ManagerError::Invalid(format!(
                "cluster {:?}: give the kubeconfig file that reaches its apiserver",
                spec.name
            )));
        }
        let key = cluster_key(&spec.name);
        if let Some((have, _)) = self.load::<Cluster>(&key)? {
            self.check_made_by(&key, "cluster", &spec.name, by)?;
            return if have.spec == spec {
                Ok((self.counted(have)?, false))
            } else {
                Err(ManagerError::Conflict(format!(
                    "cluster {:?} exists with kubeconfig {:?}; delete it to change it",
                    spec.name, have.spec.kubeconfig
                )))
            };
        }
        if let Some(other) =
            self.stored_clusters()?.into_iter().find(|c| c.spec.kubeconfig == spec.kubeconfig)
        {
            return Err(ManagerError::Conflict(format!(
                "cluster {:?} reaches its apiserver with kubeconfig {:?} already: one cluster a kubeconfig (two would run two controllers on one cluster)",
                other.spec.name, spec.kubeconfig
            )));
        }
        let c = Cluster {
            spec,
            id: random_id(),
            created: now(),
            own: false,
            nodes: 0,
            ports: 0,
            controller: None,
            error: None,
        };
        let mut ops = vec![Op::create(&key, json(&c)?)];
        ops.extend(by.map(|b| b.record(&key)).transpose()?);
        if self.store.commit(&ops)? {
            Ok((c, true))
        } else {
            // Added meanwhile by another request: the same answer as a retry's.
            let (have, _) = self.load::<Cluster>(&key)?.ok_or_else(|| {
                ManagerError::Busy(format!("cluster {:?} changed meanwhile", c.spec.name))
            })?;
            if have.spec == c.spec && self.check_made_by(&key, "cluster", &c.spec.name, by).is_ok()
            {
                Ok((self.counted(have)?, false))
            } else {
                Err(ManagerError::Conflict(format!(
                    "cluster {:?} was added meanwhile",
                    c.spec.name
                )))
            }
        }
    }

    /// A cluster with what it holds; [`LOCAL_CLUSTER`] is the manager's own.
    pub fn get_cluster(&self, name: &str) -> Result<Cluster> {
        if name == LOCAL_CLUSTER {
            return self.counted(local_cluster());
        }
        let (c, _) = self
            .load::<Cluster>(&cluster_key(name))?
            .ok_or_else(|| ManagerError::NotFound { what: "cluster", name: name.into() })?;
        self.counted(c)
    }

    /// The manager's own cluster first, then the others by name.
    pub fn list_clusters(&self) -> Result<Vec<Cluster>> {
        let (nodes, ports) = (self.list_nodes()?, self.list_ports(&Filter::default())?);
        let mut out = vec![local_cluster()];
        out.extend(self.stored_clusters()?);
        for c in &mut out {
            count(c, &nodes, &ports);
        }
        Ok(out)
    }

    /// The id of added cluster `name`, if there is one.
    pub fn cluster_id(&self, name: &str) -> Result<Option<String>> {
        Ok(self.load::<Cluster>(&cluster_key(name))?.map(|(c, _)| c.id))
    }

    /// The added clusters as stored (without what they hold: no read of every port).
    pub fn stored_clusters(&self) -> Result<Vec<Cluster>> {
        Ok(self.load_all::<Cluster>("clusters/")?.into_iter().map(|(c, _)| c).collect())
    }

    /// Deletes a cluster. While its nodes hold ports it is refused, unless `release`: then
    /// its ports are released (their addresses given back) and its nodes forgotten (they
    /// leave every flood list) first. `None` if there was none.
    pub fn delete_cluster(&self, name: &str, release: bool) -> Result<Option<Cluster>> {
        self.delete_cluster_by(name, release, None)
    }

    /// Deletes a cluster for `by` (the `Cluster` resource that made it) or over the API
    /// (`None`: refused for a resource's cluster), as [`Manager::delete_cluster`] says.
    pub fn delete_cluster_by(
        &self,
        name: &str,
        release: bool,
        by: Option<&ManagedBy>,
    ) -> Result<Option<Cluster>> {
        if name == LOCAL_CLUSTER {
            return Err(ManagerError::Invalid(format!(
                "cluster {LOCAL_CLUSTER:?} is the manager's own: it cannot be deleted"
            )));
        }
        let key = cluster_key(name);
        let Some((c, _)) = self.load::<Cluster>(&key)? else { return Ok(None) };
        self.check_deleted_by(&key, "cluster", name, by)?;
        let c = self.counted(c)?;
        if (c.ports > 0 || c.nodes > 0) && !release {
            let how = match by {
                None => format!(
                    "delete it with release (knitterctl manager cluster delete {name} --release)"
                ),
                Some(_) => format!(
                    "set releaseOnDelete on its resource (kubectl patch clusters.knitter.io {name} --type merge -p '{{\"spec\":{{\"releaseOnDelete\":true}}}}')"
                ),
            };
            return Err(ManagerError::InUse(format!(
                "cluster {name:?} has {} nodes holding {} ports: {how} to release them and forget its nodes",
                c.nodes, c.ports
            )));
        }
        // Twice: a node that registered into the cluster while the first pass ran is
        // released by the second, after the record is gone (no new one can join).
        self.release_cluster(name)?;
        if let Some((_, v)) = self.load::<Cluster>(&key)? {
            let mut ops = vec![Op::delete(&key, v)];
            ops.extend(self.check_deleted_by(&key, "cluster", name, by)?);
            if !self.store.commit(&ops)? {
                return Err(ManagerError::Busy(format!("cluster {name:?} changed meanwhile")));
            }
        }
        self.release_cluster(name)?;
        // Its bootstrap token joins no node any more, nor does a token bound to it.
        self.revoke_cluster_credentials(name)?;
        Ok(Some(c))
    }

    /// Releases the ports of cluster `name` and forgets its nodes.
    fn release_cluster(&self, name: &str) -> Result<()> {
        for p in self.list_ports(&Filter::default())?.iter().filter(|p| p.in_cluster(name)) {
            self.delete_port_record(&p.spec.container, &p.spec.interface)?;
        }
        for n in self.list_nodes()?.iter().filter(|n| n.cluster_name() == name) {
            self.delete_node(&n.name)?;
        }
        Ok(())
    }

    /// Checks a node's cluster as it registers: one that exists, the one it registered in
    /// before (node names are unique across the manager's clusters). Returns the name as
    /// the node keeps it (empty for the own cluster), and for another cluster a check that
    /// its record is still there, for the registration's commit (a cluster deleted
    /// meanwhile fails it: no node joins a cluster being deleted).
    pub(super) fn check_node_cluster(
        &self,
        node: &Node,
        have: Option<&Node>,
    ) -> Result<(String, Option<Op>)> {
        let cluster = stored_cluster(&node.cluster).to_string();
        let still = if cluster.is_empty() {
            None
        } else {
            let key = cluster_key(&cluster);
            let Some((_, v)) = self.load::<Cluster>(&key)? else {
                return Err(ManagerError::NotFound { what: "cluster", name: cluster });
            };
            Some(Op::check(key, Cond::Version(v)))
        };
        if let Some(have) = have
            && have.cluster != cluster
        {
            return Err(ManagerError::Conflict(format!(
                "node {:?} is registered in cluster {:?}: node names are unique across the manager's clusters (delete the node first to move it, or give this one another name)",
                node.name,
                have.cluster_name()
            )));
        }
        Ok((cluster, still))
    }

    /// The cluster a port on `node` is created in (its node's), if `net` reaches that
    /// cluster. A port without a node is the own cluster's; so is one on a node not
    /// registered while the manager serves no other cluster. Once it does, a node must
    /// have registered (saying its cluster) before ports are made on it: an unknown node
    /// may be another cluster's, and its pods would be judged as the own cluster's.
    pub(super) fn port_cluster(&self, net: &Network, node: &str) -> Result<String> {
        let cluster = if node.is_empty() {
            String::new()
        } else {
            match self.load::<Node>(&node_key(node))? {
                Some((n, _)) => n.cluster,
                None if self.store.list("clusters/")?.is_empty() => String::new(),
                None => {
                    return Err(ManagerError::Forbidden(format!(
                        "node {node:?} is not registered: the manager serves several clusters, and a node's pods attach once it has registered in its own (knitter-vswitchd registers when its VTEP is set)"
                    )));
                }
            }
        };
        let name = shown_cluster(&cluster);
        if !net.spec.clusters.is_empty() && !net.spec.clusters.iter().any(|c| c == name) {
            let whose = if node.is_empty() {
                "a port without a node is the manager's own cluster's (\"local\")".to_string()
            } else {
                format!("node {node:?} is in cluster {name:?}")
            };
            return Err(ManagerError::Forbidden(format!(
                "network {:?} spans clusters {:?}; {whose}",
                net.spec.name, net.spec.clusters
            )));
        }
        Ok(cluster)
    }

    fn counted(&self, mut c: Cluster) -> Result<Cluster> {
        count(&mut c, &self.list_nodes()?, &self.list_ports(&Filter::default())?);
        Ok(c)
    }
}

/// The manager's own cluster as listed (it is not stored).
fn local_cluster() -> Cluster {
    Cluster {
        spec: ClusterSpec { name: LOCAL_CLUSTER.into(), kubeconfig: String::new() },
        id: String::new(),
        created: 0,
        own: true,
        nodes: 0,
        ports: 0,
        controller: None,
        error: None,
    }
}

fn count(c: &mut Cluster, nodes: &[Node], ports: &[Port]) {
    let name = c.spec.name.as_str();
    c.nodes = nodes.iter().filter(|n| n.cluster_name() == name).count() as u64;
    c.ports = ports.iter().filter(|p| p.in_cluster(name)).count() as u64;
}

/// A random UUID (version 4) from the OS's generator.
fn random_id() -> String {
    use std::hash::BuildHasher;
    // RandomState is seeded from the OS; two of them and the time make 128 bits that do
    // not repeat across managers (an id, not a secret).
    let t = now();
    let (a, b) = (
        std::hash::RandomState::new().hash_one(t),
        std::hash::RandomState::new().hash_one(t.wrapping_add(1)),
    );
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

//! Who calls the manager, and what each caller may do; nodes' own credentials.
//!
//! Callers ([`Caller`]), by the bearer token they present:
//! - **the admin** (the manager's token, `--token-file`): everything;
//! - **a node** (a token the manager issued to that node name, [`Manager::issue_node_token`]):
//!   its own node record and sync stream, ports on itself (created for its pods, which the
//!   tenancy check applies to, and deleted), reads of nodes and of its own ports — nothing
//!   else: no tenant, network or IP group change, no other node's port or name;
//! - **the bootstrap token** (`--bootstrap-token-file`, kubeadm's idea): one thing only,
//!   joining — a node token for a name that has none yet (a name that joined before gets a
//!   new token from the admin only, so a compromised node cannot take over another's);
//! - **a cluster's bootstrap token** (`knitterctl manager cluster token NAME`, for the nodes
//!   of a cluster the manager serves besides its own): joining too, and the node token it
//!   gives binds the node to that cluster — it registers in no other. A node that joined
//!   with the manager's own bootstrap token is bound to the own cluster. (Tokens the admin
//!   issues, and credentials from before clusters, bind nothing.)
//! - **the metrics token** (`--metrics-token-file`, for Prometheus): `GET /metrics` and
//!   nothing else;
//! - **nobody** (no token): `GET /v1/health` and the gRPC `Health`; with `--loopback-reads`,
//!   reads from the manager's own host too.
//!
//! Node tokens are `node.<hex of the node name>.<64 hex digits>`, a cluster's bootstrap token
//! `cluster.<hex of its name>.<64 hex digits>`; the store keeps only the secret part's
//! SHA-256 (`node_credentials/<name>`, `cluster_credentials/<name>`), compared in constant
//! time. Issuing a
//! node a new token revokes its old one; deleting the node forgets it.

use super::objects::{Node, Port, PortSpec};
use super::{Manager, ManagerError, Result, json, now};
use crate::store::Op;
use serde::{Deserialize, Serialize};

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Node(String),
    Bootstrap,
    /// A cluster's bootstrap token (the cluster's name): joins its nodes.
    ClusterBootstrap(String),
    /// The metrics token: scrapes `/metrics`.
    Scraper,
    /// No token (or none of the above on a read that allows it).
    Nobody,
}

/// What an operation needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The admin only (every change of tenants, networks, IP groups; node deletion).
    Admin,
    /// The admin (and nobody from loopback with `--loopback-reads`).
    Read,
    /// The admin or a node (the operation checks which node); reads also nobody from loopback.
    Node,
    /// The admin or the bootstrap token (joining).
    Join,
    /// Anyone (health).
    Open,
    /// The admin or the metrics token (and nobody from loopback with `--loopback-reads`).
    Metrics,
}

/// The manager's credentials and read policy.
#[derive(Debug, Clone)]
pub struct Auth {
    admin: std::sync::Arc<str>,
    bootstrap: Option<std::sync::Arc<str>>,
    scraper: Option<std::sync::Arc<str>>,
    loopback_reads: bool,
}

/// A node's credential as the store keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Credential {
    /// SHA-256 of the token's secret part, hex.
    sha256: String,
    /// Unix seconds.
    issued: u64,
    /// `admin` or `bootstrap`.
    by: String,
    /// The cluster the node is bound to (joined with its bootstrap token; `""`: the
    /// manager's own); absent: none (issued by the admin, or before clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster: Option<String>,
}

pub(super) fn cluster_credential_key(cluster: &str) -> String {
    format!("cluster_credentials/{cluster}")
}

pub(super) fn credential_key(node: &str) -> String {
    format!("node_credentials/{node}")
}

fn sha256_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The node a token names and its secret part, if it is a node token.
fn parse_node_token(token: &str) -> Option<(String, &str)> {
    parse_token("node", token)
}

/// The name a `KIND.<hex name>.<64 hex digits>` token names and its secret part.
fn parse_token<'t>(want: &str, token: &'t str) -> Option<(String, &'t str)> {
    let mut parts = token.splitn(3, '.');
    let (kind, name, secret) = (parts.next()?, parts.next()?, parts.next()?);
    if kind != want || name.len() % 2 != 0 || secret.len() != 64 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..name.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(name.get(i..i + 2)?, 16).ok())
        .collect();
    Some((String::from_utf8(bytes?).ok()?, secret))
}

impl Auth {
    pub fn new(
        admin: impl Into<std::sync::Arc<str>>,
        bootstrap: Option<String>,
        loopback_reads: bool,
    ) -> Auth {
        Auth {
            admin: admin.into(),
            bootstrap: bootstrap.map(Into::into),
            scraper: None,
            loopback_reads,
        }
    }

    /// Lets `token` read `/metrics` (and nothing else).
    pub fn with_metrics_token(mut self, token: impl Into<std::sync::Arc<str>>) -> Auth {
        self.scraper = Some(token.into());
        self
    }

    /// The admin token alone (tests; a manager without a bootstrap token).
    pub fn admin(token: impl Into<std::sync::Arc<str>>) -> Auth {
        Auth::new(token, None, false)
    }

    /// Whether reads from loopback need no token.
    pub fn loopback_reads(&self) -> bool {
        self.loopback_reads
    }

    /// Who presents `bearer` (node tokens are looked up in the store: call off the runtime).
    pub fn identify(&self, m: &Manager, bearer: Option<&str>) -> Result<Caller> {
        let Some(t) = bearer.map(str::trim) else { return Ok(Caller::Nobody) };
        if super::rest::same_bytes(t.as_bytes(), self.admin.as_bytes()) {
            return Ok(Caller::Admin);
        }
        if self
            .bootstrap
            .as_ref()
            .is_some_and(|b| super::rest::same_bytes(t.as_bytes(), b.as_bytes()))
        {
            return Ok(Caller::Bootstrap);
        }
        if self
            .scraper
            .as_ref()
            .is_some_and(|s| super::rest::same_bytes(t.as_bytes(), s.as_bytes()))
        {
            return Ok(Caller::Scraper);
        }
        if let Some((cluster, secret)) = parse_token("cluster", t)
            && let Some(v) = m.store().get(&cluster_credential_key(&cluster))?
            && super::rest::same_bytes(sha256_hex(secret.as_bytes()).as_bytes(), v.value.as_bytes())
        {
            return Ok(Caller::ClusterBootstrap(cluster));
        }
        if let Some((node, secret)) = parse_node_token(t)
            && let Some((c, _)) = m.load::<Credential>(&credential_key(&node))?
            && super::rest::same_bytes(
                sha256_hex(secret.as_bytes()).as_bytes(),
                c.sha256.as_bytes(),
            )
        {
            return Ok(Caller::Node(node));
        }
        Err(ManagerError::Unauthenticated("the bearer token is not one this manager knows (the admin's, the bootstrap token, or a node's it issued)".into()))
    }

    /// Refuses `caller` for an operation needing `access` (`loopback`: the request came from
    /// the manager's own host; `read`: it changes nothing).
    pub fn check(&self, caller: &Caller, access: Access, loopback: bool, read: bool) -> Result<()> {
        let ok = match (access, caller) {
            (Access::Open, _) | (_, Caller::Admin) => true,
            (Access::Node, Caller::Node(_))
            | (Access::Join, Caller::Bootstrap | Caller::ClusterBootstrap(_))
            | (Access::Metrics, Caller::Scraper) => true,
            (Access::Read | Access::Node | Access::Metrics, Caller::Nobody) => {
                read && loopback && self.loopback_reads
            }
            _ => false,
        };
        if ok {
            return Ok(());
        }
        Err(match caller {
            Caller::Nobody => ManagerError::Unauthenticated(
                (if read { "reads need a bearer token (Authorization: Bearer <token>)" } else { "changes need a bearer token (Authorization: Bearer <token>; see the manager's token file)" }).into(),
            ),
            Caller::Node(n) => ManagerError::Forbidden(format!("node {n:?}'s credential may not do this (the admin's may)")),
            Caller::Bootstrap | Caller::ClusterBootstrap(_) => ManagerError::Forbidden("a bootstrap token may only join a node (knitter-vswitchd --manager-bootstrap-token-file)".into()),
            Caller::Scraper => ManagerError::Forbidden("the metrics token may only read /metrics".into()),
            Caller::Admin => unreachable!("the admin may do anything"),
        })
    }
}

impl Manager {
    /// Issues node `node` a new token (revoking its old one). The bootstrap token may only
    /// issue one to a name that has none.
    pub fn issue_node_token(&self, node: &str, caller: &Caller) -> Result<String> {
        super::check_name("node", node)?;
        let key = credential_key(node);
        let have = self.store().get(&key)?;
        let joining = matches!(caller, Caller::Bootstrap | Caller::ClusterBootstrap(_));
        if have.is_some() && joining {
            return Err(ManagerError::Conflict(format!(
                "node {node:?} joined already; the admin issues it a new token (knitterctl manager node token {node})"
            )));
        }
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| ManagerError::Busy("no random bytes".into()))?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let by = if joining { "bootstrap" } else { "admin" };
        let cluster = match caller {
            Caller::Bootstrap => Some(String::new()),
            Caller::ClusterBootstrap(c) => Some(c.clone()),
            // The admin's new token keeps the node's binding (the recovery for a node that
            // lost its credential must not free it from its cluster).
            _ => match &have {
                Some(v) => {
                    serde_json::from_str::<Credential>(&v.value).ok().and_then(|c| c.cluster)
                }
                None => None,
            },
        };
        // A name a node of another cluster holds is not a joining node's to take.
        if let Some(bound) = cluster.as_deref().filter(|_| joining)
            && let Some((n, _)) = self.load::<Node>(&super::objects::node_key(node))?
            && n.cluster != bound
        {
            return Err(ManagerError::Forbidden(format!(
                "node {node:?} is registered in cluster {:?}: a bootstrap token of another may not join it",
                n.cluster_name()
            )));
        }
        let c = json(&Credential {
            sha256: sha256_hex(secret.as_bytes()),
            issued: now(),
            by: by.into(),
            cluster,
        })?;
        let op = match &have {
            Some(v) => Op::replace(&key, Some(v.version), c),
            None => Op::create(&key, c),
        };
        if !self.store().commit(&[op])? {
            return Err(ManagerError::Busy(format!(
                "node {node:?}'s credential changed meanwhile"
            )));
        }
        tracing::info!(node, by, "issued a node token");
        let name: String = node.bytes().map(|b| format!("{b:02x}")).collect();
        Ok(format!("node.{name}.{secret}"))
    }

    /// Revokes what joins or holds cluster `cluster`: its bootstrap token, and the node
    /// tokens bound to it (of nodes that joined and never registered, or were forgotten):
    /// a cluster added again under the name is another, whose nodes join anew.
    pub(super) fn revoke_cluster_credentials(&self, cluster: &str) -> Result<()> {
        let mut ops = Vec::new();
        if let Some(v) = self.store().get(&cluster_credential_key(cluster))? {
            ops.push(Op::delete(cluster_credential_key(cluster), v.version));
        }
        for (k, v) in self.store().list("node_credentials/")? {
            let bound = serde_json::from_str::<Credential>(&v.value).ok().and_then(|c| c.cluster);
            if bound.as_deref() == Some(cluster) {
                ops.push(Op::delete(k, v.version));
            }
        }
        if !ops.is_empty() && !self.store().commit(&ops)? {
            return Err(ManagerError::Busy(format!(
                "cluster {cluster:?}'s credentials changed meanwhile"
            )));
        }
        Ok(())
    }

    /// Forgets node `node`'s credential (its token stops working); whether it had one.
    pub fn revoke_node_token(&self, node: &str) -> Result<bool> {
        let key = credential_key(node);
        let Some(v) = self.store().get(&key)? else { return Ok(false) };
        Ok(self.store().commit(&[Op::delete(&key, v.version)])?)
    }

    /// Creates a port for `caller`: a node creates ports on itself only (its name filled in
    /// when the request leaves it out), each checked against tenancy even without a pod.
    pub fn create_port_as(&self, caller: &Caller, mut spec: PortSpec) -> Result<(Port, bool)> {
        if let Caller::Node(n) = caller {
            if spec.node.is_empty() {
                spec.node = n.clone();
            }
            if spec.node != *n {
                return Err(ManagerError::Forbidden(format!(
                    "node {n:?} may not create a port on node {:?}",
                    spec.node
                )));
            }
            if spec.pod.is_empty() {
                let (net, _) = self.network(&spec.network)?;
                self.check_attachment("", "", &net.spec, &spec)?;
            }
        }
        self.create_port(spec)
    }

    /// Deletes a port for `caller`: a node, only one on itself.
    pub fn delete_port_as(
        &self,
        caller: &Caller,
        container: &str,
        interface: &str,
    ) -> Result<Option<Port>> {
        if let Caller::Node(n) = caller
            && let Ok(p) = self.get_port(container, interface)
            && p.spec.node != *n
        {
            return Err(ManagerError::Forbidden(format!(
                "node {n:?} may not delete a port of node {:?}",
                p.spec.node
            )));
        }
        self.delete_port(container, interface)
    }

    /// Reads a port for `caller`: a node, only one on itself.
    pub fn get_port_as(&self, caller: &Caller, container: &str, interface: &str) -> Result<Port> {
        let p = self.get_port(container, interface)?;
        match caller {
            Caller::Node(n) if p.spec.node != *n => Err(ManagerError::Forbidden(format!(
                "node {n:?} may not read a port of node {:?}",
                p.spec.node
            ))),
            _ => Ok(p),
        }
    }

    /// Lists ports for `caller`: a node sees its own only.
    pub fn list_ports_as(&self, caller: &Caller, f: &super::Filter) -> Result<Vec<Port>> {
        match caller {
            Caller::Node(n) => {
                Ok(self.list_ports(f)?.into_iter().filter(|p| p.spec.node == *n).collect())
            }
            _ => self.list_ports(f),
        }
    }

    /// Registers a node for `caller`: a node, only itself.
    pub fn register_node_as(&self, caller: &Caller, node: Node) -> Result<Node> {
        if let Caller::Node(n) = caller {
            if node.name != *n {
                return Err(ManagerError::Forbidden(format!(
                    "node {n:?} may not register as {:?}",
                    node.name
                )));
            }
            let bound = self.load::<Credential>(&credential_key(n))?.and_then(|(c, _)| c.cluster);
            let asked = super::objects::stored_cluster(&node.cluster);
            if let Some(b) = bound
                && b != asked
            {
                use super::objects::shown_cluster;
                return Err(ManagerError::Forbidden(format!(
                    "node {n:?} joined with cluster {:?}'s bootstrap token and registers in it only, not in {:?} (a member cluster's nodes join with its own: knitterctl manager cluster token NAME)",
                    shown_cluster(&b),
                    shown_cluster(asked)
                )));
            }
        }
        self.register_node(node)
    }

    /// Issues cluster `cluster` a new bootstrap token (revoking its old one): its nodes join
    /// with it and are bound to it.
    pub fn issue_cluster_token(&self, cluster: &str) -> Result<String> {
        let record = super::objects::cluster_key(cluster);
        let Some((_, version)) = self.load::<super::objects::Cluster>(&record)? else {
            return Err(ManagerError::NotFound { what: "cluster", name: cluster.into() });
        };
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| ManagerError::Busy("no random bytes".into()))?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let key = cluster_credential_key(cluster);
        let op = match self.store().get(&key)? {
            Some(v) => Op::replace(&key, Some(v.version), sha256_hex(secret.as_bytes())),
            None => Op::create(&key, sha256_hex(secret.as_bytes())),
        };
        // Only while the cluster is there: a token must not outlive a delete running now.
        let there = Op::check(record, crate::store::Cond::Version(version));
        if !self.store().commit(&[op, there])? {
            return Err(ManagerError::Busy(format!(
                "cluster {cluster:?}'s token changed meanwhile"
            )));
        }
        tracing::info!(cluster, "issued a cluster bootstrap token");
        let name: String = cluster.bytes().map(|b| format!("{b:02x}")).collect();
        Ok(format!("cluster.{name}.{secret}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_tokens_name_their_node() {
        let name: String = "n1.example".bytes().map(|b| format!("{b:02x}")).collect();
        let t = format!("node.{name}.{}", "ab".repeat(32));
        assert_eq!(
            parse_node_token(&t).map(|(n, s)| (n, s.len())),
            Some(("n1.example".to_string(), 64))
        );
        for bad in ["node.zz.x", "admin-token", "node.6e31", "node.6e3.".to_string().as_str()] {
            assert!(parse_node_token(bad).is_none(), "{bad}");
        }
    }
}

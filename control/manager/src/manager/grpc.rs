//! The manager's gRPC API (`knitter.manager.v1`): the same operations as the REST API over
//! the same [`Manager`]. The proto messages carry the REST JSON field for field, so a
//! request is converted by serde (JSON in between, absent optionals dropped) and a refused
//! conversion is INVALID_ARGUMENT with serde's reason. Who may call what: `auth.rs`, as for
//! REST.

use super::auth::{Access, Auth, Caller};
use super::objects::{IpGroupSpec, Node, PortSpec, Quota, TenantSpec};
use super::sync::{ClusterView, Desired};
use super::{Filter, Manager, ManagerError};
use crate::network::NetworkSpec;
use knitter_api::manager as pb;
use knitter_api::manager::manager_server::ManagerServer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

impl From<ManagerError> for Status {
    fn from(e: ManagerError) -> Status {
        Status::new(e.codes().2, e.to_string())
    }
}

/// `v` without its null fields (an absent proto optional is an absent JSON field, so the
/// REST defaults apply).
fn drop_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, drop_nulls(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(drop_nulls).collect()),
        v => v,
    }
}

/// A message as another type with the same JSON shape.
pub fn convert<A: Serialize, B: DeserializeOwned>(a: &A) -> Result<B, ManagerError> {
    let v = serde_json::to_value(a).map_err(|e| ManagerError::Invalid(e.to_string()))?;
    serde_json::from_value(drop_nulls(v))
        .map_err(|e| ManagerError::Invalid(format!("request: {e}")))
}

#[derive(Clone)]
pub struct Grpc {
    manager: Arc<Manager>,
    auth: Arc<Auth>,
    /// The Kubernetes controller's state, when this manager runs one.
    cluster: Option<Arc<super::cluster::Status>>,
    /// The controllers of the added clusters.
    fleet: Option<Arc<super::cluster::fleet::Fleet>>,
    /// The latest cluster view, for every sync stream.
    views: watch::Receiver<Option<Arc<ClusterView>>>,
    /// Where open sync streams are counted.
    metrics: Arc<super::metrics::Metrics>,
}

/// How long the view task waits for a change before looking again (and how long it waits
/// after the store failed).
const VIEW_WAIT: Duration = Duration::from_secs(1);

impl Grpc {
    /// The service, and the task that keeps the cluster view current (call from within a
    /// runtime).
    pub fn new(manager: Arc<Manager>, token: Arc<str>) -> Grpc {
        Self::with_auth(manager, Auth::admin(token))
    }

    /// The service with the manager's credentials and read policy (`auth.rs`).
    pub fn with_auth(manager: Arc<Manager>, auth: Auth) -> Grpc {
        let auth = Arc::new(auth);
        let (tx, views) = watch::channel(None);
        let m = manager.clone();
        tokio::spawn(async move {
            let mut seen = None;
            while !tx.is_closed() {
                let m2 = m.clone();
                let read = tokio::task::spawn_blocking(
                    move || -> Result<Option<ClusterView>, ManagerError> {
                        let rev = match seen {
                            Some(s) => m2.store().wait_change(s, VIEW_WAIT)?,
                            None => m2.store().revision()?,
                        };
                        if Some(rev) == seen { Ok(None) } else { m2.cluster_view().map(Some) }
                    },
                )
                .await;
                match read {
                    Ok(Ok(Some(view))) => {
                        seen = Some(view.revision);
                        let _ = tx.send(Some(Arc::new(view)));
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "cluster view not refreshed; nodes keep their last desired state");
                        tokio::time::sleep(VIEW_WAIT).await;
                    }
                    Err(e) => tracing::error!(error = %e, "cluster view task failed"),
                }
            }
        });
        Grpc { manager, auth, views, cluster: None, fleet: None, metrics: Arc::default() }
    }

    /// Counts its sync streams in `metrics` (the REST API's `/metrics` shows them).
    pub fn with_metrics(mut self, metrics: Arc<super::metrics::Metrics>) -> Grpc {
        self.metrics = metrics;
        self
    }

    /// Serves the Kubernetes controller's state too.
    pub fn with_cluster(mut self, status: Arc<super::cluster::Status>) -> Grpc {
        self.cluster = Some(status);
        self
    }

    /// Reports the added clusters' controllers, and starts or stops them as clusters are
    /// added or deleted.
    pub fn with_fleet(mut self, fleet: Arc<super::cluster::fleet::Fleet>) -> Grpc {
        self.fleet = Some(fleet);
        self
    }

    pub fn server(self) -> ManagerServer<Grpc> {
        ManagerServer::new(self)
    }

    /// Who sent `req`, allowed `access` (`write`: it changes something).
    async fn caller<T>(
        &self,
        req: &Request<T>,
        access: Access,
        write: bool,
    ) -> Result<Caller, Status> {
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(knitter_api::process::bearer_token)
            .map(str::to_string);
        let loopback = req.remote_addr().is_some_and(|a| a.ip().is_loopback());
        let (m, auth) = (self.manager.clone(), self.auth.clone());
        let caller = tokio::task::spawn_blocking(move || auth.identify(&m, given.as_deref()))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        self.auth.check(&caller, access, loopback, !write)?;
        Ok(caller)
    }

    /// Checks the caller, converts the request to `In`, runs `f` on a blocking thread and
    /// converts what it returns to the reply message. `Access::Admin`, `Access::Join` and
    /// `Access::Node` calls change something; the others read.
    async fn call<Req, In, Reply>(
        &self,
        req: Request<Req>,
        access: Access,
        f: impl FnOnce(&Manager, &Caller, In) -> Result<Value, ManagerError> + Send + 'static,
    ) -> Result<Response<Reply>, Status>
    where
        Req: Serialize,
        In: DeserializeOwned + Send + 'static,
        Reply: DeserializeOwned,
    {
        self.call_as(req, access, !matches!(access, Access::Read | Access::Open), f).await
    }

    /// [`Grpc::call`] saying whether the call writes.
    async fn call_as<Req, In, Reply>(
        &self,
        req: Request<Req>,
        access: Access,
        write: bool,
        f: impl FnOnce(&Manager, &Caller, In) -> Result<Value, ManagerError> + Send + 'static,
    ) -> Result<Response<Reply>, Status>
    where
        Req: Serialize,
        In: DeserializeOwned + Send + 'static,
        Reply: DeserializeOwned,
    {
        let caller = self.caller(&req, access, write).await?;
        let input: In = convert(req.get_ref())?;
        let m = self.manager.clone();
        let out = tokio::task::spawn_blocking(move || f(&m, &caller, input))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(
            serde_json::from_value(out).map_err(|e| Status::internal(format!("reply: {e}")))?,
        ))
    }
}

fn value<T: Serialize>(v: T) -> Result<Value, ManagerError> {
    serde_json::to_value(v).map_err(|e| ManagerError::Invalid(e.to_string()))
}

fn created<T: Serialize>(field: &str, (v, new): (T, bool)) -> Result<Value, ManagerError> {
    Ok(json!({ field: value(v)?, "created": new }))
}

fn items<T: Serialize>(v: Vec<T>) -> Result<Value, ManagerError> {
    Ok(json!({ "items": value(v)? }))
}

/// A delete's reply: what was deleted, or NOT_FOUND.
fn deleted<T: Serialize>(
    what: &'static str,
    name: String,
    v: Option<T>,
) -> Result<Value, ManagerError> {
    value(v.ok_or(ManagerError::NotFound { what, name })?)
}

fn filter(r: &pb::ListRequest) -> Result<Filter, ManagerError> {
    let kind = if r.kind.is_empty() { None } else { Some(convert(&r.kind)?) };
    Ok(Filter {
        tenant: r.tenant.clone(),
        network: r.network.clone(),
        node: r.node.clone(),
        pod: r.pod.clone(),
        kind,
    })
}

/// Feeds one node's sync stream until it closes: its desired state whenever it changes
/// (the view changed, or a peer's lease or grace ran out), and its heartbeats.
async fn stream_desired(
    m: Arc<Manager>,
    mut views: watch::Receiver<Option<Arc<ClusterView>>>,
    node: String,
    tx: mpsc::Sender<Result<pb::DesiredState, Status>>,
) {
    let (live, marks) = (m.liveness(), m.plane_markings());
    let mut beat = tokio::time::interval(live.heartbeat_every());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last: Option<Desired> = None;
    loop {
        // No view yet (a manager just started): send nothing rather than an empty state,
        // which would make the node drop what it runs.
        let view = views.borrow_and_update().clone();
        if let Some(view) = view {
            let d = view.desired_for(&node, super::now(), &live, &marks);
            if last.as_ref().is_none_or(|l| (&l.networks, &l.peers) != (&d.networks, &d.peers)) {
                let msg = convert::<_, pb::DesiredState>(&d).map_err(Status::from);
                if tx.send(msg).await.is_err() {
                    break;
                }
                last = Some(d);
            }
        }
        tokio::select! {
            _ = tx.closed() => break,
            _ = beat.tick() => {
                let (m, n) = (m.clone(), node.clone());
                match tokio::task::spawn_blocking(move || m.heartbeat(&n)).await {
                    Ok(Err(e)) => tracing::warn!(node = %node, error = %e, "heartbeat not recorded"),
                    Err(e) => tracing::warn!(node = %node, error = %e, "heartbeat failed"),
                    Ok(Ok(())) => {}
                }
            }
            changed = views.changed() => if changed.is_err() { break },
            _ = tick.tick() => {}
        }
    }
    tracing::info!(node = %node, "node sync stream closed");
}

type SyncStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::DesiredState, Status>> + Send>>;

#[tonic::async_trait]
impl pb::manager_server::Manager for Grpc {
    async fn create_tenant(
        &self,
        r: Request<pb::TenantSpec>,
    ) -> Result<Response<pb::TenantReply>, Status> {
        self.call(r, Access::Admin, |m, _, t: TenantSpec| {
            created("tenant", m.create_tenant_with(t)?)
        })
        .await
    }

    async fn get_tenant(&self, r: Request<pb::Name>) -> Result<Response<pb::Tenant>, Status> {
        self.call(r, Access::Read, |m, _, n: pb::Name| value(m.tenant(&n.name)?)).await
    }

    async fn list_tenants(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::TenantList>, Status> {
        self.call(r, Access::Read, |m, _, _: pb::ListRequest| items(m.tenants()?)).await
    }

    async fn delete_tenant(&self, r: Request<pb::Name>) -> Result<Response<pb::Tenant>, Status> {
        self.call(r, Access::Admin, |m, _, n: pb::Name| {
            deleted("tenant", n.name.clone(), m.delete_tenant(&n.name)?)
        })
        .await
    }

    async fn set_namespaces(
        &self,
        r: Request<pb::SetNamespacesRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        self.call(r, Access::Admin, |m, _, q: pb::SetNamespacesRequest| {
            value(m.set_tenant_namespaces(&q.name, q.namespaces)?)
        })
        .await
    }

    async fn set_quota(
        &self,
        r: Request<pb::SetQuotaRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        self.call(r, Access::Admin, |m, _, q: pb::SetQuotaRequest| {
            value(m.set_quota(&q.name, convert::<_, Quota>(&q.quota.unwrap_or_default())?)?)
        })
        .await
    }

    async fn create_network(
        &self,
        r: Request<pb::Network>,
    ) -> Result<Response<pb::NetworkReply>, Status> {
        self.call(r, Access::Admin, |m, _, spec: NetworkSpec| {
            created("network", m.create_network(spec)?)
        })
        .await
    }

    async fn get_network(&self, r: Request<pb::Name>) -> Result<Response<pb::Network>, Status> {
        self.call(r, Access::Read, |m, _, n: pb::Name| value(m.get_network(&n.name)?)).await
    }

    async fn list_networks(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::NetworkList>, Status> {
        self.call(r, Access::Read, |m, _, l: pb::ListRequest| items(m.list_networks(&filter(&l)?)?))
            .await
    }

    async fn delete_network(&self, r: Request<pb::Name>) -> Result<Response<pb::Network>, Status> {
        self.call(r, Access::Admin, |m, _, n: pb::Name| {
            deleted("network", n.name.clone(), m.delete_network(&n.name)?)
        })
        .await
    }

    async fn create_ip_group(
        &self,
        r: Request<pb::IpGroupSpec>,
    ) -> Result<Response<pb::IpGroupReply>, Status> {
        self.call(r, Access::Admin, |m, _, g: IpGroupSpec| created("group", m.create_group(g)?))
            .await
    }

    async fn get_ip_group(
        &self,
        r: Request<pb::GroupName>,
    ) -> Result<Response<pb::IpGroup>, Status> {
        self.call(r, Access::Read, |m, _, g: pb::GroupName| {
            value(m.get_group(&g.network, &g.name)?)
        })
        .await
    }

    async fn list_ip_groups(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::IpGroupList>, Status> {
        self.call(r, Access::Read, |m, _, l: pb::ListRequest| items(m.list_groups(&l.network)?))
            .await
    }

    async fn delete_ip_group(
        &self,
        r: Request<pb::GroupName>,
    ) -> Result<Response<pb::IpGroup>, Status> {
        self.call(r, Access::Admin, |m, _, g: pb::GroupName| {
            deleted(
                "IP group",
                format!("{}/{}", g.network, g.name),
                m.delete_group(&g.network, &g.name)?,
            )
        })
        .await
    }

    async fn create_port(
        &self,
        r: Request<pb::PortSpec>,
    ) -> Result<Response<pb::PortReply>, Status> {
        self.call(r, Access::Node, |m, c, p: PortSpec| created("port", m.create_port_as(c, p)?))
            .await
    }

    async fn get_port(&self, r: Request<pb::PortName>) -> Result<Response<pb::Port>, Status> {
        self.call(r, Access::Node, |m, c, p: pb::PortName| {
            value(m.get_port_as(c, &p.container, &p.interface)?)
        })
        .await
    }

    async fn list_ports(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::PortList>, Status> {
        self.call_as(r, Access::Node, false, |m, c, l: pb::ListRequest| {
            items(m.list_ports_as(c, &filter(&l)?)?)
        })
        .await
    }

    async fn delete_port(&self, r: Request<pb::PortName>) -> Result<Response<pb::Port>, Status> {
        self.call(r, Access::Node, |m, c, p: pb::PortName| {
            deleted(
                "port",
                format!("{}/{}", p.container, p.interface),
                m.delete_port_as(c, &p.container, &p.interface)?,
            )
        })
        .await
    }

    async fn register_node(&self, r: Request<pb::Node>) -> Result<Response<pb::Node>, Status> {
        self.call(r, Access::Node, |m, c, n: Node| value(m.register_node_as(c, n)?)).await
    }

    async fn get_node(&self, r: Request<pb::Name>) -> Result<Response<pb::Node>, Status> {
        self.call_as(r, Access::Node, false, |m, _, n: pb::Name| value(m.get_node(&n.name)?)).await
    }

    async fn list_nodes(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::NodeList>, Status> {
        self.call_as(r, Access::Node, false, |m, _, _: pb::ListRequest| items(m.list_nodes()?))
            .await
    }

    async fn delete_node(&self, r: Request<pb::Name>) -> Result<Response<pb::Node>, Status> {
        self.call(r, Access::Admin, |m, _, n: pb::Name| {
            deleted("node", n.name.clone(), m.delete_node(&n.name)?)
        })
        .await
    }

    async fn join_node(&self, r: Request<pb::Name>) -> Result<Response<pb::NodeToken>, Status> {
        self.call(r, Access::Join, |m, c, n: pb::Name| {
            Ok(json!({ "node": n.name, "token": m.issue_node_token(&n.name, c)? }))
        })
        .await
    }

    async fn health(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::HealthReply>, Status> {
        self.call(r, Access::Open, |m, _, _: pb::ListRequest| {
            Ok(json!({ "status": "serving", "revision": m.store().revision()? }))
        })
        .await
    }

    async fn get_kubernetes_status(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::KubernetesStatus>, Status> {
        self.caller(&r, Access::Read, false).await?;
        let status = self.cluster.as_ref().ok_or_else(|| {
            Status::not_found("knitter-manager runs without --kubernetes: no Kubernetes controller")
        })?;
        Ok(Response::new(convert(&status.report())?))
    }

    async fn create_cluster(
        &self,
        r: Request<pb::ClusterSpec>,
    ) -> Result<Response<pb::ClusterReply>, Status> {
        let reply = self
            .call(r, Access::Admin, |m, _, spec: super::objects::ClusterSpec| {
                created("cluster", m.create_cluster(spec)?)
            })
            .await;
        if let Some(f) = &self.fleet {
            f.changed();
        }
        reply
    }

    async fn get_cluster(&self, r: Request<pb::Name>) -> Result<Response<pb::Cluster>, Status> {
        let fleet = self.fleet.clone();
        self.call(r, Access::Read, move |m, _, n: pb::Name| {
            let mut c = m.get_cluster(&n.name)?;
            if let Some(f) = &fleet {
                f.annotate(&mut c);
            }
            value(c)
        })
        .await
    }

    async fn list_clusters(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ClusterList>, Status> {
        let fleet = self.fleet.clone();
        self.call(r, Access::Read, move |m, _, _: pb::ListRequest| {
            let mut all = m.list_clusters()?;
            if let Some(f) = &fleet {
                all.iter_mut().for_each(|c| f.annotate(c));
            }
            items(all)
        })
        .await
    }

    async fn delete_cluster(
        &self,
        r: Request<pb::DeleteClusterRequest>,
    ) -> Result<Response<pb::Cluster>, Status> {
        #[derive(serde::Deserialize)]
        struct Delete {
            name: String,
            #[serde(default)]
            release: bool,
        }
        let reply = self
            .call(r, Access::Admin, |m, _, d: Delete| {
                deleted("cluster", d.name.clone(), m.delete_cluster(&d.name, d.release)?)
            })
            .await;
        if let Some(f) = &self.fleet {
            f.changed();
        }
        reply
    }

    async fn issue_cluster_token(
        &self,
        r: Request<pb::Name>,
    ) -> Result<Response<pb::ClusterToken>, Status> {
        self.call(r, Access::Admin, |m, _, n: pb::Name| {
            Ok(json!({ "cluster": n.name, "token": m.issue_cluster_token(&n.name)? }))
        })
        .await
    }

    type SyncStream = SyncStream;

    async fn sync(&self, r: Request<pb::SyncRequest>) -> Result<Response<SyncStream>, Status> {
        let caller = self.caller(&r, Access::Node, true).await?;
        let req = r.into_inner();
        let node: Node = convert(&req.node.unwrap_or_default())?;
        if let Caller::Node(n) = &caller
            && *n != node.name
        {
            return Err(ManagerError::Forbidden(format!(
                "node {n:?} may not sync as {:?}",
                node.name
            ))
            .into());
        }
        let name = node.name.clone();
        let m = self.manager.clone();
        let registered = {
            let n = name.clone();
            tokio::task::spawn_blocking(move || {
                // As a registration: a node bound to a cluster registers in it only.
                let node = m.register_node_as(&caller, node)?;
                m.heartbeat(&n)?;
                Ok::<_, ManagerError>(node)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))??
        };
        tracing::info!(node = %name, vtep = %registered.vtep, last_revision = req.revision, "node sync stream opened");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let open = self.metrics.stream_opened();
        let desired = stream_desired(self.manager.clone(), self.views.clone(), name, tx);
        tokio::spawn(async move {
            desired.await;
            drop(open);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::objects::{IpGroupRecord, Port, PortIp, Tenant};
    use crate::network::{Kind, Plane, SubnetSpec};

    /// A Rust object through its proto message and back is unchanged: the two APIs carry
    /// the same objects.
    fn round_trip<
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
        P: Serialize + DeserializeOwned,
    >(
        v: T,
    ) {
        let p: P = convert(&v).unwrap();
        let back: T = convert(&p).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn proto_messages_carry_the_rest_objects() {
        let ip = |s: &str| s.parse().unwrap();
        let net = NetworkSpec {
            name: "red".into(),
            tenant: "t".into(),
            kind: Kind::Vlan,
            plane: Plane::Eio,
            segment: Some(7),
            ipv4: Some(SubnetSpec {
                cidr: "10.0.0.0/24".into(),
                gateway: Some(ip("10.0.0.1")),
                pools: vec![crate::ipam::Pool { start: ip("10.0.0.10"), end: ip("10.0.0.20") }],
            }),
            ipv6: None,
            mtu: Some(1400),
            shared: true,
            pod_policer: Some(crate::network::PodPolicer {
                pps: 100_000,
                bps: 0,
                burst_packets: 0,
                burst_bytes: 9000,
            }),
            sriov_pool: Some("fast".into()),
            pod_chooses_vf: true,
            node_gateway: true,
            masquerade: true,
            clusters: vec!["local".into(), "east".into()],
        };
        round_trip::<_, pb::Network>(net);
        round_trip::<_, pb::ClusterSpec>(crate::manager::objects::ClusterSpec {
            name: "east".into(),
            kubeconfig: "/etc/knitter/clusters/east".into(),
        });
        let spec = PortSpec {
            network: "red".into(),
            container: "c".into(),
            interface: "eth1".into(),
            pod: "ns/p".into(),
            node: "n".into(),
            ips: vec![ip("10.0.0.5")],
            ip_group: Some("g".into()),
            requested_mac: Some("02:00:00:00:72:50".into()),
            pod_uid: "1f0e2d3c-uid".into(),
            device_info: Some(r#"{"type":"vhost-user"}"#.into()),
        };
        round_trip::<_, pb::PortSpec>(spec.clone());
        let port = Port {
            spec,
            tenant: "t".into(),
            kind: Kind::Vxlan,
            plane: Plane::Media,
            segment: 5000,
            mtu: 1450,
            addresses: vec![PortIp { address: ip("10.0.0.5"), prefix: 24, gateway: None }],
            mac: "0a:58:0a:00:00:05".into(),
            created: 1,
            policer: Some(crate::network::PodPolicer {
                pps: 0,
                bps: 1_000_000_000,
                burst_packets: 64,
                burst_bytes: 0,
            }),
            sriov_pool: Some("fast".into()),
            pod_chooses_vf: true,
            cluster: "east".into(),
        };
        round_trip::<_, pb::Port>(port);
        round_trip::<_, pb::Tenant>(Tenant {
            name: "t".into(),
            quota: Quota { networks: 3 },
            created: 2,
            namespaces: vec!["t-prod".into()],
        });
        round_trip::<_, pb::IpGroup>(IpGroupRecord {
            name: "g".into(),
            network: "red".into(),
            members: vec![ip("10.0.0.9")],
            grace_secs: 30,
        });
        round_trip::<_, pb::IpGroupSpec>(IpGroupSpec {
            name: "g".into(),
            network: "red".into(),
            members: vec![],
            size: Some(2),
            grace_secs: None,
        });
        let node = Node {
            name: "n".into(),
            vtep: ip("192.0.2.1"),
            underlay_mtu: 9000,
            capabilities: vec!["af-xdp".into()],
            registered: 3,
            last_seen: 4,
            state: "alive".into(),
            cluster: "east".into(),
        };
        round_trip::<_, pb::Node>(node);
        // Defaults apply to what a gRPC client leaves out.
        let n: Node =
            convert(&pb::Node { name: "n".into(), vtep: "192.0.2.1".into(), ..Default::default() })
                .unwrap();
        assert_eq!(n.underlay_mtu, 1500);
        let g: IpGroupSpec = convert(&pb::IpGroupSpec {
            name: "g".into(),
            network: "red".into(),
            size: Some(1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(g.grace(), 300);
        let bad: Result<NetworkSpec, _> =
            convert(&pb::Network { name: "x".into(), kind: "geneve".into(), ..Default::default() });
        assert!(bad.unwrap_err().to_string().contains("unknown variant `geneve`"));
    }
}

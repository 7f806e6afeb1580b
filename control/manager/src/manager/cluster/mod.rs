//! The manager's Kubernetes controller (`knitter-manager --kubernetes`): watches the
//! cluster's pods and nodes and gives back what the gone ones held — a deleted pod's ports
//! (IP-group members keep their grace period, as on CNI DEL), a deleted node's ports and its
//! place in the flood lists. After a restart or a watch gap (410 Gone) the watchers list
//! again and the controller reconciles both ways ([`reconcile`]: never a port a live pod may
//! hold, nothing newer than the list). Several managers elect one leader over a Lease
//! ([`lease`]); only the leader acts, the others serve their APIs and wait.

pub mod events;
pub mod fleet;
pub mod lease;
pub mod member;
pub mod nad;
pub mod networks;
pub mod reconcile;
pub mod resources;
pub mod retries;

use crate::manager::{Filter, Manager};
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use lease::{Elector, LeaseOptions};
use reconcile::{Cluster, PodRef};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::watch;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster it watches, by name ([`LOCAL_CLUSTER`]: the manager's own): it acts on
    /// that cluster's nodes and their ports only.
    ///
    /// [`LOCAL_CLUSTER`]: crate::manager::objects::LOCAL_CLUSTER
    pub cluster: String,
    /// An added cluster's id: the controller acts only while the stored cluster of its name
    /// has this id (one deleted and added again under the name is another cluster, whose
    /// own controller takes over). Empty for the own cluster.
    pub cluster_id: String,
    pub lease: LeaseOptions,
    /// Release the ports and flood-list place of nodes the cluster no longer has.
    pub release_nodes: bool,
    /// Keep each pod's `network-status` annotation current (standalone mode: where Multus
    /// runs, it writes that annotation itself and this stays off).
    pub network_status: bool,
    /// Make `Network`, `IPGroup` and `Cluster` resources on the manager, and the networks'
    /// NetworkAttachmentDefinitions ([`networks`]).
    pub network_resources: bool,
    /// Where a `Cluster` resource's `kubeconfigKey` is a file: the `knitter-clusters`
    /// Secret mounted into the manager's pod.
    pub kubeconfigs: std::path::PathBuf,
}

/// Where the manager's pod mounts the `knitter-clusters` Secret (deploy/kubernetes overlays).
pub const KUBECONFIGS: &str = "/etc/knitter/clusters";

/// What the controller has done, for the API and metrics.
#[derive(Debug, Default)]
pub struct Status {
    /// This manager's identity in the Lease.
    pub identity: String,
    pub leader: AtomicBool,
    /// Complete lists of pods or nodes taken (the first ones and every one after a watch gap).
    pub relists: AtomicU64,
    pub released_ports: AtomicU64,
    pub released_nodes: AtomicU64,
    /// Ports the last complete list would have released but did not vouch for (no pod listed
    /// on their node): held until a list does.
    pub held_ports: AtomicU64,
    /// How long the last reconcile after a list took.
    pub last_reconcile_micros: AtomicU64,
    pub pods: AtomicU64,
    pub nodes: AtomicU64,
    /// Watch errors seen (the watchers retry with a backoff).
    pub watch_errors: AtomicU64,
    /// Pods' network-status annotations written.
    pub status_patches: AtomicU64,
    /// `Network` resources in view, and how many are made on the manager.
    pub network_resources: AtomicU64,
    pub network_resources_ready: AtomicU64,
    /// Knitter's NetworkAttachmentDefinitions in place, and how many were written.
    pub attachment_definitions: AtomicU64,
    pub attachment_definition_writes: AtomicU64,
    /// Writes to the apiserver that failed and wait to be tried again (each object backs off
    /// on its own: `retries.rs`).
    pub writes_backing_off: AtomicU64,
    /// Kubernetes Events published, and those that were not (refused, timed out, or
    /// dropped from a full queue).
    pub events: AtomicU64,
    pub events_failed: AtomicU64,
}

/// [`Status`] read at once (the API's and knitterctl's view; metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusReport {
    /// This manager's identity in the Lease.
    pub identity: String,
    pub leader: bool,
    pub relists: u64,
    pub released_ports: u64,
    pub released_nodes: u64,
    #[serde(default)]
    pub held_ports: u64,
    pub last_reconcile_micros: u64,
    pub pods: u64,
    pub nodes: u64,
    pub watch_errors: u64,
    pub status_patches: u64,
    pub network_resources: u64,
    pub network_resources_ready: u64,
    pub attachment_definitions: u64,
    pub attachment_definition_writes: u64,
    #[serde(default)]
    pub events: u64,
    #[serde(default)]
    pub events_failed: u64,
    #[serde(default)]
    pub writes_backing_off: u64,
}

impl Status {
    pub fn report(&self) -> StatusReport {
        StatusReport {
            identity: self.identity.clone(),
            leader: self.leader.load(Relaxed),
            relists: self.relists.load(Relaxed),
            released_ports: self.released_ports.load(Relaxed),
            released_nodes: self.released_nodes.load(Relaxed),
            held_ports: self.held_ports.load(Relaxed),
            last_reconcile_micros: self.last_reconcile_micros.load(Relaxed),
            pods: self.pods.load(Relaxed),
            nodes: self.nodes.load(Relaxed),
            watch_errors: self.watch_errors.load(Relaxed),
            status_patches: self.status_patches.load(Relaxed),
            network_resources: self.network_resources.load(Relaxed),
            network_resources_ready: self.network_resources_ready.load(Relaxed),
            attachment_definitions: self.attachment_definitions.load(Relaxed),
            attachment_definition_writes: self.attachment_definition_writes.load(Relaxed),
            events: self.events.load(Relaxed),
            events_failed: self.events_failed.load(Relaxed),
            writes_backing_off: self.writes_backing_off.load(Relaxed),
        }
    }
}

impl StatusReport {
    /// The report as Prometheus metrics (text exposition format).
    pub fn metrics(&self) -> String {
        let rows: [(&str, &str, &str, f64); 17] = [
            (
                "knitter_manager_kubernetes_leader",
                "gauge",
                "1 while this manager leads (holds the Lease)",
                f64::from(u8::from(self.leader)),
            ),
            (
                "knitter_manager_kubernetes_relists_total",
                "counter",
                "complete lists of pods or nodes taken (start, and every watch gap)",
                self.relists as f64,
            ),
            (
                "knitter_manager_kubernetes_released_ports_total",
                "counter",
                "ports released because their pod or node went",
                self.released_ports as f64,
            ),
            (
                "knitter_manager_kubernetes_released_nodes_total",
                "counter",
                "nodes forgotten because the cluster deleted them",
                self.released_nodes as f64,
            ),
            (
                "knitter_manager_kubernetes_held_ports",
                "gauge",
                "ports of pods the last list did not show, held because it showed no pod on their node either",
                self.held_ports as f64,
            ),
            (
                "knitter_manager_kubernetes_watch_errors_total",
                "counter",
                "watch errors (the watchers retry with a backoff)",
                self.watch_errors as f64,
            ),
            (
                "knitter_manager_kubernetes_pods",
                "gauge",
                "pods in the controller's view",
                self.pods as f64,
            ),
            (
                "knitter_manager_kubernetes_nodes",
                "gauge",
                "nodes in the controller's view",
                self.nodes as f64,
            ),
            (
                "knitter_manager_kubernetes_last_reconcile_seconds",
                "gauge",
                "how long the last reconcile after a list took",
                self.last_reconcile_micros as f64 / 1e6,
            ),
            (
                "knitter_manager_kubernetes_network_status_patches_total",
                "counter",
                "pods' network-status annotations written",
                self.status_patches as f64,
            ),
            (
                "knitter_manager_kubernetes_network_resources",
                "gauge",
                "Network resources in view",
                self.network_resources as f64,
            ),
            (
                "knitter_manager_kubernetes_network_resources_ready",
                "gauge",
                "Network resources made on the manager (Ready)",
                self.network_resources_ready as f64,
            ),
            (
                "knitter_manager_kubernetes_attachment_definitions",
                "gauge",
                "Knitter's NetworkAttachmentDefinitions in place",
                self.attachment_definitions as f64,
            ),
            (
                "knitter_manager_kubernetes_attachment_definition_writes_total",
                "counter",
                "NetworkAttachmentDefinitions created, replaced or deleted",
                self.attachment_definition_writes as f64,
            ),
            (
                "knitter_manager_kubernetes_events_total",
                "counter",
                "Kubernetes Events published",
                self.events as f64,
            ),
            (
                "knitter_manager_kubernetes_events_failed_total",
                "counter",
                "Kubernetes Events not published (refused, timed out, or dropped from a full queue)",
                self.events_failed as f64,
            ),
            (
                "knitter_manager_kubernetes_writes_backing_off",
                "gauge",
                "Writes to the apiserver that failed, waiting to be tried again (each object on its own backoff)",
                self.writes_backing_off as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in rows {
            knitter_api::metrics::family(&mut out, name, kind, help, "", [(String::new(), v)]);
        }
        out
    }
}

pub struct Controller {
    manager: Arc<Manager>,
    client: Client,
    opts: Options,
    status: Arc<Status>,
    /// Made when the controller runs (its publishing task needs the runtime).
    events: std::sync::OnceLock<events::Events>,
    /// The added clusters' controllers: told when a `Cluster` resource adds or deletes one,
    /// and asked for their state (the own cluster's controller only).
    fleet: Option<Arc<fleet::Fleet>>,
}

/// A list in progress: its objects so far, and when it started (Unix seconds).
struct Relist<T> {
    items: Vec<T>,
    started: u64,
}

impl Controller {
    pub fn new(manager: Arc<Manager>, client: Client, opts: Options) -> Controller {
        let status =
            Arc::new(Status { identity: opts.lease.identity.clone(), ..Default::default() });
        Controller {
            manager,
            client,
            opts,
            status,
            events: std::sync::OnceLock::new(),
            fleet: None,
        }
    }

    /// Lets the `Cluster` resources start and stop the added clusters' controllers at once
    /// (without it they do within the fleet's rescan) and show their state.
    pub fn with_fleet(mut self, fleet: Arc<fleet::Fleet>) -> Controller {
        self.fleet = Some(fleet);
        self
    }

    pub fn status(&self) -> Arc<Status> {
        self.status.clone()
    }

    /// Runs until `stop` is set: the election, and the watchers while this manager leads
    /// (both in this one future: whatever ends it ends both).
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let (leader_tx, leader) = watch::channel(false);
        let _ = self.events.set(events::Events::start(
            self.client.clone(),
            &self.opts.lease.identity,
            self.status.clone(),
        ));
        let elector = Elector::new(self.client.clone(), self.opts.lease.clone());
        let (elector, ()) =
            tokio::join!(elector.run(leader_tx, stop.clone()), self.serve(leader, stop));
        // Nothing acts any more: the next manager may take over at once.
        elector.release().await;
    }

    /// Leads whenever elected, until `stop` is set or the election ends.
    async fn serve(&self, mut leader: watch::Receiver<bool>, stop: watch::Receiver<bool>) {
        let mut stopping = stop.clone();
        loop {
            tokio::select! {
                led = until(&mut leader, true) => if !led { break },
                _ = until(&mut stopping, true) => break,
            }
            tracing::info!(identity = %self.opts.lease.identity, "leading: watching pods and nodes");
            self.status.leader.store(true, Relaxed);
            // Leadership lost ends the lead at once, with whatever call it was waiting on:
            // the next leader may start acting soon after.
            let mut lost = leader.clone();
            tokio::select! {
                () = self.lead(leader.clone(), stop.clone()) => {}
                _ = until(&mut lost, false) => {}
            }
            self.status.leader.store(false, Relaxed);
            if stop_set(&stop) {
                break;
            }
            tracing::info!(identity = %self.opts.lease.identity, "no longer leading");
        }
    }

    /// Acts on the cluster until leadership is lost or `stop` is set: pods and nodes, and
    /// with `network_resources` the `Network` and `IPGroup` resources.
    /// A member cluster's controller (an added cluster's: it has an id) keeps the cluster's
    /// NADs ([`member`]) beside.
    async fn lead(&self, leader: watch::Receiver<bool>, stop: watch::Receiver<bool>) {
        let pods = self.lead_pods(leader.clone(), stop.clone());
        let member = !self.opts.cluster_id.is_empty();
        if !self.opts.network_resources && !member {
            return pods.await;
        }
        let (mut leader, mut stop) = (leader, stop);
        let end = Box::pin(async move {
            tokio::select! {
                _ = until(&mut leader, false) => {}
                _ = until(&mut stop, true) => {}
            }
        });
        if member {
            tokio::join!(pods, self.serve_member_nads(end));
        } else {
            tokio::join!(pods, self.serve_resources(end));
        }
    }

    /// Watches pods and nodes and acts on them until leadership is lost or `stop` is set.
    async fn lead_pods(&self, mut leader: watch::Receiver<bool>, mut stop: watch::Receiver<bool>) {
        let config = watcher::Config::default();
        let mut pods =
            watcher(Api::<Pod>::all(self.client.clone()), config.clone()).default_backoff().boxed();
        let mut nodes =
            watcher(Api::<KubeNode>::all(self.client.clone()), config).default_backoff().boxed();
        let mut cluster = Cluster::default();
        let (mut pod_list, mut node_list) = (None, None);
        let mut published = None;
        let mut tick = tokio::time::interval(STATUS_EVERY);
        let mut recheck = tokio::time::interval(HELD_RECHECK);
        loop {
            tokio::select! {
                // Ports held because the list showed no pod on their node: the view the
                // watch has kept current since may vouch for it now.
                _ = recheck.tick(), if pod_list.is_none() && self.status.held_ports.load(Relaxed) > 0 => {
                    let cutoff = cluster.listed_at;
                    self.reconcile_orphans(&cluster, cutoff).await;
                }
                _ = tick.tick(), if self.opts.network_status && pod_list.is_none() => {
                    self.publish_network_status(&mut cluster, &mut published).await;
                }
                e = pods.next() => match e {
                    Some(Ok(e)) => {
                        let mut deleted = Vec::new();
                        self.on_pod(e, &mut cluster, &mut pod_list, &mut deleted).await;
                        // Events already waiting join the batch (a namespace deleted sends
                        // hundreds of pod deletions at once), so the deleted pods' ports are
                        // found with one read of the store instead of one each.
                        let mut ended = false;
                        while deleted.len() < DELETIONS_BATCHED {
                            match pods.next().now_or_never() {
                                Some(Some(Ok(e))) => self.on_pod(e, &mut cluster, &mut pod_list, &mut deleted).await,
                                Some(Some(Err(e))) => {
                                    self.watch_error("pods", e);
                                    break;
                                }
                                Some(None) => {
                                    ended = true;
                                    break;
                                }
                                None => break,
                            }
                        }
                        self.release_deleted(deleted).await;
                        if ended {
                            break;
                        }
                    }
                    Some(Err(e)) => self.watch_error("pods", e),
                    None => break,
                },
                e = nodes.next() => match e {
                    Some(Ok(e)) => self.on_node(e, &mut cluster, &mut node_list).await,
                    Some(Err(e)) => self.watch_error("nodes", e),
                    None => break,
                },
                _ = until(&mut leader, false) => break,
                _ = until(&mut stop, true) => break,
            }
            self.status.pods.store(cluster.pod_count() as u64, Relaxed);
            self.status.nodes.store(cluster.node_count() as u64, Relaxed);
        }
    }

    /// Writes the `network-status` of every pod whose ports changed (or whose annotation
    /// says something else) since `published` (the store revision and pods' generation of
    /// the last pass).
    async fn publish_network_status(
        &self,
        cluster: &mut Cluster,
        published: &mut Option<(u64, u64)>,
    ) {
        let revision = match self.blocking(|m| Ok(m.store().revision()?)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the store's revision for the pods' network-status");
                return;
            }
        };
        if *published == Some((revision, cluster.generation())) {
            return;
        }
        // A change after the revision was read is seen at the next pass (the revision moved).
        let scope = self.scope();
        let ports = match self.blocking(move |m| scope.ports(m, &Filter::default())).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "reading ports for the pods' network-status");
                return;
            }
        };
        let by_pod = reconcile::ports_by_pod(&ports);
        let mut due = Vec::new();
        for (uid, pod) in cluster.pods() {
            let mine = reconcile::ports_of(&by_pod, uid, &pod.name);
            if mine.is_empty() {
                continue;
            }
            let want = reconcile::network_status(&mine);
            if pod.network_status.as_deref() != Some(want.as_str()) {
                due.push((uid.clone(), pod.name.clone(), want));
            }
        }
        let mut failed = false;
        for (uid, name, want) in due {
            let Some((ns, pod)) = name.split_once('/') else { continue };
            let patch = serde_json::json!({ "metadata": { "annotations": { reconcile::NETWORK_STATUS: want } } });
            let api = Api::<Pod>::namespaced(self.client.clone(), ns);
            match bounded(api.patch(
                pod,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            ))
            .await
            {
                Ok(_) => {
                    self.status.status_patches.fetch_add(1, Relaxed);
                    cluster.set_network_status(&uid, want);
                }
                // Gone meanwhile: its delete event follows.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    failed = true;
                    tracing::warn!(pod = %name, error = %e, "writing the pod's network-status (retried)");
                }
            }
        }
        if !failed {
            *published = Some((revision, cluster.generation()));
        }
    }

    fn watch_error(&self, what: &str, e: watcher::Error) {
        self.status.watch_errors.fetch_add(1, Relaxed);
        tracing::warn!(watch = what, error = %e, "watch failed; retrying");
    }

    /// Handles one pod event; a deleted pod joins `deleted` (UID, name, whether another pod
    /// has the name now) for [`Controller::release_deleted`].
    async fn on_pod(
        &self,
        e: watcher::Event<Pod>,
        cluster: &mut Cluster,
        list: &mut Option<Relist<(String, PodRef)>>,
        deleted: &mut Vec<(String, String, bool)>,
    ) {
        match e {
            watcher::Event::Init => {
                *list = Some(Relist { items: Vec::new(), started: crate::manager::now() })
            }
            watcher::Event::InitApply(p) => {
                if let (Some(l), Some(p)) = (list.as_mut(), pod_ref(&p)) {
                    l.items.push(p);
                }
            }
            watcher::Event::InitDone => {
                let Some(l) = list.take() else { return };
                self.status.relists.fetch_add(1, Relaxed);
                cluster.set_pods(l.items);
                cluster.listed_at = l.started;
                let t = Instant::now();
                let released = self.reconcile_orphans(cluster, l.started).await;
                self.status.last_reconcile_micros.store(t.elapsed().as_micros() as u64, Relaxed);
                tracing::info!(
                    pods = cluster.pod_count(),
                    released,
                    "pods listed and ports reconciled"
                );
            }
            watcher::Event::Apply(p) => {
                if let Some((uid, r)) = pod_ref(&p) {
                    cluster.pod_applied(&uid, r);
                }
            }
            watcher::Event::Delete(p) => {
                let Some((uid, r)) = pod_ref(&p) else { return };
                cluster.pod_deleted(&uid);
                let name_held = cluster.has_pod_named(&r.name);
                deleted.push((uid, r.name, name_held));
            }
        }
    }

    async fn on_node(
        &self,
        e: watcher::Event<KubeNode>,
        cluster: &mut Cluster,
        list: &mut Option<Relist<String>>,
    ) {
        match e {
            watcher::Event::Init => {
                *list = Some(Relist { items: Vec::new(), started: crate::manager::now() })
            }
            watcher::Event::InitApply(n) => {
                if let (Some(l), Some(name)) = (list.as_mut(), n.metadata.name) {
                    l.items.push(name);
                }
            }
            watcher::Event::InitDone => {
                let Some(l) = list.take() else { return };
                self.status.relists.fetch_add(1, Relaxed);
                cluster.set_nodes(l.items);
                if cluster.node_count() == 0 {
                    tracing::warn!("the cluster lists no nodes: releasing none");
                    return;
                }
                let scope = self.scope();
                let known: Vec<String> = match self.blocking(move |m| m.list_nodes()).await {
                    Ok(nodes) => nodes
                        .into_iter()
                        .filter(|n| n.cluster_name() == scope.name)
                        .map(|n| n.name)
                        .collect(),
                    Err(e) => {
                        tracing::warn!(error = %e, "listing the manager's nodes");
                        return;
                    }
                };
                let gone: Vec<String> =
                    known.iter().filter(|n| !cluster.has_node(n)).cloned().collect();
                // A list that has none of the manager's nodes is another cluster's (a wrong
                // kubeconfig) or a filtered one, not every node deleted at once.
                if !known.is_empty() && gone.len() == known.len() {
                    tracing::warn!(
                        nodes = known.len(),
                        listed = cluster.node_count(),
                        "the cluster lists none of the manager's nodes (another cluster?): releasing none"
                    );
                    return;
                }
                for name in gone {
                    self.release_node(name).await;
                }
            }
            watcher::Event::Apply(n) => {
                if let Some(name) = n.metadata.name {
                    cluster.node_applied(&name);
                }
            }
            watcher::Event::Delete(n) => {
                if let Some(name) = n.metadata.name {
                    cluster.node_deleted(&name);
                    self.release_node(name).await;
                }
            }
        }
    }

    /// Releases the ports no pod of `cluster` holds, made before `cutoff` (when the list the
    /// view started from began), on nodes the view vouches for; counts the rest as held.
    async fn reconcile_orphans(&self, cluster: &Cluster, cutoff: u64) -> usize {
        let (view, status, scope) = (cluster.clone(), self.status.clone(), self.scope());
        self.release(move |m| {
            let ports = scope.ports(m, &Filter::default())?;
            let (gone, held) = reconcile::orphans(&ports, &view, cutoff);
            status.held_ports.store(held.len() as u64, Relaxed);
            if !held.is_empty() {
                let nodes: std::collections::BTreeSet<&str> = held.iter().map(|p| p.spec.node.as_str()).collect();
                tracing::warn!(ports = held.len(), ?nodes, pods_listed = view.pod_count(), "the list shows no pod on these nodes (another cluster? an empty or filtered list?): their ports are held, not released, until the controller's view shows the nodes' pods or the nodes are deleted");
            }
            Ok(gone.into_iter().cloned().collect())
        })
        .await
    }

    /// Releases a node the cluster no longer has: its ports, and its place in the other
    /// nodes' flood lists (the manager forgets it; nodes' sync streams drop it).
    /// Releases the ports of pods just deleted ([`Controller::on_pod`]), all found with one
    /// listing of the store's ports.
    async fn release_deleted(&self, deleted: Vec<(String, String, bool)>) {
        if deleted.is_empty() {
            return;
        }
        let scope = self.scope();
        self.release(move |m| {
            let pod =
                if let [(_, name, _)] = deleted.as_slice() { name.clone() } else { String::new() };
            let ports = scope.ports(m, &Filter { pod, ..Default::default() })?;
            Ok(deleted
                .iter()
                .flat_map(|(uid, name, held)| reconcile::of_deleted_pod(&ports, uid, name, *held))
                .cloned()
                .collect())
        })
        .await;
    }

    async fn release_node(&self, name: String) {
        if !self.opts.release_nodes {
            return;
        }
        let (node, scope) = (name.clone(), self.scope());
        match self.blocking(move |m| scope.has_node(m, &node)).await {
            Ok(true) => {}
            // Another cluster's node of the same name: not this cluster's to release.
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "reading the node gone from the cluster (retried at the next list)");
                return;
            }
        }
        let (node, scope) = (name.clone(), self.scope());
        self.release(move |m| scope.ports(m, &Filter { node: node.clone(), ..Default::default() }))
            .await;
        let node = name.clone();
        match self.blocking(move |m| m.delete_node(&node)).await {
            Ok(Some(_)) => {
                self.status.released_nodes.fetch_add(1, Relaxed);
                tracing::info!(node = %name, "node gone from the cluster: forgotten");
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "forgetting a node gone from the cluster")
            }
        }
    }

    /// Deletes the ports `pick` chooses (on a blocking thread: the store may be etcd); how
    /// many went.
    async fn release(
        &self,
        pick: impl FnOnce(&Manager) -> crate::manager::Result<Vec<crate::manager::objects::Port>>
        + Send
        + 'static,
    ) -> usize {
        let leading = self.status.clone();
        let r = self
            .blocking(move |m| {
                let mut gone = Vec::new();
                for p in pick(m)? {
                    // Leadership lost mid-way (this runs on a blocking thread the lost lead
                    // cannot cancel): stop before the next write; the next leader lists again.
                    if !leading.leader.load(Relaxed) {
                        break;
                    }
                    // A gone node's host ports go with its pods' ports.
                    if m.delete_port_record(&p.spec.container, &p.spec.interface)?.is_some() {
                        gone.push(p);
                    }
                }
                Ok(gone)
            })
            .await;
        match r {
            Ok(gone) => {
                // One Event per pod, naming all its ports (the recorder folds a pod's events of
                // one reason into one, keeping the first message).
                let mut by_pod: std::collections::BTreeMap<(&str, &str), Vec<String>> =
                    Default::default();
                for p in &gone {
                    tracing::info!(port = %format!("{}/{}", p.spec.container, p.spec.interface), pod = %p.spec.pod, uid = %p.spec.pod_uid, node = %p.spec.node, "released: its pod is gone");
                    let addresses: Vec<String> =
                        p.addresses.iter().map(|a| a.address.to_string()).collect();
                    let what = format!(
                        "{} on network {} ({})",
                        p.spec.interface,
                        p.spec.network,
                        if addresses.is_empty() {
                            "no address".into()
                        } else {
                            addresses.join(", ")
                        }
                    );
                    by_pod
                        .entry((p.spec.pod.as_str(), p.spec.pod_uid.as_str()))
                        .or_default()
                        .push(what);
                }
                if let Some(events) = self.events.get() {
                    for ((pod, uid), ports) in
                        by_pod.into_iter().filter(|((pod, _), _)| !pod.is_empty())
                    {
                        events.port_released(
                            pod,
                            uid,
                            format!(
                                "Knitter released {}: its pod or its node is gone",
                                ports.join("; ")
                            ),
                        );
                    }
                }
                self.status.released_ports.fetch_add(gone.len() as u64, Relaxed);
                gone.len()
            }
            Err(e) => {
                tracing::warn!(error = %e, "releasing ports of gone pods (retried at the next list)");
                0
            }
        }
    }

    fn scope(&self) -> Scope {
        Scope { name: self.opts.cluster.clone(), id: self.opts.cluster_id.clone() }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Manager) -> crate::manager::Result<T> + Send + 'static,
    ) -> crate::manager::Result<T> {
        let m = self.manager.clone();
        tokio::task::spawn_blocking(move || f(&m)).await.unwrap_or_else(|e| {
            Err(crate::manager::ManagerError::Busy(format!("controller task: {e}")))
        })
    }
}

/// The cluster a controller acts on: its nodes, and the ports made on them.
#[derive(Debug, Clone)]
struct Scope {
    name: String,
    /// An added cluster's id ([`Options::cluster_id`]; empty for the own cluster).
    id: String,
}

impl Scope {
    /// Whether the cluster is still the one this controller was started for.
    fn current(&self, m: &Manager) -> crate::manager::Result<bool> {
        Ok(self.id.is_empty() || m.cluster_id(&self.name)?.as_deref() == Some(self.id.as_str()))
    }

    /// The ports `f` picks that are this cluster's (none once the cluster is not current).
    fn ports(
        &self,
        m: &Manager,
        f: &Filter,
    ) -> crate::manager::Result<Vec<crate::manager::objects::Port>> {
        if !self.current(m)? {
            return Ok(Vec::new());
        }
        Ok(m.list_ports(f)?.into_iter().filter(|p| p.in_cluster(&self.name)).collect())
    }

    /// Whether node `name` may be this cluster's: registered in it, or not registered (its
    /// ports, if any, say their cluster themselves).
    fn has_node(&self, m: &Manager, name: &str) -> crate::manager::Result<bool> {
        if !self.current(m)? {
            return Ok(false);
        }
        match m.get_node(name) {
            Ok(n) => Ok(n.cluster_name() == self.name),
            Err(crate::manager::ManagerError::NotFound { .. }) => Ok(true),
            Err(e) => Err(e),
        }
    }
}

/// How long any one apiserver call may take: a stalled connection must not hold the
/// controller, nor keep a leader that can no longer renew acting on old decisions.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An apiserver call bounded by [`CALL_TIMEOUT`]; running out is an error like the
/// transport's own.
pub async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(elapsed) => Err(kube::Error::Service(Box::new(elapsed))),
    }
}

/// How often ports held by a list that did not vouch for their node are looked at again.
const HELD_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// How often the pods' network-status is brought up to date (when anything changed).
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Pod deletions whose ports are looked up together, at most (see `lead_pods`).
const DELETIONS_BATCHED: usize = 1024;

/// Waits until `rx` holds `want`; false when its sender is gone first.
async fn until(rx: &mut watch::Receiver<bool>, want: bool) -> bool {
    rx.wait_for(|v| *v == want).await.is_ok()
}

fn stop_set(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow()
}

/// A pod's UID and reference; `None` without a UID or name.
fn pod_ref(p: &Pod) -> Option<(String, PodRef)> {
    let m = &p.metadata;
    let (uid, name) = (m.uid.clone()?, m.name.as_deref()?);
    let ns = m.namespace.as_deref().unwrap_or("default");
    let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let network_status =
        m.annotations.as_ref().and_then(|a| a.get(reconcile::NETWORK_STATUS)).cloned();
    Some((uid, PodRef { name: format!("{ns}/{name}"), node, network_status }))
}

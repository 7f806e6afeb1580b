//! The controller's side of the `Network`, `IPGroup` and `Cluster` resources (with
//! `--network-resources`): each resource made on the manager (owned by it, see
//! `manager::managed`), its status written back, a Network's NetworkAttachmentDefinitions
//! kept in step ([`nad`](super::nad)), and what a deleted resource made deleted with it — a
//! [`FINALIZER`] keeps the resource, with the reason in its status, while pods still use
//! what it made (a Cluster: while its nodes hold ports, unless `releaseOnDelete`). A
//! cluster without the `clusters.knitter.io` CRD (installed before it) still gets its
//! networks: Clusters are handled once their list answers.
//!
//! One pass does it all, over complete views of the resources and namespaces: after any of
//! them changed, after a pass left something to do on the manager (a deletion refused while
//! pods still use a network) with a [`Backoff`] from [`RETRY`] to [`MAX_RETRY`] while passes
//! keep leaving it, when a write the apiserver refused is due again (each object's writes
//! back off on their own: [`Retries`]), and at least every [`RESYNC`]. Knitter's own NADs are
//! watched too: one edited or deleted by hand is put back at once. Namespaces being deleted
//! get no NAD (the apiserver refuses new objects there) and keep theirs until they go.

use super::nad::{self, MANAGED_BY};
use super::resources::{
    self, ClusterResource, IpGroupResource, Knitters, NetworkResource, Refusal,
};
use super::retries::Retries;
use super::{Controller, bounded};
use crate::manager::Manager;
use crate::manager::managed::ManagedBy;
use crate::manager::objects::{Cluster, IpGroupRecord};
use crate::network::NetworkSpec;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::watcher;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// The longest a pass waits when nothing changed.
pub const RESYNC: Duration = Duration::from_secs(30);
/// When a pass is tried again after something failed or was refused for now: the first
/// time; each pass that still leaves something waits twice as long, up to [`MAX_RETRY`].
pub const RETRY: Duration = Duration::from_secs(2);
/// The longest wait between passes that keep leaving something to do (a permanent 403, a
/// network in use for hours): the apiserver is not asked every 2 s forever, and a pass still
/// runs at least every [`RESYNC`] (what no watch shows: tenants' namespaces changed through
/// the manager's API).
pub const MAX_RETRY: Duration = RESYNC;

/// When the next pass is due after passes that left something to do on the manager:
/// [`RETRY`], doubled for each one in a row, at most [`MAX_RETRY`]; back to nothing once a
/// pass left nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    failed: u32,
}

impl Backoff {
    /// Takes a pass's outcome (whether it left something to do); the wait before the next
    /// pass when nothing changes meanwhile.
    pub fn after(&mut self, left_something: bool) -> Duration {
        if !left_something {
            self.failed = 0;
            return RESYNC;
        }
        let wait = super::retries::retry_wait(self.failed);
        self.failed = self.failed.saturating_add(1);
        wait
    }
}

/// One watched kind as its last complete list and the events since made it.
pub struct Listed<K> {
    pub items: BTreeMap<String, K>,
    listing: Option<BTreeMap<String, K>>,
    pub listed: bool,
}

impl<K> Default for Listed<K> {
    fn default() -> Self {
        Listed { items: BTreeMap::new(), listing: None, listed: false }
    }
}

impl<K: kube::Resource> Listed<K> {
    fn key(k: &K) -> String {
        let m = k.meta();
        match &m.namespace {
            Some(ns) => format!("{ns}/{}", m.name.as_deref().unwrap_or_default()),
            None => m.name.clone().unwrap_or_default(),
        }
    }

    /// Takes a watch event; whether the view changed.
    pub fn on(&mut self, e: watcher::Event<K>) -> bool {
        match e {
            watcher::Event::Init => self.listing = Some(BTreeMap::new()),
            watcher::Event::InitApply(k) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(Self::key(&k), k);
                }
            }
            watcher::Event::InitDone => {
                if let Some(l) = self.listing.take() {
                    self.items = l;
                    self.listed = true;
                    return true;
                }
            }
            watcher::Event::Apply(k) => {
                self.items.insert(Self::key(&k), k);
                return true;
            }
            watcher::Event::Delete(k) => return self.items.remove(&Self::key(&k)).is_some(),
        }
        false
    }
}

/// The resources and namespaces in view, and whether a pass is due.
#[derive(Default)]
pub struct Resources {
    pub networks: Listed<NetworkResource>,
    pub groups: Listed<IpGroupResource>,
    pub namespaces: Listed<Namespace>,
    /// Not waited for: a cluster installed before the CRD has none to list.
    pub clusters: Listed<ClusterResource>,
    pub due: bool,
}

impl Resources {
    pub fn listed(&self) -> bool {
        self.networks.listed && self.groups.listed && self.namespaces.listed
    }

    /// The `Cluster` resources, once listed.
    fn clusters(&self) -> Option<Vec<ClusterResource>> {
        self.clusters.listed.then(|| self.clusters.items.values().cloned().collect())
    }
}

/// The finalizer the controller puts on every resource: a resource being deleted stays,
/// with the reason in its status, until what it made on the manager is gone.
pub const FINALIZER: &str = "knitter.io/cleanup";

/// What the manager made of the resources.
#[derive(Debug, Default)]
pub struct Applied {
    pub networks: BTreeMap<String, Result<NetworkSpec, Refusal>>,
    pub groups: BTreeMap<String, Result<IpGroupRecord, Refusal>>,
    pub clusters: BTreeMap<String, Result<Cluster, Refusal>>,
    /// Resources being deleted whose objects are gone: (`networks.knitter.io`,
    /// `ipgroups.knitter.io` or `clusters.knitter.io`, name). Their finalizer may go.
    pub released: Vec<(&'static str, String)>,
    /// Something to try again (a transient refusal, a deletion refused while in use).
    pub retry: bool,
    /// A cluster was added or deleted: its controller starts or stops.
    pub clusters_changed: bool,
}

/// Refusals that may pass on their own.
fn transient(r: &Refusal) -> bool {
    matches!(r.reason.as_str(), "Busy" | "StoreUnavailable" | "InUse")
}

/// Whether Kubernetes is deleting the object (it waits for finalizers).
pub fn deleting(meta: &kube::api::ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Deletes the manager object `key` (`networks/<name>`, `ipgroups/<network>/<name>` or
/// `clusters/<name>`) for `by`, the resource that made it; a cluster's nodes and ports
/// are released with it only if `release`.
fn delete_made(m: &Manager, key: &str, by: &ManagedBy, release: bool) -> Result<(), Refusal> {
    let r = if let Some(name) = key.strip_prefix("networks/") {
        m.delete_network_by(name, Some(by)).map(|_| ())
    } else if let Some(name) = key.strip_prefix("clusters/") {
        m.delete_cluster_by(name, release, Some(by)).map(|_| ())
    } else if let Some((net, name)) = key.strip_prefix("ipgroups/").and_then(|k| k.split_once('/'))
    {
        m.delete_group_by(net, name, Some(by)).map(|_| ())
    } else {
        Ok(())
    };
    r.map_err(|e| Refusal::from(&e))
}

/// The resources a pass makes on the manager.
pub struct InView<'a> {
    pub networks: &'a [NetworkResource],
    pub groups: &'a [IpGroupResource],
    /// `None` until the `Cluster`s are listed: the clusters they made are left as they are.
    pub clusters: Option<&'a [ClusterResource]>,
    /// Where the `knitter-clusters` Secret's keys are files (a Cluster's `kubeconfigKey`).
    pub kubeconfigs: &'a std::path::Path,
}

/// Makes every resource's object on the manager (its tenant too); deletes what resources
/// being deleted made (IP groups before networks: a network with groups is in use), and
/// what resources no longer in view made (deleted without the finalizer's wait).
pub fn apply(m: &Manager, view: &InView<'_>) -> Applied {
    let (networks, groups) = (view.networks, view.groups);
    let clusters = view.clusters.unwrap_or_default();
    let mut out = Applied::default();
    let owned = match m.managed() {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "listing what Kubernetes resources made");
            out.retry = true;
            return out;
        }
    };
    let made_by = |by: &ManagedBy| owned.iter().find(|(_, b)| b == by).map(|(k, _)| k.clone());
    let release = |out: &mut Applied, resource: &'static str, name: &str, by: ManagedBy, all| {
        match made_by(&by).map_or(Ok(()), |key| delete_made(m, &key, &by, all)) {
            Ok(()) => {
                out.clusters_changed |= resource == ClusterResource::RESOURCE;
                out.released.push((resource, name.to_string()))
            }
            Err(e) => {
                tracing::info!(resource = %format!("{resource} {name}"), reason = %e.message, "being deleted; what it made is still in use (tried again)");
                out.retry = true;
                let name = name.to_string();
                match resource {
                    IpGroupResource::RESOURCE => drop(out.groups.insert(name, Err(e))),
                    ClusterResource::RESOURCE => drop(out.clusters.insert(name, Err(e))),
                    _ => drop(out.networks.insert(name, Err(e))),
                }
            }
        }
    };
    for r in groups.iter().filter(|r| deleting(&r.metadata)) {
        release(&mut out, IpGroupResource::RESOURCE, r.name(), r.managed_by(), false);
    }
    for r in networks.iter().filter(|r| deleting(&r.metadata)) {
        release(&mut out, NetworkResource::RESOURCE, r.name(), r.managed_by(), false);
    }
    for r in clusters.iter().filter(|r| deleting(&r.metadata)) {
        let all = r.release_on_delete();
        release(&mut out, ClusterResource::RESOURCE, r.name(), r.managed_by(), all);
    }
    for r in clusters.iter().filter(|r| !deleting(&r.metadata)) {
        let made = r.cluster_spec(view.kubeconfigs).and_then(|spec| {
            m.create_cluster_by(spec, Some(&r.managed_by())).map_err(|e| Refusal::from(&e))
        });
        out.retry |= made.as_ref().is_err_and(transient);
        out.clusters_changed |= made.as_ref().is_ok_and(|(_, new)| *new);
        out.clusters.insert(r.name().to_string(), made.map(|(c, _)| c));
    }
    for r in networks.iter().filter(|r| !deleting(&r.metadata)) {
        let made = r.network_spec().and_then(|spec| {
            m.create_tenant(&spec.tenant, None).map_err(|e| Refusal::from(&e))?;
            m.create_network_by(spec, Some(&r.managed_by()))
                .map(|(n, _)| n)
                .map_err(|e| Refusal::from(&e))
        });
        out.retry |= made.as_ref().is_err_and(transient);
        out.networks.insert(r.name().to_string(), made);
    }
    for r in groups.iter().filter(|r| !deleting(&r.metadata)) {
        let made = r.group_spec().and_then(|spec| {
            m.create_group_by(spec, Some(&r.managed_by()))
                .map(|(g, _)| g)
                .map_err(|e| Refusal::from(&e))
        });
        // A group of a network not made yet (or refused) is made when that one is.
        out.retry |= made.as_ref().is_err_and(|e| transient(e) || e.reason == "NotFound");
        out.groups.insert(r.name().to_string(), made);
    }
    let in_view: HashSet<ManagedBy> = networks
        .iter()
        .map(|r| r.managed_by())
        .chain(groups.iter().map(|r| r.managed_by()))
        .chain(clusters.iter().map(|r| r.managed_by()))
        .collect();
    let mut gone: Vec<&(String, ManagedBy)> = owned
        .iter()
        .filter(|(_, by)| !in_view.contains(by))
        .filter(|(key, _)| view.clusters.is_some() || !key.starts_with("clusters/"))
        .collect();
    gone.sort_by_key(|(key, _)| !key.starts_with("ipgroups/"));
    for (key, by) in gone {
        // A cluster whose resource went without the finalizer's wait releases nothing: no
        // one confirmed it.
        match delete_made(m, key, by, false) {
            Ok(()) => {
                out.clusters_changed |= key.starts_with("clusters/");
                tracing::info!(object = %key, resource = %format!("{} {}", by.resource, by.name), "its resource was deleted: deleted")
            }
            Err(e) if e.reason == "InUse" && key.starts_with("clusters/") => {
                // Its resource went without the finalizer's wait (taken off by hand): the
                // cluster is handed to the APIs, whose delete asks for the confirmation.
                match m.disown(key, by) {
                    Ok(_) => {
                        tracing::warn!(object = %key, reason = %e.message, "its Cluster resource was deleted without the controller's cleanup; left in place: knitterctl manager cluster delete --release removes it")
                    }
                    Err(e) => {
                        out.retry = true;
                        tracing::warn!(object = %key, error = %e, "handing a cluster whose resource went to the APIs (tried again)");
                    }
                }
            }
            Err(e) => {
                out.retry = true;
                tracing::warn!(object = %key, error = %e.message, "its resource was deleted; deleting it (tried again)");
            }
        }
    }
    out
}

/// Whether a call was answered 404.
fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// In `seen`, every NAD's writes: the NAD list failed, so which are still wanted is unknown.
pub(super) const EVERY_NAD: &str = "nad *";

/// Runs `write` (a write to the apiserver that says whether it succeeded) if `retries` says
/// the write `key` of the object `meta` is due, and records how it went; the key goes into
/// `seen` (what is still in view). Whether the write was made and succeeded.
async fn write_when_due(
    retries: &mut Retries,
    seen: &mut HashSet<String>,
    key: String,
    meta: &kube::api::ObjectMeta,
    write: impl std::future::Future<Output = bool>,
) -> bool {
    let version = meta.resource_version.as_deref();
    let due = retries.due(&key, version, Instant::now());
    let ok = due && write.await;
    if due {
        retries.record(&key, version, ok, Instant::now());
    }
    seen.insert(key);
    ok
}

/// A status's `Ready` condition: (status, reason, message).
fn ready_of(status: Option<&serde_json::Value>) -> Option<(String, String, String)> {
    let c = status?["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((text("status"), text("reason"), text("message")))
}

impl Controller {
    /// Watches `Network`s, `IPGroup`s, `Cluster`s and namespaces and runs a pass whenever they changed
    /// (and every [`RESYNC`]), until `stop` resolves.
    pub(super) async fn serve_resources(
        &self,
        mut stop: impl std::future::Future<Output = ()> + Unpin,
    ) {
        use futures_util::StreamExt;
        use kube::runtime::WatchStreamExt;
        let config = watcher::Config::default();
        let mut networks =
            watcher(Api::<NetworkResource>::all(self.client.clone()), config.clone())
                .default_backoff()
                .boxed();
        let mut groups = watcher(Api::<IpGroupResource>::all(self.client.clone()), config.clone())
            .default_backoff()
            .boxed();
        let mut namespaces = watcher(Api::<Namespace>::all(self.client.clone()), config.clone())
            .default_backoff()
            .boxed();
        let mut clusters =
            watcher(Api::<ClusterResource>::all(self.client.clone()), config.clone())
                .default_backoff()
                .boxed();
        // Knitter's own NADs: one edited or deleted by hand is put back at once.
        let ours = config.labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
        let mut nads = watcher(
            Api::<DynamicObject>::all_with(self.client.clone(), &nad::api_resource()),
            ours,
        )
        .default_backoff()
        .boxed();
        let (mut r, mut retries) = (Resources::default(), Retries::default());
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let (mut next, mut backoff) = (Instant::now() + RESYNC, Backoff::default());
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if r.listed() && (r.due || Instant::now() >= next) {
                        r.due = false;
                        let manager = backoff.after(self.pass(&r, &mut retries).await);
                        retries.defer_overdue(Instant::now());
                        let apiserver = retries.next(Instant::now()).unwrap_or(RESYNC);
                        next = Instant::now() + manager.min(apiserver);
                    }
                }
                e = networks.next() => match e {
                    Some(Ok(e)) => r.due |= r.networks.on(e),
                    Some(Err(e)) => self.watch_error("networks.knitter.io", e),
                    None => break,
                },
                e = groups.next() => match e {
                    Some(Ok(e)) => r.due |= r.groups.on(e),
                    Some(Err(e)) => self.watch_error("ipgroups.knitter.io", e),
                    None => break,
                },
                e = namespaces.next() => match e {
                    Some(Ok(e)) => r.due |= r.namespaces.on(e),
                    Some(Err(e)) => self.watch_error("namespaces", e),
                    None => break,
                },
                e = clusters.next() => match e {
                    Some(Ok(e)) => r.due |= r.clusters.on(e),
                    Some(Err(e)) => self.watch_error(ClusterResource::RESOURCE, e),
                    None => break,
                },
                e = nads.next() => match e {
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => r.due = true,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => self.watch_error("network-attachment-definitions", e),
                    None => break,
                },
                _ = &mut stop => break,
            }
            self.status.network_resources.store(r.networks.items.len() as u64, Relaxed);
        }
    }

    /// One pass over everything in view, each write to the apiserver when `retries` says it
    /// is due; whether something is left to do on the manager.
    async fn pass(&self, r: &Resources, retries: &mut Retries) -> bool {
        let nets: Vec<NetworkResource> = r.networks.items.values().cloned().collect();
        let groups: Vec<IpGroupResource> = r.groups.items.values().cloned().collect();
        let clusters = r.clusters();
        let (n, g, c) = (nets.clone(), groups.clone(), clusters.clone());
        let dir = self.opts.kubeconfigs.clone();
        let mut applied = match self
            .blocking(move |m| {
                let view =
                    InView { networks: &n, groups: &g, clusters: c.as_deref(), kubeconfigs: &dir };
                Ok(apply(m, &view))
            })
            .await
        {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "making the Network, IPGroup and Cluster resources");
                return true;
            }
        };
        if let Some(fleet) = &self.fleet {
            if applied.clusters_changed {
                fleet.changed();
            }
            for c in applied.clusters.values_mut().filter_map(|c| c.as_mut().ok()) {
                fleet.annotate(c);
            }
        }
        let clusters = clusters.unwrap_or_default();
        // Finalizers first: they are written with the resource version in view (a status
        // written before would move it).
        let retry = applied.retry;
        let released = |resource: &str, name: &str| {
            applied.released.iter().any(|(r, n)| *r == resource && n == name)
        };
        let mut seen = HashSet::new();
        self.finalize_each(&nets, &released, retries, &mut seen).await;
        self.finalize_each(&groups, &released, retries, &mut seen).await;
        self.finalize_each(&clusters, &released, retries, &mut seen).await;
        // Namespaces' labels go into the store (every replica checks pods' attachments by
        // them), then each namespace's tenant by the one rule (`tenancy.rs`).
        let labelled: BTreeMap<String, String> = r
            .namespaces
            .items
            .values()
            .filter_map(|ns| {
                Some((ns.metadata.name.clone()?, nad::labelled_tenant(ns)?.to_string()))
            })
            .collect();
        let known = match self
            .blocking(move |m| Ok((m.set_labelled_namespaces(&labelled)?, m.tenants()?)))
            .await
        {
            Ok((_, known)) => known,
            Err(e) => {
                tracing::warn!(error = %e, "recording the namespaces' tenants");
                return true;
            }
        };
        // A namespace being deleted takes no new NAD (the apiserver refuses it, every pass)
        // and its NADs go with it.
        let terminating: BTreeSet<String> = r
            .namespaces
            .items
            .values()
            .filter(|ns| deleting(&ns.metadata))
            .filter_map(|ns| ns.metadata.name.clone())
            .collect();
        let tenants: BTreeMap<String, String> = r
            .namespaces
            .items
            .values()
            .filter(|ns| !deleting(&ns.metadata))
            .filter_map(|ns| {
                let name = ns.metadata.name.clone()?;
                let tenant =
                    crate::manager::tenancy::tenant_for(&name, nad::labelled_tenant(ns), &known)
                        .to_string();
                Some((name, tenant))
            })
            .collect();
        let mut want = BTreeMap::new();
        for res in &nets {
            if let Some(Ok(spec)) = applied.networks.get(res.name()) {
                for ns in nad::namespaces_for(spec, &tenants) {
                    want.insert(format!("{ns}/{}", spec.name), nad::nad(spec, Some(res), None, ns));
                }
            }
        }
        let in_place =
            self.sync_nads(want, None, &terminating, retries, &mut seen).await.unwrap_or_default();
        self.status.attachment_definitions.store(in_place.len() as u64, Relaxed);
        let mut ready = 0;
        for res in &nets {
            let Some(outcome) = applied.networks.get(res.name()) else { continue };
            ready += outcome.is_ok() as u64;
            let mine: Vec<String> = in_place
                .iter()
                .filter(|k| k.rsplit_once('/').is_some_and(|(_, n)| n == res.name()))
                .cloned()
                .collect();
            let want = resources::network_status(res, outcome, &mine);
            self.status_when_due(res, want, retries, &mut seen).await;
        }
        self.status.network_resources_ready.store(ready, Relaxed);
        for res in &groups {
            let Some(outcome) = applied.groups.get(res.name()) else { continue };
            let want = resources::group_status(res, outcome);
            self.status_when_due(res, want, retries, &mut seen).await;
        }
        for res in &clusters {
            let Some(outcome) = applied.clusters.get(res.name()) else { continue };
            let want = resources::cluster_status(res, outcome);
            self.status_when_due(res, want, retries, &mut seen).await;
        }
        retries.retain(|k| seen.contains(k) || (k.starts_with("nad ") && seen.contains(EVERY_NAD)));
        self.status.writes_backing_off.store(retries.waiting() as u64, Relaxed);
        retry
    }

    /// [`Controller::finalize`] for each of `items`, when `retries` says each is due;
    /// `released(resource, name)`: what that resource made is gone.
    async fn finalize_each<K: Knitters>(
        &self,
        items: &[K],
        released: &(dyn Fn(&str, &str) -> bool + Sync),
        retries: &mut Retries,
        seen: &mut HashSet<String>,
    ) {
        for res in items {
            let meta = res.meta();
            let gone = released(K::RESOURCE, res.named());
            let write = self.finalize(Api::<K>::all(self.client.clone()), meta, gone);
            let key = format!("{} {} finalizers", K::RESOURCE, res.named());
            write_when_due(retries, seen, key, meta, write).await;
        }
    }

    /// [`Controller::write_status`] of `want` for `res`, when `retries` says it is due.
    async fn status_when_due<K: Knitters>(
        &self,
        res: &K,
        want: serde_json::Value,
        retries: &mut Retries,
        seen: &mut HashSet<String>,
    ) {
        let write = self.write_status(Api::<K>::all(self.client.clone()), res, res.status(), want);
        let key = format!("{} {} status", K::RESOURCE, res.named());
        write_when_due(retries, seen, key, res.meta(), write).await;
    }

    /// Puts [`FINALIZER`] on a resource that lacks it, or takes it off one being deleted whose
    /// objects are gone (`released`): a merge patch of the finalizer list, written only over
    /// the resource version in view (409 when it moved: the next pass sees the new one).
    /// False when the write failed.
    async fn finalize<K>(&self, api: Api<K>, meta: &kube::api::ObjectMeta, released: bool) -> bool
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut list = meta.finalizers.clone().unwrap_or_default();
        let has = list.iter().any(|f| f == FINALIZER);
        match (deleting(meta), has) {
            (false, false) => list.push(FINALIZER.into()),
            (true, true) if released => list.retain(|f| f != FINALIZER),
            _ => return true,
        }
        let name = meta.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({ "metadata": { "finalizers": list, "resourceVersion": meta.resource_version } });
        match bounded(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(kube::Error::Api(s)) if s.code == 409 => false,
            Err(e) => {
                tracing::warn!(resource = %name, error = %e, "writing the resource's finalizers (tried again)");
                false
            }
        }
    }

    /// Writes a resource's status (a merge patch of its status subresource) when it differs,
    /// and an Event when its `Ready` condition changed; false when the write failed.
    async fn write_status<K>(
        &self,
        api: Api<K>,
        res: &K,
        current: Option<&serde_json::Value>,
        want: serde_json::Value,
    ) -> bool
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let name = res.meta().name.clone().unwrap_or_default();
        let (before, after) = (ready_of(current), ready_of(Some(&want)));
        let Some(patch) = resources::status_patch(current, want) else { return true };
        match bounded(api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))).await
        {
            Ok(_) => {
                if let (Some((status, reason, message)), Some(events)) = (after, self.events.get())
                    && before.as_ref().is_none_or(|(s, r, _)| (s, r) != (&status, &reason))
                {
                    events.readiness(res.object_ref(&()), status == "True", &reason, &message);
                }
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                tracing::warn!(resource = %name, error = %e, "writing the resource's status (tried again)");
                false
            }
        }
    }

    /// Makes the cluster's Knitter NADs what `want` says (by `namespace/name`): creates,
    /// replaces, deletes (not in the `terminating` namespaces: their deletion takes them),
    /// each write when `retries` says it is due (its key recorded in `seen`). Returns the
    /// ones in place, `None` when the NADs could not be listed (no NAD CRD, or the list
    /// failed).
    pub(super) async fn sync_nads(
        &self,
        want: BTreeMap<String, DynamicObject>,
        maker: nad::Maker<'_>,
        terminating: &BTreeSet<String>,
        retries: &mut Retries,
        seen: &mut HashSet<String>,
    ) -> Option<BTreeSet<String>> {
        let ar = nad::api_resource();
        let all: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let selector = nad::selector(maker);
        let listed = bounded(all.list(&ListParams::default().labels(&selector))).await;
        // No NAD CRD (404) is an answer, not a failure: nothing to retry before a change.
        let answered = !matches!(&listed, Err(e) if !is_not_found(e));
        retries.record("nad list", None, answered, Instant::now());
        seen.insert("nad list".into());
        let have = match listed {
            Ok(l) => l.items,
            // No NAD CRD (no Multus): nothing to make, and nothing to retry before a change.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::warn!(
                    cluster = %self.opts.cluster,
                    "the cluster has no NetworkAttachmentDefinition CRD (Multus installs it): no NADs made"
                );
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing Knitter's NetworkAttachmentDefinitions (tried again)");
                // Every NAD's writes keep their place in `retries` until the list answers.
                seen.insert(EVERY_NAD.into());
                return None;
            }
        };
        let key = |d: &DynamicObject| {
            format!(
                "{}/{}",
                d.metadata.namespace.as_deref().unwrap_or_default(),
                d.metadata.name.as_deref().unwrap_or_default()
            )
        };
        // The own cluster's controller keeps no member's (a member's selector names it).
        let mine = |d: &DynamicObject| {
            maker.is_some()
                || !d.metadata.labels.as_ref().is_some_and(|l| l.contains_key(nad::CLUSTER_LABEL))
        };
        let have: BTreeMap<String, DynamicObject> =
            have.into_iter().filter(mine).map(|d| (key(&d), d)).collect();
        let mut in_place = BTreeSet::new();
        let api = |ns: &str| Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &ar);
        for (k, h) in have.iter().filter(|(k, _)| !want.contains_key(*k)) {
            let (ns, name) = k.split_once('/').unwrap_or_default();
            if terminating.contains(ns) {
                continue;
            }
            // Only the NAD listed as Knitter's: one deleted and made again by someone else
            // meanwhile (another UID) is refused (409) and not Knitter's to delete.
            let only_this = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: h.metadata.uid.clone(),
                    resource_version: h.metadata.resource_version.clone(),
                }),
                ..DeleteParams::default()
            };
            let delete = async {
                match bounded(api(ns).delete(name, &only_this)).await {
                    Ok(_) => {
                        self.status.attachment_definition_writes.fetch_add(1, Relaxed);
                        true
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => true,
                    Err(e) => {
                        tracing::warn!(nad = %k, error = %e, "deleting a NetworkAttachmentDefinition no longer wanted (tried again)");
                        false
                    }
                }
            };
            write_when_due(retries, seen, format!("nad {k} delete"), &h.metadata, delete).await;
        }
        for (k, d) in want {
            let (ns, name) = k.split_once('/').unwrap_or_default();
            let have = have.get(&k);
            // The key names what is wanted too: a NAD wanted otherwise than when its write
            // failed (its Network made again) is written at once, not after the old backoff.
            let key = format!("nad {k} {:016x}", nad::digest(&d));
            if let Some(h) = have.filter(|h| nad::same(h, &d)) {
                // In place, whatever failed before (a write that timed out but landed, a NAD
                // someone else put right).
                let version = h.metadata.resource_version.as_deref();
                retries.record(&key, version, true, Instant::now());
                seen.insert(key);
                in_place.insert(k);
                continue;
            }
            // One of Knitter's is brought back to what it should be by server-side apply over
            // the version in view (fields others added are kept; one deleted and made again by
            // someone else meanwhile is not taken over: 409), or by a merge patch where its
            // owner is another Network's (apply would add a second controller reference); a
            // new one is created, so that a NAD of that name not Knitter's is refused (409)
            // and left alone.
            let write = async {
                let r = match have {
                    Some(h) if nad::owner_replaced(h, &d) => {
                        let patch = nad::replacing_patch(h, &d);
                        let merge = Patch::Merge(&patch);
                        bounded(api(ns).patch(name, &PatchParams::default(), &merge))
                            .await
                            .map(|_| ())
                    }
                    Some(h) => {
                        let mut d = d.clone();
                        d.metadata.resource_version = h.metadata.resource_version.clone();
                        let apply = PatchParams::apply(nad::FIELD_MANAGER).force();
                        bounded(api(ns).patch(name, &apply, &Patch::Apply(&d))).await.map(|_| ())
                    }
                    None => bounded(api(ns).create(&PostParams::default(), &d)).await.map(|_| ()),
                };
                match r {
                    Ok(()) => {
                        self.status.attachment_definition_writes.fetch_add(1, Relaxed);
                        true
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 && have.is_none() => {
                        tracing::warn!(nad = %k, "a NetworkAttachmentDefinition of that name exists and is not Knitter's: left alone");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(nad = %k, error = %e, "writing a NetworkAttachmentDefinition (tried again)");
                        false
                    }
                }
            };
            let meta = have.map(|h| h.metadata.clone()).unwrap_or_default();
            if write_when_due(retries, seen, key, &meta, write).await {
                in_place.insert(k);
            }
        }
        Some(in_place)
    }
}

#[cfg(test)]
mod tests {
    use super::{Backoff, MAX_RETRY, RESYNC, RETRY};

    #[test]
    fn passes_that_keep_failing_wait_longer_up_to_the_cap_and_a_clean_one_resets() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..10).map(|_| b.after(true).as_secs()).collect();
        assert_eq!(waits, vec![2, 4, 8, 16, 30, 30, 30, 30, 30, 30]);
        assert_eq!(b.after(false), RESYNC);
        assert_eq!(b.after(true), RETRY, "back to the first wait");
        for _ in 0..100 {
            assert!(b.after(true) <= MAX_RETRY);
        }
    }
}

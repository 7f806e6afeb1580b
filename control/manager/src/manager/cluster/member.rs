//! NetworkAttachmentDefinitions in a member cluster (one the manager serves besides its own,
//! `fleet.rs`): every network marked for the cluster (its `clusters` naming it) gets a NAD
//! in each of the cluster's namespaces its tenant claims there (`cluster/namespace`,
//! `tenancy.rs`; a shared network's in every namespace), kept in step as namespaces,
//! tenants and networks change — the namespaces by their watch, the manager's side looked
//! at every [`MEMBER_RESYNC`] (from 2 s up to 30 s apart while the cluster's NADs cannot be
//! listed: no NAD CRD there, or the list fails). The NADs carry Knitter's labels and no owner reference (a
//! network's `Network` resource, if any, is the own cluster's: an owner missing here would
//! have the garbage collector delete them); one no longer wanted is deleted, as in the own
//! cluster (`networks.rs`, whose NAD writes these share).

use super::Controller;
use super::nad;
use super::networks::{Backoff, EVERY_NAD, Listed, deleting};
use super::retries::Retries;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// How often a member's NADs are brought in step with the manager's networks and tenants
/// when nothing in the cluster changed.
pub const MEMBER_RESYNC: Duration = Duration::from_secs(5);

impl Controller {
    /// Keeps the member cluster's NADs in step until `stop` resolves.
    pub(super) async fn serve_member_nads(
        &self,
        mut stop: impl std::future::Future<Output = ()> + Unpin,
    ) {
        use futures_util::StreamExt;
        use kube::runtime::WatchStreamExt;
        let config = watcher::Config::default();
        let mut namespaces = watcher(Api::<Namespace>::all(self.client.clone()), config.clone())
            .default_backoff()
            .boxed();
        let cluster = self.opts.cluster.clone();
        let ours = config.labels(&nad::selector(Some(&cluster)));
        let mut nads = watcher(
            Api::<DynamicObject>::all_with(self.client.clone(), &nad::api_resource()),
            ours,
        )
        .default_backoff()
        .boxed();
        let (mut listed, mut retries) = (Listed::<Namespace>::default(), Retries::default());
        // Events gather for a tick (a pass's own writes come back as events); a pass runs
        // at least every MEMBER_RESYNC.
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut due, mut next) = (true, tokio::time::Instant::now());
        let mut backoff = Backoff::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    due |= tokio::time::Instant::now() >= next;
                    if due && listed.listed {
                        due = false;
                        let unlisted = !self.member_pass(&listed, &mut retries).await;
                        let backing_off = backoff.after(unlisted);
                        let wait = if unlisted { backing_off } else { MEMBER_RESYNC };
                        next = tokio::time::Instant::now() + wait;
                    }
                }
                e = namespaces.next() => match e {
                    Some(Ok(e)) => due |= listed.on(e),
                    Some(Err(e)) => self.watch_error("namespaces", e),
                    None => break,
                },
                e = nads.next() => match e {
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => due = true,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => self.watch_error("network-attachment-definitions", e),
                    None => break,
                },
                _ = &mut stop => break,
            }
        }
    }

    /// One pass: the NADs the member cluster should have, written or deleted where they
    /// differ (each write on its own backoff). False when the cluster's NADs could not be
    /// listed.
    async fn member_pass(&self, namespaces: &Listed<Namespace>, retries: &mut Retries) -> bool {
        let scope = self.scope();
        let read = self
            .blocking(move |m| {
                // A cluster deleted or added again meanwhile is not this controller's.
                if !scope.current(m)? {
                    return Ok(None);
                }
                Ok(Some((m.networks()?, m.tenants()?)))
            })
            .await;
        let (networks, tenants) = match read {
            Ok(Some(r)) => r,
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!(cluster = %self.opts.cluster, error = %e, "reading the networks for the cluster's NADs (tried again)");
                return true;
            }
        };
        let cluster = self.opts.cluster.as_str();
        let terminating: BTreeSet<String> = namespaces
            .items
            .values()
            .filter(|ns| deleting(&ns.metadata))
            .filter_map(|ns| ns.metadata.name.clone())
            .collect();
        let by_namespace: BTreeMap<String, String> = namespaces
            .items
            .values()
            .filter(|ns| !deleting(&ns.metadata))
            .filter_map(|ns| {
                let name = ns.metadata.name.clone()?;
                let tenant =
                    crate::manager::tenancy::tenant_in(cluster, &name, None, &tenants).to_string();
                Some((name, tenant))
            })
            .collect();
        let mut want = BTreeMap::new();
        for net in networks.iter().filter(|n| n.spec.clusters.iter().any(|c| c == cluster)) {
            for ns in nad::namespaces_for(&net.spec, &by_namespace) {
                let nad = nad::nad(&net.spec, None, Some(cluster), ns);
                want.insert(format!("{ns}/{}", net.spec.name), nad);
            }
        }
        let mut seen = HashSet::new();
        let in_place = self.sync_nads(want, Some(cluster), &terminating, retries, &mut seen).await;
        let listed = in_place.is_some();
        let in_place = in_place.unwrap_or_default();
        self.status.attachment_definitions.store(in_place.len() as u64, Relaxed);
        retries.retain(|k| seen.contains(k) || (k.starts_with("nad ") && seen.contains(EVERY_NAD)));
        self.status.writes_backing_off.store(retries.waiting() as u64, Relaxed);
        listed
    }
}

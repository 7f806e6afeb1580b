//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does
//! it: the holder renews `renewTime` every retry period; a candidate takes the Lease when its
//! record has not changed for a whole lease duration (measured on the candidate's own clock
//! from when it saw the record change, so clocks need not agree). Every write carries the
//! `resourceVersion` it read, so two candidates cannot both take it: the second gets 409.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Where the Lease lives and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This manager's identity in `holderIdentity` (its host name by default).
    pub identity: String,
    /// How long a Lease whose holder stopped renewing stays its (`leaseDurationSeconds`).
    pub duration: Duration,
    /// How often the holder renews and a candidate looks again.
    pub retry: Duration,
}

/// What one look at the Lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
}

/// One candidate's view of the Lease between looks.
pub struct Elector {
    api: Api<Lease>,
    opts: LeaseOptions,
    /// The record last seen (its resourceVersion) and when it was first seen so.
    observed: Option<(String, Instant)>,
    /// When this candidate last renewed (or took) the Lease.
    renewed: Option<Instant>,
}

impl Elector {
    pub fn new(client: Client, opts: LeaseOptions) -> Elector {
        Elector { api: Api::namespaced(client, &opts.namespace), opts, observed: None, renewed: None }
    }

    /// Looks at the Lease once: takes or renews it when it may. A leader that could not renew
    /// for a whole lease duration (the API unreachable) steps down: another may hold it now.
    pub async fn step(&mut self) -> Role {
        match self.try_step().await {
            Ok(role) => role,
            Err(e) => {
                tracing::warn!(error = %e, lease = %self.opts.name, "leader election: the Lease could not be read or written");
                match self.renewed {
                    Some(t) if t.elapsed() < self.opts.duration => Role::Leader,
                    _ => {
                        self.renewed = None;
                        Role::Follower
                    }
                }
            }
        }
    }

    async fn try_step(&mut self) -> Result<Role, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.opts.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.opts.name.clone()), namespace: Some(self.opts.namespace.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.opts.identity.clone()),
                    lease_duration_seconds: Some(self.opts.duration.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return self.written(self.api.create(&PostParams::default(), &lease).await);
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != rv) {
            self.observed = Some((rv, Instant::now()));
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == self.opts.identity {
            spec.renew_time = Some(now);
            spec.lease_duration_seconds = Some(self.opts.duration.as_secs() as i32);
        } else {
            let held_for = spec.lease_duration_seconds.map_or(self.opts.duration, |s| Duration::from_secs(s.max(1) as u64));
            let unchanged = self.observed.as_ref().map_or(Duration::ZERO, |(_, at)| at.elapsed());
            if !holder.is_empty() && unchanged < held_for {
                self.renewed = None;
                return Ok(Role::Follower);
            }
            tracing::info!(lease = %self.opts.name, previous = %holder, "taking the Lease: its holder stopped renewing");
            spec.holder_identity = Some(self.opts.identity.clone());
            spec.lease_duration_seconds = Some(self.opts.duration.as_secs() as i32);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        // `replace` sends the resourceVersion read above: a write in between makes it 409.
        let r = self.api.replace(&self.opts.name, &PostParams::default(), &lease).await;
        self.written(r)
    }

    fn written(&mut self, r: Result<Lease, kube::Error>) -> Result<Role, kube::Error> {
        match r {
            Ok(l) => {
                let rv = l.metadata.resource_version.unwrap_or_default();
                self.observed = Some((rv, Instant::now()));
                self.renewed = Some(Instant::now());
                Ok(Role::Leader)
            }
            // Another candidate wrote first (409 on replace, or the Lease created meanwhile).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.renewed = None;
                Ok(Role::Follower)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs the election until `stop` is set, publishing whether this candidate leads.
    pub async fn run(mut self, leader: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            let role = self.step().await == Role::Leader;
            leader.send_if_modified(|l| std::mem::replace(l, role) != role);
            tokio::select! {
                _ = tokio::time::sleep(self.opts.retry) => {}
                _ = stop.changed() => break,
            }
        }
        leader.send_replace(false);
    }
}

//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does
//! it: the holder renews `renewTime` every retry period; a candidate takes the Lease when its
//! record has not changed for a whole lease duration (measured on the candidate's own clock
//! from when it saw the record change, so clocks need not agree). Every write carries the
//! `resourceVersion` it read, so two candidates cannot both take it: the second gets 409.
//!
//! Two leaders must never act at once, even when the apiserver stalls: every Lease call is
//! bounded, a leader that has not renewed within its renew deadline (shorter than the
//! lease: client-go's 10 s of 15) stops leading at that moment — whatever its last call
//! is still waiting for — and a candidate takes the Lease only after a whole lease duration
//! without change. A manager that stops releases the Lease, so the next one takes over at
//! its next look instead of a lease duration later.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::{CALL_TIMEOUT, bounded};

/// Where the Lease lives and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This manager's identity in `holderIdentity` (its host name by default).
    pub identity: String,
    /// How long a Lease whose holder stopped renewing stays its (`leaseDurationSeconds`).
    pub duration: Duration,
    /// How long a leader keeps leading without a successful renewal (shorter than
    /// `duration`: the margin covers a renewal that reached the apiserver just before the
    /// leader gave up on it).
    pub renew_deadline: Duration,
    /// How often the holder renews and a candidate looks again.
    pub retry: Duration,
}

impl LeaseOptions {
    /// client-go's proportions for a lease of `duration`: renew deadline 2/3 of it, a look
    /// every 2/15 (15 s, 10 s, 2 s by default).
    pub fn timed(namespace: &str, name: &str, identity: &str, duration: Duration) -> LeaseOptions {
        LeaseOptions {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration,
            renew_deadline: duration * 2 / 3,
            retry: duration * 2 / 15,
        }
    }
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
        Elector {
            api: Api::namespaced(client, &opts.namespace),
            opts,
            observed: None,
            renewed: None,
        }
    }

    /// Looks at the Lease once, bounded: takes or renews it when it may. A leader whose
    /// look fails or outlives its renew deadline steps down then: another may hold it soon.
    pub async fn step(&mut self) -> Role {
        // A leader may wait until its deadline; a candidate, one call's time but no longer
        // than a renew deadline (an answer later than that would make it a leader whose
        // term is already over).
        let bound = self.deadline().map_or(CALL_TIMEOUT.min(self.opts.renew_deadline), |d| {
            d.saturating_duration_since(Instant::now())
        });
        let error = match tokio::time::timeout(bound, self.try_step()).await {
            Ok(Ok(role)) => return role,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", bound.as_millis()),
        };
        tracing::warn!(error = %error, lease = %self.opts.name, "leader election: the Lease could not be read or written");
        self.lapsed()
    }

    /// When this candidate stops leading unless it renews first.
    fn deadline(&self) -> Option<Instant> {
        self.renewed.map(|t| t + self.opts.renew_deadline)
    }

    /// A leader still inside its renew deadline leads on; past it, it has stepped down.
    fn lapsed(&mut self) -> Role {
        match self.deadline() {
            Some(d) if Instant::now() < d => Role::Leader,
            _ => {
                self.renewed = None;
                Role::Follower
            }
        }
    }

    async fn try_step(&mut self) -> Result<Role, kube::Error> {
        // The renew deadline counts from before the write was sent, not from its answer: a
        // slow answer must not stretch this leader's term past what the others measure.
        let sent = Instant::now();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.opts.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.opts.name.clone()),
                    namespace: Some(self.opts.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.opts.identity.clone()),
                    lease_duration_seconds: Some(self.opts.duration.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return self.written(self.api.create(&PostParams::default(), &lease).await, sent);
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
            let held_for = spec
                .lease_duration_seconds
                .map_or(self.opts.duration, |s| Duration::from_secs(s.max(1) as u64));
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
        self.written(r, sent)
    }

    fn written(
        &mut self,
        r: Result<Lease, kube::Error>,
        sent: Instant,
    ) -> Result<Role, kube::Error> {
        match r {
            Ok(l) => {
                let rv = l.metadata.resource_version.unwrap_or_default();
                self.observed = Some((rv, Instant::now()));
                self.renewed = Some(sent);
                // Written, but answered after its own deadline: not leading (the next look
                // renews it afresh).
                Ok(self.lapsed())
            }
            // Another candidate wrote first (409 on replace, or the Lease created meanwhile).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.renewed = None;
                Ok(Role::Follower)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs the election until `stop` is set, publishing whether this candidate leads; a
    /// leader wakes at its renew deadline at the latest, to step down on time. Returns the
    /// elector, for [`Elector::release`] once nothing acts on its leadership any more.
    pub async fn run(
        mut self,
        leader: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) -> Elector {
        loop {
            // A stop does not wait for a look in flight.
            let role = tokio::select! {
                r = self.step() => r == Role::Leader,
                _ = stop.changed() => break,
            };
            leader.send_if_modified(|l| std::mem::replace(l, role) != role);
            let wait = self.deadline().map_or(self.opts.retry, |d| {
                self.opts.retry.min(d.saturating_duration_since(Instant::now()))
            });
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
        }
        leader.send_replace(false);
        self
    }

    /// Gives the Lease up if this candidate holds it (client-go's `ReleaseOnCancel`): the
    /// holder emptied and the duration cut to one second, so a standby takes it at its next
    /// look. Bounded; a failure leaves the Lease to run out.
    pub async fn release(mut self) {
        if self.renewed.take().is_none() {
            return;
        }
        let name = self.opts.name.clone();
        let released = async {
            let mut lease = self.api.get(&name).await?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.opts.identity.as_str()) {
                return Ok(false);
            }
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now);
            self.api.replace(&name, &PostParams::default(), &lease).await.map(|_| true)
        };
        match bounded(released).await {
            Ok(true) => tracing::info!(lease = %name, "released the Lease"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, lease = %name, "could not release the Lease: it runs out instead")
            }
        }
    }
}

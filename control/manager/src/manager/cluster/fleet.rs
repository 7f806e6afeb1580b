//! The controller once per added cluster ([`crate::manager::objects::Cluster`]): each with
//! its own client, watches, Lease and task, so a cluster whose apiserver hangs or refuses
//! holds none of the others. Clusters added or deleted through the APIs start or stop
//! theirs at once ([`Fleet::changed`]); the store is looked at again every
//! [`RESCAN`] (another replica's changes, a kubeconfig that could not be read before).
//! The manager's own cluster (`--kubernetes`) keeps the controller `knitter-manager` starts
//! itself; the fleet only reports it.

use super::{Controller, Options, Status, StatusReport, stop_set, until};
use crate::manager::Manager;
use crate::manager::objects::Cluster;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// How often the fleet looks at the stored clusters without being told.
pub const RESCAN: Duration = Duration::from_secs(10);

/// The controllers of the added clusters.
pub struct Fleet {
    manager: Arc<Manager>,
    /// What every added cluster's controller runs with (its cluster's name set in).
    template: Options,
    /// The own cluster's controller, when the manager runs one.
    own: Option<Arc<Status>>,
    members: Mutex<BTreeMap<String, Member>>,
    wake: Notify,
}

/// One added cluster's controller, or why it does not run.
struct Member {
    id: String,
    kubeconfig: String,
    running: Option<Running>,
    error: Option<String>,
}

struct Running {
    status: Arc<Status>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Fleet {
    /// `template`: the own controller's options (the Lease's name, identity and timing, and
    /// what to release); added clusters' controllers make no network resources and write no
    /// pod's network-status (a member cluster's RBAC, `overlays/member`, lets the manager
    /// read pods, not patch them).
    pub fn new(manager: Arc<Manager>, template: Options, own: Option<Arc<Status>>) -> Arc<Fleet> {
        Arc::new(Fleet {
            manager,
            template: Options { network_resources: false, network_status: false, ..template },
            own,
            members: Mutex::default(),
            wake: Notify::new(),
        })
    }

    /// A cluster was added or deleted: look at the store now.
    pub fn changed(&self) {
        self.wake.notify_one();
    }

    /// Fills in `c`'s controller state, or why none runs.
    pub fn annotate(&self, c: &mut Cluster) {
        if c.own {
            c.controller = self.own.as_ref().map(|s| s.report());
            return;
        }
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        match members.get(&c.spec.name).filter(|m| m.id == c.id) {
            Some(m) => {
                c.controller = m.running.as_ref().map(|r| r.status.report());
                c.error.clone_from(&m.error);
            }
            None => c.error = Some("its controller starts at the next look (within 10 s)".into()),
        }
    }

    /// The added clusters' controllers as Prometheus metrics, labelled by cluster (the own
    /// cluster's are `knitter_manager_kubernetes_*`).
    pub fn metrics(&self) -> String {
        let reports: Vec<(String, Option<StatusReport>)> = {
            let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            members
                .iter()
                .map(|(name, m)| (name.clone(), m.running.as_ref().map(|r| r.status.report())))
                .collect()
        };
        let mut out = String::new();
        if reports.is_empty() {
            return out;
        }
        // Each row reads a controller's report; none while it does not run.
        type Pick = fn(Option<&StatusReport>) -> f64;
        let rows: [(&str, &str, &str, Pick); 7] = [
            (
                "knitter_manager_cluster_controller_running",
                "gauge",
                "1 while the cluster's controller runs (0: its kubeconfig could not be read or used)",
                |r| f64::from(u8::from(r.is_some())),
            ),
            (
                "knitter_manager_cluster_leader",
                "gauge",
                "1 while this manager leads in the cluster (holds its Lease)",
                |r| f64::from(u8::from(r.is_some_and(|r| r.leader))),
            ),
            (
                "knitter_manager_cluster_relists_total",
                "counter",
                "complete lists of the cluster's pods or nodes taken",
                |r| r.map_or(0, |r| r.relists) as f64,
            ),
            (
                "knitter_manager_cluster_watch_errors_total",
                "counter",
                "watch errors on the cluster's apiserver",
                |r| r.map_or(0, |r| r.watch_errors) as f64,
            ),
            (
                "knitter_manager_cluster_released_ports_total",
                "counter",
                "ports released because their pod or node went from the cluster",
                |r| r.map_or(0, |r| r.released_ports) as f64,
            ),
            (
                "knitter_manager_cluster_held_ports",
                "gauge",
                "the cluster's ports held because the last list did not vouch for their node",
                |r| r.map_or(0, |r| r.held_ports) as f64,
            ),
            (
                "knitter_manager_cluster_pods",
                "gauge",
                "the cluster's pods in its controller's view",
                |r| r.map_or(0, |r| r.pods) as f64,
            ),
        ];
        for (name, kind, help, pick) in rows {
            let samples = reports.iter().map(|(c, r)| (c.clone(), pick(r.as_ref())));
            knitter_api::metrics::family(&mut out, name, kind, help, "cluster", samples);
        }
        out
    }

    /// Keeps one controller per stored cluster until `stop` is set, then stops them all
    /// (each gives its Lease up).
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            self.align().await;
            tokio::select! {
                () = tokio::time::sleep(RESCAN) => {}
                () = self.wake.notified() => {}
                _ = until(&mut stop, true) => break,
            }
            if stop_set(&stop) {
                break;
            }
        }
        let running: Vec<Running> = {
            let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *members).into_values().filter_map(|m| m.running).collect()
        };
        stop_all(running).await;
    }

    /// Starts the controllers of clusters that have none running (new ones, and ones whose
    /// kubeconfig failed before), stops those of clusters deleted or re-added.
    async fn align(&self) {
        let m = self.manager.clone();
        let clusters = match tokio::task::spawn_blocking(move || m.stored_clusters()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "listing the clusters (looked at again soon)");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing the clusters");
                return;
            }
        };
        let wanted: BTreeMap<String, Cluster> =
            clusters.into_iter().map(|c| (c.spec.name.clone(), c)).collect();
        let gone: Vec<Running> = {
            let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            let stale: Vec<String> = members
                .iter()
                .filter(|(n, m)| {
                    wanted.get(*n).is_none_or(|c| c.id != m.id || c.spec.kubeconfig != m.kubeconfig)
                })
                .map(|(n, _)| n.clone())
                .collect();
            stale.iter().filter_map(|n| members.remove(n)).filter_map(|m| m.running).collect()
        };
        if !gone.is_empty() {
            tracing::info!(
                controllers = gone.len(),
                "stopping the controllers of clusters deleted or changed"
            );
            stop_all(gone).await;
        }
        for (name, c) in wanted {
            // None running, or one that ended by itself (it stops only when told: it
            // failed): start one.
            let idle = {
                let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
                match members.get_mut(&name) {
                    None => true,
                    Some(m) => match &m.running {
                        None => true,
                        Some(r) if r.task.is_finished() => {
                            tracing::warn!(cluster = %name, "cluster's controller ended; starting it again");
                            m.running = None;
                            true
                        }
                        Some(_) => false,
                    },
                }
            };
            if !idle {
                continue;
            }
            let member = match self.start(&c).await {
                Ok(running) => {
                    tracing::info!(cluster = %name, id = %c.id, "cluster's controller started");
                    Member {
                        id: c.id,
                        kubeconfig: c.spec.kubeconfig,
                        running: Some(running),
                        error: None,
                    }
                }
                Err(error) => {
                    tracing::warn!(cluster = %name, error = %error, "cluster's controller not started (tried again within 10 s)");
                    Member {
                        id: c.id,
                        kubeconfig: c.spec.kubeconfig,
                        running: None,
                        error: Some(error),
                    }
                }
            };
            self.members.lock().unwrap_or_else(|p| p.into_inner()).insert(name, member);
        }
    }

    /// Starts `c`'s controller, its kubeconfig read now. The error said to readers names
    /// the step, not the parser's words (they may quote the file); the log has them.
    async fn start(&self, c: &Cluster) -> Result<Running, String> {
        let path = c.spec.kubeconfig.clone();
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(cluster = %c.spec.name, kubeconfig = %path, error = %e, "{what}");
            format!("{what} (the manager's log says why)")
        };
        let file = path.clone();
        let kc = tokio::task::spawn_blocking(move || kube::config::Kubeconfig::read_from(&file))
            .await
            .map_err(|e| failed("reading the kubeconfig", &e))?
            .map_err(|e| failed(&format!("reading the kubeconfig {path}"), &e))?;
        let dir = std::path::Path::new(&path).parent().unwrap_or(std::path::Path::new("/"));
        confined(&kc, dir).map_err(|e| format!("the kubeconfig {path}: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| failed(&format!("using the kubeconfig {path}"), &e))?;
        let client = kube::Client::try_from(config)
            .map_err(|e| failed(&format!("a client from the kubeconfig {path}"), &e))?;
        let opts = Options {
            cluster: c.spec.name.clone(),
            cluster_id: c.id.clone(),
            ..self.template.clone()
        };
        let controller = Controller::new(self.manager.clone(), client, opts);
        let status = controller.status();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(controller.run(rx));
        Ok(Running { status, stop, task })
    }
}

/// Refuses what a kubeconfig could make the manager do besides reaching an apiserver with
/// credentials it holds: run a command (`exec`, an `auth-provider`'s `cmd-path`) or read a
/// file outside its own directory (`tokenFile`, `client-certificate`, `client-key`,
/// `certificate-authority`: the manager's own service-account token, sent to a server the
/// file names). Whoever writes the `knitter-clusters` Secret, or a `Cluster` resource that
/// picks one of its keys, gets no more than that. `member-kubeconfig.sh`'s kubeconfigs
/// embed everything.
pub fn confined(kc: &kube::config::Kubeconfig, dir: &std::path::Path) -> Result<(), String> {
    let inside = |what: &str, file: &Option<String>| match file {
        Some(f) => {
            let p = std::path::Path::new(f);
            let up = p.components().any(|c| matches!(c, std::path::Component::ParentDir));
            if up || !p.starts_with(dir) {
                return Err(format!(
                    "{what} {f:?} is outside the kubeconfig's directory (embed it: {what}-data)"
                ));
            }
            Ok(())
        }
        None => Ok(()),
    };
    for a in &kc.auth_infos {
        let Some(info) = &a.auth_info else { continue };
        if info.exec.is_some() || info.auth_provider.is_some() {
            return Err(format!(
                "user {:?} runs a command for its credentials (exec or auth-provider): give a token or a client certificate instead",
                a.name
            ));
        }
        inside("tokenFile", &info.token_file)?;
        inside("client-certificate", &info.client_certificate)?;
        inside("client-key", &info.client_key)?;
    }
    for c in &kc.clusters {
        if let Some(cluster) = &c.cluster {
            inside("certificate-authority", &cluster.certificate_authority)?;
        }
    }
    Ok(())
}

/// Stops controllers and waits for them, each bounded (a hung apiserver call ends at
/// [`super::CALL_TIMEOUT`]).
async fn stop_all(running: Vec<Running>) {
    for r in &running {
        let _ = r.stop.send(true);
    }
    let bound = super::CALL_TIMEOUT + Duration::from_secs(1);
    for mut r in running {
        if tokio::time::timeout(bound, &mut r.task).await.is_err() {
            tracing::warn!(
                "a cluster's controller did not stop within {} s: aborted",
                bound.as_secs()
            );
            r.task.abort();
        }
    }
}

#[cfg(test)]
mod test {
    use super::confined;
    use std::path::Path;

    fn kubeconfig(user: &str, cluster: &str) -> kube::config::Kubeconfig {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster:\n    server: https://192.0.2.1:6443\n{cluster}users:\n- name: knitter\n  user:\n{user}contexts:\n- name: east\n  context: {{cluster: east, user: knitter}}\ncurrent-context: east\n"
        );
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap()
    }

    #[test]
    fn a_kubeconfig_runs_no_command_and_reads_no_file_outside_its_directory() {
        let dir = Path::new("/etc/knitter/clusters");
        let ok = |user: &str, cluster: &str| confined(&kubeconfig(user, cluster), dir);
        assert!(ok("    token: abc\n", "    certificate-authority-data: Q0E=\n").is_ok());
        assert!(ok("    tokenFile: /etc/knitter/clusters/east-token\n", "").is_ok());
        let exec = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: sh\n      args: [-c, id]\n";
        assert!(ok(exec, "").unwrap_err().contains("runs a command"));
        let provider = "    auth-provider:\n      name: gcp\n      config: {cmd-path: /bin/sh}\n";
        assert!(ok(provider, "").unwrap_err().contains("runs a command"));
        for file in [
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "/etc/knitter/clusters/../tls/tls.key",
        ] {
            let e = ok(&format!("    tokenFile: {file}\n"), "").unwrap_err();
            assert!(e.contains("outside the kubeconfig's directory"), "{e}");
            let e = ok(&format!("    client-key: {file}\n"), "").unwrap_err();
            assert!(e.contains("client-key"), "{e}");
            let e = ok("    token: abc\n", &format!("    certificate-authority: {file}\n"));
            assert!(e.unwrap_err().contains("certificate-authority"));
        }
    }
}

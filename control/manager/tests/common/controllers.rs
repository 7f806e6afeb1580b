//! Controllers run on their own tasks against the API server stand-in, nodes registered as
//! their agents register, and polling for what the controllers do (the Kubernetes and
//! multi-cluster tests share these).

use knitter_manager::manager::Manager;
use knitter_manager::manager::cluster::{Controller, Options};
use knitter_manager::manager::objects::Node;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A controller running on its own task; `stop` ends it gracefully, aborting the task kills it.
pub struct Running {
    pub stop: watch::Sender<bool>,
    pub task: tokio::task::JoinHandle<()>,
    pub status: Arc<knitter_manager::manager::cluster::Status>,
}

pub fn start_through(m: &Arc<Manager>, client: kube::Client, opts: Options) -> Running {
    let (stop, rx) = watch::channel(false);
    let c = Controller::new(m.clone(), client, opts);
    let status = c.status();
    Running { stop, task: tokio::spawn(c.run(rx)), status }
}

impl Running {
    pub async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the controller stops")
            .expect("no panic");
    }
}

/// A node registered with the manager in `cluster` (`""`: the manager's own), as its
/// agent registers.
pub fn register_in(m: &Manager, name: &str, vtep: &str, cluster: &str) {
    m.register_node(node_record(name, vtep, cluster)).unwrap();
}

/// A node as its agent registers it.
pub fn node_record(name: &str, vtep: &str, cluster: &str) -> Node {
    Node {
        name: name.into(),
        vtep: vtep.parse().unwrap(),
        underlay_mtu: 1600,
        capabilities: vec![],
        registered: 0,
        last_seen: 0,
        state: String::new(),
        cluster: cluster.into(),
    }
}

pub async fn eventually(what: &str, ok: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(20), ok).await
}

pub async fn eventually_within(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within {within:?}: {what}");
}

/// Checks `objects` against a CRD's schema with ci/k8s-validate.py (Kubernetes' own rules
/// through the `jsonschema` package kubernetes-validate brings).
pub fn validate(crd: &str, objects: Vec<serde_json::Value>) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_vec(&objects).unwrap()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/ci/k8s-validate.py"))
        .arg("objects")
        .arg(format!("{root}/{crd}"))
        .arg(file.path())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{crd}: {}{} (needs `pip install kubernetes-validate==1.37.0`, as ci/setup.sh does)",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

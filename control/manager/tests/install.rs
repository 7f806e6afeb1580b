//! docs/kubernetes.md as an operator runs it: every command block of "Network and IPGroup
//! resources", "Installing on a cluster", "Uninstalling", "Knitter as the cluster's pod
//! network" and "Several clusters" (a second stand-in as the member cluster), in order and as
//! written, with a real `kubectl` (`$KNITTER_KUBECTL`, else the one on `PATH`: Debian's 1.20
//! and a current one both pass) against the API server stand-in (`common/apiserver.rs`), and
//! a real knitter-manager process (`--kubernetes --network-resources`) as the cluster's
//! manager, so the uninstall's first step is answered as in a cluster. The kustomizations the
//! docs show as YAML are written where their comment says. What cannot run here is skipped,
//! saying why: the images' build (ci/images.sh builds and runs them) and what needs a
//! running pod (the stand-in has no kubelet). The walk ends with nothing of Knitter left.

#[allow(dead_code)]
#[path = "common/apiserver.rs"]
mod apiserver;
mod common;

use apiserver::{ApiServer, Kind, Rbac};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Lines that cannot run here, by what they contain, and why.
const SKIPPED: &[(&str, &str)] = &[
    (
        "deploy/images/build.sh",
        "the images: ci/images.sh builds them and runs them as the manifests do",
    ),
    ("port-forward", "no pod runs here (the stand-in has no kubelet)"),
    ("--manager 127.0.0.1:9481", "no pod runs here (the stand-in has no kubelet)"),
    (
        "kubectl wait --for=condition=Ready clusters.knitter.io",
        "no manager runs while the docs are walked: the test waits for the Cluster's Ready once it starts one",
    ),
];

/// A fenced block of the docs: its language and its text.
struct Block {
    language: String,
    text: String,
}

/// The fenced blocks of the sections whose titles start with one of `sections`, in order.
fn blocks(doc: &str, sections: &[&str]) -> Vec<Block> {
    let (mut out, mut inside, mut fence) = (Vec::new(), false, None::<Block>);
    for line in doc.lines() {
        if let Some(mut b) = fence.take() {
            if line.starts_with("```") {
                out.push(b);
            } else {
                b.text += line;
                b.text.push('\n');
                fence = Some(b);
            }
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            inside = sections.iter().any(|s| title.starts_with(s));
        } else if let Some(language) = line.strip_prefix("```").filter(|_| inside) {
            fence = Some(Block { language: language.trim().into(), text: String::new() });
        }
    }
    out
}

fn kubectl() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("KNITTER_KUBECTL") {
        return Some(k.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("kubectl")).find(|k| k.exists())
}

/// Where a walk runs: a copy of `deploy/` (the docs' relative paths), the kubeconfigs, a
/// `kubectl` on `PATH`, and a home of its own (kubectl's discovery cache).
struct Walk {
    dir: tempfile::TempDir,
    api: ApiServer,
    path: String,
}

impl Walk {
    fn new(api: ApiServer, kubectl: &Path) -> Walk {
        let dir = tempfile::tempdir().unwrap();
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
        let copied = Command::new("cp").args(["-r", root]).arg(dir.path()).status().unwrap();
        assert!(copied.success());
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(kubectl, bin.join("kubectl")).unwrap();
        std::fs::write(dir.path().join("admin.kubeconfig"), api.kubeconfig(true)).unwrap();
        std::fs::write(dir.path().join("manager.kubeconfig"), api.kubeconfig(false)).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        Walk { dir, api, path }
    }

    /// Runs a shell script in the walk's directory as the cluster admin; its output.
    fn sh(&self, script: &str) -> Result<String, String> {
        let out = Command::new("timeout")
            .args(["300", "bash", "-euo", "pipefail", "-c", script])
            .current_dir(self.dir.path())
            .env("KUBECONFIG", self.dir.path().join("admin.kubeconfig"))
            .env("HOME", self.dir.path())
            .env("PATH", &self.path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() { Ok(text) } else { Err(text) }
    }

    /// Runs the docs' blocks: shell ones line by line as a script (skipped lines said), a
    /// YAML block headed `# DIR/kustomization.yaml, beside a copy of FILE` written there
    /// with the patch beside it.
    fn run(&self, blocks: &[Block]) {
        for b in blocks {
            match b.language.as_str() {
                "sh" => {
                    let mut script = String::new();
                    for line in b.text.replace("\\\n", " ").lines() {
                        match SKIPPED.iter().find(|(what, _)| line.contains(what)) {
                            Some((_, why)) => eprintln!("skipped: {line}\n  ({why})"),
                            None => script += &format!("{line}\n"),
                        }
                    }
                    eprintln!("$ {}", script.trim_end().replace('\n', "\n$ "));
                    match self.sh(&script) {
                        Ok(out) => eprintln!("{out}"),
                        Err(out) => {
                            panic!("a block of docs/kubernetes.md failed:\n{script}\n{out}")
                        }
                    }
                }
                "yaml" => {
                    let Some((file, patch)) = b.text.lines().next().and_then(|l| {
                        let l = l.strip_prefix("# ")?;
                        let (file, rest) = l.split_once(", beside a copy of ")?;
                        Some((file.to_string(), rest.trim().to_string()))
                    }) else {
                        eprintln!(
                            "not a file of the walk's: a YAML block starting {:?}",
                            b.text.lines().next()
                        );
                        continue;
                    };
                    let file = self.dir.path().join(file);
                    let dir = file.parent().unwrap();
                    std::fs::create_dir_all(dir).unwrap();
                    std::fs::write(&file, &b.text).unwrap();
                    let from = self.dir.path().join("deploy/kubernetes/patches").join(&patch);
                    std::fs::copy(&from, dir.join(&patch)).unwrap();
                    // Each is applied by a later block, or rendered here.
                    let rendered = self.sh(&format!("kubectl kustomize {}", dir.display()));
                    assert!(rendered.is_ok(), "{}: {rendered:?}", file.display());
                }
                _ => {}
            }
        }
    }

    /// The manager the manifests run (`--kubernetes --network-resources`, the Lease in
    /// `knitter`, `extra` flags), as their service account: a process of this build.
    fn manager(&self, extra: &[&str]) -> common::ManagerProc {
        let kubeconfig = self.dir.path().join("manager.kubeconfig");
        let mut args = vec![
            "--kubernetes",
            "--network-resources",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--lease",
            "knitter/knitter-manager",
            "--identity",
            "knitter-manager-0",
        ];
        args.extend(extra);
        common::ManagerProc::start(&self.dir.path().join("manager"), &args)
    }

    fn eventually(&self, what: &str, ok: impl Fn(&ApiServer) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(&self.api) {
            assert!(Instant::now() < deadline, "not within 30 s: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What Knitter left in the cluster: any object but the nodes and the namespaces the
    /// cluster had, and Leases (Events expire on their own, an hour after their last).
    fn left(&self, had: &[&str]) -> Vec<String> {
        let kinds = apiserver::RESOURCES
            .iter()
            .map(|r| r.kind)
            .filter(|k| !matches!(k, Kind::Nodes | Kind::Events));
        let objects = kinds
            .flat_map(|k| self.api.objects(k).into_keys().map(move |key| format!("{k:?} {key}")));
        let leases = self.api.leases_and_events().into_iter().filter(|o| o.starts_with("Lease"));
        objects
            .chain(leases)
            .filter(|o| !had.iter().any(|h| *o == format!("Namespaces {h}")))
            .collect()
    }
}

/// A cluster as a new one is: its namespaces and two nodes.
async fn cluster(rbac: Rbac) -> ApiServer {
    let api = ApiServer::start_with(rbac).await;
    api.require_namespaces();
    for ns in CLUSTER_NAMESPACES {
        api.add_namespace(ns, &[("kubernetes.io/metadata.name", ns)]);
    }
    api.add_node("node-1");
    api.add_node("node-2");
    api
}

const CLUSTER_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kubernetes.md"))
        .unwrap()
}

/// kubectl, or (outside CI only) a reason to skip.
fn kubectl_or_skip() -> Option<PathBuf> {
    let k = kubectl();
    if k.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no kubectl: ci/setup.sh installs kubernetes-client"
        );
        eprintln!("skipped: no kubectl (apt install kubernetes-client)");
    }
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_install_upgrade_and_uninstall_run_as_written() {
    let Some(kubectl) = kubectl_or_skip() else { return };
    let walk = Walk::new(cluster(Rbac::Base).await, &kubectl);
    // Your etcd's credentials, which the etcd overlay's block reads.
    for f in ["etcd-ca.crt", "etcd-client.crt", "etcd-client.key"] {
        std::fs::write(walk.dir.path().join(f), "placeholder\n").unwrap();
    }
    let doc = doc();
    let (install, uninstall) = (blocks(&doc, &["Installing"]), blocks(&doc, &["Uninstalling"]));
    assert!(install.len() >= 5 && uninstall.len() == 1, "the docs' sections moved");
    tokio::task::block_in_place(|| walk.run(&install));

    let ns = walk.api.object(Kind::Namespaces, "knitter").expect("the namespace");
    assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    for (kind, key) in [
        (Kind::StatefulSets, "knitter/knitter-manager"),
        (Kind::Deployments, "knitter/knitter-manager"),
        (Kind::DaemonSets, "knitter/knitter-node"),
        (Kind::Secrets, "knitter/knitter-token"),
        (Kind::Secrets, "knitter/knitter-etcd"),
        (Kind::Crds, "networks.knitter.io"),
        (Kind::PodMonitors, "knitter/knitter-node"),
    ] {
        assert!(walk.api.object(kind, key).is_some(), "{kind:?} {key} was not made");
    }

    // The manager the StatefulSet runs, with the manifests' flags, as its service account;
    // then a network of tenant red (as the example's comment says), so that the uninstall's
    // first step waits for the manager to let it go.
    let mut manager = walk.manager(&[]);
    tokio::task::block_in_place(|| {
        walk.sh("kubectl create namespace red && kubectl label namespace red knitter.io/tenant=red && kubectl apply -f deploy/kubernetes/examples/networks.yaml")
            .unwrap();
        walk.eventually("the manager makes the network's NAD and holds the network", |api| {
            api.object(Kind::Nads, "red/media").is_some()
                && api.object(Kind::Networks, "media").is_some_and(|n| {
                    n["metadata"]["finalizers"].to_string().contains("knitter.io/cleanup")
                })
        });
        walk.run(&uninstall);
    });
    assert!(manager.terminate(Duration::from_secs(10)), "the manager stops");
    let left = walk.left(&[CLUSTER_NAMESPACES, &["red"]].concat());
    assert!(left.is_empty(), "the uninstall left {left:?}");
}

/// "Knitter as the cluster's pod network": the standalone overlay and the pod network, with
/// its manager (`--network-status`, under the standalone overlay's RBAC), then uninstalled
/// with that overlay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_pod_network_installs_and_uninstalls() {
    let Some(kubectl) = kubectl_or_skip() else { return };
    let walk = Walk::new(cluster(Rbac::Standalone).await, &kubectl);
    let doc = doc();
    let (install, pod_network) =
        (blocks(&doc, &["Installing"]), blocks(&doc, &["Knitter as the cluster's pod network"]));
    assert_eq!(pod_network.len(), 1, "the docs' section moved");
    let mut manager = walk.manager(&["--network-status"]);
    tokio::task::block_in_place(|| {
        // The Secrets first, as "Installing on a cluster" makes them.
        walk.run(&install[..1]);
        walk.run(&pod_network);
        walk.eventually("the manager holds the pod network", |api| {
            api.object(Kind::Networks, "default").is_some_and(|n| {
                n["metadata"]["finalizers"].to_string().contains("knitter.io/cleanup")
                    && n["status"]["conditions"].to_string().contains("\"True\"")
            })
        });
        let out = walk.sh(
            "bash deploy/kubernetes/uninstall.sh --overlay deploy/kubernetes/overlays/standalone",
        );
        assert!(out.is_ok(), "{out:?}");
    });
    assert!(manager.terminate(Duration::from_secs(10)), "the manager stops");
    let left = walk.left(CLUSTER_NAMESPACES);
    assert!(left.is_empty(), "the uninstall left {left:?}");
}

/// `kubectl get -w` against the stand-in: what is made and deleted while it watches shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watches_what_changes() {
    let Some(kubectl) = kubectl_or_skip() else { return };
    let walk = Walk::new(cluster(Rbac::Base).await, &kubectl);
    let out = tokio::task::block_in_place(|| {
        walk.sh("kubectl get namespaces --watch-only -o name > watch.out & w=$!
             sleep 1
             kubectl create namespace watched && kubectl delete namespace watched
             sleep 1; kill $w; cat watch.out")
    });
    let out = out.expect("the watch ran");
    let seen = out.lines().filter(|l| *l == "namespace/watched").count();
    assert!(seen >= 2, "made and deleted, seen {seen} times: {out}");
}

/// "Network and IPGroup resources": the CRDs, a tenant's namespace, a Network and an IPGroup
/// written as the docs write them, made by the manager (NAD, `Ready`), and their Events
/// seen the way the docs look at them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_network_resources_are_made_and_seen() {
    let Some(kubectl) = kubectl_or_skip() else { return };
    let walk = Walk::new(cluster(Rbac::Base).await, &kubectl);
    walk.sh("kubectl create namespace knitter").unwrap();
    let blocks: Vec<Block> = blocks(&doc(), &["Network and IPGroup resources"])
        .into_iter()
        .filter(|b| b.language == "sh")
        .collect();
    assert_eq!(blocks.len(), 2, "the docs' section moved");
    let mut manager = walk.manager(&[]);
    tokio::task::block_in_place(|| {
        walk.run(&blocks[..1]);
        walk.eventually("the network and the group ready, with the NAD", |api| {
            let ready = |kind, name| {
                api.object(kind, name)
                    .is_some_and(|o| o["status"]["conditions"][0]["status"] == "True")
            };
            ready(Kind::Networks, "media")
                && ready(Kind::IpGroups, "media-sts")
                && api.object(Kind::Nads, "red-dev/media").is_some()
        });
        walk.eventually("the Network's Ready event", |api| {
            api.objects(Kind::Events).values().any(|e| e["involvedObject"]["name"] == "media")
        });
        // The CRD's printer columns, over the status the controller wrote.
        let listed = walk.sh("kubectl get knet").unwrap();
        let (header, row) = (listed.lines().next().unwrap_or_default(), listed.lines().nth(1));
        let cells: Vec<&str> = row.unwrap_or_default().split_whitespace().collect();
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>(),
            ["NAME", "KIND", "TENANT", "SEGMENT", "MTU", "READY", "REASON", "AGE"],
            "{listed}"
        );
        assert_eq!(cells[..6], ["media", "vxlan", "red", "7100", "1450", "True"], "{listed}");
        let events = walk.sh(&blocks[1].text).expect("the Events block runs");
        let shown = events.lines().skip_while(|l| !l.starts_with("Events:")).collect::<Vec<_>>();
        assert!(
            shown.iter().any(|l| l.contains("Normal") && l.contains("Ready")),
            "kubectl describe shows the Ready event: {events}"
        );
    });
    assert!(manager.terminate(Duration::from_secs(10)), "the manager stops");
}

/// "Several clusters" as an operator runs it: the manager's cluster installed, a member
/// cluster (a second stand-in, kubectl's context `east`) given the bootstrap token, the CA and
/// `overlays/member`, its kubeconfig written by `member-kubeconfig.sh` (the stand-in has no
/// token controller: the test fills the token Secret as one would), the `knitter-clusters`
/// Secret made; then the cluster added to the manager with the kubeconfig the script wrote,
/// whose controller takes its Lease in the member cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_member_cluster_joins_the_manager() {
    let Some(kubectl) = kubectl_or_skip() else { return };
    let member = cluster(Rbac::Base).await;
    let walk = Walk::new(cluster(Rbac::Base).await, &kubectl);
    // kubectl's contexts: the manager's cluster (current) and `east`.
    std::fs::write(
        walk.dir.path().join("admin.kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: home\n  cluster: {{server: \"{}\"}}\n- name: east\n  cluster: {{server: \"{}\"}}\nusers:\n- name: admin\n  user: {{}}\ncontexts:\n- name: home\n  context: {{cluster: home, user: admin}}\n- name: east\n  context: {{cluster: east, user: admin}}\ncurrent-context: home\n",
            walk.api.admin_url, member.admin_url
        ),
    )
    .unwrap();
    let doc = doc();
    let (install, clusters) = (blocks(&doc, &["Installing"]), blocks(&doc, &["Several clusters"]));
    // What the skipped `knitterctl manager cluster token east` writes (the test checks the
    // token itself in tests/clusters.rs and cni/tests/clusters.rs).
    let token = format!("cluster.{}.{}", "65617374", "ab".repeat(32));
    std::fs::write(walk.dir.path().join("east-bootstrap-token"), &token).unwrap();
    assert_eq!(clusters.len(), 3, "the docs' section moved");
    // The token controller's part: the member's service-account token Secret filled.
    let filled = std::sync::atomic::AtomicBool::new(false);
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let deadline = Instant::now() + Duration::from_secs(240);
                while Instant::now() < deadline && !filled.load(std::sync::atomic::Ordering::SeqCst)
                {
                    if member.object(Kind::Secrets, "knitter/knitter-manager-token").is_some() {
                        member.edit(Kind::Secrets, "knitter/knitter-manager-token", |v| {
                            v["data"] = serde_json::json!({"token": "c2VjcmV0", "ca.crt": "Q0E="});
                        });
                        filled.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            walk.run(&install[..1]);
            walk.run(&clusters);
            filled.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    });
    // What the managers' pods find at /etc/knitter/clusters/east: the Secret's key.
    let mounted = tokio::task::block_in_place(|| {
        walk.sh("mkdir -p mounted && kubectl -n knitter get secret knitter-clusters -o jsonpath='{.data.east}' | base64 -d > mounted/east")
    });
    assert!(mounted.is_ok(), "{mounted:?}");
    assert!(!walk.dir.path().join("east.kubeconfig").exists(), "the docs remove the file");
    let kubeconfig = std::fs::read_to_string(walk.dir.path().join("mounted/east")).unwrap();
    for want in [member.admin_url.as_str(), "token: secret", "certificate-authority-data: Q0E="] {
        assert!(kubeconfig.contains(want), "{want} in {kubeconfig}");
    }
    let bootstrap = member.object(Kind::Secrets, "knitter/knitter-bootstrap").expect("a token");
    assert!(bootstrap.to_string().contains("token"), "{bootstrap}");
    assert!(!walk.dir.path().join("east-bootstrap-token").exists(), "the docs remove the file");
    let node = member.object(Kind::DaemonSets, "knitter/knitter-node").expect("the node agent");
    assert!(node.to_string().contains("--cluster=east"), "{node}");
    assert!(member.object(Kind::Services, "knitter/knitter-manager").is_none(), "no manager there");
    assert!(walk.api.object(Kind::Secrets, "knitter/knitter-clusters").is_some());
    assert!(walk.api.object(Kind::KnitterClusters, "east").is_some(), "the Cluster resource");

    // The managers then add the cluster from its resource, reading the file the Secret
    // holds (here: its content, as mounted).
    let mounted = walk.dir.path().join("mounted");
    let mut manager = walk.manager(&["--cluster-kubeconfigs", mounted.to_str().unwrap()]);
    walk.eventually("the resource made a cluster of the manager's", |api| {
        api.object(Kind::KnitterClusters, "east").is_some_and(|c| {
            c["status"]["conditions"][0]["reason"] == "Created" && c["status"]["id"].is_string()
        })
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while member.lease_holder("knitter", "knitter-manager").as_deref() != Some("knitter-manager-0")
    {
        assert!(Instant::now() < deadline, "the member's Lease not taken within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(manager.terminate(Duration::from_secs(15)), "the manager stops");
}

//! knitter-cni: the CNI plugin. A thin client of the node's attach API
//! (`knitter.node.v1.Attach` on knitter-vswitchd's socket): it reads what the runtime
//! gives (environment, configuration), asks the node, and answers in the configuration's
//! CNI version. `spec.rs` holds the protocol; this file the verbs.

pub mod spec;

use knitter_api::node as pb;
use pb::attach_client::AttachClient;
use serde_json::Value;
use spec::{AddResult, CniError, Code, Command, Env, Interface, IpResult, NetConf, RouteResult};
use tonic::transport::Channel;

/// What a successful call prints (nothing for DEL, CHECK, GC, STATUS).
pub type Output = Option<Value>;

/// Runs one CNI call; the error comes with the version to answer in.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Output, (CniError, String)> {
    if env.command == Command::Version {
        let asked = serde_json::from_slice::<Value>(stdin).ok().and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string));
        return Ok(Some(spec::version_result(asked.as_deref())));
    }
    let conf = NetConf::parse(stdin).map_err(|e| (e, version_in(stdin)))?;
    let version = conf.cni_version.clone();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| (CniError::new(Code::Io, e.to_string()), version.clone()))?;
    rt.block_on(call(env, &conf)).map_err(|e| (e, version))
}

/// The version a configuration asks for, if it can be read at all (for error results).
fn version_in(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string))
        .filter(|v| spec::SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| "1.1.0".into())
}

fn needs(conf: &NetConf, verb: &str, min: &str) -> Result<(), CniError> {
    if spec::older(&conf.cni_version, min) {
        return Err(CniError::new(Code::IncompatibleVersion, format!("{verb} needs cniVersion {min} or later; the configuration says {}", conf.cni_version)));
    }
    Ok(())
}

fn socket(conf: &NetConf) -> String {
    conf.socket.clone().unwrap_or_else(|| knitter_api::DEFAULT_NODE_SOCKET.into())
}

/// A node's refusal or absence as a CNI error.
fn node_error(socket: &str, s: tonic::Status) -> CniError {
    use tonic::Code as G;
    let transport = s.code() == G::Unavailable && s.message().contains("transport");
    match s.code() {
        _ if transport => CniError::new(Code::TryAgainLater, format!("cannot reach knitter-vswitchd at {socket}: is it running?")).details(s.message().to_string()),
        G::Unavailable | G::DeadlineExceeded => CniError::new(Code::TryAgainLater, s.message().to_string()),
        G::InvalidArgument | G::NotFound => CniError::new(Code::InvalidConfig, s.message().to_string()),
        _ => CniError::new(Code::Refused, s.message().to_string()),
    }
}

async fn call(env: &Env, conf: &NetConf) -> Result<Output, CniError> {
    let sock = socket(conf);
    let mut node = AttachClient::new(knitter_api::unix_channel(std::path::Path::new(&sock)));
    match env.command {
        Command::Add => add(env, conf, &mut node).await.map(Some).map_err(|s| node_error(&sock, s)),
        Command::Del => {
            let req = pb::DetachRequest { container_id: env.container_id.clone(), ifname: env.ifname.clone() };
            node.detach_interface(req).await.map_err(|s| node_error(&sock, s))?;
            Ok(None)
        }
        Command::Check => {
            needs(conf, "CHECK", "0.4.0")?;
            let req = pb::QueryPodRequest { container_id: env.container_id.clone(), ifname: env.ifname.clone(), verify: true };
            let found = node.query_pod_network(req).await.map_err(|s| node_error(&sock, s))?.into_inner().attachments;
            let Some(a) = found.first() else {
                return Err(CniError::new(Code::CheckFailed, format!("no attachment of {} for container {}", env.ifname, env.container_id)));
            };
            if !a.problems.is_empty() {
                return Err(CniError::new(Code::CheckFailed, format!("{} of container {}: {}", env.ifname, env.container_id, a.problems.join("; "))));
            }
            Ok(None)
        }
        Command::Gc => {
            needs(conf, "GC", "1.1.0")?;
            let valid = conf.valid_attachments.iter().map(|v| pb::AttachmentKey { container_id: v.container_id.clone(), ifname: v.ifname.clone() }).collect();
            node.garbage_collect(pb::GcRequest { cni_network: conf.name.clone(), valid }).await.map_err(|s| node_error(&sock, s))?;
            Ok(None)
        }
        Command::Status => {
            needs(conf, "STATUS", "1.1.0")?;
            let s = match node.status(pb::AttachStatusRequest {}).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    let why = format!("knitter-vswitchd at {sock} is unreachable: existing pods have no data path");
                    return Err(CniError::new(Code::NotAvailableLimitedConnectivity, why).details(e.message().to_string()));
                }
            };
            if !s.switch_running {
                return Err(CniError::new(Code::NotAvailableLimitedConnectivity, s.reason));
            }
            if !s.manager_reachable {
                return Err(CniError::new(Code::NotAvailable, s.reason));
            }
            Ok(None)
        }
        Command::Version => Ok(Some(spec::version_result(Some(&conf.cni_version)))),
    }
}

/// Addresses asked for by `runtimeConfig`, `args.cni` or `CNI_ARGS IP=` (with or without a
/// prefix), and a MAC the same ways.
fn requested(env: &Env, conf: &NetConf) -> (Vec<String>, Option<String>) {
    let from_args = env.args.get("IP").map(|s| s.split(',').map(str::to_string).collect::<Vec<_>>()).unwrap_or_default();
    let ips = conf.runtime_config.ips.iter().chain(&conf.args.cni.ips).chain(&from_args).map(|ip| ip.split('/').next().unwrap_or("").to_string()).filter(|ip| !ip.is_empty()).collect();
    let mac = conf.runtime_config.mac.clone().or_else(|| conf.args.cni.mac.clone()).or_else(|| env.args.get("MAC").cloned());
    (ips, mac)
}

async fn add(env: &Env, conf: &NetConf, node: &mut AttachClient<Channel>) -> Result<Value, tonic::Status> {
    let (ips, mac) = requested(env, conf);
    let req = pb::AttachRequest {
        container_id: env.container_id.clone(),
        ifname: env.ifname.clone(),
        netns: env.netns.clone(),
        pod_namespace: env.args.get("K8S_POD_NAMESPACE").cloned().unwrap_or_default(),
        pod_name: env.args.get("K8S_POD_NAME").cloned().unwrap_or_default(),
        network: conf.network().to_string(),
        cni_network: conf.name.clone(),
        ips,
        mac,
        ip_group: conf.ip_group.clone().or_else(|| env.args.get("IP_GROUP").cloned()),
        default_route: conf.default_route.unwrap_or(env.ifname == "eth0"),
    };
    let a = node.attach_interface(req).await?.into_inner();
    let result = AddResult {
        interfaces: vec![
            Interface { name: a.host_ifname.clone(), mac: String::new(), mtu: a.mtu, sandbox: String::new(), socket_path: String::new() },
            Interface { name: a.ifname.clone(), mac: a.mac.clone(), mtu: a.mtu, sandbox: a.netns.clone(), socket_path: String::new() },
        ],
        ips: a.ips.iter().map(|ip| IpResult { address: ip.address.clone(), gateway: ip.gateway.clone(), interface: 1 }).collect(),
        routes: a.routes.iter().map(|r| RouteResult { dst: r.dst.clone(), gw: r.gateway.clone() }).collect(),
    };
    Ok(result.to_json(&conf.cni_version))
}

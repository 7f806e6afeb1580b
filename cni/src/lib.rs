//! knitter-cni: the CNI plugin. A thin client of the node's attach API
//! (`knitter.node.v1.Attach` on knitter-vswitchd's socket): it reads what the runtime
//! gives (environment, configuration), asks the node, and answers in the configuration's
//! CNI version. `spec.rs` holds the protocol, `planes.rs` the networks a pod asks for;
//! this file the verbs.

#![forbid(unsafe_code)]

pub mod planes;
pub mod spec;

use knitter_api::node as pb;
use pb::attach_client::AttachClient;
use planes::Plane;
use serde_json::Value;
use spec::{
    AddResult, CniError, Code, Command, Env, Interface, InterfaceType, IpResult, NetConf,
    RouteResult,
};
use tonic::transport::Channel;

/// What a successful call prints (nothing for DEL, CHECK, GC, STATUS).
pub type Output = Option<Value>;

/// Runs one CNI call; the error comes with the version to answer in.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Output, (CniError, String)> {
    if env.command == Command::Version {
        let asked = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string));
        return Ok(Some(spec::version_result(asked.as_deref())));
    }
    let conf = NetConf::parse(stdin).map_err(|e| (e, version_in(stdin)))?;
    let version = conf.cni_version.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (CniError::new(Code::Io, e.to_string()), version.clone()))?;
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
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!(
                "{verb} needs cniVersion {min} or later; the configuration says {}",
                conf.cni_version
            ),
        ));
    }
    Ok(())
}

fn socket(conf: &NetConf) -> String {
    conf.socket.clone().unwrap_or_else(|| knitter_api::DEFAULT_NODE_SOCKET.into())
}

/// A node's refusal or absence as a CNI error. A status the client made itself (it carries
/// the connection's error as its source: no socket file, nobody listening, a socket that is
/// not the daemon's) says where it looked and what to check; one the daemon sent is its
/// reason, as it is.
fn node_error(socket: &str, s: tonic::Status) -> CniError {
    use tonic::Code as G;
    let transport = std::error::Error::source(&s).is_some()
        || (s.code() == G::Unavailable && s.message().contains("transport"));
    match s.code() {
        _ if transport => CniError::new(
            Code::TryAgainLater,
            format!("cannot reach knitter-vswitchd at {socket}: is it running?"),
        )
        .details(s.message().to_string()),
        G::Unavailable | G::DeadlineExceeded => {
            CniError::new(Code::TryAgainLater, s.message().to_string())
        }
        G::InvalidArgument | G::NotFound => {
            CniError::new(Code::InvalidConfig, s.message().to_string())
        }
        _ => CniError::new(Code::Refused, s.message().to_string()),
    }
}

async fn call(env: &Env, conf: &NetConf) -> Result<Output, CniError> {
    let sock = socket(conf);
    let mut node = AttachClient::new(knitter_api::unix_channel(std::path::Path::new(&sock)));
    match env.command {
        Command::Add => add(env, conf, &mut node, &sock).await.map(Some),
        Command::Del => {
            let req = pb::DetachRequest {
                container_id: env.container_id.clone(),
                ifname: scope(env, conf),
            };
            node.detach_interface(req).await.map_err(|s| node_error(&sock, s))?;
            if let Some(f) = &conf.runtime_config.device_info_file {
                let _ = std::fs::remove_file(f);
            }
            Ok(None)
        }
        Command::Check => {
            needs(conf, "CHECK", "0.4.0")?;
            let req = pb::QueryPodRequest {
                container_id: env.container_id.clone(),
                ifname: scope(env, conf),
                verify: true,
            };
            let found = node
                .query_pod_network(req)
                .await
                .map_err(|s| node_error(&sock, s))?
                .into_inner()
                .attachments;
            if !found.iter().any(|a| a.ifname == env.ifname) {
                return Err(CniError::new(
                    Code::CheckFailed,
                    format!("no attachment of {} for container {}", env.ifname, env.container_id),
                ));
            }
            let problems: Vec<String> = found
                .iter()
                .filter(|a| !a.problems.is_empty())
                .map(|a| format!("{}: {}", a.ifname, a.problems.join("; ")))
                .collect();
            if !problems.is_empty() {
                return Err(CniError::new(
                    Code::CheckFailed,
                    format!("container {}: {}", env.container_id, problems.join("; ")),
                ));
            }
            Ok(None)
        }
        Command::Gc => {
            needs(conf, "GC", "1.1.0")?;
            let valid = conf
                .valid_attachments
                .iter()
                .map(|v| pb::AttachmentKey {
                    container_id: v.container_id.clone(),
                    ifname: v.ifname.clone(),
                })
                .collect();
            node.garbage_collect(pb::GcRequest { cni_network: conf.name.clone(), valid })
                .await
                .map_err(|s| node_error(&sock, s))?;
            Ok(None)
        }
        Command::Status => {
            needs(conf, "STATUS", "1.1.0")?;
            let s = match node.status(pb::AttachStatusRequest {}).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    let why = format!(
                        "knitter-vswitchd at {sock} is unreachable: existing pods have no data path"
                    );
                    return Err(CniError::new(Code::NotAvailableLimitedConnectivity, why)
                        .details(e.message().to_string()));
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

/// The interfaces a DEL or CHECK covers: the call's own, or in standalone mode every
/// interface of the container (one ADD made them all).
fn scope(env: &Env, conf: &NetConf) -> String {
    if conf.standalone { String::new() } else { env.ifname.clone() }
}

/// The call's own interface: its network, and addresses, MAC, IP group and type asked for
/// by `runtimeConfig`, `args.cni` or `CNI_ARGS` (`IP=` with or without a prefix, `MAC=`,
/// `IP_GROUP=`).
fn own_plane(env: &Env, conf: &NetConf) -> Plane {
    let (rc, cni) = (&conf.runtime_config, &conf.args.cni);
    let kind = cni.interface_type.unwrap_or(conf.interface_type);
    let from_args = env
        .args
        .get("IP")
        .map(|s| s.split(',').map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    Plane {
        network: conf.network().to_string(),
        ifname: env.ifname.clone(),
        ips: rc
            .ips
            .iter()
            .chain(&cni.ips)
            .chain(&from_args)
            .map(|ip| ip.split('/').next().unwrap_or("").to_string())
            .filter(|ip| !ip.is_empty())
            .collect(),
        mac: rc.mac.clone().or_else(|| cni.mac.clone()).or_else(|| env.args.get("MAC").cloned()),
        ip_group: cni
            .ip_group
            .clone()
            .or_else(|| conf.ip_group.clone())
            .or_else(|| env.args.get("IP_GROUP").cloned()),
        vhost: kind == InterfaceType::VhostUser,
        sriov: kind == InterfaceType::Sriov,
        // The device plugin's VF wins over one the pod names in its cni-args.
        device_id: plugin_device(conf).or_else(|| cni.device_id.clone()),
        device_by_plugin: plugin_device(conf).is_some(),
        default_route: conf.default_route.unwrap_or(env.ifname == "eth0"),
    }
}

/// The VF the device plugin allocated for the call's interface: `runtimeConfig.deviceID`, or
/// the `deviceID` Multus sets in the configuration (the NAD's `resourceName`).
fn plugin_device(conf: &NetConf) -> Option<String> {
    conf.runtime_config.device_id.clone().or_else(|| conf.device_id.clone())
}

/// Every interface this ADD makes, the call's own first. Standalone, the pod's further
/// planes come from `args.cni.networks`, `CNI_ARGS` `NETWORKS=` or its annotations; a plane
/// naming the call's own interface (Knitter's form lists eth0 too) defines it.
fn wanted(env: &Env, conf: &NetConf) -> Result<Vec<Plane>, CniError> {
    let mut own = own_plane(env, conf);
    if !conf.standalone {
        return Ok(vec![own]);
    }
    let extra = match (&conf.args.cni.networks, env.args.get("NETWORKS")) {
        (Some(v), _) => planes::from_value(v)?,
        (None, Some(s)) => planes::multus(s, "CNI_ARGS NETWORKS")?,
        (None, None) => planes::from_annotations(&conf.runtime_config.pod_annotations)?,
    };
    let mut all = Vec::with_capacity(extra.len() + 1);
    for p in extra {
        if p.ifname == own.ifname {
            let plugin = own.device_by_plugin.then(|| own.device_id.clone()).flatten();
            own = Plane { default_route: own.default_route, ..p };
            if let Some(d) = plugin {
                (own.device_id, own.device_by_plugin) = (Some(d), true);
            }
        } else {
            all.push(p);
        }
    }
    // A pod that asks for its default route on another plane (Multus's `default-route`)
    // gets it there, and only there: the call's own interface gives its default up, whatever
    // the configuration's `defaultRoute` said (the pod's request is the more specific).
    let asked: Vec<&str> =
        all.iter().filter(|p| p.default_route).map(|p| p.ifname.as_str()).collect();
    if asked.len() > 1 {
        return Err(CniError::new(
            Code::InvalidConfig,
            format!(
                "default-route is asked for on {}: one interface carries it",
                asked.join(" and ")
            ),
        ));
    }
    if !asked.is_empty() {
        own.default_route = false;
    }
    all.insert(0, own);
    planes::check_names(all.iter().map(|p| p.ifname.as_str()))?;
    Ok(all)
}

fn request(env: &Env, conf: &NetConf, p: &Plane) -> Result<pb::AttachRequest, CniError> {
    let vhost = conf.vhost_user.clone();
    Ok(pb::AttachRequest {
        container_id: env.container_id.clone(),
        ifname: p.ifname.clone(),
        netns: env.netns.clone(),
        pod_namespace: env.args.get("K8S_POD_NAMESPACE").cloned().unwrap_or_default(),
        pod_name: env.args.get("K8S_POD_NAME").cloned().unwrap_or_default(),
        pod_uid: env.args.get("K8S_POD_UID").cloned().unwrap_or_default(),
        network: p.network.clone(),
        cni_network: conf.name.clone(),
        ips: p.ips.clone(),
        mac: p.mac.clone(),
        ip_group: p.ip_group.clone(),
        default_route: p.default_route,
        vhost_user: match p.vhost {
            false => None,
            true => {
                // The pod's own volume in Kubernetes, unless the network names a shared
                // directory.
                let uid = env.args.get("K8S_POD_UID").filter(|u| !u.is_empty());
                let pod_volume = match (&vhost.dir, uid) {
                    (None, Some(_)) => {
                        vhost.volume.clone().unwrap_or_else(|| spec::DEFAULT_VHOST_VOLUME.into())
                    }
                    _ => String::new(),
                };
                Some(pb::VhostUserHandoff {
                    dir: vhost.dir.unwrap_or_default(),
                    switch_listens: vhost.switch_listens,
                    mode: conf.vhost_mode()?,
                    owner: vhost.owner,
                    group: vhost.group,
                    pod_volume,
                    mount_path: vhost.mount_path.unwrap_or_default(),
                })
            }
        },
        sriov: (p.sriov || (p.device_id.is_some() && !p.vhost)).then(|| pb::SriovRequest {
            device_id: p.device_id.clone().unwrap_or_default(),
            chosen_by_pod: p.device_id.is_some() && !p.device_by_plugin,
        }),
    })
}

/// Attaches every wanted interface; a failure undoes the ones this call made.
async fn add(
    env: &Env,
    conf: &NetConf,
    node: &mut AttachClient<Channel>,
    sock: &str,
) -> Result<Value, CniError> {
    let wanted = wanted(env, conf)?;
    let mut made: Vec<pb::Attachment> = Vec::with_capacity(wanted.len());
    for p in &wanted {
        match node.attach_interface(request(env, conf, p)?).await {
            Ok(a) => made.push(a.into_inner()),
            Err(s) => {
                for a in &made {
                    let _ = node
                        .detach_interface(pb::DetachRequest {
                            container_id: a.container_id.clone(),
                            ifname: a.ifname.clone(),
                        })
                        .await;
                }
                let e = node_error(sock, s);
                return Err(if wanted.len() > 1 {
                    CniError {
                        msg: format!("{} (network {}): {}", p.ifname, p.network, e.msg),
                        ..e
                    }
                } else {
                    e
                });
            }
        }
    }
    if let (Some(file), Some(own)) = (&conf.runtime_config.device_info_file, made.first())
        && (!own.socket_path.is_empty() || !own.pci_id.is_empty())
    {
        write_device_info(file, own).map_err(|e| {
            CniError::new(Code::Io, format!("writing the device-info file {file}: {e}"))
        })?;
    }
    Ok(result(&made).to_json(&conf.cni_version))
}

/// The result of the attachments: a veth adds its node end and its pod end, a vhost-user
/// interface one entry with its socket, an SR-IOV VF one with its PCI address; each address
/// names its interface.
fn result(made: &[pb::Attachment]) -> AddResult {
    let mut r = AddResult::default();
    for a in made {
        if a.socket_path.is_empty() && a.pci_id.is_empty() {
            r.interfaces.push(Interface {
                name: a.host_ifname.clone(),
                mac: String::new(),
                mtu: a.mtu,
                sandbox: String::new(),
                socket_path: String::new(),
                pci_id: String::new(),
            });
        }
        r.interfaces.push(Interface {
            name: a.ifname.clone(),
            mac: a.mac.clone(),
            mtu: a.mtu,
            sandbox: a.netns.clone(),
            socket_path: a.socket_path.clone(),
            pci_id: a.pci_id.clone(),
        });
        let index = r.interfaces.len() - 1;
        r.ips.extend(a.ips.iter().map(|ip| IpResult {
            address: ip.address.clone(),
            gateway: ip.gateway.clone(),
            interface: index,
        }));
        r.routes.extend(
            a.routes.iter().map(|rt| RouteResult { dst: rt.dst.clone(), gw: rt.gateway.clone() }),
        );
    }
    r
}

/// The NPWG device-info file Multus reads (`CNIDeviceInfoFile`): the socket and the role
/// the pod's app plays on it, or the VF's PCI address and its PF's.
fn write_device_info(file: &str, a: &pb::Attachment) -> std::io::Result<()> {
    let info = match a.pci_id.as_str() {
        "" => knitter_api::device_info::vhost_user(&a.socket_path, a.switch_listens),
        pci => knitter_api::device_info::pci(pci, &a.pf_pci),
    };
    let path = std::path::Path::new(file);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_vec(&info).map_err(std::io::Error::other)?)
}

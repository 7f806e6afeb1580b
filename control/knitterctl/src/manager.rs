//! `knitterctl manager ...`: the manager's objects (tenants, networks, IP groups, ports,
//! nodes) over its gRPC API, as tables or `-o json|yaml` (tenants, networks and IP groups
//! as documents `manager apply -f` takes back: manifest.rs).

use crate::Output;
use crate::manifest;
use crate::out::{opt, structured, table};
use crate::target::{Target, authed};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use knitter_api::manager as pb;
use pb::manager_client::ManagerClient;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub enum ManagerCmd {
    /// Tenants and their quotas.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
    },
    /// Networks (one subnet per family on one VXLAN or VLAN segment).
    Network {
        #[command(subcommand)]
        cmd: NetworkCmd,
    },
    /// IP groups: named sets of a network's addresses that stick to their pods.
    Ipgroup {
        #[command(subcommand)]
        cmd: GroupCmd,
    },
    /// Ports: a container interface's addresses and MAC.
    Port {
        #[command(subcommand)]
        cmd: PortCmd,
    },
    /// Nodes and their liveness.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// Kubernetes clusters the manager serves besides its own ("local"): each gets its own
    /// controller (watches, Lease); its nodes register with `knitter-vswitchd --cluster`.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// The manager's Kubernetes controller: leader or standby, lists taken, what it released.
    Status,
    /// Apply a document of tenants, networks and IP groups (what `manager tenant|network|
    /// ipgroup list|show -o yaml|json` prints): create what is missing, change a tenant's
    /// quota and namespaces; a network or IP group defined otherwise is refused (delete it
    /// to change it). Nothing is deleted.
    #[command(after_help = APPLY_EXAMPLES)]
    Apply(crate::node::Source),
    /// Whether the manager serves (needs no token: probes, health checks).
    Health,
}

const APPLY_EXAMPLES: &str = "Examples:
  knitterctl manager network list -o yaml > networks.yaml
  knitterctl manager apply -f networks.yaml             # on another manager: the same networks
  knitterctl manager tenant show red -o yaml | sed 's/networks: 4/networks: 8/' | knitterctl manager apply -f -";

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    List,
    Show {
        name: String,
    },
    Create {
        name: String,
        /// Networks the tenant may own (default: the manager's).
        #[arg(long)]
        quota: Option<u32>,
        /// Namespaces that belong to the tenant without a knitter.io/tenant label (comma
        /// separated).
        #[arg(long, value_delimiter = ',')]
        namespaces: Vec<String>,
    },
    Delete {
        name: String,
    },
    /// Set how many networks the tenant may own.
    Quota {
        name: String,
        networks: u32,
    },
    /// Set the namespaces that belong to the tenant without a label (none: clears them).
    Namespaces {
        name: String,
        namespaces: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NetworkCmd {
    List {
        /// The tenant's networks and the shared ones.
        #[arg(long)]
        tenant: Option<String>,
        /// vxlan or vlan.
        #[arg(long)]
        kind: Option<String>,
    },
    Show {
        name: String,
    },
    Create(Box<NetworkCreate>),
    Delete {
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct NetworkCreate {
    name: String,
    #[arg(long, default_value = "admin")]
    tenant: String,
    /// vxlan or vlan.
    #[arg(long, default_value = "vxlan")]
    kind: String,
    /// std, control, media, eio or oam.
    #[arg(long)]
    plane: Option<String>,
    /// VNI or VLAN ID (default: the first free one).
    #[arg(long)]
    segment: Option<u32>,
    /// IPv4 subnet, e.g. 10.10.0.0/24.
    #[arg(long)]
    ipv4: Option<String>,
    #[arg(long)]
    gateway4: Option<String>,
    /// Allocation pool FIRST-LAST (repeatable).
    #[arg(long)]
    pool4: Vec<String>,
    /// IPv6 subnet, e.g. fd00:10::/64.
    #[arg(long)]
    ipv6: Option<String>,
    #[arg(long)]
    gateway6: Option<String>,
    #[arg(long)]
    pool6: Vec<String>,
    /// Default: the smallest node underlay MTU minus the encapsulation.
    #[arg(long)]
    mtu: Option<u32>,
    /// Usable by every tenant.
    #[arg(long)]
    shared: bool,
    /// Ingress policing of every pod port of the network: packets a second.
    #[arg(long, value_name = "PPS")]
    pod_pps: Option<u64>,
    /// Ingress policing of every pod port of the network: bits a second (frames as received).
    #[arg(long, value_name = "BPS")]
    pod_bps: Option<u64>,
    /// The node SR-IOV pool (`[sriov.pools]`) whose VFs back the network's VF pods when no
    /// device plugin names one (VLAN networks).
    #[arg(long, value_name = "POOL")]
    sriov_pool: Option<String>,
    /// Let a pod name its own VF (deviceID in its cni-args): one of the pool's that is free
    /// (VLAN networks; without it the device plugin or the node chooses).
    #[arg(long)]
    pod_chooses_vf: bool,
    /// Every node with pods on the network is their gateway (--gateway4/--gateway6) and
    /// gives the network a host port into its own stack: pods reach their node, its
    /// Services and, with --masquerade, beyond (docs/pod-network.md).
    #[arg(long)]
    node_gateway: bool,
    /// Pods' traffic for anything but the pod networks leaves their node with its address.
    #[arg(long, requires = "node_gateway")]
    masquerade: bool,
    /// Only these clusters' nodes may attach pods to it (comma separated; "local" is the
    /// manager's own; default: every cluster's).
    #[arg(long, value_delimiter = ',')]
    clusters: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum GroupCmd {
    List {
        #[arg(long)]
        network: Option<String>,
    },
    Show {
        network: String,
        name: String,
    },
    Create {
        network: String,
        name: String,
        /// The members (comma-separated addresses).
        #[arg(long, value_delimiter = ',', conflicts_with = "size")]
        members: Vec<String>,
        /// Or take this many free addresses.
        #[arg(long)]
        size: Option<u32>,
        /// Seconds a released member stays reserved for its pod (default 300).
        #[arg(long)]
        grace: Option<u64>,
    },
    Delete {
        network: String,
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PortCmd {
    List {
        #[arg(long)]
        network: Option<String>,
        #[arg(long)]
        node: Option<String>,
        /// namespace/name
        #[arg(long)]
        pod: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
    },
    Show {
        container: String,
        interface: String,
    },
    Create {
        #[arg(long)]
        network: String,
        #[arg(long)]
        container: String,
        #[arg(long, default_value = "eth0")]
        interface: String,
        /// namespace/name
        #[arg(long, default_value = "")]
        pod: String,
        #[arg(long, default_value = "")]
        node: String,
        /// A fixed address (one per family; repeatable).
        #[arg(long)]
        ip: Vec<String>,
        #[arg(long)]
        ip_group: Option<String>,
        /// A MAC of its own instead of the one derived from its address.
        #[arg(long)]
        mac: Option<String>,
    },
    Delete {
        container: String,
        interface: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    List,
    Show {
        name: String,
    },
    /// Register a node by hand (nodes register themselves through their sync stream).
    Register {
        name: String,
        #[arg(long)]
        vtep: String,
        #[arg(long)]
        underlay_mtu: Option<u32>,
        /// The cluster the node is in (default: the manager's own).
        #[arg(long)]
        cluster: Option<String>,
    },
    Delete {
        name: String,
    },
    /// Issue a node its own token (a new one, revoking the old): for a node that lost its
    /// credential, or nodes set up by hand instead of with the bootstrap token.
    Token {
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    List,
    Show {
        name: String,
    },
    /// Add a cluster: its controller starts at once with the kubeconfig (a file the
    /// manager reads; in Kubernetes, a Secret mounted into the manager's pod).
    Add {
        name: String,
        #[arg(long)]
        kubeconfig: String,
    },
    /// A new bootstrap token for the cluster's nodes (the old one revoked): a node joining
    /// with it is bound to the cluster (its knitter-bootstrap Secret).
    Token {
        name: String,
    },
    /// Delete a cluster. Refused while it has nodes or ports, unless --release: its ports
    /// are released (addresses given back) and its nodes forgotten.
    Delete {
        name: String,
        #[arg(long)]
        release: bool,
    },
}

fn pool(s: &str) -> Result<pb::Pool> {
    let (start, end) =
        s.split_once('-').with_context(|| format!("pool {s:?} is not FIRST-LAST"))?;
    Ok(pb::Pool { start: start.trim().into(), end: end.trim().into() })
}

fn subnet(
    cidr: Option<String>,
    gateway: Option<String>,
    pools: &[String],
) -> Result<Option<pb::SubnetSpec>> {
    let Some(cidr) = cidr else {
        if gateway.is_some() || !pools.is_empty() {
            bail!("a gateway or pool needs its subnet (--ipv4 / --ipv6)");
        }
        return Ok(None);
    };
    Ok(Some(pb::SubnetSpec {
        cidr,
        gateway,
        pools: pools.iter().map(|p| pool(p)).collect::<Result<_>>()?,
    }))
}

fn print_networks(items: &[pb::Network]) {
    let family = |s: &Option<pb::SubnetSpec>| {
        s.as_ref().map(|s| {
            format!(
                "{}{}",
                s.cidr,
                s.gateway.as_ref().map_or(String::new(), |g| format!(" gw {g}"))
            )
        })
    };
    table(
        &["name", "tenant", "kind", "segment", "plane", "ipv4", "ipv6", "mtu", "shared"],
        items
            .iter()
            .map(|n| {
                vec![
                    n.name.clone(),
                    n.tenant.clone(),
                    n.kind.clone(),
                    opt(n.segment),
                    n.plane.clone().unwrap_or_else(|| "std".into()),
                    opt(family(&n.ipv4)),
                    opt(family(&n.ipv6)),
                    opt(n.mtu),
                    if n.shared { "yes".into() } else { "no".into() },
                ]
            })
            .collect(),
    );
}

fn print_ports(items: &[pb::Port]) {
    table(
        &["container", "interface", "network", "pod", "node", "addresses", "mac", "segment", "mtu"],
        items
            .iter()
            .map(|p| {
                let addrs: Vec<String> =
                    p.addresses.iter().map(|a| format!("{}/{}", a.address, a.prefix)).collect();
                let addrs =
                    if addrs.is_empty() { "(being created)".into() } else { addrs.join(",") };
                vec![
                    p.container.clone(),
                    p.interface.clone(),
                    p.network.clone(),
                    // Another cluster's pod is named with its cluster, as the manager tells
                    // pods apart.
                    if p.cluster.is_empty() {
                        p.pod.clone()
                    } else {
                        format!("{}/{}", p.cluster, p.pod)
                    },
                    p.node.clone(),
                    addrs,
                    p.mac.clone(),
                    p.segment.to_string(),
                    p.mtu.to_string(),
                ]
            })
            .collect(),
    );
}

fn print_groups(items: &[pb::IpGroup]) {
    table(
        &["network", "name", "members", "grace"],
        items
            .iter()
            .map(|g| {
                vec![
                    g.network.clone(),
                    g.name.clone(),
                    g.members.join(","),
                    format!("{}s", g.grace_secs),
                ]
            })
            .collect(),
    );
}

fn print_nodes(items: &[pb::Node]) {
    table(
        &["name", "cluster", "vtep", "underlay mtu", "state", "last seen"],
        items
            .iter()
            .map(|n| {
                let seen = if n.last_seen == 0 {
                    "-".into()
                } else {
                    format!("{}s ago", crate::unix_now().saturating_sub(n.last_seen))
                };
                let cluster = if n.cluster.is_empty() { "local" } else { n.cluster.as_str() };
                vec![
                    n.name.clone(),
                    cluster.into(),
                    n.vtep.clone(),
                    opt(n.underlay_mtu),
                    n.state.clone(),
                    seen,
                ]
            })
            .collect(),
    );
}

fn print_clusters(items: &[pb::Cluster]) {
    table(
        &["name", "id", "nodes", "ports", "controller", "pods", "watch errors", "kubeconfig"],
        items
            .iter()
            .map(|c| {
                let (state, pods, errors) = match (&c.controller, &c.error) {
                    (Some(k), _) => (
                        if k.leader { "leading" } else { "standby" }.to_string(),
                        k.pods.to_string(),
                        k.watch_errors.to_string(),
                    ),
                    (None, Some(e)) => (format!("not running: {e}"), "-".into(), "-".into()),
                    (None, None) => ("none".into(), "-".into(), "-".into()),
                };
                let id = if c.own { "(own)".to_string() } else { c.id.clone() };
                let kc = if c.kubeconfig.is_empty() { "-".into() } else { c.kubeconfig.clone() };
                vec![
                    c.name.clone(),
                    id,
                    c.nodes.to_string(),
                    c.ports.to_string(),
                    state,
                    pods,
                    errors,
                    kc,
                ]
            })
            .collect(),
    );
}

fn print_tenants(items: &[pb::Tenant]) {
    table(
        &["name", "network quota", "namespaces"],
        items
            .iter()
            .map(|t| vec![t.name.clone(), opt(t.quota.map(|q| q.networks)), t.namespaces.join(",")])
            .collect(),
    );
}

/// Prints the objects of `kind` as a document `manager apply -f` takes back, or as a table.
fn objects<T: serde::Serialize>(
    out: Output,
    kind: &str,
    items: Vec<T>,
    print: impl FnOnce(&[T]),
) -> Result<()> {
    if out != Output::Table {
        return manifest::print(out, kind, &items);
    }
    print(&items);
    Ok(())
}

/// Prints `v` as JSON, or as a table with `print`.
fn show<T: serde::Serialize>(out: Output, v: T, print: impl FnOnce(&T)) -> Result<()> {
    if out != Output::Table {
        return structured(out, &v);
    }
    print(&v);
    Ok(())
}

fn created(
    out: Output,
    what: &str,
    name: &str,
    new: bool,
    v: impl serde::Serialize,
    print: impl FnOnce(),
) -> Result<()> {
    if out != Output::Table {
        return structured(out, &v);
    }
    println!("{what} {name} {}", if new { "created" } else { "already there, unchanged" });
    print();
    Ok(())
}

fn list(
    tenant: Option<String>,
    network: Option<String>,
    node: Option<String>,
    pod: Option<String>,
    kind: Option<String>,
) -> pb::ListRequest {
    pb::ListRequest {
        tenant: tenant.unwrap_or_default(),
        network: network.unwrap_or_default(),
        node: node.unwrap_or_default(),
        pod: pod.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
    }
}

type Client = ManagerClient<Channel>;

pub async fn run(t: &Target, out: Output, cmd: ManagerCmd) -> Result<()> {
    let mut c = ManagerClient::new(t.channel()?);
    let none = || list(None, None, None, None, None);
    match cmd {
        ManagerCmd::Status => status(&mut c, t, out).await?,
        ManagerCmd::Tenant { cmd } => tenant(&mut c, t, out, cmd).await?,
        ManagerCmd::Network { cmd } => network(&mut c, t, out, cmd).await?,
        ManagerCmd::Ipgroup { cmd } => ipgroup(&mut c, t, out, cmd).await?,
        ManagerCmd::Port { cmd } => port(&mut c, t, out, cmd).await?,
        ManagerCmd::Node { cmd } => node(&mut c, t, out, cmd).await?,
        ManagerCmd::Cluster { cmd } => cluster(&mut c, t, out, cmd).await?,
        ManagerCmd::Apply(source) => {
            let (text, format) = source.read()?;
            manifest::apply(&mut c, t, out, manifest::Document::parse(&text, &format)?).await?
        }
        ManagerCmd::Health => show(out, c.health(authed(t, none())?).await?.into_inner(), |v| {
            println!("{} (store revision {})", v.status, v.revision)
        })?,
    }
    Ok(())
}

/// `manager status`: the Kubernetes controller's state.
async fn status(c: &mut Client, t: &Target, out: Output) -> Result<()> {
    let none = || list(None, None, None, None, None);
    show(out, c.get_kubernetes_status(authed(t, none())?).await?.into_inner(), |s| {
        let role = if s.leader { "leader (holds the Lease)" } else { "standby" };
        println!("kubernetes controller: {} as {:?}", role, s.identity);
        println!(
            "  pods {}, nodes {} in view; lists taken {}; watch errors {}",
            s.pods, s.nodes, s.relists, s.watch_errors
        );
        println!(
            "  released: {} ports, {} nodes; last reconcile {:.1} ms",
            s.released_ports,
            s.released_nodes,
            s.last_reconcile_micros as f64 / 1000.0
        );
        if s.events > 0 || s.events_failed > 0 {
            println!("  events: {} published, {} not", s.events, s.events_failed);
        }
        if s.writes_backing_off > 0 {
            println!(
                "  writes refused by the apiserver, backing off: {} (see the manager's log)",
                s.writes_backing_off
            );
        }
        if s.held_ports > 0 {
            println!(
                "  held: {} ports of pods not listed, on nodes the list showed no pod on (see the manager's log)",
                s.held_ports
            );
        }
        if s.network_resources > 0 || s.attachment_definitions > 0 {
            println!(
                "  Network resources {} ({} ready); NetworkAttachmentDefinitions {} (writes {})",
                s.network_resources,
                s.network_resources_ready,
                s.attachment_definitions,
                s.attachment_definition_writes
            );
        }
    })?;
    Ok(())
}

/// `manager tenant …`.
async fn tenant(c: &mut Client, t: &Target, out: Output, cmd: TenantCmd) -> Result<()> {
    let none = || list(None, None, None, None, None);
    match cmd {
        TenantCmd::List => objects(
            out,
            "tenants",
            c.list_tenants(authed(t, none())?).await?.into_inner().items,
            print_tenants,
        )?,
        TenantCmd::Show { name } => objects(
            out,
            "tenants",
            vec![c.get_tenant(authed(t, pb::Name { name })?).await?.into_inner()],
            print_tenants,
        )?,
        TenantCmd::Create { name, quota, namespaces } => {
            let r = c
                .create_tenant(authed(
                    t,
                    pb::TenantSpec {
                        name: name.clone(),
                        quota: quota.map(|networks| pb::Quota { networks }),
                        namespaces,
                    },
                )?)
                .await?
                .into_inner();
            created(out, "tenant", &name, r.created, &r, || print_tenants(r.tenant.as_slice()))?
        }
        TenantCmd::Delete { name } => show(
            out,
            c.delete_tenant(authed(t, pb::Name { name: name.clone() })?).await?.into_inner(),
            |_| println!("tenant {name} deleted"),
        )?,
        TenantCmd::Quota { name, networks } => {
            let r = c
                .set_quota(authed(
                    t,
                    pb::SetQuotaRequest { name, quota: Some(pb::Quota { networks }) },
                )?)
                .await?
                .into_inner();
            show(out, r, |v| print_tenants(std::slice::from_ref(v)))?
        }
        TenantCmd::Namespaces { name, namespaces } => {
            let r = c
                .set_namespaces(authed(t, pb::SetNamespacesRequest { name, namespaces })?)
                .await?
                .into_inner();
            show(out, r, |v| print_tenants(std::slice::from_ref(v)))?
        }
    }
    Ok(())
}

/// `manager network …`.
async fn network(c: &mut Client, t: &Target, out: Output, cmd: NetworkCmd) -> Result<()> {
    match cmd {
        NetworkCmd::List { tenant, kind } => objects(
            out,
            "networks",
            c.list_networks(authed(t, list(tenant, None, None, None, kind))?)
                .await?
                .into_inner()
                .items,
            print_networks,
        )?,
        NetworkCmd::Show { name } => objects(
            out,
            "networks",
            vec![c.get_network(authed(t, pb::Name { name })?).await?.into_inner()],
            print_networks,
        )?,
        NetworkCmd::Create(n) => {
            let spec = pb::Network {
                name: n.name.clone(),
                tenant: n.tenant,
                kind: n.kind,
                plane: n.plane,
                segment: n.segment,
                ipv4: subnet(n.ipv4, n.gateway4, &n.pool4)?,
                ipv6: subnet(n.ipv6, n.gateway6, &n.pool6)?,
                mtu: n.mtu,
                shared: n.shared,
                pod_policer: (n.pod_pps.is_some() || n.pod_bps.is_some()).then(|| pb::Policer {
                    pps: n.pod_pps.unwrap_or(0),
                    bps: n.pod_bps.unwrap_or(0),
                    ..Default::default()
                }),
                sriov_pool: n.sriov_pool,
                pod_chooses_vf: n.pod_chooses_vf,
                node_gateway: n.node_gateway,
                masquerade: n.masquerade,
                clusters: n.clusters,
            };
            let r = c.create_network(authed(t, spec)?).await?.into_inner();
            created(out, "network", &n.name, r.created, &r, || {
                print_networks(r.network.as_slice())
            })?
        }
        NetworkCmd::Delete { name } => show(
            out,
            c.delete_network(authed(t, pb::Name { name: name.clone() })?).await?.into_inner(),
            |_| println!("network {name} deleted"),
        )?,
    }
    Ok(())
}

/// `manager ipgroup …`.
async fn ipgroup(c: &mut Client, t: &Target, out: Output, cmd: GroupCmd) -> Result<()> {
    match cmd {
        GroupCmd::List { network } => objects(
            out,
            "ipgroups",
            c.list_ip_groups(authed(t, list(None, network, None, None, None))?)
                .await?
                .into_inner()
                .items,
            print_groups,
        )?,
        GroupCmd::Show { network, name } => objects(
            out,
            "ipgroups",
            vec![c.get_ip_group(authed(t, pb::GroupName { network, name })?).await?.into_inner()],
            print_groups,
        )?,
        GroupCmd::Create { network, name, members, size, grace } => {
            let r = c
                .create_ip_group(authed(
                    t,
                    pb::IpGroupSpec {
                        name: name.clone(),
                        network,
                        members,
                        size,
                        grace_secs: grace,
                    },
                )?)
                .await?
                .into_inner();
            created(out, "IP group", &name, r.created, &r, || print_groups(r.group.as_slice()))?
        }
        GroupCmd::Delete { network, name } => show(
            out,
            c.delete_ip_group(authed(t, pb::GroupName { network, name: name.clone() })?)
                .await?
                .into_inner(),
            |_| println!("IP group {name} deleted"),
        )?,
    }
    Ok(())
}

/// `manager port …`.
async fn port(c: &mut Client, t: &Target, out: Output, cmd: PortCmd) -> Result<()> {
    match cmd {
        PortCmd::List { network, node, pod, tenant } => show(
            out,
            c.list_ports(authed(t, list(tenant, network, node, pod, None))?)
                .await?
                .into_inner()
                .items,
            |v| print_ports(v),
        )?,
        PortCmd::Show { container, interface } => show(
            out,
            c.get_port(authed(t, pb::PortName { container, interface })?).await?.into_inner(),
            |v| print_ports(std::slice::from_ref(v)),
        )?,
        PortCmd::Create { network, container, interface, pod, node, ip, ip_group, mac } => {
            let id = format!("{container}/{interface}");
            let r = c
                .create_port(authed(
                    t,
                    pb::PortSpec {
                        network,
                        container,
                        interface,
                        pod,
                        node,
                        ips: ip,
                        ip_group,
                        requested_mac: mac,
                        pod_uid: String::new(),
                        device_info: None,
                    },
                )?)
                .await?
                .into_inner();
            created(out, "port", &id, r.created, &r, || print_ports(r.port.as_slice()))?
        }
        PortCmd::Delete { container, interface } => {
            let id = format!("{container}/{interface}");
            show(
                out,
                c.delete_port(authed(t, pb::PortName { container, interface })?)
                    .await?
                    .into_inner(),
                |_| println!("port {id} deleted"),
            )?
        }
    }
    Ok(())
}

/// `manager node …`.
async fn cluster(c: &mut Client, t: &Target, out: Output, cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::List => {
            let none = || list(None, None, None, None, None);
            show(out, c.list_clusters(authed(t, none())?).await?.into_inner().items, |v| {
                print_clusters(v)
            })?
        }
        ClusterCmd::Show { name } => {
            show(out, c.get_cluster(authed(t, pb::Name { name })?).await?.into_inner(), |v| {
                print_clusters(std::slice::from_ref(v))
            })?
        }
        ClusterCmd::Add { name, kubeconfig } => {
            let spec = pb::ClusterSpec { name: name.clone(), kubeconfig };
            let r = c.create_cluster(authed(t, spec)?).await?.into_inner();
            created(out, "cluster", &name, r.created, &r, || print_clusters(r.cluster.as_slice()))?
        }
        ClusterCmd::Token { name } => show(
            out,
            c.issue_cluster_token(authed(t, pb::Name { name })?).await?.into_inner(),
            |v| println!("{}", v.token),
        )?,
        ClusterCmd::Delete { name, release } => show(
            out,
            c.delete_cluster(authed(t, pb::DeleteClusterRequest { name: name.clone(), release })?)
                .await?
                .into_inner(),
            |v| {
                println!(
                    "cluster {name} deleted ({} ports released, {} nodes forgotten)",
                    v.ports, v.nodes
                )
            },
        )?,
    }
    Ok(())
}

async fn node(c: &mut Client, t: &Target, out: Output, cmd: NodeCmd) -> Result<()> {
    let none = || list(None, None, None, None, None);
    match cmd {
        NodeCmd::List => {
            show(out, c.list_nodes(authed(t, none())?).await?.into_inner().items, |v| {
                print_nodes(v)
            })?
        }
        NodeCmd::Show { name } => {
            show(out, c.get_node(authed(t, pb::Name { name })?).await?.into_inner(), |v| {
                print_nodes(std::slice::from_ref(v))
            })?
        }
        NodeCmd::Register { name, vtep, underlay_mtu, cluster } => {
            let cluster = cluster.unwrap_or_default();
            let r = c
                .register_node(authed(
                    t,
                    pb::Node { name, vtep, underlay_mtu, cluster, ..Default::default() },
                )?)
                .await?
                .into_inner();
            show(out, r, |v| print_nodes(std::slice::from_ref(v)))?
        }
        NodeCmd::Delete { name } => show(
            out,
            c.delete_node(authed(t, pb::Name { name: name.clone() })?).await?.into_inner(),
            |_| println!("node {name} deleted"),
        )?,
        NodeCmd::Token { name } => {
            show(out, c.join_node(authed(t, pb::Name { name })?).await?.into_inner(), |v| {
                println!("{}", v.token)
            })?
        }
    }
    Ok(())
}

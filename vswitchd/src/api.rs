//! The node gRPC API (`knitter.node.v1.Node`) over a [`Node`]: requests are converted,
//! handed to the node (which validates and applies them whole) and refusals mapped to gRPC
//! status codes with the node's reason as the message. One error table: [`status`].

use crate::convert::{self, FieldError};
use crate::grpc::{blocking, status};
use crate::node::{Node, NodeError};
use crate::views::{peer_status, port_status, stats_reply};
use knitter_api::node as pb;
use knitter_api::node::node_server::Node as NodeApi;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use vswitch::fdb::Dest;

pub struct Api {
    pub node: Arc<Node>,
}

fn field(e: FieldError) -> Status {
    Status::invalid_argument(e.to_string())
}

fn applied(r: Result<u64, NodeError>) -> Result<Response<pb::Applied>, Status> {
    r.map(|generation| Response::new(pb::Applied { generation })).map_err(status)
}

impl Api {
    fn bridges(&self) -> Vec<pb::Bridge> {
        self.node.state().bridges.iter().map(|b| convert::bridge_to(&b.item, b.owner)).collect()
    }

    fn ports(&self) -> Vec<pb::Port> {
        self.node.state().ports.iter().map(|p| convert::port_to(&p.item, p.owner)).collect()
    }
}

type EventStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::NodeEvent, Status>> + Send>>;

#[tonic::async_trait]
impl NodeApi for Api {
    type EventsStream = EventStream;

    async fn events(&self, _: Request<pb::EventsRequest>) -> Result<Response<EventStream>, Status> {
        use tokio_stream::StreamExt;
        use tokio_stream::wrappers::{BroadcastStream, errors::BroadcastStreamRecvError};
        let stream = BroadcastStream::new(self.node.events.subscribe()).map(|e| match e {
            Ok(e) => Ok(e),
            Err(BroadcastStreamRecvError::Lagged(n)) => Ok(crate::events::lost(n)),
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn show(&self, _: Request<pb::ShowRequest>) -> Result<Response<pb::NodeView>, Status> {
        let state = self.node.state();
        let pool = &self.node.pool;
        let status = port_status(&self.node);
        let buffers_lent = status.iter().flat_map(|p| &p.queues).map(|q| q.rx_lent).sum::<u64>();
        Ok(Response::new(pb::NodeView {
            version: env!("CARGO_PKG_VERSION").into(),
            generation: self.node.switch.generation(),
            bridges: self.bridges(),
            ports: self.ports(),
            vtep: state
                .vtep
                .as_ref()
                .zip(state.running_vtep())
                .map(|(v, running)| convert::vtep_to(&running, v.owner)),
            status,
            pmd_threads: self.node.opts.pmd.threads as u32,
            idle_policy: match self.node.opts.pmd.idle {
                vswitch::IdlePolicy::Busy => "busy".into(),
                vswitch::IdlePolicy::Adaptive { spin_us, max_sleep_us } => {
                    format!("adaptive (spin {spin_us} us, sleep up to {max_sleep_us} us)")
                }
            },
            buffers: pool.capacity(),
            buffers_free: pool.free_count() as u32,
            hugepages: matches!(pool.backing(), vswitch::region::Backing::HugeTlb),
            peers: peer_status(&self.node),
            fdb_entries: self.node.switch.fdb().len() as u32,
            fdb_capacity: self.node.switch.fdb().capacity(),
            emc_entries: self.node.opts.tables.emc_entries as u32,
            megaflow_entries: self.node.opts.tables.megaflow_entries as u32,
            buffers_lent: buffers_lent.min(u32::MAX as u64) as u32,
            pool_sized_for_pods: self.node.opts.sized_for_pods.unwrap_or(0),
        }))
    }

    async fn add_bridge(
        &self,
        r: Request<pb::AddBridgeRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let r = r.into_inner();
        let b = r.bridge.ok_or_else(|| Status::invalid_argument("bridge: missing"))?;
        let owner = convert::owner_from(b.owner).map_err(field)?;
        let cfg = convert::bridge_from(&b).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.add_bridge(cfg, owner, r.replace)).await?)
    }

    async fn delete_bridge(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let r = r.into_inner();
        let owner = convert::owner_from(r.owner).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.delete_bridge(&r.name, owner)).await?)
    }

    async fn list_bridges(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::BridgeList>, Status> {
        Ok(Response::new(pb::BridgeList { bridges: self.bridges() }))
    }

    async fn add_port(
        &self,
        r: Request<pb::AddPortRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let p = r.into_inner().port.ok_or_else(|| Status::invalid_argument("port: missing"))?;
        let owner = convert::owner_from(p.owner).map_err(field)?;
        let spec = convert::port_from(&p).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.add_port(spec, owner)).await?)
    }

    async fn delete_port(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let r = r.into_inner();
        let owner = convert::owner_from(r.owner).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.delete_port(&r.name, owner)).await?)
    }

    async fn list_ports(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::PortList>, Status> {
        Ok(Response::new(pb::PortList { ports: self.ports() }))
    }

    async fn set_vtep(
        &self,
        r: Request<pb::SetVtepRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let v = r.into_inner().vtep.ok_or_else(|| Status::invalid_argument("vtep: missing"))?;
        let owner = convert::owner_from(v.owner).map_err(field)?;
        let cfg = convert::vtep_from(&v).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.set_vtep(cfg, owner)).await?)
    }

    async fn clear_vtep(
        &self,
        r: Request<pb::ClearVtepRequest>,
    ) -> Result<Response<pb::Applied>, Status> {
        let owner = convert::owner_from(r.into_inner().owner).map_err(field)?;
        let node = self.node.clone();
        applied(blocking(move || node.clear_vtep(owner)).await?)
    }

    async fn stats(
        &self,
        _: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        Ok(Response::new(stats_reply(&self.node)))
    }

    async fn apply(
        &self,
        r: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::ApplyReply>, Status> {
        let r = r.into_inner();
        let doc = crate::state::NodeState::parse(&r.document, &r.format)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let node = self.node.clone();
        let report =
            blocking(move || node.apply(doc, r.dry_run, r.prune)).await?.map_err(status)?;
        Ok(Response::new(pb::ApplyReply {
            generation: report.generation,
            added: report.added,
            changed: report.changed,
            removed: report.removed,
            kept: report.kept,
            skipped: report.skipped,
        }))
    }

    async fn export(
        &self,
        r: Request<pb::ExportRequest>,
    ) -> Result<Response<pb::ExportReply>, Status> {
        let r = r.into_inner();
        let select = crate::state::Selection {
            kind: Some(r.kind),
            name: Some(r.name),
            all_owners: r.all_owners,
        };
        let document = self.node.state().document(&r.format, &select).map_err(|e| match e {
            crate::state::DocumentError::NotFound { .. } => Status::not_found(e.to_string()),
            e => Status::invalid_argument(e.to_string()),
        })?;
        Ok(Response::new(pb::ExportReply { document }))
    }

    async fn fdb_dump(&self, r: Request<pb::FdbRequest>) -> Result<Response<pb::FdbReply>, Status> {
        let only = r.into_inner().bridge;
        let snap = self.node.switch.snapshot();
        let now = vswitch::util::coarse_secs();
        let entries = self
            .node
            .switch
            .fdb()
            .dump()
            .into_iter()
            .filter_map(|e| {
                let bridge = snap.bd(e.bd)?.name.clone();
                if !only.is_empty() && bridge != only {
                    return None;
                }
                let dest = match e.dest {
                    Dest::Port(p) => format!("port {}", snap.ports.get(p as usize)?.as_ref()?.name),
                    Dest::Peer(p) => format!("remote {}", snap.peer(p)?.ip),
                };
                Some(pb::FdbEntry {
                    bridge,
                    mac: e.mac.to_string(),
                    dest,
                    is_static: e.is_static,
                    age_secs: now.saturating_sub(e.seen),
                })
            })
            .collect();
        Ok(Response::new(pb::FdbReply { entries }))
    }

    async fn trace(
        &self,
        r: Request<pb::TraceRequest>,
    ) -> Result<Response<pb::TraceReply>, Status> {
        crate::trace::trace(self.node.switch.clone(), r.into_inner()).await.map(Response::new)
    }

    async fn pmd_show(
        &self,
        _: Request<pb::PmdShowRequest>,
    ) -> Result<Response<pb::PmdShowReply>, Status> {
        // The TSC's rate may still be calibrating (100 ms after start): waited for off the
        // async workers.
        let node = self.node.clone();
        blocking(move || pb::PmdShowReply {
            tsc_hz: vswitch::util::tsc_hz() as u64,
            ..crate::views::pmd_reply(&node)
        })
        .await
        .map(Response::new)
    }

    async fn pmd_rebalance(
        &self,
        r: Request<pb::PmdRebalanceRequest>,
    ) -> Result<Response<pb::PmdRebalanceReply>, Status> {
        let window = match r.into_inner().window_ms {
            0 => std::time::Duration::from_secs(1),
            ms if ms <= 60_000 => std::time::Duration::from_millis(ms.into()),
            ms => return Err(Status::invalid_argument(format!("window_ms {ms}: at most 60000"))),
        };
        let node = self.node.clone();
        let moved = blocking(move || node.rebalance_pmds(window))
            .await?
            .ok_or_else(|| Status::unavailable("the PMD threads are stopped"))?;
        let snap = self.node.switch.snapshot();
        let name = |id: u16| snap.port(id).map_or_else(|| format!("#{id}"), |p| p.name.clone());
        let thread = |t: Option<usize>| t.map_or(-1, |t| t as i32);
        let queues = moved
            .into_iter()
            .map(|m| pb::QueueMove {
                port: name(m.port),
                queue: m.queue.into(),
                busy_cycles: m.busy_cycles,
                from: thread(m.from),
                to: thread(m.to),
            })
            .collect();
        Ok(Response::new(pb::PmdRebalanceReply { queues }))
    }

    type CaptureStream = crate::capture::CaptureStream;

    async fn capture(
        &self,
        r: Request<pb::CaptureRequest>,
    ) -> Result<Response<Self::CaptureStream>, Status> {
        crate::capture::capture(self.node.switch.clone(), r.into_inner()).map(Response::new)
    }

    async fn log_filter(
        &self,
        r: Request<pb::LogFilterRequest>,
    ) -> Result<Response<pb::LogFilterReply>, Status> {
        use knitter_api::logging::{self, FilterError};
        let r = r.into_inner();
        if !r.filter.trim().is_empty() {
            let was = logging::filter().unwrap_or_default();
            logging::set_filter(r.filter.trim()).map_err(|e| match e {
                FilterError::Parse(..) => Status::invalid_argument(e.to_string()),
                _ => Status::failed_precondition(e.to_string()),
            })?;
            // At warn: the new filter may hide info.
            tracing::warn!(filter = r.filter.trim(), was, "log filter changed");
        }
        let filter = logging::filter().map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(pb::LogFilterReply { filter }))
    }

    async fn fdb_flush(
        &self,
        r: Request<pb::FdbFlushRequest>,
    ) -> Result<Response<pb::FdbFlushReply>, Status> {
        let r = r.into_inner();
        let sw = &self.node.switch;
        let removed = match (r.bridge.is_empty(), r.port.is_empty()) {
            (false, true) => sw
                .flush_bridge(&r.bridge)
                .ok_or_else(|| Status::not_found(format!("no bridge named {:?}", r.bridge)))?,
            (true, false) => sw
                .flush_port(&r.port)
                .ok_or_else(|| Status::not_found(format!("no port named {:?}", r.port)))?,
            _ => return Err(Status::invalid_argument("name exactly one of bridge and port")),
        };
        Ok(Response::new(pb::FdbFlushReply { removed: removed as u64 }))
    }
}

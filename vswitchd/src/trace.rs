//! The node API's packet trace: a live trace armed on a port and collected until the count
//! or the deadline, or a synthetic frame run through the current configuration; traces
//! rendered with the snapshot's names.

use crate::grpc::switch_status;
use knitter_api::node as pb;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;
use vswitch::Switch;
use vswitch::trace::{FrameTrace, MAX_TRACES};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the collector looks for finished traces.
const POLL: Duration = Duration::from_millis(20);

pub async fn trace(sw: Arc<Switch>, r: pb::TraceRequest) -> Result<pb::TraceReply, Status> {
    if r.port.is_empty() {
        return Err(Status::invalid_argument("port: name the ingress port to trace"));
    }
    if !r.synthetic.is_empty() {
        let frame = vswitch::wire::spec::build(&r.synthetic)
            .map_err(|e| Status::invalid_argument(format!("synthetic frame: {e}")))?;
        let t = sw.trace_synthetic(&r.port, &frame).map_err(switch_status)?;
        return Ok(pb::TraceReply { frames: vec![frame_to(&sw, &t)], lost: 0 });
    }
    let count = match r.count {
        0 => 1,
        n if n as usize <= MAX_TRACES => n,
        n => {
            return Err(Status::invalid_argument(format!(
                "count {n}: at most {MAX_TRACES} frames are traced at once"
            )));
        }
    };
    let timeout = match r.timeout_ms {
        0 => DEFAULT_TIMEOUT,
        ms => Duration::from_millis(ms as u64).min(MAX_TIMEOUT),
    };
    let lost_before = sw.tracing().lost();
    sw.trace(&r.port, count).map_err(switch_status)?;
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    loop {
        got.extend(sw.traces());
        if got.len() >= count as usize || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    // Frames traced while the request is withdrawn still arrive: take them too.
    sw.tracing().disarm();
    got.extend(sw.traces());
    got.sort_by_key(|t| t.seq);
    Ok(pb::TraceReply {
        frames: got.iter().map(|t| frame_to(&sw, t)).collect(),
        lost: sw.tracing().lost() - lost_before,
    })
}

fn frame_to(sw: &Switch, t: &FrameTrace) -> pb::TraceFrame {
    let snap = sw.snapshot();
    let (frame, steps) = t.render(&snap);
    pb::TraceFrame {
        seq: t.seq,
        thread: t.thread as u32,
        port: snap.port(t.port).map_or_else(|| format!("#{}", t.port), |p| p.name.clone()),
        frame,
        steps: steps
            .into_iter()
            .map(|(node, detail)| pb::TraceStep { node: node.into(), detail })
            .collect(),
        synthetic: t.dry,
    }
}

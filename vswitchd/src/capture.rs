//! The node API's packet capture: a capture started on the switch ([`vswitch::capture`]) and
//! its frames streamed to the client in chunks until the count, the duration or the client
//! goes; the capture stops whichever way the stream ends (a guard stops it when the
//! streaming task ends or is dropped).

use knitter_api::node as pb;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use vswitch::Switch;
use vswitch::bpf::{Insn, Program};
use vswitch::capture::{CaptureError, Direction, Request, Session, Slot};

/// How often the streaming task collects the copies.
const POLL: Duration = Duration::from_millis(10);
/// Frames one chunk carries at most.
const CHUNK: usize = 256;
/// Bytes of frames one chunk carries at most (well under a gRPC client's 4 MiB message).
const CHUNK_BYTES: usize = 1 << 20;

pub type CaptureStream = ReceiverStream<Result<pb::CaptureChunk, Status>>;

/// Starts a capture and the task that streams it.
pub fn capture(sw: Arc<Switch>, r: pb::CaptureRequest) -> Result<CaptureStream, Status> {
    if r.port.is_empty() {
        return Err(Status::invalid_argument("port: name the port to capture"));
    }
    let snap = sw.snapshot();
    let port = snap
        .port_id(&r.port)
        .ok_or_else(|| Status::not_found(format!("port {}: no such port", r.port)))?;
    let (rx, tx) = match pb::CaptureDirection::try_from(r.direction) {
        Ok(pb::CaptureDirection::Both) => (true, true),
        Ok(pb::CaptureDirection::Rx) => (true, false),
        Ok(pb::CaptureDirection::Tx) => (false, true),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "direction {}: BOTH, RX or TX",
                r.direction
            )));
        }
    };
    let filter = if r.filter.is_empty() { None } else { Some(program(&r.filter)?) };
    let session = sw
        .capture()
        .start(Request { port, rx, tx, count: r.count, snaplen: r.snaplen, filter })
        .map_err(|e| match e {
            CaptureError::Busy(id) => {
                let name = snap.port(id).map_or_else(|| format!("#{id}"), |p| p.name.clone());
                Status::failed_precondition(format!(
                    "a capture of port {name} is running; one capture at a time"
                ))
            }
            e => Status::invalid_argument(e.to_string()),
        })?;
    tracing::info!(port = %r.port, rx, tx, count = r.count, snaplen = session.snaplen, filtered = !r.filter.is_empty(), "capture started");
    let (out, stream) = mpsc::channel(8);
    let running = Running { sw, session };
    let duration = (r.duration_ms > 0).then(|| Duration::from_millis(r.duration_ms as u64));
    tokio::spawn(stream_frames(running, r.port, duration, r.summary, out));
    Ok(ReceiverStream::new(stream))
}

/// A filter from the API, checked as the kernel checks a socket filter.
fn program(insns: &[pb::BpfInstruction]) -> Result<Program, Status> {
    let insns = insns
        .iter()
        .enumerate()
        .map(|(at, i)| match (u16::try_from(i.code), u8::try_from(i.jt), u8::try_from(i.jf)) {
            (Ok(code), Ok(jt), Ok(jf)) => Ok(Insn { code, jt, jf, k: i.k }),
            _ => Err(Status::invalid_argument(format!(
                "filter: instruction {at} has a field out of range"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Program::new(insns).map_err(|e| Status::invalid_argument(format!("filter: {e}")))
}

/// The running capture; stopped when dropped.
struct Running {
    sw: Arc<Switch>,
    session: Arc<Session>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.sw.capture().stop(&self.session);
        tracing::info!(port = self.session.port, lost = self.session.lost(), "capture stopped");
    }
}

async fn stream_frames(
    run: Running,
    port: String,
    duration: Option<Duration>,
    summary: bool,
    out: mpsc::Sender<Result<pb::CaptureChunk, Status>>,
) {
    let s = run.session.clone();
    let deadline = duration.map(|d| Instant::now() + d);
    let chunk =
        |frames, lost| pb::CaptureChunk { frames, lost, port: port.clone(), snaplen: s.snaplen };
    // A client that stops reading holds the capture only until the deadline, if there is one.
    let send = |c: Result<pb::CaptureChunk, Status>| {
        let out = out.clone();
        async move {
            match deadline {
                Some(d) => {
                    matches!(tokio::time::timeout_at(d.into(), out.send(c)).await, Ok(Ok(())))
                }
                None => out.send(c).await.is_ok(),
            }
        }
    };
    if !send(Ok(chunk(Vec::new(), 0))).await {
        return;
    }
    let mut lost = 0;
    loop {
        let ending = s.complete() || s.port_gone() || deadline.is_some_and(|d| Instant::now() >= d);
        if ending {
            // Bursts in flight hand over their copies within microseconds.
            run.sw.capture().stop(&s);
            tokio::time::sleep(POLL).await;
        }
        loop {
            let (frames, full) = take_chunk(&s, summary);
            if frames.is_empty() && s.lost() == lost {
                break;
            }
            lost = s.lost();
            if !send(Ok(chunk(frames, lost))).await {
                return;
            }
            if !full {
                break;
            }
        }
        if ending {
            if s.port_gone() {
                let _ = send(Err(Status::aborted(format!(
                    "port {port} was removed: the capture ended"
                ))))
                .await;
            }
            return;
        }
        tokio::select! {
            _ = out.closed() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// The frames waiting, up to [`CHUNK`] frames or [`CHUNK_BYTES`]; true if it stopped at a
/// limit (more may wait).
fn take_chunk(s: &Session, summary: bool) -> (Vec<pb::CapturedFrame>, bool) {
    let (mut frames, mut bytes) = (Vec::new(), 0);
    while frames.len() < CHUNK && bytes < CHUNK_BYTES {
        let Some(f) = s.next(|f| frame_to(f, summary)) else { return (frames, false) };
        bytes += f.data.len();
        frames.push(f);
    }
    (frames, true)
}

fn frame_to(f: &Slot, summary: bool) -> pb::CapturedFrame {
    let direction = match f.dir {
        Direction::Rx => pb::CaptureDirection::Rx,
        Direction::Tx => pb::CaptureDirection::Tx,
    };
    pb::CapturedFrame {
        timestamp_ns: f.ts_ns,
        direction: direction as i32,
        original_length: f.orig_len,
        data: f.bytes().to_vec(),
        drop_reason: f.reason.map(|r| r.name().to_owned()).unwrap_or_default(),
        thread: f.thread as u32,
        summary: if summary {
            vswitch::trace::describe_frame(f.bytes(), f.orig_len)
        } else {
            String::new()
        },
    }
}

//! `knitterctl capture`: a port's frames as pcapng (`-w FILE`, `-w -` for `tcpdump -r -`) or
//! one line each, filtered by a tcpdump expression compiled to classic BPF by `tcpdump -ddd`
//! (the daemon checks and runs the program). Ends at `--count`, `--duration`, Ctrl-C, or
//! when the reader of `-w -` goes; the daemon stops copying as the stream ends.

use crate::Output;
use crate::out::{CLOSED_PIPE, line, record};
use crate::pcapng;
use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::io::Write;
use std::path::PathBuf;
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq)]
pub(crate) enum Direction {
    Rx,
    Tx,
    Both,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The port (as `knitterctl port list` names it).
    port: String,
    /// A tcpdump filter expression (`udp port 53`, `host 10.1.0.7 and tcp`, `vlan 10`,
    /// `ether proto 0x0806`), compiled by `tcpdump -ddd`; the frame it sees is the one on
    /// the port (on an underlay: the VXLAN packet, `udp[12:4] >> 8 = VNI` picks a VNI).
    filter: Vec<String>,
    /// Frames received (rx), sent (tx) or both.
    #[arg(long, value_enum, default_value_t = Direction::Both)]
    direction: Direction,
    /// Stop after this many frames.
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Bytes of each frame kept (at most 16384; default 9216, a jumbo frame whole).
    #[arg(short = 's', long)]
    snaplen: Option<u32>,
    /// Write pcapng to this file, or to standard output with `-` (`| tcpdump -r -`).
    #[arg(short = 'w', long = "write")]
    write: Option<PathBuf>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
}

/// The filter as classic BPF, compiled by the tcpdump on this host.
fn compile(expr: &str, snaplen: u32) -> Result<Vec<pb::BpfInstruction>> {
    let out = std::process::Command::new("tcpdump")
        .args(["-ddd", "-y", "EN10MB", "-s", &snaplen.to_string(), "--", expr])
        .output()
        .map_err(|e| {
            anyhow::anyhow!("compiling the filter needs tcpdump (apt-get install tcpdump): {e}")
        })?;
    if !out.status.success() {
        bail!(
            "filter {expr:?}: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.starts_with("Warning"))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    knitter_api::bpf::parse_ddd(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| anyhow::anyhow!("tcpdump -ddd: {e}"))
}

/// Where frames go: pcapng, or a line each.
enum Sink {
    Pcap(pcapng::Writer<Box<dyn Write>>),
    Lines(Output),
}

/// A write to the pcapng sink; a reader that went (`-w - | head`) ends the capture quietly.
fn written(r: std::io::Result<()>) -> Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(CLOSED_PIPE),
        r => Ok(r?),
    }
}

/// A note on standard error (which may be closed: then it is left unsaid).
fn say(args: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "knitterctl: {args}");
}

fn clock(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        (ns / 1000) % 1_000_000
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) async fn capture(c: &mut NodeClient<Channel>, out: Output, a: Args) -> Result<()> {
    let snaplen = a.snaplen.unwrap_or(0);
    let expr = a.filter.join(" ");
    let filter = if expr.trim().is_empty() {
        Vec::new()
    } else {
        compile(&expr, if snaplen == 0 { 262_144 } else { snaplen })?
    };
    let direction = match a.direction {
        Direction::Rx => pb::CaptureDirection::Rx,
        Direction::Tx => pb::CaptureDirection::Tx,
        Direction::Both => pb::CaptureDirection::Both,
    };
    let duration_ms = match a.duration {
        Some(d) if d.is_finite() && d > 0.0 => (d * 1000.0).min(u32::MAX as f64).max(1.0) as u32,
        Some(d) => bail!("--duration {d}: seconds, more than 0"),
        None => 0,
    };
    let req = pb::CaptureRequest {
        port: a.port.clone(),
        direction: direction as i32,
        count: a.count.unwrap_or(0),
        snaplen,
        filter,
        duration_ms,
        summary: a.write.is_none(),
    };
    let mut stream = c.capture(req).await?.into_inner();
    // The first chunk says the capture runs (and its snap length).
    let first = stream.message().await?.context("the daemon ended the capture before it began")?;
    let mut sink = match &a.write {
        Some(p) => {
            let w: Box<dyn Write> = if p.as_os_str() == "-" {
                Box::new(std::io::stdout())
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?,
                ))
            };
            let mut w = pcapng::Writer::new(w, &first.port, first.snaplen)?;
            written(w.flush())?;
            Sink::Pcap(w)
        }
        None => Sink::Lines(out),
    };
    let filtered =
        if expr.trim().is_empty() { String::new() } else { format!(", filter {expr:?}") };
    let direction =
        a.direction.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default();
    say(format_args!(
        "capturing on {} ({direction}{filtered}), snap length {}",
        first.port, first.snaplen
    ));
    let (mut got, mut lost) = (0u64, 0u64);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let chunk = tokio::select! {
            m = stream.message() => m?,
            _ = &mut interrupted => None,
        };
        let Some(chunk) = chunk else { break };
        lost = chunk.lost;
        for f in chunk.frames {
            got += 1;
            let outbound = f.direction == pb::CaptureDirection::Tx as i32;
            let dropped =
                (!f.drop_reason.is_empty()).then(|| format!("dropped: {}", f.drop_reason));
            match &mut sink {
                Sink::Pcap(w) => written(w.frame(
                    f.timestamp_ns,
                    outbound,
                    f.original_length,
                    &f.data,
                    dropped.as_deref(),
                ))?,
                Sink::Lines(out @ (Output::Json | Output::Yaml)) => record(
                    *out,
                    &serde_json::json!({
                        "timestamp_ns": f.timestamp_ns, "direction": if outbound { "tx" } else { "rx" }, "length": f.original_length,
                        "drop_reason": f.drop_reason, "thread": f.thread, "summary": f.summary, "data": hex(&f.data),
                    }),
                )?,
                Sink::Lines(Output::Table) => {
                    let dir = if outbound { "tx" } else { "rx" };
                    let drop = dropped.map(|d| format!("  [{d}]")).unwrap_or_default();
                    line(format_args!(
                        "{} UTC {dir} {} pmd {}: {}{drop}",
                        clock(f.timestamp_ns),
                        first.port,
                        f.thread,
                        f.summary
                    ))
                }
            }
        }
        if let Sink::Pcap(w) = &mut sink {
            written(w.flush())?;
        }
    }
    drop(stream);
    if let Sink::Pcap(w) = &mut sink {
        written(w.stats(crate::unix_now().saturating_mul(1_000_000_000), got, lost))?;
        written(w.flush())?;
    }
    let behind = if lost > 0 {
        " (frames the daemon could not keep: the reader fell behind; filter, or write to a file)"
    } else {
        ""
    };
    say(format_args!("{got} frames captured, {lost} lost{behind}"));
    Ok(())
}

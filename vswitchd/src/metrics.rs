//! The Prometheus endpoint (`GET /metrics`, text exposition format 0.0.4): the same counters
//! as the API's `Stats`, read when scraped, plus buffer-pool and configuration gauges; and
//! `GET /healthz`, `GET /readyz` for probes.

use crate::node::Node;
use crate::views::stats_reply;
use knitter_api::metrics::{escape, family};
use knitter_api::node as pb;
use std::fmt::Write;
use std::sync::Arc;

/// The exposition text of `node` now.
pub fn render(node: &Node) -> String {
    let s = stats_reply(node);
    let mut o = String::with_capacity(4096);
    knitter_api::metrics::build_info(&mut o, "knitter-vswitchd", env!("CARGO_PKG_VERSION"));
    port_families(&mut o, &s);
    vhost_families(&mut o, &s);
    dpdk_families(&mut o, &s);
    // Per queue: (port, queue) as one label pair.
    let queue_family =
        |o: &mut String, name: &str, help: &str, f: fn(&knitter_api::node::QueueStats) -> u64| {
            let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &s.ports {
                for q in &p.queues {
                    let _ = writeln!(
                        o,
                        "{name}{{port=\"{}\",queue=\"{}\"}} {}",
                        escape(&p.name),
                        q.queue,
                        f(q)
                    );
                }
            }
        };
    queue_family(
        &mut o,
        "knitter_queue_rx_packets_total",
        "Frames the port's queue received.",
        |q| q.rx_packets,
    );
    queue_family(
        &mut o,
        "knitter_queue_rx_dropped_total",
        "Frames the queue received but could not hand over.",
        |q| q.rx_dropped,
    );
    queue_family(&mut o, "knitter_queue_tx_packets_total", "Frames the queue sent.", |q| {
        q.tx_packets
    });
    queue_family(
        &mut o,
        "knitter_queue_tx_full_total",
        "Frames the queue could not take (full).",
        |q| q.tx_full,
    );
    queue_family(
        &mut o,
        "knitter_queue_rx_gso_total",
        "GSO super-frames the queue received and cut into segments.",
        |q| q.rx_gso,
    );
    queue_family(
        &mut o,
        "knitter_queue_rx_csum_total",
        "Frames whose partial L4 checksum the queue finished.",
        |q| q.rx_csum,
    );
    queue_family(
        &mut o,
        "knitter_queue_tx_dropped_total",
        "Frames the queue could not send (longer than its slots), dropped.",
        |q| q.tx_dropped,
    );
    queue_family(
        &mut o,
        "knitter_queue_rx_starved_total",
        "Times the queue's receive buffers ran out with the buffer pool empty (frames arriving then were dropped).",
        |q| q.rx_starved,
    );
    queue_family(
        &mut o,
        "knitter_queue_rx_lent",
        "Pool buffers the queue has lent out for receiving now (AF_XDP: its fill ring).",
        |q| q.rx_lent,
    );
    let counts = |c: &[knitter_api::node::Count]| {
        c.iter().map(|c| (c.name.clone(), c.value as f64)).collect::<Vec<_>>()
    };
    family(
        &mut o,
        "knitter_drops_total",
        "counter",
        "Frames dropped, by reason.",
        "reason",
        counts(&s.drops),
    );
    family(
        &mut o,
        "knitter_events_total",
        "counter",
        "Pipeline events (learning, flooding, encapsulation...).",
        "event",
        counts(&s.events),
    );
    let bds = |f: fn(&knitter_api::node::BridgeStats) -> f64| {
        s.bridges.iter().map(move |b| (b.name.clone(), f(b)))
    };
    family(
        &mut o,
        "knitter_bridge_packets_total",
        "counter",
        "Frames forwarded in the bridge domain.",
        "bridge",
        bds(|b| b.packets as f64),
    );
    family(
        &mut o,
        "knitter_bridge_flooded_total",
        "counter",
        "Frames flooded in the bridge domain.",
        "bridge",
        bds(|b| b.flooded as f64),
    );
    family(
        &mut o,
        "knitter_bridge_learned_total",
        "counter",
        "MACs learned in the bridge domain.",
        "bridge",
        bds(|b| b.learned as f64),
    );
    family(
        &mut o,
        "knitter_bridge_policed_total",
        "counter",
        "Frames the bridge domain's policer dropped (also counted on their ports).",
        "bridge",
        bds(|b| b.policed as f64),
    );
    family(
        &mut o,
        "knitter_fdb_entries",
        "gauge",
        "Forwarding-table entries of the bridge domain.",
        "bridge",
        bds(|b| b.fdb_entries as f64),
    );
    let pmds = |f: fn(&knitter_api::node::PmdStats) -> f64| {
        s.pmds.iter().map(move |p| (p.thread.to_string(), f(p)))
    };
    family(
        &mut o,
        "knitter_pmd_busy_cycles_total",
        "counter",
        "TSC cycles the PMD thread spent on packets.",
        "thread",
        pmds(|p| p.busy_cycles as f64),
    );
    family(
        &mut o,
        "knitter_pmd_idle_cycles_total",
        "counter",
        "TSC cycles the PMD thread polled empty queues.",
        "thread",
        pmds(|p| p.idle_cycles as f64),
    );
    family(
        &mut o,
        "knitter_pmd_packets_total",
        "counter",
        "Frames the PMD thread received.",
        "thread",
        pmds(|p| p.packets as f64),
    );
    // Counters only: utilisation and cycles a packet are ratios of their rates, for PromQL
    // over the window a dashboard picks (docs/operations.md "Metrics").
    let placed = crate::views::pmd_reply(node);
    // Left out for the 100 ms after start the daemon takes to calibrate it (a scrape never waits).
    let tsc = (placed.tsc_hz > 0).then(|| (String::new(), placed.tsc_hz as f64));
    family(
        &mut o,
        "knitter_tsc_hz",
        "gauge",
        "TSC cycles a second (to turn the *_cycles_total counters into seconds).",
        "",
        tsc,
    );
    for (name, help, f) in [
        (
            "knitter_pmd_rxq_busy_cycles_total",
            "TSC cycles of the polls of the rx queue that moved packets, since the PMD thread was given it.",
            (|q: &knitter_api::node::PolledQueue| q.busy_cycles)
                as fn(&knitter_api::node::PolledQueue) -> u64,
        ),
        (
            "knitter_pmd_rxq_packets_total",
            "Frames the PMD thread received from the rx queue, since it was given it.",
            |q| q.packets,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for t in &placed.threads {
            for q in &t.queues {
                let _ = writeln!(
                    o,
                    "{name}{{thread=\"{}\",port=\"{}\",queue=\"{}\"}} {}",
                    t.index,
                    escape(&q.port),
                    q.queue,
                    f(q)
                );
            }
        }
    }
    let one = |v: f64| [(String::new(), v)];
    family(
        &mut o,
        "knitter_buffers",
        "gauge",
        "Packet buffers in the pool.",
        "",
        one(node.pool.capacity() as f64),
    );
    family(
        &mut o,
        "knitter_buffers_free",
        "gauge",
        "Packet buffers free now.",
        "",
        one(node.pool.free_count() as f64),
    );
    let lent: u64 = s.ports.iter().flat_map(|p| &p.queues).map(|q| q.rx_lent).sum();
    family(
        &mut o,
        "knitter_buffers_lent",
        "gauge",
        "Packet buffers lent to the kernel's receive rings now (AF_XDP fill rings).",
        "",
        one(lent as f64),
    );
    family(
        &mut o,
        "knitter_config_generation",
        "gauge",
        "Configuration generation the PMD threads read.",
        "",
        one(node.switch.generation() as f64),
    );
    o
}

/// A probe's answer: `ok` while every PMD thread runs, 503 naming the dead ones otherwise.
/// Readiness also needs the manager to take the node's credential: a node it refuses
/// cannot attach pods to its networks, and an unready pod holds a DaemonSet's rollout. A
/// manager that is only unreachable does not make the node unready (it forwards on).
async fn probe(
    node: Arc<Node>,
    ok: &'static str,
    readiness: bool,
) -> (axum::http::StatusCode, String) {
    let dead = node.dead_pmd_threads();
    if !dead.is_empty() {
        return (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("PMD threads {dead:?} died; see the log\n"),
        );
    }
    match node.manager_refusal() {
        Some(why) if readiness => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("the manager refuses this node's credential: {why}\n"),
        ),
        _ => (axum::http::StatusCode::OK, ok.to_string()),
    }
}

/// Serves `/metrics` on `listener` until `stop` resolves.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::routing::get;
    let (healthz, readyz) = (node.clone(), node.clone());
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let node = node.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        render(&node),
                    )
                }
            }),
        )
        // Probes (a kubelet's httpGet on 127.0.0.1 of a hostNetwork pod): the endpoint starts
        // after the state is restored, just before the node API, so answering is being ready.
        // A PMD thread that died (a panic outside any port's burst, which would otherwise put
        // only that port in error) fails both, so the kubelet restarts the daemon.
        .route("/healthz", get(move || probe(healthz.clone(), "ok\n", false)))
        .route("/readyz", get(move || probe(readyz.clone(), "ready\n", true)));
    axum::serve(listener, app).with_graceful_shutdown(stop).await
}

/// A port's value in a family.
type PortValue = fn(&pb::PortStatus) -> f64;
/// A vhost-user port's count of one kind of frontend error.
type VhostErrorCount = fn(&pb::VhostErrors) -> u64;

/// Per port, labelled `port`: traffic, drops, priority classes, state.
fn port_families(o: &mut String, s: &pb::StatsReply) {
    let per_port = |o: &mut String, rows: &[(&str, &str, &str, PortValue)]| {
        for &(name, kind, help, value) in rows {
            family(o, name, kind, help, "port", s.ports.iter().map(|p| (p.name.clone(), value(p))));
        }
    };
    per_port(
        o,
        &[
            ("knitter_port_rx_packets_total", "counter", "Frames received from the port.", |p| {
                p.rx_packets as f64
            }),
            ("knitter_port_rx_bytes_total", "counter", "Bytes received from the port.", |p| {
                p.rx_bytes as f64
            }),
            ("knitter_port_tx_packets_total", "counter", "Frames sent to the port.", |p| {
                p.tx_packets as f64
            }),
            ("knitter_port_tx_bytes_total", "counter", "Bytes sent to the port.", |p| {
                p.tx_bytes as f64
            }),
            (
                "knitter_port_drops_total",
                "counter",
                "Frames of the port dropped (any reason).",
                |p| p.drops as f64,
            ),
            (
                "knitter_port_policed_total",
                "counter",
                "Frames the port's ingress policer dropped (also in drops).",
                |p| p.policed as f64,
            ),
        ],
    );
    let name = "knitter_port_tx_class_packets_total";
    let _ = writeln!(
        o,
        "# HELP {name} Frames sent to the port by class: priority networks' (ahead of the others on a shared egress) and ordinary.\n# TYPE {name} counter"
    );
    for p in &s.ports {
        let (port, ordinary) = (escape(&p.name), p.tx_packets.saturating_sub(p.tx_priority));
        let _ = writeln!(
            o,
            "{name}{{port=\"{port}\",class=\"priority\"}} {}\n{name}{{port=\"{port}\",class=\"ordinary\"}} {ordinary}",
            p.tx_priority
        );
    }
    per_port(
        o,
        &[
            (
                "knitter_port_priority_held_total",
                "counter",
                "Priority frames the port's ring had no room for, held for its next flush (each counted once).",
                |p| p.priority_held as f64,
            ),
            (
                "knitter_port_priority_dropped_total",
                "counter",
                "Priority frames dropped on the port (also in drops).",
                |p| p.priority_dropped as f64,
            ),
            (
                "knitter_port_up",
                "gauge",
                "1 when the port runs, its link is up and no vhost-user ring is stopped.",
                |p| (p.error.is_empty() && p.ring_error.is_empty() && p.link_up) as u8 as f64,
            ),
        ],
    );
}

/// Per dpdk port, labelled `port`: whether frames cross its edge without a copy.
fn dpdk_families(o: &mut String, s: &pb::StatsReply) {
    let dpdk = s.ports.iter().filter_map(|p| Some((p.name.clone(), p.zero_copy? as u8 as f64)));
    family(
        o,
        "knitter_dpdk_zero_copy",
        "gauge",
        "1 when frames cross the dpdk port's edge without a copy.",
        "port",
        dpdk,
    );
}

/// Per vhost-user port, labelled `port`: the frontend connected, and what it did wrong.
fn vhost_families(o: &mut String, s: &pb::StatsReply) {
    let vhost =
        s.ports.iter().filter_map(|p| Some((p.name.clone(), p.vhost_connected? as u8 as f64)));
    family(
        o,
        "knitter_vhost_user_connected",
        "gauge",
        "1 when a vhost-user frontend is connected and its rings run.",
        "port",
        vhost,
    );
    let rows: [(&str, &str, VhostErrorCount); 6] = [
        (
            "knitter_vhost_user_broken_rings_total",
            "Rings stopped: a driver claiming more than a queue's worth, or a memory file that shrank.",
            |e| e.broken_rings,
        ),
        (
            "knitter_vhost_user_bad_chains_total",
            "Descriptor chains from the guest refused as malformed.",
            |e| e.bad_chains,
        ),
        (
            "knitter_vhost_user_refused_frames_total",
            "Frames from the guest refused (runt, oversize, offload not negotiated, no buffer).",
            |e| e.refused_frames,
        ),
        (
            "knitter_vhost_user_guest_buffer_too_small_total",
            "Frames for the guest that its receive buffers could not hold.",
            |e| e.guest_buffer_too_small,
        ),
        (
            "knitter_vhost_user_memory_faults_total",
            "Rings stopped because the frontend's memory file shrank under its memory table.",
            |e| e.memory_faults,
        ),
        (
            "knitter_vhost_user_interrupts_full_total",
            "Interrupts not sent because the guest's eventfd counter was full.",
            |e| e.interrupts_full,
        ),
    ];
    for (name, help, value) in rows {
        let samples = s
            .ports
            .iter()
            .filter_map(|p| Some((p.name.clone(), value(p.vhost_errors.as_ref()?) as f64)));
        family(o, name, "counter", help, "port", samples);
    }
}

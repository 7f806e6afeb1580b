//! The node as the API and the metrics endpoint show it: ports' status and counters, every
//! counter at once, remote VTEPs with their next hops.

use crate::node::Node;
use knitter_api::node as pb;
use vswitch::Event;

/// Counters and state of every port, running or not.
pub fn port_status(node: &Node) -> Vec<pb::PortStatus> {
    let snap = node.switch.snapshot();
    let totals = node.switch.stats();
    let running = snap.ports.iter().flatten().map(|p| {
        let t = totals.ports.get(p.id as usize).cloned().unwrap_or_default();
        let zero_copy = node.dpdk_zero_copy(&p.name);
        pb::PortStatus {
            name: p.name.clone(),
            link_up: p.port.link_up(),
            rx_packets: t.rx_packets,
            rx_bytes: t.rx_bytes,
            tx_packets: t.tx_packets,
            tx_bytes: t.tx_bytes,
            drops: t.drops,
            policed: t.policed,
            tx_priority: t.tx_priority,
            priority_held: t.priority_held,
            priority_dropped: t.priority_dropped,
            error: node.switch.faults().get(&p.name).unwrap_or_default(),
            vhost_connected: node.vhost_connected(&p.name),
            zero_copy: zero_copy.as_ref().map(|(on, _)| *on),
            copy_reason: zero_copy.and_then(|(_, why)| why).unwrap_or_default(),
            fallback: node.fallback(&p.name).unwrap_or_default(),
            ring_error: node.vhost_ring_error(&p.name).unwrap_or_default(),
            vhost_errors: node.vhost_errors(&p.name),
            vhost_rings: node.vhost_rings(&p.name),
            queues: p
                .port
                .queue_stats()
                .iter()
                .enumerate()
                .map(|(q, s)| pb::QueueStats {
                    queue: q as u32,
                    rx_packets: s.rx_packets,
                    rx_dropped: s.rx_dropped,
                    tx_packets: s.tx_packets,
                    tx_full: s.tx_full,
                    rx_gso: s.rx_gso,
                    rx_csum: s.rx_csum,
                    tx_dropped: s.tx_dropped,
                    rx_starved: s.rx_starved,
                    rx_lent: s.rx_lent,
                })
                .collect(),
        }
    });
    let failed = node.failed_ports().into_iter().map(|(name, error)| pb::PortStatus {
        name,
        error,
        ..Default::default()
    });
    running.chain(failed).collect()
}

/// Every counter of the node at once (the API's `Stats`, the metrics endpoint's source).
pub fn stats_reply(node: &Node) -> pb::StatsReply {
    let sw = &node.switch;
    let snap = sw.snapshot();
    let totals = sw.stats();
    let at_unix_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let bridges = snap
        .bds
        .iter()
        .flatten()
        .map(|b| {
            let t = totals.bds.get(b.id as usize).cloned().unwrap_or_default();
            pb::BridgeStats {
                name: b.name.clone(),
                packets: t.packets,
                bytes: t.bytes,
                flooded: t.flooded,
                learned: t.learned,
                fdb_entries: sw.fdb().bd_len(b.id).into(),
                policed: t.policed,
            }
        })
        .collect();
    let event_count = |e: &Event| pb::Count {
        name: e.name().into(),
        value: totals.event(*e),
        node: vswitch::trace::Node::counting(*e).map_or("pmd", |n| n.name()).into(),
    };
    let drop_count = |r: &vswitch::DropReason| pb::Count {
        name: r.name().into(),
        value: totals.drop(*r),
        node: vswitch::trace::Node::dropping(*r).name().into(),
    };
    pb::StatsReply {
        ports: port_status(node),
        bridges,
        drops: vswitch::DropReason::ALL
            .iter()
            .filter(|r| totals.drop(**r) > 0)
            .map(drop_count)
            .collect(),
        events: Event::ALL.iter().filter(|e| totals.event(**e) > 0).map(event_count).collect(),
        pmds: sw
            .thread_stats()
            .iter()
            .enumerate()
            .map(|(i, t)| pb::PmdStats {
                thread: i as u32,
                busy_cycles: t.busy_cycles,
                idle_cycles: t.idle_cycles,
                packets: t.packets,
                cycles_per_packet: t.cycles_per_packet().unwrap_or(0.0),
            })
            .collect(),
        at_unix_nanos,
    }
}

/// Every remote VTEP the switch runs, with its next hop's resolution.
pub fn peer_status(node: &Node) -> Vec<pb::PeerStatus> {
    let snap = node.switch.snapshot();
    let neighbors = node.switch.neighbor_table();
    let now = vswitch::util::coarse_secs();
    let configured =
        |ip| snap.config.vtep.as_ref()?.peers.iter().find(|p| p.ip == ip)?.next_hop_mac;
    snap.peers
        .iter()
        .flatten()
        .map(|p| {
            let st = neighbors.state(p.id).unwrap_or_default();
            let (mac, confirmed) = match p.resolve {
                None => (configured(p.ip), None),
                Some(_) => (st.mac, st.confirmed.map(|c| now.saturating_sub(c))),
            };
            pb::PeerStatus {
                ip: p.ip.to_string(),
                next_hop_mac: mac.map(|m| m.to_string()),
                confirmed_secs_ago: confirmed,
                unanswered: st.unanswered,
            }
        })
        .collect()
}

/// Each PMD thread and the queues it polls, named (the API's `PmdShow`); `tsc_hz` 0 while the
/// TSC's rate is not calibrated yet (the daemon does it at start: see `Node::start`).
pub fn pmd_reply(node: &Node) -> pb::PmdShowReply {
    let snap = node.switch.snapshot();
    let name = |id: u16| snap.port(id).map_or_else(|| format!("#{id}"), |p| p.name.clone());
    let threads = node
        .pmd_threads()
        .into_iter()
        .map(|t| {
            let placed = t.placement.as_deref();
            pb::PmdThread {
                index: t.index as u32,
                core: t.core.map_or(-1, |c| c as i32),
                alive: t.alive,
                busy_cycles: placed.map_or(0, |p| p.stats.busy_cycles.get()),
                idle_cycles: placed.map_or(0, |p| p.stats.idle_cycles.get()),
                queues: placed
                    .map(|p| {
                        let pinned = |id: u16| snap.port(id).is_some_and(|p| p.pmd.is_some());
                        p.queues
                            .iter()
                            .map(|q| pb::PolledQueue {
                                port: name(q.port),
                                queue: q.queue as u32,
                                busy_cycles: q.busy_cycles(),
                                packets: q.packets(),
                                pinned: pinned(q.port),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    pb::PmdShowReply { threads, tsc_hz: vswitch::util::tsc_hz_known().unwrap_or(0.0) as u64 }
}

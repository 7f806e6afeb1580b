//! `knitterctl stats`: the node's counters, once or repeated with rates (like `vppctl show
//! int`).

use crate::Output;
use crate::out::{record, structured, table};
use anyhow::Result;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::time::Duration;
use tonic::transport::Channel;

pub(crate) async fn stats(
    c: &mut NodeClient<Channel>,
    out: Output,
    interval: Option<f64>,
    count: u32,
    queues: bool,
) -> Result<()> {
    let mut prev: Option<pb::StatsReply> = None;
    let reports = if interval.is_some() { count.max(1) } else { 1 };
    for i in 0..reports {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs_f64(interval.unwrap_or(1.0))).await;
        }
        let s = c.stats(pb::StatsRequest {}).await?.into_inner();
        if out != Output::Table {
            // Repeated: a stream of reports, a JSON line or a YAML document each.
            if interval.is_some() {
                record(out, &s)?
            } else {
                structured(out, &s)?
            }
            prev = Some(s);
            continue;
        }
        let rate = |now: u64, name: &str, f: fn(&pb::PortStatus) -> u64| -> String {
            let Some(p) = &prev else { return "-".into() };
            let secs = (s.at_unix_nanos.saturating_sub(p.at_unix_nanos)) as f64 / 1e9;
            let before = p.ports.iter().find(|x| x.name == name).map(f).unwrap_or(0);
            if secs > 0.0 {
                format!("{:.0}", now.saturating_sub(before) as f64 / secs)
            } else {
                "-".into()
            }
        };
        table(
            &[
                "port",
                "rx packets",
                "rx bytes",
                "tx packets",
                "tx bytes",
                "drops",
                "policed",
                "rx pps",
                "tx pps",
            ],
            s.ports
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.rx_packets.to_string(),
                        p.rx_bytes.to_string(),
                        p.tx_packets.to_string(),
                        p.tx_bytes.to_string(),
                        p.drops.to_string(),
                        p.policed.to_string(),
                        rate(p.rx_packets, &p.name, |x| x.rx_packets),
                        rate(p.tx_packets, &p.name, |x| x.tx_packets),
                    ]
                })
                .collect(),
        );
        if s.ports.iter().any(|p| p.tx_priority + p.priority_held + p.priority_dropped > 0) {
            println!();
            table(
                &["port", "tx priority", "tx ordinary", "priority held", "priority dropped"],
                s.ports
                    .iter()
                    .filter(|p| p.tx_priority + p.priority_held + p.priority_dropped > 0)
                    .map(|p| {
                        vec![
                            p.name.clone(),
                            p.tx_priority.to_string(),
                            p.tx_packets.saturating_sub(p.tx_priority).to_string(),
                            p.priority_held.to_string(),
                            p.priority_dropped.to_string(),
                        ]
                    })
                    .collect(),
            );
        }
        if queues {
            println!();
            table(
                &[
                    "port",
                    "queue",
                    "rx packets",
                    "rx dropped",
                    "rx starved",
                    "rx lent",
                    "tx packets",
                    "tx full",
                    "tx dropped",
                    "rx gso",
                    "rx csum",
                ],
                s.ports
                    .iter()
                    .flat_map(|p| {
                        p.queues.iter().map(|q| {
                            vec![
                                p.name.clone(),
                                q.queue.to_string(),
                                q.rx_packets.to_string(),
                                q.rx_dropped.to_string(),
                                q.rx_starved.to_string(),
                                q.rx_lent.to_string(),
                                q.tx_packets.to_string(),
                                q.tx_full.to_string(),
                                q.tx_dropped.to_string(),
                                q.rx_gso.to_string(),
                                q.rx_csum.to_string(),
                            ]
                        })
                    })
                    .collect(),
            );
        }
        println!();
        table(
            &["bridge", "packets", "flooded", "learned", "fdb entries", "policed"],
            s.bridges
                .iter()
                .map(|b| {
                    vec![
                        b.name.clone(),
                        b.packets.to_string(),
                        b.flooded.to_string(),
                        b.learned.to_string(),
                        b.fdb_entries.to_string(),
                        b.policed.to_string(),
                    ]
                })
                .collect(),
        );
        println!();
        table(
            &["pmd", "packets", "busy cycles", "idle cycles", "cycles/packet"],
            s.pmds
                .iter()
                .map(|p| {
                    vec![
                        p.thread.to_string(),
                        p.packets.to_string(),
                        p.busy_cycles.to_string(),
                        p.idle_cycles.to_string(),
                        format!("{:.0}", p.cycles_per_packet),
                    ]
                })
                .collect(),
        );
        if !s.drops.is_empty() {
            println!();
            table(
                &["node", "drop reason", "count"],
                s.drops
                    .iter()
                    .map(|d| vec![d.node.clone(), d.name.clone(), d.value.to_string()])
                    .collect(),
            );
        }
        if !s.events.is_empty() {
            println!();
            table(
                &["node", "event", "count"],
                s.events
                    .iter()
                    .map(|d| vec![d.node.clone(), d.name.clone(), d.value.to_string()])
                    .collect(),
            );
        }
        if i + 1 < reports {
            println!("--");
        }
        prev = Some(s);
    }
    Ok(())
}

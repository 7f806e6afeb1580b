//! `knitterctl pmd show`: where each rx queue is polled (`dpif-netdev/pmd-rxq-show`, VPP's
//! `show interface rx-placement`): each PMD thread, its core and how busy it is, each queue
//! it polls with its share of the thread's polling work; since each queue was given to its
//! thread, or over `--interval` seconds.

use crate::Output;
use crate::out::{structured, table};
use anyhow::Result;
use knitter_api::node as pb;
use pb::node_client::NodeClient;
use tonic::transport::Channel;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum PmdCmd {
    /// Each PMD thread, its core, and the queues it polls with their share of its work.
    Show {
        /// Measure over this many seconds instead of since each queue was placed.
        #[arg(long)]
        interval: Option<f64>,
    },
    /// Place the queues of ports without a pin by the load each takes (measured over
    /// --window seconds): the busiest first, each on the least loaded thread without a pin
    /// (like `ovs-appctl dpif-netdev/pmd-rxq-rebalance`).
    Rebalance {
        #[arg(long, default_value_t = 1.0)]
        window: f64,
    },
}

/// `now` less `before` (the same thread and queue in an earlier sample; counts that started
/// again since are taken whole).
fn delta(now: &pb::PmdShowReply, before: &pb::PmdShowReply) -> pb::PmdShowReply {
    let mut d = now.clone();
    for t in &mut d.threads {
        let Some(b) = before.threads.iter().find(|b| b.index == t.index) else { continue };
        (t.busy_cycles, t.idle_cycles) = (
            t.busy_cycles.saturating_sub(b.busy_cycles),
            t.idle_cycles.saturating_sub(b.idle_cycles),
        );
        for q in &mut t.queues {
            if let Some(bq) = b
                .queues
                .iter()
                .find(|bq| (bq.port.as_str(), bq.queue) == (q.port.as_str(), q.queue))
                && bq.busy_cycles <= q.busy_cycles
            {
                (q.busy_cycles, q.packets) =
                    (q.busy_cycles - bq.busy_cycles, q.packets.saturating_sub(bq.packets));
            }
        }
    }
    d
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 { "-".into() } else { format!("{:.1} %", 100.0 * part as f64 / whole as f64) }
}

pub(crate) async fn run(c: &mut NodeClient<Channel>, out: Output, cmd: PmdCmd) -> Result<()> {
    let interval = match cmd {
        PmdCmd::Show { interval } => interval,
        PmdCmd::Rebalance { window } => return rebalance(c, out, window).await,
    };
    let mut r = c.pmd_show(pb::PmdShowRequest {}).await?.into_inner();
    if let Some(secs) = interval {
        anyhow::ensure!(secs.is_finite() && secs > 0.0, "--interval {secs}: seconds, more than 0");
        tokio::time::sleep(std::time::Duration::from_secs_f64(secs)).await;
        let now = c.pmd_show(pb::PmdShowRequest {}).await?.into_inner();
        r = delta(&now, &r);
    }
    if out != Output::Table {
        return structured(out, &r);
    }
    let over = interval.map_or("since start".to_owned(), |s| format!("over {s} s"));
    for t in &r.threads {
        let core = if t.core < 0 { "not pinned".to_owned() } else { format!("core {}", t.core) };
        let dead = if t.alive { "" } else { ", ENDED (see the daemon's log)" };
        println!(
            "pmd {} ({core}{dead}): {} busy {over}, {} queues",
            t.index,
            percent(t.busy_cycles, t.busy_cycles + t.idle_cycles),
            t.queues.len()
        );
        let polled: u64 = t.queues.iter().map(|q| q.busy_cycles).sum();
        let rows = t
            .queues
            .iter()
            .map(|q| {
                let per =
                    q.busy_cycles.checked_div(q.packets).map_or("-".into(), |c| c.to_string());
                let port = if q.pinned {
                    format!("  {} (pinned)", q.port)
                } else {
                    format!("  {}", q.port)
                };
                vec![
                    port,
                    q.queue.to_string(),
                    percent(q.busy_cycles, polled),
                    q.packets.to_string(),
                    per,
                ]
            })
            .collect();
        table(&["  port", "queue", "share", "packets", "cycles/packet"], rows);
    }
    Ok(())
}

async fn rebalance(c: &mut NodeClient<Channel>, out: Output, window: f64) -> Result<()> {
    anyhow::ensure!(
        window.is_finite() && window > 0.0 && window <= 60.0,
        "--window {window}: seconds, more than 0, at most 60"
    );
    let r = c
        .pmd_rebalance(pb::PmdRebalanceRequest { window_ms: (window * 1000.0).max(1.0) as u32 })
        .await?
        .into_inner();
    if out != Output::Table {
        return structured(out, &r);
    }
    let thread = |t: i32| if t < 0 { "-".to_owned() } else { t.to_string() };
    let rows = r
        .queues
        .iter()
        .map(|q| {
            let moved = if q.from == q.to { "stays" } else { "moved" };
            vec![
                q.port.clone(),
                q.queue.to_string(),
                q.busy_cycles.to_string(),
                thread(q.from),
                thread(q.to),
                moved.into(),
            ]
        })
        .collect();
    table(&["port", "queue", "busy cycles", "from pmd", "to pmd", ""], rows);
    Ok(())
}

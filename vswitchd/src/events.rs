//! The node's event stream: what the control plane did (ports added and removed,
//! configuration generations) and what it saw (links going up and down, vhost-user
//! frontends connecting and going, ports that failed). A broadcast channel: every API
//! subscriber gets every event from when it subscribed; a slow one is told how many it lost.

use knitter_api::node::NodeEvent;
use tokio::sync::broadcast;

/// Events kept for subscribers that fall behind.
const BACKLOG: usize = 1024;

pub struct Events {
    tx: broadcast::Sender<NodeEvent>,
}

impl Default for Events {
    fn default() -> Self {
        Events { tx: broadcast::channel(BACKLOG).0 }
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Events {
    /// Sends an event to every subscriber (none: dropped).
    pub fn emit(&self, kind: &str, port: &str, detail: impl Into<String>, generation: u64) {
        tracing::debug!(kind, port, "event");
        let _ = self.tx.send(NodeEvent {
            at_unix_nanos: now_nanos(),
            kind: kind.into(),
            port: port.into(),
            detail: detail.into(),
            generation,
        });
    }

    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.tx.subscribe()
    }
}

/// The event a subscriber gets instead of `n` it was too slow for.
pub fn lost(n: u64) -> NodeEvent {
    NodeEvent {
        at_unix_nanos: now_nanos(),
        kind: "events_lost".into(),
        detail: format!("{n} events lost: read faster"),
        ..Default::default()
    }
}

//! The node's event stream: what the control plane did (ports added and removed,
//! configuration generations) and what it saw (links going up and down, vhost-user
//! frontends connecting and going, ports that failed). A broadcast channel: every API
//! subscriber gets every event from when it subscribed; a slow one is told how many it lost.

use crate::node::Node;
use knitter_api::node::NodeEvent;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
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
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Events {
    /// Sends an event to every subscriber (none: dropped).
    pub fn emit(&self, kind: &str, port: &str, detail: impl Into<String>, generation: u64) {
        tracing::debug!(kind, port, "event");
        let _ = self.tx.send(NodeEvent { at_unix_nanos: now_nanos(), kind: kind.into(), port: port.into(), detail: detail.into(), generation });
    }

    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.tx.subscribe()
    }
}

/// A thread that waits on rtnetlink's link notifications and wakes `changed` for each
/// batch of them; without netlink, polling alone follows links.
fn kernel_link_changes(changed: Arc<tokio::sync::Notify>) {
    use vswitch::port::netlink::Socket;
    let mut socket = match Socket::subscribe(libc::NETLINK_ROUTE, libc::RTMGRP_LINK as u32) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "no rtnetlink link notifications: links are polled only");
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("link-events".into()).spawn(move || {
        loop {
            match socket.wait(Duration::from_secs(1)) {
                Ok(true) => changed.notify_one(),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "rtnetlink link notifications failed: links are polled only");
                    return;
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no link-events thread: links are polled only");
    }
}

/// The event a subscriber gets instead of `n` it was too slow for.
pub fn lost(n: u64) -> NodeEvent {
    NodeEvent { at_unix_nanos: now_nanos(), kind: "events_lost".into(), detail: format!("{n} events lost: read faster"), ..Default::default() }
}

/// Asks every running port for its link when the kernel announces a link change in the
/// daemon's namespace (rtnetlink's link group) and every `every` besides (for ports in
/// other namespaces, and vhost-user ports), and reports changes. The first look at a port
/// reports nothing (its `port_added` did).
pub async fn watch_links(node: Arc<Node>, every: Duration) {
    let mut seen: HashMap<String, bool> = HashMap::new();
    // vhost-user ports whose stopped ring was reported (a `port_error` once per stop).
    let mut ring_errors: HashMap<String, String> = HashMap::new();
    let changed = Arc::new(tokio::sync::Notify::new());
    kernel_link_changes(changed.clone());
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = changed.notified() => {}
        }
        let snap = node.switch.snapshot();
        let mut now = HashMap::with_capacity(seen.len());
        for p in snap.ports.iter().flatten() {
            p.port.refresh_link();
            let up = p.port.link_up();
            if seen.get(&p.name).is_some_and(|was| *was != up) {
                let vhost = node.vhost_connected(&p.name).is_some();
                let detail = match (vhost, up) {
                    (true, true) => "vhost-user frontend connected, rings running",
                    (true, false) => "vhost-user frontend gone",
                    (false, true) => "interface up and running",
                    (false, false) => "interface down or without carrier",
                };
                node.events.emit(if up { "link_up" } else { "link_down" }, &p.name, detail, snap.generation);
            }
            now.insert(p.name.clone(), up);
            match node.vhost_ring_error(&p.name) {
                Some(why) if ring_errors.get(&p.name) != Some(&why) => {
                    node.events.emit("port_error", &p.name, format!("vhost-user ring stopped: {why}"), snap.generation);
                    ring_errors.insert(p.name.clone(), why);
                }
                Some(_) => {}
                None => {
                    ring_errors.remove(&p.name);
                }
            }
        }
        seen = now;
    }
}

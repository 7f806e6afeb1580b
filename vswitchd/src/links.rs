//! Following the ports' links: every running port asked for its link when rtnetlink says a
//! link changed (and on a timer, for ports in other namespaces and vhost-user ports), and a
//! `link_up`/`link_down`, or a port put in error (`port_error`: a vhost-user ring stopped,
//! a frontend refused or cut off, a panic on the port's burst), told to the event stream's
//! subscribers.

use crate::node::Node;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Asks every running port for its link when the kernel announces a link change in the
/// daemon's namespace (rtnetlink's link group) and every `every` besides (for ports in
/// other namespaces, and vhost-user ports), and reports changes. The first look at a port
/// reports nothing (its `port_added` did).
pub async fn watch_links(node: Arc<Node>, every: Duration) {
    let mut seen: HashMap<String, bool> = HashMap::new();
    // Ports whose error was reported (a `port_error` once per error).
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
                node.events.emit(
                    if up { "link_up" } else { "link_down" },
                    &p.name,
                    detail,
                    snap.generation,
                );
            }
            now.insert(p.name.clone(), up);
            let error = match node.switch.faults().get(&p.name) {
                Some(why) => Some(format!("the switch put the port in error: {why}")),
                None => node
                    .vhost_ring_error(&p.name)
                    .map(|why| format!("vhost-user port in error: {why}")),
            };
            match error {
                Some(why) if ring_errors.get(&p.name) != Some(&why) => {
                    node.events.emit("port_error", &p.name, why.clone(), snap.generation);
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

/// A thread that waits on rtnetlink's link notifications and wakes `changed` for each
/// batch of them; without netlink, polling alone follows links.
fn kernel_link_changes(changed: Arc<tokio::sync::Notify>) {
    use plumbing::netlink::Socket;
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

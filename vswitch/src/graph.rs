//! The pipeline's node graph: every logical node ([`Node`]) as its file in
//! `pipeline/` declares it ([`Descriptor`]: its name, next nodes — VPP's next indices: a
//! next index is a position in [`Node::nexts`] — drop reasons and counters), collected
//! here in [`NODES`]; where a burst enters the graph, and the checks that keep it one graph (every next names a node, every node is reachable from
//! an entry, the graph has an order to run it in). The fused dispatcher and the per-node one
//! ([`crate::pipeline::Dispatch`]) both follow it; the packet trace shows the path a frame
//! took through it, and [`edges_of`] turns a trace back into the edges it took (a test
//! checks that traces take every edge and no other).

use crate::counters::{DropReason, Event};
pub use crate::descriptor::{Descriptor, Next};
use crate::pipeline::{
    cache, classify, decap, encap, flood, forward, learn, neighbor, rewrite, tx,
};
use crate::trace::{FrameTrace, Node, Step};

/// Every node, in [`Node`]'s order (adding a node: its file's descriptor and a line here).
pub const NODES: [&Descriptor; Node::ALL.len()] = [
    &cache::NODE,
    &classify::NODE,
    &decap::NODE,
    &classify::PORT_SECURITY,
    &learn::NODE,
    &forward::SUPPRESS,
    &forward::NODE,
    &flood::NODE,
    &rewrite::NODE,
    &encap::NODE,
    &neighbor::NODE,
    &tx::NODE,
    &decap::VTEP,
];

/// The nodes a received burst enters at: the cache, or (cache off, missed, traced) the local
/// port's classification or the underlay's decapsulation, or — an underlay frame that is not
/// VXLAN (ARP, neighbor discovery) — the VTEP's own neighbor handling.
pub const ENTRIES: &[Node] = &[Node::Cache, Node::Classify, Node::Decap, Node::Vtep];

impl Node {
    /// Its file's descriptor.
    pub fn descriptor(self) -> &'static Descriptor {
        NODES[self as usize]
    }

    /// This node's next nodes, in next-index order.
    pub fn nexts(self) -> &'static [Next] {
        self.descriptor().nexts
    }

    /// The node whose counter event `e` is (`None`: the PMD thread's, not a node's), as the
    /// nodes' descriptors say ([`check`]: at most one).
    pub fn counting(e: Event) -> Option<Node> {
        NODES.iter().find(|d| d.counts.contains(&e)).map(|d| d.node)
    }

    /// The node that drops a frame for `r`, as the nodes' descriptors say
    /// ([`check`]: exactly one).
    pub fn dropping(r: DropReason) -> Node {
        NODES.iter().find(|d| d.drops.contains(&r)).map_or(Node::Tx, |d| d.node)
    }

    /// The next index of `to` from this node.
    pub fn next_index(self, to: Next) -> Option<usize> {
        self.nexts().iter().position(|n| *n == to)
    }
}

/// What is wrong with the graph.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("NODES lists {0} in {1}'s place")]
    Misplaced(&'static str, &'static str),
    #[error("drop reason {0} is counted by {1} nodes (one, exactly)")]
    DropOwners(&'static str, usize),
    #[error("event {0} is counted by {1} nodes (at most one)")]
    EventOwners(&'static str, usize),
    #[error("node {0} cannot be reached from an entry")]
    Unreachable(&'static str),
    #[error("node {0} lists next {1} twice")]
    DuplicateNext(&'static str, String),
    #[error("node {0} drops frames for a reason but has no drop next")]
    DropsWithoutNext(&'static str),
    #[error("the graph has a cycle through {0} other than neighbor-hold's retry")]
    Cycle(&'static str),
}

/// Checks the graph; returns its nodes in an order to run them in (every node before its
/// next nodes, neighbor-hold's retry of vxlan-encap aside: parked frames go back to
/// encapsulation on a later burst).
pub fn check() -> Result<Vec<Node>, GraphError> {
    for (d, n) in NODES.iter().zip(Node::ALL) {
        if d.node != *n {
            return Err(GraphError::Misplaced(d.name, n.name()));
        }
    }
    for r in DropReason::ALL {
        match NODES.iter().filter(|d| d.drops.contains(r)).count() {
            1 => {}
            k => return Err(GraphError::DropOwners(r.name(), k)),
        }
    }
    for e in Event::ALL {
        match NODES.iter().filter(|d| d.counts.contains(e)).count() {
            0 | 1 => {}
            k => return Err(GraphError::EventOwners(e.name(), k)),
        }
    }
    for n in Node::ALL {
        for (i, x) in n.nexts().iter().enumerate() {
            if n.nexts()[..i].contains(x) {
                return Err(GraphError::DuplicateNext(n.name(), format!("{x:?}")));
            }
        }
    }
    for r in crate::DropReason::ALL {
        let n = Node::dropping(*r);
        if n.next_index(Next::Drop).is_none() {
            return Err(GraphError::DropsWithoutNext(n.name()));
        }
    }
    let forward = |n: Node| {
        n.nexts().iter().filter_map(move |x| match x {
            Next::Node(m) if !(n == Node::NeighborHold && *m == Node::Encap) => Some(*m),
            _ => None,
        })
    };
    let mut reached: Vec<Node> = ENTRIES.to_vec();
    let mut i = 0;
    while i < reached.len() {
        for m in forward(reached[i]) {
            if !reached.contains(&m) {
                reached.push(m);
            }
        }
        i += 1;
    }
    if let Some(n) = Node::ALL.iter().find(|n| !reached.contains(n)) {
        return Err(GraphError::Unreachable(n.name()));
    }
    // Kahn's algorithm over the forward edges.
    let mut order = Vec::new();
    let mut left: Vec<Node> = Node::ALL.to_vec();
    while !left.is_empty() {
        let ready = left.iter().position(|n| !left.iter().any(|m| forward(*m).any(|x| x == *n)));
        match ready {
            Some(k) => order.push(left.remove(k)),
            None => return Err(GraphError::Cycle(left[0].name())),
        }
    }
    Ok(order)
}

/// The edges a traced frame took, in order: (from, to), `None` as `from` for its entry.
/// A flood's copies each leave from `flood`; a drop is an edge from the node that dropped
/// it (whose step comes before the drop's, or which records none for frames it drops; the
/// reason may be counted under another node's name: [`Node::dropping`]).
pub fn edges_of(t: &FrameTrace) -> Vec<(Option<Node>, Next)> {
    let mut out = Vec::new();
    let mut prev: Option<Node> = None;
    let mut flooded = false;
    for s in t.steps() {
        let Some(node) = s.node() else { continue };
        if let Step::Drop { .. } = s {
            // Classification, port security and decapsulation record their step only for
            // frames they pass: a frame one of them drops shows only the drop.
            if prev != Some(node)
                && matches!(node, Node::Classify | Node::PortSecurity | Node::Decap)
            {
                out.push((prev, Next::Node(node)));
                prev = Some(node);
            }
            out.push((prev, Next::Drop));
            continue;
        }
        // A cache hit is reported and then the full path is taken: the hit's own edge.
        if let Step::Cache { hit: Some((_, d)) } = s {
            let to = match d {
                crate::fdb::Dest::Port(_) => Node::VlanRewrite,
                crate::fdb::Dest::Peer(_) => Node::Encap,
            };
            out.push((None, Next::Node(Node::Cache)));
            out.push((Some(Node::Cache), Next::Node(to)));
            prev = Some(Node::Cache);
            continue;
        }
        if prev == Some(node) {
            continue;
        }
        let from = if flooded && matches!(node, Node::VlanRewrite | Node::Encap) {
            Some(Node::Flood)
        } else {
            prev
        };
        out.push((from, Next::Node(node)));
        flooded |= node == Node::Flood;
        prev = Some(node);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graph_is_one_graph_with_an_order() {
        let order = check().expect("the graph checks");
        assert_eq!(order.len(), Node::ALL.len());
        let pos = |n: Node| order.iter().position(|m| *m == n).unwrap_or(usize::MAX);
        for n in Node::ALL {
            for x in n.nexts() {
                if let Next::Node(m) = x
                    && !(*n == Node::NeighborHold && *m == Node::Encap)
                {
                    assert!(pos(*n) < pos(*m), "{} runs before {}", n.name(), m.name());
                }
            }
        }
        // The per-node dispatcher runs its frames' nodes in this order.
        assert!(pos(Node::Flood) < pos(Node::VlanRewrite) && pos(Node::Flood) < pos(Node::Encap));
    }

    #[test]
    fn every_counter_is_a_node_s_but_the_thread_s_own() {
        for e in crate::Event::ALL {
            assert_eq!(
                Node::counting(*e).is_none(),
                *e == crate::Event::ConfigAdopted,
                "{}",
                e.name()
            );
        }
        for r in crate::DropReason::ALL {
            assert!(Node::dropping(*r).next_index(Next::Drop).is_some(), "{}", r.name());
        }
    }

    #[test]
    fn every_node_but_entries_has_a_node_before_it() {
        for n in Node::ALL.iter().filter(|n| !ENTRIES.contains(n)) {
            assert!(
                Node::ALL.iter().any(|m| m.next_index(Next::Node(*n)).is_some()),
                "{} has no way in",
                n.name()
            );
        }
    }
}

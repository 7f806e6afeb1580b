//! A pipeline node as its file declares it (VPP's `VLIB_REGISTER_NODE`): its name, next
//! nodes, drop reasons and events. Each node file in `pipeline/` has one; [`crate::graph`]
//! collects them and checks the graph they make. A leaf: node files import it, not the graph.

use crate::counters::{DropReason, Event};
use crate::trace::Node;

/// A node as its file declares it (VPP's `VLIB_REGISTER_NODE`).
#[derive(Debug)]
pub struct Descriptor {
    pub node: Node,
    /// Its name in traces, counters and metrics.
    pub name: &'static str,
    /// Where it hands frames, in next-index order.
    pub nexts: &'static [Next],
    /// The drop reasons counted against it.
    pub drops: &'static [DropReason],
    /// The events it counts.
    pub counts: &'static [Event],
}

/// Where a node hands a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Next {
    Node(Node),
    /// Dropped, counted by reason ([`crate::DropReason`]; [`Node::dropping`] names the
    /// node whose counter it is).
    Drop,
}

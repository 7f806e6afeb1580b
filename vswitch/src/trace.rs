//! Packet trace, like VPP's `trace add` and OVS's `ofproto/trace`: for chosen frames, each
//! logical node of the pipeline they passed, the decision it took and the fields that
//! decided.
//!
//! Two uses. **Live**: [`Tracing::arm`] picks an ingress port and a frame count; a PMD thread
//! checks once per burst whether the burst's port is armed (one load), and only such a burst
//! takes the traced path: the full slow path (the exact-match cache is read and its decision
//! reported, never used or filled, so the trace shows what the tables decide and whether the
//! cache agrees), recording into a [`FrameTrace`] per frame. Finished traces go to a bounded
//! queue the control side drains. **Synthetic** (dry): a made-up frame runs through the
//! current snapshot in a private pipeline that learns nothing, asks for no next hop and
//! sends nothing (`Pipeline::trace_dry`).
//!
//! Steps are plain values (ids, not names) recorded without allocation; [`FrameTrace::render`]
//! turns them into text with the snapshot's names on the control side.

use crate::counters::DropReason;
use crate::fdb::Dest;
use crate::snapshot::Snapshot;
use crate::wire::ethernet::{self, ethertype};
use crate::wire::{MacAddr, arp, ipv4, ipv6, udp, vxlan};
use crossbeam_queue::ArrayQueue;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Steps one frame's trace keeps (a flood to many ports records the rest as a count).
pub const MAX_STEPS: usize = 24;
/// Bytes of the frame as received a trace keeps.
pub const HEAD_BYTES: usize = 128;
/// Traces waiting for the control side (and the most one request may ask for).
pub const MAX_TRACES: usize = 256;

/// The logical nodes of the pipeline, in the order a frame meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// The exact-match cache (stage 0).
    Cache,
    /// (port, VLAN) → bridge domain, L2 sanity.
    Classify,
    /// VXLAN decapsulation on the underlay: (source, VNI) → bridge domain.
    Decap,
    /// A pod port's MAC/IP/ARP/ND checks.
    PortSecurity,
    /// MAC learning.
    Learn,
    /// ARP/ND answered from the bridge domain's table.
    Suppress,
    /// FDB lookup of the destination.
    Forward,
    /// Copies to every member (split horizon).
    Flood,
    /// The egress port's tagging.
    VlanRewrite,
    /// VXLAN encapsulation to a peer.
    Encap,
    /// Frames waiting for a peer's next-hop MAC.
    NeighborHold,
    /// Queued on a port's tx batch.
    Tx,
    /// The VTEP's own neighbor traffic (answers to it, requests for its address).
    Vtep,
}

impl Node {
    pub const ALL: &'static [Node] = &[
        Node::Cache,
        Node::Classify,
        Node::Decap,
        Node::PortSecurity,
        Node::Learn,
        Node::Suppress,
        Node::Forward,
        Node::Flood,
        Node::VlanRewrite,
        Node::Encap,
        Node::NeighborHold,
        Node::Tx,
        Node::Vtep,
    ];

    pub fn name(self) -> &'static str {
        self.descriptor().name
    }
}

/// What learning did with a frame's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// Learning is off for this side of the bridge domain.
    Off,
    /// Known behind this ingress and refreshed this second: nothing written.
    Fresh,
    Refreshed,
    New,
    Moved,
    StaticRefused,
    Limit,
    Busy,
    /// A synthetic trace: the FDB is not written (it would have been).
    WouldLearn,
}

/// How the egress port's tagging changed the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retag {
    Keep,
    Push {
        tpid: u16,
        vid: u16,
    },
    Pop,
    /// A tag kept, its TPID set to the egress port's.
    Tpid(u16),
}

/// One node's decision about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Step {
    #[default]
    None,
    /// The cache's decision for the frame (`None`: a miss): reported, not used.
    Cache {
        hit: Option<(u16, Dest)>,
    },
    Classify {
        bd: u16,
        vid: u16,
        pcp: u8,
    },
    Decap {
        peer: u16,
        bd: u16,
    },
    PortSecurity,
    Learn {
        bd: u16,
        mac: MacAddr,
        outcome: Learned,
    },
    Suppress {
        arp: bool,
    },
    /// The destination's FDB entry (`None`: unknown, or a group address).
    Forward {
        mac: MacAddr,
        found: Option<Dest>,
    },
    /// The FDB points somewhere no longer in the bridge domain.
    Stale {
        mac: MacAddr,
    },
    Flood {
        bd: u16,
        copies: u16,
    },
    VlanRewrite {
        port: u16,
        op: Retag,
    },
    Encap {
        peer: u16,
        vni: u32,
        dscp: u8,
        priority: bool,
    },
    NeighborHold {
        peer: u16,
    },
    Tx {
        port: u16,
        first: bool,
        sent: bool,
    },
    /// The VTEP answered a neighbor asking for its address (sent back out of the ingress).
    VtepAnswer,
    /// An answer to the VTEP's own neighbor request, learned and done with.
    VtepLearned,
    Drop {
        reason: DropReason,
        port: u16,
    },
}

impl Step {
    pub fn node(&self) -> Option<Node> {
        Some(match self {
            Step::None => return None,
            Step::Cache { .. } => Node::Cache,
            Step::Classify { .. } => Node::Classify,
            Step::Decap { .. } => Node::Decap,
            Step::PortSecurity => Node::PortSecurity,
            Step::Learn { .. } => Node::Learn,
            Step::Suppress { .. } => Node::Suppress,
            Step::Forward { .. } | Step::Stale { .. } => Node::Forward,
            Step::Flood { .. } => Node::Flood,
            Step::VlanRewrite { .. } => Node::VlanRewrite,
            Step::Encap { .. } => Node::Encap,
            Step::NeighborHold { .. } => Node::NeighborHold,
            Step::Tx { .. } => Node::Tx,
            Step::VtepAnswer | Step::VtepLearned => Node::Vtep,
            Step::Drop { reason, .. } => Node::dropping(*reason),
        })
    }
}

/// What the pipeline did with one frame.
#[derive(Debug, Clone)]
pub struct FrameTrace {
    /// Order across threads (a trace's number).
    pub seq: u64,
    pub thread: usize,
    pub port: u16,
    /// The frame's length as received, and its first bytes.
    pub len: u32,
    pub head: [u8; HEAD_BYTES],
    pub head_len: u16,
    steps: [Step; MAX_STEPS],
    n: u8,
    /// Steps past [`MAX_STEPS`] (a large flood), not kept.
    pub more: u16,
    /// A synthetic frame: nothing was learned or sent.
    pub dry: bool,
}

impl Default for FrameTrace {
    fn default() -> Self {
        FrameTrace {
            seq: 0,
            thread: 0,
            port: 0,
            len: 0,
            head: [0; HEAD_BYTES],
            head_len: 0,
            steps: [Step::None; MAX_STEPS],
            n: 0,
            more: 0,
            dry: false,
        }
    }
}

impl FrameTrace {
    /// Starts the trace of a frame received on `port` whose bytes begin with `head`.
    pub fn start(&mut self, port: u16, len: usize, head: &[u8]) {
        let k = head.len().min(HEAD_BYTES);
        self.head[..k].copy_from_slice(&head[..k]);
        (self.port, self.len, self.head_len, self.n, self.more) =
            (port, len as u32, k as u16, 0, 0);
    }

    pub fn push(&mut self, s: Step) {
        match self.steps.get_mut(self.n as usize) {
            Some(slot) => {
                *slot = s;
                self.n += 1;
            }
            None => self.more = self.more.saturating_add(1),
        }
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps[..self.n as usize]
    }

    /// The logical nodes the frame passed, in order, each once.
    pub fn nodes(&self) -> Vec<Node> {
        let mut v: Vec<Node> = Vec::new();
        for n in self.steps().iter().filter_map(Step::node) {
            if !v.contains(&n) {
                v.push(n);
            }
        }
        v
    }

    /// The frame's headers in one line, and each step as (node, what it decided), with the
    /// names `snap` gives ids.
    pub fn render(&self, snap: &Snapshot) -> (String, Vec<(&'static str, String)>) {
        let names = Names(snap);
        let mut steps: Vec<(&'static str, String)> =
            self.steps().iter().filter_map(|s| Some((s.node()?.name(), names.step(s)))).collect();
        if self.more > 0 {
            steps.push(("...", format!("{} more steps not kept", self.more)));
        }
        (describe_frame(&self.head[..self.head_len as usize], self.len), steps)
    }
}

struct Names<'s>(&'s Snapshot);

impl Names<'_> {
    fn port(&self, id: u16) -> String {
        self.0.port(id).map_or_else(|| format!("#{id}"), |p| p.name.clone())
    }

    fn bd(&self, id: u16) -> String {
        self.0.bd(id).map_or_else(|| format!("#{id}"), |b| b.name.clone())
    }

    fn peer(&self, id: u16) -> String {
        self.0.peer(id).map_or_else(|| format!("peer #{id}"), |p| format!("vtep {}", p.ip))
    }

    fn dest(&self, d: Dest) -> String {
        match d {
            Dest::Port(p) => format!("port {}", self.port(p)),
            Dest::Peer(p) => self.peer(p),
        }
    }

    fn step(&self, s: &Step) -> String {
        match *s {
            Step::None => String::new(),
            Step::Cache { hit: None } => {
                "miss (traced frames take the full path; the cache is not filled)".into()
            }
            Step::Cache { hit: Some((bd, d)) } => {
                format!("hit: bridge {} → {} (not used while tracing)", self.bd(bd), self.dest(d))
            }
            Step::Classify { bd, vid: 0, pcp } => {
                format!("untagged → bridge {}{}", self.bd(bd), pcp_text(pcp))
            }
            Step::Classify { bd, vid, pcp } => {
                format!("vlan {vid} → bridge {}{}", self.bd(bd), pcp_text(pcp))
            }
            Step::Decap { peer, bd } => {
                let vni = self
                    .0
                    .bd(bd)
                    .and_then(|b| b.vni)
                    .map_or_else(String::new, |v| format!(" vni {v}"));
                format!("from {}{vni} → bridge {}", self.peer(peer), self.bd(bd))
            }
            Step::PortSecurity => "passed (source MAC and addresses allowed)".into(),
            Step::Learn { bd, mac, outcome } => {
                let what = match outcome {
                    Learned::Off => "learning off",
                    Learned::Fresh => "known here (fresh)",
                    Learned::Refreshed => "refreshed",
                    Learned::New => "learned",
                    Learned::Moved => "moved here",
                    Learned::StaticRefused => "not learned: a static entry points elsewhere",
                    Learned::Limit => "not learned: MAC limit",
                    Learned::Busy => "not learned: bucket busy",
                    Learned::WouldLearn => "would learn (synthetic: the FDB is not written)",
                };
                format!("src {mac} in bridge {}: {what}", self.bd(bd))
            }
            Step::Suppress { arp } => format!(
                "{} answered from the bridge's table, back to the ingress",
                if arp { "ARP request" } else { "neighbor solicitation" }
            ),
            Step::Forward { mac, found: Some(d) } => format!("dst {mac} → {}", self.dest(d)),
            Step::Forward { mac, found: None } if mac.is_group() => {
                format!("dst {mac}: group address → flood")
            }
            Step::Forward { mac, found: None } => format!("dst {mac}: unknown → flood"),
            Step::Stale { mac } => format!("dst {mac}: entry points outside the bridge → flood"),
            Step::Flood { bd, copies } => {
                format!("bridge {}: {copies} egress(es), split horizon", self.bd(bd))
            }
            Step::VlanRewrite { port, op } => {
                let what = match op {
                    Retag::Keep => "untagged, unchanged".to_string(),
                    Retag::Push { tpid, vid } => format!("push tag {tpid:#06x} vlan {vid}"),
                    Retag::Pop => "pop tag".to_string(),
                    Retag::Tpid(t) => format!("tag kept, tpid {t:#06x}"),
                };
                format!("to port {}: {what}", self.port(port))
            }
            Step::Encap { peer, vni, dscp, priority } => {
                let mark = if dscp != 0 { format!(", dscp {dscp}") } else { String::new() };
                let first = if priority { ", priority egress" } else { "" };
                format!("vni {vni} to {}{mark}{first}", self.peer(peer))
            }
            Step::NeighborHold { peer } => {
                format!("next hop of {} not resolved: the frame waits", self.peer(peer))
            }
            Step::Tx { port, first, sent } => {
                let q = if first { "priority batch" } else { "tx batch" };
                if sent {
                    format!("queued on port {} ({q})", self.port(port))
                } else {
                    format!("port {} (synthetic: not sent)", self.port(port))
                }
            }
            Step::VtepAnswer => "a neighbor asked for the VTEP's address: answered".into(),
            Step::VtepLearned => "an answer to the VTEP's next-hop request: learned".into(),
            Step::Drop { reason, port } => {
                format!("DROP {} (port {})", reason.name(), self.port(port))
            }
        }
    }
}

fn pcp_text(pcp: u8) -> String {
    if pcp == 0 { String::new() } else { format!(", pcp {pcp}") }
}

/// One line naming a frame's headers (Ethernet, tags, ARP/IPv4/IPv6, UDP/TCP, VXLAN and the
/// inner frame's), as far as `head` holds them.
pub fn describe_frame(head: &[u8], len: u32) -> String {
    let mut s = format!("{len} bytes: ");
    describe_eth(&mut s, head, 0);
    s
}

fn describe_eth(s: &mut String, h: &[u8], depth: u8) {
    let Ok(f) = ethernet::Frame::new_checked(h) else { return s.push_str("runt") };
    let _ = write!(s, "eth {} > {}", f.src(), f.dst());
    // Tags as they come (QinQ: the outer then the inner), each seen as an Ethernet header
    // with its addresses moved on by a tag.
    let (mut et, mut rest) = (f.ethertype(), &h[12..]);
    while ethernet::is_tpid(et) {
        let Some(tci) = rest.get(2..4).map(|t| u16::from_be_bytes([t[0], t[1]])) else { return };
        let _ = write!(s, ", vlan {} pcp {}", tci & 0xfff, tci >> 13);
        rest = &rest[4..];
        let Some(next) = rest.get(..2).map(|t| u16::from_be_bytes([t[0], t[1]])) else { return };
        et = next;
    }
    let payload = &rest[2..];
    match et {
        ethertype::ARP => match arp::Packet::new_checked(payload) {
            Ok(a) => {
                let _ = write!(
                    s,
                    ", arp {} {} > {}",
                    if a.op() == 1 { "request" } else { "reply" },
                    a.spa(),
                    a.tpa()
                );
            }
            Err(e) => {
                let _ = write!(s, ", arp ({e})");
            }
        },
        ethertype::IPV4 => describe_ipv4(s, payload, depth),
        ethertype::IPV6 => describe_ipv6(s, payload, depth),
        _ => {
            let _ = write!(s, ", ethertype {et:#06x}");
        }
    }
}

fn describe_ipv4(s: &mut String, h: &[u8], depth: u8) {
    let p = match ipv4::Packet::header_checked(h) {
        Ok(p) => p,
        Err(e) => {
            return {
                let _ = write!(s, ", ipv4 ({e})");
            };
        }
    };
    let _ = write!(s, ", ipv4 {} > {} tos {:#04x} ttl {}", p.src(), p.dst(), p.tos(), p.ttl());
    describe_l4(s, p.protocol(), p.rest(), depth);
}

fn describe_ipv6(s: &mut String, h: &[u8], depth: u8) {
    let p = match ipv6::Packet::header_checked(h) {
        Ok(p) => p,
        Err(e) => {
            return {
                let _ = write!(s, ", ipv6 ({e})");
            };
        }
    };
    let _ = write!(
        s,
        ", ipv6 {} > {} tc {:#04x} hlim {}",
        p.src(),
        p.dst(),
        p.traffic_class(),
        p.hop_limit()
    );
    describe_l4(s, p.next_header(), p.rest(), depth);
}

fn describe_l4(s: &mut String, proto: u8, h: &[u8], depth: u8) {
    match proto {
        ipv4::PROTO_UDP => {
            let Ok(u) = udp::Packet::header_checked(h) else {
                return s.push_str(", udp (truncated)");
            };
            let _ = write!(s, ", udp {} > {}", u.src_port(), u.dst_port());
            if u.dst_port() == vxlan::DEFAULT_PORT
                && depth == 0
                && let Ok(vx) = vxlan::Header::new_checked(u.rest())
            {
                let _ = write!(s, ", vxlan vni {} [", vx.vni());
                describe_eth(s, &u.rest()[vxlan::HEADER_LEN..], depth + 1);
                s.push(']');
            }
        }
        ipv4::PROTO_TCP => match h.get(..4) {
            Some(p) => {
                let _ = write!(
                    s,
                    ", tcp {} > {}",
                    u16::from_be_bytes([p[0], p[1]]),
                    u16::from_be_bytes([p[2], p[3]])
                );
            }
            None => s.push_str(", tcp (truncated)"),
        },
        1 => s.push_str(", icmp"),
        ipv6::NEXT_ICMPV6 => {
            let t = h.first().copied().unwrap_or(0);
            let _ = write!(s, ", icmpv6 type {t}");
        }
        p => {
            let _ = write!(s, ", proto {p}");
        }
    }
}

/// The trace request PMD threads read (once per burst) and the traces they hand back.
pub struct Tracing {
    /// The armed ingress port plus one (0: off).
    armed: AtomicU32,
    /// Frames still to trace.
    remaining: AtomicU32,
    seq: AtomicU64,
    done: ArrayQueue<FrameTrace>,
    /// Traces that found the queue full (the control side did not drain it).
    lost: AtomicU64,
}

impl Default for Tracing {
    fn default() -> Self {
        Tracing {
            armed: AtomicU32::new(0),
            remaining: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            done: ArrayQueue::new(MAX_TRACES),
            lost: AtomicU64::new(0),
        }
    }
}

impl Tracing {
    /// Traces the next `count` frames (at most [`MAX_TRACES`]) received on port id `port`;
    /// replaces any earlier request and drops traces not yet taken.
    pub fn arm(&self, port: u16, count: u32) {
        self.armed.store(0, SeqCst);
        while self.done.pop().is_some() {}
        self.remaining.store(count.min(MAX_TRACES as u32), SeqCst);
        self.armed.store(port as u32 + 1, SeqCst);
    }

    pub fn disarm(&self) {
        self.armed.store(0, SeqCst);
        self.remaining.store(0, SeqCst);
    }

    /// Whether bursts from `port` are traced (the PMD's one check per burst).
    #[inline(always)]
    pub fn armed_for(&self, port: u16) -> bool {
        self.armed.load(Relaxed) == port as u32 + 1
    }

    /// Frames still to trace.
    pub fn remaining(&self) -> u32 {
        self.remaining.load(Acquire)
    }

    /// Claims up to `n` frames of a burst to trace; the last claim disarms.
    pub(crate) fn claim(&self, n: usize) -> usize {
        let mut cur = self.remaining.load(Acquire);
        loop {
            let k = cur.min(n as u32);
            if k == 0 {
                self.armed.store(0, Release);
                return 0;
            }
            match self.remaining.compare_exchange_weak(cur, cur - k, AcqRel, Acquire) {
                Ok(_) => {
                    if cur == k {
                        self.armed.store(0, Release);
                    }
                    return k as usize;
                }
                Err(c) => cur = c,
            }
        }
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Relaxed)
    }

    pub(crate) fn hand_over(&self, t: FrameTrace) {
        if self.done.push(t).is_err() {
            self.lost.fetch_add(1, Relaxed);
        }
    }

    /// The finished traces, in the order they were taken from the queue (sort by `seq`).
    pub fn take(&self) -> Vec<FrameTrace> {
        let mut v: Vec<FrameTrace> = std::iter::from_fn(|| self.done.pop()).collect();
        v.sort_by_key(|t| t.seq);
        v
    }

    /// Traces lost because the queue was full.
    pub fn lost(&self) -> u64 {
        self.lost.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_reason_belongs_to_a_node() {
        for r in DropReason::ALL {
            let n = Node::dropping(*r);
            assert!(Node::ALL.contains(&n), "{r:?}");
        }
    }

    #[test]
    fn claims_stop_at_the_count_and_disarm() {
        let t = Tracing::default();
        t.arm(3, 40);
        assert!(t.armed_for(3) && !t.armed_for(4));
        assert_eq!(t.claim(32), 32);
        assert!(t.armed_for(3));
        assert_eq!(t.claim(32), 8);
        assert!(!t.armed_for(3));
        assert_eq!(t.claim(32), 0);
    }

    #[test]
    fn a_trace_keeps_its_steps_and_counts_the_rest() {
        let mut f = FrameTrace::default();
        f.start(1, 60, &[0u8; 200]);
        assert_eq!(f.head_len as usize, HEAD_BYTES);
        for _ in 0..MAX_STEPS + 3 {
            f.push(Step::PortSecurity);
        }
        assert_eq!(f.steps().len(), MAX_STEPS);
        assert_eq!(f.more, 3);
        assert_eq!(f.nodes(), vec![Node::PortSecurity]);
    }

    #[test]
    fn frames_are_described_through_vxlan() {
        let mut f = vec![0u8; 0];
        f.extend([2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        f.extend([0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend([0x12, 0x34, 0x12, 0xb5, 0, 0, 0, 0]);
        f.extend([8, 0, 0, 0, 0, 0, 100, 0]);
        f.extend([2, 0, 0, 0, 0, 4, 2, 0, 0, 0, 0, 3, 0x81, 0x00, 0x20, 10, 0x08, 0x06]);
        let s = describe_frame(&f, 100);
        assert!(s.contains("eth 02:00:00:00:00:01 > 02:00:00:00:00:02"), "{s}");
        assert!(s.contains("ipv4 10.0.0.1 > 10.0.0.2"), "{s}");
        assert!(
            s.contains("vxlan vni 100 [eth 02:00:00:00:00:03 > 02:00:00:00:00:04, vlan 10 pcp 1"),
            "{s}"
        );
        // Truncated input never panics.
        for k in 0..f.len() {
            describe_frame(&f[..k], k as u32);
        }
    }
}

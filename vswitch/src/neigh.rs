//! Next-hop resolution for VTEP peers whose next-hop MAC is not configured (the dedicated
//! VTEP address mode): ARP over IPv4 and neighbor discovery over IPv6, sent from the VTEP's
//! own address, with Linux's timers in miniature.
//!
//! The state is one slot per peer, shared by the PMD threads and written without locks:
//! the MAC (read for every frame to that peer), when it was last confirmed, when it was last
//! asked for (a compare-and-swap on that second elects the one thread that sends the request),
//! and how many requests went unanswered. A slot is
//! - *incomplete* while it has no MAC: frames wait in the sending thread's queue (see
//!   [`Parked`]) while requests go out once a second; after [`MAX_PROBES`] unanswered ones,
//!   frames that waited [`MAX_PROBES`] seconds are dropped (`neighbor_unresolved`), and
//!   requests go on once a second while traffic keeps coming;
//! - *reachable* for [`REACHABLE_SECS`] after an answer; then it is re-confirmed by requests
//!   (once a second) while frames keep using the MAC; [`MAX_PROBES`] unanswered requests
//!   forget it.
//!
//! Answers are learned from any ARP packet (reply, or request) whose sender is a next hop and
//! whose target is the VTEP's address, and from neighbor advertisements for a next hop's
//! address sent to the VTEP's address.

use crate::buf::{BufId, Pool, PoolCache};
use crate::wire::{MacAddr, arp, ethernet, icmpv6, ipv6};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Requests without an answer before a MAC is forgotten (or frames waiting are dropped).
pub const MAX_PROBES: u32 = 3;
/// Seconds an answer is trusted before it is re-confirmed.
pub const REACHABLE_SECS: u32 = 30;
/// Frames one PMD thread keeps waiting for resolution.
pub const PARKED_MAX: usize = 256;

const VALID: u64 = 1 << 48;
const NEVER: u32 = u32::MAX;

struct Slot {
    /// The MAC in the low 48 bits with [`VALID`], or 0.
    mac: AtomicU64,
    confirmed: AtomicU32,
    asked: AtomicU32,
    unanswered: AtomicU32,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            mac: AtomicU64::new(0),
            confirmed: AtomicU32::new(NEVER),
            asked: AtomicU32::new(NEVER),
            unanswered: AtomicU32::new(0),
        }
    }
}

/// The state of one peer's next hop, as the API shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NeighborState {
    pub mac: Option<MacAddr>,
    /// Second of the last answer.
    pub confirmed: Option<u32>,
    pub unanswered: u32,
}

/// Resolution state of every peer's next hop, indexed by peer id.
pub struct Neighbors {
    slots: Box<[Slot]>,
    /// Bumped when a slot gains or changes its MAC, so threads with waiting frames look again.
    learned: AtomicU32,
}

impl std::fmt::Debug for Neighbors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Neighbors({} slots)", self.slots.len())
    }
}

/// What a frame to a peer should do about its next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Send with this destination MAC.
    Send(MacAddr),
    /// Wait for an answer.
    Wait,
}

impl Neighbors {
    pub fn new(peers: usize) -> Neighbors {
        Neighbors {
            slots: (0..peers).map(|_| Slot::default()).collect(),
            learned: AtomicU32::new(0),
        }
    }

    fn slot(&self, peer: u16) -> Option<&Slot> {
        self.slots.get(peer as usize)
    }

    /// Changes whenever a next hop gains or changes its MAC.
    #[inline(always)]
    pub fn generation(&self) -> u32 {
        self.learned.load(Acquire)
    }

    /// The MAC to send to `peer` with, if known and confirmed less than [`REACHABLE_SECS`]
    /// ago (the per-frame case: reads only).
    #[inline(always)]
    pub fn fresh_mac(&self, peer: u16, now: u32) -> Option<MacAddr> {
        let s = self.slot(peer)?;
        let v = s.mac.load(Acquire);
        (v & VALID != 0 && now.wrapping_sub(s.confirmed.load(Relaxed)) < REACHABLE_SECS)
            .then(|| MacAddr::from_u64(v & 0xffff_ffff_ffff))
    }

    /// The MAC to send to `peer` with, if known.
    #[inline(always)]
    pub fn mac(&self, peer: u16) -> Option<MacAddr> {
        let v = self.slot(peer)?.mac.load(Acquire);
        (v & VALID != 0).then(|| MacAddr::from_u64(v & 0xffff_ffff_ffff))
    }

    /// Decides for a frame to `peer` at second `now`, and whether this thread must send a
    /// request now (at most one request per peer and second across all threads). With
    /// `may_ask` false (the kernel resolves, see `kernel_ports::kernel_neigh`) nobody is elected here.
    pub fn next(&self, peer: u16, now: u32, may_ask: bool) -> (Next, bool) {
        let Some(s) = self.slot(peer) else { return (Next::Wait, false) };
        let v = s.mac.load(Acquire);
        let known = v & VALID != 0;
        let fresh = known && now.wrapping_sub(s.confirmed.load(Relaxed)) < REACHABLE_SECS;
        let ask = may_ask && !fresh && self.claim(s, now);
        // The claim may just have forgotten the MAC.
        let v = if ask { s.mac.load(Acquire) } else { v };
        let known = v & VALID != 0;
        let next =
            if known { Next::Send(MacAddr::from_u64(v & 0xffff_ffff_ffff)) } else { Next::Wait };
        (next, ask)
    }

    /// Elects the caller to send this second's request; counts it as unanswered until an
    /// answer comes, and forgets a MAC that [`MAX_PROBES`] requests could not confirm.
    fn claim(&self, s: &Slot, now: u32) -> bool {
        let asked = s.asked.load(Relaxed);
        if asked == now || s.asked.compare_exchange(asked, now, AcqRel, Relaxed).is_err() {
            return false;
        }
        if s.unanswered.fetch_add(1, AcqRel) >= MAX_PROBES && s.mac.swap(0, AcqRel) != 0 {
            self.learned.fetch_add(1, Release);
        }
        true
    }

    /// Elects the caller to ask for `peer`'s next hop this second (as [`Neighbors::next`]
    /// does for the PMD threads); counts the request as unanswered until an answer comes.
    pub fn request_due(&self, peer: u16, now: u32) -> bool {
        self.slot(peer).is_some_and(|s| self.claim(s, now))
    }

    /// Whether frames waiting since `since` for `peer` should be given up at `now`.
    pub fn given_up(&self, peer: u16, since: u32, now: u32) -> bool {
        let unanswered = self.slot(peer).map_or(u32::MAX, |s| s.unanswered.load(Relaxed));
        unanswered >= MAX_PROBES && now.wrapping_sub(since) >= MAX_PROBES
    }

    /// Records that `peer`'s next hop answered from `mac` at `now`.
    pub fn learn(&self, peer: u16, mac: MacAddr, now: u32) {
        let Some(s) = self.slot(peer) else { return };
        s.confirmed.store(now, Relaxed);
        s.unanswered.store(0, Relaxed);
        if s.mac.swap(mac.to_u64() | VALID, AcqRel) != (mac.to_u64() | VALID) {
            self.learned.fetch_add(1, Release);
        }
    }

    /// Forgets a slot (its peer or next hop changed in the configuration).
    pub fn reset(&self, peer: u16) {
        if let Some(s) = self.slot(peer) {
            s.mac.store(0, Release);
            s.confirmed.store(NEVER, Relaxed);
            s.asked.store(NEVER, Relaxed);
            s.unanswered.store(0, Relaxed);
        }
    }

    pub fn state(&self, peer: u16) -> Option<NeighborState> {
        let s = self.slot(peer)?;
        let confirmed = s.confirmed.load(Relaxed);
        Some(NeighborState {
            mac: self.mac(peer),
            confirmed: (confirmed != NEVER).then_some(confirmed),
            unanswered: s.unanswered.load(Relaxed),
        })
    }
}

/// An ARP request or neighbor solicitation for `target` from the VTEP (`local`, `mac`),
/// tagged when the underlay is, in a fresh buffer.
pub fn request(
    cache: &mut PoolCache,
    local: IpAddr,
    mac: MacAddr,
    vlan: Option<u16>,
    target: IpAddr,
) -> Option<BufId> {
    let mut f = [0u8; 18 + ipv6::HEADER_LEN + icmpv6::NA_LEN];
    let (dst, et) = match target {
        IpAddr::V4(_) => (MacAddr::BROADCAST, ethernet::ethertype::ARP),
        IpAddr::V6(t) => (solicited_node_mac(&t), ethernet::ethertype::IPV6),
    };
    let eth = ethernet::Repr {
        dst,
        src: mac,
        tag: vlan.map(|v| (ethernet::ethertype::VLAN, v)),
        ethertype: et,
    };
    eth.emit(&mut f);
    let l2 = ethernet::header_len(vlan.is_some());
    let len = match (local, target) {
        (IpAddr::V4(spa), IpAddr::V4(tpa)) => {
            arp::Repr { op: arp::OP_REQUEST, sha: mac, spa, tha: MacAddr([0; 6]), tpa }
                .emit(&mut f[l2..]);
            (l2 + arp::PACKET_LEN).max(60)
        }
        (IpAddr::V6(src), IpAddr::V6(t)) => {
            let dst = solicited_node(&t);
            let ip = ipv6::Repr {
                src,
                dst,
                next_header: ipv6::NEXT_ICMPV6,
                hop_limit: 255,
                payload_len: icmpv6::NA_LEN as u16,
            };
            ip.emit(&mut f[l2..]);
            icmpv6::emit_ns(&mut f[l2 + ipv6::HEADER_LEN..], &src, &dst, &t, mac);
            l2 + ipv6::HEADER_LEN + icmpv6::NA_LEN
        }
        _ => return None,
    };
    cache.alloc_frame(&f[..len])
}

/// The answer in an underlay frame addressed to the VTEP at `local`: the sender's address
/// and MAC of an ARP packet targeting `local`, or the target and its MAC of a neighbor
/// advertisement sent to `local`. The frame is untagged or carries one tag.
pub fn answer_in(pool: &Pool, b: &BufId, local: IpAddr) -> Option<(IpAddr, MacAddr)> {
    let h = pool.head(b);
    let mut l2 = 14;
    let mut et = u16::from_be_bytes([*h.get(12)?, *h.get(13)?]);
    if ethernet::is_tpid(et) {
        et = u16::from_be_bytes([*h.get(16)?, *h.get(17)?]);
        l2 = 18;
    }
    let body = h.get(l2..)?;
    match (et, local) {
        (ethernet::ethertype::ARP, IpAddr::V4(me)) => {
            let p = arp::Packet::new_checked(body).ok()?;
            let ok = (p.op() == arp::OP_REPLY || p.op() == arp::OP_REQUEST)
                && p.tpa() == me
                && !p.sha().is_group();
            ok.then(|| (IpAddr::V4(p.spa()), p.sha()))
        }
        (ethernet::ethertype::IPV6, IpAddr::V6(me)) => {
            let ip = ipv6::Packet::new_checked(body).ok()?;
            if ip.next_header() != ipv6::NEXT_ICMPV6 || ip.hop_limit() != 255 || ip.dst() != me {
                return None;
            }
            let msg = ip.payload();
            let na = icmpv6::Ndp::new_checked(msg).ok()?;
            if na.msg_type() != icmpv6::TYPE_NA || !icmpv6::checksum_ok(&ip.src(), &ip.dst(), msg) {
                return None;
            }
            let mac = na.link_layer_option().filter(|m| !m.is_group())?;
            Some((IpAddr::V6(na.target()), mac))
        }
        _ => None,
    }
}

fn solicited_node(t: &Ipv6Addr) -> Ipv6Addr {
    let o = t.octets();
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | o[13] as u16, u16::from_be_bytes([o[14], o[15]]))
}

fn solicited_node_mac(t: &Ipv6Addr) -> MacAddr {
    let o = t.octets();
    MacAddr([0x33, 0x33, 0xff, o[13], o[14], o[15]])
}

/// One frame waiting for its peer's next hop: the inner frame (untagged, not yet
/// encapsulated), where it goes, and since when it waits.
#[derive(Debug)]
pub struct Waiting {
    pub b: BufId,
    pub peer: u16,
    pub vni: u32,
    pub since: u32,
}

/// A PMD thread's frames waiting for resolution, in arrival order, at most [`PARKED_MAX`].
#[derive(Debug, Default)]
pub struct Parked {
    frames: std::collections::VecDeque<Waiting>,
    /// The [`Neighbors::generation`] and second last looked at.
    seen: (u32, u32),
}

impl Parked {
    pub fn new() -> Parked {
        Parked { frames: std::collections::VecDeque::with_capacity(PARKED_MAX), seen: (0, 0) }
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Queues a frame; gives it back when the queue is full.
    pub fn park(&mut self, w: Waiting) -> Result<(), Waiting> {
        if self.frames.len() >= PARKED_MAX {
            return Err(w);
        }
        self.frames.push_back(w);
        Ok(())
    }

    /// Whether anything may have changed for the waiting frames since the last look.
    #[inline(always)]
    pub fn due(&mut self, generation: u32, now: u32) -> bool {
        let due = !self.frames.is_empty() && self.seen != (generation, now);
        if due {
            self.seen = (generation, now);
        }
        due
    }

    /// Offers every waiting frame, oldest first, to `f`, which sends or drops it (`None`) or
    /// gives it back to wait on, in order. Never allocates: the queue keeps its capacity.
    pub fn retry(&mut self, mut f: impl FnMut(Waiting) -> Option<Waiting>) {
        for _ in 0..self.frames.len() {
            let Some(w) = self.frames.pop_front() else { break };
            if let Some(w) = f(w) {
                self.frames.push_back(w);
            }
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn one_request_per_second_then_forget() {
        let n = Neighbors::new(4);
        assert_eq!(n.next(1, 10, true), (Next::Wait, true));
        assert_eq!(n.next(1, 10, true), (Next::Wait, false), "one request per second");
        assert!(!n.given_up(1, 10, 11));
        assert_eq!(n.next(1, 11, true), (Next::Wait, true));
        assert_eq!(n.next(1, 12, true), (Next::Wait, true));
        assert!(n.given_up(1, 10, 13));
        let g = n.generation();
        let m = MacAddr([2, 0, 0, 0, 0, 7]);
        n.learn(1, m, 13);
        assert!(n.generation() != g);
        assert_eq!(n.next(1, 14, true), (Next::Send(m), false));
        assert!(!n.given_up(1, 10, 20));
        // Stale after REACHABLE_SECS: re-confirmed while still sending, forgotten after
        // MAX_PROBES unanswered requests.
        let t = 13 + REACHABLE_SECS;
        assert_eq!(n.next(1, t, true), (Next::Send(m), true));
        assert_eq!(n.next(1, t + 1, true), (Next::Send(m), true));
        assert_eq!(n.next(1, t + 2, true), (Next::Send(m), true));
        assert_eq!(n.next(1, t + 3, true), (Next::Wait, true));
        assert_eq!(n.mac(1), None);
        n.reset(1);
        assert_eq!(n.state(1), Some(NeighborState { mac: None, confirmed: None, unanswered: 0 }));
        assert_eq!(n.next(9, 1, true), (Next::Wait, false), "no such slot");
    }

    #[test]
    fn requests_and_answers_round_trip() {
        let pool = Pool::new(64, false).unwrap();
        let mut c = PoolCache::new(pool.clone());
        let me = MacAddr([2, 0, 0, 0, 0, 1]);
        let peer = MacAddr([2, 0, 0, 0, 0, 2]);
        for (local, target, vlan) in [
            ("198.51.100.1", "198.51.100.2", None),
            ("198.51.100.1", "198.51.100.2", Some(7)),
            ("2001:db8::1", "2001:db8::2", None),
        ] {
            let (local, target): (IpAddr, IpAddr) =
                (local.parse().unwrap(), target.parse().unwrap());
            let b = request(&mut c, local, me, vlan, target).unwrap();
            assert!(pool.pkt_len(&b) >= 60);
            // The request, as seen by the target: an ARP request or a solicitation for it.
            let h = pool.head(&b).to_vec();
            c.free(b);
            let l2 = ethernet::header_len(vlan.is_some());
            let answer = match (local, target) {
                (IpAddr::V4(l), IpAddr::V4(t)) => {
                    let p = arp::Packet::new_checked(&h[l2..]).unwrap();
                    assert_eq!((p.op(), p.spa(), p.tpa(), p.sha()), (arp::OP_REQUEST, l, t, me));
                    assert_eq!(&h[..6], &[0xff; 6]);
                    let mut r = h.clone();
                    r[..6].copy_from_slice(&me.0);
                    r[6..12].copy_from_slice(&peer.0);
                    arp::Repr { op: arp::OP_REPLY, sha: peer, spa: t, tha: me, tpa: l }
                        .emit(&mut r[l2..]);
                    r
                }
                (IpAddr::V6(l), IpAddr::V6(t)) => {
                    let ip = ipv6::Packet::new_checked(&h[l2..]).unwrap();
                    assert_eq!((ip.src(), ip.dst()), (l, solicited_node(&t)));
                    assert_eq!(&h[..6], &solicited_node_mac(&t).0);
                    let ns = icmpv6::Ndp::new_checked(ip.payload()).unwrap();
                    assert_eq!((ns.msg_type(), ns.target()), (icmpv6::TYPE_NS, t));
                    assert!(icmpv6::checksum_ok(&l, &solicited_node(&t), ip.payload()));
                    let mut r = vec![0u8; 14 + ipv6::HEADER_LEN + icmpv6::NA_LEN];
                    ethernet::Repr {
                        dst: me,
                        src: peer,
                        tag: None,
                        ethertype: ethernet::ethertype::IPV6,
                    }
                    .emit(&mut r);
                    ipv6::Repr {
                        src: t,
                        dst: l,
                        next_header: ipv6::NEXT_ICMPV6,
                        hop_limit: 255,
                        payload_len: icmpv6::NA_LEN as u16,
                    }
                    .emit(&mut r[14..]);
                    icmpv6::emit_na(&mut r[14 + ipv6::HEADER_LEN..], &t, &l, &t, peer, false);
                    r
                }
                _ => unreachable!(),
            };
            let b = c.alloc_frame(&answer).unwrap();
            assert_eq!(answer_in(&pool, &b, local), Some((target, peer)));
            let other: IpAddr = if local.is_ipv4() {
                "198.51.100.9".parse().unwrap()
            } else {
                "2001:db8::9".parse().unwrap()
            };
            assert_eq!(answer_in(&pool, &b, other), None, "not for us");
            c.free(b);
        }
    }
}

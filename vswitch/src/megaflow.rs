//! The second-level cache: per PMD thread, a known-unicast decision split into the two
//! halves it depends on, so flows the exact-match cache cannot hold still skip the slow path.
//!
//! A thousand pods each talking to all the others make 10^6 (source, destination) pairs but
//! only 2,000 halves: whether a source may send from its ingress as it does (classification,
//! port security, learning with nothing to change) depends on the ingress, the source MAC and
//! the tag, never on the destination; where a frame goes (the FDB's egress, its tag and MTU)
//! depends on the ingress, the destination MAC and the tag, never on the source. The split
//! is [`Key::halves`]; each half lives in a table of its own, an [`Emc`] keyed by it (the
//! sources' entries carry no decision, the destinations' the whole [`Hit`]). A frame hits
//! when both halves do, in the same epoch. Both halves are written by the slow path only, at
//! once, from one frame it forwarded as known unicast with learning having nothing to change
//! (as the exact-match cache's entries are); since every source half says "this source
//! passes on its own" and every destination half "a frame to here goes there", any pair of
//! them is a decision the slow path would make again. They stay true only as long as the
//! exact-match cache's entries do (the snapshot, the FDB's generation and the second:
//! [`Megaflows::sync`]), and a burst whose slow-path frame moved a MAC drops the hits after
//! it the same way.
//!
//! OVS's dpcls reaches the same end with masks (the megaflows' wildcards) and a subtable per
//! mask; Knitter's L2 decision has one shape, so two exact tables do it with two lookups.
//! Only bursts from local ports the exact-match cache does not serve (it churns there, see
//! `pipeline/cache.rs`) look here: a hit costs one lookup more than the exact-match cache's.

use crate::emc::{Emc, EmcView, Hit, Key};

/// The two halves' tables.
pub struct Megaflows {
    sources: Emc,
    destinations: Emc,
    /// Fills of which at least one half took an empty or stale place (running count,
    /// wrapping).
    free_fills: u32,
}

impl std::fmt::Debug for Megaflows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Megaflows({} entries a half)", self.sources.capacity())
    }
}

impl Megaflows {
    /// Tables of at least `entries` halves each (0 turns the cache off).
    pub fn new(entries: usize) -> Megaflows {
        Megaflows { sources: Emc::new(entries), destinations: Emc::new(entries), free_fills: 0 }
    }

    /// Entries of each half's table (0: off).
    pub fn capacity(&self) -> usize {
        self.sources.capacity()
    }

    /// As [`Emc::sync`], for both halves (their epochs move together).
    #[inline(always)]
    pub fn sync(&mut self, snapshot: u64, fdb: u32, now: u32) {
        self.sources.sync(snapshot, fdb, now);
        self.destinations.sync(snapshot, fdb, now);
    }

    /// What lookups read, by value (see [`EmcView`]).
    #[inline(always)]
    pub fn view(&self) -> MegaflowView<'_> {
        MegaflowView { sources: self.sources.view(), destinations: self.destinations.view() }
    }

    /// Fills so far of which at least one half took an empty or stale place: flows whose
    /// source or destination the cache had room for (running count, wrapping; see
    /// [`Emc::free_fills`]).
    #[inline(always)]
    pub fn free_fills(&self) -> u32 {
        self.free_fills
    }

    /// Remembers the slow path's known-unicast decision `hit` for the frame of key `k`
    /// (`secured`: a key of a port with port security), one half in each table.
    pub fn insert(&mut self, k: &Key, secured: bool, hit: Hit) {
        let (source, destination) = k.halves(secured);
        let before = (self.sources.free_fills(), self.destinations.free_fills());
        self.sources.insert(&source, Hit::default());
        self.destinations.insert(&destination, hit);
        let after = (self.sources.free_fills(), self.destinations.free_fills());
        self.free_fills = self.free_fills.wrapping_add((after != before) as u32);
    }
}

/// [`Megaflows`]' fields lookups read.
#[derive(Clone, Copy)]
pub struct MegaflowView<'a> {
    sources: EmcView<'a>,
    destinations: EmcView<'a>,
}

impl MegaflowView<'_> {
    /// The decision for the frame of key `k` (`secured` as for [`Megaflows::insert`]): its
    /// destination half's, when its source half is known too.
    #[inline(always)]
    pub fn lookup(self, k: &Key, secured: bool) -> Option<Hit> {
        let (source, destination) = k.halves(secured);
        self.sources.lookup(&source)?;
        self.destinations.lookup(&destination)
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn frame(dst: u16, src: u16, et: u16, tci: u16) -> [u8; 36] {
        let mut f = [0u8; 36];
        f[..6].copy_from_slice(&[2, 0, 0, 0, (dst >> 8) as u8, dst as u8]);
        f[6..12].copy_from_slice(&[2, 0, 0, 1, (src >> 8) as u8, src as u8]);
        f[12..14].copy_from_slice(&et.to_be_bytes());
        f[14..16].copy_from_slice(&tci.to_be_bytes());
        f
    }

    fn ipv4(dst: u16, src: u16, src_ip: [u8; 4]) -> [u8; 36] {
        let mut f = frame(dst, src, 0x0800, 0x4500);
        f[26..30].copy_from_slice(&src_ip);
        f
    }

    fn to(port: u16) -> Hit {
        Hit::to_port(1, port, false, None, 1514).unwrap_or_default()
    }

    fn sync(m: &mut Megaflows, now: u32) {
        m.sync(1, 1, now);
    }

    /// A mesh of 1,000 sources to 500 destinations filled along one diagonal (each source
    /// and each destination seen once) hits for all 500,000 pairs, out of 1,500 halves.
    #[test]
    fn a_mesh_is_held_in_its_halves() {
        let mut m = Megaflows::new(4096);
        sync(&mut m, 1);
        let key = |s: u16, d: u16| Key::from_port(3, &frame(d, s, 0x0800, 0x4500));
        for s in 0..1000u16 {
            let k = key(s, s % 500).expect("a key");
            m.insert(&k, false, to(7 + s % 500));
        }
        let v = m.view();
        let mut hits = 0;
        for s in 0..1000u16 {
            for d in 0..500u16 {
                let k = key(s, d).expect("a key");
                assert_eq!(v.lookup(&k, false), Some(to(7 + d)), "{s} to {d}");
                hits += 1;
            }
        }
        assert_eq!(hits, 500_000);
    }

    /// Both halves must be known, from the same ingress, with the same tag, in this epoch.
    #[test]
    fn a_frame_hits_only_where_both_halves_were_seen() {
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        let f = frame(1, 2, 0x8100, 10);
        let k = Key::from_port(3, &f).expect("a key");
        m.insert(&k, false, to(4));
        let look = |m: &Megaflows, port: u16, f: &[u8]| {
            Key::from_port(port, f).and_then(|k| m.view().lookup(&k, false))
        };
        assert_eq!(look(&m, 3, &f), Some(to(4)));
        assert_eq!(look(&m, 5, &f), None, "another ingress");
        assert_eq!(look(&m, 3, &frame(1, 2, 0x8100, 11)), None, "another VLAN");
        assert_eq!(look(&m, 3, &frame(1, 2, 0x0800, 10)), None, "untagged");
        assert_eq!(look(&m, 3, &frame(1, 9, 0x8100, 10)), None, "a source not seen");
        assert_eq!(look(&m, 3, &frame(9, 2, 0x8100, 10)), None, "a destination not seen");
        sync(&mut m, 2);
        assert_eq!(look(&m, 3, &f), None, "a new second");
    }

    /// From a port with port security, a source's half holds its address: a spoofed one
    /// misses, and a DHCP server's frame (UDP source port 67) never hits; the destination
    /// half does not hold the source's address, so a mesh still shares it.
    #[test]
    fn a_secured_ports_source_half_holds_what_the_check_reads() {
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        let fill = |m: &mut Megaflows, f: &[u8]| {
            let k = Key::from_secured_port(3, f).expect("a key");
            m.insert(&k, true, to(4));
        };
        let look = |m: &Megaflows, f: &[u8]| {
            Key::lookup_from_secured_port(3, f).and_then(|k| m.view().lookup(&k, true))
        };
        fill(&mut m, &ipv4(1, 2, [10, 0, 0, 2]));
        fill(&mut m, &ipv4(5, 6, [10, 0, 0, 6]));
        assert_eq!(look(&m, &ipv4(5, 2, [10, 0, 0, 2])), Some(to(4)), "a pair not seen");
        assert_eq!(look(&m, &ipv4(1, 2, [10, 0, 0, 3])), None, "a spoofed address");
        let mut dhcp = ipv4(1, 2, [10, 0, 0, 2]);
        dhcp[34..36].copy_from_slice(&67u16.to_be_bytes());
        assert_eq!(look(&m, &dhcp), None, "a DHCP server's frame");
        let mut arp = frame(1, 2, 0x0806, 1);
        arp[26..30].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(look(&m, &arp), None, "not IPv4");
    }

    /// A pod port's destination half does not hold the DSCP and ECN bits, which only the
    /// source's side reads: a pod varying them shares one destination half per destination.
    #[test]
    fn a_secured_destination_half_ignores_dscp() {
        let k = |tos: u8| {
            let mut f = ipv4(1, 2, [10, 0, 0, 2]);
            f[15] = tos;
            Key::from_secured_port(3, &f).expect("a key")
        };
        assert_ne!(k(0).halves(true).0, k(0xb8).halves(true).0, "the source half holds it");
        assert_eq!(k(0).halves(true).1, k(0xb8).halves(true).1, "the destination half not");
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        m.insert(&k(0), true, to(4));
        m.insert(&k(0xb8), true, to(4));
        assert_eq!(m.free_fills(), 2, "a new source half each, one destination half");
    }

    #[test]
    fn an_empty_cache_is_off() {
        let mut m = Megaflows::new(0);
        assert_eq!(m.capacity(), 0);
        sync(&mut m, 1);
        let k = Key::from_port(3, &frame(1, 2, 0x0800, 0)).expect("a key");
        m.insert(&k, false, to(4));
        assert_eq!(m.view().lookup(&k, false), None);
    }
}

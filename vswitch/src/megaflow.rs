//! The second-level cache: per PMD thread, a known-unicast decision split into the two
//! halves it depends on, so flows the exact-match cache cannot hold still skip the slow path.
//!
//! A thousand pods each talking to all the others make 10^6 (source, destination) pairs but
//! only 2,000 halves. Whether a source may send from its ingress as it does (classification,
//! port security, learning with nothing to change) depends on the ingress, the source MAC and
//! the tag, never on the destination: the **source half** ([`Key::source_half`]) holds that,
//! and its entry holds what it decided — the bridge domain, whether the frame came tagged,
//! the ingress's longest frame ([`Hit::from_source`]). Where a frame of that bridge domain
//! goes (the FDB's egress, its tag, the egress's MTU) depends on the destination MAC and
//! whether the frame came tagged, never on the source: the **destination half**
//! ([`Key::destination_half`], keyed by the source half's bridge domain, not the ingress)
//! holds the rest of the [`Hit`]. What the decision reads of both — the egress must not be
//! the ingress (a reflection), the frame must fit both MTUs — is checked at each hit
//! ([`MegaflowView::lookup`]). Each half lives in a table of its own, an [`Emc`] keyed by it;
//! a frame hits when both halves do, in the same epoch.
//!
//! Both halves are written by the slow path only, at once, from one frame it forwarded as
//! known unicast with learning having nothing to change (as the exact-match cache's entries
//! are), so any source half with any destination half of its bridge domain is a decision the
//! slow path would make again. They stay true only as long as the exact-match cache's
//! entries do (the snapshot, the FDB's generation and the second: [`Megaflows::sync`]), and a
//! burst whose slow-path frame moved a MAC drops the hits after it the same way.
//!
//! OVS's dpcls reaches the same end with masks (the megaflows' wildcards) and a subtable per
//! mask; Knitter's L2 decision has one shape, so two exact tables do it with two lookups.
//! Only bursts from local ports look here: the exact-match cache's misses, and all the
//! frames of a port it churns on (see `pipeline/cache.rs`).

use crate::emc::{Emc, EmcPair, Hit, Key};

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
        // One set a key: the halves' lookups look nowhere else (`EmcView::lookup_comparing`).
        // A newcomer waits a miss here too (`Emc::insert`), each half on its own: letting it in
        // at once cost random MACs 209.4 instructions a frame against 185.2 (halves overloaded
        // by 100,000 MACs thrash; docs/perf/instructions.md).
        Megaflows {
            sources: Emc::one_set_a_key(entries),
            destinations: Emc::one_set_a_key(entries),
            free_fills: 0,
        }
    }

    /// Entries of each half's table (0: off).
    pub fn capacity(&self) -> usize {
        self.sources.capacity()
    }

    /// As [`Emc::sync`], for both halves (their epochs move together: the destinations'
    /// sources are the sources' whenever these did not change).
    #[inline(always)]
    pub fn sync(&mut self, snapshot: u64, fdb: u32, now: u32) {
        if self.sources.synced(snapshot, fdb, now) {
            self.destinations.sync(snapshot, fdb, now);
        }
    }

    /// What lookups read, by value (see [`crate::emc::EmcView`]).
    #[inline(always)]
    pub fn view(&self) -> MegaflowView<'_> {
        // Made alike (`new`) and synced together (`sync`): the sources' mask, shift and epoch
        // serve both tables. Were they ever out of step, nothing would hit.
        MegaflowView { tables: EmcPair::new(self.sources.view(), self.destinations.view()) }
    }

    /// Fills so far of which at least one half took an empty or stale place: flows whose
    /// source or destination the cache had room for (running count, wrapping; see
    /// [`Emc::free_fills`]).
    #[inline(always)]
    pub fn free_fills(&self) -> u32 {
        self.free_fills
    }

    /// Remembers the slow path's known-unicast decision for the frame of key `k` (from a
    /// local port), its halves `source` and `destination` ([`crate::emc::Decision`]).
    pub fn insert(&mut self, k: &Key, source: Hit, destination: Hit) {
        let before = (self.sources.free_fills(), self.destinations.free_fills());
        self.sources.insert(&k.source_half(), source);
        self.destinations.insert(&k.destination_half(source), destination);
        let after = (self.sources.free_fills(), self.destinations.free_fills());
        self.free_fills = self.free_fills.wrapping_add((after != before) as u32);
    }
}

/// [`Megaflows`]' fields lookups read.
#[derive(Clone, Copy)]
pub struct MegaflowView<'a> {
    /// The sources' table first.
    tables: EmcPair<'a>,
}

impl MegaflowView<'_> {
    /// The decision for the frame of key `k` (from a local port): its source half's bridge
    /// domain's destination half, unless that sends it back out of its ingress, for frames
    /// as long as both the ingress and the egress allow.
    #[inline(always)]
    pub fn lookup(self, k: &Key) -> Option<Hit> {
        let source = self.tables.first().lookup(&k.source_half())?;
        let d = self.destination(k, source)?;
        (!d.reflects_to(k.port())).then(|| d.within(source))
    }

    /// [`MegaflowView::lookup`] for a frame of `len` bytes, the burst's first pass: `None`
    /// also when the ingress does not allow the frame, and the decision as the destination
    /// half holds it (which `len` fits; for other lengths, [`MegaflowView::lookup`]'s).
    ///
    /// `SECURED`: `k` is a key of a port with port security. A port without has source halves
    /// whose `k0` is 0, and so has every entry of the sources' table that holds its ingress
    /// (in `k2`) in this epoch: a port's keys change layout only with its port security,
    /// which a new snapshot, and so a new epoch, brings. Its lookups leave `k0` out.
    #[inline(always)]
    pub fn lookup_for<const SECURED: bool>(self, k: &Key, len: u32) -> Option<Hit> {
        let source = self.tables.first().lookup_comparing::<SECURED, true>(&k.source_half());
        let source = source.filter(|s| s.admits(len))?;
        let d = self.destination(k, source)?;
        (!d.reflects_to(k.port())).then_some(d)
    }

    /// The destination half of `k` in `source`'s domain. Every entry of the destinations'
    /// table has a `k1` of 0 ([`Key::destination_half`]): lookups leave it out.
    #[inline(always)]
    fn destination(self, k: &Key, source: Hit) -> Option<Hit> {
        self.tables.second().lookup_comparing::<true, false>(&k.destination_half(source))
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

    /// Bridge domain 1, untagged, 1,514 bytes at most on the ingress.
    fn source(bd: u16, tagged: bool, max: usize) -> Hit {
        Hit::from_source(bd, tagged, false, max).unwrap_or_default()
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
            m.insert(&k, source(1, false, 1514), to(7 + s % 500));
        }
        let v = m.view();
        let mut hits = 0;
        for s in 0..1000u16 {
            for d in 0..500u16 {
                let k = key(s, d).expect("a key");
                assert_eq!(v.lookup(&k), Some(to(7 + d)), "{s} to {d}");
                hits += 1;
            }
        }
        assert_eq!(hits, 500_000);
    }

    /// The source half must be known from that ingress with that tag, the destination half in
    /// the source's bridge domain for a frame tagged as it is, both in this epoch.
    #[test]
    fn a_frame_hits_only_where_both_halves_were_seen() {
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        let f = frame(1, 2, 0x8100, 10);
        let k = Key::from_port(3, &f).expect("a key");
        let tagged_to_4 = Hit::to_port(1, 4, true, None, 1518).unwrap_or_default();
        m.insert(&k, source(1, true, 1518), tagged_to_4);
        let look = |m: &Megaflows, port: u16, f: &[u8]| {
            Key::from_port(port, f).and_then(|k| m.view().lookup(&k))
        };
        assert_eq!(look(&m, 3, &f), Some(tagged_to_4));
        assert_eq!(look(&m, 5, &f), None, "another ingress");
        assert_eq!(look(&m, 3, &frame(1, 2, 0x8100, 11)), None, "another VLAN");
        assert_eq!(look(&m, 3, &frame(1, 2, 0x0800, 10)), None, "untagged");
        assert_eq!(look(&m, 3, &frame(1, 9, 0x8100, 10)), None, "a source not seen");
        assert_eq!(look(&m, 3, &frame(9, 2, 0x8100, 10)), None, "a destination not seen");
        sync(&mut m, 2);
        assert_eq!(look(&m, 3, &f), None, "a new second");
    }

    /// Pods behind ports of their own share the destination halves of their bridge domain:
    /// 512 pods to 1,000 destinations are 1,512 halves. A destination half never sends a
    /// frame back out of its ingress, never serves another bridge domain, and a hit allows
    /// the shorter of the two ports' longest frames.
    #[test]
    fn a_destination_half_serves_every_port_of_its_bridge_domain() {
        let mut m = Megaflows::new(4096);
        sync(&mut m, 1);
        let key = |pod: u16, d: u16| Key::from_port(100 + pod, &frame(d, pod, 0x0800, 0x4500));
        for pod in 0..512u16 {
            let k = key(pod, pod % 100).expect("a key");
            m.insert(&k, source(1, false, 1514), to(7));
        }
        for d in 100..1000u16 {
            m.insert(&key(0, d).expect("a key"), source(1, false, 1514), to(7));
        }
        for pod in 0..512u16 {
            for d in (0..1000u16).step_by(37) {
                assert_eq!(m.view().lookup(&key(pod, d).expect("a key")), Some(to(7)));
            }
        }
        // A source behind port 7 to a destination behind port 7: a reflection, not a hit.
        let from_7 = Key::from_port(7, &frame(2000, 900, 0x0800, 0x4500)).expect("a key");
        m.insert(&from_7, source(1, false, 1514), to(9));
        let back = Key::from_port(7, &frame(3, 900, 0x0800, 0x4500)).expect("a key");
        assert_eq!(m.view().lookup(&back), None, "out of its own ingress");
        // Another bridge domain's source does not see domain 1's destinations.
        let other = Key::from_port(9, &frame(1, 901, 0x0800, 0x4500)).expect("a key");
        let other_d = Key::from_port(9, &frame(2, 901, 0x0800, 0x4500)).expect("a key");
        m.insert(
            &other_d,
            source(2, false, 1514),
            Hit::to_port(2, 4, false, None, 1514).unwrap_or_default(),
        );
        assert_eq!(m.view().lookup(&other), None, "destination 1 is domain 1's");
        // A small ingress MTU narrows the hit.
        let small = Key::from_port(10, &frame(3, 902, 0x0800, 0x4500)).expect("a key");
        m.insert(&small, source(1, false, 600), to(7));
        let hit = m.view().lookup(&small).expect("a hit");
        assert!(hit.admits(600) && !hit.admits(601), "the ingress's 600 bytes, not 1,514");
        assert_eq!(m.view().lookup(&key(0, 3).expect("a key")).map(|h| h.admits(1514)), Some(true));
    }

    /// A destination half is kept apart by whether its frames came tagged and whether they
    /// are ARP or IPv6: an untagged source does not find a tagged frame's destination, nor
    /// an ARP source an IPv4 frame's.
    #[test]
    fn a_destination_half_is_kept_apart_by_tag_and_neighbor_protocol() {
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        // Port 3 (a trunk): a tagged frame to 1 in domain 1; port 4: an untagged IPv4 frame
        // to 2, and an ARP frame from the same source to someone else.
        let tagged = Key::from_port(3, &frame(1, 10, 0x8100, 5)).expect("a key");
        m.insert(
            &tagged,
            source(1, true, 1518),
            Hit::to_port(1, 7, true, None, 1518).unwrap_or_default(),
        );
        let v4 = Key::from_port(4, &frame(2, 11, 0x0800, 0x4500)).expect("a key");
        m.insert(&v4, source(1, false, 1514), to(7));
        let arp = Key::from_port(4, &frame(9, 11, 0x0806, 1)).expect("a key");
        let arp_source = Hit::from_source(1, false, true, 1514).unwrap_or_default();
        m.insert(&arp, arp_source, to(8));
        let look = |port: u16, f: &[u8]| Key::from_port(port, f).and_then(|k| m.view().lookup(&k));
        assert_eq!(look(4, &frame(1, 11, 0x0800, 0x4500)), None, "1 is known tagged only");
        assert_eq!(look(4, &frame(2, 11, 0x0806, 1)), None, "2 is known to IPv4 only");
        assert_eq!(look(4, &frame(9, 11, 0x0806, 1)), Some(to(8)));
        assert_eq!(look(4, &frame(2, 11, 0x0800, 0x4500)), Some(to(7)));
    }

    /// From a port with port security, a source's half holds its address: a spoofed one
    /// misses, and a DHCP server's frame (UDP source port 67) never hits; DSCP and ECN are in
    /// the source half only.
    #[test]
    fn a_secured_ports_source_half_holds_what_the_check_reads() {
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        let fill = |m: &mut Megaflows, f: &[u8]| {
            let k = Key::from_secured_port(3, f).expect("a key");
            m.insert(&k, source(1, false, 1514), to(4));
        };
        let look = |m: &Megaflows, f: &[u8]| {
            let k = Key::lookup_from_secured_port(3, f)?;
            let found = m.view().lookup(&k);
            assert_eq!(m.view().lookup_for::<true>(&k, 60), found, "the burst's lookup agrees");
            found
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
        let mut marked = ipv4(1, 2, [10, 0, 0, 2]);
        marked[15] = 0xb8;
        assert_eq!(look(&m, &marked), None, "another DSCP: a source half of its own");
        let before = m.free_fills();
        fill(&mut m, &marked);
        assert_eq!(m.free_fills(), before + 1, "its source half new, its destination's not");
        assert_eq!(look(&m, &marked), Some(to(4)));
    }

    /// A port without port security looks its source halves up without their first word
    /// (always 0 in its layout). A secured port's source half can match such a key in every
    /// other word: it is never found, because a port's layout changes only with a new
    /// snapshot, which starts a new epoch.
    #[test]
    fn a_source_half_of_another_layout_is_of_another_epoch() {
        let mut secured = ipv4(7, 0x0101, [10, 1, 0, 0]);
        secured[14] = 0x45;
        let mut trusted = [0u8; 36];
        trusted[..6].copy_from_slice(&secured[..6]);
        trusted[6..14].copy_from_slice(&secured[8..16]);
        trusted[14..16].copy_from_slice(&secured[26..28]);
        let kt = Key::from_port(3, &trusted).expect("a key");
        let mut m = Megaflows::new(64);
        sync(&mut m, 1);
        // The source MAC's first two bytes, the secured half's first word, chosen so both
        // halves share a set.
        let set = |k: &Key| m.view().tables.first().set_of(&k.source_half());
        let ks = (1..=u16::MAX)
            .filter_map(|b| {
                secured[6..8].copy_from_slice(&b.to_be_bytes());
                Key::from_secured_port(3, &secured)
            })
            .find(|ks| set(ks) == set(&kt))
            .expect("a secured key in the trusted key's set");
        assert_ne!(ks.source_half(), kt.source_half(), "apart in the first word only");
        m.insert(&ks, source(1, false, 1514), to(4));
        assert_eq!(m.view().lookup_for::<true>(&ks, 60), Some(to(4)));
        assert_eq!(m.view().lookup(&kt), None, "the first word tells them apart");
        assert_eq!(
            m.view().lookup_for::<false>(&kt, 60),
            Some(to(4)),
            "a lookup that leaves it out would take the secured port's source half"
        );
        // Port 3 loses its port security: a new snapshot.
        m.sync(2, 1, 1);
        assert_eq!(m.view().lookup_for::<false>(&kt, 60), None);
    }

    #[test]
    fn an_empty_cache_is_off() {
        let mut m = Megaflows::new(0);
        assert_eq!(m.capacity(), 0);
        sync(&mut m, 1);
        let k = Key::from_port(3, &frame(1, 2, 0x0800, 0)).expect("a key");
        m.insert(&k, source(1, false, 1514), to(4));
        assert_eq!(m.view().lookup(&k), None);
    }
}

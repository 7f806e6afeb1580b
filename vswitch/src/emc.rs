//! The exact-match cache: per PMD thread, the forwarding decision of recent flows, so a
//! known-unicast frame skips classification, learning and the FDB (OVS's EMC, for L2).
//!
//! A key is everything the decision depends on: the ingress (a port, or a remote VTEP and
//! bridge domain after decapsulation), both MACs, the EtherType and the two bytes after it
//! (the VLAN tag when there is one). The value is the egress (a port and the tag frames carry
//! there, or a peer and a VNI) and the bridge domain, for its counters. Entries are written
//! only by the slow path, after it forwarded a frame as known unicast *and* learning had
//! nothing to change, so a hit means the slow path would do the same thing again.
//!
//! Entries stay true only while nothing they were derived from changes: the configuration
//! snapshot, the FDB (its generation moves on every move, removal and static entry; learning
//! a new MAC cannot change a known-unicast decision), and the current second (learning
//! refreshes a MAC's timestamp once a second, through the slow path). [`Emc::sync`] compares
//! the three once per burst and, when any changed, starts a new epoch: entries of an older
//! epoch never match, without touching the table. A burst's lookups are all made before its
//! first frame is forwarded, so the pipeline also asks [`Emc::outdated_by`] after each frame
//! that took the slow path: when that frame moved a MAC, the burst's later hits are dropped
//! and take the slow path too. What each hit still checks per frame
//! (ingress MTU; egress MTU and tagging happen in the shared egress code) stays per frame.
//!
//! Two entries of 32 bytes per 64-byte line; a key may sit in either (set-associative), and
//! when both hold live entries, in the adjacent line's set (the other of its pair), which
//! only a second look finds: the burst's misses get it, the hits' lookups stay one line's.

/// What a hit forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A local port, untagged or with a VLAN tag (`want`: TPID and VLAN ID).
    Port { port: u16, want: Option<(u16, u16)> },
    /// A remote VTEP, in a VNI.
    Peer { peer: u16, vni: u32 },
}

/// A cached decision, packed into 64 bits so an entry fills half a cache line:
///
/// | bits | port egress | peer egress |
/// |---|---|---|
/// | 0..12 | port id | peer id |
/// | 12..24 | bridge domain | bridge domain |
/// | 24 | 0 | 1 |
/// | 25 | the frame arrived tagged | same |
/// | 26..50 | bit 26: tagged out; 27..29: TPID index; 32..44: VLAN ID | VNI |
/// | 50..64 | one more than the longest frame allowed through (ingress and egress MTU) | same (ingress MTU) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit(u64);

impl Default for Hit {
    /// No decision: no frame passes with it, not even an empty one.
    fn default() -> Hit {
        Hit(0)
    }
}

const PEER: u64 = 1 << 24;
const TAGGED_IN: u64 = 1 << 25;
const TAGGED_OUT: u64 = 1 << 26;
/// TPIDs by index (four entries, so a two-bit index needs no bounds check).
const TPIDS: [u16; 4] = [0x8100, 0x88a8, 0x9100, 0x8100];
const ID_MAX: u16 = 0xfff;
/// Longest frame length a hit can carry (jumbo frames are longer: the slow path takes them).
pub const MAX_LEN: usize = (1 << 14) - 2;

impl Hit {
    /// The decision to send a frame of bridge domain `bd` to a local port; `None` when a
    /// field does not fit (the frame then always takes the slow path).
    pub fn to_port(
        bd: u16,
        port: u16,
        tagged_in: bool,
        want: Option<(u16, u16)>,
        max_len: usize,
    ) -> Option<Hit> {
        let out = match want {
            None => 0,
            Some((tpid, vid)) => {
                let i = TPIDS[..3].iter().position(|t| *t == tpid)? as u64;
                if vid > ID_MAX {
                    return None;
                }
                TAGGED_OUT | i << 27 | (vid as u64) << 32
            }
        };
        Self::pack(bd, port, tagged_in, out, max_len)
    }

    /// What a source half of the second level holds ([`crate::megaflow`]): the frame's bridge
    /// domain, whether it arrived tagged, whether it is ARP or IPv6 (`neighbor`: to the
    /// gateway's MAC those are answered or not by their payload, never cached, while IPv4
    /// is), and the longest frame its ingress allows.
    pub fn from_source(bd: u16, tagged_in: bool, neighbor: bool, max_len: usize) -> Option<Hit> {
        Self::pack(bd, neighbor as u16, tagged_in, 0, max_len)
    }

    /// The bridge domain, whether the frame arrived tagged and whether it is ARP or IPv6, as
    /// a [`Hit::from_source`]'s bits hold them: what a destination half is keyed by besides
    /// the MAC.
    #[inline(always)]
    pub fn domain(self) -> u64 {
        self.0 & ((ID_MAX as u64) << 12 | TAGGED_IN | 1)
    }

    /// This decision for a frame whose ingress allows at most what `source` (a
    /// [`Hit::from_source`]) does: the shorter of the two longest frames.
    #[inline(always)]
    pub fn within(self, source: Hit) -> Hit {
        let limit = (self.0 >> 50).min(source.0 >> 50);
        Hit(self.0 & ((1 << 50) - 1) | limit << 50)
    }

    /// Whether it sends the frame back out of local port `port`.
    #[inline(always)]
    pub fn reflects_to(self, port: u16) -> bool {
        self.0 & (PEER | ID_MAX as u64) == port as u64
    }

    /// The decision to send a frame of bridge domain `bd` to a remote VTEP.
    pub fn to_peer(bd: u16, peer: u16, tagged_in: bool, vni: u32, max_len: usize) -> Option<Hit> {
        if vni > 0xff_ffff {
            return None;
        }
        Self::pack(bd, peer, tagged_in, PEER | (vni as u64) << 26, max_len)
    }

    fn pack(bd: u16, id: u16, tagged_in: bool, rest: u64, max_len: usize) -> Option<Hit> {
        if bd > ID_MAX || id > ID_MAX || max_len > MAX_LEN {
            return None;
        }
        let t = if tagged_in { TAGGED_IN } else { 0 };
        Some(Hit(id as u64 | (bd as u64) << 12 | t | rest | (max_len as u64 + 1) << 50))
    }

    #[inline(always)]
    pub fn bd(self) -> u16 {
        (self.0 >> 12) as u16 & ID_MAX
    }

    /// Whether a frame of `len` bytes may take this decision: not longer than the longest
    /// it was made with (none may take [`Hit::default`]'s, not even an empty one).
    #[inline(always)]
    pub fn admits(self, len: u32) -> bool {
        (len as u64) < self.0 >> 50
    }

    /// Whether the egress is a remote VTEP.
    #[inline(always)]
    pub fn is_peer(self) -> bool {
        self.0 & PEER != 0
    }

    /// Whether the frame arrived with a VLAN tag.
    #[inline(always)]
    pub fn tagged_in(self) -> bool {
        self.0 & TAGGED_IN != 0
    }

    /// The egress port when the frame leaves as it came (untagged in and out): the common
    /// case, decided with one test.
    #[inline(always)]
    pub fn plain_port(self) -> Option<u16> {
        (self.0 & (PEER | TAGGED_IN | TAGGED_OUT) == 0).then_some(self.0 as u16 & ID_MAX)
    }

    #[inline(always)]
    pub fn action(self) -> Action {
        let id = self.0 as u16 & ID_MAX;
        if self.0 & PEER != 0 {
            return Action::Peer { peer: id, vni: (self.0 >> 26) as u32 & 0xff_ffff };
        }
        let want = (self.0 & TAGGED_OUT != 0)
            .then(|| (TPIDS[(self.0 >> 27) as usize & 3], (self.0 >> 32) as u16 & ID_MAX));
        Action::Port { port: id, want }
    }
}

/// A known-unicast decision of the slow path as the caches keep it: whole, for the
/// exact-match cache, and as its two halves, for the second level ([`crate::megaflow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub hit: Hit,
    /// The ingress's side: bridge domain, tagged or not, ARP or IPv6 or not, the ingress's
    /// longest frame.
    pub source: Hit,
    /// The egress's side: everything but the ingress's MTU.
    pub destination: Hit,
}

impl Decision {
    /// Out of local port `port` of bridge domain `bd`, from an ingress that allows
    /// `ingress_max` bytes (`None`: a decapsulated frame, which has no ingress MTU) to an
    /// egress that allows `egress_max`; `neighbor`: the frame is ARP or IPv6.
    pub fn to_port(
        bd: u16,
        port: u16,
        tagged_in: bool,
        neighbor: bool,
        want: Option<(u16, u16)>,
        ingress_max: Option<usize>,
        egress_max: usize,
    ) -> Option<Decision> {
        let both = ingress_max.map_or(egress_max, |i| i.min(egress_max));
        let source_max = ingress_max.unwrap_or(MAX_LEN);
        Some(Decision {
            hit: Hit::to_port(bd, port, tagged_in, want, both)?,
            source: Hit::from_source(bd, tagged_in, neighbor, source_max)?,
            destination: Hit::to_port(bd, port, tagged_in, want, egress_max)?,
        })
    }

    /// To remote VTEP `peer` in VNI `vni`, from an ingress that allows `ingress_max` bytes.
    pub fn to_peer(
        bd: u16,
        peer: u16,
        tagged_in: bool,
        neighbor: bool,
        vni: u32,
        ingress_max: usize,
    ) -> Option<Decision> {
        Some(Decision {
            hit: Hit::to_peer(bd, peer, tagged_in, vni, ingress_max)?,
            source: Hit::from_source(bd, tagged_in, neighbor, ingress_max)?,
            destination: Hit::to_peer(bd, peer, tagged_in, vni, MAX_LEN)?,
        })
    }
}

/// The key of one frame. `k0` is the destination MAC (and, after decapsulation, the bridge
/// domain), `k1` the source MAC and EtherType as they lie in the frame, `k2` the ingress and
/// the two bytes after the EtherType, in its low 48 bits (the top 16 hold an entry's epoch).
/// A port with port security has keys of its own layout (see [`Key::from_secured_port`]);
/// they never meet other keys, whose ingress differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    k0: u64,
    k1: u64,
    k2: u64,
}

/// Head bytes a key needs (an Ethernet header and a tag).
pub const KEY_BYTES: usize = 18;
/// Head bytes a key from a port with port security needs: Ethernet, an IPv4 header (the
/// check wants one whole: the source address at 26..30 is in it) and a UDP source port.
pub const SECURED_KEY_BYTES: usize = 36;
/// The DHCP server port as its two bytes read little-endian (one compare with the frame).
const DHCPV4_SERVER_PORT_IN_FRAME: u16 = crate::security::DHCPV4_SERVER_PORT.swap_bytes();
/// Ingress ids at or above this are remote VTEPs (peer id added), not ports.
const FROM_PEER: u64 = 0x8000;
/// Where an entry's epoch sits in its third key word (16 bits: a key's own bits end at 48).
const EPOCH_SHIFT: u32 = 48;
/// Epochs are counted modulo this (0 is skipped: it marks empty entries).
const EPOCHS: u32 = 1 << (64 - EPOCH_SHIFT);
/// Each new epoch empties the next `1 / SWEEP_EPOCHS` of the table (see [`Emc::next_epoch`]).
const SWEEP_EPOCHS: usize = 1 << 15;

impl Key {
    /// The key of a frame received on local port `port`; `None` when the head is too short.
    #[inline(always)]
    pub fn from_port(port: u16, h: &[u8]) -> Option<Key> {
        Self::new(port as u64, 0, h)
    }

    /// The key under which the decision for a frame received on local port `port`, which
    /// has port security, is filled: only an untagged IPv4 frame with a 20-byte header gets
    /// one, and it holds everything the security check decides on — the source MAC, the
    /// EtherType, the IP version and header length (bytes 0..16 of the frame, in `k0` and
    /// `k1`) and the source address (`k2`, beside the port); a frame the DHCP guard could
    /// drop (a UDP source port of 67 where a 20-byte header puts it) gets a key with a
    /// version no entry holds. A hit therefore means the check would pass again: a spoofed
    /// source address has another key, and a DHCP server's frame never hits. ARP, IPv6 (ND
    /// and RA guards, 16-byte sources) and tagged frames from such a port get none and always
    /// take the slow path.
    #[inline(always)]
    pub fn from_secured_port(port: u16, h: &[u8]) -> Option<Key> {
        let k = Self::lookup_from_secured_port(port, h)?;
        // The EtherType (0x0800, big-endian) and the IP version and header length (4, 5), as
        // they lie in `k1` (a frame the DHCP guard could drop has another version here).
        (k.k1 >> 32 & 0xff_ffff == 0x45_0008).then_some(k)
    }

    /// [`Key::from_secured_port`] for a lookup, without its check: the same key for a frame
    /// that has one, and for any other frame (an ARP or a tagged frame, another IP version)
    /// a key that no entry holds, since the bytes that tell them apart are part of the key.
    /// `None` only when the head is too short.
    #[inline(always)]
    pub fn lookup_from_secured_port(port: u16, h: &[u8]) -> Option<Key> {
        let h = h.first_chunk::<SECURED_KEY_BYTES>()?;
        let w = |i: usize| {
            u64::from_le_bytes([
                h[i],
                h[i + 1],
                h[i + 2],
                h[i + 3],
                h[i + 4],
                h[i + 5],
                h[i + 6],
                h[i + 7],
            ])
        };
        let src_ip = u32::from_le_bytes([h[26], h[27], h[28], h[29]]) as u64;
        // A frame the DHCP guard could drop — 67 where a 20-byte IPv4 header puts a UDP
        // source port (see `security`) — has the top bit of its IP version set in its key:
        // no entry holds such a version (fills take version 4 only), so it never hits. (Set,
        // not flipped: a flip would turn a bogus version 12 into a 4 that hits.)
        let dhcp = (u16::from_le_bytes([h[34], h[35]]) == DHCPV4_SERVER_PORT_IN_FRAME) as u64;
        // Rotated so the destination's last bytes, which tell a pod's flows apart, sit where
        // other keys have them, the top (see `Key::bucket`).
        Some(Key {
            k0: w(0).rotate_left(16),
            k1: w(8) | dhcp << 55,
            k2: port as u64 | src_ip << 16,
        })
    }

    /// The key of an inner frame decapsulated from `peer` into bridge domain `bd`.
    #[inline(always)]
    pub fn from_peer(peer: u16, bd: u16, h: &[u8]) -> Option<Key> {
        Self::new(FROM_PEER | peer as u64, bd as u64, h)
    }

    #[inline(always)]
    fn new(ingress: u64, bd: u64, h: &[u8]) -> Option<Key> {
        let h = h.first_chunk::<KEY_BYTES>()?;
        let w = |i: usize| {
            u64::from_le_bytes([
                h[i],
                h[i + 1],
                h[i + 2],
                h[i + 3],
                h[i + 4],
                h[i + 5],
                h[i + 6],
                h[i + 7],
            ])
        };
        // Bytes 0..8 hold the destination and the first two bytes of the source, which `k1`
        // (bytes 6..14) holds too: shift them out.
        let k0 = w(0) << 16 | bd;
        let k1 = w(6);
        let k2 = ingress | (u16::from_le_bytes([h[14], h[15]]) as u64) << 16;
        Some(Key { k0, k1, k2 })
    }

    /// The source half of the key, for [`crate::megaflow`]: everything classification, port
    /// security and learning read — the ingress, the source MAC, the EtherType and the two
    /// bytes after it, and from a port with port security also the IP version, header length,
    /// DSCP, the DHCP guard's mark and the source address. Only the destination is left out
    /// (both layouts keep it in `k0`'s bits 16..64; their low 16 bits hold the bridge domain,
    /// 0 from a port, or a secured key's source bytes, which stay).
    #[inline(always)]
    pub fn source_half(&self) -> Key {
        Key { k0: self.k0 & 0xffff, k1: self.k1, k2: self.k2 }
    }

    /// The destination half of the key: its destination MAC in the bridge domain of `source`
    /// (its source half's decision, [`Hit::from_source`]), for a frame that arrived tagged or
    /// not — what the FDB's decision reads. The ingress is left out, so
    /// the half serves every port of the domain: its bridge domain and tag come from the
    /// source half's decision, and whether the egress is the ingress and the ingress MTU are
    /// checked at each hit ([`crate::megaflow`]).
    #[inline(always)]
    pub fn destination_half(&self, source: Hit) -> Key {
        // The domain in `k2` (below the epoch's bits: it ends at bit 26) and `k1` always 0:
        // the destinations' table need not compare `k1` ([`crate::megaflow`]).
        Key { k0: self.k0 & !0xffff, k1: 0, k2: source.domain() }
    }

    /// Whether the key is a decapsulated frame's (its ingress a remote VTEP).
    #[inline(always)]
    fn of_decapsulated(&self) -> bool {
        self.k2 & FROM_PEER != 0
    }

    /// The ingress port of a key from a local port (both layouts keep it in `k2`'s low bits).
    #[inline(always)]
    pub fn port(&self) -> u16 {
        self.k2 as u16
    }

    /// The third key word as entries of `epoch` hold it.
    #[inline(always)]
    fn with_epoch(&self, epoch: u32) -> u64 {
        self.k2 | (epoch as u64) << EPOCH_SHIFT
    }

    /// The EtherType (or TPID) of the frame.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        ((self.k1 >> 48) as u16).swap_bytes()
    }

    /// The two bytes after the EtherType, big-endian (the TCI when the frame is tagged).
    #[inline(always)]
    pub fn tci(&self) -> u16 {
        ((self.k2 >> 16) as u16).swap_bytes()
    }

    /// The slot of [`Emc::insert`]'s marks for a cache of `2^(64 - shift)` sets: the set and
    /// the hash's next bit, so keys of one set mostly wait in slots of their own.
    #[inline(always)]
    fn waiting_slot(&self, shift: u32) -> usize {
        self.hash().wrapping_shr(shift - 1) as usize
    }

    /// The set of a cache of `2^(64 - shift)` sets (`shift` in 1..=63: a cache has at least
    /// two sets): below that count, with no mask to apply.
    #[inline(always)]
    fn bucket(&self, shift: u32) -> usize {
        // k2's ingress and tag bits lie under k0's zeroed low bits and the destination's
        // lowest bytes (or, for a port with port security, the source address's under the
        // EtherType and the destination's first bytes): a plain XOR keeps them. Fibonacci
        // hashing: the set is the product's *top* bits, the only ones every bit of the key reaches (a product's bit i depends
        // on the factor's bits up to i; bits 32 and up, taken before, never saw the key's
        // bits 48..63 — the destination MAC's last two bytes, all that tells apart the
        // manager's MACs (0a:58 + IPv4) within a /16). The bytes are swapped first so the
        // MACs' last bytes, which vary most, are the low, numerically counting bits that
        // this hashing spreads evenly. The top bits alone: no mask to keep in a register.
        self.hash().wrapping_shr(shift) as usize
    }

    #[inline(always)]
    fn hash(&self) -> u64 {
        (self.k0 ^ self.k1 ^ self.k2).swap_bytes().wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    k0: u64,
    k1: u64,
    /// `Key::k2` with the epoch in the top 16 bits (epoch 0: empty).
    k2: u64,
    hit: u64,
}

impl Entry {
    /// Whether the entry holds `k2` (its ingress and epoch) and, where `K0` and `K1` ask,
    /// `k0` and `k1`.
    #[inline(always)]
    fn matches<const K0: bool, const K1: bool>(&self, k0: u64, k1: u64, k2: u64) -> bool {
        let w0 = if K0 { self.k0 ^ k0 } else { 0 };
        let w1 = if K1 { self.k1 ^ k1 } else { 0 };
        (w0 | w1 | (self.k2 ^ k2)) == 0
    }
}

/// What the cache's entries were derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sources {
    snapshot: u64,
    fdb: u32,
    now: u32,
}

pub struct Emc {
    sets: Box<[[Entry; 2]]>,
    /// Whether a key whose own set is full may sit in the other set of its pair (sets `2i`
    /// and `2i + 1`: four ways, on two adjacent lines) — see [`Emc::insert`].
    pairs: bool,
    /// Whether this epoch put a key in the other set of its pair (when not, a miss in the
    /// own set needs no second look).
    partnered: bool,
    mask: u32,
    /// 64 less the bits of `mask` (see [`Key::bucket`]).
    shift: u32,
    epoch: u32,
    /// The first set the next epoch empties (see [`Emc::next_epoch`]).
    sweep: usize,
    sources: Option<Sources>,
    /// Entries filled, and of them those that took an empty or stale place (not a rewrite of
    /// the same key, nor a live entry pushed out): running counts, wrapping.
    fills: u32,
    free_fills: u32,
    /// Entries filled in this epoch (saturating): about the flows seen since it began.
    epoch_fills: u32,
    /// [`OUTGROWN_FILLS`] for a table that holds more, never for one that does not (its
    /// fills past that evicted: it stays in the core's caches). Derived from the size, kept
    /// so [`Emc::outgrown`] is one compare: a mesh port asks twice a burst (deriving it cost
    /// l2-fullmesh-1k 0.3 instructions a frame).
    outgrows_past: u32,
    /// This epoch's recent fills and evictions, to tell whether the cache thrashes.
    window: (u16, u16),
    /// Thrashing: only one miss in [`SPARSE_EVERY`] fills an entry (see [`Emc::insert`]).
    sparse: bool,
    skipped: u32,
    /// Newcomers turned away once this epoch (see [`Emc::insert`]): a mark per slot, two
    /// slots a set, chosen by the key's hash. Keys that share a slot share its mark, so one
    /// lets the next in: with a mark of its own (a fingerprint), two keys that overwrite each
    /// other's marks never got in (random MACs: 92.7 % hits against 98.0 %).
    waiting: Box<[u8]>,
    /// Fills turned away so far (running count, wrapping).
    deferred: u32,
}

/// Fills looked at together to decide whether the cache thrashes.
const WINDOW: u16 = 1024;
/// While it thrashes, one miss in this many fills an entry.
const SPARSE_EVERY: u32 = 16;
/// Fills in one epoch past which lookups are prefetched: their sets (a line each, 16 384
/// lines = 1 MiB) no longer fit beside everything else in a core's 1–2 MiB L2.
const SPREAD_FILLS: u32 = 16 * 1024;
/// Fills in one epoch past which a lookup, prefetched, still costs more than a hit of the
/// second level, whose two small tables stay in the core's own caches: natively, meshes
/// that hit the exact-match cache every time cost 28–30 TSC cycles a frame against the
/// halves' 35 with 31,250 flows, 33–52 against 35–36 with 61,250 and 36–53 against
/// 35.8–37.5 with 125,000 (docs/perf/vhost-user.md "An exact-match cache that outgrew the
/// core"; this machine: 1 MiB of L2 a core, 32 MiB of L3). It counts fills, not the flows
/// that are hot: within an epoch (a second at most), keys that came once count too.
pub const OUTGROWN_FILLS: u32 = 40 * 1024;

/// What a lookup reads, by value: a burst loop that also stores to memory (buffer metadata)
/// keeps it in registers or on its stack, where `&Emc`'s fields would be read again after
/// every store the compiler cannot prove unrelated.
#[derive(Clone, Copy)]
pub struct EmcView<'a> {
    sets: &'a [[Entry; 2]],
    mask: u32,
    /// 64 less the bits of `mask` (see [`Key::bucket`]).
    shift: u32,
    epoch: u32,
    /// Whether lookups are worth prefetching (see [`Emc::view`]).
    pub spread: bool,
}

/// Two tables' views that share one mask, shift and epoch ([`EmcPair::new`]): the second's
/// lookups use the first's, so a burst loop over both keeps one set of them in registers.
#[derive(Clone, Copy)]
pub struct EmcPair<'a> {
    first: EmcView<'a>,
    second: &'a [[Entry; 2]],
}

impl<'a> EmcPair<'a> {
    /// `first` and `second`, if they look their entries up alike (the same mask, shift and
    /// epoch: tables made with one size and synced together); otherwise a pair that finds
    /// nothing in either (epoch 0 in their first two sets, which every table has).
    #[inline(always)]
    pub fn new(first: EmcView<'a>, second: EmcView<'a>) -> EmcPair<'a> {
        let alike =
            (first.mask, first.shift, first.epoch) == (second.mask, second.shift, second.epoch);
        let first = if alike { first } else { EmcView { mask: 1, shift: 63, epoch: 0, ..first } };
        EmcPair { first, second: second.sets }
    }

    #[inline(always)]
    pub fn first(self) -> EmcView<'a> {
        self.first
    }

    /// The second table's view, with the first's mask, shift and epoch: its own, or (tables
    /// out of step) the first two sets', which it has.
    #[inline(always)]
    pub fn second(self) -> EmcView<'a> {
        EmcView { sets: self.second, ..self.first }
    }
}

impl<'a> EmcView<'a> {
    /// The set `k` lies in (for [`EmcView::prefetch_set`] and [`EmcView::lookup_in`]).
    #[inline(always)]
    pub fn set_of(self, k: &Key) -> usize {
        k.bucket(self.shift)
    }

    /// Hints the CPU to fetch set `set` of [`EmcView::set_of`] (a burst ahead of the lookups).
    #[inline(always)]
    pub fn prefetch_set(self, set: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // In bounds (`sets.len() == mask + 1`) without a check; were it not, a prefetch
            // still has no memory effects.
            let p = self.sets.as_ptr().wrapping_add(set & self.mask as usize);
            // SAFETY: a prefetch reads nothing the program sees and never faults.
            unsafe { _mm_prefetch(p.cast(), _MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = set;
    }

    /// As [`Emc::lookup`]: in the key's own set. (A key whose own set was full may sit in
    /// the other set of its pair: [`EmcView::lookup_partner`] finds it there.)
    #[inline(always)]
    pub fn lookup(self, k: &Key) -> Option<Hit> {
        self.lookup_comparing::<true, true>(k)
    }

    /// The decision for `k` in the other set of its set's pair (see [`Emc::insert`]): where a
    /// burst's misses in their own sets are looked up again (`pipeline/cache.rs`), off the
    /// hits' path.
    #[inline(always)]
    pub fn lookup_partner(self, k: &Key) -> Option<Hit> {
        Self::lookup_set::<true, true>(self.set_at(self.set_of(k) ^ 1), k, self.epoch)
    }

    /// [`EmcView::lookup`], then [`EmcView::lookup_partner`]: everything the pipeline's
    /// lookups find, for a single frame (a trace).
    pub fn lookup_either(self, k: &Key) -> Option<Hit> {
        self.lookup_pair_in(self.set_of(k), k)
    }

    /// [`EmcView::lookup`] comparing, besides the third key word (the ingress or bridge
    /// domain, and the epoch), `k0` only where `K0` and `k1` only where `K1` say: for a table
    /// whose entries cannot differ from the key in a word left out once the others match
    /// (the caller's invariant; [`crate::megaflow`]'s halves have two). Two instructions
    /// fewer for each entry looked at.
    #[inline(always)]
    pub fn lookup_comparing<const K0: bool, const K1: bool>(self, k: &Key) -> Option<Hit> {
        // SAFETY: `sets.len() == 2^(64 - shift)`, and the set is the hash's top `64 - shift`
        // bits.
        let set = unsafe { self.sets.get_unchecked(self.set_of(k)) };
        Self::lookup_set::<K0, K1>(set, k, self.epoch)
    }

    /// As [`EmcView::lookup_in`], then (a miss there) in the other set of the pair.
    #[inline(always)]
    pub fn lookup_pair_in(self, set: usize, k: &Key) -> Option<Hit> {
        Self::lookup_set::<true, true>(self.set_at(set), k, self.epoch)
            .or_else(|| Self::lookup_set::<true, true>(self.set_at(set ^ 1), k, self.epoch))
    }

    /// As [`EmcView::lookup`], `set` being [`EmcView::set_of`] `k`.
    #[inline(always)]
    pub fn lookup_in(self, set: usize, k: &Key) -> Option<Hit> {
        Self::lookup_set::<true, true>(self.set_at(set), k, self.epoch)
    }

    /// Set `set` of the table, masked into it (so any index is safe: a set's partner,
    /// `set ^ 1`, included).
    #[inline(always)]
    fn set_at(self, set: usize) -> &'a [Entry; 2] {
        // SAFETY: `sets.len() == mask + 1` (a power of two), so the masked index is in bounds.
        unsafe { self.sets.get_unchecked(set & self.mask as usize) }
    }

    #[inline(always)]
    fn lookup_set<const K0: bool, const K1: bool>(
        set: &[Entry; 2],
        k: &Key,
        epoch: u32,
    ) -> Option<Hit> {
        let k2 = k.with_epoch(epoch);
        if set[0].matches::<K0, K1>(k.k0, k.k1, k2) {
            return Some(Hit(set[0].hit));
        }
        if set[1].matches::<K0, K1>(k.k0, k.k1, k2) {
            return Some(Hit(set[1].hit));
        }
        None
    }
}

impl std::fmt::Debug for Emc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Emc({} entries, epoch {})", self.capacity(), self.epoch)
    }
}

impl Emc {
    /// A cache of at least `entries` entries (rounded up to a power of two, four at least:
    /// two sets of two; 0 disables it).
    pub fn new(entries: usize) -> Emc {
        // At least two sets: `shift` stays below 64 (see `Key::bucket`).
        let sets = entries.div_ceil(2).next_power_of_two().clamp(2, 1 << 24);
        let enabled = entries > 0;
        Emc {
            sets: zeroed(sets),
            pairs: true,
            partnered: false,
            mask: sets as u32 - 1,
            shift: 64 - sets.trailing_zeros(),
            // Epoch 0 never matches a key (it marks empty entries); a disabled cache stays there.
            epoch: if enabled { 1 } else { 0 },
            sweep: 0,
            sources: None,
            fills: 0,
            free_fills: 0,
            epoch_fills: 0,
            outgrows_past: if sets * 2 > OUTGROWN_FILLS as usize {
                OUTGROWN_FILLS
            } else {
                u32::MAX
            },
            window: (0, 0),
            sparse: false,
            skipped: 0,
            waiting: zeroed_marks(if enabled { 2 * sets } else { 0 }),
            deferred: 0,
        }
    }

    /// A table whose keys sit in their own set only (its lookups need look nowhere else:
    /// [`EmcView::lookup_comparing`]).
    pub fn one_set_a_key(entries: usize) -> Emc {
        Emc { pairs: false, ..Emc::new(entries) }
    }

    pub fn capacity(&self) -> usize {
        if self.epoch == 0 { 0 } else { self.sets.len() * 2 }
    }

    /// Called once per burst: starts a new epoch if the configuration, the FDB or the second
    /// changed since the entries were made. A disabled cache keeps the sources too: the
    /// second level's hits are checked against them ([`Emc::outdated_by`]).
    #[inline(always)]
    pub fn sync(&mut self, snapshot: u64, fdb: u32, now: u32) {
        self.synced(snapshot, fdb, now);
    }

    /// [`Emc::sync`], saying whether the sources changed.
    #[inline(always)]
    pub fn synced(&mut self, snapshot: u64, fdb: u32, now: u32) -> bool {
        let s = Some(Sources { snapshot, fdb, now });
        if s == self.sources {
            return false;
        }
        self.sources = s;
        if self.epoch != 0 {
            self.next_epoch();
        }
        true
    }

    /// Whether the FDB changed since this burst's [`Emc::sync`]: a frame of the burst that
    /// took the slow path moved or removed a MAC, so the lookups made for the frames after it
    /// (all made before it) may be stale.
    #[inline(always)]
    pub fn outdated_by(&self, fdb: u32) -> bool {
        self.sources.is_some_and(|s| s.fdb != fdb)
    }

    /// Starts a new epoch. An entry's epoch must never come round again while it is still in
    /// the table, or it would match once more: each epoch empties the next
    /// `1 / SWEEP_EPOCHS` of the sets (4 sets, 256 bytes, of the default cache), so every
    /// entry is gone within `SWEEP_EPOCHS` epochs of being written, well before its epoch's
    /// number is reused `EPOCHS - 1` epochs later. Emptying the whole table at the wrap
    /// instead stalled the PMD thread for a millisecond (8 MiB; 64 MiB for a cache sized to a
    /// million flows) every 65 535 epochs — a minute or so while MACs flap.
    #[cold]
    fn next_epoch(&mut self) {
        // Every entry is stale: the cache has room again.
        (self.window, self.sparse, self.epoch_fills, self.partnered) = ((0, 0), false, 0, false);
        let step = self.sets.len().div_ceil(SWEEP_EPOCHS);
        let end = (self.sweep + step).min(self.sets.len());
        self.sets[self.sweep..end].fill([Entry::default(); 2]); // no allocation on a PMD thread
        self.sweep = if end == self.sets.len() { 0 } else { end };
        self.epoch = self.epoch % (EPOCHS - 1) + 1;
    }

    /// The cached decision for `k`, if one of this epoch exists (in its own set or the other
    /// of the pair).
    pub fn lookup(&self, k: &Key) -> Option<Hit> {
        self.view().lookup_either(k)
    }

    /// The fields lookups read, by value (see [`EmcView`]).
    ///
    /// `spread`: this epoch filled more entries than a core's own caches hold lines
    /// ([`SPREAD_FILLS`]), so most lookups wait on the shared cache or DRAM; the pipeline then
    /// prefetches a burst's sets before looking them up, which overlaps those waits (a
    /// million flows: 64 instead of 99 cycles a frame) for ~28 instructions a frame that flows
    /// a core's caches hold would pay for nothing.
    #[inline(always)]
    pub fn view(&self) -> EmcView<'_> {
        let spread = self.epoch_fills > SPREAD_FILLS;
        EmcView { sets: &self.sets, mask: self.mask, shift: self.shift, epoch: self.epoch, spread }
    }

    /// Whether this epoch put a key in the other set of its pair, so a miss in a key's own
    /// set may still find it there ([`EmcView::lookup_partner`]).
    #[inline(always)]
    pub fn partnered(&self) -> bool {
        self.partnered
    }

    /// Whether this epoch filled more entries than [`OUTGROWN_FILLS`] into a table that
    /// holds more: even hits then cost more than the second level's.
    #[inline(always)]
    pub fn outgrown(&self) -> bool {
        self.epoch_fills > self.outgrows_past
    }

    /// Remembers a decision. The newer entry of a set sits first; a third key goes to the
    /// other set of the pair when that has room ([`Emc::new`]'s tables; lookups find it there
    /// with [`EmcView::lookup_partner`]), else replaces the older entry of its own set (stale
    /// entries count as free) on its second miss in the epoch: the first only marks it as
    /// waiting. Flows a generator or a VNF replays in turn, three or more of
    /// which share a set, otherwise push each other out at every fill and all miss (100,000
    /// random MACs through 256 Ki entries: 18 % of the flows); with newcomers waiting a miss,
    /// half of them hit, and a newcomer behind entries no longer used still gets in a miss
    /// later, not an epoch (a second) later, as evicting one fill in four would (tried:
    /// docs/perf/instructions.md "Newcomers wait a miss").
    ///
    /// A cache whose fills mostly push out live entries holds fewer flows than pass through
    /// it: filling on every miss then replaces entries before they are hit again (500 000
    /// flows through 256 Ki entries hit 17.6 %, and cost more than no cache). Once three
    /// fills in four of a [`WINDOW`] evicted or were turned away (a newcomer counts once), only
    /// one miss in [`SPARSE_EVERY`] fills (newcomers no longer wait), so the
    /// entries stay long enough to be hit (as OVS's `emc-insert-inv-prob`, but only while
    /// thrashing: a cache with room fills on every miss); a new epoch starts it afresh.
    pub fn insert(&mut self, k: &Key, hit: Hit) {
        if self.epoch == 0 {
            return;
        }
        if self.sparse {
            self.skipped = self.skipped.wrapping_add(1);
            if !self.skipped.is_multiple_of(SPARSE_EVERY) {
                return;
            }
        }
        let epoch = self.epoch;
        let k2 = k.with_epoch(epoch);
        let own = k.bucket(self.shift);
        let e = Entry { k0: k.k0, k1: k.k1, k2, hit: hit.0 };
        let current = |x: &Entry| (x.k2 >> EPOCH_SHIFT) as u32 == epoch;
        let ours = |x: &Entry| x.matches::<true, true>(k.k0, k.k1, k2);
        let (mut evicted, mut free, mut admitted) = (false, false, false);
        let set = &mut self.sets[own];
        if ours(&set[0]) {
            set[0] = e;
        } else if !current(&set[0]) {
            set[0] = e;
            free = true;
        } else if ours(&set[1]) {
            set[1] = e;
        } else if !current(&set[1]) {
            set[1] = set[0];
            set[0] = e;
            free = true;
        } else if let Some(slot) = (self.pairs && (!k.of_decapsulated() || self.view().spread))
            .then(|| self.sets[own ^ 1].iter_mut().find(|x| ours(x) || !current(x)))
            .flatten()
        {
            // The own set full of this epoch's entries: the other set of the pair, where the
            // key then has its only copy (its own set's entries stay until the epoch ends).
            // A decapsulated frame's only while the table is spread: the underlay's lookups
            // look in the partner then only (`pipeline/cache.rs` `strip_hits`), and a table
            // stays spread until the epoch ends.
            free = !current(slot);
            *slot = e;
            self.partnered = true;
        } else {
            evicted = true;
            if !self.sparse {
                if !admit(&mut self.waiting, k.waiting_slot(self.shift), epoch as u8) {
                    self.deferred = self.deferred.wrapping_add(1);
                    self.note_window(true);
                    return;
                }
                admitted = true;
            }
            let set = &mut self.sets[own];
            set[1] = set[0];
            set[0] = e;
        }
        self.fills = self.fills.wrapping_add(1);
        self.epoch_fills = self.epoch_fills.saturating_add(1);
        self.free_fills = self.free_fills.wrapping_add(free as u32);
        // A newcomer let in on its second miss was counted at its first (the window's fills
        // then hold as many that would evict as without waiting): counted again, a wave of
        // new flows let in a round after it came would look like thrashing.
        if !admitted {
            self.note_window(evicted);
        }
    }

    /// Counts a fill into the window that tells whether the cache thrashes: `evicted`, it
    /// pushed out a live entry or (turned away) would have.
    #[inline(always)]
    fn note_window(&mut self, evicted: bool) {
        self.window = (self.window.0 + 1, self.window.1 + evicted as u16);
        if self.window.0 == WINDOW {
            self.sparse = 4 * self.window.1 as u32 >= 3 * WINDOW as u32;
            self.window = (0, 0);
        }
    }

    /// Fills turned away so far, their key waiting for a second miss (running count,
    /// wrapping).
    pub fn deferred(&self) -> u32 {
        self.deferred
    }

    /// Whether only some misses fill entries (the cache thrashes; see [`Emc::insert`]).
    pub fn is_sparse(&self) -> bool {
        self.sparse
    }

    /// Entries filled so far (running count, wrapping: callers subtract two readings).
    #[inline(always)]
    pub fn fills(&self) -> u32 {
        self.fills
    }

    /// Entries filled into an empty or stale place so far (running count, wrapping): flows
    /// the cache had room for, not rewrites of a key it holds.
    #[inline(always)]
    pub fn free_fills(&self) -> u32 {
        self.free_fills
    }
}

/// Whether a newcomer whose fill would push out a live entry gets in: on the second try in
/// an epoch from its slot of `waiting` (marked with the epoch's low byte, `mark`, by the
/// first; cleared for the next newcomer), not on the first. Marks of an older epoch are
/// stale; one that wrapped round to this epoch (256 epochs on, or a zeroed slot) only lets a
/// newcomer in a miss early.
#[inline(always)]
fn admit(waiting: &mut [u8], slot: usize, mark: u8) -> bool {
    let Some(w) = waiting.get_mut(slot) else { return true };
    let second = *w == mark;
    *w = if second { mark.wrapping_sub(1) } else { mark };
    second
}

/// Zeroed marks straight from zeroed pages (untouched until used), on huge pages where the
/// table is large (as the entries: the marks are read at random too).
fn zeroed_marks(n: usize) -> Box<[u8]> {
    // SAFETY: zero is a valid u8.
    let b = unsafe { Box::<[u8]>::new_zeroed_slice(n).assume_init() };
    crate::util::back_with_huge_pages(&b);
    b
}

/// A table of empty entries straight from zeroed pages (untouched until used).
fn zeroed(sets: usize) -> Box<[[Entry; 2]]> {
    let b = Box::<[[Entry; 2]]>::new_zeroed_slice(sets);
    // SAFETY: an entry is four integers, for which all-zero bits are valid (and mean empty).
    let b = unsafe { b.assume_init() };
    // Lookups land anywhere in the table: with 4 KiB pages, a 64 MiB cache missed the TLB on
    // nearly every one.
    crate::util::back_with_huge_pages(&b);
    b
}

#[cfg(test)]
mod test {
    use super::*;

    fn frame(dst: u8, src: u8, et: u16, tci: u16) -> [u8; 18] {
        let mut f = [0u8; 18];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
        f[12..14].copy_from_slice(&et.to_be_bytes());
        f[14..16].copy_from_slice(&tci.to_be_bytes());
        f
    }

    /// A cache that evicts live entries on three fills in four fills on one miss in 16 from
    /// the next window on; a cache with room (a new epoch) fills on every miss again.
    #[test]
    fn a_thrashing_cache_fills_sparsely_until_it_has_room() {
        let mut c = Emc::new(64);
        let hit = Hit::to_port(1, 2, false, None, 1518).unwrap();
        let key = |n: u32| {
            let mut f = frame(0, 0, 0x0800, 0);
            f[2..6].copy_from_slice(&n.to_be_bytes());
            Key::from_port(1, &f).unwrap()
        };
        for n in 0..64 {
            c.insert(&key(n), hit);
        }
        assert!(!c.is_sparse(), "filling free entries is not thrashing");
        // New keys, each met once: most are turned away (each counts in the window), some let
        // in at once by another's mark in their slot (not counted: a let-in's first miss is).
        for n in 64..64 + 2 * WINDOW as u32 {
            c.insert(&key(n), hit);
        }
        assert!(c.is_sparse(), "a window of fills that evicted live entries, or would have");
        let before = c.fills();
        for n in 0..1600 {
            c.insert(&key(100_000 + n), hit);
        }
        assert_eq!(c.fills() - before, 1600 / SPARSE_EVERY, "one miss in {SPARSE_EVERY} fills");
        c.sync(1, 1, 1); // a new epoch: every entry stale, room again
        assert!(!c.is_sparse());
        let before = c.fills();
        c.insert(&key(7), hit);
        assert_eq!(c.fills() - before, 1);
        assert_eq!(c.lookup(&key(7)), Some(hit));
    }

    #[test]
    fn a_secured_port_keys_ipv4_by_source_address_and_nothing_else() {
        use crate::testkit::{frames, mac};
        let udp =
            |ip: [u8; 4]| frames::udp4(mac(2), mac(1), ip.into(), [192, 0, 2, 9].into(), 1, 2, 64);
        let a = Key::from_secured_port(3, &udp([192, 0, 2, 1])).unwrap();
        assert_eq!(a, Key::from_secured_port(3, &udp([192, 0, 2, 1])).unwrap(), "the same flow");
        for other in [[192, 0, 2, 2], [192, 0, 3, 1], [10, 0, 2, 1], [0, 0, 0, 0]] {
            assert_ne!(a, Key::from_secured_port(3, &udp(other)).unwrap(), "source {other:?}");
        }
        assert_ne!(a, Key::from_secured_port(4, &udp([192, 0, 2, 1])).unwrap(), "another port");
        let mut not_v4 = udp([192, 0, 2, 1]);
        not_v4[14] = 0x65;
        let ip = [192, 0, 2, 1].into();
        for (what, f) in [
            ("ARP", frames::arp_request(mac(1), ip, ip)),
            ("IPv6", frames::ns(mac(1), "fe80::1".parse().unwrap(), "fd00::1".parse().unwrap())),
            ("tagged", frames::add_tag(&udp([192, 0, 2, 1]), 0x8100, 10)),
            ("not version 4", not_v4),
            ("shorter than an IPv4 header", udp([192, 0, 2, 1])[..33].to_vec()),
        ] {
            assert_eq!(Key::from_secured_port(3, &f), None, "{what}: always the slow path");
        }
    }

    /// Lookups skip the fill key's check: a frame that may be cached looks up the key it is
    /// filled under, and one that may not (same MACs and the same bytes where an IPv4
    /// source address lies) looks up a key that no fill made.
    #[test]
    fn a_secured_ports_lookups_find_only_what_its_fills_made() {
        use crate::testkit::{frames, mac};
        let ip = [192, 0, 2, 1];
        let good = frames::udp4(mac(2), mac(1), ip.into(), [192, 0, 2, 9].into(), 1, 2, 64);
        let filled = Key::from_secured_port(3, &good).unwrap();
        assert_eq!(Key::lookup_from_secured_port(3, &good), Some(filled));
        let same_source = |mut f: Vec<u8>| {
            f.resize(f.len().max(SECURED_KEY_BYTES), 0);
            f[..6].copy_from_slice(&good[..6]);
            f[26..30].copy_from_slice(&ip);
            f
        };
        let mut v6 = good.clone();
        v6[14] = 0x65;
        let mut tagged = frames::add_tag(&good, 0x8100, 10);
        tagged[26..30].copy_from_slice(&ip);
        for (what, f) in [
            ("ARP", same_source(frames::arp_request(mac(1), ip.into(), ip.into()))),
            (
                "IPv6",
                same_source(frames::ns(
                    mac(1),
                    "fe80::1".parse().unwrap(),
                    "fd00::1".parse().unwrap(),
                )),
            ),
            ("tagged", same_source(tagged)),
            ("not version 4", v6),
        ] {
            assert_eq!(Key::from_secured_port(3, &f), None, "{what}: never filled");
            let k = Key::lookup_from_secured_port(3, &f).unwrap();
            assert_ne!(k, filled, "{what}: finds nothing the good frame filled");
        }
    }

    fn to_3() -> Hit {
        Hit::to_port(7, 3, false, Some((0x88a8, 100)), 1518).unwrap()
    }

    /// How many of `keys` the cache still holds after inserting them all.
    fn held(keys: &[Key], sets: usize) -> usize {
        let mut c = Emc::new(2 * sets);
        c.sync(1, 1, 0);
        for k in keys {
            c.insert(k, to_3());
        }
        keys.iter().filter(|k| c.lookup(k).is_some()).count()
    }

    /// The MAC sets pods really have spread over the cache's sets: one source to 1 000
    /// destinations that differ only in the last two bytes, and the manager's MACs
    /// (0a:58 + IPv4) across a /16. They all fell into one 2-way set, so 2 of 1 000 stayed.
    #[test]
    fn realistic_mac_sets_spread_over_the_sets() {
        let key = |dst: [u8; 6], src: [u8; 6]| {
            let mut f = [0u8; 18];
            f[..6].copy_from_slice(&dst);
            f[6..12].copy_from_slice(&src);
            f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            Key::from_port(1, &f).unwrap()
        };
        let last_two: Vec<Key> = (0..1000u16)
            .map(|i| {
                let [a, b] = i.to_be_bytes();
                key([2, 0, 0, 0, a, b], [2, 0, 0, 0, 0, 1])
            })
            .collect();
        let manager: Vec<Key> = (0..1000u16)
            .map(|i| {
                let [a, b] = (i * 61).to_be_bytes();
                key([0x0a, 0x58, 10, 72, a, b], [0x0a, 0x58, 10, 72, 0, 2])
            })
            .collect();
        let pod: Vec<Key> = (0..1000u16)
            .map(|i| {
                let [a, b] = (i * 61).to_be_bytes();
                let f = crate::testkit::frames::udp4(
                    crate::wire::MacAddr([0x0a, 0x58, 10, 72, a, b]),
                    crate::wire::MacAddr([0x0a, 0x58, 10, 72, 0, 2]),
                    [10, 72, 0, 2].into(),
                    [10, 72, a, b].into(),
                    1,
                    2,
                    64,
                );
                Key::from_secured_port(1, &f).unwrap()
            })
            .collect();
        for (what, keys) in
            [("last two bytes", &last_two), ("manager MACs", &manager), ("from a pod port", &pod)]
        {
            // 4 096 entries for 1 000 keys: a uniform spread keeps nearly all of them.
            let n = held(keys, 2048);
            assert!(n >= 990, "{what}: {n} of 1000 kept");
        }
    }

    #[test]
    fn codes_round_trip() {
        for (bd, id, tin, want, max) in [
            (7, 3, false, Some((0x88a8, 100)), 1518),
            (4095, 4095, true, None, MAX_LEN),
            (0, 0, true, Some((0x9100, 4095)), 0),
        ] {
            let h = Hit::to_port(bd, id, tin, want, max).unwrap();
            assert_eq!(
                (h.bd(), h.tagged_in(), h.action()),
                (bd, tin, Action::Port { port: id, want })
            );
            assert!(h.admits(max as u32) && !h.admits(max as u32 + 1));
        }
        assert!(!Hit::default().admits(0), "no decision admits even an empty frame");
        let h = Hit::to_peer(9, 12, true, 0xff_ffff, 9000).unwrap();
        assert_eq!(
            (h.bd(), h.tagged_in(), h.action()),
            (9, true, Action::Peer { peer: 12, vni: 0xff_ffff })
        );
        assert!(h.admits(9000) && !h.admits(9001));
        assert_eq!(Hit::to_port(1, 4096, false, None, 1518), None);
        assert_eq!(Hit::to_port(1, 1, false, Some((0x0800, 1)), 1518), None);
        assert_eq!(Hit::to_port(1, 1, false, None, MAX_LEN + 1), None);
        assert_eq!(Hit::to_peer(1, 1, false, 1 << 24, 1518), None);
    }

    #[test]
    fn key_covers_ingress_macs_type_and_tag() {
        let f = frame(1, 2, 0x8100, 0x2064);
        let k = Key::from_port(5, &f).unwrap();
        assert_eq!((k.ethertype(), k.tci()), (0x8100, 0x2064));
        let differ = [
            Key::from_port(6, &f),
            Key::from_port(5, &frame(9, 2, 0x8100, 0x2064)),
            Key::from_port(5, &frame(1, 9, 0x8100, 0x2064)),
            Key::from_port(5, &frame(1, 2, 0x88a8, 0x2064)),
            Key::from_port(5, &frame(1, 2, 0x8100, 0x2065)),
            Key::from_peer(5, 0, &f),
            Key::from_peer(5, 1, &f),
        ];
        for d in differ {
            assert_ne!(d, Some(k));
        }
        assert_eq!(Key::from_port(5, &f[..17]), None);
    }

    #[test]
    fn hits_until_any_source_changes() {
        let mut c = Emc::new(64);
        c.sync(1, 1, 1);
        let k = Key::from_port(1, &frame(1, 2, 0x0800, 0x4500)).unwrap();
        assert_eq!(c.lookup(&k), None);
        c.insert(&k, to_3());
        assert_eq!(c.lookup(&k), Some(to_3()));
        c.sync(1, 1, 1);
        assert_eq!(c.lookup(&k), Some(to_3()));
        for (s, f, n) in [(2, 1, 1), (2, 2, 1), (2, 2, 2)] {
            c.insert(&k, to_3());
            c.sync(s, f, n);
            assert_eq!(c.lookup(&k), None, "after a change to {:?}", (s, f, n));
        }
    }

    #[test]
    fn two_tables_out_of_step_find_nothing() {
        let (mut a, mut b) = (Emc::new(64), Emc::new(4096));
        a.sync(0, 0, 0);
        b.sync(0, 0, 0);
        let k = Key::from_port(1, &frame(1, 2, 0x0800, 0)).unwrap();
        a.insert(&k, to_3());
        b.insert(&k, to_3());
        let pair = EmcPair::new(a.view(), b.view());
        assert_eq!((pair.first().lookup(&k), pair.second().lookup(&k)), (None, None));
        let mut c = Emc::new(64);
        c.sync(0, 0, 0);
        c.insert(&k, to_3());
        let pair = EmcPair::new(a.view(), c.view());
        assert_eq!(pair.second().lookup(&k), Some(to_3()), "alike: the second's own view");
        c.sync(1, 0, 0);
        assert_eq!(EmcPair::new(a.view(), c.view()).first().lookup(&k), None, "epochs apart");
    }

    /// `n` keys (of frames from port 1) that fall in one set of `c`.
    fn keys_of_one_set(c: &Emc, n: usize) -> Vec<Key> {
        let all: Vec<Key> =
            (0..64).map(|i| Key::from_port(1, &frame(i, 2, 0x0800, 0)).unwrap()).collect();
        let own = c.view().set_of(&all[0]);
        let keys: Vec<Key> =
            all.iter().filter(|k| c.view().set_of(k) == own).take(n).copied().collect();
        assert_eq!(keys.len(), n, "{n} keys of one set");
        keys
    }

    #[test]
    fn colliding_keys_share_a_set_of_two() {
        let mut c = Emc::one_set_a_key(4); // two sets, the fewest a cache has
        c.sync(0, 0, 0);
        let keys = keys_of_one_set(&c, 3);
        c.insert(&keys[0], to_3());
        c.insert(&keys[1], to_3());
        assert!(c.lookup(&keys[0]).is_some() && c.lookup(&keys[1]).is_some());
        c.insert(&keys[2], to_3());
        assert_eq!(c.lookup(&keys[2]), None, "a newcomer's first fill only marks it waiting");
        assert!(c.lookup(&keys[0]).is_some() && c.lookup(&keys[1]).is_some());
        assert_eq!(c.deferred(), 1);
        c.insert(&keys[2], to_3());
        assert!(c.lookup(&keys[2]).is_some() && c.lookup(&keys[1]).is_some(), "its second");
        assert_eq!(c.lookup(&keys[0]), None, "the older way is replaced");
        c.sync(1, 0, 0); // a new epoch: the set is free again, and nobody waits
        c.insert(&keys[0], to_3());
        c.insert(&keys[1], to_3());
        c.insert(&keys[2], to_3());
        assert_eq!(c.lookup(&keys[2]), None, "a mark of the epoch before does not count");
    }

    /// A key whose own set is full goes to the other set of the pair while it has room, where
    /// only a second look finds it; once both are full, a newcomer waits and then replaces
    /// the older entry of its own set. A decapsulated frame's key stays in its own set while
    /// the table is not spread (the underlay's lookups look nowhere else then).
    #[test]
    fn a_full_sets_keys_go_to_the_other_set_of_its_pair() {
        let mut c = Emc::new(4); // one pair of sets
        c.sync(0, 0, 0);
        let keys = keys_of_one_set(&c, 5);
        for k in &keys[..4] {
            c.insert(k, to_3());
        }
        assert!(keys[..4].iter().all(|k| c.lookup(k).is_some()), "four ways");
        assert!(c.partnered());
        for k in &keys[2..4] {
            assert_eq!(c.view().lookup(k), None, "not in its own set");
            assert!(c.view().lookup_partner(k).is_some(), "in the other of its pair");
        }
        c.insert(&keys[4], to_3());
        assert_eq!(c.lookup(&keys[4]), None, "both sets full: the newcomer waits");
        c.insert(&keys[4], to_3());
        assert!(c.view().lookup(&keys[4]).is_some(), "then takes its own set's older place");
        assert_eq!(c.lookup(&keys[0]), None);
        c.sync(1, 0, 0);
        assert!(!c.partnered(), "a new epoch");
        let peer: Vec<Key> =
            (0..64).filter_map(|i| Key::from_peer(3, 1, &frame(i, 2, 0x0800, 0))).collect();
        let own = c.view().set_of(&peer[0]);
        let peer: Vec<Key> = peer.into_iter().filter(|k| c.view().set_of(k) == own).collect();
        for k in &peer[..3] {
            c.insert(k, to_3());
        }
        assert!(!c.partnered(), "a decapsulated frame's key waits in its own set");
        assert_eq!(c.lookup(&peer[2]), None);
    }

    /// Once a table is spread (more fills this epoch than a core's caches hold lines), a
    /// decapsulated frame's key may sit in the partner set too: the underlay's probe then
    /// looks there, and the table stays spread until the epoch ends.
    #[test]
    fn a_spread_tables_decapsulated_keys_go_to_the_partner_too() {
        let mut c = Emc::new(1 << 16);
        c.sync(0, 0, 0);
        let local = |n: u32| {
            let mut f = frame(0, 0, 0x0800, 0);
            f[2..6].copy_from_slice(&n.to_be_bytes());
            Key::from_port(2, &f).unwrap()
        };
        for n in 0..=SPREAD_FILLS {
            c.insert(&local(n), to_3());
        }
        assert!(c.view().spread);
        let peer: Vec<Key> = (0..65_536u32)
            .filter_map(|n| {
                let mut f = frame(0, 0, 0x0800, 0);
                f[6..12].copy_from_slice(&crate::testkit::random_mac(n).0);
                Key::from_peer(3, 1, &f)
            })
            .collect();
        // Three decapsulated keys of one set that holds nothing yet, whose partner has room.
        let free = |c: &Emc, set: usize| {
            c.sets[set].iter().filter(|e| (e.k2 >> EPOCH_SHIFT) as u32 != c.epoch).count()
        };
        let mut by_set = std::collections::HashMap::<usize, Vec<Key>>::new();
        for k in peer {
            by_set.entry(c.view().set_of(&k)).or_default().push(k);
        }
        let (_, keys) = by_set
            .into_iter()
            .filter(|(set, keys)| keys.len() >= 3 && free(&c, *set) == 2 && free(&c, set ^ 1) > 0)
            .min_by_key(|(set, _)| *set)
            .expect("an empty set with three keys and room in its partner");
        for k in &keys[..3] {
            c.insert(k, to_3());
        }
        assert_eq!(c.view().lookup(&keys[2]), None, "not in its own set");
        assert!(c.view().lookup_partner(&keys[2]).is_some(), "in the partner");
        assert!(c.view().lookup_pair_in(c.view().set_of(&keys[2]), &keys[2]).is_some());
    }

    /// Three flows of one set met in turn (as a generator replays them): with each fill
    /// replacing the older entry they would all miss every time; with a newcomer let in on
    /// its second miss, half of them hit (the waiting flow, let in, pushes out the one met
    /// next; the best a set of two can do is two in three).
    #[test]
    fn three_flows_of_a_set_met_in_turn_mostly_hit() {
        let mut c = Emc::one_set_a_key(4);
        c.sync(0, 0, 0);
        let keys = keys_of_one_set(&c, 3);
        let mut hits = 0;
        for _round in 0..100 {
            for k in &keys {
                match c.lookup(k) {
                    Some(_) => hits += 1,
                    None => c.insert(k, to_3()),
                }
            }
        }
        assert!(hits >= 145, "{hits} hits of 300");
    }

    #[test]
    fn disabled_cache_never_hits() {
        let mut c = Emc::new(0);
        c.sync(0, 0, 0);
        let k = Key::from_port(1, &frame(1, 2, 0x0800, 0)).unwrap();
        c.insert(&k, to_3());
        assert_eq!(c.lookup(&k), None);
        assert_eq!(c.capacity(), 0);
    }

    #[test]
    fn an_entry_never_outlives_its_epochs_number() {
        // Small tables sweep a set per epoch, large ones several: entries written at any
        // epoch, anywhere, are gone before their epoch's number comes round.
        for sets in [2usize, 1 << 10, 1 << 16, 1 << 17] {
            let mut c = Emc::new(sets * 2);
            c.sync(0, 0, 0);
            // More keys than writes: none is written twice, so only the sweep can empty it.
            let keys: Vec<Key> = (0..=255u8)
                .map(|i| Key::from_port(1, &frame(i, i.wrapping_mul(7), 0x0800, 0)).unwrap())
                .collect();
            let mut now = 0;
            let mut written: std::collections::HashMap<u32, Vec<Key>> = Default::default();
            // Write a key every 1 009 epochs for a whole cycle of epoch numbers and more.
            for step in 0..2 * EPOCHS {
                if step % 1009 == 0 {
                    let k = keys[(step / 1009) as usize % keys.len()];
                    c.insert(&k, to_3());
                    written.entry(c.epoch).or_default().push(k);
                }
                now += 1;
                c.sync(0, 0, now);
                assert_ne!(c.epoch, 0, "epoch 0 marks empty entries");
                for k in written.remove(&c.epoch).unwrap_or_default() {
                    assert_eq!(
                        c.lookup(&k),
                        None,
                        "{sets} sets: an entry of an earlier epoch {} matched",
                        c.epoch
                    );
                }
            }
        }
    }

    #[test]
    fn a_new_epoch_empties_only_a_slice() {
        let mut c = Emc::new(1 << 18); // 2^17 sets: 4 a step
        c.sync(0, 0, 0);
        c.sync(0, 0, 1);
        assert_eq!((c.epoch, c.sweep), (3, 8));
        c.epoch = EPOCHS - 1;
        c.sync(0, 0, 2);
        assert_eq!(
            (c.epoch, c.sweep),
            (1, 12),
            "the count skips 0 and nothing else happens at the wrap"
        );
    }
}

//! Priority on a shared egress other than the underlay: a trunk carrying a priority VLAN
//! network (a control plane) and an ordinary one (a media plane). The priority domain's
//! frames leave first and wait for room instead of being dropped — known unicast and floods
//! alike, however often the flow repeats (such frames are not cached) — and the guard of the
//! lowest class gives the ordinary plane a share of a ring a priority flood fills.

use std::net::Ipv4Addr;
use std::sync::Arc;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::{Harness, frames, mac};
use vswitch::{Batch, Event, Pool, PoolCache, SwitchOptions};

const CONTROL_VLAN: u16 = 100;
const MEDIA_VLAN: u16 = 200;

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// Pods a1 (control, priority unless `priority` is false) and b1 (media); trunk "tr" with
/// both VLANs on a ring of 64 slots whose far end the test drains itself.
fn setup(priority: bool) -> (Harness, RingPeer) {
    let mut h = Harness::with_pool(Pool::new(16384, false).unwrap(), SwitchOptions::default());
    h.ring("b1").ring("a1");
    let (tr, wire) = RingPort::new("tr", 1, 64).unwrap();
    h.register("tr", tr);
    let mut control = BridgeConfig::new("control").vlan(CONTROL_VLAN);
    control.priority = priority;
    h.apply(SwitchConfig {
        bridges: vec![control, BridgeConfig::new("media").vlan(MEDIA_VLAN)],
        ports: vec![
            PortConfig::access("b1", "media"),
            PortConfig::access("a1", "control"),
            PortConfig::trunk("tr", &[CONTROL_VLAN, MEDIA_VLAN], None),
        ],
        vtep: None,
    })
    .unwrap();
    (h, wire)
}

/// Frames taken from the trunk's far end (at most `max`), counted by VLAN: (control, media).
fn take(h: &Harness, wire: &mut RingPeer, max: usize, seen: &mut (usize, usize)) {
    let mut cache = PoolCache::new(h.pool.clone());
    let mut batch = Batch::new();
    let mut taken = 0;
    while taken < max && wire.recv(0, &mut batch) > 0 {
        for b in batch.drain() {
            let mut f = Vec::new();
            h.pool.read_frame(&b, &mut f);
            cache.free(b);
            taken += 1;
            match u16::from_be_bytes([f[14], f[15]]) & 0xfff {
                CONTROL_VLAN => seen.0 += 1,
                _ => seen.1 += 1,
            }
        }
    }
}

/// The far ends of both VLANs answer once, so the switch knows their MACs behind the trunk.
fn learn_far_ends(h: &mut Harness, wire: &mut RingPeer) {
    let mut cache = PoolCache::new(h.pool.clone());
    for (vlan, dst, src) in [(CONTROL_VLAN, 2, 1), (MEDIA_VLAN, 4, 3)] {
        let f = frames::tagged(mac(dst), mac(src), 0x8100, vlan, 0x0800, &[0; 46]);
        let mut b = cache.alloc().unwrap();
        h.pool.append(&mut b, &f);
        wire.send_one(0, b).map_err(|_| "ring full").unwrap();
    }
    h.step();
    h.recv_all();
}

/// 32 media frames and one control frame a round, both to MACs known behind the trunk (or
/// unknown: flooded, `known` false); the trunk's ring drained every fourth round. Returns
/// what arrived and the counters.
fn trickle_under_flood(priority: bool, known: bool) -> ((usize, usize), vswitch::counters::Totals) {
    let (mut h, mut wire) = setup(priority);
    if known {
        learn_far_ends(&mut h, &mut wire);
    }
    let mut seen = (0, 0);
    let (control_dst, media_dst) = if known { (mac(1), mac(3)) } else { (mac(11), mac(13)) };
    for round in 0..100u16 {
        for i in 0..32u16 {
            h.send("b1", &frames::udp4(media_dst, mac(4), ip(4), ip(3), i, round, 200));
        }
        h.send("a1", &frames::udp4(control_dst, mac(2), ip(2), ip(1), 7, round, 80));
        h.step();
        if round % 4 == 3 {
            take(&h, &mut wire, usize::MAX, &mut seen);
        }
    }
    take(&h, &mut wire, usize::MAX, &mut seen);
    // Held frames leave with the next flush (a burst of anything).
    h.send("b1", &frames::udp4(media_dst, mac(4), ip(4), ip(3), 1, 1, 60));
    h.step();
    take(&h, &mut wire, usize::MAX, &mut seen);
    (seen, h.stats())
}

#[test]
fn a_priority_vlan_loses_nothing_to_a_flood_on_a_shared_trunk() {
    for known in [true, false] {
        let ((control, media), s) = trickle_under_flood(true, known);
        assert_eq!(control, 100, "known {known}: every control frame arrived");
        assert!(
            media < 100 * 32 / 2,
            "known {known}: the media flood was cut to what the ring drains: {media}"
        );
        assert_eq!(s.event(Event::PriorityFirst), 100, "known {known}");
        let tr = &s.ports[2];
        assert_eq!(tr.tx_priority, 100, "known {known}: counted per port");
        assert!(tr.priority_held > 0, "known {known}: control frames waited for room");
        assert_eq!(tr.priority_dropped, 0, "known {known}");
        assert_eq!(s.event(Event::PriorityNoSlot), 0);
        if known {
            // The media flow is cached; the control flow, which leaves first, never is.
            assert!(s.event(Event::CacheHits) > 1000, "{}", s.event(Event::CacheHits));
        }
    }
    let ((control, _), s) = trickle_under_flood(false, true);
    assert!(
        control < 60,
        "without priority the flood takes most control frames: {control} arrived"
    );
    assert_eq!(s.event(Event::PriorityFirst), 0);
    assert_eq!(s.ports[2].tx_priority, 0);
}

/// A priority plane that itself floods cannot take the whole ring: 32 frames of each plane a
/// round, 32 slots freed every other round. Strict priority alone would give the media
/// plane nothing after the first rounds; the guard sends its batch first on every fifth
/// contended flush.
#[test]
fn the_guard_gives_the_lowest_class_a_share_of_a_ring_a_priority_flood_fills() {
    let (mut h, mut wire) = setup(true);
    learn_far_ends(&mut h, &mut wire);
    let mut seen = (0, 0);
    for round in 0..200u16 {
        for i in 0..32u16 {
            h.send("b1", &frames::udp4(mac(3), mac(4), ip(4), ip(3), i, round, 200));
            h.send("a1", &frames::udp4(mac(1), mac(2), ip(2), ip(1), i, round, 80));
        }
        h.step();
        if round % 2 == 1 {
            take(&h, &mut wire, 32, &mut seen);
        }
    }
    let s = h.stats();
    let (control, media) = seen;
    let total = control + media;
    // What was drained: 64 at first, then 32 every other round.
    assert!(total >= 100 * 32, "{control} + {media}");
    let guards = s.event(Event::PriorityGuard);
    assert!(guards >= 15, "the guard went first {guards} times");
    // One contended flush in five: a fifth of the ring, within a batch either way.
    assert!(media * 5 >= total - 64 && media * 5 <= total + 5 * 64, "media {media} of {total}");
    assert!(control > 3 * media, "priority still takes most: {control} vs {media}");
    let _ = Arc::strong_count(&h.pool);
}

/// A stalled ring: priority frames wait, in order, up to 256 a port and thread (8 batches),
/// then the excess is dropped and counted; once the ring drains, the held ones leave first.
#[test]
fn priority_frames_wait_out_a_stalled_ring_in_order() {
    let (mut h, mut wire) = setup(true);
    learn_far_ends(&mut h, &mut wire);
    // Fill the trunk's ring (64 slots) with media frames.
    for i in 0..64u16 {
        h.send("b1", &frames::udp4(mac(3), mac(4), ip(4), ip(3), i, 0, 200));
    }
    h.step();
    for round in 0..300u16 {
        h.send("a1", &frames::udp4(mac(1), mac(2), ip(2), ip(1), 7, round, 80));
        h.step();
    }
    let s = h.stats();
    assert_eq!(s.ports[2].priority_dropped, 300 - 256, "held up to 256, the rest dropped");
    assert_eq!(
        s.ports[2].priority_held, 256,
        "each held frame counted once, however many flushes it waited"
    );
    // The consumer catches up: media first (already in the ring), then the held control
    // frames, in the order they came — with no traffic left to flush them: an idle PMD
    // thread's housekeeping sends them.
    let mut cache = PoolCache::new(h.pool.clone());
    let mut got = Vec::new();
    for _ in 0..20 {
        let mut batch = Batch::new();
        while wire.recv(0, &mut batch) > 0 {
            for b in batch.drain() {
                let mut f = Vec::new();
                h.pool.read_frame(&b, &mut f);
                cache.free(b);
                if u16::from_be_bytes([f[14], f[15]]) & 0xfff == CONTROL_VLAN {
                    // The UDP destination port: the round (tagged frame: IPv4 at 18).
                    got.push(u16::from_be_bytes([f[18 + 22], f[18 + 23]]));
                }
            }
        }
        let snap = h.switch.snapshot();
        h.pipe.housekeeping(&snap);
    }
    assert_eq!(got, (0..256).collect::<Vec<_>>(), "the first 256 rounds, in order");
}

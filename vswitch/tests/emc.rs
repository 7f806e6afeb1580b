//! The exact-match cache never changes what the switch does: after a flow is cached, MAC
//! moves, FDB flushes, configuration changes, a new second (learning refresh), oversize
//! frames and refused learning all behave as without it.

use std::net::Ipv4Addr;
use vswitch::config::{BridgeConfig, PortConfig, StaticMac, SwitchConfig};
use vswitch::fdb::Dest;
use vswitch::testkit::{Harness, frames, mac, random_mac};
use vswitch::wire::MacAddr;
use vswitch::{DropReason, Event};

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

fn config(mtu: u16) -> SwitchConfig {
    let mut ports: Vec<PortConfig> =
        ["p0", "p1", "p2"].iter().map(|p| PortConfig::access(p, "red")).collect();
    for p in &mut ports {
        p.mtu = mtu;
    }
    SwitchConfig { bridges: vec![BridgeConfig::new("red")], ports, vtep: None }
}

/// p0 (mac 1) and p1 (mac 2) have talked, so 1 → 2 is known unicast and cached.
fn cached_flow() -> (Harness, Vec<u8>) {
    let mut h = Harness::new();
    for p in ["p0", "p1", "p2"] {
        h.ring(p);
    }
    h.apply(config(1500)).unwrap();
    h.set_now(1);
    let a_to_b = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 64);
    h.send("p0", &a_to_b);
    h.send("p1", &frames::udp4(mac(1), mac(2), ip(2), ip(1), 2000, 1000, 64));
    h.step();
    h.recv_all();
    for _ in 0..2 {
        h.send("p0", &a_to_b);
        h.step();
    }
    assert_eq!(h.recv("p1"), vec![a_to_b.clone(), a_to_b.clone()]);
    assert_eq!(h.stats().event(Event::CacheHits), 1, "the second frame of the flow hit");
    (h, a_to_b)
}

fn hits(h: &Harness) -> u64 {
    h.stats().event(Event::CacheHits)
}

#[test]
fn a_cached_flow_is_forwarded_byte_exact() {
    let (mut h, f) = cached_flow();
    for _ in 0..40 {
        h.send("p0", &f);
    }
    h.step();
    assert_eq!(h.recv("p1"), vec![f.clone(); 40]);
    assert!(h.recv("p2").is_empty());
    let s = h.stats();
    assert_eq!(s.event(Event::CacheHits), 41);
    assert_eq!(s.ports[0].rx_packets, 43);
    assert_eq!(s.total_drops(), 0);
    // The bridge domain counts every frame, hit or not (an all-hit burst counts once).
    let red = h.switch.snapshot().bd_id("red").expect("red") as usize;
    assert_eq!((s.bds[red].packets, s.bds[red].bytes), (44, 44 * f.len() as u64));
}

#[test]
fn a_moved_destination_is_followed_at_once() {
    let (mut h, f) = cached_flow();
    // mac(2) now speaks from p2.
    h.send("p2", &frames::udp4(mac(1), mac(2), ip(2), ip(1), 2000, 1000, 64));
    h.step();
    h.recv_all();
    h.send("p0", &f);
    h.step();
    assert_eq!(h.recv("p2"), vec![f]);
    assert!(h.recv("p1").is_empty());
    assert_eq!(h.stats().event(Event::MacMoved), 1);
}

#[test]
fn a_moved_source_is_learned_even_when_its_flow_was_cached() {
    let (mut h, f) = cached_flow();
    // mac(1) moves to p2 and sends the same flow from there.
    h.send("p2", &f);
    h.step();
    assert_eq!(h.recv("p1"), vec![f]);
    let fdb = h.switch.fdb().dump();
    let p2 = h.switch.snapshot().port_id("p2").unwrap();
    assert!(fdb.iter().any(|e| e.mac == mac(1) && e.dest == Dest::Port(p2)));
}

/// The lookups of a burst are made before any of its frames is forwarded: a frame that
/// moves a MAC must still decide for the cached frames after it in the same burst.
#[test]
fn a_mac_move_inside_a_burst_applies_to_the_frames_after_it() {
    let (mut h, f) = cached_flow();
    // mac(2) speaks from p0 between two frames of the cached flow 1 → 2: the second now
    // goes back where it came from.
    let moved = frames::udp4(MacAddr::BROADCAST, mac(2), ip(2), ip(9), 2000, 3000, 64);
    for frame in [&f, &moved, &f] {
        h.send("p0", frame);
    }
    h.step();
    assert_eq!(h.recv("p1"), vec![f, moved.clone()]);
    assert_eq!(h.recv("p2"), vec![moved]);
    let s = h.stats();
    assert_eq!((s.event(Event::MacMoved), s.drop(DropReason::Reflect)), (1, 1));
    assert_eq!(s.event(Event::CacheHits), 2, "the frame after the move counts as no hit");
}

#[test]
fn a_flushed_fdb_floods_again() {
    let (mut h, f) = cached_flow();
    assert!(h.switch.flush_bridge("red").unwrap() >= 2);
    h.send("p0", &f);
    h.step();
    let out = h.recv_all();
    assert_eq!(out["p1"], vec![f.clone()]);
    assert_eq!(out["p2"], vec![f], "unknown again: flooded");
    assert_eq!(h.stats().event(Event::Flooded), 2);
}

#[test]
fn learning_still_refreshes_once_a_second() {
    let (mut h, f) = cached_flow();
    h.set_now(7);
    h.send("p0", &f);
    h.send("p0", &f);
    h.step();
    assert_eq!(h.recv("p1").len(), 2);
    let seen = h.switch.fdb().dump().into_iter().find(|e| e.mac == mac(1)).unwrap().seen;
    assert_eq!(seen, 7, "the first frame of a new second went through learning");
    assert_eq!(hits(&h), 1, "and so did the second frame of that burst, which missed too");
    h.send("p0", &f);
    h.step();
    assert_eq!(hits(&h), 2, "cached again for the rest of the second");
}

#[test]
fn a_configuration_change_applies_to_cached_flows() {
    let (mut h, f) = cached_flow();
    // p1 leaves the bridge: the cached egress must not be used.
    let mut cfg = config(1500);
    cfg.ports[1] = PortConfig::access("p1", "blue");
    cfg.bridges.push(BridgeConfig::new("blue").vlan(200));
    h.apply(cfg).unwrap();
    h.send("p0", &f);
    h.step();
    let out = h.recv_all();
    assert!(out["p1"].is_empty());
    assert_eq!(out["p2"], vec![f]);
}

#[test]
fn oversize_frames_of_a_cached_flow_are_dropped_and_counted() {
    let (mut h, small) = cached_flow();
    let big = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 1600);
    h.send("p0", &big);
    h.send("p0", &small);
    h.step();
    assert_eq!(h.recv("p1"), vec![small]);
    assert_eq!(h.stats().drop(DropReason::Oversize), 1);
}

#[test]
fn a_lowered_egress_mtu_applies_to_cached_flows() {
    let (mut h, _) = cached_flow();
    let mut cfg = config(1500);
    cfg.ports[1].mtu = 1000;
    h.apply(cfg).unwrap();
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 1200);
    for _ in 0..3 {
        h.send("p0", &f);
        h.step();
    }
    assert!(h.recv("p1").is_empty());
    assert_eq!(h.stats().drop(DropReason::EgressMtu), 3);
}

#[test]
fn refused_learning_is_never_cached() {
    let mut h = Harness::new();
    for p in ["p0", "p1", "p2"] {
        h.ring(p);
    }
    let mut cfg = config(1500);
    // mac(1) is pinned to p2; frames from it on p0 still go out, and every one counts.
    cfg.bridges[0].static_macs.push(StaticMac {
        mac: mac(1),
        port: Some("p2".into()),
        remote: None,
    });
    cfg.bridges[0].static_macs.push(StaticMac {
        mac: mac(2),
        port: Some("p1".into()),
        remote: None,
    });
    h.apply(cfg).unwrap();
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 64);
    for _ in 0..5 {
        h.send("p0", &f);
        h.step();
    }
    assert_eq!(h.recv("p1").len(), 5);
    let s = h.stats();
    assert_eq!(s.event(Event::StaticMoveRefused), 5);
    assert_eq!(s.event(Event::CacheHits), 0);
}

#[test]
fn tagged_flows_are_cached_with_their_priority() {
    let mut h = Harness::new();
    h.ring("a").ring("t");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vlan(100)],
        ports: vec![PortConfig::access("a", "red"), PortConfig::trunk("t", &[100], None)],
        vtep: None,
    })
    .unwrap();
    let from_trunk = |pcp: u16| {
        frames::add_tag(
            &frames::udp4(mac(1), mac(2), ip(2), ip(1), 1, 2, 60),
            0x8100,
            pcp << 13 | 100,
        )
    };
    let to_trunk = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 60);
    h.send("a", &to_trunk);
    h.send("t", &from_trunk(5));
    h.step();
    h.recv_all();
    for _ in 0..3 {
        h.send("t", &from_trunk(5));
        h.send("a", &to_trunk);
        h.step();
    }
    assert_eq!(h.recv("a"), vec![frames::udp4(mac(1), mac(2), ip(2), ip(1), 1, 2, 60); 3]);
    assert_eq!(h.recv("t"), vec![frames::add_tag(&to_trunk, 0x8100, 100); 3]);
    assert!(hits(&h) >= 4, "both directions cached");
    // Every frame counted in the bridge domain, hits from the trunk with their tag.
    let red = h.switch.snapshot().bd_id("red").expect("red") as usize;
    let bytes = 4 * (to_trunk.len() + from_trunk(5).len()) as u64;
    assert_eq!((h.stats().bds[red].packets, h.stats().bds[red].bytes), (8, bytes));
    // Another priority is another key: the tag's bytes are part of it.
    h.send("t", &from_trunk(3));
    h.step();
    assert_eq!(h.recv("a").len(), 1);
}

/// A trunk's burst that all hit, over two bridge domains in runs (100, 100, 200, 100, 200,
/// 200): each domain counts its own frames and bytes, tag included, as the frames take
/// their own ways out.
#[test]
fn a_trunks_burst_that_all_hit_counts_each_bridge_domain() {
    let mut h = Harness::new();
    h.ring("a").ring("b").ring("t");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vlan(100), BridgeConfig::new("blue").vlan(200)],
        ports: vec![
            PortConfig::access("a", "red"),
            PortConfig::access("b", "blue"),
            PortConfig::trunk("t", &[100, 200], None),
        ],
        vtep: None,
    })
    .unwrap();
    let snap = h.switch.snapshot();
    let (red, blue) = (snap.bd_id("red").expect("red"), snap.bd_id("blue").expect("blue"));
    // mac(1) behind a, mac(3) behind b; mac(2) and mac(4) behind the trunk, in 100 and 200.
    let untagged = |vid: u16, len: usize| {
        let (dst, src) = if vid == 100 { (1u8, 2u8) } else { (3, 4) };
        frames::udp4(mac(dst.into()), mac(src.into()), ip(src), ip(dst), 1, 2, len)
    };
    let tagged = |vid: u16, len: usize| frames::add_tag(&untagged(vid, len), 0x8100, vid);
    h.send("a", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 2, 1, 60));
    h.send("b", &frames::udp4(mac(4), mac(3), ip(3), ip(4), 2, 1, 60));
    h.step();
    for _ in 0..2 {
        h.send("t", &tagged(100, 60));
        h.send("t", &tagged(200, 80));
        h.step();
    }
    h.recv_all();
    let before = (h.stats(), hits(&h));
    let burst = [(100, 60), (100, 70), (200, 80), (100, 60), (200, 90), (200, 80)];
    for (vid, len) in burst {
        h.send("t", &tagged(vid, len));
    }
    h.step();
    assert_eq!(hits(&h) - before.1, 6, "the whole burst hit");
    let to =
        |vid| burst.iter().filter(|b| b.0 == vid).map(|&(v, l)| untagged(v, l)).collect::<Vec<_>>();
    assert_eq!(h.recv("a"), to(100));
    assert_eq!(h.recv("b"), to(200));
    let after = h.stats();
    for (bd, vid) in [(red, 100), (blue, 200)] {
        let bytes: usize =
            burst.iter().filter(|b| b.0 == vid).map(|&(v, l)| tagged(v, l).len()).sum();
        let (b0, b1) = (&before.0.bds[bd as usize], &after.bds[bd as usize]);
        assert_eq!((b1.packets - b0.packets, b1.bytes - b0.bytes), (3, bytes as u64), "VLAN {vid}");
    }
}

/// An empty frame (a hostile guest can offer one) has no key: it must not take the cache's
/// "no decision" for a hit, which would send it to port 0.
#[test]
fn an_empty_frame_is_a_counted_runt_not_a_hit() {
    let (mut h, _) = cached_flow();
    h.send("p1", &[]);
    h.step();
    let out = h.recv_all();
    assert!(out.values().all(|frames| frames.is_empty()), "{out:?}");
    assert_eq!(h.stats().drop(DropReason::Runt), 1);
    assert_eq!(hits(&h), 1, "no new hit");
}

/// A port whose flows churn through more than the cache holds stops paying for it (its
/// bursts mostly skip the lookups and fills that would be wasted), and goes back to the cache
/// as soon as its flows repeat: a sampled burst hits, and the rest of its bursts hit too.
#[test]
fn a_port_churning_through_the_cache_skips_it_until_its_flows_repeat() {
    let mut h = Harness::with_pool(
        vswitch::Pool::new(4096, false).unwrap(),
        vswitch::SwitchOptions { emc_entries: 2, ..Default::default() },
    );
    for p in ["p0", "p1", "p2"] {
        h.ring(p);
    }
    h.apply(config(1500)).unwrap();
    h.set_now(1);
    // 64 destinations behind p1, known to the FDB.
    for d in 0..64u32 {
        h.send("p1", &frames::udp4(mac(1), mac(100 + d), ip(2), ip(1), 1, 2, 64));
        h.step();
    }
    h.recv_all();
    // p0 sends to all 64 in turn, a burst of 32 at a time: a two-entry cache holds none of
    // them long enough to hit.
    let churn = |h: &mut Harness, bursts: usize| {
        for b in 0..bursts {
            for d in 0..32u32 {
                h.send(
                    "p0",
                    &frames::udp4(
                        mac(100 + (b as u32 * 32 + d) % 64),
                        mac(1),
                        ip(1),
                        ip(2),
                        1,
                        2,
                        64,
                    ),
                );
            }
            h.step();
        }
        h.recv_all();
    };
    churn(&mut h, 40);
    let before = hits(&h);
    // One flow, over and over. Its first bursts skip the cache: with it, the second burst
    // would already hit (the first filled it).
    let one = frames::udp4(mac(100), mac(1), ip(1), ip(2), 1, 2, 64);
    let mut got = 0;
    for _ in 0..3 {
        for _ in 0..32 {
            h.send("p0", &one);
        }
        h.step();
        got += h.recv("p1").len();
    }
    assert_eq!(hits(&h), before, "a churning port's bursts skip the cache");
    // Sampled bursts (one in 64 of the port's, then twice as few after each one whose misses
    // the second level found): the first caches the flow, the next (128 bursts later) hits,
    // and from then on every burst goes through the cache and hits.
    for _ in 3..300 {
        for _ in 0..32 {
            h.send("p0", &one);
        }
        h.step();
        got += h.recv("p1").len();
    }
    assert_eq!(got, 300 * 32, "every frame forwarded, cached or not");
    assert!(
        hits(&h) - before >= 100 * 32,
        "the repeating flow went back to the cache: {} hits",
        hits(&h) - before
    );
}

/// Flows spread over more of the cache than a core's own caches hold take the prefetching
/// lookup (`probe_spread_burst`, once an epoch filled 16 384 entries): it hits and forwards
/// exactly as the plain one, from a port with port security (whose frames it still checks)
/// and from a trusted one.
#[test]
fn flows_spread_over_the_cache_hit_and_forward_as_any_other() {
    const DESTS: u32 = 12_000;
    let mut h = Harness::new();
    for p in ["pod", "p0", "net"] {
        h.ring(p);
    }
    let pod = PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]);
    let mut net = PortConfig::access("net", "red");
    net.mac_limit = DESTS; // above the default 8 192 a port may learn
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![pod, PortConfig::access("p0", "red"), net],
        vtep: None,
    })
    .unwrap();
    h.set_now(1);
    let dest = |d: u32| mac(100_000 + d);
    // The senders, then every destination, learnt (from broadcasts: flows of theirs in the
    // cache, no longer used, would make some of the rounds' flows wait a miss to get in).
    h.send("pod", &frames::udp4(mac(3), mac(1), ip(1), ip(3), 1, 2, 64));
    h.send("p0", &frames::udp4(mac(1), mac(3), ip(3), ip(1), 1, 2, 64));
    h.step();
    for chunk in (0..DESTS).collect::<Vec<_>>().chunks(256) {
        for &d in chunk {
            h.send("net", &frames::udp4(MacAddr::BROADCAST, dest(d), ip(2), ip(1), 1, 2, 64));
        }
        h.step();
        h.recv_all();
    }
    // Two rounds from each sender to every destination: the first fills 2 × 12 000 entries
    // (past the 16 384 that turn prefetching on), the second hits them all. A frame with a
    // source address the pod does not own rides in every burst of the pod's.
    let mut sent = 0;
    for round in 0..2 {
        let before = hits(&h);
        for chunk in (0..DESTS).collect::<Vec<_>>().chunks(32) {
            let mut want = Vec::new();
            for &d in chunk {
                let from_pod =
                    frames::udp4(dest(d), mac(1), ip(1), ip(2), 1, 2, 64 + (d % 64) as usize);
                let from_p0 = frames::udp4(dest(d), mac(3), ip(3), ip(2), 3, 4, 64);
                h.send("pod", &from_pod);
                h.send("p0", &from_p0);
                want.push((from_pod, from_p0));
            }
            h.send("pod", &frames::udp4(dest(chunk[0]), mac(1), ip(9), ip(2), 1, 2, 64));
            h.step();
            sent += 1;
            let got = h.recv("net");
            let want: Vec<Vec<u8>> =
                want.iter().map(|w| w.0.clone()).chain(want.iter().map(|w| w.1.clone())).collect();
            let mut got_sorted = got.clone();
            got_sorted.sort();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            assert_eq!(got.len(), want.len(), "round {round}: every frame forwarded once");
            assert!(got_sorted == want_sorted, "round {round}: the frames forwarded byte exact");
            let (back_pod, back_p0) = (h.recv("pod"), h.recv("p0"));
            assert!(
                back_pod.is_empty() && back_p0.is_empty(),
                "round {round}: nothing flooded back: {} {} {:?}",
                back_pod.len(),
                back_p0.len(),
                back_pod.first().or(back_p0.first()).map(|f| &f[..14])
            );
        }
        if round == 1 {
            assert_eq!(hits(&h) - before, 2 * DESTS as u64, "every frame of the second round hit");
        }
    }
    let s = h.stats();
    assert_eq!(
        s.drop(DropReason::SecurityIp),
        sent,
        "the pod's forged frames dropped, cached flows or not"
    );
    assert_eq!(s.total_drops(), sent, "{:?}", s.nonzero_drops());
}

/// The DHCP guard holds on cached flows: a pod whose flow to another pod's MAC is cached
/// (a legitimate UDP flow, from its own address) then sends that pod a DHCP server's reply
/// from the same address — the bytes the cache keys on are all the same but the source
/// port — and it is dropped, not forwarded by the cache.
#[test]
fn a_dhcp_reply_never_rides_a_cached_flow() {
    let mut h = Harness::new();
    for p in ["pod", "p0"] {
        h.ring(p);
    }
    let pod = PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]);
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![pod, PortConfig::access("p0", "red")],
        vtep: None,
    })
    .unwrap();
    h.set_now(1);
    h.send("p0", &frames::udp4(mac(1), mac(2), ip(2), ip(1), 68, 5000, 64));
    h.step();
    h.recv_all();
    let flow = frames::udp4(mac(2), mac(1), ip(1), ip(2), 5000, 68, 300);
    for _ in 0..3 {
        h.send("pod", &flow);
        h.step();
    }
    assert_eq!(h.recv("p0").len(), 3);
    let before = hits(&h);
    assert!(before >= 1, "the pod's flow is cached");
    let offer = frames::udp4(mac(2), mac(1), ip(1), ip(2), 67, 68, 300);
    h.send("pod", &offer);
    h.send("pod", &flow);
    h.step();
    assert_eq!(h.recv("p0"), vec![flow.clone()], "the offer is dropped, the flow goes on");
    assert_eq!(h.stats().drop(DropReason::SecurityDhcp), 1);
    assert_eq!(hits(&h), before + 1, "only the flow's frame hit");
}

/// Flows whose own sets are full sit in the other set of the pair: a burst's second look
/// finds them, and they are forwarded byte-exact and counted as the cache's hits, from a pod
/// port (port security) and an access port alike — more hits than the sets alone could hold.
#[test]
fn flows_of_crowded_sets_hit_in_the_other_set_of_their_pair() {
    use vswitch::emc::{Emc, Key};
    const DESTS: u32 = 24;
    const ENTRIES: usize = 64;
    let opts =
        vswitch::SwitchOptions { emc_entries: ENTRIES, megaflow_entries: 0, ..Default::default() };
    let mut h = Harness::with_pool(vswitch::Pool::new(8192, false).expect("a pool"), opts);
    for p in ["pod", "p0", "net"] {
        h.ring(p);
    }
    let pod = PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]);
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![pod, PortConfig::access("p0", "red"), PortConfig::access("net", "red")],
        vtep: None,
    })
    .unwrap();
    h.set_now(1);
    let dest = |d: u32| random_mac(d);
    h.send("pod", &frames::udp4(MacAddr::BROADCAST, mac(1), ip(1), ip(3), 1, 2, 64));
    h.send("p0", &frames::udp4(MacAddr::BROADCAST, mac(3), ip(3), ip(1), 1, 2, 64));
    for d in 0..DESTS {
        h.send("net", &frames::udp4(MacAddr::BROADCAST, dest(d), ip(2), ip(1), 1, 2, 64));
    }
    h.step();
    h.recv_all();
    let frames_of = |d: u32| {
        let from_pod = frames::udp4(dest(d), mac(1), ip(1), ip(2), 1, 2, 64 + (d % 16) as usize);
        let from_p0 = frames::udp4(dest(d), mac(3), ip(3), ip(2), 3, 4, 64);
        (from_pod, from_p0)
    };
    // How many of the flows their own sets could hold (two a set).
    let snap = h.switch.snapshot();
    let (pod, p0) = (snap.port_id("pod").unwrap(), snap.port_id("p0").unwrap());
    let sets = Emc::new(ENTRIES);
    let mut per_set = std::collections::HashMap::<usize, u64>::new();
    for d in 0..DESTS {
        let (a, b) = frames_of(d);
        for k in [Key::from_secured_port(pod, &a).unwrap(), Key::from_port(p0, &b).unwrap()] {
            *per_set.entry(sets.view().set_of(&k)).or_default() += 1;
        }
    }
    let own_sets_hold: u64 = per_set.values().map(|n| (*n).min(2)).sum();
    assert!(own_sets_hold < 2 * DESTS as u64, "some sets crowded: {per_set:?}");
    let mut last = 0;
    for round in 0..4 {
        let before = hits(&h);
        for d in 0..DESTS {
            let (a, b) = frames_of(d);
            h.send("pod", &a);
            h.send("p0", &b);
        }
        h.step();
        let mut got = h.recv("net");
        let mut want: Vec<Vec<u8>> = (0..DESTS)
            .flat_map(|d| {
                let (a, b) = frames_of(d);
                [a, b]
            })
            .collect();
        got.sort();
        want.sort();
        assert!(got == want, "round {round}: every frame forwarded once, byte exact");
        assert!(h.recv("pod").is_empty() && h.recv("p0").is_empty(), "nothing flooded back");
        last = hits(&h) - before;
    }
    assert!(
        last > own_sets_hold,
        "{last} hits in the last round; the own sets alone hold {own_sets_hold}"
    );
    assert_eq!(h.stats().total_drops(), 0, "{:?}", h.stats().nonzero_drops());
}

/// A tenant that aims its flows at another tenant's set (the cache's hash is no secret: a
/// tenant with two unsecured ports can pick MAC pairs whose keys land in any set) can push
/// the victim's flow out of the exact-match cache — four flows of its own, as many as a set
/// and its partner hold, repeated as often as the victim's, keep it out nineteen times in
/// twenty — but never out of the caches: the victim's frames all hit the second level
/// instead (the megaflow halves: a pod's frame costs ~150 instructions there against ~110,
/// l2-pod-mesh-512x1k against l2-pod-1k; never the slow path), and are forwarded, byte
/// exact, to its own port only. The attacker pays four frames of its own for each of the
/// victim's (docs/perf/instructions.md, "a tenant whose keys crowd another's set").
#[test]
fn a_tenant_aiming_its_flows_at_anothers_set_never_locks_it_out() {
    use vswitch::emc::{Emc, Key};
    const X_MACS: u32 = 2048;
    const Y_MACS: u32 = 512;
    const AIMED: usize = 4;
    const ROUNDS: u64 = 400;
    let mut h = Harness::new();
    for p in ["v1", "v2", "x", "y"] {
        h.ring(p);
    }
    let (v1, v2) = (mac(1), mac(2));
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("victim"), BridgeConfig::new("attacker")],
        ports: vec![
            PortConfig::pod("v1", "victim", v1, &[ip(1).into()]),
            PortConfig::pod("v2", "victim", v2, &[ip(2).into()]),
            PortConfig::access("x", "attacker"),
            PortConfig::access("y", "attacker"),
        ],
        vtep: None,
    })
    .unwrap();
    h.set_now(1);
    let xmac = |i: u32| random_mac(0x10_0000 + i);
    let ymac = |j: u32| random_mac(0x20_0000 + j);
    h.send("v1", &frames::udp4(MacAddr::BROADCAST, v1, ip(1), ip(2), 1, 2, 64));
    h.send("v2", &frames::udp4(MacAddr::BROADCAST, v2, ip(2), ip(1), 1, 2, 64));
    for chunk in (0..X_MACS).collect::<Vec<_>>().chunks(512) {
        for &i in chunk {
            h.send("x", &frames::udp4(MacAddr::BROADCAST, xmac(i), ip(9), ip(8), 1, 2, 64));
        }
        h.step();
        h.recv_all();
    }
    for j in 0..Y_MACS {
        h.send("y", &frames::udp4(MacAddr::BROADCAST, ymac(j), ip(8), ip(9), 1, 2, 64));
    }
    h.step();
    h.recv_all();

    let victim = frames::udp4(v2, v1, ip(1), ip(2), 1000, 2000, 64);
    let snap = h.switch.snapshot();
    let (v1_id, x_id) = (snap.port_id("v1").unwrap(), snap.port_id("x").unwrap());
    let view_of = Emc::new(vswitch::SwitchOptions::default().emc_entries);
    let sets = view_of.view();
    let target = sets.set_of(&Key::from_secured_port(v1_id, &victim).unwrap());
    // The attacker's search: of its X_MACS × Y_MACS pairs, those whose keys land in the
    // victim's set or the other set of its pair.
    let mut aimed = Vec::new();
    let mut f = frames::udp4(ymac(0), xmac(0), ip(9), ip(8), 1, 2, 64);
    'search: for i in 0..X_MACS {
        for j in 0..Y_MACS {
            f[0..6].copy_from_slice(&ymac(j).0);
            f[6..12].copy_from_slice(&xmac(i).0);
            if sets.set_of(&Key::from_port(x_id, &f).unwrap()) | 1 == target | 1 {
                aimed.push(f.clone());
                if aimed.len() == AIMED {
                    break 'search;
                }
            }
        }
    }
    assert_eq!(aimed.len(), AIMED, "the attacker found keys in the victim's sets");

    let second = |h: &Harness| h.stats().event(Event::MegaflowHits);
    let (mut victim_hits, mut victim_second) = (0, 0);
    for round in 0..ROUNDS {
        for a in &aimed {
            h.send("x", a);
        }
        h.step();
        assert_eq!(h.recv("y").len(), AIMED, "round {round}: the attacker's frames forwarded");
        let before = (hits(&h), second(&h));
        h.send("v1", &victim);
        h.step();
        victim_hits += hits(&h) - before.0;
        victim_second += second(&h) - before.1;
        assert_eq!(h.recv("v2"), vec![victim.clone()], "round {round}: the victim's frame");
        assert!(h.recv("v1").is_empty() && h.recv("x").is_empty() && h.recv("y").is_empty());
    }
    eprintln!("the victim's {ROUNDS} frames: {victim_hits} exact hits, {victim_second} second");
    assert_eq!(h.stats().total_drops(), 0, "{:?}", h.stats().nonzero_drops());
    // The first frame after the attack starts may miss both (its entry pushed out).
    assert!(
        victim_hits + victim_second >= ROUNDS - 2,
        "{victim_hits} + {victim_second} of {ROUNDS} of the victim's frames hit a cache"
    );
}

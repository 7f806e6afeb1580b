//! The second-level cache (`megaflow`): a mesh the exact-match cache cannot hold rides its
//! halves, from a trusted port and from a pod port with port security, and nothing a pod
//! spoofs rides them. (That it decides as the slow path does over random traffic, MAC moves
//! and flushes is `tests/model.rs`'s.)

use std::net::Ipv4Addr;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::fdb::Dest;
use vswitch::testkit::{Harness, frames, mac};
use vswitch::trace::Step;
use vswitch::wire::MacAddr;
use vswitch::{DropReason, Event, Pool, SwitchOptions};

fn ip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc000_0200 + n)
}

/// Sources and destinations of the mesh (their MACs and addresses: `mac(SRC + i)`,
/// `mac(DST + j)`).
const SRC: u32 = 1000;
const DST: u32 = 2000;

/// A switch with these options, its clock at one second.
fn switch(options: SwitchOptions) -> Harness {
    let mut h = Harness::with_pool(Pool::new(8192, false).expect("a pool"), options);
    h.set_now(1);
    h
}

/// A switch whose exact-match cache holds 64 entries, far fewer than the mesh's pairs.
fn small_cache() -> Harness {
    switch(SwitchOptions { emc_entries: 64, ..Default::default() })
}

/// Access ports `a` and `net` in bridge domain `red`, each and the domain learning up to
/// `mac_limit` MACs (None: the defaults).
fn a_and_net(h: &mut Harness, mac_limit: Option<u32>) {
    h.ring("a").ring("net");
    let mut bridge = BridgeConfig::new("red");
    let mut ports = vec![PortConfig::access("a", "red"), PortConfig::access("net", "red")];
    if let Some(limit) = mac_limit {
        bridge.mac_limit = limit;
        for p in &mut ports {
            p.mac_limit = limit;
        }
    }
    h.apply(SwitchConfig { bridges: vec![bridge], ports, vtep: None }).expect("config");
}

/// `sources` behind `a` each to every one of `destinations` behind `net`, every pair in turn
/// (a destination's sources one after another).
fn mesh(sources: u32, destinations: u32) -> Vec<Vec<u8>> {
    (0..destinations)
        .flat_map(|d| {
            (0..sources).map(move |s| {
                frames::udp4(mac(DST + d), mac(SRC + s), ip(SRC + s), ip(DST + d), 1, 2, 64)
            })
        })
        .collect()
}

/// `n` destinations behind `net`, learned.
fn learn_destinations(h: &mut Harness, n: u32) {
    for j in 0..n {
        h.send("net", &frames::udp4(mac(1), mac(DST + j), ip(DST + j), ip(1), 1, 2, 64));
        if j % 32 == 31 {
            h.step();
            h.recv_all();
        }
    }
    h.step();
    h.recv_all();
}

/// Every frame of `frames` sent from `port` in bursts of 32; returns how many left on `to`.
fn send_all(h: &mut Harness, port: &str, frames: &[Vec<u8>], to: &str) -> usize {
    let mut got = 0;
    for burst in frames.chunks(32) {
        for f in burst {
            h.send(port, f);
        }
        h.step();
        got += h.recv(to).len();
        h.recv_all();
    }
    got
}

/// 40 sources behind one access port each talking to all of 40 destinations behind another,
/// every pair in turn (1,600 flows through 64 exact-match entries): after the first round,
/// nearly every frame is a second-level hit and reaches its destination.
#[test]
fn a_mesh_the_exact_match_cache_cannot_hold_rides_the_halves() {
    let mut h = small_cache();
    a_and_net(&mut h, None);
    learn_destinations(&mut h, 40);
    let mesh = mesh(40, 40);
    assert_eq!(send_all(&mut h, "a", &mesh, "net"), mesh.len(), "the first round, learning");
    let before = h.stats().event(Event::MegaflowHits);
    for _ in 0..3 {
        assert_eq!(send_all(&mut h, "a", &mesh, "net"), mesh.len(), "every frame forwarded");
    }
    let s = h.stats();
    let halves = s.event(Event::MegaflowHits) - before;
    assert!(halves >= 3 * 1600 * 9 / 10, "second-level hits: {halves} of {}", 3 * 1600);
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
}

/// A pod port (port security) talking to 200 destinations, more than the exact-match
/// cache holds: its good frames ride the second level, while frames with its MAC but
/// another source address, another IP version, or ARP for a foreign address, sent between
/// them, are dropped for the slow path's reasons.
#[test]
fn a_pods_mesh_rides_the_halves_and_nothing_spoofed_does() {
    let mut h = small_cache();
    h.ring("pod").ring("net");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::pod("pod", "red", mac(SRC), &[ip(SRC).into()]),
            PortConfig::access("net", "red"),
        ],
        vtep: None,
    })
    .expect("config");
    learn_destinations(&mut h, 200);
    let good: Vec<Vec<u8>> = (0..200u32)
        .map(|d| frames::udp4(mac(DST + d), mac(SRC), ip(SRC), ip(DST + d), 1, 2, 64))
        .collect();
    assert_eq!(send_all(&mut h, "pod", &good, "net"), 200, "the first round, learning");
    assert_eq!(send_all(&mut h, "pod", &good, "net"), 200);
    let before = h.stats().event(Event::MegaflowHits);
    // Good frames with the spoofed ones among them, to destinations whose halves are known.
    let mut mixed = Vec::new();
    for (d, g) in good.iter().enumerate().take(64) {
        mixed.push(g.clone());
        match d % 4 {
            0 => mixed.push(frames::udp4(
                mac(DST + d as u32),
                mac(SRC),
                ip(SRC + 1),
                ip(DST + d as u32),
                1,
                2,
                64,
            )),
            1 => {
                let mut v6 = g.clone();
                v6[14] = 0x65;
                mixed.push(v6);
            }
            2 => {
                let mut arp = frames::arp_request(mac(SRC), ip(SRC), ip(DST + d as u32));
                arp[28..32].copy_from_slice(&ip(SRC + 1).octets());
                mixed.push(arp);
            }
            _ => {}
        }
    }
    assert_eq!(send_all(&mut h, "pod", &mixed, "net"), 64, "the good frames, only they");
    let s = h.stats();
    assert_eq!(s.drop(DropReason::SecurityIp), 32, "{:?}", s.nonzero_drops());
    assert_eq!(s.drop(DropReason::SecurityArp), 16);
    assert!(
        s.event(Event::MegaflowHits) - before >= 56,
        "the good frames rode the halves: {}",
        s.event(Event::MegaflowHits) - before
    );
}

/// After a flood of frames the second level never finds (broadcasts, which run its account
/// with the port down), a mesh from the same port still comes back to the halves (a sampled
/// burst finds them). That the flood stops paying for lookups is not observable here: the
/// instruction count of `flood-8` shows it (docs/perf/vhost-user.md).
#[test]
fn a_port_back_from_a_flood_finds_the_halves_again() {
    let mut h = small_cache();
    h.ring("a").ring("net").ring("other");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::access("a", "red"),
            PortConfig::access("net", "red"),
            PortConfig::access("other", "red"),
        ],
        vtep: None,
    })
    .expect("config");
    learn_destinations(&mut h, 40);
    let broadcast: Vec<Vec<u8>> = (0..32 * 20u32)
        .map(|s| frames::udp4(MacAddr([0xff; 6]), mac(SRC + s % 40), ip(SRC), ip(1), 1, 2, 64))
        .collect();
    send_all(&mut h, "a", &broadcast, "net");
    let mesh: Vec<Vec<u8>> = (0..40u32)
        .flat_map(|d| {
            (0..40u32).map(move |s| {
                frames::udp4(mac(DST + d), mac(SRC + s), ip(SRC + s), ip(DST + d), 1, 2, 64)
            })
        })
        .collect();
    let before = h.stats().event(Event::MegaflowHits);
    let mut got = 0;
    for _ in 0..4 {
        got += send_all(&mut h, "a", &mesh, "net");
    }
    assert_eq!(got, 4 * mesh.len(), "every frame forwarded");
    let halves = h.stats().event(Event::MegaflowHits) - before;
    assert!(halves >= 2 * 1600, "the mesh came back to the halves: {halves} hits");
}

/// A traced frame whose flow only the second level knows (its source and its destination
/// were each seen with others) reports that decision as the cache's, as `knitterctl trace`
/// shows it, and then takes the slow path, which forwards it the same way.
#[test]
fn a_trace_reports_the_halves_decision() {
    let mut h = small_cache();
    a_and_net(&mut h, None);
    learn_destinations(&mut h, 2);
    let pair = |s: u32, d: u32| {
        frames::udp4(mac(DST + d), mac(SRC + s), ip(SRC + s), ip(DST + d), 1, 2, 64)
    };
    // (0, 0) and (1, 1), twice: both sources and both destinations are known by halves.
    assert_eq!(send_all(&mut h, "a", &[pair(0, 0), pair(1, 1), pair(0, 0), pair(1, 1)], "net"), 4);
    h.switch.trace("a", 1).expect("trace");
    assert_eq!(send_all(&mut h, "a", &[pair(0, 1)], "net"), 1, "forwarded");
    let net = h.switch.snapshot().port_id("net").expect("port");
    let t = h.switch.traces();
    assert_eq!(
        t[0].steps()[0],
        Step::Cache { hit: Some((0, Dest::Port(net))) },
        "{:?}",
        t[0].steps()
    );
}

/// What a hit reads of both halves is checked at each hit: a destination half filled from
/// one port never sends another port's frame back out of that port (`reflect`, as the slow
/// path drops it), nor lets a frame longer than its own ingress allows through (`oversize`).
#[test]
fn a_hit_neither_reflects_nor_outgrows_its_ingress() {
    for (emc_entries, megaflow_entries) in [(0, 1 << 10), (64, 1 << 10)] {
        let mut h = switch(SwitchOptions { emc_entries, megaflow_entries, ..Default::default() });
        h.ring("a").ring("b").ring("small");
        let mut small = PortConfig::access("small", "red");
        small.mtu = 500;
        h.apply(SwitchConfig {
            bridges: vec![BridgeConfig::new("red")],
            ports: vec![PortConfig::access("a", "red"), PortConfig::access("b", "red"), small],
            vtep: None,
        })
        .expect("config");
        let udp =
            |d: u32, s: u32, len: usize| frames::udp4(mac(d), mac(s), ip(s), ip(d), 1, 2, len);
        // Hosts 1 and 2 behind a, 3 behind b, 4 behind small; everyone talks to 3 (long
        // frames from a), and 3 to 1, so the halves know 1, 2, 3 and 4 as sources and 1 and
        // 3 as destinations.
        for _ in 0..3 {
            send_all(&mut h, "a", &[udp(3, 1, 1000), udp(3, 2, 1000)], "b");
            send_all(&mut h, "small", &[udp(3, 4, 100)], "b");
            send_all(&mut h, "b", &[udp(1, 3, 100)], "a");
        }
        let hits = h.stats().event(Event::MegaflowHits) + h.stats().event(Event::CacheHits);
        assert!(hits > 0, "caches ({emc_entries}, {megaflow_entries}): halves in use");
        // 2 to 1: both behind a. Its source half and 1's destination half are known.
        for _ in 0..2 {
            h.send("a", &udp(1, 2, 100));
            h.step();
        }
        let out = h.recv_all();
        assert!(out.values().all(|v| v.is_empty()), "nothing sent anywhere: {out:?}");
        assert_eq!(h.stats().drop(DropReason::Reflect), 2, "dropped as the slow path drops it");
        // A frame from small as long as a's were: its own MTU refuses it.
        h.send("small", &udp(3, 4, 1000));
        h.step();
        assert!(h.recv("b").is_empty(), "not let through by a's longer MTU");
        assert_eq!(h.stats().drop(DropReason::Oversize), 1);
    }
}

/// A switch with `emc_entries` exact-match entries and `megaflow_entries` a half, whose
/// `a` meets `sources` × `destinations` pairs behind `net` (every pair in turn, a
/// destination's sources one after another); returns it and the mesh, after a first round
/// that learned the sources and filled the caches.
fn outgrown_mesh(
    emc_entries: usize,
    megaflow_entries: usize,
    sources: u32,
    destinations: u32,
) -> (Harness, Vec<Vec<u8>>) {
    let mut h = switch(SwitchOptions { emc_entries, megaflow_entries, ..Default::default() });
    a_and_net(&mut h, None);
    learn_destinations(&mut h, destinations);
    let mesh = mesh(sources, destinations);
    assert_eq!(send_all(&mut h, "a", &mesh, "net"), mesh.len(), "the first round, learning");
    (h, mesh)
}

/// Hits of each cache over one more round of `mesh` from `a`, all of it delivered.
fn round_hits(h: &mut Harness, mesh: &[Vec<u8>]) -> (u64, u64) {
    let before = h.stats();
    assert_eq!(send_all(h, "a", mesh, "net"), mesh.len(), "every frame forwarded");
    let s = h.stats();
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    (
        s.event(Event::CacheHits) - before.event(Event::CacheHits),
        s.event(Event::MegaflowHits) - before.event(Event::MegaflowHits),
    )
}

/// 220 sources × 200 destinations (44,000 flows): the exact-match cache holds them all, but
/// they are more than `emc::OUTGROWN_FILLS`, so its hits would cost more than the halves',
/// which hold the 420 halves: the port leaves it for the second level, though the exact-match
/// cache would find every frame.
#[test]
fn a_port_leaves_an_exact_match_cache_that_outgrew_the_core_for_the_halves() {
    let (mut h, mesh) = outgrown_mesh(1 << 17, 1 << 16, 220, 200);
    assert!(mesh.len() > vswitch::emc::OUTGROWN_FILLS as usize);
    let (exact, halves) = round_hits(&mut h, &mesh);
    assert!(halves >= mesh.len() as u64 * 99 / 100, "second-level hits {halves}, exact {exact}");
}

/// A port the halves were serving first, which they fail once its flows change to more
/// than they hold, goes back to the exact-match cache: a 44,000-flow mesh takes it to the
/// halves (16,384 entries a half hold its 420 halves), then 50,000 sources each talking to
/// one destination of its own (as `l2-100k`, every MAC learned before, so in the same epoch)
/// end mostly on the exact-match cache, which holds them. (With the halves' misses weighed
/// as plain misses and no recall, the same rounds end at 68 % exact hits: the port drifts
/// back only through samples.)
#[test]
fn a_port_the_halves_fail_goes_back_to_an_exact_match_cache_that_outgrew_the_core() {
    let mut h = switch(SwitchOptions {
        emc_entries: 1 << 17,
        megaflow_entries: 1 << 14,
        ..Default::default()
    });
    // Room in the FDB for every MAC (a domain learns 65,536 by default, a port 8,192).
    a_and_net(&mut h, Some(1 << 20));
    const PAIRS: u32 = 50_000;
    // The mesh's destinations, then the pairs' from DST + 1,000 on.
    learn_destinations(&mut h, 1000 + PAIRS);
    let mesh = mesh(220, 200);
    let pairs: Vec<Vec<u8>> = (0..PAIRS)
        .map(|i| {
            frames::udp4(mac(DST + 1000 + i), mac(100_000 + i), ip(i), ip(PAIRS + i), 1, 2, 64)
        })
        .collect();
    for frames in [&pairs, &mesh] {
        assert_eq!(send_all(&mut h, "a", frames, "net"), frames.len(), "learning");
    }
    // The next second: new epochs for both caches, as a running switch starts every second,
    // and from here on no MAC moves.
    h.set_now(2);
    assert_eq!(send_all(&mut h, "a", &mesh, "net"), mesh.len(), "the mesh, filling");
    let (_, halves) = round_hits(&mut h, &mesh);
    assert!(halves >= mesh.len() as u64 * 9 / 10, "the mesh rides the halves: {halves}");
    // Six rounds: the port moves between the caches while both learn the pairs (exact hits
    // by round, 2026-12-01: 0, 66 %, 73 %, 77 %, 79 %, 82 %, 85 %, 88 %).
    for _ in 0..6 {
        assert_eq!(send_all(&mut h, "a", &pairs, "net"), pairs.len(), "the pairs, filling");
    }
    let (exact, halves) = round_hits(&mut h, &pairs);
    let n = PAIRS as u64;
    assert!(exact >= n * 8 / 10, "exact hits {exact}, second-level {halves}");
    assert!(exact + halves >= n * 95 / 100, "exact hits {exact}, second-level {halves}");
}

//! Ingress policing through the pipeline, over ring ports with the pipeline's clock in the
//! test's hands: the rate holds within 5 % over a measured window, the burst passes whole
//! after idle and no more, bits and packets both bind, and a policer that could never pass a
//! frame is refused with the reason. And fairness: a flooding pod gets a burst a round.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::policer::PolicerConfig;
use vswitch::snapshot::ConfigError;
use vswitch::testkit::{Harness, frames, mac};
use vswitch::{DropReason, Event};

/// Each test's own clock (tests run on threads of one process).
fn rig(clock: fn() -> u64, policer: PolicerConfig) -> Harness {
    let mut h = Harness::new();
    h.ring("p0").ring("p1");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::access("p0", "red").policed(policer),
            PortConfig::access("p1", "red"),
        ],
        vtep: None,
    })
    .unwrap();
    h.pipe.set_clock(clock);
    // p1's MAC learned, so p0's frames go to p1 alone.
    h.send("p1", &frame(2, 1, 64));
    h.step();
    h.recv_all();
    h
}

fn frame(src: u32, dst: u32, size: usize) -> Vec<u8> {
    frames::udp4(
        mac(dst),
        mac(src),
        Ipv4Addr::new(192, 0, 2, src as u8),
        Ipv4Addr::new(192, 0, 2, dst as u8),
        1,
        2,
        size,
    )
}

#[test]
fn the_rate_holds_within_five_percent_and_the_rest_is_counted() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    let mut h = rig(
        || NOW.load(Relaxed),
        PolicerConfig { pps: 10_000, burst_packets: 64, ..Default::default() },
    );
    // One second offered at 50 000 frames a second, 5 frames every 100 µs.
    let (mut offered, mut passed) = (0u64, 0u64);
    for _ in 0..10_000 {
        NOW.fetch_add(100_000, Relaxed);
        for _ in 0..5 {
            h.send("p0", &frame(1, 2, 64));
        }
        offered += 5;
        h.step();
        passed += h.recv("p1").len() as u64;
    }
    let want = 10_000 + 64;
    assert!(passed.abs_diff(want) * 20 <= want, "{passed} passed, {want} ± 5 % wanted");
    let s = h.stats();
    assert_eq!(s.drop(DropReason::Policed), offered - passed, "every frame over the rate counted");
    assert_eq!(s.ports[0].rx_packets, offered, "policed frames were received");
    assert_eq!((s.ports[0].drops, s.ports[0].policed), (offered - passed, offered - passed));
    assert!(
        h.recv("p0").is_empty() && s.event(Event::Flooded) == 1,
        "only the learning frame flooded"
    );
}

#[test]
fn after_idle_the_burst_passes_whole_and_no_more() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    let mut h = rig(
        || NOW.load(Relaxed),
        PolicerConfig { pps: 1_000, burst_packets: 100, ..Default::default() },
    );
    NOW.fetch_add(60_000_000_000, Relaxed); // a minute idle: the bucket holds its burst, no more
    let mut passed = 0;
    for _ in 0..10 {
        for _ in 0..30 {
            h.send("p0", &frame(1, 2, 64));
        }
        h.step();
        passed += h.recv("p1").len();
    }
    assert_eq!(passed, 100);
    NOW.fetch_add(10_000_000, Relaxed); // 10 ms: 10 more
    for _ in 0..30 {
        h.send("p0", &frame(1, 2, 64));
    }
    h.step();
    assert_eq!(h.recv("p1").len(), 10);
}

#[test]
fn bits_bind_large_frames_while_small_ones_pass() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    // 1 Mbit/s with a 4 000-byte burst: two 1 500-byte frames, then only what the rate earns.
    let mut h = rig(
        || NOW.load(Relaxed),
        PolicerConfig { bps: 1_000_000, burst_bytes: 4_000, ..Default::default() },
    );
    for _ in 0..4 {
        h.send("p0", &frame(1, 2, 1500));
    }
    h.step();
    assert_eq!(h.recv("p1").len(), 2);
    NOW.fetch_add(1_000_000, Relaxed); // 1 ms: 125 bytes earned, on the 1 000 left
    h.send("p0", &frame(1, 2, 1500));
    h.send("p0", &frame(1, 2, 1000));
    h.step();
    let got = h.recv("p1");
    assert_eq!(
        got.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![1000],
        "the large frame dropped, the small one after it passed"
    );
}

#[test]
fn a_policer_that_could_never_pass_a_frame_is_refused() {
    let mut h = Harness::new();
    h.ring("p0");
    let cfg = |p: PolicerConfig| SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![PortConfig::access("p0", "red").policed(p)],
        vtep: None,
    };
    let e = h
        .apply(cfg(PolicerConfig { bps: 1_000_000, burst_bytes: 1000, ..Default::default() }))
        .unwrap_err();
    assert!(matches!(e, ConfigError::BadPolicer { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "port \"p0\": policer: burst_bytes 1000 is less than the port's largest frame (1518 bytes), which could never pass"
    );
    let e = h.apply(cfg(PolicerConfig::default())).unwrap_err();
    assert!(e.to_string().contains("needs a rate"), "{e}");
}

/// Fairness on a PMD thread: each round polls every queue once and takes at most a burst
/// (`BATCH` frames) from it, so a pod offering a thousand frames gets one burst a round, as
/// does its quiet neighbor, whose frames all pass in the first round.
#[test]
fn a_flooding_pod_takes_one_burst_a_round_and_its_neighbor_loses_nothing() {
    let mut h = Harness::new();
    h.ring("loud").ring("quiet").ring("out");
    let ports = ["loud", "quiet", "out"].iter().map(|p| PortConfig::access(p, "red")).collect();
    h.apply(SwitchConfig { bridges: vec![BridgeConfig::new("red")], ports, vtep: None }).unwrap();
    h.send("out", &frame(3, 1, 64)); // learn "out"'s MAC
    h.step();
    h.recv_all();
    for _ in 0..1000 {
        h.send("loud", &frame(1, 3, 64));
    }
    for _ in 0..10 {
        h.send("quiet", &frame(2, 3, 64));
    }
    // One round, as a PMD thread makes it.
    let snap = h.switch.snapshot();
    let mut batch = vswitch::Batch::new();
    for &(p, q) in &snap.rxqs {
        h.pipe.poll(&snap, p, q, &mut batch);
    }
    let out = h.recv("out");
    let from = |src: u32| out.iter().filter(|f| f[6..12] == mac(src).0).count();
    assert_eq!((from(1), from(2)), (vswitch::BATCH, 10));
    assert_eq!(h.step(), 1000 - vswitch::BATCH, "the rest in later rounds");
}

/// A bridge's pod policer (a network's per-pod rate) holds each of its access ports without
/// a policer of its own to that rate, each on its own; a port's own policer wins; a pod
/// policer without a rate is refused with the bridge's name.
#[test]
fn a_bridges_pod_policer_holds_each_of_its_access_ports() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    let mut h = Harness::new();
    h.ring("p0").ring("p1").ring("p2").ring("sink");
    let mut red = BridgeConfig::new("red");
    red.pod_policer = Some(PolicerConfig { pps: 1_000, burst_packets: 10, ..Default::default() });
    let cfg = |red: BridgeConfig| SwitchConfig {
        bridges: vec![red],
        ports: vec![
            PortConfig::access("p0", "red"),
            PortConfig::access("p1", "red"),
            PortConfig::access("p2", "red")
                .policed(PolicerConfig { pps: 100_000, ..Default::default() }),
            PortConfig::access("sink", "red"),
        ],
        vtep: None,
    };
    h.apply(cfg(red.clone())).unwrap();
    h.pipe.set_clock(|| NOW.load(Relaxed));
    h.send("sink", &frame(9, 1, 64));
    h.step();
    h.recv_all();
    // 100 ms at 10 000 frames a second from each pod: 10 ms of rate (the burst) + 100 ms.
    let mut passed = [0u64; 3];
    for _ in 0..100 {
        NOW.fetch_add(1_000_000, Relaxed);
        for (i, p) in ["p0", "p1", "p2"].iter().enumerate() {
            for _ in 0..10 {
                h.send(p, &frame(i as u32 + 1, 9, 64));
            }
        }
        h.step();
        for f in h.recv("sink") {
            passed[(f[11] - 1) as usize] += 1;
        }
    }
    assert!(
        passed[0].abs_diff(110) <= 5 && passed[1].abs_diff(110) <= 5,
        "each pod at its own 1 000/s: {passed:?}"
    );
    assert_eq!(passed[2], 1000, "a port's own policer wins");
    let s = h.stats();
    assert_eq!(s.ports[0].policed + s.ports[1].policed, 2000 - passed[0] - passed[1]);

    red.pod_policer = Some(PolicerConfig::default());
    let e = h.apply(cfg(red)).unwrap_err();
    assert_eq!(e.to_string(), "bridge \"red\": pod policer: a policer needs a rate: pps or bps");
}

/// A bridge's own policer holds what all its access ports send together: two pods each
/// offering 10 000 frames a second into a network policed at 2 000 get 2 000 a second
/// between them (and the burst), each policed frame counted on its port and on the bridge; the bucket
/// keeps its state across an unrelated configuration change, and is refused without a rate.
#[test]
fn a_bridges_policer_holds_its_ports_together() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    let mut h = Harness::new();
    h.ring("p0").ring("p1").ring("sink").ring("other");
    let mut red = BridgeConfig::new("red");
    red.policer = Some(PolicerConfig { pps: 2_000, burst_packets: 20, ..Default::default() });
    let cfg = |red: BridgeConfig, extra: bool| SwitchConfig {
        bridges: vec![red, BridgeConfig::new("blue")],
        ports: [
            vec![
                PortConfig::access("p0", "red"),
                PortConfig::access("p1", "red"),
                PortConfig::access("sink", "red"),
            ],
            if extra { vec![PortConfig::access("other", "blue")] } else { vec![] },
        ]
        .concat(),
        vtep: None,
    };
    h.apply(cfg(red.clone(), false)).unwrap();
    h.pipe.set_clock(|| NOW.load(Relaxed));
    h.send("sink", &frame(9, 1, 64));
    h.step();
    h.recv_all();
    let base = h.stats();
    let mut passed = [0u64; 2];
    for round in 0..1000 {
        if round == 500 {
            // Another bridge's port added: the policer's bucket is the same one.
            h.apply(cfg(red.clone(), true)).unwrap();
        }
        NOW.fetch_add(100_000, Relaxed); // 100 µs
        for (i, p) in ["p0", "p1"].iter().enumerate() {
            h.send(p, &frame(i as u32 + 1, 9, 64));
        }
        h.step();
        for f in h.recv("sink") {
            passed[(f[11] - 1) as usize] += 1;
        }
    }
    // 0.1 s at 2 000 a second, and the burst's 20 (a sink-side frame also drew from it).
    let total = passed[0] + passed[1];
    assert!(total.abs_diff(200 + 20) <= 3, "both pods together at the network's rate: {passed:?}");
    // How the rate divides among the pods is first come, first served (here the pod polled
    // first takes each token as it accrues): a pod policer is what makes them fair.
    let s = h.stats();
    let policed = 2000 - total;
    assert_eq!(s.bds[0].policed - base.bds[0].policed, policed, "counted on the bridge");
    assert_eq!(s.ports[0].policed + s.ports[1].policed, policed, "and on the ports");
    assert_eq!(s.drop(DropReason::Policed) - base.drop(DropReason::Policed), policed);

    red.policer = Some(PolicerConfig::default());
    let e = h.apply(cfg(red, false)).unwrap_err();
    assert_eq!(e.to_string(), "bridge \"red\": policer: a policer needs a rate: pps or bps");
}

/// How a sender spreads its frames over a port's four receive queues, and which of two PMD
/// threads polls which queue.
struct Layout {
    name: &'static str,
    /// Frames in each queue per 80 offered.
    share: [u64; 4],
    /// The thread (0 or 1) that polls each queue.
    thread: [usize; 4],
}

/// A port's rate is the port's: a frontend that enabled four queues and sends on one, on all
/// evenly, or skewed, polled by one PMD thread or two, passes the rate it was given within
/// 2 % over a simulated second — in packets and in bits, for the port's own policer, its
/// network's per-pod one and its network's on the node (a frontend's queue count is its
/// choice; a policer that split the rate by queue gave a one-queue sender a quarter).
#[test]
fn a_ports_rate_holds_however_its_queues_are_used_and_polled() {
    static NOW: AtomicU64 = AtomicU64::new(0);
    let layouts = [
        Layout { name: "one queue", share: [80, 0, 0, 0], thread: [0; 4] },
        Layout { name: "even", share: [20; 4], thread: [0; 4] },
        Layout { name: "skewed", share: [56, 8, 8, 8], thread: [0; 4] },
        Layout { name: "two threads, one queue each", share: [0, 40, 40, 0], thread: [0, 1, 0, 1] },
        Layout { name: "two threads, skewed", share: [50, 10, 15, 5], thread: [0, 0, 1, 1] },
    ];
    let pps = PolicerConfig { pps: 20_000, ..Default::default() };
    // 16 Mbit/s of 100-byte frames: 20 000 frames a second.
    let bps = PolicerConfig { bps: 16_000_000, burst_bytes: 20_000, ..Default::default() };
    // The port's own policer, its network's per-pod one, its network's on the node.
    let policers = [
        ("port pps", pps, 64, 0),
        ("port bps", bps, 100, 0),
        ("pod pps", pps, 64, 1),
        ("network pps", pps, 64, 2),
        ("network bps", bps, 100, 2),
    ];
    for (kind, policer, size, whose) in policers {
        for l in &layouts {
            let mut h = Harness::new();
            let (port, mut wire) = vswitch::port::ring::RingPort::new("vnf", 4, 1024).unwrap();
            h.register("vnf", port).ring("sink");
            let mut red = BridgeConfig::new("red");
            let mut vnf = PortConfig::access("vnf", "red");
            match whose {
                0 => vnf = vnf.policed(policer),
                1 => red.pod_policer = Some(policer),
                _ => red.policer = Some(policer),
            }
            h.apply(SwitchConfig {
                bridges: vec![red],
                ports: vec![vnf, PortConfig::access("sink", "red")],
                vtep: None,
            })
            .unwrap();
            // Every pipeline on the test's clock (they share the network's bucket).
            h.pipe.set_clock(|| NOW.load(Relaxed));
            let mut threads = [h.switch.pipeline(0), h.switch.pipeline(1)];
            for t in &mut threads {
                t.set_clock(|| NOW.load(Relaxed));
            }
            h.send("sink", &frame(9, 1, 64));
            h.step();
            h.recv_all();
            let snap = h.switch.snapshot();
            let mut cache = vswitch::buf::PoolCache::new(h.pool.clone());
            // One second offered at 80 000 frames a second (4× the rate), a millisecond a round.
            let mut passed = 0u64;
            for _ in 0..1000 {
                NOW.fetch_add(1_000_000, Relaxed);
                for (q, &n) in l.share.iter().enumerate() {
                    for _ in 0..n {
                        let b = cache.alloc_frame(&frame(1, 9, size)).unwrap();
                        assert!(wire.send_one(q as u16, b).is_ok(), "room in queue {q}");
                    }
                }
                let mut batch = vswitch::Batch::new();
                for &(p, q) in &snap.rxqs {
                    let t = if snap.port(p).is_some_and(|e| e.name == "vnf") {
                        l.thread[q as usize]
                    } else {
                        0
                    };
                    while threads[t].poll(&snap, p, q, &mut batch) > 0 {}
                }
                passed += h.recv("sink").len() as u64;
            }
            let (rate, burst) = (20_000, 200);
            assert!(
                passed.abs_diff(rate + burst) * 50 <= rate,
                "{kind}, {}: {passed} passed, {} ± 2 % wanted",
                l.name,
                rate + burst
            );
            let s = h.stats();
            assert_eq!(s.ports[0].policed, 80_000 - passed, "{kind}, {}: the rest policed", l.name);
        }
    }
}

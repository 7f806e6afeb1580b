//! Real PMD threads: traffic through two threads in both idle policies, prompt clean stop,
//! adaptive threads really sleep, configuration adoption is acknowledged, and a replaced
//! configuration is freed off the PMD thread.
//!
//! These tests spin CPUs, so they run one at a time (a lock here, and the `pmd` nextest test
//! group across binaries).

use std::sync::Mutex;
use std::time::{Duration, Instant};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::{eventually, frames, mac};
use vswitch::{Batch, IdlePolicy, PmdConfig, PmdSet, Pool, PoolCache, Switch, SwitchOptions};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Rig {
    pool: std::sync::Arc<Pool>,
    switch: std::sync::Arc<Switch>,
    peers: Vec<RingPeer>,
}

fn rig(ports: usize) -> Rig {
    let pool = Pool::new(16384, false).unwrap();
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let mut peers = Vec::new();
    let mut cfg = SwitchConfig { bridges: vec![BridgeConfig::new("red")], ..Default::default() };
    for i in 0..ports {
        let name = format!("p{i}");
        let (p, peer) = RingPort::new(&name, 2, 1024).unwrap();
        switch.register_port(&name, p).unwrap();
        peers.push(peer);
        cfg.ports.push(PortConfig::access(&name, "red"));
    }
    switch.apply(cfg).unwrap();
    Rig { pool, switch, peers }
}

/// Sends `n` frames p0→p1 (and learns p1's MAC first); returns how many arrived in time.
fn pump(r: &mut Rig, n: usize, deadline: Duration) -> usize {
    let mut cache = PoolCache::new(r.pool.clone());
    let learn = frames::udp4(
        mac(1),
        mac(2),
        "192.0.2.2".parse().unwrap(),
        "192.0.2.1".parse().unwrap(),
        1,
        2,
        64,
    );
    r.peers[1].send_one(0, cache.alloc_frame(&learn).unwrap()).unwrap();
    let f = frames::udp4(
        mac(2),
        mac(1),
        "192.0.2.1".parse().unwrap(),
        "192.0.2.2".parse().unwrap(),
        1,
        2,
        64,
    );
    let end = Instant::now() + deadline;
    let (mut sent, mut got) = (0, 0);
    let mut b = Batch::new();
    while got < n && Instant::now() < end {
        // Keep fewer frames in flight than a ring holds, so a descheduled test thread never
        // makes the switch's tx ring overflow.
        if sent < n && sent - got < 512 {
            let q = (sent % 2) as u16;
            if let Ok(()) =
                r.peers[0].send_one(q, cache.alloc_frame(&f).unwrap()).map_err(|x| cache.free(x))
            {
                sent += 1;
            }
        }
        for q in 0..2 {
            r.peers[1].recv(q, &mut b);
            for x in b.drain() {
                got += 1;
                cache.free(x);
            }
            r.peers[0].drain(&mut cache); // the learning frame's copy
        }
    }
    got
}

fn run_policy(idle: IdlePolicy) {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rig(2);
    let pmd =
        PmdSet::start(r.switch.clone(), &PmdConfig { threads: 2, cores: vec![], idle }).unwrap();
    let got = pump(&mut r, 20_000, Duration::from_secs(20));
    assert_eq!(got, 20_000, "every frame forwarded");
    let t0 = Instant::now();
    pmd.stop();
    assert!(t0.elapsed() < Duration::from_secs(1), "stop is prompt");
    let s = r.switch.stats();
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    assert!(s.packets >= 20_000);
    assert!(s.cycles_per_packet().is_some());
    let per_thread = r.switch.thread_stats();
    assert_eq!(per_thread.len(), 2);
    assert!(
        per_thread.iter().all(|t| t.packets > 0 && t.busy_cycles > 0),
        "both PMDs polled their queues"
    );
}

#[test]
fn pmd_busy_forwards_and_stops() {
    run_policy(IdlePolicy::Busy);
}

#[test]
fn pmd_adaptive_forwards_sleeps_and_stops() {
    run_policy(IdlePolicy::default());
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rig(2);
    let pmd = PmdSet::start(
        r.switch.clone(),
        &PmdConfig { threads: 1, cores: vec![0], idle: IdlePolicy::default() },
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || r.switch.stats().sleeps > 0),
        "an idle adaptive thread sleeps"
    );
    // A frame arriving while the thread sleeps wakes it.
    assert_eq!(pump(&mut r, 1, Duration::from_secs(5)), 1);
    // Config changes are adopted and acknowledged.
    let mut cfg = r.switch.snapshot().config.clone();
    cfg.bridges.push(BridgeConfig::new("blue"));
    let generation = r.switch.apply(cfg).unwrap();
    assert!(pmd.wait_adopted(generation, Duration::from_secs(5)));
    drop(pmd);
}

/// The README's library example, as written there.
#[test]
fn readme_example_runs() -> Result<(), Box<dyn std::error::Error>> {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
    let pool = Pool::new(16384, true)?; // 16k buffers, hugepages if any
    let switch = Switch::new(pool, SwitchOptions::default());
    let (port, _wire) = RingPort::new("pod1", 1, 1024)?; // any `Port` implementation
    switch.register_port("pod1", port)?;
    switch.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vlan(100)],
        ports: vec![PortConfig::access("pod1", "red")],
        vtep: None,
    })?; // refused whole, with a reason, if invalid
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![1], idle: IdlePolicy::default() },
    )?;
    println!("{:?}", switch.stats().nonzero_drops());
    pmd.stop();
    Ok(())
}

/// A PMD thread never frees the configuration it stops using (a large one would stall its
/// polling): it leaves it for `PmdSet::reclaim`, which `wait_adopted` calls on the control
/// thread; the ports only that configuration named close then.
#[test]
fn a_replaced_configuration_is_freed_off_the_pmd_thread() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = rig(2);
    let pmd = PmdSet::start(
        r.switch.clone(),
        &PmdConfig { threads: 1, cores: vec![], idle: IdlePolicy::default() },
    )
    .unwrap();
    let adopted = || r.switch.stats().event(vswitch::Event::ConfigAdopted);
    assert!(
        pmd.wait_adopted(r.switch.generation(), Duration::from_secs(5)),
        "the thread started on the first configuration"
    );
    let old = std::sync::Arc::downgrade(&r.switch.snapshot());
    let snap = r.switch.snapshot();
    let port = std::sync::Arc::downgrade(&snap.port(snap.port_id("p1").unwrap()).unwrap().port);
    drop(snap);
    let mut cfg = r.switch.snapshot().config.clone();
    cfg.ports.retain(|p| p.name != "p1");
    let before = adopted();
    let generation = r.switch.apply(cfg).unwrap();
    drop(r.switch.unregister_port("p1").unwrap());
    assert!(
        eventually(Duration::from_secs(5), || adopted() > before),
        "an idle thread adopts after its sleep"
    );
    assert!(
        old.upgrade().is_some() && port.upgrade().is_some(),
        "the PMD thread left the snapshot, with its port, to the control thread"
    );
    assert!(pmd.wait_adopted(generation, Duration::from_secs(5)));
    assert!(old.upgrade().is_none(), "reclaimed");
    assert!(port.upgrade().is_none(), "the removed port closed with it");
    drop(pmd);
}

/// A port whose bursts make the switch panic when asked to (what a frame the switch
/// mishandles would do), whose arming of wake-ups panics, or whose wake descriptor does
/// (outside anything a port is blamed for).
struct Boom {
    name: String,
    on_rx: std::sync::atomic::AtomicBool,
    on_tx: std::sync::atomic::AtomicBool,
    on_arm: std::sync::atomic::AtomicBool,
    on_wake_fd: std::sync::atomic::AtomicBool,
    failed: Mutex<Option<String>>,
}

impl vswitch::port::Port for Boom {
    fn name(&self) -> &str {
        &self.name
    }
    fn rx_burst(&self, _q: u16, _c: &mut PoolCache, _b: &mut Batch) -> usize {
        assert!(
            !self.on_rx.load(std::sync::atomic::Ordering::Relaxed),
            "a burst the switch cannot handle"
        );
        0
    }
    fn tx_burst(&self, _q: u16, cache: &mut PoolCache, b: &mut Batch) -> usize {
        assert!(
            !self.on_tx.load(std::sync::atomic::Ordering::Relaxed),
            "a receive ring the switch cannot handle"
        );
        let n = b.len();
        for x in b.drain() {
            cache.free(x);
        }
        n
    }
    fn arm_wake(&self, _q: u16, _armed: bool) -> bool {
        assert!(
            !self.on_arm.load(std::sync::atomic::Ordering::Relaxed),
            "a wake-up the switch cannot handle"
        );
        false
    }
    fn wake_fd(&self, _q: u16) -> Option<std::os::fd::RawFd> {
        assert!(
            !self.on_wake_fd.load(std::sync::atomic::Ordering::Relaxed),
            "a descriptor the switch cannot handle"
        );
        None
    }
    fn fail(&self, why: &str) {
        *self.failed.lock().unwrap() = Some(why.to_string());
    }
}

/// A panic while a PMD thread processes a port's burst puts that port in error (the switch's
/// faults say why, the port is told and no longer polled) and the thread goes on forwarding
/// for the others; adding the port again clears it. A thread that dies of a panic elsewhere
/// is reported by `dead_threads`, which the daemon's health check reads.
#[test]
fn a_panic_in_a_ports_burst_fails_only_that_port() {
    use std::sync::atomic::Ordering::Relaxed;
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = rig(2);
    let boom = std::sync::Arc::new(Boom {
        name: "boom".into(),
        on_rx: false.into(),
        on_tx: false.into(),
        on_arm: false.into(),
        on_wake_fd: false.into(),
        failed: Mutex::new(None),
    });
    r.switch.register_port("boom", boom.clone()).unwrap();
    let mut cfg = r.switch.snapshot().config.clone();
    cfg.ports.push(PortConfig::access("boom", "red"));
    r.switch.apply(cfg.clone()).unwrap();
    let pmd = PmdSet::start(
        r.switch.clone(),
        &PmdConfig { threads: 1, cores: vec![], idle: IdlePolicy::default() },
    )
    .unwrap();
    assert_eq!(pump(&mut r, 100, Duration::from_secs(10)), 100);
    boom.on_rx.store(true, Relaxed);
    assert!(
        eventually(Duration::from_secs(5), || r.switch.faults().get("boom").is_some()),
        "the port is in error"
    );
    let why = r.switch.faults().get("boom").unwrap();
    assert!(why.contains("panicked") && why.contains("a burst the switch cannot handle"), "{why}");
    assert_eq!(boom.failed.lock().unwrap().as_deref(), Some(why.as_str()), "the port was told");
    assert_eq!(
        pump(&mut r, 1000, Duration::from_secs(10)),
        1000,
        "the thread forwards for the others"
    );
    assert!(pmd.dead_threads().is_empty());
    // A panic in its transmit burst (its receive ring's walk) is its, not the sender's.
    boom.on_rx.store(false, Relaxed);
    r.switch.replace_port("boom", boom.clone()).unwrap();
    r.switch.apply(cfg.clone()).unwrap();
    boom.on_tx.store(true, Relaxed);
    let mut cache = PoolCache::new(r.pool.clone());
    let bcast = frames::udp4(
        vswitch::wire::MacAddr::BROADCAST,
        mac(1),
        "192.0.2.1".parse().unwrap(),
        "192.0.2.255".parse().unwrap(),
        1,
        2,
        64,
    );
    r.peers[0].send_one(0, cache.alloc_frame(&bcast).unwrap()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || r
            .switch
            .faults()
            .get("boom")
            .is_some_and(|w| w.contains("sending to it"))),
        "the receiver is in error"
    );
    assert!(r.switch.faults().get("p0").is_none(), "not the sender");
    boom.on_tx.store(false, Relaxed);
    let mut b = Batch::new();
    for q in 0..2 {
        r.peers[1].recv(q, &mut b); // the broadcast's copy for p1
        for x in b.drain() {
            cache.free(x);
        }
    }
    drop(cache);
    assert_eq!(
        pump(&mut r, 1000, Duration::from_secs(10)),
        1000,
        "the thread forwards for the others"
    );
    // Added again (its device opened anew), it is polled again; a panic arming its wake-up
    // (the idle thread's, outside any burst) is its too.
    boom.on_rx.store(false, Relaxed);
    r.switch.replace_port("boom", boom.clone()).unwrap();
    assert!(r.switch.faults().get("boom").is_none());
    boom.on_arm.store(true, Relaxed);
    r.switch.apply(cfg.clone()).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || r
            .switch
            .faults()
            .get("boom")
            .is_some_and(|w| w.contains("arming its wake-up"))),
        "the port is in error"
    );
    assert_eq!(
        pump(&mut r, 1000, Duration::from_secs(10)),
        1000,
        "the thread forwards for the others"
    );
    // A panic nothing can be blamed on ends the thread, which is reported.
    boom.on_arm.store(false, Relaxed);
    boom.on_wake_fd.store(true, Relaxed);
    r.switch.replace_port("boom", boom.clone()).unwrap();
    r.switch.apply(cfg).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || pmd.dead_threads() == vec![0]),
        "the dead thread is reported"
    );
    boom.on_wake_fd.store(false, Relaxed);
    drop(pmd);
}

/// Queues are dealt to threads, each queue to exactly one; a port pinned to a thread is
/// polled there and that thread polls nothing else; a pin to a thread that does not run is
/// refused once PMD threads run.
#[test]
fn pinned_ports_go_to_their_thread_and_the_rest_are_dealt_to_the_others() {
    use vswitch::pmd::assignment;
    let r = rig(4);
    let mut cfg = r.switch.snapshot().config.clone();
    cfg.ports[1].pmd = Some(1);
    r.switch.apply(cfg.clone()).unwrap();
    let snap = r.switch.snapshot();
    let id = |name: &str| snap.port_id(name).unwrap();
    let threads: Vec<Vec<(u16, u16)>> = (0..3).map(|t| assignment(&snap, t, 3)).collect();
    assert_eq!(
        threads[1],
        vec![(id("p1"), 0), (id("p1"), 1)],
        "the pinned thread polls its port's queues alone"
    );
    let mut all: Vec<(u16, u16)> = threads.concat();
    all.sort();
    let mut want = snap.rxqs.clone();
    want.sort();
    assert_eq!(all, want, "every queue once");
    assert!(threads[0].len().abs_diff(threads[2].len()) <= 1, "{threads:?}");
    // Every thread pinned: the unpinned queues are dealt over all of them.
    assert_eq!((0..1).map(|t| assignment(&snap, t, 1).len()).sum::<usize>(), snap.rxqs.len());

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let set =
        PmdSet::start(r.switch.clone(), &PmdConfig { threads: 2, ..Default::default() }).unwrap();
    cfg.ports[1].pmd = Some(2);
    let e = r.switch.apply(cfg.clone()).unwrap_err();
    assert!(e.to_string().contains("PMD thread 2 does not exist (this switch runs 2: 0-1)"), "{e}");
    set.stop();
    // A pin the configuration had already (threads fewer after a restart) stays: pmd 2 of 2
    // threads is thread 0, and other changes go on.
    let r = rig(4);
    r.switch.apply(cfg.clone()).unwrap();
    let set =
        PmdSet::start(r.switch.clone(), &PmdConfig { threads: 2, ..Default::default() }).unwrap();
    cfg.ports[0].mtu = 1400;
    r.switch.apply(cfg).unwrap();
    let snap = r.switch.snapshot();
    assert_eq!(
        assignment(&snap, 0, 2),
        vec![(snap.port_id("p1").unwrap(), 0), (snap.port_id("p1").unwrap(), 1)]
    );
    set.stop();
}

/// A rebalance places the busiest queue first, each on the least loaded thread; queues it
/// placed stay there, the others are dealt in turn; a pinned thread takes none.
#[test]
fn a_rebalance_places_queues_by_load() {
    use vswitch::pmd::{Moves, assignment_with, place_by_load};
    let (a, b, c, d) = ((0, 0), (0, 1), (1, 0), (1, 1));
    let placed = place_by_load(vec![(c, 10), (a, 100), (d, 5), (b, 90)], &[0, 1]);
    assert_eq!(placed.into_iter().collect::<Vec<_>>(), vec![(a, 0), (b, 1), (c, 1), (d, 0)]);
    let idle = place_by_load(vec![(a, 0), (b, 0), (c, 0), (d, 0)], &[0, 1]);
    assert_eq!(idle.values().filter(|&&t| t == 0).count(), 2, "idle queues spread: {idle:?}");

    let r = rig(3);
    let snap = r.switch.snapshot();
    let q = |name: &str, i: u16| (snap.port_id(name).unwrap(), i);
    let moves =
        Moves { generation: 1, placed: [(q("p0", 0), 1), (q("p0", 1), 1)].into_iter().collect() };
    let (t0, t1) = (assignment_with(&snap, 0, 2, &moves), assignment_with(&snap, 1, 2, &moves));
    assert!(
        t1.contains(&q("p0", 0)) && t1.contains(&q("p0", 1)) && !t0.contains(&q("p0", 0)),
        "{t0:?} {t1:?}"
    );
    assert_eq!(t0.len() + t1.len(), snap.rxqs.len());
    assert_eq!((t0.len(), t1.len()), (2, 4), "the four others dealt two and two");
}

//! Two simulated guests on vhost ports of one switch: frames cross guest → switch → guest
//! byte for byte, flooded first, then as known unicast (through the exact-match cache), and
//! a guest that posts no receive buffers only loses the frames meant for it.

use knitter_vhost::testkit::Vm;
use vswitch::port::Port;
use vswitch::testkit::{self, Harness, frames, mac};
use vswitch::{Event, Pool, SwitchOptions};

fn ip(n: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(192, 0, 2, n)
}

#[test]
fn frames_cross_between_two_guests() {
    let pool = Pool::new(4096, false).unwrap();
    let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
    let (mut a, mut b) = (Vm::new("vm-a", &pool, 64), Vm::new("vm-b", &pool, 64));
    h.register("vm-a", a.port.clone()).register("vm-b", b.port.clone());
    h.apply(testkit::one_bridge(&["vm-a", "vm-b"])).unwrap();
    let mut a_bufs: std::collections::VecDeque<u64> = a.give_rx_buffers(32).into();
    let mut b_bufs: std::collections::VecDeque<u64> = b.give_rx_buffers(32).into();

    let a_to_b = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 200);
    let b_to_a = frames::udp4(mac(1), mac(2), ip(2), ip(1), 2000, 1000, 1400);
    a.send(&a_to_b); // unknown destination: flooded to b
    h.step();
    b.send(&b_to_a); // mac(1) learned on vm-a
    h.step();
    a.send(&a_to_b); // known unicast now: the slow path caches the flow
    h.step();
    for _ in 0..9 {
        a.send(&a_to_b);
    }
    h.step();
    assert_eq!(b.received(&mut b_bufs), vec![a_to_b.clone(); 11]);
    assert_eq!(a.received(&mut a_bufs), vec![b_to_a]);
    let s = h.stats();
    assert!(s.event(Event::CacheHits) >= 9, "known unicast through the cache");
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    assert_eq!(a.tx.completions().len(), 11, "every transmit chain returned to the guest");
    assert_eq!(b.port.queue_stats()[0].tx_packets, 11);
    assert!(a.port.link_up());
}

#[test]
fn a_guest_without_receive_buffers_loses_only_its_frames() {
    let pool = Pool::new(4096, false).unwrap();
    let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
    let (mut a, mut b, mut c) = (Vm::new("vm-a", &pool, 64), Vm::new("vm-b", &pool, 64), Vm::new("vm-c", &pool, 64));
    h.register("vm-a", a.port.clone()).register("vm-b", b.port.clone()).register("vm-c", c.port.clone());
    h.apply(testkit::one_bridge(&["vm-a", "vm-b", "vm-c"])).unwrap();
    let mut c_bufs: std::collections::VecDeque<u64> = c.give_rx_buffers(8).into();
    // vm-b posts none.
    let bcast = frames::udp4(vswitch::wire::MacAddr::BROADCAST, mac(1), ip(1), ip(255), 68, 67, 300);
    for _ in 0..4 {
        a.send(&bcast);
    }
    h.step();
    assert_eq!(c.received(&mut c_bufs), vec![bcast.clone(); 4]);
    assert_eq!(b.rx.completions(), vec![]);
    let s = h.stats();
    assert_eq!(s.drop(vswitch::DropReason::TxFull), 4, "vm-b had no room: counted as tx_full");
    assert_eq!(b.port.queue_stats()[0].tx_full, 4);
    drop(b);
    h.flush_caches();
}

/// The PMD threads share a guest's running queue pairs whichever pairs it enables, and
/// follow when it enables others; a ring port's queue stays where it was.
#[test]
fn running_pairs_spread_over_pmd_threads() {
    use vswitch::pmd::assignment;
    let pool = Pool::new(1024, false).unwrap();
    let switch = vswitch::Switch::new(pool.clone(), SwitchOptions::default());
    let (ring, _peer) = vswitch::port::ring::RingPort::new("r0", 1, 64).unwrap();
    switch.register_port("r0", ring).unwrap();
    let vm = Vm::new("vm", &pool, 64); // pair 0 runs
    let (g2, g3) = (vm.rx.another_queue(2), vm.rx.another_queue(3));
    vm.port.configure(|d| d.run_pair(2, g2.queue(), g3.queue()));
    switch.register_port("vm", vm.port.clone()).unwrap();
    switch
        .apply(testkit::one_bridge(&["r0", "vm"]))
        .unwrap();
    let snap = switch.snapshot();
    let (r, v) = (snap.port_id("r0").unwrap(), snap.port_id("vm").unwrap());
    let threads = |s: &vswitch::snapshot::Snapshot| (assignment(s, 0, 2), assignment(s, 1, 2));
    // Pairs 0 and 2 run: one on each thread (the ring port's queue on the first).
    assert_eq!(threads(&snap), (vec![(r, 0), (v, 2)], vec![(v, 0)]));
    // The guest stops pair 0 and starts pair 1.
    vm.port.configure(|d| {
        let (g0, g1) = (vm.rx.another_queue(0), vm.rx.another_queue(1));
        d.pairs[0].queues = [None, None];
        d.run_pair(1, g0.queue(), g1.queue());
    });
    assert_eq!(threads(&snap), (vec![(r, 0), (v, 2)], vec![(v, 1)]));
    assert_eq!(vm.port.running_pairs(), 2);
}

/// Buffer handles are indices into one pool: a vhost-user port made over a second pool is
/// refused by the switch (registering and replacing), so its indices never reach the
/// pipeline.
#[test]
fn a_port_over_another_pool_is_refused() {
    let pool = Pool::new(256, false).unwrap();
    let other = Pool::new(256, false).unwrap();
    let switch = vswitch::Switch::new(pool.clone(), SwitchOptions::default());
    let foreign = std::sync::Arc::new(knitter_vhost::port::VhostPort::new("vm", other));
    let err = switch.register_port("vm", foreign.clone()).unwrap_err();
    assert!(matches!(err, vswitch::switch::SwitchError::ForeignPool(_)), "{err}");
    switch.register_port("vm", std::sync::Arc::new(knitter_vhost::port::VhostPort::new("vm", pool))).unwrap();
    assert!(matches!(switch.replace_port("vm", foreign), Err(vswitch::switch::SwitchError::ForeignPool(_))));
}

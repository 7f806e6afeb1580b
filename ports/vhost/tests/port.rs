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
    frames_cross(false);
}

/// The same over packed rings with `IN_ORDER` (the guests' transmit chains come back a burst
/// at a time).
#[test]
fn frames_cross_between_two_guests_over_packed_rings() {
    frames_cross(true);
}

fn frames_cross(packed: bool) {
    let pool = Pool::new(4096, false).unwrap();
    let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
    let (mut a, mut b) =
        (Vm::with_layout("vm-a", &pool, 64, packed), Vm::with_layout("vm-b", &pool, 64, packed));
    assert_eq!(a.port.rings().map(|r| (r.packed, r.in_order)), Some((packed, packed)));
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

/// Packed rings of 64 entries, lap after lap: 400 frames in bursts of 20, receive buffers
/// refilled as the guest's driver does; every frame arrives whole and in order, and every
/// transmit chain comes back.
#[test]
fn packed_rings_go_round_lap_after_lap() {
    let pool = Pool::new(4096, false).unwrap();
    let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
    let (mut a, mut b) =
        (Vm::with_layout("vm-a", &pool, 64, true), Vm::with_layout("vm-b", &pool, 64, true));
    h.register("vm-a", a.port.clone()).register("vm-b", b.port.clone());
    h.apply(testkit::one_bridge(&["vm-a", "vm-b"])).unwrap();
    let mut b_bufs: std::collections::VecDeque<u64> = b.give_rx_buffers(40).into();
    let (mut got, mut returned) = (Vec::new(), 0);
    for burst in 0..20u16 {
        let sent: Vec<Vec<u8>> = (0..20u16)
            .map(|i| frames::udp4(mac(2), mac(1), ip(1), ip(2), burst, i, 60 + i as usize))
            .collect();
        for f in &sent {
            a.send(f);
        }
        h.step();
        let arrived = b.received(&mut b_bufs);
        b_bufs.extend(b.give_rx_buffers(arrived.len()));
        returned += a.tx.completions().len();
        assert_eq!(arrived, sent, "burst {burst}");
        got.extend(arrived);
    }
    assert_eq!((got.len(), returned), (400, 400));
    assert_eq!(h.stats().total_drops(), 0, "{:?}", h.stats().nonzero_drops());
}

#[test]
fn a_guest_without_receive_buffers_loses_only_its_frames() {
    let pool = Pool::new(4096, false).unwrap();
    let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
    let (mut a, mut b, mut c) =
        (Vm::new("vm-a", &pool, 64), Vm::new("vm-b", &pool, 64), Vm::new("vm-c", &pool, 64));
    h.register("vm-a", a.port.clone())
        .register("vm-b", b.port.clone())
        .register("vm-c", c.port.clone());
    h.apply(testkit::one_bridge(&["vm-a", "vm-b", "vm-c"])).unwrap();
    let mut c_bufs: std::collections::VecDeque<u64> = c.give_rx_buffers(8).into();
    // vm-b posts none.
    let bcast =
        frames::udp4(vswitch::wire::MacAddr::BROADCAST, mac(1), ip(1), ip(255), 68, 67, 300);
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
    switch.apply(testkit::one_bridge(&["r0", "vm"])).unwrap();
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
    switch
        .register_port("vm", std::sync::Arc::new(knitter_vhost::port::VhostPort::new("vm", pool)))
        .unwrap();
    assert!(matches!(
        switch.replace_port("vm", foreign),
        Err(vswitch::switch::SwitchError::ForeignPool(_))
    ));
}

/// The single-copy path: frames of `LEND_MIN` bytes or more cross from one guest to another
/// byte for byte whether lent (on) or copied twice (off); to a ring port (which may keep
/// a buffer) and flooded they arrive whole too, a jumbo one chained; the sending guest gets
/// every transmit descriptor back in the order it posted them, and every pool buffer comes
/// back.
#[test]
fn large_frames_cross_with_one_copy_and_reach_other_ports_whole() {
    for single_copy in [true, false] {
        let pool = Pool::new(4096, false).unwrap();
        let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
        let (mut a, mut b) = (Vm::new("vm-a", &pool, 128), Vm::new("vm-b", &pool, 128));
        a.port.set_single_copy(single_copy);
        b.port.set_single_copy(single_copy);
        h.ring("r0");
        h.register("vm-a", a.port.clone()).register("vm-b", b.port.clone());
        let mut config = testkit::one_bridge(&["vm-a", "vm-b", "r0"]);
        for p in &mut config.ports {
            p.mtu = 9000; // jumbo frames
        }
        h.apply(config).unwrap();
        let mut a_bufs: std::collections::VecDeque<u64> = a.give_rx_buffers(8).into();
        let mut b_bufs: std::collections::VecDeque<u64> = b.give_rx_buffers(64).into();
        // vm-b and r0 speak first: the switch knows where they are.
        b.send(&frames::udp4(mac(1), mac(2), ip(2), ip(1), 1, 1, 60));
        h.send("r0", &frames::udp4(mac(1), mac(3), ip(3), ip(1), 1, 1, 60));
        h.step();
        let _ = (h.recv_all(), a.received(&mut a_bufs), b.received(&mut b_bufs));
        h.flush_caches();
        let free = pool.free_count();

        let sizes = [100, 511, 512, 513, 1000, 1514, 2000];
        let to_b: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| frames::udp4(mac(2), mac(1), ip(1), ip(2), 5, n as u16, n))
            .collect();
        let to_r0: Vec<Vec<u8>> = [1514, 4000, 9014]
            .iter()
            .map(|&n| frames::udp4(mac(3), mac(1), ip(1), ip(3), 5, n as u16, n))
            .collect();
        let flooded = frames::udp4(mac(7), mac(1), ip(1), ip(7), 5, 7, 1400);
        let mut posted = Vec::new();
        for f in to_b.iter().chain(&to_r0).chain([&flooded]) {
            let mut buf = vec![0u8; knitter_vhost::net::HDR_LEN];
            buf.extend_from_slice(f);
            posted.push(a.tx.post(&[knitter_vhost::testkit::Buf::Read(buf)]).0);
        }
        h.step();
        assert_eq!(
            h.stats().total_drops(),
            0,
            "{:?} (single copy {single_copy})",
            h.stats().nonzero_drops()
        );
        let mut want_b = to_b.clone();
        want_b.push(flooded.clone());
        assert_eq!(b.received(&mut b_bufs), want_b, "guest to guest (single copy {single_copy})");
        let mut want_r0 = to_r0.clone();
        want_r0.push(flooded.clone());
        assert_eq!(h.recv("r0"), want_r0, "guest to a ring port (single copy {single_copy})");
        let returned: Vec<u16> = a.tx.completions().iter().map(|c| c.0).collect();
        assert_eq!(returned, posted, "every descriptor back, in ring order");
        h.flush_caches();
        assert_eq!(pool.free_count(), free, "every pool buffer back");
        // 512 bytes and more: 513, 1000, 1514, 2000, three to r0 and the flooded one (the
        // frame of 512 bytes exactly too).
        assert_eq!(a.port.net.lent_frames.get(), if single_copy { 9 } else { 0 });
    }
}

/// A transmit ring the frontend disables while a burst of its frames is lent (QEMU does so
/// when the guest changes its number of queue pairs) gets those descriptors back once it is
/// enabled again, in their places; none is lost.
#[test]
fn descriptors_lent_while_a_ring_is_disabled_come_back_when_it_is_enabled() {
    let pool = Pool::new(256, false).unwrap();
    let mut a = Vm::new("vm-a", &pool, 16);
    a.port.set_single_copy(true);
    let frame = frames::udp4(mac(2), mac(1), ip(1), ip(2), 5, 6, 1000);
    a.send(&frame);
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    assert_eq!(a.port.rx_burst(0, &mut cache, &mut batch), 1);
    assert!(cache.lending(), "a 1,000-byte frame is lent");
    let park = |on: bool| {
        a.port.configure(|d| {
            let p = d.pair_of(1).unwrap();
            if on {
                p.parked[1] = p.queues[1].take();
            } else {
                p.queues[1] = p.parked[1].take();
            }
        })
    };
    park(true); // SET_VRING_ENABLE 0 on the transmit ring
    for b in batch.drain() {
        cache.free(b);
    }
    cache.end_lending();
    a.port.rx_done(0);
    assert_eq!(a.tx.completions(), vec![], "nothing returned to a disabled ring");
    park(false); // enabled again, as itself
    a.send(&frame[..60]);
    assert_eq!(a.port.rx_burst(0, &mut cache, &mut batch), 1);
    assert_eq!(a.tx.completions(), vec![(0, 0), (1, 0)], "the lent one first, in its place");
    for b in batch.drain() {
        cache.free(b);
    }
}

/// The frontend goes while descriptors lent from a disabled ring wait for it: they are
/// forgotten with the memory table they kept mapped (nothing of a gone frontend stays mapped).
#[test]
fn descriptors_lent_while_a_ring_is_disabled_go_with_their_frontend() {
    let pool = Pool::new(256, false).unwrap();
    let mut a = Vm::new("vm-a", &pool, 16);
    a.port.set_single_copy(true);
    a.send(&frames::udp4(mac(2), mac(1), ip(1), ip(2), 5, 6, 1000));
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    assert_eq!(a.port.rx_burst(0, &mut cache, &mut batch), 1);
    a.port.configure(|d| {
        let p = d.pair_of(1).unwrap();
        p.parked[1] = p.queues[1].take();
    });
    for b in batch.drain() {
        cache.free(b);
    }
    cache.end_lending();
    a.port.rx_done(0);
    a.port.configure(|d| {
        d.pair_of(1).unwrap().parked = Default::default();
        d.set_memory(None);
        d.forget_frontend();
    });
    // Only the simulated guest's two queues hold its memory now.
    assert_eq!(std::sync::Arc::strong_count(&a.rx.mem), 2, "the lent table is let go");
}

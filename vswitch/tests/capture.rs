//! Packet capture: a captured port's received frames are copied as they arrived (those the
//! switch dropped say why) and its sent frames as they left; a filter and a count bound a
//! capture; other ports' frames are not copied; the cache's path is captured like the slow
//! path; a second capture is refused while one runs; a capture ends with its port.

use std::net::Ipv4Addr;
use std::sync::Arc;
use vswitch::bpf::Program;
use vswitch::capture::{Direction, Request, Session};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::counters::{DropReason, Event};
use vswitch::testkit::{Harness, frames, mac};

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, n)
}

/// `red`: pod port p1 (mac(1), 10.1.0.1, port security), access ports a2 and a3.
fn setup() -> Harness {
    let mut h = Harness::new();
    h.ring("p1").ring("a2").ring("a3");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::pod("p1", "red", mac(1), &[ip(1).into()]),
            PortConfig::access("a2", "red"),
            PortConfig::access("a3", "red"),
        ],
        vtep: None,
    })
    .unwrap();
    h
}

fn capture(
    h: &Harness,
    port: &str,
    rx: bool,
    tx: bool,
    count: u64,
    filter: Option<Program>,
) -> Arc<Session> {
    let port = h.switch.snapshot().port_id(port).unwrap();
    h.switch.capture().start(Request { port, rx, tx, count, snaplen: 0, filter }).unwrap()
}

/// (direction, drop reason, bytes, original length) of every frame captured so far.
fn taken(s: &Session) -> Vec<(Direction, Option<DropReason>, Vec<u8>, u32)> {
    std::iter::from_fn(|| s.next(|f| (f.dir, f.reason, f.bytes().to_vec(), f.orig_len))).collect()
}

fn udp(dst: u32, src: u32, sip: Ipv4Addr, dip: Ipv4Addr, dport: u16) -> Vec<u8> {
    frames::udp4(mac(dst), mac(src), sip, dip, 1000, dport, 100)
}

#[test]
fn a_captured_port_shows_what_it_received_and_sent_and_why_a_frame_was_dropped() {
    let mut h = setup();
    let s = capture(&h, "p1", true, true, 0, None);
    let good = udp(2, 1, ip(1), ip(2), 2000);
    let spoofed = udp(2, 1, ip(66), ip(2), 2000);
    h.send("p1", &good);
    h.send("p1", &spoofed);
    h.step();
    assert_eq!(h.recv("a2").len(), 1, "the captured frame is forwarded as usual");
    let reply = udp(1, 2, ip(2), ip(1), 1000);
    h.send("a2", &reply);
    h.send("a3", &udp(2, 3, ip(3), ip(2), 1000));
    h.step();
    assert_eq!(h.recv("p1"), vec![reply.clone()]);
    let got = taken(&s);
    assert_eq!(
        got,
        vec![
            (Direction::Rx, None, good.clone(), good.len() as u32),
            (Direction::Rx, Some(DropReason::SecurityIp), spoofed.clone(), spoofed.len() as u32),
            (Direction::Tx, None, reply.clone(), reply.len() as u32),
        ],
        "a3's frame to a2 is not p1's"
    );
    h.switch.capture().stop(&s);
    h.send("p1", &good);
    h.step();
    assert!(taken(&s).is_empty(), "a stopped capture copies nothing");
}

#[test]
fn frames_the_cache_forwards_are_captured_too() {
    let mut h = setup();
    // Learn both ends, then the same flow again: the cache's hits.
    h.send("a2", &udp(1, 2, ip(2), ip(1), 1000));
    h.step();
    for _ in 0..3 {
        h.send("p1", &udp(2, 1, ip(1), ip(2), 2000));
        h.step();
    }
    let hits = h.stats().event(Event::CacheHits);
    let s = capture(&h, "p1", true, false, 0, None);
    for _ in 0..4 {
        h.send("p1", &udp(2, 1, ip(1), ip(2), 2000));
    }
    h.step();
    assert_eq!(h.recv("a2").len(), 4 + 3);
    let got = taken(&s);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|(d, r, ..)| *d == Direction::Rx && r.is_none()));
    assert_eq!(h.stats().event(Event::CacheHits) - hits, 4, "the cache forwarded them");
}

#[test]
fn a_filter_and_a_count_bound_a_capture_and_one_runs_at_a_time() {
    let mut h = setup();
    let filter = Program::new(vswitch::testkit::UDP_53.to_vec()).unwrap();
    let s = capture(&h, "a2", true, false, 2, Some(filter));
    let p1 = h.switch.snapshot().port_id("p1").unwrap();
    assert!(
        h.switch
            .capture()
            .start(Request { port: p1, rx: true, tx: false, count: 0, snaplen: 0, filter: None })
            .is_err(),
        "one capture at a time"
    );
    for dport in [53, 80, 53, 53] {
        h.send("a2", &udp(1, 2, ip(2), ip(1), dport));
    }
    h.step();
    let got = taken(&s);
    assert_eq!(got.len(), 2, "two DNS frames of three, none of the other");
    assert!(got.iter().all(|(_, _, f, _)| f[36..38] == 53u16.to_be_bytes()));
    assert!(s.complete());
    h.switch.capture().stop(&s);
}

#[test]
fn a_capture_ends_when_its_port_goes() {
    let mut h = setup();
    let s = capture(&h, "a3", true, true, 0, None);
    // a3 goes; the next port added may take its id: nothing of it reaches a3's capture.
    h.ring("a4");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::pod("p1", "red", mac(1), &[ip(1).into()]),
            PortConfig::access("a2", "red"),
            PortConfig::access("a4", "red"),
        ],
        vtep: None,
    })
    .unwrap();
    assert!(s.port_gone());
    assert_eq!(h.switch.capture().running(), None);
    h.send("a4", &udp(2, 4, ip(4), ip(2), 1000));
    h.step();
    assert!(taken(&s).is_empty());
}

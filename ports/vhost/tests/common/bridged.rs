//! A switch with vhost-user ports and a ring port in one bridge domain, stepped by the test,
//! and one frame each way between a frontend's guest and the ring port: what the vhost-user
//! tests and the hostile-frontend tests share (`#[path]`).
#![allow(dead_code)] // each test binary uses its own part

use crate::frontend::Vm;
use knitter_vhost::net::HDR_LEN;
use knitter_vhost::port::VhostPort;
use knitter_vhost::testkit::Buf;
use std::sync::Arc;
use std::time::Duration;
use vswitch::port::Port;
use vswitch::testkit::{self, Harness, frames, mac};
use vswitch::{Pool, SwitchOptions};

pub fn wait_for(what: &str, ok: impl FnMut() -> bool) {
    assert!(testkit::eventually(Duration::from_secs(5), ok), "timed out waiting for {what}");
}

/// A switch (harness) with vhost-user ports `names` and the ring port "r0" in one bridge
/// domain.
pub fn bridged(names: &[&str]) -> (Harness, Vec<Arc<VhostPort>>) {
    let pool = Pool::new(4096, false).unwrap();
    let ports: Vec<Arc<VhostPort>> =
        names.iter().map(|n| Arc::new(VhostPort::new(n, pool.clone()))).collect();
    let mut h = Harness::with_pool(pool, SwitchOptions::default());
    h.ring("r0");
    for (n, p) in names.iter().zip(&ports) {
        h.register(n, p.clone());
    }
    let all: Vec<&str> = names.iter().copied().chain(["r0"]).collect();
    h.apply(testkit::one_bridge(&all)).unwrap();
    (h, ports)
}

/// A scratch directory for one test's sockets (removed at its end).
pub fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("knitter-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One frame each way between the guest and the ring port "r0".
pub fn exchange(h: &mut Harness, port: &VhostPort, vm: &mut Vm, round: usize) {
    wait_for("the rings to run", || port.link_up());
    let ip = |n| std::net::Ipv4Addr::new(192, 0, 2, n);
    let out = frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 100 + round);
    let mut b = vec![0u8; HDR_LEN];
    b.extend_from_slice(&out);
    vm.tx.post(&[Buf::Read(b)]);
    let rx_buf = vm.rx.post(&[Buf::Write(2048)]).1[0];
    h.step();
    assert_eq!(h.recv("r0"), vec![out], "guest → switch → ring port (round {round})");
    let back = frames::udp4(mac(1), mac(9), ip(9), ip(1), 2, 1, 200);
    h.send("r0", &back);
    h.step();
    assert_eq!(vm.rx.completions().len(), 1, "ring port → switch → guest (round {round})");
    assert_eq!(vm.rx.read(rx_buf + HDR_LEN as u64, back.len()), back);
    assert_eq!(vm.tx.completions().len(), 1);
}

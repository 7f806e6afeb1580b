//! Instructions and TSC cycles per packet of the vhost data path, guest to guest through one
//! switch (L2 known unicast, cache warm): the port's receive burst (pop the guest's transmit
//! chains, copy into pool packets), the pipeline, and its transmit burst (copy into the
//! other guest's receive chains). The simulated guests' own work is outside the measure:
//!
//!     cargo build --release -p knitter-vhost --example vhost_insn
//!     valgrind --tool=callgrind --toggle-collect='*measured_poll*' \
//!         target/release/examples/vhost_insn 64 64000
//!
//! Arguments: frame size (bytes), packets, then `mrg` to negotiate mergeable receive buffers
//! (as DPDK's virtio-user and Linux do by default) and `packed` for packed rings with
//! `IN_ORDER` (virtio-user's `packed_vq=1`).

use knitter_vhost::net::HDR_LEN;
use knitter_vhost::testkit::{Buf, Vm};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::testkit::{frames, mac};
use vswitch::{Batch, Pool, Switch, SwitchOptions};

/// One burst through the switch: what is measured.
#[inline(never)]
fn measured_poll(
    pipe: &mut vswitch::pipeline::Pipeline,
    snap: &vswitch::snapshot::Snapshot,
    port: u16,
    batch: &mut Batch,
) -> usize {
    pipe.poll(snap, port, 0, batch)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let packets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64_000);
    let flags: Vec<String> = args.collect();
    let mrg = flags.iter().any(|a| a == "mrg");
    let packed = flags.iter().any(|a| a == "packed");
    let pool = Pool::new(8192, true).expect("pool");
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let (mut a, mut b) =
        (Vm::with_layout("vm-a", &pool, 256, packed), Vm::with_layout("vm-b", &pool, 256, packed));
    for vm in [&a, &b] {
        vm.port.configure(|d| d.set_mrg_rxbuf(mrg));
    }
    switch.register_port("vm-a", a.port.clone()).expect("register");
    switch.register_port("vm-b", b.port.clone()).expect("register");
    switch
        .apply(SwitchConfig {
            bridges: vec![BridgeConfig::new("red")],
            ports: vec![PortConfig::access("vm-a", "red"), PortConfig::access("vm-b", "red")],
            vtep: None,
        })
        .expect("config");
    let snap = switch.snapshot();
    let (pa, pb) = (snap.port_id("vm-a").expect("a"), snap.port_id("vm-b").expect("b"));
    let mut pipe = switch.pipeline(0);
    pipe.set_now(1);
    let mut batch = Batch::new();
    let ip = |n| std::net::Ipv4Addr::new(192, 0, 2, n);
    let with_hdr = |f: Vec<u8>| {
        let mut v = vec![0u8; HDR_LEN];
        v.extend_from_slice(&f);
        v
    };
    // Warm-up: both MACs learned, the flow cached.
    b.rx.post(&[Buf::Write(2048)]);
    a.rx.post(&[Buf::Write(2048)]);
    b.tx.post(&[Buf::Read(with_hdr(frames::udp4(mac(1), mac(2), ip(2), ip(1), 2, 1, 60)))]);
    pipe.poll(&snap, pb, 0, &mut batch);
    let frame = with_hdr(frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, size));
    for _ in 0..2 {
        a.tx.post(&[Buf::Read(frame.clone())]);
        b.rx.post(&[Buf::Write(2048)]);
        pipe.poll(&snap, pa, 0, &mut batch);
    }
    a.rx.completions();
    b.rx.completions();
    a.tx.completions();
    let (mut got, mut cycles) = (0usize, 0u64);
    while got < packets {
        for _ in 0..32 {
            a.tx.post(&[Buf::Read(frame.clone())]);
            b.rx.post(&[Buf::Write(2048)]);
        }
        let t0 = vswitch::util::cycles();
        got += measured_poll(&mut pipe, &snap, pa, &mut batch);
        cycles += vswitch::util::cycles() - t0;
        let out = b.rx.completions().len();
        a.tx.completions();
        assert_eq!(out, 32, "every frame reached the other guest");
    }
    let st = switch.stats();
    println!(
        "size={size} packed={packed} mrg={mrg} packets={got} drops={} cache_hits={} tsc_cycles_per_packet={:.1}",
        st.total_drops(),
        st.event(vswitch::Event::CacheHits),
        cycles as f64 / got as f64
    );
}

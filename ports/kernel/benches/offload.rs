//! Criterion benchmarks of the software offloads kernel-backed ports run per frame
//! (`kernel_ports::offload`): the check for a partial checksum every frame from a software
//! device pays on AF_XDP (whole checksums, the common case: nothing to finish), and cutting
//! a 64 KiB super-frame on AF_PACKET (per segment, copies into pool buffers not included).
//!
//!     cargo bench -p knitter-kernel-ports --bench offload

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kernel_ports::offload::{MAX_HEADERS, Segmenter, VnetHdr, finish_checksum, finish_if_partial};
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;
use vswitch::testkit::frames::{self, Outer};
use vswitch::testkit::mac;
use vswitch::wire::checksum::{accumulate, fold};

/// An IPv4/UDP frame of `size` bytes with a whole checksum.
fn udp(size: usize) -> Vec<u8> {
    let mut f = frames::udp4(
        mac(2),
        mac(1),
        Ipv4Addr::new(192, 0, 2, 1),
        Ipv4Addr::new(192, 0, 2, 2),
        1000,
        2000,
        size,
    );
    let pseudo = fold(accumulate(17 + (f.len() - 34) as u64, &f[26..34], &mut false));
    f[40..42].copy_from_slice(&pseudo.to_be_bytes());
    assert!(finish_checksum(&mut f, 34, 6));
    f
}

fn offload(c: &mut Criterion) {
    let mut g = c.benchmark_group("offload");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(1));
    let mut plain = udp(64);
    g.bench_function("partial-check-64B", |b| {
        b.iter(|| black_box(finish_if_partial(black_box(&mut plain), None)))
    });
    let o = Outer {
        dst_mac: mac(9),
        src_mac: mac(8),
        src: Ipv4Addr::new(198, 51, 100, 1).into(),
        dst: Ipv4Addr::new(198, 51, 100, 2).into(),
        sport: 49152,
        dport: 4789,
        vlan: None,
    };
    let mut vxlan = frames::vxlan(&o, 5001, &udp(64), false);
    g.bench_function("partial-check-vxlan-64B", |b| {
        b.iter(|| black_box(finish_if_partial(black_box(&mut vxlan), Some(4789))))
    });
    // A UDP super-frame of 64,000 payload bytes cut into 1,400-byte datagrams.
    let sup = udp(42 + 64_000);
    let h =
        VnetHdr { needs_csum: true, gso_type: 5, gso_size: 1400, csum_start: 34, csum_offset: 6 };
    let n = Segmenter::new(&sup, &h).unwrap().count(&sup) as u64;
    g.throughput(Throughput::Elements(n));
    g.bench_function("cut-64KiB-into-1400B", |b| {
        let mut hdr = [0u8; MAX_HEADERS];
        b.iter(|| {
            let mut s = Segmenter::new(&sup, &h).unwrap();
            while let Some(seg) = s.next(&sup, &mut hdr) {
                black_box(seg);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, offload);
criterion_main!(benches);

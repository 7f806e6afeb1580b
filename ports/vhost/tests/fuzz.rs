//! The fuzz targets' harnesses (`knitter_vhost::testkit::fuzz`, run for longer by
//! `ports/vhost/fuzz`) on random inputs: whatever a frontend sends — messages and descriptors,
//! rings and memory — the backend neither panics, hangs nor leaks a buffer.

use knitter_vhost::testkit::fuzz;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_messages_with_any_descriptors(data in proptest::collection::vec(any::<u8>(), 0..1500)) {
        fuzz::messages(&data);
    }

    #[test]
    fn any_rings_over_any_memory(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        fuzz::virtqueue(&data);
    }
}

/// A negotiation, then ring messages the fuzzer would take a while to find: rings set up in
/// the memory table, kicks and calls of every kind, the ring enabled, then the frontend gone.
#[test]
fn a_negotiated_connection_with_rings() {
    let mut data = vec![1u8];
    data.extend(std::iter::repeat_n(0u8, 256));
    let rec = |flags: u8, request: u8, body: &[u8]| {
        let mut r = vec![flags];
        r.extend(std::iter::repeat_n(1u8, (flags & 3) as usize)); // eventfds
        r.push(request);
        r.extend_from_slice(&(body.len() as u16).to_le_bytes());
        r.extend_from_slice(body);
        r
    };
    let vring = |i: u32, v: u32| [i.to_le_bytes(), v.to_le_bytes()].concat();
    let mut addr = vec![0u8; 40];
    addr[8..16].copy_from_slice(&0x7000_0000_0000u64.to_le_bytes());
    addr[16..24].copy_from_slice(&0x7000_0000_2000u64.to_le_bytes());
    addr[24..32].copy_from_slice(&0x7000_0000_1000u64.to_le_bytes());
    for i in 0..2u32 {
        data.extend(rec(0, 8, &vring(i, 64))); // SET_VRING_NUM
        addr[..4].copy_from_slice(&i.to_le_bytes());
        data.extend(rec(0, 9, &addr)); // SET_VRING_ADDR
        data.extend(rec(0, 10, &vring(i, 0))); // SET_VRING_BASE
        data.extend(rec(1, 12, &(i as u64).to_le_bytes())); // SET_VRING_KICK
        data.extend(rec(1, 13, &(i as u64).to_le_bytes())); // SET_VRING_CALL
        data.extend(rec(16, 18, &[vring(i, 1), vec![]].concat())); // SET_VRING_ENABLE
    }
    fuzz::messages(&data);
}

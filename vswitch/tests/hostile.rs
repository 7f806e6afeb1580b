//! Hostile input on every port kind: random bytes, random mutations of valid frames (tagged,
//! ARP, ND, VXLAN). The switch never panics, counts what it drops, and never loses a buffer,
//! whichever dispatcher runs its nodes.

use proptest::prelude::*;
use vswitch::testkit::fuzz;
use vswitch::testkit::fuzz::record;

fn dispatch(per_node: bool) -> vswitch::Dispatch {
    if per_node { vswitch::Dispatch::PerNode } else { vswitch::Dispatch::Fused }
}

fn valid_frames() -> Vec<Vec<u8>> {
    fuzz::samples().into_iter().map(|(_, _, f)| f).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_or_leak(data in proptest::collection::vec(any::<u8>(), 0..4000), per_node in any::<bool>()) {
        let mut h = fuzz::harness_with(dispatch(per_node));
        fuzz::run(&mut h, &data);
    }

    #[test]
    fn mutated_valid_frames_never_panic_or_leak(
        picks in proptest::collection::vec((0..7usize, 0..5u8, proptest::collection::vec((any::<u16>(), any::<u8>()), 0..6), any::<u16>()), 1..12),
        per_node in any::<bool>(),
    ) {
        let valid = valid_frames();
        let mut data = Vec::new();
        for (which, port, flips, cut) in picks {
            let which = which % valid.len();
            let mut f = valid[which].clone();
            for (at, val) in flips {
                let i = at as usize % f.len();
                f[i] = val;
            }
            let keep = (cut as usize % (f.len() + 1)).max(f.len() / 2);
            f.truncate(keep);
            data.extend(record(port, &f));
        }
        let mut h = fuzz::harness_with(dispatch(per_node));
        fuzz::run(&mut h, &data);
    }
}

#[test]
fn unmutated_valid_frames_are_forwarded() {
    let mut h = fuzz::harness();
    let mut data = Vec::new();
    for (_, port, f) in fuzz::samples() {
        data.extend(record(port, &f));
    }
    fuzz::run(&mut h, &data);
    let s = h.stats();
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    assert_eq!(s.event(vswitch::Event::Decapsulated), 2);
}

/// Ports may hand over chains segmented anywhere (a guest's descriptors); frames whose head
/// segment cannot hold the L2 header are refused, every other segmentation forwards the same
/// bytes.
#[test]
fn any_segmentation_is_safe_and_byte_exact() {
    for (name, port, f) in fuzz::samples() {
        for cut in [1usize, 11, 12, 13, 14, 15, 17, 18, 19, 49, 50, 51, 63, 64, 65] {
            for second in [1usize, 7, 64] {
                let mut h = fuzz::harness();
                let mut whole = fuzz::harness();
                let p = fuzz::PORTS[port as usize];
                h.send_chain(p, &f, &[cut, second]);
                whole.send(p, &f);
                h.step();
                whole.step();
                let (got, want) = (h.recv_all(), whole.recv_all());
                // A short head may be refused; whatever is forwarded equals the unsegmented result.
                for (port_name, frames) in &got {
                    if !frames.is_empty() {
                        assert_eq!(
                            frames, &want[port_name],
                            "{name} cut at {cut}/{second} on {port_name}"
                        );
                    }
                }
                h.flush_caches();
                whole.flush_caches();
                assert_eq!(
                    h.pool.free_count(),
                    h.pool.capacity() as usize,
                    "{name}: leak at {cut}/{second}"
                );
            }
        }
    }
}

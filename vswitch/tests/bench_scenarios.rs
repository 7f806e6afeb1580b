//! The benchmark workloads (`testkit::bench`, what `ci/insn-count.sh` and the criterion
//! bench measure) forward what they claim: every frame out (eight copies for the flood),
//! none dropped, and the cache hit rates the docs report for them. A workload that quietly
//! stopped forwarding would make its instruction count look better.

use vswitch::Event;
use vswitch::testkit::bench::{Bench, Scenario};

#[test]
fn every_benchmark_scenario_forwards_every_frame() {
    for s in Scenario::ALL {
        let mut b = Bench::new(s);
        let hits = b.stats().event(Event::CacheHits);
        let (mut got, mut out) = (0, 0);
        for _ in 0..64 {
            b.inject();
            got += b.poll();
            out += b.drain();
        }
        let copies = if s == Scenario::Flood8 { 8 } else { 1 };
        assert_eq!((got, out), (64 * 32, 64 * 32 * copies), "{}", s.name());
        assert_eq!(b.stats().total_drops(), 0, "{}: {:?}", s.name(), b.stats().nonzero_drops());
        let hit_rate = (b.stats().event(Event::CacheHits) - hits) as f64 / got as f64;
        let floor = match s {
            Scenario::Flood8 => 0.0,
            Scenario::L2 { macs: 100_000 } | Scenario::L2Both { .. } => 0.5,
            _ => 0.99,
        };
        assert!(hit_rate >= floor, "{}: cache hits {hit_rate:.3}", s.name());
    }
}

/// Random MACs crowd some of the exact-match cache's sets; with a table of 32 Ki entries
/// (16 Ki sets) for 20,000 flows, two ways a set could keep at most ~86 % of them, and the
/// sets' pairs (four ways on adjacent lines) keep more: from local ports and, once the table
/// is spread, decapsulated frames too. Every frame is still forwarded and none dropped.
#[test]
fn crowded_sets_keep_their_flows_in_their_pairs() {
    let opts = vswitch::SwitchOptions { emc_entries: 32 * 1024, ..Default::default() };
    for s in [
        Scenario::L2Both { macs: 20_000, random: true },
        Scenario::VxlanDecapRandom { macs: 20_000 },
    ] {
        let mut b = Bench::with_options(s, opts);
        let hits = b.stats().event(Event::CacheHits);
        let (mut got, mut out) = (0, 0);
        let bursts = 2 * 20_000 / 32;
        for _ in 0..bursts {
            b.inject();
            got += b.poll();
            out += b.drain();
        }
        assert_eq!((got, out), (bursts * 32, bursts * 32), "{}", s.name());
        assert_eq!(b.stats().total_drops(), 0, "{}: {:?}", s.name(), b.stats().nonzero_drops());
        let hit_rate = (b.stats().event(Event::CacheHits) - hits) as f64 / got as f64;
        eprintln!("{}: cache hits {hit_rate:.3}", s.name());
        assert!(hit_rate >= 0.88, "{}: cache hits {hit_rate:.3}", s.name());
    }
}

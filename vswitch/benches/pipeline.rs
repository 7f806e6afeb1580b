//! Criterion benchmarks of the pipeline over ring ports, one core, 64-byte frames.
//! Only `Bench::poll` (rx burst + pipeline + tx burst) is timed; generating and sinking the
//! frames is not. Throughput is per input packet.
//!
//!     cargo bench -p knitter-vswitch --bench pipeline

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::time::{Duration, Instant};
use vswitch::testkit::bench::{Bench, Scenario};

fn pipeline(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(32));
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    for s in Scenario::ALL {
        let mut b = Bench::new(s);
        g.bench_function(s.name(), |bencher| {
            bencher.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    b.inject();
                    let t = Instant::now();
                    std::hint::black_box(b.poll());
                    spent += t.elapsed();
                    b.drain();
                }
                spent
            })
        });
        let st = b.stats();
        assert_eq!(st.total_drops(), 0, "{}: {:?}", s.name(), st.nonzero_drops());
    }
    g.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);

//! Runs one benchmark scenario for a fixed number of packets, for instruction counting:
//!
//!     cargo build --release -p knitter-vswitch --example pipeline_insn
//!     valgrind --tool=callgrind --toggle-collect='*Bench*poll*' \
//!         target/release/examples/pipeline_insn l2-1k 320000 [--no-cache] [--per-node]
//!
//! callgrind then counts only the instructions of `Bench::poll` (rx burst, pipeline, tx
//! burst); divide by the packets printed. `ci/insn-count.sh` does all of that per scenario.

use vswitch::testkit::bench::{Bench, Scenario};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "l2-1k".into());
    let Some(s) = Scenario::parse(&name) else {
        let names: Vec<String> = Scenario::ALL.iter().map(|s| s.name()).collect();
        eprintln!("unknown scenario {name:?}; one of: {}", names.join(", "));
        std::process::exit(2);
    };
    let packets: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(320_000);
    // `--no-cache`: the slow path alone (stages 1-2 for every frame); `--emc-entries N`: a
    // cache of N entries (2: every flow of a 1k workload misses, and the cost of a miss
    // shows); `--megaflow-entries N`: each half of the second level (0: none).
    // `--per-node`: the per-node dispatcher (what fusing saves shows against the default).
    // `--capture`: a packet capture of every frame the input port receives (what copying
    // costs the PMD thread; the copies are drained outside the counted burst).
    let mut opts = vswitch::SwitchOptions::default();
    let mut capture = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-cache" => (opts.emc_entries, opts.megaflow_entries) = (0, 0),
            "--emc-entries" => {
                opts.emc_entries = args.next().and_then(|n| n.parse().ok()).unwrap_or(2)
            }
            "--megaflow-entries" => {
                opts.megaflow_entries = args.next().and_then(|n| n.parse().ok()).unwrap_or(0)
            }
            "--per-node" => opts.dispatch = vswitch::Dispatch::PerNode,
            "--capture" => capture = true,
            other => {
                eprintln!(
                    "unknown option {other:?}: --no-cache, --emc-entries N, --megaflow-entries N, --per-node, --capture"
                );
                std::process::exit(2);
            }
        }
    }
    let mut b = Bench::with_options(s, opts);
    let session = capture.then(|| {
        let r = vswitch::capture::Request {
            port: b.in_port(),
            rx: true,
            tx: false,
            count: 0,
            snaplen: 0,
            filter: None,
        };
        b.switch.capture().start(r).expect("capture")
    });
    let mut captured = 0;
    let mut got = 0;
    let mut out = 0;
    let mut cycles = 0u64;
    let mut best = u64::MAX;
    let megaflow_before = b.stats().event(vswitch::Event::MegaflowHits);
    let hits_before = b.stats().event(vswitch::Event::CacheHits);
    for _ in 0..packets / 32 {
        b.inject();
        let t0 = vswitch::util::cycles();
        let n = b.poll();
        let dt = vswitch::util::cycles() - t0;
        cycles += dt;
        best = best.min(dt);
        got += n;
        out += b.drain();
        if let Some(c) = &session {
            while c.next(|_| ()).is_some() {
                captured += 1;
            }
        }
    }
    if let Some(c) = &session
        && (captured != got || c.lost() > 0)
    {
        eprintln!("captured {captured} of {got} frames, {} lost", c.lost());
        std::process::exit(1);
    }
    let st = b.stats();
    let hits = st.event(vswitch::Event::CacheHits) - hits_before;
    let megaflow_hits = st.event(vswitch::Event::MegaflowHits) - megaflow_before;
    println!(
        "scenario={} packets={got} out={out} drops={} cache_hits={:.1}% megaflow_hits={:.1}% tsc_cycles_per_packet={:.1} best_burst={:.1}",
        s.name(),
        st.total_drops(),
        100.0 * hits as f64 / got.max(1) as f64,
        100.0 * megaflow_hits as f64 / got.max(1) as f64,
        cycles as f64 / got.max(1) as f64,
        best as f64 / 32.0
    );
    // A benchmark that stopped forwarding would count fewer instructions: refuse it.
    let copies = if s == Scenario::Flood8 { 8 } else { 1 };
    if out != got * copies {
        eprintln!("expected {} frames out, got {out}", got * copies);
        std::process::exit(1);
    }
    if st.total_drops() > 0 {
        eprintln!("drops: {:?}", st.nonzero_drops());
        std::process::exit(1);
    }
}

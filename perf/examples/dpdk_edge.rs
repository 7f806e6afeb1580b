//! The dpdk port's edge alone, for diagnosis: a burst of frames sent out of a `net_ring`
//! loopback port and received back, over and over, on one thread; TSC cycles a frame (one
//! transmit and one receive) with the switch's buffers shared (zero copy) and copied.
//!
//!     cargo run --release -p knitter-perf --example dpdk_edge -- [frame bytes, 60] [bursts, 2000000] [zero|copy|both]

use std::sync::Arc;
use vswitch::port::Port;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    let bursts: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2_000_000);
    let modes: Vec<bool> = match args.next().as_deref() {
        None | Some("both") => vec![false, true, false, true],
        Some("zero") => vec![false],
        Some("copy") => vec![true],
        Some(other) => return Err(format!("zero, copy or both, not {other:?}").into()),
    };
    // EDGE_PLAIN=1: plain pages for DPDK and the pool (valgrind cannot map DPDK's hugepage
    // reservations).
    let plain = std::env::var_os("EDGE_PLAIN").is_some();
    let prefix = format!("edge-{}", std::process::id());
    let eal = if plain {
        [
            "knitter",
            "-l",
            "0",
            "--no-telemetry",
            "--no-pci",
            "--no-huge",
            "-m",
            "256",
            "--no-shconf",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--file-prefix".to_string(), prefix])
        .collect()
    } else {
        dpdk::eal::default_args(&prefix, &[])
    };
    dpdk::eal::init(&eal)?;
    let pool = vswitch::Pool::new(16384, !plain)?;
    println!("pool backing: {}", pool.backing());
    let frame = vec![0x5au8; size];
    for (round, copy) in modes.into_iter().enumerate() {
        let devargs = format!("net_ring_e{round}");
        let mut opts = dpdk::PortOptions::for_device(&devargs, 1, pool.clone());
        if copy {
            opts.zero_copy = None;
        }
        let port: Arc<dpdk::DpdkPort> = dpdk::DpdkPort::open("e", &devargs, &opts)?;
        let mut cache = vswitch::PoolCache::new(pool.clone());
        let mut batch = vswitch::Batch::new();
        for _ in 0..32 {
            let b = cache.alloc_frame(&frame).ok_or("pool")?;
            batch.push(b).map_err(|_| "batch")?;
        }
        let mut run = |n: u64| -> Result<u64, Box<dyn std::error::Error>> {
            // SAFETY: reading the TSC.
            let t = unsafe { core::arch::x86_64::_rdtsc() };
            for _ in 0..n {
                if port.tx_burst(0, &mut cache, &mut batch) != 32
                    || port.rx_burst(0, &mut cache, &mut batch) != 32
                {
                    return Err("the loopback lost frames".into());
                }
            }
            // SAFETY: as above.
            Ok(unsafe { core::arch::x86_64::_rdtsc() } - t)
        };
        run(bursts / 10)?;
        let cycles = run(bursts)?;
        println!(
            "{:>5} B {:>5}: {:>7.1} cycles a frame (out and back in)",
            size,
            if copy { "copy" } else { "zero" },
            cycles as f64 / (bursts * 32) as f64
        );
        for i in 0..batch.len() {
            cache.free(batch.take(i));
        }
        let n = batch.len();
        batch.handed_on(n);
    }
    Ok(())
}

//! How much CPU this VM really gives: a thread pinned to a CPU spins reading the clock and
//! counts the gaps longer than 10 µs (time it was not running). `steal` in /proc/stat does
//! not show the host taking the vCPU away here; this does. A trial taken while the supply
//! was low is repeated.
//!
//! And where the host put the two vCPUs: a cache line passed back and forth between the
//! generator's CPU and the switch's ([`round_trip`]). Here it takes ~50 ns a round trip for
//! minutes, then ~330 ns for minutes (the host moved the vCPUs apart: another core complex),
//! and every vhost-user switch's rate and the VNF's cycles a packet move with it (~2×), since
//! both sides pass every frame's lines between the two cores. A trial is compared only with
//! trials in the same placement (`mrr.rs`).
//!
//! And how fast each vCPU runs while it runs ([`speed`]): a chain of dependent multiplies
//! (the core's own speed: slower when the host runs something on its other hyperthread or
//! lowers its clock) and a chain of dependent loads over more memory than any cache holds
//! (the memory's latency: slower when the host's other tenants load it). A trial at half its
//! usual rate with the CPUs near is looked for there.

use serde::Serialize;
use std::time::{Duration, Instant};

/// Gaps longer than this are time the thread did not run.
const GAP: Duration = Duration::from_micros(10);

#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Supply {
    pub cpu: usize,
    /// The fraction of the probe's time the thread ran (0..=1).
    pub fraction: f64,
    pub longest_gap_us: f64,
}

/// Spins on `cpu` for `dur`; the fraction of that time it got.
pub fn probe(cpu: usize, dur: Duration) -> std::io::Result<Supply> {
    std::thread::scope(|s| {
        s.spawn(|| {
            pin(cpu)?;
            let start = Instant::now();
            let (mut last, mut lost, mut longest) = (start, Duration::ZERO, Duration::ZERO);
            loop {
                let now = Instant::now();
                let d = now - last;
                if d > GAP {
                    lost += d;
                    longest = longest.max(d);
                }
                last = now;
                if now - start >= dur {
                    break;
                }
            }
            let total = last - start;
            Ok(Supply {
                cpu,
                fraction: 1.0 - lost.as_secs_f64() / total.as_secs_f64().max(1e-9),
                longest_gap_us: longest.as_secs_f64() * 1e6,
            })
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the probe thread panicked")))
    })
}

/// Nanoseconds a cache line takes to go from CPU `a` to CPU `b` and back, the mean over
/// `dur` of round trips (two threads pinned, one atomic on a line of its own).
pub fn round_trip(a: usize, b: usize, dur: Duration) -> std::io::Result<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
    #[repr(align(128))]
    struct Line(AtomicU64);
    let (line, stop) = (Line(AtomicU64::new(0)), AtomicBool::new(false));
    std::thread::scope(|s| {
        let answer = s.spawn(|| {
            let pinned = pin(b);
            // Answers every odd value with the next even one until told to stop.
            while !stop.load(Relaxed) {
                let v = line.0.load(Acquire);
                if v & 1 == 1 {
                    line.0.store(v + 1, Release);
                }
                std::hint::spin_loop();
            }
            pinned
        });
        let ask = s.spawn(|| -> std::io::Result<f64> {
            let pinned = pin(a);
            let start = Instant::now();
            let mut trips = 0u64;
            // Bounded even if the other side never answers (its CPU taken away for good);
            // only answered trips count, and none answered reads as the whole wait.
            'probe: while pinned.is_ok() && start.elapsed() < dur {
                for _ in 0..256 {
                    let v = line.0.load(Relaxed) + 1;
                    line.0.store(v, Release);
                    while line.0.load(Acquire) == v {
                        if start.elapsed() > dur * 4 {
                            break 'probe;
                        }
                        std::hint::spin_loop();
                    }
                    trips += 1;
                }
            }
            pinned?;
            Ok(start.elapsed().as_secs_f64() * 1e9 / trips.max(1) as f64)
        });
        let ns = ask.join().unwrap_or_else(|_| Err(std::io::Error::other("the probe panicked")));
        stop.store(true, Relaxed);
        answer.join().unwrap_or_else(|_| Err(std::io::Error::other("the probe panicked")))?;
        ns
    })
}

/// How fast a CPU ran a fixed piece of work ([`speed`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Speed {
    pub cpu: usize,
    /// Nanoseconds a dependent 64-bit multiply-add took (with `black_box`'s store and
    /// reload: a relative measure, compared across trials, not a multiply's latency).
    pub alu_ns: f64,
    /// Nanoseconds a dependent load from a random line of [`CHASE_BYTES`] took.
    pub memory_ns: f64,
}

/// The memory [`speed`]'s loads chase through: more than the host's last-level cache.
pub const CHASE_BYTES: usize = 64 << 20;

/// A random cycle through [`CHASE_BYTES`] of lines: each line's first word is the index of
/// the next line's (made once, on first use: ~0.3 s).
fn chase() -> &'static [u64] {
    static CHASE: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    CHASE.get_or_init(|| {
        const WORDS: usize = 8; // a 64-byte line
        let lines = CHASE_BYTES / 64;
        let mut order: Vec<usize> = (0..lines).collect();
        // Sattolo's shuffle (one cycle through every line), from a fixed xorshift.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..lines).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % i as u64) as usize);
        }
        let mut v = vec![0u64; lines * WORDS];
        for (i, &next) in order.iter().enumerate() {
            v[i * WORDS] = (next * WORDS) as u64;
        }
        v
    })
}

/// Runs [`Speed`]'s two chains on `cpu` for about `dur` each.
pub fn speed(cpu: usize, dur: Duration) -> std::io::Result<Speed> {
    let mem = chase();
    std::thread::scope(|s| {
        s.spawn(|| {
            pin(cpu)?;
            let (mut x, mut ops, start) = (1u64, 0u64, Instant::now());
            while start.elapsed() < dur {
                for _ in 0..4096 {
                    x = std::hint::black_box(x.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(1));
                }
                ops += 4096;
            }
            let alu_ns = start.elapsed().as_secs_f64() * 1e9 / ops as f64;
            let (mut at, mut loads, start) = (0usize, 0u64, Instant::now());
            while start.elapsed() < dur {
                for _ in 0..1024 {
                    at = std::hint::black_box(mem[at] as usize);
                }
                loads += 1024;
            }
            let memory_ns = start.elapsed().as_secs_f64() * 1e9 / loads as f64;
            Ok(Speed { cpu, alu_ns, memory_ns })
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the speed probe panicked")))
    })
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it for
    // cpu < CPU_SETSIZE, checked first.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is out of range")));
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_speed_probe_times_both_chains() {
        // Both chains timed, nothing about how fast: CI runs this beside other tests on the
        // same two cores, where a preempted chain took 100 ns a multiply (debug build).
        let s = speed(0, Duration::from_millis(10)).unwrap();
        for ns in [s.alu_ns, s.memory_ns] {
            assert!(ns > 0.0 && ns.is_finite(), "{s:?}");
        }
        assert!(speed(100_000, Duration::from_millis(1)).is_err());
    }

    #[test]
    fn a_probe_reports_a_fraction() {
        let s = probe(0, Duration::from_millis(20)).unwrap();
        assert!(s.fraction > 0.0 && s.fraction <= 1.0, "{s:?}");
        assert!(pin(100_000).is_err());
    }

    #[test]
    fn a_round_trip_takes_time_and_ends() {
        let ns = round_trip(0, 1.min(num_cpus() - 1), Duration::from_millis(20)).unwrap();
        assert!(ns > 0.0 && ns < 1e6, "{ns}");
        assert!(round_trip(0, 100_000, Duration::from_millis(5)).is_err());
    }

    fn num_cpus() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

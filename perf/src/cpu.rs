//! How much CPU this VM really gives: a thread pinned to a CPU spins reading the clock and
//! counts the gaps longer than 10 µs (time it was not running). `steal` in /proc/stat does
//! not show the host taking the vCPU away here; this does. A trial taken while the supply
//! was low is repeated.

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
    fn a_probe_reports_a_fraction() {
        let s = probe(0, Duration::from_millis(20)).unwrap();
        assert!(s.fraction > 0.0 && s.fraction <= 1.0, "{s:?}");
        assert!(pin(100_000).is_err());
    }
}

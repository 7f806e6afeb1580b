//! What every generator shares: the trial loop (a set rate through a token bucket, or as
//! fast as the switch takes frames; TSC stamps and ages in an HDR histogram; the
//! generator's own stalls recorded), run on one thread pinned to the generator CPU, over a
//! [`Wire`]: the two ports a generator offers on and counts on — vhost-user frontends
//! ([`crate::vgen`]) or AF_XDP sockets on veths ([`crate::xgen`]).

use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// Descriptors in the rings the switch fills towards the generator (both generators use
/// 1 024): how long a generator stall may last before the switch has to drop.
pub const RING: usize = 1024;
/// Frames offered per burst at most.
pub const BURST: usize = 32;

/// The generator's two ports, worked a burst at a time.
pub trait Wire: Send {
    /// Sends one frame from the counting side, so a learning switch knows where it is.
    fn learn(&mut self);
    /// Frames that can be offered now (free descriptors or buffers).
    fn room(&mut self) -> usize;
    /// Offers up to `k` frames, each stamped with the TSC when `stamp`; how many went.
    fn offer(&mut self, k: usize, stamp: bool) -> usize;
    /// Frames that came out of the counting side: how many and their bytes (no FCS); with
    /// `ages`, their ages recorded.
    fn receive(&mut self, ages: Option<&mut Ages>) -> (u64, u64);
    /// Frames that came back out of the offering side (floods while the switch learns).
    fn drain_stray(&mut self) -> u64;
    /// Completions from the switch that named no descriptor (a switch bug).
    fn bad_completions(&self) -> u64 {
        0
    }
}

/// What one trial gave.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// Frames offered on A and received on B in the trial (those still in flight at its
    /// end were waited for).
    pub sent: u64,
    pub received: u64,
    /// Bytes of the frames received (without the virtio-net header): a check that what
    /// came out is what the scenario expects (VXLAN adds 50 bytes).
    pub received_bytes: u64,
    /// Frames that came back out of A (floods while the switch learns).
    pub stray: u64,
    /// The trial's length (offering).
    pub seconds: f64,
    /// Frame ages on arrival, nanoseconds (latency trials only).
    #[serde(skip)]
    pub latency: Option<Histogram<u64>>,
    /// Completions from the switch that named no descriptor (a switch bug).
    pub bad_completions: u64,
    /// The longest the generator's loop went without running, µs: when the VM took its
    /// CPU away for longer than B's ring lasts at the offered rate, the switch had to drop
    /// and the loss is the machine's, not the switch's.
    pub longest_gap_us: f64,
}

impl Outcome {
    pub fn offered_pps(&self) -> f64 {
        self.sent as f64 / self.seconds.max(1e-9)
    }

    /// Bytes per frame received (no FCS), when any came.
    pub fn frame_bytes(&self) -> Option<f64> {
        (self.received > 0).then(|| self.received_bytes as f64 / self.received as f64)
    }

    pub fn received_pps(&self) -> f64 {
        self.received as f64 / self.seconds.max(1e-9)
    }

    /// Whether the generator stopped running for longer than B's ring lasts at the rate
    /// it offered (so a loss may be the machine's).
    pub fn starved(&self) -> bool {
        let ring_us = RING as f64 / self.offered_pps().max(1.0) * 1e6;
        self.longest_gap_us > ring_us
    }

    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            self.sent.saturating_sub(self.received) as f64 / self.sent as f64
        }
    }
}

/// A generator: its wire and the CPU its thread runs on.
pub struct Generator {
    wire: Box<dyn Wire>,
    cpu: usize,
    tsc_hz: f64,
}

impl Generator {
    pub fn new(wire: Box<dyn Wire>, cpu: usize) -> Generator {
        Generator { wire, cpu, tsc_hz: tsc_hz() }
    }

    /// Offers frames for `dur` at `rate` frames per second (`None`: as fast as the switch
    /// takes them), then waits for the ones in flight. `latency` stamps every frame and
    /// records ages.
    pub fn trial(
        &mut self,
        rate: Option<f64>,
        dur: Duration,
        latency: bool,
    ) -> anyhow::Result<Outcome> {
        let (cpu, tsc_hz) = (self.cpu, self.tsc_hz);
        let wire = &mut *self.wire;
        std::thread::scope(|s| {
            s.spawn(move || {
                crate::cpu::pin(cpu)?;
                Ok(run(wire, tsc_hz, rate, dur, latency))
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the generator thread panicked")))
        })
    }
}

/// Frame ages of one latency trial.
pub struct Ages {
    pub hist: Histogram<u64>,
    /// The trial's start (TSC): a stamp older than this belongs to a frame of an earlier
    /// trial (or to one never stamped) that a switch held on to.
    since: u64,
    ns_per_cycle: f64,
    /// Frames whose stamp was not from this trial.
    pub stale: u64,
}

impl Ages {
    /// Records the age of a frame whose stamp (the TSC when offered, little-endian) is
    /// `stamp`, received at TSC `now`.
    #[inline]
    pub fn record(&mut self, stamp: &[u8], now: u64) {
        match stamp.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes) {
            Some(sent) if (self.since..=now).contains(&sent) => {
                self.hist.saturating_record(((now - sent) as f64 * self.ns_per_cycle) as u64);
            }
            _ => self.stale += 1,
        }
    }
}

fn run(w: &mut dyn Wire, tsc_hz: f64, rate: Option<f64>, dur: Duration, latency: bool) -> Outcome {
    // Frames of an earlier trial still in a switch's queues are not this trial's: they go
    // first (until nothing came for 5 ms), or they would hide this trial's losses.
    let mut quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(5) {
        if w.receive(None).0 + w.drain_stray() > 0 {
            quiet = Instant::now();
        }
        w.room();
    }
    w.learn();
    let per_cycle = rate.map(|r| r / tsc_hz);
    let ns_per_cycle = 1e9 / tsc_hz;
    let (t0, span) = (tsc(), (dur.as_secs_f64() * tsc_hz) as u64);
    // The trial's length comes from the monotonic clock, not from the TSC count over the
    // calibrated rate: a calibration off by a stall would scale every rate of the trial.
    let started = Instant::now();
    let mut ages = latency.then(|| Ages {
        hist: Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .expect("static histogram bounds"),
        since: t0,
        ns_per_cycle,
        stale: 0,
    });
    let (mut sent, mut received, mut stray, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let (mut now, mut gap) = (t0, 0u64);
    let (mut tokens, mut filled) = (0.0f64, t0);
    while now.wrapping_sub(t0) < span {
        let mut k = w.room().min(BURST);
        if let Some(pc) = per_cycle {
            // A token bucket two bursts deep: after a stall (this VM takes its vCPUs away
            // for milliseconds) the generator does not catch up in one flood, which a
            // constant-rate generator on real hardware would never send either.
            tokens = (tokens + now.wrapping_sub(filled) as f64 * pc).min(2.0 * BURST as f64);
            filled = now;
            k = k.min(tokens as usize);
        }
        if k > 0 {
            let n = w.offer(k, latency);
            tokens -= n as f64;
            sent += n as u64;
        }
        let (n, b) = w.receive(ages.as_mut());
        (received, bytes) = (received + n, bytes + b);
        stray += w.drain_stray();
        let t = tsc();
        gap = gap.max(t.wrapping_sub(now));
        now = t;
    }
    let seconds = started.elapsed().as_secs_f64();
    // The frames in flight: wait until B has them all, or nothing came for 20 ms.
    let mut quiet = Instant::now();
    while received < sent && quiet.elapsed() < Duration::from_millis(20) {
        let (n, b) = w.receive(ages.as_mut());
        if n > 0 {
            (received, bytes) = (received + n, bytes + b);
            quiet = Instant::now();
        }
        stray += w.drain_stray();
        w.room();
    }
    if let Some(a) = ages.as_ref().filter(|a| a.stale > 0) {
        tracing::debug!(stale = a.stale, "frames from an earlier trial arrived");
    }
    Outcome {
        sent,
        received,
        received_bytes: bytes,
        stray,
        seconds,
        latency: ages.map(|a| a.hist),
        bad_completions: w.bad_completions(),
        longest_gap_us: gap as f64 * ns_per_cycle / 1e3,
    }
}

/// The TSC (`vswitch::util::cycles`): stamps and the loop's clock.
pub use vswitch::util::cycles as tsc;

/// The TSC's rate (pacing and frame ages), calibrated once per run.
fn tsc_hz() -> f64 {
    vswitch::util::tsc_hz()
}

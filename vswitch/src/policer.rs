//! Ingress policing: a port's frames held to a rate in packets a second and in bits a second,
//! each with a burst, by token buckets; frames over either are dropped and counted (`policed`).
//!
//! Bits count the Ethernet frame as received — headers and payload, a VLAN tag when there is
//! one, not the FCS, preamble or inter-frame gap (20 bytes of L1 overhead a frame are *not*
//! counted), as OVS's ingress policing counts them.
//!
//! A policer is one pair of buckets ([`SharedBucket`]) whatever polls it: a port's policer
//! is the port's, drawn from by every PMD thread that polls one of its receive queues, so the
//! rate configured is the rate that passes however many queues a frontend enables and however
//! its traffic spreads over them (as OVS's `ingress_policing_rate` is per interface). A
//! network's policer on a node is one bucket for all of the network's pod ports. Lock-free: a
//! compare-exchange to refill and a `fetch_update` per kind of token, once a burst when the
//! burst fits; frame by frame in order when it does not.
//!
//! Tokens are fixed-point, a packet or bit being 10⁹ units, so that refilling is one multiply
//! of nanoseconds by the rate (128-bit, once a burst) and admitting a frame two compares and
//! two subtractions, without division.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A port's policer, as configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicerConfig {
    /// Packets a second (0: no limit in packets).
    #[serde(default)]
    pub pps: u64,
    /// Bits a second of frames as received, without L1 overhead (0: no limit in bits).
    #[serde(default)]
    pub bps: u64,
    /// Packets let through back to back above the rate (0: 10 ms of `pps`, at least 64).
    #[serde(default)]
    pub burst_packets: u64,
    /// Bytes let through back to back above the rate (0: 10 ms of `bps`, at least two of the
    /// port's largest frames); less than one largest frame is refused (it could never pass).
    #[serde(default)]
    pub burst_bytes: u64,
}

/// One unit of a packet or a bit, in tokens.
const UNIT: u64 = 1_000_000_000;
/// Bursts are capped so their tokens fit 64 bits: 2^64 / 10⁹ / 8 bytes.
const MAX_BURST_BYTES: u64 = u64::MAX / UNIT / 8;
const MAX_BURST_PACKETS: u64 = u64::MAX / UNIT;

/// A policer's limits with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub pps: u64,
    pub bps: u64,
    pub burst_packets: u64,
    pub burst_bytes: u64,
}

impl PolicerConfig {
    /// The limits this configuration sets on a port whose largest frame is `max_frame`
    /// bytes, or why it is refused.
    pub fn limits(&self, max_frame: u32) -> Result<Limits, String> {
        if self.pps == 0 && self.bps == 0 {
            return Err("a policer needs a rate: pps or bps".into());
        }
        let max_frame = max_frame as u64;
        let burst_packets = match self.burst_packets {
            0 => (self.pps / 100).max(64),
            n => n,
        };
        let burst_bytes = match self.burst_bytes {
            0 => (self.bps / 8 / 100).max(2 * max_frame),
            n if n < max_frame => {
                return Err(format!(
                    "burst_bytes {n} is less than the port's largest frame ({max_frame} bytes), which could never pass"
                ));
            }
            n => n,
        };
        if burst_packets > MAX_BURST_PACKETS || burst_bytes > MAX_BURST_BYTES {
            return Err(format!(
                "a burst of at most {MAX_BURST_PACKETS} packets and {MAX_BURST_BYTES} bytes"
            ));
        }
        Ok(Limits { pps: self.pps, bps: self.bps, burst_packets, burst_bytes })
    }
}

/// A policer's rates and caps, in tokens (a rate of 0 never fills, and then frames cost 0 of
/// that kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rates {
    pps: u64,
    bps: u64,
    packets_cap: u64,
    bits_cap: u64,
    packet_cost: u64,
    byte_cost: u64,
}

impl Rates {
    fn of(limits: &Limits) -> Rates {
        Rates {
            pps: limits.pps,
            bps: limits.bps,
            packets_cap: limits.burst_packets * UNIT,
            bits_cap: limits.burst_bytes * 8 * UNIT,
            packet_cost: if limits.pps > 0 { UNIT } else { 0 },
            byte_cost: if limits.bps > 0 { 8 * UNIT } else { 0 },
        }
    }
}

/// A policer's token buckets, drawn from by every PMD thread that polls one of its ports'
/// queues: its tokens and clock are atomics. Refilling is done by the one thread that moves
/// `last` forward (a compare-exchange); taking is a `fetch_update` per kind of token, with
/// what one kind took beyond the other given back.
#[derive(Debug)]
pub struct SharedBucket {
    rates: Rates,
    /// The clock (nanoseconds) when the tokens were last topped up.
    last: AtomicU64,
    packets: AtomicU64,
    bits: AtomicU64,
}

/// The frames of a burst a policer admitted: bit `i` for the burst's `i`-th frame.
pub type Admitted = u64;

impl SharedBucket {
    /// A full bucket held to `limits`, from `now`.
    pub fn new(limits: &Limits, now: u64) -> SharedBucket {
        let rates = Rates::of(limits);
        SharedBucket {
            last: AtomicU64::new(now),
            packets: AtomicU64::new(rates.packets_cap),
            bits: AtomicU64::new(rates.bits_cap),
            rates,
        }
    }

    /// Whether it holds to `limits` (a new configuration may keep it, tokens and all).
    pub fn holds_to(&self, limits: &Limits) -> bool {
        self.rates == Rates::of(limits)
    }

    /// Adds the tokens earned since the last refill by any thread (once a burst).
    #[inline]
    pub fn refill(&self, now: u64) {
        let last = self.last.load(Relaxed);
        if now <= last || self.last.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
            return; // the clock has not moved, or another thread refilled for this interval
        }
        let dt = (now - last) as u128;
        add_capped(&self.packets, dt * self.rates.pps as u128, self.rates.packets_cap);
        add_capped(&self.bits, dt * self.rates.bps as u128, self.rates.bits_cap);
    }

    /// Takes the tokens of a whole burst of `packets` frames and `bytes` bytes if both
    /// buckets hold enough (a port under its rate: one test a burst).
    #[inline]
    pub fn take_all(&self, packets: u64, bytes: u64) -> bool {
        let (p, b) = (packets * self.rates.packet_cost, bytes * self.rates.byte_cost);
        let take = |a: &AtomicU64, n: u64| {
            n == 0 || a.fetch_update(Relaxed, Relaxed, |t| t.checked_sub(n)).is_ok()
        };
        if !take(&self.packets, p) {
            return false;
        }
        if !take(&self.bits, b) {
            add_capped(&self.packets, p as u128, self.rates.packets_cap);
            return false;
        }
        true
    }

    /// Takes the tokens of the frames of a burst (of `lens` bytes each, at most 64) that both
    /// buckets cover, frame by frame in order: while packets last, each frame whose bits fit
    /// what is left passes (a small frame after a large one that did not fit may pass).
    #[inline]
    pub fn take(&self, lens: &[u32]) -> Admitted {
        debug_assert!(lens.len() <= 64);
        let (pc, bc) = (self.rates.packet_cost, self.rates.byte_cost);
        let n = lens.len() as u64;
        // How many frames the packet tokens pay for (each costs `pc`; none: no limit).
        let mut k = n;
        if pc > 0 {
            let afford = |t: u64| (t / pc).min(n);
            let had = self
                .packets
                .fetch_update(Relaxed, Relaxed, |t| Some(t - afford(t) * pc))
                .unwrap_or_else(|t| t);
            k = afford(had);
        }
        if bc == 0 {
            return first(k);
        }
        // The frames, at most `k`, whose bits fit `t` tokens taken in order, and those bits.
        let pick = |t: u64| {
            let (mut left, mut admitted, mut m) = (t, 0 as Admitted, 0);
            for (i, &len) in lens.iter().enumerate() {
                if m == k {
                    break;
                }
                let c = len as u64 * bc;
                if c <= left {
                    (left, admitted, m) = (left - c, admitted | 1 << i, m + 1);
                }
            }
            (admitted, t - left, m)
        };
        let had =
            self.bits.fetch_update(Relaxed, Relaxed, |t| Some(t - pick(t).1)).unwrap_or_else(|t| t);
        let (admitted, _, m) = pick(had);
        if m < k && pc > 0 {
            add_capped(&self.packets, ((k - m) * pc) as u128, self.rates.packets_cap);
        }
        admitted
    }
}

/// The first `k` (≤ 64) frames of a burst.
#[inline]
pub fn first(k: u64) -> Admitted {
    if k >= 64 { Admitted::MAX } else { (1 << k) - 1 }
}

/// Adds `n` tokens to `a`, up to `cap`.
fn add_capped(a: &AtomicU64, n: u128, cap: u64) {
    let _ = a.fetch_update(Relaxed, Relaxed, |t| Some((t as u128 + n).min(cap as u128) as u64));
}

#[cfg(test)]
mod test {
    use super::*;

    fn limits(pps: u64, bps: u64, burst_packets: u64, burst_bytes: u64) -> Limits {
        PolicerConfig { pps, bps, burst_packets, burst_bytes }.limits(1518).unwrap()
    }

    /// Offers `offered` frames a second of `len` bytes for `secs`, a burst every `tick_ns`;
    /// returns those admitted.
    fn run(b: &SharedBucket, offered: u64, len: u32, secs: u64, tick_ns: u64) -> u64 {
        let per_tick = offered * tick_ns / 1_000_000_000;
        let mut passed = 0;
        let mut now = 0;
        while now < secs * 1_000_000_000 {
            now += tick_ns;
            b.refill(now);
            passed += (0..per_tick).filter(|_| admit(b, len)).count() as u64;
        }
        passed
    }

    /// Offers one frame of `len` bytes; whether it passed.
    fn admit(b: &SharedBucket, len: u32) -> bool {
        b.take(&[len]) == 1
    }

    #[test]
    fn packets_a_second_hold_within_a_percent_whatever_the_burst_size() {
        for tick in [10_000, 100_000, 500_000] {
            let l = limits(100_000, 0, 64, 0);
            let b = SharedBucket::new(&l, 0);
            let passed = run(&b, 1_000_000, 64, 10, tick);
            // The burst's 64 on top of ten seconds of rate.
            assert!(passed.abs_diff(1_000_000 + 64) <= 10_000, "tick {tick} ns: {passed}");
        }
    }

    #[test]
    fn bits_a_second_count_frame_bytes_without_l1_overhead() {
        let l = limits(0, 8_000_000, 0, 0); // 1 MB/s
        let b = SharedBucket::new(&l, 0);
        let passed = run(&b, 10_000, 1000, 10, 100_000);
        // 10 MB in 1 000-byte frames, plus the burst (2 × 1 518 bytes, the default).
        assert!(passed.abs_diff(10_000 + 3) <= 100, "{passed}");
    }

    #[test]
    fn a_burst_passes_whole_after_idle_and_no_more() {
        let l = limits(1000, 0, 500, 0);
        let b = SharedBucket::new(&l, 0);
        b.refill(10_000_000_000); // idle for 10 s: capped at the burst
        assert_eq!((0..2000).filter(|_| admit(&b, 64)).count(), 500);
        b.refill(10_000_000_000 + 1_000_000); // 1 ms: one packet
        assert_eq!((0..10).filter(|_| admit(&b, 64)).count(), 1);
    }

    #[test]
    fn both_limits_apply_and_a_small_frame_passes_where_a_large_one_does_not() {
        let l = limits(1000, 8 * 3000, 10, 3000);
        let b = SharedBucket::new(&l, 0);
        assert!(admit(&b, 1500) && admit(&b, 1500));
        assert!(!admit(&b, 1500), "bytes spent");
        b.refill(100_000_000); // 0.1 s: 300 bytes, 100 packets (capped at 10)
        assert!(!admit(&b, 1500) && admit(&b, 300));
    }

    #[test]
    fn refused_configurations_say_why() {
        let e = PolicerConfig::default().limits(1518).unwrap_err();
        assert!(e.contains("needs a rate"), "{e}");
        let e = PolicerConfig { bps: 1_000_000, burst_bytes: 1000, ..Default::default() }
            .limits(1518)
            .unwrap_err();
        assert!(e.contains("less than the port's largest frame (1518"), "{e}");
        let d = PolicerConfig { bps: 1_000_000, ..Default::default() }.limits(1518).unwrap();
        assert_eq!((d.burst_bytes, d.burst_packets), (3036, 64), "defaults");
    }

    #[test]
    fn a_burst_is_taken_whole_or_not_at_all() {
        let l = limits(1000, 8 * 10_000, 40, 10_000);
        let b = SharedBucket::new(&l, 0);
        assert!(!b.take_all(41, 100), "one packet short");
        assert!(!b.take_all(2, 10_001), "one byte short");
        assert!(b.take_all(32, 9_000));
        assert_eq!(
            (0..10).filter(|_| admit(&b, 100)).count(),
            8,
            "what is left: 8 packets, 1 000 bytes"
        );
    }

    #[test]
    fn a_bucket_admits_frame_by_frame_and_refills_once_per_interval() {
        let l = limits(1000, 8 * 10_000, 40, 10_000);
        let b = SharedBucket::new(&l, 0);
        assert_eq!(b.take(&[100; 32]), first(32));
        assert_eq!(b.take(&[100; 32]), first(8), "packets bind: 40 in the burst");
        b.refill(10_000_000); // 10 ms: 10 packets, 100 bytes (6 100 then)
        assert_eq!(
            b.take(&[3000, 3000, 200, 10]),
            0b1011,
            "bits bind the large frame; the small ones after it pass"
        );
        assert_eq!(
            b.packets.load(Relaxed) / UNIT,
            7,
            "the packet tokens the bits refused were given back"
        );
        assert_eq!(b.bits.load(Relaxed) / UNIT / 8, 90);
        b.refill(10_000_000);
        assert_eq!(b.packets.load(Relaxed) / UNIT, 7, "the same instant adds nothing");
    }

    #[test]
    fn a_shared_bucket_takes_a_burst_whole_or_not_at_all() {
        let l = limits(1000, 8 * 10_000, 40, 10_000);
        let b = SharedBucket::new(&l, 0);
        assert!(!b.take_all(41, 100), "one packet short");
        assert!(!b.take_all(2, 10_001), "one byte short: the packets it took are given back");
        assert!(b.take_all(40, 10_000));
        assert_eq!((b.packets.load(Relaxed), b.bits.load(Relaxed)), (0, 0));
    }

    /// Two threads drawing from one bucket for a simulated second (a clock both move on, 50 µs
    /// a burst, offering 16 frames each time: 320 000 a second): together they get the rate
    /// and the burst, not each of them.
    #[test]
    fn threads_share_one_rate() {
        let l = limits(100_000, 0, 64, 0);
        let b = std::sync::Arc::new(SharedBucket::new(&l, 0));
        let clock = std::sync::Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (b, clock) = (b.clone(), clock.clone());
                std::thread::spawn(move || {
                    let mut passed = 0;
                    for _ in 0..10_000 {
                        b.refill(clock.fetch_add(50_000, Relaxed) + 50_000);
                        passed += b.take(&[64; 16]).count_ones();
                    }
                    passed as u64
                })
            })
            .collect();
        let passed: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(passed.abs_diff(100_000 + 64) <= 100, "{passed}");
    }

    #[test]
    fn a_clock_going_back_adds_nothing() {
        let l = limits(1000, 0, 1, 0);
        let b = SharedBucket::new(&l, 5_000_000_000);
        assert!(admit(&b, 64));
        b.refill(1_000_000_000);
        assert!(!admit(&b, 64));
    }
}

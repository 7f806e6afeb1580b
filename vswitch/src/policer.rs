//! Ingress policing: a port's frames held to a rate in packets a second and in bits a second,
//! each with a burst, by token buckets; frames over either are dropped and counted (`policed`).
//!
//! Bits count the Ethernet frame as received — headers and payload, a VLAN tag when there is
//! one, not the FCS, preamble or inter-frame gap (20 bytes of L1 overhead a frame are *not*
//! counted), as OVS's ingress policing counts them. Each receive queue of a port has a bucket
//! of its own with an equal share of the rate and burst (one PMD thread polls a queue, so no
//! bucket is shared between threads and nothing is locked or atomic): a pod's single queue
//! gets the whole rate; a multi-queue port whose traffic uses fewer queues than it has gets
//! less than its rate.
//!
//! Tokens are fixed-point, a packet or bit being 10⁹ units, so that refilling is one multiply
//! of nanoseconds by the rate (128-bit, once a burst) and admitting a frame two compares and
//! two subtractions, without division.

use serde::{Deserialize, Serialize};

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

/// A policer's limits with defaults applied (what a queue's share is taken from).
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
                return Err(format!("burst_bytes {n} is less than the port's largest frame ({max_frame} bytes), which could never pass"));
            }
            n => n,
        };
        if burst_packets > MAX_BURST_PACKETS || burst_bytes > MAX_BURST_BYTES {
            return Err(format!("a burst of at most {MAX_BURST_PACKETS} packets and {MAX_BURST_BYTES} bytes"));
        }
        Ok(Limits { pps: self.pps, bps: self.bps, burst_packets, burst_bytes })
    }
}

/// One receive queue's token buckets.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// The clock (nanoseconds) when the tokens were last topped up.
    last: u64,
    packets: u64,
    bits: u64,
    /// Rates and caps of this queue's share, in tokens (a rate of 0 never fills, and then
    /// frames cost 0 of that kind).
    pps: u64,
    bps: u64,
    packets_cap: u64,
    bits_cap: u64,
    packet_cost: u64,
    byte_cost: u64,
}

impl Bucket {
    /// A full bucket holding `share` of `limits` (one of `share` queues), from `now`.
    pub fn new(limits: &Limits, share: u16, now: u64) -> Bucket {
        let n = share.max(1) as u64;
        let packets_cap = limits.burst_packets.div_ceil(n) * UNIT;
        let bits_cap = limits.burst_bytes.div_ceil(n) * 8 * UNIT;
        Bucket {
            last: now,
            packets: packets_cap,
            bits: bits_cap,
            pps: limits.pps.div_ceil(n),
            bps: limits.bps.div_ceil(n),
            packets_cap,
            bits_cap,
            packet_cost: if limits.pps > 0 { UNIT } else { 0 },
            byte_cost: if limits.bps > 0 { 8 * UNIT } else { 0 },
        }
    }

    /// Adds the tokens earned since the last call (once a burst).
    #[inline]
    pub fn refill(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last) as u128;
        self.last = now.max(self.last);
        let top = |tokens: u64, rate: u64, cap: u64| (tokens as u128 + dt * rate as u128).min(cap as u128) as u64;
        self.packets = top(self.packets, self.pps, self.packets_cap);
        self.bits = top(self.bits, self.bps, self.bits_cap);
    }

    /// Takes a whole burst of `packets` frames and `bytes` bytes if both buckets hold enough
    /// for all of it (a port under its rate: one test a burst instead of one a frame).
    #[inline(always)]
    pub fn admit_all(&mut self, packets: u64, bytes: u64) -> bool {
        let (p, b) = (packets * self.packet_cost, bytes * self.byte_cost);
        let ok = self.packets >= p && self.bits >= b;
        if ok {
            self.packets -= p;
            self.bits -= b;
        }
        ok
    }

    /// Takes a frame of `len` bytes if both buckets hold enough; whether it passes.
    #[inline(always)]
    pub fn admit(&mut self, len: u32) -> bool {
        let bits = len as u64 * self.byte_cost;
        let ok = self.packets >= self.packet_cost && self.bits >= bits;
        if ok {
            self.packets -= self.packet_cost;
            self.bits -= bits;
        }
        ok
    }
}

/// One PMD thread's buckets: per port id, one per rx queue of the port, made on the port's
/// first burst after it got a policer or its limits changed (allocated then, never per frame).
#[derive(Default)]
pub struct Buckets {
    ports: Vec<Option<(Limits, Box<[Bucket]>)>>,
}

impl Buckets {
    /// The bucket of `queue` (of `queues`) of port `port`, held to `limits`, topped up to `now`.
    #[inline]
    pub fn get(&mut self, port: u16, limits: &Limits, queue: u16, queues: u16, now: u64) -> &mut Bucket {
        let i = port as usize;
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, || None);
        }
        let n = queues.max(1) as usize;
        let slot = &mut self.ports[i];
        if !matches!(slot, Some((l, b)) if l == limits && b.len() == n) {
            *slot = None;
        }
        let (_, buckets) = slot.get_or_insert_with(|| (*limits, (0..n).map(|_| Bucket::new(limits, queues, now)).collect()));
        let n = buckets.len();
        let b = &mut buckets[queue as usize % n];
        b.refill(now);
        b
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn limits(pps: u64, bps: u64, burst_packets: u64, burst_bytes: u64) -> Limits {
        PolicerConfig { pps, bps, burst_packets, burst_bytes }.limits(1518).unwrap()
    }

    /// Offers `offered` frames a second of `len` bytes for `secs`, a burst every `tick_ns`;
    /// returns those admitted.
    fn run(b: &mut Bucket, offered: u64, len: u32, secs: u64, tick_ns: u64) -> u64 {
        let per_tick = offered * tick_ns / 1_000_000_000;
        let mut passed = 0;
        let mut now = 0;
        while now < secs * 1_000_000_000 {
            now += tick_ns;
            b.refill(now);
            passed += (0..per_tick).filter(|_| b.admit(len)).count() as u64;
        }
        passed
    }

    #[test]
    fn packets_a_second_hold_within_a_percent_whatever_the_burst_size() {
        for tick in [10_000, 100_000, 500_000] {
            let l = limits(100_000, 0, 64, 0);
            let mut b = Bucket::new(&l, 1, 0);
            let passed = run(&mut b, 1_000_000, 64, 10, tick);
            // The burst's 64 on top of ten seconds of rate.
            assert!(passed.abs_diff(1_000_000 + 64) <= 10_000, "tick {tick} ns: {passed}");
        }
    }

    #[test]
    fn bits_a_second_count_frame_bytes_without_l1_overhead() {
        let l = limits(0, 8_000_000, 0, 0); // 1 MB/s
        let mut b = Bucket::new(&l, 1, 0);
        let passed = run(&mut b, 10_000, 1000, 10, 100_000);
        // 10 MB in 1 000-byte frames, plus the burst (2 × 1 518 bytes, the default).
        assert!(passed.abs_diff(10_000 + 3) <= 100, "{passed}");
    }

    #[test]
    fn a_burst_passes_whole_after_idle_and_no_more() {
        let l = limits(1000, 0, 500, 0);
        let mut b = Bucket::new(&l, 1, 0);
        b.refill(10_000_000_000); // idle for 10 s: capped at the burst
        assert_eq!((0..2000).filter(|_| b.admit(64)).count(), 500);
        b.refill(10_000_000_000 + 1_000_000); // 1 ms: one packet
        assert_eq!((0..10).filter(|_| b.admit(64)).count(), 1);
    }

    #[test]
    fn both_limits_apply_and_a_small_frame_passes_where_a_large_one_does_not() {
        let l = limits(1000, 8 * 3000, 10, 3000);
        let mut b = Bucket::new(&l, 1, 0);
        assert!(b.admit(1500) && b.admit(1500));
        assert!(!b.admit(1500), "bytes spent");
        b.refill(100_000_000); // 0.1 s: 300 bytes, 100 packets (capped at 10)
        assert!(!b.admit(1500) && b.admit(300));
    }

    #[test]
    fn queues_share_the_rate() {
        let l = limits(100_000, 0, 64, 0);
        let mut b = Bucket::new(&l, 4, 0);
        let passed = run(&mut b, 1_000_000, 64, 10, 100_000);
        assert!(passed.abs_diff(250_000 + 16) <= 2_500, "{passed}");
    }

    #[test]
    fn refused_configurations_say_why() {
        let e = PolicerConfig::default().limits(1518).unwrap_err();
        assert!(e.contains("needs a rate"), "{e}");
        let e = PolicerConfig { bps: 1_000_000, burst_bytes: 1000, ..Default::default() }.limits(1518).unwrap_err();
        assert!(e.contains("less than the port's largest frame (1518"), "{e}");
        let d = PolicerConfig { bps: 1_000_000, ..Default::default() }.limits(1518).unwrap();
        assert_eq!((d.burst_bytes, d.burst_packets), (3036, 64), "defaults");
    }

    #[test]
    fn a_burst_is_taken_whole_or_not_at_all() {
        let l = limits(1000, 8 * 10_000, 40, 10_000);
        let mut b = Bucket::new(&l, 1, 0);
        assert!(!b.admit_all(41, 100), "one packet short");
        assert!(!b.admit_all(2, 10_001), "one byte short");
        assert!(b.admit_all(32, 9_000));
        assert_eq!((0..10).filter(|_| b.admit(100)).count(), 8, "what is left: 8 packets, 1 000 bytes");
    }

    #[test]
    fn a_clock_going_back_adds_nothing() {
        let l = limits(1000, 0, 1, 0);
        let mut b = Bucket::new(&l, 1, 5_000_000_000);
        assert!(b.admit(64));
        b.refill(1_000_000_000);
        assert!(!b.admit(64));
    }
}

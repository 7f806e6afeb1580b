//! Small helpers shared by the control side and the fast path: a fast non-cryptographic
//! hasher for the snapshot's lookup maps, huge pages for the large lookup tables, a VLAN
//! bitset, and the coarse clock.

use std::hash::{BuildHasherDefault, Hasher};

/// The Fx hash (as in rustc): a multiply-rotate over words. Keys here are switch-internal
/// (VNIs, VTEP addresses, IPs from the control plane), so hash flooding is not a concern.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(K);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    /// The product's top bits, the only ones every input bit reaches, rotated down to where
    /// the table takes its bucket index (the low bits; as rustc-hash 2 does). Without it,
    /// 16 384 VTEP addresses counting in their last two bytes shared a few dozen buckets
    /// (an IPv4 address is hashed as one word whose low bits hold its first, constant bytes)
    /// and a snapshot build of 4 096 flood lists took ~300 ms in lookups.
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

pub type FxMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;
pub type FxSet<K> = std::collections::HashSet<K, BuildHasherDefault<FxHasher>>;

/// Backs the 2 MiB-aligned part of a large table with transparent huge pages, so that
/// lookups spread over the table miss the TLB less: marks it for THP (whose "madvise" mode is
/// the common default) and collapses the pages it already has into huge ones at once
/// (`MADV_COLLAPSE`, Linux 6.1: a zeroed allocation of this alignment was written whole, in
/// small pages, before it gets here). Best effort: where THP is off or the kernel is older,
/// pages stay small and nothing else changes.
pub fn back_with_huge_pages<T>(table: &[T]) {
    const HUGE: usize = 2 << 20;
    /// Not in the `libc` crate yet (include/uapi/asm-generic/mman-common.h).
    const MADV_COLLAPSE: libc::c_int = 25;
    let bytes = std::mem::size_of_val(table);
    if bytes < 2 * HUGE {
        return;
    }
    let start = table.as_ptr() as usize;
    let (from, to) = (start.next_multiple_of(HUGE), (start + bytes) & !(HUGE - 1));
    if to <= from {
        return;
    }
    for advice in [libc::MADV_HUGEPAGE, MADV_COLLAPSE] {
        // SAFETY: the range lies inside `table`'s own allocation, page-aligned; both advices
        // only change how the kernel backs those pages (collapsing copies them into huge
        // pages), never their contents.
        unsafe { libc::madvise(from as *mut libc::c_void, to - from, advice) };
    }
}

/// A set of VLAN ids 0..4096.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet(Box<[u64; 64]>);

impl Default for VlanSet {
    fn default() -> Self {
        VlanSet(Box::new([0; 64]))
    }
}

impl std::fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries((0..4096u16).filter(|v| self.contains(*v))).finish()
    }
}

impl VlanSet {
    pub fn insert(&mut self, v: u16) {
        self.0[(v as usize >> 6) & 63] |= 1 << (v & 63);
    }
    #[inline(always)]
    pub fn contains(&self, v: u16) -> bool {
        self.0[(v as usize >> 6) & 63] & (1 << (v & 63)) != 0
    }

    /// The VLANs in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().enumerate().flat_map(|(i, w)| {
            let mut w = *w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros();
                    w &= w - 1;
                    (i as u32 * 64 + b) as u16
                })
            })
        })
    }
}

fn clock(id: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts
}

/// Seconds of a monotonic clock, cheap enough to read once per batch (vDSO, coarse).
pub fn coarse_secs() -> u32 {
    clock(libc::CLOCK_MONOTONIC_COARSE).tv_sec as u32
}

/// Nanoseconds of the monotonic clock (the policers' clock: read once a burst of a policed
/// port; tests give the pipeline another).
pub fn monotonic_ns() -> u64 {
    let ts = clock(libc::CLOCK_MONOTONIC);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU's time-stamp counter (cycles); elsewhere nanoseconds of a monotonic clock
/// (a counter that still orders and measures time, at another rate).
#[inline(always)]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

/// The TSC's rate ([`cycles`] a second), calibrated once per process (the perf lab's pacing
/// and frame ages, `knitterctl pmd show`'s times). It used to be measured for every
/// generator in the perf lab, over one 100 ms sleep with the two clocks read one after the
/// other: a vCPU stall between the two reads (this VM stops a vCPU for milliseconds) put
/// that trial's rate off by the stall's share of 100 ms.
pub fn tsc_hz() -> f64 {
    *TSC_HZ.get_or_init(calibrate)
}

/// [`tsc_hz`] if it is calibrated already (without waiting the 100 ms it takes).
pub fn tsc_hz_known() -> Option<f64> {
    TSC_HZ.get().copied()
}

static TSC_HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// The median of five 20 ms measurements, each clock pair read with nothing between.
fn calibrate() -> f64 {
    let mut hz: Vec<f64> = (0..5)
        .map(|_| {
            let (i0, t0) = paired_read();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (i1, t1) = paired_read();
            t1.wrapping_sub(t0) as f64 / (i1 - i0).as_secs_f64()
        })
        .collect();
    hz.sort_by(f64::total_cmp);
    hz[2]
}

/// The monotonic clock and the TSC at one moment: the clock read between two TSC reads,
/// again until the two are close (no stall between them), the TSC taken halfway.
fn paired_read() -> (std::time::Instant, u64) {
    /// ~8 µs at 2.6 GHz: far more than the reads take, far less than a vCPU stall.
    const CLOSE: u64 = 20_000;
    loop {
        let a = cycles();
        let i = std::time::Instant::now();
        let b = cycles();
        if b.wrapping_sub(a) < CLOSE {
            return (i, a + b.wrapping_sub(a) / 2);
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn the_tsc_calibrates_the_same_twice() {
        let (a, b) = (calibrate(), calibrate());
        assert!(a > 1e8 && ((a - b) / a).abs() < 0.005, "{a} vs {b}");
    }

    #[test]
    fn vlan_set() {
        let mut s = VlanSet::default();
        s.insert(1);
        s.insert(4094);
        assert!(s.contains(1) && s.contains(4094) && !s.contains(2));
        s.insert(64);
        s.insert(63);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![1, 63, 64, 4094]);
    }

    /// Addresses that count in their last bytes spread over a table's buckets (its low bits).
    #[test]
    fn fx_hash_spreads_counting_addresses_over_low_bits() {
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<FxHasher>::default();
        let mask = (1u64 << 14) - 1;
        let buckets: std::collections::HashSet<u64> = (0..16384u32)
            .map(|n| {
                b.hash_one(std::net::IpAddr::V4(std::net::Ipv4Addr::from(0xc633_0000 + n))) & mask
            })
            .collect();
        assert!(buckets.len() > 16384 / 2, "{} buckets of 16384 used", buckets.len());
    }
}

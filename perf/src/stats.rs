//! The statistics of a comparison and the throughput searches: medians and spreads of
//! repeated trials, per-pair ratios, and NDR/PDR found by binary search over the offered
//! rate (as FD.io CSIT defines them: NDR = no loss, PDR = loss ≤ 0.5 %).

use serde::Serialize;

/// Repeated measurements of one thing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// (max − min) / median: how far to trust the median.
    pub spread: f64,
    /// A 95 % confidence interval of the median (percentile bootstrap over the values;
    /// none for fewer than [`MIN_FOR_INTERVAL`] values).
    #[serde(default)]
    pub interval: Option<(f64, f64)>,
}

/// Fewer values than this give no interval worth stating.
pub const MIN_FOR_INTERVAL: usize = 3;
/// The bootstrap's resamples and confidence level.
const RESAMPLES: usize = 4000;
const LEVEL: f64 = 0.95;

impl Summary {
    /// Whether the interval excludes `x` (a ratio's 1.0): when it does not, the values are
    /// not distinguishable from `x`; with no interval, nothing can be said.
    pub fn excludes(&self, x: f64) -> Option<bool> {
        self.interval.map(|(lo, hi)| x < lo || x > hi)
    }
}

/// `None` for no values.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = median_of_sorted(&v);
    let (min, max) = (v[0], v[n - 1]);
    let spread = if median > 0.0 { (max - min) / median } else { 0.0 };
    // The percentiles may fall a hair beside the median itself with few values.
    let interval = (n >= MIN_FOR_INTERVAL)
        .then(|| median_interval(&v))
        .map(|(lo, hi)| (lo.min(median), hi.max(median)));
    Some(Summary { n, median, min, max, spread, interval })
}

fn median_of_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// The percentile bootstrap of the median of `v` (sorted): the median of `RESAMPLES`
/// resamples with replacement, the central `LEVEL` of them. Seeded by the values, so a
/// report written again from the same results says the same.
fn median_interval(v: &[f64]) -> (f64, f64) {
    let mut rng = SplitMix(
        v.iter()
            .fold(0x9e37_79b9_7f4a_7c15, |h, x| (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3)),
    );
    let mut sample = vec![0.0; v.len()];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for s in sample.iter_mut() {
                *s = v[(rng.next() % v.len() as u64) as usize];
            }
            sample.sort_by(f64::total_cmp);
            median_of_sorted(&sample)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    (at((1.0 - LEVEL) / 2.0), at((1.0 + LEVEL) / 2.0))
}

/// splitmix64: a small, good, deterministic generator for the bootstrap.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The ratio of `a` to `b` per interleaved pair (trials `i` of both ran back to back), then
/// summarized: pairs share the machine's state of the moment, so their ratios are steadier
/// than the ratio of the medians.
pub fn pair_ratios(a: &[f64], b: &[f64]) -> Option<Summary> {
    let r: Vec<f64> = a.iter().zip(b).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
    summarize(&r)
}

/// What one trial at an offered rate gave.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Trial {
    /// Offered and received, packets per second.
    pub offered: f64,
    pub received: f64,
}

impl Trial {
    pub fn loss(&self) -> f64 {
        if self.offered <= 0.0 {
            0.0
        } else {
            ((self.offered - self.received) / self.offered).max(0.0)
        }
    }
}

/// The loss a PDR allows (FD.io CSIT: 0.5 %).
pub const PDR_LOSS: f64 = 0.005;

/// The highest offered rate in `[lo, hi]` whose trial loses at most `max_loss`, to within
/// `precision` (relative), by binary search; `trial` runs one trial at a rate. `None` when
/// even `lo` loses more.
pub fn search<E>(
    lo: f64,
    hi: f64,
    precision: f64,
    max_loss: f64,
    mut trial: impl FnMut(f64) -> Result<Trial, E>,
) -> Result<Option<f64>, E> {
    if trial(hi)?.loss() <= max_loss {
        return Ok(Some(hi));
    }
    if trial(lo)?.loss() > max_loss {
        return Ok(None);
    }
    let (mut good, mut bad) = (lo, hi);
    while (bad - good) / bad > precision {
        let mid = (good + bad) / 2.0;
        if trial(mid)?.loss() <= max_loss {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok(Some(good))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn medians_and_spreads() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(s.spread, 1.0);
        assert_eq!(summarize(&[1.0, 2.0, 3.0, 4.0]).unwrap().median, 2.5);
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
        let r = pair_ratios(&[2.0, 4.0, 9.0], &[1.0, 4.0, 0.0]).unwrap();
        assert_eq!((r.n, r.median), (2, 1.5), "a pair whose reference got nothing is left out");
    }

    #[test]
    fn the_median_has_an_interval_and_a_ratio_says_when_it_is_no_ratio() {
        assert_eq!(summarize(&[1.0, 2.0]).unwrap().interval, None, "two values: no interval");
        let s = summarize(&[10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3]).unwrap();
        let (lo, hi) = s.interval.unwrap();
        assert!(lo <= s.median && s.median <= hi && lo >= s.min && hi <= s.max, "{s:?}");
        assert_eq!(
            summarize(&[10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3]).unwrap().interval,
            s.interval,
            "the same values, the same interval"
        );
        // Knitter twice OVS in every round: distinguishable from 1.
        let twice =
            pair_ratios(&[20.0, 21.0, 19.0, 20.5, 19.5], &[10.0, 10.4, 9.6, 10.1, 9.9]).unwrap();
        assert_eq!(twice.excludes(1.0), Some(true), "{twice:?}");
        // Ahead in some rounds, behind in others: not distinguishable from 1.
        let even =
            pair_ratios(&[10.0, 11.0, 9.0, 10.5, 9.5], &[10.0, 10.0, 10.0, 10.0, 10.0]).unwrap();
        assert_eq!(even.excludes(1.0), Some(false), "{even:?}");
        assert_eq!(
            pair_ratios(&[2.0, 3.0], &[1.0, 1.0]).unwrap().excludes(1.0),
            None,
            "two rounds say nothing"
        );
    }

    proptest! {
        #[test]
        fn the_interval_holds_the_median(v in proptest::collection::vec(0.0f64..100.0, 3..15)) {
            let s = summarize(&v).unwrap();
            let (lo, hi) = s.interval.unwrap();
            prop_assert!(s.min <= lo && lo <= s.median && s.median <= hi && hi <= s.max, "{s:?}");
        }
    }

    /// A switch that forwards up to `cap` and drops the excess, plus `noise` of loss.
    fn model(cap: f64, noise: f64) -> impl FnMut(f64) -> Result<Trial, ()> {
        move |rate| Ok(Trial { offered: rate, received: rate.min(cap) * (1.0 - noise) })
    }

    #[test]
    fn the_search_finds_the_capacity() {
        let ndr = search(1e5, 20e6, 0.001, 0.0, model(7.5e6, 0.0)).unwrap().unwrap();
        assert!((ndr - 7.5e6).abs() / 7.5e6 < 0.002, "{ndr}");
        // 0.3 % loss everywhere: no NDR at all, a PDR at the capacity.
        assert_eq!(search(1e5, 20e6, 0.001, 0.0, model(7.5e6, 0.003)).unwrap(), None);
        let pdr = search(1e5, 20e6, 0.001, PDR_LOSS, model(7.5e6, 0.003)).unwrap().unwrap();
        assert!((7.5e6 * 0.998..=7.5e6 * 1.003).contains(&pdr), "{pdr}");
        assert_eq!(
            search(1e5, 1e6, 0.001, 0.0, model(7.5e6, 0.0)).unwrap(),
            Some(1e6),
            "the top of the range when it passes"
        );
    }

    proptest! {
        #[test]
        fn the_search_is_within_precision_of_any_capacity(cap in 2e5f64..19e6, precision in 0.001f64..0.05) {
            let mut trials = 0;
            let found = search(1e5, 20e6, precision, 0.0, |r| { trials += 1; model(cap, 0.0)(r) }).unwrap().unwrap();
            prop_assert!(found <= cap && (cap - found) / cap <= precision * 2.0 + 1e-9, "{found} vs {cap}");
            prop_assert!(trials <= 2 + (20e6f64 / (1e5 * precision)).log2().ceil() as usize + 1);
        }
    }
}

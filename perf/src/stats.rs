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
}

/// `None` for no values.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    let (min, max) = (v[0], v[n - 1]);
    let spread = if median > 0.0 { (max - min) / median } else { 0.0 };
    Some(Summary { n, median, min, max, spread })
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
        if self.offered <= 0.0 { 0.0 } else { ((self.offered - self.received) / self.offered).max(0.0) }
    }
}

/// The loss a PDR allows (FD.io CSIT: 0.5 %).
pub const PDR_LOSS: f64 = 0.005;

/// The highest offered rate in `[lo, hi]` whose trial loses at most `max_loss`, to within
/// `precision` (relative), by binary search; `trial` runs one trial at a rate. `None` when
/// even `lo` loses more.
pub fn search<E>(lo: f64, hi: f64, precision: f64, max_loss: f64, mut trial: impl FnMut(f64) -> Result<Trial, E>) -> Result<Option<f64>, E> {
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
        assert_eq!(search(1e5, 1e6, 0.001, 0.0, model(7.5e6, 0.0)).unwrap(), Some(1e6), "the top of the range when it passes");
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

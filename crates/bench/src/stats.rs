//! Small statistics: percentiles of latency samples and medians of per-round figures.
//!
//! Percentiles use the same index rule as the reference `rrbench` tool
//! (`sorted[floor(n * q)]`), so our figures and the published peer baselines are
//! computed alike.

/// The `q`-quantile (0 ≤ q < 1) of already sorted samples, as `rrbench` picks it:
/// `sorted[floor(n * q)]`. `None` for no samples.
pub fn percentile_sorted<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    // Truncation is the rule; the clamp keeps q = 1.0 inside the slice.
    let idx = ((sorted.len() as f64) * q) as usize;
    sorted.get(idx.min(sorted.len() - 1)).copied()
}

/// The median of per-round figures (mean of the two middle values for an even count),
/// ignoring NaN. `None` if nothing is left.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// `x / reference`, or `None` when either is missing or the reference is zero.
pub fn ratio(x: Option<f64>, reference: Option<f64>) -> Option<f64> {
    match (x, reference) {
        (Some(x), Some(r)) if r != 0.0 => Some(x / r),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_rrbench_index_rule() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 0.50), Some(51));
        assert_eq!(percentile_sorted(&v, 0.99), Some(100));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1));
        assert_eq!(percentile_sorted(&v, 1.0), Some(100));
        assert_eq!(percentile_sorted(&[7u32], 0.99), Some(7));
        assert_eq!(percentile_sorted::<u32>(&[], 0.5), None);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratios_refuse_missing_or_zero_references() {
        assert_eq!(ratio(Some(3.0), Some(4.0)), Some(0.75));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }
}

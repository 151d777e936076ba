//! Small statistics for campaigns: median, quartiles, bootstrap intervals (pure).

/// Median; `None` for no values.
pub fn median(v: &[f64]) -> Option<f64> {
    quantile(v, 0.5)
}

/// Linear-interpolated quantile `q` in [0, 1].
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// First and third quartiles.
pub fn quartiles(v: &[f64]) -> Option<(f64, f64)> {
    Some((quantile(v, 0.25)?, quantile(v, 0.75)?))
}

/// Percentile bootstrap interval of the median, with a fixed-seed generator so a report
/// is reproducible.
pub fn bootstrap_ci(v: &[f64], resamples: usize, level: f64) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut medians = Vec::with_capacity(resamples);
    let mut sample = vec![0.0; v.len()];
    for _ in 0..resamples {
        for s in sample.iter_mut() {
            *s = v[(next() % v.len() as u64) as usize];
        }
        medians.push(median(&sample)?);
    }
    let tail = (1.0 - level) / 2.0;
    Some((quantile(&medians, tail)?, quantile(&medians, 1.0 - tail)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), Some(2.5));
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0, 5.0]), Some((2.0, 4.0)));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn bootstrap_brackets_the_median() {
        let v = [1.9, 2.0, 2.1, 2.0, 1.95, 2.05];
        let (lo, hi) = bootstrap_ci(&v, 2000, 0.95).unwrap();
        assert!(
            lo <= 2.0 && 2.0 <= hi && lo >= 1.9 && hi <= 2.1,
            "{lo} {hi}"
        );
        // Constant data: a point interval.
        assert_eq!(bootstrap_ci(&[1.0; 5], 100, 0.95), Some((1.0, 1.0)));
    }
}

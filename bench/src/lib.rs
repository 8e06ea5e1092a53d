//! Shared pieces of the stagevm benchmarks: what to run ([`target`]) and
//! small statistics ([`stats`]).

pub mod target;

/// Statistics over repeated runs.
pub mod stats {
    /// Median of the finite values in `v` (upper median for an even count;
    /// NaN when there is none).
    pub fn median(mut v: Vec<f64>) -> f64 {
        v.retain(|x| x.is_finite());
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            f64::NAN
        } else {
            v[v.len() / 2]
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn median_skips_non_finite_values() {
            assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
            assert_eq!(super::median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
            assert_eq!(super::median(vec![f64::NAN, 5.0]), 5.0);
            assert!(super::median(vec![]).is_nan());
        }
    }
}

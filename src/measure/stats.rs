//! Median, min and max of a sample: how every benchmark figure is reported. Owns the summary;
//! no timing.

/// Median, min and max of a sample.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl Stats {
    /// Summarises values (at least one).
    pub fn of(mut v: Vec<f64>) -> Stats {
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

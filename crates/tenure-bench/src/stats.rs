//! Latency samples and their percentiles.

use std::time::Duration;

#[derive(Debug, Default, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    /// Every sample less `d` (none below zero).
    pub fn less(&self, d: Duration) -> Samples {
        Samples(self.0.iter().map(|s| s.saturating_sub(d)).collect())
    }

    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every sample in milliseconds, smallest first.
    pub fn sorted_ms(&self) -> Vec<f64> {
        let mut sorted = self.0.clone();
        sorted.sort();
        sorted.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
    }

    /// The q-quantile (0..=1) in milliseconds, nearest rank.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.0.clone();
        sorted.sort();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1].as_secs_f64() * 1000.0
    }

    pub fn p50(&self) -> f64 {
        self.quantile_ms(0.50)
    }

    pub fn p90(&self) -> f64 {
        self.quantile_ms(0.90)
    }

    pub fn p99(&self) -> f64 {
        self.quantile_ms(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let mut s = Samples::default();
        for ms in 1..=100 {
            s.push(Duration::from_millis(ms));
        }
        assert_eq!(s.p50(), 50.0);
        assert_eq!(s.p90(), 90.0);
        assert_eq!(s.p99(), 99.0);
        assert!(Samples::default().p50().is_nan());
    }
}

//! The exporter's own series (issue #21's self-metrics): how long collections and proofs
//! take (histograms), when the last good one finished, errors by kind, and, at scrape time,
//! the age of the last good collection and the process's CPU and RSS under the names the
//! Prometheus client libraries use (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_start_time_seconds`).

use super::{Acc, Kind};
use crate::collect::own::OwnProcess;

/// Bucket bounds (seconds) of the collection and proof histograms: a collection of a quiet
/// node takes tens of milliseconds, a first proof of a large model many seconds.
pub const DURATION_BUCKETS: [f64; 11] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A cumulative histogram of observations (classic buckets, plus +Inf).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// (upper bound, observations in that bucket alone), +Inf last: what the encoder takes.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(&DURATION_BUCKETS)
    }
}

/// What went wrong in a collection, by kind (`twofold_collect_errors_total{kind}`).
pub const ERROR_KINDS: [&str; 4] = ["collection", "residency", "process_unreadable", "trace"];

/// The exporter's own state, carried from one collection to the next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelfStats {
    /// Wall time of the last collection (snapshot + report + encoding).
    pub collect_duration_seconds: f64,
    /// Every collection's wall time, failed ones included.
    pub collect_durations: Histogram,
    /// Every proof's wall time (collections that proved).
    pub proof_durations: Histogram,
    /// Errors since start, by [`ERROR_KINDS`] (same order): failed collections, files
    /// whose page-cache residency could not be read, processes not read fully, tracing
    /// that failed to attach.
    pub errors_total: [u64; 4],
    /// Series not exported because their file was folded into `other`, since start.
    pub series_dropped_total: u64,
    /// When the last successful collection finished (seconds since the Unix epoch).
    pub last_success_unix_seconds: Option<f64>,
}

impl SelfStats {
    /// Counts one error of `kind` (one of [`ERROR_KINDS`]).
    pub fn error(&mut self, kind: &str, n: u64) {
        if let Some(i) = ERROR_KINDS.iter().position(|k| *k == kind) {
            self.errors_total[i] += n;
        }
    }
}

/// The exporter's series known at collection time.
pub(super) fn series(acc: &mut Acc, stats: &SelfStats, dropped_now: u64) {
    acc.gauge(
        "twofold_collect_last_duration_seconds",
        "Wall time of the last successful collection (snapshot, proof, report and encoding)",
        Vec::new(),
        stats.collect_duration_seconds,
    );
    acc.histogram(
        "twofold_collect_duration_seconds",
        "Wall time of each collection (snapshot, proof, report and encoding), failed ones included",
        stats.collect_durations.clone(),
    );
    acc.histogram(
        "twofold_proof_duration_seconds",
        "Wall time of each byte-level proof (the search of processes' memory for copies)",
        stats.proof_durations.clone(),
    );
    if let Some(t) = stats.last_success_unix_seconds {
        acc.gauge(
            "twofold_collect_last_success_timestamp_seconds",
            "When the last successful collection finished (Unix time)",
            Vec::new(),
            t,
        );
    }
    for (kind, n) in ERROR_KINDS.iter().zip(stats.errors_total) {
        acc.add(
            "twofold_collect_errors",
            "Errors since the exporter started, by kind: collection (a collection failed), residency (a file's page cache could not be read), process_unreadable (a process could not be read fully), trace (eBPF failed to attach)",
            Kind::Counter,
            vec![("kind".to_string(), kind.to_string())],
            n as f64,
        );
    }
    acc.add(
        "twofold_series_dropped",
        "Series not exported because their file was folded into file_id other (--max-files), summed over collections",
        Kind::Counter,
        Vec::new(),
        (stats.series_dropped_total + dropped_now) as f64,
    );
}

/// The series computed when a scrape arrives: the age of the last good collection
/// (`None`: there was none yet) and the process's own CPU, RSS and start time.
pub fn scrape_time(
    last_good_age_seconds: Option<f64>,
    own: Option<OwnProcess>,
) -> Vec<super::Family> {
    let mut acc = Acc::default();
    if let Some(age) = last_good_age_seconds {
        acc.gauge(
            "twofold_collect_last_success_age_seconds",
            "Seconds since the last successful collection finished, when this scrape was answered",
            Vec::new(),
            age,
        );
    }
    if let Some(o) = own {
        acc.add(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            Kind::Counter,
            Vec::new(),
            o.cpu_seconds,
        );
        acc.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            Vec::new(),
            o.resident_bytes as f64,
        );
        if let Some(t) = o.start_time_seconds {
            acc.gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                Vec::new(),
                t,
            );
        }
    }
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_hold_each_observation_once() {
        let mut h = Histogram::default();
        for v in [0.005, 0.01, 0.3, 100.0, f64::NAN] {
            h.observe(v);
        }
        assert_eq!(h.count, 4);
        assert!((h.sum - 100.315).abs() < 1e-9);
        let b = h.buckets();
        assert_eq!(b.len(), DURATION_BUCKETS.len() + 1);
        assert_eq!(b[0], (0.01, 2));
        assert_eq!(b[5], (0.5, 1));
        assert_eq!(b.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), h.count);
    }
}

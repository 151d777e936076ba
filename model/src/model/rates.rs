//! Rates between two samples: what changed per second over the interval. Pure.

use serde::{Deserialize, Serialize};

use crate::sample::Sample;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Seconds between the two samples.
    pub interval_secs: f64,
    /// `/proc/vmstat` `workingset_refault_file` per second.
    pub refaults_file_per_sec: Option<f64>,
    /// `/proc/vmstat` `pgmajfault` per second.
    pub major_faults_per_sec: Option<f64>,
    /// Growth of each process's `RssAnon` (bytes per second), for processes in both.
    pub processes: Vec<ProcessRate>,
    /// Growth of each file's page-cache residency (bytes per second).
    pub files: Vec<FileRate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessRate {
    pub pid: i32,
    pub anon_bytes_per_sec: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRate {
    pub key: crate::sample::FileKey,
    pub resident_bytes_per_sec: Option<f64>,
}

fn per_sec(prev: Option<u64>, cur: Option<u64>, secs: f64) -> Option<f64> {
    Some((cur? as f64 - prev? as f64) / secs)
}

/// Rates from `prev` to `cur`, `secs` apart; `None` when no time passed.
pub fn between(prev: &Sample, cur: &Sample, secs: f64) -> Option<Rates> {
    if secs.is_nan() || secs <= 0.0 || !secs.is_finite() {
        return None;
    }
    let vm = |s: &Sample, k: &str| s.system.vmstat.get(k).copied();
    let refault =
        |s: &Sample| vm(s, "workingset_refault_file").or_else(|| vm(s, "workingset_refault"));
    let processes = cur
        .processes
        .iter()
        .filter_map(|p| {
            let q = prev.processes.iter().find(|q| q.pid == p.pid)?;
            Some(ProcessRate {
                pid: p.pid,
                anon_bytes_per_sec: per_sec(q.status.rss_anon_bytes, p.status.rss_anon_bytes, secs),
            })
        })
        .collect();
    let files = cur
        .files
        .iter()
        .filter_map(|f| {
            let g = prev.files.iter().find(|g| g.key == f.key)?;
            Some(FileRate {
                key: f.key,
                resident_bytes_per_sec: per_sec(
                    g.residency.as_ref().map(|r| r.cached_bytes),
                    f.residency.as_ref().map(|r| r.cached_bytes),
                    secs,
                ),
            })
        })
        .collect();
    Some(Rates {
        interval_secs: secs,
        refaults_file_per_sec: per_sec(refault(prev), refault(cur), secs),
        major_faults_per_sec: per_sec(vm(prev, "pgmajfault"), vm(cur, "pgmajfault"), secs),
        processes,
        files,
    })
}

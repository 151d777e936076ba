//! The readers experiment: N concurrent readers of one file inside a memory limit, with a
//! copying arm (`read()` into the heap) and a mapping arm (`MAP_SHARED`), as in the
//! article's table (N = 1, 6, 10 of a 512 MiB file under 4 GiB). The readers start together
//! from a cold page cache (all armed, then released at one barrier), so their load times
//! and rates are load rates from storage, not copies out of a warm cache.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cache::{self, CacheMode, StartCache};
use super::sandbox::{host_memory, Sandbox};
use crate::cleanup::Registry;
use crate::collect::process::ProcReader;
use crate::collect::Roots;
use crate::model::cgroup::build as cgroup_model;
use crate::spawn::Barrier;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    Copy,
    Mmap,
}

impl Arm {
    pub fn child_mode(self) -> &'static str {
        match self {
            Arm::Copy => "copy",
            Arm::Mmap => "map",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadersRow {
    pub arm: Arm,
    pub readers: usize,
    /// The file's page cache when the readers were released: evicted first (whole-file
    /// `POSIX_FADV_DONTNEED`) unless a process maps it, then measured.
    pub start_cache: StartCache,
    /// Each reader's release, in ms after the first one's (`null`: it never armed).
    pub release_offsets_ms: Vec<Option<f64>>,
    /// Last release − first release (ms): how close to together the readers started.
    pub release_spread_ms: Option<f64>,
    /// Each reader's load time, from its release to its `ready` (`null`: it died first,
    /// e.g. OOM-killed).
    pub load_seconds: Vec<Option<f64>>,
    pub load_seconds_median: Option<f64>,
    pub load_seconds_max: Option<f64>,
    /// Readers alive once all had loaded (the others were OOM-killed).
    pub alive: usize,
    pub oom_kills: Option<u64>,
    pub peak_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub page_cache_bytes: Option<u64>,
    /// Resident fraction of the file (cachestat) with all readers running.
    pub file_resident_fraction: Option<f64>,
    /// The host's MemAvailable with all readers running.
    pub mem_available_bytes: Option<u64>,
    /// PSS of each living reader.
    pub reader_pss_bytes: Vec<u64>,
    /// One reader's load rate: file size / median load time (GB/s).
    pub load_gb_per_s: Option<f64>,
    /// All readers together: readers that loaded × file size / the longest load time
    /// (GB/s).
    pub aggregate_load_gb_per_s: Option<f64>,
}

/// Drops a file's page cache (whole file; mapped pages stay).
pub fn evict(path: &Path) {
    let _ = super::cache::advise_dontneed(path);
}

/// Load times and rates from release and ready instants (pure).
pub struct Loads {
    pub release_offsets_ms: Vec<Option<f64>>,
    pub release_spread_ms: Option<f64>,
    pub load_seconds: Vec<Option<f64>>,
    pub median: Option<f64>,
    pub max: Option<f64>,
    pub gb_per_s: Option<f64>,
    pub aggregate_gb_per_s: Option<f64>,
}

pub fn loads(released: &[Option<Instant>], ready: &[Option<Instant>], size: u64) -> Loads {
    let first = released.iter().flatten().min().copied();
    let last = released.iter().flatten().max().copied();
    let release_offsets_ms = released
        .iter()
        .map(|r| Some(r.as_ref()?.duration_since(first?).as_secs_f64() * 1e3))
        .collect();
    let load_seconds: Vec<Option<f64>> = released
        .iter()
        .zip(ready)
        .map(|(r, d)| Some(d.as_ref()?.duration_since(*r.as_ref()?).as_secs_f64()))
        .collect();
    let mut done: Vec<f64> = load_seconds.iter().flatten().copied().collect();
    done.sort_by(f64::total_cmp);
    let median = super::stats::median(&done);
    let max = done.last().copied();
    let rate = |bytes: f64, secs: Option<f64>| secs.filter(|s| *s > 0.0).map(|s| bytes / s / 1e9);
    Loads {
        release_offsets_ms,
        release_spread_ms: first
            .zip(last)
            .map(|(a, b)| b.duration_since(a).as_secs_f64() * 1e3),
        gb_per_s: rate(size as f64, median),
        aggregate_gb_per_s: rate(done.len() as f64 * size as f64, max),
        load_seconds,
        median,
        max,
    }
}

/// Runs one (arm, N) configuration in a fresh sandbox: the file evicted, N readers armed
/// (started, waiting at a barrier), released together, each timed to its `ready`.
pub fn run_config(
    exe: &Path,
    file: &Path,
    arm: Arm,
    n: usize,
    limit: u64,
    registry: &Registry,
) -> anyhow::Result<ReadersRow> {
    let roots = Roots::live();
    let size = std::fs::metadata(file)?.len();
    let mut start_cache = cache::prepare(&roots.proc, file, CacheMode::Cold)?;
    let sandbox = Sandbox::create(&roots, limit, registry)?;
    let mut barrier = Barrier::arm(
        exe,
        arm.child_mode(),
        Some(file),
        &[],
        n,
        Some(&sandbox.procs_file()),
        Duration::from_secs(60),
        &|pid| registry.add_pid(pid),
    )?;
    // Armed readers have not opened the file yet: this is what the release starts from.
    (start_cache.resident_bytes, start_cache.resident_fraction) = cache::resident(file);
    let released = barrier.release();
    let ready = barrier.wait_ready(Duration::from_secs(300))?;
    let mut readers = barrier.into_readers();
    let l = loads(&released, &ready, size);
    // Let the OOM killer finish what it started.
    std::thread::sleep(Duration::from_millis(200));
    let procs = ProcReader::new(&roots.proc);
    let mut pss = Vec::new();
    let mut alive = 0;
    for r in readers.iter_mut() {
        if r.alive() {
            alive += 1;
            if let Ok(Some(roll)) = procs.rollup(r.pid()) {
                pss.push(roll.pss_bytes);
            }
        }
    }
    let cg = sandbox.read().ok().map(|s| cgroup_model(&s));
    let row = ReadersRow {
        arm,
        readers: n,
        start_cache,
        release_offsets_ms: l.release_offsets_ms,
        release_spread_ms: l.release_spread_ms,
        load_seconds: l.load_seconds,
        load_seconds_median: l.median,
        load_seconds_max: l.max,
        alive,
        oom_kills: cg.as_ref().and_then(|c| c.oom_kills),
        peak_bytes: cg.as_ref().and_then(|c| c.peak_bytes),
        anon_bytes: cg.as_ref().and_then(|c| c.anon_bytes),
        page_cache_bytes: cg.as_ref().and_then(|c| c.file_bytes),
        file_resident_fraction: cache::resident(file).1,
        mem_available_bytes: host_memory(&roots.proc).ok().map(|m| m.0),
        reader_pss_bytes: pss,
        load_gb_per_s: l.gb_per_s,
        aggregate_load_gb_per_s: l.aggregate_gb_per_s,
    };
    drop(readers);
    drop(sandbox);
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_rates_come_from_the_median_and_the_longest_load() {
        let t0 = Instant::now();
        let ms = |v: u64| Some(t0 + Duration::from_millis(v));
        // Three released within 2 ms; one never armed; one died while loading.
        let released = [ms(0), ms(1), ms(2), None, ms(2)];
        let ready = [ms(1000), ms(2001), ms(4002), None, None];
        let l = loads(&released, &ready, 2_000_000_000);
        assert_eq!(l.release_spread_ms, Some(2.0));
        assert_eq!(l.release_offsets_ms[3], None);
        assert_eq!(
            l.load_seconds,
            [Some(1.0), Some(2.0), Some(4.0), None, None]
        );
        assert_eq!((l.median, l.max), (Some(2.0), Some(4.0)));
        assert_eq!(l.gb_per_s, Some(1.0));
        // Three loaded readers × 2 GB in 4 s.
        assert_eq!(l.aggregate_gb_per_s, Some(1.5));
    }
}

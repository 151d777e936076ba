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
pub enum ReadArm {
    Copy,
    Mmap,
}

impl ReadArm {
    pub fn child_mode(self) -> &'static str {
        match self {
            ReadArm::Copy => "copy",
            ReadArm::Mmap => "map",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadersRow {
    pub arm: ReadArm,
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

/// The least a reader costs inside the cgroup (its heap, stack and page tables; measured
/// about 1.5 MiB for a `__child map` reader), whatever the arm.
pub const READER_MIN_BYTES: u64 = 2 << 20;

/// Refuses `n` readers of a `file_bytes` file that cannot fit (pure): even the mapping arm
/// needs the file once plus [`READER_MIN_BYTES`] per reader within `limit`; and each reader
/// is a process plus a thread of twofold, of which at most half the machine's free tasks
/// (`free_tasks`, `None` if unknown) may be taken.
pub fn check_readers(
    n: usize,
    file_bytes: u64,
    limit: u64,
    free_tasks: Option<(u64, u64)>,
) -> anyhow::Result<()> {
    use crate::units::iec;
    let need = file_bytes.saturating_add((n as u64).saturating_mul(READER_MIN_BYTES));
    if need > limit {
        let fit = limit.saturating_sub(file_bytes) / READER_MIN_BYTES;
        anyhow::bail!(
            "'--readers {n}' cannot fit in '--memory-max {}': the file ('{}') plus {n} readers at '{}' each need '{}'; at most {fit} readers fit",
            iec(limit),
            iec(file_bytes),
            iec(READER_MIN_BYTES),
            iec(need)
        );
    }
    if let Some((free, max)) = free_tasks {
        let tasks = (n as u64).saturating_mul(2);
        if tasks > free / 2 {
            anyhow::bail!(
                "'--readers {n}' is more than this machine can start: {n} readers need {tasks} tasks (a process and a thread of twofold each) and {free} of {max} are free, half of them kept for the rest of the machine; at most {} readers",
                free / 4
            );
        }
    }
    Ok(())
}

/// Tasks the machine can still start: the smaller of `kernel.pid_max` and
/// `kernel.threads-max`, less the tasks that exist now (`/proc/loadavg`); and that maximum.
pub fn free_tasks(proc_root: &Path) -> Option<(u64, u64)> {
    let read = |p: &str| -> Option<u64> {
        std::fs::read_to_string(proc_root.join(p))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let max = read("sys/kernel/pid_max")?.min(read("sys/kernel/threads-max")?);
    let loadavg = std::fs::read_to_string(proc_root.join("loadavg")).ok()?;
    let now: u64 = loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()?;
    Some((max.saturating_sub(now), max))
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
    arm: ReadArm,
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

    #[test]
    fn reader_counts_are_capped_by_the_limit_and_the_machine() {
        let mib = 1u64 << 20;
        assert!(check_readers(4, 64 * mib, 200 * mib, Some((30000, 32768))).is_ok());
        let err = check_readers(100_000, 64 * mib, 200 * mib, Some((30000, 32768)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'--readers 100000' cannot fit"), "{err}");
        assert!(err.contains("at most 68 readers fit"), "{err}");
        assert_eq!(err.lines().count(), 1);
        let err = check_readers(10_000, mib, 1 << 40, Some((30000, 32768)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 7500 readers"), "{err}");
        assert!(check_readers(10_000, mib, 1 << 40, None).is_ok());
    }

    #[test]
    fn free_tasks_come_from_the_pid_limits_and_loadavg() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sys/kernel")).unwrap();
        std::fs::write(d.path().join("sys/kernel/pid_max"), "32768\n").unwrap();
        std::fs::write(d.path().join("sys/kernel/threads-max"), "192730\n").unwrap();
        std::fs::write(d.path().join("loadavg"), "0.50 0.40 0.30 2/768 4242\n").unwrap();
        assert_eq!(free_tasks(d.path()), Some((32000, 32768)));
    }
}

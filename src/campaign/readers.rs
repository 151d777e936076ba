//! The readers experiment: N concurrent readers of one file inside a memory limit, with a
//! copying arm (`read()` into the heap) and a mapping arm (`MAP_SHARED`), as in the
//! article's table (N = 1, 6, 10 of a 512 MiB file under 4 GiB).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::sandbox::{host_memory, Sandbox};
use crate::cleanup::Registry;
use crate::collect::process::ProcReader;
use crate::collect::{residency, Roots};
use crate::model::cgroup::build as cgroup_model;
use crate::spawn::Reader;

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
    /// Readers alive once all were started (the others were OOM-killed).
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
    /// Median load throughput of the readers that finished loading (GB/s).
    pub load_gb_per_s: Option<f64>,
}

/// Drops a file's page cache (whole file, nothing mapped): each configuration starts cold.
pub fn evict(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on an fd we own; it only drops clean cached pages.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

fn resident_fraction(path: &Path) -> Option<f64> {
    let (f, size) = residency::open(path).ok()?;
    let r = residency::query(&f, path, size, residency::Method::Auto).ok()?;
    let pages = size.div_ceil(4096).max(1);
    Some((r.cached_bytes / 4096) as f64 / pages as f64)
}

/// Runs one (arm, N) configuration in a fresh sandbox.
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
    evict(file);
    let sandbox = Sandbox::create(&roots, limit, registry)?;
    let mut readers = Vec::new();
    let mut loads = Vec::new();
    for _ in 0..n {
        let start = Instant::now();
        match Reader::start_in(
            exe,
            arm.child_mode(),
            Some(file),
            &[],
            Duration::from_secs(300),
            Some(&sandbox.procs_file()),
        ) {
            Ok(r) => {
                loads.push(size as f64 / start.elapsed().as_secs_f64() / 1e9);
                registry.add_pid(r.pid());
                readers.push(r);
            }
            // Killed while loading (the OOM killer): counted below.
            Err(_) => continue,
        }
    }
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
    loads.sort_by(f64::total_cmp);
    let row = ReadersRow {
        arm,
        readers: n,
        alive,
        oom_kills: cg.as_ref().and_then(|c| c.oom_kills),
        peak_bytes: cg.as_ref().and_then(|c| c.peak_bytes),
        anon_bytes: cg.as_ref().and_then(|c| c.anon_bytes),
        page_cache_bytes: cg.as_ref().and_then(|c| c.file_bytes),
        file_resident_fraction: resident_fraction(file),
        mem_available_bytes: host_memory(&roots.proc).ok().map(|m| m.0),
        reader_pss_bytes: pss,
        load_gb_per_s: super::stats::median(&loads),
    };
    drop(readers);
    drop(sandbox);
    Ok(row)
}

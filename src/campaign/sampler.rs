//! The campaign sampler: every interval, the sandbox cgroup's counters, the summed
//! `RssAnon`/`RssFile` of its processes, and the page-cache residency (cachestat) of the
//! files of interest. Runs on its own thread; the samples come back when it is stopped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::collect::process::ProcReader;
use crate::collect::{cgroup, residency};
use crate::model::cgroup::build as cgroup_model;
use crate::sample::CgroupVersion;

/// One sample (bytes unless named otherwise).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub t_seconds: f64,
    pub usage_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub file_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub file_mapped_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    pub processes: usize,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Resident bytes of each file of interest, in the order given.
    pub files_resident_bytes: Vec<Option<u64>>,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Point>>,
}

struct Target {
    dir: PathBuf,
    version: CgroupVersion,
    procs: ProcReader,
    files: Vec<Option<(File, PathBuf, u64)>>,
}

impl Target {
    fn sample(&self, t: f64) -> Point {
        let mut p = Point {
            t_seconds: t,
            ..Point::default()
        };
        if let Ok(s) = cgroup::read_dir(&self.dir, Some(self.version)) {
            let m = cgroup_model(&s);
            p.usage_bytes = m.usage_bytes;
            p.anon_bytes = m.anon_bytes;
            p.file_bytes = m.file_bytes;
            p.shmem_bytes = m.shmem_bytes;
            p.file_mapped_bytes = m.file_mapped_bytes;
            p.oom_kills = m.oom_kills;
        }
        let pids: Vec<i32> = std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        p.processes = pids.len();
        for pid in pids {
            if let Ok(st) = self.procs.status(pid) {
                p.rss_anon_bytes += st.status.rss_anon_bytes.unwrap_or(0);
                p.rss_file_bytes += st.status.rss_file_bytes.unwrap_or(0);
            }
        }
        p.files_resident_bytes = self
            .files
            .iter()
            .map(|f| {
                let (file, path, size) = f.as_ref()?;
                residency::query(file, path, *size, residency::Method::Auto)
                    .ok()
                    .map(|r| r.cached_bytes.min(size.next_multiple_of(4096)))
            })
            .collect();
        p
    }
}

impl Sampler {
    /// Starts sampling the cgroup at `dir` every `interval`.
    pub fn start(
        proc_root: &Path,
        dir: &Path,
        version: CgroupVersion,
        files: &[PathBuf],
        interval: Duration,
    ) -> Sampler {
        let target = Target {
            dir: dir.to_path_buf(),
            version,
            procs: ProcReader::new(proc_root),
            files: files
                .iter()
                .map(|f| residency::open(f).ok().map(|(h, s)| (h, f.clone(), s)))
                .collect(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut points = Vec::new();
            let mut next = Duration::ZERO;
            loop {
                points.push(target.sample(start.elapsed().as_secs_f64()));
                if flag.load(Ordering::Relaxed) {
                    return points;
                }
                next += interval;
                let now = start.elapsed();
                if next > now {
                    // Sleep in small steps so that a stop is seen quickly.
                    let until = start + next;
                    while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(10)));
                    }
                } else {
                    next = now;
                }
            }
        });
        Sampler { stop, handle }
    }

    /// Stops sampling (after one last sample) and returns every sample.
    pub fn finish(self) -> Vec<Point> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

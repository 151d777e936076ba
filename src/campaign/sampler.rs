//! The campaign sampler: every interval, the sandbox cgroup's counters and the summed
//! `RssAnon`/`RssFile` of its processes; at most once a second (and in the first and last
//! sample), the page-cache residency (cachestat) of the files of interest, whose cost grows
//! with the number of cached folios. Runs on its own thread; the samples come back when it
//! is stopped.

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
pub struct TimelinePoint {
    pub t_seconds: f64,
    pub usage_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub file_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub file_mapped_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
    /// Cumulative `workingset_refault_file` of the cgroup (pages).
    pub refaults_file: Option<u64>,
    pub processes: usize,
    /// Summed over the processes, from `/proc/PID/statm` (cheaper than `status`):
    /// `resident − shared` (= RssAnon) and `shared` (= RssFile + RssShmem).
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    /// Resident bytes of each file of interest, in the order given.
    pub files_resident_bytes: Vec<Option<u64>>,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(Vec<TimelinePoint>, f64)>,
}

/// CPU seconds (user + system) of the calling thread, from getrusage(RUSAGE_THREAD).
fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes only into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is valid on Linux.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

struct CgroupWatch {
    dir: PathBuf,
    version: CgroupVersion,
    procs: ProcReader,
    files: Vec<Option<(File, PathBuf, u64)>>,
}

/// (RssAnon, RssFile + RssShmem) in bytes from `/proc/PID/statm` (pages).
fn statm(procs: &ProcReader, pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(procs.root().join(pid.to_string()).join("statm")).ok()?;
    let mut it = text
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().ok());
    let (resident, shared) = (it.next()??, it.next()??);
    let page = crate::collect::system::page_size();
    Some((resident.saturating_sub(shared) * page, shared * page))
}

impl CgroupWatch {
    fn sample(&self, t: f64, with_files: bool) -> TimelinePoint {
        let mut p = TimelinePoint {
            t_seconds: t,
            ..TimelinePoint::default()
        };
        if let Ok(s) = cgroup::read_counters(&self.dir, self.version) {
            let m = cgroup_model(&s);
            p.usage_bytes = m.usage_bytes;
            p.anon_bytes = m.anon_bytes;
            p.file_bytes = m.file_bytes;
            p.shmem_bytes = m.shmem_bytes;
            p.file_mapped_bytes = m.file_mapped_bytes;
            p.oom_kills = m.oom_kills;
            p.refaults_file = m.refaults_file;
        }
        let pids: Vec<i32> = std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        p.processes = pids.len();
        for pid in pids {
            if let Some((anon, shared)) = statm(&self.procs, pid) {
                p.rss_anon_bytes += anon;
                p.rss_file_bytes += shared;
            }
        }
        if !with_files {
            p.files_resident_bytes = vec![None; self.files.len()];
            return p;
        }
        p.files_resident_bytes = self
            .files
            .iter()
            .map(|f| {
                let (file, path, size) = f.as_ref()?;
                residency::query(file, path, *size, residency::Method::Auto)
                    .ok()
                    .map(|r| {
                        r.cached_bytes
                            .min(size.next_multiple_of(crate::collect::system::page_size()))
                    })
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
        files_interval: Duration,
    ) -> Sampler {
        let target = CgroupWatch {
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
            let files_every =
                (files_interval.as_nanos() / interval.as_nanos().max(1)).max(1) as usize;
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let with_files = points.len() % files_every == 0 || stopping;
                points.push(target.sample(start.elapsed().as_secs_f64(), with_files));
                if stopping {
                    return (points, thread_cpu_seconds());
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

    /// Stops sampling (after one last sample) and returns every sample and the CPU
    /// seconds the sampler used.
    pub fn finish(self) -> (Vec<TimelinePoint>, f64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

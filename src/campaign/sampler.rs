//! The campaign sampler: every interval, the sandbox cgroup's counters and the summed
//! `RssAnon`/`RssFile` of its processes; at most once a second (and in the first and last
//! sample), the page-cache residency (cachestat) of the files of interest, whose cost grows
//! with the number of cached folios. Each sample is a raw [`CampaignTick`]; its
//! [`TimelinePoint`] is the model's view of it ([`timeline::point`]). Runs on its own
//! thread; the points come back when it is stopped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collect::process::ProcReader;
use crate::collect::{cgroup, residency};
use crate::model::timeline;
use crate::sample::campaign::{CampaignTick, FileTick, Statm};
use crate::sample::CgroupVersion;

pub use crate::model::timeline::TimelinePoint;

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

/// `/proc/PID/statm`'s resident and shared sizes (pages).
fn statm(procs: &ProcReader, pid: i32) -> Option<Statm> {
    let text = std::fs::read_to_string(procs.root().join(pid.to_string()).join("statm")).ok()?;
    let mut it = text
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().ok());
    Some(Statm {
        resident_pages: it.next()??,
        shared_pages: it.next()??,
    })
}

impl CgroupWatch {
    /// The raw tick at `t`; the residency of the files only `with_files`.
    fn sample(&self, t: f64, with_files: bool) -> CampaignTick {
        let pids: Vec<i32> = std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        CampaignTick {
            t_seconds: t,
            page_bytes: crate::collect::system::page_size(),
            cgroup: cgroup::read_counters(&self.dir, self.version).ok(),
            processes: pids.len(),
            statm: pids.iter().filter_map(|p| statm(&self.procs, *p)).collect(),
            files: self
                .files
                .iter()
                .map(|f| {
                    let (file, path, size) = f.as_ref().filter(|_| with_files)?;
                    let r = residency::query(file, path, *size, residency::Method::Auto).ok()?;
                    Some(FileTick {
                        cached_bytes: r.cached_bytes,
                        size_bytes: *size,
                    })
                })
                .collect(),
        }
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
                .map(|f| residency::open(f).ok().map(|(h, s, _)| (h, f.clone(), s)))
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
                let tick = target.sample(start.elapsed().as_secs_f64(), with_files);
                points.push(timeline::point(&tick));
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

//! The engine: one place that collects a timestamped [`Snapshot`] (the sample of
//! `/proc`, cgroups and residency, with the byte-level proofs and the read() ledger as
//! inputs), and the one pure way to turn a snapshot, and optionally the one before it, into
//! the [`Report`] every view shows: `scan`, `replay`, `record`, `dump` and campaigns.
//!
//! Collection keeps nothing a report needs outside the snapshot, so a recorded snapshot
//! renders exactly as it did live. With tracing on ([`Engine::set_tracing`]), each
//! snapshot also carries the eBPF counters ([`TraceSample`]) with the names they need, and
//! [`report`] turns them into the report's trace section (totals, and rates from the
//! snapshot before).

use crate::sample::Warning;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod carry;
mod held;
mod ledger;
mod manual;
mod placed;
mod reuse;
mod todo;
mod tracing;
mod uploads;
mod weighed;
pub use crate::sample::unsearched::CHANGED_SINCE_SEARCH;
pub use manual::{Progress, ProveJob, Proved};
use reuse::Reused;
pub(crate) use reuse::{Fingerprint, Fingerprints};
pub use reuse::{
    REPROVE_AFTER, REPROVE_COST_FACTOR, RESEARCH_COST_FACTOR, RESEARCH_MAX, RESEARCH_MIN,
    REVERIFY_AFTER,
};
pub use weighed::{REWEIGH_AFTER, REWEIGH_AFTER_QUIET, REWEIGH_AFTER_TRACKED};

use crate::collect::cache::{CacheStats, ProcCache};
use crate::collect::gather::{self, Request};
use crate::collect::Roots;
use crate::dupes::prove::ProveOptions;
use crate::sample::FileKey;

pub use crate::sample::snapshot::{Snapshot, SNAPSHOT_VERSION};

/// The clocks, read once.
pub fn now() -> (u64, u64) {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0);
    (wall, mono)
}

/// Collects snapshots of what `req` names, with the proof when `prove` is set.
pub struct Engine {
    pub roots: Roots,
    pub req: Request,
    pub prove: Option<ProveOptions>,
    /// Proofs of earlier snapshots, reused while nothing they depend on changed (looked
    /// up once per candidate each snapshot: hashed, not a tree of 2,000 large entries).
    reuse: std::collections::HashMap<(i32, FileKey), Reused, foldhash::fast::RandomState>,
    /// The (process, file) searches the budget cut, one after another: searched again at
    /// the next snapshot with twice the budget ([`todo::MAX_BOOST`]).
    cut: std::collections::HashMap<(i32, FileKey), u32, foldhash::fast::RandomState>,
    /// How many (process, file) proofs the last snapshot reused rather than searched.
    pub last_reused: usize,
    /// How many it checked again in place (memory changed within the search cadence).
    pub last_rechecked: usize,
    /// How many it searched again only where the process's memory moved since its last
    /// search (the rest passed over: the count stays exact).
    pub last_moved: usize,
    /// Of the proofs searched again in the last snapshot, those that kept the copies
    /// found before (checked in place) and searched the rest only.
    pub last_carried: usize,
    /// Of those reused, the searches due again of processes that had not run since.
    pub last_slept: usize,
    /// How many processes' placements (present ranges and sampled frames,
    /// [`crate::dupes::moved::Placement`]) the last snapshot read: a changed process whose
    /// threads took no page fault since its placement was read needs none.
    pub last_placements: usize,
    /// How many files' copies the last snapshot weighed again (read their page maps)
    /// rather than keep their last share-out.
    pub last_weighed: usize,
    /// Wall time of the last snapshot's proof, seconds (`None`: it did not prove).
    pub last_proof_seconds: Option<f64>,
    /// NVML (or a test's fixture), opened once.
    gpu: Box<dyn crate::collect::gpu::GpuSource>,
    /// What unchanged processes need not be read again for (`top`, `serve`, `record`);
    /// `None` reads everything every snapshot (`scan`).
    cache: Option<ProcCache>,
    /// The eBPF tracer, while tracing is on.
    tracing: Option<tracing::Tracing>,
    /// The last share-out of each file's physical pages, kept while nothing it depends on
    /// changed.
    weighed: std::collections::BTreeMap<crate::sample::FileKey, weighed::Weighed>,
    /// The content index of the model files, kept across proofs while they do not change.
    index: crate::dupes::indexcache::IndexCache,
    /// The files of interest of the last snapshot (key, path): what tracing pins and names.
    interest: Vec<(FileKey, String)>,
    /// Proofs asked for by hand ([`Engine::prove_now`]), merged into later snapshots.
    manual: BTreeMap<(i32, FileKey), manual::Manual>,
    /// When the free heap was last looked at ([`give_back_free_heap`]).
    trimmed: Option<std::time::Instant>,
    /// The fingerprints of the files of interest, kept per version to link twins
    /// ([`crate::dupes::twins`]); made when two files first have one size.
    twin_points: Option<crate::dupes::pointcache::PointCache>,
}

impl Engine {
    pub fn new(req: Request, prove: Option<ProveOptions>) -> Engine {
        Engine {
            roots: Roots::live(),
            req,
            prove,
            reuse: Default::default(),
            cut: Default::default(),
            last_reused: 0,
            last_rechecked: 0,
            last_moved: 0,
            last_carried: 0,
            last_slept: 0,
            last_placements: 0,
            last_weighed: 0,
            last_proof_seconds: None,
            gpu: crate::collect::gpu::source(),
            cache: None,
            tracing: None,
            interest: Vec::new(),
            index: Default::default(),
            weighed: std::collections::BTreeMap::new(),
            manual: BTreeMap::new(),
            trimmed: None,
            twin_points: None,
        }
    }

    /// Makes later snapshots incremental: a process whose counters did not change is not
    /// read again for up to `max_age` (see [`crate::collect::cache`] for the rule).
    pub fn incremental(mut self, max_age: Duration) -> Engine {
        let mut cache = ProcCache::new(max_age);
        // The host's processes in one read, where this engine reads the host's `/proc`.
        if self.roots.proc == std::path::Path::new("/proc") {
            cache.tasks.want();
        }
        self.cache = Some(cache);
        self
    }

    /// Whether an incremental engine reads the BPF task iterator (on by default where it
    /// reads the host's `/proc`, unless `TWOFOLD_NO_TASK_ITER` is set).
    pub fn task_iterator(mut self, on: bool) -> Engine {
        if let Some(c) = self.cache.as_mut() {
            c.tasks.set_wanted(on);
        }
        self
    }

    /// Whether an incremental engine reads its kept files' page counts at every snapshot
    /// (where the task iterator loads), not only where that costs less than `cachestat`.
    pub fn held_pages_always(mut self, on: bool) -> Engine {
        if let Some(c) = self.cache.as_mut() {
            c.held.always_pages = on;
        }
        self
    }

    /// How many kept files' residency the last snapshot took as it stood (their page
    /// count and stamp unchanged: `collect::heldfiles::Since`), not from `cachestat`.
    pub fn residencies_stood(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.held.stood)
    }

    /// How many content indexes were built and reused since the start, and how many are
    /// kept now.
    pub fn index_stats(&self) -> (u64, u64, usize) {
        (self.index.built, self.index.reused, self.index.len())
    }

    /// What the last snapshot reused and read (`None` without [`Engine::incremental`]).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.cache.as_ref().map(|c| c.stats)
    }

    /// The memory ranges of the copies the last search of (`pid`, `file`) found (empty
    /// when none is kept), to weigh proofs merged from elsewhere with the engine's.
    pub fn copy_ranges(&self, pid: i32, file: FileKey) -> crate::dupes::physical::CopyRanges {
        self.reuse
            .get(&(pid, file))
            .map(|r| crate::dupes::physical::CopyRanges::of(file, &r.proof.found))
            .unwrap_or_default()
    }

    /// One snapshot (with the eBPF counters when tracing is on). Warnings (a process that
    /// could not be read, a file that vanished) are appended.
    pub fn snapshot(&mut self, warnings: &mut Vec<Warning>) -> anyhow::Result<Snapshot> {
        let (at_unix_ns, at_mono_ns) = now();
        let cpu0 = (crate::collect::thread_cpu(), crate::collect::worker_cpu());
        if let Some(t) = self.tracing.as_mut() {
            t.take_warnings(warnings);
        }
        // A one-shot window (`trace_once`) is read first and detached, so the collection
        // and the proof run untraced.
        let mut trace = match self.tracing.as_mut() {
            Some(t) if t.once => t.tracer.take().map(|tracer| tracer.sample()),
            _ => None,
        };
        // GPUs next: the processes holding device memory are kept in the sample.
        let gpu = crate::collect::gpu::sample(self.gpu.as_mut(), &self.roots.proc);
        self.req.gpu_pids = gpu
            .devices
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.pid))
            .collect();
        // A one-shot collection leaves the rollups of processes that hold nothing (the
        // candidates) to be read beside the proof: both are page-table walks.
        self.req.defer_rollups = self.cache.is_none() && self.prove.is_some();
        // The holders of copies whose pages were weighed: their faults are read each time.
        if let Some(c) = self.cache.as_mut() {
            c.watch = self.weighed.values().flat_map(|w| w.pids()).collect();
        }
        let mut sample =
            gather::gather_cached(&self.roots, &self.req, warnings, self.cache.as_mut())?;
        sample.gpu = gpu;
        crate::dupes::twins::link(
            &self.roots.proc,
            &mut sample,
            &mut self.twin_points,
            self.cache.as_ref().map(|c| &c.held),
        );
        self.last_proof_seconds = None;
        if let Some(opts) = self.prove {
            let began = std::time::Instant::now();
            let which = if self.req.defer_rollups {
                gather::deferred_rollups(&sample)
            } else {
                Vec::new()
            };
            let roots = self.roots.clone();
            let (proofs, rollups) = std::thread::scope(|s| {
                let reading = (!which.is_empty())
                    .then(|| s.spawn(|| gather::read_rollups(&roots, &sample, &which)));
                let proofs = self.prove(&sample, opts, warnings);
                let rollups = reading.map(|h| h.join().unwrap_or_default());
                (proofs, rollups)
            });
            sample.proofs = proofs;
            if let Some(r) = rollups {
                gather::fill_rollups(&mut sample, &which, r);
            }
            self.last_proof_seconds = Some(began.elapsed().as_secs_f64());
        }
        gather::keep_related(&mut sample);
        crate::collect::gpu::settle(self.gpu.as_mut(), &mut sample.gpu);
        self.merge_manual(&mut sample);
        // An index of files that left, or were deleted, is let go now (its open files
        // would keep them alive).
        self.index
            .keep_only(&sample.files.iter().map(|f| f.key).collect());
        self.interest = sample
            .files
            .iter()
            .map(|f| (f.key, f.path.clone()))
            .collect();
        // Continuous tracing reads the counters after the collection and the proof: a copy
        // the proof found was read before, so the ledger holds its reads. The read()
        // ledger is the counters' `io` (cumulative since attach: a process that read a file
        // an hour ago and closed it is still known to have ingested it); `sample.reads`
        // stays empty rather than hold it twice.
        if let Some(cur) = self.trace_for_snapshot(warnings) {
            trace = Some(cur);
        }
        if let Some(u) = self.tracing.as_mut().and_then(|t| t.uploads.as_mut()) {
            let mut said = Vec::new();
            sample.gpu.uploads = Some(u.sample(&sample, &mut said));
            warnings.extend(said.into_iter().map(tracing::upload_warning));
        } else {
            // No tracing of its own: what a resident tracer of the host saw (one tracer
            // per host, `collect::hostledger`).
            let own = std::process::id() as i32;
            let dir = crate::collect::hostledger::ledger_dir();
            sample.gpu.uploads = crate::collect::hostledger::read_host(&dir, &self.roots.proc, own)
                .map(|mut u| {
                    uploads::with_gpus(&mut u, &sample.gpu);
                    u
                });
        }
        if let (Some(t), Some(cur)) = (self.tracing.as_mut(), trace.as_mut()) {
            if t.once {
                // A one-shot window, read before the collection: named now.
                t.annotate(&self.req, &self.interest, cur, warnings);
            }
        }
        if self
            .tracing
            .as_ref()
            .is_some_and(|t| t.once && t.tracer.is_none())
        {
            self.tracing = None;
        }
        if self.cache.is_some() && self.trimmed.is_none_or(|at| at.elapsed() >= TRIM_EVERY) {
            self.trimmed = Some(std::time::Instant::now());
            give_back_free_heap();
        }
        if std::env::var_os("TWOFOLD_PROFILE").is_some() {
            let (cpu, (c, w)) = (crate::collect::thread_cpu(), crate::collect::worker_cpu());
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "cpu: snapshot {:.1} ms on its thread, {:.1} ms on collection workers, {:.1} ms on sweep workers",
                ms(cpu.saturating_sub(cpu0.0)),
                ms(c.saturating_sub(cpu0.1 .0)),
                ms(w.saturating_sub(cpu0.1 .1)),
            );
            eprintln!(
                "proof: {:.1} ms: {} reused ({} had not run), {} checked in place, {} moved, {} carried, {} placements read, {} files weighed",
                self.last_proof_seconds.unwrap_or(0.0) * 1e3,
                self.last_reused,
                self.last_slept,
                self.last_rechecked,
                self.last_moved,
                self.last_carried,
                self.last_placements,
                self.last_weighed
            );
            if let Some(c) = self.cache.as_ref() {
                let t = &c.tasks;
                eprintln!(
                    "tasks: {} stamps, {} statm reads skipped, {} of {} kept files' residency stood{}",
                    t.now().map_or(0, |s| s.len()),
                    c.stats.statm_skipped,
                    c.held.stood,
                    c.held.len(),
                    t.unavailable()
                        .map(|w| format!(" (iterator unavailable: {w})"))
                        .unwrap_or_default()
                );
            }
        }
        Ok(Snapshot {
            version: SNAPSHOT_VERSION,
            at_unix_ns,
            at_mono_ns,
            sample,
            trace,
        })
    }
}

/// The report of a snapshot: the one pure entry every view uses ([`model::build`]).
pub use crate::model::build as report;

/// Hands the free pages of the heap back to the kernel (glibc's `malloc_trim(0)`, which
/// releases free pages inside every arena, not only at the top) once the heap holds more
/// than [`TRIM_ABOVE`] free. A long-running engine (`serve`, `record`, `top`) builds and
/// drops an index of the model files when it searches; without this, glibc keeps the freed
/// pages and RSS stays at the search's peak. Trimming after every snapshot handed back and
/// faulted in again the same few pages each time (page faults were 4% of serve's steady
/// CPU on the bench host, perf).
fn give_back_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallinfo2 and malloc_trim only take the allocator's own locks; malloc_trim
    // returns free pages.
    unsafe {
        if libc::mallinfo2().fordblks >= TRIM_ABOVE {
            libc::malloc_trim(0);
        }
    }
}

/// A long-running engine looks at its free heap at most this often (`mallinfo2` walks the
/// allocator's free lists: a tenth of a millisecond each snapshot of `record`).
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Free heap bytes kept rather than handed back ([`give_back_free_heap`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_ABOVE: usize = 4 << 20;

/// For a long-running command (`serve`, `record`, `top`), called before it starts any
/// thread: one malloc arena for all threads (glibc's `M_ARENA_MAX`). With an arena per
/// thread (the HTTP workers, the proof's search threads), the pages that each snapshot's
/// proof frees are spread over arenas that `malloc_trim` cannot empty, and serve's RSS
/// floor crept from 30 to 80 MB in 10 minutes beside a 200,000-tensor copy; with one arena
/// it stayed at 12.5 MB (bench/RESULTS-soak.md). The search threads read into buffers
/// they keep, so they rarely meet on the arena's lock.
pub fn one_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(test)]
mod tests;

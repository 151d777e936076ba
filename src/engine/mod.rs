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

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod manual;
mod reuse;
pub use crate::sample::unsearched::CHANGED_SINCE_SEARCH;
pub use manual::{Progress, ProveJob, Proved};
use reuse::Reused;
pub(crate) use reuse::{fingerprint, Fingerprint};
pub use reuse::{REPROVE_AFTER, RESEARCH_COST_FACTOR, RESEARCH_MAX, RESEARCH_MIN};

use crate::collect::bpf::{TraceOptions, Tracer};
use crate::collect::cache::{CacheStats, ProcCache};
use crate::collect::gather::{self, Request};
use crate::collect::names::Names;
use crate::collect::Roots;
use crate::dupes::prove::ProveOptions;
use crate::model;
use crate::model::trace::{TraceContext, TraceModel};
use crate::sample::trace::{TraceNames, TraceSample};
use crate::sample::{FileKey, Sample};

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
    /// Proofs of earlier snapshots, reused while nothing they depend on changed.
    reuse: BTreeMap<(i32, FileKey), Reused>,
    /// How many (process, file) proofs the last snapshot reused rather than searched.
    pub last_reused: usize,
    /// How many it checked again in place (memory changed within the search cadence).
    pub last_rechecked: usize,
    /// Wall time of the last snapshot's proof, seconds (`None`: it did not prove).
    pub last_proof_seconds: Option<f64>,
    /// NVML (or a test's fixture), opened once.
    gpu: Box<dyn crate::collect::gpu::GpuSource>,
    /// What unchanged processes need not be read again for (`top`, `serve`, `record`);
    /// `None` reads everything every snapshot (`scan`).
    cache: Option<ProcCache>,
    /// The eBPF tracer, while tracing is on.
    tracing: Option<Tracing>,
    /// Proofs asked for by hand ([`Engine::prove_now`]), merged into later snapshots.
    manual: BTreeMap<(i32, FileKey), manual::Manual>,
}

/// What the engine keeps while tracing: the tracer, what it pinned, names it resolved and
/// the sample before.
struct Tracing {
    /// `None` once a one-shot window ([`Engine::trace_once`]) has been read.
    tracer: Option<Tracer>,
    /// Detach right after the next sample.
    once: bool,
    pinned: BTreeSet<FileKey>,
    names: Names,
    prev: Option<TraceSample>,
    /// Non-fatal attach problems, reported with the next snapshot.
    warnings: Vec<String>,
    /// The per-process counters of the last sample, as read (see [`fold_exited`]).
    before: Option<PerProcess>,
    /// Bytes read per file by processes folded away since the attach.
    exited_read: BTreeMap<FileKey, u64>,
}

type PerProcess = (
    BTreeMap<i32, crate::sample::trace::PidCounters>,
    BTreeMap<(i32, FileKey), crate::sample::trace::IoCounters>,
);

impl Engine {
    pub fn new(req: Request, prove: Option<ProveOptions>) -> Engine {
        Engine {
            roots: Roots::live(),
            req,
            prove,
            reuse: BTreeMap::new(),
            last_reused: 0,
            last_rechecked: 0,
            last_proof_seconds: None,
            gpu: crate::collect::gpu::source(),
            cache: None,
            tracing: None,
            manual: BTreeMap::new(),
        }
    }

    /// Makes later snapshots incremental: a process whose counters did not change is not
    /// read again for up to `max_age` (see [`crate::collect::cache`] for the rule).
    pub fn incremental(mut self, max_age: Duration) -> Engine {
        self.cache = Some(ProcCache::new(max_age));
        self
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

    /// Whether tracing is on.
    pub fn tracing(&self) -> bool {
        self.tracing.is_some()
    }

    /// Turns eBPF tracing on (attaching the programs, pinning the request's files and
    /// processes) or off (detaching them). Snapshots carry the counters while it is on;
    /// counters start from zero at each attach. `Err` says why it cannot be turned on (no
    /// privilege, no tracepoint), in words for people; the engine goes on without it.
    pub fn set_tracing(&mut self, on: bool) -> Result<(), String> {
        if !on {
            self.tracing = None;
            return Ok(());
        }
        if self.tracing.is_some() {
            return Ok(());
        }
        let files = explicit_keys(&self.req.paths);
        let tracer = Tracer::attach(&TraceOptions::pinning(&self.req.pids, &files))
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        self.tracing = Some(Tracing {
            warnings: tracer.warnings().to_vec(),
            tracer: Some(tracer),
            once: false,
            pinned: files.into_iter().collect(),
            names: Names::new(&self.roots, BTreeMap::new()),
            prev: None,
            before: None,
            exited_read: BTreeMap::new(),
        });
        Ok(())
    }

    /// Turns tracing on for one window: the next snapshot carries the counters since now
    /// and detaches the programs as soon as it has read them, before collecting (so a
    /// one-shot scan's own collection and proof run untraced, as fast as without it).
    pub fn trace_once(&mut self) -> Result<(), String> {
        self.set_tracing(true)?;
        if let Some(t) = self.tracing.as_mut() {
            t.once = true;
        }
        Ok(())
    }

    /// Counters the tracer could not attach, with the reason (empty when tracing is off).
    pub fn trace_unavailable(&self) -> BTreeMap<crate::sample::trace::Counter, String> {
        self.tracing
            .as_ref()
            .and_then(|t| t.tracer.as_ref())
            .map(|t| t.unavailable().clone())
            .unwrap_or_default()
    }

    /// One snapshot (with the eBPF counters when tracing is on). Warnings (a process that
    /// could not be read, a file that vanished) are appended.
    pub fn snapshot(&mut self, warnings: &mut Vec<String>) -> anyhow::Result<Snapshot> {
        let (at_unix_ns, at_mono_ns) = now();
        if let Some(t) = self.tracing.as_mut() {
            warnings.append(&mut t.warnings);
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
        let mut sample =
            gather::gather_cached(&self.roots, &self.req, warnings, self.cache.as_mut())?;
        sample.gpu = gpu;
        self.last_proof_seconds = None;
        if let Some(opts) = self.prove {
            let began = std::time::Instant::now();
            sample.proofs = self.prove(&sample, opts, warnings);
            self.last_proof_seconds = Some(began.elapsed().as_secs_f64());
        }
        self.merge_manual(&mut sample);
        if let Some(t) = self.tracing.as_mut() {
            // Continuous tracing reads the counters after the collection and the proof:
            // a copy the proof found was read before, so the ledger holds its reads.
            if let Some(tracer) = t.tracer.as_mut() {
                let mut cur = tracer.sample();
                fold_exited(
                    &self.roots.proc,
                    tracer,
                    &mut t.before,
                    &mut t.exited_read,
                    &mut cur,
                );
                trace = Some(cur);
            }
            // The read() ledger is the counters' `io` (cumulative since attach: a process
            // that read a file an hour ago and closed it is still known to have ingested
            // it); `sample.reads` stays empty rather than hold it twice.
            if let Some(cur) = trace.as_mut() {
                t.annotate(&self.req, &sample, cur, warnings);
            }
            if t.tracer.is_none() {
                self.tracing = None;
            }
        }
        if self.cache.is_some() {
            give_back_free_heap();
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

/// Forgets the processes that exited before the last sample and did nothing since: their
/// counters leave the sample and the kernel's maps ([`Tracer::forget`]), and what they read
/// of each file is kept in `exited` (the sample's `exited_read_bytes`), so that per-file
/// totals and rates stay whole. A process that exits shows in the one sample after its
/// last event, then only in the per-file totals: a recording's frames hold the living and
/// the recently exited, not every process since the attach.
fn fold_exited(
    proc_root: &std::path::Path,
    tracer: &mut Tracer,
    before: &mut Option<PerProcess>,
    exited: &mut BTreeMap<FileKey, u64>,
    cur: &mut TraceSample,
) {
    if let Some((pids, io)) = before.as_ref() {
        let idle_pids: Vec<i32> = cur
            .pids
            .iter()
            .filter(|(p, c)| pids.get(p) == Some(c))
            .map(|(p, _)| *p)
            .collect();
        let idle_io: Vec<(i32, FileKey)> = cur
            .io
            .iter()
            .filter(|(k, c)| io.get(k) == Some(c))
            .map(|(k, _)| *k)
            .collect();
        if !idle_pids.is_empty() || !idle_io.is_empty() {
            // Processes (counters are kept per thread-group id, as /proc lists them);
            // when /proc cannot be listed, nobody is taken for gone.
            let alive: std::collections::HashSet<i32> =
                match crate::collect::process::ProcReader::new(proc_root).pids() {
                    Ok(pids) => pids.into_iter().collect(),
                    Err(_) => cur
                        .pids
                        .keys()
                        .chain(cur.io.keys().map(|k| &k.0))
                        .copied()
                        .collect(),
                };
            let gone_pids: Vec<i32> = idle_pids
                .into_iter()
                .filter(|p| !alive.contains(p))
                .collect();
            let gone_io: Vec<(i32, FileKey)> = idle_io
                .into_iter()
                .filter(|(p, _)| !alive.contains(p))
                .collect();
            for p in &gone_pids {
                cur.pids.remove(p);
            }
            for k in &gone_io {
                if let Some(c) = cur.io.remove(k) {
                    let e = exited.entry(k.1).or_default();
                    *e = e.saturating_add(c.read_bytes);
                }
            }
            tracer.forget(&gone_pids, &gone_io);
        }
    }
    *before = Some((cur.pids.clone(), cur.io.clone()));
    cur.exited_read_bytes = exited.clone();
}

/// (dev, inode) of the request's paths that are files (directories' model files are
/// pinned once collection finds them).
fn explicit_keys(paths: &[std::path::PathBuf]) -> Vec<FileKey> {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .filter(|m| m.is_file())
        .map(|m| FileKey::from_dev(m.dev(), m.ino()))
        .collect()
}

impl Tracing {
    /// Pins the files of interest collection found, and names what a report of `cur`
    /// (with the sample before it, or without) would show that the sample does not name.
    fn annotate(
        &mut self,
        req: &Request,
        sample: &Sample,
        cur: &mut TraceSample,
        warnings: &mut Vec<String>,
    ) {
        let new: Vec<FileKey> = sample
            .files
            .iter()
            .map(|f| f.key)
            .filter(|k| !self.pinned.contains(k))
            .collect();
        if let (false, Some(tracer)) = (new.is_empty(), self.tracer.as_mut()) {
            match tracer.pin_files(&new) {
                Ok(()) => self.pinned.extend(new),
                Err(e) => warnings.push(format!("--trace: {:#}", anyhow::Error::from(e))),
            }
        }
        cur.pinned_pids = req.pids.clone();
        // The widest context a report can have: every file of the sample is of interest
        // (a report keeps a subset), so every row a report shows is a row here too.
        let mut ctx = TraceContext {
            paths: sample
                .files
                .iter()
                .map(|f| (f.key, f.path.clone()))
                .collect(),
            interest: sample.files.iter().map(|f| f.key).collect(),
            pids: req.pids.clone(),
            top: model::TRACE_TOP,
            ..TraceContext::default()
        };
        for (k, p) in self.names.paths() {
            ctx.paths.entry(*k).or_insert_with(|| p.clone());
        }
        let prev = self
            .prev
            .as_ref()
            .filter(|p| crate::sample::trace::same_attachment(p, cur));
        let mut keys = BTreeSet::new();
        let mut pids = BTreeSet::new();
        for m in [
            TraceModel::new(cur, prev, &ctx),
            TraceModel::new(cur, None, &ctx),
        ] {
            keys.extend(m.files.iter().map(|f| f.key));
            keys.extend(
                m.processes
                    .iter()
                    .flat_map(|p| p.files.iter().map(|f| f.key)),
            );
            pids.extend(m.processes.iter().map(|p| p.pid));
        }
        let named: BTreeSet<FileKey> = sample.files.iter().map(|f| f.key).collect();
        keys.retain(|k| !named.contains(k));
        self.names.resolve_paths(&keys);
        self.names.resolve_comms(&pids);
        cur.names = TraceNames {
            paths: keys
                .iter()
                .filter_map(|k| Some((*k, self.names.paths().get(k)?.clone())))
                .collect(),
            comms: pids
                .iter()
                .filter_map(|p| Some((*p, self.names.comms().get(p)?.clone())))
                .collect(),
        };
        self.prev = Some(cur.clone());
    }
}

/// The report of a snapshot: the one pure entry every view uses ([`model::build`]).
pub use crate::model::build as report;

/// Hands the free pages of the heap back to the kernel (glibc's `malloc_trim(0)`, which
/// releases free pages inside every arena, not only at the top). A long-running engine
/// (`serve`, `record`, `top`) builds and drops an index of the model files at every proof;
/// without this, glibc keeps the freed pages and RSS stays at the proof's peak.
fn give_back_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only takes the allocator's own locks and returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

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

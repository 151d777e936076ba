//! The engine: one place that collects a timestamped [`Snapshot`] (the sample of
//! `/proc`, cgroups and residency, with the byte-level proofs and the read() ledger as
//! inputs), and the one pure way to turn a snapshot, and optionally the one before it, into
//! the [`Report`] every view shows: `scan`, `replay`, `record`, `dump` and campaigns.
//!
//! Collection keeps nothing a report needs outside the snapshot, so a recorded snapshot
//! renders exactly as it did live.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::collect::cache::{CacheStats, ProcCache};
use crate::collect::gather::{self, Request};
use crate::collect::Roots;
use crate::dupes::prove::ProveOptions;
use crate::model::{self, Report};
use crate::sample::{FileKey, ProofSample, ReadSample, Sample};

/// Version of the snapshot document (recordings); bumped on any incompatible change.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Everything one collection read, stamped with when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// Wall clock, nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// `CLOCK_MONOTONIC`, nanoseconds: rates between snapshots use this.
    pub at_mono_ns: u64,
    pub sample: Sample,
}

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
    /// NVML (or a test's fixture), opened once.
    gpu: Box<dyn crate::collect::gpu::GpuSource>,
    /// What unchanged processes need not be read again for (`top`, `serve`, `record`);
    /// `None` reads everything every snapshot (`scan`).
    cache: Option<ProcCache>,
}

/// A proof kept for reuse, with what it depends on.
struct Reused {
    fingerprint: (Option<u64>, Option<u64>, Option<u64>),
    at: Instant,
    proof: ProofSample,
}

/// A complete proof is reused for at most this long while the process's `RssAnon` and
/// `rchar` and the file's size are unchanged (`top`, `serve` and `record` take a snapshot
/// every few seconds; re-searching unchanged memory every time would cost a core).
pub const REPROVE_AFTER: Duration = Duration::from_secs(60);

fn fingerprint(
    sample: &Sample,
    pid: i32,
    file: FileKey,
) -> (Option<u64>, Option<u64>, Option<u64>) {
    let p = sample.processes.iter().find(|p| p.pid == pid);
    (
        p.and_then(|p| p.status.rss_anon_bytes),
        p.and_then(|p| p.rchar_bytes),
        sample
            .files
            .iter()
            .find(|f| f.key == file)
            .and_then(|f| f.size_bytes),
    )
}

impl Engine {
    pub fn new(req: Request, prove: Option<ProveOptions>) -> Engine {
        Engine {
            roots: Roots::live(),
            req,
            prove,
            reuse: BTreeMap::new(),
            last_reused: 0,
            gpu: crate::collect::gpu::source(),
            cache: None,
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

    /// One snapshot; `reads` is the read() ledger of a traced window, when there is one.
    /// Warnings (a process that could not be read, a file that vanished) are appended.
    pub fn snapshot(
        &mut self,
        reads: Vec<ReadSample>,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<Snapshot> {
        let (at_unix_ns, at_mono_ns) = now();
        // GPUs first: the processes holding device memory are kept in the sample.
        let gpu = crate::collect::gpu::sample(self.gpu.as_mut(), &self.roots.proc);
        self.req.gpu_pids = gpu
            .devices
            .iter()
            .flat_map(|d| d.processes.iter().map(|p| p.pid))
            .collect();
        let mut sample =
            gather::gather_cached(&self.roots, &self.req, warnings, self.cache.as_mut())?;
        sample.reads = reads;
        sample.gpu = gpu;
        if let Some(opts) = self.prove {
            sample.proofs = self.prove(&sample, opts, warnings);
        }
        Ok(Snapshot {
            version: SNAPSHOT_VERSION,
            at_unix_ns,
            at_mono_ns,
            sample,
        })
    }
}

impl Engine {
    /// Searches the candidates whose proof cannot be reused; reuses the others.
    fn prove(
        &mut self,
        sample: &Sample,
        opts: ProveOptions,
        warnings: &mut Vec<String>,
    ) -> Vec<ProofSample> {
        let now = Instant::now();
        let mut kept = Vec::new();
        let mut todo = Vec::new();
        for c in &sample.candidates {
            let fp = fingerprint(sample, c.pid, c.file);
            match self.reuse.get(&(c.pid, c.file)) {
                Some(r) if r.fingerprint == fp && now.duration_since(r.at) < REPROVE_AFTER => {
                    kept.push(r.proof.clone())
                }
                _ => todo.push(c.clone()),
            }
        }
        self.last_reused = kept.len();
        let mut fresh = Vec::new();
        if !todo.is_empty() {
            let pending = Sample {
                candidates: todo,
                ..sample.clone()
            };
            fresh = crate::dupes::prove::prove(&self.roots, &pending, opts, warnings);
        }
        // Keep complete proofs of processes that are still candidates.
        self.reuse
            .retain(|k, _| sample.candidates.iter().any(|c| (c.pid, c.file) == *k));
        for p in &fresh {
            if p.unsearched.is_none() {
                self.reuse.insert(
                    (p.pid, p.file),
                    Reused {
                        fingerprint: fingerprint(sample, p.pid, p.file),
                        at: now,
                        proof: p.clone(),
                    },
                );
            }
        }
        kept.extend(fresh);
        kept.sort_by(|a, b| a.file.cmp(&b.file).then(a.pid.cmp(&b.pid)));
        kept
    }
}

/// The report of a snapshot: the one pure entry every view uses. With the snapshot
/// before it, the report also carries rates over the interval between the two.
pub fn report(snap: &Snapshot, prev: Option<&Snapshot>) -> Report {
    let mut r = model::build(&snap.sample);
    r.at_unix_ns = Some(snap.at_unix_ns);
    if let Some(p) = prev {
        let secs = Duration::from_nanos(snap.at_mono_ns.saturating_sub(p.at_mono_ns)).as_secs_f64();
        // A previous snapshot from another boot (monotonic clock went back): wall clock.
        let secs = if secs > 0.0 {
            secs
        } else {
            Duration::from_nanos(snap.at_unix_ns.saturating_sub(p.at_unix_ns)).as_secs_f64()
        };
        r.rates = model::rates::between(&p.sample, &snap.sample, secs);
    }
    r
}

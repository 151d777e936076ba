//! The data model: pure functions from a [`Sample`] to a [`Report`]. No I/O here.
//!
//! Derived quantities and their definitions:
//! - USS = `Private_Clean + Private_Dirty` (the bytes only this process maps, as `smem`).
//! - Per file, the *representation count* (see [`copies`] and `docs/metrics.md`): page
//!   cache + CoW pages of private mappings + private copies proven byte by byte (+ device
//!   copies where known). Suspected copies are shown beside it, never summed into it;
//!   what could not be searched makes it a lower bound.

pub mod cgroup;
pub mod copies;
mod derived;
pub mod device;
pub mod dupes;
pub mod fields;
mod holders;
use holders::{holders, mapper, process_model};
pub mod findings;
pub mod gate;
pub mod inspect;
pub mod probe;
pub mod rates;
pub mod residency;
pub mod trace;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::sample::snapshot::Snapshot;
use crate::sample::trace::TraceSample;
use crate::sample::{FileKey, ProcessSample, Sample, Skipped, Unreadable};
pub use cgroup::CgroupModel;
pub use findings::{Code, Finding, Severity};

/// Version of the JSON document; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Private memory at least this fraction of a file's size could hold a copy of it: the
/// model suspects a copy only there, and the gatherer looks for one only there (its
/// `COPY_FRACTION` is this).
pub const SUSPECT_FRACTION: f64 = 0.8;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub system: SystemModel,
    pub processes: Vec<ProcessModel>,
    pub files: Vec<FileModel>,
    pub cgroups: Vec<CgroupModel>,
    pub findings: Vec<Finding>,
    pub skipped: Skipped,
    /// GPUs (NVML), or why they are not known.
    #[serde(default)]
    pub gpus: device::GpusModel,
    /// `scan --trace D`: eBPF counters over the traced window; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<trace::TraceModel>,
    /// When the snapshot behind this report was taken (ns since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ns: Option<u64>,
    /// Rates since the snapshot before (`replay`, `record`); absent for a single scan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<rates::Rates>,
    /// Who read the sample (root, `CAP_SYS_PTRACE`); absent: not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privilege: Option<crate::sample::Privilege>,
    /// twofold's own processes seen (never holders, mappers or candidates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observers: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemModel {
    pub page_size_bytes: u64,
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
    pub page_cache_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub mapped_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub dirty_bytes: Option<u64>,
    /// `workingset_refault_file`: file pages read again soon after eviction (count).
    pub refaults_file: Option<u64>,
    pub major_faults: Option<u64>,
    /// `/proc/pressure/memory` `some`/`full` `avg10` (percent); absent where unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<crate::sample::PressureSample>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessModel {
    pub pid: i32,
    pub comm: String,
    pub cmdline: String,
    pub rss_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub file_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    pub pss_bytes: Option<u64>,
    pub pss_anon_bytes: Option<u64>,
    pub pss_file_bytes: Option<u64>,
    pub pss_shmem_bytes: Option<u64>,
    pub uss_bytes: Option<u64>,
    pub shared_clean_bytes: Option<u64>,
    pub shared_dirty_bytes: Option<u64>,
    pub private_clean_bytes: Option<u64>,
    pub private_dirty_bytes: Option<u64>,
    pub cgroup: Option<String>,
    /// Files of interest it maps, holds open or holds a proven copy of; `None` (null)
    /// when its `maps` or `fd` could not be read (see `unreadable`): unknown, not 0.
    pub holds_files: Option<usize>,
    /// Device memory on all GPUs (NVML); `None` (null): not known (no NVIDIA GPU or
    /// driver, or a process list NVML would not give).
    #[serde(default)]
    pub gpu_memory_bytes: Option<u64>,
    /// Per GPU, where it holds any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_memory: Vec<device::GpuUse>,
    /// Set when part of the process could not be read (`denied`: root or
    /// `CAP_SYS_PTRACE` needed; `gone`: exited).
    pub unreadable: Option<Unreadable>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapKind {
    Shared,
    Private,
    Mixed,
}

/// One process's mappings of one file (all its VMAs of that file, summed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mapper {
    pub pid: i32,
    pub comm: String,
    pub kind: MapKind,
    /// Union of the VMAs' protections, `maps` notation (`r--s`).
    pub prot: String,
    pub writable: bool,
    pub vmas: usize,
    pub mapped_bytes: u64,
    pub resident_bytes: Option<u64>,
    pub pss_bytes: Option<u64>,
    /// Anonymous (copy-on-write) pages inside private mappings of the file.
    pub cow_anon_bytes: Option<u64>,
    /// File pages mapped with 2 MiB PMD entries (`FilePmdMapped`).
    pub thp_bytes: Option<u64>,
    /// Mapped bytes past the end of the file (the file shrank: touching them is SIGBUS).
    pub beyond_eof_bytes: u64,
}

/// A process holding the file open (fd), with or without a mapping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: i32,
    pub comm: String,
    pub fds: Vec<i32>,
    pub mapped: bool,
}

/// A proven private copy of (part of) the file in one process: found byte by byte in its
/// private anonymous memory (never in its own mapping of the file: that is CoW).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvenCopy {
    pub pid: i32,
    pub comm: String,
    /// File bytes found identical / widened to F32, and the memory they occupy.
    pub identical_bytes: u64,
    pub widened_bytes: u64,
    pub memory_bytes: u64,
    /// Tensor runs found.
    pub copies: u64,
    /// (identical + widened) / file size × [`ProvenCopy::share`]: this copy's part of the
    /// count (one physical copy shared by several processes is shared out among them).
    pub fraction: f64,
    /// The part of the copy's pages that is this process's: 1 when no other copy found
    /// maps them, 1/4 for a copy four processes share after `fork()`.
    #[serde(default = "one")]
    pub share: f64,
    /// With whom, and how, the copy's pages are shared (`None`: with nobody, or not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedCopy>,
    /// How the copy was made, as far as the kernel and the bytes tell.
    pub how: CopyHow,
    /// Bytes of this file it read() during a traced window (`scan --trace`), if traced.
    #[serde(default)]
    pub traced_read_bytes: Option<u64>,
    /// The process also maps the file.
    pub mapped: bool,
}

fn one() -> f64 {
    1.0
}

impl ProvenCopy {
    /// The file bytes of the copy that count for this process: its physical share.
    pub fn physical_bytes(&self) -> f64 {
        (self.identical_bytes + self.widened_bytes) as f64 * self.share
    }
}

/// How a proven copy's physical pages are shared with other processes' copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedCopy {
    /// Most processes one of its pages is mapped by, this one included.
    pub by: u32,
    /// The other processes, by pid.
    #[serde(default)]
    pub with: Vec<i32>,
    /// Shared memory (shmem, memfd, tmpfs) mapped by several processes; else fork.
    pub shmem: bool,
    /// Weighed without page frame numbers (not `CAP_SYS_ADMIN`): an estimate.
    pub estimated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyHow {
    /// It does not map the file and read() at least as many bytes as it holds (`rchar`,
    /// or this file's bytes in a trace): a read() copy.
    Read,
    /// It maps the file and holds the bytes as they are, out of the mapping (a copy loop,
    /// `.clone()`, `.copy()`).
    CopiedFromMapping,
    /// It maps the file and holds its tensors converted: F16/BF16 widened to F32
    /// (`.float()`, `.astype(np.float32)`), for most of the bytes found.
    Converted,
    /// Not known (rchar unreadable, or too small for a read() copy).
    Copied,
    /// Found in shared memory (a shmem, tmpfs such as /dev/shm, or memfd file): a copy
    /// made into memory that processes share, instead of mapping the file itself.
    SharedMemory,
}

/// A process whose private memory could hold a copy that was not (fully) searched.
/// Shown beside the count, never summed into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspectedCopy {
    pub pid: i32,
    pub comm: String,
    /// Its private anonymous memory (`RssAnon` less CoW pages of mapped files).
    pub anon_bytes: u64,
    /// Private memory attributed to this file (at most its size; one heap is never
    /// suspected of holding two files).
    pub attributed_bytes: u64,
    /// `attributed_bytes / size`: what the count would grow by if the copy is real.
    pub fraction: f64,
    pub mapped: bool,
    pub why: crate::sample::CandidateWhy,
    /// Why it was not searched (or only in part).
    pub unsearched: crate::sample::unsearched::Unsearched,
}

/// The candidate copy holders of a file and what became of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CandidateCounts {
    /// Processes whose private memory could hold a copy.
    pub could_hold: usize,
    pub searched: usize,
    pub not_searched: usize,
    /// Memory sampled and compared with the file over all searched candidates.
    #[serde(default)]
    pub sampled_bytes: u64,
    #[serde(default)]
    pub compared_bytes: u64,
}

/// How many times the file's bytes are in memory, from proven parts only. The default
/// is nothing known and nothing counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Representations {
    /// Page-cache resident fraction; `None` if residency is unknown.
    pub page_cache: Option<f64>,
    /// Copy-on-write anonymous pages inside private mappings of the file, as a fraction
    /// of it; `None` if a mapper's smaps could not be read.
    pub cow: Option<f64>,
    /// Proven private copies (heap, anonymous mappings), summed over processes.
    pub private_copies: f64,
    /// Device copies (GPU memory); `None`: not known.
    pub device: Option<f64>,
    /// `page_cache + cow + private_copies (+ device)`: the count. `None` if the page
    /// cache part is unknown.
    pub proven: Option<f64>,
    /// Suspected copies (unsearched candidates), summed: shown beside, never added.
    pub suspected: f64,
    /// Suspected device copies (by size, from NVML), summed: beside, never added.
    #[serde(default)]
    pub suspected_device: f64,
    /// Candidates not searched (no permission, gone, over budget, nothing searchable).
    pub unsearched: usize,
    /// The count is a lower bound: something that could hold a copy was not searched,
    /// or a part is unknown.
    pub lower_bound: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileModel {
    pub path: String,
    /// The name's bytes, only when they are not UTF-8 (`path` is then lossy): people
    /// see them escaped (`\xff`) rather than as U+FFFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_bytes: Option<Vec<u8>>,
    /// (major, minor, inode): the identity joins are made on.
    pub key: FileKey,
    /// `major:minor`, as people read it.
    pub device: String,
    pub inode: u64,
    pub size_bytes: Option<u64>,
    pub resident_bytes: Option<u64>,
    pub resident_fraction: Option<f64>,
    pub dirty_bytes: Option<u64>,
    /// `cachestat` only: pages of this file evicted since it was first cached, and those
    /// evicted recently enough that reading them again counts as a refault.
    pub evicted_bytes: Option<u64>,
    pub recently_evicted_bytes: Option<u64>,
    pub residency_source: Option<String>,
    pub residency_unknown_reason: Option<String>,
    pub mappers: Vec<Mapper>,
    /// Processes holding it open; `mapped: false` ones read it without mapping.
    pub holders: Vec<Holder>,
    pub proven_copies: Vec<ProvenCopy>,
    pub suspected_copies: Vec<SuspectedCopy>,
    /// Device copies, proven (twofold's own loaders) or suspected (NVML sizes).
    #[serde(default)]
    pub device_copies: Vec<device::DeviceCopy>,
    pub candidates: CandidateCounts,
    /// Found only in a model store (no process maps or holds it).
    pub store: bool,
    pub representations: Representations,
    /// Unlinked, or its path now names another inode: only its holders keep it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The inode at its path now, when that is another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_at_path: Option<FileKey>,
    /// Other names processes give it (another mount namespace's), beside `path`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen_as: Vec<String>,
    /// A file in shared memory (shmem, tmpfs such as /dev/shm, memfd) whose bytes were
    /// proven to be a copy of another model file: that file's path and identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shmem_copy_of: Option<CopyOf>,
}

/// The model file another one is a copy of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyOf {
    pub key: FileKey,
    pub path: String,
}

fn sum_opt(mut values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.try_fold(0u64, |acc, v| Some(acc + v?))
}

/// The report of a snapshot: one snapshot in, one report out, the one entry every view
/// uses (scan, top, serve, record, replay, dump, campaigns). With the snapshot before it,
/// the report carries rates over the interval between the two, and the trace model's
/// rates when both come from one attachment of the tracer. Pure: the same snapshots always
/// give the same report.
pub fn build(snap: &Snapshot, prev: Option<&Snapshot>) -> Report {
    let trace = snap.trace.as_ref().map(|cur| TraceInput {
        cur,
        prev: prev
            .and_then(|p| p.trace.as_ref())
            .filter(|p| crate::sample::trace::same_attachment(p, cur)),
    });
    let mut r = build_with(&snap.sample, trace);
    r.at_unix_ns = Some(snap.at_unix_ns);
    if let Some(p) = prev {
        use std::time::Duration;
        let secs = Duration::from_nanos(snap.at_mono_ns.saturating_sub(p.at_mono_ns)).as_secs_f64();
        // A previous snapshot from another boot (monotonic clock went back): wall clock.
        let secs = if secs > 0.0 {
            secs
        } else {
            Duration::from_nanos(snap.at_unix_ns.saturating_sub(p.at_unix_ns)).as_secs_f64()
        };
        r.rates = rates::between(&p.sample, &snap.sample, secs);
    }
    r
}

/// The report of a bare sample (no timestamps, no counters, no snapshot before it): what
/// [`build`] gives for a snapshot holding only `sample`, less `at_unix_ns`.
pub fn from_sample(sample: &Sample) -> Report {
    build_with(sample, None)
}

/// At most this many rows of other files and processes (not of interest) in a report's
/// trace section.
pub const TRACE_TOP: usize = 10;

/// The eBPF counters of a snapshot, and those of the snapshot before it when both come
/// from one attachment (rates are then over the interval between them, else since attach).
#[derive(Debug, Clone, Copy)]
struct TraceInput<'a> {
    cur: &'a TraceSample,
    prev: Option<&'a TraceSample>,
}

/// The context of a report's trace model: the report's files are the files of interest;
/// paths come from the sample and from the names resolved when the counters were read.
pub fn trace_context(sample: &Sample, files: &[FileModel], t: &TraceSample) -> trace::TraceContext {
    let mut paths: BTreeMap<FileKey, String> = sample
        .files
        .iter()
        .map(|f| (f.key, f.path.clone()))
        .collect();
    for (k, p) in &t.names.paths {
        paths.entry(*k).or_insert_with(|| p.clone());
    }
    trace::TraceContext {
        paths,
        interest: files.iter().map(|f| f.key).collect(),
        sizes: files
            .iter()
            .filter_map(|f| Some((f.key, f.size_bytes?)))
            .collect(),
        comms: t.names.comms.clone(),
        pids: t.pinned_pids.clone(),
        files: Vec::new(),
        top: TRACE_TOP,
        page_bytes: sample.system.page_bytes(),
    }
}

/// Builds the report of a sample and, when traced, of its eBPF counters: findings of both
/// are computed here, once. Pure.
fn build_with(sample: &Sample, trace: Option<TraceInput>) -> Report {
    let page = sample.system.page_size.max(1);
    let mut files: Vec<FileModel> = sample
        .files
        .iter()
        .map(|f| {
            let resident = f.residency.as_ref().map(|r| r.cached_bytes);
            FileModel {
                path: f.path.clone(),
                path_bytes: f.path_bytes.clone(),
                key: f.key,
                device: format!("{}:{}", f.key.major, f.key.minor),
                inode: f.key.inode,
                size_bytes: f.size_bytes,
                resident_bytes: resident,
                // In pages: the last, partial page of a file is cached whole.
                resident_fraction: resident
                    .zip(f.size_bytes)
                    .map(|(r, s)| page_cache_fraction(r, s, page)),
                dirty_bytes: f.residency.as_ref().and_then(|r| r.dirty_bytes),
                evicted_bytes: f.residency.as_ref().and_then(|r| r.evicted_bytes),
                recently_evicted_bytes: f.residency.as_ref().and_then(|r| r.recently_evicted_bytes),
                residency_source: f
                    .residency
                    .as_ref()
                    .map(|r| format!("{:?}", r.source).to_lowercase()),
                residency_unknown_reason: f.residency_error.clone(),
                mappers: sample
                    .processes
                    .iter()
                    .filter_map(|p| mapper(p, f.key, f.size_bytes, page))
                    .collect(),
                holders: holders(sample, f.key),
                proven_copies: Vec::new(),
                suspected_copies: Vec::new(),
                device_copies: Vec::new(),
                candidates: CandidateCounts::default(),
                store: f.store,
                deleted: f.deleted,
                now_at_path: f.now_at_path,
                seen_as: f.seen_as.clone(),
                shmem_copy_of: None,
                representations: Representations::default(),
            }
        })
        .collect();
    // The read() ledger: from the counters when traced, else as the sample holds it
    // (recordings of format 1).
    let reads: BTreeMap<(i32, FileKey), u64> = match trace {
        Some(t) => t.cur.io.iter().map(|(k, v)| (*k, v.read_bytes)).collect(),
        None => sample
            .reads
            .iter()
            .map(|r| ((r.pid, r.file), r.read_bytes))
            .collect(),
    };
    copies::attribute(sample, &reads, &mut files);
    copies::shmem_copies(sample, &mut files);
    for f in &mut files {
        f.representations = copies::representations(f);
    }
    device::attribute(sample, &mut files);
    for f in &mut files {
        let r = &mut f.representations;
        if let (Some(p), Some(d)) = (r.proven, r.device) {
            r.proven = Some(p + d);
        }
    }
    // A store file nothing holds and no process holds a copy of is not news.
    files.retain(|f| {
        !f.store
            || !f.mappers.is_empty()
            || !f.holders.is_empty()
            || !f.proven_copies.is_empty()
            || !f.suspected_copies.is_empty()
            || !f.device_copies.is_empty()
    });
    files.sort_by(|a, b| {
        let ta = a.representations.proven.unwrap_or(0.0);
        let tb = b.representations.proven.unwrap_or(0.0);
        tb.total_cmp(&ta)
            .then(b.size_bytes.cmp(&a.size_bytes))
            .then(a.path.cmp(&b.path))
    });

    let mut holds: BTreeMap<i32, usize> = BTreeMap::new();
    for f in &files {
        let mut pids: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
        pids.extend(f.holders.iter().map(|h| h.pid));
        pids.extend(f.proven_copies.iter().map(|c| c.pid));
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            *holds.entry(pid).or_default() += 1;
        }
    }
    let mut processes: Vec<ProcessModel> = sample
        .processes
        .iter()
        .map(|p| {
            let held = holds.get(&p.pid).copied().unwrap_or(0);
            process_model(p, held, device::process_uses(sample, p.pid))
        })
        .collect();
    processes.sort_by(|a, b| {
        b.holds_files
            .unwrap_or(0)
            .min(1)
            .cmp(&a.holds_files.unwrap_or(0).min(1))
            .then(b.rss_bytes.unwrap_or(0).cmp(&a.rss_bytes.unwrap_or(0)))
            .then(a.pid.cmp(&b.pid))
    });
    let cgroups: Vec<CgroupModel> = sample.cgroups.iter().map(cgroup::build).collect();
    let system = system_model(sample);
    let mut findings = findings::evaluate(&files, &cgroups, sample.privilege);
    let trace = trace.map(|t| {
        let ctx = trace_context(sample, &files, t.cur);
        let m = trace::TraceModel::new(t.cur, t.prev, &ctx);
        findings.extend(trace::findings::evaluate(&m, &ctx));
        findings.sort_by_key(|f| f.severity);
        m
    });
    Report {
        schema_version: SCHEMA_VERSION,
        system,
        processes,
        files,
        cgroups,
        findings,
        skipped: sample.skipped.clone(),
        gpus: device::gpus(sample),
        trace,
        at_unix_ns: None,
        rates: None,
        observers: sample.observers.clone(),
        privilege: sample.privilege,
    }
}

/// The page-cache fraction of a file: resident pages over the file's pages (its partial
/// last page is cached whole). The one definition every view uses.
pub fn page_cache_fraction(cached_bytes: u64, size_bytes: u64, page: u64) -> f64 {
    let page = page.max(1);
    fraction(cached_bytes.div_ceil(page), size_bytes.div_ceil(page))
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn system_model(sample: &Sample) -> SystemModel {
    let mi = &sample.system.meminfo;
    let vm = &sample.system.vmstat;
    SystemModel {
        page_size_bytes: sample.system.page_size,
        mem_total_bytes: mi.get("MemTotal").copied(),
        mem_available_bytes: mi.get("MemAvailable").copied(),
        page_cache_bytes: mi.get("Cached").copied(),
        anon_bytes: mi.get("AnonPages").copied(),
        mapped_bytes: mi.get("Mapped").copied(),
        shmem_bytes: mi.get("Shmem").copied(),
        dirty_bytes: mi.get("Dirty").copied(),
        refaults_file: vm
            .get("workingset_refault_file")
            .or_else(|| vm.get("workingset_refault"))
            .copied(),
        major_faults: vm.get("pgmajfault").copied(),
        pressure: sample.system.pressure,
    }
}

#[cfg(test)]
mod tests;

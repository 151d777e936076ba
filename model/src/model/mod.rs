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
mod device_uploads;
pub mod dupes;
pub mod fields;
mod holders;
use holders::{holders, mapper, process_model};
mod build;
pub mod findings;
pub mod gate;
pub mod inspect;
pub mod probe;
pub mod rates;
pub mod relation;
pub mod residency;
pub mod timeline;
pub mod trace;
pub mod unexplained;

pub use build::{build, from_sample, trace_context, TRACE_TOP};

use serde::{Deserialize, Serialize};

use crate::sample::{FileKey, ProcessSample, Skipped, Unreadable};
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
    /// Named processes without named files: the host's files of interest looked at for
    /// them, and those left out ([`crate::sample::HostFiles`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_files: Option<crate::sample::HostFiles>,
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
    /// File bytes found identical / converted to another dtype, and the memory they
    /// occupy (identical bytes once, converted ones as their dtype takes).
    pub identical_bytes: u64,
    #[serde(alias = "widened_bytes")]
    pub converted_bytes: u64,
    pub memory_bytes: u64,
    /// The converted bytes per conversion (`converted F32→F16`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversions: Vec<crate::sample::converted::Converted>,
    /// Tensor runs found.
    pub copies: u64,
    /// `memory_bytes` / file size × [`ProvenCopy::share`]: this copy's part of the count,
    /// by the bytes it holds (an F32 → F16 conversion of the whole file counts 0.5, an
    /// F16 → F32 one 2; one physical copy shared by several processes is shared out among
    /// them).
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
    /// Most of the copy lies in huge pages from the hugetlbfs pool (`MAP_HUGETLB`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub huge_pages: bool,
    /// Why it is this file's when other files of interest have the same bytes (`the file
    /// it read`, `matched by content; also identical to B`: [`relation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<String>,
}

fn one() -> f64 {
    1.0
}

impl ProvenCopy {
    /// The bytes of the copy that count for this process (the memory it occupies, as
    /// [`ProvenCopy::fraction`]): its physical share.
    pub fn physical_bytes(&self) -> f64 {
        self.memory_bytes as f64 * self.share
    }

    /// The conversion holding most of the copy's converted bytes, if any.
    pub fn conversion(&self) -> Option<crate::sample::converted::Conversion> {
        crate::sample::converted::dominant(&self.conversions)
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
    /// Merged by KSM (`MADV_MERGEABLE` memory, `/proc/kpageflags` `KSM`): copies the
    /// processes made each on its own, merged since; neither fork nor shared memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ksm: bool,
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
    /// It maps the file and holds its tensors converted to another dtype, for most of
    /// the bytes found: F16/BF16 widened to F32 (`.float()`, `.astype(np.float32)`), F32
    /// narrowed (`.half()`, `.astype(np.float16)`), BF16 ↔ F16
    /// ([`ProvenCopy::conversions`] says which).
    Converted,
    /// Not known (rchar unreadable, or too small for a read() copy).
    Copied,
    /// Found in shared memory (a shmem, tmpfs such as /dev/shm, or memfd file): a copy
    /// made into memory that processes share, instead of mapping the file itself.
    SharedMemory,
    /// Found in host memory the NVIDIA driver maps (`/dev/nvidiactl`, a CUDA process's
    /// shared memory): a pinned staging copy (`cudaHostAlloc`, PyTorch's `pin_memory()`).
    Pinned,
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
    /// Each candidate not searched (or searched only in part) and why, whether or not
    /// enough of its memory is left to suspect it: what makes the count a lower bound is
    /// named by pid wherever the count is shown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsearched: Vec<UnsearchedCandidate>,
    /// Memory sampled and compared with the file over all searched candidates.
    #[serde(default)]
    pub sampled_bytes: u64,
    #[serde(default)]
    pub compared_bytes: u64,
}

/// A candidate copy holder that was not searched in full, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnsearchedCandidate {
    pub pid: i32,
    pub why: crate::sample::unsearched::Unsearched,
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
    /// Private memory of related processes that is distributed like the file but is no
    /// form of it twofold knows: suspected, beside the count, never in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unexplained: Vec<unexplained::UnexplainedMemory>,
    /// Device copies, proven (twofold's own loaders) or suspected (NVML sizes).
    #[serde(default)]
    pub device_copies: Vec<device::DeviceCopy>,
    /// Bytes of it processes uploaded to a GPU (traced, matched by content).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uploads: Vec<device::UploadModel>,
    /// Device bytes of it uploaded by processes that exited since tracing started, per
    /// GPU (the exporter's counter keeps them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uploads_retired: Vec<crate::sample::uploads::RetiredUpload>,
    /// Processes that registered their mapping of it for device access (read in place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_place: Vec<device::InPlaceModel>,
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
    /// Where copies of it in shared memory live (a `/dev/shm` file, a memfd): each is
    /// shown here, under the file it copies, never as a model file of its own; its bytes
    /// are counted in this file's private copies (through the processes that map it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shmem_places: Vec<ShmemPlace>,
    /// Other files of interest with the same bytes (same size and fingerprint of blocks
    /// spread over them): each has its own page cache, so what is cached of both is in
    /// memory twice. Never summed into this file's count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_bytes: Vec<CopyOf>,
}

/// A copy of a model file in shared memory: the shmem, tmpfs or memfd file that holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShmemPlace {
    pub key: FileKey,
    pub path: String,
    pub size_bytes: Option<u64>,
    /// Its pages in memory (a tmpfs file's "page cache" is the copy itself).
    pub resident_bytes: Option<u64>,
    /// Processes that map it or hold it open.
    pub pids: Vec<i32>,
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

#[cfg(test)]
mod tests;

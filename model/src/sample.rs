//! Raw samples: values exactly as the kernel reported them, converted to bytes.
//!
//! A field is `None` where the kernel lacks it (older kernels have no `Pss_Anon`) or where
//! it could not be read (no permission). Nothing here is derived; see [`crate::model`].

use serde::{Deserialize, Serialize};

pub mod campaign;
pub mod converted;
mod marks;
pub(crate) use marks::is_zero;
pub use marks::{strip_deleted, DELETED};
mod gpu;
mod hostfiles;
pub mod places;
pub use hostfiles::HostFiles;
mod referrers;
pub use referrers::referrers;
pub mod snapshot;
pub mod trace;
pub mod unsearched;
pub mod uploads;
pub mod warning;

pub use warning::{Warning, WarningKind};

pub use gpu::*;

/// Identity of a file: `(major, minor, inode)`, as `/proc/PID/maps` and `stat(2)` give it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct FileKey {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl FileKey {
    /// From `st_dev` as `stat(2)` gives it (glibc's encoding of a 64-bit `dev_t`: the
    /// major number in bits 8-19 and 32-63, the minor in bits 0-7 and 20-31).
    pub fn from_dev(dev: u64, inode: u64) -> Self {
        FileKey {
            major: (((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000)) as u32,
            minor: ((dev & 0xff) | ((dev >> 12) & 0xffff_ff00)) as u32,
            inode,
        }
    }
}

/// `/proc/PID/status`, memory lines (bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusSample {
    pub vm_rss_bytes: Option<u64>,
    pub rss_anon_bytes: Option<u64>,
    pub rss_file_bytes: Option<u64>,
    pub rss_shmem_bytes: Option<u64>,
    pub vm_swap_bytes: Option<u64>,
    pub uid: Option<u32>,
    /// `HugetlbPages`: huge pages from the hugetlbfs pool it maps (not in `VmRSS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugetlb_bytes: Option<u64>,
}

/// `/proc/PID/smaps_rollup` (bytes). `rss`/`pss` exist on every kernel with the file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RollupSample {
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub pss_anon_bytes: Option<u64>,
    pub pss_file_bytes: Option<u64>,
    pub pss_shmem_bytes: Option<u64>,
    pub shared_clean_bytes: u64,
    pub shared_dirty_bytes: u64,
    pub private_clean_bytes: u64,
    pub private_dirty_bytes: u64,
    pub anonymous_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    pub swap_pss_bytes: Option<u64>,
}

/// Protection and sharing of one mapping, from the `rwxp`/`rwxs` column of `maps`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
}

impl Perms {
    pub fn as_str(&self) -> String {
        [
            if self.read { 'r' } else { '-' },
            if self.write { 'w' } else { '-' },
            if self.exec { 'x' } else { '-' },
            if self.shared { 's' } else { 'p' },
        ]
        .iter()
        .collect()
    }
}

/// One VMA of a file of interest: the `maps` header plus its `smaps` fields (bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MappingSample {
    pub start: u64,
    pub end: u64,
    pub perms: Perms,
    pub offset_bytes: u64,
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
    pub path: String,
    pub rss_bytes: Option<u64>,
    pub pss_bytes: Option<u64>,
    pub shared_clean_bytes: Option<u64>,
    pub shared_dirty_bytes: Option<u64>,
    pub private_clean_bytes: Option<u64>,
    pub private_dirty_bytes: Option<u64>,
    /// `Anonymous:` inside a file mapping: copy-on-write pages.
    pub anonymous_bytes: Option<u64>,
    /// `FilePmdMapped:`: file pages mapped with PMD (2 MiB) entries.
    pub file_pmd_mapped_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    pub swap_pss_bytes: Option<u64>,
}

impl MappingSample {
    pub fn key(&self) -> FileKey {
        FileKey {
            major: self.major,
            minor: self.minor,
            inode: self.inode,
        }
    }
    pub fn size_bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// An open file descriptor of a file of interest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenFileSample {
    pub fd: i32,
    pub key: FileKey,
    pub path: String,
}

/// Why part of a process could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unreadable {
    /// EACCES/EPERM: needs root or `CAP_SYS_PTRACE`.
    Denied,
    /// The process exited while it was read.
    Gone,
}

/// One process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub pid: i32,
    pub comm: String,
    pub cmdline: std::sync::Arc<[String]>,
    pub kernel_thread: bool,
    pub status: StatusSample,
    pub rollup: Option<RollupSample>,
    /// Set when `smaps_rollup`, `maps`, `smaps` or `fd` could not be read.
    pub unreadable: Option<Unreadable>,
    /// Path of the process's memory cgroup, relative to its hierarchy, and the hierarchy.
    pub cgroup: Option<CgroupRef>,
    pub mappings: Vec<MappingSample>,
    pub open_files: Vec<OpenFileSample>,
    /// `/proc/PID/io` `rchar`: bytes this process ever read with read()/pread and the
    /// like (all files, pipes and sockets). `None`: not read or not readable.
    #[serde(default)]
    pub rchar_bytes: Option<u64>,
}

/// A cgroup a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CgroupRef {
    pub version: CgroupVersion,
    /// Path inside the hierarchy, starting with `/`.
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Page-cache state of a file, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResidencySample {
    pub source: ResidencySource,
    pub cached_bytes: u64,
    /// Only `cachestat(2)` reports these.
    pub dirty_bytes: Option<u64>,
    pub writeback_bytes: Option<u64>,
    pub evicted_bytes: Option<u64>,
    pub recently_evicted_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencySource {
    #[default]
    Cachestat,
    Mincore,
}

/// A file of interest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSample {
    pub key: FileKey,
    /// The path as a process (or the command line) names it.
    pub path: String,
    /// The name's bytes, only when they are not UTF-8 (`path` is then lossy): people
    /// see them escaped (`\xff`) rather than as U+FFFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_bytes: Option<Vec<u8>>,
    /// `None` when the file could not be `stat`ed (gone, or another mount namespace
    /// we may not enter).
    pub size_bytes: Option<u64>,
    pub residency: Option<ResidencySample>,
    /// Why residency is unknown, when it is.
    pub residency_error: Option<String>,
    /// Why twofold did not open the file, when it did not: its filesystem did not answer
    /// in time, or it is one where opening a file drops its page cache (FUSE). The proof
    /// does not open it either (`dupes FILE` does, when asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unopened: Option<String>,
    /// Named on the command line (rather than found in a process).
    pub explicit: bool,
    /// Found in a well-known model store (Hugging Face, ollama, torch hub,
    /// `TWOFOLD_MODEL_PATH`) rather than held by a process.
    #[serde(default)]
    pub store: bool,
    /// The inode no longer has its name: unlinked (`maps` says ` (deleted)`), or its path
    /// now names another inode (a new model renamed over it). Processes that map or hold
    /// it keep it, and its page cache, alive.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The inode its path names now, when that is another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_at_path: Option<FileKey>,
    /// Other names processes give it (from another mount namespace, where `path` is the
    /// host's name), as they give them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen_as: Vec<String>,
    /// Other files of interest with the same bytes (same size and fingerprint:
    /// `dupes::twins`), by key; each is its own inode with its own page cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_bytes: Vec<FileKey>,
}

/// A memory cgroup (v1 or v2), bytes and event counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupSample {
    pub version: Option<CgroupVersion>,
    pub path: String,
    /// v2 `memory.current`, v1 `memory.usage_in_bytes`.
    pub usage_bytes: Option<u64>,
    /// v2 `memory.max`, v1 `memory.limit_in_bytes`; `None` inside means unlimited.
    /// (JSON: absent = not read, `null` = unlimited, a number = the limit.)
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub limit_bytes: Option<Option<u64>>,
    /// v2 `memory.peak`, v1 `memory.max_usage_in_bytes`.
    pub peak_bytes: Option<u64>,
    /// `memory.stat` as read (v1: `total_*` keys are hierarchical).
    pub stat: std::collections::BTreeMap<String, u64>,
    /// v2 `memory.events` or v1 `memory.oom_control` (`oom_kill`, `under_oom`, ...).
    pub events: std::collections::BTreeMap<String, u64>,
    /// v1 `memory.failcnt`.
    pub failcnt: Option<u64>,
    /// v2 `memory.min` and `memory.low` (protection; v1 has neither).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_bytes: Option<u64>,
    /// v2 `memory.high` (throttling); `None` inside means `max`, as for `limit_bytes`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub high_bytes: Option<Option<u64>>,
    /// v2 `memory.pressure` `some`/`full` `avg10` (percent), where PSI is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<PressureSample>,
}

/// `avg10` of a PSI file's `some` and `full` lines, percent of time stalled over 10 s
/// (<https://docs.kernel.org/accounting/psi.html>).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PressureSample {
    pub some_avg10: f64,
    pub full_avg10: Option<f64>,
}

impl PressureSample {
    /// Parses `some avg10=0.00 avg60=... total=...` and `full avg10=...`.
    pub fn parse(text: &str) -> Option<PressureSample> {
        let avg10 = |kind: &str| {
            text.lines()
                .find(|l| l.starts_with(kind))?
                .split_whitespace()
                .find_map(|w| w.strip_prefix("avg10="))?
                .parse::<f64>()
                .ok()
        };
        Some(PressureSample {
            some_avg10: avg10("some ")?,
            full_avg10: avg10("full "),
        })
    }
}

mod double_option;

/// A 4 KiB page: the unit the byte-level search samples in, and the page size assumed
/// where no sample gives the system's (see [`SystemSample::page_bytes`]).
pub const PAGE_BYTES: u64 = 4096;

/// System-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemSample {
    /// `/proc/meminfo` (bytes).
    pub meminfo: std::collections::BTreeMap<String, u64>,
    /// `/proc/vmstat` (counts; `nr_*` in pages).
    pub vmstat: std::collections::BTreeMap<String, u64>,
    pub page_size: u64,
    /// `/proc/pressure/memory` `some`/`full` `avg10` (percent), where PSI is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<PressureSample>,
}

impl SystemSample {
    /// The system's page size, [`PAGE_BYTES`] where the sample has none (0).
    pub fn page_bytes(&self) -> u64 {
        if self.page_size == 0 {
            PAGE_BYTES
        } else {
            self.page_size
        }
    }
}

/// The privilege of the process that read a sample (see `twofold::collect::access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Privilege {
    /// Effective user id.
    pub euid: u32,
    /// `CAP_SYS_PTRACE` in the effective set: may read any process's memory files.
    pub cap_sys_ptrace: bool,
}

impl Privilege {
    /// Whether ptrace checks pass for every process as far as capabilities go: any
    /// refusal is then a security policy's.
    pub fn reads_any(&self) -> bool {
        self.cap_sys_ptrace
    }

    /// Root, with or without its capabilities.
    pub fn is_root(&self) -> bool {
        self.euid == 0
    }
}

/// Counts of what a scan had to leave out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Processes that exited between listing and reading.
    pub gone: u64,
    /// Processes whose private files could not be read (needs root or `CAP_SYS_PTRACE`).
    pub denied: u64,
}

/// Everything one scan read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub system: SystemSample,
    pub processes: Vec<ProcessSample>,
    pub files: Vec<FileSample>,
    pub cgroups: Vec<CgroupSample>,
    pub skipped: Skipped,
    /// Processes whose private memory could hold a copy of a file of interest.
    #[serde(default)]
    pub candidates: Vec<CandidateSample>,
    /// Byte-level searches of candidates' memory (empty with `--no-prove`).
    #[serde(default)]
    pub proofs: Vec<ProofSample>,
    /// The eBPF read() ledger of a traced window: per (process, file), bytes read with
    /// read()/pread and mmap calls, even by processes that closed the file. Only in
    /// snapshots of version 1; since version 2 the ledger is the snapshot's trace
    /// (`TraceSample::io`) and this stays empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<ReadSample>,
    /// GPUs and per-process device memory (NVML); recordings made before it have none.
    #[serde(default)]
    pub gpu: GpuSample,
    /// (pid, file) pairs where the process's command line names the file.
    #[serde(default)]
    pub named: Vec<(i32, FileKey)>,
    /// twofold's own processes (the one that scans, and any other running the same
    /// executable: a recorder, an exporter), left out of holders, mappers and candidates:
    /// what they map or hold is there because they observe it.
    #[serde(default)]
    pub observers: Vec<i32>,
    /// Who read it; `None`: not known (a fixture tree, a recording made before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privilege: Option<Privilege>,
    /// A collection of named processes (`scan --pid P`) without named files: the files
    /// of interest of the whole host (mapped, held or named by any process) they were
    /// looked at for; the files kept are those they map, hold, name or may hold a copy
    /// of. `None`: not such a collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_files: Option<HostFiles>,
}

/// One (process, file) entry of the read() ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadSample {
    pub pid: i32,
    pub file: FileKey,
    pub read_bytes: u64,
    pub read_calls: u64,
    pub mmap_calls: u64,
}

/// Why a process could hold a private copy of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateWhy {
    /// It maps the file or holds it open.
    Holder,
    /// Its command line names the file.
    Named,
    /// It has read() at least as many bytes as the file has (`rchar`).
    Read,
    /// Its `rchar` could not be read, so a read() copy cannot be ruled out.
    Unknown,
    /// It maps shared memory (shmem, memfd, a /dev/shm file) large enough to hold a copy
    /// that another process may have made.
    SharedMemory,
}

/// A process whose private anonymous memory is large enough to hold a copy of a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSample {
    pub pid: i32,
    pub file: FileKey,
    pub why: CandidateWhy,
    /// `RssAnon` less the copy-on-write pages of files of interest it maps, plus its
    /// `RssShmem` (less the pages of a model file in shared memory it maps).
    pub private_anon_bytes: u64,
}

/// What a byte-level search of one process found of one file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProofSample {
    pub pid: i32,
    pub file: FileKey,
    /// Why the process was not (fully) searched; `None` when it was. (It and the counts
    /// are left out of the JSON when `None` or 0: most proofs find nothing.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsearched: Option<unsearched::Unsearched>,
    /// File bytes found copied in private memory (heap, anonymous mappings), identical.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub identical_file_bytes: u64,
    /// File bytes found converted to another dtype (F16/BF16 → F32, F32 → F16/BF16,
    /// F16 ↔ BF16) in private memory.
    #[serde(default, alias = "widened_file_bytes", skip_serializing_if = "is_zero")]
    pub converted_file_bytes: u64,
    /// Those converted copies per conversion, with the memory they occupy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversions: Vec<converted::Converted>,
    /// Memory those copies occupy (identical and converted): what they add to the count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy_memory_bytes: u64,
    /// Copies (tensor runs) found.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copies: u64,
    /// File bytes found inside the process's own private mapping of this file: its
    /// copy-on-write pages (counted as CoW, never as another copy).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cow_file_bytes: u64,
    /// Fraction of the file's bytes the search could look for (tensors of at least
    /// 4 KiB with some information in them).
    pub searchable_fraction: f64,
    /// Pages between samples (1: every present page).
    pub stride_pages: u64,
    pub sampled_bytes: u64,
    /// Bytes of memory compared with the file to confirm copies.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compared_bytes: u64,
    /// How the pages of the copies are shared with other processes (fork, shared
    /// memory), so that one physical copy counts once; `None`: not weighed (recordings
    /// before it, a proof of one process alone), taken as this process's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical: Option<PhysicalSample>,
    /// Files in shared memory (shmem, tmpfs such as /dev/shm, memfd) the copies were
    /// found in: each is a copy of this file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shmem_files: Vec<FileKey>,
    /// The copies' memory in anonymous shared memory, huge pages and driver memory.
    #[serde(default, skip_serializing_if = "places::Places::is_empty")]
    pub places: places::Places,
    /// Estimated private memory (bytes) distributed like this file's bytes (as they are,
    /// reordered, or relabelled by one XOR constant) that no copy found covers: a form of
    /// the model twofold does not know, suspected (`dupes::likeness`). Sampled pages like
    /// the file times the pages each stands for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unexplained_bytes: u64,
    /// Sampled pages behind [`ProofSample::unexplained_bytes`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unexplained_samples: u64,
}

/// The physical pages under one process's copies of one file, from `/proc/PID/pagemap`
/// (<https://docs.kernel.org/admin-guide/mm/pagemap.html>): with page frame numbers
/// (`CAP_SYS_ADMIN`), each physical page is shared out among the copies that map it;
/// without them, from the page's exclusive-mapping bit (56) and its mapping's
/// `Pss`/`Rss` (smaps), marked estimated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PhysicalSample {
    /// Present 4 KiB pages of the copies weighed.
    pub pages: u64,
    /// Their share, in pages: each page counts 1 / (how many copies found map it).
    pub share_pages: f64,
    /// Most processes one page is mapped by (1: the copy is this process's alone).
    pub shared_by: u32,
    /// Other processes whose copies map the same pages, by pid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<i32>,
    /// Shared through shared memory (shmem, memfd, tmpfs) rather than by fork.
    #[serde(default)]
    pub shmem: bool,
    /// Merged by KSM: shared frames `/proc/kpageflags` marks `KSM`, not fork's.
    #[serde(default)]
    pub ksm: bool,
    /// No page frame numbers (not `CAP_SYS_ADMIN`): weighed from the exclusive bit and
    /// `Pss`/`Rss`, an estimate.
    #[serde(default)]
    pub estimated: bool,
}

impl PhysicalSample {
    /// The part of the copies' bytes that is this process's (1: all of it).
    pub fn ratio(&self) -> f64 {
        if self.pages == 0 {
            1.0
        } else {
            (self.share_pages / self.pages as f64).clamp(0.0, 1.0)
        }
    }
}

/// A map written as a sorted list of `[key, value]` entries: JSON objects only take string
/// keys, and a file key or a (process, file) pair is not one.
pub mod entries;

#[cfg(test)]
mod tests {
    use super::FileKey;

    #[test]
    fn file_key_splits_dev_as_glibc() {
        // Values from glibc's makedev(major, minor).
        for (dev, major, minor) in [
            (0x803, 8, 3),
            (0x6781_039a, 259, 0x6789a),
            (0x1_2000_6783_459a, 0x12345, 0x6789a),
            (0x7fff_f7ff_ffff_ffff, 0x7fff_ffff, 0x7fff_ffff),
        ] {
            let k = FileKey::from_dev(dev, 7);
            assert_eq!((k.major, k.minor, k.inode), (major, minor, 7), "{dev:#x}");
        }
    }
}

//! Raw eBPF counters: cumulative values since the programs were attached, exactly as
//! the maps held them when read (pages, bytes, nanoseconds, event counts).
//!
//! A counter family whose tracepoint could not be attached is listed in
//! [`TraceSample::unavailable`] with the reason; its values here are zero and the model
//! turns them into "unknown". See `docs/trace.md` for each counter's tracepoint.
//!
//! A [`TraceSample`] is part of a recorded snapshot, so it is serialisable: maps keyed by
//! files or (process, file) pairs are written as sorted `[key, value]` entry lists, and
//! counters that are zero are left out (they read back as zero).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::FileKey;

/// What a group of tracepoints counts; a missing tracepoint disables only its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counter {
    /// `exceptions:page_fault_user` and `page_fault_kernel`.
    PageFaults,
    /// `filemap:mm_filemap_fault`.
    FileFaults,
    /// `filemap:mm_filemap_map_pages` (fault-around).
    FaultAround,
    /// `filemap:mm_filemap_add_to_page_cache`.
    PageCacheAdds,
    /// `filemap:mm_filemap_delete_from_page_cache`.
    PageCacheEvictions,
    /// `vmscan:mm_vmscan_direct_reclaim_begin/end`.
    DirectReclaim,
    /// `vmscan:mm_vmscan_memcg_reclaim_begin/end`.
    MemcgReclaim,
    /// `oom:mark_victim`.
    OomKills,
    /// `syscalls:sys_enter_/sys_exit_` of `read`, `pread64`, `readv`, `preadv`.
    Reads,
    /// `syscalls:sys_enter_mmap` / `sys_exit_mmap`.
    Mmaps,
}

use super::is_zero;

fn all_zero<const N: usize>(v: &[u64; N]) -> bool {
    v.iter().all(|x| *x == 0)
}

/// Per process (thread group), cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PidCounters {
    /// Page faults by `error_code & 3`: read not-present, read protection, write
    /// not-present, write protection (user mode, and kernel mode at user addresses).
    #[serde(skip_serializing_if = "all_zero")]
    pub faults_by_code: [u64; 4],
    /// The part of them the kernel took in kernel mode (copy_to_user and the like).
    #[serde(skip_serializing_if = "is_zero")]
    pub kernel_faults: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub file_faults: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub fault_around_events: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub fault_around_pages: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub direct_reclaims: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub memcg_reclaims: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub reclaim_ns: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub reclaim_max_ns: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub reclaimed_pages: u64,
    /// Reclaims by latency: `[2^k, 2^(k+1))` microseconds.
    #[serde(skip_serializing_if = "all_zero")]
    pub reclaim_hist_us_log2: [u64; 32],
}

impl PidCounters {
    pub fn faults(&self) -> u64 {
        self.faults_by_code
            .iter()
            .fold(0, |a, b| a.saturating_add(*b))
    }
}

/// Per file, cumulative. Pages are 4 KiB pages (a folio counts `1 << order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FileCounters {
    #[serde(skip_serializing_if = "is_zero")]
    pub file_faults: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub fault_around_events: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub fault_around_pages: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub added_pages: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub evicted_pages: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub refault_pages: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub add_events: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub evict_events: u64,
}

/// Per (process, file), cumulative.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IoCounters {
    #[serde(skip_serializing_if = "is_zero")]
    pub read_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub read_calls: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub mmap_shared: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub mmap_shared_write: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub mmap_private: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub mmap_private_write: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub mmap_bytes: u64,
    /// The process's comm at its last counted call (it may have exited since).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub comm: String,
}

/// One `oom:mark_victim` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    pub pid: i32,
    pub comm: String,
    pub uid: u32,
    /// The process whose allocation triggered the kill.
    pub killer_pid: i32,
    pub total_vm_bytes: u64,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    /// Seconds since the programs were attached.
    pub at_secs: f64,
}

/// One read of every map. Serialised as part of a snapshot (`docs/store.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceSample {
    /// Seconds since the programs were attached, when this sample was read.
    pub at_secs: f64,
    /// `CLOCK_MONOTONIC` (ns) when the programs were attached: two samples with the same
    /// value come from one attachment, so their counters can be subtracted; samples of
    /// different attachments cannot (each starts from zero).
    #[serde(default)]
    pub attached_mono_ns: u64,
    #[serde(default, with = "super::entries")]
    pub pids: BTreeMap<i32, PidCounters>,
    #[serde(default, with = "super::entries")]
    pub files: BTreeMap<FileKey, FileCounters>,
    #[serde(default, with = "super::entries")]
    pub io: BTreeMap<(i32, FileKey), IoCounters>,
    /// Bytes read of each file by processes that exited and were forgotten (their
    /// `io` entries folded here and deleted from the maps): per-file read totals are
    /// `io` summed per file plus this, so they never go back.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        with = "super::entries"
    )]
    pub exited_read_bytes: BTreeMap<FileKey, u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_kills: Vec<OomKill>,
    /// Counters that could not be attached, with the reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<Counter, String>,
    /// Updates lost because a non-LRU map was full (0 in any sane session).
    #[serde(default)]
    pub lost_updates: u64,
    /// Page-cache pages added and evicted, all files together (kept whatever the
    /// LRU maps dropped).
    #[serde(default)]
    pub added_pages_all: u64,
    #[serde(default)]
    pub evicted_pages_all: u64,
    /// Processes the request named (`--pid`), pinned in the non-LRU maps: when there are
    /// any, the model lists only them (as `trace --pid` does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_pids: Vec<i32>,
    /// The upload tracer's ledger, when `trace` reads it with the counters (snapshots
    /// carry it in their GPU sample instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads: Option<super::uploads::UploadsSample>,
    /// Names the collector resolved from `/proc` when it read the maps, for counters of
    /// files and processes the snapshot's sample does not name (a loader that closed the
    /// file and exited is named only here).
    #[serde(default)]
    pub names: TraceNames,
}

/// Paths of files and comms of processes, as `/proc` named them at sampling time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceNames {
    #[serde(default, with = "super::entries")]
    pub paths: BTreeMap<FileKey, String>,
    #[serde(default, with = "super::entries")]
    pub comms: BTreeMap<i32, String>,
}

/// Whether `prev` and `cur` come from one attachment, in order: their counters subtract
/// (rates are then over the interval between them, else since `cur`'s attach).
pub fn same_attachment(prev: &TraceSample, cur: &TraceSample) -> bool {
    prev.attached_mono_ns == cur.attached_mono_ns && prev.at_secs <= cur.at_secs
}

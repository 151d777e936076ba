//! Raw eBPF counters: cumulative values since the programs were attached, exactly as
//! the maps held them when read (pages, bytes, nanoseconds, event counts).
//!
//! A counter family whose tracepoint could not be attached is listed in
//! [`TraceSample::unavailable`] with the reason; its values here are zero and the model
//! turns them into "unknown". See `docs/trace.md` for each counter's tracepoint.

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

/// Per process (thread group), cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidCounters {
    /// Page faults by `error_code & 3`: read not-present, read protection, write
    /// not-present, write protection (user mode, and kernel mode at user addresses).
    pub faults_by_code: [u64; 4],
    /// The part of them the kernel took in kernel mode (copy_to_user and the like).
    pub kernel_faults: u64,
    pub file_faults: u64,
    pub fault_around_events: u64,
    pub fault_around_pages: u64,
    pub direct_reclaims: u64,
    pub memcg_reclaims: u64,
    pub reclaim_ns: u64,
    pub reclaim_max_ns: u64,
    pub reclaimed_pages: u64,
    /// Reclaims by latency: `[2^k, 2^(k+1))` microseconds.
    pub reclaim_hist_us_log2: [u64; 32],
}

impl PidCounters {
    pub fn faults(&self) -> u64 {
        self.faults_by_code.iter().sum()
    }
}

/// Per file, cumulative. Pages are 4 KiB pages (a folio counts `1 << order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCounters {
    pub file_faults: u64,
    pub fault_around_events: u64,
    pub fault_around_pages: u64,
    pub added_pages: u64,
    pub evicted_pages: u64,
    pub refault_pages: u64,
    pub add_events: u64,
    pub evict_events: u64,
}

/// Per (process, file), cumulative.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    pub read_bytes: u64,
    pub read_calls: u64,
    pub mmap_shared: u64,
    pub mmap_shared_write: u64,
    pub mmap_private: u64,
    pub mmap_private_write: u64,
    pub mmap_bytes: u64,
    /// The process's comm at its last counted call (it may have exited since).
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

/// Not serialised: its maps are keyed by tuples (the model's output is).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceSample {
    /// Seconds since the programs were attached, when this sample was read.
    pub at_secs: f64,
    pub pids: BTreeMap<i32, PidCounters>,
    pub files: BTreeMap<FileKey, FileCounters>,
    pub io: BTreeMap<(i32, FileKey), IoCounters>,
    pub oom_kills: Vec<OomKill>,
    /// Counters that could not be attached, with the reason.
    pub unavailable: BTreeMap<Counter, String>,
    /// Updates lost because a non-LRU map was full (0 in any sane session).
    pub lost_updates: u64,
    /// Page-cache pages added and evicted, all files together (kept whatever the
    /// LRU maps dropped).
    pub added_pages_all: u64,
    pub evicted_pages_all: u64,
}

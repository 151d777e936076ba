//! Per-cgroup memory model over v1 and v2 `memory.stat` (read by `twofold::collect::cgroup`).
//!
//! v2 keys: `anon`, `file`, `file_mapped`, `shmem` (bytes), `workingset_refault_file`
//! (count). v1 uses the hierarchical `total_rss`, `total_cache`, `total_mapped_file`,
//! `total_shmem`, `total_workingset_refault_file`, falling back to the local keys.

use serde::{Deserialize, Serialize};

use crate::sample::{CgroupSample, CgroupVersion};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupModel {
    pub path: String,
    pub version: Option<CgroupVersion>,
    pub usage_bytes: Option<u64>,
    /// `None` when unknown; `Some(None)` is serialised as `"unlimited": true`.
    pub limit_bytes: Option<u64>,
    pub unlimited: bool,
    pub peak_bytes: Option<u64>,
    pub anon_bytes: Option<u64>,
    pub file_bytes: Option<u64>,
    pub file_mapped_bytes: Option<u64>,
    pub shmem_bytes: Option<u64>,
    pub refaults_file: Option<u64>,
    pub oom_events: Option<u64>,
    pub oom_kills: Option<u64>,
    pub failcnt: Option<u64>,
    /// v2 `memory.min`, `memory.low` (protection), `memory.high` (throttling;
    /// `high_unlimited` when `max`). v1 has none of them.
    #[serde(default)]
    pub min_bytes: Option<u64>,
    #[serde(default)]
    pub low_bytes: Option<u64>,
    #[serde(default)]
    pub high_bytes: Option<u64>,
    #[serde(default)]
    pub high_unlimited: bool,
    /// v2 `memory.pressure` `some`/`full` `avg10`, percent.
    #[serde(default)]
    pub pressure: Option<crate::sample::PressureSample>,
}

pub fn build(s: &CgroupSample) -> CgroupModel {
    let get = |keys: &[&str]| keys.iter().find_map(|k| s.stat.get(*k).copied());
    let v1 = s.version == Some(CgroupVersion::V1);
    let (anon, file, mapped, shmem, refault) = if v1 {
        (
            get(&["total_rss", "rss"]),
            get(&["total_cache", "cache"]),
            get(&["total_mapped_file", "mapped_file"]),
            get(&["total_shmem", "shmem"]),
            get(&[
                "total_workingset_refault_file",
                "workingset_refault_file",
                "total_workingset_refault",
            ]),
        )
    } else {
        (
            get(&["anon"]),
            get(&["file"]),
            get(&["file_mapped"]),
            get(&["shmem"]),
            get(&["workingset_refault_file", "workingset_refault"]),
        )
    };
    let (oom_events, oom_kills) = if v1 {
        (
            s.events.get("under_oom").copied(),
            s.events.get("oom_kill").copied(),
        )
    } else {
        (
            s.events.get("oom").copied(),
            s.events.get("oom_kill").copied(),
        )
    };
    CgroupModel {
        path: s.path.clone(),
        version: s.version,
        usage_bytes: s.usage_bytes,
        limit_bytes: s.limit_bytes.flatten(),
        unlimited: s.limit_bytes == Some(None),
        peak_bytes: s.peak_bytes,
        anon_bytes: anon,
        file_bytes: file,
        file_mapped_bytes: mapped,
        shmem_bytes: shmem,
        refaults_file: refault,
        oom_events,
        oom_kills,
        failcnt: s.failcnt,
        min_bytes: s.min_bytes,
        low_bytes: s.low_bytes,
        high_bytes: s.high_bytes.flatten(),
        high_unlimited: s.high_bytes == Some(None),
        pressure: s.pressure,
    }
}

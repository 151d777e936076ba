//! A hand-built report for the state and screen tests: one file held twice (page cache
//! and a proven read() copy), one whose residency is unknown, three processes (one whose
//! PSS is unknown), three cgroups (one the parent of another), a warning and a notice, and rates.

use crate::model::rates::{ProcessRate, Rates};
use crate::model::{
    CandidateCounts, CgroupModel, Code, CopyHow, FileModel, Finding, Holder, MapKind, Mapper,
    ProcessModel, ProvenCopy, Report, Representations, Severity, SuspectedCopy, SystemModel,
};
use crate::sample::{CandidateWhy, CgroupVersion, FileKey, Skipped};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn process(
    pid: i32,
    comm: &str,
    rss: u64,
    anon: u64,
    pss: Option<u64>,
    files: usize,
) -> ProcessModel {
    ProcessModel {
        pid,
        comm: comm.into(),
        cmdline: format!("/usr/bin/{comm} --model /models/llama.gguf"),
        rss_bytes: Some(rss),
        anon_bytes: Some(anon),
        file_bytes: Some(rss - anon),
        shmem_bytes: Some(0),
        swap_bytes: Some(0),
        pss_bytes: pss,
        pss_anon_bytes: None,
        pss_file_bytes: None,
        pss_shmem_bytes: None,
        uss_bytes: pss.map(|p| p.min(anon)),
        shared_clean_bytes: None,
        shared_dirty_bytes: None,
        private_clean_bytes: pss.map(|_| 0),
        private_dirty_bytes: pss.map(|p| p.min(anon)),
        cgroup: Some("/system.slice/llama.service".into()),
        holds_files: Some(files),
        gpu_memory_bytes: Some(0),
        gpu_memory: Vec::new(),
        unreadable: None,
    }
}

fn file(path: &str, inode: u64, size: u64) -> FileModel {
    FileModel {
        path: path.into(),
        path_bytes: None,
        key: FileKey {
            major: 8,
            minor: 1,
            inode,
        },
        device: "8:1".into(),
        inode,
        size_bytes: Some(size),
        resident_bytes: None,
        resident_fraction: None,
        dirty_bytes: None,
        evicted_bytes: None,
        recently_evicted_bytes: None,
        residency_source: None,
        residency_unknown_reason: None,
        mappers: Vec::new(),
        holders: Vec::new(),
        proven_copies: Vec::new(),
        suspected_copies: Vec::new(),
        unexplained: Vec::new(),
        device_copies: Vec::new(),
        uploads: Vec::new(),
        uploads_retired: Vec::new(),
        in_place: Vec::new(),
        candidates: CandidateCounts::default(),
        store: false,
        deleted: false,
        now_at_path: None,
        seen_as: Vec::new(),
        same_bytes: Vec::new(),
        shmem_copy_of: None,
        shmem_places: Vec::new(),
        representations: Representations::default(),
    }
}

pub fn report() -> Report {
    let mut llama = file("/models/llama-3-8b.Q4_K_M.gguf", 11, 4 * GIB);
    llama.resident_bytes = Some(4 * GIB);
    llama.resident_fraction = Some(1.0);
    llama.residency_source = Some("cachestat".into());
    llama.mappers.push(Mapper {
        pid: 4242,
        comm: "llama-server".into(),
        kind: MapKind::Shared,
        prot: "r--s".into(),
        writable: false,
        vmas: 1,
        mapped_bytes: 4 * GIB,
        resident_bytes: Some(4 * GIB),
        pss_bytes: Some(4 * GIB),
        cow_anon_bytes: Some(0),
        thp_bytes: Some(0),
        beyond_eof_bytes: 0,
    });
    llama.holders.push(Holder {
        pid: 5151,
        comm: "python3".into(),
        fds: vec![7],
        mapped: false,
    });
    llama.proven_copies.push(ProvenCopy {
        pid: 5151,
        comm: "python3".into(),
        identical_bytes: 4 * GIB,
        converted_bytes: 0,
        conversions: Vec::new(),
        memory_bytes: 4 * GIB,
        copies: 291,
        fraction: 1.0,
        share: 1.0,
        shared: None,
        how: CopyHow::Read,
        traced_read_bytes: None,
        mapped: false,
        huge_pages: false,
        attribution: None,
    });
    llama.candidates = CandidateCounts {
        could_hold: 1,
        searched: 1,
        not_searched: 0,
        sampled_bytes: 0,
        compared_bytes: 0,
        unsearched: Vec::new(),
    };
    llama.representations = Representations {
        page_cache: Some(1.0),
        cow: Some(0.0),
        private_copies: 1.0,
        proven: Some(2.0),
        ..Representations::default()
    };

    let mut qwen = file("/models/qwen2-7b.safetensors", 12, 512 * MIB);
    qwen.residency_unknown_reason = Some("cachestat and mincore are both unavailable".into());
    qwen.suspected_copies.push(SuspectedCopy {
        pid: 6161,
        comm: "vllm".into(),
        anon_bytes: 600 * MIB,
        attributed_bytes: 512 * MIB,
        fraction: 1.0,
        mapped: false,
        why: CandidateWhy::Named,
        unsearched: "over the proof budget".into(),
    });
    // Two candidates not searched: 6161 suspected, 6262 named though too little of its
    // memory is left to suspect it (a lower bound names every pid it comes from).
    qwen.candidates = CandidateCounts {
        could_hold: 2,
        not_searched: 2,
        unsearched: [6161, 6262]
            .map(|pid| crate::model::UnsearchedCandidate {
                pid,
                why: "over the proof budget".into(),
            })
            .to_vec(),
        ..CandidateCounts::default()
    };
    qwen.representations.lower_bound = true;

    Report {
        schema_version: crate::model::SCHEMA_VERSION,
        system: SystemModel {
            page_size_bytes: 4096,
            mem_total_bytes: Some(64 * GIB),
            mem_available_bytes: Some(40 * GIB),
            page_cache_bytes: Some(20 * GIB),
            anon_bytes: Some(12 * GIB),
            mapped_bytes: Some(5 * GIB),
            shmem_bytes: Some(MIB),
            dirty_bytes: Some(0),
            refaults_file: Some(0),
            major_faults: Some(0),
            pressure: None,
        },
        processes: vec![
            process(
                5151,
                "python3",
                4 * GIB + 300 * MIB,
                4 * GIB + 200 * MIB,
                Some(4 * GIB),
                1,
            ),
            ProcessModel {
                gpu_memory_bytes: Some(4 * GIB + 512 * MIB),
                ..process(
                    4242,
                    "llama-server",
                    4 * GIB + 100 * MIB,
                    80 * MIB,
                    Some(2 * GIB),
                    1,
                )
            },
            ProcessModel {
                cgroup: Some("/user.slice".into()),
                ..process(6161, "vllm", 700 * MIB, 600 * MIB, None, 0)
            },
        ],
        files: vec![llama, qwen],
        cgroups: vec![
            CgroupModel {
                path: "/system.slice/llama.service".into(),
                version: Some(CgroupVersion::V2),
                usage_bytes: Some(9 * GIB),
                limit_bytes: Some(16 * GIB),
                unlimited: false,
                peak_bytes: Some(10 * GIB),
                anon_bytes: Some(4 * GIB),
                file_bytes: Some(5 * GIB),
                file_mapped_bytes: Some(4 * GIB),
                shmem_bytes: Some(0),
                refaults_file: Some(0),
                oom_events: Some(0),
                oom_kills: Some(0),
                failcnt: None,
                min_bytes: Some(0),
                low_bytes: Some(4 * GIB),
                high_bytes: Some(12 * GIB),
                high_unlimited: false,
                pressure: Some(crate::sample::PressureSample {
                    some_avg10: 1.5,
                    full_avg10: Some(0.25),
                }),
            },
            CgroupModel {
                path: "/system.slice".into(),
                version: Some(CgroupVersion::V2),
                usage_bytes: Some(10 * GIB),
                limit_bytes: None,
                unlimited: true,
                peak_bytes: Some(11 * GIB),
                anon_bytes: Some(5 * GIB),
                file_bytes: Some(5 * GIB),
                file_mapped_bytes: Some(4 * GIB),
                shmem_bytes: Some(0),
                refaults_file: Some(12),
                oom_events: Some(1),
                oom_kills: Some(1),
                failcnt: None,
                min_bytes: Some(0),
                low_bytes: Some(0),
                high_bytes: None,
                high_unlimited: true,
                pressure: None,
            },
            CgroupModel {
                path: "/user.slice".into(),
                version: Some(CgroupVersion::V2),
                usage_bytes: Some(GIB),
                limit_bytes: None,
                unlimited: true,
                peak_bytes: None,
                anon_bytes: Some(700 * MIB),
                file_bytes: Some(300 * MIB),
                file_mapped_bytes: None,
                shmem_bytes: None,
                refaults_file: None,
                oom_events: None,
                oom_kills: None,
                failcnt: None,
                min_bytes: None,
                low_bytes: None,
                high_bytes: None,
                high_unlimited: false,
                pressure: None,
            },
        ],
        findings: vec![
            Finding {
                severity: Severity::Notice,
                code: Code::Text {
                    code: "suspected-private-copy".into(),
                    subject: "/models/qwen2-7b.safetensors".into(),
                    message: "pid 6161 (vllm) could hold a copy of 'qwen2-7b.safetensors'".into(),
                    remedy: None,
                },
            },
            Finding {
                severity: Severity::Warning,
                code: Code::Text {
                    code: "private-copy".into(),
                    subject: "/models/llama-3-8b.Q4_K_M.gguf".into(),
                    message: "'llama-3-8b.Q4_K_M.gguf' is in memory 2.00 times".into(),
                    remedy: Some("map it instead of reading it".into()),
                },
            },
        ],
        skipped: Skipped::default(),
        gpus: crate::model::device::GpusModel {
            not_available: None,
            uploads: None,
            devices: vec![crate::model::device::GpuModel {
                info: crate::sample::GpuInfo {
                    index: 0,
                    name: Some("NVIDIA H200".into()),
                    uuid: None,
                    pci_bus_id: Some("0000:3b:00.0".into()),
                    memory_total_bytes: Some(140 * GIB),
                    memory_used_bytes: Some(5 * GIB),
                    memory_free_bytes: Some(135 * GIB),
                    pcie_link_gen: Some(5),
                    pcie_link_width: Some(16),
                    integrated: Some(false),
                },
                process_memory_bytes: Some(4 * GIB + 512 * MIB),
                processes_unavailable: None,
            }],
        },
        trace: None,
        observers: Vec::new(),
        host_files: None,
        privilege: None,
        at_unix_ns: Some(1_764_460_800_000_000_000),
        rates: Some(Rates {
            interval_secs: 2.0,
            refaults_file_per_sec: Some(0.0),
            major_faults_per_sec: Some(0.0),
            processes: vec![
                ProcessRate {
                    pid: 5151,
                    anon_bytes_per_sec: Some(2.0 * MIB as f64),
                },
                ProcessRate {
                    pid: 4242,
                    anon_bytes_per_sec: Some(0.0),
                },
            ],
            files: Vec::new(),
        }),
    }
}

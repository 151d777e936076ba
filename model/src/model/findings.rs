//! Findings: small rules over the model. Each is a typed [`Code`] with the numbers it
//! was found from; [`text`] writes the sentence and the remedy (they are part of the
//! JSON document, so they live with the model).

use serde::{Deserialize, Serialize};

use super::{CgroupModel, CopyHow, FileModel, MapKind};
use crate::sample::{FileKey, Privilege};

mod device;
pub mod remedy;
pub mod text;
mod twins;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Notice,
    Info,
}

/// A finding: which rule fired, about what, with its numbers. The model holds no prose:
/// the sentence, its subject and the remedy people read are written from the code by
/// [`text`] (which also writes and reads a finding's JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub severity: Severity,
    pub code: Code,
}

/// The rule that fired, and the typed facts the sentence is written from. `as_str` is the
/// stable identifier of the rule (`suspected-private-copy`, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum Code {
    /// A copy of the file's bytes proven byte by byte in a process's private memory.
    ProvenPrivateCopy {
        file: FileKey,
        path: String,
        size_bytes: Option<u64>,
        pid: i32,
        comm: String,
        how: CopyHow,
        /// What the copy adds to the count (its memory / the file's size).
        fraction: f64,
        /// File bytes found (identical and converted).
        file_bytes: u64,
        /// File bytes found converted to another dtype, and the main conversion.
        converted_bytes: u64,
        conversion: Option<crate::sample::converted::Conversion>,
        traced_read_bytes: Option<u64>,
        /// Most of it lies in huge pages from the hugetlbfs pool.
        huge_pages: bool,
    },
    /// One physical private copy mapped by several processes (after `fork()`, or in
    /// shared memory): counted once, shared out among them.
    SharedPrivateCopy {
        file: FileKey,
        path: String,
        /// The processes mapping it, by pid.
        pids: Vec<i32>,
        /// Shared memory (shmem, memfd) rather than fork.
        shmem: bool,
        /// Merged by KSM rather than shared after fork.
        ksm: bool,
        /// Fraction of the file the one physical copy holds.
        fraction: f64,
        /// Weighed without page frame numbers: an estimate.
        estimated: bool,
    },
    /// A process that could hold a copy but was not searched.
    SuspectedPrivateCopy {
        file: FileKey,
        path: String,
        size_bytes: Option<u64>,
        pid: i32,
        comm: String,
        anon_bytes: u64,
        /// Why it was not searched, as the proof said.
        unsearched: crate::sample::unsearched::Unsearched,
        /// Who read the sample (the remedy fits them); `None`: not known.
        reader: Option<Privilege>,
    },
    /// Private memory of a process related to the file, distributed like its bytes, that
    /// no proven copy covers: a form of the model twofold does not know (suspected).
    UnexplainedMemory {
        file: FileKey,
        path: String,
        size_bytes: Option<u64>,
        pid: i32,
        comm: String,
        estimated_bytes: u64,
        sampled_pages: u64,
    },
    /// A private writable mapping written in place: copy-on-write pages.
    CowInPrivateMapping {
        file: FileKey,
        path: String,
        pid: i32,
        comm: String,
        cow_bytes: u64,
    },
    /// A mapping past the end of the (shrunk) file.
    MappingBeyondEof {
        file: FileKey,
        path: String,
        pid: i32,
        comm: String,
        beyond_eof_bytes: u64,
    },
    /// File pages mapped with 2 MiB entries.
    FileThp {
        file: FileKey,
        path: String,
        pid: i32,
        comm: String,
        thp_bytes: u64,
    },
    /// Processes sharing one mapped copy.
    SharedMapping {
        file: FileKey,
        path: String,
        size_bytes: Option<u64>,
        sharers: usize,
    },
    /// Files of the same bytes (`FileModel::same_bytes`), each cached: the bytes are in
    /// memory once per file. (key, path, page cache bytes) of each cached one, by path.
    SameBytesCached {
        files: Vec<(FileKey, String, u64)>,
        /// The page cache beyond the largest file's: what one file instead of these
        /// would save at most.
        extra_bytes: u64,
    },
    /// A mapped file mostly not in the page cache.
    LowResidency {
        file: FileKey,
        path: String,
        resident_fraction: f64,
    },
    /// A file replaced or deleted on disk that processes still map or hold: the old
    /// inode (and its page cache) lives until they let it go.
    ReplacedFileHeld {
        file: FileKey,
        path: String,
        /// Its page cache; `None`: unknown.
        resident_bytes: Option<u64>,
        /// The processes keeping it, (pid, comm), by pid.
        holders: Vec<(i32, String)>,
        /// The inode at its path now, if another one.
        now_at_path: Option<FileKey>,
    },
    /// Page-cache residency could not be read.
    ResidencyUnknown {
        file: FileKey,
        path: String,
        /// Why, as collection said.
        reason: String,
        /// Who read the sample (the remedy fits them); `None`: not known.
        reader: Option<Privilege>,
    },
    /// The file is in memory about twice or more, proven.
    MultipleRepresentations {
        file: FileKey,
        path: String,
        total: f64,
        page_cache: f64,
        cow: Option<f64>,
        private_copies: usize,
        private_fraction: f64,
        lower_bound: bool,
    },
    /// Some processes that could hold a copy were not searched.
    CountIsLowerBound {
        file: FileKey,
        path: String,
        unsearched: usize,
        could_hold: usize,
    },
    CgroupOomKills {
        cgroup: String,
        kills: u64,
    },
    CgroupNearLimit {
        cgroup: String,
        usage_bytes: u64,
        limit_bytes: u64,
    },
    /// eBPF: a process read a large part of a file with read().
    ReadCopy {
        file: FileKey,
        path: String,
        pid: i32,
        comm: Option<String>,
        read_bytes: u64,
        /// Seconds the counters cover (since attach).
        secs: f64,
    },
    /// eBPF: a process stalled in direct reclaim.
    DirectReclaim {
        pid: i32,
        comm: Option<String>,
        reclaim_ns: u64,
        reclaims: u64,
        longest_ns: u64,
        secs: f64,
    },
    /// eBPF: a file's pages evicted and read back.
    Refaults {
        file: FileKey,
        path: Option<String>,
        pages: u64,
        /// Bytes of one of those pages (the system's page size).
        page_bytes: u64,
        secs: f64,
    },
    /// eBPF: an OOM kill.
    OomKill {
        pid: i32,
        comm: String,
        anon_rss_bytes: u64,
        file_rss_bytes: u64,
    },
    /// A device copy: proven (a twofold loader read it back identical) or suspected (a
    /// process that came to the file holds that much device memory: NVML sizes only).
    DeviceCopy {
        file: FileKey,
        path: String,
        pid: i32,
        comm: String,
        gpu: Option<u32>,
        gpu_name: Option<String>,
        integrated: Option<bool>,
        device_bytes: u64,
        proven: bool,
        /// How it came to the file (`mapped`, `open`, `copied`, `read`, `named`, `loader`).
        via: String,
    },
    /// A finding read back from a report's JSON: its code and text as written (the typed
    /// facts are not in the JSON).
    Text {
        code: String,
        subject: String,
        message: String,
        remedy: Option<String>,
    },
}

impl Code {
    /// The stable identifier of the rule.
    pub fn as_str(&self) -> &str {
        match self {
            Code::ProvenPrivateCopy { .. } => "proven-private-copy",
            Code::SharedPrivateCopy { .. } => "shared-private-copy",
            Code::SuspectedPrivateCopy { .. } => "suspected-private-copy",
            Code::UnexplainedMemory { .. } => "unexplained-memory",
            Code::CowInPrivateMapping { .. } => "cow-in-private-mapping",
            Code::MappingBeyondEof { .. } => "mapping-beyond-eof",
            Code::FileThp { .. } => "file-thp",
            Code::SharedMapping { .. } => "shared-mapping",
            Code::SameBytesCached { .. } => "same-bytes-cached",
            Code::LowResidency { .. } => "low-residency",
            Code::ReplacedFileHeld { .. } => "replaced-file-held",
            Code::ResidencyUnknown { .. } => "residency-unknown",
            Code::MultipleRepresentations { .. } => "multiple-representations",
            Code::CountIsLowerBound { .. } => "count-is-lower-bound",
            Code::CgroupOomKills { .. } => "cgroup-oom-kills",
            Code::CgroupNearLimit { .. } => "cgroup-near-limit",
            Code::ReadCopy { .. } => "read-copy",
            Code::DirectReclaim { .. } => "direct-reclaim",
            Code::Refaults { .. } => "refaults",
            Code::OomKill { .. } => "oom-kill",
            Code::DeviceCopy { proven: true, .. } => "proven-device-copy",
            Code::DeviceCopy { proven: false, .. } => "suspected-device-copy",
            Code::Text { code, .. } => code,
        }
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Below this page-cache fraction a mapped file's reads go to storage.
pub const LOW_RESIDENCY: f64 = 0.9;
/// A cgroup using this fraction of its limit is near it.
pub const NEAR_LIMIT: f64 = 0.9;

fn finding(severity: Severity, code: Code) -> Finding {
    Finding { severity, code }
}

/// The findings of a report's files and cgroups; `reader` is who read the sample, for
/// remedies that fit them.
pub fn evaluate(
    files: &[FileModel],
    cgroups: &[CgroupModel],
    reader: Option<Privilege>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for f in files {
        file_findings(f, reader, &mut out);
    }
    for c in cgroups {
        cgroup_findings(c, &mut out);
    }
    twins::same_bytes_findings(files, &mut out);
    out.sort_by_key(|f| f.severity);
    out
}

fn file_findings(f: &FileModel, reader: Option<Privilege>, out: &mut Vec<Finding>) {
    let (file, path) = (f.key, &f.path);
    // A copy shared by several processes is one finding, on the process that made it
    // (the one that read the file, else the first), with the whole physical copy.
    let mut groups: Vec<Vec<i32>> = Vec::new();
    for c in &f.proven_copies {
        let Some(s) = &c.shared else { continue };
        let mut pids: Vec<i32> = s.with.iter().copied().chain([c.pid]).collect();
        pids.sort_unstable();
        pids.dedup();
        if !groups.iter().any(|g| g.contains(&c.pid)) {
            groups.push(pids);
        }
    }
    for g in &groups {
        let members: Vec<&super::ProvenCopy> = f
            .proven_copies
            .iter()
            .filter(|c| g.contains(&c.pid))
            .collect();
        out.push(finding(
            Severity::Notice,
            Code::SharedPrivateCopy {
                file,
                path: path.clone(),
                pids: g.clone(),
                shmem: members
                    .iter()
                    .any(|c| c.shared.as_ref().is_some_and(|s| s.shmem)),
                ksm: members
                    .iter()
                    .any(|c| c.shared.as_ref().is_some_and(|s| s.ksm)),
                fraction: members.iter().map(|c| c.fraction).sum(),
                estimated: members
                    .iter()
                    .any(|c| c.shared.as_ref().is_some_and(|s| s.estimated)),
            },
        ));
    }
    let origin = |c: &super::ProvenCopy| {
        let Some(g) = groups.iter().find(|g| g.contains(&c.pid)) else {
            return true;
        };
        let members = || f.proven_copies.iter().filter(|m| g.contains(&m.pid));
        let first = members()
            .find(|m| m.how == CopyHow::Read)
            .or_else(|| members().next());
        first.is_some_and(|m| m.pid == c.pid)
    };
    for c in f.proven_copies.iter().filter(|c| origin(c)) {
        // The origin of a shared copy speaks for the whole physical copy.
        let fraction = match groups.iter().find(|g| g.contains(&c.pid)) {
            Some(g) => f
                .proven_copies
                .iter()
                .filter(|m| g.contains(&m.pid))
                .map(|m| m.fraction)
                .sum(),
            None => c.fraction,
        };
        out.push(finding(
            Severity::Warning,
            Code::ProvenPrivateCopy {
                file,
                path: path.clone(),
                size_bytes: f.size_bytes,
                pid: c.pid,
                comm: c.comm.clone(),
                how: c.how,
                fraction,
                file_bytes: c.identical_bytes + c.converted_bytes,
                converted_bytes: c.converted_bytes,
                conversion: c.conversion(),
                traced_read_bytes: c.traced_read_bytes,
                huge_pages: c.huge_pages,
            },
        ));
    }
    for s in &f.suspected_copies {
        out.push(finding(
            Severity::Notice,
            Code::SuspectedPrivateCopy {
                file,
                path: path.clone(),
                size_bytes: f.size_bytes,
                pid: s.pid,
                comm: s.comm.clone(),
                anon_bytes: s.anon_bytes,
                unsearched: s.unsearched.clone(),
                reader,
            },
        ));
    }
    for u in &f.unexplained {
        out.push(finding(
            Severity::Notice,
            Code::UnexplainedMemory {
                file,
                path: path.clone(),
                size_bytes: f.size_bytes,
                pid: u.pid,
                comm: u.comm.clone(),
                estimated_bytes: u.estimated_bytes,
                sampled_pages: u.sampled_pages,
            },
        ));
    }
    device::device_findings(f, out);
    for m in &f.mappers {
        let cow = m.cow_anon_bytes.unwrap_or(0);
        if m.kind != MapKind::Shared && m.writable && cow > 0 {
            out.push(finding(
                Severity::Warning,
                Code::CowInPrivateMapping {
                    file,
                    path: path.clone(),
                    pid: m.pid,
                    comm: m.comm.clone(),
                    cow_bytes: cow,
                },
            ));
        }
        if m.beyond_eof_bytes > 0 {
            out.push(finding(
                Severity::Warning,
                Code::MappingBeyondEof {
                    file,
                    path: path.clone(),
                    pid: m.pid,
                    comm: m.comm.clone(),
                    beyond_eof_bytes: m.beyond_eof_bytes,
                },
            ));
        }
        if m.thp_bytes.unwrap_or(0) > 0 {
            out.push(finding(
                Severity::Info,
                Code::FileThp {
                    file,
                    path: path.clone(),
                    pid: m.pid,
                    comm: m.comm.clone(),
                    thp_bytes: m.thp_bytes.unwrap_or(0),
                },
            ));
        }
    }
    let sharers = f
        .mappers
        .iter()
        .filter(|m| !m.writable || m.kind == MapKind::Shared)
        .count();
    if sharers >= 2 {
        out.push(finding(
            Severity::Info,
            Code::SharedMapping {
                file,
                path: path.clone(),
                size_bytes: f.size_bytes,
                sharers,
            },
        ));
    }
    let held = !f.mappers.is_empty() || !f.holders.is_empty();
    if f.deleted && held {
        let mut holders: Vec<(i32, String)> = f
            .mappers
            .iter()
            .map(|m| (m.pid, m.comm.clone()))
            .chain(f.holders.iter().map(|h| (h.pid, h.comm.clone())))
            .collect();
        holders.sort();
        holders.dedup();
        out.push(finding(
            Severity::Notice,
            Code::ReplacedFileHeld {
                file,
                path: path.clone(),
                resident_bytes: f.resident_bytes,
                holders,
                now_at_path: f.now_at_path,
            },
        ));
    }
    match (f.resident_fraction, &f.residency_unknown_reason) {
        (Some(r), _) if held && !f.mappers.is_empty() && r < LOW_RESIDENCY => out.push(finding(
            Severity::Notice,
            Code::LowResidency {
                file,
                path: path.clone(),
                resident_fraction: r,
            },
        )),
        (None, Some(reason)) => out.push(finding(
            Severity::Notice,
            Code::ResidencyUnknown {
                file,
                path: path.clone(),
                reason: reason.clone(),
                reader,
            },
        )),
        _ => {}
    }
    let r = &f.representations;
    if let Some(total) = r.proven {
        if total >= 1.8 {
            out.push(finding(
                Severity::Warning,
                Code::MultipleRepresentations {
                    file,
                    path: path.clone(),
                    total,
                    page_cache: r.page_cache.unwrap_or(0.0),
                    cow: r.cow,
                    // Physical copies: a copy shared by several processes is one.
                    private_copies: f
                        .proven_copies
                        .iter()
                        .filter(|c| c.shared.is_none())
                        .count()
                        + groups.len(),
                    private_fraction: r.private_copies,
                    lower_bound: r.lower_bound,
                },
            ));
        }
    }
    if r.unsearched > 0 {
        out.push(finding(
            Severity::Info,
            Code::CountIsLowerBound {
                file,
                path: path.clone(),
                unsearched: r.unsearched,
                could_hold: f.candidates.could_hold,
            },
        ));
    }
}

fn cgroup_findings(c: &CgroupModel, out: &mut Vec<Finding>) {
    if let Some(k) = c.oom_kills.filter(|k| *k > 0) {
        out.push(finding(
            Severity::Warning,
            Code::CgroupOomKills {
                cgroup: c.path.clone(),
                kills: k,
            },
        ));
    }
    if let (Some(u), Some(l)) = (c.usage_bytes, c.limit_bytes) {
        if l > 0 && u as f64 >= NEAR_LIMIT * l as f64 {
            out.push(finding(
                Severity::Warning,
                Code::CgroupNearLimit {
                    cgroup: c.path.clone(),
                    usage_bytes: u,
                    limit_bytes: l,
                },
            ));
        }
    }
}

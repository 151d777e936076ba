//! The data model: pure functions from a [`Sample`] to a [`Report`]. No I/O here.
//!
//! Derived quantities and their definitions:
//! - USS = `Private_Clean + Private_Dirty` (the bytes only this process maps, as `smem`).
//! - Per file, the *representation estimate*: page-cache resident fraction, plus CoW
//!   anonymous bytes inside private mappings of it (as a fraction of its size), plus one
//!   per *suspected* private copy: a holder whose `RssAnon` (less the CoW bytes already
//!   counted) is at least 80% of the file size. Anonymous memory is attributed greedily,
//!   largest file first, so one heap is never counted as the copy of two files. Suspected
//!   copies are sizes, not proof (a byte-level proof is the job of a later `dupes`).

pub mod cgroup;
pub mod dupes;
pub mod findings;
pub mod inspect;
pub mod probe;
pub mod residency;
pub mod trace;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::sample::{FileKey, ProcessSample, Sample, Skipped, Unreadable};
pub use cgroup::CgroupModel;
pub use findings::{Finding, Severity};

/// Version of the JSON document; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// A holder's anonymous memory at least this fraction of a file's size is a suspected copy.
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
    /// `scan --trace D`: eBPF counters over the traced window; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<trace::TraceModel>,
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
    pub holds_files: usize,
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

/// A holder whose anonymous memory is large enough to be a private copy of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspectedCopy {
    pub pid: i32,
    pub comm: String,
    pub anon_bytes: u64,
    /// Anonymous bytes attributed to this file (at most its size).
    pub attributed_bytes: u64,
    pub mapped: bool,
    /// `None`: not checked (`scan` without `--prove`); `Some(false)`: `dupes` found no
    /// byte-identical or widened copy; `Some(true)`: it did.
    pub proven: Option<bool>,
    /// Fraction of the file found copied byte by byte (identical + widened), when checked.
    pub proven_fraction: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Representations {
    /// Page-cache resident fraction; `None` if residency is unknown.
    pub page_cache: Option<f64>,
    /// CoW anonymous bytes inside private mappings, as a fraction of the file.
    pub cow_anon: f64,
    /// Suspected copies not (or not yet) checked byte by byte; each counts as one.
    pub suspected_copies: usize,
    /// Suspected copies that `--prove` confirmed.
    pub proven_copies: usize,
    /// Fraction of the file those proven copies cover (identical + widened).
    pub proven_fraction: f64,
    /// Sum of the above; `None` if the page-cache part is unknown.
    pub total_estimate: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileModel {
    pub path: String,
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
    pub suspected_copies: Vec<SuspectedCopy>,
    pub representations: Representations,
}

fn sum_opt(mut values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.try_fold(0u64, |acc, v| Some(acc + v?))
}

fn process_model(p: &ProcessSample, holds_files: usize) -> ProcessModel {
    let r = p.rollup.as_ref();
    ProcessModel {
        pid: p.pid,
        comm: p.comm.clone(),
        cmdline: p.cmdline.join(" "),
        rss_bytes: p.status.vm_rss_bytes,
        anon_bytes: p.status.rss_anon_bytes,
        file_bytes: p.status.rss_file_bytes,
        shmem_bytes: p.status.rss_shmem_bytes,
        swap_bytes: p.status.vm_swap_bytes,
        pss_bytes: r.map(|r| r.pss_bytes),
        pss_anon_bytes: r.and_then(|r| r.pss_anon_bytes),
        pss_file_bytes: r.and_then(|r| r.pss_file_bytes),
        pss_shmem_bytes: r.and_then(|r| r.pss_shmem_bytes),
        uss_bytes: r.map(|r| r.private_clean_bytes + r.private_dirty_bytes),
        shared_clean_bytes: r.map(|r| r.shared_clean_bytes),
        shared_dirty_bytes: r.map(|r| r.shared_dirty_bytes),
        private_clean_bytes: r.map(|r| r.private_clean_bytes),
        private_dirty_bytes: r.map(|r| r.private_dirty_bytes),
        cgroup: p.cgroup.as_ref().map(|c| c.path.clone()),
        holds_files,
        unreadable: p.unreadable,
    }
}

fn mapper(p: &ProcessSample, key: FileKey, size: Option<u64>, page: u64) -> Option<Mapper> {
    let vmas: Vec<_> = p.mappings.iter().filter(|m| m.key() == key).collect();
    if vmas.is_empty() {
        return None;
    }
    let shared = vmas.iter().filter(|m| m.perms.shared).count();
    let kind = match shared {
        0 => MapKind::Private,
        n if n == vmas.len() => MapKind::Shared,
        _ => MapKind::Mixed,
    };
    let mut prot = crate::sample::Perms::default();
    for m in &vmas {
        prot.read |= m.perms.read;
        prot.write |= m.perms.write;
        prot.exec |= m.perms.exec;
        prot.shared |= m.perms.shared;
    }
    let eof = size.map(|s| s.div_ceil(page) * page);
    Some(Mapper {
        pid: p.pid,
        comm: p.comm.clone(),
        kind,
        prot: prot.as_str(),
        writable: prot.write,
        vmas: vmas.len(),
        mapped_bytes: vmas.iter().map(|m| m.size_bytes()).sum(),
        resident_bytes: sum_opt(vmas.iter().map(|m| m.rss_bytes)),
        pss_bytes: sum_opt(vmas.iter().map(|m| m.pss_bytes)),
        cow_anon_bytes: sum_opt(vmas.iter().map(|m| m.anonymous_bytes)),
        thp_bytes: sum_opt(vmas.iter().map(|m| m.file_pmd_mapped_bytes)),
        beyond_eof_bytes: eof.map_or(0, |eof| {
            vmas.iter()
                .map(|m| (m.offset_bytes + m.size_bytes()).saturating_sub(eof.max(m.offset_bytes)))
                .sum()
        }),
    })
}

/// Builds the report. Pure: the same sample always gives the same report.
pub fn build(sample: &Sample) -> Report {
    let page = sample.system.page_size.max(1);
    let mut files: Vec<FileModel> = sample
        .files
        .iter()
        .map(|f| {
            let resident = f.residency.as_ref().map(|r| r.cached_bytes);
            FileModel {
                path: f.path.clone(),
                device: format!("{}:{}", f.key.major, f.key.minor),
                inode: f.key.inode,
                size_bytes: f.size_bytes,
                resident_bytes: resident,
                // In pages: the last, partial page of a file is cached whole.
                resident_fraction: resident
                    .zip(f.size_bytes)
                    .map(|(r, s)| fraction(r.div_ceil(page), s.div_ceil(page))),
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
                suspected_copies: Vec::new(),
                representations: Representations {
                    page_cache: None,
                    cow_anon: 0.0,
                    suspected_copies: 0,
                    proven_copies: 0,
                    proven_fraction: 0.0,
                    total_estimate: None,
                },
            }
        })
        .collect();
    attribute_copies(sample, &mut files);
    for f in &mut files {
        f.representations = representations(f);
    }
    files.sort_by(|a, b| {
        let ta = a.representations.total_estimate.unwrap_or(0.0);
        let tb = b.representations.total_estimate.unwrap_or(0.0);
        tb.total_cmp(&ta)
            .then(b.size_bytes.cmp(&a.size_bytes))
            .then(a.path.cmp(&b.path))
    });

    let mut holds: BTreeMap<i32, usize> = BTreeMap::new();
    for f in &files {
        let mut pids: Vec<i32> = f.mappers.iter().map(|m| m.pid).collect();
        pids.extend(f.holders.iter().map(|h| h.pid));
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            *holds.entry(pid).or_default() += 1;
        }
    }
    let mut processes: Vec<ProcessModel> = sample
        .processes
        .iter()
        .map(|p| process_model(p, holds.get(&p.pid).copied().unwrap_or(0)))
        .collect();
    processes.sort_by(|a, b| {
        b.holds_files
            .min(1)
            .cmp(&a.holds_files.min(1))
            .then(b.rss_bytes.unwrap_or(0).cmp(&a.rss_bytes.unwrap_or(0)))
            .then(a.pid.cmp(&b.pid))
    });
    let cgroups: Vec<CgroupModel> = sample.cgroups.iter().map(cgroup::build).collect();
    let system = system_model(sample);
    let findings = findings::evaluate(&files, &cgroups);
    Report {
        schema_version: SCHEMA_VERSION,
        system,
        processes,
        files,
        cgroups,
        findings,
        skipped: sample.skipped.clone(),
        trace: None,
    }
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn holders(sample: &Sample, key: FileKey) -> Vec<Holder> {
    sample
        .processes
        .iter()
        .filter_map(|p| {
            let fds: Vec<i32> = p
                .open_files
                .iter()
                .filter(|o| o.key == key)
                .map(|o| o.fd)
                .collect();
            (!fds.is_empty()).then(|| Holder {
                pid: p.pid,
                comm: p.comm.clone(),
                fds,
                mapped: p.mappings.iter().any(|m| m.key() == key),
            })
        })
        .collect()
}

/// Attributes each process's anonymous memory to the files it holds, largest first.
fn attribute_copies(sample: &Sample, files: &mut [FileModel]) {
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|a, b| files[*b].size_bytes.cmp(&files[*a].size_bytes));
    for p in &sample.processes {
        let Some(anon) = p.status.rss_anon_bytes else {
            continue;
        };
        let cow: u64 = p.mappings.iter().filter_map(|m| m.anonymous_bytes).sum();
        let mut left = anon.saturating_sub(cow);
        for &i in &order {
            let f = &mut files[i];
            let mapped = f.mappers.iter().any(|m| m.pid == p.pid);
            let held = mapped || f.holders.iter().any(|h| h.pid == p.pid);
            let size = f.size_bytes.unwrap_or(0);
            if !held || size == 0 {
                continue;
            }
            if left as f64 >= SUSPECT_FRACTION * size as f64 {
                let attributed = left.min(size);
                left -= attributed;
                f.suspected_copies.push(SuspectedCopy {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    anon_bytes: anon,
                    attributed_bytes: attributed,
                    mapped,
                    proven: None,
                    proven_fraction: None,
                });
            }
        }
    }
}

fn representations(f: &FileModel) -> Representations {
    let cow: u64 = f.mappers.iter().filter_map(|m| m.cow_anon_bytes).sum();
    let cow_anon = fraction(cow, f.size_bytes.unwrap_or(0));
    let unchecked = f
        .suspected_copies
        .iter()
        .filter(|s| s.proven.is_none())
        .count();
    let proven: f64 = f
        .suspected_copies
        .iter()
        .filter_map(|s| s.proven_fraction)
        .fold(0.0, |a, b| a + b);
    let n_proven = f
        .suspected_copies
        .iter()
        .filter(|s| s.proven == Some(true))
        .count();
    Representations {
        page_cache: f.resident_fraction,
        cow_anon,
        suspected_copies: unchecked,
        proven_copies: n_proven,
        proven_fraction: proven,
        total_estimate: f
            .resident_fraction
            .map(|pc| pc + cow_anon + unchecked as f64 + proven),
    }
}

/// The outcome of `dupes` for one (process, file): fraction of the file found copied.
#[derive(Debug, Clone, PartialEq)]
pub struct Proof {
    pub pid: i32,
    pub path: String,
    /// `None` when the process could not be searched.
    pub fraction: Option<f64>,
}

/// Folds byte-level proofs into a report: suspected copies become proven or disproven,
/// and representations and findings are recomputed.
pub fn apply_proofs(report: &mut Report, proofs: &[Proof]) {
    for f in &mut report.files {
        for s in &mut f.suspected_copies {
            let Some(p) = proofs.iter().find(|p| p.pid == s.pid && p.path == f.path) else {
                continue;
            };
            if let Some(fr) = p.fraction {
                s.proven = Some(fr > 0.0);
                s.proven_fraction = Some(fr);
            }
        }
        f.representations = representations(f);
    }
    report.findings = findings::evaluate(&report.files, &report.cgroups);
}

/// Adds the traced counters of `scan --trace` and their findings to a report.
pub fn apply_trace(report: &mut Report, model: trace::TraceModel, ctx: &trace::TraceContext) {
    report
        .findings
        .extend(trace::findings::evaluate(&model, ctx));
    report.findings.sort_by_key(|f| f.severity);
    report.trace = Some(model);
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
    }
}

#[cfg(test)]
mod tests;

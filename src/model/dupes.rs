//! The `dupes` report: proven copies per process and file, and the representation count.
//! Pure: built from the tensor table, the index's targets, and the confirmed matches.

use serde::{Deserialize, Serialize};

use crate::collect::memory::{Region, RegionKind};
use crate::container::{Container, Format};
use crate::dupes::index::{CopyKind, Index, Unsearchable};
use crate::dupes::search::{Found, Stats};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DupesReport {
    pub schema_version: u32,
    pub processes: Vec<ProcessDupes>,
    /// Machine-wide, per file: page cache + every process's proven copies.
    pub files: Vec<FileSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessDupes {
    pub pid: i32,
    pub comm: String,
    /// Why this process could not be searched (e.g. no ptrace rights); its copies are
    /// unknown then, not zero.
    pub error: Option<String>,
    pub files: Vec<FileDupes>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    pub tensors: usize,
    /// Bytes of the file these copies cover.
    pub file_bytes: u64,
    /// Bytes they occupy in the process.
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionHits {
    pub label: String,
    pub kind: RegionKind,
    pub start: u64,
    pub end: u64,
    pub identical_bytes: u64,
    pub widened_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyHit {
    pub tensor: String,
    pub kind: CopyKind,
    pub address: u64,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileDupes {
    pub path: String,
    pub format: Format,
    pub size_bytes: u64,
    pub tensors: usize,
    pub tensor_bytes: u64,
    /// Tensors shorter than 4 KiB: not searched.
    pub too_small: Tally,
    /// Tensors with no 4 KiB region free of constant runs: not searched.
    pub low_entropy: Tally,
    pub identical: Tally,
    pub widened: Tally,
    pub regions: Vec<RegionHits>,
    pub copies: Vec<CopyHit>,
    /// (identical + widened file bytes) / file size: private copies of the file this
    /// process holds.
    pub private_copies: f64,
    pub stats: Stats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSummary {
    pub path: String,
    pub size_bytes: u64,
    pub page_cache: Option<f64>,
    pub private_copies: f64,
    /// `page_cache + private_copies`; `None` if residency is unknown.
    pub representations: Option<f64>,
}

/// Builds one process's findings for one file.
pub fn file_dupes(
    path: &str,
    container: &Container,
    index: &Index,
    regions: &[Region],
    found: &[Found],
    stats: Stats,
) -> FileDupes {
    let tensors = &container.tensors;
    let mut f = FileDupes {
        path: path.to_string(),
        format: container.format.clone(),
        size_bytes: container.file_size,
        tensors: tensors.len(),
        tensor_bytes: tensors.iter().map(|t| t.len).sum(),
        too_small: Tally::default(),
        low_entropy: Tally::default(),
        identical: Tally::default(),
        widened: Tally::default(),
        regions: Vec::new(),
        copies: Vec::new(),
        private_copies: 0.0,
        stats,
    };
    for (ti, kind, why) in &index.unsearchable {
        if *kind != CopyKind::Identical {
            continue;
        }
        let tally = match why {
            Unsearchable::TooSmall => &mut f.too_small,
            Unsearchable::LowEntropy => &mut f.low_entropy,
        };
        tally.tensors += 1;
        tally.file_bytes += tensors[*ti].len;
        tally.memory_bytes += tensors[*ti].len;
    }
    for hit in found {
        let t = &index.targets[hit.target];
        let tensor = &tensors[t.tensor];
        let tally = if t.kind == CopyKind::Identical {
            &mut f.identical
        } else {
            &mut f.widened
        };
        tally.tensors += 1;
        tally.file_bytes += tensor.len;
        tally.memory_bytes += t.mem_len;
        let r = &regions[hit.region];
        let pos = f
            .regions
            .iter()
            .position(|x| x.start == r.start)
            .unwrap_or_else(|| {
                f.regions.push(RegionHits {
                    label: r.label.clone(),
                    kind: r.kind,
                    start: r.start,
                    end: r.end,
                    identical_bytes: 0,
                    widened_bytes: 0,
                });
                f.regions.len() - 1
            });
        if t.kind == CopyKind::Identical {
            f.regions[pos].identical_bytes += t.mem_len;
        } else {
            f.regions[pos].widened_bytes += t.mem_len;
        }
        f.copies.push(CopyHit {
            tensor: tensor.name.clone(),
            kind: t.kind,
            address: hit.addr,
            memory_bytes: t.mem_len,
        });
    }
    f.copies.sort_by_key(|c| c.address);
    f.regions.sort_by_key(|r| r.start);
    if f.size_bytes > 0 {
        f.private_copies =
            (f.identical.file_bytes + f.widened.file_bytes) as f64 / f.size_bytes as f64;
    }
    f
}

/// Machine-wide summary per file over all processes searched.
pub fn summarize(
    processes: &[ProcessDupes],
    residency: &[(String, Option<f64>)],
) -> Vec<FileSummary> {
    residency
        .iter()
        .map(|(path, page_cache)| {
            let mut size = 0;
            let private: f64 = processes
                .iter()
                .flat_map(|p| p.files.iter())
                .filter(|f| &f.path == path)
                .map(|f| {
                    size = f.size_bytes;
                    f.private_copies
                })
                .fold(0.0, |a, b| a + b);
            FileSummary {
                path: path.clone(),
                size_bytes: size,
                page_cache: *page_cache,
                private_copies: private,
                representations: page_cache.map(|pc| pc + private),
            }
        })
        .collect()
}

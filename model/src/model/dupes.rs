//! The `dupes` report: proven copies per process and file, and the representation count.
//! Pure: built from the tensor table, the index's targets, and the confirmed matches.

use serde::{Deserialize, Serialize};

use twofold_formats::convert::Conversion;
use twofold_formats::{Format, Tensor};

/// What kind of memory a searched range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionKind {
    /// Private anonymous memory (heap, `mmap(MAP_ANONYMOUS)`, stacks).
    Anon,
    /// Shared anonymous memory or shmem/memfd/tmpfs mappings.
    SharedAnon,
    /// Anonymous (copy-on-write) pages inside a private writable file mapping.
    PrivateFile,
    /// Huge pages from the hugetlbfs pool (`MAP_HUGETLB`: `/anon_hugepage`).
    Hugetlb,
    /// Host memory the NVIDIA driver maps (`/dev/nvidiactl`: pinned memory; managed
    /// memory resident on the CPU), or anonymous shared memory of a process that maps the
    /// driver (its pinned allocations).
    Pinned,
}

/// How a copy relates to the file's bytes: as they are, or converted to another dtype
/// ([`Conversion`]). The first three keep their names of old (`widened_f16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    Identical,
    /// F16 widened to F32.
    WidenedF16,
    /// BF16 widened to F32.
    WidenedBf16,
    /// F32 narrowed to F16.
    F32ToF16,
    /// F32 narrowed to BF16.
    F32ToBf16,
    /// BF16 to F16 (through F32).
    Bf16ToF16,
    /// F16 to BF16 (through F32).
    F16ToBf16,
    /// A quantised weight repacked by llama.cpp's CPU backend into `layout`, rows of
    /// `row_bytes` bytes interleaved `R` at a time (`twofold_formats::repack`): the same
    /// size as the file's tensor, recomputed a group of `R` rows at a time.
    Repacked {
        layout: twofold_formats::repack::Layout,
        row_bytes: u32,
    },
    /// A quantised weight packed by llama.cpp's AMX backend into 16-row tiles
    /// (`twofold_formats::repack::amx`), recomputed 16 rows at a time; some types grow.
    AmxPacked {
        layout: twofold_formats::repack::amx::AmxLayout,
        row_bytes: u32,
    },
}

impl CopyKind {
    /// The dtype conversion it is (`None`: identical bytes).
    pub fn conversion(self) -> Option<Conversion> {
        Some(match self {
            CopyKind::Identical => return None,
            CopyKind::WidenedF16 => Conversion::F16ToF32,
            CopyKind::WidenedBf16 => Conversion::Bf16ToF32,
            CopyKind::F32ToF16 => Conversion::F32ToF16,
            CopyKind::F32ToBf16 => Conversion::F32ToBf16,
            CopyKind::Bf16ToF16 => Conversion::Bf16ToF16,
            CopyKind::F16ToBf16 => Conversion::F16ToBf16,
            CopyKind::Repacked { layout, .. } => Conversion::Repack(layout),
            CopyKind::AmxPacked { layout, .. } => Conversion::Amx(layout),
        })
    }

    /// The unit its bytes are made in: (file bytes, memory bytes). An element for a
    /// conversion, a byte for identical bytes, a group of `R` rows for a repack (a tensor's
    /// memory is recomputed from whole units, starting at the tensor's start).
    pub fn granule(self) -> (u64, u64) {
        match self {
            CopyKind::Repacked { layout, row_bytes } => {
                let g = layout.group_bytes(u64::from(row_bytes)).max(1);
                (g, g)
            }
            CopyKind::AmxPacked { layout, row_bytes } if row_bytes > 0 => {
                use twofold_formats::repack::amx::TILE_ROWS;
                let s = layout.spec();
                let tiles = u64::from(row_bytes) / s.source_block_bytes as u64;
                (
                    TILE_ROWS as u64 * u64::from(row_bytes),
                    (tiles * s.tile_bytes() as u64).max(1),
                )
            }
            other => other.elements(),
        }
    }

    /// Bytes of one element: (in the file, in memory); (1, 1) for identical bytes.
    pub fn elements(self) -> (u64, u64) {
        self.conversion().map_or((1, 1), Conversion::elements)
    }

    /// Memory bytes of `file_bytes` of the file (whole elements).
    pub fn mem_bytes(self, file_bytes: u64) -> u64 {
        let (f, m) = self.elements();
        (file_bytes / f).saturating_mul(m)
    }

    /// File bytes of `mem_bytes` of memory (whole elements).
    pub fn file_bytes(self, mem_bytes: u64) -> u64 {
        let (f, m) = self.elements();
        (mem_bytes / m).saturating_mul(f)
    }
}

impl From<Conversion> for CopyKind {
    fn from(c: Conversion) -> CopyKind {
        match c {
            Conversion::F16ToF32 => CopyKind::WidenedF16,
            Conversion::Bf16ToF32 => CopyKind::WidenedBf16,
            Conversion::F32ToF16 => CopyKind::F32ToF16,
            Conversion::F32ToBf16 => CopyKind::F32ToBf16,
            Conversion::Bf16ToF16 => CopyKind::Bf16ToF16,
            Conversion::F16ToBf16 => CopyKind::F16ToBf16,
            // The row length is the tensor's: 0 takes the bytes converted as one group.
            Conversion::Repack(layout) => CopyKind::Repacked {
                layout,
                row_bytes: 0,
            },
            Conversion::Amx(layout) => CopyKind::AmxPacked {
                layout,
                row_bytes: 0,
            },
        }
    }
}

/// Why a tensor cannot be searched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unsearchable {
    /// Shorter than `grid::SMALL_MIN` (256 bytes) in memory.
    TooSmall,
    /// Every indexed window of it is a constant run (all zeros, one repeated value).
    LowEntropy,
}

/// Work done by one search of a process's memory, for reports and the benchmark.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepStats {
    pub regions: usize,
    /// Address space of the searched regions.
    pub mapped_bytes: u64,
    /// Present, eligible bytes in them.
    pub present_bytes: u64,
    pub sampled_pages: u64,
    pub candidates: u64,
    pub rejected: u64,
    /// Bytes compared with the file.
    pub compared_bytes: u64,
    pub stride_pages: u64,
}

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
    /// Without named files: the host's files of interest (mapped, held or named by any
    /// process) it was looked at for; its files are those it maps or holds and those it
    /// has the private memory and the reads to hold a copy of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_files: Option<crate::sample::HostFiles>,
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
    /// Memory bytes of copies converted to another dtype (widened, narrowed, F16 ↔ BF16).
    #[serde(alias = "widened_bytes")]
    pub converted_bytes: u64,
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
    /// Tensors shorter than 256 bytes (`dupes::grid::SMALL_MIN`) in memory: not searched.
    pub too_small: Tally,
    /// Tensors whose indexed windows are all constant runs: not searched.
    pub low_entropy: Tally,
    pub identical: Tally,
    /// Copies converted to another dtype ([`CopyKind::conversion`]).
    #[serde(alias = "widened")]
    pub converted: Tally,
    pub regions: Vec<RegionHits>,
    pub copies: Vec<CopyHit>,
    /// File bytes found inside the process's own private mapping of this file: its
    /// copy-on-write pages, not a private copy.
    #[serde(default)]
    pub cow_bytes: u64,
    /// (identical + converted memory bytes) / file size × `share`: private copies of the
    /// file this process holds, a converted copy by the bytes it occupies (F32 → F16 of a
    /// whole file: 0.5), its physical share. `None` when nothing in the file can be
    /// searched for (unknown, not 0).
    pub private_copies: Option<f64>,
    /// The part of the copies' pages that is this process's (1: its own; 1/4 for a copy
    /// four searched processes share after fork), as `scan` weighs it.
    #[serde(default = "one")]
    pub share: f64,
    /// Most searched processes one page of the copies is mapped by (1: its own).
    #[serde(default = "one_u32")]
    pub shared_by: u32,
    pub stats: SweepStats,
}

fn one() -> f64 {
    1.0
}

fn one_u32() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSummary {
    pub path: String,
    pub size_bytes: u64,
    pub page_cache: Option<f64>,
    /// Copy-on-write pages of processes' private mappings of the file, as a fraction.
    #[serde(default)]
    pub cow: f64,
    /// `None` when nothing in the file can be searched for.
    pub private_copies: Option<f64>,
    /// `page_cache + cow + private_copies` (the count `scan` gives); `None` if either is
    /// unknown.
    pub representations: Option<f64>,
}

/// A confirmed copy as the search reports it: which tensor, how, where, and the region
/// (label, kind, bounds) it lies in.
#[derive(Debug, Clone)]
pub struct HitIn {
    pub tensor: usize,
    pub kind: CopyKind,
    pub address: u64,
    /// Memory bytes credited (present pages equal to the file).
    pub memory_bytes: u64,
    pub region: (String, RegionKind, u64, u64),
    /// Inside the process's own private mapping of this file (CoW pages).
    pub own_mapping: bool,
}

/// A file as the search saw it.
pub struct Searched<'a> {
    pub path: &'a str,
    pub format: &'a Format,
    pub size_bytes: u64,
    /// The tensors searched for (a file twofold cannot parse: its blocks).
    pub tensors: &'a [Tensor],
    pub unsearchable: &'a [(usize, CopyKind, Unsearchable)],
    /// Whether anything in it could be searched for.
    pub searchable: bool,
}

/// Builds one process's findings for one file.
pub fn file_dupes(file: &Searched, hits: &[HitIn], stats: SweepStats) -> FileDupes {
    let Searched {
        path,
        format,
        size_bytes,
        tensors,
        unsearchable,
        searchable,
    } = *file;
    let mut f = FileDupes {
        path: path.to_string(),
        format: format.clone(),
        size_bytes,
        tensors: tensors.len(),
        tensor_bytes: tensors.iter().map(|t| t.len).sum(),
        too_small: Tally::default(),
        low_entropy: Tally::default(),
        identical: Tally::default(),
        converted: Tally::default(),
        regions: Vec::new(),
        copies: Vec::new(),
        cow_bytes: 0,
        private_copies: None,
        share: 1.0,
        shared_by: 1,
        stats,
    };
    for (ti, kind, why) in unsearchable.iter() {
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
    // Tensors are counted once each, however many pieces of them were found (a copy that
    // spans two mappings is found as two pieces of one tensor).
    let mut seen = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for hit in hits {
        let tensor = &tensors[hit.tensor];
        let file_bytes = hit.kind.file_bytes(hit.memory_bytes);
        if hit.own_mapping {
            f.cow_bytes += file_bytes;
            continue;
        }
        let (tally, seen) = if hit.kind == CopyKind::Identical {
            (&mut f.identical, &mut seen.0)
        } else {
            (&mut f.converted, &mut seen.1)
        };
        if seen.insert(hit.tensor) {
            tally.tensors += 1;
        }
        tally.file_bytes += file_bytes;
        tally.memory_bytes += hit.memory_bytes;
        let (label, kind, start, end) = &hit.region;
        let pos = f
            .regions
            .iter()
            .position(|x| x.start == *start)
            .unwrap_or_else(|| {
                f.regions.push(RegionHits {
                    label: label.clone(),
                    kind: *kind,
                    start: *start,
                    end: *end,
                    identical_bytes: 0,
                    converted_bytes: 0,
                });
                f.regions.len() - 1
            });
        if hit.kind == CopyKind::Identical {
            f.regions[pos].identical_bytes += hit.memory_bytes;
        } else {
            f.regions[pos].converted_bytes += hit.memory_bytes;
        }
        f.copies.push(CopyHit {
            tensor: tensor.name.clone(),
            kind: hit.kind,
            address: hit.address,
            memory_bytes: hit.memory_bytes,
        });
    }
    f.copies.sort_by_key(|c| c.address);
    f.regions.sort_by_key(|r| r.start);
    if searchable && f.size_bytes > 0 {
        f.private_copies = Some(
            (f.identical.memory_bytes + f.converted.memory_bytes) as f64 / f.size_bytes as f64,
        );
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
            let cow_bytes: u64 = processes
                .iter()
                .flat_map(|p| p.files.iter())
                .filter(|f| &f.path == path)
                .map(|f| f.cow_bytes)
                .sum();
            let private: Option<f64> = processes
                .iter()
                .flat_map(|p| p.files.iter())
                .filter(|f| &f.path == path)
                .map(|f| {
                    size = f.size_bytes;
                    f.private_copies
                })
                .try_fold(0.0, |a, b| Some(a + b?));
            let cow = if size > 0 {
                cow_bytes as f64 / size as f64
            } else {
                0.0
            };
            FileSummary {
                path: path.clone(),
                size_bytes: size,
                page_cache: *page_cache,
                cow,
                private_copies: private,
                representations: page_cache.zip(private).map(|(pc, p)| pc + cow + p),
            }
        })
        .collect()
}

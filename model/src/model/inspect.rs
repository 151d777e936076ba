//! `twofold inspect`: statistics of a container's tensor table. Pure: no I/O.
//!
//! Definitions (all over tensors of non-zero length, in file order):
//! - *aligned bytes*: bytes of tensors whose file offset is a multiple of the page
//!   (4 KiB) or huge page (2 MiB); the fraction is of all tensor bytes.
//! - *shared pages*: 4 KiB file pages holding bytes of at least two different tensors;
//!   such a page is faulted in (and kept resident) by whichever tensor is used first.
//! - *relayout padding*: the bytes a writer would add if each tensor started at the next
//!   aligned offset after the previous one, starting from an aligned data section.
//! - *widening*: packed float dtypes that frameworks often upcast to F32 when they load
//!   (F16, BF16, F8): elements × 4 bytes. A value-exact, element-wise conversion (the one
//!   `dupes` searches for F16 and BF16). I8/U8 are not counted: they also hold raw bytes,
//!   masks and int8 weights that stay int8.
//! - *dequantisation*: GGML block-quantised tensors (`Q4_K`, `Q8_0`, `IQ2_XXS`...) that a
//!   framework may dequantise to F32 when it loads (elements × 4 bytes). Never called
//!   widening: the values are reconstructed from block scales, not upcast one by one, and
//!   no copy of them can be found byte for byte.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use twofold_formats::{
    gguf, numel, Container, Dtype, ExternalTensor, Format, Tensor, UnmappedTensor,
};

pub use crate::sample::PAGE_BYTES;
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;

/// The JSON document of `twofold inspect --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InspectReport {
    pub schema_version: u32,
    pub files: Vec<FileInspect>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileInspect {
    pub path: String,
    pub format: Format,
    /// For people: `gguf v3`, `npy 1.0`.
    pub format_name: String,
    pub file_size_bytes: u64,
    pub data_offset_bytes: Option<u64>,
    /// What the format promises (GGUF `general.alignment`).
    pub format_alignment_bytes: Option<u64>,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    /// By bytes, largest first.
    pub dtypes: Vec<DtypeStat>,
    pub alignment: AlignmentStats,
    pub widening: Widening,
    /// GGML block-quantised tensors as F32: a separate figure from `widening`.
    #[serde(default)]
    pub dequantisation: Dequantisation,
    pub tensors: Vec<Tensor>,
    /// Tensors in another file (ONNX external data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalTensor>,
    /// Tensors stored as no byte range of the file (ONNX varint-packed data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmapped: Vec<UnmappedTensor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DtypeStat {
    pub dtype: String,
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlignmentStats {
    pub page_bytes: u64,
    pub huge_page_bytes: u64,
    pub page_aligned_bytes: u64,
    /// `None` when there are no tensor bytes.
    pub page_aligned_fraction: Option<f64>,
    pub huge_page_aligned_bytes: u64,
    pub huge_page_aligned_fraction: Option<f64>,
    pub shared_pages: u64,
    pub shared_page_bytes: u64,
    pub page_relayout: Relayout,
    pub huge_page_relayout: Relayout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Relayout {
    pub alignment_bytes: u64,
    pub padding_bytes: u64,
    /// Of the tensor bytes; `None` when there are none.
    pub padding_fraction: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Widening {
    pub tensors: usize,
    pub bytes: u64,
    pub elements: u64,
    /// The same elements as F32.
    pub widened_bytes: u64,
    pub by_dtype: Vec<WidenStat>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WidenStat {
    pub dtype: String,
    pub tensors: usize,
    pub bytes: u64,
    pub elements: u64,
    pub widened_bytes: u64,
}

/// Block-quantised tensors and their size dequantised to F32.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dequantisation {
    pub tensors: usize,
    pub bytes: u64,
    pub elements: u64,
    /// The same elements as F32.
    pub dequantised_bytes: u64,
    pub by_dtype: Vec<DequantStat>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DequantStat {
    pub dtype: String,
    pub tensors: usize,
    pub bytes: u64,
    pub elements: u64,
    /// Bits per element of the GGML type (`Q4_K` 4.5); `None` for a type ggml lacks.
    pub bits_per_element: Option<f64>,
    pub dequantised_bytes: u64,
}

fn fraction(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// `gguf v3`, `npy 1.0`, `safetensors`.
pub fn format_name(f: &Format) -> String {
    match f {
        Format::Safetensors => "safetensors".into(),
        Format::Gguf { version } => format!("gguf v{version}"),
        Format::Npy { major, minor } => format!("npy {major}.{minor}"),
        Format::Npz => "npz".into(),
        Format::Torch => "torch zip".into(),
        Format::Onnx => "onnx".into(),
        Format::Opaque => "opaque".into(),
    }
}

/// Bytes of tensors whose offset is a multiple of `align`.
fn aligned_bytes(tensors: &[&Tensor], align: u64) -> u64 {
    tensors
        .iter()
        .filter(|t| t.offset % align == 0)
        .fold(0u64, |a, t| a.saturating_add(t.len))
}

/// Pages of `page` bytes that hold bytes of two or more tensors. `tensors` are sorted by
/// offset; each covers pages `first..=last`, and a page is shared where it lies in the
/// union of the earlier tensors' pages too.
pub fn shared_pages(tensors: &[&Tensor], page: u64) -> u64 {
    let mut shared = 0;
    let mut max_last: Option<u64> = None;
    let mut counted_to: Option<u64> = None;
    for t in tensors {
        let first = t.offset / page;
        let last = t.offset.saturating_add(t.len - 1) / page;
        if let Some(prev) = max_last.filter(|&m| m >= first) {
            let hi = prev.min(last);
            let lo = counted_to.map_or(first, |c| first.max(c + 1));
            if hi >= lo {
                shared += hi - lo + 1;
                counted_to = Some(hi);
            }
        }
        max_last = Some(max_last.map_or(last, |m| m.max(last)));
    }
    shared
}

/// Padding added if each tensor started at the next multiple of `align`.
pub fn relayout_padding(tensors: &[&Tensor], align: u64) -> u64 {
    let mut pos = 0u64;
    let mut padding = 0u64;
    for t in tensors {
        let start = pos.checked_next_multiple_of(align).unwrap_or(u64::MAX);
        padding = padding.saturating_add(start - pos);
        pos = start.saturating_add(t.len);
    }
    padding
}

/// Packed float dtypes that frameworks often widen to F32 element by element. Not GGML
/// block quantisations: see [`Dequantisation`].
pub fn widens(d: &Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F8E4M3 | Dtype::F8E5M2)
}

fn dequantisation(tensors: &[Tensor]) -> Dequantisation {
    let mut by: BTreeMap<&str, DequantStat> = BTreeMap::new();
    for t in tensors {
        let Dtype::Quant(name) = &t.dtype else {
            continue;
        };
        let s = by.entry(name).or_insert_with(|| DequantStat {
            dtype: name.clone(),
            tensors: 0,
            bytes: 0,
            elements: 0,
            bits_per_element: gguf::bits_per_element(name),
            dequantised_bytes: 0,
        });
        let n = numel(&t.shape).unwrap_or(0);
        s.tensors += 1;
        s.bytes = s.bytes.saturating_add(t.len);
        s.elements = s.elements.saturating_add(n);
        s.dequantised_bytes = s.dequantised_bytes.saturating_add(n.saturating_mul(4));
    }
    let mut by_dtype: Vec<DequantStat> = by.into_values().collect();
    by_dtype.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.dtype.cmp(&b.dtype)));
    let sum =
        |f: fn(&DequantStat) -> u64| by_dtype.iter().fold(0u64, |a, s| a.saturating_add(f(s)));
    Dequantisation {
        tensors: by_dtype.iter().map(|s| s.tensors).sum(),
        bytes: sum(|s| s.bytes),
        elements: sum(|s| s.elements),
        dequantised_bytes: sum(|s| s.dequantised_bytes),
        by_dtype,
    }
}

fn widening(tensors: &[Tensor]) -> Widening {
    let mut by: BTreeMap<&Dtype, WidenStat> = BTreeMap::new();
    for t in tensors.iter().filter(|t| widens(&t.dtype)) {
        let s = by.entry(&t.dtype).or_insert_with(|| WidenStat {
            dtype: t.dtype.name(),
            tensors: 0,
            bytes: 0,
            elements: 0,
            widened_bytes: 0,
        });
        let n = numel(&t.shape).unwrap_or(0);
        s.tensors += 1;
        s.bytes = s.bytes.saturating_add(t.len);
        s.elements = s.elements.saturating_add(n);
        s.widened_bytes = s.widened_bytes.saturating_add(n.saturating_mul(4));
    }
    let mut by_dtype: Vec<WidenStat> = by.into_values().collect();
    by_dtype.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.dtype.cmp(&b.dtype)));
    Widening {
        tensors: by_dtype.iter().map(|s| s.tensors).sum(),
        bytes: by_dtype.iter().fold(0u64, |a, s| a.saturating_add(s.bytes)),
        elements: by_dtype
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.elements)),
        widened_bytes: by_dtype
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.widened_bytes)),
        by_dtype,
    }
}

fn dtypes(tensors: &[Tensor]) -> Vec<DtypeStat> {
    let mut by: BTreeMap<&Dtype, (usize, u64)> = BTreeMap::new();
    for t in tensors {
        let e = by.entry(&t.dtype).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(t.len);
    }
    let mut out: Vec<DtypeStat> = by
        .into_iter()
        .map(|(dtype, (tensors, bytes))| DtypeStat {
            dtype: dtype.name(),
            tensors,
            bytes,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.dtype.cmp(&b.dtype)));
    out
}

/// Alignment statistics of tensors sorted by offset.
pub fn alignment(tensors: &[Tensor]) -> AlignmentStats {
    let live: Vec<&Tensor> = tensors.iter().filter(|t| t.len > 0).collect();
    let total = live.iter().fold(0u64, |a, t| a.saturating_add(t.len));
    let page_aligned = aligned_bytes(&live, PAGE_BYTES);
    let huge_aligned = aligned_bytes(&live, HUGE_PAGE_BYTES);
    let shared = shared_pages(&live, PAGE_BYTES);
    let relayout = |align| {
        let padding = relayout_padding(&live, align);
        Relayout {
            alignment_bytes: align,
            padding_bytes: padding,
            padding_fraction: fraction(padding, total),
        }
    };
    AlignmentStats {
        page_bytes: PAGE_BYTES,
        huge_page_bytes: HUGE_PAGE_BYTES,
        page_aligned_bytes: page_aligned,
        page_aligned_fraction: fraction(page_aligned, total),
        huge_page_aligned_bytes: huge_aligned,
        huge_page_aligned_fraction: fraction(huge_aligned, total),
        shared_pages: shared,
        shared_page_bytes: shared * PAGE_BYTES,
        page_relayout: relayout(PAGE_BYTES),
        huge_page_relayout: relayout(HUGE_PAGE_BYTES),
    }
}

/// The statistics of one file's container (whose tensor table it keeps).
pub fn file(path: &str, c: Container) -> FileInspect {
    let mut tensors = c.tensors;
    let order = |a: &Tensor, b: &Tensor| a.offset.cmp(&b.offset).then_with(|| a.name.cmp(&b.name));
    if !tensors.is_sorted_by(|a, b| order(a, b).is_le()) {
        tensors.sort_by(order);
    }
    FileInspect {
        path: path.to_string(),
        format_name: format_name(&c.format),
        format: c.format,
        file_size_bytes: c.file_size,
        data_offset_bytes: c.data_offset,
        format_alignment_bytes: c.alignment,
        tensor_count: tensors.len(),
        tensor_bytes: tensors.iter().fold(0u64, |a, t| a.saturating_add(t.len)),
        dtypes: dtypes(&tensors),
        alignment: alignment(&tensors),
        widening: widening(&tensors),
        dequantisation: dequantisation(&tensors),
        tensors,
        external: c.external,
        unmapped: c.unmapped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: Dtype, shape: &[u64], offset: u64, len: u64) -> Tensor {
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            offset,
            len,
        }
    }

    #[test]
    fn alignment_of_known_layout() {
        // a: page-aligned, ends mid-page 1; b: starts in that page, ends in page 2;
        // c: at 2 MiB, 4 KiB long.
        let ts = vec![
            t("a", Dtype::F32, &[1536], 0, 6144),
            t("b", Dtype::F16, &[2048], 6144, 4096),
            t("c", Dtype::U8, &[4096], HUGE_PAGE_BYTES, 4096),
        ];
        let a = alignment(&ts);
        assert_eq!(a.page_aligned_bytes, 6144 + 4096);
        assert_eq!(a.huge_page_aligned_bytes, 6144 + 4096);
        assert_eq!(a.page_aligned_fraction, Some(10240.0 / 14336.0));
        assert_eq!(a.shared_pages, 1);
        assert_eq!(a.shared_page_bytes, 4096);
        // Relayout at 4 KiB: b moves from 6144 to 8192 (+2048); c from 12288: +0.
        assert_eq!(a.page_relayout.padding_bytes, 2048);
        // At 2 MiB: b at 2 MiB (+2 MiB - 6144), c at 4 MiB (+2 MiB - 4096).
        assert_eq!(
            a.huge_page_relayout.padding_bytes,
            (HUGE_PAGE_BYTES - 6144) + (HUGE_PAGE_BYTES - 4096)
        );
    }

    #[test]
    fn shared_pages_count_each_page_once() {
        // Three tensors inside one page, then one spanning pages 0..=2, then a page-3 one.
        let ts = [
            t("a", Dtype::U8, &[10], 0, 10),
            t("b", Dtype::U8, &[10], 10, 10),
            t("c", Dtype::U8, &[10], 20, 10),
            t("d", Dtype::U8, &[10], 30, 3 * 4096),
            t("e", Dtype::U8, &[10], 30 + 3 * 4096, 1),
        ];
        let refs: Vec<&Tensor> = ts.iter().collect();
        assert_eq!(shared_pages(&refs, 4096), 2);
    }

    #[test]
    fn widening_and_dtypes() {
        let ts = vec![
            t("q", Dtype::Quant("Q4_0".into()), &[64], 0, 36),
            t("h", Dtype::BF16, &[4], 64, 8),
            t("f", Dtype::F32, &[4], 128, 16),
            t("i", Dtype::I8, &[4], 192, 4),
        ];
        let f = file(
            "m",
            Container {
                format: Format::Gguf { version: 3 },
                file_size: 256,
                data_offset: Some(0),
                alignment: Some(32),
                external: Vec::new(),
                unmapped: Vec::new(),
                tensors: ts,
            },
        );
        assert_eq!(f.format_name, "gguf v3");
        assert_eq!(f.tensor_bytes, 64);
        assert_eq!(f.dtypes[0].dtype, "Q4_0");
        // Only BF16 widens; Q4_0 is dequantised, a separate figure.
        assert_eq!(f.widening.tensors, 1);
        assert_eq!(f.widening.bytes, 8);
        assert_eq!(f.widening.widened_bytes, 16);
        assert!(f.widening.by_dtype.iter().all(|s| s.dtype == "BF16"));
        let d = &f.dequantisation;
        assert_eq!((d.tensors, d.bytes, d.elements), (1, 36, 64));
        assert_eq!(d.dequantised_bytes, 256);
        assert_eq!(d.by_dtype[0].dtype, "Q4_0");
        assert_eq!(d.by_dtype[0].bits_per_element, Some(4.5));
    }

    #[test]
    fn empty_container_has_no_fractions() {
        let a = alignment(&[]);
        assert_eq!(a.page_aligned_fraction, None);
        assert_eq!(a.page_relayout.padding_bytes, 0);
        assert_eq!(a.shared_pages, 0);
    }
}

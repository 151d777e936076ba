//! Human output of `twofold inspect` (an [`InspectReport`]).

use std::fmt::Write as _;

use super::table::{Align, Table};
use crate::container::Format;
use crate::model::inspect::{FileInspect, InspectReport, Relayout};
use crate::units::iec;

fn pct(f: Option<f64>) -> String {
    f.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "n/a".into())
}

fn share(part: u64, whole: u64) -> String {
    pct((whole > 0).then(|| part as f64 / whole as f64))
}

fn relayout(r: &Relayout) -> String {
    format!("+{} ({})", iec(r.padding_bytes), pct(r.padding_fraction))
}

fn header(f: &FileInspect, out: &mut String) {
    let _ = writeln!(out, "{}", f.path);
    let mut line = format!(
        "  {}, {} tensor{}, {} of tensors in a {} file",
        f.format_name,
        f.tensor_count,
        if f.tensor_count == 1 { "" } else { "s" },
        iec(f.tensor_bytes),
        iec(f.file_size_bytes),
    );
    if let Some(d) = f.data_offset_bytes {
        let _ = write!(line, ", data at offset {d}");
    }
    if let Some(a) = f.format_alignment_bytes {
        let _ = write!(line, ", aligned to {a} B");
    }
    let _ = writeln!(out, "{line}");
}

fn dtype_table(f: &FileInspect, out: &mut String) {
    let mut t = Table::new(&[
        ("dtype", Align::Left),
        ("tensors", Align::Right),
        ("bytes", Align::Right),
        ("share", Align::Right),
    ]);
    for d in &f.dtypes {
        t.row(vec![
            d.dtype.clone(),
            d.tensors.to_string(),
            iec(d.bytes),
            share(d.bytes, f.tensor_bytes),
        ]);
    }
    if !t.is_empty() {
        out.push('\n');
        out.push_str(&t.render(2));
    }
}

fn alignment_table(f: &FileInspect, out: &mut String) {
    let a = &f.alignment;
    let mut t = Table::new(&[
        ("alignment", Align::Left),
        ("4 KiB pages", Align::Right),
        ("2 MiB pages", Align::Right),
    ]);
    t.row(vec![
        "tensor bytes at aligned offsets".into(),
        format!(
            "{} ({})",
            pct(a.page_aligned_fraction),
            iec(a.page_aligned_bytes)
        ),
        format!(
            "{} ({})",
            pct(a.huge_page_aligned_fraction),
            iec(a.huge_page_aligned_bytes)
        ),
    ]);
    t.row(vec![
        "padding to align every tensor".into(),
        relayout(&a.page_relayout),
        relayout(&a.huge_page_relayout),
    ]);
    t.row(vec![
        "pages shared by two tensors".into(),
        format!("{} ({})", a.shared_pages, iec(a.shared_page_bytes)),
        "-".into(),
    ]);
    out.push('\n');
    out.push_str(&t.render(2));
}

fn widening(f: &FileInspect, out: &mut String) {
    let w = &f.widening;
    if w.tensors == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "\n  widened to F32 by a framework that upcasts on load: {} tensor{}, {} -> {} (+{})",
        w.tensors,
        if w.tensors == 1 { "" } else { "s" },
        iec(w.bytes),
        iec(w.widened_bytes),
        iec(w.widened_bytes.saturating_sub(w.bytes)),
    );
    let mut t = Table::new(&[
        ("dtype", Align::Left),
        ("tensors", Align::Right),
        ("bytes", Align::Right),
        ("as F32", Align::Right),
    ]);
    for s in &w.by_dtype {
        t.row(vec![
            s.dtype.clone(),
            s.tensors.to_string(),
            iec(s.bytes),
            iec(s.widened_bytes),
        ]);
    }
    out.push_str(&t.render(4));
}

fn dequantisation(f: &FileInspect, out: &mut String) {
    let d = &f.dequantisation;
    if d.tensors == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "\n  dequantised to F32 by a framework that dequantises on load (not a widened copy): {} tensor{}, {} -> {} (+{})",
        d.tensors,
        if d.tensors == 1 { "" } else { "s" },
        iec(d.bytes),
        iec(d.dequantised_bytes),
        iec(d.dequantised_bytes.saturating_sub(d.bytes)),
    );
    let mut t = Table::new(&[
        ("dtype", Align::Left),
        ("tensors", Align::Right),
        ("bytes", Align::Right),
        ("bits", Align::Right),
        ("as F32", Align::Right),
    ]);
    for s in &d.by_dtype {
        t.row(vec![
            s.dtype.clone(),
            s.tensors.to_string(),
            iec(s.bytes),
            s.bits_per_element
                .map_or_else(|| "n/a".into(), |b| format!("{b}")),
            iec(s.dequantised_bytes),
        ]);
    }
    out.push_str(&t.render(4));
}

/// Tensors whose bytes are not in this file's tensor table (ONNX).
fn elsewhere(f: &FileInspect, out: &mut String) {
    if !f.external.is_empty() {
        let bytes = f.external.iter().fold(0u64, |a, t| a.saturating_add(t.len));
        let mut files: Vec<&str> = f.external.iter().map(|t| t.location.as_str()).collect();
        files.sort_unstable();
        files.dedup();
        let _ = writeln!(
            out,
            "\n  external data: {} tensor{}, {} in '{}'",
            f.external.len(),
            if f.external.len() == 1 { "" } else { "s" },
            iec(bytes),
            files.join("', '"),
        );
    }
    if !f.unmapped.is_empty() {
        let _ = writeln!(
            out,
            "\n  not mapped to file bytes (varint or string storage): {} tensor{}",
            f.unmapped.len(),
            if f.unmapped.len() == 1 { "" } else { "s" },
        );
    }
}

/// Renders every file of the report for a terminal.
pub fn human(report: &InspectReport) -> String {
    let mut out = String::new();
    for (i, f) in report.files.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if f.format == Format::Opaque {
            let _ = writeln!(
                out,
                "{}\n  opaque: not a container twofold reads (safetensors, GGUF, NumPy, PyTorch zip, ONNX); one {} region",
                f.path,
                iec(f.file_size_bytes)
            );
            continue;
        }
        header(f, &mut out);
        dtype_table(f, &mut out);
        alignment_table(f, &mut out);
        widening(f, &mut out);
        dequantisation(f, &mut out);
        elsewhere(f, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{Container, Dtype, Tensor};
    use crate::model::inspect::file;

    #[test]
    fn renders_a_small_gguf() {
        let c = Container {
            format: Format::Gguf { version: 3 },
            file_size: 8192 + 4096,
            data_offset: Some(4096),
            alignment: Some(32),
            external: Vec::new(),
            unmapped: Vec::new(),
            tensors: vec![
                Tensor {
                    name: "a".into(),
                    dtype: Dtype::F16,
                    shape: vec![1024],
                    offset: 4096,
                    len: 2048,
                },
                Tensor {
                    name: "b".into(),
                    dtype: Dtype::F32,
                    shape: vec![1024],
                    offset: 6144,
                    len: 4096,
                },
            ],
        };
        let report = InspectReport {
            schema_version: 1,
            files: vec![file("m.gguf", c)],
        };
        let text = human(&report);
        let expected = "\
m.gguf
  gguf v3, 2 tensors, 6.0 KiB of tensors in a 12.0 KiB file, data at offset 4096, aligned to 32 B

  dtype  tensors    bytes  share
  F32          1  4.0 KiB  66.7%
  F16          1  2.0 KiB  33.3%

  alignment                             4 KiB pages          2 MiB pages
  tensor bytes at aligned offsets   33.3% (2.0 KiB)           0.0% (0 B)
  padding to align every tensor    +2.0 KiB (33.3%)  +2.0 MiB (34100.0%)
  pages shared by two tensors           1 (4.0 KiB)                    -

  widened to F32 by a framework that upcasts on load: 1 tensor, 2.0 KiB -> 4.0 KiB (+2.0 KiB)
    dtype  tensors    bytes   as F32
    F16          1  2.0 KiB  4.0 KiB
";
        assert_eq!(text, expected, "\n{text}");
    }

    #[test]
    fn quantised_tensors_are_dequantised_not_widened() {
        let t = |name: &str, dtype: Dtype, n: u64, offset: u64, len: u64| Tensor {
            name: name.into(),
            dtype,
            shape: vec![n],
            offset,
            len,
        };
        let c = Container {
            format: Format::Gguf { version: 3 },
            file_size: 4096,
            data_offset: Some(0),
            alignment: Some(32),
            external: Vec::new(),
            unmapped: Vec::new(),
            tensors: vec![
                t("q", Dtype::Quant("Q4_K".into()), 512, 0, 288),
                t("h", Dtype::F16, 16, 320, 32),
            ],
        };
        let report = InspectReport {
            schema_version: 1,
            files: vec![file("m.gguf", c)],
        };
        let text = human(&report);
        let widened = text
            .lines()
            .skip_while(|l| !l.contains("widened to F32"))
            .take_while(|l| !l.contains("dequantised"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(widened.contains("1 tensor, 32 B -> 64 B"), "{text}");
        assert!(!widened.contains("Q4_K"), "{text}");
        assert!(
            text.contains("dequantised to F32 by a framework that dequantises on load (not a widened copy): 1 tensor, 288 B -> 2.0 KiB"),
            "{text}"
        );
        assert!(
            text.contains("    Q4_K         1  288 B   4.5  2.0 KiB"),
            "{text}"
        );
    }

    #[test]
    fn opaque_files_have_no_tables() {
        let c = crate::container::parse_bytes(b"plain text").unwrap();
        let report = InspectReport {
            schema_version: 1,
            files: vec![file("notes.txt", c)],
        };
        assert_eq!(
            human(&report),
            "notes.txt\n  opaque: not a container twofold reads (safetensors, GGUF, NumPy, PyTorch zip, ONNX); one 10 B region\n"
        );
    }
}

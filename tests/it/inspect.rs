//! `twofold inspect` as a user runs it: alignment numbers on a file whose layout we chose,
//! JSON parsed back into the typed report, and one-line errors with exit 2.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use crate::writers::*;
use twofold::container::{Dtype, Format};
use twofold::model::inspect::{InspectReport, HUGE_PAGE_BYTES};

fn twofold(args: &[&str]) -> Output {
    Command::new(crate::common::exe())
        .args(args)
        .output()
        .unwrap()
}

const MIB2: u64 = HUGE_PAGE_BYTES;

/// A safetensors file with the data at 4096 and three tensors chosen so every alignment
/// number is known:
/// - `a`: F32, 6144 bytes at 4096 (page-aligned, not 2 MiB-aligned), pages 1..=2;
/// - `b`: F16, 4096 bytes at 10240 (not page-aligned), pages 2..=3: page 2 is shared;
/// - `c`: U8, 4096 bytes at 2 MiB (page- and 2 MiB-aligned), after a gap.
fn known_layout(dir: &Path) -> std::path::PathBuf {
    let t = |name: &str, dtype: (&'static str, Dtype), n: u64, size: u64, offset: u64| SafeTensor {
        name: name.into(),
        dtype,
        shape: vec![n],
        offset: Some(offset),
        data: bytes(n, (n * size) as usize),
    };
    let tensors = [
        t("a", ("F32", Dtype::F32), 1536, 4, 0),
        t("b", ("F16", Dtype::F16), 2048, 2, 6144),
        t("c", ("U8", Dtype::U8), 4096, 1, MIB2 - 4096),
    ];
    let (file, expected) = safetensors(&tensors, Some(4096));
    assert_eq!(
        expected.iter().map(|t| t.offset).collect::<Vec<_>>(),
        [4096, 10240, MIB2]
    );
    let path = dir.join("known.safetensors");
    std::fs::write(&path, file).unwrap();
    path
}

#[test]
fn alignment_numbers_on_a_known_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = known_layout(dir.path());
    let out = twofold(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty());
    let report: InspectReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.schema_version, twofold::model::SCHEMA_VERSION);
    let f = &report.files[0];
    assert_eq!(f.format, Format::Safetensors);
    assert_eq!(f.tensor_count, 3);
    assert_eq!(f.tensor_bytes, 14336);
    assert_eq!(f.data_offset_bytes, Some(4096));
    let a = &f.alignment;
    assert_eq!(a.page_aligned_bytes, 6144 + 4096);
    assert_eq!(a.page_aligned_fraction, Some(10240.0 / 14336.0));
    assert_eq!(a.huge_page_aligned_bytes, 4096);
    assert_eq!(a.huge_page_aligned_fraction, Some(4096.0 / 14336.0));
    assert_eq!((a.shared_pages, a.shared_page_bytes), (1, 4096));
    // 4 KiB relayout: b moves from 6144 to 8192, c follows at 12288.
    assert_eq!(a.page_relayout.padding_bytes, 2048);
    assert_eq!(a.page_relayout.padding_fraction, Some(2048.0 / 14336.0));
    // 2 MiB relayout: b to 2 MiB, c to 4 MiB.
    let huge = (MIB2 - 6144) + (MIB2 - 4096);
    assert_eq!(a.huge_page_relayout.padding_bytes, huge);
    assert_eq!(
        a.huge_page_relayout.padding_fraction,
        Some(huge as f64 / 14336.0)
    );
    // F16 widens: 2048 elements → 8 KiB as F32.
    assert_eq!(f.widening.tensors, 1);
    assert_eq!((f.widening.bytes, f.widening.widened_bytes), (4096, 8192));
    let names: Vec<&str> = f.dtypes.iter().map(|d| d.dtype.as_str()).collect();
    assert_eq!(names, ["F32", "F16", "U8"]);
    assert_eq!(f.tensors.len(), 3);
}

#[test]
fn human_output_of_several_files() {
    let dir = tempfile::tempdir().unwrap();
    let st = known_layout(dir.path());
    let gg = dir.path().join("m.gguf");
    std::fs::write(&gg, gguf_many(10)).unwrap();
    let out = twofold(&["inspect", st.to_str().unwrap(), gg.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("safetensors, 3 tensors, 14.0 KiB of tensors"),
        "{text}"
    );
    assert!(text.contains("gguf v3, 10 tensors"), "{text}");
    assert!(text.contains("pages shared by two tensors"), "{text}");
    assert!(text.contains("Q4_K"), "{text}");
}

/// Exit 2, exactly one line on stderr naming `needle`, nothing on stdout.
fn assert_bad_input(args: &[&str], needle: &str) {
    let out = twofold(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("twofold: error: "), "{err}");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let missing = format!("{d}/nope.gguf");
    assert_bad_input(
        &["inspect", "--json", &missing],
        &format!("cannot open '{missing}'"),
    );
    assert_bad_input(&["inspect", d], "is not a regular file (a directory)");
    assert_bad_input(
        &["inspect", "--json", "/dev/null"],
        "'/dev/null' is not a regular file",
    );
    let (g, _) = gguf(
        3,
        None,
        &[],
        &[GgufTensor::new("t", &[4], 0, vec![0; 16], Dtype::F32)],
    );
    let cut = format!("{d}/cut.gguf");
    std::fs::write(&cut, &g[..g.len() - 1]).unwrap();
    assert_bad_input(
        &["inspect", "--json", &cut],
        &format!("cannot read the container '{cut}': tensor 't' at"),
    );
    // One bad file among good ones: still an error, and nothing printed.
    let good = known_layout(dir.path());
    assert_bad_input(&["inspect", good.to_str().unwrap(), &missing], "nope.gguf");
    // clap: no file at all.
    assert_eq!(twofold(&["inspect"]).status.code(), Some(2));
}

#[test]
fn onnx_model_with_external_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    let model = onnx(vec![
        onnx_raw("w", 1, &[16, 16], bytes(1, 1024)),
        onnx_raw("h", 10, &[8], bytes(2, 16)),
        onnx_external("e", 16, &[64], "model.onnx.data", 0, None),
    ]);
    std::fs::write(&path, &model).unwrap();
    let p = path.to_str().unwrap();
    let out = twofold(&["inspect", "--json", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: InspectReport = serde_json::from_slice(&out.stdout).unwrap();
    let f = &report.files[0];
    assert_eq!(
        (f.format.clone(), f.format_name.as_str()),
        (Format::Onnx, "onnx")
    );
    assert_eq!((f.tensor_count, f.tensor_bytes), (2, 1040));
    for t in &f.tensors {
        let want = if t.name == "w" {
            bytes(1, 1024)
        } else {
            bytes(2, 16)
        };
        assert_eq!(
            &model[t.offset as usize..(t.offset + t.len) as usize],
            &want[..]
        );
    }
    assert_eq!(f.external.len(), 1);
    assert_eq!(
        (f.external[0].dtype.clone(), f.external[0].len),
        (Dtype::BF16, 128)
    );
    let text = String::from_utf8(twofold(&["inspect", p]).stdout).unwrap();
    assert!(
        text.contains("onnx, 2 tensors, 1.0 KiB of tensors"),
        "{text}"
    );
    assert!(
        text.contains("external data: 1 tensor, 128 B in 'model.onnx.data'"),
        "{text}"
    );
}

/// GGML block types are dequantised, never "widened": the widening figure is what
/// `dupes` can find byte for byte (F16/BF16 as F32), the dequantised one is not.
#[test]
fn quantised_gguf_is_dequantised_not_widened() {
    let dir = tempfile::tempdir().unwrap();
    let gg = dir.path().join("m.gguf");
    // Five Q4_K [256, 2] and five F32 [64].
    std::fs::write(&gg, gguf_many(10)).unwrap();
    let out = twofold(&["inspect", "--json", gg.to_str().unwrap()]);
    let report: InspectReport = serde_json::from_slice(&out.stdout).unwrap();
    let f = &report.files[0];
    assert_eq!(f.widening.tensors, 0);
    assert!(f.widening.by_dtype.is_empty());
    let d = &f.dequantisation;
    assert_eq!((d.tensors, d.elements), (5, 5 * 512));
    assert_eq!((d.bytes, d.dequantised_bytes), (5 * 288, 5 * 512 * 4));
    assert_eq!(d.by_dtype[0].dtype, "Q4_K");
    assert_eq!(d.by_dtype[0].bits_per_element, Some(4.5));
    let text = String::from_utf8(twofold(&["inspect", gg.to_str().unwrap()]).stdout).unwrap();
    assert!(!text.contains("widened to F32"), "{text}");
    assert!(text.contains("dequantised to F32"), "{text}");
}

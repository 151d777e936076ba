//! Repacked copies (llama.cpp's CPU `CPU_REPACK` buffer) found by the proof: a GGUF file
//! mapped by a process that also holds its matrix weights in the layouts ggml's AVX2
//! build writes (`q4_0_8x8`, `q4_K_8x8`). The bytes are laid out by the test with
//! `twofold_formats::repack` (checked byte for byte against ggml's own output in
//! `formats/tests/fixtures/repack/`); the real runtime's copy is `tests/exact/llama.rs`.
//!
//! Truth is the test's own: the file's page cache by `mincore(2)`, and the repacked
//! bytes it had the holder read (each tensor keeps its size when repacked).

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::writers::{gguf, GgufTensor};
use twofold::container::repack::{repack, Layout};
use twofold::container::{Dtype, Tensor};
use twofold::model::CopyHow;

/// ggml type ids (`ggml.h`).
const Q4_0: u32 = 2;
const Q4_K: u32 = 12;

/// A small llama-like GGUF: two repacked weights of each kind, a `token_embd` that is
/// never repacked (llama.cpp reads it with `GET_ROWS`), and a norm.
fn model(dir: &Path, seed: u64) -> (std::path::PathBuf, Vec<Tensor>) {
    let quant = |name: &str, ty: u32, cols: u64, rows: u64, s: u64| {
        let (per, block) = if ty == Q4_K { (256, 144) } else { (32, 18) };
        let len = (cols / per * block * rows) as usize;
        let dtype = Dtype::Quant(if ty == Q4_K { "Q4_K" } else { "Q4_0" }.into());
        GgufTensor::new(
            name,
            &[cols, rows],
            ty,
            crate::writers::bytes(seed + s, len),
            dtype,
        )
    };
    let tensors = vec![
        quant("token_embd.weight", Q4_0, 2048, 512, 1),
        quant("blk.0.ffn_up.weight", Q4_0, 2048, 1024, 2),
        quant("blk.0.ffn_down.weight", Q4_0, 4096, 512, 3),
        quant("blk.0.attn_q.weight", Q4_K, 2048, 1024, 4),
        quant("blk.0.attn_output.weight", Q4_K, 4096, 512, 5),
        GgufTensor::new(
            "blk.0.attn_norm.weight",
            &[2048],
            0,
            crate::writers::bytes(seed + 6, 8192),
            Dtype::F32,
        ),
    ];
    let (bytes, table) = gguf(3, None, &[], &tensors);
    let path = dir.join("model-q4.gguf");
    std::fs::write(&path, bytes).unwrap();
    (path, table)
}

/// A holder that maps `file` and reads `copy` (the repacked weights, one after another)
/// into its heap; the copy's file is deleted once read. Returns it once ready.
fn hold(file: &Path, copy: &Path) -> twofold::spawn::Reader {
    let script = r#"
import mmap, os, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
s = 0
for i in range(0, len(m), 4096):
    s += m[i]
with open(sys.argv[2], "rb") as c:
    held = bytearray(c.read())
os.unlink(sys.argv[2])
print("ready", flush=True)
sys.stdin.read()
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script]).arg(file).arg(copy);
    let (child, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

#[test]
fn repacked_weights_count_by_their_bytes_and_name_the_layout() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root")
        || !require(
            std::arch::is_x86_feature_detected!("avx2"),
            "an x86 CPU with AVX2 (the layouts llama.cpp's AVX2 build picks)",
        )
        || !python_has("mmap")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, table) = model(dir.path(), 7100);
    let data = std::fs::read(&file).unwrap();
    // The weights ggml repacks, each in the layout it picks on an AVX2 build.
    let mut copy = Vec::new();
    let mut repacked_bytes = 0u64;
    for t in &table {
        let layout = match (t.name.as_str(), &t.dtype) {
            ("token_embd.weight", _) | (_, Dtype::F32) => continue,
            (_, Dtype::Quant(q)) if q == "Q4_K" => Layout::Q4_K_8x8,
            _ => Layout::Q4_0_8x8,
        };
        let rows = t.shape[1] as usize;
        let src = &data[t.offset as usize..(t.offset + t.len) as usize];
        let out = repack(layout, rows, t.len as usize / rows, src).unwrap();
        copy.extend_from_slice(&out);
        // ggml aligns each tensor of a buffer to 32 bytes; the sizes here are multiples.
        repacked_bytes += out.len() as u64;
    }
    let copy_path = dir.path().join("repacked.bin");
    std::fs::File::create(&copy_path)
        .unwrap()
        .write_all(&copy)
        .unwrap();
    // Nothing of the file, repacked or not, stays in this process's heap while twofold scans.
    copy.fill(0);
    drop(copy);
    drop(data);
    let held = hold(&file, &copy_path);
    let size = std::fs::metadata(&file).unwrap().len();
    let cached = fincore_pages(&file) as f64 * 4096.0 / size.next_multiple_of(4096) as f64;
    let truth = cached + repacked_bytes as f64 / size as f64;

    let (r, m) = scan_file(&file);
    let count = m.representations.proven.unwrap();
    let pid = held.pid();
    let copy = m
        .proven_copies
        .iter()
        .find(|c| c.pid == pid)
        .unwrap_or_else(|| panic!("no copy found: {m:#?}"));
    eprintln!(
        "repack: truth {truth:.3} (cached {cached:.3} + repacked {:.3}), twofold {count:.3} (copy {:.3}, {:?})",
        repacked_bytes as f64 / size as f64,
        copy.fraction,
        copy.how,
    );
    assert!(
        (count - truth).abs() <= 0.02,
        "twofold {count}, truth {truth}"
    );
    assert!(
        (copy.fraction - repacked_bytes as f64 / size as f64).abs() <= 0.01,
        "{copy:?}"
    );
    assert_eq!(copy.how, CopyHow::Converted, "{copy:?}");
    let json = serde_json::to_value(&r).unwrap().to_string();
    for layout in ["q4_0_8x8", "q4_K_8x8"] {
        assert!(
            json.contains(&format!("{{\"repack\":\"{layout}\"}}")),
            "{json}"
        );
    }
    let finding = r
        .findings
        .iter()
        .find(|x| {
            x.code.as_str() == "proven-private-copy" && x.message().contains(&format!("pid {pid}"))
        })
        .unwrap_or_else(|| panic!("no finding: {:#?}", r.findings));
    let msg = finding.message();
    assert!(msg.contains("repacked by llama.cpp"), "{msg}");
    assert!(
        finding.remedy().unwrap_or_default().contains("--no-repack"),
        "{:?}",
        finding.remedy()
    );
    let human = run_ok(Command::new(exe()).arg("scan").arg(&file));
    let human = String::from_utf8_lossy(&human);
    let row = human
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains("repacked"), "{row}");
}

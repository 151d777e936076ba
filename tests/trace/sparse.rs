//! `trace --file` of a 15 TiB sparse model: the issue (#41) measured it running past 11 s
//! without an end. The files it pins are found by `stat`, the upload index skips holes
//! (`SEEK_DATA`); the whole trace must end in about the time of the same trace of a
//! small model.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::serial;
use crate::support::bpf_ready;

const TIB: u64 = 1 << 40;

/// A safetensors of `tensors` F32 tensors of `each` bytes, 4 MiB of random data after
/// its header and the rest a hole (`each` × `tensors` bytes of data in all).
fn sparse_model(dir: &Path, name: &str, tensors: u64, each: u64) -> PathBuf {
    let entries: Vec<String> = (0..tensors)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"F32","shape":[{},1024],"data_offsets":[{},{}]}}"#,
                each / 4 / 1024,
                i * each,
                (i + 1) * each
            )
        })
        .collect();
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(&(header.len() as u64).to_le_bytes(), 0)
        .unwrap();
    f.write_all_at(&header, 8).unwrap();
    let data_at = 8 + header.len() as u64;
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ tensors;
    let data: Vec<u8> = (0..(4u64 << 20).min(tensors * each))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    f.write_all_at(&data, data_at).unwrap();
    f.set_len(data_at + tensors * each).unwrap();
    path
}

/// `trace --json --file FILE --duration 1s`: how long it took, and whether its first
/// record named the file.
fn trace_one(file: &Path) -> (Duration, bool) {
    let start = Instant::now();
    let (status, out, err) = bounded(
        Command::new(exe())
            .args(["trace", "--json", "--duration", "1s", "--file"])
            .arg(file),
        Duration::from_secs(120),
    );
    let took = start.elapsed();
    assert_eq!(status.code(), Some(0), "stdout: {out}\nstderr: {err}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "attached", "{out}");
    let named = first["data"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f.as_str() == file.to_str());
    (took, named)
}

#[test]
fn trace_of_a_15_tib_sparse_file_ends_like_a_small_one() {
    let _serial = serial();
    if !bpf_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sparse = sparse_model(dir.path(), "sparse15t.safetensors", 15, TIB);
    let small = sparse_model(dir.path(), "small.safetensors", 1, 4 << 20);
    let blocks = std::fs::metadata(&sparse).unwrap();
    use std::os::unix::fs::MetadataExt;
    // 15 TiB long, a few MiB on disk: a real hole.
    assert_eq!(blocks.len() >> 40, 15);
    assert!(
        blocks.blocks() * 512 < 64 << 20,
        "{} blocks",
        blocks.blocks()
    );
    let (base, named_small) = trace_one(&small);
    let (took, named) = trace_one(&sparse);
    eprintln!("trace --file --duration 1s: small model {base:?}, 15 TiB sparse {took:?}");
    assert!(named_small && named, "each trace pins its file");
    assert!(
        took < base + Duration::from_secs(5),
        "15 TiB sparse took {took:?}, a small model {base:?}"
    );
}

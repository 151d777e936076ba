//! Real runtimes: NumPy and safetensors load files the test wrote; the loaders report where
//! each array's bytes live, `/proc/PID/maps` says whether that is anonymous memory (a copy)
//! or the file mapping, and `twofold dupes` must find exactly the copies that exist.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A `.npy` (format 1.0) of `n` little-endian f32 values, header padded to 64 bytes.
fn npy(dir: &Path, n: usize) -> PathBuf {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    let mut s = 0x9e37_79b9u32;
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        bytes.extend_from_slice(&((s % 100_000) as f32 / 7.0).to_le_bytes());
    }
    let path = dir.join("weights.npy");
    std::fs::write(&path, bytes).unwrap();
    path
}

struct Loaded {
    reader: twofold::spawn::Reader,
    /// Array name → data address.
    arrays: BTreeMap<String, u64>,
}

fn load(mode: &str, file: &Path) -> Loaded {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/load.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(mode).arg(file);
    let (reader, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(120)).unwrap();
    let arrays: BTreeMap<String, u64> = serde_json::from_str(&line).unwrap();
    Loaded { reader, arrays }
}

/// Addresses that lie in anonymous memory of `pid`, by the kernel's own maps.
fn in_anon(pid: i32, addrs: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let anon: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(twofold::collect::maps::parse_header)
        .filter(|m| m.inode == 0)
        .map(|m| (m.start, m.end))
        .collect();
    addrs
        .iter()
        .filter(|(_, a)| anon.iter().any(|(s, e)| s <= *a && *a < e))
        .map(|(k, a)| (k.clone(), *a))
        .collect()
}

fn found(pid: i32, file: &Path) -> BTreeMap<String, u64> {
    dupes_report(pid, file, &[]).processes[0].files[0]
        .copies
        .iter()
        .map(|c| (c.tensor.clone(), c.address))
        .collect()
}

#[test]
fn numpy_load_copies_and_mmap_mode_does_not() {
    if !require(python_ready(), "python3 with numpy and safetensors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = npy(dir.path(), 1 << 20);
    let copy = load("np-copy", &file);
    let truth = in_anon(copy.reader.pid(), &copy.arrays);
    assert_eq!(truth.len(), 1, "np.load must copy: {:?}", copy.arrays);
    assert_eq!(found(copy.reader.pid(), &file), truth);
    let mapped = load("np-mmap", &file);
    assert!(in_anon(mapped.reader.pid(), &mapped.arrays).is_empty());
    assert!(found(mapped.reader.pid(), &file).is_empty());
}

#[test]
fn safetensors_load_file_copies_exactly_what_the_kernel_says() {
    if !require(python_ready(), "python3 with numpy and safetensors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = safetensors(
        dir.path(),
        &[
            ("a", 1 << 20, Fill::Random(11)),
            ("b", 256 << 10, Fill::Random(12)),
            ("c", 64 << 10, Fill::Random(13)),
        ],
    );
    for mode in ["st-load", "st-load-write"] {
        let l = load(mode, &file);
        let mut truth = in_anon(l.reader.pid(), &l.arrays);
        if mode == "st-load-write" {
            // The array written in place holds other values: not a copy of the file.
            truth.remove("a");
        }
        assert_eq!(
            found(l.reader.pid(), &file),
            truth,
            "{mode}: arrays {:?}",
            l.arrays
        );
    }
}

//! Copies converted to another dtype by real runtimes (NumPy's `.astype`, PyTorch's
//! `.half()` and `.to(torch.bfloat16)`), held beside a mapping of the file: the count adds
//! each converted copy by the bytes it occupies (F32 → F16 of a whole file: 0.50), the
//! cause names the conversion, and random memory is never taken for one.
//!
//! Truth is the test's own: the page cache by `mincore(2)` on its own mapping, the
//! converted arrays' bytes as the runtime reports them, checked against the runtime's
//! `RssAnon` growth and, byte for byte through `/proc/PID/mem`, against the test's own
//! conversion of the file's bytes.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use twofold::container::convert::Conversion;
use twofold::model::CopyHow;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/convert.py")
}
/// The runtime that converts to and from BF16: torch where it is installed (a 4 GiB wheel
/// with its CUDA libraries from PyPI, which `scripts/test.sh` does not install), else
/// ml_dtypes (JAX's bfloat16 NumPy type, which it does); said on stderr.
fn bf16_runtime() -> Option<&'static str> {
    if !require(is_root(), "root") {
        return None;
    }
    let torch = Command::new("python3")
        .args(["-c", "import numpy, torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    let runtime = if torch {
        "torch"
    } else if python_has("numpy, ml_dtypes") {
        "mld"
    } else {
        return None;
    };
    eprintln!(
        "bf16 conversions by {}",
        if torch { "torch" } else { "ml_dtypes" }
    );
    Some(runtime)
}

/// A safetensors file of `dtype` from random values of `seed`: a seed per test, as files
/// of one seed are conversions of each other (an F16 file's tensors are another test's
/// F32 → F16 arrays, found as identical copies of it while both tests run).
fn write(dir: &Path, dtype: &str, seed: u32) -> PathBuf {
    let path = dir.join(format!("model-{dtype}.safetensors"));
    let seed = seed.to_string();
    run_ok(
        Command::new("python3")
            .arg(script())
            .args(["write", dtype])
            .arg(&path)
            .arg(seed),
    );
    path
}

/// The runtime holding `file` converted per `mode`: the child, its arrays (address,
/// bytes) and how much its `RssAnon` grew while it made them.
struct Held {
    child: twofold::spawn::Reader,
    arrays: Vec<(u64, u64)>,
    rss_anon_growth: i64,
}

fn hold(mode: &str, file: &Path) -> Held {
    let mut cmd = Command::new("python3");
    cmd.arg(script()).args(["hold", mode]).arg(file);
    let (child, line) = twofold::spawn::Reader::spawn(cmd, Duration::from_secs(180)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let arrays = v["arrays"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a[0].as_u64().unwrap(), a[1].as_u64().unwrap()))
        .collect();
    Held {
        child,
        arrays,
        rss_anon_growth: v["rss_anon_growth"].as_i64().unwrap(),
    }
}
/// Resident fraction of `file` by `mincore(2)` on the test's own mapping (unmapped after).
fn cached(file: &Path) -> f64 {
    let f = std::fs::File::open(file).unwrap();
    // SAFETY: a read-only mapping of the test's own file, never truncated meanwhile.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let pages = map.len().div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `map.len()` bytes; `vec` holds one byte per page.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    vec.iter().filter(|b| *b & 1 != 0).count() as f64 / pages as f64
}

/// The tensors of a safetensors file the test's script wrote: (file offset, bytes), in
/// file order.
fn tensors(file: &Path) -> Vec<(u64, u64)> {
    let c = twofold::container::open(file).unwrap();
    let mut v: Vec<(u64, u64)> = c.tensors.iter().map(|t| (t.offset, t.len)).collect();
    v.sort();
    v
}

/// Checks each array against the test's own conversion of its tensor (`which[i]`: the
/// tensor of array `i`), byte for byte, and returns the arrays' bytes.
fn converted_truth(held: &Held, file: &Path, conv: Conversion, which: &[usize]) -> u64 {
    let f = std::fs::File::open(file).unwrap();
    let mem = std::fs::File::open(format!("/proc/{}/mem", held.child.pid())).unwrap();
    let ts = tensors(file);
    assert_eq!(held.arrays.len(), which.len());
    let (mut src, mut want, mut got) = (Vec::new(), Vec::new(), Vec::new());
    let mut total = 0;
    for (&(addr, n), &ti) in held.arrays.iter().zip(which) {
        let (off, len) = ts[ti];
        src.resize(len as usize, 0);
        f.read_exact_at(&mut src, off).unwrap();
        conv.convert(&src, &mut want);
        got.resize(n as usize, 0);
        mem.read_exact_at(&mut got, addr).unwrap();
        assert!(
            got == want,
            "array at {addr:#x} is not tensor {ti} converted {}",
            conv.name()
        );
        total += n;
    }
    // Nothing of the file stays in this process's heap while twofold scans next.
    for b in [&mut src, &mut want, &mut got] {
        b.fill(0);
    }
    let growth = held.rss_anon_growth as f64;
    assert!(
        (growth - total as f64).abs() <= 0.1 * total as f64 + (1 << 20) as f64,
        "RssAnon grew {growth} bytes for {total} bytes of arrays"
    );
    total
}

/// Scans `file` while `held` holds it converted; checks the count against the truth
/// (`cached` + the converted arrays' bytes / size), the cause and its words.
fn check(file: &Path, held: &Held, conv: Conversion, which: &[usize], what: &str) {
    let size = std::fs::metadata(file).unwrap().len();
    let cached = cached(file);
    let (r, m) = scan_file(file);
    let bytes = converted_truth(held, file, conv, which);
    let truth = cached + bytes as f64 / size as f64;
    let count = m.representations.proven.unwrap();
    let pid = held.child.pid();
    let copy = m
        .proven_copies
        .iter()
        .find(|c| c.pid == pid)
        .unwrap_or_else(|| panic!("{what}: no copy found: {m:#?}"));
    eprintln!(
        "{what}: truth {truth:.3} (cached {cached:.3} + converted {:.3}), twofold {count:.3} (copy {:.3}, {:?} {:?})",
        bytes as f64 / size as f64,
        copy.fraction,
        copy.how,
        copy.conversion()
    );
    assert!(
        (count - truth).abs() <= 0.02,
        "{what}: twofold {count}, truth {truth}"
    );
    assert_eq!(copy.how, CopyHow::Converted, "{what}: {copy:?}");
    assert_eq!(copy.conversion(), Some(conv), "{what}: {copy:?}");
    let name = conv.name();
    let finding = r
        .findings
        .iter()
        .find(|x| {
            x.code.as_str() == "proven-private-copy" && x.message().contains(&format!("pid {pid}"))
        })
        .unwrap_or_else(|| panic!("{what}: no finding: {:#?}", r.findings));
    assert!(
        finding.message().contains(&format!("converted {name}")),
        "{}",
        finding.message()
    );
    assert!(finding.remedy().unwrap_or_default().contains("dtype"));
    let json = serde_json::to_value(&r).unwrap();
    let conversions = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["proven_copies"].as_array().unwrap())
        .find(|c| c["pid"] == pid)
        .map(|c| c["conversions"].clone())
        .unwrap();
    assert!(
        conversions
            .to_string()
            .contains(&serde_json::to_string(&conv).unwrap()),
        "{conversions}"
    );
    let human = run_ok(Command::new(exe()).arg("scan").arg(file));
    let human = String::from_utf8_lossy(&human);
    let row = human
        .lines()
        .find(|l| l.trim_start().starts_with(&pid.to_string()))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(row.contains(&format!("converted {name}")), "{row}");
}

#[test]
fn numpy_f32_astype_f16_counts_half_the_file() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "F32", 41);
    let held = hold("np-f16", &file);
    let all: Vec<usize> = (0..12).collect();
    check(&file, &held, Conversion::F32ToF16, &all, "numpy F32 → F16");
}

#[test]
fn numpy_f16_astype_f32_of_half_the_tensors() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "F16", 42);
    let held = hold("np-f32-part", &file);
    let even: Vec<usize> = (0..12).step_by(2).collect();
    check(
        &file,
        &held,
        Conversion::F16ToF32,
        &even,
        "numpy F16 → F32 (every other tensor)",
    );
}

#[test]
fn bf16_to_f16_counts_the_whole_file_again() {
    let _group = crate::common::group(module_path!());
    let Some(runtime) = bf16_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "BF16", 43);
    let held = hold(&format!("{runtime}-half"), &file);
    let all: Vec<usize> = (0..12).collect();
    check(
        &file,
        &held,
        Conversion::Bf16ToF16,
        &all,
        "torch BF16 .half()",
    );
}

#[test]
fn f32_to_bf16_counts_half_the_file() {
    let _group = crate::common::group(module_path!());
    let Some(runtime) = bf16_runtime() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "F32", 44);
    let held = hold(&format!("{runtime}-bf16"), &file);
    let all: Vec<usize> = (0..12).collect();
    check(
        &file,
        &held,
        Conversion::F32ToBf16,
        &all,
        "torch F32 .to(bfloat16)",
    );
}

/// A process mapping the file and holding random F16 arrays as large as its F32 → F16
/// conversion would be: no converted copy, and nothing counted for it.
#[test]
fn random_memory_is_no_converted_copy() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "F32", 45);
    let held = hold("random", &file);
    assert!(held.rss_anon_growth > 10 << 20, "{}", held.rss_anon_growth);
    let cached = cached(&file);
    let (_, m) = scan_file(&file);
    assert!(
        !m.proven_copies.iter().any(|c| c.pid == held.child.pid()),
        "{:#?}",
        m.proven_copies
    );
    let count = m.representations.proven.unwrap();
    assert!(
        (count - cached).abs() <= 0.02,
        "twofold {count}, cached {cached}"
    );
}

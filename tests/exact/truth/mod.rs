//! The headline number against ground truth the test establishes itself: real loaders (a
//! C program that read()s the file and closes it, NumPy, safetensors, onnxruntime), and an
//! independent search of each loader's private memory through `/proc/PID/mem`, restricted
//! to present pages (`/proc/PID/pagemap`), in anonymous mappings (`/proc/PID/maps`).
//!
//! Every case checks plain `twofold scan` (the proof runs by default): the count, its parts,
//! and that a suspicion is never summed into it.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use twofold::model::{FileModel, Report};
use twofold::spawn::Reader;

const BLOCK: usize = 4096;

mod engine;

/// The tests here and in `engine` run as one group (beside each other, never beside
/// another module's).
const GROUP: &str = module_path!();

/// Bytes of `path` found in `pid`'s private anonymous memory, by the test's own search:
/// every 4 KiB block of the file (at block-aligned file offsets) is looked for at every
/// address whose residue mod 16 is in `residues`, and counted where all 4096 bytes match.
/// The file is mapped and the target's memory read into an anonymous mapping, both
/// unmapped after, so this process never keeps a copy.
fn own_search(pid: i32, path: &Path, residues: &[u64]) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only mapping of the test's own file, never truncated meanwhile.
    let file = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let file: &[u8] = &file;
    let mut markers: HashMap<[u8; 16], Vec<usize>> = HashMap::new();
    for k in 0..file.len() / BLOCK {
        let w: [u8; 16] = file[k * BLOCK..k * BLOCK + 16].try_into().unwrap();
        if w[..8] != w[8..] {
            markers.entry(w).or_default().push(k);
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut found = 0u64;
    for line in maps.lines() {
        let m = twofold::collect::maps::parse_header(line).unwrap();
        if m.inode != 0 || !m.perms.read || m.path.starts_with("[v") {
            continue;
        }
        let len = (m.end - m.start) as usize;
        let pages = len / BLOCK;
        let mut pm = vec![0u8; pages * 8];
        pagemap.read_exact_at(&mut pm, m.start / 4096 * 8).unwrap();
        let mut buf = memmap2::MmapMut::map_anon(len).unwrap();
        for p in 0..pages {
            let e = u64::from_le_bytes(pm[p * 8..p * 8 + 8].try_into().unwrap());
            if e & (1 << 63) != 0 {
                let _ = mem.read_exact_at(
                    &mut buf[p * BLOCK..(p + 1) * BLOCK],
                    m.start + (p * BLOCK) as u64,
                );
            }
        }
        let mut pos = 0usize;
        while pos + BLOCK <= len {
            let addr = m.start + pos as u64;
            if !residues.contains(&(addr % 16)) {
                pos += 1;
                continue;
            }
            let w: [u8; 16] = buf[pos..pos + 16].try_into().unwrap();
            let hit = markers.get(&w).and_then(|ks| {
                ks.iter()
                    .find(|k| buf[pos..pos + BLOCK] == file[**k * BLOCK..(**k + 1) * BLOCK])
            });
            if hit.is_some() {
                found += BLOCK as u64;
                pos += BLOCK;
            } else {
                pos += 1;
            }
        }
    }
    found
}

/// `twofold scan --json ARGS...` and the file of the report at `path`.
fn scan_file(args: &[&str], path: &Path) -> (Report, FileModel) {
    // A budget no loaded host runs out of: these counts must be exact, not lower bounds.
    let mut all: Vec<&std::ffi::OsStr> = vec![
        "scan".as_ref(),
        "--json".as_ref(),
        "--prove-budget".as_ref(),
        "120s".as_ref(),
    ];
    all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    let r: Report = twofold_json(&all);
    let f = r
        .files
        .iter()
        .find(|f| Path::new(&f.path) == path)
        .unwrap_or_else(|| {
            panic!(
                "{} not in the report: {:?}",
                path.display(),
                r.files.iter().map(|f| &f.path).collect::<Vec<_>>()
            )
        })
        .clone();
    (r, f)
}

/// The test's own processes were searched: none of them is among the suspected copies.
/// (On a busy host an unrelated process, a compiler say, may still be out of the budget and
/// make the count a lower bound, as it should; the proven count is exact either way.)
fn assert_searched(f: &FileModel, pids: &[i32]) {
    let unsearched: Vec<i32> = f
        .suspected_copies
        .iter()
        .map(|s| s.pid)
        .filter(|p| pids.contains(p))
        .collect();
    assert!(
        unsearched.is_empty(),
        "not searched: {unsearched:?}: {:#?}",
        f.suspected_copies
    );
    if f.representations.lower_bound {
        eprintln!(
            "note: lower bound from processes this test did not start: {:?}",
            f.suspected_copies
                .iter()
                .map(|s| (s.pid, &s.comm, &s.unsearched))
                .collect::<Vec<_>>()
        );
    }
}

fn count(f: &FileModel) -> f64 {
    f.representations.proven.unwrap()
}

fn assert_count(f: &FileModel, want: f64) {
    let got = count(f);
    assert!(
        (got - want).abs() < 0.02,
        "count {got}, want {want} (this test is pid {}): {:?} {:#?} {:#?} {:#?}",
        std::process::id(),
        f.proven_copies
            .iter()
            .map(
                |c| std::fs::read_to_string(format!("/proc/{}/cmdline", c.pid)).unwrap_or_default()
            )
            .collect::<Vec<_>>(),
        f.representations,
        f.proven_copies,
        f.candidates
    );
}

/// The test's own search agrees with twofold's proven bytes for `pid` (within 1%).
fn assert_proof_matches_own_search(f: &FileModel, pid: i32, file: &Path, residues: &[u64]) {
    let own = own_search(pid, file, residues);
    let size = std::fs::metadata(file).unwrap().len();
    let c = f.proven_copies.iter().find(|c| c.pid == pid);
    let twofold = c.map_or(0, |c| c.identical_bytes + c.converted_bytes);
    let tol = size / 100 + 2 * BLOCK as u64;
    assert!(
        own.abs_diff(twofold) <= tol,
        "pid {pid}: own search {own} bytes, twofold {twofold} bytes"
    );
}

fn cc_reader(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/read_close.c");
    let bin = dir.join("read_close");
    run_ok(Command::new("cc").arg("-O2").arg("-o").arg(&bin).arg(src));
    bin
}

fn start(mut cmd: Command) -> Reader {
    let (r, _) = Reader::spawn(
        {
            cmd.stdin(std::process::Stdio::piped());
            cmd
        },
        Duration::from_secs(120),
    )
    .unwrap();
    r
}

fn python(mode: &str, file: &Path) -> Reader {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes/load.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(mode).arg(file);
    start(cmd)
}

fn python_has(module: &str) -> bool {
    require(
        Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success()),
        &format!("the Python module '{module}'"),
    )
}

/// Residues (mod 16) at which a copy puts the file's 4 KiB blocks: 0 for a copy of the
/// whole file, `-offset` for a tensor copied on its own into a 16-byte-aligned buffer.
fn block_residues(offsets: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut r: Vec<u64> = offsets.map(|o| (16 - o % 16) % 16).collect();
    r.push(0);
    r.sort_unstable();
    r.dedup();
    r
}

/// A 24 MiB safetensors model of random F16 tensors (written by a child process, so
/// that this process never holds its bytes), and its block residues. Each test passes its
/// own `seed`: tests run at once, and a copy of the same bytes made by another test's
/// loader would be a copy of this model too.
fn model(dir: &Path, seed: u64) -> (PathBuf, Vec<u64>) {
    let path = dir.join("model.safetensors");
    run_ok(Command::new("python3").args([
        "-c",
        r#"
import json, struct, sys, numpy as np
rng = np.random.default_rng(int(sys.argv[2]))
sizes = {"a": 8 << 20, "b": 12 << 20, "c": 4 << 20}
header, at = {}, 0
for k, n in sizes.items():
    header[k] = {"dtype": "F16", "shape": [n // 2], "data_offsets": [at, at + n]}
    at += n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for k, n in sizes.items():
        # Finite F16 values only, as real weights.
        f.write((rng.integers(0, 1 << 16, n // 2, dtype=np.uint16) & 0x3FFF).tobytes())
"#,
        path.to_str().unwrap(),
        &seed.to_string(),
    ]));
    let c = twofold::container::open(&path).unwrap();
    (path, block_residues(c.tensors.iter().map(|t| t.offset)))
}

/// Reads the file into the page cache from another process.
fn touch_cache(path: &Path) {
    run_ok(
        Command::new("cat")
            .arg(path)
            .stdout(std::process::Stdio::null()),
    );
}

#[test]
fn closed_file_copy_in_c_counts_two_in_every_kind_of_scan() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root (to search other processes' memory)")
        || !require(have("cc"), "a C compiler")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, residues) = model(dir.path(), 1);
    let bin = cc_reader(dir.path());
    let mut cmd = Command::new(&bin);
    cmd.arg(&path);
    let c = start(cmd);
    touch_cache(&path);
    // The reader holds neither an fd nor a mapping of the file.
    let holds = std::fs::read_dir(format!("/proc/{}/fd", c.pid()))
        .unwrap()
        .any(|e| std::fs::read_link(e.unwrap().path()).is_ok_and(|l| l == path));
    assert!(!holds, "the C reader still holds the file open");
    let p = path.to_str().unwrap();
    let (_, f) = scan_file(&[p], &path);
    assert_count(&f, 2.0);
    assert_searched(&f, &[c.pid()]);
    assert_eq!(f.proven_copies.len(), 1);
    assert_eq!(f.proven_copies[0].pid, c.pid());
    assert_eq!(f.proven_copies[0].how, twofold::model::CopyHow::Read);
    assert_proof_matches_own_search(&f, c.pid(), &path, &residues);
    // By pid: the file is found on its command line.
    let pid = c.pid().to_string();
    let (_, f) = scan_file(&["--pid", &pid], &path);
    assert_count(&f, 2.0);
    // A bare scan finds it the same way.
    let (r, f) = scan_file(&[], &path);
    assert_count(&f, 2.0);
    let me = r.processes.iter().find(|x| x.pid == c.pid()).unwrap();
    assert_eq!(me.holds_files, Some(1));
    // The human output says so, with no suspicion in the count.
    let out = run_ok(Command::new(exe()).args(["scan", p]));
    let t = String::from_utf8_lossy(&out);
    assert!(t.contains("in memory 2.00 times"), "{t}");
    assert!(t.contains("not open, not mapped"), "{t}");
    // A one-shot scan reads the copier's smaps_rollup beside the proof (it holds no file
    // of interest). Its anonymous pages are its own, so their PSS is the kernel's to the
    // byte (the test reads it before and after); its whole PSS moves by the shares of the
    // libraries twofold maps too while it runs.
    let rollup = |field: &str| {
        let text = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", c.pid())).unwrap();
        let l = text.lines().find(|l| l.starts_with(field)).unwrap();
        l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let (anon_before, pss_before) = (rollup("Pss_Anon:"), rollup("Pss:"));
    let (r, _) = scan_file(&[p], &path);
    let anon_after = rollup("Pss_Anon:");
    let me = r.processes.iter().find(|x| x.pid == c.pid()).unwrap();
    let anon = me.pss_anon_bytes.expect("the copier's PSS is read");
    assert!(
        (anon_before.min(anon_after)..=anon_before.max(anon_after)).contains(&anon),
        "Pss_Anon {anon} outside the kernel's {anon_before}..{anon_after}"
    );
    let pss = me.pss_bytes.unwrap();
    assert!(
        pss.abs_diff(pss_before) < 1 << 20,
        "PSS {pss} against {pss_before}"
    );
}

#[test]
fn numpy_load_copies_count_and_two_copiers_make_three() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.npy");
    run_ok(Command::new("python3").args([
        "-c",
        "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).random(3 << 20))",
        path.to_str().unwrap(),
    ]));
    let a = python("np-copy", &path);
    touch_cache(&path);
    let p = path.to_str().unwrap();
    let (_, f) = scan_file(&[p], &path);
    assert_count(&f, 2.0);
    assert_searched(&f, &[a.pid()]);
    // np.load's array starts 16-byte aligned; the file's data after a 128-byte header.
    assert_proof_matches_own_search(&f, a.pid(), &path, &[0]);
    let b = python("np-copy", &path);
    let (_, f) = scan_file(&[p], &path);
    assert_count(&f, 3.0);
    let pids: Vec<i32> = f.proven_copies.iter().map(|c| c.pid).collect();
    assert!(
        pids.contains(&a.pid()) && pids.contains(&b.pid()),
        "{pids:?}"
    );
    drop(b);
    // One copying and one mapping reader: 2.
    let m = python("np-mmap", &path);
    let (_, f) = scan_file(&[p], &path);
    assert_count(&f, 2.0);
    assert!(f.mappers.iter().any(|x| x.pid == m.pid()));
    assert!(!f.proven_copies.iter().any(|c| c.pid == m.pid()));
}

#[test]
fn private_mapping_written_in_place_is_cow_counted_once() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = model(dir.path(), 2);
    let size = std::fs::metadata(&path).unwrap().len();
    let size_arg = size.to_string();
    let w = reader("private-write", Some(&path), &["--bytes", &size_arg]);
    let p = path.to_str().unwrap();
    let (r, f) = scan_file(&[p], &path);
    // Every page written: page cache 1 + CoW 1, and the proof found the CoW pages
    // themselves, which must not be counted again.
    assert_count(&f, 2.0);
    assert!((f.representations.cow.unwrap() - 1.0).abs() < 0.01);
    assert!(f.proven_copies.is_empty(), "{:?}", f.proven_copies);
    let mine: Vec<_> = r.findings.iter().filter(|x| x.subject() == p).collect();
    let cow = mine
        .iter()
        .find(|x| x.code == "cow-in-private-mapping")
        .unwrap();
    assert!(
        cow.message().contains("written in place"),
        "{}",
        cow.message()
    );
    assert!(
        !mine.iter().any(|x| x.code == "proven-private-copy"),
        "{mine:?}"
    );
    drop(w);
}

fn npy(path: &Path, floats: u64, seed: u64) {
    run_ok(Command::new("python3").args([
        "-c",
        &format!("import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng({seed}).random({floats}))"),
        path.to_str().unwrap(),
    ]));
}

#[test]
fn zero_copy_loaders_count_one_without_a_copy_finding() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root") || !python_has("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // An 8 MiB file mapped by a Python process with a heap twice its size, and a 4 MiB
    // file mapped by a plain Python process (whose heap alone is larger than the file).
    let big = dir.path().join("z.npy");
    let small = dir.path().join("s.npy");
    npy(&big, 1 << 20, 2);
    npy(&small, 1 << 19, 3);
    let heap = python("np-mmap-heap", &big);
    let plain = python("np-mmap", &small);
    for (path, loader) in [(&big, &heap), (&small, &plain)] {
        let (r, f) = scan_file(&[path.to_str().unwrap()], path);
        assert_count(&f, 1.0);
        assert_searched(&f, &[loader.pid()]);
        assert!(f.proven_copies.is_empty());
        assert!(f.mappers.iter().any(|m| m.pid == loader.pid()));
        // Its heap could hold the file, so it was searched, and nothing was found.
        assert!(
            f.candidates.searched >= 1,
            "{:?} {:?}",
            f.candidates,
            f.mappers
        );
        let codes: Vec<&str> = r
            .findings
            .iter()
            .filter(|x| Path::new(&x.subject()) == path.as_path())
            .map(|x| x.code.as_str())
            .collect();
        assert!(
            !codes
                .iter()
                .any(|c| *c == "proven-private-copy" || *c == "multiple-representations"),
            "{codes:?}"
        );
    }
}

#[test]
fn safetensors_numpy_loaders_copy_and_the_count_says_so() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root") || !python_has("numpy") || !python_has("safetensors") {
        return;
    }
    // safetensors 0.8's NumPy API maps the file and copies every tensor out of the
    // mapping (RssAnon grows by the tensors' size), in load_file and in
    // safe_open(...).get_tensor alike: real copies, confirmed by the test's own search.
    let dir = tempfile::tempdir().unwrap();
    let (st, residues) = model(dir.path(), 3);
    for mode in ["st-load", "st-safe-open"] {
        let l = python(mode, &st);
        let (_, f) = scan_file(&[st.to_str().unwrap()], &st);
        assert_count(&f, 2.0);
        assert_searched(&f, &[l.pid()]);
        assert_eq!(f.proven_copies.len(), 1, "{mode}: {:?}", f.proven_copies);
        assert_proof_matches_own_search(&f, l.pid(), &st, &residues);
    }
}

#[test]
fn a_process_that_cannot_be_searched_makes_the_count_a_lower_bound() {
    let _group = crate::common::group(GROUP);
    let Some((dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let (path, _) = model(dir.path(), 4);
    // World-writable, so the kernel reveals its residency to 'nobody'.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let c = reader("copy", Some(&path), &["--close"]);
    touch_cache(&path);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["scan", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Report = serde_json::from_slice(&out.stdout).unwrap();
    let f = r.files.iter().find(|f| Path::new(&f.path) == path).unwrap();
    // 1.00 proven (page cache), a lower bound, and the copier suspected beside it.
    assert_count(f, 1.0);
    assert!(f.representations.lower_bound);
    assert!(f.representations.unsearched >= 1);
    assert!(
        f.suspected_copies.iter().any(|s| s.pid == c.pid()),
        "{f:#?}"
    );
    let human = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("scan")
        .arg(&path)
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&human.stdout);
    assert!(t.contains("in memory ≥ 1.00 times"), "{t}");
    // Every process 'nobody' cannot rule out is suspected; the reader is one of them.
    let line = t.lines().find(|l| l.contains("up to ")).unwrap_or_default();
    assert!(line.contains(&c.pid().to_string()), "{t}");
}

#[test]
fn onnxruntime_heap_copies_are_found_and_counted() {
    let _group = crate::common::group(GROUP);
    if !require(is_root(), "root") || !python_has("onnx") || !python_has("onnxruntime") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    // A small graph (y = ((x @ W0) @ W1) @ W2) with 4 MiB float initializers.
    run_ok(Command::new("python3").args([
        "-c",
        r#"
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
rng = np.random.default_rng(5)
ws = [numpy_helper.from_array(rng.standard_normal((1024, 1024)).astype(np.float32), f"W{i}") for i in range(3)]
nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"W{i}"], [f"h{i+1}" if i < 2 else "y"]) for i in range(3)]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], ws)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
"#,
        path.to_str().unwrap(),
    ]));
    // twofold must parse it as ONNX, with three tensors.
    let c = twofold::container::open(&path).unwrap();
    assert_eq!(c.format, twofold::container::Format::Onnx);
    assert_eq!(c.tensors.len(), 3);
    let residues = block_residues(c.tensors.iter().map(|t| t.offset));
    let ort = python("ort", &path);
    touch_cache(&path);
    let (_, f) = scan_file(&[path.to_str().unwrap()], &path);
    // onnxruntime was searched in full (a process the test did not start may still be
    // out of reach, which would make the count a lower bound, as it should).
    assert!(
        !f.suspected_copies.iter().any(|s| s.pid == ort.pid()),
        "{:#?}",
        f.suspected_copies
    );
    let copy = f
        .proven_copies
        .iter()
        .find(|x| x.pid == ort.pid())
        .unwrap_or_else(|| panic!("no copy found in onnxruntime: {f:#?}"));
    assert!(copy.fraction > 0.5, "{copy:?}");
    assert!(count(&f) >= 1.5, "{:#?}", f.representations);
    assert_proof_matches_own_search(&f, ort.pid(), &path, &residues);
}

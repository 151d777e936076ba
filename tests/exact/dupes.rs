//! `twofold dupes` against child processes whose copies the test made: exact bytes found
//! for each case, and no false positives.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use twofold::model::dupes::{DupesReport, FileDupes};

fn model(dir: &Path) -> (PathBuf, Vec<Written>) {
    safetensors(
        dir,
        &[
            ("embed", 1 << 20, Fill::Random(1)),
            ("l0.attn", 256 << 10, Fill::Random(2)),
            ("l0.norm", 2048, Fill::Random(3)),
            // Under 256 bytes even widened: too small to search.
            ("l0.tiny", 64, Fill::Random(7)),
            ("l0.mlp", 64 << 10, Fill::Random(4)),
            ("l1.zero_bias", 64 << 10, Fill::Zero),
            ("l1.ones_norm", 16 << 10, Fill::Ones),
            ("l1.attn", 8 << 10, Fill::Random(5)),
            ("l1.mlp", 512 << 10, Fill::Random(6)),
        ],
    )
}

fn dupes(pid: i32, file: &Path, extra: &[&str]) -> FileDupes {
    let r = dupes_report(pid, file, extra);
    assert_eq!(r.processes.len(), 1);
    assert_eq!(r.processes[0].error, None);
    r.processes[0].files[0].clone()
}

fn found_names(f: &FileDupes, widened: bool) -> Vec<String> {
    let mut v: Vec<String> = f
        .copies
        .iter()
        .filter(|c| (c.kind != twofold::dupes::index::CopyKind::Identical) == widened)
        .map(|c| c.tensor.clone())
        .collect();
    v.sort();
    v
}

fn names(ts: &[&Written]) -> Vec<String> {
    let mut v: Vec<String> = ts.iter().map(|t| t.name.clone()).collect();
    v.sort();
    v
}

fn range(t: &Written) -> String {
    format!("{}:{}", t.offset, t.len)
}

#[test]
fn whole_copy_at_an_unaligned_heap_offset() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, ts) = model(dir.path());
    let searchable: Vec<&Written> = ts.iter().filter(|t| t.searchable).collect();
    // 48: 16-byte aligned, not page aligned.
    let c = reader("copy", Some(&file), &["--offset", "48"]);
    let f = dupes(c.pid(), &file, &[]);
    assert_eq!(found_names(&f, false), names(&searchable));
    let bytes: u64 = searchable.iter().map(|t| t.len).sum();
    assert_eq!(f.identical.file_bytes, bytes);
    assert_eq!(f.identical.memory_bytes, bytes);
    assert_eq!(f.converted.tensors, 0);
    assert_eq!(f.too_small.tensors, 1);
    assert_eq!(f.low_entropy.tensors, 2);
    assert_eq!(f.regions.len(), 1);
    // An odd offset (3) is found with --align 1, and not claimed with the default 16.
    let c = reader("copy", Some(&file), &["--offset", "3"]);
    assert_eq!(
        found_names(&dupes(c.pid(), &file, &["--align", "1"]), false),
        names(&searchable)
    );
    assert_eq!(dupes(c.pid(), &file, &[]).identical.tensors, 0);
}

#[test]
fn half_of_the_tensors() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, ts) = model(dir.path());
    let copied: Vec<&Written> = ts.iter().step_by(2).collect();
    let args: Vec<String> = copied
        .iter()
        .flat_map(|t| ["--range".to_string(), range(t)])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = reader("copy", Some(&file), &args);
    let f = dupes(c.pid(), &file, &[]);
    let want: Vec<&Written> = copied.into_iter().filter(|t| t.searchable).collect();
    assert_eq!(found_names(&f, false), names(&want));
    assert_eq!(
        f.identical.file_bytes,
        want.iter().map(|t| t.len).sum::<u64>()
    );
}

#[test]
fn f16_widened_to_f32() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, ts) = model(dir.path());
    let widened: Vec<&Written> = ts
        .iter()
        .filter(|t| t.name.ends_with("mlp") || t.name == "embed")
        .collect();
    let mut args = vec!["--dtype".to_string(), "f16".to_string()];
    for t in &widened {
        args.push("--range".into());
        args.push(range(t));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = reader("widen", Some(&file), &args);
    let f = dupes(c.pid(), &file, &[]);
    // Whole widened copies, exactly those the child made. The child's conversion scratch
    // may also hold a stale page of a widened tensor: a real partial copy, counted as such.
    let whole: Vec<String> = {
        let mut v: Vec<String> = f
            .copies
            .iter()
            .filter(|c| {
                widened
                    .iter()
                    .any(|t| t.name == c.tensor && c.memory_bytes == 2 * t.len)
            })
            .map(|c| c.tensor.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(whole, names(&widened), "{:#?}", f.copies);
    assert!(found_names(&f, false).is_empty());
    let src: u64 = widened.iter().map(|t| t.len).sum();
    let scratch = f.converted.file_bytes - src;
    assert!(scratch <= 8192, "{:#?}", f.copies);
    assert_eq!(f.converted.memory_bytes, 2 * (src + scratch));
    // --no-widen does not look for them.
    assert_eq!(dupes(c.pid(), &file, &["--no-widen"]).converted.tensors, 0);
}

#[test]
fn no_false_positives() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = model(dir.path());
    // A mapping without a copy; a CoW-written private mapping; unrelated memory that is
    // mostly zero pages.
    for (mode, extra) in [
        ("map", vec![]),
        ("private-write", vec!["--bytes", "2M"]),
        ("anon", vec!["--bytes", "64M"]),
    ] {
        let c = if mode == "anon" {
            reader(mode, None, &extra)
        } else {
            reader(mode, Some(&file), &extra)
        };
        let f = dupes(c.pid(), &file, &[]);
        assert_eq!(f.identical.tensors, 0, "{mode}: {:?}", f.copies);
        assert_eq!(f.converted.tensors, 0, "{mode}: {:?}", f.copies);
        assert_eq!(f.private_copies, Some(0.0));
    }
}

#[test]
fn process_without_rights_is_unknown_not_zero() {
    let _group = crate::common::group(module_path!());
    let Some((dir, bin, _nobody)) = nobody_setup() else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let (file, _) = model(dir.path());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let c = reader("copy", Some(&file), &[]);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["dupes", "--json", "--pid", &c.pid().to_string()])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let r: DupesReport = serde_json::from_slice(&out.stdout).unwrap();
    let e = r.processes[0].error.as_deref().unwrap();
    assert!(e.contains("ptrace"), "{e}");
    assert!(r.processes[0].files.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not searched"));
}

#[test]
fn unparseable_file_runs_are_found_and_nothing_searchable_is_unknown() {
    let _group = crate::common::group(module_path!());
    let dir = tempfile::tempdir().unwrap();
    // 4 MiB of random bytes in no known format; a process copies one 48 KiB run of it
    // (like onnxruntime's tensor copies) to a 16-byte-aligned buffer.
    let file = model_file(dir.path(), "weights.bin", 4 * MIB);
    let c = reader("copy", Some(&file), &["--range", "1000003:49152"]);
    let f = dupes(c.pid(), &file, &[]);
    assert_eq!(format!("{:?}", f.format), "Opaque");
    // Every whole page of the run is found (the run's first and last partial pages are not).
    let found = f.identical.memory_bytes;
    assert!((40960..=49152).contains(&found), "{found}: {:#?}", f.copies);
    assert!(f.private_copies.unwrap() > 0.0);
    // A file of zeros has nothing to search for: unknown, not 0.
    let zeros = dir.path().join("zeros.bin");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let z = reader("copy", Some(&zeros), &[]);
    let f = dupes(z.pid(), &zeros, &[]);
    assert_eq!(f.private_copies, None);
    let out = std::process::Command::new(exe())
        .args(["dupes", "--pid", &z.pid().to_string()])
        .arg(&zeros)
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("private copies of the file: unknown"), "{t}");
}

/// The content index is built once per version of the files and kept: a second proof of
/// the same file reuses it and finds the same copy; a file rewritten (new mtime) is
/// indexed anew; a deleted file's index is let go, so twofold holds no descriptor of it.
#[test]
fn the_index_is_built_once_per_version_and_let_go_when_the_file_is_deleted() {
    let _group = crate::common::group(module_path!());
    use twofold::collect::gather::{gather, Request};
    use twofold::collect::Roots;
    use twofold::dupes::indexcache::IndexCache;
    use twofold::dupes::prove::{prove_cached, ProveOptions};
    if !require(is_root(), "root (to search the copying reader's memory)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = model(dir.path());
    let copy = reader("copy", Some(&file), &["--close"]);
    let key = file_key(&file);
    // Only the copy is a candidate: other processes of a busy host come and go.
    let req = Request {
        paths: vec![file.clone()],
        pids: vec![copy.pid()],
        ..Request::default()
    };
    let roots = Roots::live();
    let opts = ProveOptions {
        budget: Some(std::time::Duration::from_secs(60)),
        exact: false,
    };
    let mut cache = IndexCache::default();
    let mut w = Vec::new();
    let proven = |cache: &mut IndexCache| {
        let mut w = Vec::new();
        let sample = gather(&roots, &req, &mut w).unwrap();
        let p = prove_cached(&roots, &sample, opts, None, &mut w, Some(cache), None);
        p.iter()
            .filter(|p| p.sample.pid == copy.pid() && p.sample.file == key)
            .map(|p| p.sample.identical_file_bytes)
            .sum::<u64>()
    };
    let first = proven(&mut cache);
    assert!(first > 0, "the copy is found");
    assert_eq!((cache.built, cache.reused, cache.len()), (1, 0, 1));
    assert_eq!(
        proven(&mut cache),
        first,
        "the same copy from the kept index"
    );
    assert_eq!((cache.built, cache.reused), (1, 1), "nothing indexed again");
    // A new mtime is a new version (the bytes are the same: the copy still is one).
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(proven(&mut cache), first);
    assert_eq!(cache.built, 2, "the new version is indexed anew");
    // Deleted: the index goes at the next snapshot's keep, with its descriptors.
    let sample = gather(&roots, &req, &mut w).unwrap();
    std::fs::remove_file(&file).unwrap();
    cache.keep_only(&sample.files.iter().map(|f| f.key).collect());
    assert!(cache.is_empty(), "{} kept", cache.len());
    let held = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        // This test's file only: the other tests of this module run beside it, in this
        // process, each with a model.safetensors of its own.
        .filter(|l| l.to_string_lossy().starts_with(&*file.to_string_lossy()))
        .count();
    assert_eq!(held, 0, "no descriptor of the deleted model is left open");
}

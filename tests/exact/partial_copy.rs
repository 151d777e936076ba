//! A process tied to a model file (it maps it, or its command line names it) that keeps
//! a small part of it in private memory, far less than the file (a runtime's pinned
//! buffer of one tensor: llama.cpp's `CUDA_Host` token embeddings under `--load-mode
//! none`): the part is searched for and counted, although the process's private memory
//! could never hold the whole file (issue #44).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Child;

use crate::common::*;

/// A Python process that keeps `keep` tensors of `path` (each in a bytes object of its
/// own) and, with `map`, keeps the whole file mapped; without it the file is closed (its
/// command line still names it). Says `ready` and waits for its stdin to close.
fn keeper(path: &Path, keep: usize, map: bool) -> (Child, i32) {
    let code = r#"
import json, mmap, struct, sys
path, keep, map_it = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "map"
f = open(path, "rb")
n = struct.unpack("<Q", f.read(8))[0]
meta = json.loads(f.read(n))
base = 8 + n
kept = []
for name, t in sorted(meta.items(), key=lambda kv: kv[1]["data_offsets"][0])[:keep]:
    a, b = t["data_offsets"]
    f.seek(base + a)
    kept.append(f.read(b - a))
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if map_it else None
f.close()
print("ready", flush=True)
sys.stdin.read()
"#;
    let keep = keep.to_string();
    let mode = if map { "map" } else { "named" };
    python_ready(code, &[path.as_os_str(), keep.as_ref(), mode.as_ref()])
}

#[test]
fn a_small_part_kept_by_a_process_tied_to_the_file_is_counted() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "reading another process's memory needs root")
        || !require(python_has("json, mmap"), "python3")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (n, len, keep) = (48, 1usize << 20, 3);
    let order: Vec<usize> = (0..n).collect();
    let model = dir.path().join("model.safetensors");
    crate::shared_tensors::write(&model, n, len, 46, &order);
    let size = std::fs::metadata(&model).unwrap().len();
    for map in [true, false] {
        let (mut child, pid) = keeper(&model, keep, map);
        // The process's private memory is far from the file's size: by size alone it could
        // hold no copy (the rule for processes not tied to the file).
        let anon = status_bytes(pid, "RssAnon");
        assert!(
            (anon as f64) < 0.8 * size as f64,
            "anon {anon} of a {size}-byte file"
        );
        let r: twofold::model::Report =
            twofold_json(&["scan".as_ref(), "--json".as_ref(), model.as_os_str()]);
        let f = r
            .files
            .iter()
            .find(|f| Path::new(&f.path) == model)
            .unwrap();
        let kept: u64 = f
            .proven_copies
            .iter()
            .filter(|c| c.pid == pid)
            .map(|c| c.identical_bytes)
            .sum();
        // Ground truth: the process holds `keep` tensors of 1 MiB, read from the file.
        assert_eq!(kept, (keep * len) as u64, "map {map}: {f:#?}");
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}

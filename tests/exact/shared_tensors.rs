//! Two model files that hold the same tensors in different places (a `.pt` and the
//! `.safetensors` of the same weights, as model repositories ship them): a process that
//! loaded one of them tensor by tensor holds a copy of the tensors of both. The copy is
//! counted under the file the process came to (its command line names it), in either
//! order the files are named in, and the other file has none (issue #44).

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;
use std::process::Child;

use crate::common::*;

/// Writes a safetensors file of `n` F32 tensors of `len` pseudo-random bytes each (the
/// same `seed`, the same tensors), laid out in `order`.
pub(crate) fn write(path: &Path, n: usize, len: usize, seed: u64, order: &[usize]) {
    let mut header = String::from("{");
    let mut off = 0;
    for (k, &i) in order.iter().enumerate() {
        if k > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t{i}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            len / 4,
            off + len
        ));
        off += len;
    }
    header.push('}');
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    assert_eq!(n, order.len());
    for &i in order {
        let mut x = seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut t = vec![0u8; len];
        for c in t.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&t).unwrap();
    }
}

/// A Python process that reads every tensor of `path` into a bytes object of its own, in
/// reverse order (each its own allocation, as a loader's tensors are), says `ready` and
/// waits for its stdin to close.
fn loader(path: &Path) -> (Child, i32) {
    let code = r#"
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
meta = json.loads(f.read(n))
base = 8 + n
tensors = []
for name, t in sorted(meta.items(), key=lambda kv: -kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    f.seek(base + a)
    tensors.append(f.read(b - a))
f.close()
print("ready", flush=True)
sys.stdin.read()
"#;
    python_ready(code, &[path.as_os_str()])
}

#[test]
fn a_copy_of_tensors_two_files_share_counts_under_the_file_the_process_loaded() {
    let _group = crate::common::group(module_path!());
    if !require(is_root(), "reading another process's memory needs root")
        || !require(python_has("json"), "python3")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (n, len) = (24, 1 << 20);
    let forward: Vec<usize> = (0..n).collect();
    let shuffled: Vec<usize> = (0..n).map(|k| (k * 7 + 3) % n).collect();
    // A and B: the same 24 tensors of 1 MiB, in other orders behind other headers.
    let a = dir.path().join("weights.safetensors");
    let b = dir.path().join("weights-copy.safetensors");
    write(&a, n, len, 44, &forward);
    write(&b, n, len, 44, &shuffled);
    for loaded in [&a, &b] {
        let other = if loaded == &a { &b } else { &a };
        let (mut child, pid) = loader(loaded);
        for (first, second) in [(&a, &b), (&b, &a)] {
            let r: twofold::model::Report = twofold_json(&[
                "scan".as_ref(),
                "--json".as_ref(),
                first.as_os_str(),
                second.as_os_str(),
            ]);
            let of = |p: &Path| r.files.iter().find(|f| Path::new(&f.path) == p).unwrap();
            let copy = |p: &Path| {
                of(p)
                    .proven_copies
                    .iter()
                    .filter(|c| c.pid == pid)
                    .map(|c| c.identical_bytes)
                    .sum::<u64>()
            };
            // Ground truth: the loader holds every tensor's bytes once (24 MiB), read from
            // `loaded`; `other` holds the same bytes and the loader never opened it.
            assert_eq!(
                copy(loaded),
                (n * len) as u64,
                "{} named first: {:#?}",
                first.display(),
                of(loaded)
            );
            assert_eq!(copy(other), 0, "{} named first", first.display());
        }
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}

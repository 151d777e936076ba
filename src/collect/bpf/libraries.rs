//! Where the driver libraries the upload tracer attaches are: every file named
//! `libcuda.so*` (the CUDA driver) or `libcufile.so*` (GPUDirect Storage) that a process
//! maps, the paths `/etc/ld.so.cache` names, the usual install paths, and
//! `TWOFOLD_LIBCUDA` / `TWOFOLD_LIBCUFILE` (`:`-separated).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::sample::FileKey;

/// Whether a mapped path names a library the tracer attaches: the CUDA driver
/// (`libcuda.so*`) or GPUDirect Storage's `libcufile.so*`.
pub(super) fn is_traced(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|b| b.starts_with("libcuda.so") || is_cufile(b))
}

/// Whether a path names GPUDirect Storage's library (`libcufile.so*`, not
/// `libcufile_rdma`).
pub fn is_cufile(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|b| b.starts_with("libcufile.so"))
}

/// Where drivers install the libraries (the container toolkit's mount included) and
/// CUDA installs libcufile.
const KNOWN: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
    "/usr/local/cuda/lib64/libcufile.so.0",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0",
    "/usr/local/cuda/targets/sbsa-linux/lib/libcufile.so.0",
    "/usr/lib/x86_64-linux-gnu/libcufile.so.0",
    "/usr/lib/aarch64-linux-gnu/libcufile.so.0",
];

/// Paths of the libraries `TWOFOLD_LIBCUDA`, `TWOFOLD_LIBCUFILE` and `/etc/ld.so.cache`
/// name, and the usual install paths.
pub(super) fn configured_libraries() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = KNOWN
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    for var in ["TWOFOLD_LIBCUDA", "TWOFOLD_LIBCUFILE"] {
        if let Some(v) = std::env::var_os(var) {
            out.extend(std::env::split_paths(&v).filter(|p| p.is_file()));
        }
    }
    if let Ok(cache) =
        crate::input::read_bounded(Path::new("/etc/ld.so.cache"), "ld.so.cache", 16 << 20)
    {
        for s in cache.split(|b| *b == 0) {
            if let Ok(s) = std::str::from_utf8(s) {
                if s.starts_with('/') && is_traced(s) && Path::new(s).is_file() {
                    out.push(PathBuf::from(s));
                }
            }
        }
    }
    out
}

/// A library file mapped by processes: the path to attach through (in the first mapper's
/// root), the path as that process sees it, and who maps it.
pub(super) type MappedLibrary = (PathBuf, String, BTreeSet<i32>);

/// Library files mapped by each process.
pub(super) fn mapped_libraries(proc_root: &Path) -> BTreeMap<FileKey, MappedLibrary> {
    let mut out: BTreeMap<FileKey, MappedLibrary> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for d in dir.flatten() {
        let Some(pid) = d.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(d.path().join("maps")) else {
            continue;
        };
        for line in text
            .lines()
            .filter(|l| l.contains("libcuda.so") || l.contains("libcufile.so"))
        {
            let Some(m) = crate::collect::maps::parse_header(line) else {
                continue;
            };
            if m.inode == 0 || !is_traced(&m.path) {
                continue;
            }
            let via = d.path().join("root").join(m.path.trim_start_matches('/'));
            out.entry(m.key())
                .or_insert_with(|| (via, m.path.clone(), BTreeSet::new()))
                .2
                .insert(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_driver_and_cufile_libraries_are_traced() {
        assert!(is_traced("/usr/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert!(is_traced("/tmp/x/libcuda.so.580.159"));
        assert!(!is_traced("/usr/lib/libcudart.so.12"));
        assert!(!is_traced("/opt/libcuda.so.1/other"));
        assert!(is_traced("/usr/local/cuda/lib64/libcufile.so.0"));
        assert!(is_cufile("/usr/local/cuda/lib64/libcufile.so.1.13.0"));
        assert!(!is_cufile("/usr/local/cuda/lib64/libcufile_rdma.so.1"));
        assert!(!is_cufile("/usr/lib/x86_64-linux-gnu/libcuda.so.1"));
    }
}

//! Collectors: read the kernel's files into raw [`crate::sample`] types.
//!
//! Every reader takes a root path; the live roots are named once, in [`Roots::live`].

pub mod access;
pub mod answer;
pub mod bpf;
pub mod cache;
pub mod candidates;
pub mod cgroup;
pub mod decisions;
pub mod detail;
pub mod error;
pub mod gather;
pub mod gpu;
pub mod heldfiles;
pub mod hostledger;
pub mod input;
pub mod interest;
pub mod keyvalue;
pub mod mapped;
pub mod maps;
mod measure;
pub mod memory;
pub mod mounts;
pub mod names;
pub mod observer;
pub mod overlay;
pub mod own;
pub mod pagescan;
mod phases;
pub mod process;
pub mod quiet;
pub mod reopen;
pub mod request;
pub mod residency;
pub mod statfiles;
pub mod stop;
pub mod stores;
pub mod system;
pub mod taskview;
pub mod walk;
pub mod walkmemo;

use std::path::PathBuf;

/// Where the kernel's file systems are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc: PathBuf,
    pub cgroup: PathBuf,
}

impl Roots {
    /// The live system.
    pub fn live() -> Self {
        let proc = PathBuf::from("/proc");
        Roots {
            cgroup: mounts::live_cgroup_root(&proc),
            proc,
        }
    }
}

/// File extensions of model containers.
pub const MODEL_EXTENSIONS: &[&str] = &[
    "gguf",
    "safetensors",
    "bin",
    "pt",
    "pth",
    "ckpt",
    "onnx",
    "npy",
    "npz",
    "tflite",
    "mlmodel",
    "h5",
];

/// Whether a path names a model container by its extension (a `" (deleted)"` suffix of
/// `/proc/PID/maps` is ignored). A `.pth` directly in a `site-packages` or `dist-packages`
/// directory is Python's path configuration (`site`: `distutils-precedence.pth`), which
/// every Python process opens as it starts, not a PyTorch checkpoint.
pub fn has_model_extension(path: &str) -> bool {
    let path = std::path::Path::new(path.strip_suffix(" (deleted)").unwrap_or(path));
    let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
        return false;
    };
    let site = || {
        path.parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "site-packages" || d == "dist-packages")
    };
    MODEL_EXTENSIONS.iter().any(|m| m.eq_ignore_ascii_case(ext))
        && !(ext.eq_ignore_ascii_case("pth") && site())
}

/// CPUs this process may use, asked once (`available_parallelism` reads the affinity
/// mask and the cgroup's CPU quota files each time; a live view asks at every snapshot).
fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Threads for work spread over the CPUs: one per CPU, at most 8.
pub fn cpu_threads() -> usize {
    cpus().clamp(1, 8)
}

/// Threads a proof searches memory on: one per CPU (reads of `/proc/PID/mem` are kernel
/// time spent copying pages, and a machine with more cores holds more memory).
pub fn proof_threads() -> usize {
    cpus().clamp(1, 64)
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu() -> std::time::Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(std::time::Duration::ZERO, std::time::Duration::from)
}

/// Kinds of short-lived worker threads whose CPU `TWOFOLD_PROFILE` reports: the
/// collection's [`par_map`] workers, and the proof's memory sweeps.
#[derive(Clone, Copy)]
pub enum Worker {
    Collect = 0,
    Sweep = 1,
}

/// CPU (ns) spent on worker threads, by [`Worker`] kind, since the process started.
static WORKER_CPU_NS: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Runs `f` (the body of a worker thread of `kind`), adding the CPU it used to the count
/// of its kind.
pub fn on_worker<R>(kind: Worker, f: impl FnOnce() -> R) -> R {
    let t0 = thread_cpu();
    let r = f();
    let used = thread_cpu().saturating_sub(t0).as_nanos() as u64;
    WORKER_CPU_NS[kind as usize].fetch_add(used, std::sync::atomic::Ordering::Relaxed);
    r
}

/// CPU spent on worker threads of each kind so far: (collection, sweeps).
pub fn worker_cpu() -> (std::time::Duration, std::time::Duration) {
    let get = |k: Worker| {
        std::time::Duration::from_nanos(
            WORKER_CPU_NS[k as usize].load(std::sync::atomic::Ordering::Relaxed),
        )
    };
    (get(Worker::Collect), get(Worker::Sweep))
}

/// Maps `f` over `items` on up to one thread per CPU (procfs reads are mostly kernel
/// time: page-table walks for `smaps`), keeping the order; few items are mapped here.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() < 32 {
        return items.iter().map(f).collect();
    }
    par_map_on(cpu_threads(), items, f)
}

/// Maps `f` over `items` on up to `threads` threads (this one and scoped others), each
/// taking the next item when it is done with one, keeping the order. A panic in `f` is
/// resumed here.
pub fn par_map_on<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = threads.min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            out.push((i, f(item)));
        }
        out
    };
    let mut parts: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (1..threads)
            .map(|_| s.spawn(|| on_worker(Worker::Collect, work)))
            .collect();
        let mut parts = work();
        for w in workers {
            parts.extend(w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        parts
    });
    parts.sort_unstable_by_key(|(i, _)| *i);
    parts.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
/// An explicit model file of `size` bytes at `path`, `cached` of them in the page cache.
pub(crate) fn test_file_sample(
    key: crate::sample::FileKey,
    path: &str,
    size: u64,
    cached: Option<u64>,
) -> crate::sample::FileSample {
    crate::sample::FileSample {
        key,
        path: path.to_string(),
        path_bytes: None,
        size_bytes: Some(size),
        residency: cached.map(|cached_bytes| crate::sample::ResidencySample {
            cached_bytes,
            ..Default::default()
        }),
        residency_error: None,
        unopened: None,
        explicit: true,
        store: false,
        deleted: false,
        now_at_path: None,
        seen_as: Vec::new(),
        same_bytes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_extensions() {
        assert!(super::has_model_extension("/m/llama.Q4_K_M.gguf"));
        assert!(super::has_model_extension("/m/x.SAFETENSORS"));
        assert!(super::has_model_extension("/m/x.npy (deleted)"));
        assert!(!super::has_model_extension("/usr/lib/libc.so.6"));
        assert!(!super::has_model_extension("/m/gguf"));
        assert!(!super::has_model_extension(
            "/usr/lib/python3/dist-packages/distutils-precedence.pth"
        ));
        assert!(!super::has_model_extension(
            "/venv/lib/python3.11/site-packages/_virtualenv.pth"
        ));
        assert!(super::has_model_extension("/models/resnet50.pth"));
        assert!(super::has_model_extension(
            "/venv/lib/python3.11/site-packages/pkg/weights.pth"
        ));
    }
}

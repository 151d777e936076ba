//! What one collection reads: the [`Request`] every reader of a collection is given.

use std::path::PathBuf;

use super::residency::Method;

/// What to scan.
#[derive(Debug, Clone)]
pub struct Request {
    /// Files or directories named by the user (always of interest).
    pub paths: Vec<PathBuf>,
    /// Only these processes (all when empty).
    pub pids: Vec<i32>,
    /// Only processes in this cgroup (or below it); its counters are reported.
    pub cgroup: Option<PathBuf>,
    /// Files at least this large are of interest whatever their extension.
    pub min_size: u64,
    /// Report every process, not only the holders of files of interest.
    pub all_processes: bool,
    pub residency: Method,
    /// Also look for copies of the model files in the well-known stores
    /// ([`super::stores`]); `scan` without paths does.
    pub stores: bool,
    /// Find the processes whose private memory could hold a copy of a file of interest
    /// (copy holders that closed the file), for the proof.
    pub candidates: bool,
    /// Only the files in `paths` (and an older inode still held at one of their paths),
    /// with their holders and candidates: `scan FILE...` without `--all`.
    pub only_paths: bool,
    /// With `pids` and no `paths` (`scan --pid P`, `dupes --pid P`): every process is read
    /// to learn the host's files of interest, and the named processes are searched for
    /// them (a copy of a file P read and closed is found); only those are kept.
    pub host_files: bool,
    /// Processes holding device memory (NVML): kept in the sample even when they hold no
    /// file, so that a device copy made by one that read or named the file and closed it
    /// can be suspected (filled in by the engine each snapshot).
    pub gpu_pids: Vec<i32>,
    /// Leave `smaps_rollup` of the processes that hold no file of interest (candidates
    /// only) unread, in [`crate::sample::Sample`]'s `deferred` list: the engine reads
    /// them beside the proof (each is a walk of the process's page tables).
    pub defer_rollups: bool,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            paths: Vec::new(),
            pids: Vec::new(),
            cgroup: None,
            min_size: 64 << 20,
            all_processes: false,
            residency: Method::Auto,
            stores: false,
            candidates: true,
            only_paths: false,
            host_files: false,
            gpu_pids: Vec::new(),
            defer_rollups: false,
        }
    }
}

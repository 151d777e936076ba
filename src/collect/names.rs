//! Names for what the eBPF counters key by number: (dev, inode) → a path, from the
//! processes that map or hold the file (`/proc/PID/maps`, `/proc/PID/fd`), and pid →
//! comm (`/proc/PID/comm`, re-read every time it is asked for: exec changes it). Paths
//! are cached: a whole-/proc pass runs at most every [`Names::RESCAN`], and only when a
//! key is still unknown.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::process::ProcReader;
use super::Roots;
use crate::sample::FileKey;

pub struct Names {
    procs: ProcReader,
    paths: BTreeMap<FileKey, String>,
    comms: BTreeMap<i32, String>,
    last_scan: Option<Instant>,
}

impl Names {
    /// Minimum time between two passes over every process.
    pub const RESCAN: Duration = Duration::from_secs(5);

    /// Starts with the paths already known (files of interest from a scan).
    pub fn new(roots: &Roots, known: BTreeMap<FileKey, String>) -> Self {
        Names {
            procs: ProcReader::new(&roots.proc),
            paths: known,
            comms: BTreeMap::new(),
            last_scan: None,
        }
    }

    pub fn paths(&self) -> &BTreeMap<FileKey, String> {
        &self.paths
    }

    pub fn comms(&self) -> &BTreeMap<i32, String> {
        &self.comms
    }

    /// Looks for the paths of `keys` not yet known (at most every [`Self::RESCAN`]).
    pub fn resolve_paths(&mut self, keys: &BTreeSet<FileKey>) {
        let missing: BTreeSet<FileKey> = keys
            .iter()
            .filter(|k| !self.paths.contains_key(k))
            .copied()
            .collect();
        if missing.is_empty() || self.last_scan.is_some_and(|t| t.elapsed() < Self::RESCAN) {
            return;
        }
        self.last_scan = Some(Instant::now());
        let Ok(pids) = self.procs.pids() else { return };
        let procs = self.procs.clone();
        let found = super::par_map(&pids, |pid| {
            let mut out = Vec::new();
            if let Ok(maps) = procs.maps(*pid) {
                out.extend(
                    maps.iter()
                        .filter(|m| missing.contains(&m.key()))
                        .map(|m| (m.key(), m.path.clone())),
                );
            }
            if let Ok(fds) = procs.open_files(*pid) {
                out.extend(
                    fds.into_iter()
                        .filter(|f| missing.contains(&f.key))
                        .map(|f| (f.key, f.path)),
                );
            }
            out
        });
        for (k, path) in found.into_iter().flatten() {
            self.paths.entry(k).or_insert(path);
        }
    }

    /// Reads the comms of `pids` afresh (a process may have exec'd since the last read:
    /// its comm changes); a process that exited keeps the comm last read.
    pub fn resolve_comms(&mut self, pids: &BTreeSet<i32>) {
        for pid in pids {
            let path = self.procs.root().join(pid.to_string()).join("comm");
            if let Ok(c) = super::keyvalue::read_to_string(&path) {
                self.comms.insert(*pid, c.trim_end().to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comms_follow_an_exec_and_outlive_an_exit() {
        let dir = tempfile::tempdir().unwrap();
        let comm = dir.path().join("42").join("comm");
        std::fs::create_dir_all(comm.parent().unwrap()).unwrap();
        let roots = Roots {
            proc: dir.path().to_path_buf(),
            cgroup: dir.path().to_path_buf(),
        };
        let mut names = Names::new(&roots, BTreeMap::new());
        let pids = BTreeSet::from([42]);
        std::fs::write(&comm, "sh\n").unwrap();
        names.resolve_comms(&pids);
        assert_eq!(names.comms()[&42], "sh");
        std::fs::write(&comm, "sleep\n").unwrap();
        names.resolve_comms(&pids);
        assert_eq!(names.comms()[&42], "sleep");
        std::fs::remove_file(&comm).unwrap();
        names.resolve_comms(&pids);
        assert_eq!(names.comms()[&42], "sleep");
    }
}

/// An existing regular file with a model extension that a process's command line names
/// (`llama-server -m /models/x.gguf`), resolved in the process's root and working
/// directory.
#[derive(Debug, Clone)]
pub struct NamedFile {
    /// The path as the process names it (absolute).
    pub shown: std::path::PathBuf,
    /// Where twofold opens it (`/proc/PID/root/...`).
    pub open_path: std::path::PathBuf,
    pub key: crate::sample::FileKey,
    pub size_bytes: u64,
}

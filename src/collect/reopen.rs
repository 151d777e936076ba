//! Opening a file of interest by its identity, through a path that outlives any one
//! process.
//!
//! A file of interest is an inode, `(dev, inode)`. The path a process names it by may be
//! gone (`/proc/PID/maps` appends ` (deleted)`), may now name another inode (a new model
//! renamed over the old one while a server still maps the old one), or may exist only in
//! the process's mount namespace. The ways to open it, in order:
//!
//! 1. the host path (as named on the command line, or as the process names it through
//!    `/proc/PID/root`);
//! 2. each holder's `/proc/PID/fd/N` (needs ptrace read access, `PTRACE_MODE_READ`);
//! 3. each mapper's `/proc/PID/map_files/START-END` (needs `CAP_SYS_ADMIN`, or
//!    `CAP_CHECKPOINT_RESTORE` since Linux 5.9);
//! 4. each holder's `/proc/PID/root/PATH`.
//!
//! The first that opens *that* inode wins: one that opens another inode is passed over,
//! and so is a holder that exited meanwhile (ENOENT, ESRCH): the next one is tried. Never
//! a path with ` (deleted)` appended. See
//! <https://www.kernel.org/doc/html/latest/filesystems/proc.html> (§1.1, `map_files`).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sample::{FileKey, ProcessSample};

pub use crate::sample::{strip_deleted, DELETED};

/// `PROC/PID/root/PATH`: `path` as the process sees it (its mount namespace and root).
pub fn in_root(proc_root: &Path, pid: i32, path: &str) -> PathBuf {
    proc_root
        .join(pid.to_string())
        .join("root")
        .join(strip_deleted(path).trim_start_matches('/'))
}

/// `PROC/PID/map_files/START-END` of a mapping (the kernel's lower-case hex, no padding).
pub fn map_file(proc_root: &Path, pid: i32, start: u64, end: u64) -> PathBuf {
    proc_root
        .join(pid.to_string())
        .join("map_files")
        .join(format!("{start:x}-{end:x}"))
}

/// The ways to open `key`, in the order of the module doc: `first` (the host path, when
/// there is one), then each process's fds, mappings and root path.
pub fn ways(
    proc_root: &Path,
    processes: &[ProcessSample],
    key: FileKey,
    first: Option<&Path>,
) -> Vec<PathBuf> {
    ways_among(proc_root, processes.iter(), key, first)
}

/// [`ways`] among `processes` (all of them, or those an index says refer to `key`).
pub fn ways_among<'a>(
    proc_root: &Path,
    processes: impl Iterator<Item = &'a ProcessSample> + Clone,
    key: FileKey,
    first: Option<&Path>,
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = first.map(Path::to_path_buf).into_iter().collect();
    let holders = || {
        processes.clone().filter(move |p| {
            p.open_files.iter().any(|o| o.key == key) || p.mappings.iter().any(|m| m.key() == key)
        })
    };
    for p in holders() {
        for o in p.open_files.iter().filter(|o| o.key == key) {
            out.push(
                proc_root
                    .join(p.pid.to_string())
                    .join("fd")
                    .join(o.fd.to_string()),
            );
        }
    }
    for p in holders() {
        for m in p.mappings.iter().filter(|m| m.key() == key) {
            out.push(map_file(proc_root, p.pid, m.start, m.end));
        }
    }
    for p in holders() {
        let path = p
            .open_files
            .iter()
            .find(|o| o.key == key)
            .map(|o| o.path.as_str())
            .or_else(|| {
                p.mappings
                    .iter()
                    .find(|m| m.key() == key)
                    .map(|m| m.path.as_str())
            });
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            out.push(in_root(proc_root, p.pid, path));
        }
    }
    out.dedup();
    out
}

/// Why one way did not open the inode.
#[derive(Debug)]
pub enum Miss {
    /// It opened, but another inode (the path was reused).
    Other(FileKey),
    /// It did not open.
    Failed(io::Error),
}

/// Everything tried, when nothing opened the inode.
#[derive(Debug, Default)]
pub struct Misses(pub Vec<(PathBuf, Miss)>);

impl Misses {
    /// A holder's way that failed because the holder exited.
    fn gone(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
    }

    /// One sentence: the first path and why, then what the holders' ways said.
    pub fn describe(&self) -> String {
        let Some((first, why)) = self.0.first() else {
            return "no way to open it is known (no path, and no process maps or holds it)".into();
        };
        let mut s = match why {
            Miss::Other(_) => format!(
                "'{}' now names another file (the one held was replaced or deleted)",
                first.display()
            ),
            Miss::Failed(e) => format!("cannot open '{}' read-only: {e}", first.display()),
        };
        let rest: Vec<&(PathBuf, Miss)> = self.0.iter().skip(1).collect();
        if rest.is_empty() {
            return s;
        }
        let failed: Vec<String> = rest
            .iter()
            .filter_map(|(p, m)| match m {
                Miss::Failed(e) if !Self::gone(e) => Some(format!("'{}': {e}", p.display())),
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            s.push_str(
                ", nor through the fd, map_files or root of the processes that held it (gone)",
            );
        } else {
            s.push_str(&format!(
                ", and its holders' paths could not be opened ({})",
                failed.join("; ")
            ));
        }
        s
    }
}

/// Opens the first of `ways` that gives the inode `key`, with `open` (which returns what it
/// opened and the identity it found there).
pub fn open_inode<T>(
    ways: &[PathBuf],
    key: FileKey,
    mut open: impl FnMut(&Path) -> io::Result<(T, FileKey)>,
) -> Result<(T, PathBuf), Misses> {
    let mut misses = Misses::default();
    for w in ways {
        match open(w) {
            Ok((t, k)) if k == key => return Ok((t, w.clone())),
            Ok((_, k)) => misses.0.push((w.clone(), Miss::Other(k))),
            Err(e) => misses.0.push((w.clone(), Miss::Failed(e))),
        }
    }
    Err(misses)
}

/// The first of `ways` whose `stat` is the inode `key` (nothing is opened), with that
/// `stat`; each `stat` under the deadline of [`super::answer`] (a filesystem that does
/// not answer has none).
pub fn first_way(ways: &[PathBuf], key: FileKey) -> Option<(&Path, std::fs::Metadata)> {
    let place = super::answer::Place::of_key(key);
    ways.iter().find_map(|w| {
        let m = super::answer::metadata(place.clone(), w).ok()?.ok()?;
        (identity(&m) == key).then_some((w.as_path(), m))
    })
}

/// The identity of what `metadata` describes.
pub fn identity(m: &std::fs::Metadata) -> FileKey {
    FileKey::from_dev(m.dev(), m.ino())
}

/// A path's bytes when they are not UTF-8 (its `display()` is lossy).
pub fn raw_if_lossy(p: &Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    p.to_str()
        .is_none()
        .then(|| p.as_os_str().as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{MappingSample, OpenFileSample};

    fn key(inode: u64) -> FileKey {
        FileKey {
            major: 8,
            minor: 1,
            inode,
        }
    }

    #[test]
    fn ways_go_host_fds_mappings_roots_and_never_through_deleted() {
        let p = ProcessSample {
            pid: 7,
            mappings: vec![MappingSample {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0010_0000,
                major: 8,
                minor: 1,
                inode: 5,
                path: "/m/x.gguf (deleted)".into(),
                ..MappingSample::default()
            }],
            open_files: vec![OpenFileSample {
                fd: 3,
                key: key(5),
                path: "/m/x.gguf (deleted)".into(),
            }],
            ..ProcessSample::default()
        };
        let other = ProcessSample {
            pid: 8,
            ..ProcessSample::default()
        };
        let w = ways(
            Path::new("/proc"),
            &[other, p],
            key(5),
            Some(Path::new("/m/x.gguf")),
        );
        let w: Vec<String> = w.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            w,
            [
                "/m/x.gguf",
                "/proc/7/fd/3",
                "/proc/7/map_files/7f0000000000-7f0000100000",
                "/proc/7/root/m/x.gguf",
            ]
        );
    }

    #[test]
    fn the_next_way_is_tried_and_misses_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let kb = identity(&std::fs::metadata(&b).unwrap());
        let gone = dir.path().join("gone");
        let open = |p: &Path| {
            let f = std::fs::File::open(p)?;
            let k = identity(&f.metadata()?);
            Ok((f, k))
        };
        let ways = vec![a.clone(), gone.clone(), b.clone()];
        let (_, at) = open_inode(&ways, kb, open).unwrap();
        assert_eq!(at, b);
        assert_eq!(first_way(&ways, kb).map(|w| w.0), Some(b.as_path()));
        let misses = open_inode(&[a.clone(), gone.clone()], kb, open).unwrap_err();
        let text = misses.describe();
        assert!(text.starts_with(&format!("'{}' now names another file", a.display())));
        assert!(
            text.ends_with("of the processes that held it (gone)"),
            "{text}"
        );
    }
}

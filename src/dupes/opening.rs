//! Where a proof opens the model files it searches for: the first way to each that is
//! still that inode ([`crate::collect::reopen`]), `stat`ed, so that a long-running engine
//! that kept the index of those versions opens none of them.

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::path::{Path, PathBuf};

use super::filebytes::FileBytes;
use super::indexcache::Version;
use crate::collect::reopen;
use crate::sample::unsearched::Unsearched;
use crate::sample::{FileKey, FileSample, Sample};

/// Where a file of a sample can be opened: the first of its ways
/// ([`crate::collect::reopen`]) that is still that inode: its path as shown (never with
/// " (deleted)" appended), else a holder's fd, map_files or root, passing over holders
/// that exited; the path as shown when none is (the caller's open then says why).
pub fn open_path(sample: &Sample, key: FileKey, path: &str, proc_root: &Path) -> PathBuf {
    open_path_stat(sample, key, path, proc_root).0
}

/// [`open_path`], with what `stat` says of the file there when it is that inode. The path
/// as shown is tried first: the other ways are worked out (a look over every process's
/// descriptors and mappings) only when it names another file or none.
pub fn open_path_stat(
    sample: &Sample,
    key: FileKey,
    path: &str,
    proc_root: &Path,
) -> (PathBuf, Option<Metadata>) {
    let is_it = |p: &Path| {
        crate::collect::answer::metadata(crate::collect::answer::Place::of_key(key), p)
            .ok()?
            .ok()
            .filter(|m| reopen::identity(m) == key)
    };
    let host = PathBuf::from(reopen::strip_deleted(path));
    if let Some(m) = is_it(&host) {
        return (host, Some(m));
    }
    let ways = reopen::ways(proc_root, &sample.processes, key, None);
    ways.into_iter()
        .find_map(|w| is_it(&w).map(|m| (w, Some(m))))
        .unwrap_or((host, None))
}

/// A file opened for a proof: its version, its bytes, the path it was opened by.
pub type Opened = (Version, FileBytes, PathBuf);

/// Opens each file where [`open_path_stat`] found it (and checks it is still that inode):
/// the files opened, in order, and why each of the others could not be.
pub fn open_all(
    files: &[(&FileSample, (PathBuf, Option<Metadata>))],
) -> (Vec<Opened>, BTreeMap<FileKey, Unsearched>) {
    let mut opened = Vec::new();
    let mut unopened = BTreeMap::new();
    for (f, (path, _)) in files {
        let o = FileBytes::open(path)
            .map_err(|e| super::filebytes::cannot(path, &e))
            .and_then(|b| {
                let m = b.file().metadata().ok();
                match m.filter(|m| reopen::identity(m) == f.key) {
                    Some(m) => Ok((super::indexcache::version(f.key, &m), b, path.clone())),
                    None => Err(format!("'{}' now names another file", path.display())),
                }
            });
        match o {
            Ok(o) => opened.push(o),
            Err(e) => {
                unopened.insert(f.key, Unsearched::from_error(e));
            }
        }
    }
    (opened, unopened)
}

/// Why the candidates of files the collection did not open (their filesystem did not
/// answer, or opening drops their page cache: `FileSample::unopened`) go unsearched.
pub fn not_opened(files: &[&FileSample]) -> Vec<(FileKey, Unsearched)> {
    files
        .iter()
        .filter_map(|f| {
            let why = f.unopened.as_deref()?;
            Some((
                f.key,
                Unsearched::from_error(format!("not searched: {why}")),
            ))
        })
        .collect()
}
